//! Tensors of a model, kept in their file format (f32, f16, bf16).
//!
//! [`WeightStore::open`] memory-maps a model directory's safetensors files:
//! `model.safetensors`, or else the shards that `model.safetensors.index.json`
//! lists in its `weight_map` (tensor name to file name). Nothing is copied or
//! converted: a [`Weight`] is a view of its bytes in the mapping, in the dtype
//! the file stores (`F32`, `F16` or `BF16`), so a bf16 model takes bf16 bytes
//! of memory, paged in from the file as the kernels read them.
//!
//! Every file is checked whole before any tensor is handed out, in a fixed
//! order (the header's entries sorted by their data offsets, the shards by
//! name), so a file with several faults always reports the same one:
//!
//! - the 8-byte header length fits the file and the format's limit (100 MB), and
//!   the header is a JSON object of well-formed entries with distinct names
//!   ([`LlmError::BadFile`]);
//! - every tensor's dtype is `F32`, `F16` or `BF16`; its data offsets hold
//!   exactly its shape's bytes, start where the previous tensor's data ends (no
//!   overlap, no gap) and end inside the file; no bytes follow the last tensor
//!   ([`LlmError::BadTensorInFile`], naming the file and the tensor);
//! - for a sharded model, every file the index names exists and holds the
//!   tensors the index assigns to it ([`LlmError::BadTensorInFile`], naming the
//!   shard and the tensor). Tensors a shard holds beyond those the index lists
//!   are checked but not exposed.
//!
//! The files must not be modified or truncated while the store (or any
//! [`Weight`] cloned from it) lives: their bytes are read in place.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use fucina::exec::{
    PackedBf16Matrix, PackedQuantMatrix, QuantFormat, QuantMatrix, Storage, TensorFormat,
    WeightFormat, WeightMatrix,
};

use crate::error::LlmError;
use crate::format_report::{FormatChoice, FormatReport, TensorFormatEntry, conversion_target};

/// Where a weight's bytes live.
#[derive(Clone, Debug)]
enum WeightBytes {
    /// A range of a memory-mapped file.
    Mapped {
        /// The mapping (shared by every tensor of the file).
        map: Arc<memmap2::Mmap>,
        /// The tensor's bytes within it.
        range: std::ops::Range<usize>,
    },
    /// Bytes owned in memory (tests, converted tensors).
    Owned(Arc<[u8]>),
}

/// One tensor of a model in its file format.
///
/// A weight is either a float tensor (`Storage::Float`: f32, f16, bf16, read
/// by [`ExecContext::weight_matmul`](fucina::ExecContext::weight_matmul)) or a
/// block-quantized matrix (`Storage::Quant`: any block format of
/// [`FORMATS`](fucina::exec::FORMATS) in llama.cpp's layout, read by
/// [`ExecContext::quant_matmul`](fucina::ExecContext::quant_matmul)), one sum
/// type ([`storage`](Weight::storage)); [`matmul`](Weight::matmul) and
/// [`row_to_f32`](Weight::row_to_f32) serve both.
#[derive(Clone, Debug)]
pub struct Weight {
    /// A float tensor's element format or a matrix's block format.
    storage: Storage,
    shape: Vec<usize>,
    bytes: WeightBytes,
    /// The kernels' strip layout of a quantized matrix, once
    /// [`repack`](Weight::repack) made it (shared by clones of the weight).
    packed: Option<Arc<PackedQuantMatrix>>,
    /// The AMX-rule tiles of a bf16 matrix, once
    /// [`pack_bf16_products`](Weight::pack_bf16_products) made them (shared by
    /// clones of the weight).
    bf16: Option<Arc<PackedBf16Matrix>>,
    /// Whether the tiles hold exactly the file's values (no subnormal was
    /// flushed), so that [`row_to_f32`](Weight::row_to_f32) reads them.
    bf16_rows: bool,
}

impl Weight {
    /// A weight of `storage` and `shape` over `bytes`, not yet checked, with no
    /// kernel copies.
    fn new(storage: Storage, shape: Vec<usize>, bytes: WeightBytes) -> Weight {
        Weight {
            storage,
            shape,
            bytes,
            packed: None,
            bf16: None,
            bf16_rows: false,
        }
    }

    /// A weight owning `bytes` (little-endian elements of `format`), checked against
    /// `shape`.
    pub fn from_bytes(
        name: &str,
        format: WeightFormat,
        shape: &[usize],
        bytes: Vec<u8>,
    ) -> Result<Weight, LlmError> {
        let expected = shape
            .iter()
            .try_fold(format.size_bytes(), |n, &d| n.checked_mul(d))
            .ok_or_else(|| LlmError::BadTensor {
                name: name.to_string(),
                reason: format!("shape {shape:?}: the byte count overflows usize"),
            })?;
        if bytes.len() != expected {
            return Err(LlmError::BadTensor {
                name: name.to_string(),
                reason: format!(
                    "{} bytes for shape {shape:?} of {}, expected {expected}",
                    bytes.len(),
                    format.name()
                ),
            });
        }
        Ok(Weight::new(
            Storage::Float(format),
            shape.to_vec(),
            WeightBytes::Owned(bytes.into()),
        ))
    }

    /// A block-quantized `[rows, cols]` matrix over `bytes` (llama.cpp's blocks of
    /// `format`, row after row), checked against the shape: `cols` must be a
    /// multiple of the format's block size (32, or 256 for Q4_K and Q6_K) and
    /// `bytes` hold exactly `rows · cols / block size` blocks.
    pub fn quantized(
        name: &str,
        format: QuantFormat,
        shape: &[usize],
        bytes: Vec<u8>,
    ) -> Result<Weight, LlmError> {
        let w = Weight::new(
            Storage::Quant(format),
            shape.to_vec(),
            WeightBytes::Owned(bytes.into()),
        );
        w.quant_matrix(name)?;
        Ok(w)
    }

    /// A block-quantized matrix over `range` of a memory-mapped file, checked as
    /// [`quantized`](Weight::quantized).
    pub(crate) fn mapped_quantized(
        name: &str,
        format: QuantFormat,
        shape: Vec<usize>,
        map: Arc<memmap2::Mmap>,
        range: std::ops::Range<usize>,
    ) -> Result<Weight, LlmError> {
        let w = Weight::new(
            Storage::Quant(format),
            shape,
            WeightBytes::Mapped { map, range },
        );
        w.quant_matrix(name)?;
        Ok(w)
    }

    /// The quantized matrix view (an error naming `name` when the weight is not a
    /// valid block-quantized matrix).
    fn quant_matrix(&self, name: &str) -> Result<QuantMatrix<'_>, LlmError> {
        let bad = |reason: String| LlmError::BadTensor {
            name: name.to_string(),
            reason,
        };
        let (Some(format), &[rows, cols]) = (self.quant_format(), self.shape.as_slice()) else {
            return Err(bad(format!(
                "shape {:?}: a quantized weight must be a matrix",
                self.shape
            )));
        };
        QuantMatrix::new(format, rows, cols, self.bytes()).map_err(|e| bad(e.to_string()))
    }

    /// The block-quantized format, or `None` for a float weight.
    pub fn quant_format(&self) -> Option<QuantFormat> {
        match self.storage {
            Storage::Quant(q) => Some(q),
            Storage::Float(_) => None,
        }
    }

    /// The element format, or `None` for a block-quantized matrix.
    pub fn float_format(&self) -> Option<WeightFormat> {
        match self.storage {
            Storage::Float(f) => Some(f),
            Storage::Quant(_) => None,
        }
    }

    /// How the weight is kept: a float tensor's element format or a matrix's
    /// block format.
    pub fn storage(&self) -> Storage {
        self.storage
    }

    /// The format the weight is stored in: its block format, or its float
    /// format.
    pub fn tensor_format(&self) -> TensorFormat {
        match self.storage {
            Storage::Quant(q) => q.into(),
            Storage::Float(f) => f.into(),
        }
    }

    /// `out[i, j] = Σ_k x[i, k] · w[j, k]` for the `m` rows of `x`, through the
    /// kernel of the weight's format (see [`Weight`]).
    ///
    /// # Errors
    /// A weight that is not a matrix, or lengths of `x` and `out` that do not fit.
    pub fn matmul(
        &self,
        ctx: &fucina::ExecContext,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), LlmError> {
        if let Some(b) = &self.bf16 {
            ctx.bf16_matmul_amx_rule(x, m, b, out)?;
            return Ok(());
        }
        match (&self.packed, self.quant_format()) {
            (Some(p), _) => ctx.quant_matmul_packed(x, m, p, out)?,
            (None, None) => ctx.weight_matmul(x, m, &self.matrix()?, out)?,
            (None, Some(_)) => ctx.quant_matmul(x, m, &self.quant_matrix("")?, out)?,
        }
        Ok(())
    }

    /// Makes the kernels' repacked copy of a quantized matrix
    /// ([`ExecContext::repack_quant`](fucina::ExecContext::repack_quant): rows in
    /// strips of 8, scales apart from the values, 64-byte aligned), which
    /// [`matmul`](Weight::matmul) reads from then on: the same bits, faster
    /// (the decode of a quantized model reads its weights at close to the
    /// memory bandwidth). The copy lives as long as the weight (and its
    /// clones); the original bytes stay for [`bytes`](Weight::bytes). Returns
    /// whether a copy was made (`false` for a float weight, one already
    /// repacked, or a matrix of a format read in place, see
    /// [`QuantFormat::repackable`]).
    ///
    /// # Errors
    /// Out of memory.
    pub fn repack(&mut self, ctx: &fucina::ExecContext) -> Result<bool, LlmError> {
        if self.quant_format().is_none_or(|q| !q.repackable()) || self.packed.is_some() {
            return Ok(false);
        }
        let packed = ctx.repack_quant(&self.quant_matrix("")?)?;
        self.packed = Some(Arc::new(packed));
        self.release_mapped_pages();
        Ok(true)
    }

    /// Tells the kernel that the mapped pages wholly inside this weight's range
    /// are not needed now (`madvise(MADV_DONTNEED)`), so that a repacked model
    /// does not hold its file's pages as well as the copy. Advisory: the pages
    /// of a read-only file mapping come back from the file if read again (by
    /// [`bytes`](Weight::bytes)), so nothing changes but the resident set; a
    /// refusal by the kernel is ignored.
    fn release_mapped_pages(&self) {
        let WeightBytes::Mapped { map, range } = &self.bytes else {
            return;
        };
        let page = 4096;
        let (start, end) = (range.start.next_multiple_of(page), range.end / page * page);
        if start < end && end <= map.len() {
            // SAFETY: `map` is a read-only shared mapping of a file (`Mmap::map`
            // in `WeightStore::open` and `GgufFile::open`), never written: after
            // MADV_DONTNEED its pages repopulate from the file on the next read,
            // so every slice of it keeps reading the same bytes. The range is
            // page-aligned and inside the mapping (checked above).
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }

    /// Switches [`matmul`](Weight::matmul) of a bf16 matrix to bf16 products
    /// with the AMX rule ([`ExecContext::bf16_matmul_amx_rule`](fucina::ExecContext::bf16_matmul_amx_rule)):
    /// the activations are rounded to bf16 and the depth is summed as Intel's
    /// AMX tile product sums it, on the AMX tiles where the CPU has them and
    /// by an emulation with the same bits elsewhere. Makes the op's packed
    /// tiles (the matrix's bytes, rounded up to whole tiles) and, for a
    /// weight mapped from a file, tells the kernel its pages are not needed
    /// now (the tiles replace them: [`row_to_f32`](Weight::row_to_f32) reads
    /// its rows from the tiles too, unless the matrix holds subnormal values,
    /// which the tiles read as zeros; then its rows page back in from the
    /// file). Returns whether tiles were made (`false` when they exist
    /// already).
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when the weight is not a bf16 matrix (a
    /// quantized, f32 or f16 weight, or not rank 2); out of memory. The weight
    /// is unchanged on an error.
    pub fn pack_bf16_products(&mut self) -> Result<bool, LlmError> {
        if self.bf16.is_some() {
            return Ok(false);
        }
        if self.storage != Storage::Float(WeightFormat::BF16) || self.shape.len() != 2 {
            let what = match self.storage {
                Storage::Quant(q) => format!("{q:?}"),
                Storage::Float(f) => f.name().to_string(),
            };
            return Err(LlmError::InvalidRequest {
                op: "Weight::pack_bf16_products",
                reason: format!(
                    "the weight is {what}, shape {:?}: bf16 products need a bf16 matrix \
                     (convert the model to bf16 first)",
                    self.shape
                ),
            });
        }
        let packed = PackedBf16Matrix::new(&self.matrix()?)?;
        // The tiles read subnormals as zeros; without any, they are the
        // file's values and serve single rows too (an embedding table that is
        // also the output projection then stays resident once).
        let subnormal = |b: &[u8]| {
            let h = u16::from_le_bytes([b[0], b[1]]);
            h & 0x7f80 == 0 && h & 0x007f != 0
        };
        self.bf16_rows = !self.bytes().chunks_exact(2).any(subnormal);
        self.bf16 = Some(Arc::new(packed));
        self.release_mapped_pages();
        Ok(true)
    }

    /// Whether [`pack_bf16_products`](Weight::pack_bf16_products) made the
    /// AMX-rule tiles that [`matmul`](Weight::matmul) reads.
    pub fn has_bf16_products(&self) -> bool {
        self.bf16.is_some()
    }

    /// Whether [`repack`](Weight::repack) made the kernels' copy.
    pub fn is_repacked(&self) -> bool {
        self.packed.is_some()
    }

    /// Row `r` of a matrix weight widened to f32 into `out` (`cols` values); a
    /// quantized row is dequantized.
    ///
    /// # Errors
    /// A weight that is not a matrix, `r` past its rows or `out` of the wrong length.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) -> Result<(), LlmError> {
        if let Some(b) = self.bf16.as_ref().filter(|_| self.bf16_rows) {
            b.row_to_f32(r, out).map_err(|_| LlmError::InvalidRequest {
                op: "Weight::row_to_f32",
                reason: format!(
                    "row {r} into {} values of a [{}, {}] matrix",
                    out.len(),
                    b.rows(),
                    b.cols()
                ),
            })?;
            return Ok(());
        }
        match (&self.packed, self.quant_format()) {
            (Some(p), _) => p.dequantize_row(r, out)?,
            (None, Some(_)) => self.quant_matrix("")?.dequantize_row(r, out)?,
            (None, None) => {
                let m = self.matrix()?;
                if r >= m.rows || out.len() != m.cols {
                    return Err(LlmError::InvalidRequest {
                        op: "Weight::row_to_f32",
                        reason: format!(
                            "row {r} into {} values of a [{}, {}] matrix",
                            out.len(),
                            m.rows,
                            m.cols
                        ),
                    });
                }
                m.row_to_f32(r, out);
            }
        }
        Ok(())
    }

    /// An f32 weight of `shape` holding `values`, stored as `format` (values are
    /// rounded to nearest-even for f16 and bf16).
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when `values` does not hold exactly one
    /// value per element of `shape` (or that count overflows).
    pub fn from_f32(
        format: WeightFormat,
        shape: &[usize],
        values: &[f32],
    ) -> Result<Weight, LlmError> {
        let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if elements != Some(values.len()) {
            return Err(LlmError::InvalidRequest {
                op: "Weight::from_f32",
                reason: match elements {
                    Some(n) => format!(
                        "{} values for shape {shape:?} of {n} elements",
                        values.len()
                    ),
                    None => format!("shape {shape:?}: the element count overflows usize"),
                },
            });
        }
        let mut bytes = vec![0u8; values.len() * format.size_bytes()];
        encode_f32(format, values, &mut bytes);
        Ok(Weight::new(
            Storage::Float(format),
            shape.to_vec(),
            WeightBytes::Owned(bytes.into()),
        ))
    }

    /// A weight over `range` of a memory-mapped file.
    pub(crate) fn mapped(
        format: WeightFormat,
        shape: Vec<usize>,
        map: Arc<memmap2::Mmap>,
        range: std::ops::Range<usize>,
    ) -> Weight {
        Weight::new(
            Storage::Float(format),
            shape,
            WeightBytes::Mapped { map, range },
        )
    }

    /// The element format of a float weight; for a block-quantized matrix
    /// (see [`storage`](Weight::storage)), f32, the format
    /// [`row_to_f32`](Weight::row_to_f32) widens its rows to.
    pub fn format(&self) -> WeightFormat {
        self.float_format().unwrap_or(WeightFormat::F32)
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether the bytes are read in place from a memory-mapped file (rather
    /// than owned in memory).
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, WeightBytes::Mapped { .. })
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            WeightBytes::Mapped { map, range } => &map[range.clone()],
            WeightBytes::Owned(b) => b,
        }
    }

    /// The weight as a `[rows, cols]` matrix (a rank-2 tensor), for
    /// [`ExecContext::weight_matmul`](fucina::ExecContext::weight_matmul).
    pub fn matrix(&self) -> Result<WeightMatrix<'_>, LlmError> {
        let format = match self.storage {
            Storage::Float(f) => f,
            Storage::Quant(q) => {
                return Err(LlmError::BadTensor {
                    name: String::new(),
                    reason: format!("a {q:?} weight is read by quant_matmul, not weight_matmul"),
                });
            }
        };
        let &[rows, cols] = self.shape.as_slice() else {
            return Err(LlmError::BadTensor {
                name: String::new(),
                reason: format!("rank {} where a matrix was expected", self.shape.len()),
            });
        };
        Ok(WeightMatrix::new(format, rows, cols, self.bytes())?)
    }

    /// The elements widened to f32 (exact; a quantized matrix is dequantized).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        if let &[rows, cols] = self.shape.as_slice() {
            // Row by row through the per-format loops of `row_to_f32`.
            let mut out = vec![0.0f32; rows * cols];
            for (r, row) in out.chunks_exact_mut(cols.max(1)).enumerate() {
                // The view was checked at construction.
                let _ = self.row_to_f32(r, row);
            }
            return out;
        }
        let b = self.bytes();
        (0..self.shape.iter().product::<usize>())
            .map(|i| self.format().element(b, i))
            .collect()
    }
}

/// `values` stored as `format` into `out` (`values.len()` elements of
/// `format`), rounding to nearest-even for f16 and bf16. One loop per format
/// (no per-element format match), so the loops vectorise: this converts whole
/// models at load.
fn encode_f32(format: WeightFormat, values: &[f32], out: &mut [u8]) {
    debug_assert_eq!(out.len(), values.len() * format.size_bytes());
    match format {
        WeightFormat::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(values) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        WeightFormat::F16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(values) {
                o.copy_from_slice(&fucina::storage::half::f16::from_f32(v).to_le_bytes());
            }
        }
        WeightFormat::BF16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(values) {
                o.copy_from_slice(&fucina::storage::half::bf16::from_f32(v).to_le_bytes());
            }
        }
    }
}

/// Rows of a matrix [`WeightStore::convert`] widens at a time (4 MiB of f32).
const CONVERT_BLOCK_ELEMENTS: usize = 1 << 20;

/// The single-file weights of a model directory.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded model directory (`weight_map`: tensor name to file).
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Bytes of the little-endian header-length prefix of a safetensors file.
const LEN_PREFIX: usize = 8;
/// The largest header accepted (the limit of the reference reader).
const MAX_HEADER_BYTES: u64 = 100_000_000;
/// The reserved header key of the string metadata map.
const METADATA_KEY: &str = "__metadata__";

/// A model's tensors by name (Hugging Face names: `model.layers.0.self_attn.q_proj.weight`).
#[derive(Clone, Debug, Default)]
pub struct WeightStore {
    tensors: BTreeMap<String, Weight>,
    /// The mapped files and their sizes in bytes, sorted by path.
    files: Vec<(PathBuf, u64)>,
    /// Why [`convert`](WeightStore::convert) gave each matrix its format
    /// (empty for a store that was not converted: every tensor is the file's).
    choices: BTreeMap<String, FormatChoice>,
}

impl WeightStore {
    /// Memory-maps the safetensors files of the model directory `dir`:
    /// `model.safetensors` when it exists, else the shards
    /// `model.safetensors.index.json` lists (see the [module docs](self) for
    /// what is checked).
    ///
    /// # Errors
    /// [`LlmError::BadFile`] if `dir` holds neither file, or for a file whose
    /// framing or header is malformed (naming the file); [`LlmError::Io`] if
    /// the single file or the index cannot be read;
    /// [`LlmError::BadTensorInFile`] naming the file and the tensor for an
    /// unsupported dtype, data offsets that disagree with the shape, overlap
    /// another tensor, leave a gap or run past the end of the file (truncated),
    /// a shard the index lists that cannot be opened, or a tensor the index
    /// lists that its shard lacks.
    pub fn open(dir: impl AsRef<Path>) -> Result<WeightStore, LlmError> {
        let dir = dir.as_ref();
        let single = dir.join(SINGLE_FILE);
        if single.exists() {
            let file = MappedFile::open(&single, None)?;
            return Ok(WeightStore {
                files: vec![(single, file.map.len() as u64)],
                tensors: file.into_weights(),
                choices: BTreeMap::new(),
            });
        }
        let index = dir.join(INDEX_FILE);
        if index.exists() {
            return WeightStore::open_sharded(dir, &index);
        }
        Err(LlmError::BadFile {
            path: dir.to_path_buf(),
            reason: format!("the directory holds neither {SINGLE_FILE} nor {INDEX_FILE}"),
        })
    }

    fn open_sharded(dir: &Path, index: &Path) -> Result<WeightStore, LlmError> {
        let text = crate::files::read_regular(index)?;
        let parsed: Index = serde_json::from_slice(&text).map_err(|e| LlmError::BadFile {
            path: index.to_path_buf(),
            reason: format!("not a valid index (a JSON object with a `weight_map`): {e}"),
        })?;
        let bad = |name: &str, reason: String| LlmError::BadTensorInFile {
            path: index.to_path_buf(),
            name: name.to_string(),
            reason,
        };
        // Shard file name -> the tensors the index assigns to it (sorted).
        let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut seen = HashSet::new();
        for (name, value) in parsed.weight_map.0 {
            let Some(file) = value.as_str() else {
                return Err(bad(
                    &name,
                    format!("`weight_map` gives {value}, expected a file name"),
                ));
            };
            if !seen.insert(name.clone()) {
                return Err(bad(&name, "listed twice in `weight_map`".to_string()));
            }
            let plain = {
                let mut c = Path::new(file).components();
                matches!(
                    (c.next(), c.next()),
                    (Some(std::path::Component::Normal(_)), None)
                )
            };
            if !plain {
                return Err(bad(
                    &name,
                    format!("shard `{file}` is not a file name inside the model directory"),
                ));
            }
            shards.entry(file.to_string()).or_default().push(name);
        }
        let mut tensors = BTreeMap::new();
        let mut files = Vec::with_capacity(shards.len());
        for (file, mut names) in shards {
            names.sort_unstable();
            let path = dir.join(&file);
            let mapped = MappedFile::open(&path, Some(&names[0]))?;
            files.push((path.clone(), mapped.map.len() as u64));
            let mut weights = mapped.into_weights();
            for name in names {
                let Some(w) = weights.remove(&name) else {
                    return Err(LlmError::BadTensorInFile {
                        path,
                        name,
                        reason: format!("{INDEX_FILE} assigns it to this file, which lacks it"),
                    });
                };
                tensors.insert(name, w);
            }
        }
        Ok(WeightStore {
            tensors,
            files,
            choices: BTreeMap::new(),
        })
    }

    /// A store over tensors already in memory.
    pub fn from_tensors(tensors: HashMap<String, Weight>) -> WeightStore {
        WeightStore {
            tensors: tensors.into_iter().collect(),
            files: Vec::new(),
            choices: BTreeMap::new(),
        }
    }

    /// [`Weight::repack`] of every block-quantized matrix of the store
    /// ([`open_model`](crate::open_model) and [`Model::load_as`](crate::Model::load_as)
    /// call it): the decode kernels then read the repacked strips. Returns how
    /// many were repacked.
    ///
    /// # Errors
    /// Out of memory (the weights repacked so far keep their copies).
    pub fn repack_quantized(&mut self, ctx: &fucina::ExecContext) -> Result<usize, LlmError> {
        let mut n = 0;
        for w in self.tensors.values_mut() {
            n += usize::from(w.repack(ctx)?);
        }
        Ok(n)
    }

    /// The tensor `name`, or an error naming it.
    pub fn get(&self, name: &str) -> Result<&Weight, LlmError> {
        self.tensors.get(name).ok_or_else(|| LlmError::BadTensor {
            name: name.to_string(),
            reason: "missing from the model files".to_string(),
        })
    }

    /// The tensor `name` as a `[rows, cols]` matrix (see [`Weight::matrix`]),
    /// or an error naming it (missing, or not of rank 2).
    pub fn matrix(&self, name: &str) -> Result<WeightMatrix<'_>, LlmError> {
        self.get(name)?.matrix().map_err(|e| match e {
            LlmError::BadTensor { reason, .. } => LlmError::BadTensor {
                name: name.to_string(),
                reason,
            },
            other => other,
        })
    }

    /// Whether the store holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The tensors with their names, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Weight)> {
        self.tensors.iter().map(|(n, w)| (n.as_str(), w))
    }

    /// The memory-mapped files (sorted by path) and their sizes in bytes; none
    /// for a store built in memory.
    pub fn files(&self) -> impl Iterator<Item = (&Path, u64)> {
        self.files.iter().map(|(p, n)| (p.as_path(), *n))
    }

    /// The total size of the memory-mapped files in bytes (0 for a store built
    /// in memory): what the weights can add to the resident memory.
    pub fn file_bytes(&self) -> u64 {
        self.files.iter().map(|(_, n)| n).sum()
    }

    /// The total size of the tensors' bytes (in their file formats).
    pub fn tensor_bytes(&self) -> usize {
        self.tensors.values().map(|w| w.bytes().len()).sum()
    }

    /// Checks that every value of every tensor is finite, as llama.cpp's
    /// `--check-tensors` does (`generate --check-tensors`): the loaders do not
    /// read the tensors' bytes, so a block whose f16 scale is NaN or infinite,
    /// or a float tensor holding one, loads, and the outputs it reaches are
    /// not finite (see [`arch::gguf`](crate::arch::gguf)). This reads and
    /// widens every tensor once (dequantizing the block formats), a pass over
    /// the whole model.
    ///
    /// # Errors
    /// [`LlmError::BadTensor`] naming the first tensor (in name order) holding
    /// a NaN or infinite value, with the row, the block (for a block format)
    /// and the value.
    pub fn check_finite(&self) -> Result<(), LlmError> {
        for (name, w) in &self.tensors {
            let bad = |reason: String| LlmError::BadTensor {
                name: name.clone(),
                reason,
            };
            let &[rows, cols] = w.shape() else {
                if let Some((i, v)) = w
                    .to_f32_vec()
                    .iter()
                    .enumerate()
                    .find(|(_, v)| !v.is_finite())
                {
                    return Err(bad(format!("element {i} is {v}")));
                }
                continue;
            };
            let mut row = vec![0.0f32; cols];
            for r in 0..rows {
                w.row_to_f32(r, &mut row)?;
                let Some((c, v)) = row.iter().enumerate().find(|(_, v)| !v.is_finite()) else {
                    continue;
                };
                return Err(bad(match w.quant_format() {
                    Some(q) => {
                        let e = q.block_elements();
                        format!(
                            "row {r}, column {c} is {v}: block {} of the row ({} values of {}) \
                             has a scale or min that is not finite",
                            c / e,
                            e,
                            TensorFormat::from(q),
                        )
                    }
                    None => format!("row {r}, column {c} is {v}"),
                }));
            }
        }
        Ok(())
    }

    /// What every tensor is stored as, and why: for a store read from files
    /// as they are (a GGUF file's mix of types), every tensor is
    /// [`FormatChoice::File`]; for one made by [`convert`](WeightStore::convert),
    /// each matrix says whether it took the asked format, the output
    /// projection's, or a fallback ([`conversion_target`]).
    pub fn format_report(&self) -> FormatReport {
        FormatReport::new(
            self.tensors
                .iter()
                .map(|(name, w)| TensorFormatEntry {
                    name: name.clone(),
                    shape: w.shape().to_vec(),
                    format: w.tensor_format(),
                    choice: self
                        .choices
                        .get(name)
                        .copied()
                        .unwrap_or(FormatChoice::File),
                })
                .collect(),
        )
    }
}

/// The format [`WeightStore::convert`] turns a model's matrices into
/// (`generate --dtype`): any [`TensorFormat`]
/// (parsed from its lower-case name, case-insensitive: `"q4_k".parse()`).
///
/// The float formats round each value once (to nearest-even for f16 and
/// bf16); Q8_0 and Q4_0 are llama.cpp's blocks of 32, made by
/// [`ExecContext::quantize`](fucina::ExecContext::quantize) (its reference
/// quantizer, so the bytes are those `llama-quantize` writes for the same f32
/// values); the K formats are llama.cpp's super-block formats, made by
/// `quantize`'s simpler K rules (their bytes differ from `llama-quantize`'s).
pub type LoadDtype = TensorFormat;

/// The block format llama.cpp's `llama-quantize` takes for a tensor whose rows
/// are not whole super-blocks of a K format (a format of blocks of 32: Q4_K →
/// Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K, Q3_K and IQ4_XS → IQ4_NL); the
/// format itself for the others. [`conversion_target`] applies it.
pub fn k_fallback(q: QuantFormat) -> QuantFormat {
    match q {
        QuantFormat::Q4_K => QuantFormat::Q5_0,
        QuantFormat::Q5_K => QuantFormat::Q5_1,
        QuantFormat::Q6_K => QuantFormat::Q8_0,
        QuantFormat::Q2_K | QuantFormat::Q3_K | QuantFormat::IQ4_XS => QuantFormat::IQ4_NL,
        other => other,
    }
}

impl WeightStore {
    /// A copy of the store with every matrix (rank-2 tensor) stored as `dtype`,
    /// for running a model at another precision than its file's
    /// (`generate --dtype`). `self` is left as it is.
    ///
    /// What changes follows llama.cpp's `llama-quantize`:
    ///
    /// - every rank-2 tensor — the q/k/v/o and gate/up/down projections, the
    ///   embedding table and `lm_head.weight` — becomes `dtype`; tensors of
    ///   other ranks (the norms, the biases) are kept as they are (the decoder
    ///   widens them to f32 when it builds, whatever their format);
    /// - for every block format but Q8_0 and Q6_K the output projection keeps
    ///   more bits: the super-block formats store it as Q6_K, as llama.cpp's
    ///   presets do; the formats of blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1,
    ///   IQ4_NL) as Q8_0 (llama.cpp takes Q6_K; Q8_0 is repacked by
    ///   `open_model` and read at the packed kernel's speed, where a Q6_K
    ///   matrix is read in place). The output projection is `lm_head.weight`,
    ///   or the embedding table when `tie_word_embeddings` (llama.cpp's rule
    ///   for models that share the two); `Q4_K_M` and `Q5_K_M` also give Q6_K
    ///   to some of the v and down projections, which this conversion does
    ///   not;
    /// - the K formats need whole super-blocks of 256 along the columns; a
    ///   matrix whose column count is not a multiple of 256 falls back per
    ///   tensor, as llama.cpp's does ([`k_fallback`]): Q4_K to Q5_0, Q5_K to
    ///   Q5_1, Q6_K to Q8_0, Q2_K, Q3_K and IQ4_XS to IQ4_NL (the output
    ///   projection's Q6_K too: to Q8_0). [`conversion_target`] is this rule
    ///   for one matrix; what each tensor became, and why, is the converted
    ///   store's [`format_report`](WeightStore::format_report);
    /// - a tensor already in its target format is kept as it is (still mapped,
    ///   no copy); any other is widened to f32 (a quantized one dequantized) and
    ///   converted, so the result owns its bytes in memory. Re-quantizing an
    ///   already quantized tensor (a Q8_0 file to Q4_0) loses more than
    ///   quantizing the original would.
    ///
    /// The quantized bytes are [`ExecContext::quantize`](fucina::ExecContext::quantize)
    /// of the tensor's f32 values: the same for any thread count of `ctx`.
    ///
    /// # Errors
    /// [`LlmError::BadTensor`] naming the tensor and its shape when a matrix to
    /// be quantized has a column count (its input features, the dimension the
    /// blocks run along) that is not a multiple of 32 (for the K formats too:
    /// their fallbacks need whole blocks of 32): llama.cpp refuses such a
    /// tensor too ("Unsupported tensor size").
    /// Nothing is returned half-converted.
    pub fn convert(
        &self,
        ctx: &fucina::ExecContext,
        dtype: LoadDtype,
        tie_word_embeddings: bool,
    ) -> Result<WeightStore, LlmError> {
        let output = if tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let mut tensors = BTreeMap::new();
        let mut choices = BTreeMap::new();
        for (name, w) in &self.tensors {
            let &[rows, cols] = w.shape() else {
                tensors.insert(name.clone(), w.clone());
                continue;
            };
            let (target, choice) = conversion_target(dtype, cols, name == output);
            choices.insert(name.clone(), choice);
            let target = target.storage();
            if w.storage() == target {
                tensors.insert(name.clone(), w.clone());
                continue;
            }
            let bad = |reason: String| LlmError::BadTensor {
                name: name.clone(),
                reason: format!("shape [{rows}, {cols}]: {reason}"),
            };
            if let Storage::Quant(q) = target
                && !cols.is_multiple_of(q.block_elements())
            {
                return Err(bad(format!(
                    "{cols} columns are not a multiple of the {}-element blocks of {q:?} \
                     (llama.cpp refuses such a tensor too)",
                    q.block_elements(),
                )));
            }
            // A block of rows at a time through one f32 buffer, so a large
            // matrix is never widened whole (every format works per row, so the
            // bytes do not depend on the block size).
            let row_bytes = match target {
                Storage::Float(f) => cols * f.size_bytes(),
                Storage::Quant(q) => cols / q.block_elements() * q.block_bytes(),
            };
            let total = rows
                .checked_mul(row_bytes)
                .ok_or_else(|| bad("the converted size overflows usize".to_string()))?;
            let mut bytes = Vec::new();
            bytes
                .try_reserve_exact(total)
                .map_err(|_| bad(format!("{total} bytes cannot be allocated")))?;
            let block_rows = (CONVERT_BLOCK_ELEMENTS / cols.max(1)).clamp(1, rows.max(1));
            let mut buf = vec![0.0f32; block_rows * cols];
            for r0 in (0..rows).step_by(block_rows) {
                let n = block_rows.min(rows - r0);
                let buf = &mut buf[..n * cols];
                for (i, row) in buf.chunks_exact_mut(cols.max(1)).enumerate() {
                    w.row_to_f32(r0 + i, row)?;
                }
                match target {
                    Storage::Float(f) => {
                        let start = bytes.len();
                        bytes.resize(start + n * row_bytes, 0);
                        encode_f32(f, buf, &mut bytes[start..]);
                    }
                    Storage::Quant(q) => bytes.extend_from_slice(
                        ctx.quantize(q, n, cols, buf)
                            .map_err(|e| bad(e.to_string()))?
                            .bytes(),
                    ),
                }
            }
            let converted = match target {
                Storage::Float(f) => Weight::from_bytes(name, f, w.shape(), bytes)?,
                Storage::Quant(q) => Weight::quantized(name, q, w.shape(), bytes)?,
            };
            tensors.insert(name.clone(), converted);
        }
        Ok(WeightStore {
            tensors,
            files: self.files.clone(),
            choices,
        })
    }
}

/// `model.safetensors.index.json` (other keys, such as `metadata`, are ignored).
#[derive(Deserialize)]
struct Index {
    weight_map: Entries,
}

/// A JSON object's entries in file order, repeated keys kept (a JSON map would
/// keep only the last of them).
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Entries;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    out.push((key, map.next_value::<Value>()?));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// One header entry of a safetensors file.
#[derive(Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// A checked, memory-mapped safetensors file.
struct MappedFile {
    map: Arc<memmap2::Mmap>,
    /// Name, format, shape and absolute byte range in the mapping.
    tensors: CheckedTensors,
}

impl MappedFile {
    /// Maps and checks the file at `path`. `listed`: for a shard, a tensor the
    /// index assigns to it, named if the file cannot be opened.
    fn open(path: &Path, listed: Option<&str>) -> Result<MappedFile, LlmError> {
        let io = |source: std::io::Error| match listed {
            Some(name) => LlmError::BadTensorInFile {
                path: path.to_path_buf(),
                name: name.to_string(),
                reason: format!(
                    "{INDEX_FILE} assigns it to this file, which cannot be opened: {source}"
                ),
            },
            None => LlmError::Io {
                path: path.to_path_buf(),
                source,
            },
        };
        let file = crate::files::open_regular(path).map_err(|e| match (listed, e) {
            (Some(_), LlmError::Io { source, .. }) => io(source),
            (Some(name), LlmError::BadFile { reason, .. }) => LlmError::BadTensorInFile {
                path: path.to_path_buf(),
                name: name.to_string(),
                reason: format!("{INDEX_FILE} assigns it to this file, which is {reason}"),
            },
            (_, e) => e,
        })?;
        let len = file.metadata().map_err(io)?.len();
        if len < LEN_PREFIX as u64 {
            return Err(LlmError::BadFile {
                path: path.to_path_buf(),
                reason: format!(
                    "{len} bytes: too short for a safetensors file (an 8-byte header length comes first)"
                ),
            });
        }
        // SAFETY: the mapping is read-only and private to this store; the
        // documented precondition of `WeightStore::open` is that the files are
        // not modified or truncated while it lives (what every memory-mapping
        // model loader requires). Mapping is what keeps a bf16 model at its file
        // size in memory, with no copy and no conversion.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let tensors = check_file(path, &map)?;
        Ok(MappedFile {
            map: Arc::new(map),
            tensors,
        })
    }

    fn into_weights(self) -> BTreeMap<String, Weight> {
        self.tensors
            .into_iter()
            .map(|(name, format, shape, range)| {
                let w = Weight::mapped(format, shape, Arc::clone(&self.map), range);
                (name, w)
            })
            .collect()
    }
}

type CheckedTensors = Vec<(String, WeightFormat, Vec<usize>, std::ops::Range<usize>)>;

/// Checks the framing, header and data offsets of the safetensors bytes `bytes`
/// (the file at `path`), and returns every tensor with its absolute byte range.
fn check_file(path: &Path, bytes: &[u8]) -> Result<CheckedTensors, LlmError> {
    let file_err = |reason: String| LlmError::BadFile {
        path: path.to_path_buf(),
        reason,
    };
    let tensor_err = |name: &str, reason: String| LlmError::BadTensorInFile {
        path: path.to_path_buf(),
        name: name.to_string(),
        reason,
    };
    let prefix: [u8; LEN_PREFIX] = bytes[..LEN_PREFIX].try_into().expect("checked length");
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER_BYTES {
        return Err(file_err(format!(
            "header length {n} is above the format's limit of {MAX_HEADER_BYTES} bytes (not a safetensors file?)"
        )));
    }
    let n = n as usize;
    let Some(header) = bytes.get(LEN_PREFIX..LEN_PREFIX + n) else {
        return Err(file_err(format!(
            "header length {n} runs past the end of the file ({} bytes): truncated, or not a safetensors file",
            bytes.len()
        )));
    };
    let Entries(entries) = serde_json::from_slice(header)
        .map_err(|e| file_err(format!("the header is not a valid JSON object: {e}")))?;
    let data_start = LEN_PREFIX + n;
    let data_len = bytes.len() - data_start;

    let mut seen = HashSet::with_capacity(entries.len());
    let mut metadata_seen = false;
    let mut infos = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if name == METADATA_KEY {
            if metadata_seen {
                return Err(file_err(format!("the header holds `{METADATA_KEY}` twice")));
            }
            metadata_seen = true;
            if !(value.is_null()
                || value
                    .as_object()
                    .is_some_and(|m| m.values().all(Value::is_string)))
            {
                return Err(file_err(format!(
                    "`{METADATA_KEY}` is {value}, expected an object of strings"
                )));
            }
            continue;
        }
        if name.is_empty() {
            return Err(tensor_err(
                &name,
                "the header holds an empty tensor name".to_string(),
            ));
        }
        if !seen.insert(name.clone()) {
            return Err(tensor_err(&name, "appears twice in the header".to_string()));
        }
        let info: RawInfo = serde_json::from_value(value).map_err(|e| {
            tensor_err(
                &name,
                format!("malformed header entry (expected dtype, shape, data_offsets): {e}"),
            )
        })?;
        infos.push((name, info));
    }
    // A fixed order, so that the same faults always give the same error.
    infos.sort_by(|(a, x), (b, y)| (x.data_offsets, a).cmp(&(y.data_offsets, b)));

    let mut out = Vec::with_capacity(infos.len());
    let mut end_so_far = 0u64;
    let mut previous: Option<String> = None;
    for (name, info) in infos {
        let format = match info.dtype.as_str() {
            "F32" => WeightFormat::F32,
            "F16" => WeightFormat::F16,
            "BF16" => WeightFormat::BF16,
            other => {
                return Err(tensor_err(
                    &name,
                    format!("dtype {other} is not supported (F32, F16 and BF16 are)"),
                ));
            }
        };
        let (s, e) = info.data_offsets;
        let size = info
            .shape
            .iter()
            .try_fold(format.size_bytes() as u64, |acc, &d| acc.checked_mul(d));
        let Some(size) = size else {
            return Err(tensor_err(
                &name,
                format!("shape {:?} has more bytes than a u64 counts", info.shape),
            ));
        };
        if e < s || e - s != size {
            return Err(tensor_err(
                &name,
                format!(
                    "data_offsets [{s}, {e}] do not hold its shape {:?} of {} ({size} bytes)",
                    info.shape, info.dtype
                ),
            ));
        }
        let after = match &previous {
            Some(p) => format!("tensor `{p}`"),
            None => "the start of the data section".to_string(),
        };
        if s < end_so_far {
            return Err(tensor_err(
                &name,
                format!(
                    "data_offsets [{s}, {e}] overlap the data of {after}, which ends at {end_so_far}"
                ),
            ));
        }
        if s > end_so_far {
            return Err(tensor_err(
                &name,
                format!(
                    "data_offsets [{s}, {e}] leave a gap after {after}, which ends at {end_so_far} (the format has no gaps)"
                ),
            ));
        }
        if e > data_len as u64 {
            return Err(tensor_err(
                &name,
                format!(
                    "data_offsets [{s}, {e}] run past the end of the file, whose data section holds {data_len} bytes (truncated?)"
                ),
            ));
        }
        let Ok(shape) = info.shape.iter().map(|&d| usize::try_from(d)).collect() else {
            return Err(tensor_err(
                &name,
                format!("shape {:?} does not fit in usize", info.shape),
            ));
        };
        // `s <= e <= data_len`, so both offsets fit in usize.
        out.push((
            name.clone(),
            format,
            shape,
            data_start + s as usize..data_start + e as usize,
        ));
        end_so_far = e;
        previous = Some(name);
    }
    if end_so_far != data_len as u64 {
        return Err(file_err(format!(
            "{} bytes follow the last tensor's data (the header's tensors take {end_so_far} of the {data_len} bytes of data)",
            data_len as u64 - end_so_far
        )));
    }
    Ok(out)
}
