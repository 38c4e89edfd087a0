//! Rank-0 parameter dumps: raw little-endian `f32` bits with their shapes.
//!
//! Format: the 8 bytes `FUCDIST1`, the parameter count (`u64` LE), then per
//! parameter its rank (`u64`), its dimensions (`u64` each) and its elements
//! (`f32` LE bits). Written to `<path>.tmp`, then renamed over `path`.

use std::io::Write;
use std::path::Path;

use fucina::autograd::Tensor;

use crate::error::{DistError, Result};
use crate::world::World;

const MAGIC: &[u8; 8] = b"FUCDIST1";

/// Rank 0 writes `params` to `path` (every other rank writes nothing); then all
/// ranks wait for it and learn whether it worked. Collective: every rank calls
/// it, with its (identical) parameters.
///
/// # Errors
/// [`DistError::Checkpoint`] on **every** rank if rank 0 could not write the
/// file (with rank 0's message).
pub fn save_params_rank0(world: &World, params: &[Tensor], path: &Path) -> Result<()> {
    let mut status = Vec::new();
    if world.is_root()
        && let Err(e) = write_params(params, path)
    {
        status = e.to_string().into_bytes();
    }
    // The broadcast of rank 0's status is the barrier.
    world.broadcast_bytes(&mut status);
    if status.is_empty() {
        Ok(())
    } else {
        Err(DistError::Checkpoint {
            path: path.display().to_string(),
            message: format!(
                "rank 0 could not write it: {}",
                String::from_utf8_lossy(&status)
            ),
        })
    }
}

/// Writes `params` to `path` (no MPI: one process).
///
/// # Errors
/// The I/O error, as [`std::io::Error`].
pub fn write_params(params: &[Tensor], path: &Path) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(params.len() as u64).to_le_bytes());
    for p in params {
        bytes.extend_from_slice(&(p.shape().len() as u64).to_le_bytes());
        for &d in p.shape() {
            bytes.extend_from_slice(&(d as u64).to_le_bytes());
        }
        for v in p.to_vec() {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Reads a dump written by [`write_params`]: each parameter's shape and values.
///
/// # Errors
/// [`DistError::Checkpoint`] if the file cannot be read or is not such a dump
/// (bad magic, truncated, trailing bytes).
pub fn read_params(path: &Path) -> Result<Vec<(Vec<usize>, Vec<f32>)>> {
    let err = |message: String| DistError::Checkpoint {
        path: path.display().to_string(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let mut r = Reader {
        bytes: &bytes,
        at: 0,
    };
    if r.take(8).map_err(err)? != MAGIC {
        return Err(err("not a fucina-dist parameter dump (bad magic)".into()));
    }
    let count = r.u64().map_err(err)?;
    let mut out = Vec::new();
    for _ in 0..count {
        let rank = r.u64().map_err(err)?;
        let shape = (0..rank)
            .map(|_| r.u64())
            .collect::<std::result::Result<Vec<usize>, String>>()
            .map_err(err)?;
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| err("parameter size overflows".into()))?;
        let values = r
            .take(numel)
            .map_err(err)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        out.push((shape, values));
    }
    if r.at != bytes.len() {
        return Err(err(format!("{} trailing bytes", bytes.len() - r.at)));
    }
    Ok(out)
}

struct Reader<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> std::result::Result<&'b [u8], String> {
        let s = self
            .at
            .checked_add(n)
            .and_then(|end| self.bytes.get(self.at..end))
            .ok_or_else(|| format!("truncated at byte {}", self.at))?;
        self.at += n;
        Ok(s)
    }

    fn u64(&mut self) -> std::result::Result<usize, String> {
        let b: [u8; 8] = self.take(8)?.try_into().expect("8 bytes");
        usize::try_from(u64::from_le_bytes(b)).map_err(|_| "value out of range".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fucina::exec::ExecContext;

    #[test]
    fn dump_round_trips_and_rejects_damage() {
        let ctx = ExecContext::with_threads(1);
        let a = Tensor::variable_from_slice(&ctx, &[2, 3], &[1., -2., 3.5, 0., 1e-30, 7.]).unwrap();
        let b = Tensor::variable_from_slice(&ctx, &[1], &[f32::MIN_POSITIVE]).unwrap();
        let dir = std::env::temp_dir().join(format!("fucina-dist-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("params.bin");
        write_params(&[a.clone(), b.clone()], &path).unwrap();
        let back = read_params(&path).unwrap();
        assert_eq!(back, vec![(vec![2, 3], a.to_vec()), (vec![1], b.to_vec())]);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.pop();
        std::fs::write(&path, &bytes).unwrap();
        let e = read_params(&path).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        bytes[0] = b'X';
        std::fs::write(&path, &bytes).unwrap();
        let e = read_params(&path).unwrap_err().to_string();
        assert!(e.contains("bad magic"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
