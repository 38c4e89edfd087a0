//! The dispatch / park / join protocol of `team/README.md`.
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
//! after every participant that *entered* the job has left it (the `done`
//! join). A worker enters through the job's **seat** word, which the
//! dispatcher closes once it has claimed every task nobody else claimed; a
//! worker that comes too late (descheduled, parked) finds the seat closed and
//! touches nothing of the job, so the join waits for the work, not for every
//! worker to check in. The seat and `done` live on the generation line.

use crate::error::ThreadError;
use crate::knobs::{self, OVERSUBSCRIBED_JOIN_SPIN, SpinBudgets};
use crate::profile::{self, LineHeader, Mode, TraceSlot, Tracer};
#[cfg(test)]
use crate::sync::AtomicBool;
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

/// One participant's share of a job: called once per participant that
/// entered the dispatch, with the job payload and the participant's
/// [`Share`]; the dispatcher calls it a second time, with [`Share::steal`]
/// set, to run the static tasks of the workers that never entered.
///
/// # Safety
/// `payload` must have been made (by [`Payload::new`]) from the value the
/// function was monomorphized for, and what it points to must be live.
pub(crate) type RunFn = unsafe fn(payload: &Payload, share: Share<'_>);

/// The inline bytes of a job payload: the first 32 share the generation line
/// with the header (a job of up to 4 words, such as `parallel_chunks` with a
/// closure of up to 3 captured words, or `parallel_for_slices` with up to 1,
/// travels on that one line); the rest fill the adjacent line of the 128-byte
/// block, before the profile start (a larger job costs that line too).
pub(crate) const PAYLOAD_BYTES: usize = 80;

/// The seat bit that closes a job: set by the dispatcher once every task is
/// claimed; a worker never enters a closed seat.
pub(crate) const SEAT_CLOSED: u64 = 1 << 63;

/// Worker `index`'s (`1..=63`) bit in the seat word: set when it entered.
#[inline(always)]
pub(crate) const fn seat_bit(index: usize) -> u64 {
    1 << (index - 1)
}

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

    /// Moves the value out (the payload must not be used as a `C` again).
    ///
    /// # Safety
    /// As [`Payload::get_ref`].
    #[inline(always)]
    pub(crate) unsafe fn take<C>(&self) -> C {
        // SAFETY: as for `get_ref`; the caller reads it out once.
        unsafe { self.0.as_ptr().cast::<C>().read() }
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
/// claim counter (chunks mode), the task count, the panic slot, its trace
/// slot, and (the dispatcher's second call only) the static tasks to steal.
#[derive(Clone, Copy)]
pub(crate) struct Share<'a> {
    /// This participant (0 = the dispatcher, `1..=W` = the workers).
    pub(crate) index: usize,
    /// Participants of the dispatch (`W + 1`).
    pub(crate) participants: usize,
    /// The dynamic claim counter: 0 when the job was published, a claim that
    /// returns `v` got dynamic claim number `v`.
    pub(crate) next: &'a AtomicUsize,
    /// 0 for an ordinary share. Otherwise the dispatcher's call after the
    /// seat closed: run exactly the static tasks of the workers whose
    /// [`seat_bit`] is set here (they never entered and never will), nothing
    /// else. Chained jobs get no such call.
    pub(crate) steal: u64,
    /// Tasks in the job.
    pub(crate) count: usize,
    /// The team's panic slot (chunks mode): the first task panic is recorded here.
    pub(crate) panic: &'a PanicSlot,
    /// This participant's trace slot, when profiling.
    pub(crate) tracer: Option<Tracer<'a>>,
}

/// The type-erased job descriptor published with a generation: a 16-byte
/// header and the payload, whose first 32 bytes complete the generation
/// line (with the generation word, `done` and the seat).
#[repr(C)]
pub(crate) struct JobRef {
    /// The job's share function; `None` tells the workers to exit (shutdown).
    run: Option<RunFn>,
    count: usize,
    /// The job's data, used in place by every participant.
    payload: Payload,
}

/// The generation word, the completion counter, the seat and the job
/// descriptor, on one cache line: the worker's read of a new generation brings
/// the seat and the job with it (the closure too, when it fits), and its seat
/// and `done` updates return the same line (team/README.md, "Actors and
/// shared words").
#[repr(C)]
pub(crate) struct GenerationLine {
    /// Bumped (release) once per dispatch and once at shutdown; workers wait on it.
    pub(crate) word: WaitWord,
    /// Worker `done` increments, ever (wrapping u32, a futex word); the
    /// dispatcher joins on it reaching its target. Monotonic, never reset.
    done: WaitWord,
    /// The current job's seat: [`SEAT_CLOSED`] plus the [`seat_bit`] of every
    /// worker that entered it. Stored 0 (open, empty; release) by PUBLISH
    /// after the job is written; a worker enters with an acquire CAS that sets
    /// its bit only while the seat is open; the dispatcher closes it with an
    /// RMW, whose result says exactly who entered.
    seat: AtomicU64,
    /// The current job; written by the dispatcher only while no worker reads it.
    job: UnsafeCell<JobRef>,
    /// The profile start of the current job (end of the next line; read only
    /// when profiling), under the same protocol as `job`.
    start: UnsafeCell<Option<Instant>>,
}

// The generation word, `done`, the seat, the job header and the first 32
// payload bytes share the first 64-byte line; the rest of the payload and the
// profile start fill the second (`CachePadded` aligns the struct to 128 bytes
// on x86_64 and aarch64, so the two lines form one aligned pair).
#[cfg(not(loom))]
const _: () = {
    assert!(std::mem::offset_of!(GenerationLine, done) == 4);
    assert!(std::mem::offset_of!(GenerationLine, seat) == 8);
    assert!(std::mem::offset_of!(GenerationLine, job) == 16);
    assert!(std::mem::offset_of!(JobRef, payload) == 16);
    assert!(std::mem::offset_of!(GenerationLine, start) == 112);
    assert!(size_of::<GenerationLine>() <= 128);
    assert!(align_of::<CachePadded<GenerationLine>>() >= 64);
};

/// State shared by the dispatcher and the workers.
pub(crate) struct Shared {
    /// The generation word, `done` and the job (see [`GenerationLine`]).
    pub(crate) generation: CachePadded<GenerationLine>,
    /// The chunks-mode dynamic claim counter: 0 at every publish (the
    /// dispatcher resets it after a job that used it).
    next: CachePadded<AtomicUsize>,
    /// Workers currently inside (or about to enter) a futex wait on `generation`.
    parked: CachePadded<AtomicU32>,
    /// Workers that latched the initial generation (startup handshake only).
    ready: AtomicU32,
    /// The first task panic of the current chunks-mode dispatch.
    panic: CachePadded<PanicSlot>,
    /// Timed waits taken by the join fallback (diagnostics and tests); shared
    /// with the `Team`, which reads it without holding `active`.
    join_timed_waits: Arc<AtomicU64>,
    /// Test hook: while set, workers do not try to enter a job (they behave
    /// as if descheduled) and count the generations they skipped.
    #[cfg(test)]
    pub(crate) hold: AtomicBool,
    /// Test hook: generations a held worker let pass.
    #[cfg(test)]
    pub(crate) held: AtomicU32,
    workers: u32,
    budgets: SpinBudgets,
    /// One slot per participant (index 0 = dispatcher) when profiling.
    trace: Option<Box<[CachePadded<TraceSlot>]>>,
}

// SAFETY: every field but `generation.job`/`generation.start` is an atomic, a
// lock, or immutable after creation. `job` holds raw pointers (and possibly a
// `Sync` closure) and is accessed under the seat protocol: the dispatcher
// writes it only between a completed join (the seat closed, and the `done`
// increment of every worker that entered acquired) and the next (release)
// seat store, and workers read it only after entering that seat (acquire CAS)
// and before their `done` increment, so no write races a read
// (team/README.md, P2). The data its payload points to is `Sync` (the job
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
    pub(crate) shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    /// The profile line's dispatch counter (starts at 1, wraps).
    dispatches: u32,
    /// The value of `done` once every entered worker left the last dispatch.
    done_target: u32,
    /// Whether the last job moved the claim counter (so PUBLISH resets it).
    next_dirty: bool,
    /// The adaptive serial mode (team/README.md, "Adaptive parallelism").
    pub(crate) adapt: crate::team::adapt::Adapt,
}

#[cfg(test)]
std::thread_local! {
    /// Test hook: make the spawn of this worker index fail (0 = never).
    pub(crate) static FAIL_SPAWN_AT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Test hook: the initial value of `done` (to cross the wrap).
    pub(crate) static COUNTER_START: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The initial value of the monotonic `done` counter.
fn counter_start() -> u32 {
    #[cfg(test)]
    {
        COUNTER_START.with(|c| c.get())
    }
    #[cfg(not(test))]
    {
        0
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
    pub(crate) fn start(
        workers: usize,
        join_timed_waits: Arc<AtomicU64>,
    ) -> Result<Core, ThreadError> {
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
        let done_start = counter_start();
        let shared = Arc::new(Shared {
            generation: CachePadded::new(GenerationLine {
                word: WaitWord::new(0),
                done: WaitWord::new(done_start),
                seat: AtomicU64::new(SEAT_CLOSED),
                job: UnsafeCell::new(JobRef {
                    run: None,
                    count: 0,
                    payload: Payload::new(()),
                }),
                start: UnsafeCell::new(None),
            }),
            next: CachePadded::new(AtomicUsize::new(0)),
            parked: CachePadded::new(AtomicU32::new(0)),
            ready: AtomicU32::new(0),
            panic: CachePadded::new(PanicSlot::new()),
            join_timed_waits,
            #[cfg(test)]
            hold: AtomicBool::new(false),
            #[cfg(test)]
            held: AtomicU32::new(0),
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
                next_dirty: false,
                adapt: Default::default(),
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

    /// The spin budgets fixed at team start.
    pub(crate) fn budgets(&self) -> SpinBudgets {
        self.shared.budgets
    }

    /// Takes the first task panic recorded by the last chunks-mode dispatch.
    #[inline]
    pub(crate) fn take_panic(&self) -> Option<Box<dyn Any + Send>> {
        self.shared.panic.take()
    }

    /// Publishes a job, runs participant 0's share on the calling thread,
    /// closes the job's seat, runs the static tasks of the workers that did not
    /// enter (chunks mode), and returns once every worker that entered has
    /// left the job, with the job's data moved back out of the descriptor as
    /// the participants left it (the caller drops it). Only `size_of::<C>()`
    /// payload bytes are written and read back: a small job never touches the
    /// descriptor's second line.
    ///
    /// In the adaptive serial mode (team/README.md, "Adaptive parallelism")
    /// nothing is published: the caller runs every task of a small job itself,
    /// exactly as in a dispatch that no worker entered.
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
        let participants = self.workers() + 1;
        if self.adapt.run_alone(count, participants) {
            // SAFETY: as ours; a single participant runs the job.
            return unsafe { self.run_alone(job, run, mode, count) };
        }
        let sh = &*self.shared;
        // State PUBLISH: reset the claim counter if the last job moved it, the
        // job fields, the seat (release), then the release bump. Every worker
        // that entered the last job left it (the join acquired its `done`
        // increment); no other worker touched `next` or the descriptor.
        if self.next_dirty {
            sh.next.store(0, Ordering::Relaxed);
        }
        self.next_dirty = mode == Mode::Chunks && count > participants;
        let start = if sh.trace.is_some() {
            trace_start(sh)
        } else {
            None
        };
        // SAFETY: no worker reads `job` now: each one that entered the last
        // job read it before its `done` increment, which our previous join
        // acquired, and a worker reads it only after entering a seat, which is
        // closed until the store below. The previous payload was taken back by
        // its dispatcher (or is `Copy`).
        sh.generation.job.with_mut(|j| unsafe {
            (*j).run = Some(run);
            (*j).count = count;
            (&raw mut (*j).payload).cast::<C>().write(job);
        });
        if start.is_some() {
            // SAFETY: as for `job`.
            sh.generation.start.with_mut(|s| unsafe { *s = start });
        }
        // Open the seat: a worker's acquire CAS that enters reads from this
        // store (or from another entering worker's CAS, in its release
        // sequence), so the job written above happens-before its reads.
        sh.generation.seat.store(0, Ordering::Release);
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
        let share = Share {
            index: 0,
            participants,
            next: &sh.next,
            count,
            panic: &sh.panic,
            tracer,
            steal: 0,
        };
        // SAFETY: the caller guarantees `run` may be called with the payload in
        // place; we only read the descriptor, as the workers do.
        sh.generation
            .job
            .with(|j| unsafe { run(&(*j).payload, share) });
        if self.adapt.probing() {
            // A probe of the adaptive mode: give parked workers the time to
            // wake and enter before closing (README, "Adaptive parallelism").
            await_entries(sh, all_seats(self.workers()), PROBE_PATIENCE);
        }
        // State CLOSE: every task is claimed now, except the static tasks of
        // workers that have not entered. The RMW reads the latest seat value:
        // a worker whose bit it shows entered before (and runs its static
        // task); any other worker's entry CAS comes later, sees the closed
        // seat and fails, so its static task is ours alone.
        let entered = sh.generation.seat.fetch_or(SEAT_CLOSED, Ordering::Relaxed) & !SEAT_CLOSED;
        let all = all_seats(self.workers());
        let absent = all & !entered;
        if absent != 0 && mode == Mode::Chunks {
            // SAFETY: as for the share above.
            sh.generation.job.with(|j| unsafe {
                run(
                    &(*j).payload,
                    Share {
                        steal: absent,
                        ..share
                    },
                )
            });
        }
        drop(region);
        // State JOIN: every worker that entered increments `done` once.
        let target = self.done_target.wrapping_add(entered.count_ones());
        self.done_target = target;
        let slept = join(sh, target);
        self.adapt.record(absent != 0 || slept);
        // SAFETY: every worker that entered left the job (join) and no other
        // worker will read it (closed seat), so nobody reads it now; it holds
        // the `C` written above, moved out once (the next dispatch overwrites
        // the bytes).
        let back = sh
            .generation
            .job
            .with(|j| unsafe { (&raw const (*j).payload).cast::<C>().read() });
        if let Some(start) = start {
            self.print_trace(mode, count, chunk, start);
        }
        back
    }

    /// The adaptive serial mode's dispatch: runs every task of the job on the
    /// calling thread, as participant 0 of a dispatch no worker entered
    /// (inside a parallel region, so nested calls and per-participant slots
    /// behave as in a parallel dispatch), without publishing anything.
    ///
    /// # Safety
    /// As [`Engine::dispatch`] (with one participant).
    #[cold]
    #[inline(never)]
    unsafe fn run_alone<C>(&mut self, job: C, run: RunFn, mode: Mode, count: usize) -> C {
        let sh = &*self.shared;
        let payload = Payload::new(job);
        let next = AtomicUsize::new(0);
        let region = crate::team::RegionGuard::enter();
        let share = Share {
            index: 0,
            participants: self.workers() + 1,
            next: &next,
            count,
            panic: &sh.panic,
            tracer: None,
            steal: 0,
        };
        // SAFETY: the caller guarantees `run` may be called with this payload
        // (it holds `job`); only this thread uses it.
        unsafe { run(&payload, share) };
        if mode == Mode::Chunks {
            let steal = all_seats(self.workers());
            // SAFETY: as above: the static tasks nobody else runs.
            unsafe { run(&payload, Share { steal, ..share }) };
        }
        drop(region);
        // SAFETY: `payload` holds the `C` moved in above, read out once.
        unsafe { payload.take::<C>() }
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

/// How long a probe of the adaptive mode waits, after the dispatcher's own
/// share, for every worker to enter before it closes the seat: a parked
/// worker's wake-up latency, so that an idle team is seen as back.
pub(crate) const PROBE_PATIENCE: Duration = Duration::from_micros(200);

/// Spins until every worker of `all` entered the seat or `patience` passed.
#[cold]
#[inline(never)]
fn await_entries(sh: &Shared, all: u64, patience: Duration) {
    let t0 = Instant::now();
    loop {
        for _ in 0..64 {
            if sh.generation.seat.load(Ordering::Relaxed) & all == all {
                return;
            }
            sync::spin_loop();
        }
        if t0.elapsed() >= patience {
            return;
        }
    }
}

/// The seat bits of workers `1..=workers`.
#[inline(always)]
pub(crate) fn all_seats(workers: usize) -> u64 {
    debug_assert!(workers < 64);
    (1u64 << workers) - 1
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

/// State SHUTDOWN: publish the exit job, open the seat, bump the generation,
/// wake all, join all.
fn shutdown(sh: &Shared, handles: &mut Vec<JoinHandle<()>>) {
    if handles.is_empty() {
        return;
    }
    // SAFETY: as in `dispatch`: no worker is inside a job (the last join, or
    // the startup handshake, happened; the seat is closed), so none reads
    // `job` until it enters the seat opened below.
    sh.generation.job.with_mut(|j| unsafe { (*j).run = None });
    #[cfg(test)]
    sh.hold.store(false, Ordering::Relaxed);
    sh.generation.seat.store(0, Ordering::Release);
    sh.generation.word.word().fetch_add(1, Ordering::Release);
    sh.generation.word.wake_all();
    for h in handles.drain(..) {
        // A worker never unwinds (task panics are caught), so join cannot fail;
        // if it did, there is nothing useful to do with the payload in drop.
        let _ = h.join();
    }
}

/// The join: spin up to the join bound, then 1 ms timed waits
/// on `done` itself (workers never wake it), with the bound dropped to
/// [`OVERSUBSCRIBED_JOIN_SPIN`] after the first wait. Returns when `done`
/// reaches `target` (it never passes it: see team/README.md, P2), and whether
/// it had to sleep (a worker that entered was slow to leave).
#[inline]
fn join(sh: &Shared, target: u32) -> bool {
    let mut bound = sh.budgets.join_spin;
    let mut spins = 0u32;
    let mut slept = false;
    loop {
        let d = sh.generation.done.word().load(Ordering::Acquire);
        if d == target {
            return slept;
        }
        spins += 1;
        if spins < bound {
            sync::spin_loop();
        } else {
            sh.generation.done.wait_timeout(d, JOIN_WAIT_TIMEOUT);
            sh.join_timed_waits.fetch_add(1, Ordering::Relaxed);
            bound = bound.min(sync::model_spin_cap(OVERSUBSCRIBED_JOIN_SPIN));
            spins = 0;
            slept = true;
        }
    }
}

/// State ENTER: sets this worker's bit in the seat if the seat is open and the
/// bit clear; `false` when the job is closed (it completed, or is completing,
/// without us) or already entered by us.
#[inline(always)]
fn enter(sh: &Shared, bit: u64) -> bool {
    let seat = &sh.generation.seat;
    let mut s = seat.load(Ordering::Relaxed);
    loop {
        if s & (SEAT_CLOSED | bit) != 0 {
            return false;
        }
        // Acquire: the descriptor written before the seat was opened (the
        // release store of PUBLISH heads the release sequence this CAS reads
        // from) happens-before our reads of it.
        match seat.compare_exchange(s, s | bit, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => s = now,
        }
    }
}

/// A worker thread's body (team/README.md, "Worker states").
fn worker_main(sh: &Shared, index: usize) {
    // A worker only ever runs task code, so it is always "inside a parallel
    // region" (as participant `index`): any parallel call made by a task runs
    // inline.
    crate::team::mark_worker_thread(index);
    // Numerics of tasks never depend on the spawner's float environment.
    crate::fp::enter_default_environment();
    let participants = sh.workers as usize + 1;
    let trace_slot = sh.trace.as_ref().map(|t| &*t[index]);
    let bit = seat_bit(index);
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
        #[cfg(test)]
        if sh.hold.load(Ordering::Relaxed) {
            // Test hook: behave as a worker descheduled past this job.
            sh.held.fetch_add(1, Ordering::Release);
            while sh.hold.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
        }
        // State ENTER: a closed seat means the job is done (or being finished
        // by the dispatcher) without us: touch nothing of it, wait for the
        // next generation.
        if !enter(sh, bit) {
            continue;
        }
        // States CHECK and RUN, on the descriptor in place.
        // SAFETY: we entered the seat (acquire), which the dispatcher opened
        // after writing `job`; it does not write `job` again before our `done`
        // increment below, and keeps what the payload points to alive until it
        // has acquired that increment; `run` is the function made for that payload.
        let ran = sh.generation.job.with(|j| unsafe {
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
            run(
                &job.payload,
                Share {
                    index,
                    participants,
                    next: &sh.next,
                    count: job.count,
                    panic: &sh.panic,
                    tracer,
                    steal: 0,
                },
            );
            Some(())
        });
        if ran.is_none() {
            // The exit job (shutdown): leave without touching `done`.
            return;
        }
        // State LEAVE: after this we never touch the job again.
        sh.generation.done.word().fetch_add(1, Ordering::Release);
    }
}
