//! Block-quantized weights in llama.cpp's Q8_0, Q4_0, Q4_K and Q6_K layouts,
//! and their product with f32 activations (the decode and small-batch path of
//! quantized models).
//!
//! # Formats
//! A row of `cols` weights is `cols / block_elements` blocks, rows one after
//! the other, no padding; the bytes are exactly those of a GGUF tensor of the
//! same type, so files interchange. Q8_0 and Q4_0 have blocks of 32 (`cols` a
//! multiple of 32); Q4_K and Q6_K have super-blocks of 256 (`cols` a multiple
//! of 256).
//! - **Q8_0** (34 bytes per block): an f16 scale `d` (little-endian), then 32
//!   signed bytes `q`; value `k` is `q[k] · d`. Quantizing takes
//!   `d = amax / 127` and `q = round(x / d)` (half away from zero).
//! - **Q4_0** (18 bytes per block): an f16 scale `d`, then 16 bytes of nibbles:
//!   the low nibble of byte `k` holds element `k`, its high nibble element
//!   `k + 16`; value `k` is `(n[k] - 8) · d`. Quantizing takes the signed value
//!   `max` of largest magnitude, `d = max / -8` and
//!   `n = min(15, trunc(x / d + 8.5))`.
//! - **Q4_K** (144 bytes per super-block): f16 `d`, f16 `dmin`, 12 bytes of
//!   eight 6-bit scales `sc` and eight 6-bit mins `mn` (one pair per sub-block
//!   of 32), 128 bytes of nibbles; value `(d · sc) · q − dmin · mn`.
//! - **Q6_K** (210 bytes per super-block): 128 bytes of low nibbles, 64 bytes
//!   of high 2-bit pairs, 16 int8 scales (one per 16 values), f16 `d`; value
//!   `(d · sc) · (q − 32)`.
//!
//! (The K layouts bit by bit are in `kernels::quant_k` and in
//! `docs/QUANTIZATION.md`.) The Q8_0 and Q4_0 scales are computed in f32 and
//! rounded to f16 for storage (the values are quantized with the f32 scale), as
//! llama.cpp's reference quantizer does. The K quantizer is simpler than
//! llama.cpp's (which searches for the scales that minimize a weighted error),
//! so its bytes differ from llama.cpp's; files made by llama.cpp are read as
//! they are:
//! - Q4_K: per sub-block, the range `[min(0, min x), max x]` in 15 steps; the
//!   steps and the mins are coded in 6 bits against `d = max step / 63` and
//!   `dmin = max min / 63` (stored as f16), each rounded to the nearest code;
//!   each value takes the nibble nearest to it under the coded scale and min.
//! - Q6_K: per group of 16, the scale `g = max / −32` (`max` the signed value
//!   of largest magnitude); the scales are coded as int8 against
//!   `d = G / −128` (`G` the group scale of largest magnitude, f16); each value
//!   takes the nearest code in `−32..=31` under its coded scale.
//!
//! # The product
//! [`ExecContext::quant_matmul`] quantizes each activation row once per call to
//! int8 blocks of 32 with an f32 scale (`d = amax / 127`), into pooled scratch,
//! then takes integer dot products block by block (AVX-512 VNNI `vpdpbusd`, AVX2
//! `vpmaddubsw`, or plain Rust), reading the weights in place. Block sums are
//! exact integers, and the float accumulation has one fixed order (eight lanes
//! of four elements, blocks in increasing order, a fused multiply-add by the
//! product of the two scales, then the lanes folded in halves), so a result is
//! the same bits on every vector level, for every thread count, and whatever the
//! other rows of the batch. For Q4_K and Q6_K the weight scale of a lane is
//! that of its sub-block (Q6_K: of its group of 16), an exact f32 product
//! `d · sc`; the even and odd sub-blocks accumulate in two sets of eight lanes
//! (folded together at the end), and Q4_K closes each super-block with its min
//! term, lane `l` taking `fma(−(dmin · mn[l]) · dx, Σ x̂, acc[l])` for
//! sub-block `l` (see `kernels::quant_k`).
//!
//! # Lifetime of the weights
//! [`ExecContext::quant_matmul`] reads the llama.cpp layout directly: a
//! [`QuantMatrix`] is treated as [`RhsLifetime::Transient`](crate::RhsLifetime)
//! and nothing is kept, so a borrowed matrix over memory-mapped file bytes costs
//! no extra memory. A weight that lives for the process (the
//! [`RhsLifetime::StableProcess`](crate::RhsLifetime) case: a loaded model) can
//! be repacked once by [`ExecContext::repack_quant`] into a
//! [`PackedQuantMatrix`] (strips of eight rows, scales side by side, 64-byte
//! aligned; see `kernels::quant_packed`), which its owner keeps and
//! [`ExecContext::quant_matmul_packed`] reads. The copy is owned by that value
//! and freed when it drops; its results are the same bits as `quant_matmul` on
//! the original blocks.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::quant_dot::{self, Acts, LANES, QK};
use crate::kernels::quant_k::{self, Q4K_BYTES, Q6K_BYTES, QK_K};
use crate::kernels::quant_packed::{self, G, StripLayout};
use crate::memory::advise_huge_pages;
use crate::tensor::layout::Dims;

/// A block-quantized weight format (llama.cpp's layouts; see the module docs).
/// The variants are spelled as llama.cpp spells its types.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// 32 int8 values and an f16 scale per block (34 bytes).
    Q8_0,
    /// 32 4-bit values and an f16 scale per block (18 bytes).
    Q4_0,
    /// Super-blocks of 256: eight sub-blocks of 32 4-bit values, each with a
    /// 6-bit scale and a 6-bit min, under an f16 scale and an f16 min scale
    /// (144 bytes, 4.5 bits per weight).
    Q4_K,
    /// Super-blocks of 256: 6-bit values, an int8 scale per 16 values, an f16
    /// scale (210 bytes, 6.5625 bits per weight).
    Q6_K,
}

impl QuantFormat {
    /// Every format, in declaration order.
    pub const ALL: [QuantFormat; 4] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
    ];

    /// Elements per block: 32 for Q8_0 and Q4_0, 256 (a super-block) for Q4_K
    /// and Q6_K. A matrix's column count must be a multiple of it.
    pub const fn block_elements(self) -> usize {
        match self {
            QuantFormat::Q8_0 | QuantFormat::Q4_0 => QK,
            QuantFormat::Q4_K | QuantFormat::Q6_K => QK_K,
        }
    }

    /// Bytes per block: 34 for Q8_0, 18 for Q4_0, 144 for Q4_K, 210 for Q6_K.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_K => Q4K_BYTES,
            QuantFormat::Q6_K => Q6K_BYTES,
        }
    }

    /// The format's name as llama.cpp spells it (`"q8_0"`, `"q4_0"`, `"q4_k"`,
    /// `"q6_k"`).
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "q8_0",
            QuantFormat::Q4_0 => "q4_0",
            QuantFormat::Q4_K => "q4_k",
            QuantFormat::Q6_K => "q6_k",
        }
    }

    /// Whether [`ExecContext::repack_quant`] accepts the format: Q8_0 and
    /// Q4_0 are repacked, Q4_K and Q6_K are read in place only.
    pub const fn repackable(self) -> bool {
        matches!(self, QuantFormat::Q8_0 | QuantFormat::Q4_0)
    }

    /// The bytes of a `[rows, cols]` matrix in this format.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `cols` is not a multiple of
    /// [`block_elements`](Self::block_elements), [`ExecError::Overflow`] if the
    /// size does not fit in `usize`.
    pub fn matrix_bytes(
        self,
        op: &'static str,
        rows: usize,
        cols: usize,
    ) -> Result<usize, ExecError> {
        if !cols.is_multiple_of(self.block_elements()) {
            return Err(ExecError::InvalidArgument {
                op,
                reason: if self.block_elements() == QK {
                    "the column count of a quantized matrix must be a multiple of 32 (the block size)"
                } else {
                    "the column count of a q4_k or q6_k matrix must be a multiple of 256 (the super-block size)"
                },
            });
        }
        (cols / self.block_elements())
            .checked_mul(self.block_bytes())
            .and_then(|b| b.checked_mul(rows))
            .ok_or(ExecError::Overflow {
                op,
                shape: Dims::new(&[rows, cols]),
            })
    }

    fn is_q4(self) -> bool {
        self == QuantFormat::Q4_0
    }

    /// Whether this is a super-block format (Q4_K, Q6_K).
    fn is_k(self) -> bool {
        matches!(self, QuantFormat::Q4_K | QuantFormat::Q6_K)
    }
}

/// An immutable `[rows, cols]` block-quantized matrix borrowed in llama.cpp's
/// layout: `rows` output features of `cols` input features each (PyTorch's
/// `nn.Linear` layout), each row `cols / format.block_elements()` blocks. `Copy`, `Send` and `Sync`;
/// the bytes can be a memory-mapped file's, a [`QuantizedWeights`]' or any
/// other slice (no alignment required).
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a> {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    bytes: &'a [u8],
}

impl<'a> QuantMatrix<'a> {
    /// A matrix over `bytes`, checked.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `cols` is not a multiple of the
    /// format's [`block_elements`](QuantFormat::block_elements) (32, or 256 for
    /// Q4_K and Q6_K), [`ExecError::Overflow`] if the size overflows, and
    /// [`ExecError::InvalidDataLength`] if `bytes` is not exactly
    /// `rows · cols / block_elements` blocks long.
    pub fn new(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        bytes: &'a [u8],
    ) -> Result<Self, ExecError> {
        let op = "QuantMatrix::new";
        let expected = format.matrix_bytes(op, rows, cols)?;
        if bytes.len() != expected {
            return Err(ExecError::InvalidDataLength {
                op,
                shape: Dims::new(&[rows, cols]),
                expected,
                got: bytes.len(),
            });
        }
        Ok(QuantMatrix {
            format,
            rows,
            cols,
            bytes,
        })
    }

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Output features (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns, a multiple of the format's block size).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The blocks, row after row.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.format.block_elements() * self.format.block_bytes()
    }

    /// Row `r` dequantized into `out` (`out.len() == cols`): Q8_0 `q · d`,
    /// Q4_0 `(n - 8) · d`, each one f32 product (exact up to that rounding);
    /// Q4_K `(d · sc) · q − dmin · mn` (one rounding, the difference), Q6_K
    /// `(d · sc) · (q − 32)` (exact), as llama.cpp computes them.
    ///
    /// # Errors
    /// [`ExecError::IndexOutOfBounds`] if `r >= rows`,
    /// [`ExecError::InvalidDataLength`] if `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), ExecError> {
        check_row(
            "QuantMatrix::dequantize_row",
            r,
            self.rows,
            self.cols,
            out.len(),
        )?;
        let rb = self.row_bytes();
        dequantize_row(self.format, &self.bytes[r * rb..(r + 1) * rb], out);
        Ok(())
    }
}

/// The checks of a `dequantize_row`: row `r` of `rows`, into `out_len` values
/// for `cols` columns.
fn check_row(
    op: &'static str,
    r: usize,
    rows: usize,
    cols: usize,
    out_len: usize,
) -> Result<(), ExecError> {
    if r >= rows {
        return Err(ExecError::IndexOutOfBounds {
            op,
            index: i64::try_from(r).unwrap_or(i64::MAX),
            bound: rows,
        });
    }
    if out_len != cols {
        return Err(ExecError::InvalidDataLength {
            op,
            shape: Dims::new(&[cols]),
            expected: cols,
            got: out_len,
        });
    }
    Ok(())
}

/// A block-quantized matrix owning its bytes (llama.cpp's layout, see
/// [`QuantMatrix`]); made by [`ExecContext::quantize`] or from bytes read
/// elsewhere. Immutable, `Send` and `Sync`; [`matrix`](Self::matrix) borrows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizedWeights {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
}

impl QuantizedWeights {
    /// Takes `bytes` (checked as [`QuantMatrix::new`] checks them).
    ///
    /// # Errors
    /// As [`QuantMatrix::new`].
    pub fn from_bytes(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
    ) -> Result<Self, ExecError> {
        QuantMatrix::new(format, rows, cols, &bytes)?;
        Ok(QuantizedWeights {
            format,
            rows,
            cols,
            bytes,
        })
    }

    /// The matrix, borrowed.
    pub fn matrix(&self) -> QuantMatrix<'_> {
        QuantMatrix {
            format: self.format,
            rows: self.rows,
            cols: self.cols,
            bytes: &self.bytes,
        }
    }

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Output features (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns, a multiple of the format's block size).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The blocks, row after row.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The blocks, given back.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// 64 bytes, 64-byte aligned: the unit of a [`PackedQuantMatrix`]'s storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The bytes of `lines`.
fn line_bytes(lines: &[Line]) -> &[u8] {
    // SAFETY: a Line is 64 bytes with no padding (repr(C) over [u8; 64]), so
    // the slice's memory is `64 · len` initialized bytes, borrowed as long as
    // `lines`.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast(), lines.len() * 64) }
}

/// The bytes of `lines`, mutably.
fn line_bytes_mut(lines: &mut [Line]) -> &mut [u8] {
    // SAFETY: as in `line_bytes`; the borrow is exclusive, and any byte
    // pattern is a valid Line.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), lines.len() * 64) }
}

/// A block-quantized matrix repacked for the kernels: the same bytes as the
/// llama.cpp blocks it was made from ([`ExecContext::repack_quant`]), laid out
/// in 64-byte aligned strips of eight rows with the eight rows' f16 scales side
/// by side, so a decode step reads one sequential stream per thread and
/// converts eight scales at once. [`ExecContext::quant_matmul_packed`] gives
/// the same bits as [`ExecContext::quant_matmul`] on the original matrix.
///
/// This is the prepared form of a weight that lives for the process
/// ([`RhsLifetime::StableProcess`](crate::RhsLifetime)): make it once, keep it
/// with the model, drop it with the model (it owns its copy; nothing is cached
/// elsewhere). Immutable, `Send` and `Sync`.
#[derive(Clone)]
pub struct PackedQuantMatrix {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    layout: StripLayout,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedQuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedQuantMatrix")
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("size_bytes", &self.size_bytes())
            .finish()
    }
}

impl PackedQuantMatrix {
    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Output features (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns, a multiple of 32).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The memory the repacked copy takes: the matrix's bytes, plus the
    /// padding of the last strip to eight rows and of each strip's scales to
    /// 64 bytes.
    pub fn size_bytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// Row `r` dequantized into `out` (`out.len() == cols`): the same values,
    /// bit for bit, as [`QuantMatrix::dequantize_row`] on the original blocks
    /// (so an owner that keeps only the repacked copy can still read a row,
    /// e.g. a tied embedding).
    ///
    /// # Errors
    /// [`ExecError::IndexOutOfBounds`] if `r >= rows`,
    /// [`ExecError::InvalidDataLength`] if `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), ExecError> {
        check_row(
            "PackedQuantMatrix::dequantize_row",
            r,
            self.rows,
            self.cols,
            out.len(),
        )?;
        let lay = &self.layout;
        let sb = lay.strip_bytes;
        let strip = &line_bytes(&self.lines)[r / G * sb..(r / G + 1) * sb];
        let mut blk = [0u8; 34];
        let bb = self.format.block_bytes();
        for (b, ob) in out.chunks_exact_mut(QK).enumerate() {
            quant_packed::block_of(lay, strip, r % G, b, &mut blk[..bb]);
            dequantize_row(self.format, &blk[..bb], ob);
        }
        Ok(())
    }
}

/// Quantizes one row (`x.len()` a multiple of the block size) into its blocks
/// `out`.
fn quantize_row(format: QuantFormat, x: &[f32], out: &mut [u8]) {
    let bb = format.block_bytes();
    if format.is_k() {
        for (xb, blk) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(bb)) {
            match format {
                QuantFormat::Q4_K => quant_k::quantize_q4k(xb, blk),
                _ => quant_k::quantize_q6k(xb, blk),
            }
        }
        return;
    }
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bb)) {
        let (d, qs) = blk.split_at_mut(2);
        let scale = match format {
            QuantFormat::Q8_0 => {
                let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                for (q, &v) in qs.iter_mut().zip(xb) {
                    *q = (v * id).round() as i8 as u8;
                }
                d
            }
            QuantFormat::Q4_0 => {
                let (mut amax, mut max) = (0.0f32, 0.0f32);
                for &v in xb {
                    if amax < v.abs() {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let nib = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
                for (k, q) in qs.iter_mut().enumerate() {
                    *q = nib(xb[k]) | (nib(xb[k + 16]) << 4);
                }
                d
            }
            QuantFormat::Q4_K | QuantFormat::Q6_K => {
                unreachable!("quantize_row: super-block formats return above")
            }
        };
        d.copy_from_slice(
            &fucina_storage::half::f16::from_f32(scale)
                .to_bits()
                .to_le_bytes(),
        );
    }
}

/// Dequantizes one row of blocks `blocks` into `out`.
fn dequantize_row(format: QuantFormat, blocks: &[u8], out: &mut [f32]) {
    let bb = format.block_bytes();
    if format.is_k() {
        for (blk, ob) in blocks.chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
            match format {
                QuantFormat::Q4_K => quant_k::dequantize_q4k(blk, ob),
                _ => quant_k::dequantize_q6k(blk, ob),
            }
        }
        return;
    }
    for (blk, ob) in blocks.chunks_exact(bb).zip(out.chunks_exact_mut(QK)) {
        let d = quant_dot::f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
        let qs = &blk[2..];
        match format {
            QuantFormat::Q8_0 => {
                for (o, &q) in ob.iter_mut().zip(qs) {
                    *o = f32::from(q as i8) * d;
                }
            }
            QuantFormat::Q4_0 => {
                for (k, &q) in qs.iter().enumerate() {
                    ob[k] = f32::from((q & 0x0f) as i8 - 8) * d;
                    ob[k + 16] = f32::from((q >> 4) as i8 - 8) * d;
                }
            }
            QuantFormat::Q4_K | QuantFormat::Q6_K => {
                unreachable!("dequantize_row: super-block formats return above")
            }
        }
    }
}

impl ExecContext {
    /// Quantizes the row-major `[rows, cols]` matrix `values` to `format`
    /// (llama.cpp's reference quantizer for Q8_0 and Q4_0, a simpler
    /// documented one for Q4_K and Q6_K; see the module docs), in parallel
    /// over rows.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, QuantFormat};
    ///
    /// let ctx = ExecContext::new();
    /// let w: Vec<f32> = (0..64).map(|i| i as f32 - 32.0).collect();
    /// let q = ctx.quantize(QuantFormat::Q8_0, 2, 32, &w)?;
    /// assert_eq!(q.bytes().len(), 2 * 34);
    /// let mut back = vec![0.0; 64];
    /// ctx.dequantize(&q.matrix(), &mut back)?;
    /// assert!(back.iter().zip(&w).all(|(b, w)| (b - w).abs() <= 0.13));
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `cols` is not a multiple of the
    /// format's [`block_elements`](QuantFormat::block_elements),
    /// [`ExecError::InvalidDataLength`] if `values.len() != rows · cols`,
    /// [`ExecError::Overflow`] on a size overflow, [`ExecError::OutOfMemory`] if
    /// the bytes cannot be allocated.
    pub fn quantize(
        &self,
        format: QuantFormat,
        rows: usize,
        cols: usize,
        values: &[f32],
    ) -> Result<QuantizedWeights, ExecError> {
        let op = "quantize";
        let nbytes = format.matrix_bytes(op, rows, cols)?;
        let n = rows.checked_mul(cols).ok_or(ExecError::Overflow {
            op,
            shape: Dims::new(&[rows, cols]),
        })?;
        if values.len() != n {
            return Err(ExecError::InvalidDataLength {
                op,
                shape: Dims::new(&[rows, cols]),
                expected: n,
                got: values.len(),
            });
        }
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(nbytes).map_err(|_| {
            ExecError::storage(
                op,
                fucina_storage::StorageError::AllocationFailed { bytes: nbytes },
            )
        })?;
        bytes.resize(nbytes, 0);
        if cols > 0 {
            let rb = nbytes / rows.max(1);
            self.par_rows(&mut bytes, rb, cols, |r, out| {
                for (i, o) in r.zip(out.chunks_exact_mut(rb)) {
                    quantize_row(format, &values[i * cols..(i + 1) * cols], o);
                }
            });
        }
        Ok(QuantizedWeights {
            format,
            rows,
            cols,
            bytes,
        })
    }

    /// Dequantizes `w` into `out` (row-major `[rows, cols]`), in parallel over
    /// rows (see [`QuantMatrix::dequantize_row`]).
    ///
    /// # Errors
    /// [`ExecError::InvalidDataLength`] if `out.len() != rows · cols`.
    pub fn dequantize(&self, w: &QuantMatrix<'_>, out: &mut [f32]) -> Result<(), ExecError> {
        let n = w.rows * w.cols;
        if out.len() != n {
            return Err(ExecError::InvalidDataLength {
                op: "dequantize",
                shape: Dims::new(&[w.rows, w.cols]),
                expected: n,
                got: out.len(),
            });
        }
        if n == 0 {
            return Ok(());
        }
        let (rb, cols) = (w.row_bytes(), w.cols);
        self.par_rows(out, cols, cols, |r, out| {
            for (i, o) in r.zip(out.chunks_exact_mut(cols)) {
                dequantize_row(w.format, &w.bytes[i * rb..(i + 1) * rb], o);
            }
        });
        Ok(())
    }

    /// Repacks `w` into the kernels' strip layout (see [`PackedQuantMatrix`]),
    /// in parallel over strips: for a weight that lives for the process, made
    /// once and kept by its owner.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, QuantFormat};
    ///
    /// let ctx = ExecContext::new();
    /// let w: Vec<f32> = (0..10 * 64).map(|i| ((i * 7 % 19) as f32 - 9.0) / 10.0).collect();
    /// let q = ctx.quantize(QuantFormat::Q8_0, 10, 64, &w)?;
    /// let packed = ctx.repack_quant(&q.matrix())?;
    /// let x: Vec<f32> = (0..64).map(|i| (i as f32).cos()).collect();
    /// let (mut a, mut b) = (vec![0.0; 10], vec![0.0; 10]);
    /// ctx.quant_matmul(&x, 1, &q.matrix(), &mut a)?;
    /// ctx.quant_matmul_packed(&x, 1, &packed, &mut b)?;
    /// assert_eq!(a, b); // the same bits
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] for a Q4_K or Q6_K matrix (see
    /// [`QuantFormat::repackable`]: those are read in place by
    /// [`quant_matmul`](Self::quant_matmul)), [`ExecError::Overflow`] if the
    /// size overflows, [`ExecError::OutOfMemory`] if the copy cannot be
    /// allocated.
    pub fn repack_quant(&self, w: &QuantMatrix<'_>) -> Result<PackedQuantMatrix, ExecError> {
        let op = "repack_quant";
        if !w.format.repackable() {
            return Err(ExecError::InvalidArgument {
                op,
                reason: "q4_k and q6_k matrices are read in place by quant_matmul; only q8_0 and q4_0 are repacked",
            });
        }
        let overflow = || ExecError::Overflow {
            op,
            shape: Dims::new(&[w.rows, w.cols]),
        };
        let layout = StripLayout::new(w.format.is_q4(), w.cols / QK).ok_or_else(overflow)?;
        let strips = w.rows.div_ceil(G);
        let nbytes = strips
            .checked_mul(layout.strip_bytes)
            .ok_or_else(overflow)?;
        let mut lines: Vec<Line> = Vec::new();
        lines.try_reserve_exact(nbytes / 64).map_err(|_| {
            ExecError::storage(
                op,
                fucina_storage::StorageError::AllocationFailed { bytes: nbytes },
            )
        })?;
        advise_huge_pages(lines.as_ptr().cast(), nbytes);
        lines.resize(nbytes / 64, Line([0; 64]));
        if nbytes > 0 {
            let bytes = line_bytes_mut(&mut lines);
            let sb = layout.strip_bytes;
            self.par_rows(bytes, sb, sb, |r, out| {
                for (s, o) in r.zip(out.chunks_exact_mut(sb)) {
                    quant_packed::repack_strip(&layout, w.bytes, w.rows, s, o);
                }
            });
        }
        Ok(PackedQuantMatrix {
            format: w.format,
            rows: w.rows,
            cols: w.cols,
            layout,
            lines,
        })
    }

    /// [`quant_matmul`](Self::quant_matmul) over a repacked matrix: the same
    /// `out[i, j] = Σ_k x[i, k] · w[j, k]`, the same bits (for any `m`, thread
    /// count and vector level), read from the strip layout. Allocates nothing
    /// once the context's pool holds the scratch of a call of this size.
    ///
    /// # Errors
    /// As [`quant_matmul`](Self::quant_matmul).
    pub fn quant_matmul_packed(
        &self,
        x: &[f32],
        m: usize,
        w: &PackedQuantMatrix,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        let op = "quant_matmul_packed";
        let (rows, cols) = (w.rows, w.cols);
        let Some((nx, no)) = check_product(op, x, m, rows, cols, out)? else {
            return Ok(());
        };
        let nb = cols / QK;
        let lease = |e| ExecError::storage(op, e);
        let pool = self.pool();
        let strips = rows.div_ceil(G);
        let mut xq = pool.acquire_scratch::<i8>(nx).map_err(lease)?;
        let mut xs = pool.acquire_scratch::<f32>(m * nb).map_err(lease)?;
        let mut xb = pool.acquire_scratch::<i32>(m * nb * LANES).map_err(lease)?;
        let mut t = pool.acquire_scratch::<f32>(strips * G * m).map_err(lease)?;
        self.quantize_acts(x, cols, w.format.is_q4(), &mut xq, &mut xs, &mut xb);
        let acts = Acts {
            q: &xq,
            scale: &xs,
            bias: &xb,
            cols,
        };
        let data = line_bytes(&w.lines);
        let lay = w.layout;
        self.par_rows(&mut t, G * m, G * m * cols, |r, o| {
            quant_packed::packed_rows(&lay, data, r, &acts, m, o);
        });
        debug_assert_eq!(out.len(), no);
        if m == 1 {
            out.copy_from_slice(&t[..rows]);
        } else {
            // `t` holds each strip's outputs activation row by activation
            // row: a row of `out` is gathered in runs of G (rows of `out` in
            // parallel).
            let t = &t[..strips * G * m];
            self.par_rows(out, rows, rows, |ri, out| {
                for (s, ts) in t.chunks_exact(G * m).enumerate() {
                    let n = G.min(rows - s * G);
                    for (i, o) in ri.clone().zip(out.chunks_exact_mut(rows)) {
                        let run = &ts[i * G..(i + 1) * G];
                        let o = &mut o[s * G..s * G + n];
                        if n == G {
                            // A whole strip: a fixed-length copy (no library
                            // call).
                            let o: &mut [f32; G] = o.try_into().expect("G outputs");
                            *o = run.try_into().expect("a run of G");
                        } else {
                            o.copy_from_slice(&run[..n]);
                        }
                    }
                }
            });
        }
        Ok(())
    }

    /// `out[i, j] = Σ_k x[i, k] · w[j, k]` for `m` rows of `x` (`[m, w.cols()]`,
    /// row-major, f32) into `out` (`[m, w.rows()]`), reading `w` in its block
    /// format: each row of `x` is quantized to int8 blocks of 32 (f32 scale
    /// `amax / 127`), then every block pair is an exact integer dot product,
    /// accumulated in the fixed order of the module docs. Each row's result is
    /// the same bits for any `m`, thread count and vector level; a row of `x`
    /// holding a non-finite value gives NaN outputs.
    ///
    /// Runs in parallel over the rows of `w`; allocates nothing once the
    /// context's pool holds the scratch (the quantized activations, and for
    /// `m > 1` a transposed output) of a call of this size.
    ///
    /// # Errors
    /// [`ExecError::InvalidDataLength`] if `x.len() != m · cols` or
    /// `out.len() != m · rows`; [`ExecError::OutOfMemory`] if the scratch cannot
    /// be had (then `out` is unchanged).
    pub fn quant_matmul(
        &self,
        x: &[f32],
        m: usize,
        w: &QuantMatrix<'_>,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        let op = "quant_matmul";
        let (rows, cols) = (w.rows, w.cols);
        let Some((nx, no)) = check_product(op, x, m, rows, cols, out)? else {
            return Ok(());
        };
        let nb = cols / QK;
        let q4 = w.format.is_q4();
        let lease = |e| ExecError::storage(op, e);
        let pool = self.pool();
        let mut xq = pool.acquire_scratch::<i8>(nx).map_err(lease)?;
        let mut xs = pool.acquire_scratch::<f32>(m * nb).map_err(lease)?;
        let mut xb = pool.acquire_scratch::<i32>(m * nb * LANES).map_err(lease)?;
        // Q4_K's min term needs each activation block's sum.
        let mut sums = match w.format.is_k() {
            true => Some(pool.acquire_scratch::<f32>(m * nb).map_err(lease)?),
            false => None,
        };
        let mut tr = match m {
            1 => None,
            _ => Some(pool.acquire_scratch::<f32>(no).map_err(lease)?),
        };
        let q6 = w.format == QuantFormat::Q6_K;
        match sums.as_deref_mut() {
            Some(sums) => {
                quant_k::quantize_acts(x, m, cols, q6, &mut xq, &mut xs, &mut xb, sums);
            }
            None => self.quantize_acts(x, cols, q4, &mut xq, &mut xs, &mut xb),
        }
        let acts = Acts {
            q: &xq,
            scale: &xs,
            bias: &xb,
            cols,
        };
        let rb = w.row_bytes();
        let sums = sums.as_deref();
        let kernel = |r: std::ops::Range<usize>, o: &mut [f32]| match sums {
            Some(sums) => quant_k::quant_rows(q6, w.bytes, rb, r, &acts, sums, m, o),
            None => quant_dot::quant_rows(q4, w.bytes, rb, r, &acts, m, o),
        };
        match tr.as_deref_mut() {
            None => self.par_rows(out, 1, cols, kernel),
            Some(t) => {
                // Transposed output [rows, m]: each weight row's m outputs are
                // contiguous, so the chunks split the weight rows.
                self.par_rows(t, m, m * cols, kernel);
                untranspose(t, m, out);
            }
        }
        Ok(())
    }
}

/// Writes `t` (`[rows, m]`, each weight row's `m` outputs side by side) into
/// `out` (`[m, rows]`): blocks of 16 weight rows at a time, so that each
/// activation row receives a run of 16 contiguous outputs (one cache line)
/// instead of single values `rows` apart.
fn untranspose(t: &[f32], m: usize, out: &mut [f32]) {
    const B: usize = 16;
    let rows = t.len() / m;
    debug_assert_eq!(out.len(), rows * m);
    for (jb, tb) in t.chunks(B * m).enumerate() {
        let n = tb.len() / m;
        let j0 = jb * B;
        for (i, orow) in out.chunks_exact_mut(rows).enumerate() {
            for (jj, o) in orow[j0..j0 + n].iter_mut().enumerate() {
                *o = tb[jj * m + i];
            }
        }
    }
}

/// Checks the lengths of a quantized product's operands; `None` when there is
/// nothing to compute (`out` then holds its result: nothing, or zeros for
/// `cols == 0`), else the lengths of `x` and `out`.
fn check_product(
    op: &'static str,
    x: &[f32],
    m: usize,
    rows: usize,
    cols: usize,
    out: &mut [f32],
) -> Result<Option<(usize, usize)>, ExecError> {
    let len_err = |shape: &[usize], expected: usize, got: usize| ExecError::InvalidDataLength {
        op,
        shape: Dims::new(shape),
        expected,
        got,
    };
    let nx = m.checked_mul(cols).ok_or(ExecError::Overflow {
        op,
        shape: Dims::new(&[m, cols]),
    })?;
    if x.len() != nx {
        return Err(len_err(&[m, cols], nx, x.len()));
    }
    let no = m.checked_mul(rows).ok_or(ExecError::Overflow {
        op,
        shape: Dims::new(&[m, rows]),
    })?;
    if out.len() != no {
        return Err(len_err(&[m, rows], no, out.len()));
    }
    if no == 0 {
        return Ok(None);
    }
    if cols == 0 {
        out.fill(0.0);
        return Ok(None);
    }
    Ok(Some((nx, no)))
}

impl ExecContext {
    /// Quantizes the `x.len() / cols` rows of `x` to int8 blocks (`xq`), their
    /// scales (`xs`) and lane biases (`xb`), rows in parallel (each row's
    /// blocks depend on that row alone).
    fn quantize_acts(
        &self,
        x: &[f32],
        cols: usize,
        q4: bool,
        xq: &mut [i8],
        xs: &mut [f32],
        xb: &mut [i32],
    ) {
        let nb = cols / QK;
        let m = x.len() / cols;
        let offset = quant_dot::bias_offset(q4);
        self.par_rows3(
            (&mut xq[..m * cols], cols),
            (&mut xs[..m * nb], nb),
            (&mut xb[..m * nb * LANES], nb * LANES),
            4 * cols,
            |rows, xq, xs, xb| {
                for (k, i) in rows.enumerate() {
                    quant_dot::quantize_row(
                        &x[i * cols..(i + 1) * cols],
                        offset,
                        &mut xq[k * cols..(k + 1) * cols],
                        &mut xs[k * nb..(k + 1) * nb],
                        &mut xb[k * nb * LANES..(k + 1) * nb * LANES],
                    );
                }
            },
        );
    }
}
