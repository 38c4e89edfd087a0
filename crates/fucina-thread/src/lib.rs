//! fucina-thread: a persistent spin-then-park fork-join team with
//! deterministic chunking, for CPU kernels that need to split work across cores
//! with a dispatch cost close to one cache-line round trip.
//!
//! # The team
//!
//! A [`Team`] is participant 0 (the thread that calls it) plus a fixed set of
//! worker threads, started lazily on the first parallel call and joined when
//! the team is dropped. Between dispatches a worker spins on a generation
//! counter for a bounded budget, then parks on a futex, so a dense stream of
//! parallel ops pays atomics instead of system calls while an idle team costs
//! no CPU. The protocol, with its proof sketch, is in `src/team/README.md`.
//!
//! - [`Team::parallel_chunks`] runs one closure per task, each task exactly
//!   once; [`Team::parallel_for`] splits a range with [`chunk_ranges`], whose
//!   boundaries depend only on `(begin, end, grain, threads)`.
//! - Safe mutable parallelism: [`Team::parallel_chunks_mut`] hands each
//!   element of a `&mut [T]` to exactly one task, and
//!   [`Team::parallel_for_slices`] hands each deterministic chunk its range
//!   and the disjoint `&mut` sub-slice it covers. No `Mutex` or raw pointer
//!   is needed to write outputs in parallel.
//! - [`current_participant`] tells a task its participant index (for
//!   per-participant scratch buffers); `None` in a serial run.
//! - [`Team::parallel_reduce`] reduces a range over fixed-size blocks
//!   combined in block order: its bits do not depend on the team size.
//! - [`Team::parallel_chained`] runs a dependency graph: running tasks make
//!   others runnable through [`Chain::enqueue`].
//! - The calls are scoped like `std::thread::scope`: tasks and closures may
//!   borrow the caller's stack, and a dispatch allocates nothing.
//! - Degradation is always safe: with no workers, from inside a task (nested
//!   call, see [`in_parallel_region`]) or while another thread is dispatching
//!   on the same team, the tasks run serially on the calling thread.
//! - A panicking task does not poison the team: the other tasks still run, the
//!   dispatch completes and the first panic is resumed on the caller (in every
//!   mode, the serial fallbacks included).
//!
//! ```
//! use fucina_thread::{Team, TeamOptions};
//!
//! // One participant per schedulable core (the caller is one of them).
//! let team = Team::new(TeamOptions::default())?;
//!
//! // Scale a vector in place; each chunk writes only its own elements.
//! let mut v: Vec<f32> = (0..10_000).map(|i| i as f32).collect();
//! team.parallel_for_slices(&mut v, 1000, |_range, chunk| {
//!     for x in chunk {
//!         *x *= 2.0;
//!     }
//! });
//! assert_eq!(v[1234], 2468.0);
//!
//! // A deterministic reduction: fixed blocks of 512, partials combined in
//! // block order, so the bits do not depend on the team size.
//! let data = &v;
//! let total = team.parallel_reduce(0, data.len(), 512, 0.0f32, |r| data[r].iter().sum(), |a, b| a + b);
//! let one = Team::new(TeamOptions { max_workers: 0 })?;
//! let alone = one.parallel_reduce(0, data.len(), 512, 0.0f32, |r| data[r].iter().sum(), |a, b| a + b);
//! assert_eq!(total.to_bits(), alone.to_bits());
//! # Ok::<(), fucina_thread::ThreadError>(())
//! ```
//!
//! # Other helpers
//!
//! - [`OneShotWorker`]: one helper thread that runs one job at a time, to
//!   overlap two branches (`join(a, b)`).
//! - [`TaskPool`]: many small independent tasks on a private `rayon-core`
//!   pool, away from the hot team.
//!
//! # Knobs
//!
//! The default team size is [`cpu_thread_count`]`(MAX_THREADS)`: the
//! schedulable cores (physical cores in the affinity mask, lowered by a cgroup
//! CPU quota and, on Apple Silicon, by the performance-core count). Precedence:
//! [`set_max_threads`] (replaces detection) > `FUCINA_MAX_THREADS` (only
//! lowers) > detection. `FUCINA_SPIN_BUDGET` overrides the worker spin budget
//! (0 = park at once) and `FUCINA_POOL_PROFILE=1` prints one trace line per
//! dispatch; both are read once per team start. See [`knobs`] and
//! `docs/THREADING.md`.
//!
//! # Floating-point environment
//!
//! On Linux a new thread inherits its creator's floating-point environment
//! (rounding mode, flush-to-zero). So that no task's numerics depend on which
//! thread happened to start the team, every thread this crate starts (team
//! workers, the [`OneShotWorker`] helper, [`TaskPool`] threads) installs the
//! default IEEE environment (round to nearest-even, gradual underflow) through
//! `fucina-fpenv` before it runs anything. Participant 0 is the caller and
//! keeps the caller's environment, which the workspace's numeric contracts
//! assume is the default (`fucina_fpenv::assert_default` checks it). Code that
//! changes the environment must do so inside each task, under a
//! `fucina_fpenv::Guard`.
//!
//! # Module map
//!
//! - `team/`: the persistent fork-join [`Team`] and its dispatch protocol
//!   (`team/README.md`), chained dispatch, futex parking;
//! - `chunking`: the deterministic range chunking;
//! - `reduce`: [`Team::parallel_reduce`];
//! - `knobs/`: thread-count knobs, environment parsing, CPU detection, spin budgets;
//! - `one_shot`: [`OneShotWorker`];
//! - `tasks`: general async tasks over `rayon-core`;
//! - `profile`: the `FUCINA_POOL_PROFILE` trace line;
//! - `sync`: the std/loom shim every atomic, lock and park goes through.

mod chunking;
mod error;
mod fp;
pub mod knobs;
mod one_shot;
mod profile;
mod reduce;
mod sync;
mod tasks;
mod team;

pub use chunking::{ChunkRanges, chunk_ranges};
pub use error::ThreadError;
pub use knobs::{
    MAX_THREADS, SpinBudgets, cgroup_cpu_budget, cpu_thread_count, env_flag, env_positive_usize,
    env_spin_budget, performance_cpu_count, physical_cpu_count, schedulable_cpu_count,
    set_max_threads, spin_budgets,
};
pub use one_shot::OneShotWorker;
pub use tasks::{TaskPool, TaskScope};
pub use team::chained::Chain;
pub use team::{Team, TeamOptions, current_participant, in_parallel_region};

/// Internals exposed for this crate's benchmarks only; not a stable API.
#[doc(hidden)]
pub mod __bench {
    #[cfg(target_os = "linux")]
    pub use crate::team::park::futex;
    pub use crate::team::park::keyed;
}

/// Compile-time checks of the thread-safety bounds (doctests only).
///
/// The accepted shapes compile:
///
/// ```
/// use fucina_thread::{Chain, OneShotWorker, Team, TeamOptions};
/// use std::sync::atomic::{AtomicU32, Ordering};
/// let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
/// let tasks = [AtomicU32::new(0), AtomicU32::new(0)];
/// team.parallel_chunks(&tasks, |t| { t.fetch_add(1, Ordering::Relaxed); });
/// let mut owned = vec![Box::new(0u32), Box::new(0u32)];
/// team.parallel_chained(&mut owned, 2, |t: &mut Box<u32>, _: &Chain<'_>| **t += 1);
/// let w = OneShotWorker::new();
/// let v = vec![1u32];
/// let _ = w.join(|| v.len(), || 0usize).unwrap();
/// ```
///
/// `parallel_chunks` hands `&T` to other threads, so `T` must be `Sync`:
///
/// ```compile_fail,E0277
/// use fucina_thread::{Team, TeamOptions};
/// use std::cell::Cell;
/// let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
/// let tasks = [Cell::new(0u32), Cell::new(0u32)];
/// team.parallel_chunks(&tasks, |t| t.set(t.get() + 1));
/// ```
///
/// `parallel_chunks_mut` and `parallel_for_slices` move `&mut T` to other
/// threads, so `T` must be `Send`:
///
/// ```compile_fail,E0277
/// use fucina_thread::{Team, TeamOptions};
/// use std::rc::Rc;
/// let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
/// let mut items = vec![Rc::new(0u32), Rc::new(0u32)];
/// team.parallel_chunks_mut(&mut items, |t| *t = Rc::new(1));
/// ```
///
/// ```compile_fail,E0277
/// use fucina_thread::{Team, TeamOptions};
/// use std::rc::Rc;
/// let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
/// let mut out = vec![Rc::new(0u32), Rc::new(0u32)];
/// team.parallel_for_slices(&mut out, 1, |_, s| s[0] = Rc::new(1));
/// ```
///
/// The closure is shared by every participant, so it must be `Sync`:
///
/// ```compile_fail,E0277
/// use fucina_thread::{Team, TeamOptions};
/// use std::cell::Cell;
/// let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
/// let count = Cell::new(0u32);
/// team.parallel_for(0, 100, 1, |_| count.set(count.get() + 1));
/// ```
///
/// `parallel_chained` moves `&mut T` to other threads, so `T` must be `Send`:
///
/// ```compile_fail,E0277
/// use fucina_thread::{Chain, Team, TeamOptions};
/// use std::rc::Rc;
/// let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
/// let mut tasks = vec![Rc::new(0u32), Rc::new(0u32)];
/// team.parallel_chained(&mut tasks, 2, |t: &mut Rc<u32>, _: &Chain<'_>| {
///     *t = Rc::new(1);
/// });
/// ```
///
/// The `&Chain` of a task cannot outlive the task:
///
/// ```compile_fail,E0521
/// use fucina_thread::{Chain, Team, TeamOptions};
/// use std::sync::Mutex;
/// let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
/// let escaped: Mutex<Option<&Chain<'_>>> = Mutex::new(None);
/// team.parallel_chained(&mut [0u8; 2], 2, |_, chain| {
///     *escaped.lock().unwrap() = Some(chain);
/// });
/// ```
///
/// The helper branch of `OneShotWorker::join` runs on another thread:
///
/// ```compile_fail,E0277
/// use fucina_thread::OneShotWorker;
/// use std::rc::Rc;
/// let w = OneShotWorker::new();
/// let v = Rc::new(1u32);
/// let _ = w.join(move || *v, || 0u32);
/// ```
#[cfg(doctest)]
pub mod bounds_checks {}
