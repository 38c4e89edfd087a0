//! `conv_transpose1d` and `conv_transpose2d` (PyTorch's transposed
//! convolutions, with stride, zero padding, output padding, dilation and
//! groups) and their backward kernels: a member of the convolution family of
//! `ops::conv`, whose kernels it runs.
//!
//! # Algorithms
//! A transposed convolution is the gradient of a convolution with respect to
//! its input: with the same weight (`[C_in, C_out / groups, KH, KW]`, which is
//! the weight layout of a convolution from `C_out` to `C_in` channels) and the
//! same stride, padding, dilation and groups,
//! - the **forward** is that convolution's input gradient, given `x` as the
//!   output gradient, for an "input" of the transposed convolution's output
//!   size (plus the bias, added per channel as each sample and group is done);
//! - the **input gradient** is that convolution's forward applied to `dY`;
//! - the **weight gradient** is that convolution's weight gradient, with `dY`
//!   as its input and `x` as its output gradient;
//! - the **bias gradient** is [`ExecContext::conv_bias_grad`].
//!
//! So no kernel is new: the packed GEMMs, the implicit im2col and col2im, the
//! depthwise kernels and their split over the team are those of `conv2d`.
//!
//! A 2-D forward of **stride 1 and one group** (with a padding of at most
//! `dilation · (K - 1)`, e.g. the U-Net's 3x3, padding 1) runs instead as
//! the convolution's forward with the flipped weight (`w'[o, c, r, s] =
//! w[c, o, KH - 1 - r, KW - 1 - s]`) and padding `dilation · (K - 1) -
//! padding`: one GEMM of depth `C_in · KH · KW` per block, written once,
//! instead of a GEMM of depth `C_in` into a `KH · KW` times larger column
//! matrix added back by col2im.
//!
//! # Determinism
//! That of the convolutions: every output element is one fused multiply-add
//! chain in a fixed order (the bias added after it), each sample is computed
//! alone (batch-invariant), and the weight and bias gradients sum the batch in
//! sample order, for every team size and vector level.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::ops::conv::{self, Spec};
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, check_shape};
use crate::{Conv1dOptions, Conv2dOptions};

/// Options of [`ExecContext::conv_transpose2d`] (PyTorch's
/// `conv_transpose2d` arguments, `[height, width]` each). `Default` is
/// stride 1, no padding, no output padding, dilation 1, one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvTranspose2dOptions {
    /// Step between the input positions' places in the output, `[h, w]` (at
    /// least 1).
    pub stride: [usize; 2],
    /// Rows and columns removed from both sides of the full output,
    /// `[h, w]` (the padding of the convolution this one transposes).
    pub padding: [usize; 2],
    /// Rows and columns added at the bottom and the right of the output,
    /// `[h, w]` (each smaller than its stride).
    pub output_padding: [usize; 2],
    /// Spacing between kernel taps, `[h, w]` (at least 1).
    pub dilation: [usize; 2],
    /// Channel groups (at least 1; must divide the input and output channels).
    pub groups: usize,
}

impl Default for ConvTranspose2dOptions {
    fn default() -> Self {
        ConvTranspose2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            output_padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl ConvTranspose2dOptions {
    /// The options of the convolution this one transposes (the same stride,
    /// padding, dilation and groups).
    pub fn conv(self) -> Conv2dOptions {
        Conv2dOptions {
            stride: self.stride,
            padding: self.padding,
            dilation: self.dilation,
            groups: self.groups,
        }
    }

    /// The output shape of [`ExecContext::conv_transpose2d`] for an input of
    /// shape `x` and a weight of shape `w`: `[N, C_out, OH, OW]` with `C_out
    /// = w[1] * groups` and `OH = (H - 1) * stride[0] - 2 * padding[0] +
    /// dilation[0] * (KH - 1) + output_padding[0] + 1` (likewise `OW`).
    ///
    /// # Errors
    /// The forward's shape and option errors (see
    /// [`ExecContext::conv_transpose2d`]).
    pub fn out_shape(self, x: &[usize], w: &[usize]) -> Result<Dims, ExecError> {
        out_geometry(TSpec::d2("conv_transpose2d", self), x, w, None)
    }
}

/// Options of [`ExecContext::conv_transpose1d`] (PyTorch's
/// `conv_transpose1d` arguments). `Default` is stride 1, no padding, no
/// output padding, dilation 1, one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvTranspose1dOptions {
    /// Step between the input positions' places in the output (at least 1).
    pub stride: usize,
    /// Positions removed from both ends of the full output.
    pub padding: usize,
    /// Positions added at the end of the output (smaller than the stride).
    pub output_padding: usize,
    /// Spacing between kernel taps (at least 1).
    pub dilation: usize,
    /// Channel groups (at least 1; must divide the input and output channels).
    pub groups: usize,
}

impl Default for ConvTranspose1dOptions {
    fn default() -> Self {
        ConvTranspose1dOptions {
            stride: 1,
            padding: 0,
            output_padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

impl ConvTranspose1dOptions {
    /// The options of the convolution this one transposes.
    pub fn conv(self) -> Conv1dOptions {
        Conv1dOptions {
            stride: self.stride,
            padding: self.padding,
            dilation: self.dilation,
            groups: self.groups,
        }
    }

    /// The output shape of [`ExecContext::conv_transpose1d`] for an input of
    /// shape `x` and a weight of shape `w`: `[N, C_out, OL]`, `OL = (L - 1) *
    /// stride - 2 * padding + dilation * (K - 1) + output_padding + 1`.
    ///
    /// # Errors
    /// The forward's shape and option errors.
    pub fn out_shape(self, x: &[usize], w: &[usize]) -> Result<Dims, ExecError> {
        out_geometry(TSpec::d1("conv_transpose1d", self), x, w, None)
    }
}

/// One transposed-convolution call: the op name, whether it is 1-D, and the
/// options as 2-D (height 1 for 1-D).
#[derive(Clone, Copy)]
struct TSpec {
    op: &'static str,
    one_d: bool,
    o: ConvTranspose2dOptions,
}

impl TSpec {
    fn d1(op: &'static str, o: ConvTranspose1dOptions) -> TSpec {
        TSpec {
            op,
            one_d: true,
            o: ConvTranspose2dOptions {
                stride: [1, o.stride],
                padding: [0, o.padding],
                output_padding: [0, o.output_padding],
                dilation: [1, o.dilation],
                groups: o.groups,
            },
        }
    }
    fn d2(op: &'static str, o: ConvTranspose2dOptions) -> TSpec {
        TSpec {
            op,
            one_d: false,
            o,
        }
    }
    /// The convolution this one transposes, under this op's name.
    fn conv(self) -> Spec {
        if self.one_d {
            Spec::d1(
                self.op,
                Conv1dOptions {
                    stride: self.o.stride[1],
                    padding: self.o.padding[1],
                    dilation: self.o.dilation[1],
                    groups: self.o.groups,
                },
            )
        } else {
            Spec::d2(self.op, self.o.conv())
        }
    }
}

/// Validates a transposed convolution of an input of shape `x` with a weight
/// of shape `w` (and a bias of shape `bias`) and returns its output shape:
/// every bad input is an `Err` naming the op and the value, before anything
/// is allocated. The sizes are computed with checked arithmetic; the
/// convolution kernels then check their own sizes (the padded planes) again.
#[warn(clippy::arithmetic_side_effects)]
fn out_geometry(
    spec: TSpec,
    x: &[usize],
    w: &[usize],
    bias: Option<&[usize]>,
) -> Result<Dims, ExecError> {
    let op = spec.op;
    conv::check_operands(
        op,
        spec.one_d,
        x,
        w,
        [
            "the weight must be 3-D [in_channels, out_channels / groups, kernel]",
            "the weight must be 4-D [in_channels, out_channels / groups, kh, kw]",
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
    // (option axis, shape axis): the last axis for 1-D.
    let axes: &[(usize, usize)] = if spec.one_d {
        &[(1, 2)]
    } else {
        &[(0, 2), (1, 3)]
    };
    let name = |n1: &'static str, n2: [&'static str; 2], a: usize| {
        if spec.one_d { n1 } else { n2[a] }
    };
    for &(a, _) in axes {
        if o.stride[a] == 0 {
            return bad(
                name("stride", ["stride[0]", "stride[1]"], a),
                0,
                "must be at least 1",
            );
        }
        if o.dilation[a] == 0 {
            return bad(
                name("dilation", ["dilation[0]", "dilation[1]"], a),
                0,
                "must be at least 1",
            );
        }
        if o.output_padding[a] >= o.stride[a] {
            return bad(
                name(
                    "output_padding",
                    ["output_padding[0]", "output_padding[1]"],
                    a,
                ),
                o.output_padding[a],
                "must be smaller than the stride",
            );
        }
    }
    let (n, c_in) = (x[0], x[1]);
    if w[0] != c_in {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: Dims::new(x),
            rhs: Dims::new(w),
            reason: "the weight's first dimension must be the input channels",
        });
    }
    if !c_in.is_multiple_of(o.groups) {
        return bad("groups", o.groups, "must divide the input channels");
    }
    let Some(c_out) = w[1].checked_mul(o.groups) else {
        return bad(
            "groups",
            o.groups,
            "the output channels (weight[1] * groups) overflow",
        );
    };
    if let Some(b) = bias
        && (b.len() != 1 || b[0] != c_out)
    {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: Dims::new(b),
            rhs: Dims::new(w),
            reason: "the bias must be 1-D [out_channels] (weight[1] * groups)",
        });
    }
    // `[N, C_out, OH, OW]`; 1-D fills `[N, C_out, OL]` (the last entry unused).
    let mut out = [n, c_out, 1, 1];
    for &(a, i) in axes {
        let (size, kernel) = (x[i], w[i]);
        // `(size - 1) * stride + (kernel - 1) * dilation + output_padding + 1
        // - 2 * padding`, `None` on overflow.
        let full = size
            .checked_sub(1)
            .and_then(|s| s.checked_mul(o.stride[a]))
            .and_then(|s| {
                kernel
                    .checked_sub(1)
                    .and_then(|k| k.checked_mul(o.dilation[a]))
                    .and_then(|k| s.checked_add(k))
            })
            .and_then(|s| s.checked_add(o.output_padding[a]))
            .and_then(|s| s.checked_add(1));
        let Some(full) = full else {
            return Err(ExecError::Overflow {
                op,
                shape: Dims::new(x),
            });
        };
        match o.padding[a]
            .checked_mul(2)
            .and_then(|p| full.checked_sub(p))
            .filter(|&s| s > 0)
        {
            Some(s) => out[i] = s,
            None => {
                return bad(
                    name("padding", ["padding[0]", "padding[1]"], a),
                    o.padding[a],
                    "leaves an empty output",
                );
            }
        }
    }
    let out = if spec.one_d {
        Dims::new(&[out[0], out[1], out[2]])
    } else {
        Dims::new(&out)
    };
    check_shape(op, out.as_slice())?;
    Ok(out)
}

/// `grad` must have the output shape `want`.
fn check_grad(op: &'static str, want: Dims, grad: &RawTensor) -> Result<(), ExecError> {
    if grad.shape() != want.as_slice() {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: grad.dims(),
            rhs: want,
            reason: "grad must have the transposed convolution's output shape",
        });
    }
    Ok(())
}

fn forward(
    ctx: &ExecContext,
    spec: TSpec,
    x: &RawTensor,
    w: &RawTensor,
    bias: Option<&RawTensor>,
) -> Result<RawTensor, ExecError> {
    let out = out_geometry(spec, x.shape(), w.shape(), bias.map(|b| b.shape()))?;
    if let Some(o) = as_convolution(spec, w.shape()) {
        let flipped = flip_weight(ctx, spec.op, w)?;
        return conv::conv_forward(ctx, Spec::d2(spec.op, o), x, &flipped, bias);
    }
    conv::input_grad(ctx, spec.conv(), out.as_slice(), w, x, bias)
}

/// The options of the convolution that computes a 2-D transposed
/// convolution of stride 1 and one group directly (a convolution of the
/// input with the flipped weight, [`flip_weight`], padded by `dilation ·
/// (K - 1) - padding`), or `None` where it does not apply (another stride,
/// groups, a padding larger than `dilation · (K - 1)`, 1-D).
///
/// Both compute every output element as the sum of the same products; the
/// convolution's forward is one GEMM of depth `C_in · KH · KW` written once
/// into the output, where the input-gradient form is a GEMM of depth `C_in`
/// into a `KH · KW` times larger column matrix added back by col2im.
fn as_convolution(spec: TSpec, w: &[usize]) -> Option<Conv2dOptions> {
    let o = spec.o;
    if spec.one_d || o.groups != 1 || o.stride != [1, 1] {
        return None;
    }
    let pad = |a: usize| (o.dilation[a] * (w[2 + a] - 1)).checked_sub(o.padding[a]);
    Some(Conv2dOptions {
        stride: [1, 1],
        padding: [pad(0)?, pad(1)?],
        dilation: o.dilation,
        groups: 1,
    })
}

/// The weight `[C_out, C_in, KH, KW]` of the convolution
/// [`as_convolution`] describes, from the transposed convolution's `[C_in,
/// C_out, KH, KW]` (one group): the channels exchanged and the taps
/// reversed, `w'[o, c, r, s] = w[c, o, KH - 1 - r, KW - 1 - s]`.
fn flip_weight(ctx: &ExecContext, op: &'static str, w: &RawTensor) -> Result<RawTensor, ExecError> {
    let &[c_in, c_out, kh, kw] = w.shape() else {
        unreachable!("out_geometry checked a 4-D weight")
    };
    let w = ctx.contiguous(w)?;
    let ws = w.contiguous_slice();
    let taps = kh * kw;
    ctx.new_tensor(op, &[c_out, c_in, kh, kw], |out| {
        for (oc, rows) in out.chunks_exact_mut(c_in * taps).enumerate() {
            for (c, dst) in rows.chunks_exact_mut(taps).enumerate() {
                let src = &ws[(c * c_out + oc) * taps..][..taps];
                for (d, &v) in dst.iter_mut().zip(src.iter().rev()) {
                    *d = v;
                }
            }
        }
    })
}

fn input_grad(
    ctx: &ExecContext,
    spec: TSpec,
    x_shape: &[usize],
    w: &RawTensor,
    grad: &RawTensor,
) -> Result<RawTensor, ExecError> {
    let out = out_geometry(spec, x_shape, w.shape(), None)?;
    check_grad(spec.op, out, grad)?;
    // With `output_padding < stride` the convolution of an output-sized
    // tensor has exactly the input's size.
    conv::conv_forward(ctx, spec.conv(), grad, w, None)
}

fn weight_grad(
    ctx: &ExecContext,
    spec: TSpec,
    x: &RawTensor,
    w_shape: &[usize],
    grad: &RawTensor,
) -> Result<RawTensor, ExecError> {
    let out = out_geometry(spec, x.shape(), w_shape, None)?;
    check_grad(spec.op, out, grad)?;
    conv::weight_grad(ctx, spec.conv(), grad, w_shape, x)
}

impl ExecContext {
    /// The 2-D transposed convolution of `x` (`[N, C_in, H, W]`) with `w`
    /// (`[C_in, C_out / groups, KH, KW]`) plus an optional `bias` (`[C_out]`),
    /// PyTorch's `conv_transpose2d`: every input position `(i, j)` of channel
    /// `c` adds `x[n, c, i, j] · w[c, o, r, s]` to the output at `(i *
    /// stride[0] + r * dilation[0] - padding[0], j * stride[1] + s *
    /// dilation[1] - padding[1])` of channel `g * C_out / groups + o` (`g` the
    /// group of `c`), positions outside the output dropped. The output is
    /// `[N, C_out, OH, OW]`, `OH = (H - 1) * stride[0] - 2 * padding[0] +
    /// dilation[0] * (KH - 1) + output_padding[0] + 1` (likewise `OW`): the
    /// input gradient of `conv2d` with these options, which is how it runs
    /// (with stride 1 and one group: as `conv2d` of the flipped weight; see
    /// the module docs).
    ///
    /// Each sample's result is bitwise the same alone or in any batch, for any
    /// team size and vector level.
    ///
    /// ```
    /// use fucina_exec::{ConvTranspose2dOptions, ExecContext};
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_vec(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0])?;
    /// let w = ctx.from_vec(&[1, 1, 2, 2], vec![1.0f32; 4])?;
    /// let opts = ConvTranspose2dOptions { stride: [2, 2], ..Default::default() };
    /// let y = ctx.conv_transpose2d(&x, &w, None, opts)?;
    /// assert_eq!(y.shape(), &[1, 1, 4, 4]);
    /// assert_eq!(y.to_vec()[..4], [1.0, 1.0, 2.0, 2.0]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] for an input or weight that is not 4-D or
    /// has a zero dimension; [`ExecError::InvalidOption`] for a stride,
    /// dilation or group count of 0, a group count that does not divide the
    /// input channels, an output padding not smaller than its stride (PyTorch
    /// also accepts one smaller than the dilation instead; this does not), or
    /// a padding that leaves no output; [`ExecError::ShapeMismatch`] for a
    /// weight whose first dimension is not `C_in` or a bias that is not
    /// `[C_out]`; [`ExecError::Overflow`] for sizes that overflow;
    /// [`ExecError::OutOfMemory`].
    pub fn conv_transpose2d(
        &self,
        x: &RawTensor,
        w: &RawTensor,
        bias: Option<&RawTensor>,
        opts: ConvTranspose2dOptions,
    ) -> Result<RawTensor, ExecError> {
        forward(self, TSpec::d2("conv_transpose2d", opts), x, w, bias)
    }

    /// The gradient of [`conv_transpose2d`](ExecContext::conv_transpose2d)
    /// with respect to its input (of shape `x_shape`), given the weight `w`
    /// and `grad = dL/dy`: `conv2d(grad, w)` with the same options. Each
    /// sample's gradient is computed alone (batch-invariant).
    ///
    /// # Errors
    /// The errors of [`conv_transpose2d`](ExecContext::conv_transpose2d) for
    /// these shapes; [`ExecError::ShapeMismatch`] if `grad` does not have the
    /// output's shape; [`ExecError::OutOfMemory`].
    pub fn conv_transpose2d_input_grad(
        &self,
        x_shape: &[usize],
        w: &RawTensor,
        grad: &RawTensor,
        opts: ConvTranspose2dOptions,
    ) -> Result<RawTensor, ExecError> {
        let spec = TSpec::d2("conv_transpose2d_input_grad", opts);
        input_grad(self, spec, x_shape, w, grad)
    }

    /// The gradient of [`conv_transpose2d`](ExecContext::conv_transpose2d)
    /// with respect to its weight (of shape `w_shape`), given the input `x`
    /// and `grad = dL/dy`, summed over the batch in increasing sample order.
    /// The bias gradient is [`conv_bias_grad`](ExecContext::conv_bias_grad).
    ///
    /// # Errors
    /// As [`conv_transpose2d_input_grad`](ExecContext::conv_transpose2d_input_grad).
    pub fn conv_transpose2d_weight_grad(
        &self,
        x: &RawTensor,
        w_shape: &[usize],
        grad: &RawTensor,
        opts: ConvTranspose2dOptions,
    ) -> Result<RawTensor, ExecError> {
        let spec = TSpec::d2("conv_transpose2d_weight_grad", opts);
        weight_grad(self, spec, x, w_shape, grad)
    }

    /// The 1-D transposed convolution of `x` (`[N, C_in, L]`) with `w` (`[C_in,
    /// C_out / groups, K]`) plus an optional `bias` (`[C_out]`), PyTorch's
    /// `conv_transpose1d`: [`conv_transpose2d`](ExecContext::conv_transpose2d)
    /// with height 1. The output is `[N, C_out, OL]`, `OL = (L - 1) * stride -
    /// 2 * padding + dilation * (K - 1) + output_padding + 1`.
    ///
    /// ```
    /// use fucina_exec::{ConvTranspose1dOptions, ExecContext};
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_vec(&[1, 1, 2], vec![1.0, 2.0])?;
    /// let w = ctx.from_vec(&[1, 1, 3], vec![1.0f32, 10.0, 100.0])?;
    /// let y = ctx.conv_transpose1d(&x, &w, None, ConvTranspose1dOptions::default())?;
    /// assert_eq!(y.to_vec(), vec![1.0, 12.0, 120.0, 200.0]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`conv_transpose2d`](ExecContext::conv_transpose2d), for 3-D shapes.
    pub fn conv_transpose1d(
        &self,
        x: &RawTensor,
        w: &RawTensor,
        bias: Option<&RawTensor>,
        opts: ConvTranspose1dOptions,
    ) -> Result<RawTensor, ExecError> {
        forward(self, TSpec::d1("conv_transpose1d", opts), x, w, bias)
    }

    /// The gradient of [`conv_transpose1d`](ExecContext::conv_transpose1d)
    /// with respect to its input; see
    /// [`conv_transpose2d_input_grad`](ExecContext::conv_transpose2d_input_grad).
    ///
    /// # Errors
    /// As [`conv_transpose2d_input_grad`](ExecContext::conv_transpose2d_input_grad),
    /// for 3-D shapes.
    pub fn conv_transpose1d_input_grad(
        &self,
        x_shape: &[usize],
        w: &RawTensor,
        grad: &RawTensor,
        opts: ConvTranspose1dOptions,
    ) -> Result<RawTensor, ExecError> {
        let spec = TSpec::d1("conv_transpose1d_input_grad", opts);
        input_grad(self, spec, x_shape, w, grad)
    }

    /// The gradient of [`conv_transpose1d`](ExecContext::conv_transpose1d)
    /// with respect to its weight; see
    /// [`conv_transpose2d_weight_grad`](ExecContext::conv_transpose2d_weight_grad).
    ///
    /// # Errors
    /// As [`conv_transpose2d_input_grad`](ExecContext::conv_transpose2d_input_grad),
    /// for 3-D shapes.
    pub fn conv_transpose1d_weight_grad(
        &self,
        x: &RawTensor,
        w_shape: &[usize],
        grad: &RawTensor,
        opts: ConvTranspose1dOptions,
    ) -> Result<RawTensor, ExecError> {
        let spec = TSpec::d1("conv_transpose1d_weight_grad", opts);
        weight_grad(self, spec, x, w_shape, grad)
    }
}
