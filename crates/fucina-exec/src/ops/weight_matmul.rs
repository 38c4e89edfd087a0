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
//! terms past the end, up to the next multiple of 16, count as `0 · 0`), then
//! the lanes folded in halves (`l + 8` into `l`, then `l + 4`, `l + 2`,
//! `l + 1`). The result of a row is therefore the same bits whatever the number
//! of rows in the call (batch invariance), the thread count and the vector
//! level.
//!
//! The `0 · 0` terms are part of the order, not a convenience: adding `+0` to a
//! lane changes it only when it holds `-0`, which a lane reaches only through
//! products that underflow to `-0` (say `-1e-30 · 1e-30`); the padded term turns
//! that lane into `+0`, and with it a total that would otherwise have been `-0`
//! (`tests/weight_matmul.rs` pins the case).
//!
//! # The kernels
//!
//! `kernels::weight_dot` computes the order at three vector levels with the same
//! bits: AVX-512 (a lane chain is one `zmm`; bf16 widened in registers by one
//! `vpermw`, f16 by `vcvtph2ps`; masked loads for the last, partial step),
//! AVX2 + FMA + F16C (a chain is two `ymm`, lanes 0–7 and 8–15; the partial step
//! from zero-padded copies) and portable (`[f32; 16]` and `f32::mul_add`). Each
//! block kernel keeps one accumulator chain per output for a block of weight
//! rows and activation rows: 1 weight row for `m = 1`, so decoding reads every
//! weight byte once, in one sequential stream with the next row prefetched; 3 weight
//! rows × 8 activation rows on AVX-512 (2 × 2 on AVX2) for `m > 1`, so each
//! widened weight vector serves 8 rows of `x`. [`ExecContext::weight_matmul`]
//! splits the output features `j` over the team with the deterministic chunks of
//! the other ops (each output computed by one thread, whole); `m > 1` writes a
//! pooled `[rows, m]` buffer, transposed into `out` after (in blocks of 16
//! features); with `m >= 8`, activation rows that are not 64-byte aligned are
//! first copied to a pooled aligned buffer (when `cols` is a multiple of 16),
//! so that no vector load straddles two cache lines. Measured against the
//! streaming bandwidth in docs/BENCHMARKS.md ("Weight-format matmul (LLM
//! decode)").

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::weight_dot::weight_rows;
use crate::weight_format::WeightMatrix;

impl ExecContext {
    /// `out[i, j] = Σ_k x[i, k] · w[j, k]` for `m` rows of `x` (`[m, w.cols]`,
    /// row-major) into `out` (`[m, w.rows]`), reading `w` in its own format.
    ///
    /// The result of each row is the same bits for any `m`, thread count and vector
    /// level (see the module documentation of the summation order). The output
    /// features `j` are split over the team in deterministic chunks; each output is
    /// computed by one thread, whole, in the fixed order. With `m = 1` (decode)
    /// every weight byte is read once; with `m > 1` each loaded weight vector
    /// serves several rows of `x` (see `kernels::weight_dot`). No heap allocation:
    /// `m > 1` takes one pooled scratch buffer of `m * w.rows` floats (and,
    /// for `m >= 8` with unaligned `x` and `w.cols` a multiple of 16, one of
    /// `m * w.cols` floats for an aligned copy of `x`).
    ///
    /// ```
    /// use fucina_exec::{ExecContext, WeightFormat, WeightMatrix};
    ///
    /// // bf16 weights [2, 3]: [[1, 2, 3], [-1, 0, 0.5]]
    /// let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, -1.0, 0.0, 0.5]
    ///     .iter()
    ///     .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
    ///     .collect();
    /// let w = WeightMatrix::new(WeightFormat::BF16, 2, 3, &bytes)?;
    /// let ctx = ExecContext::new();
    /// let mut out = [0.0f32; 2];
    /// ctx.weight_matmul(&[1.0, 1.0, 2.0], 1, &w, &mut out)?;
    /// assert_eq!(out, [9.0, 0.0]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidDataLength`] (naming `weight_matmul`) when `w.bytes`
    /// does not hold `w.rows * w.cols` elements, `x.len() != m * w.cols` or
    /// `out.len() != m * w.rows`; [`ExecError::InvalidArgument`] when a size
    /// overflows `usize`; [`ExecError::OutOfMemory`] when the scratch buffer of
    /// `m > 1` cannot be had. Nothing is written on an error.
    pub fn weight_matmul(
        &self,
        x: &[f32],
        m: usize,
        w: &WeightMatrix<'_>,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        const OP: &str = "weight_matmul";
        let overflow = ExecError::InvalidArgument {
            op: OP,
            reason: "a size (rows * cols * element size, m * cols or m * rows) overflows usize",
        };
        let (rows, cols) = (w.rows, w.cols);
        let bytes = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(w.format.size_bytes()))
            .ok_or(overflow.clone())?;
        if w.bytes.len() != bytes {
            return Err(ExecError::InvalidDataLength {
                op: OP,
                shape: crate::Dims::new(&[rows, cols]),
                expected: bytes,
                got: w.bytes.len(),
            });
        }
        let x_len = m.checked_mul(cols).ok_or(overflow.clone())?;
        if x.len() != x_len {
            return Err(ExecError::InvalidDataLength {
                op: OP,
                shape: crate::Dims::new(&[m, cols]),
                expected: x_len,
                got: x.len(),
            });
        }
        let out_len = m.checked_mul(rows).ok_or(overflow)?;
        if out.len() != out_len {
            return Err(ExecError::InvalidDataLength {
                op: OP,
                shape: crate::Dims::new(&[m, rows]),
                expected: out_len,
                got: out.len(),
            });
        }
        if out_len == 0 {
            return Ok(());
        }
        // Fused multiply-adds per output feature: the parallel gate's work.
        let work = x_len.max(1);
        if m == 1 {
            // `out` is `[rows]`: a range of features owns a contiguous piece.
            self.par_rows(out, 1, work, |r, o| weight_rows(x, 1, w, r, o));
            return Ok(());
        }
        // The kernels write `[rows, m]` (a range of features owns a
        // contiguous piece of it); transposed into `out` after.
        let mut t = self
            .pool()
            .acquire_scratch::<f32>(out_len)
            .map_err(|e| ExecError::storage(OP, e))?;
        // Activation rows that do not start on 64-byte boundaries make every
        // 16-float load of the AVX-512 kernels straddle two cache lines; with
        // `m >= 8` the rows are first copied to a pooled (64-byte aligned)
        // buffer, when `cols` is a multiple of 16 (so that every row starts
        // aligned there). The values are the same, so are the bits.
        let copy = m >= ALIGN_COPY_MIN_M
            && cols.is_multiple_of(16)
            && !(x.as_ptr() as usize).is_multiple_of(64);
        let mut xa;
        let x = if copy {
            xa = self
                .pool()
                .acquire_scratch::<f32>(x_len)
                .map_err(|e| ExecError::storage(OP, e))?;
            xa.copy_from_slice(x);
            &xa[..]
        } else {
            x
        };
        self.par_rows(&mut t[..], m, work, |r, o| weight_rows(x, m, w, r, o));
        transpose_into(&t, m, rows, out);
        Ok(())
    }
}

/// The smallest `m` for which [`ExecContext::weight_matmul`] copies unaligned
/// activation rows to an aligned buffer first (one copy of `m * cols` floats
/// against `m * rows * cols` fused multiply-adds).
const ALIGN_COPY_MIN_M: usize = 8;

/// Features per block of [`transpose_into`].
const TRANSPOSE_BLOCK: usize = 16;

/// `out[i * rows + j] = t[j * m + i]` (`t` is `[rows, m]`, `out` `[m, rows]`),
/// in blocks of [`TRANSPOSE_BLOCK`] features `j`: a block's `16 * m` floats of
/// `t` stay in L1 while each output row takes 16 contiguous floats (64 bytes)
/// from it. The plain walk (all of `out` row by row) read one cache line of `t`
/// per element: at `m = 64`, 2.6–2.9 × slower for 576 to 5632 features (30.7
/// against 11.5 µs for 576, 376.6 against 142.2 µs for 5632, one thread;
/// see docs/BENCHMARKS-JOURNAL.md).
fn transpose_into(t: &[f32], m: usize, rows: usize, out: &mut [f32]) {
    assert!(
        t.len() == m * rows && out.len() == m * rows,
        "weight_matmul: transpose lengths"
    );
    let mut jb = 0;
    while jb < rows {
        let je = rows.min(jb + TRANSPOSE_BLOCK);
        let tb = &t[jb * m..je * m];
        for (i, out_i) in out.chunks_exact_mut(rows).enumerate() {
            for (o, t_j) in out_i[jb..je].iter_mut().zip(tb.chunks_exact(m)) {
                *o = t_j[i];
            }
        }
        jb = je;
    }
}
