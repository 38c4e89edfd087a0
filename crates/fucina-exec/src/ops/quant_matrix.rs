//! Block-quantized matrices in llama.cpp's layouts: [`QuantMatrix`] (borrowed,
//! e.g. over a memory-mapped file) and [`QuantizedWeights`] (owned), and the
//! ops that make and read them ([`ExecContext::quantize`],
//! [`ExecContext::dequantize`]). The formats are in `docs/QUANTIZATION.md`.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::quant_block;
use crate::ops::quant_format::{QuantFormat, with_block_format};
use crate::tensor::layout::Dims;

/// An immutable `[rows, cols]` block-quantized matrix borrowed in llama.cpp's
/// layout: `rows` output features of `cols` input features each (PyTorch's
/// `nn.Linear` layout), each row `cols / format.block_elements()` blocks. `Copy`, `Send` and `Sync`;
/// the bytes can be a memory-mapped file's, a [`QuantizedWeights`]' or any
/// other slice (no alignment required).
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a> {
    pub(crate) format: QuantFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) bytes: &'a [u8],
}

impl<'a> QuantMatrix<'a> {
    /// A matrix over `bytes`, checked.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `cols` is not a multiple of the
    /// format's [`block_elements`](QuantFormat::block_elements) (32, or 256 for
    /// the super-block formats), [`ExecError::Overflow`] if the size overflows, and
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
pub(crate) fn check_row(
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

/// Quantizes one row (`x.len()` a multiple of the block size) into its blocks
/// `out`.
pub(crate) fn quantize_row(format: QuantFormat, x: &[f32], out: &mut [u8]) {
    with_block_format!(format, F => quant_block::quantize_row::<F>(x, out))
}

/// Dequantizes one row of blocks `blocks` into `out`.
pub(crate) fn dequantize_row(format: QuantFormat, blocks: &[u8], out: &mut [f32]) {
    with_block_format!(format, F => quant_block::dequantize_row::<F>(blocks, out))
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
}
