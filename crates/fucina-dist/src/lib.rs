//! # fucina-dist
//!
//! Data-parallel training over MPI (Open MPI through the `mpi` crate) whose
//! results are **bitwise the same for any number of ranks**, and the same as a
//! single-process run of the same microbatch split.
//!
//! - [`World`]: MPI's world communicator (`init`, `rank`, `size`, `barrier`,
//!   `abort`, `abort_on_error`).
//! - [`DataParallel`]: a model's parameters replicated over the ranks (rank 0's
//!   values broadcast, shapes checked on every rank), and a gradient exchange in
//!   size-bounded buckets that sums every microbatch's partial gradient in one
//!   fixed binary tree over microbatch indices ([`Reduction::Tree`]: each rank
//!   sums its own subtree, then a reduce-scatter and an allgather of slices,
//!   ring all-reduce volume; or [`Reduction::Allgather`], any rank count).
//! - [`LocalDataParallel`]: the same microbatch split in one process, without
//!   MPI: the reference the multi-rank runs match bit for bit.
//! - [`ShardedSampler`]: which samples each microbatch holds (a seed-derived
//!   permutation per epoch) and which microbatches are this rank's.
//! - [`save_checkpoint_rank0`] and [`load_checkpoint_rank0`]: training
//!   checkpoints (parameters, optimizer state, the run's position) through
//!   `fucina::checkpoint`, written by rank 0 behind a barrier, and resumable on
//!   any rank count or in one process ([`save_checkpoint`], [`load_checkpoint`]).
//!
//! A training step with microbatch closures (runs under `mpirun -np N`; a
//! process started without `mpirun` is a world of one rank):
//!
//! ```no_run
//! use fucina::nn::{Linear, Module};
//! use fucina::optim::Sgd;
//! use fucina::{ExecContext, Tensor};
//! use fucina_dist::{DataParallel, DataParallelOptions, World};
//!
//! let world = World::init()?;
//! let ctx = ExecContext::new();
//! let fc = Linear::new(&ctx, 4, 1, 7)?;
//! let mut opt = Sgd::new(fc.parameters(), 0.1)?;
//! let opts = DataParallelOptions { microbatches: 4, ..Default::default() };
//! // rank 0's values replace every other rank's, in `fc` itself
//! let mut dp = DataParallel::new(&world, fc.parameters(), opts)?;
//! let x = Tensor::from_slice(&ctx, &[4, 4], &[0.5; 16])?;
//! let out = dp.step(&ctx, |ctx, _params, m| {
//!     // microbatch m's forward (through the layer) and backward; its loss
//!     let y = fc.forward(ctx, &x)?.scale(ctx, (m + 1) as f32)?;
//!     let loss = y.mean_all(ctx)?;
//!     loss.backward(ctx)?;
//!     Ok::<_, fucina::Error>(loss.item()?)
//! })?;
//! opt.step(&ctx)?; // the same update on every rank
//! if world.is_root() {
//!     println!("loss {}", out.value);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See `docs/DISTRIBUTED.md` in the repository for the model, the determinism
//! argument and its cost, and how to run on several machines.
#![forbid(unsafe_code)]

mod checkpoint;
mod dp;
mod error;
mod reduce;
mod sampler;
mod tree;
mod world;

pub use checkpoint::{
    METADATA_PREFIX, Resumed, TrainPosition, load_checkpoint, load_checkpoint_rank0,
    save_checkpoint, save_checkpoint_rank0,
};
#[allow(deprecated)]
pub use checkpoint::{read_params, save_params_rank0, write_params};
pub use dp::{DataParallel, DataParallelOptions, Reduction};
pub use error::{DistError, Result};
pub use reduce::{DistParam, LocalDataParallel, StepOutput, shard_range};
pub use sampler::ShardedSampler;
pub use tree::tree_allows;
pub use world::World;

/// FNV-1a (64-bit) over the little-endian bits of every element of `params`,
/// in order: a fingerprint of a model's exact values.
///
/// ```
/// use fucina::autograd::Tensor;
/// use fucina::exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let a = Tensor::from_slice(&ctx, &[2], &[1.0, 2.0])?;
/// let b = Tensor::from_slice(&ctx, &[2], &[1.0, 2.0000002])?;
/// assert_ne!(fucina_dist::params_hash(&[a.clone()]), fucina_dist::params_hash(&[b]));
/// assert_eq!(fucina_dist::params_hash(&[a.clone()]), fucina_dist::params_hash(&[a]));
/// # Ok::<(), fucina::autograd::AutogradError>(())
/// ```
pub fn params_hash(params: &[fucina::autograd::Tensor]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in params {
        for v in p.to_vec() {
            for byte in v.to_bits().to_le_bytes() {
                h ^= u64::from(byte);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    h
}
