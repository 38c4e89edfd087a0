//! `custom_vjp`: a user-defined differentiable op.

use fucina_exec::{ExecContext, RawTensor};

use crate::error::Result;
use crate::record::GradList;
use crate::tensor::Tensor;

/// What the backward of a [`custom_vjp`] op receives.
#[derive(Debug)]
pub struct CustomVjpArgs<'a> {
    /// The inputs as the forward saw them.
    pub inputs: &'a [RawTensor],
    /// The forward's output.
    pub output: &'a RawTensor,
    /// The gradient of the output (the output's shape; any layout).
    pub grad: &'a RawTensor,
    /// Which inputs need a gradient (`false` for constants: return `None` there).
    pub needs: &'a [bool],
}

/// A differentiable op from a forward over raw tensors and a backward closure.
///
/// `forward` computes the output from the inputs' raw tensors. When gradients
/// are enabled and an input requires one, a graph node is recorded whose VJP is
/// `backward`: it returns one gradient per input (`None` for no gradient), each of
/// that input's shape, as a [`Grads`](crate::Grads) vector or an array
/// `[Option<RawTensor>; N]` (which allocates nothing). The result follows the
/// rules of every op: adopted by the innermost exec scope if one is open,
/// caller-owned otherwise.
///
/// The closure is kept in a recycled slot (see `docs/AUTOGRAD.md`, "Custom
/// VJPs"): with up to four inputs and an array of gradients, a custom op in a
/// training step allocates nothing after warm-up.
///
/// `backward` must not capture [`Tensor`]s that require a gradient (the graph
/// would keep itself alive); it may capture raw tensors and plain values.
///
/// ```
/// use fucina_autograd::{Tensor, custom_vjp};
/// use fucina_autograd::exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let x = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
/// // y = x^3 with a hand-written derivative 3 x^2.
/// let y = custom_vjp(
///     &ctx,
///     "cube",
///     &[&x],
///     |ctx, xs| Ok(ctx.mul(&ctx.mul(&xs[0], &xs[0])?, &xs[0])?),
///     |ctx, a| {
///         let d = ctx.scale(&ctx.mul(&a.inputs[0], &a.inputs[0])?, 3.0)?;
///         Ok(vec![Some(ctx.mul(&d, a.grad)?)])
///     },
/// )?;
/// y.sum_all(&ctx)?.backward(&ctx)?;
/// assert_eq!(x.grad(&ctx)?.unwrap().to_vec(), [3., 12., 27.]);
/// # Ok::<(), fucina_autograd::AutogradError>(())
/// ```
///
/// # Errors
/// The errors of `forward`. In backward: the errors of `backward`,
/// [`AutogradError::GradientCountMismatch`](crate::AutogradError::GradientCountMismatch)
/// if it returns another number of gradients than inputs, and
/// [`AutogradError::GradientShapeMismatch`](crate::AutogradError::GradientShapeMismatch)
/// if a gradient has the wrong shape.
pub fn custom_vjp<Fwd, Bwd, G>(
    ctx: &ExecContext,
    name: &'static str,
    inputs: &[&Tensor],
    forward: Fwd,
    backward: Bwd,
) -> Result<Tensor>
where
    Fwd: FnOnce(&ExecContext, &[RawTensor]) -> Result<RawTensor>,
    Bwd: Fn(&ExecContext, &CustomVjpArgs<'_>) -> Result<G> + Send + Sync + 'static,
    G: IntoIterator<Item = Option<RawTensor>>,
{
    let raws = Raws::of(inputs);
    let out = forward(ctx, raws.as_slice())?;
    let saved_out = out.clone();
    Tensor::finish_boxed(ctx, name, out, inputs, move |ctx, g, needs| {
        let grads = backward(
            ctx,
            &CustomVjpArgs {
                inputs: raws.as_slice(),
                output: &saved_out,
                grad: g,
                needs,
            },
        )?;
        Ok(grads.into_iter().collect::<GradList>())
    })
}

/// What the backward of a [`custom_vjp_unsaved`] op receives: no inputs and no
/// output (the op keeps none of them).
#[derive(Debug)]
pub struct CustomGradArgs<'a> {
    /// The gradient of the output (the output's shape; any layout).
    pub grad: &'a RawTensor,
    /// Which inputs need a gradient (`false` for constants: return `None` there).
    pub needs: &'a [bool],
}

/// A differentiable op that keeps neither its inputs nor its output for the
/// backward: [`custom_vjp`] for a backward that needs only the output's
/// gradient and what its closure captures (a linear map by a constant, whose
/// VJP is the transposed map).
///
/// The graph holds the op's node and its closure, nothing of `[inputs]` or of
/// the output: an activation the op consumed is freed as soon as nothing else
/// holds it, and the output is the caller's alone (it is not kept until the
/// backward). Everything else is as [`custom_vjp`].
///
/// ```
/// use fucina_autograd::{Tensor, custom_vjp_unsaved};
/// use fucina_autograd::exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let x = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
/// // y = 3 x: the backward needs only the gradient.
/// let y = custom_vjp_unsaved(
///     &ctx,
///     "triple",
///     &[&x],
///     |ctx, xs| Ok(ctx.scale(&xs[0], 3.0)?),
///     |ctx, a| Ok(vec![Some(ctx.scale(a.grad, 3.0)?)]),
/// )?;
/// y.sum_all(&ctx)?.backward(&ctx)?;
/// assert_eq!(x.grad(&ctx)?.unwrap().to_vec(), [3., 3., 3.]);
/// # Ok::<(), fucina_autograd::AutogradError>(())
/// ```
///
/// # Errors
/// As [`custom_vjp`].
pub fn custom_vjp_unsaved<Fwd, Bwd, G>(
    ctx: &ExecContext,
    name: &'static str,
    inputs: &[&Tensor],
    forward: Fwd,
    backward: Bwd,
) -> Result<Tensor>
where
    Fwd: FnOnce(&ExecContext, &[RawTensor]) -> Result<RawTensor>,
    Bwd: Fn(&ExecContext, &CustomGradArgs<'_>) -> Result<G> + Send + Sync + 'static,
    G: IntoIterator<Item = Option<RawTensor>>,
{
    let out = forward(ctx, Raws::of(inputs).as_slice())?;
    Tensor::finish_boxed(ctx, name, out, inputs, move |ctx, g, needs| {
        let grads = backward(ctx, &CustomGradArgs { grad: g, needs })?;
        Ok(grads.into_iter().collect::<GradList>())
    })
}

/// The most inputs whose handles a custom op keeps without a list on the heap.
const INLINE_INPUTS: usize = 4;

/// The inputs' raw handles as a custom op passes them to its closures: inline
/// for up to [`INLINE_INPUTS`] inputs (the slots past the inputs hold more
/// handles of the first, never read), on the heap beyond. Inline on purpose:
/// the list lives in the op's recycled closure slot, and boxing it would
/// allocate on every op.
#[allow(clippy::large_enum_variant)]
enum Raws {
    Inline([RawTensor; INLINE_INPUTS], usize),
    Heap(Vec<RawTensor>),
}

impl Raws {
    fn of(inputs: &[&Tensor]) -> Raws {
        match inputs.first() {
            Some(first) if inputs.len() <= INLINE_INPUTS => Raws::Inline(
                std::array::from_fn(|i| inputs.get(i).unwrap_or(first).raw.clone()),
                inputs.len(),
            ),
            _ => Raws::Heap(inputs.iter().map(|t| t.raw.clone()).collect()),
        }
    }

    fn as_slice(&self) -> &[RawTensor] {
        match self {
            Raws::Inline(a, n) => &a[..*n],
            Raws::Heap(v) => v,
        }
    }
}
