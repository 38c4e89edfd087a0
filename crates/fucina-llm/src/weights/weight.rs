//! One tensor of a model in its file format, and the kernel that reads it.

use std::sync::Arc;

use fucina::exec::{
    GroupedWeight, PackedBf16Matrix, PackedQuantMatrix, QuantFormat, QuantMatrix, Storage,
    TensorFormat, WeightFormat, WeightMatrix,
};

use crate::error::LlmError;

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

    /// The weight as the kernel of [`matmul`](Weight::matmul) reads it, for
    /// [`ExecContext::grouped_matmul`](fucina::ExecContext::grouped_matmul)
    /// (the same bits as [`matmul`](Weight::matmul)).
    ///
    /// # Errors
    /// A weight that is not a matrix.
    pub fn grouped(&self) -> Result<GroupedWeight<'_>, LlmError> {
        if let Some(b) = &self.bf16 {
            return Ok(GroupedWeight::Bf16AmxRule(b));
        }
        Ok(match (&self.packed, self.quant_format()) {
            (Some(p), _) => GroupedWeight::Packed(p),
            (None, None) => GroupedWeight::Float(self.matrix()?),
            (None, Some(_)) => GroupedWeight::Quant(self.quant_matrix("")?),
        })
    }

    /// Makes the kernels' repacked copy of a quantized matrix
    /// ([`ExecContext::repack_quant`](fucina::ExecContext::repack_quant): rows in
    /// strips of 8, scales apart from the values, 64-byte aligned), which
    /// [`matmul`](Weight::matmul) reads from then on: the same bits, faster
    /// (the decode of a quantized model reads its weights at close to the
    /// memory bandwidth). The copy lives as long as the weight (and its
    /// clones); the original bytes stay for [`bytes`](Weight::bytes). Returns
    /// whether a copy was made (`false` for a float weight, one already
    /// repacked, or a matrix read in place, see
    /// [`QuantFormat::repackable_rows`]: a format other than the blocks of 32
    /// and Q4_K, or a Q4_K matrix whose rows are not a multiple of 8).
    ///
    /// # Errors
    /// Out of memory.
    pub fn repack(&mut self, ctx: &fucina::ExecContext) -> Result<bool, LlmError> {
        let rows = self.shape.first().copied().unwrap_or(0);
        if self.quant_format().is_none_or(|q| !q.repackable_rows(rows)) || self.packed.is_some() {
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
pub(super) fn encode_f32(format: WeightFormat, values: &[f32], out: &mut [u8]) {
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
