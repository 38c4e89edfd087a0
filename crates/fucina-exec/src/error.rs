//! The crate's one error type.

use fucina_fpenv::Environment;
use fucina_storage::{DType, StorageError};

use crate::tensor::layout::Dims;

/// Everything an [`ExecContext`](crate::ExecContext) operation can refuse.
///
/// Every variant names the operation (`op`) and the shape, length, index or dtype
/// that was wrong. Bad input is always an `Err`, never a panic, and an op that
/// fails changes nothing (its operands are untouched, no output is half-written).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// Rank 0 or above 8, or a zero dimension, or a shape an op cannot accept.
    #[error("{op}: invalid shape {shape}: {reason}")]
    InvalidShape {
        /// The operation.
        op: &'static str,
        /// The offending shape.
        shape: Dims,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The element count of a shape does not fit in `usize`.
    #[error("{op}: the element count of shape {shape} overflows usize")]
    Overflow {
        /// The operation.
        op: &'static str,
        /// The offending shape.
        shape: Dims,
    },
    /// A data slice's length does not match the shape's element count (checked before
    /// anything is allocated), or a view does not fit its storage.
    #[error("{op}: data length {got} does not match shape {shape}, which needs {expected}")]
    InvalidDataLength {
        /// The operation.
        op: &'static str,
        /// The shape the data was for.
        shape: Dims,
        /// The length the shape needs.
        expected: usize,
        /// The length that was given.
        got: usize,
    },
    /// Two operands' shapes are incompatible.
    #[error("{op}: shapes {lhs} and {rhs} are incompatible: {reason}")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// The first shape.
        lhs: Dims,
        /// The second shape.
        rhs: Dims,
        /// Why they do not fit.
        reason: &'static str,
    },
    /// An axis is outside `-rank..rank` (negative axes count from the end; see
    /// [`Axis`](crate::Axis)).
    #[error("{op}: axis {axis} is out of range for rank {rank}")]
    InvalidAxis {
        /// The operation.
        op: &'static str,
        /// The axis as given (negative if it was; a `usize` above `i64::MAX`
        /// reads as `i64::MAX`).
        axis: i64,
        /// The operand's rank.
        rank: usize,
    },
    /// A view cannot be expressed over the operand's layout (e.g. `reshape` of a
    /// non-contiguous tensor, or contiguous data access to a strided view).
    #[error("{op}: unsupported view: {reason}")]
    UnsupportedView {
        /// The operation.
        op: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// An index (or a label) is outside `0..bound`.
    #[error("{op}: index {index} is out of bounds for size {bound}")]
    IndexOutOfBounds {
        /// The operation.
        op: &'static str,
        /// The index that was given.
        index: i64,
        /// The exclusive upper bound.
        bound: usize,
    },
    /// A scalar argument is outside its domain (a dropout probability, a `k`...).
    #[error("{op}: invalid argument: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// An op's option has a value outside its domain, or one that does not fit
    /// the operands (a stride of 0, a group count that does not divide the
    /// channels).
    #[error("{op}: {name} = {value} is invalid: {reason}")]
    InvalidOption {
        /// The operation.
        op: &'static str,
        /// The option (`"stride[1]"`, `"groups"`, ...).
        name: &'static str,
        /// The value that was given.
        value: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A signed option (a pad width, negative to crop) does not fit the
    /// operand.
    #[error("{op}: {name} = {value} is invalid: {reason}")]
    InvalidSignedOption {
        /// The operation.
        op: &'static str,
        /// The option (`"pads[0]"`, ...).
        name: &'static str,
        /// The value that was given.
        value: isize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The buffer pool could not provide the memory.
    #[error("{op}: out of memory: {source}")]
    OutOfMemory {
        /// The operation.
        op: &'static str,
        /// The storage error.
        source: StorageError,
    },
    /// The calling thread's float environment differs from the one recorded when
    /// the context was created.
    #[error(
        "the float environment changed since the context was created: at init {at_init:?}, now {now:?}"
    )]
    FloatEnvironmentChanged {
        /// The environment recorded at creation.
        at_init: Environment,
        /// The environment now.
        now: Environment,
    },
    /// Pooled buffers of this context were still alive when it was closed.
    #[error("{count} pooled buffer(s) of this context were still alive at close")]
    LeakedBuffers {
        /// How many.
        count: usize,
    },
    /// A storage-consuming op was given an operand owned by an exec scope.
    #[error("{op}: the operand is owned by an open exec scope and cannot be consumed")]
    ActiveExecScopeUnsupported {
        /// The operation.
        op: &'static str,
    },
    /// A right-hand side marked `RhsLifetime::StableProcess` lives in pooled storage,
    /// whose addresses are recycled.
    #[error("{op}: pooled storage cannot be marked RhsLifetime::StableProcess")]
    UnstableRhs {
        /// The operation.
        op: &'static str,
    },
    /// An operand has the wrong dtype.
    #[error("{op}: expected dtype {expected}, got {got}")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// The dtype the op needs.
        expected: DType,
        /// The dtype it was given.
        got: DType,
    },
}

impl ExecError {
    /// Maps a storage error of a pool acquire in `op`.
    pub(crate) fn storage(op: &'static str, e: StorageError) -> ExecError {
        ExecError::OutOfMemory { op, source: e }
    }
}
