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
//! (The K layouts bit by bit are in `kernels::quant_block` and in
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
//! other rows of the batch. The K formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and
//! IQ4_XS take their activations in
//! blocks of 256 instead (llama.cpp's Q8_K: one f32 scale per block, int8
//! values, the sums of each group of 16) and apply their sub-block scales and
//! mins as integer multiplies: per super-block and output two exact integers
//! and one or two fused multiply-adds, super-blocks in increasing order (see
//! `kernels::quant_k::q8k`), the same bits everywhere by the same argument.
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
use crate::kernels::quant_block;
use crate::kernels::quant_dot::{self, Acts, LANES, QK};
use crate::kernels::quant_k;
use crate::kernels::quant_k::QK_K;
use crate::kernels::quant_k::q8k::{self, GROUPS, KActs};
use crate::ops::quant_format::QuantFormat;
use crate::ops::quant_format::with_block_format;
use crate::ops::quant_matrix::QuantMatrix;
use crate::tensor::layout::Dims;

impl ExecContext {
    /// `out[i, j] = Σ_k x[i, k] · w[j, k]` for `m` rows of `x` (`[m, w.cols()]`,
    /// row-major, f32) into `out` (`[m, w.rows()]`), reading `w` in its block
    /// format: each row of `x` is quantized to int8 blocks of 32 (f32 scale
    /// `amax / 127`; for the K formats and IQ4_XS blocks of 256 with llama.cpp's
    /// Q8_K rule), then every block pair is an exact integer dot product,
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
        let format = w.format;
        if let Some(kernel) = q8k_kernel(format) {
            return self.quant_matmul_q8k("quant_matmul", x, m, w, out, (kernel, 1));
        }
        let nb = cols / QK;
        let offset = format.act_offset();
        let lease = |e| ExecError::storage(op, e);
        let pool = self.pool();
        let mut xq = pool.acquire_scratch::<i8>(nx).map_err(lease)?;
        let mut xs = pool.acquire_scratch::<f32>(m * nb).map_err(lease)?;
        let mut xb = pool.acquire_scratch::<i32>(m * nb * LANES).map_err(lease)?;
        // A format with a min term (Q4_1, Q5_1, Q2_K) needs each activation
        // block's sum.
        let mut sums = match format.needs_sums() {
            true => Some(pool.acquire_scratch::<f32>(m * nb).map_err(lease)?),
            false => None,
        };
        let mut tr = match m {
            1 => None,
            _ => Some(pool.acquire_scratch::<f32>(no).map_err(lease)?),
        };
        match sums.as_deref_mut() {
            Some(sums) => {
                quant_k::quantize_acts(x, m, cols, offset, &mut xq, &mut xs, &mut xb, sums);
            }
            None => self.quantize_acts(x, cols, offset, &mut xq, &mut xs, &mut xb),
        }
        let acts = Acts {
            q: &xq,
            scale: &xs,
            bias: &xb,
            cols,
        };
        let rb = w.row_bytes();
        let sums = sums.as_deref().unwrap_or(&[]);
        let kernel = |r: std::ops::Range<usize>, o: &mut [f32]| with_block_format!(format, F => quant_block::quant_rows::<F>(w.bytes, rb, r, &acts, sums, m, o));
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

/// The kernels of a format whose products take the super-block activations
/// (`kernels::quant_k::q8k`: the K formats and IQ4_XS): the rows kernel
/// (`q8k_rows`) and the GEMM over tiles of 16 weight rows (`gemm_tiles`,
/// the weight row count its third argument).
#[derive(Clone, Copy)]
pub(crate) struct Q8kKernel {
    pub(crate) rows: Q8kRows,
    gemm: Q8kGemmTiles,
    /// `gemm_for`: whether `gemm` runs `m` activation rows at this level.
    gemm_for: fn(usize) -> bool,
}

/// `q8k_rows`: weights, row bytes, weight rows, activations, `m`, output.
pub(crate) type Q8kRows = fn(&[u8], usize, std::ops::Range<usize>, &KActs<'_>, usize, &mut [f32]);

/// `gemm_tiles`: weights, row bytes, weight row count, tiles, activations,
/// `m`, output.
type Q8kGemmTiles = fn(&[u8], usize, usize, std::ops::Range<usize>, &KActs<'_>, usize, &mut [f32]);

/// The [`Q8kKernel`] of a repacked Q4_K matrix (`quant_k::q4k_packed`:
/// whole strips of eight rows; the same bits as Q4_K's in place).
pub(crate) fn q4k_packed_kernel() -> Q8kKernel {
    use crate::kernels::quant_k::q4k_packed;
    Q8kKernel {
        rows: q4k_packed::packed_rows,
        gemm: q4k_packed::gemm_tiles,
        gemm_for: q8k::gemm_for::<crate::kernels::quant_block::Q4_K>,
    }
}

/// The [`Q8kKernel`] of `format`, if it takes the super-block activations.
pub(crate) fn q8k_kernel(format: QuantFormat) -> Option<Q8kKernel> {
    use crate::kernels::quant_block as qb;
    fn of<F: q8k::Q8kVector>() -> Q8kKernel {
        Q8kKernel {
            rows: q8k::q8k_rows::<F>,
            gemm: q8k::gemm_tiles::<F>,
            gemm_for: q8k::gemm_for::<F>,
        }
    }
    match format {
        QuantFormat::Q4_K => Some(of::<qb::Q4_K>()),
        QuantFormat::Q5_K => Some(of::<qb::Q5_K>()),
        QuantFormat::Q6_K => Some(of::<qb::Q6_K>()),
        QuantFormat::Q3_K => Some(of::<qb::Q3_K>()),
        QuantFormat::Q2_K => Some(of::<qb::Q2_K>()),
        QuantFormat::IQ4_XS => Some(of::<qb::IQ4_XS>()),
        _ => None,
    }
}

impl ExecContext {
    /// [`quant_matmul`](Self::quant_matmul) for a format with a
    /// [`Q8kKernel`]: the activations quantized to blocks of 256 (rows in
    /// parallel), then the kernel over the weight rows in parallel, split
    /// into runs of `unit` weight rows (1, or a repacked matrix's strip).
    pub(crate) fn quant_matmul_q8k(
        &self,
        op: &'static str,
        x: &[f32],
        m: usize,
        w: &QuantMatrix<'_>,
        out: &mut [f32],
        (kernel, unit): (Q8kKernel, usize),
    ) -> Result<(), ExecError> {
        let (rows, cols) = (w.rows, w.cols);
        let Some((nx, no)) = check_product(op, x, m, rows, cols, out)? else {
            return Ok(());
        };
        let nk = cols / QK_K;
        let lease = |e| ExecError::storage(op, e);
        let pool = self.pool();
        let mut xq = pool.acquire_scratch::<i8>(nx).map_err(lease)?;
        let mut xd = pool.acquire_scratch::<f32>(m * nk).map_err(lease)?;
        let mut xb = pool
            .acquire_scratch::<i16>(m * nk * GROUPS)
            .map_err(lease)?;
        let gemm = (kernel.gemm_for)(m);
        let tiles = rows.div_ceil(q8k::GEMM_TILE);
        let nt = match (m, gemm) {
            (1, false) => 0,
            (_, false) => no,
            (_, true) => tiles * q8k::GEMM_TILE * m,
        };
        let mut tr = match nt {
            0 => None,
            _ => Some(pool.acquire_scratch::<f32>(nt).map_err(lease)?),
        };
        self.par_rows3(
            (&mut xq[..nx], cols),
            (&mut xd[..m * nk], nk),
            (&mut xb[..m * nk * GROUPS], nk * GROUPS),
            4 * cols,
            |ri, xq, xd, xb| {
                for (k, i) in ri.enumerate() {
                    q8k::quantize_row(
                        &x[i * cols..(i + 1) * cols],
                        &mut xq[k * cols..(k + 1) * cols],
                        &mut xd[k * nk..(k + 1) * nk],
                        &mut xb[k * nk * GROUPS..(k + 1) * nk * GROUPS],
                    );
                }
            },
        );
        let acts = KActs {
            q: &xq,
            d: &xd,
            bsums: &xb,
            cols,
        };
        let rb = w.row_bytes();
        // `r` counts runs of `unit` weight rows
        let run = |r: std::ops::Range<usize>, o: &mut [f32]| {
            (kernel.rows)(w.bytes, rb, r.start * unit..r.end * unit, &acts, m, o)
        };
        match tr.as_deref_mut() {
            None => self.par_rows(out, unit, unit * cols, run),
            Some(t) if gemm => {
                let t = &mut t[..nt];
                let tile = q8k::GEMM_TILE * m;
                self.par_rows(t, tile, tile * cols, |r, o| {
                    (kernel.gemm)(w.bytes, rb, rows, r, &acts, m, o)
                });
                q8k::untranspose_tiles(t, m, rows, out);
            }
            Some(t) => {
                self.par_rows(&mut t[..no], unit * m, unit * m * cols, run);
                untranspose(&t[..no], m, out);
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
pub(crate) fn check_product(
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
    /// scales (`xs`) and lane biases (`xb`, for the weight format's
    /// `offset`), rows in parallel (each row's
    /// blocks depend on that row alone).
    pub(crate) fn quantize_acts(
        &self,
        x: &[f32],
        cols: usize,
        offset: i32,
        xq: &mut [i8],
        xs: &mut [f32],
        xb: &mut [i32],
    ) {
        let nb = cols / QK;
        let m = x.len() / cols;
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
