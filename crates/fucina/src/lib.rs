//! # fucina
//!
//! An eager CPU tensor runtime with autograd, built for speed close to the
//! hardware limit, bitwise determinism and predictable memory behaviour. This
//! facade gathers the layers below it and adds what a training program needs:
//! layers ([`nn`]), optimizers ([`optim`]), one error type ([`Error`]) and a
//! [`prelude`].
//!
//! The main job, a digit classifier trained on the 8x8 handwritten digits shipped
//! in the repository (progress bar, test accuracy, pool and allocation
//! statistics, loss curve): `cargo run --release -p fucina --example train_digits`.
//! `docs/GUIDE.md` in the repository is the user guide.
//!
//! A complete training loop (a two-layer MLP learning XOR):
//!
//! ```
//! use fucina::prelude::*;
//!
//! let ctx = ExecContext::new();
//! let (fc1, fc2) = (Linear::new(&ctx, 2, 16, 1)?, Linear::new(&ctx, 16, 2, 2)?);
//! let mut params = fc1.parameters();
//! params.extend(fc2.parameters());
//! let mut opt = AdamW::new(params, AdamWConfig { lr: 0.05, ..AdamWConfig::default() })?;
//! let x = Tensor::from_slice(&ctx, &[4, 2], &[0., 0., 0., 1., 1., 0., 1., 1.])?;
//! let labels = ctx.from_slice_typed::<i64>(&[4], &[0, 1, 1, 0])?;
//! for _ in 0..200 {
//!     let logits = fc2.forward(&ctx, &fc1.forward(&ctx, &x)?.relu(&ctx)?)?;
//!     let loss = logits.cross_entropy(&ctx, &labels)?;
//!     loss.backward(&ctx)?;
//!     opt.step(&ctx)?;
//!     opt.zero_grad();
//! }
//! # let logits = fc2.forward(&ctx, &fc1.forward(&ctx, &x)?.relu(&ctx)?)?;
//! # assert_eq!(logits.argmax(&ctx, 1, false)?.to_vec(), [0, 1, 1, 0]);
//! # Ok::<(), fucina::Error>(())
//! ```
//!
//! | module | crate | what it holds |
//! | --- | --- | --- |
//! | [`nn`] | `fucina` | layers, [`nn::Parameter`], [`nn::Module`] |
//! | [`optim`] | `fucina` | SGD, Adam, AdamW, clipping, schedules |
//! | [`autograd`] | `fucina-autograd` | the differentiable [`Tensor`], `no_grad`, custom VJPs, gradcheck |
//! | [`exec`] | `fucina-exec` | [`ExecContext`], raw tensors, kernels, buffer pool, exec scopes |
//! | [`thread`] | `fucina-thread` | the fork-join worker team |
//! | [`storage`] | `fucina-storage` | aligned, counted, refcounted, pooled memory |
//! | [`fpenv`] | `fucina-fpenv` | IEEE floating-point environment control |
//! | [`rng`] | `fucina-rng` | the deterministic splitmix64 RNG and its fills |
//!
//! Every crate is usable alone; this one only re-exports them and builds on
//! their public APIs.
#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod data;
mod error;
pub mod nn;
pub mod optim;

pub use error::{Error, Result};

pub use fucina_autograd as autograd;
pub use fucina_exec as exec;
pub use fucina_fpenv as fpenv;
pub use fucina_rng as rng;
pub use fucina_storage as storage;
pub use fucina_thread as thread;

pub use fucina_autograd::{NoGradGuard, Tensor, is_grad_enabled, no_grad};
pub use fucina_exec::{ExecContext, RawTensor};

/// The names a training program uses, for `use fucina::prelude::*`.
pub mod prelude {
    pub use crate::nn::{
        Block, CausalSelfAttention, Dropout, Embedding, Forward, Gelu, LayerNorm, Linear, Module,
        Parameter, Relu, RmsNorm, Sequential, StateDict,
    };
    pub use crate::optim::{
        Adam, AdamConfig, AdamW, AdamWConfig, Optimizer, ParamGroup, Sgd, SgdConfig, WarmupCosine,
        clip_grad_norm, decay_groups,
    };
    pub use crate::{Error, ExecContext, RawTensor, Result, Tensor, no_grad};
}

#[cfg(test)]
mod static_checks {
    use super::*;
    static_assertions::assert_impl_all!(Error: Send, Sync, std::error::Error);
    // Small enough that `Result<T>` stays cheap (and clippy's `result_large_err`
    // quiet in user code).
    static_assertions::const_assert!(std::mem::size_of::<Error>() <= 80);
    static_assertions::assert_impl_all!(nn::Parameter: Send, Sync, Clone);
    static_assertions::assert_impl_all!(nn::Sequential: Send, Sync);
    static_assertions::assert_impl_all!(optim::AdamW: Send, Sync);
}
