//! bf16 autocast: a thread-local scope in which the matrix products and
//! convolutions (transposed ones included) take bf16-rounded operands with f32 accumulation.

use std::cell::Cell;
use std::marker::PhantomData;

use fucina_exec::{ExecContext, RawTensor};

use crate::error::Result;

thread_local! {
    static AUTOCAST_BF16_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether an [`autocast_bf16`] scope is open on this thread.
pub fn is_autocast_bf16() -> bool {
    AUTOCAST_BF16_DEPTH.with(|d| d.get() > 0)
}

/// Opens a bf16 autocast scope on this thread, open until the returned guard
/// drops (or is [`close`](AutocastGuard::close)d). Guards nest: the scope
/// stays open until the last one drops, and a guard dropped while a panic
/// unwinds closes its level as well, so a panic inside the scope leaves it
/// off afterwards.
///
/// Inside it, the products [`matmul`](crate::Tensor::matmul),
/// [`linear`](crate::Tensor::linear) and [`product`](crate::Tensor::product),
/// and the convolutions [`conv1d`](crate::Tensor::conv1d),
/// [`conv2d`](crate::Tensor::conv2d),
/// [`conv_transpose1d`](crate::Tensor::conv_transpose1d) and
/// [`conv_transpose2d`](crate::Tensor::conv_transpose2d) (and everything
/// built on them: [`einsum`](crate::einsum), the `fucina::nn` layers
/// `Linear`, `Conv1d`, `Conv2d`, `ConvTranspose1d`, `ConvTranspose2d`, the
/// attention layers, `Lstm` and `Gru`) round both operands — the input and the weight, not
/// the bias — to the nearest bf16 value (ties to even,
/// [`round_to_bf16`](fucina_exec::round_to_bf16)) and run the ordinary f32
/// kernel on the rounded values. The product of two bf16 values is exact in
/// f32, so the only roundings are the f32 accumulation's, in the kernel's
/// fixed order: the result is the same bits at every vector level and thread
/// count, and equals the f32 product of the explicitly rounded inputs.
/// Everything else (elementwise ops, reductions, norms, losses) runs in f32;
/// the tensors themselves — master weights, activations, gradients, optimizer
/// state — stay f32.
///
/// The backward of a product recorded inside the scope uses the same rounded
/// operands (saved by the forward), and the rounding is passed straight
/// through: the gradient with respect to an unrounded input is the gradient
/// of the rounded product with respect to the rounded input (for `y = a · b`,
/// `da = dy · bf16(b)ᵀ`, `db = bf16(a)ᵀ · dy`, with `dy` itself not rounded),
/// as PyTorch's autocast gives. Whether a product is recorded in the scope
/// decides its backward; where `backward` runs does not matter.
///
/// ```
/// use fucina_autograd::{Tensor, autocast_bf16, is_autocast_bf16};
/// use fucina_autograd::exec::{ExecContext, round_to_bf16};
///
/// let ctx = ExecContext::new();
/// let a = Tensor::variable_from_slice(&ctx, &[1, 2], &[1.0 + 2f32.powi(-9), 3.0])?;
/// let b = Tensor::variable_from_slice(&ctx, &[2, 1], &[1.0, 1.0 + 2f32.powi(-10)])?;
/// let exact = a.matmul(&ctx, &b)?.to_vec();
/// {
///     let _bf16 = autocast_bf16();
///     assert!(is_autocast_bf16());
///     let y = a.matmul(&ctx, &b)?;
///     assert_eq!(y.to_vec(), [round_to_bf16(1.0 + 2f32.powi(-9)) + 3.0]);
///     assert_eq!(y.to_vec(), [4.0]);
///     y.sum_all(&ctx)?.backward(&ctx)?;
/// }
/// assert!(!is_autocast_bf16());
/// assert_ne!(exact, [4.0]);
/// // da = dy · bf16(b)ᵀ: the rounded b, 1 + 2^-10 -> 1.
/// assert_eq!(a.grad(&ctx)?.expect("a variable").to_vec(), [1.0, 1.0]);
/// # Ok::<(), fucina_autograd::AutogradError>(())
/// ```
pub fn autocast_bf16() -> AutocastGuard {
    AUTOCAST_BF16_DEPTH.with(|d| d.set(d.get() + 1));
    AutocastGuard {
        _not_send: PhantomData,
    }
}

/// The guard of [`autocast_bf16`]: the scope closes when the last guard of the
/// thread drops. It is neither `Send` nor `Sync` (the scope is per thread).
#[must_use = "the autocast scope closes as soon as the guard is dropped"]
#[derive(Debug)]
pub struct AutocastGuard {
    _not_send: PhantomData<*const ()>,
}

impl AutocastGuard {
    /// Ends this guard now (the same as dropping it).
    pub fn close(self) {}
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        AUTOCAST_BF16_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// The operands a product runs on: `a` and `b` rounded to bf16 inside an
/// autocast scope, else themselves.
pub(crate) fn product_operands(
    ctx: &ExecContext,
    a: &RawTensor,
    b: &RawTensor,
) -> Result<(RawTensor, RawTensor)> {
    if is_autocast_bf16() {
        Ok((ctx.round_bf16(a)?, ctx.round_bf16(b)?))
    } else {
        Ok((a.clone(), b.clone()))
    }
}
