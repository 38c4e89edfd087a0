//! Training checkpoints: a model's parameters, its optimizer's state (AdamW's
//! moments and step count, SGD's momentum) and the position of the run (the next
//! epoch and step, and the sampler's seed and shape), written through
//! [`fucina::checkpoint`] (safetensors; atomic: a crash leaves the previous
//! complete file; loads are all or nothing).
//!
//! Nothing in a checkpoint depends on the rank count: a run saved at 4 ranks
//! resumes at 2 ranks, or in one process, and goes on with the same bits as the
//! run that was never interrupted (the reduction sums the microbatches in an
//! order fixed by the microbatch count, and the sampler's epoch order depends on
//! the seed and the epoch alone).
//!
//! - [`save_checkpoint_rank0`] (collective): rank 0 writes; every rank returns
//!   once the file is complete, with rank 0's error on every rank if it failed.
//! - [`load_checkpoint_rank0`] (collective): rank 0 reads the file and sends its
//!   bytes to every rank (the other ranks need not see rank 0's disk); every rank
//!   loads the same bytes, so every rank gets the same result or the same error.
//! - [`save_checkpoint`] and [`load_checkpoint`]: the same files in one process
//!   (no MPI), e.g. for a `--local` run or to inspect a distributed run's file.
//!
//! Layout of the file: [`fucina::checkpoint::save_module`]'s (`model.<name>`
//! parameters, `optim.<name>` optimizer state) plus the metadata entries
//! `fucina_dist.format` (`1`), `fucina_dist.epoch`, `fucina_dist.step`,
//! `fucina_dist.seed`, `fucina_dist.samples`, `fucina_dist.global_batch`,
//! `fucina_dist.microbatches` and `fucina_dist.ranks` (the rank count of the run
//! that saved it; informative only), and the caller's own entries.
//!
//! The module also keeps the raw parameter dumps of earlier versions
//! ([`write_params`], [`read_params`], [`save_params_rank0`]), deprecated: they
//! hold no optimizer state nor position.

use std::io::Write;
use std::path::Path;

use fucina::autograd::Tensor;
use fucina::checkpoint::{CheckpointError, Metadata};
use fucina::exec::ExecContext;
use fucina::nn::Module;
use fucina::optim::Optimizer;

use crate::error::{DistError, Result};
use crate::sampler::ShardedSampler;
use crate::world::World;

/// The prefix of the metadata keys this module writes; the caller's own
/// metadata must not use it.
pub const METADATA_PREFIX: &str = "fucina_dist.";

const KEY_FORMAT: &str = "fucina_dist.format";
const KEY_EPOCH: &str = "fucina_dist.epoch";
const KEY_STEP: &str = "fucina_dist.step";
const KEY_SEED: &str = "fucina_dist.seed";
const KEY_SAMPLES: &str = "fucina_dist.samples";
const KEY_GLOBAL_BATCH: &str = "fucina_dist.global_batch";
const KEY_MICROBATCHES: &str = "fucina_dist.microbatches";
const KEY_RANKS: &str = "fucina_dist.ranks";
/// The value of `fucina_dist.format` this version writes and reads.
const FORMAT: &str = "1";

/// Where a training run stands: the **next** step to run, as an epoch and a
/// step within it (`0 .. steps_per_epoch`). A run saved at the end of epoch `e`
/// is at `TrainPosition { epoch: e + 1, step: 0 }`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrainPosition {
    /// The epoch of the next step (from 0).
    pub epoch: u64,
    /// The next step within that epoch (from 0).
    pub step: usize,
}

/// What [`load_checkpoint`] and [`load_checkpoint_rank0`] restored besides the
/// model and the optimizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resumed {
    /// Where to go on from.
    pub position: TrainPosition,
    /// The rank count of the run that saved the checkpoint.
    pub saved_ranks: usize,
    /// Every metadata entry of the file (the caller's own, and this module's
    /// `fucina_dist.*` entries).
    pub metadata: Metadata,
}

/// The message of a facade error, without the path that
/// [`DistError::Checkpoint`] adds anyway.
fn describe(e: fucina::Error) -> String {
    match e {
        fucina::Error::Checkpoint(c) => match *c {
            CheckpointError::Io { source, .. } => source.to_string(),
            other => other.to_string(),
        },
        other => other.to_string(),
    }
}

fn checkpoint_error(path: &Path, message: String) -> DistError {
    DistError::Checkpoint {
        path: path.display().to_string(),
        message,
    }
}

/// Checks `position` and `metadata` and writes the file; the error's message.
fn write_checkpoint<M: Module + ?Sized>(
    path: &Path,
    model: &M,
    optimizer: Option<&dyn Optimizer>,
    sampler: &ShardedSampler,
    position: TrainPosition,
    metadata: &[(&str, &str)],
) -> std::result::Result<(), String> {
    if position.step >= sampler.steps_per_epoch() {
        return Err(format!(
            "position step {} is not below the epoch's {} steps (the end of epoch e is \
             epoch e + 1, step 0)",
            position.step,
            sampler.steps_per_epoch()
        ));
    }
    if let Some((key, _)) = metadata
        .iter()
        .find(|(k, _)| k.starts_with(METADATA_PREFIX))
    {
        return Err(format!(
            "metadata key `{key}`: keys starting with `{METADATA_PREFIX}` are reserved for the \
             training position"
        ));
    }
    let own = [
        (KEY_FORMAT, FORMAT.to_string()),
        (KEY_EPOCH, position.epoch.to_string()),
        (KEY_STEP, position.step.to_string()),
        (KEY_SEED, sampler.seed().to_string()),
        (KEY_SAMPLES, sampler.samples().to_string()),
        (KEY_GLOBAL_BATCH, sampler.global_batch().to_string()),
        (KEY_MICROBATCHES, sampler.microbatches().to_string()),
        (KEY_RANKS, sampler.ranks().to_string()),
    ];
    let mut meta: Vec<(&str, &str)> = own.iter().map(|(k, v)| (*k, v.as_str())).collect();
    meta.extend_from_slice(metadata);
    fucina::checkpoint::save_module(path, model, optimizer, &meta).map_err(describe)
}

/// Saves a training checkpoint to `path` in one process (no MPI): `model`'s
/// parameters, `optimizer`'s state (if given), `position` (the next step to
/// run), `sampler`'s seed and shape, and `metadata` (keys must not start with
/// [`METADATA_PREFIX`]). Atomic: the file is written beside `path` and renamed
/// over it, so a crash leaves the previous checkpoint whole.
///
/// ```
/// use fucina::nn::{Linear, Module};
/// use fucina::optim::AdamW;
/// use fucina::ExecContext;
/// use fucina_dist::{ShardedSampler, TrainPosition, load_checkpoint, save_checkpoint};
///
/// let ctx = ExecContext::new();
/// let model = Linear::new(&ctx, 4, 2, 1)?;
/// let opt = AdamW::new(model.parameters(), 0.01)?;
/// let sampler = ShardedSampler::new(100, 20, 4, 7, 0, 1)?;
/// let path = std::env::temp_dir().join(format!("fucina-dist-doc-{}.safetensors", std::process::id()));
/// let at = TrainPosition { epoch: 3, step: 0 };
/// save_checkpoint(&path, &model, Some(&opt), &sampler, at, &[("note", "doc")])?;
///
/// let fresh = Linear::new(&ctx, 4, 2, 99)?;
/// let mut fresh_opt = AdamW::new(fresh.parameters(), 0.01)?;
/// let resumed = load_checkpoint(&ctx, &path, &fresh, Some(&mut fresh_opt), &sampler)?;
/// assert_eq!(resumed.position, at);
/// assert_eq!(resumed.metadata.get("note"), Some("doc"));
/// assert_eq!(fresh.weight.to_vec(), model.weight.to_vec());
///
/// // Another seed draws other epochs: resuming with it is refused.
/// let other = ShardedSampler::new(100, 20, 4, 8, 0, 1)?;
/// assert!(load_checkpoint(&ctx, &path, &fresh, None, &other).is_err());
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`DistError::Checkpoint`] naming `path`: a `position.step` not below the
/// sampler's steps per epoch, a reserved or repeated metadata key, or the
/// write failed.
pub fn save_checkpoint<M: Module + ?Sized>(
    path: impl AsRef<Path>,
    model: &M,
    optimizer: Option<&dyn Optimizer>,
    sampler: &ShardedSampler,
    position: TrainPosition,
    metadata: &[(&str, &str)],
) -> Result<()> {
    let path = path.as_ref();
    write_checkpoint(path, model, optimizer, sampler, position, metadata)
        .map_err(|m| checkpoint_error(path, m))
}

/// [`save_checkpoint`] by rank 0, collectively: every rank calls it with its
/// (identical) model, optimizer and position; rank 0 alone writes, and every
/// rank returns only once rank 0 has finished (the broadcast of rank 0's
/// outcome is the barrier), so a rank that goes on, exits or is killed after
/// the call cannot leave a checkpoint half-written.
///
/// # Errors
/// [`DistError::Checkpoint`] on **every** rank, with rank 0's message, if rank 0
/// could not write the file (or refused the position or metadata).
pub fn save_checkpoint_rank0<M: Module + ?Sized>(
    world: &World,
    path: impl AsRef<Path>,
    model: &M,
    optimizer: Option<&dyn Optimizer>,
    sampler: &ShardedSampler,
    position: TrainPosition,
    metadata: &[(&str, &str)],
) -> Result<()> {
    let path = path.as_ref();
    let mut status = Vec::new();
    if world.is_root()
        && let Err(m) = write_checkpoint(path, model, optimizer, sampler, position, metadata)
    {
        status = m.into_bytes();
    }
    world.broadcast_bytes(&mut status);
    if status.is_empty() {
        Ok(())
    } else {
        Err(checkpoint_error(
            path,
            format!(
                "rank 0 could not write it: {}",
                String::from_utf8_lossy(&status)
            ),
        ))
    }
}

/// Reads a `fucina_dist.*` metadata entry.
fn entry<T: std::str::FromStr>(meta: &Metadata, key: &str) -> std::result::Result<T, String> {
    let v = meta.get(key).ok_or_else(|| {
        format!("no `{key}` entry (not a fucina-dist training checkpoint, or a damaged one)")
    })?;
    v.parse()
        .map_err(|_| format!("`{key}` = `{v}` is not a valid value"))
}

/// Checks the position entries of `meta` against `sampler`.
fn position_of(
    meta: &Metadata,
    sampler: &ShardedSampler,
) -> std::result::Result<(TrainPosition, usize), String> {
    match meta.get(KEY_FORMAT) {
        Some(FORMAT) => {}
        Some(other) => {
            return Err(format!(
                "`{KEY_FORMAT}` = `{other}`: this version reads format {FORMAT}"
            ));
        }
        None => {
            return Err(format!(
                "no `{KEY_FORMAT}` entry: not a fucina-dist training checkpoint (a plain \
                 fucina::checkpoint file has no training position)"
            ));
        }
    }
    let seed: u64 = entry(meta, KEY_SEED)?;
    let samples: usize = entry(meta, KEY_SAMPLES)?;
    let global_batch: usize = entry(meta, KEY_GLOBAL_BATCH)?;
    let microbatches: usize = entry(meta, KEY_MICROBATCHES)?;
    let saved = (seed, samples, global_batch, microbatches);
    let here = (
        sampler.seed(),
        sampler.samples(),
        sampler.global_batch(),
        sampler.microbatches(),
    );
    if saved != here {
        return Err(format!(
            "saved by a run with seed {seed}, {samples} samples, global batch {global_batch} and \
             {microbatches} microbatches; this run has seed {}, {} samples, global batch {} and \
             {} microbatches (its steps would differ: resume with the saved values)",
            here.0, here.1, here.2, here.3
        ));
    }
    let position = TrainPosition {
        epoch: entry(meta, KEY_EPOCH)?,
        step: entry(meta, KEY_STEP)?,
    };
    if position.step >= sampler.steps_per_epoch() {
        return Err(format!(
            "`{KEY_STEP}` = {} is not below the epoch's {} steps",
            position.step,
            sampler.steps_per_epoch()
        ));
    }
    let ranks: usize = entry(meta, KEY_RANKS)?;
    Ok((position, ranks))
}

/// Checks `bytes` (position, sampler) and loads them into `model` and
/// `optimizer`, all or nothing; the error's message.
fn load_bytes<M: Module + ?Sized>(
    ctx: &ExecContext,
    bytes: &[u8],
    model: &M,
    optimizer: Option<&mut dyn Optimizer>,
    sampler: &ShardedSampler,
) -> std::result::Result<Resumed, String> {
    let meta = fucina::checkpoint::read_metadata_from_bytes(bytes)
        .map_err(|e| describe(fucina::Error::from(e)))?;
    let (position, saved_ranks) = position_of(&meta, sampler)?;
    let metadata = fucina::checkpoint::load_module_from_bytes(ctx, bytes, model, optimizer)
        .map_err(describe)?;
    Ok(Resumed {
        position,
        saved_ranks,
        metadata,
    })
}

/// Loads a training checkpoint in one process (no MPI): `model`'s parameters
/// and, with `optimizer`, its state, after checking that the file was saved by
/// a run whose sampler had `sampler`'s seed, sample count, global batch and
/// microbatch count (the rank count may differ). All or nothing: on an error
/// neither the model nor the optimizer has changed.
///
/// # Errors
/// [`DistError::Checkpoint`] naming `path`: the file cannot be read, is not a
/// complete fucina-dist checkpoint, was saved with another sampler, or does
/// not fit the model or the optimizer (a missing, unknown or misshapen entry;
/// an optimizer given for a file saved without one).
pub fn load_checkpoint<M: Module + ?Sized>(
    ctx: &ExecContext,
    path: impl AsRef<Path>,
    model: &M,
    optimizer: Option<&mut dyn Optimizer>,
    sampler: &ShardedSampler,
) -> Result<Resumed> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| checkpoint_error(path, e.to_string()))?;
    load_bytes(ctx, &bytes, model, optimizer, sampler).map_err(|m| checkpoint_error(path, m))
}

/// [`load_checkpoint`], collectively: rank 0 reads `path` and broadcasts its
/// bytes; every rank checks and loads the same bytes into its own model and
/// optimizer, so every rank ends with the same values, or every rank returns
/// the same error with nothing changed. Only rank 0 needs to see the file.
///
/// # Errors
/// As [`load_checkpoint`], on **every** rank.
pub fn load_checkpoint_rank0<M: Module + ?Sized>(
    world: &World,
    ctx: &ExecContext,
    path: impl AsRef<Path>,
    model: &M,
    optimizer: Option<&mut dyn Optimizer>,
    sampler: &ShardedSampler,
) -> Result<Resumed> {
    let path = path.as_ref();
    // Rank 0's outcome first (empty: read), then the length, then the bytes.
    let mut bytes = Vec::new();
    let mut status = Vec::new();
    if world.is_root() {
        match std::fs::read(path) {
            Ok(b) => bytes = b,
            Err(e) => status = e.to_string().into_bytes(),
        }
    }
    world.broadcast_bytes(&mut status);
    if !status.is_empty() {
        return Err(checkpoint_error(
            path,
            format!(
                "rank 0 could not read it: {}",
                String::from_utf8_lossy(&status)
            ),
        ));
    }
    let mut len = (bytes.len() as u64).to_le_bytes().to_vec();
    world.broadcast_bytes(&mut len);
    let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    if !world.is_root() {
        let len = usize::try_from(len)
            .map_err(|_| checkpoint_error(path, format!("{len} bytes do not fit in memory")))?;
        bytes = vec![0; len];
    }
    world.broadcast_slice(&mut bytes);
    load_bytes(ctx, &bytes, model, optimizer, sampler).map_err(|m| checkpoint_error(path, m))
}

const MAGIC: &[u8; 8] = b"FUCDIST1";

/// Deprecated: a raw dump of the parameters alone (no optimizer state, no
/// position), in a format of this crate; use [`save_checkpoint_rank0`].
///
/// Rank 0 writes `params` to `path` (every other rank writes nothing); then all
/// ranks wait for it and learn whether it worked. Collective: every rank calls
/// it, with its (identical) parameters.
///
/// # Errors
/// [`DistError::Checkpoint`] on **every** rank if rank 0 could not write the
/// file (with rank 0's message).
#[deprecated(
    since = "0.1.0",
    note = "use save_checkpoint_rank0: a safetensors checkpoint with the optimizer state and the position"
)]
pub fn save_params_rank0(world: &World, params: &[Tensor], path: &Path) -> Result<()> {
    let mut status = Vec::new();
    #[allow(deprecated)]
    let written = if world.is_root() {
        write_params(params, path)
    } else {
        Ok(())
    };
    if let Err(e) = written {
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

/// Deprecated: use [`save_checkpoint`].
///
/// Writes `params` to `path` (no MPI: one process) as a raw dump: the 8 bytes
/// `FUCDIST1`, the parameter count (`u64` LE), then per parameter its rank
/// (`u64`), its dimensions (`u64` each) and its elements (`f32` LE bits);
/// written to `<path>.tmp`, then renamed over `path`.
///
/// # Errors
/// The I/O error, as [`std::io::Error`].
#[deprecated(since = "0.1.0", note = "use save_checkpoint (safetensors)")]
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

/// Deprecated: use [`load_checkpoint`].
///
/// Reads a dump written by [`write_params`]: each parameter's shape and values.
///
/// # Errors
/// [`DistError::Checkpoint`] if the file cannot be read or is not such a dump
/// (bad magic, truncated, trailing bytes).
#[deprecated(since = "0.1.0", note = "use load_checkpoint (safetensors)")]
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
#[allow(deprecated)]
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

#[cfg(test)]
mod checkpoint_tests {
    use super::*;
    use fucina::nn::Linear;
    use fucina::optim::AdamW;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "fucina-dist-checkpoint-{tag}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// One AdamW step of `model` on a fixed input.
    fn train_step(ctx: &ExecContext, model: &Linear, opt: &mut AdamW) {
        let x = Tensor::from_slice(ctx, &[2, 3], &[1., -2., 3., 0.5, 4., -1.]).unwrap();
        opt.zero_grad();
        let loss = model.forward(ctx, &x).unwrap().mean_all(ctx).unwrap();
        loss.backward(ctx).unwrap();
        opt.step(ctx).unwrap();
    }

    fn bits(m: &Linear) -> Vec<u32> {
        m.parameters()
            .iter()
            .flat_map(|p| p.tensor().to_vec())
            .map(f32::to_bits)
            .collect()
    }

    #[test]
    fn a_resumed_run_goes_on_with_the_same_bits() {
        let ctx = ExecContext::with_threads(1);
        let d = dir("resume");
        let path = d.join("run.safetensors");
        let sampler = ShardedSampler::new(64, 16, 4, 5, 1, 4).unwrap();
        let model = Linear::new(&ctx, 3, 2, 1).unwrap();
        let mut opt = AdamW::new(model.parameters(), 0.05).unwrap();
        for _ in 0..3 {
            train_step(&ctx, &model, &mut opt);
        }
        let at = TrainPosition { epoch: 2, step: 3 };
        save_checkpoint(&path, &model, Some(&opt), &sampler, at, &[("lr", "0.05")]).unwrap();
        // The uninterrupted run goes on.
        train_step(&ctx, &model, &mut opt);
        train_step(&ctx, &model, &mut opt);

        // A fresh run on another rank count (1 of 1) resumes from the file.
        let one = ShardedSampler::new(64, 16, 4, 5, 0, 1).unwrap();
        let fresh = Linear::new(&ctx, 3, 2, 77).unwrap();
        let mut fresh_opt = AdamW::new(fresh.parameters(), 0.05).unwrap();
        let r = load_checkpoint(&ctx, &path, &fresh, Some(&mut fresh_opt), &one).unwrap();
        assert_eq!(r.position, at);
        assert_eq!(r.saved_ranks, 4);
        assert_eq!(r.metadata.get("lr"), Some("0.05"));
        assert_eq!(fresh_opt.step_count(), 3);
        train_step(&ctx, &fresh, &mut fresh_opt);
        train_step(&ctx, &fresh, &mut fresh_opt);
        // Equal only if the moments and the step count came back too.
        assert_eq!(bits(&fresh), bits(&model));

        // Without the optimizer state the continuation differs (the check above
        // can fail).
        let bare = Linear::new(&ctx, 3, 2, 77).unwrap();
        let mut bare_opt = AdamW::new(bare.parameters(), 0.05).unwrap();
        load_checkpoint(&ctx, &path, &bare, None, &one).unwrap();
        train_step(&ctx, &bare, &mut bare_opt);
        train_step(&ctx, &bare, &mut bare_opt);
        assert_ne!(bits(&bare), bits(&model));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn bad_files_and_mismatches_are_errors_naming_the_file_and_change_nothing() {
        let ctx = ExecContext::with_threads(1);
        let d = dir("bad");
        let path = d.join("run.safetensors");
        let sampler = ShardedSampler::new(64, 16, 4, 5, 0, 2).unwrap();
        let model = Linear::new(&ctx, 3, 2, 1).unwrap();
        let mut opt = AdamW::new(model.parameters(), 0.05).unwrap();
        train_step(&ctx, &model, &mut opt);
        let at = TrainPosition { epoch: 1, step: 0 };
        save_checkpoint(&path, &model, Some(&opt), &sampler, at, &[]).unwrap();

        let target = Linear::new(&ctx, 3, 2, 9).unwrap();
        let mut target_opt = AdamW::new(target.parameters(), 0.05).unwrap();
        let before = bits(&target);
        let shown = path.display().to_string();
        let mut refused = |p: &Path, s: &ShardedSampler, want: &str| {
            let e = load_checkpoint(&ctx, p, &target, Some(&mut target_opt), s)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&p.display().to_string()), "{e}");
            assert!(e.contains(want), "{e}");
            assert_eq!(bits(&target), before, "{e}: the model changed");
            assert_eq!(target_opt.step_count(), 0, "{e}: the optimizer changed");
        };
        // Another seed, batch or microbatch count.
        for (other, want) in [
            (ShardedSampler::new(64, 16, 4, 6, 0, 1).unwrap(), "seed 5"),
            (
                ShardedSampler::new(64, 32, 4, 5, 0, 1).unwrap(),
                "global batch 16",
            ),
            (
                ShardedSampler::new(64, 16, 2, 5, 0, 1).unwrap(),
                "4 microbatches",
            ),
        ] {
            refused(&path, &other, want);
        }
        // A truncated file.
        let bytes = std::fs::read(&path).unwrap();
        let cut = d.join("cut.safetensors");
        std::fs::write(&cut, &bytes[..bytes.len() - 4]).unwrap();
        refused(&cut, &sampler, "safetensors");
        // A missing file.
        refused(&d.join("missing.safetensors"), &sampler, "No such file");
        // A plain fucina checkpoint (no training position).
        let plain = d.join("plain.safetensors");
        fucina::checkpoint::save_module(&plain, &model, Some(&opt), &[]).unwrap();
        refused(&plain, &sampler, "not a fucina-dist training checkpoint");
        // A model of another shape: the position fits, the parameters do not.
        let wide = Linear::new(&ctx, 4, 2, 9).unwrap();
        let e = load_checkpoint(&ctx, &path, &wide, None, &sampler).unwrap_err();
        assert!(e.to_string().contains(&shown), "{e}");
        assert!(e.to_string().contains("shape"), "{e}");

        // Saving: a position past the epoch, a reserved key, a missing directory.
        let past = TrainPosition { epoch: 0, step: 4 };
        let e = save_checkpoint(&path, &model, None, &sampler, past, &[]).unwrap_err();
        assert!(
            e.to_string().contains("not below the epoch's 4 steps"),
            "{e}"
        );
        let e = save_checkpoint(
            &path,
            &model,
            None,
            &sampler,
            at,
            &[("fucina_dist.epoch", "9")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        let nowhere = d.join("no-such-dir").join("x.safetensors");
        let e = save_checkpoint(&nowhere, &model, None, &sampler, at, &[]).unwrap_err();
        assert!(
            e.to_string().contains(&nowhere.display().to_string()),
            "{e}"
        );
        // The refused saves left the good file as it was.
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
