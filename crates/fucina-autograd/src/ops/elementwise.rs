//! Elementwise ops: binary with broadcasting (gradients reduced back to each
//! operand's shape), scalar forms, unary math, selection and dropout.

use fucina_exec::{BinaryOp, ExecContext, MaskOp, RawTensor, ScalarOp, UnaryOp};

use crate::error::Result;
use crate::ops::sum_to;
use crate::record::{GradList, grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// Applies the unary elementwise op `op` (the descriptor names its forward
    /// kernel, run now, and its backward kernel, run by backward). The named
    /// methods (`relu`, `exp`, ...) are this with their variant.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{ExecContext, UnaryOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[2], &[-1., 2.])?;
    /// let y = x.unary(&ctx, UnaryOp::Relu)?;
    /// assert_eq!(y.to_vec(), x.relu(&ctx)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`](fucina_exec::ExecError::OutOfMemory).
    pub fn unary(&self, ctx: &ExecContext, op: UnaryOp) -> Result<Tensor> {
        let out = ctx.unary(op, &self.raw)?;
        let x = self.raw.clone();
        record!(
            ctx,
            op.name(),
            out,
            &[self],
            Unary { op, x },
            |ctx, g, _| Ok(grads![Some(ctx.unary_backward(*op, x, g)?)])
        )
    }
}

/// The named unary methods, each [`Tensor::unary`] with its descriptor.
macro_rules! unary {
    ($($(#[$doc:meta])* $name:ident => $variant:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            ///
            /// # Errors
            /// [`ExecError::OutOfMemory`](fucina_exec::ExecError::OutOfMemory).
            pub fn $name(&self, ctx: &ExecContext) -> Result<Tensor> {
                self.unary(ctx, UnaryOp::$variant)
            }
        )*}
    };
}

unary! {
    /// `-x`.
    neg => Neg;
    /// `|x|` (gradient 0 at 0).
    abs => Abs;
    /// `e^x`.
    exp => Exp;
    /// Natural logarithm.
    log => Log;
    /// Square root.
    sqrt => Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt;
    /// The logistic function.
    sigmoid => Sigmoid;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// `max(x, 0)` (gradient 0 at 0).
    relu => Relu;
    /// GELU, tanh approximation.
    gelu => Gelu;
    /// Exact GELU.
    gelu_erf => GeluErf;
    /// SiLU `x * sigmoid(x)`.
    silu => Silu;
    /// Softplus `ln(1 + e^x)`.
    softplus => Softplus;
    /// Log-sigmoid `ln(sigmoid(x))`, stable for any `x`.
    logsigmoid => LogSigmoid;
    /// Mish `x * tanh(softplus(x))`.
    mish => Mish;
    /// Hard swish `x * relu6(x + 3) / 6`.
    hardswish => Hardswish;
    /// Sine.
    sin => Sin;
    /// Cosine.
    cos => Cos;
}

/// Reduces the two broadcast-shaped gradients of a binary op to the operands'
/// shapes (only those that were asked for).
fn reduce_pair(
    ctx: &ExecContext,
    needs: &[bool],
    a_shape: &[usize],
    b_shape: &[usize],
    (ga, gb): (Option<RawTensor>, Option<RawTensor>),
) -> Result<GradList> {
    let ga = match ga {
        Some(ga) if needs[0] => Some(sum_to(ctx, &ga, a_shape)?),
        _ => None,
    };
    let gb = match gb {
        Some(gb) if needs[1] => Some(sum_to(ctx, &gb, b_shape)?),
        _ => None,
    };
    Ok(grads![ga, gb])
}

impl Tensor {
    /// Applies the binary elementwise op `op` to `self` and `y` with numpy
    /// broadcasting (the descriptor names its forward kernel, run now, and its
    /// backward kernel, run by backward; each gradient is summed back to its
    /// operand's shape). The named methods (`add`, `mul`, ...) are this with
    /// their variant. Ops whose backward reads only the shapes (`add`, `sub`)
    /// keep only the shapes, not the operands.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{BinaryOp, ExecContext};
    ///
    /// let ctx = ExecContext::new();
    /// let a = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    /// let b = Tensor::variable_from_slice(&ctx, &[2], &[3., 4.])?;
    /// let y = a.binary(&ctx, BinaryOp::Mul, &b)?;
    /// assert_eq!(y.to_vec(), a.mul(&ctx, &b)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`](fucina_exec::ExecError::ShapeMismatch) if the
    /// shapes do not broadcast; out of memory.
    pub fn binary(&self, ctx: &ExecContext, op: BinaryOp, y: &Tensor) -> Result<Tensor> {
        let out = ctx.binary(op, &self.raw, &y.raw)?;
        if !op.keeps_operands() {
            let (a, b) = (self.raw.dims(), y.raw.dims());
            return record!(
                ctx,
                op.name(),
                out,
                &[self, y],
                BinaryShapes { op, a, b },
                |ctx, g, needs| {
                    let pair = ctx.binary_backward(*op, None, g, [needs[0], needs[1]])?;
                    reduce_pair(ctx, needs, a.as_slice(), b.as_slice(), pair)
                }
            );
        }
        let (a, b) = (self.raw.clone(), y.raw.clone());
        record!(
            ctx,
            op.name(),
            out,
            &[self, y],
            Binary { op, a, b },
            |ctx, g, needs| {
                let pair = ctx.binary_backward(*op, Some((a, b)), g, [needs[0], needs[1]])?;
                reduce_pair(ctx, needs, a.shape(), b.shape(), pair)
            }
        )
    }
}

/// The named binary methods, each [`Tensor::binary`] with its descriptor.
macro_rules! binary {
    ($($(#[$doc:meta])* $name:ident => $variant:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            ///
            /// # Errors
            /// [`ExecError::ShapeMismatch`](fucina_exec::ExecError::ShapeMismatch)
            /// if the shapes do not broadcast; out of memory.
            pub fn $name(&self, ctx: &ExecContext, y: &Tensor) -> Result<Tensor> {
                self.binary(ctx, BinaryOp::$variant, y)
            }
        )*}
    };
}

binary! {
    /// `self + y` (numpy broadcasting).
    add => Add;
    /// `self - y` (numpy broadcasting).
    sub => Sub;
    /// `self * y` (numpy broadcasting).
    mul => Mul;
    /// `self / y` (numpy broadcasting).
    div => Div;
    /// `self ^ y` elementwise (numpy broadcasting).
    pow => Pow;
    /// The elementwise larger of `self` and `y` (ties split the gradient evenly).
    maximum => Maximum;
    /// The elementwise smaller of `self` and `y` (ties split the gradient evenly).
    minimum => Minimum;
}

impl Tensor {
    /// Applies the scalar-parameter op `op` (`scale`, `add_scalar`,
    /// `pow_scalar`, `clamp`; the descriptor holds the scalars and names the
    /// forward kernel, run now, and the backward kernel, run by backward). The
    /// named methods are this with their variant; the input is kept only if the
    /// backward reads it.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{ExecContext, ScalarOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    /// let y = x.scalar_op(&ctx, ScalarOp::Scale(3.0))?;
    /// assert_eq!(y.to_vec(), x.scale(&ctx, 3.0)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`](fucina_exec::ExecError::InvalidArgument)
    /// for unordered or NaN clamp bounds; out of memory.
    pub fn scalar_op(&self, ctx: &ExecContext, op: ScalarOp) -> Result<Tensor> {
        let out = ctx.scalar_op(op, &self.raw)?;
        let x = op.keeps_input().then(|| self.raw.clone());
        record!(
            ctx,
            op.name(),
            out,
            &[self],
            Scalar { op, x },
            |ctx, g, _| Ok(grads![Some(ctx.scalar_op_backward(*op, x.as_ref(), g)?)])
        )
    }

    /// `self * s`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn scale(&self, ctx: &ExecContext, s: f32) -> Result<Tensor> {
        self.scalar_op(ctx, ScalarOp::Scale(s))
    }

    /// `self + s`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn add_scalar(&self, ctx: &ExecContext, s: f32) -> Result<Tensor> {
        self.scalar_op(ctx, ScalarOp::AddScalar(s))
    }

    /// `self ^ p`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn pow_scalar(&self, ctx: &ExecContext, p: f32) -> Result<Tensor> {
        self.scalar_op(ctx, ScalarOp::PowScalar(p))
    }

    /// `self` clamped to `[min, max]` (gradient 0 outside).
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`](fucina_exec::ExecError::InvalidArgument) for
    /// unordered or NaN bounds; out of memory.
    pub fn clamp(&self, ctx: &ExecContext, min: f32, max: f32) -> Result<Tensor> {
        self.scalar_op(ctx, ScalarOp::Clamp { min, max })
    }

    /// Inverted dropout with probability `p` and a counter-based mask from `seed`
    /// (regenerated in backward, never stored).
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`](fucina_exec::ExecError::InvalidArgument)
    /// unless `0 <= p < 1`; out of memory.
    pub fn dropout(&self, ctx: &ExecContext, p: f32, seed: u64) -> Result<Tensor> {
        self.scalar_op(ctx, ScalarOp::Dropout { p, seed })
    }

    /// Applies the mask op `op` (the descriptor names its forward kernel, run
    /// now, and its backward kernel, run by backward): `mask ? self : other`
    /// for [`MaskOp::Where`] (`other` required; each gradient is summed back to
    /// its operand's shape), `mask ? value : self` for
    /// [`MaskOp::MaskedFill`] (`other` is `None`). [`where_`](Tensor::where_)
    /// and [`masked_fill`](Tensor::masked_fill) are this with their variant.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{ExecContext, MaskOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    /// let mask = ctx.from_slice_typed::<bool>(&[2], &[true, false])?;
    /// let y = x.mask_op(&ctx, MaskOp::MaskedFill(0.5), &mask, None)?;
    /// assert_eq!(y.to_vec(), x.masked_fill(&ctx, &mask, 0.5)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`](fucina_exec::ExecError::InvalidArgument)
    /// if `other` is missing for `where` or given to `masked_fill`;
    /// [`ExecError::ShapeMismatch`](fucina_exec::ExecError::ShapeMismatch) if
    /// the shapes do not broadcast; out of memory.
    pub fn mask_op(
        &self,
        ctx: &ExecContext,
        op: MaskOp,
        mask: &RawTensor<bool>,
        other: Option<&Tensor>,
    ) -> Result<Tensor> {
        let out = ctx.mask_op(op, mask, &self.raw, other.map(|t| &t.raw))?;
        let a = self.raw.dims();
        let b = other.map_or(a, |t| t.raw.dims());
        let saved_mask = mask.clone();
        let (pair, single);
        let inputs: &[&Tensor] = match other {
            Some(other) => {
                pair = [self, other];
                &pair
            }
            None => {
                single = [self];
                &single
            }
        };
        record!(
            ctx,
            op.name(),
            out,
            inputs,
            Mask {
                op,
                mask: saved_mask,
                a,
                b
            },
            |ctx, g, needs| {
                let want = [needs[0], needs.get(1).copied().unwrap_or(false)];
                let (ga, gb) = ctx.mask_op_backward(*op, mask, g, want)?;
                match needs.len() {
                    1 => Ok(grads![ga]),
                    _ => reduce_pair(ctx, needs, a.as_slice(), b.as_slice(), (ga, gb)),
                }
            }
        )
    }

    /// `cond ? a : b` elementwise, the three broadcast together; the gradient
    /// goes to the selected operand.
    ///
    /// # Errors
    /// As [`add`](Tensor::add).
    pub fn where_(
        ctx: &ExecContext,
        cond: &RawTensor<bool>,
        a: &Tensor,
        b: &Tensor,
    ) -> Result<Tensor> {
        a.mask_op(ctx, MaskOp::Where, cond, Some(b))
    }

    /// `self` with `value` where `mask` is true (the gradient is 0 there).
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`](fucina_exec::ExecError::ShapeMismatch) if the
    /// mask does not broadcast to `self`'s shape; out of memory.
    pub fn masked_fill(
        &self,
        ctx: &ExecContext,
        mask: &RawTensor<bool>,
        value: f32,
    ) -> Result<Tensor> {
        self.mask_op(ctx, MaskOp::MaskedFill(value), mask, None)
    }
}
