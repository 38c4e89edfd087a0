//! [`Buffer`]: a shared handle to a module's non-trainable state.

use std::fmt;
use std::sync::Arc;

use fucina_autograd::Tensor;
use fucina_exec::{Dims, ExecContext};
use parking_lot::RwLock;

use crate::error::{Error, Result};

/// Non-trainable state a module keeps and saves with its parameters, such as
/// the running mean and variance of batch normalization (PyTorch's
/// "buffers").
///
/// Like [`Parameter`](super::Parameter), every clone is a handle to the *same*
/// buffer. Unlike a parameter, a buffer is a constant: ops on
/// [`tensor`](Buffer::tensor) record no gradient, and optimizers never see it
/// ([`Module::parameters`](super::Module::parameters) does not list it).
/// [`Module::named_buffers`](super::Module::named_buffers) lists the buffers,
/// and [`Module::state_dict`](super::Module::state_dict) and the checkpoints
/// save them after the parameters.
///
/// ```
/// use fucina::nn::Buffer;
/// use fucina::ExecContext;
///
/// let ctx = ExecContext::new();
/// let b = Buffer::from_slice(&ctx, &[2], &[0.0, 1.0])?;
/// let same = b.clone();
/// same.update_(|v| v[0] = 3.0)?;
/// assert_eq!(b.to_vec(), [3.0, 1.0]);
/// assert!(!b.tensor().requires_grad());
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<RwLock<Tensor>>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Buffer").field(&*self.inner.read()).finish()
    }
}

impl Buffer {
    /// A buffer over `t` (detached: it holds the values, not a graph).
    pub fn new(t: Tensor) -> Buffer {
        Buffer {
            inner: Arc::new(RwLock::new(t.detach())),
        }
    }

    /// A buffer holding a pooled copy of `values`.
    ///
    /// # Errors
    /// The shape and length errors of `ExecContext::from_slice`.
    pub fn from_slice(ctx: &ExecContext, shape: &[usize], values: &[f32]) -> Result<Buffer> {
        Ok(Buffer::new(Tensor::from_slice(ctx, shape, values)?))
    }

    /// The current value as a constant tensor (sharing the storage: an
    /// update after this call copies rather than changes what it holds).
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

    /// Whether `self` and `other` are handles to the same buffer.
    pub fn ptr_eq(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Runs `f` over the values in place (copy-on-write when a tensor from
    /// [`tensor`](Buffer::tensor) or a state dict still shares the storage).
    /// `f` must not use this same buffer (it holds the buffer's lock).
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
                "Buffer::copy_from_slice",
                format!("{} values for a buffer of {n} elements", values.len()),
            ));
        }
        self.update_(|w| w.copy_from_slice(values))
    }
}
