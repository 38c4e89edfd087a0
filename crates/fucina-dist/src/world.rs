//! [`World`]: the MPI communicator of every rank of the job.

use std::fmt::Display;

use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::error::{DistError, Result};

/// Every process of the job (`MPI_COMM_WORLD`): MPI is initialized by
/// [`World::init`] and finalized when the `World` is dropped.
///
/// Only the thread that called `init` talks to MPI (`MPI_THREAD_FUNNELED`); the
/// worker team of an `ExecContext` never does.
pub struct World {
    // Field order: the communicator handle goes before the universe, whose drop
    // finalizes MPI.
    comm: SimpleCommunicator,
    _universe: Universe,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl World {
    /// Initializes MPI and returns the world communicator. A process started
    /// without `mpirun` is a world of one rank (MPI's singleton mode).
    ///
    /// # Errors
    /// [`DistError::AlreadyInitialized`] if MPI was initialized before in this
    /// process (it can be initialized once).
    pub fn init() -> Result<World> {
        let (universe, _threading) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or(DistError::AlreadyInitialized)?;
        let comm = universe.world();
        let rank = usize::try_from(comm.rank()).expect("MPI ranks are non-negative");
        let size = usize::try_from(comm.size()).expect("MPI sizes are positive");
        Ok(World {
            comm,
            _universe: universe,
            rank,
            size,
        })
    }

    /// This process's rank, `0 .. size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether this is rank 0 (the one that prints and writes files).
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// Waits until every rank has called `barrier`.
    pub fn barrier(&self) {
        self.comm.barrier();
    }

    /// Prints `message` to stderr naming this rank, then ends **every** rank of
    /// the job (`MPI_Abort` with exit code 1): `mpirun` kills the others and
    /// says which rank aborted. Use it for an error of this rank alone, which
    /// would otherwise leave the other ranks waiting in a collective forever.
    pub fn abort(&self, message: &str) -> ! {
        // One write, so that mpirun's forwarding does not interleave the line
        // with its own notice.
        let line = format!(
            "fucina-dist: rank {} of {}: {message}; aborting the job\n",
            self.rank, self.size
        );
        let mut err = std::io::stderr().lock();
        let _ = std::io::Write::write_all(&mut err, line.as_bytes());
        let _ = std::io::Write::flush(&mut err);
        drop(err);
        self.comm.abort(1)
    }

    /// The value of `result`, or [`abort`](World::abort) with its error.
    pub fn abort_on_error<T, E: Display>(&self, result: Result<T, E>) -> T {
        match result {
            Ok(v) => v,
            Err(e) => self.abort(&format!("error: {e}")),
        }
    }

    /// The communicator (crate-internal: collectives of this crate).
    pub(crate) fn comm(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// Rank 0's bytes on every rank (`bytes` is read on rank 0, replaced on the
    /// others).
    pub(crate) fn broadcast_bytes(&self, bytes: &mut Vec<u8>) {
        let root = self.comm.process_at_rank(0);
        let mut len = bytes.len() as u64;
        root.broadcast_into(&mut len);
        bytes.resize(usize::try_from(len).expect("length fits in memory"), 0);
        // Open MPI refuses the dangling pointer of an empty slice (MPI_ERR_ARG).
        if !bytes.is_empty() {
            root.broadcast_into(&mut bytes[..]);
        }
    }

    /// Rank 0's `buf` on every rank (every rank passes a buffer of the same
    /// length), in pieces of at most 1 GiB: MPI counts elements in an `int`.
    pub(crate) fn broadcast_slice(&self, buf: &mut [u8]) {
        let root = self.comm.process_at_rank(0);
        for piece in buf.chunks_mut(1 << 30) {
            root.broadcast_into(piece);
        }
    }

    /// Every rank's `value`, in rank order.
    pub(crate) fn all_gather_u64(&self, value: u64) -> Vec<u64> {
        let mut out = vec![0u64; self.size];
        self.comm.all_gather_into(&value, &mut out[..]);
        out
    }
}
