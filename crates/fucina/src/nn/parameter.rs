//! [`Parameter`]: a shared handle to a leaf variable.

use std::fmt;
use std::sync::Arc;

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
#[derive(Clone)]
pub struct Parameter {
    inner: Arc<RwLock<Tensor>>,
}

impl fmt::Debug for Parameter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Parameter")
            .field(&*self.inner.read())
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
            inner: Arc::new(RwLock::new(t)),
        }
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
        self.inner.read().clone()
    }

    /// The shape.
    pub fn shape(&self) -> Dims {
        self.inner.read().raw().dims()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.inner.read().numel()
    }

    /// The values in row-major order, copied.
    pub fn to_vec(&self) -> Vec<f32> {
        self.inner.read().to_vec()
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
        Ok(self.inner.read().grad(ctx)?)
    }

    /// The accumulated gradient without a copy (a handle sharing its storage).
    pub fn grad_view(&self) -> Option<Tensor> {
        self.inner.read().grad_view()
    }

    /// Releases the gradient.
    pub fn zero_grad(&self) {
        self.inner.read().zero_grad();
    }

    /// Runs `f` over the values in place (copy-on-write when a graph or another
    /// tensor still shares the storage; see the type's docs). The gradient state
    /// is kept. `f` must not call methods of this same parameter (the update
    /// holds its lock).
    ///
    /// # Errors
    /// Out of memory if a copy is needed and cannot be allocated.
    pub fn update_<R>(&self, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
        Ok(self.inner.write().update_(f)?)
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
