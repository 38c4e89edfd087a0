//! Products with weights kept in their file format (f32, f16, bf16): the
//! inference path of loaded models, where a weight matrix is read once per
//! decoded token and converting it to f32 up front would double (bf16, f16) the
//! bytes it occupies and reads.
//!
//! # The summation order
//!
//! Every output `out[i, j] = Σ_k x[i, k] · w[j, k]` is computed in one fixed order
//! that depends on nothing but `k`: sixteen lane accumulators, lane `l` taking the
//! terms `k ≡ l (mod 16)` in increasing `k` with a fused multiply-add (missing
//! terms past the end count as `0 · 0`), then the lanes folded in halves
//! (`l + 8` into `l`, then `l + 4`, `l + 2`, `l + 1`). The result of a row is
//! therefore the same bits whatever the number of rows in the call (batch
//! invariance), the thread count and the vector level.

use crate::context::ExecContext;
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
    /// If `r >= rows` or `out.len() != cols`.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row_to_f32: row {r} of {}", self.rows);
        assert_eq!(out.len(), self.cols, "row_to_f32: output length");
        let row = &self.bytes[r * self.cols * self.format.size_bytes()..];
        for (k, o) in out.iter_mut().enumerate() {
            *o = self.format.element(row, k);
        }
    }
}

/// Lanes of the fixed summation order (see the module documentation).
pub const WEIGHT_DOT_LANES: usize = 16;

/// The reference dot product of `x` with row `r` of `w`, in the fixed summation
/// order. Every fast kernel must return these bits.
pub(crate) fn reference_dot(x: &[f32], w: &WeightMatrix<'_>, r: usize) -> f32 {
    let row = &w.bytes[r * w.cols * w.format.size_bytes()..];
    let mut acc = [0.0f32; WEIGHT_DOT_LANES];
    for (k, &xk) in x.iter().enumerate().take(w.cols) {
        let l = k % WEIGHT_DOT_LANES;
        acc[l] = xk.mul_add(w.format.element(row, k), acc[l]);
    }
    let mut width = WEIGHT_DOT_LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

impl ExecContext {
    /// `out[i, j] = Σ_k x[i, k] · w[j, k]` for `m` rows of `x` (`[m, w.cols]`,
    /// row-major) into `out` (`[m, w.rows]`), reading `w` in its own format.
    ///
    /// The result of each row is the same bits for any `m`, thread count and vector
    /// level (see the module documentation of the summation order).
    ///
    /// PLACEHOLDER: this is the scalar reference; the vectorised, threaded kernels
    /// replace its body with the same bits.
    pub fn weight_matmul(
        &self,
        x: &[f32],
        m: usize,
        w: &WeightMatrix<'_>,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        if x.len() != m * w.cols {
            return Err(ExecError::InvalidDataLength {
                op: "weight_matmul",
                shape: crate::Dims::new(&[m, w.cols]),
                expected: m * w.cols,
                got: x.len(),
            });
        }
        if out.len() != m * w.rows {
            return Err(ExecError::InvalidDataLength {
                op: "weight_matmul",
                shape: crate::Dims::new(&[m, w.rows]),
                expected: m * w.rows,
                got: out.len(),
            });
        }
        for i in 0..m {
            let xi = &x[i * w.cols..(i + 1) * w.cols];
            for j in 0..w.rows {
                out[i * w.rows + j] = reference_dot(xi, w, j);
            }
        }
        Ok(())
    }
}
