//! Little-endian f32 `.npy` files (NumPy's format, version 1.0), written and
//! read without NumPy: the `generate` example's `--logits-out` and the fixture
//! tests (which include this file with `#[path]`).
//!
//! The layout: the magic `\x93NUMPY`, the version bytes `1 0`, the header length
//! as a little-endian `u16`, the header (a Python dict literal
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (T, V), }` padded with
//! spaces and ended by `\n`), then the values in C order. The padding is what
//! `numpy.save` writes: room for the first dimension to grow to 21 digits, then
//! up to the next multiple of 64 bytes for the whole preamble, so a file written
//! here has the bytes of `numpy.save(path, array.astype('<f4'))`.
#![allow(dead_code)] // not every including target uses every function

use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The Python repr of a shape tuple: `()`, `(5,)`, `(2, 3)`.
fn shape_repr(shape: &[usize]) -> String {
    match shape {
        [] => "()".to_string(),
        [n] => format!("({n},)"),
        _ => {
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            format!("({})", dims.join(", "))
        }
    }
}

/// The bytes of a `.npy` file holding `data` with `shape` (C order).
///
/// Panics if `data.len()` is not the product of `shape` (a caller bug).
pub(crate) fn npy_f32_bytes(shape: &[usize], data: &[f32]) -> Vec<u8> {
    assert_eq!(
        shape.iter().product::<usize>(),
        data.len(),
        "npy_f32_bytes: {} values do not fill shape {shape:?}",
        data.len()
    );
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': {}, }}",
        shape_repr(shape)
    );
    // Spare room for the first dimension to grow to 21 digits (as numpy.save).
    if let Some(first) = shape.first() {
        header.push_str(&" ".repeat(21usize.saturating_sub(first.to_string().len())));
    }
    // Magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + 4 * data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Writes `data` with `shape` to `path` as a `.npy` file.
pub(crate) fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) -> std::io::Result<()> {
    std::fs::write(path, npy_f32_bytes(shape, data))
}

/// Reads a little-endian f32, C-order `.npy` file (version 1.0 or 2.0): its
/// shape and values.
pub(crate) fn parse_npy_f32(bytes: &[u8]) -> Result<(Vec<usize>, Vec<f32>), String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (no \\x93NUMPY magic)".to_string());
    }
    let (hlen, start): (usize, usize) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let end = start
        .checked_add(hlen)
        .filter(|&e| e <= bytes.len())
        .ok_or("header longer than the file")?;
    let header =
        std::str::from_utf8(&bytes[start..end]).map_err(|_| "header is not UTF-8".to_string())?;
    let field = |key: &str| -> Result<&str, String> {
        let at = header
            .find(&format!("'{key}':"))
            .ok_or(format!("header has no '{key}'"))?;
        Ok(header[at + key.len() + 3..].trim_start())
    };
    if !field("descr")?.starts_with("'<f4'") {
        return Err(format!("dtype is not little-endian f32: {header}"));
    }
    if !field("fortran_order")?.starts_with("False") {
        return Err("Fortran-order arrays are not supported".to_string());
    }
    let shape_text = field("shape")?;
    let close = shape_text.find(')').ok_or("unterminated shape")?;
    let shape = shape_text[1..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|e| format!("bad dimension {s:?}: {e}"))
        })
        .collect::<Result<Vec<usize>, String>>()?;
    let n: usize = shape.iter().product();
    let data = &bytes[end..];
    if data.len() != 4 * n {
        return Err(format!(
            "shape {shape:?} needs {} bytes of data, the file has {}",
            4 * n,
            data.len()
        ));
    }
    let values = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((shape, values))
}

/// Reads the `.npy` file at `path` (see [`parse_npy_f32`]).
pub(crate) fn read_npy_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_npy_f32(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}
