//! The dispatch / park / join protocol of `team/README.md` (reference §3.2–3.5).
//!
//! [`Shared`] is the state the workers see (behind an `Arc`); [`Core`] is the
//! dispatcher-side owner (thread handles, chained arrays, the profile counter),
//! touched only by the thread that holds the team's `active` flag.
//!
//! A job is type-erased as a small `Copy` [`Payload`] plus a monomorphized
//! [`RunFn`]. The payload is copied into the job descriptor, on the generation
//! cache line, so a worker needs no further cache miss on the caller's stack to
//! start its task (it holds raw pointers into the caller's stack, valid until
//! [`Engine::dispatch`] returns, which is after every participant has left the
//! job: the `done` join).

use crate::error::ThreadError;
use crate::knobs::{self, OVERSUBSCRIBED_JOIN_SPIN, SpinBudgets};
use crate::profile::{self, LineHeader, Mode, TraceSlot, Tracer};
use crate::sync::{
    self, Arc, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, JoinHandle, Ordering, UnsafeCell,
    WaitWord,
};
use crate::team::PanicSlot;
use crossbeam_utils::CachePadded;
use std::any::Any;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

/// How long one join fallback wait sleeps on the `done` word at most.
pub(crate) const JOIN_WAIT_TIMEOUT: Duration = Duration::from_millis(1);

/// One participant's share of a job: called once per participant per dispatch
/// with the job payload and the participant's [`Share`].
///
/// # Safety
/// `payload` must have been made (by [`Payload::new`]) from the value the
/// function was monomorphized for, and what it points to must be live.
pub(crate) type RunFn = unsafe fn(payload: &Payload, share: Share<'_>);

/// The inline bytes of a job payload (4 words: fits the generation line).
const PAYLOAD_BYTES: usize = 32;

/// A job's `Copy` data (typically raw pointers into the caller's stack and a
/// few integers), type-erased and copied into the job descriptor.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct Payload([MaybeUninit<u8>; PAYLOAD_BYTES]);

impl Payload {
    /// Copies `c` in; `C` must fit [`PAYLOAD_BYTES`] with alignment <= 8
    /// (checked at compile time).
    #[inline(always)]
    pub(crate) fn new<C: Copy>(c: C) -> Self {
        const {
            assert!(size_of::<C>() <= PAYLOAD_BYTES && align_of::<C>() <= 8);
        }
        let mut p = Payload([MaybeUninit::uninit(); PAYLOAD_BYTES]);
        // SAFETY: `C` fits and the buffer is 8-aligned (const check above).
        unsafe { p.0.as_mut_ptr().cast::<C>().write(c) };
        p
    }

    /// Copies the value out.
    ///
    /// # Safety
    /// `self` must have been made by `Payload::new::<C>`.
    #[inline(always)]
    pub(crate) unsafe fn get<C: Copy>(&self) -> C {
        // SAFETY: the caller guarantees a `C` was written here by `new::<C>`
        // (which checked size and alignment).
        unsafe { self.0.as_ptr().cast::<C>().read() }
    }
}

/// The job of a generation that has none (before the first dispatch).
///
/// # Safety
/// Always safe; `unsafe` only to match [`RunFn`].
unsafe fn no_job(_: &Payload, _: Share<'_>) {}

/// What a participant gets besides the job context: its index, the shared
/// claim counter and its base (chunks mode), the task count, the panic slot
/// and its trace slot.
#[derive(Clone, Copy)]
pub(crate) struct Share<'a> {
    /// This participant (0 = the dispatcher, `1..=W` = the workers).
    pub(crate) index: usize,
    /// Participants of the dispatch (`W + 1`).
    pub(crate) participants: usize,
    /// The monotonic claim counter (never reset; see `base`).
    pub(crate) next: &'a AtomicUsize,
    /// The value of `next` when the job was published: a claim that returns
    /// `v` got dynamic claim number `v - base` (wrapping).
    pub(crate) base: usize,
    /// Tasks in the job.
    pub(crate) count: usize,
    /// The team's panic slot (chunks mode): the first task panic is recorded here.
    pub(crate) panic: &'a PanicSlot,
    /// This participant's trace slot, when profiling.
    pub(crate) tracer: Option<Tracer<'a>>,
}

/// The type-erased job descriptor published with a generation (56 bytes: with
/// the generation word it fills one 64-byte line).
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct JobRef {
    run: RunFn,
    count: usize,
    /// `next` at publish time (the dynamic claims' origin).
    base: usize,
    payload: Payload,
}

/// The completion counter and the claim counter, on one cache line: a worker's
/// last (failed) claim brings the line its `done` increment needs.
///
/// Both are monotonic (never reset), so publishing a job writes only the
/// generation line (team/README.md, "Monotonic counters").
pub(crate) struct JoinLine {
    /// Worker `done` increments, ever (wrapping u32, the futex word); the
    /// dispatcher joins on it reaching its target.
    done: WaitWord,
    /// The chunks-mode dynamic claim counter (wrapping).
    next: AtomicUsize,
}

/// The generation word and the job descriptor it publishes, on one cache line:
/// the worker's read of a new generation brings the job with it.
#[repr(C)]
pub(crate) struct GenerationLine {
    /// Bumped (release) once per dispatch and once at shutdown; workers wait on it.
    word: WaitWord,
    /// The current job; written by the dispatcher only while no worker reads it.
    job: UnsafeCell<JobRef>,
    /// The profile start of the current job (next line; read only when profiling),
    /// under the same protocol as `job`.
    start: UnsafeCell<Option<Instant>>,
}

// The generation word and the job descriptor share the first 64-byte line
// (`CachePadded` aligns the struct to 128 bytes).
#[cfg(not(loom))]
const _: () = assert!(std::mem::offset_of!(GenerationLine, start) <= 64);

/// State shared by the dispatcher and the workers.
pub(crate) struct Shared {
    /// The generation word and the job (see [`GenerationLine`]).
    generation: CachePadded<GenerationLine>,
    /// `done` and the claim counter (see [`JoinLine`]).
    join: CachePadded<JoinLine>,
    /// Workers currently inside (or about to enter) a futex wait on `generation`.
    parked: CachePadded<AtomicU32>,
    /// Workers that latched the initial generation (startup handshake only).
    ready: AtomicU32,
    /// Set before the final generation bump; a worker that sees it exits.
    shutdown: AtomicBool,
    /// The first task panic of the current chunks-mode dispatch.
    panic: CachePadded<PanicSlot>,
    /// Timed waits taken by the join fallback (diagnostics and tests).
    join_timed_waits: AtomicU64,
    workers: u32,
    budgets: SpinBudgets,
    /// One slot per participant (index 0 = dispatcher) when profiling.
    trace: Option<Box<[CachePadded<TraceSlot>]>>,
}

// SAFETY: every field but `generation.job`/`generation.start` is an atomic, a
// lock, or immutable after creation. `job` holds raw pointers and is accessed
// under the generation protocol: the dispatcher writes it only between a
// completed join (every worker's `done` increment of that generation acquired)
// and the next (release) generation bump, and workers read it only after
// acquiring that bump and before their `done` increment, so no write races a
// read (team/README.md, P2). The data its payload points to is `Sync` (the job
// types require `Sync` closures and tasks), except chained-mode tasks, which
// are `Send` and handed out as `&mut` at most once each (claimed flags).
unsafe impl Sync for Shared {}
// SAFETY: as above; moving the `Arc` between threads moves no thread-affine data.
unsafe impl Send for Shared {}

/// The dispatcher-side owner of a started team: the engine that dispatches,
/// and the chained-mode arrays (disjoint fields, so a chained job can borrow
/// the arrays while the engine dispatches it).
pub(crate) struct Core {
    pub(crate) engine: Engine,
    /// The chained-mode arrays (grown, never shrunk).
    pub(crate) chain: crate::team::chained::ChainArrays,
}

/// The worker threads and the dispatcher's side of the protocol.
pub(crate) struct Engine {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    /// The profile line's dispatch counter (starts at 1, wraps).
    dispatches: u32,
    /// The value of `done` once every worker left the last dispatch.
    done_target: u32,
}

#[cfg(test)]
std::thread_local! {
    /// Test hook: make the spawn of this worker index fail (0 = never).
    pub(crate) static FAIL_SPAWN_AT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Test hook: the initial values of `done` and `next` (to cross the wrap).
    pub(crate) static COUNTER_START: std::cell::Cell<(u32, usize)> =
        const { std::cell::Cell::new((0, 0)) };
}

/// The initial values of the monotonic `done` and `next` counters.
fn counter_start() -> (u32, usize) {
    #[cfg(test)]
    {
        COUNTER_START.with(|c| c.get())
    }
    #[cfg(not(test))]
    {
        (0, 0)
    }
}

/// Test hook: whether the spawn of worker `index` must fail (`FAIL_SPAWN_AT`; never
/// outside unit tests).
fn injected_spawn_failure(index: usize) -> bool {
    #[cfg(test)]
    {
        FAIL_SPAWN_AT.with(|f| f.get()) == index
    }
    #[cfg(not(test))]
    {
        let _ = index;
        false
    }
}

impl Core {
    /// Starts a team of `workers` workers (>= 1) and waits until each has
    /// latched the initial generation. On a spawn failure the started workers
    /// are shut down and joined, and the error is returned.
    pub(crate) fn start(workers: usize) -> Result<Core, ThreadError> {
        debug_assert!((1..knobs::MAX_THREADS).contains(&workers));
        let budgets = knobs::spin_budgets(
            knobs::env_spin_budget(),
            workers + 1,
            knobs::schedulable_cpu_count(),
        );
        let budgets = SpinBudgets {
            worker_spin: sync::model_spin_cap(budgets.worker_spin),
            join_spin: sync::model_spin_cap(budgets.join_spin),
        };
        let profile = !cfg!(loom) && knobs::env_flag(knobs::POOL_PROFILE_ENV);
        let trace = profile.then(|| {
            (0..=workers)
                .map(|_| CachePadded::new(TraceSlot::new()))
                .collect::<Box<[_]>>()
        });
        let (done_start, next_start) = counter_start();
        let shared = Arc::new(Shared {
            generation: CachePadded::new(GenerationLine {
                word: WaitWord::new(0),
                job: UnsafeCell::new(JobRef {
                    run: no_job,
                    count: 0,
                    base: 0,
                    payload: Payload::new(()),
                }),
                start: UnsafeCell::new(None),
            }),
            join: CachePadded::new(JoinLine {
                done: WaitWord::new(done_start),
                next: AtomicUsize::new(next_start),
            }),
            parked: CachePadded::new(AtomicU32::new(0)),
            ready: AtomicU32::new(0),
            shutdown: AtomicBool::new(false),
            panic: CachePadded::new(PanicSlot::new()),
            join_timed_waits: AtomicU64::new(0),
            workers: u32::try_from(workers).expect("worker count below MAX_THREADS"),
            budgets,
            trace,
        });
        let mut handles = Vec::with_capacity(workers);
        for index in 1..=workers {
            let sh = Arc::clone(&shared);
            let spawned = if injected_spawn_failure(index) {
                Err(std::io::Error::other("injected spawn failure"))
            } else {
                sync::spawn(format!("fucina-team-{index}"), move || {
                    worker_main(&sh, index)
                })
            };
            match spawned {
                Ok(h) => handles.push(h),
                Err(source) => {
                    wait_ready(&shared, handles.len());
                    shutdown(&shared, &mut handles);
                    return Err(ThreadError::Spawn {
                        what: format!("team worker {index}"),
                        source,
                    });
                }
            }
        }
        wait_ready(&shared, workers);
        Ok(Core {
            engine: Engine {
                shared,
                handles,
                dispatches: 0,
                done_target: done_start,
            },
            chain: Default::default(),
        })
    }
}

impl Engine {
    /// The number of workers (participants - 1).
    #[inline]
    pub(crate) fn workers(&self) -> usize {
        self.shared.workers as usize
    }

    /// Timed waits taken by the join fallback so far.
    pub(crate) fn join_timed_waits(&self) -> u64 {
        self.shared.join_timed_waits.load(Ordering::Relaxed)
    }

    /// The spin budgets fixed at team start.
    pub(crate) fn budgets(&self) -> SpinBudgets {
        self.shared.budgets
    }

    /// Takes the first task panic recorded by the last chunks-mode dispatch.
    pub(crate) fn take_panic(&self) -> Option<Box<dyn Any + Send>> {
        self.shared.panic.take()
    }

    /// Publishes a job, runs participant 0's share on the calling thread, and
    /// returns once every worker has left the job.
    ///
    /// # Safety
    /// `run(&payload, _)` must be safe to call concurrently from every
    /// participant until this function returns, and must not unwind (job
    /// functions catch task panics). What `payload` points to must stay valid
    /// until this function returns.
    pub(crate) unsafe fn dispatch(
        &mut self,
        payload: Payload,
        run: RunFn,
        mode: Mode,
        count: usize,
        chunk: usize,
    ) {
        let sh = &*self.shared;
        let start = sh.trace.as_ref().map(|slots| {
            for s in slots.iter() {
                s.reset();
            }
            Instant::now()
        });
        // State PUBLISH: the job fields (with the claim base), then the release
        // bump. Nothing is reset: `done` and `next` are monotonic.
        // No participant touches `next` between our join and the bump below
        // (workers claim only after acquiring a bump, and our previous join
        // acquired every worker's last claim), so this read is its final value.
        let base = sh.join.next.load(Ordering::Relaxed);
        self.done_target = self.done_target.wrapping_add(sh.workers);
        // SAFETY: no worker reads `job` now: each one's previous read happened
        // before its `done` increment, which our previous join acquired; the
        // next read happens only after acquiring the bump below.
        sh.generation.job.with_mut(|j| unsafe {
            *j = JobRef {
                run,
                count,
                base,
                payload,
            }
        });
        if sh.trace.is_some() {
            // SAFETY: as for `job`.
            sh.generation.start.with_mut(|s| unsafe { *s = start });
        }
        // Only the `active` holder (and `Drop`, exclusively) writes the
        // generation, so a plain release store suffices, and the relaxed load
        // reads our own (or a previous holder's, acquired via `active`) value.
        let g = sh.generation.word.word().load(Ordering::Relaxed);
        sh.generation
            .word
            .word()
            .store(g.wrapping_add(1), Ordering::Release);
        // The wake check is an RMW on `parked` (README, P1): it reads the last
        // parking announcement, or a parker's RMW reads from it and acquires
        // the bump above. On a line the spinning workers never touch.
        if sh.parked.fetch_add(0, Ordering::AcqRel) != 0 {
            sh.generation.word.wake_all();
        }
        // State RUN: participant 0.
        let tracer = sh
            .trace
            .as_ref()
            .zip(start)
            .map(|(t, start)| Tracer { slot: &t[0], start });
        // SAFETY: the caller guarantees `run` may be called with `payload` here.
        unsafe {
            run(
                &payload,
                Share {
                    index: 0,
                    participants: sh.workers as usize + 1,
                    next: &sh.join.next,
                    base,
                    count,
                    panic: &sh.panic,
                    tracer,
                },
            )
        };
        // State JOIN.
        join(sh, self.done_target);
        if let (Some(slots), Some(start)) = (&sh.trace, start) {
            let span_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.dispatches = self.dispatches.wrapping_add(1);
            let header = LineHeader {
                dispatch: self.dispatches,
                mode,
                jobs: count,
                participants: self.workers() + 1,
                chunk,
                span_ns,
            };
            let line = profile::format_line(&header, slots.iter().map(|s| s.snapshot()));
            use std::io::Write as _;
            // A failed diagnostic write is ignored (never panic after a dispatch).
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        shutdown(&self.shared, &mut self.handles);
    }
}

/// Spins (then yields) until `n` workers have latched the initial generation.
fn wait_ready(sh: &Shared, n: usize) {
    let mut spins = 0u32;
    while (sh.ready.load(Ordering::Acquire) as usize) < n {
        if spins < 64 {
            spins += 1;
            sync::spin_loop();
        } else {
            sync::yield_now();
        }
    }
}

/// State SHUTDOWN: set the flag, bump the generation, wake all, join all.
fn shutdown(sh: &Shared, handles: &mut Vec<JoinHandle<()>>) {
    if handles.is_empty() {
        return;
    }
    sh.shutdown.store(true, Ordering::Release);
    sh.generation.word.word().fetch_add(1, Ordering::Release);
    sh.generation.word.wake_all();
    for h in handles.drain(..) {
        // A worker never unwinds (task panics are caught), so join cannot fail;
        // if it did, there is nothing useful to do with the payload in drop.
        let _ = h.join();
    }
}

/// The join of reference §3.5: spin up to the join bound, then 1 ms timed waits
/// on `done` itself (workers never wake it), with the bound dropped to
/// [`OVERSUBSCRIBED_JOIN_SPIN`] after the first wait. Returns when `done`
/// reaches `target` (it never passes it: see team/README.md, P2).
fn join(sh: &Shared, target: u32) {
    let mut bound = sh.budgets.join_spin;
    let mut spins = 0u32;
    loop {
        let d = sh.join.done.word().load(Ordering::Acquire);
        if d == target {
            return;
        }
        spins += 1;
        if spins < bound {
            sync::spin_loop();
        } else {
            sh.join.done.wait_timeout(d, JOIN_WAIT_TIMEOUT);
            sh.join_timed_waits.fetch_add(1, Ordering::Relaxed);
            bound = bound.min(sync::model_spin_cap(OVERSUBSCRIBED_JOIN_SPIN));
            spins = 0;
        }
    }
}

/// A worker thread's body (reference §3.3, "Worker loop").
fn worker_main(sh: &Shared, index: usize) {
    // A worker only ever runs task code, so it is always "inside a parallel
    // region": any parallel call made by a task runs inline.
    crate::team::mark_worker_thread(index);
    // Numerics of tasks never depend on the spawner's float environment.
    crate::fp::enter_default_environment();
    // State LATCH.
    let mut seen = sh.generation.word.word().load(Ordering::Acquire);
    sh.ready.fetch_add(1, Ordering::Release);
    let budget = sh.budgets.worker_spin;
    loop {
        // State WAIT: spin, then park; re-read the generation every iteration.
        let mut spins = 0u32;
        let generation = loop {
            let g = sh.generation.word.word().load(Ordering::Acquire);
            if g != seen {
                break g;
            }
            if spins < budget {
                spins += 1;
                sync::spin_loop();
            } else {
                // State PARK: announce, then sleep only while the word is still `g`.
                sh.parked.fetch_add(1, Ordering::AcqRel);
                sh.generation.word.wait(g);
                sh.parked.fetch_sub(1, Ordering::Relaxed);
                spins = 0;
            }
        };
        seen = generation;
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        // State RUN.
        // SAFETY: we acquired the bump that published `job`; the dispatcher does
        // not write it again before our `done` increment below.
        let job = sh.generation.job.with(|j| unsafe { *j });
        let tracer = sh.trace.as_ref().and_then(|t| {
            // SAFETY: as for `job`.
            let start = sh.generation.start.with(|s| unsafe { *s })?;
            Some(Tracer {
                slot: &t[index],
                start,
            })
        });
        // SAFETY: the dispatcher keeps what `job.payload` points to alive until
        // it has acquired our `done` increment, and `job.run` is the function
        // made for that payload.
        unsafe {
            (job.run)(
                &job.payload,
                Share {
                    index,
                    participants: sh.workers as usize + 1,
                    next: &sh.join.next,
                    base: job.base,
                    count: job.count,
                    panic: &sh.panic,
                    tracer,
                },
            )
        };
        // State LEAVE: after this we never touch the job again.
        sh.join.done.word().fetch_add(1, Ordering::Release);
    }
}
