//! `conv1d` and `conv2d` (PyTorch's `NCL` / `NCHW` convolutions with stride, zero
//! padding, dilation and groups) and their backward kernels.
//!
//! # Algorithms
//! - **Forward**: for each sample and group, the output `[Og, OH*OW]` is the GEMM
//!   `W_g [Og, K] · B [K, OH*OW]` (`K = Cg * KH * KW`), where the column matrix
//!   `B` is never materialized: it is packed block by block (at most 512 columns,
//!   about 1 MiB) straight from the image into the GEMM's right-hand-side panels
//!   (an implicit-GEMM packer), in scratch leased from the context's pool. A 1x1
//!   stride-1 unpadded convolution packs the image rows as they are.
//! - **Stride 1** (the common case): the group's planes are first copied into
//!   zero-padded planes (`Hp x Wp`). The forward packs each panel row from them
//!   (one copy per output row the panel touches, the offsets found once per
//!   panel) and the GEMM writes straight into the output. Over "wide" columns
//!   `oh * Wp + ow'` every row of the column matrix is one contiguous run of the
//!   padded planes, so the input gradient adds each row back as one contiguous
//!   run, and the weight gradient reads its left-hand rows in place, against
//!   `dY'ᵀ` panels packed straight from the output gradient (zero in the
//!   columns `ow' >= OW`). The valid outputs are the same multiply-add chains as
//!   the column matrix's.
//! - **Input gradient**: `W_gᵀ · dY` per column block into pooled scratch, added
//!   back into the image positions it came from (col2im); the pointwise case writes
//!   the product straight into the gradient.
//! - **Weight gradient**: its transpose `B · dYᵀ` (`[K, Og]` per group) per sample
//!   and column block, accumulated sample after sample (the batch in increasing
//!   order), with the `K` rows split over the team (one chunk per thread) so each
//!   thread builds only its own rows of the column matrix; then transposed into
//!   `[C_out, K]`. With few rows (`K < 64`, stride 1, one group) the split is
//!   over output channels instead, each thread packing only its channels' `dY'ᵀ`.
//! - **Depthwise** (`groups == in == out`): direct kernels, vectorized over the
//!   output columns.
//!
//! # Determinism
//! Every GEMM output is one fused multiply-add chain over its depth in increasing
//! order (see `kernels::gemm`), and the column blocks are a function of `K` only,
//! so the forward and the input gradient of a sample do not depend on the batch,
//! the team size or the vector level; the weight gradient sums over the batch in
//! sample order, and the bias gradient sums each sample's plane (the fixed-lane
//! sum of the reductions) in sample order. Work is split over samples x groups
//! (forward, input gradient), rows of `K` or output channels (weight gradient)
//! or output channels (bias gradient), so
//! every output element is computed by one thread, the same way for any team.

use crate::context::{ExecContext, PARALLEL_THRESHOLD};
use crate::error::ExecError;
use crate::kernels::conv::{self, ConvGeom};
use crate::kernels::gemm::{self, GemmArgs, LhsRows, NR, Rhs, a_scratch_len};
use crate::kernels::reduce;
use crate::kernels::simd::{self, SimdLevel, vectorized};
use crate::parallel::for_each_run;
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, check_shape};

/// Options of [`ExecContext::conv2d`] (PyTorch's `conv2d` arguments, `[height,
/// width]` each). `Default` is stride 1, no padding, dilation 1, one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dOptions {
    /// Step between output positions, `[h, w]` (at least 1).
    pub stride: [usize; 2],
    /// Zeros added on both sides of the input, `[h, w]`.
    pub padding: [usize; 2],
    /// Spacing between kernel taps, `[h, w]` (at least 1).
    pub dilation: [usize; 2],
    /// Channel groups (at least 1; must divide the input and output channels).
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Options of [`ExecContext::conv1d`] (PyTorch's `conv1d` arguments). `Default`
/// is stride 1, no padding, dilation 1, one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv1dOptions {
    /// Step between output positions (at least 1).
    pub stride: usize,
    /// Zeros added on both sides of the input.
    pub padding: usize,
    /// Spacing between kernel taps (at least 1).
    pub dilation: usize,
    /// Channel groups (at least 1; must divide the input and output channels).
    pub groups: usize,
}

impl Default for Conv1dOptions {
    fn default() -> Self {
        Conv1dOptions {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

/// One convolution call: the op name, whether it is 1-D (`[N, C, L]`, computed
/// as 2-D with `H = KH = 1`) and the options as 2-D.
#[derive(Clone, Copy)]
pub(super) struct Spec {
    op: &'static str,
    one_d: bool,
    o: Conv2dOptions,
}

impl Spec {
    pub(super) fn d1(op: &'static str, o: Conv1dOptions) -> Spec {
        Spec {
            op,
            one_d: true,
            o: Conv2dOptions {
                stride: [1, o.stride],
                padding: [0, o.padding],
                dilation: [1, o.dilation],
                groups: o.groups,
            },
        }
    }
    pub(super) fn d2(op: &'static str, o: Conv2dOptions) -> Spec {
        Spec {
            op,
            one_d: false,
            o,
        }
    }
    /// The output shape of geometry `g`.
    fn out_shape(self, g: &ConvGeom) -> Dims {
        if self.one_d {
            Dims::new(&[g.n, g.c_out, g.ow])
        } else {
            Dims::new(&[g.n, g.c_out, g.oh, g.ow])
        }
    }
}

/// The checks every convolution (and transposed convolution) starts with: an
/// input of rank 3 (`one_d`) or 4 and a weight of the same rank (`weight`
/// says its layout, 1-D then 2-D), with no zero dimension and element counts
/// that fit.
pub(super) fn check_operands(
    op: &'static str,
    one_d: bool,
    x: &[usize],
    w: &[usize],
    weight: [&'static str; 2],
) -> Result<(), ExecError> {
    let rank = if one_d { 3 } else { 4 };
    if x.len() != rank {
        return Err(ExecError::InvalidShape {
            op,
            shape: Dims::new(x),
            reason: if one_d {
                "the input must be 3-D [batch, channels, length]"
            } else {
                "the input must be 4-D [batch, channels, height, width]"
            },
        });
    }
    if w.len() != rank {
        return Err(ExecError::InvalidShape {
            op,
            shape: Dims::new(w),
            reason: weight[usize::from(!one_d)],
        });
    }
    // No zero dimension (a zero kernel would underflow below), counts that fit.
    check_shape(op, x)?;
    check_shape(op, w)?;
    Ok(())
}

/// Validates a convolution of an input of shape `x` with a weight of shape `w`
/// (and a bias of shape `bias`): every bad input is an `Err` naming the op and
/// the value, before anything is allocated.
///
/// The shapes may come straight from a caller (the backward kernels take the
/// input's or the weight's shape as a slice), so every size the kernels derive
/// from them is checked here, once: the element counts of the input, the weight
/// and the output, the padded sizes (at most `isize::MAX`, the kernels' signed
/// offsets), and for stride 1 the zero-padded planes and the wide columns. Past
/// this point a size is at most one of these, so plain arithmetic cannot
/// overflow; the scratch sizes, sums of such products, go through
/// [`scratch_len`].
#[warn(clippy::arithmetic_side_effects)]
fn geometry(
    spec: Spec,
    x: &[usize],
    w: &[usize],
    bias: Option<&[usize]>,
) -> Result<ConvGeom, ExecError> {
    let op = spec.op;
    check_operands(
        op,
        spec.one_d,
        x,
        w,
        [
            "the weight must be 3-D [out_channels, in_channels / groups, kernel]",
            "the weight must be 4-D [out_channels, in_channels / groups, kh, kw]",
        ],
    )?;
    let o = spec.o;
    let bad = |name, value, reason| {
        Err(ExecError::InvalidOption {
            op,
            name,
            value,
            reason,
        })
    };
    if o.groups == 0 {
        return bad("groups", 0, "must be at least 1");
    }
    let names: [[&'static str; 2]; 3] = if spec.one_d {
        [
            ["stride", "stride"],
            ["dilation", "dilation"],
            ["padding", "padding"],
        ]
    } else {
        [
            ["stride[0]", "stride[1]"],
            ["dilation[0]", "dilation[1]"],
            ["padding[0]", "padding[1]"],
        ]
    };
    for (a, (&s, &d)) in o.stride.iter().zip(&o.dilation).enumerate() {
        if s == 0 {
            return bad(names[0][a], 0, "must be at least 1");
        }
        if d == 0 {
            return bad(names[1][a], 0, "must be at least 1");
        }
    }
    let (n, c_in) = (x[0], x[1]);
    let (h, wd) = if spec.one_d { (1, x[2]) } else { (x[2], x[3]) };
    let (c_out, wc) = (w[0], w[1]);
    let (kh, kw) = if spec.one_d { (1, w[2]) } else { (w[2], w[3]) };
    if !c_in.is_multiple_of(o.groups) {
        return bad("groups", o.groups, "must divide the input channels");
    }
    if !c_out.is_multiple_of(o.groups) {
        return bad(
            "groups",
            o.groups,
            "must divide the output channels (the weight's first dimension)",
        );
    }
    if c_in.checked_div(o.groups) != Some(wc) {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: Dims::new(x),
            rhs: Dims::new(w),
            reason: "the weight's second dimension must be in_channels / groups",
        });
    }
    if let Some(b) = bias
        && (b.len() != 1 || b[0] != c_out)
    {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: Dims::new(b),
            rhs: Dims::new(w),
            reason: "the bias must be 1-D [out_channels]",
        });
    }
    let mut out = [0usize; 2];
    for (a, (size, kernel)) in [(h, kh), (wd, kw)].into_iter().enumerate() {
        // At most `isize::MAX`: the kernels walk the padded input with signed
        // offsets (`i * stride + r * dilation - padding`).
        let padded = o.padding[a]
            .checked_mul(2)
            .and_then(|p| p.checked_add(size))
            .filter(|&p| isize::try_from(p).is_ok());
        let Some(padded) = padded else {
            return bad(names[2][a], o.padding[a], "the padded input size overflows");
        };
        // `(padded - span) / stride + 1`, where `span = (kernel - 1) *
        // dilation + 1` is the dilated kernel; `None` when it does not fit.
        let size_out = kernel
            .checked_sub(1)
            .and_then(|k| k.checked_mul(o.dilation[a]))
            .and_then(|k| k.checked_add(1))
            .and_then(|span| padded.checked_sub(span))
            .and_then(|room| room.checked_div(o.stride[a]))
            .and_then(|steps| steps.checked_add(1));
        match size_out {
            Some(v) => out[a] = v,
            None => {
                return Err(ExecError::ShapeMismatch {
                    op,
                    lhs: Dims::new(x),
                    rhs: Dims::new(w),
                    reason: "the (dilated) kernel is larger than the padded input",
                });
            }
        }
    }
    let g = ConvGeom {
        n,
        c_in,
        h,
        w: wd,
        c_out,
        kh,
        kw,
        groups: o.groups,
        stride: o.stride,
        pad: o.padding,
        dil: o.dilation,
        oh: out[0],
        ow: out[1],
    };
    // The output's element count (and so `OH * OW`, `N * C_out * OH * OW`).
    check_shape(op, &spec.out_shape(&g))?;
    if g.uses_padded_planes() {
        // Stride 1 (but for the direct depthwise kernels) runs over a group's
        // zero-padded planes (`Cg x Hp x Wp` plus a padded row of slack: at
        // most `Cg x (Hp + 1) x Wp`) and over wide columns (`Og x OH x Wp`).
        // `Hp + 1` fits (`Hp <= isize::MAX`), so saturating is exact.
        check_shape(op, &[g.cg(), g.hp().saturating_add(1), g.wp()])?;
        check_shape(op, &[g.og(), g.oh, g.wp()])?;
    }
    Ok(g)
}

/// The length of a scratch lease made of the blocks `blocks` (`[rows, cols]`
/// each, in floats): their sizes added, or [`ExecError::Overflow`] naming the
/// block whose size (or the running sum) overflows `usize`.
#[warn(clippy::arithmetic_side_effects)]
fn scratch_len(op: &'static str, blocks: &[[usize; 2]]) -> Result<usize, ExecError> {
    blocks.iter().try_fold(0usize, |sum, b| {
        Dims::new(b)
            .checked_product()
            .and_then(|n| sum.checked_add(n))
            .ok_or(ExecError::Overflow {
                op,
                shape: Dims::new(b),
            })
    })
}

/// `grad` must have the output shape of the convolution.
fn check_grad(spec: Spec, g: &ConvGeom, grad: &RawTensor) -> Result<(), ExecError> {
    let want = spec.out_shape(g);
    if grad.shape() != want.as_slice() {
        return Err(ExecError::ShapeMismatch {
            op: spec.op,
            lhs: grad.dims(),
            rhs: want,
            reason: "grad must have the convolution's output shape",
        });
    }
    Ok(())
}

impl ExecContext {
    /// The 2-D convolution of `x` (`[N, C_in, H, W]`) with `w` (`[C_out, C_in /
    /// groups, KH, KW]`) plus an optional `bias` (`[C_out]`), PyTorch's
    /// `conv2d`: `y[n, o, i, j] = bias[o] + Σ_{c, r, s} w[o, c, r, s] · x[n, g *
    /// C_in/groups + c, i * stride[0] + r * dilation[0] - padding[0], j *
    /// stride[1] + s * dilation[1] - padding[1]]` (zero outside the input; `g` the
    /// group of `o`). The output is `[N, C_out, OH, OW]` with `OH = (H + 2 *
    /// padding[0] - dilation[0] * (KH - 1) - 1) / stride[0] + 1` (likewise `OW`).
    ///
    /// Runs as a packed GEMM per sample and group (see the module docs), so each
    /// sample's result is bitwise the same alone or in any batch, for any team
    /// size and vector level. Each output element is one fused multiply-add chain
    /// over `(c, r, s)` in increasing order, started from the bias (or zero).
    ///
    /// ```
    /// use fucina_exec::{Conv2dOptions, ExecContext};
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_vec(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0])?;
    /// let w = ctx.from_vec(&[1, 1, 2, 2], vec![1.0f32; 4])?;
    /// let opts = Conv2dOptions { padding: [1, 1], ..Default::default() };
    /// let y = ctx.conv2d(&x, &w, None, opts)?;
    /// assert_eq!(y.shape(), &[1, 1, 3, 3]);
    /// assert_eq!(y.to_vec()[4], 10.0);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] for an input or weight that is not 4-D;
    /// [`ExecError::InvalidOption`] for a stride, dilation or group count of 0, or
    /// a group count that does not divide the channels;
    /// [`ExecError::ShapeMismatch`] for a weight whose second dimension is not
    /// `C_in / groups`, a bias that is not `[C_out]`, or a kernel larger than the
    /// padded input; [`ExecError::OutOfMemory`].
    pub fn conv2d(
        &self,
        x: &RawTensor,
        w: &RawTensor,
        bias: Option<&RawTensor>,
        opts: Conv2dOptions,
    ) -> Result<RawTensor, ExecError> {
        conv_forward(self, Spec::d2("conv2d", opts), x, w, bias)
    }

    /// The 1-D convolution of `x` (`[N, C_in, L]`) with `w` (`[C_out, C_in /
    /// groups, K]`) plus an optional `bias` (`[C_out]`), PyTorch's `conv1d`:
    /// the 2-D convolution of [`conv2d`](ExecContext::conv2d) with height 1. The
    /// output is `[N, C_out, OL]`, `OL = (L + 2 * padding - dilation * (K - 1) -
    /// 1) / stride + 1`.
    ///
    /// ```
    /// use fucina_exec::{Conv1dOptions, ExecContext};
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_vec(&[1, 1, 5], vec![1.0, 2.0, 3.0, 4.0, 5.0])?;
    /// let w = ctx.from_vec(&[1, 1, 2], vec![1.0f32, -1.0])?;
    /// let y = ctx.conv1d(&x, &w, None, Conv1dOptions { stride: 2, ..Default::default() })?;
    /// assert_eq!(y.to_vec(), vec![-1.0, -1.0]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`conv2d`](ExecContext::conv2d), for 3-D shapes.
    pub fn conv1d(
        &self,
        x: &RawTensor,
        w: &RawTensor,
        bias: Option<&RawTensor>,
        opts: Conv1dOptions,
    ) -> Result<RawTensor, ExecError> {
        conv_forward(self, Spec::d1("conv1d", opts), x, w, bias)
    }

    /// The gradient of [`conv2d`](ExecContext::conv2d) with respect to its input
    /// (of shape `x_shape`), given the weight `w` and `grad = dL/dy`. Each sample's
    /// gradient is computed alone (batch-invariant), the same for every team size
    /// and vector level.
    ///
    /// # Errors
    /// The errors of [`conv2d`](ExecContext::conv2d) for these shapes;
    /// [`ExecError::ShapeMismatch`] if `grad` does not have the output's shape;
    /// [`ExecError::OutOfMemory`].
    pub fn conv2d_input_grad(
        &self,
        x_shape: &[usize],
        w: &RawTensor,
        grad: &RawTensor,
        opts: Conv2dOptions,
    ) -> Result<RawTensor, ExecError> {
        input_grad(
            self,
            Spec::d2("conv2d_input_grad", opts),
            x_shape,
            w,
            grad,
            None,
        )
    }

    /// The gradient of [`conv2d`](ExecContext::conv2d) with respect to its weight
    /// (of shape `w_shape`), given the input `x` and `grad = dL/dy`, summed over
    /// the batch in increasing sample order.
    ///
    /// # Errors
    /// As [`conv2d_input_grad`](ExecContext::conv2d_input_grad).
    pub fn conv2d_weight_grad(
        &self,
        x: &RawTensor,
        w_shape: &[usize],
        grad: &RawTensor,
        opts: Conv2dOptions,
    ) -> Result<RawTensor, ExecError> {
        weight_grad(self, Spec::d2("conv2d_weight_grad", opts), x, w_shape, grad)
    }

    /// The gradient of a convolution's bias: `grad` (`[N, C_out, ...]`, any
    /// rank of at least 2, e.g. the output gradient of
    /// [`conv2d`](ExecContext::conv2d) or [`conv1d`](ExecContext::conv1d))
    /// summed over every axis but the second, shape `[C_out]`. Each sample's
    /// plane is summed with the fixed-lane sum of the reductions, and the
    /// samples are added in increasing order.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] for a `grad` of rank below 2;
    /// [`ExecError::OutOfMemory`].
    pub fn conv_bias_grad(&self, grad: &RawTensor) -> Result<RawTensor, ExecError> {
        let op = "conv_bias_grad";
        if grad.rank() < 2 {
            return Err(ExecError::InvalidShape {
                op,
                shape: grad.dims(),
                reason: "grad must be [batch, channels, ...]",
            });
        }
        let (n, c) = (grad.shape()[0], grad.shape()[1]);
        let plane = grad.numel() / (n * c);
        let g = self.contiguous(grad)?;
        let gs = g.contiguous_slice();
        self.new_tensor(op, &[c], |out: &mut [f32]| {
            self.par_rows(out, 1, n * plane, |chans, o| {
                for (ch, v) in chans.zip(o.iter_mut()) {
                    let mut acc = 0.0f32;
                    for ni in 0..n {
                        acc += vectorized!(reduce::sum(&gs[(ni * c + ch) * plane..][..plane]));
                    }
                    *v = acc;
                }
            });
        })
    }

    /// The gradient of [`conv1d`](ExecContext::conv1d) with respect to its input;
    /// see [`conv2d_input_grad`](ExecContext::conv2d_input_grad).
    ///
    /// # Errors
    /// As [`conv2d_input_grad`](ExecContext::conv2d_input_grad), for 3-D shapes.
    pub fn conv1d_input_grad(
        &self,
        x_shape: &[usize],
        w: &RawTensor,
        grad: &RawTensor,
        opts: Conv1dOptions,
    ) -> Result<RawTensor, ExecError> {
        input_grad(
            self,
            Spec::d1("conv1d_input_grad", opts),
            x_shape,
            w,
            grad,
            None,
        )
    }

    /// The gradient of [`conv1d`](ExecContext::conv1d) with respect to its weight;
    /// see [`conv2d_weight_grad`](ExecContext::conv2d_weight_grad).
    ///
    /// # Errors
    /// As [`conv2d_input_grad`](ExecContext::conv2d_input_grad), for 3-D shapes.
    pub fn conv1d_weight_grad(
        &self,
        x: &RawTensor,
        w_shape: &[usize],
        grad: &RawTensor,
        opts: Conv1dOptions,
    ) -> Result<RawTensor, ExecError> {
        weight_grad(self, Spec::d1("conv1d_weight_grad", opts), x, w_shape, grad)
    }
}

/// The forward of both convolutions (and the input gradient of the transposed
/// convolutions, `ops::conv_transpose`).
pub(super) fn conv_forward(
    ctx: &ExecContext,
    spec: Spec,
    x: &RawTensor,
    w: &RawTensor,
    bias: Option<&RawTensor>,
) -> Result<RawTensor, ExecError> {
    let op = spec.op;
    let g = geometry(spec, x.shape(), w.shape(), bias.map(|b| b.shape()))?;
    let x = ctx.contiguous(x)?;
    let w = ctx.contiguous(w)?;
    let bias = bias.map(|b| ctx.contiguous(b)).transpose()?;
    let (xs, ws) = (x.contiguous_slice(), w.contiguous_slice());
    let bs = bias.as_ref().map(|b| b.contiguous_slice());
    let level = simd::level();
    let (og, cg, kk, ohw, hw) = (g.og(), g.cg(), g.k(), g.ohw(), g.hw());
    let jb = g.col_block();
    let wide = if g.uses_padded_planes() {
        g.xpad_len()
    } else {
        0
    };
    // Each group's weight rows, packed once per chunk of units for every
    // sample's products (after them in the scratch).
    let wpk = gemm::packed_lhs_len(og, kk);
    let scratch = if g.is_depthwise() {
        0
    } else {
        scratch_len(op, &[[kk, jb], [1, wide], [g.groups, wpk]])?
    };
    let mut done = Ok(());
    let out = ctx.new_tensor(op, &spec.out_shape(&g), |out: &mut [f32]| {
        if g.is_depthwise() {
            // One plane per (sample, channel).
            let taps = g.kh * g.kw;
            ctx.par_rows(out, ohw, ohw.saturating_mul(taps), |planes, o| {
                for (p, y) in planes.zip(o.chunks_exact_mut(ohw)) {
                    let ch = p % g.c_in;
                    let b = bs.map_or(0.0, |b| b[ch]);
                    let img = &xs[p * hw..][..hw];
                    let wk = &ws[ch * taps..][..taps];
                    vectorized!(conv::depthwise_plane(&g, img, wk, b, y));
                }
            });
            return;
        }
        let work = og.saturating_mul(kk).saturating_mul(ohw);
        done = ctx.par_rows_with_scratch(op, out, og * ohw, work, scratch, |units, o, sc| {
            let (sc, wpacked) = sc.split_at_mut(kk * jb + wide);
            for gi in 0..g.groups {
                let lhs = LhsRows {
                    data: ws,
                    row_off: |o| (gi * og + o) * kk,
                    cs: 1,
                };
                gemm::pack_lhs(level, &lhs, og, kk, &mut wpacked[gi * wpk..][..wpk]);
            }
            for (u, y) in units.zip(o.chunks_exact_mut(og * ohw)) {
                let (ni, gi) = (u / g.groups, u % g.groups);
                let xg = &xs[(ni * g.c_in + gi * cg) * hw..][..cg * hw];
                let wg = &wpacked[gi * wpk..][..wpk];
                forward_unit(&g, xg, ws, wg, bs, gi, y, sc, level);
            }
        });
    })?;
    done.map(|()| out)
}

/// The forward of one sample and group: `y` (`[Og, OH*OW]`) from the group's
/// input planes `xg`, with the group's weight rows packed by [`gemm::pack_lhs`]
/// in `wg`.
#[allow(clippy::too_many_arguments)]
fn forward_unit(
    g: &ConvGeom,
    xg: &[f32],
    ws: &[f32],
    wg: &[f32],
    bias: Option<&[f32]>,
    gi: usize,
    y: &mut [f32],
    sc: &mut [f32],
    level: SimdLevel,
) {
    let (og, kk, ohw) = (g.og(), g.k(), g.ohw());
    let lhs = LhsRows {
        data: ws,
        row_off: |o| (gi * og + o) * kk,
        cs: 1,
    };
    let jb = g.col_block();
    let (packed, rest) = sc.split_at_mut(kk * jb);
    let xpad = if g.is_wide() {
        // Stride 1: the image is first copied into zero-padded planes, from
        // which each packed row is one copy per output row it touches.
        let xpad = &mut rest[..g.xpad_len()];
        conv::pad_image(g, xg, xpad);
        Some(&*xpad)
    } else {
        None
    };
    if let Some(b) = bias {
        for (o, row) in y.chunks_exact_mut(ohw).enumerate() {
            row.fill(b[gi * og + o]);
        }
    }
    for j0 in (0..ohw).step_by(jb) {
        let cols = jb.min(ohw - j0);
        let pk = &mut packed[..cols.div_ceil(NR) * kk * NR];
        if let Some(xpad) = xpad {
            conv::pack_valid(g, xpad, j0, cols, pk);
        } else if g.is_pointwise() {
            gemm::pack_b_rows(pk, xg, j0, g.hw(), kk, cols);
        } else {
            conv::pack_cols(g, xg, j0, cols, pk);
        }
        let args = GemmArgs {
            level,
            lhs: &lhs,
            m: og,
            k: kk,
            n: cols,
            rhs: Rhs::Packed(pk),
            accumulate: bias.is_some(),
        };
        gemm::gemm_ldc_packed_lhs(&args, wg, &mut y[j0..], ohw);
    }
}

/// The input gradient of both convolutions, plus `bias[c]` on every element of
/// its channel `c` when there is a bias (`[C_in]`, the transposed
/// convolutions' bias: their forward, in `ops::conv_transpose`, is this
/// gradient).
pub(super) fn input_grad(
    ctx: &ExecContext,
    spec: Spec,
    x_shape: &[usize],
    w: &RawTensor,
    grad: &RawTensor,
    bias: Option<&RawTensor>,
) -> Result<RawTensor, ExecError> {
    let op = spec.op;
    let g = geometry(spec, x_shape, w.shape(), None)?;
    check_grad(spec, &g, grad)?;
    let w = ctx.contiguous(w)?;
    let dy = ctx.contiguous(grad)?;
    let bias = bias.map(|b| ctx.contiguous(b)).transpose()?;
    let bs = bias.as_ref().map(|b| b.contiguous_slice());
    let (ws, dys) = (w.contiguous_slice(), dy.contiguous_slice());
    let level = simd::level();
    let (og, cg, kk, ohw, hw) = (g.og(), g.cg(), g.k(), g.ohw(), g.hw());
    let jb = g.col_block();
    let pointwise = g.is_pointwise();
    let (wide_cols, xpad) = if g.uses_padded_planes() {
        (g.wide_cols(), g.xpad_len())
    } else {
        (0, 0)
    };
    let cols_rows = if pointwise { 0 } else { kk };
    let blocks = [[cols_rows, jb], [og, jb], [og, wide_cols], [1, xpad]];
    let unit_scratch = if g.is_depthwise() {
        0
    } else {
        scratch_len(op, &blocks)?
    };
    // Each group's `W_gᵀ`, packed once per chunk of units for every
    // sample's products (after them in the scratch).
    let wpk = gemm::packed_lhs_len(kk, og);
    let scratch = if g.is_depthwise() {
        0
    } else {
        scratch_len(op, &[[1, unit_scratch], [g.groups, wpk]])?
    };
    let mut done = Ok(());
    let dx = ctx.new_tensor(op, x_shape, |dx: &mut [f32]| {
        if g.is_depthwise() {
            let taps = g.kh * g.kw;
            ctx.par_rows(dx, hw, ohw.saturating_mul(taps), |planes, o| {
                for (p, d) in planes.zip(o.chunks_exact_mut(hw)) {
                    let ch = p % g.c_in;
                    let dyp = &dys[p * ohw..][..ohw];
                    let wk = &ws[ch * taps..][..taps];
                    vectorized!(conv::depthwise_input_grad_plane(&g, dyp, wk, d));
                    if let Some(b) = bs {
                        add_bias(d, b[ch]);
                    }
                }
            });
            return;
        }
        let work = og.saturating_mul(kk).saturating_mul(ohw);
        done = ctx.par_rows_with_scratch(op, dx, cg * hw, work, scratch, |units, o, sc| {
            let (sc, wpacked) = sc.split_at_mut(unit_scratch);
            for gi in 0..g.groups {
                // `W_gᵀ`: row `kk` of the product is column `kk` of the
                // group's weight rows.
                let lhs = LhsRows {
                    data: ws,
                    row_off: |r| gi * og * kk + r,
                    cs: kk,
                };
                gemm::pack_lhs(level, &lhs, kk, og, &mut wpacked[gi * wpk..][..wpk]);
            }
            for (u, d) in units.zip(o.chunks_exact_mut(cg * hw)) {
                let (ni, gi) = (u / g.groups, u % g.groups);
                let dy_off = (ni * g.c_out + gi * og) * ohw;
                let wg = &wpacked[gi * wpk..][..wpk];
                input_grad_unit(&g, dys, dy_off, ws, wg, gi, d, sc, level);
                if let Some(b) = bs {
                    for (c, plane) in d.chunks_exact_mut(hw).enumerate() {
                        add_bias(plane, b[gi * cg + c]);
                    }
                }
            }
        });
    })?;
    done.map(|()| dx)
}

/// `plane[i] += b` for every element (one rounding each, the same at every
/// vector level and team size).
fn add_bias(plane: &mut [f32], b: f32) {
    for v in plane {
        *v += b;
    }
}

/// The input gradient of one sample and group into `dxg` (`[Cg, H*W]`), from the
/// output-gradient rows at `dy_off` (`[Og, OH*OW]`), with the group's `W_gᵀ`
/// packed by [`gemm::pack_lhs`] in `wg`.
#[allow(clippy::too_many_arguments)]
fn input_grad_unit(
    g: &ConvGeom,
    dys: &[f32],
    dy_off: usize,
    ws: &[f32],
    wg: &[f32],
    gi: usize,
    dxg: &mut [f32],
    sc: &mut [f32],
    level: SimdLevel,
) {
    let (og, kk, ohw) = (g.og(), g.k(), g.ohw());
    let jb = g.col_block();
    // `W_gᵀ`: row `kk` of the product is column `kk` of the group's weight rows.
    let lhs = LhsRows {
        data: ws,
        row_off: |r| gi * og * kk + r,
        cs: kk,
    };
    let pointwise = g.is_pointwise();
    let (cols_buf, rest) = sc.split_at_mut(if pointwise { 0 } else { kk * jb });
    let (packed, rest) = rest.split_at_mut(og * jb);
    if g.is_wide() {
        // Stride 1: `W_gᵀ · dY'` over the wide columns (`dY'` zero past each
        // output row), each block added into the zero-padded gradient planes as
        // one contiguous run per row, then the interior copied out.
        let wc = g.wide_cols();
        let (dyw, rest) = rest.split_at_mut(og * wc);
        let dxpad = &mut rest[..g.xpad_len()];
        conv::widen(g, &dys[dy_off..][..og * ohw], dyw);
        dxpad.fill(0.0);
        for j0 in (0..wc).step_by(jb) {
            let cols = jb.min(wc - j0);
            let pk = &mut packed[..cols.div_ceil(NR) * og * NR];
            gemm::pack_b_rows(pk, dyw, j0, wc, og, cols);
            let args = GemmArgs {
                level,
                lhs: &lhs,
                m: kk,
                k: og,
                n: cols,
                rhs: Rhs::Packed(pk),
                accumulate: false,
            };
            let c = &mut cols_buf[..kk * cols];
            gemm::gemm_ldc_packed_lhs(&args, wg, c, cols);
            conv::col2im_wide(g, dxpad, j0, cols, c);
        }
        conv::unpad_image(g, dxpad, dxg);
        return;
    }
    if !pointwise {
        dxg.fill(0.0);
    }
    for j0 in (0..ohw).step_by(jb) {
        let cols = jb.min(ohw - j0);
        let pk = &mut packed[..cols.div_ceil(NR) * og * NR];
        gemm::pack_b_rows(pk, dys, dy_off + j0, ohw, og, cols);
        let args = GemmArgs {
            level,
            lhs: &lhs,
            m: kk,
            k: og,
            n: cols,
            rhs: Rhs::Packed(pk),
            accumulate: false,
        };
        if pointwise {
            // The column matrix is the image: write the product in place.
            gemm::gemm_ldc_packed_lhs(&args, wg, &mut dxg[j0..], ohw);
        } else {
            let c = &mut cols_buf[..kk * cols];
            gemm::gemm_ldc_packed_lhs(&args, wg, c, cols);
            conv::col2im_block(g, dxg, j0, cols, c);
        }
    }
}

/// The weight gradient of both convolutions (and, with the roles of the input
/// and the output gradient exchanged, of the transposed convolutions).
pub(super) fn weight_grad(
    ctx: &ExecContext,
    spec: Spec,
    x: &RawTensor,
    w_shape: &[usize],
    grad: &RawTensor,
) -> Result<RawTensor, ExecError> {
    let op = spec.op;
    let g = geometry(spec, x.shape(), w_shape, None)?;
    check_grad(spec, &g, grad)?;
    let x = ctx.contiguous(x)?;
    let dy = ctx.contiguous(grad)?;
    let (xs, dys) = (x.contiguous_slice(), dy.contiguous_slice());
    let level = simd::level();
    let (og, cg, kk, ohw, hw) = (g.og(), g.cg(), g.k(), g.ohw(), g.hw());
    let mut done = Ok(());
    if g.is_depthwise() {
        let dw = ctx.new_tensor(op, w_shape, |dw: &mut [f32]| {
            let taps = g.kh * g.kw;
            let work = g.n.saturating_mul(ohw).saturating_mul(taps);
            done = ctx.par_rows_with_scratch(op, dw, taps, work, g.ow, |chans, o, acc| {
                for (ch, d) in chans.zip(o.chunks_exact_mut(taps)) {
                    let planes = |ni: usize| {
                        let p = ni * g.c_in + ch;
                        (&xs[p * hw..][..hw], &dys[p * ohw..][..ohw])
                    };
                    vectorized!(conv::depthwise_weight_grad(&g, planes, acc, d));
                }
            });
        })?;
        return done.map(|()| dw);
    }
    if g.is_wide() && g.groups == 1 && kk < 2 * NR {
        // Few `K` rows (a first layer over one or three channels): split over
        // output channels instead, so each thread packs only its own `dY'ᵀ`.
        return weight_grad_by_channel(ctx, op, &g, xs, dys, w_shape, level);
    }
    // `dW_gᵀ` (`[K, Og]` per group) `= B · dYᵀ`, its `K` rows split over the
    // team: each chunk builds only its own rows of the column matrix.
    let jd = g.col_block();
    let wide = g.is_wide();
    // The packed `dY'ᵀ` panels (`Og` rounded up to `NR` rows of `jd`), and the
    // padded planes (stride 1) or a block of the column matrix (`K x jd`).
    let panels = [og.div_ceil(NR), NR * jd];
    let scratch = if wide {
        scratch_len(op, &[panels, [1, g.xpad_len()], [1, a_scratch_len(kk)]])?
    } else {
        scratch_len(op, &[[kk, jd], panels, [1, a_scratch_len(kk)]])?
    };
    let op_ = og.div_ceil(NR) * NR;
    // Each chunk builds the whole batch's padded planes and `dY'` for its rows:
    // with few rows (a strided first layer; stride 1 splits over channels
    // above) the team would mostly repeat that, so those run on the caller
    // (the result is the same); with
    // more, one chunk per thread, so that work is repeated once per thread
    // rather than once per chunk of the default split (four per thread).
    let rows = g.groups * kk;
    let work = if rows < 2 * NR || rows.saturating_mul(og * g.n * ohw) < PARALLEL_THRESHOLD {
        1
    } else {
        one_chunk_per_thread(rows, ctx.threads())
    };
    let dwt = ctx.new_tensor(op, &[g.groups * kk, og], |dwt: &mut [f32]| {
        done = ctx.par_rows_with_scratch(op, dwt, og, work, scratch, |rows, o, sc| {
            if wide {
                weight_grad_wide(&g, xs, dys, rows, o, sc, level);
                return;
            }
            let (cols_buf, rest) = sc.split_at_mut(kk * jd);
            let (packed, a_sc) = rest.split_at_mut(op_ * jd);
            for_each_run(rows, kk, og, o, |gi, run, c| {
                c.fill(0.0);
                let ka = run.start - gi * kk;
                for ni in 0..g.n {
                    let xg = &xs[(ni * g.c_in + gi * cg) * hw..][..cg * hw];
                    let dy_off = (ni * g.c_out + gi * og) * ohw;
                    for j0 in (0..ohw).step_by(jd) {
                        let cols = jd.min(ohw - j0);
                        let t = &mut cols_buf[..run.len() * cols];
                        conv::im2col_rows(&g, xg, ka..ka + run.len(), j0, cols, t);
                        // `dYᵀ` (`cols x Og`) into panels of NR output channels.
                        for p in 0..og.div_ceil(NR) {
                            let d = &mut packed[p * cols * NR..][..cols * NR];
                            let off = dy_off + p * NR * ohw + j0;
                            gemm::pack_b_panel(d, dys, off, 1, ohw, cols, NR.min(og - p * NR));
                        }
                        let lhs = LhsRows {
                            data: &*t,
                            row_off: |i| i * cols,
                            cs: 1,
                        };
                        let args = GemmArgs {
                            level,
                            lhs: &lhs,
                            m: run.len(),
                            k: cols,
                            n: og,
                            rhs: Rhs::Packed(&packed[..og.div_ceil(NR) * cols * NR]),
                            accumulate: true,
                        };
                        gemm::gemm(&args, c, a_sc);
                    }
                }
            });
        });
    })?;
    done?;
    let dt = dwt.contiguous_slice();
    ctx.new_tensor(op, w_shape, |dw: &mut [f32]| {
        for (row, d) in dw.chunks_exact_mut(kk).enumerate() {
            let (gi, o) = (row / og, row % og);
            for (kx, v) in d.iter_mut().enumerate() {
                *v = dt[(gi * kk + kx) * og + o];
            }
        }
    })
}

/// The stride-1 weight gradient of one group with few `K` rows, split over
/// output channels: each chunk of channels computes its `dW_gᵀ` columns (`K x
/// nr`, at most [`NR`] channels at a time) sample after sample, exactly the
/// multiply-add chains of [`weight_grad_wide`] (the same column blocks, the
/// same order), and writes them transposed into its rows of `dW`. Each thread
/// packs only its channels' `dY'ᵀ` (the costly part when `K` is small) and pads
/// the (one- or few-channel) images itself.
fn weight_grad_by_channel(
    ctx: &ExecContext,
    op: &'static str,
    g: &ConvGeom,
    xs: &[f32],
    dys: &[f32],
    w_shape: &[usize],
    level: SimdLevel,
) -> Result<RawTensor, ExecError> {
    let (kk, ohw, hw) = (g.k(), g.ohw(), g.hw());
    let (jd, wc) = (g.col_block(), g.wide_cols());
    let scratch = scratch_len(
        op,
        &[
            [jd, NR],
            [1, g.xpad_len()],
            [kk, NR],
            [1, a_scratch_len(kk)],
        ],
    )?;
    let total = kk.saturating_mul(g.c_out * g.n * ohw);
    let work = if total < PARALLEL_THRESHOLD {
        1
    } else {
        one_chunk_per_thread(g.c_out, ctx.threads())
    };
    let mut done = Ok(());
    let dw = ctx.new_tensor(op, w_shape, |dw: &mut [f32]| {
        done = ctx.par_rows_with_scratch(op, dw, kk, work, scratch, |chans, o, sc| {
            let (packed, rest) = sc.split_at_mut(jd * NR);
            let (xpad, rest) = rest.split_at_mut(g.xpad_len());
            let (cbuf, a_sc) = rest.split_at_mut(kk * NR);
            for p0 in chans.clone().step_by(NR) {
                let nr = NR.min(chans.end - p0);
                let c = &mut cbuf[..kk * nr];
                c.fill(0.0);
                for ni in 0..g.n {
                    conv::pad_image(g, &xs[ni * g.c_in * hw..][..g.c_in * hw], xpad);
                    let dy_off = (ni * g.c_out + p0) * ohw;
                    for j0 in (0..wc).step_by(jd) {
                        let cols = jd.min(wc - j0);
                        let d = &mut packed[..cols * NR];
                        conv::pack_wide_dyt(g, dys, dy_off, j0, cols, nr, d);
                        let lhs = LhsRows {
                            data: &*xpad,
                            row_off: |i| g.tap_off(i) + j0,
                            cs: 1,
                        };
                        let args = GemmArgs {
                            level,
                            lhs: &lhs,
                            m: kk,
                            k: cols,
                            n: nr,
                            rhs: Rhs::Packed(d),
                            accumulate: true,
                        };
                        gemm::gemm(&args, c, a_sc);
                    }
                }
                let rows = &mut o[(p0 - chans.start) * kk..][..nr * kk];
                for (i, row) in rows.chunks_exact_mut(kk).enumerate() {
                    for (kx, v) in row.iter_mut().enumerate() {
                        *v = c[kx * nr + i];
                    }
                }
            }
        });
    })?;
    done.map(|()| dw)
}

/// The work per row to hand `par_rows_with_scratch` so that `rows` rows split
/// into one chunk per thread (the split's grain is `PARALLEL_THRESHOLD / work`
/// and its chunk count `rows / grain`): the smallest work per row that gives
/// `threads` chunks or more (more only where no grain gives exactly `threads`).
fn one_chunk_per_thread(rows: usize, threads: usize) -> usize {
    let chunks = |w: usize| rows / (PARALLEL_THRESHOLD / w).max(1);
    // `chunks` is non-decreasing in `w`: the least `w` reaching `threads`.
    let (mut lo, mut hi) = (1, PARALLEL_THRESHOLD);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if chunks(mid) >= threads.max(1) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// The stride-1 weight gradient of the `dW_gᵀ` rows `rows` into `o` (`rows x
/// Og`): for each sample, the left-hand rows are read in place from the
/// zero-padded planes (row `kk` is one contiguous run from `ConvGeom::tap_off`), against
/// `dY'ᵀ` (the output gradient at the padded width, zero past each row), block
/// by block, accumulated sample after sample.
fn weight_grad_wide(
    g: &ConvGeom,
    xs: &[f32],
    dys: &[f32],
    rows: std::ops::Range<usize>,
    o: &mut [f32],
    sc: &mut [f32],
    level: SimdLevel,
) {
    let (og, cg, kk, ohw, hw) = (g.og(), g.cg(), g.k(), g.ohw(), g.hw());
    let (jd, wc) = (g.col_block(), g.wide_cols());
    let op_ = og.div_ceil(NR) * NR;
    let (packed, rest) = sc.split_at_mut(op_ * jd);
    let (xpad, a_sc) = rest.split_at_mut(g.xpad_len());
    for_each_run(rows, kk, og, o, |gi, run, c| {
        c.fill(0.0);
        let ka = run.start - gi * kk;
        for ni in 0..g.n {
            conv::pad_image(g, &xs[(ni * g.c_in + gi * cg) * hw..][..cg * hw], xpad);
            let dy_off = (ni * g.c_out + gi * og) * ohw;
            for j0 in (0..wc).step_by(jd) {
                let cols = jd.min(wc - j0);
                for p in 0..og.div_ceil(NR) {
                    let d = &mut packed[p * cols * NR..][..cols * NR];
                    let nr = NR.min(og - p * NR);
                    conv::pack_wide_dyt(g, dys, dy_off + p * NR * ohw, j0, cols, nr, d);
                }
                let lhs = LhsRows {
                    data: &*xpad,
                    row_off: |i| g.tap_off(ka + i) + j0,
                    cs: 1,
                };
                let args = GemmArgs {
                    level,
                    lhs: &lhs,
                    m: run.len(),
                    k: cols,
                    n: og,
                    rhs: Rhs::Packed(&packed[..og.div_ceil(NR) * cols * NR]),
                    accumulate: true,
                };
                gemm::gemm(&args, c, a_sc);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weight gradient's split: one chunk per thread, whatever the row count.
    #[test]
    fn one_chunk_per_thread_gives_one_chunk_per_thread() {
        for threads in 2..=4 {
            for rows in (2 * NR..3000).chain([9 * 512, 8192, threads * PARALLEL_THRESHOLD]) {
                let work = one_chunk_per_thread(rows, threads);
                assert!(
                    rows * work >= PARALLEL_THRESHOLD,
                    "rows {rows}: runs in parallel"
                );
                let grain = PARALLEL_THRESHOLD / work;
                let chunks = fucina_thread::chunk_ranges(0, rows, grain, threads);
                assert_eq!(chunks.len(), threads, "rows {rows}, {threads} threads");
            }
        }
    }
}
