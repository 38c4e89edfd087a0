//! Checkpoints: named `f32` tensors plus string metadata, in the
//! [safetensors](https://github.com/huggingface/safetensors) format.
//!
//! - **Names** are the caller's stable strings (a model's parameter names, an
//!   optimizer's state names); a checkpoint never depends on the order in which
//!   tensors are listed.
//! - **Deterministic bytes**: equal names, shapes, values and metadata give
//!   byte-identical files, whatever the order they were listed in.
//! - **Data** is stored as `F32`, little-endian, row-major, whatever the
//!   layout of the tensor saved (a transposed or narrowed view is written in its
//!   logical order). Loading is bit-exact, NaN payloads included.
//! - **Half-precision files** load too: a tensor stored as `F16` or `BF16` (the
//!   dtypes of most published model weights) is widened to an `f32` tensor on
//!   load. The widening is exact: every f16 and bf16 value is an f32 value, and
//!   infinities, signed zeros and subnormals keep their values; a bf16 NaN keeps
//!   its bits, an f16 NaN its sign and payload (a signaling one comes back
//!   quiet). Saving always writes `F32`.
//! - **Metadata** is a string-to-string map (the safetensors `__metadata__`
//!   entry): step counters, learning-rate schedule positions, format versions.
//! - **Atomic save**: [`save`] writes a temporary file in the destination's
//!   directory, syncs it and renames it over `path`, so a crash leaves either the
//!   old checkpoint or the new one, never a truncated file.
//! - **All-or-nothing load**: [`load_into`] checks every name, dtype and shape
//!   and decodes every byte before it writes any target; on an error no target
//!   has changed.
//! - **No aborts, stable errors**: sizes are computed in checked arithmetic and
//!   the bytes of a save are reserved fallibly ([`CheckpointError::OutOfMemory`]
//!   names the tensor, even for a view showing more elements than memory holds);
//!   files are checked in a fixed order, so an error names the same tensor on
//!   every run.
//!
//! ```
//! use fucina::checkpoint;
//! use fucina::{ExecContext, Tensor};
//!
//! let ctx = ExecContext::new();
//! let w = Tensor::variable_from_slice(&ctx, &[2, 2], &[1., 2., 3., 4.])?;
//! let b = Tensor::variable_from_slice(&ctx, &[2], &[0.5, -0.5])?;
//! let bytes = checkpoint::save_to_bytes(&[("fc.weight", &w), ("fc.bias", &b)], &[("step", "10")])?;
//!
//! let mut w2 = Tensor::variable_from_slice(&ctx, &[2, 2], &[0.; 4])?;
//! let mut b2 = Tensor::variable_from_slice(&ctx, &[2], &[0.; 2])?;
//! let meta = checkpoint::load_into_from_bytes(
//!     &bytes,
//!     &mut [("fc.weight", &mut w2), ("fc.bias", &mut b2)],
//! )?;
//! assert_eq!(w2.to_vec(), [1., 2., 3., 4.]);
//! assert!(w2.is_variable()); // loaded in place: still the same variable
//! assert_eq!(meta.get("step"), Some("10"));
//!
//! // A wrong shape is refused, and nothing is written.
//! let mut small = Tensor::variable_from_slice(&ctx, &[3], &[7.; 3])?;
//! let err = checkpoint::load_into_from_bytes(&bytes, &mut [("fc.bias", &mut small)]);
//! assert!(matches!(err, Err(checkpoint::CheckpointError::ShapeMismatch { .. })));
//! assert_eq!(small.to_vec(), [7.; 3]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::nn::{Module, StateDict};
use crate::optim::Optimizer;
use crate::safetensors_header::{
    self, Dtype, HeaderError, HeaderTensor, LEN_PREFIX, MAX_HEADER_BYTES, METADATA_KEY,
};
use fucina_autograd::{AutogradError, Tensor};
use fucina_exec::{ExecContext, MAX_RANK};
use fucina_storage::half::f16;

/// The string metadata stored with a checkpoint (sorted by key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata(pub BTreeMap<String, String>);

impl Metadata {
    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The entries, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The underlying map.
    pub fn into_inner(self) -> BTreeMap<String, String> {
        self.0
    }
}

/// Everything saving or loading a checkpoint can refuse.
///
/// Every variant names what was wrong (the path, the tensor name, the shapes or
/// dtypes). A load that returns an error has changed no target.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading or writing the file failed.
    #[error("checkpoint {}: {source}", path.display())]
    Io {
        /// The checkpoint path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid safetensors file (truncated or corrupt header or
    /// data, not a safetensors file at all).
    #[error("not a valid safetensors checkpoint: {reason}")]
    Format {
        /// What is wrong with the bytes.
        reason: String,
    },
    /// A target asked for a tensor the checkpoint does not hold.
    #[error("the checkpoint has no tensor named `{name}`")]
    MissingTensor {
        /// The name asked for.
        name: String,
    },
    /// A strict load ([`LoadOptions::strict`]) found a tensor that no target asked for.
    #[error("the checkpoint holds tensor `{name}`, which no target asked for (strict load)")]
    UnexpectedTensor {
        /// The tensor's name in the checkpoint.
        name: String,
    },
    /// A stored tensor's shape differs from its target's.
    #[error(
        "tensor `{name}`: the checkpoint has shape {found:?}, the target has shape {expected:?}"
    )]
    ShapeMismatch {
        /// The tensor's name.
        name: String,
        /// The target's shape.
        expected: Vec<usize>,
        /// The shape in the checkpoint.
        found: Vec<usize>,
    },
    /// A stored tensor's element type is not one fucina reads (`F32`, `F16`,
    /// `BF16`).
    #[error("tensor `{name}`: the checkpoint stores {found}, expected {expected}")]
    DTypeMismatch {
        /// The tensor's name.
        name: String,
        /// The element types accepted (`"F32, F16 or BF16"`).
        expected: String,
        /// The element type in the checkpoint.
        found: String,
    },
    /// A tensor name appears twice (in the tensors to save, in the targets to
    /// load, or in the checkpoint's header).
    #[error("the tensor name `{name}` appears more than once")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// A metadata key appears twice (in the metadata to save, or in the
    /// checkpoint's metadata map).
    #[error("the metadata key `{key}` appears more than once")]
    DuplicateMetadataKey {
        /// The repeated key.
        key: String,
    },
    /// A tensor name cannot be stored (to save), or a file holds one that
    /// could not have been (to load or read).
    #[error("invalid tensor name `{name}`: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A stored tensor has a shape no fucina tensor can have (rank 0 or above 8,
    /// or a zero dimension).
    #[error(
        "tensor `{name}` has shape {shape:?}, which a fucina tensor cannot hold (rank 1 to 8, no zero dimension)"
    )]
    UnsupportedShape {
        /// The tensor's name.
        name: String,
        /// The shape in the checkpoint.
        shape: Vec<usize>,
    },
    /// The bytes of a checkpoint cannot be held in memory: a tensor's size in
    /// bytes overflows `usize`, or the memory for the file's bytes cannot be
    /// allocated (a huge broadcast view saves as every element it shows).
    #[error("tensor `{name}` of shape {shape:?}: {reason}")]
    OutOfMemory {
        /// The tensor whose size overflows, or the largest tensor of a
        /// checkpoint whose bytes could not be allocated.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
        /// What failed, with the sizes in bytes.
        reason: String,
    },
    /// Making or writing a tensor failed (out of memory). Boxed: it is rare, and
    /// an inline exec error would make every checkpoint `Result` large.
    #[error(transparent)]
    Tensor(#[from] Box<AutogradError>),
}

impl From<AutogradError> for CheckpointError {
    fn from(e: AutogradError) -> Self {
        CheckpointError::Tensor(Box::new(e))
    }
}

/// Options of [`load_into_with_options`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Refuse a checkpoint that holds tensors no target asks for
    /// ([`CheckpointError::UnexpectedTensor`]). Off by default, so that the
    /// parameters can be loaded alone from a file that also holds optimizer state.
    pub strict: bool,
}

fn format_error(e: impl fmt::Display) -> CheckpointError {
    CheckpointError::Format {
        reason: e.to_string(),
    }
}

/// Serializes `tensors` (as `F32`) and `metadata` into the bytes of a
/// safetensors file.
///
/// The bytes depend only on the names, shapes, values and metadata, not on the
/// order of the lists: the header's keys are sorted, and the data follows the
/// sorted tensor names (the data section starts 8-byte aligned).
///
/// # Errors
/// [`CheckpointError::DuplicateName`] if a name is given twice;
/// [`CheckpointError::DuplicateMetadataKey`] if a metadata key is given twice;
/// [`CheckpointError::InvalidName`] for an empty name or the reserved
/// `__metadata__`; [`CheckpointError::OutOfMemory`] if the file's bytes cannot
/// be allocated (or counted in a `usize`). Errors are found in a fixed order
/// (the lists in the order given, then the tensors sorted by name), so the same
/// input always gives the same error.
pub fn save_to_bytes(
    tensors: &[(&str, &Tensor)],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>, CheckpointError> {
    check_names(tensors, metadata)?;
    // The header is written here rather than by `safetensors::serialize`, whose
    // metadata map is a `HashMap`: its iteration order would make the bytes of
    // two saves of the same state differ. Keys are sorted, so equal states give
    // equal files.
    let mut sorted: Vec<(&str, &Tensor)> = tensors.to_vec();
    sorted.sort_unstable_by_key(|&(name, _)| name);
    let mut meta: Vec<(&str, &str)> = metadata.to_vec();
    meta.sort_unstable();
    let (ranges, data_bytes) = data_ranges(&sorted)?;
    let header = header_json(&meta, &sorted, &ranges)?;
    let mut out = reserve_file(header.len(), data_bytes, &sorted, &ranges)?;
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for (_, t) in &sorted {
        write_values(&mut out, t);
    }
    debug_assert!(safetensors_header::parse(&out, &Dtype::ALL).is_ok());
    Ok(out)
}

/// The names' and metadata keys' checks of [`save_to_bytes`], in the order
/// given: an empty or reserved tensor name, a tensor name or a metadata key
/// given twice.
fn check_names(
    tensors: &[(&str, &Tensor)],
    metadata: &[(&str, &str)],
) -> Result<(), CheckpointError> {
    let mut names = HashSet::with_capacity(tensors.len());
    for &(name, _) in tensors {
        if name.is_empty() {
            return Err(CheckpointError::InvalidName {
                name: name.to_string(),
                reason: "a tensor name must not be empty",
            });
        }
        if name == METADATA_KEY {
            return Err(CheckpointError::InvalidName {
                name: name.to_string(),
                reason: "the name is reserved for the metadata map",
            });
        }
        if !names.insert(name) {
            return Err(CheckpointError::DuplicateName {
                name: name.to_string(),
            });
        }
    }
    let mut keys = HashSet::with_capacity(metadata.len());
    for &(key, _) in metadata {
        if !keys.insert(key) {
            return Err(CheckpointError::DuplicateMetadataKey {
                key: key.to_string(),
            });
        }
    }
    Ok(())
}

/// Each tensor's byte range in the data section (the tensors in `sorted`
/// order, one after the other) and the section's size, in checked
/// arithmetic: a view can show more elements than memory holds (a broadcast),
/// or more bytes than `usize` counts.
fn data_ranges(
    sorted: &[(&str, &Tensor)],
) -> Result<(Vec<(usize, usize)>, usize), CheckpointError> {
    let mut offset = 0usize;
    let mut ranges = Vec::with_capacity(sorted.len());
    for &(name, t) in sorted {
        let len = t
            .shape()
            .iter()
            .try_fold(std::mem::size_of::<f32>(), |acc, &d| acc.checked_mul(d));
        let end = len.and_then(|len| offset.checked_add(len));
        let Some(end) = end else {
            return Err(CheckpointError::OutOfMemory {
                name: name.to_string(),
                shape: t.shape().to_vec(),
                reason: format!(
                    "its data, with the tensors sorted before it, takes more bytes than usize counts ({})",
                    usize::MAX
                ),
            });
        };
        ranges.push((offset, end));
        offset = end;
    }
    Ok((ranges, offset))
}

/// The JSON header: the sorted metadata map, then each sorted tensor's dtype,
/// shape and data offsets; padded with spaces so that the data starts 8-byte
/// aligned, and refused above the format's limit.
fn header_json(
    meta: &[(&str, &str)],
    sorted: &[(&str, &Tensor)],
    ranges: &[(usize, usize)],
) -> Result<String, CheckpointError> {
    let json = |s: &str| serde_json::to_string(s).map_err(format_error);
    let mut header = String::from("{");
    if !meta.is_empty() {
        header.push_str(&json(METADATA_KEY)?);
        header.push_str(":{");
        for (i, (k, v)) in meta.iter().enumerate() {
            if i > 0 {
                header.push(',');
            }
            header.push_str(&json(k)?);
            header.push(':');
            header.push_str(&json(v)?);
        }
        header.push('}');
    }
    for (i, ((name, t), (start, end))) in sorted.iter().zip(ranges).enumerate() {
        if i > 0 || !meta.is_empty() {
            header.push(',');
        }
        let shape = t.shape().iter().map(usize::to_string).collect::<Vec<_>>();
        header.push_str(&json(name)?);
        header.push_str(&format!(
            r#":{{"dtype":"F32","shape":[{}],"data_offsets":[{start},{end}]}}"#,
            shape.join(","),
        ));
    }
    header.push('}');
    while header.len() % LEN_PREFIX != 0 {
        header.push(' ');
    }
    if header.len() as u64 > MAX_HEADER_BYTES {
        return Err(CheckpointError::Format {
            reason: format!(
                "the header would take {} bytes, above the format's limit of {MAX_HEADER_BYTES}",
                header.len()
            ),
        });
    }
    Ok(header)
}

/// An empty buffer with room for the whole file (the length prefix, a header
/// of `header_bytes` and `data_bytes` of data), reserved fallibly: a failure is
/// an error naming the largest tensor, never an abort.
fn reserve_file(
    header_bytes: usize,
    data_bytes: usize,
    sorted: &[(&str, &Tensor)],
    ranges: &[(usize, usize)],
) -> Result<Vec<u8>, CheckpointError> {
    let total = (LEN_PREFIX + header_bytes).checked_add(data_bytes);
    let mut out: Vec<u8> = Vec::new();
    let reserved = match total {
        Some(total) => out
            .try_reserve_exact(total)
            .map_err(|e| (total.to_string(), e.to_string())),
        None => Err((
            "more than usize::MAX".to_string(),
            "capacity overflow".to_string(),
        )),
    };
    if let Err((bytes, why)) = reserved {
        let (name, t) = sorted
            .iter()
            .zip(ranges)
            .max_by_key(|&(&(name, _), &(s, e))| (e - s, std::cmp::Reverse(name)))
            .map(|(nt, _)| *nt)
            .expect("a failed reservation has data, so at least one tensor");
        return Err(CheckpointError::OutOfMemory {
            name: name.to_string(),
            shape: t.shape().to_vec(),
            reason: format!(
                "out of memory: the checkpoint takes {bytes} bytes, which cannot be allocated ({why}); this is its largest tensor"
            ),
        });
    }
    Ok(out)
}

/// Appends `t`'s values, little-endian, in logical order (a non-contiguous
/// view is read in place: no copy of the view is made).
fn write_values(out: &mut Vec<u8>, t: &Tensor) {
    let raw = t.raw();
    match raw.data() {
        Ok(values) => {
            for v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Err(_) => {
            let src: &[f32] = raw.buffer();
            raw.layout()
                .for_each_index(|i| out.extend_from_slice(&src[i].to_le_bytes()));
        }
    }
}

/// Saves `tensors` and `metadata` to `path` atomically: the bytes go to a
/// temporary file in the same directory, which is synced and then renamed over
/// `path` (an existing checkpoint is replaced only by a complete one).
///
/// # Errors
/// The errors of [`save_to_bytes`]; [`CheckpointError::Io`] if the file cannot be
/// written or renamed (the temporary file is removed).
pub fn save(
    path: impl AsRef<Path>,
    tensors: &[(&str, &Tensor)],
    metadata: &[(&str, &str)],
) -> Result<(), CheckpointError> {
    let bytes = save_to_bytes(tensors, metadata)?;
    write_atomically(path.as_ref(), &bytes)
}

/// Distinguishes the temporary files of concurrent saves within one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let Some(file_name) = path.file_name() else {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path does not name a file",
        )));
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (tmp, mut file) = loop {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(
            ".{}.{}.{n}.tmp",
            file_name.to_string_lossy(),
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(file) => break (tmp, file),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io(e)),
        }
    };
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| {
            drop(file);
            std::fs::rename(&tmp, path)
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    // Persist the rename itself (best effort: not every platform can open a
    // directory for syncing).
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The element types a checkpoint's tensors are read from, as the header
/// spells them.
const READABLE_DTYPES: &str = "F32, F16 or BF16";

/// Refuses a tensor not stored as `F32`, `F16` or `BF16` (the element types
/// fucina reads; the half-precision ones are widened to `f32` exactly).
fn check_dtype(info: &HeaderTensor) -> Result<(), CheckpointError> {
    if !matches!(info.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
        return Err(CheckpointError::DTypeMismatch {
            name: info.name.clone(),
            expected: READABLE_DTYPES.to_string(),
            found: info.dtype.name().to_string(),
        });
    }
    Ok(())
}

/// A checked safetensors file: its header and data section.
struct Parsed<'a> {
    header: safetensors_header::Header,
    data: &'a [u8],
}

impl Parsed<'_> {
    /// The tensor names, sorted.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.header.tensors.iter().map(|t| t.name.clone()).collect();
        names.sort_unstable();
        names
    }

    /// The header entry of tensor `name`.
    fn info(&self, name: &str) -> Option<&HeaderTensor> {
        self.header.tensors.iter().find(|t| t.name == name)
    }

    fn metadata(&self) -> Metadata {
        Metadata(self.header.metadata.clone())
    }

    /// The elements of tensor `info` as `f32`: `F32` bit for bit, `F16` and
    /// `BF16` widened exactly.
    fn decode(&self, info: &HeaderTensor) -> Result<Vec<f32>, CheckpointError> {
        check_dtype(info)?;
        // The header check put the range inside the data, of the shape's size.
        let Some(bytes) = self.data.get(info.range.clone()) else {
            return Err(CheckpointError::Format {
                reason: format!(
                    "tensor `{}`: its data offsets do not match its shape",
                    info.name
                ),
            });
        };
        Ok(match info.dtype {
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            // bfloat16 is the upper half of a binary32: the shift is exact for
            // every pattern, NaN payloads included.
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                .collect(),
            _ => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        })
    }
}

/// Checks the framing and header of a safetensors file with the shared
/// validator ([`safetensors_header::parse`]: the header's JSON, every
/// tensor's name, dtype, shape and offsets in a fixed order, and that the
/// data section ends exactly at the end of `bytes`).
fn parse(bytes: &[u8]) -> Result<Parsed<'_>, CheckpointError> {
    let header = safetensors_header::parse(bytes, &Dtype::ALL).map_err(header_error)?;
    let data = &bytes[header.data_start..];
    Ok(Parsed { header, data })
}

/// A header fault as a checkpoint error: a repeated name or metadata key and
/// an empty name as their own variants, the rest as
/// [`CheckpointError::Format`] naming the tensor at fault.
fn header_error(e: HeaderError) -> CheckpointError {
    match e {
        HeaderError::DuplicateName { name } => CheckpointError::DuplicateName { name },
        HeaderError::DuplicateMetadataKey { key } => CheckpointError::DuplicateMetadataKey { key },
        HeaderError::EmptyName => CheckpointError::InvalidName {
            name: String::new(),
            reason: "a tensor name must not be empty",
        },
        e => CheckpointError::Format {
            reason: match e.tensor() {
                Some(name) => format!("tensor `{name}`: {e}"),
                None => e.to_string(),
            },
        },
    }
}

/// Loads the tensors named by `targets` from the checkpoint at `path` into the
/// targets, in place, and returns the checkpoint's metadata.
///
/// All or nothing: every name, dtype and shape is checked and every byte decoded
/// before any target is written; on an error no target has changed. The writes
/// are copy-on-write ([`Tensor::update_`]): a variable stays the same variable
/// (its gradient state is kept), and other handles that shared the target's
/// storage (a graph's saved activations, clones taken before the load) keep the
/// old values. Tensors of the checkpoint that no target names are ignored (see
/// [`load_into_with_options`] for a strict load). A tensor stored as `F16` or
/// `BF16` is widened to `f32` exactly (see the [module docs](self)).
///
/// # Errors
/// [`CheckpointError::Io`] if the file cannot be read; the errors of
/// [`load_into_from_bytes`].
pub fn load_into(
    path: impl AsRef<Path>,
    targets: &mut [(&str, &mut Tensor)],
) -> Result<Metadata, CheckpointError> {
    load_into_with_options(path, targets, LoadOptions::default())
}

/// [`load_into`] with [`LoadOptions`].
///
/// # Errors
/// As [`load_into`]; [`CheckpointError::UnexpectedTensor`] for a strict load of a
/// checkpoint holding a tensor no target names.
pub fn load_into_with_options(
    path: impl AsRef<Path>,
    targets: &mut [(&str, &mut Tensor)],
    options: LoadOptions,
) -> Result<Metadata, CheckpointError> {
    let bytes = read_file(path.as_ref())?;
    load_into_from_bytes_with_options(&bytes, targets, options)
}

/// [`load_into`] from the bytes of a safetensors file.
///
/// # Errors
/// [`CheckpointError::DuplicateName`] if two targets share a name or the header
/// repeats a name; [`CheckpointError::DuplicateMetadataKey`] if the header's
/// metadata repeats a key; [`CheckpointError::InvalidName`] if the file holds a
/// tensor with an empty name; [`CheckpointError::Format`] if the bytes are not a
/// complete, valid safetensors file; [`CheckpointError::MissingTensor`],
/// [`CheckpointError::DTypeMismatch`], [`CheckpointError::ShapeMismatch`] for a
/// target the checkpoint does not match; [`CheckpointError::Tensor`] if a
/// target's storage cannot be allocated. No target changes on any of them.
pub fn load_into_from_bytes(
    bytes: &[u8],
    targets: &mut [(&str, &mut Tensor)],
) -> Result<Metadata, CheckpointError> {
    load_into_from_bytes_with_options(bytes, targets, LoadOptions::default())
}

/// [`load_into_from_bytes`] with [`LoadOptions`].
///
/// # Errors
/// As [`load_into_from_bytes`]; [`CheckpointError::UnexpectedTensor`] for a
/// strict load of a checkpoint holding a tensor no target names.
pub fn load_into_from_bytes_with_options(
    bytes: &[u8],
    targets: &mut [(&str, &mut Tensor)],
    options: LoadOptions,
) -> Result<Metadata, CheckpointError> {
    let mut wanted = HashSet::with_capacity(targets.len());
    for (name, _) in targets.iter() {
        if !wanted.insert(*name) {
            return Err(CheckpointError::DuplicateName {
                name: name.to_string(),
            });
        }
    }
    let parsed = parse(bytes)?;
    if options.strict
        && let Some(name) = parsed
            .names()
            .into_iter()
            .find(|n| !wanted.contains(n.as_str()))
    {
        return Err(CheckpointError::UnexpectedTensor { name });
    }
    // 1. Check and decode everything; nothing is written yet.
    let mut values = Vec::with_capacity(targets.len());
    for (name, target) in targets.iter() {
        let Some(info) = parsed.info(name) else {
            return Err(CheckpointError::MissingTensor {
                name: name.to_string(),
            });
        };
        check_dtype(info)?;
        if info.shape.as_slice() != target.shape() {
            return Err(CheckpointError::ShapeMismatch {
                name: name.to_string(),
                expected: target.shape().to_vec(),
                found: info.shape.clone(),
            });
        }
        values.push(parsed.decode(info)?);
    }
    // 2. Give every target contiguous storage of its own, with its current
    //    values: the only step that can fail (out of memory), and it changes no
    //    value.
    for (_, target) in targets.iter_mut() {
        target.update_(|_| ())?;
    }
    // 3. Write in place (no allocation left to fail).
    for ((_, target), v) in targets.iter_mut().zip(values) {
        target.update_(|dst| dst.copy_from_slice(&v))?;
    }
    Ok(parsed.metadata())
}

/// Reads every tensor of the checkpoint at `path` as a new constant `f32`
/// tensor (sorted by name; `F16` and `BF16` data widened exactly), with the
/// metadata.
///
/// # Errors
/// [`CheckpointError::Io`] if the file cannot be read; the errors of
/// [`read_from_bytes`].
pub fn read(
    ctx: &ExecContext,
    path: impl AsRef<Path>,
) -> Result<(Vec<(String, Tensor)>, Metadata), CheckpointError> {
    let bytes = read_file(path.as_ref())?;
    read_from_bytes(ctx, &bytes)
}

/// [`read`] from the bytes of a safetensors file.
///
/// # Errors
/// [`CheckpointError::Format`] if the bytes are not a complete, valid safetensors
/// file; [`CheckpointError::DuplicateName`] if the header repeats a name;
/// [`CheckpointError::DuplicateMetadataKey`] if its metadata repeats a key;
/// [`CheckpointError::InvalidName`] for a tensor with an empty name;
/// [`CheckpointError::DTypeMismatch`] for a tensor that is not `F32`, `F16` or
/// `BF16` (the last two are widened to `f32` exactly);
/// [`CheckpointError::UnsupportedShape`] for a shape of rank 0 or above 8 or with
/// a zero dimension; [`CheckpointError::Tensor`] if a tensor cannot be allocated.
pub fn read_from_bytes(
    ctx: &ExecContext,
    bytes: &[u8],
) -> Result<(Vec<(String, Tensor)>, Metadata), CheckpointError> {
    let parsed = parse(bytes)?;
    let mut out = Vec::new();
    for name in parsed.names() {
        let Some(info) = parsed.info(&name) else {
            return Err(CheckpointError::Format {
                reason: format!("the header lists `{name}` without an entry"),
            });
        };
        let shape_ok =
            (1..=MAX_RANK).contains(&info.shape.len()) && info.shape.iter().all(|&d| d > 0);
        let values = parsed.decode(info)?;
        if !shape_ok {
            return Err(CheckpointError::UnsupportedShape {
                name,
                shape: info.shape.clone(),
            });
        }
        let tensor = Tensor::from_slice(ctx, &info.shape, &values)?;
        out.push((name, tensor));
    }
    Ok((out, parsed.metadata()))
}

fn read_file(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The prefix of a model's parameters in a [`save_module`] checkpoint
/// (`"model.fc1.weight"`).
pub const MODEL_PREFIX: &str = "model.";
/// The prefix of an optimizer's state in a [`save_module`] checkpoint
/// (`"optim.step"`, `"optim.exp_avg.0"`).
pub const OPTIM_PREFIX: &str = "optim.";
/// The metadata key a [`save_module`] checkpoint sets (to `"1"`) when it holds
/// an optimizer's state (which may have no tensors: before the first step).
pub const OPTIM_MARKER: &str = "fucina.optimizer";

/// The metadata of the checkpoint at `path` (the whole file is checked as
/// [`read`] checks it, but no tensor is made).
///
/// # Errors
/// [`CheckpointError::Io`] if the file cannot be read; the format errors of
/// [`read_from_bytes`].
pub fn read_metadata(path: impl AsRef<Path>) -> Result<Metadata, CheckpointError> {
    let bytes = read_file(path.as_ref())?;
    read_metadata_from_bytes(&bytes)
}

/// [`read_metadata`] from the bytes of a safetensors file.
///
/// # Errors
/// The format errors of [`read_from_bytes`].
pub fn read_metadata_from_bytes(bytes: &[u8]) -> Result<Metadata, CheckpointError> {
    Ok(parse(bytes)?.metadata())
}

/// Saves a [`StateDict`] and `metadata` to `path` atomically (see [`save`]).
/// The state dict's own metadata is written too; an entry of `metadata`
/// replaces one of the same key.
///
/// # Errors
/// The errors of [`save`].
pub fn save_state_dict(
    path: impl AsRef<Path>,
    state: &StateDict,
    metadata: &[(&str, &str)],
) -> Result<(), CheckpointError> {
    let tensors: Vec<(&str, &Tensor)> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut meta: Vec<(&str, &str)> = state
        .metadata()
        .iter()
        .filter(|(k, _)| !metadata.iter().any(|(m, _)| m == k))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    meta.extend_from_slice(metadata);
    save(path, &tensors, &meta)
}

/// Reads the checkpoint at `path` as a [`StateDict`] (sorted by name; the
/// file's metadata as the state dict's metadata).
///
/// # Errors
/// The errors of [`read`].
pub fn read_state_dict(
    ctx: &ExecContext,
    path: impl AsRef<Path>,
) -> Result<StateDict, CheckpointError> {
    let (entries, meta) = read(ctx, path)?;
    let mut sd = StateDict::from_unique(entries);
    for (k, v) in meta.into_inner() {
        sd.set_metadata(k, v);
    }
    Ok(sd)
}

/// Saves a model's parameters and, optionally, an optimizer's state to `path`
/// in one atomic write (see [`save`]): the parameters and buffers under
/// `"model.<name>"` ([`Module::state_dict`]), the optimizer's
/// [`state_dict`](Optimizer::state_dict) under `"optim.<name>"`, and
/// `metadata` (plus `"fucina.optimizer" = "1"` when an optimizer is saved).
/// [`load_module`] restores both.
///
/// ```
/// use fucina::checkpoint;
/// use fucina::nn::{Linear, Module};
/// use fucina::optim::{AdamW, Optimizer};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let model = Linear::new(&ctx, 3, 1, 7)?;
/// let mut opt = AdamW::new(model.parameters(), 0.1)?;
/// let x = Tensor::from_slice(&ctx, &[1, 3], &[1., 2., 3.])?;
/// model.forward(&ctx, &x)?.sum_all(&ctx)?.backward(&ctx)?;
/// opt.step(&ctx)?;
///
/// let path = std::env::temp_dir().join(format!("fucina-doc-{}.safetensors", std::process::id()));
/// checkpoint::save_module(&path, &model, Some(&opt), &[("epoch", "1")])?;
///
/// let fresh = Linear::new(&ctx, 3, 1, 99)?;
/// let mut fresh_opt = AdamW::new(fresh.parameters(), 0.1)?;
/// let meta = checkpoint::load_module(&ctx, &path, &fresh, Some(&mut fresh_opt))?;
/// assert_eq!(meta.get("epoch"), Some("1"));
/// assert_eq!(fresh.weight.to_vec(), model.weight.to_vec());
/// assert_eq!(fresh_opt.step_count(), 1);
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), fucina::Error>(())
/// ```
///
/// # Errors
/// [`crate::Error::Checkpoint`] with the errors of [`save`] (a metadata key
/// given twice or equal to `"fucina.optimizer"` is
/// [`CheckpointError::DuplicateMetadataKey`]).
pub fn save_module<M: Module + ?Sized>(
    path: impl AsRef<Path>,
    model: &M,
    optimizer: Option<&dyn Optimizer>,
    metadata: &[(&str, &str)],
) -> crate::Result<()> {
    let mut state = model.state_dict().with_prefix(MODEL_PREFIX);
    let mut meta: Vec<(&str, &str)> = metadata.to_vec();
    if let Some(opt) = optimizer {
        state.extend(opt.state_dict().with_prefix(OPTIM_PREFIX))?;
        meta.push((OPTIM_MARKER, "1"));
    }
    let tensors: Vec<(&str, &Tensor)> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    save(path, &tensors, &meta)?;
    Ok(())
}

/// Restores what [`save_module`] wrote: the model's parameters and buffers
/// and, with `optimizer`, its state, in one all-or-nothing call. Every entry is
/// checked first (each parameter and buffer present once with its shape, no unknown name, the
/// optimizer's state valid for its parameters); on any error neither the model
/// nor the optimizer has changed. Returns the checkpoint's metadata.
///
/// # Errors
/// [`crate::Error::Checkpoint`] with the errors of [`read`];
/// [`crate::Error::StateDict`] for an entry that does not fit the model or the
/// optimizer, an entry outside `"model."` and `"optim."`, or an `optimizer`
/// given for a checkpoint saved without one.
pub fn load_module<M: Module + ?Sized>(
    ctx: &ExecContext,
    path: impl AsRef<Path>,
    model: &M,
    optimizer: Option<&mut dyn Optimizer>,
) -> crate::Result<Metadata> {
    let bytes = read_file(path.as_ref())?;
    load_module_from_bytes(ctx, &bytes, model, optimizer)
}

/// [`load_module`] from the bytes of a safetensors file (what a process that
/// received a checkpoint over the network, rather than from its own disk,
/// loads). All or nothing, as [`load_module`].
///
/// ```
/// use fucina::checkpoint;
/// use fucina::nn::{Linear, Module};
/// use fucina::ExecContext;
///
/// let ctx = ExecContext::new();
/// let model = Linear::new(&ctx, 3, 2, 7)?;
/// let path = std::env::temp_dir().join(format!("fucina-doc-bytes-{}.safetensors", std::process::id()));
/// checkpoint::save_module(&path, &model, None, &[("epoch", "4")])?;
/// let bytes = std::fs::read(&path)?;
/// # std::fs::remove_file(&path).ok();
///
/// let fresh = Linear::new(&ctx, 3, 2, 99)?;
/// assert_eq!(checkpoint::read_metadata_from_bytes(&bytes)?.get("epoch"), Some("4"));
/// checkpoint::load_module_from_bytes(&ctx, &bytes, &fresh, None)?;
/// assert_eq!(fresh.weight.to_vec(), model.weight.to_vec());
/// // A truncated file is refused and changes nothing.
/// let other = Linear::new(&ctx, 3, 2, 5)?;
/// let before = other.weight.to_vec();
/// assert!(checkpoint::load_module_from_bytes(&ctx, &bytes[..bytes.len() - 1], &other, None).is_err());
/// assert_eq!(other.weight.to_vec(), before);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`load_module`], without the I/O error.
pub fn load_module_from_bytes<M: Module + ?Sized>(
    ctx: &ExecContext,
    bytes: &[u8],
    model: &M,
    optimizer: Option<&mut dyn Optimizer>,
) -> crate::Result<Metadata> {
    let (entries, meta) = read_from_bytes(ctx, bytes)?;
    let mut model_part = Vec::new();
    let mut optim_part = Vec::new();
    for (name, t) in entries {
        if let Some(n) = name.strip_prefix(MODEL_PREFIX) {
            model_part.push((n.to_string(), t));
        } else if let Some(n) = name.strip_prefix(OPTIM_PREFIX) {
            optim_part.push((n.to_string(), t));
        } else {
            return Err(crate::Error::StateDict {
                reason: format!(
                    "unexpected tensor `{name}` (names start with {MODEL_PREFIX:?} or {OPTIM_PREFIX:?})"
                ),
            });
        }
    }
    // Saved with an optimizer: the marker, or (a file written by hand or by an
    // earlier version) optimizer entries.
    let has_optim = meta.get(OPTIM_MARKER) == Some("1") || !optim_part.is_empty();
    if optimizer.is_some() && !has_optim {
        return Err(crate::Error::StateDict {
            reason: "the checkpoint holds no optimizer state (it was saved without an optimizer)"
                .to_string(),
        });
    }
    // Handles on the current values: the load below copies rather than
    // overwrites them, so they can be put back if the optimizer refuses.
    let before = model.state_dict();
    model.load_state_dict(&StateDict::from_unique(model_part))?;
    if let Some(opt) = optimizer
        && let Err(e) = opt.load_state_dict(ctx, &optim_part)
    {
        model.load_state_dict(&before)?;
        return Err(e);
    }
    Ok(meta)
}
