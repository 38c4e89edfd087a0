//! `attention`: the fused scaled dot-product attention of multi-head layers
//! (`softmax(scale · q_h k_hᵀ) v_h` for every head `h`), and its backward.
//!
//! **Layout.** `q` is `[N, L, E]`, `k` and `v` are `[N, S, E]`, the heads
//! the `E / heads` consecutive features of each row (the layout of a linear
//! projection's output), and the output `[N, L, E]` in the same layout: the
//! heads are never split into `[N, heads, L, E / heads]` copies nor joined
//! back. The attention weights `[N, heads, L, S]` come back too; the backward
//! reads them instead of recomputing the softmax.
//!
//! **Key padding.** The `_masked` forms take PyTorch's boolean
//! `key_padding_mask` (`[N, S]`, `true` for the keys a sample ignores): the
//! scaled scores of those keys become `-inf` before the softmax, so their
//! weights are zero (a query whose keys are all masked gets NaN, as in
//! PyTorch). The backward is the unmasked one: it reads the weights, whose
//! zeros carry the mask.
//!
//! **Work.** One sample per task, its heads in increasing order. Per head the
//! forward runs `q_h · k_hᵀ` (the GEMM of `kernels/gemm`, `k_hᵀ` packed from
//! its strided rows) into the weights' block, the scaled softmax of each row
//! (`kernels/rowwise.rs`) while the block is in cache, and `P · v_h` (`v_h`
//! read in place where the AVX-512 kernel can, else packed). The backward
//! runs `dP = dO_h · v_hᵀ`, the softmax's backward row by row (times the
//! scale), `dv_h = Pᵀ · dO_h`, `dq_h = dS · k_h` and `dk_h = dSᵀ · q_h`. The
//! scratch comes from the context's pool once per task: no allocation after
//! warm-up. Each product writes its head's columns of the output (or of a
//! gradient) in place, `E` (or `3E`) floats apart: no head block is copied.
//!
//! **Bits.** Every product is the GEMM's fused multiply-add chain in
//! increasing depth order, every softmax row the row kernel's fixed order,
//! and a sample's results depend on that sample alone: the same bits for every
//! team size, vector level and batch composition.

use std::sync::Mutex;

use fucina_storage::{BufferPool, ScratchLease};

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::gemm::{
    self, GemmArgs, LhsRows, NR, Rhs, a_scratch_len, direct_rhs_ok, packed_b_len,
};
use crate::kernels::rowwise;
use crate::kernels::simd::{self, SimdLevel, vectorized};
use crate::tensor::RawTensor;

/// The sizes of one attention call.
#[derive(Clone, Copy, Debug)]
struct Geom {
    /// Samples.
    n: usize,
    /// Query rows per sample.
    l: usize,
    /// Key (and value) rows per sample.
    s: usize,
    /// Features per row.
    e: usize,
    /// Heads.
    h: usize,
    /// Features per head (`e / h`).
    d: usize,
}

/// The key-padding mask of a call: `N` rows of `S` flags (`true`: the key is
/// ignored), or none.
#[derive(Clone, Copy)]
struct KeyPadding<'a>(Option<&'a [bool]>);

impl<'a> KeyPadding<'a> {
    /// The `S` flags of sample `i`.
    fn sample(self, g: &Geom, i: usize) -> Option<&'a [bool]> {
        self.0.map(|m| &m[i * g.s..][..g.s])
    }
}

impl Geom {
    /// Fused multiply-adds of one sample's forward (for the team's split).
    fn work(&self) -> usize {
        2 * self.h * self.l * self.s * self.d
    }

    /// Floats of the packed form of a `k x d` right-hand side (at most
    /// `max(L, S)` rows).
    fn packed_rows(&self) -> usize {
        packed_b_len(self.l.max(self.s), self.d).expect("checked sizes")
    }
}

const OP: &str = "attention";
const BACKWARD: &str = "attention_backward";
const PACKED: &str = "attention_packed";
const PACKED_BACKWARD: &str = "attention_packed_backward";
const MASKED: &str = "attention_masked";
const PACKED_MASKED: &str = "attention_packed_masked";

/// One operand of one sample: row `i`'s `E` features at `data[off + i *
/// rs..]`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    off: usize,
    rs: usize,
}

/// The operands of a call: three `[N, T, E]` tensors, or one `[N, L, 3E]`
/// whose rows hold `q`, `k` and `v` side by side.
#[derive(Clone, Copy)]
enum Src<'a> {
    Three(&'a [f32], &'a [f32], &'a [f32]),
    Packed(&'a [f32]),
}

impl<'a> Src<'a> {
    /// The operands `(q, k, v)` of sample `i`.
    fn sample(self, g: &Geom, i: usize) -> (Rows<'a>, Rows<'a>, Rows<'a>) {
        let e = g.e;
        match self {
            Src::Three(q, k, v) => {
                let (le, se) = (g.l * e, g.s * e);
                let rows = |data: &'a [f32], len: usize| Rows {
                    data: &data[i * len..][..len],
                    off: 0,
                    rs: e,
                };
                (rows(q, le), rows(k, se), rows(v, se))
            }
            Src::Packed(x) => {
                let len = 3 * g.l * e;
                let data = &x[i * len..][..len];
                let part = |p: usize| Rows {
                    data,
                    off: p * e,
                    rs: 3 * e,
                };
                (part(0), part(1), part(2))
            }
        }
    }
}

fn shape_err(op: &'static str, t: &RawTensor, reason: &'static str) -> ExecError {
    ExecError::InvalidShape {
        op,
        shape: t.dims(),
        reason,
    }
}

/// The sizes of `q`, `k`, `v` and `heads`, or the error naming the misfit.
fn check(
    op: &'static str,
    q: &RawTensor,
    k: &RawTensor,
    v: &RawTensor,
    heads: usize,
    scale: f32,
) -> Result<Geom, ExecError> {
    let &[n, l, e] = q.shape() else {
        return Err(shape_err(op, q, "the query must be 3-D [N, L, E]"));
    };
    let &[nk, s, ek] = k.shape() else {
        return Err(shape_err(op, k, "the key must be 3-D [N, S, E]"));
    };
    if nk != n || ek != e {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: q.dims(),
            rhs: k.dims(),
            reason: "the key must have the query's batch and features",
        });
    }
    if v.shape() != k.shape() {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: k.dims(),
            rhs: v.dims(),
            reason: "the value must have the key's shape",
        });
    }
    if l == 0 || s == 0 || e == 0 {
        return Err(shape_err(
            op,
            q,
            "the query and key lengths and the features must be nonzero",
        ));
    }
    if heads == 0 || !e.is_multiple_of(heads) {
        return Err(ExecError::InvalidArgument {
            op,
            reason: "heads must be nonzero and divide the features",
        });
    }
    if !scale.is_finite() {
        return Err(ExecError::InvalidArgument {
            op,
            reason: "the scale must be finite",
        });
    }
    Ok(Geom {
        n,
        l,
        s,
        e,
        h: heads,
        d: e / heads,
    })
}

/// The right-hand side `B[kk, j] = src[off + kk * rs + j]` (`k x n`): read
/// in place where the level's kernel can, else packed into `buf`.
#[allow(clippy::too_many_arguments)] // a strided matrix and its buffer
fn rows_rhs<'a>(
    level: SimdLevel,
    rows: usize,
    src: &'a [f32],
    off: usize,
    rs: usize,
    k: usize,
    n: usize,
    buf: &'a mut [f32],
) -> Rhs<'a> {
    if direct_rhs_ok(level, rows, n, rs) {
        return Rhs::Rows { data: src, off, rs };
    }
    let len = packed_b_len(k, n).expect("checked sizes");
    gemm::pack_b_rows(&mut buf[..len], src, off, rs, k, n);
    Rhs::Packed(&buf[..len])
}

/// Packs the transposed right-hand side `B[kk, j] = src[off + j * rs + kk]`
/// (`k x n`: the rows of a head read as columns) into `buf`.
fn packed_transposed<'a>(
    src: &[f32],
    off: usize,
    rs: usize,
    k: usize,
    n: usize,
    buf: &'a mut [f32],
) -> Rhs<'a> {
    let len = packed_b_len(k, n).expect("checked sizes");
    for (p, panel) in buf[..len].chunks_exact_mut(k * NR).enumerate() {
        let ncols = NR.min(n - p * NR);
        gemm::pack_b_panel(panel, src, off + p * NR * rs, 1, rs, k, ncols);
    }
    Rhs::Packed(&buf[..len])
}

/// `c = A · B` (`m x n`, row `i` at `c[i * ldc..][..n]`) with `A[i, kk] =
/// a[row_off(i) + kk * cs]`.
#[allow(clippy::too_many_arguments)] // the operands of one product
fn product(
    level: SimdLevel,
    a: &[f32],
    row_off: impl Fn(usize) -> usize,
    cs: usize,
    (m, k, n): (usize, usize, usize),
    rhs: Rhs<'_>,
    (c, ldc): (&mut [f32], usize),
    a_scratch: &mut [f32],
) {
    let lhs = LhsRows {
        data: a,
        row_off,
        cs,
    };
    let args = GemmArgs {
        level,
        lhs: &lhs,
        m,
        k,
        n,
        rhs,
        accumulate: false,
    };
    gemm::gemm_ldc(&args, &mut c[..(m - 1) * ldc + n], ldc, a_scratch);
}

/// Where the backward of one sample writes its gradients: part 0 (`dq`), 1
/// (`dk`) or 2 (`dv`), each head's columns written in place by its product.
trait GradRows {
    /// The slice whose row `i`, `ldc` floats apart, starts at column `col`
    /// of row `i` of `part`, and `ldc`.
    fn at(&mut self, part: usize, col: usize) -> (&mut [f32], usize);
}

/// Three `[T, E]` gradients (`dq`, `dk`, `dv`).
struct ThreeGrads<'a>([&'a mut [f32]; 3], usize);

impl GradRows for ThreeGrads<'_> {
    fn at(&mut self, part: usize, col: usize) -> (&mut [f32], usize) {
        (&mut self.0[part][col..], self.1)
    }
}

/// One `[L, 3E]` gradient, the three parts side by side in each row.
struct PackedGrads<'a>(&'a mut [f32], usize);

impl GradRows for PackedGrads<'_> {
    fn at(&mut self, part: usize, col: usize) -> (&mut [f32], usize) {
        let e = self.1;
        (&mut self.0[part * e + col..], 3 * e)
    }
}

/// Splits `rest` into pieces of the given lengths.
fn pieces<const N: usize>(mut rest: &mut [f32], lens: [usize; N]) -> [&mut [f32]; N] {
    lens.map(|len| {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
        rest = tail;
        head
    })
}

/// The forward of one sample: `out` (`[L, E]`) and its weights `p`
/// (`[heads, L, S]`) from its `q` (`L` rows), `k` and `v` (`S` rows).
#[allow(clippy::too_many_arguments)] // one sample's operands and scratch
fn forward_sample(
    g: &Geom,
    level: SimdLevel,
    scale: f32,
    (q, k, v): (Rows<'_>, Rows<'_>, Rows<'_>),
    pad: Option<&[bool]>,
    out: &mut [f32],
    p: &mut [f32],
    scratch: &mut [f32],
) {
    let (l, s, e, d) = (g.l, g.s, g.e, g.d);
    let [a_scr, kt, vb, st] = pieces(
        scratch,
        [
            a_scratch_len(l.max(s)),
            packed_b_len(d, s).expect("checked sizes"),
            g.packed_rows(),
            l * s,
        ],
    );
    for (h, pb) in p.chunks_exact_mut(l * s).enumerate() {
        let col = h * d;
        let rhs = packed_transposed(k.data, k.off + col, k.rs, d, s, kt);
        let q_row = |i| q.off + i * q.rs + col;
        product(level, q.data, q_row, 1, (l, d, s), rhs, (st, s), a_scr);
        vectorized!(scaled_softmax_rows(st, pb, s, scale, pad));
        let rhs = rows_rhs(level, l, v.data, v.off + col, v.rs, s, d, vb);
        product(
            level,
            pb,
            |i| i * s,
            1,
            (l, s, d),
            rhs,
            (&mut out[col..], e),
            a_scr,
        );
    }
}

/// `p = softmax(scale · x)` row by row (rows of `s`); `x` is scaled in place,
/// and its columns flagged in `pad` set to `-inf` (weight zero).
#[inline(always)]
fn scaled_softmax_rows(x: &mut [f32], p: &mut [f32], s: usize, scale: f32, pad: Option<&[bool]>) {
    for (xr, pr) in x.chunks_exact_mut(s).zip(p.chunks_exact_mut(s)) {
        for v in xr.iter_mut() {
            *v *= scale;
        }
        if let Some(pad) = pad {
            for (v, &m) in xr.iter_mut().zip(pad) {
                if m {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        rowwise::softmax(xr, pr);
    }
}

/// `ds = scale · softmax_backward(p, dp)` row by row (rows of `s`).
#[inline(always)]
fn scaled_softmax_backward_rows(p: &[f32], dp: &[f32], ds: &mut [f32], s: usize, scale: f32) {
    for ((pr, gr), dr) in p
        .chunks_exact(s)
        .zip(dp.chunks_exact(s))
        .zip(ds.chunks_exact_mut(s))
    {
        rowwise::softmax_backward(pr, gr, dr);
        for v in dr.iter_mut() {
            *v *= scale;
        }
    }
}

/// The backward of one sample from its operands, weights `p` and output
/// gradient `gy` (`[L, E]`): each product writes the head columns `col..col
/// + d` of `dq` (part 0), `dk` (1) or `dv` (2) where `out` puts them.
#[allow(clippy::too_many_arguments)] // one sample's operands and scratch
fn backward_sample(
    g: &Geom,
    level: SimdLevel,
    scale: f32,
    (q, k, v): (Rows<'_>, Rows<'_>, Rows<'_>),
    (p, gy): (&[f32], &[f32]),
    out: &mut impl GradRows,
    scratch: &mut [f32],
) {
    let (l, s, e, d) = (g.l, g.s, g.e, g.d);
    let [a_scr, vt, dp, ds, rb] = pieces(
        scratch,
        [
            a_scratch_len(l.max(s)),
            packed_b_len(d, s).expect("checked sizes"),
            l * s,
            l * s,
            g.packed_rows(),
        ],
    );
    for (h, pb) in p.chunks_exact(l * s).enumerate() {
        let col = h * d;
        // dP = dO_h · v_hᵀ, then dS = scale · P ⊙ (dP - rowsum(dP ⊙ P)).
        let rhs = packed_transposed(v.data, v.off + col, v.rs, d, s, vt);
        product(
            level,
            gy,
            |i| i * e + col,
            1,
            (l, d, s),
            rhs,
            (dp, s),
            a_scr,
        );
        vectorized!(scaled_softmax_backward_rows(pb, dp, ds, s, scale));
        // dv_h = Pᵀ · dO_h.
        let rhs = rows_rhs(level, s, gy, col, e, l, d, rb);
        product(level, pb, |j| j, s, (s, l, d), rhs, out.at(2, col), a_scr);
        // dq_h = dS · k_h.
        let rhs = rows_rhs(level, l, k.data, k.off + col, k.rs, s, d, rb);
        product(
            level,
            ds,
            |i| i * s,
            1,
            (l, s, d),
            rhs,
            out.at(0, col),
            a_scr,
        );
        // dk_h = dSᵀ · q_h.
        let rhs = rows_rhs(level, s, q.data, q.off + col, q.rs, l, d, rb);
        product(level, ds, |j| j, s, (s, l, d), rhs, out.at(1, col), a_scr);
    }
}

/// `len` floats of pool scratch for one task of `op`.
fn task_scratch(
    pool: &BufferPool,
    op: &'static str,
    len: usize,
) -> Result<ScratchLease<f32>, ExecError> {
    pool.acquire_scratch::<f32>(len)
        .map_err(|e| ExecError::storage(op, e))
}

/// Records the first failure of a task.
fn keep_err(slot: &Mutex<Option<ExecError>>, e: ExecError) {
    slot.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert(e);
}

/// The scratch floats of one forward task.
fn forward_scratch(g: &Geom) -> usize {
    a_scratch_len(g.l.max(g.s))
        + packed_b_len(g.d, g.s).expect("checked sizes")
        + g.packed_rows()
        + g.l * g.s
}

/// The scratch floats of one backward task.
fn backward_scratch(g: &Geom) -> usize {
    a_scratch_len(g.l.max(g.s))
        + packed_b_len(g.d, g.s).expect("checked sizes")
        + 2 * g.l * g.s
        + g.packed_rows()
}

/// The sizes of a packed `[N, L, 3E]` operand, or the error naming the
/// misfit.
fn check_packed(
    op: &'static str,
    qkv: &RawTensor,
    heads: usize,
    scale: f32,
) -> Result<Geom, ExecError> {
    let &[_, _, e3] = qkv.shape() else {
        return Err(shape_err(
            op,
            qkv,
            "the packed operand must be 3-D [N, L, 3E]",
        ));
    };
    if !e3.is_multiple_of(3) {
        return Err(shape_err(
            op,
            qkv,
            "the packed operand's last dimension must be 3E (q, k and v)",
        ));
    }
    let q = qkv.narrow(2, 0, e3 / 3)?;
    check(op, &q, &q, &q, heads, scale)
}

/// Checks a key-padding mask against the call's sizes: `[N, S]`.
fn check_padding(op: &'static str, g: &Geom, pad: &RawTensor<bool>) -> Result<(), ExecError> {
    if pad.shape() != [g.n, g.s] {
        return Err(ExecError::InvalidShape {
            op,
            shape: pad.dims(),
            reason: "the key padding mask must be [N, S]: the batch and the key length",
        });
    }
    Ok(())
}

/// Checks the weights and the output gradient of a backward.
fn check_backward(
    op: &'static str,
    g: &Geom,
    probs: &RawTensor,
    grad: &RawTensor,
) -> Result<(), ExecError> {
    if probs.shape() != [g.n, g.h, g.l, g.s] {
        return Err(shape_err(op, probs, "the weights must be [N, heads, L, S]"));
    }
    if grad.shape() != [g.n, g.l, g.e] {
        return Err(shape_err(
            op,
            grad,
            "the output's gradient must be [N, L, E], the forward's output",
        ));
    }
    Ok(())
}

impl ExecContext {
    /// Fused multi-head scaled dot-product attention without masks: for
    /// `q` `[N, L, E]` and `k`, `v` `[N, S, E]` whose rows hold `heads`
    /// heads of `E / heads` consecutive features, head `h` of each output
    /// row is `softmax(scale · q_h k_hᵀ) v_h`. Returns the output (`[N, L,
    /// E]`, the same layout) and the attention weights (`[N, heads, L, S]`),
    /// which [`attention_backward`](Self::attention_backward) reads. The
    /// same bits for every team size, vector level and batch composition.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let q = ctx.from_slice(&[1, 2, 2], &[1.0, 0.0, 0.0, 1.0])?;
    /// let v = ctx.from_slice(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0])?;
    /// // Two heads of one feature; a zero scale weighs the keys equally.
    /// let (y, w) = ctx.attention(&q, &q, &v, 2, 0.0)?;
    /// assert_eq!(y.to_vec(), [2.0, 3.0, 2.0, 3.0]);
    /// assert_eq!(w.shape(), [1, 2, 2, 2]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] for an operand that is not 3-D,
    /// [`ExecError::ShapeMismatch`] for a key whose batch or features differ
    /// from the query's or a value whose shape differs from the key's,
    /// [`ExecError::InvalidArgument`] for `heads` zero or not dividing `E`
    /// or a scale that is not finite; out of memory.
    pub fn attention(
        &self,
        q: &RawTensor,
        k: &RawTensor,
        v: &RawTensor,
        heads: usize,
        scale: f32,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let g = check(OP, q, k, v, heads, scale)?;
        let (qc, kc, vc) = (
            self.contiguous(q)?,
            self.contiguous(k)?,
            self.contiguous(v)?,
        );
        let src = Src::Three(
            qc.contiguous_slice(),
            kc.contiguous_slice(),
            vc.contiguous_slice(),
        );
        self.attention_run(OP, &g, src, KeyPadding(None), scale)
    }

    /// [`attention`](Self::attention) with PyTorch's boolean key-padding
    /// mask `key_padding` (`[N, S]`, `true` for the keys a sample ignores):
    /// their scaled scores become `-inf` before the softmax, so their
    /// weights are zero; a query whose keys are all masked gets NaN, as in
    /// PyTorch. With no flag set, the bits of `attention`.
    /// [`attention_backward`](Self::attention_backward) takes its weights
    /// unchanged (their zeros carry the mask).
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let q = ctx.from_slice(&[1, 1, 2], &[1.0, 1.0])?;
    /// let kv = ctx.from_slice(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0])?;
    /// let pad = ctx.from_slice_typed::<bool>(&[1, 2], &[false, true])?;
    /// // One head; the second key is padding, so the output is the first value.
    /// let (y, w) = ctx.attention_masked(&q, &kv, &kv, &pad, 1, 1.0)?;
    /// assert_eq!(w.to_vec()[1], 0.0);
    /// let y = y.to_vec();
    /// assert!((y[0] - 1.0).abs() < 1e-6 && (y[1] - 2.0).abs() < 1e-6);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`attention`](Self::attention), and [`ExecError::InvalidShape`]
    /// for a mask that is not `[N, S]`; out of memory.
    pub fn attention_masked(
        &self,
        q: &RawTensor,
        k: &RawTensor,
        v: &RawTensor,
        key_padding: &RawTensor<bool>,
        heads: usize,
        scale: f32,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let g = check(MASKED, q, k, v, heads, scale)?;
        check_padding(MASKED, &g, key_padding)?;
        let (qc, kc, vc, mc) = (
            self.contiguous(q)?,
            self.contiguous(k)?,
            self.contiguous(v)?,
            self.contiguous(key_padding)?,
        );
        let src = Src::Three(
            qc.contiguous_slice(),
            kc.contiguous_slice(),
            vc.contiguous_slice(),
        );
        let pad = KeyPadding(Some(mc.contiguous_slice()));
        self.attention_run(MASKED, &g, src, pad, scale)
    }

    /// [`attention`](Self::attention) of a sequence to itself from one
    /// packed operand `qkv` (`[N, L, 3E]`: each row its query, key and value
    /// side by side, the output of one projection by the stacked `[3E, E]`
    /// weight, as in `nn::MultiheadAttention`'s `in_proj_weight`). The
    /// bits of `attention` on the three parts;
    /// [`attention_packed_backward`](Self::attention_packed_backward) returns
    /// one packed gradient.
    ///
    /// # Errors
    /// As [`attention`](Self::attention), and [`ExecError::InvalidShape`]
    /// for a last dimension that is not a multiple of 3; out of memory.
    pub fn attention_packed(
        &self,
        qkv: &RawTensor,
        heads: usize,
        scale: f32,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let g = check_packed(PACKED, qkv, heads, scale)?;
        let xc = self.contiguous(qkv)?;
        let src = Src::Packed(xc.contiguous_slice());
        self.attention_run(PACKED, &g, src, KeyPadding(None), scale)
    }

    /// [`attention_packed`](Self::attention_packed) with PyTorch's boolean
    /// key-padding mask `key_padding` (`[N, L]`: the keys are the query
    /// rows), as in [`attention_masked`](Self::attention_masked);
    /// [`attention_packed_backward`](Self::attention_packed_backward) takes
    /// its weights unchanged.
    ///
    /// # Errors
    /// As [`attention_packed`](Self::attention_packed), and
    /// [`ExecError::InvalidShape`] for a mask that is not `[N, L]`; out of
    /// memory.
    pub fn attention_packed_masked(
        &self,
        qkv: &RawTensor,
        key_padding: &RawTensor<bool>,
        heads: usize,
        scale: f32,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let g = check_packed(PACKED_MASKED, qkv, heads, scale)?;
        check_padding(PACKED_MASKED, &g, key_padding)?;
        let (xc, mc) = (self.contiguous(qkv)?, self.contiguous(key_padding)?);
        let src = Src::Packed(xc.contiguous_slice());
        let pad = KeyPadding(Some(mc.contiguous_slice()));
        self.attention_run(PACKED_MASKED, &g, src, pad, scale)
    }

    /// The forward over every sample, one sample per task.
    fn attention_run(
        &self,
        op: &'static str,
        g: &Geom,
        src: Src<'_>,
        pad: KeyPadding<'_>,
        scale: f32,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let level = simd::level();
        let scratch = forward_scratch(g);
        let (le, hls) = (g.l * g.e, g.h * g.l * g.s);
        let failed = Mutex::new(None);
        let pool = self.pool().pool();
        let mut probs = None;
        let out = self.new_tensor(op, &[g.n, g.l, g.e], |out| {
            probs = Some(self.new_tensor(op, &[g.n, g.h, g.l, g.s], |p| {
                self.par_rows2((out, le), (p, hls), g.work(), |rows, out, p| {
                    let mut buf = match task_scratch(pool, op, scratch) {
                        Ok(b) => b,
                        Err(e) => return keep_err(&failed, e),
                    };
                    for ((i, o), pp) in rows
                        .zip(out.chunks_exact_mut(le))
                        .zip(p.chunks_exact_mut(hls))
                    {
                        let ops = src.sample(g, i);
                        forward_sample(g, level, scale, ops, pad.sample(g, i), o, pp, &mut buf);
                    }
                });
            }));
        })?;
        let probs = probs.expect("the fill ran")?;
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok((out, probs)),
        }
    }

    /// The gradients `(dq, dk, dv)` of [`attention`](Self::attention) at
    /// `q`, `k`, `v` with `heads` and `scale`, from its weights `probs`
    /// (`[N, heads, L, S]`) and the output's gradient `grad` (`[N, L, E]`).
    /// The same bits for every team size, vector level and batch
    /// composition.
    ///
    /// # Errors
    /// As [`attention`](Self::attention), and [`ExecError::InvalidShape`]
    /// for `probs` or `grad` of another shape than the forward's weights and
    /// output; out of memory.
    #[allow(clippy::too_many_arguments)] // the forward's operands and options
    pub fn attention_backward(
        &self,
        q: &RawTensor,
        k: &RawTensor,
        v: &RawTensor,
        probs: &RawTensor,
        grad: &RawTensor,
        heads: usize,
        scale: f32,
    ) -> Result<(RawTensor, RawTensor, RawTensor), ExecError> {
        let g = check(BACKWARD, q, k, v, heads, scale)?;
        check_backward(BACKWARD, &g, probs, grad)?;
        let [qc, kc, vc, pc, gc] = [q, k, v, probs, grad].map(|t| self.contiguous(t));
        let (qc, kc, vc, pc, gc) = (qc?, kc?, vc?, pc?, gc?);
        let src = Src::Three(
            qc.contiguous_slice(),
            kc.contiguous_slice(),
            vc.contiguous_slice(),
        );
        let (ps, gs) = (pc.contiguous_slice(), gc.contiguous_slice());
        let (e, le, se, hls) = (g.e, g.l * g.e, g.s * g.e, g.h * g.l * g.s);
        let level = simd::level();
        let scratch = backward_scratch(&g);
        let failed = Mutex::new(None);
        let pool = self.pool().pool();
        let (mut dk, mut dv) = (None, None);
        let dq = self.new_tensor(BACKWARD, &[g.n, g.l, g.e], |dq| {
            dk = Some(self.new_tensor(BACKWARD, &[g.n, g.s, g.e], |dk| {
                dv = Some(self.new_tensor(BACKWARD, &[g.n, g.s, g.e], |dv| {
                    let work = 2 * g.work();
                    self.par_rows3((dq, le), (dk, se), (dv, se), work, |rows, dq, dk, dv| {
                        let mut buf = match task_scratch(pool, BACKWARD, scratch) {
                            Ok(b) => b,
                            Err(err) => return keep_err(&failed, err),
                        };
                        let outs = dq
                            .chunks_exact_mut(le)
                            .zip(dk.chunks_exact_mut(se))
                            .zip(dv.chunks_exact_mut(se));
                        for (i, ((dqi, dki), dvi)) in rows.zip(outs) {
                            let mut put = ThreeGrads([dqi, dki, dvi], e);
                            let pg = (&ps[i * hls..][..hls], &gs[i * le..][..le]);
                            backward_sample(
                                &g,
                                level,
                                scale,
                                src.sample(&g, i),
                                pg,
                                &mut put,
                                &mut buf,
                            );
                        }
                    });
                }));
            }));
        })?;
        let (dk, dv) = (dk.expect("the fill ran")?, dv.expect("the fill ran")?);
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(err) => Err(err),
            None => Ok((dq, dk, dv)),
        }
    }

    /// The gradient of [`attention_packed`](Self::attention_packed) at
    /// `qkv` (`[N, L, 3E]`, the three parts' gradients side by side in each
    /// row), from its weights `probs` and the output's gradient `grad`.
    /// The bits of [`attention_backward`](Self::attention_backward) on the
    /// three parts.
    ///
    /// # Errors
    /// As [`attention_packed`](Self::attention_packed), and
    /// [`ExecError::InvalidShape`] for `probs` or `grad` of another shape
    /// than the forward's weights and output; out of memory.
    pub fn attention_packed_backward(
        &self,
        qkv: &RawTensor,
        probs: &RawTensor,
        grad: &RawTensor,
        heads: usize,
        scale: f32,
    ) -> Result<RawTensor, ExecError> {
        let g = check_packed(PACKED_BACKWARD, qkv, heads, scale)?;
        check_backward(PACKED_BACKWARD, &g, probs, grad)?;
        let [xc, pc, gc] = [qkv, probs, grad].map(|t| self.contiguous(t));
        let (xc, pc, gc) = (xc?, pc?, gc?);
        let src = Src::Packed(xc.contiguous_slice());
        let (ps, gs) = (pc.contiguous_slice(), gc.contiguous_slice());
        let (e, le, hls) = (g.e, g.l * g.e, g.h * g.l * g.s);
        let level = simd::level();
        let scratch = backward_scratch(&g);
        let failed = Mutex::new(None);
        let pool = self.pool().pool();
        let dx = self.new_tensor(PACKED_BACKWARD, &[g.n, g.l, 3 * g.e], |dx| {
            self.par_rows(dx, 3 * le, 2 * g.work(), |rows, dx| {
                let mut buf = match task_scratch(pool, PACKED_BACKWARD, scratch) {
                    Ok(b) => b,
                    Err(err) => return keep_err(&failed, err),
                };
                for (i, dxi) in rows.zip(dx.chunks_exact_mut(3 * le)) {
                    let mut put = PackedGrads(dxi, e);
                    let pg = (&ps[i * hls..][..hls], &gs[i * le..][..le]);
                    backward_sample(&g, level, scale, src.sample(&g, i), pg, &mut put, &mut buf);
                }
            });
        })?;
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(err) => Err(err),
            None => Ok(dx),
        }
    }
}
