//! The dispatch / park / join protocol of `team/README.md` (reference §3.2–3.5).
//!
//! [`Shared`] is the state the workers see (behind an `Arc`); [`Core`] is the
//! dispatcher-side owner (thread handles, chained arrays, the profile counter),
//! touched only by the thread that holds the team's `active` flag.
//!
//! A job is type-erased as a small [`Payload`] plus a monomorphized [`RunFn`].
//! The payload is moved into the job descriptor, on the generation cache line,
//! and every participant runs it in place: with the closure moved in too (when
//! it fits), a worker's first access after the generation line is the task's
//! own data, never the dispatcher's stack. Pointers in it (tasks, a closure
//! that did not fit) stay valid until [`Engine::dispatch`] returns, which is
//! after every participant has left the job (the `done` join), and `done`
//! itself lives on that same line: a dispatch moves one line to the worker and
//! back.

use crate::error::ThreadError;
use crate::knobs::{self, OVERSUBSCRIBED_JOIN_SPIN, SpinBudgets};
use crate::profile::{self, LineHeader, Mode, TraceSlot, Tracer};
use crate::sync::{
    self, Arc, AtomicU32, AtomicU64, AtomicUsize, JoinHandle, Ordering, UnsafeCell, WaitWord,
};
use crate::team::PanicSlot;
use crossbeam_utils::CachePadded;
use std::any::Any;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

/// How long one join fallback wait sleeps on the `done` word at most.
pub(crate) const JOIN_WAIT_TIMEOUT: Duration = Duration::from_millis(1);

/// One participant's share of a job: called once per participant per dispatch
/// with the job payload and the participant's [`Share`]; returns how far the
/// job advances the claim counter `next` in total, over all participants (a
/// function of the job alone, the same on every participant: see
/// [`claims_advance`]; 0 for a job that never claims).
///
/// # Safety
/// `payload` must have been made (by [`Payload::new`]) from the value the
/// function was monomorphized for, and what it points to must be live.
pub(crate) type RunFn = unsafe fn(payload: &Payload, share: Share<'_>) -> usize;

/// The inline bytes of a job payload: the first 40 share the generation line
/// with the header (a job of up to 5 words, such as `parallel_chunks` with a
/// closure of up to 4 captured words, or `parallel_for_slices` with up to 2,
/// travels on that one line); the rest fill the adjacent line of the 128-byte
/// block, before the profile start (a larger job costs that line too).
pub(crate) const PAYLOAD_BYTES: usize = 88;

/// A job's data (raw pointers into the caller's stack, a few integers, and the
/// closure itself when it fits), type-erased. Moved into the job descriptor
/// and used there in place; the dispatcher moves it back out after the join.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct Payload([MaybeUninit<u8>; PAYLOAD_BYTES]);

impl Payload {
    /// Whether a `C` fits a payload (size and alignment).
    pub(crate) const fn fits<C>() -> bool {
        size_of::<C>() <= PAYLOAD_BYTES && align_of::<C>() <= 8
    }

    /// Moves `c` in (a `Copy` value, or one that the caller leaks).
    ///
    /// # Panics
    /// When `C` does not fit ([`Payload::fits`]; a compile-time constant, so
    /// the check costs nothing).
    #[inline(always)]
    pub(crate) fn new<C>(c: C) -> Self {
        assert!(Self::fits::<C>(), "Payload::new: the value does not fit");
        let mut p = Payload([MaybeUninit::uninit(); PAYLOAD_BYTES]);
        // SAFETY: `C` fits and the buffer is 8-aligned (checked above).
        unsafe { p.0.as_mut_ptr().cast::<C>().write(c) };
        p
    }

    /// The value, in place.
    ///
    /// # Safety
    /// `self` must hold a live `C`, written by `Payload::new::<C>` or by
    /// `Engine::dispatch::<C>` (which checks size and alignment the same way).
    #[inline(always)]
    pub(crate) unsafe fn get_ref<C>(&self) -> &C {
        // SAFETY: the caller guarantees a live `C` here (size and alignment
        // were checked by whoever wrote it).
        unsafe { &*self.0.as_ptr().cast::<C>() }
    }

    /// Copies a `Copy` value out.
    ///
    /// # Safety
    /// As [`Payload::get_ref`].
    #[inline(always)]
    pub(crate) unsafe fn get<C: Copy>(&self) -> C {
        // SAFETY: as for `get_ref`.
        unsafe { *self.get_ref::<C>() }
    }
}

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
    /// `v` got dynamic claim number `v - base` (wrapping). Each participant
    /// keeps its own record of it (team/README.md, "Monotonic counters").
    pub(crate) base: usize,
    /// Tasks in the job.
    pub(crate) count: usize,
    /// The team's panic slot (chunks mode): the first task panic is recorded here.
    pub(crate) panic: &'a PanicSlot,
    /// This participant's trace slot, when profiling.
    pub(crate) tracer: Option<Tracer<'a>>,
}

/// The type-erased job descriptor published with a generation: a 16-byte
/// header and the payload, whose first 40 bytes complete the generation
/// line (with the generation word and `done`).
#[repr(C)]
pub(crate) struct JobRef {
    /// The job's share function; `None` tells the workers to exit (shutdown).
    run: Option<RunFn>,
    count: usize,
    /// The job's data, used in place by every participant.
    payload: Payload,
}

/// The generation word, the completion counter and the job descriptor, on one
/// cache line: the worker's read of a new generation brings the job with it
/// (the closure too, when it fits), and its `done` increment returns the same
/// line, so a dispatch moves one line to the worker and back
/// (team/README.md, "Actors and shared words").
#[repr(C)]
pub(crate) struct GenerationLine {
    /// Bumped (release) once per dispatch and once at shutdown; workers wait on it.
    word: WaitWord,
    /// Worker `done` increments, ever (wrapping u32, a futex word); the
    /// dispatcher joins on it reaching its target. Monotonic, never reset.
    done: WaitWord,
    /// The current job; written by the dispatcher only while no worker reads it.
    job: UnsafeCell<JobRef>,
    /// The profile start of the current job (end of the next line; read only
    /// when profiling), under the same protocol as `job`.
    start: UnsafeCell<Option<Instant>>,
}

// The generation word, `done`, the job header and the first 40 payload bytes
// share the first 64-byte line; the rest of the payload and the profile start
// fill the second (`CachePadded` aligns the struct to 128 bytes on x86_64 and
// aarch64, so the two lines form one aligned pair).
#[cfg(not(loom))]
const _: () = {
    assert!(std::mem::offset_of!(GenerationLine, done) == 4);
    assert!(std::mem::offset_of!(GenerationLine, job) == 8);
    assert!(std::mem::offset_of!(JobRef, payload) == 16);
    assert!(std::mem::offset_of!(GenerationLine, start) == 112);
    assert!(size_of::<GenerationLine>() <= 128);
    assert!(align_of::<CachePadded<GenerationLine>>() >= 64);
};

/// State shared by the dispatcher and the workers.
pub(crate) struct Shared {
    /// The generation word, `done` and the job (see [`GenerationLine`]).
    generation: CachePadded<GenerationLine>,
    /// The chunks-mode dynamic claim counter (wrapping, never reset: the
    /// dispatcher knows its value at every publish without reading it).
    next: CachePadded<AtomicUsize>,
    /// Workers currently inside (or about to enter) a futex wait on `generation`.
    parked: CachePadded<AtomicU32>,
    /// Workers that latched the initial generation (startup handshake only).
    ready: AtomicU32,
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
// lock, or immutable after creation. `job` holds raw pointers (and possibly a
// `Sync` closure) and is accessed under the generation protocol: the dispatcher writes it only between a
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
    /// The value of `next` once every participant left the last dispatch
    /// (participant 0's record; each worker keeps its own).
    next_base: usize,
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
                done: WaitWord::new(done_start),
                job: UnsafeCell::new(JobRef {
                    run: None,
                    count: 0,
                    payload: Payload::new(()),
                }),
                start: UnsafeCell::new(None),
            }),
            next: CachePadded::new(AtomicUsize::new(next_start)),
            parked: CachePadded::new(AtomicU32::new(0)),
            ready: AtomicU32::new(0),
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
                next_base: next_start,
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
    #[inline]
    pub(crate) fn take_panic(&self) -> Option<Box<dyn Any + Send>> {
        self.shared.panic.take()
    }

    /// Publishes a job, runs participant 0's share on the calling thread, and
    /// returns once every worker has left the job, with the job's data moved
    /// back out of the descriptor as the participants left it (the caller
    /// drops it). Only `size_of::<C>()` payload bytes are written and read
    /// back: a small job never touches the descriptor's second line.
    ///
    /// # Safety
    /// `run(&payload, _)` must be safe to call concurrently from every
    /// participant, with a payload holding `job` in place in the job
    /// descriptor, until this function returns, and must not unwind (job
    /// functions catch task panics). What `job` points to must stay valid
    /// until this function returns.
    #[inline(always)]
    pub(crate) unsafe fn dispatch<C>(
        &mut self,
        job: C,
        run: RunFn,
        mode: Mode,
        count: usize,
        chunk: usize,
    ) -> C {
        // A compile-time constant per `C` (not a `const` block: the callers
        // instantiate this for the variant of a job that does not fit too, in
        // a branch that never runs).
        assert!(Payload::fits::<C>(), "a job must fit the payload");
        let sh = &*self.shared;
        // State PUBLISH: the job fields, then the release bump. Nothing is
        // reset: `done` and `next` are monotonic, and every participant keeps
        // its own record of their values (no read of a line the workers wrote
        // last).
        let base = self.next_base;
        self.done_target = self.done_target.wrapping_add(sh.workers);
        let start = if sh.trace.is_some() {
            trace_start(sh)
        } else {
            None
        };
        // SAFETY: no worker reads `job` now: each one's previous read happened
        // before its `done` increment, which our previous join acquired; the
        // next read happens only after acquiring the bump below. The previous
        // payload was taken back by its dispatcher (or is `Copy`).
        sh.generation.job.with_mut(|j| unsafe {
            (*j).run = Some(run);
            (*j).count = count;
            (&raw mut (*j).payload).cast::<C>().write(job);
        });
        if start.is_some() {
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
        // the bump above. On a line the spinning workers never touch. (On
        // x86_64 this idempotent RMW compiles to a fence plus a load.)
        if sh.parked.fetch_add(0, Ordering::AcqRel) != 0 {
            sh.generation.word.wake_all();
        }
        // State RUN: participant 0 (bookkeeping after the publish).
        let region = crate::team::RegionGuard::enter();
        let tracer = match (&sh.trace, start) {
            (Some(t), Some(start)) => Some(Tracer { slot: &t[0], start }),
            _ => None,
        };
        // SAFETY: the caller guarantees `run` may be called with the payload in
        // place; we only read the descriptor, as the workers do.
        let claims = sh.generation.job.with(|j| unsafe {
            run(
                &(*j).payload,
                Share {
                    index: 0,
                    participants: sh.workers as usize + 1,
                    next: &sh.next,
                    base,
                    count,
                    panic: &sh.panic,
                    tracer,
                },
            )
        });
        drop(region);
        self.next_base = base.wrapping_add(claims);
        // State JOIN.
        join(sh, self.done_target);
        // Every participant's claims happened before its `done` increment (or
        // are ours), so the join acquired them all.
        debug_assert_eq!(
            sh.next.load(Ordering::Relaxed),
            self.next_base,
            "the claim counter advanced by the computed amount"
        );
        // SAFETY: every worker left the job (join), so nobody reads it now;
        // it holds the `C` written above, moved out once (the next dispatch
        // overwrites the bytes).
        let back = sh
            .generation
            .job
            .with(|j| unsafe { (&raw const (*j).payload).cast::<C>().read() });
        if let Some(start) = start {
            self.print_trace(mode, count, chunk, start);
        }
        back
    }

    /// Prints the profile line of the dispatch that just joined.
    #[cold]
    #[inline(never)]
    fn print_trace(&mut self, mode: Mode, count: usize, chunk: usize, start: Instant) {
        let Some(slots) = &self.shared.trace else {
            return;
        };
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

/// How far a chunks job of `count` tasks on `participants` participants with
/// claim size `chunk` advances the claim counter (what its share function
/// returns on every participant): with `count > participants`
/// every participant claims until its first failing claim, so the claims are
/// the `ceil((count - participants) / chunk)` successful ones plus one failing
/// claim per participant, `chunk` each; with `count <= participants` nobody
/// claims (team/README.md, "Monotonic counters").
pub(crate) fn claims_advance(count: usize, participants: usize, chunk: usize) -> usize {
    if count <= participants {
        return 0;
    }
    let successes = (count - participants).div_ceil(chunk);
    chunk.wrapping_mul(successes.wrapping_add(participants))
}

/// Zeroes the trace slots and reads the dispatch start time (profiling only).
#[cold]
#[inline(never)]
fn trace_start(sh: &Shared) -> Option<Instant> {
    for s in sh.trace.as_deref().unwrap_or(&[]) {
        s.reset();
    }
    Some(Instant::now())
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

/// State SHUTDOWN: publish the exit job, bump the generation, wake all, join all.
fn shutdown(sh: &Shared, handles: &mut Vec<JoinHandle<()>>) {
    if handles.is_empty() {
        return;
    }
    // SAFETY: as in `dispatch`: every worker is between generations (the last
    // join, or the startup handshake, happened), so none reads `job` until it
    // acquires the bump below.
    sh.generation.job.with_mut(|j| unsafe { (*j).run = None });
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
#[inline]
fn join(sh: &Shared, target: u32) {
    let mut bound = sh.budgets.join_spin;
    let mut spins = 0u32;
    loop {
        let d = sh.generation.done.word().load(Ordering::Acquire);
        if d == target {
            return;
        }
        spins += 1;
        if spins < bound {
            sync::spin_loop();
        } else {
            sh.generation.done.wait_timeout(d, JOIN_WAIT_TIMEOUT);
            sh.join_timed_waits.fetch_add(1, Ordering::Relaxed);
            bound = bound.min(sync::model_spin_cap(OVERSUBSCRIBED_JOIN_SPIN));
            spins = 0;
        }
    }
}

/// A worker thread's body (reference §3.3, "Worker loop").
fn worker_main(sh: &Shared, index: usize) {
    // A worker only ever runs task code, so it is always "inside a parallel
    // region" (as participant `index`): any parallel call made by a task runs
    // inline.
    crate::team::mark_worker_thread(index);
    // Numerics of tasks never depend on the spawner's float environment.
    crate::fp::enter_default_environment();
    let participants = sh.workers as usize + 1;
    let trace_slot = sh.trace.as_ref().map(|t| &*t[index]);
    // This worker's record of `next` at the start of each job: nobody claims
    // before the first dispatch, which follows our `ready` increment.
    let mut base = sh.next.load(Ordering::Relaxed);
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
        // States CHECK and RUN, on the descriptor in place.
        // SAFETY: we acquired the bump that published `job`; the dispatcher does
        // not write it again before our `done` increment below. The dispatcher
        // keeps what the payload points to alive until it has acquired that
        // increment, and `run` is the function made for that payload.
        let claims = sh.generation.job.with(|j| unsafe {
            let job = &*j;
            let run = job.run?;
            let tracer = match trace_slot {
                Some(slot) => sh
                    .generation
                    .start
                    .with(|s| *s)
                    .map(|start| Tracer { slot, start }),
                None => None,
            };
            Some(run(
                &job.payload,
                Share {
                    index,
                    participants,
                    next: &sh.next,
                    base,
                    count: job.count,
                    panic: &sh.panic,
                    tracer,
                },
            ))
        });
        let Some(claims) = claims else {
            // The exit job (shutdown): leave without touching `done`.
            return;
        };
        base = base.wrapping_add(claims);
        // State LEAVE: after this we never touch the job again.
        sh.generation.done.word().fetch_add(1, Ordering::Release);
    }
}
