//! Weights borrowed in their file format (f32, f16, bf16): [`WeightFormat`],
//! [`WeightMatrix`] and the lane count of the weight products' summation order
//! ([`WEIGHT_DOT_LANES`]). The ops that read such weights
//! ([`ExecContext::weight_matmul`](crate::ExecContext::weight_matmul),
//! [`PackedBf16Matrix::new`](crate::PackedBf16Matrix::new)) and their kernels
//! (`kernels/weight_dot/`, `kernels/amx_rule/`) both use these types, so
//! they sit below both.

use crate::error::ExecError;

/// The element format of a [`WeightMatrix`]'s bytes (little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the upper half of a binary32).
    BF16,
}

impl WeightFormat {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::F16 | WeightFormat::BF16 => 2,
        }
    }

    /// The format's name (`"f32"`, `"f16"`, `"bf16"`).
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::F16 => "f16",
            WeightFormat::BF16 => "bf16",
        }
    }

    /// Element `i` of `bytes`, widened to f32 (exact for every format).
    ///
    /// # Panics
    /// If `bytes` is shorter than element `i`'s end.
    #[inline]
    pub fn element(self, bytes: &[u8], i: usize) -> f32 {
        match self {
            WeightFormat::F32 => {
                let b = &bytes[4 * i..4 * i + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }
            WeightFormat::F16 => {
                let b = &bytes[2 * i..2 * i + 2];
                fucina_storage::half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
            }
            WeightFormat::BF16 => {
                let b = &bytes[2 * i..2 * i + 2];
                f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
            }
        }
    }
}

/// A row-major `[rows, cols]` weight matrix borrowed in its file format: `rows`
/// output features of `cols` input features each (the layout of a PyTorch
/// `nn.Linear` weight, `[out, in]`).
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    /// The element format of `bytes`.
    pub format: WeightFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// `rows * cols` elements, little-endian, no alignment required.
    pub bytes: &'a [u8],
}

impl<'a> WeightMatrix<'a> {
    /// A matrix over `bytes`, checked: `bytes` must hold exactly `rows * cols`
    /// elements of `format`.
    pub fn new(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &'a [u8],
    ) -> Result<Self, ExecError> {
        let expected = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(format.size_bytes()))
            .ok_or(ExecError::InvalidArgument {
                op: "weight_matmul",
                reason: "rows * cols * element size overflows usize",
            })?;
        if bytes.len() != expected {
            return Err(ExecError::InvalidDataLength {
                op: "weight_matmul",
                shape: crate::Dims::new(&[rows, cols]),
                expected,
                got: bytes.len(),
            });
        }
        Ok(WeightMatrix {
            format,
            rows,
            cols,
            bytes,
        })
    }

    /// Row `r` widened to f32 into `out` (`out.len() == cols`).
    ///
    /// # Panics
    /// If `r >= rows`, `out.len() != cols`, or `bytes` (a field set by hand)
    /// ends before row `r` does.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row_to_f32: row {r} of {}", self.rows);
        assert_eq!(out.len(), self.cols, "row_to_f32: output length");
        let es = self.format.size_bytes();
        let row = &self.bytes[r * self.cols * es..(r + 1) * self.cols * es];
        // One loop per format over exact chunks (no per-element format match or
        // bounds check, so the f32 and bf16 loops compile to vector code).
        match self.format {
            WeightFormat::F32 => {
                for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            WeightFormat::F16 => {
                for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o = fucina_storage::half::f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
                        .to_f32();
                }
            }
            WeightFormat::BF16 => {
                for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
                }
            }
        }
    }
}

/// Lanes of the fixed summation order of
/// [`ExecContext::weight_matmul`](crate::ExecContext::weight_matmul): sixteen
/// lane accumulators, lane `l` taking the terms `k ≡ l (mod 16)`.
pub const WEIGHT_DOT_LANES: usize = 16;
