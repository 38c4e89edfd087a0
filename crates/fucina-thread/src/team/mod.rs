//! The persistent spin-then-park fork-join [`Team`] (protocol: `team/README.md`).

pub(crate) mod adapt;
pub(crate) mod chained;
pub(crate) mod dispatch;
mod jobs;
#[cfg_attr(loom, allow(dead_code))]
pub(crate) mod park;

use crate::chunking::chunk_ranges;
use crate::error::ThreadError;
use crate::knobs::{self, MAX_THREADS};
use crate::profile::Mode;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, thread_local};
use chained::{Chain, ChainedJob};
use crossbeam_utils::CachePadded;
use dispatch::{Core, Payload};
use jobs::{
    ByRef, IndexedJob, Inline, MutSliceJob, RangeJob, SliceJob, SlicesJob, claim_chunk, run_chunks,
};
use std::any::Any;
use std::cell::Cell;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

/// [`REGION`] value: not running tasks of any call.
const OUTSIDE: usize = 0;
/// [`REGION`] value: inside a parallel region, running the tasks of a nested
/// call serially (no participant index).
const SERIAL: usize = usize::MAX;

#[cfg(not(loom))]
thread_local! {
    /// This thread's place in a dispatch: [`OUTSIDE`], [`SERIAL`], or `p + 1`
    /// while it runs tasks as participant `p` of a parallel dispatch (always on
    /// a worker thread). A parallel call made while it is not [`OUTSIDE`] runs
    /// inline.
    static REGION: Cell<usize> = const { Cell::new(OUTSIDE) };
}

#[cfg(loom)]
thread_local! {
    static REGION: Cell<usize> = Cell::new(OUTSIDE);
}

/// Whether the calling thread is inside a parallel region (running a task of a
/// team dispatch, on a worker or as the dispatching caller, or a task of a
/// call with several tasks that ran serially: a busy team, a failed start, the
/// adaptive mode). Parallel calls made from inside a region run inline on the
/// calling thread, so their chunks never depend on whether the outer call
/// found the team free.
#[inline]
pub fn in_parallel_region() -> bool {
    REGION.with(|f| f.get()) != OUTSIDE
}

/// The participant index of the calling thread in the parallel dispatch whose
/// task it is running, like rayon's `current_thread_index`: `Some(p)` with `p`
/// in `0..team.participants()` (the dispatching caller is 0, the workers
/// `1..`), the same index for every task a thread runs in that dispatch, and
/// distinct threads of one dispatch never share an index. It is meant for
/// per-participant scratch: a buffer per index, allocated once.
///
/// A job that the adaptive mode ([`Team::set_adaptive`]) runs on the caller
/// alone is a dispatch that no worker entered: its tasks see `Some(0)`.
///
/// `None` outside a dispatch and in every serial run: the serial fallbacks (a
/// team without workers, a nested call, a busy team), a single task run
/// inline, and `parallel_for`/`parallel_for_slices` with a single chunk. Such
/// tasks must not use a per-participant slot (a busy-team fallback runs beside
/// the dispatch that holds the team, whose participant 0 uses slot 0; a nested
/// call runs inside a task that may hold its own slot); a local buffer is
/// exclusive there. Inside a nested serial call the outer index comes back
/// when the nested call returns.
///
/// ```
/// use fucina_thread::{Team, TeamOptions, current_participant};
/// use std::sync::Mutex;
///
/// let team = Team::new(TeamOptions { max_workers: 1 })?;
/// // One scratch buffer per participant, reused by every task it runs.
/// let scratch: Vec<Mutex<Vec<f32>>> =
///     (0..team.participants()).map(|_| Mutex::new(Vec::new())).collect();
/// let tasks: Vec<usize> = (0..64).collect();
/// team.parallel_chunks(&tasks, |&t| {
///     let (mut slot, mut local);
///     let buf: &mut Vec<f32> = match current_participant() {
///         Some(p) => {
///             slot = scratch[p].lock().unwrap();
///             &mut slot
///         }
///         // A serial run: a local buffer is exclusive.
///         None => {
///             local = Vec::new();
///             &mut local
///         }
///     };
///     buf.clear();
///     buf.extend((0..t).map(|i| i as f32));
/// });
/// assert_eq!(current_participant(), None);
/// # Ok::<(), fucina_thread::ThreadError>(())
/// ```
#[inline]
pub fn current_participant() -> Option<usize> {
    match REGION.with(|f| f.get()) {
        OUTSIDE | SERIAL => None,
        p => Some(p - 1),
    }
}

/// Marks the current thread as team worker `index` (permanently in a region).
pub(crate) fn mark_worker_thread(index: usize) {
    REGION.with(|f| f.set(index + 1));
}

/// Marks the caller as participant 0 of its dispatch; restores on drop.
pub(crate) struct RegionGuard {
    prev: usize,
}

impl RegionGuard {
    #[inline]
    pub(crate) fn enter() -> Self {
        RegionGuard {
            prev: REGION.with(|f| f.replace(1)),
        }
    }
}

impl Drop for RegionGuard {
    #[inline]
    fn drop(&mut self) {
        REGION.with(|f| f.set(self.prev));
    }
}

/// Inside a region, marks a serial run (no participant index); restores on drop.
struct SerialGuard {
    prev: usize,
}

impl SerialGuard {
    /// Marks a serial run inside a region; with `always`, also outside one
    /// (the fallbacks of a multi-task job: nested calls then see a region, as
    /// they would inside a parallel dispatch of the same job).
    fn enter(always: bool) -> Self {
        let prev = REGION.with(|f| f.get());
        if always || prev != OUTSIDE {
            REGION.with(|f| f.set(SERIAL));
        }
        SerialGuard { prev }
    }
}

impl Drop for SerialGuard {
    fn drop(&mut self) {
        REGION.with(|f| f.set(self.prev));
    }
}

/// The first panic of a dispatch, carried to the caller after the join.
pub(crate) struct PanicSlot {
    panicked: AtomicBool,
    payload: Mutex<Option<Box<dyn Any + Send>>>,
}

impl PanicSlot {
    pub(crate) fn new() -> Self {
        PanicSlot {
            panicked: AtomicBool::new(false),
            payload: Mutex::new(None),
        }
    }

    /// Runs `f`, recording its panic (the first one wins) instead of unwinding.
    #[inline(always)]
    pub(crate) fn catch(&self, f: impl FnOnce()) {
        if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
            self.record(p);
        }
    }

    #[cold]
    fn record(&self, p: Box<dyn Any + Send>) {
        let lost = {
            let mut slot = self.payload.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(p);
                None
            } else {
                Some(p)
            }
        };
        self.panicked.store(true, Ordering::Release);
        if let Some(p) = lost {
            drop_lost_payload(p);
        }
    }

    /// Whether a task panicked.
    #[inline]
    pub(crate) fn panicked(&self) -> bool {
        self.panicked.load(Ordering::Acquire)
    }

    /// Takes the recorded panic and clears the slot (exclusive use: after a join).
    #[inline]
    pub(crate) fn take(&self) -> Option<Box<dyn Any + Send>> {
        if !self.panicked() {
            return None;
        }
        self.take_slow()
    }

    #[cold]
    #[inline(never)]
    fn take_slow(&self) -> Option<Box<dyn Any + Send>> {
        self.panicked.store(false, Ordering::Relaxed);
        self.payload
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Re-raises the recorded panic on the calling thread, if any.
    fn resume(&self) {
        if let Some(p) = self.take() {
            resume_unwind(p);
        }
    }
}

/// Drops the payload of a panic that is not the first of its call.
///
/// A payload's `Drop` may itself panic. That must not unwind out of a
/// participant's share (participant 0 would leave `dispatch` before the join,
/// freeing the job under the workers, and a worker would die without its
/// `done` increment) nor out of a serial run (the remaining tasks would not
/// run). The nested payload is leaked instead.
#[cold]
fn drop_lost_payload(p: Box<dyn Any + Send>) {
    if let Err(nested) = catch_unwind(AssertUnwindSafe(move || drop(p))) {
        std::mem::forget(nested);
    }
}

/// Runs `task(0..count)` in index order on the calling thread (the serial
/// fallbacks and the single-task call): every task runs even if an earlier
/// one panicked, then the first panic is resumed.
/// With `in_region`, the tasks run inside a parallel region even when the
/// caller is outside one (see [`SerialGuard::enter`]).
fn run_serially(count: usize, in_region: bool, mut task: impl FnMut(usize)) {
    let serial = SerialGuard::enter(in_region);
    let mut first: Option<Box<dyn Any + Send>> = None;
    for i in 0..count {
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| task(i))) {
            match first {
                None => first = Some(p),
                Some(_) => drop_lost_payload(p),
            }
        }
    }
    drop(serial);
    if let Some(p) = first {
        resume_unwind(p);
    }
}

/// Runs tasks `0..count` of `job` serially on the calling thread ([`run_serially`]).
///
/// # Safety
/// As [`Team::run_job`].
#[inline(never)]
unsafe fn run_job_serially<C: IndexedJob>(count: usize, job: &C) {
    // A job of several tasks runs them inside a region, as a parallel
    // dispatch would: a nested call's chunks do not depend on whether the
    // team was free.
    run_serially(count, count > 1, |i| {
        // SAFETY: `i < count`, each `i` once, and the caller keeps the job's
        // data live.
        unsafe { job.call(i) }
    })
}

/// Options of [`Team::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TeamOptions {
    /// Upper bound on worker threads (participants - 1). The actual count,
    /// fixed when the workers start, is
    /// `min(max_workers, max(cpu_thread_count(usize::MAX) - 1, 1))`
    /// (one participant per schedulable CPU, the caller included); `0` means
    /// every call runs serially on the caller.
    pub max_workers: usize,
}

impl Default for TeamOptions {
    /// `max_workers = cpu_thread_count(MAX_THREADS) - 1`: one participant per
    /// schedulable core, the caller being one of them.
    fn default() -> Self {
        TeamOptions {
            max_workers: knobs::cpu_thread_count(MAX_THREADS).saturating_sub(1),
        }
    }
}

/// `worker_count` value while no worker has been started.
const NOT_STARTED: usize = usize::MAX;

/// A persistent fork-join team: participant 0 is the calling thread, the
/// workers (participants `1..`) are started lazily on the first parallel
/// dispatch and shut down and joined on drop.
///
/// Several threads may share a `&Team`; one dispatch runs at a time, and a
/// call that finds the team busy (or that is made from inside a task) runs its
/// tasks serially on the calling thread instead of waiting.
///
/// ```
/// use fucina_thread::{Team, TeamOptions};
///
/// let team = Team::new(TeamOptions::default())?;
/// let mut out = vec![0u64; 1000];
/// let sums: Vec<std::sync::atomic::AtomicU64> =
///     (0..4).map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
/// team.parallel_for(0, out.len(), 100, |r| {
///     let s: u64 = r.clone().map(|i| i as u64).sum();
///     sums[0].fetch_add(s, std::sync::atomic::Ordering::Relaxed);
/// });
/// assert_eq!(sums[0].load(std::sync::atomic::Ordering::Relaxed), 999 * 1000 / 2);
/// # out.clear();
/// # Ok::<(), fucina_thread::ThreadError>(())
/// ```
pub struct Team {
    max_workers: usize,
    /// Held by the one thread currently dispatching (the spec's
    /// `parallel_chunks_active`); guards `core`.
    active: CachePadded<AtomicBool>,
    /// Workers of the started team, or [`NOT_STARTED`].
    worker_count: AtomicUsize,
    /// The started team; accessed only by the holder of `active` (or `&mut self`).
    core: std::cell::UnsafeCell<Option<Core>>,
    /// Join fallback timed waits, shared with the started team's workers'
    /// state: readable at any time, even during a dispatch.
    join_waits: Arc<AtomicU64>,
    /// Whether the adaptive serial mode may engage ([`Team::set_adaptive`]).
    adaptive: AtomicBool,
}

// SAFETY: `core` is only accessed by the thread that won the `active` CAS
// (acquire) until it releases the flag (release), or through `&mut self`; all
// other fields are atomics. `Core` itself is `Send`.
unsafe impl Sync for Team {}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("max_workers", &self.max_workers)
            .field("participants", &self.participants())
            .field("started", &self.is_started())
            .finish()
    }
}

/// Proof that the holder won the `active` flag; releases it on drop.
struct ActiveToken<'t>(&'t Team);

impl Drop for ActiveToken<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.active.store(false, Ordering::Release);
    }
}

/// The largest task count a team dispatch takes; larger counts (only possible
/// with zero-sized task types, and never finishing in practice) run serially,
/// so the wrapping claim arithmetic stays exact.
const MAX_CHUNKS_COUNT: usize = isize::MAX as usize;

impl Team {
    /// Creates a team; no thread is started until the first parallel dispatch.
    ///
    /// # Errors
    /// [`ThreadError::TooManyWorkers`] when `options.max_workers` exceeds
    /// `MAX_THREADS - 1`.
    pub fn new(options: TeamOptions) -> Result<Team, ThreadError> {
        if options.max_workers > MAX_THREADS - 1 {
            return Err(ThreadError::TooManyWorkers {
                requested: options.max_workers,
                max: MAX_THREADS - 1,
            });
        }
        Ok(Team {
            max_workers: options.max_workers,
            active: CachePadded::new(AtomicBool::new(false)),
            worker_count: AtomicUsize::new(NOT_STARTED),
            core: std::cell::UnsafeCell::new(None),
            join_waits: Arc::new(AtomicU64::new(0)),
            adaptive: AtomicBool::new(knobs::adaptive_from_env()),
        })
    }

    /// The configured worker ceiling ([`TeamOptions::max_workers`]).
    pub fn max_workers(&self) -> usize {
        self.max_workers
    }

    /// The number of workers the team has (once started) or would start now.
    fn planned_workers(&self) -> usize {
        let started = self.worker_count.load(Ordering::Acquire);
        if started != NOT_STARTED {
            return started;
        }
        let cpus = knobs::cpu_thread_count(usize::MAX);
        self.max_workers.min(cpus.saturating_sub(1).max(1))
    }

    /// Participants of a dispatch: workers + 1 (the caller). Before the workers
    /// start this is the count they would start with now.
    pub fn participants(&self) -> usize {
        self.planned_workers() + 1
    }

    /// Whether the worker threads have been started.
    pub fn is_started(&self) -> bool {
        self.worker_count.load(Ordering::Acquire) != NOT_STARTED
    }

    /// Join fallback timed waits taken so far (the join's bounded futex waits,
    /// see `team/README.md`); a diagnostic.
    /// 0 before the workers start. Readable at any time, also while a
    /// dispatch is running (from one of its tasks, say).
    pub fn join_timed_waits(&self) -> u64 {
        self.join_waits.load(Ordering::Relaxed)
    }

    /// Turns the adaptive serial mode on (the default) or off.
    ///
    /// When the workers stop showing up for dispatches (a worker never
    /// entered, or the caller had to sleep in the join, `4` dispatches in a
    /// row: competing processes, a CPU quota), the team runs *small* jobs
    /// (fewer than 4 tasks per participant) alone on the caller for a short
    /// window (1 ms, doubling up to 16 ms while probes fail), then probes
    /// with a real dispatch; a probe that every worker entered in time ends
    /// the mode. Results are bitwise identical either way: the tasks and their
    /// boundaries do not change, only who runs them. Off, every job with two
    /// or more tasks is dispatched. A new team starts with the mode on unless
    /// `FUCINA_ADAPTIVE` starts with `0`.
    pub fn set_adaptive(&self, on: bool) {
        self.adaptive.store(on, Ordering::Relaxed);
    }

    /// The adaptive mode's diagnostics: `(times it engaged, jobs run alone)`
    /// so far; `None` while another thread is dispatching.
    pub fn adaptive_stats(&self) -> Option<(u64, u64)> {
        self.with_core(|core| {
            core.map_or((0, 0), |c| {
                (c.engine.adapt.engaged, c.engine.adapt.alone_runs)
            })
        })
    }

    /// The spin budgets of the started team (`None` before start or while
    /// another thread is dispatching).
    pub fn spin_budgets(&self) -> Option<knobs::SpinBudgets> {
        self.with_core(|core| core.map(|c| c.engine.budgets()))
            .flatten()
    }

    /// Starts the workers now instead of on the first dispatch, reporting a
    /// spawn failure. Returns without doing anything when the team is already
    /// started, has no workers, or is busy in another thread.
    ///
    /// # Errors
    /// [`ThreadError::Spawn`] when the OS refuses a thread; the team stays
    /// unstarted (every dispatch runs serially until a later start succeeds).
    pub fn warm_up(&self) -> Result<(), ThreadError> {
        let Some(mut token) = self.acquire() else {
            return Ok(());
        };
        self.start_core(&mut token).map(|_| ())
    }

    /// Wins the `active` flag, `None` when another dispatch holds it.
    #[inline]
    fn acquire(&self) -> Option<ActiveToken<'_>> {
        self.active
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| ActiveToken(self))
    }

    /// Runs `f` on the core while holding the flag; `None` when busy.
    fn with_core<R>(&self, f: impl FnOnce(Option<&Core>) -> R) -> Option<R> {
        let token = self.acquire()?;
        // SAFETY: we hold `active` (token), so no other thread accesses `core`.
        let core = unsafe { &*self.core.get() };
        let r = f(core.as_ref());
        drop(token);
        Some(r)
    }

    /// The started core, starting it on first use; `Ok(None)` when the team
    /// has no workers.
    #[allow(clippy::mut_from_ref)] // exclusivity comes from the token
    #[inline]
    fn start_core<'t>(
        &'t self,
        _token: &'t mut ActiveToken<'_>,
    ) -> Result<Option<&'t mut Core>, ThreadError> {
        // SAFETY: the token proves we hold `active`, so this is the only access
        // to `core` until the token is dropped, and the returned borrow keeps
        // the token mutably borrowed, so it cannot be dropped while in use.
        let core = unsafe { &mut *self.core.get() };
        if core.is_none() {
            self.start_workers(core)?;
        }
        Ok(core.as_mut())
    }

    /// Starts the workers into the empty `core` (first dispatch); leaves it
    /// empty when the team has no workers.
    #[cold]
    #[inline(never)]
    fn start_workers(&self, core: &mut Option<Core>) -> Result<(), ThreadError> {
        let workers = self.planned_workers();
        if workers > 0 {
            *core = Some(Core::start(workers, Arc::clone(&self.join_waits))?);
            self.worker_count.store(workers, Ordering::Release);
        }
        Ok(())
    }

    /// Runs tasks `0..count` of `job` across the team (the shared engine of
    /// `parallel_chunks`, `parallel_chunks_mut`, `parallel_for` and
    /// `parallel_for_slices`), then drops `job`.
    ///
    /// # Safety
    /// `job.call(i)` must be safe for every `i < count`, each called once,
    /// until this returns.
    #[inline]
    unsafe fn run_job<C: IndexedJob>(&self, count: usize, job: C) {
        if count <= 1 || count > MAX_CHUNKS_COUNT || in_parallel_region() {
            // SAFETY: as ours.
            return unsafe { run_job_serially(count, &job) };
        }
        let Some(mut token) = self.acquire() else {
            // SAFETY: as ours.
            return unsafe { run_job_serially(count, &job) };
        };
        let Ok(Some(core)) = self.start_core(&mut token) else {
            // SAFETY: as ours.
            return unsafe { run_job_serially(count, &job) };
        };
        let participants = core.engine.workers() + 1;
        let chunk = claim_chunk(count, participants);
        core.engine.adapt.enabled = self.adaptive.load(Ordering::Relaxed);
        // SAFETY: `run_chunks::<C>` is made for a `C` payload; it catches every
        // task panic and is safe to run concurrently (jobs only share `Sync`
        // data, and hand out each `&mut` once: P3). The caller keeps what `job`
        // points to live until we return, which is after `dispatch` returned,
        // which is after every worker that entered the job has left it (a
        // worker that did not enter never touches it).
        let back = unsafe {
            core.engine
                .dispatch(job, run_chunks::<C>, Mode::Chunks, count, chunk)
        };
        let panic = core.engine.take_panic();
        drop(token);
        // The job as the participants left it: drop it (the closure, if it
        // was moved in) outside the `active` section.
        drop(back);
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }

    /// Runs `run(&tasks[i])` for every task across the team and returns when
    /// all have finished.
    ///
    /// - 0 tasks: returns at once; 1 task: runs inline on the caller.
    /// - No workers, a call from inside a task (nested), or the team busy with
    ///   a dispatch from another thread: every task runs serially on the
    ///   calling thread, in index order.
    /// - Otherwise every task runs exactly once, on some participant; the order
    ///   is unspecified. The caller is participant 0.
    ///
    /// `tasks` and `run` may borrow from the caller's stack: the call does not
    /// return before every participant that took part has left the dispatch
    /// (a worker that comes too late touches nothing of it).
    ///
    /// # Panics
    /// If a task panics, the other tasks still run, the dispatch completes,
    /// and the first panic is resumed on the caller; the team stays usable.
    /// This holds in every mode: a parallel dispatch, the serial fallbacks and
    /// a single task run inline.
    ///
    /// ```
    /// use fucina_thread::{Team, TeamOptions};
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    ///
    /// let team = Team::new(TeamOptions { max_workers: 1 })?;
    /// let hits: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
    /// let tasks: Vec<usize> = (0..8).collect();
    /// team.parallel_chunks(&tasks, |&i| {
    ///     hits[i].fetch_add(1, Ordering::Relaxed);
    /// });
    /// assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    /// # Ok::<(), fucina_thread::ThreadError>(())
    /// ```
    pub fn parallel_chunks<T, F>(&self, tasks: &[T], run: F)
    where
        T: Sync,
        F: Fn(&T) + Sync,
    {
        let (n, tasks) = (tasks.len(), tasks.as_ptr());
        // SAFETY: task `i < n` is `run(&tasks[i])`; `tasks` outlives the call,
        // and so does `run` (moved into the job, or borrowed).
        unsafe {
            if Payload::fits::<SliceJob<T, Inline<F>>>() {
                self.run_job(
                    n,
                    SliceJob {
                        tasks,
                        run: Inline(run),
                    },
                )
            } else {
                self.run_job(
                    n,
                    SliceJob {
                        tasks,
                        run: ByRef(&run),
                    },
                )
            }
        }
    }

    /// Runs `f` over the deterministic chunks of `[begin, end)`
    /// ([`chunk_ranges`](crate::chunk_ranges) with `threads` = this team's
    /// [`participants`](Team::participants), or 1 inside a parallel region).
    ///
    /// With a single chunk `f(begin..end)` is called directly; an empty range
    /// calls nothing. The boundaries depend only on `(begin, end, grain,
    /// threads)`, never on scheduling: when the team is busy the same chunks
    /// run serially, in order. A `grain` of 0 is treated as 1.
    ///
    /// # Panics
    /// As [`parallel_chunks`](Team::parallel_chunks).
    pub fn parallel_for<F>(&self, begin: usize, end: usize, grain: usize, f: F)
    where
        F: Fn(Range<usize>) + Sync,
    {
        let threads = if in_parallel_region() {
            1
        } else {
            self.participants()
        };
        let chunks = chunk_ranges(begin, end, grain, threads);
        match chunks.len() {
            0 => {}
            1 => run_serially(1, false, |_| f(begin..end)),
            n => {
                // SAFETY: `f` outlives the call; `job.range(i)` is chunk `i < n`.
                unsafe {
                    if Payload::fits::<RangeJob<Inline<F>>>() {
                        self.run_job(n, RangeJob::new(&chunks, Inline(f)))
                    } else {
                        self.run_job(n, RangeJob::new(&chunks, ByRef(&f)))
                    }
                }
            }
        }
    }

    /// Runs `run(&mut items[i])` for every item across the team and returns
    /// when all have finished: safe mutable parallelism over a slice, each
    /// item handed to exactly one task.
    ///
    /// Modes, ordering and panics as [`parallel_chunks`](Team::parallel_chunks)
    /// (serially in index order on the caller when the team has no workers,
    /// is busy, or the call is nested; one item runs inline).
    ///
    /// ```
    /// use fucina_thread::{Team, TeamOptions};
    ///
    /// let team = Team::new(TeamOptions::default())?;
    /// // One output row per task.
    /// let mut rows = vec![[0f32; 16]; 64];
    /// team.parallel_chunks_mut(&mut rows, |row| {
    ///     for (j, x) in row.iter_mut().enumerate() {
    ///         *x = j as f32;
    ///     }
    /// });
    /// assert!(rows.iter().all(|r| r[15] == 15.0));
    /// # Ok::<(), fucina_thread::ThreadError>(())
    /// ```
    pub fn parallel_chunks_mut<T, F>(&self, items: &mut [T], run: F)
    where
        T: Send,
        F: Fn(&mut T) + Sync,
    {
        let (n, items) = (items.len(), items.as_mut_ptr());
        // SAFETY: task `i < n` is `run(&mut items[i])`; `items` (borrowed
        // mutably for the call) outlives it, and so does `run`.
        unsafe {
            if Payload::fits::<MutSliceJob<T, Inline<F>>>() {
                self.run_job(
                    n,
                    MutSliceJob {
                        items,
                        run: Inline(run),
                    },
                )
            } else {
                self.run_job(
                    n,
                    MutSliceJob {
                        items,
                        run: ByRef(&run),
                    },
                )
            }
        }
    }

    /// Runs `f(range, &mut out[range])` over the deterministic chunks of
    /// `0..out.len()`: the same chunks as
    /// [`parallel_for`](Team::parallel_for)`(0, out.len(), grain, _)`
    /// ([`chunk_ranges`](crate::chunk_ranges)), each chunk handed its range and
    /// the disjoint mutable sub-slice of `out` it covers.
    ///
    /// With a single chunk (or inside a parallel region) `f(0..len, out)` is
    /// called directly; an empty `out` calls nothing. Modes and panics as
    /// [`parallel_chunks`](Team::parallel_chunks); a `grain` of 0 is treated
    /// as 1.
    ///
    /// ```
    /// use fucina_thread::{Team, TeamOptions};
    ///
    /// let team = Team::new(TeamOptions::default())?;
    /// let x: Vec<f32> = (0..10_000).map(|i| i as f32).collect();
    /// let mut y = vec![0f32; x.len()];
    /// // y = 2x + 1, each chunk writing only its own part of `y`.
    /// team.parallel_for_slices(&mut y, 1024, |r, y| {
    ///     for (yi, xi) in y.iter_mut().zip(&x[r]) {
    ///         *yi = 2.0 * xi + 1.0;
    ///     }
    /// });
    /// assert_eq!(y[1234], 2469.0);
    /// # Ok::<(), fucina_thread::ThreadError>(())
    /// ```
    pub fn parallel_for_slices<T, F>(&self, out: &mut [T], grain: usize, f: F)
    where
        T: Send,
        F: Fn(Range<usize>, &mut [T]) + Sync,
    {
        let len = out.len();
        let threads = if in_parallel_region() {
            1
        } else {
            self.participants()
        };
        let chunks = chunk_ranges(0, len, grain, threads);
        match chunks.len() {
            0 => {}
            1 => run_serially(1, false, |_| f(0..len, &mut *out)),
            n => {
                let (out, size) = (out.as_mut_ptr(), chunks.chunk_size());
                // SAFETY: chunk `i < n` is `[i * size, min((i + 1) * size, len))`
                // (`ChunkRanges` with `begin = 0`), inside `out`, which is borrowed
                // mutably for the call; `f` outlives it.
                unsafe {
                    if Payload::fits::<SlicesJob<T, Inline<F>>>() {
                        let f = Inline(f);
                        self.run_job(n, SlicesJob { out, size, len, f })
                    } else {
                        let f = ByRef(&f);
                        self.run_job(n, SlicesJob { out, size, len, f })
                    }
                }
            }
        }
    }

    /// Dependency-chained fork-join: tasks
    /// `0..initial_count` start runnable (and start in that order), and a
    /// running task makes others runnable with [`Chain::enqueue`]. Each task
    /// gets `&mut` access to its element.
    ///
    /// Returns `true` when the graph ran here (all tasks finished), and `true`
    /// for an empty task list. Returns `false` without running anything when
    /// `initial_count` is 0 or larger than `tasks.len()`, or when the team
    /// cannot run it (no workers, busy with another thread's dispatch, called
    /// from inside a task, the chained arrays cannot grow): the caller then
    /// runs the graph itself.
    ///
    /// Contract: within one call, the seeds plus all `enqueue` calls must name
    /// each index in `0..tasks.len()` exactly once.
    ///
    /// # Panics
    /// - If a task panics: the dispatch stops handing out tasks, every
    ///   participant leaves, and the panic is resumed on the caller.
    /// - If an index would be handed out twice (in every build), and in debug
    ///   builds on a double enqueue, a certain stall (under-enqueue) or a
    ///   seeds + enqueues count different from the task count.
    ///
    /// ```
    /// use fucina_thread::{Chain, Team, TeamOptions};
    ///
    /// let team = Team::new(TeamOptions { max_workers: 1 })?;
    /// // A chain 0 -> 1 -> 2 -> 3: each task enqueues its successor.
    /// let mut order = vec![0usize; 4];
    /// let step = std::sync::atomic::AtomicUsize::new(0);
    /// let ran = team.parallel_chained(&mut order, 1, |slot: &mut usize, chain: &Chain| {
    ///     let k = step.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ///     *slot = k;
    ///     if k + 1 < chain.len() {
    ///         chain.enqueue(k + 1);
    ///     }
    /// });
    /// if ran {
    ///     assert_eq!(order, [0, 1, 2, 3]);
    /// }
    /// # Ok::<(), fucina_thread::ThreadError>(())
    /// ```
    pub fn parallel_chained<T, F>(&self, tasks: &mut [T], initial_count: usize, run: F) -> bool
    where
        T: Send,
        F: Fn(&mut T, &Chain<'_>) + Sync,
    {
        let n = tasks.len();
        if n == 0 {
            return true;
        }
        if initial_count == 0 || initial_count > n || in_parallel_region() {
            return false;
        }
        let Some(mut token) = self.acquire() else {
            return false;
        };
        let Ok(Some(core)) = self.start_core(&mut token) else {
            return false;
        };
        if !core.chain.grow(n) {
            return false;
        }
        let Core {
            engine,
            chain: arrays,
        } = core;
        engine.adapt.enabled = self.adaptive.load(Ordering::Relaxed);
        let job = ChainedJob::new(tasks, initial_count, &run, arrays);
        // SAFETY: `run_chained::<T, F>` is made for `ChainedJob<T, F>`; it
        // catches every panic; tasks are handed out at most once each (claimed
        // flags), `T: Send`, `F: Sync`. `job` (and the `&mut tasks` borrow it
        // holds) lives until `dispatch` returns, after every worker that
        // entered has left (no other worker touches it).
        unsafe {
            engine.dispatch(
                &raw const job,
                chained::run_chained::<T, F>,
                Mode::Chained,
                n,
                1,
            );
        }
        // A resumed panic releases `active` while unwinding (the token's Drop).
        job.panic.resume();
        #[cfg(debug_assertions)]
        {
            let (completed, enqueued) = (job.completed(), job.chain.enqueued());
            assert!(
                initial_count + enqueued == n && completed == n,
                "parallel_chained: seeds ({initial_count}) + enqueues ({enqueued}) != task count ({n}) \
                 ({completed} tasks ran)"
            );
        }
        true
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        // Shut the workers down and join them (Core's Drop).
        drop(self.core.get_mut().take());
    }
}

#[cfg(test)]
mod tests;
