//! [`DistError`] and the crate's `Result`.

use fucina::autograd::AutogradError;

/// Everything that can go wrong in `fucina-dist`.
///
/// Errors returned by a collective ([`DataParallel::new`](crate::DataParallel::new),
/// [`save_checkpoint_rank0`](crate::save_checkpoint_rank0),
/// [`load_checkpoint_rank0`](crate::load_checkpoint_rank0)) are returned on **every**
/// rank, so that all ranks leave together; an error of one rank alone (a failing
/// forward pass, say) must end the job through
/// [`World::abort_on_error`](crate::World::abort_on_error), never by returning
/// while the other ranks wait in a collective.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// MPI was already initialized (or finalized) in this process.
    #[error("MPI is already initialized in this process: World::init may be called once")]
    AlreadyInitialized,
    /// A configuration value is out of range (its name and why).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The ranks disagree on the model: parameter count or shapes, or the
    /// data-parallel options (which rank, which parameter, what each has).
    #[error("the ranks disagree on the model: {0}")]
    ShapeMismatch(String),
    /// [`Reduction::Tree`](crate::Reduction::Tree) was asked for with a rank
    /// count the fixed tree cannot be split over (see
    /// [`tree_allows`](crate::tree_allows)): not a power of two, or more ranks
    /// than microbatches.
    #[error(
        "Reduction::Tree cannot split {microbatches} microbatches over {ranks} ranks: it needs \
         a power-of-two rank count no larger than the microbatch count (1, 2, 4, ... up to \
         {microbatches}); run with such a rank count, or use Reduction::Allgather (or Auto), \
         which works for any rank count with the same bits"
    )]
    TreeRankCount {
        /// The rank count of the world.
        ranks: usize,
        /// The microbatches of a step.
        microbatches: usize,
    },
    /// A microbatch was recorded out of the order this rank owns them in.
    #[error(
        "microbatch {got} recorded out of order: this rank owns microbatches {owned:?} \
         and expected {expected:?} next"
    )]
    MicrobatchOrder {
        /// The microbatch index given.
        got: usize,
        /// The next index expected (`None`: all were recorded already).
        expected: Option<usize>,
        /// This rank's microbatch range.
        owned: std::ops::Range<usize>,
    },
    /// [`all_reduce_gradients`](crate::DataParallel::all_reduce_gradients) was
    /// called before every microbatch of this rank was recorded.
    #[error("all_reduce_gradients called after {recorded} of this rank's {owned} microbatches")]
    MissingMicrobatches {
        /// How many were recorded.
        recorded: usize,
        /// How many this rank owns.
        owned: usize,
    },
    /// Writing or reading a checkpoint (or a deprecated parameter dump) failed,
    /// or the file does not fit the run: the path and the cause (rank 0's
    /// message for a collective call whose rank 0 failed).
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
    /// An error of the autograd or exec layer.
    #[error(transparent)]
    Autograd(#[from] AutogradError),
}

/// `Result` with [`DistError`].
pub type Result<T, E = DistError> = std::result::Result<T, E>;

/// A facade error (what `fucina::nn` layers, optimizers and checkpoints
/// return) from a microbatch closure: it becomes [`DistError::Autograd`] with
/// the same message (the autograd and exec layers' errors come back as
/// themselves, every other one travels inside `AutogradError::External`).
impl From<fucina::Error> for DistError {
    fn from(e: fucina::Error) -> DistError {
        DistError::Autograd(AutogradError::from(e))
    }
}
