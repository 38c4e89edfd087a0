//! The dispatch / park / join protocol of `team/README.md` (reference §3.2–3.5).
//!
//! [`Shared`] is the state the workers see (behind an `Arc`); [`Core`] is the
//! dispatcher-side owner (thread handles, chained arrays, the profile counter),
//! touched only by the thread that holds the team's `active` flag.
//!
//! A job is type-erased as a context pointer plus a monomorphized
//! [`RunFn`]; the context lives on the dispatching caller's stack and is valid
//! until [`Core::dispatch`] returns, which is after every participant has left
//! the job (the `done` join).

use crate::error::ThreadError;
use crate::knobs::{self, OVERSUBSCRIBED_JOIN_SPIN, SpinBudgets};
use crate::profile::{self, LineHeader, Mode, TraceSlot, Tracer};
use crate::sync::{
    self, Arc, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, JoinHandle, Ordering, UnsafeCell,
    WaitWord,
};
use crossbeam_utils::CachePadded;
use std::time::{Duration, Instant};

/// How long one join fallback wait sleeps on the `done` word at most.
pub(crate) const JOIN_WAIT_TIMEOUT: Duration = Duration::from_millis(1);

/// One participant's share of a job: called once per participant per dispatch
/// with the job context and the participant's [`Share`].
///
/// # Safety
/// `ctx` must point to the live job object the function was monomorphized for.
pub(crate) type RunFn = unsafe fn(ctx: *const (), share: Share<'_>);

/// What a participant gets besides the job context: the shared claim counter
/// (chunks mode), the task count and claim chunk, and its trace slot.
#[derive(Clone, Copy)]
pub(crate) struct Share<'a> {
    /// The claim counter (`job_next` of the reference), reset to 0 per dispatch.
    pub(crate) next: &'a AtomicUsize,
    /// Tasks in the job.
    pub(crate) count: usize,
    /// Tasks per claim.
    pub(crate) chunk: usize,
    /// This participant's trace slot, when profiling.
    pub(crate) tracer: Option<Tracer<'a>>,
}

/// The type-erased job descriptor published with a generation.
#[derive(Clone, Copy)]
pub(crate) struct JobRef {
    ctx: *const (),
    run: RunFn,
    count: usize,
    chunk: usize,
    start: Option<Instant>,
}

/// The completion counter and the claim counter, on one cache line: a worker's
/// last (failed) claim brings the line its `done` increment needs.
pub(crate) struct JoinLine {
    /// Workers that finished the current generation; the dispatcher joins on it.
    done: WaitWord,
    /// The chunks-mode claim counter.
    next: AtomicUsize,
}

/// The generation word and the job descriptor it publishes, on one cache line:
/// the worker's read of a new generation brings the job with it.
pub(crate) struct GenerationLine {
    /// Bumped (`SeqCst`) once per dispatch and once at shutdown; workers wait on it.
    word: WaitWord,
    /// The current job; written by the dispatcher only while no worker reads it.
    job: UnsafeCell<Option<JobRef>>,
}

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
    /// Timed waits taken by the join fallback (diagnostics and tests).
    join_timed_waits: AtomicU64,
    workers: u32,
    budgets: SpinBudgets,
    /// One slot per participant (index 0 = dispatcher) when profiling.
    trace: Option<Box<[CachePadded<TraceSlot>]>>,
}

// SAFETY: every field but `generation.job` is an atomic or immutable after creation. `job`
// holds a raw context pointer and is accessed under the generation protocol:
// the dispatcher writes it only between a completed join (every worker's
// `done` increment acquired) and the next `SeqCst` generation bump, and workers
// read it only after acquiring that bump and before their `done` increment, so
// no write races a read (team/README.md, "job descriptor"). The context it points
// to is `Sync` data (the job types require `Sync` closures and tasks).
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
}

#[cfg(test)]
std::thread_local! {
    /// Test hook: make the spawn of this worker index fail (0 = never).
    pub(crate) static FAIL_SPAWN_AT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
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
        let profile = !cfg!(loom) && knobs::env_flag("FUCINA_POOL_PROFILE");
        let trace = profile.then(|| {
            (0..=workers)
                .map(|_| CachePadded::new(TraceSlot::new()))
                .collect::<Box<[_]>>()
        });
        let shared = Arc::new(Shared {
            generation: CachePadded::new(GenerationLine {
                word: WaitWord::new(0),
                job: UnsafeCell::new(None),
            }),
            join: CachePadded::new(JoinLine {
                done: WaitWord::new(0),
                next: AtomicUsize::new(0),
            }),
            parked: CachePadded::new(AtomicU32::new(0)),
            ready: AtomicU32::new(0),
            shutdown: AtomicBool::new(false),
            join_timed_waits: AtomicU64::new(0),
            workers: u32::try_from(workers).expect("worker count below MAX_THREADS"),
            budgets,
            trace,
        });
        let mut handles = Vec::with_capacity(workers);
        for index in 1..=workers {
            let sh = Arc::clone(&shared);
            #[cfg(test)]
            let spawned = if FAIL_SPAWN_AT.with(|f| f.get()) == index {
                Err(std::io::Error::other("injected spawn failure"))
            } else {
                sync::spawn(format!("fucina-team-{index}"), move || {
                    worker_main(&sh, index)
                })
            };
            #[cfg(not(test))]
            let spawned = sync::spawn(format!("fucina-team-{index}"), move || {
                worker_main(&sh, index)
            });
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

    /// Publishes a job, runs participant 0's share on the calling thread, and
    /// returns once every worker has left the job.
    ///
    /// # Safety
    /// `run(ctx, _)` must be safe to call concurrently from every participant
    /// until this function returns, and must not unwind (job functions catch
    /// task panics). `ctx` must stay valid until this function returns.
    pub(crate) unsafe fn dispatch(
        &mut self,
        ctx: *const (),
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
        // State PUBLISH: job fields, then `done = 0`, then the SeqCst bump.
        // SAFETY: no worker reads `job` now: each one's previous read happened
        // before its `done` increment, which our previous join acquired; the
        // next read happens only after acquiring the bump below.
        sh.generation.job.with_mut(|j| unsafe {
            *j = Some(JobRef {
                ctx,
                run,
                count,
                chunk,
                start,
            })
        });
        sh.join.next.store(0, Ordering::Relaxed);
        sh.join.done.word().store(0, Ordering::Relaxed);
        sh.generation.word.word().fetch_add(1, Ordering::SeqCst);
        sync::dekker_fence();
        if sh.parked.load(Ordering::SeqCst) != 0 {
            sh.generation.word.wake_all();
        }
        // State RUN: participant 0.
        let tracer = sh
            .trace
            .as_ref()
            .zip(start)
            .map(|(t, start)| Tracer { slot: &t[0], start });
        // SAFETY: the caller guarantees `run` may be called with `ctx` here.
        unsafe {
            run(
                ctx,
                Share {
                    next: &sh.join.next,
                    count,
                    chunk,
                    tracer,
                },
            )
        };
        // State JOIN.
        join(sh);
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
    sh.generation.word.word().fetch_add(1, Ordering::SeqCst);
    sync::dekker_fence();
    sh.generation.word.wake_all();
    for h in handles.drain(..) {
        // A worker never unwinds (task panics are caught), so join cannot fail;
        // if it did, there is nothing useful to do with the payload in drop.
        let _ = h.join();
    }
}

/// The join of reference §3.5: spin up to the join bound, then 1 ms timed waits
/// on `done` itself (workers never wake it), with the bound dropped to
/// [`OVERSUBSCRIBED_JOIN_SPIN`] after the first wait.
fn join(sh: &Shared) {
    let mut bound = sh.budgets.join_spin;
    let mut spins = 0u32;
    loop {
        let d = sh.join.done.word().load(Ordering::Acquire);
        if d == sh.workers {
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
    crate::team::mark_worker_thread();
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
                sh.parked.fetch_add(1, Ordering::SeqCst);
                sync::dekker_fence();
                sh.generation.word.wait(g);
                sh.parked.fetch_sub(1, Ordering::SeqCst);
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
        let job = sh
            .generation
            .job
            .with(|j| unsafe { *j })
            .expect("a published generation carries a job");
        let tracer = sh.trace.as_ref().zip(job.start).map(|(t, start)| Tracer {
            slot: &t[index],
            start,
        });
        // SAFETY: the dispatcher keeps `job.ctx` alive until it has acquired our
        // `done` increment, and `job.run` is the function made for that context.
        unsafe {
            (job.run)(
                job.ctx,
                Share {
                    next: &sh.join.next,
                    count: job.count,
                    chunk: job.chunk,
                    tracer,
                },
            )
        };
        // State LEAVE: after this we never touch the job again.
        sh.join.done.word().fetch_add(1, Ordering::Release);
    }
}
