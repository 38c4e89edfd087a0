//! [`Parameter`]: a shared handle to a leaf variable.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fucina_autograd::Tensor;
use fucina_exec::{Dims, ExecContext};
use parking_lot::RwLock;

use crate::error::{Error, Result};

/// A trainable parameter: a shared handle to a leaf variable.
///
/// A [`Tensor`] handle owns its view of the values: updating one handle in place
/// is copy-on-write and never changes what other handles see. A `Parameter`
/// adds the sharing a model needs: every clone of a `Parameter` is the same
/// parameter, so the layer that reads it in `forward` and the optimizer that
/// updates it agree on its values. [`tensor`](Parameter::tensor) returns the
/// current value as a variable (same gradient state) for use in ops.
///
/// Updates ([`update_`](Parameter::update_)) are in place when nothing else
/// holds the storage and copy-on-write otherwise: a graph that saved the old
/// values (a forward whose backward has not run yet) keeps them.
///
/// ```
/// use fucina::nn::Parameter;
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let p = Parameter::from_slice(&ctx, &[2], &[1.0, 2.0])?;
/// let q = p.clone(); // the same parameter
/// q.update_(|w| w[0] = 5.0)?;
/// assert_eq!(p.to_vec(), [5.0, 2.0]);
/// let loss = p.tensor().mul(&ctx, &p.tensor())?.sum_all(&ctx)?;
/// loss.backward(&ctx)?;
/// assert_eq!(q.grad(&ctx)?.unwrap().to_vec(), [10.0, 4.0]);
/// # Ok::<(), fucina::Error>(())
/// ```
///
/// The closure of [`update_`](Parameter::update_) must not use the parameter it
/// updates (through any handle): such a call is detected, the update stops
/// there, and `update_` returns [`Error::InvalidArgument`] (it never deadlocks).
#[derive(Clone)]
pub struct Parameter {
    inner: Arc<Inner>,
}

struct Inner {
    tensor: RwLock<Tensor>,
    /// The [`thread_token`] of the thread running an update of this parameter
    /// (0: none). Lets a call from inside the update's closure, on that same
    /// thread, be refused instead of waiting forever for the update's lock.
    updater: AtomicU64,
    /// The last pass of [`Parameter::mark`] that saw this parameter.
    mark: AtomicU64,
}

/// The unwinding payload of a call made from inside an update of the same
/// parameter (raised with `resume_unwind`, which prints nothing, and caught by
/// [`Parameter::update_`]).
struct Reentered;

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);
static NEXT_MARK: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TOKEN: u64 = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
}

/// A number unique to the calling thread (never 0).
fn thread_token() -> u64 {
    TOKEN.with(|t| *t)
}

impl fmt::Debug for Parameter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.updating_here() {
            return f.write_str("Parameter(<being updated>)");
        }
        f.debug_tuple("Parameter")
            .field(&*self.inner.tensor.read())
            .finish()
    }
}

impl Parameter {
    /// A parameter over `t` (made a leaf variable if it is not one: a constant
    /// from `randn`, `zeros`, ... becomes trainable; an op result is detached
    /// first).
    pub fn new(t: Tensor) -> Parameter {
        let t = if t.is_variable() {
            t
        } else {
            t.detach().into_variable()
        };
        Parameter {
            inner: Arc::new(Inner {
                tensor: RwLock::new(t),
                updater: AtomicU64::new(0),
                mark: AtomicU64::new(0),
            }),
        }
    }

    /// Whether the calling thread is inside an update of this parameter.
    fn updating_here(&self) -> bool {
        self.inner.updater.load(Ordering::Acquire) == thread_token()
    }

    /// The value, read-locked. From inside an update of this parameter, stops
    /// that update (see [`update_`](Parameter::update_)).
    fn read(&self) -> parking_lot::RwLockReadGuard<'_, Tensor> {
        if self.updating_here() {
            resume_unwind(Box::new(Reentered));
        }
        self.inner.tensor.read()
    }

    /// A fresh pass number for [`mark`](Parameter::mark).
    pub(crate) fn new_pass() -> u64 {
        NEXT_MARK.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks this parameter as seen by pass `pass`; `false` if that pass had
    /// already marked it (it was listed twice). Allocation-free duplicate
    /// detection for lists walked every step.
    pub(crate) fn mark(&self, pass: u64) -> bool {
        self.inner.mark.swap(pass, Ordering::Relaxed) != pass
    }

    /// A parameter holding a copy of `values`.
    ///
    /// # Errors
    /// The shape and length errors of `ExecContext::from_slice`.
    pub fn from_slice(ctx: &ExecContext, shape: &[usize], values: &[f32]) -> Result<Parameter> {
        Ok(Parameter::new(Tensor::variable_from_slice(
            ctx, shape, values,
        )?))
    }

    /// The current value as a variable handle (it shares the storage and the
    /// gradient state: ops on it record into this parameter's gradient).
    pub fn tensor(&self) -> Tensor {
        self.read().clone()
    }

    /// The shape.
    pub fn shape(&self) -> Dims {
        self.read().raw().dims()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.read().numel()
    }

    /// The values in row-major order, copied.
    pub fn to_vec(&self) -> Vec<f32> {
        self.read().to_vec()
    }

    /// Whether `self` and `other` are handles to the same parameter.
    pub fn ptr_eq(&self, other: &Parameter) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A caller-owned copy of the accumulated gradient (`None` before a
    /// backward reached the parameter, or after [`zero_grad`](Parameter::zero_grad)).
    ///
    /// # Errors
    /// Out of memory.
    pub fn grad(&self, ctx: &ExecContext) -> Result<Option<Tensor>> {
        Ok(self.read().grad(ctx)?)
    }

    /// The accumulated gradient without a copy (a handle sharing its storage).
    pub fn grad_view(&self) -> Option<Tensor> {
        self.read().grad_view()
    }

    /// Releases the gradient.
    pub fn zero_grad(&self) {
        self.read().zero_grad();
    }

    /// Runs `f` over the values in place (copy-on-write when a graph or another
    /// tensor still shares the storage; see the type's docs). The gradient state
    /// is kept.
    ///
    /// `f` must not use this same parameter (through any of its handles: the
    /// update holds its lock). Such a call on the updating thread is detected:
    /// it does not return into `f`, the update stops there, and `update_`
    /// returns an error (the values `f` wrote before that call stay written).
    /// Another thread using the parameter waits until the update ends (so `f`
    /// must not wait for such a thread). Other parameters may be used.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `f` used this parameter, or if this is
    /// called from inside an update of this parameter; out of memory if a copy
    /// is needed and cannot be allocated.
    pub fn update_<R>(&self, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
        let reentered = || {
            Error::invalid(
                "Parameter::update_",
                "the update's closure used the parameter being updated (read it before the update)",
            )
        };
        let me = thread_token();
        if self.inner.updater.load(Ordering::Acquire) == me {
            return Err(reentered());
        }
        let mut t = self.inner.tensor.write();
        self.inner.updater.store(me, Ordering::Release);
        let r = catch_unwind(AssertUnwindSafe(|| t.update_(f).map_err(Error::from)));
        self.inner.updater.store(0, Ordering::Release);
        drop(t);
        match r {
            Ok(r) => r,
            Err(payload) if payload.is::<Reentered>() => Err(reentered()),
            Err(payload) => resume_unwind(payload),
        }
    }

    /// Overwrites the values with `values` (same element count; the shape is
    /// kept).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the lengths differ; out of memory.
    pub fn copy_from_slice(&self, values: &[f32]) -> Result<()> {
        let n = self.numel();
        if values.len() != n {
            return Err(Error::invalid(
                "Parameter::copy_from_slice",
                format!("{} values for a parameter of {n} elements", values.len()),
            ));
        }
        self.update_(|w| w.copy_from_slice(values))
    }
}
