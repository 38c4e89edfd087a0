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
//! | [`nn`] | `fucina` | layers (dense, convolutional, normalization, pooling, attention), [`nn::Parameter`], [`nn::Buffer`], [`nn::Module`] |
//! | [`optim`] | `fucina` | SGD, Adam, AdamW, clipping, schedules |
//! | [`checkpoint`] | `fucina` | safetensors checkpoints: named tensors and metadata |
//! | [`data`] | `fucina` | the shipped data sets, the IDX reader (MNIST-style sets), the [`data::DataLoader`] |
//! | [`diag`] | `fucina` | [`memory_stats`], [`diag::CountingAllocator`] |
//! | [`sample`] | `fucina` | seeded sampling from tensors: [`sample::multinomial`] |
//! | [`autograd`] | `fucina-autograd` | the differentiable [`Tensor`], [`no_grad`], [`custom_vjp`], [`gradcheck`] |
//! | [`exec`] | `fucina-exec` | [`ExecContext`], [`RawTensor`], the raw ops, exec scopes |
//! | [`thread`] | `fucina-thread` | the fork-join worker [`Team`], [`Team::parallel_reduce`] |
//! | [`storage`] | `fucina-storage` | aligned, counted, refcounted, pooled memory, [`PoolStats`] |
//! | [`fpenv`] | `fucina-fpenv` | IEEE floating-point environment control |
//! | [`rng`] | `fucina-rng` | the deterministic splitmix64 RNG, its fills ([`rng::gaussian_fill`], [`rng::uniform_fill`], ...) and [`rng::categorical`] |
//!
//! Every crate is usable alone; this one re-exports them (their items are
//! documented here, under the modules above, so `cargo doc -p fucina
//! --no-deps` is the whole manual) and builds on their public APIs. The
//! items a training program names most are also at the top level:
//! [`Tensor`], [`ExecContext`], [`custom_vjp`], [`gradcheck`], [`Team`],
//! [`PoolStats`], [`memory_stats`], [`Error`].
//!
//! # Errors
//!
//! [`Error`] is the one error type of the facade: every layer's error converts
//! into it with `?`. The other way round, a facade error converts into an
//! [`AutogradError`] (the errors of the autograd and exec layers as themselves,
//! the others whole inside [`AutogradError::External`]), so the closures of
//! [`custom_vjp`] may call layers with `?`, and [`gradcheck`] takes closures
//! that return either error type:
//!
//! ```
//! use fucina::nn::Linear;
//! use fucina::{ExecContext, GradcheckOptions, gradcheck};
//!
//! let ctx = ExecContext::new();
//! let layer = Linear::new(&ctx, 3, 2, 7)?;
//! let x = ctx.from_slice(&[2, 3], &[0.1, -0.4, 0.9, 1.3, -1.1, 0.5])?;
//! let r = gradcheck(&ctx, |ctx, t| layer.forward(ctx, &t[0]), &[x], &GradcheckOptions::default())?;
//! assert!(r.passed, "{r:?}");
//! # Ok::<(), fucina::Error>(())
//! ```
//!
//! # Reading these docs
//!
//! `cargo doc -p fucina --no-deps --open` builds and opens them; CI builds them
//! with every warning and broken link an error.
// `unsafe` only in `diag` (the counting global allocator), with its SAFETY
// comments; everywhere else it is an error.
#![deny(unsafe_code)]

pub mod checkpoint;
mod convert;
pub mod data;
pub mod diag;
mod error;
pub mod nn;
pub mod optim;
pub mod safetensors_header;
pub mod sample;

pub use diag::{MemoryStats, MemoryStatsExt, memory_stats};
pub use error::{Error, Result};

/// Reverse-mode automatic differentiation (the `fucina-autograd` crate): the
/// differentiable [`Tensor`] (a raw tensor plus optional
/// gradient state), refcounted graph nodes, an iterative
/// [`backward`](autograd::Tensor::backward), [`no_grad`],
/// [`custom_vjp`] and a finite-difference
/// [`gradcheck`]. `docs/AUTOGRAD.md` in the repository
/// describes the gradient model.
pub mod autograd {
    /// The exec layer autograd is built on: the facade's [`exec`].
    pub use crate::exec;
    #[doc(inline)]
    pub use fucina_autograd::*;
}

/// The execution layer (the `fucina-exec` crate): the
/// [`ExecContext`] that owns a buffer pool, a lazily
/// started worker team and the exec-scope stack; the
/// [`RawTensor`] over pooled storage with zero-copy views; the
/// raw ops and the backward kernels autograd calls.
pub mod exec {
    #[doc(inline)]
    pub use fucina_exec::*;
    // The layers below, as the facade's own modules (documented once, there).
    pub use crate::{fpenv, rng, storage, thread};
}

/// The fork-join worker team (the `fucina-thread` crate):
/// [`Team`] with deterministic chunking
/// ([`chunk_ranges`](thread::chunk_ranges)), safe mutable parallelism, a
/// reduction whose bits do not depend on the team size
/// ([`Team::parallel_reduce`](thread::Team::parallel_reduce)), chained
/// dispatch, and the thread-count knobs. `docs/THREADING.md` in the repository
/// describes the team.
pub mod thread {
    #[doc(inline)]
    pub use fucina_thread::*;
}

/// Aligned, counted, refcounted and pooled memory (the `fucina-storage`
/// crate): [`Buffer`](storage::Buffer), the two-tier
/// [`BufferPool`](storage::BufferPool) / [`LocalPool`](storage::LocalPool) and
/// their [`PoolStats`]. `docs/MEMORY.md` in the repository
/// describes the pool.
pub mod storage {
    // Listed, not globbed: a glob would inline the whole `half` crate here.
    /// The `half` crate, re-exported for its `f16` and `bf16` element types
    /// (documented on docs.rs).
    #[doc(hidden)]
    pub use fucina_storage::half;
    #[doc(inline)]
    pub use fucina_storage::{
        ALIGNMENT, AlignedBlock, AllocationStats, Arena, Buffer, BufferPool,
        DEFAULT_LOCAL_MAX_CACHED_BYTES, DEFAULT_MAX_CACHED_BYTES, DType, F32_ROUNDING_THRESHOLD,
        LocalPool, OVERHEAD, PoolStats, SLAB_QUANTUM, Scalar, ScratchLease, StorageError,
        allocation_stats, reset_peak_allocation, round_f32_len, round_slab_bytes,
    };
}

/// IEEE floating-point environment control (the `fucina-fpenv` crate):
/// rounding mode and flush-to-zero, read, set under a guard, and checked.
/// `docs/FPENV.md` in the repository describes it.
pub mod fpenv {
    #[doc(inline)]
    pub use fucina_fpenv::*;
}

/// The deterministic random numbers (the `fucina-rng` crate): splitmix64 with
/// an O(1) counter form ([`at`](rng::at)) and the fills built on it
/// ([`gaussian_fill`](rng::gaussian_fill), [`uniform_fill`](rng::uniform_fill),
/// [`kaiming_uniform_fill`](rng::kaiming_uniform_fill),
/// [`randperm_fill`](rng::randperm_fill), ...), and the categorical sampler
/// ([`categorical`](rng::categorical)). Every `(seed -> values)` mapping is a
/// checkpoint contract: the same seed gives the same bits on any run, thread
/// count and CPU. `docs/DETERMINISM.md` in the repository defines them.
pub mod rng {
    #[doc(inline)]
    pub use fucina_rng::*;
}

#[doc(inline)]
pub use fucina_autograd::{
    AutocastGuard, AutogradError, BackwardOptions, CustomGradArgs, CustomVjpArgs,
    GradcheckMismatch, GradcheckOptions, GradcheckResult, Grads, NoGradGuard, Tensor,
    autocast_bf16, custom_vjp, custom_vjp_unsaved, einsum, free_graph_nodes, gradcheck,
    is_autocast_bf16, is_grad_enabled, no_grad,
};
#[doc(inline)]
pub use fucina_exec::{Axis, ExecContext, ExecError, ExecScope, RawTensor};
#[doc(inline)]
pub use fucina_storage::PoolStats;
#[doc(inline)]
pub use fucina_thread::{Team, TeamOptions};

/// The names a training program uses, for `use fucina::prelude::*`.
pub mod prelude {
    pub use crate::exec::{
        Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions, GroupNormOptions, InterpolateMode,
        PadMode, PadOptions, Pool1dOptions, Pool2dOptions,
    };
    pub use crate::nn::{
        AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Block, Buffer, CausalSelfAttention,
        Conv1d, Conv2d, ConvTranspose2d, Dropout, Embedding, Flatten, Forward, Gelu, GroupNorm,
        Gru, GruCell, Identity, InstanceNorm2d, LayerNorm, Linear, Lstm, LstmCell, MaxPool1d,
        MaxPool2d, Module, MultiheadAttention, Parameter, ReflectionPad2d, Relu, RmsNorm,
        RnnOptions, Sequential, StateDict, TransformerDecoderLayer, TransformerEncoderLayer,
        TransformerOptions, Upsample, ZeroPad2d,
    };
    pub use crate::optim::{
        Adagrad, AdagradConfig, Adam, AdamConfig, AdamW, AdamWConfig, Lion, LionConfig, Optimizer,
        ParamGroup, RmsProp, RmsPropConfig, Sgd, SgdConfig, WarmupCosine, clip_grad_norm,
        decay_groups,
    };
    pub use crate::{Error, ExecContext, RawTensor, Result, Tensor, no_grad};
}

#[cfg(test)]
mod static_checks {
    use super::*;
    static_assertions::assert_impl_all!(Error: Send, Sync, std::error::Error);
    // Small enough that `Result<T>` stays cheap (and clippy's `result_large_err`,
    // at 128 bytes, quiet in user code): the lower layers' errors are boxed (the
    // autograd one is itself small now), and the largest variant is
    // `ShapeMismatch`'s three heap handles.
    #[cfg(target_pointer_width = "64")]
    static_assertions::const_assert!(std::mem::size_of::<Error>() <= 72);
    #[cfg(target_pointer_width = "64")]
    static_assertions::const_assert!(std::mem::size_of::<Result<()>>() <= 72);
    static_assertions::assert_impl_all!(nn::Parameter: Send, Sync, Clone);
    static_assertions::assert_impl_all!(nn::Sequential: Send, Sync);
    static_assertions::assert_impl_all!(optim::AdamW: Send, Sync);
}
