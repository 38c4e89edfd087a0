//! `no_grad`: a thread-local switch that stops ops from recording a graph.

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    static NO_GRAD_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether ops on this thread record a graph (no [`NoGradGuard`] is alive).
pub fn is_grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|d| d.get() == 0)
}

/// Disables graph recording on this thread until the returned guard drops (or is
/// [`close`](NoGradGuard::close)d). Under it, ops on variables compute their
/// values, record nothing and allocate no graph node; their results are
/// constants. Guards nest.
///
/// ```
/// use fucina_autograd::{Tensor, no_grad, is_grad_enabled};
/// use fucina_autograd::exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
/// {
///     let _g = no_grad();
///     assert!(!is_grad_enabled());
///     let y = w.mul(&ctx, &w)?;
///     assert!(!y.requires_grad());
/// }
/// assert!(w.mul(&ctx, &w)?.requires_grad());
/// # Ok::<(), fucina_autograd::AutogradError>(())
/// ```
pub fn no_grad() -> NoGradGuard {
    NO_GRAD_DEPTH.with(|d| d.set(d.get() + 1));
    NoGradGuard {
        _not_send: PhantomData,
    }
}

/// The guard of [`no_grad`]: recording resumes when the last guard of the thread
/// drops. It is neither `Send` nor `Sync` (the switch is per thread).
#[must_use = "recording resumes as soon as the guard is dropped"]
#[derive(Debug)]
pub struct NoGradGuard {
    _not_send: PhantomData<*const ()>,
}

impl NoGradGuard {
    /// Ends this guard now (the same as dropping it).
    pub fn close(self) {}
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        NO_GRAD_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}
