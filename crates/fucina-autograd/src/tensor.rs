//! [`Tensor`]: a [`RawTensor`] plus optional gradient state.

use std::fmt;

use fucina_exec::{ExecContext, ExecError, RawTensor};

use crate::error::{AutogradError, Result};
use crate::fill::{par_fill, seed_at};
use crate::grad_mode::is_grad_enabled;
use crate::node::{self, BackwardOptions, NodePool, NodeRef, Small, run_backward};
use crate::record::{GradList, Saved, Vjp, VjpFn};

/// A differentiable tensor: a [`RawTensor`] (shared, immutable storage plus a
/// layout) and, when it takes part in a graph, a shared graph node.
///
/// - A **variable** ([`into_variable`](Tensor::into_variable),
///   [`variable_from_slice`](Tensor::variable_from_slice)) is a leaf that
///   accumulates a gradient across [`backward`](Tensor::backward) calls until
///   [`zero_grad`](Tensor::zero_grad).
/// - A **constant** ([`constant`](Tensor::constant), [`from_slice`](Tensor::from_slice),
///   [`zeros`](Tensor::zeros), ...) records nothing.
/// - An **op result** records a node with the op's VJP when gradients are
///   enabled (see [`no_grad`](crate::no_grad)) and an operand requires a gradient.
///
/// While an exec scope is open, every op result is also adopted by the innermost
/// scope, which keeps its storage and node alive until the scope closes.
/// Constructors and fetched gradients are never adopted.
///
/// ```
/// use fucina_autograd::Tensor;
/// use fucina_autograd::exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
/// let y = w.mul(&ctx, &w)?;
/// let loss = y.sum_all(&ctx)?;
/// loss.backward(&ctx)?;
/// let gw: Tensor = w.grad(&ctx)?.expect("w is a variable");
/// assert_eq!(gw.to_vec(), [2., 4., 6.]);
/// w.zero_grad();
/// # Ok::<(), fucina_autograd::AutogradError>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    pub(crate) raw: RawTensor,
    pub(crate) node: Option<NodeRef>,
    scope_owned: bool,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("raw", &self.raw)
            .field("requires_grad", &self.requires_grad())
            .field("scope_owned", &self.scope_owned)
            .finish()
    }
}

impl Tensor {
    // ---- constructors (caller-owned, never scope-adopted) ----

    /// A leaf variable over `raw` (no copy): it requires a gradient and
    /// accumulates one on every backward that reaches it.
    ///
    /// Deprecated: the context is not used and the call cannot fail; write
    /// `Tensor::constant(raw).into_variable()`, which is the same leaf.
    ///
    /// # Errors
    /// None: it always returns `Ok`.
    #[deprecated(
        since = "0.1.0",
        note = "the context is unused and the call cannot fail: use `Tensor::constant(raw).into_variable()`"
    )]
    pub fn variable(ctx: &ExecContext, raw: RawTensor) -> Result<Tensor> {
        let _ = ctx;
        Ok(Tensor::leaf(raw))
    }

    /// A leaf variable holding a pooled copy of `values`.
    ///
    /// # Errors
    /// The shape and length errors of [`ExecContext::from_slice`].
    pub fn variable_from_slice(
        ctx: &ExecContext,
        shape: &[usize],
        values: &[f32],
    ) -> Result<Tensor> {
        Ok(Tensor::leaf(ctx.from_slice(shape, values)?))
    }

    fn leaf(raw: RawTensor) -> Tensor {
        let node = node::leaf(raw.dims());
        Tensor {
            raw,
            node: Some(node),
            scope_owned: false,
        }
    }

    /// A constant over `raw` (no copy, no gradient).
    pub fn constant(raw: RawTensor) -> Tensor {
        Tensor {
            raw,
            node: None,
            scope_owned: false,
        }
    }

    /// A constant holding a pooled copy of `values`.
    ///
    /// # Errors
    /// The shape and length errors of [`ExecContext::from_slice`].
    pub fn from_slice(ctx: &ExecContext, shape: &[usize], values: &[f32]) -> Result<Tensor> {
        Ok(Tensor::constant(ctx.from_slice(shape, values)?))
    }

    /// A constant of zeros.
    ///
    /// # Errors
    /// The shape errors of [`ExecContext::zeros`].
    pub fn zeros(ctx: &ExecContext, shape: &[usize]) -> Result<Tensor> {
        Ok(Tensor::constant(ctx.zeros(shape)?))
    }

    /// A constant of ones.
    ///
    /// # Errors
    /// The shape errors of [`ExecContext::ones`].
    pub fn ones(ctx: &ExecContext, shape: &[usize]) -> Result<Tensor> {
        Ok(Tensor::constant(ctx.ones(shape)?))
    }

    /// A constant with every element `value`.
    ///
    /// # Errors
    /// The shape errors of [`ExecContext::full`].
    pub fn full(ctx: &ExecContext, shape: &[usize], value: f32) -> Result<Tensor> {
        Ok(Tensor::constant(ctx.full(shape, value)?))
    }

    /// A one-element constant of shape `[1]`.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn scalar(ctx: &ExecContext, value: f32) -> Result<Tensor> {
        Ok(Tensor::constant(ctx.scalar(value)?))
    }

    /// A constant of N(0, `std`²) values from `seed` (element `i` is a pure
    /// function of `(seed, i)`: see `fucina_rng::gaussian_fill_at`). Large fills
    /// run in parallel chunks, bitwise equal to the serial fill.
    ///
    /// # Errors
    /// [`AutogradError::InvalidArgument`] unless `std` is finite and `>= 0`; the
    /// shape errors of [`ExecContext::empty`].
    pub fn randn(ctx: &ExecContext, shape: &[usize], std: f32, seed: u64) -> Result<Tensor> {
        if !(std.is_finite() && std >= 0.0) {
            return Err(AutogradError::InvalidArgument {
                op: "Tensor::randn",
                reason: "the standard deviation must be finite and >= 0",
            });
        }
        let mut raw = ctx.empty(shape)?;
        par_fill(ctx, raw.data_mut()?, |first, out| {
            fucina_exec::rng::gaussian_fill_at(seed, first, out, std);
        });
        Ok(Tensor::constant(raw))
    }

    /// A constant of U[`lo`, `hi`) values from `seed`, bitwise equal to
    /// `fucina_rng::uniform_fill(seed, ..)` (large fills run in parallel chunks).
    ///
    /// # Errors
    /// [`AutogradError::InvalidArgument`] unless the bounds are finite with
    /// `lo <= hi` and a finite width `hi - lo` (`lo == hi` gives all `hi`); the
    /// shape errors of [`ExecContext::empty`].
    pub fn uniform(
        ctx: &ExecContext,
        shape: &[usize],
        lo: f32,
        hi: f32,
        seed: u64,
    ) -> Result<Tensor> {
        if !(lo.is_finite() && hi.is_finite() && lo <= hi && (hi - lo).is_finite()) {
            return Err(AutogradError::InvalidArgument {
                op: "Tensor::uniform",
                reason: "the bounds must be finite, with lo <= hi and a finite width hi - lo",
            });
        }
        let mut raw = ctx.empty(shape)?;
        par_fill(ctx, raw.data_mut()?, |first, out| {
            fucina_exec::rng::uniform_fill(seed_at(seed, first), out, lo, hi);
        });
        Ok(Tensor::constant(raw))
    }

    /// A constant of U[-b, b) values with `b = sqrt(1 / fan_in)` from `seed`
    /// (PyTorch's `nn.Linear` initialization, `fucina_rng::kaiming_uniform_fill`),
    /// where `fan_in` is the last dimension of `shape`.
    ///
    /// # Errors
    /// The shape errors of [`ExecContext::empty`].
    pub fn kaiming_uniform(ctx: &ExecContext, shape: &[usize], seed: u64) -> Result<Tensor> {
        let mut raw = ctx.empty(shape)?;
        let fan_in = *raw.shape().last().expect("rank >= 1");
        par_fill(ctx, raw.data_mut()?, |first, out| {
            fucina_exec::rng::kaiming_uniform_fill(seed_at(seed, first), out, fan_in);
        });
        Ok(Tensor::constant(raw))
    }

    /// This tensor as a leaf variable (sharing the storage): a constant made with a
    /// constructor such as [`randn`](Tensor::randn) becomes a parameter.
    pub fn into_variable(self) -> Tensor {
        Tensor::leaf(self.raw)
    }

    // ---- accessors ----

    /// The same values without gradient state (shares the storage; caller-owned).
    pub fn detach(&self) -> Tensor {
        Tensor::constant(self.raw.clone())
    }

    /// Whether this tensor takes part in a graph (a variable, or an op result
    /// recorded with gradients enabled).
    pub fn requires_grad(&self) -> bool {
        self.node.is_some()
    }

    /// Whether this tensor is a leaf variable.
    pub fn is_variable(&self) -> bool {
        self.node.as_ref().is_some_and(|n| n.is_leaf())
    }

    /// Whether this tensor was adopted by an exec scope when it was made (the
    /// scope keeps its storage alive until it closes).
    pub fn is_scope_owned(&self) -> bool {
        self.scope_owned
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.raw.shape()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.raw.numel()
    }

    /// The underlying raw tensor.
    pub fn raw(&self) -> &RawTensor {
        &self.raw
    }

    /// The elements in row-major order, borrowed.
    ///
    /// # Errors
    /// [`ExecError::UnsupportedView`] if the tensor is not contiguous (use
    /// [`to_vec`](Tensor::to_vec)).
    pub fn data(&self) -> Result<&[f32]> {
        Ok(self.raw.data()?)
    }

    /// The elements in logical row-major order, copied.
    ///
    /// # Panics
    /// If the memory for all [`numel`](Tensor::numel) elements cannot be had (a
    /// broadcast view may be far larger than its storage): use
    /// [`try_to_vec`](Tensor::try_to_vec) where that can happen.
    pub fn to_vec(&self) -> Vec<f32> {
        self.raw.to_vec()
    }

    /// [`to_vec`](Tensor::to_vec), taking its memory fallibly.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`](fucina_exec::ExecError::OutOfMemory) if the
    /// `Vec` cannot be allocated.
    pub fn try_to_vec(&self) -> Result<Vec<f32>> {
        Ok(self.raw.try_to_vec()?)
    }

    /// The value of a one-element tensor.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if the tensor has more than one element.
    pub fn item(&self) -> Result<f32> {
        Ok(self.raw.item()?)
    }

    // ---- gradients ----

    /// A caller-owned copy of this variable's accumulated gradient (`None` for a
    /// tensor that is not a variable, or before any backward reached it). Never
    /// scope-adopted.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if the copy cannot be allocated.
    pub fn grad(&self, ctx: &ExecContext) -> Result<Option<Tensor>> {
        match self.node.as_ref().and_then(|n| n.grad()) {
            None => Ok(None),
            Some(g) => Ok(Some(Tensor::constant(ctx.materialize(&g)?))),
        }
    }

    /// This variable's accumulated gradient without a copy (a handle sharing the
    /// storage; a later backward that accumulates into the gradient copies it
    /// rather than changing what this handle sees).
    pub fn grad_view(&self) -> Option<Tensor> {
        self.node
            .as_ref()
            .and_then(|n| n.grad())
            .map(Tensor::constant)
    }

    /// Multiplies this variable's accumulated gradient by `s` (gradient
    /// clipping). In place when the gradient's storage is its own (see
    /// [`own_grad`](Tensor::own_grad)); a grad view taken earlier keeps the old
    /// values. Returns whether there was a gradient.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if the gradient is shared and its scaled copy
    /// cannot be allocated (the gradient is then unchanged).
    pub fn scale_grad_(&self, ctx: &ExecContext, s: f32) -> Result<bool> {
        match &self.node {
            Some(n) if n.is_leaf() => n.scale_grad(ctx, s),
            _ => Ok(false),
        }
    }

    /// Gives this variable's accumulated gradient storage of its own
    /// (contiguous, shared with no view or other gradient), copying it if
    /// needed; the values do not change. After it, [`scale_grad_`](Tensor::scale_grad_)
    /// cannot fail: a caller that scales several gradients calls this on all of
    /// them first, so that an out-of-memory error leaves every gradient as it was.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if the copy cannot be allocated (nothing
    /// changes).
    pub fn own_grad(&self, ctx: &ExecContext) -> Result<()> {
        match &self.node {
            Some(n) if n.is_leaf() => n.own_grad(ctx),
            _ => Ok(()),
        }
    }

    /// Releases this variable's gradient (the next backward starts from zero).
    pub fn zero_grad(&self) {
        if let Some(n) = &self.node {
            n.zero_grad();
        }
    }

    /// Backpropagates from this one-element tensor (seed 1): every variable it
    /// depends on accumulates its gradient. The graph is consumed (its saved
    /// tensors are released).
    ///
    /// # Errors
    /// [`AutogradError::NoGradientGraph`] if this tensor records no graph;
    /// [`AutogradError::NonScalarLoss`] if it has more than one element;
    /// [`AutogradError::BackwardAlreadyRun`] if an earlier backward consumed the
    /// graph; the exec errors of the VJPs.
    pub fn backward(&self, ctx: &ExecContext) -> Result<()> {
        self.backward_with(ctx, None, BackwardOptions::default())
    }

    /// Backpropagates from this tensor with `grad` as its gradient (its shape).
    ///
    /// # Errors
    /// As [`backward`](Tensor::backward), and
    /// [`AutogradError::GradientShapeMismatch`] if `grad` has another shape.
    pub fn backward_with_grad(&self, ctx: &ExecContext, grad: &RawTensor) -> Result<()> {
        self.backward_with(ctx, Some(grad), BackwardOptions::default())
    }

    /// Backpropagates with an optional seed (`None`: 1 for a one-element tensor)
    /// and [`BackwardOptions`].
    ///
    /// # Errors
    /// As [`backward_with_grad`](Tensor::backward_with_grad).
    pub fn backward_with(
        &self,
        ctx: &ExecContext,
        grad: Option<&RawTensor>,
        opts: BackwardOptions,
    ) -> Result<()> {
        let Some(node) = &self.node else {
            return Err(AutogradError::NoGradientGraph { op: "backward" });
        };
        let seed = match grad {
            Some(g) => {
                if g.shape() != self.shape() {
                    return Err(AutogradError::GradientShapeMismatch {
                        op: "backward",
                        expected: Box::new(self.raw.dims()),
                        got: Box::new(g.dims()),
                    });
                }
                g.clone()
            }
            None => {
                if self.numel() != 1 {
                    return Err(AutogradError::NonScalarLoss {
                        shape: Box::new(self.raw.dims()),
                    });
                }
                ctx.ones(self.shape())?
            }
        };
        run_backward(ctx, node, seed, opts)
    }

    // ---- in-place updates ----

    /// Runs `f` over this tensor's elements in place, copy-on-write: when a graph
    /// (or any other handle) still shares the storage, the values are first
    /// copied into storage of this tensor's own, so saved activations and views
    /// keep the old values. The gradient state is kept (a variable stays the same
    /// variable). Meant for optimizer steps.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if the copy cannot be allocated.
    pub fn update_<R>(&mut self, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
        Ok(f(self.raw.data_mut()?))
    }

    /// One plain SGD step on a variable, `w -= lr * grad`, in place and
    /// copy-on-write (see [`update_`](Tensor::update_)). Returns whether a gradient
    /// was there to apply.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if a copy cannot be allocated.
    pub fn sgd_step_(&mut self, lr: f32) -> Result<bool> {
        let Some(g) = self.node.as_ref().and_then(|n| n.grad()) else {
            return Ok(false);
        };
        let shape_ok = g.shape() == self.shape();
        debug_assert!(shape_ok, "a variable's gradient has its shape");
        let data = self.raw.data_mut()?;
        if g.is_contiguous() {
            for (w, &d) in data.iter_mut().zip(g.data()?) {
                *w -= lr * d;
            }
        } else {
            for (w, d) in data.iter_mut().zip(g.to_vec()) {
                *w -= lr * d;
            }
        }
        Ok(true)
    }

    // ---- storage-consuming no-grad ops ----

    /// `self + y` without recording, consuming `self` and reusing its storage when
    /// it holds the only handle (see [`ExecContext::take_add_no_grad`]). The result
    /// is a constant.
    ///
    /// # Errors
    /// [`ExecError::ActiveExecScopeUnsupported`] if `self` is owned by an exec
    /// scope (the scope holds it until it closes); the errors of `add`.
    pub fn take_add_no_grad(self, ctx: &ExecContext, y: &Tensor) -> Result<Tensor> {
        if self.scope_owned {
            return Err(ExecError::ActiveExecScopeUnsupported {
                op: "take_add_no_grad",
            }
            .into());
        }
        Ok(Tensor::constant(ctx.take_add_no_grad(self.raw, &y.raw)?))
    }

    /// `self * s` without recording, consuming `self` (see
    /// [`take_add_no_grad`](Tensor::take_add_no_grad)).
    ///
    /// # Errors
    /// As [`take_add_no_grad`](Tensor::take_add_no_grad).
    pub fn take_scale_no_grad(self, ctx: &ExecContext, s: f32) -> Result<Tensor> {
        if self.scope_owned {
            return Err(ExecError::ActiveExecScopeUnsupported {
                op: "take_scale_no_grad",
            }
            .into());
        }
        Ok(Tensor::constant(ctx.take_scale_no_grad(self.raw, s)?))
    }

    // ---- op plumbing ----

    /// Wraps an op result: records a node (VJP `vjp` over `saved`) when gradients
    /// are enabled and an input requires one, and adopts the result (with its
    /// node) into the innermost open exec scope, reserving the slot before the
    /// node is built so that adoption cannot fail. The node comes from the
    /// context's free list (no allocation after warm-up).
    pub(crate) fn finish(
        ctx: &ExecContext,
        name: &'static str,
        raw: RawTensor,
        inputs: &[&Tensor],
        saved: Saved,
        vjp: VjpFn,
    ) -> Result<Tensor> {
        Tensor::finish_vjp(ctx, name, raw, inputs, || Vjp::Fn(vjp, saved))
    }

    /// [`finish`](Tensor::finish) with a VJP closure, for custom VJPs and ops
    /// whose saved state does not fit a [`Saved`]: stored in a boxed slot of
    /// its type from the context's free list (a new one only when none is
    /// free: no allocation after warm-up; see [`BoxedVjp`](crate::record::BoxedVjp)).
    pub(crate) fn finish_boxed<F>(
        ctx: &ExecContext,
        name: &'static str,
        raw: RawTensor,
        inputs: &[&Tensor],
        vjp: F,
    ) -> Result<Tensor>
    where
        F: Fn(&ExecContext, &RawTensor, &[bool]) -> Result<GradList> + Send + Sync + 'static,
    {
        Tensor::finish_vjp(ctx, name, raw, inputs, || {
            let ty = std::any::TypeId::of::<Option<F>>();
            match NodePool::of(ctx).take_slot(ty) {
                Some(mut slot) => {
                    *slot
                        .as_any_mut()
                        .downcast_mut::<Option<F>>()
                        .expect("a free slot has the type of its list") = Some(vjp);
                    Vjp::Boxed(slot)
                }
                None => Vjp::Boxed(Box::new(Some(vjp))),
            }
        })
    }

    fn finish_vjp(
        ctx: &ExecContext,
        name: &'static str,
        raw: RawTensor,
        inputs: &[&Tensor],
        vjp: impl FnOnce() -> Vjp,
    ) -> Result<Tensor> {
        let scoped = ctx.exec_scope_active();
        if scoped {
            ctx.reserve_scope_slot()?;
        }
        let node: Option<NodeRef> = if is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
        {
            let links: Small<NodeRef> = inputs.iter().map(|t| t.node.clone()).collect();
            let n = node::op(ctx, name, raw.dims(), links, vjp());
            if scoped {
                ctx.adopt_scope_value_assume_capacity(raw.clone(), Some(n.scope_node()));
            }
            Some(n)
        } else {
            if scoped {
                ctx.adopt_scope_value_assume_capacity(raw.clone(), None);
            }
            None
        };
        Ok(Tensor {
            raw,
            node,
            scope_owned: scoped,
        })
    }

    /// The node's creation number (tests of the ordering).
    #[doc(hidden)]
    pub fn node_id(&self) -> Option<u64> {
        self.node.as_ref().map(|n| n.id())
    }

    /// The name of the op that recorded this tensor's node (`"leaf"` for a
    /// variable).
    pub fn op_name(&self) -> Option<&'static str> {
        self.node.as_ref().map(|n| n.name())
    }

    /// Sets this variable's accumulated gradient to a copy of `grad` (`None`
    /// releases it, as [`zero_grad`](Tensor::zero_grad) does): what code that
    /// exchanges gradients (data parallelism, accumulation by hand) writes back
    /// before an optimizer step. Read it back with [`grad`](Tensor::grad).
    ///
    /// # Errors
    /// [`AutogradError::InvalidArgument`] if this tensor is not a leaf variable;
    /// [`AutogradError::GradientShapeMismatch`] if `grad`'s shape is not this
    /// tensor's; out of memory for the copy. The gradient is unchanged on any
    /// of them.
    pub fn set_grad(&self, ctx: &ExecContext, grad: Option<&Tensor>) -> Result<()> {
        let Some(node) = self.node.as_ref().filter(|n| n.is_leaf()) else {
            return Err(AutogradError::InvalidArgument {
                op: "set_grad",
                reason: "the tensor is not a leaf variable (only variables hold a gradient)",
            });
        };
        let Some(g) = grad else {
            node.zero_grad();
            return Ok(());
        };
        if g.shape() != self.shape() {
            return Err(AutogradError::GradientShapeMismatch {
                op: "set_grad",
                expected: Box::new(self.raw.dims()),
                got: Box::new(g.raw.dims()),
            });
        }
        // A copy of its own (the caller's tensor may change later), made before
        // the old gradient is released.
        let own = ctx.clone(&g.raw)?;
        node.set_grad(Some(own));
        Ok(())
    }
}
