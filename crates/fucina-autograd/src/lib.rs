//! # fucina-autograd
//!
//! Reverse-mode automatic differentiation over `fucina-exec`: the differentiable
//! [`Tensor`] (a [`RawTensor`](fucina_exec::RawTensor) plus optional gradient
//! state), refcounted graph nodes numbered in creation order, an iterative
//! [`backward`](Tensor::backward) (no recursion, any depth), exec-scope adoption of
//! op results, [`no_grad`], [`custom_vjp`] and a finite-difference [`gradcheck`].
//!
//! ```
//! use fucina_autograd::Tensor;
//! use fucina_autograd::exec::ExecContext;
//!
//! let ctx = ExecContext::new();
//! let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
//! for _ in 0..2 {
//!     let scope = ctx.open_exec_scope();
//!     let y = w.mul(&ctx, &w)?; // adopted by the scope
//!     let loss = y.sum_all(&ctx)?;
//!     loss.backward(&ctx)?;
//!     let gw = w.grad(&ctx)?.expect("w is a variable"); // caller-owned
//!     assert_eq!(gw.to_vec(), [2., 4., 6.]);
//!     w.zero_grad();
//!     ctx.close_exec_scope(scope);
//! }
//! # Ok::<(), fucina_autograd::AutogradError>(())
//! ```
//!
//! It is a layer over `fucina-exec` and depends on nothing else of the workspace.
//! See `docs/AUTOGRAD.md` in the repository for the gradient model, scopes versus
//! drop-as-you-go, custom VJPs and gradcheck.
#![forbid(unsafe_code)]

mod autocast;
mod custom;
mod error;
mod fill;
mod grad_mode;
mod gradcheck;
mod node;
mod ops;
mod record;
mod tensor;

pub use autocast::{AutocastGuard, autocast_bf16, is_autocast_bf16};
pub use custom::{CustomGradArgs, CustomVjpArgs, custom_vjp, custom_vjp_unsaved};
pub use error::{AutogradError, ExternalError, Result};
pub use grad_mode::{NoGradGuard, is_grad_enabled, no_grad};
pub use gradcheck::{GradcheckMismatch, GradcheckOptions, GradcheckResult, gradcheck};
pub use node::{BackwardOptions, free_graph_nodes};
pub use ops::einsum::einsum;
pub use record::Grads;
pub use tensor::Tensor;

/// The option and result types of the convolutional-network ops, re-exported
/// from the exec layer.
pub use fucina_exec::{BatchNormStats, GroupNormOptions, Pool1dOptions, Pool2dOp, Pool2dOptions};
/// The options of [`Tensor::pad`] and [`Tensor::interpolate`].
pub use fucina_exec::{InterpolateMode, InterpolateOptions, PadMode, PadOptions};

/// The exec layer this crate is built on.
pub use fucina_exec as exec;
/// The convolution options (`Tensor::conv1d`, `Tensor::conv2d`), from the exec layer.
pub use fucina_exec::{Conv1dOptions, Conv2dOptions};
/// The transposed-convolution options (`Tensor::conv_transpose1d`,
/// `Tensor::conv_transpose2d`), from the exec layer.
pub use fucina_exec::{ConvTranspose1dOptions, ConvTranspose2dOptions};

#[cfg(test)]
mod static_checks {
    use super::*;
    static_assertions::assert_impl_all!(Tensor: Send, Sync, Clone);
    static_assertions::assert_not_impl_any!(NoGradGuard: Send, Sync);
    static_assertions::assert_not_impl_any!(AutocastGuard: Send, Sync);
    static_assertions::assert_impl_all!(AutogradError: Send, Sync, std::error::Error);
    static_assertions::assert_not_impl_any!(exec::ExecContext: Sync);
}
