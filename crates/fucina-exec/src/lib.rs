//! # fucina-exec
//!
//! The execution layer of fucina: an [`ExecContext`] that owns a buffer pool, a
//! lazily started worker team and an exec-scope stack; [`RawTensor`], an f32 (or
//! typed) tensor over refcounted pooled storage with an inline layout and zero-copy
//! views; and the raw op surface (elementwise, reductions, softmax, norms, matmul,
//! indexing, losses, dropout, and the backward kernels autograd calls).
//!
//! ```
//! use fucina_exec::ExecContext;
//!
//! let ctx = ExecContext::new();
//! let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
//! let b = ctx.from_slice(&[3], &[10., 20., 30.])?;
//! let y = ctx.add(&x, &b)?; // numpy broadcasting
//! assert_eq!(y.to_vec(), [11., 22., 33., 14., 25., 36.]);
//! # Ok::<(), fucina_exec::ExecError>(())
//! ```
//!
//! ## Guarantees
//! - **Errors, not panics.** Every op returns `Result<_, ExecError>`; a wrong shape,
//!   length, axis or index is an `Err` naming the op and the value, and nothing is
//!   half-written.
//! - **Determinism.** Every op's output is bitwise identical for every team size
//!   (outputs are written by exactly one chunk; reductions combine fixed blocks in a
//!   fixed order) and for every batch size (a row's result never depends on the
//!   other rows).
//! - **No allocation at steady state.** Tensor headers are inline (rank <= 8), op
//!   outputs come from the context's pool, and the parallel dispatch allocates
//!   nothing.
//! - **Threads.** A context is `Send + !Sync` (one driving thread at a time);
//!   tensors are `Send + Sync`.
//! - **Failure.** Memory is taken fallibly (a huge broadcast view's copy is
//!   `OutOfMemory`, never an abort; see [`RawTensor::try_to_vec`]); an exec scope's
//!   token closes its scope when dropped, so `?` or a panic never leaves one open;
//!   dropping a context before its tensors is safe and silent
//!   ([`ExecContext::close`] reports what is still alive).
//!
//! See `docs/RUNTIME.md` in the repository for the lifecycle, ownership and scope
//! rules with examples.

// `ExecError` carries inline shapes (no heap on the error path), which makes it as
// large as the `RawTensor` in the `Ok` arm (also an inline layout): boxing it would
// not shrink `Result<RawTensor, ExecError>` and would allocate on every error.
#![allow(clippy::result_large_err)]

mod axis;
mod context;
mod error;
mod kernels;
mod memory;
mod ops;
mod parallel;
mod rhs_cache;
mod scope;
mod scope_stack;
mod tensor;
mod weight_format;

pub use axis::Axis;

/// Scalar math with the same bits on every machine and at every vector level
/// (a fixed sequence of IEEE operations, no C library call, no fused
/// multiply-add), for code above this crate that needs the runtime's own
/// functions (a sampler's weights, an inference engine's softmax).
pub mod math {
    pub use crate::kernels::math::exp;
    pub use crate::kernels::reduce::fold_lanes;
}
pub use context::{ExecContext, MAX_THREADS, PARALLEL_THRESHOLD};
pub use error::ExecError;
pub use kernels::simd::{
    CpuFeatures, SimdLevel, detected_simd_level, force_simd_level, simd_level,
};
#[cfg(target_arch = "x86_64")]
pub use kernels::simd::{with_avx2, with_avx512};
pub use ops::bf16_matmul::{
    PackedBf16Matrix, amx_available, amx_rule_path, amx_rule_path_for, force_amx,
    set_amx_rule_min_rows,
};
pub use ops::bf16_round::round_to_bf16;
pub use ops::common::BatchNormStats;
pub use ops::conv::{Conv1dOptions, Conv2dOptions};
pub use ops::conv_transpose::{ConvTranspose1dOptions, ConvTranspose2dOptions};
pub use ops::elementwise::{BinaryOp, CompareOp, MaskOp, ScalarOp, UnaryOp};
pub use ops::gather::IndexOp;
pub use ops::group_norm::GroupNormOptions;
pub use ops::grouped_matmul::{GroupedList, GroupedProduct, GroupedScratch, GroupedWeight};
pub use ops::interpolate::{InterpolateMode, InterpolateOptions};
pub use ops::join::JoinOp;
pub use ops::loss::{ClassLoss, RegressionLoss};
pub use ops::matmul::{MatmulOptions, ProductGrads, ProductOp, RhsLifetime};
pub use ops::norm::NormOp;
pub use ops::pad::{PadMode, PadOptions};
pub use ops::pool::{Pool1dOptions, Pool2dOp, Pool2dOptions};
pub use ops::quant_format::{
    FORMATS, FormatRow, QuantFormat, Storage, TensorFormat, UnknownFormatName,
};
pub use ops::quant_matrix::{QuantMatrix, QuantizedWeights};
pub use ops::quant_packed::PackedQuantMatrix;
pub use ops::reduce::{AxisReduction, AxisStatistic, FullReduction};
pub use ops::softmax::SoftmaxOp;
pub use ops::view::ViewOp;
pub use scope::{ExecScope, ScopeNode};
pub use tensor::layout::{Dims, Layout, LayoutClass, MAX_RANK, broadcast_shapes};
pub use tensor::{Element, RawTensor};
pub use weight_format::{WEIGHT_DOT_LANES, WeightFormat, WeightMatrix};

/// The lower layers, re-exported for users of the exec layer alone.
pub use fucina_fpenv as fpenv;
pub use fucina_rng as rng;
pub use fucina_storage as storage;
pub use fucina_thread as thread;

#[cfg(test)]
mod static_checks {
    use super::*;
    static_assertions::assert_impl_all!(ExecContext: Send);
    static_assertions::assert_not_impl_any!(ExecContext: Sync);
    static_assertions::assert_impl_all!(RawTensor: Send, Sync, Clone);
    static_assertions::assert_impl_all!(RawTensor<i64>: Send, Sync, Clone);
    static_assertions::assert_impl_all!(ExecError: Send, Sync, std::error::Error);
    static_assertions::assert_impl_all!(ScopeNode: Send, Sync);
}
