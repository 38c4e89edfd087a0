//! The crate's one error type.

use std::sync::Arc;

use fucina_exec::{Dims, ExecError};

/// Everything an autograd operation can refuse.
///
/// Errors of the exec layer (a wrong shape, axis, index, out of memory, a
/// scope-owned operand given to a storage-consuming op) arrive wrapped in
/// [`AutogradError::Exec`]; the other variants are the autograd layer's own.
///
/// The variants that carry shapes hold them boxed, so the error is small (40
/// bytes on 64-bit targets): a `Result<T, AutogradError>` stays cheap to
/// return, and clippy's `result_large_err` stays quiet in user code that
/// returns one (a custom VJP's closures). Match the exec layer's error with
/// `AutogradError::Exec(e)` and `*e`, or with [`AutogradError::as_exec`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AutogradError {
    /// An error of the exec layer (the op and the offending value are named in it).
    #[error(transparent)]
    Exec(Box<ExecError>),
    /// `backward` was called on a tensor that records no graph (a constant, a
    /// detached tensor, or a result computed under `no_grad`).
    #[error(
        "{op}: the tensor has no gradient graph (it is a constant, detached, or was computed under no_grad)"
    )]
    NoGradientGraph {
        /// The operation.
        op: &'static str,
    },
    /// `backward` without an output gradient on a tensor with more than one
    /// element: pass the seed with `backward_with_grad`.
    #[error(
        "backward: the output has shape {shape}, not one element; pass its gradient with backward_with_grad"
    )]
    NonScalarLoss {
        /// The shape of the output.
        shape: Box<Dims>,
    },
    /// A gradient (a seed, or one returned by a custom backward) does not have the
    /// shape of the tensor it belongs to.
    #[error("{op}: gradient of shape {got} for a tensor of shape {expected}")]
    GradientShapeMismatch {
        /// The operation.
        op: &'static str,
        /// The shape of the tensor.
        expected: Box<Dims>,
        /// The shape of the gradient that was given.
        got: Box<Dims>,
    },
    /// A custom backward returned a number of gradients different from the number
    /// of inputs.
    #[error("{op}: the backward returned {got} gradients for {expected} inputs")]
    GradientCountMismatch {
        /// The operation.
        op: &'static str,
        /// The number of inputs.
        expected: usize,
        /// The number of gradients returned.
        got: usize,
    },
    /// The graph was already consumed by an earlier `backward` (its saved
    /// tensors are released). Use `BackwardOptions { retain_graph: true, ..BackwardOptions::default() }` on the
    /// earlier call to run backward more than once.
    #[error(
        "backward: the graph was already consumed by an earlier backward (retain it with BackwardOptions::retain_graph)"
    )]
    BackwardAlreadyRun,
    /// A custom op's forward failed with a message of its own.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// An [`einsum`](crate::einsum) spec that cannot be applied to its
    /// operands: a malformed spec, an output letter that is repeated or not
    /// among the inputs, an operand count other than one or two, a letter
    /// count that is not an operand's rank, or a letter whose sizes differ.
    #[error("einsum \"{spec}\": {reason}")]
    Einsum {
        /// The spec as given.
        spec: Box<str>,
        /// What is wrong (naming the letter or operand).
        reason: Box<str>,
    },
    /// An error of another type returned by user code that runs inside the
    /// autograd layer (a custom VJP's closures, for example an error of the
    /// `fucina` facade), kept whole: its message and source chain are shown
    /// as they are.
    #[error(transparent)]
    External(ExternalError),
}

impl From<ExecError> for AutogradError {
    fn from(e: ExecError) -> AutogradError {
        AutogradError::Exec(Box::new(e))
    }
}

impl AutogradError {
    /// The exec layer's error inside, if this is one.
    pub fn as_exec(&self) -> Option<&ExecError> {
        match self {
            AutogradError::Exec(e) => Some(e),
            _ => None,
        }
    }
}

/// An error of another type carried by [`AutogradError::External`]: shared,
/// so the autograd error stays `Clone`. Its message and source are those of the
/// error inside; two of them are equal when they share that error.
#[derive(Debug, Clone)]
pub struct ExternalError(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl ExternalError {
    /// Wraps `e`.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> ExternalError {
        ExternalError(Arc::new(e))
    }

    /// The error inside (downcast it with `downcast_ref` to recover its type).
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl std::fmt::Display for ExternalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for ExternalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for ExternalError {
    fn eq(&self, other: &ExternalError) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The result type of this crate.
pub type Result<T, E = AutogradError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    // Small enough that clippy's `result_large_err` (128 bytes) stays quiet in
    // user code returning `Result<_, AutogradError>`, with room to spare: the
    // shapes and the exec layer's error are boxed.
    #[cfg(target_pointer_width = "64")]
    static_assertions::const_assert!(std::mem::size_of::<AutogradError>() <= 40);

    #[test]
    fn the_error_is_small_and_its_messages_are_unchanged() {
        #[cfg(target_pointer_width = "64")]
        assert_eq!(std::mem::size_of::<AutogradError>(), 40);
        let d = |v: &[usize]| Box::new(Dims::new(v));
        let cases = [
            (
                AutogradError::NonScalarLoss { shape: d(&[2, 3]) },
                "backward: the output has shape [2, 3], not one element; pass its gradient with backward_with_grad",
            ),
            (
                AutogradError::GradientShapeMismatch {
                    op: "set_grad",
                    expected: d(&[4]),
                    got: d(&[2, 2]),
                },
                "set_grad: gradient of shape [2, 2] for a tensor of shape [4]",
            ),
            (
                AutogradError::from(ExecError::Overflow {
                    op: "full",
                    shape: Dims::new(&[usize::MAX, 2]),
                }),
                "full: the element count of shape [18446744073709551615, 2] overflows usize",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.to_string(), want);
        }
        let e = AutogradError::from(ExecError::LeakedBuffers { count: 1 });
        assert_eq!(e.as_exec(), Some(&ExecError::LeakedBuffers { count: 1 }));
        assert!(std::error::Error::source(&e).is_none());
        assert_eq!(AutogradError::BackwardAlreadyRun.as_exec(), None);
    }
}
