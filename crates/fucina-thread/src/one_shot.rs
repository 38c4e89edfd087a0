//! [`OneShotWorker`]: one lazily started helper thread that runs one job at a
//! time, so a caller can overlap two branches (`join(a, b)`).
//!
//! # Protocol
//!
//! One futex word (`state`, a [`WaitWord`]) carries the whole handshake:
//!
//! | State | Meaning | Who leaves it |
//! |---|---|---|
//! | [`IDLE`] | no job; the helper sleeps | a caller, `IDLE -> RESERVED` (CAS, acquire) |
//! | [`RESERVED`] | a caller owns the slot and is writing the job descriptor | that caller, `-> JOB` (release) + wake |
//! | [`JOB`] | the descriptor is published; the helper runs it | the helper, `JOB -> DONE` (CAS, release) + wake |
//! | [`DONE`] | the job and its result slot are finished | the caller, `-> IDLE` (release) |
//! | [`STOP`] | shutdown (only from `Drop`, which owns the worker) | — |
//!
//! Proof sketch:
//! - *Exclusive slot*: only the caller whose CAS moved `IDLE -> RESERVED` writes
//!   the descriptor, and no other caller can reserve until it stores `IDLE`.
//! - *Publication*: the caller writes the descriptor and the job closure, then
//!   stores `JOB` with release; the helper reads them after an acquire load of
//!   `JOB`. The helper writes the result, then its release CAS to `DONE`; the
//!   caller reads the result after an acquire load of `DONE`.
//! - *No lost wake-up*: a sleeper passes the value it last read; the futex
//!   sleeps only while the word still holds it, and every transition a sleeper
//!   waits for (`-> JOB`, `-> DONE`, `-> STOP`) is followed by a wake.
//! - *Borrow safety*: the job lives in a slot on the caller's stack. `join`
//!   waits for `DONE` on every path, including a panic in the caller's own
//!   branch (caught, then resumed after the wait), so the helper never touches
//!   the slot after `join` returns.
//!
//! Atomics, the futex word, the cell and the spawn all go through
//! [`crate::sync`], so `tests/loom_one_shot.rs` model-checks this code.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

use crate::error::ThreadError;
use crate::sync::{Arc, AtomicBool, JoinHandle, Mutex, Ordering, UnsafeCell, WaitWord, spawn};

/// No job; the helper sleeps.
const IDLE: u32 = 0;
/// A caller owns the descriptor and is writing it.
const RESERVED: u32 = 1;
/// The descriptor is published; the helper runs it.
const JOB: u32 = 2;
/// The job finished; its result is in the caller's slot.
const DONE: u32 = 3;
/// Shutdown requested; the helper exits.
const STOP: u32 = 4;

/// A type-erased job: `run(data)`, where `data` points at a [`Slot`] on the
/// caller's stack. Copy-able, so publishing it allocates nothing.
#[derive(Clone, Copy)]
struct JobRef {
    data: *const (),
    run: unsafe fn(*const ()),
}

/// State shared between the worker handle and its helper thread.
struct Shared {
    state: WaitWord,
    /// Written only in `RESERVED` by the reserving caller, read only in `JOB`
    /// by the helper (see the module docs).
    job: UnsafeCell<Option<JobRef>>,
}

// SAFETY: `job` is only accessed under the state protocol above (one writer
// in RESERVED, one reader in JOB, ordered by release/acquire on `state`); the
// raw pointer inside points to a slot whose closure is `Send` (enforced by
// `OneShotWorker::join`'s bounds) and which outlives the job.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`: every access to the cell is serialized by `state`.
unsafe impl Sync for Shared {}

/// The caller-stack slot of one job: the closure going in, the result coming
/// out (a caught panic is an `Err` payload).
struct Slot<A, RA> {
    func: UnsafeCell<Option<A>>,
    result: UnsafeCell<Option<std::thread::Result<RA>>>,
}

/// Runs the job stored in the `Slot<A, RA>` at `data` on the helper thread.
///
/// # Safety
///
/// `data` must point to a live `Slot<A, RA>` whose `func` is `Some`, which no
/// other thread accesses until the helper's `JOB -> DONE` transition.
unsafe fn run_slot<A: FnOnce() -> RA, RA>(data: *const ()) {
    // SAFETY: the caller guarantees `data` is a live `Slot<A, RA>`.
    let slot = unsafe { &*data.cast::<Slot<A, RA>>() };
    // SAFETY: exclusive access to the slot until `DONE` (function contract).
    let func = slot.func.with_mut(|p| unsafe { (*p).take() });
    let func = func.expect("one-shot job slot was empty (protocol violation)");
    let result = panic::catch_unwind(AssertUnwindSafe(func));
    // SAFETY: as above; the caller reads the result only after `DONE`.
    slot.result.with_mut(|p| unsafe { *p = Some(result) });
}

/// The helper thread's body: sleep until a job or a stop arrives.
fn helper_loop(shared: &Shared) {
    // Jobs never depend on the spawner's float environment.
    crate::fp::enter_default_environment();
    loop {
        let state = shared.state.word().load(Ordering::Acquire);
        match state {
            JOB => {
                // SAFETY: in `JOB` the descriptor was written by the reserving
                // caller before its release store, read after our acquire load.
                let job = shared.job.with(|p| unsafe { *p });
                let job = job.expect("one-shot state JOB without a job (protocol violation)");
                // SAFETY: the descriptor points at the reserving caller's
                // slot, which stays alive and untouched until we publish DONE.
                unsafe { (job.run)(job.data) };
                let finished = shared.state.word().compare_exchange(
                    JOB,
                    DONE,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                if finished.is_err() {
                    // Only `Drop` leaves JOB otherwise, by storing STOP.
                    return;
                }
                shared.state.wake_all();
            }
            STOP => return,
            // IDLE, RESERVED, DONE: nothing for the helper to do yet.
            other => shared.state.wait(other),
        }
    }
}

/// One lazily started helper thread that runs one job at a time, so the
/// calling thread can overlap two branches of work (the reference uses it to
/// run the two matmul-backward products at once).
///
/// [`join(a, b)`](Self::join) runs `a` on the helper while the caller runs
/// `b`, and returns both results. The job may borrow the caller's data: `join`
/// always waits for it before returning (also when either branch panics), like
/// `std::thread::scope`. Jobs are type-erased on the caller's stack, so a
/// steady-state `join` allocates nothing.
///
/// The helper thread is started on the first `join` (or [`start`](Self::start)),
/// never at construction, sleeps on a futex between jobs, and is stopped and
/// joined when the worker is dropped.
///
/// One job at a time: if the worker is already busy — another thread is in
/// `join`, or `join` is called from inside a job or from the caller's branch
/// — the call runs `a` then `b` serially on the calling thread instead of
/// waiting (no deadlock, no queueing).
///
/// ```
/// use fucina_thread::OneShotWorker;
///
/// let worker = OneShotWorker::new();
/// let data: Vec<u64> = (1..=1000).collect();
/// let (left, right) = data.split_at(500);
/// // `left` is summed on the helper thread while this thread sums `right`.
/// let (a, b) = worker.join(|| left.iter().sum::<u64>(), || right.iter().sum::<u64>())?;
/// assert_eq!(a + b, 500_500);
/// # Ok::<(), fucina_thread::ThreadError>(())
/// ```
pub struct OneShotWorker {
    shared: Arc<Shared>,
    /// Fast-path "the helper is running" flag, set after `thread` is filled.
    started: AtomicBool,
    /// The helper's handle; also the lock that serializes its lazy start.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl OneShotWorker {
    /// A worker with no thread yet (the helper starts on first use).
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                state: WaitWord::new(IDLE),
                job: UnsafeCell::new(None),
            }),
            started: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// Whether the helper thread has been started.
    pub fn is_started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    /// Starts the helper thread if it is not running yet (idempotent; a
    /// failed start is retried by the next call).
    ///
    /// # Errors
    ///
    /// [`ThreadError::Spawn`] when the OS refuses to start the thread.
    pub fn start(&self) -> Result<(), ThreadError> {
        if self.is_started() {
            return Ok(());
        }
        let mut thread = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if thread.is_some() {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        let handle = spawn("fucina-one-shot".to_owned(), move || helper_loop(&shared)).map_err(
            |source| ThreadError::Spawn {
                what: "one-shot worker".to_owned(),
                source,
            },
        )?;
        *thread = Some(handle);
        self.started.store(true, Ordering::Release);
        Ok(())
    }

    /// Runs `a` on the helper thread while the calling thread runs `b`;
    /// returns `(a(), b())` once both have finished.
    ///
    /// Both closures may borrow from the caller's stack. If the worker is busy
    /// (see the type docs), `a` and `b` run serially on the calling thread.
    ///
    /// # Errors
    ///
    /// [`ThreadError::Spawn`] when the helper thread had to be started and the
    /// OS refused; neither closure has run then. Call [`start`](Self::start)
    /// first to separate the start-up failure from the work (and, e.g., fall
    /// back to running both branches inline).
    ///
    /// # Panics
    ///
    /// A panic in either branch is resumed on the caller after both branches
    /// have finished (the panic of `a` when both panic). The worker stays
    /// usable.
    pub fn join<A, B, RA, RB>(&self, a: A, b: B) -> Result<(RA, RB), ThreadError>
    where
        A: FnOnce() -> RA + Send,
        RA: Send,
        B: FnOnce() -> RB,
    {
        self.start()?;
        let state = self.shared.state.word();
        if state
            .compare_exchange(IDLE, RESERVED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // Busy: another join is in flight (another thread, or nested).
            let ra = a();
            return Ok((ra, b()));
        }
        let slot: Slot<A, RA> = Slot {
            func: UnsafeCell::new(Some(a)),
            result: UnsafeCell::new(None),
        };
        let job = JobRef {
            data: (&raw const slot).cast(),
            run: run_slot::<A, RA>,
        };
        // SAFETY: in RESERVED this thread is the only one touching `job`.
        self.shared.job.with_mut(|p| unsafe { *p = Some(job) });
        state.store(JOB, Ordering::Release);
        self.shared.state.wake_all();

        let rb = panic::catch_unwind(AssertUnwindSafe(b));

        // Always wait, even if `b` panicked: the helper may still use `slot`.
        loop {
            match state.load(Ordering::Acquire) {
                DONE => break,
                s @ (RESERVED | JOB) => self.shared.state.wait(s),
                s => unreachable!("one-shot worker in state {s} during a join"),
            }
        }
        // SAFETY: after DONE (acquire) the helper no longer touches the slot.
        let ra = slot.result.with_mut(|p| unsafe { (*p).take() });
        state.store(IDLE, Ordering::Release);
        let ra = ra.expect("one-shot job finished without a result (protocol violation)");
        match (ra, rb) {
            (Ok(ra), Ok(rb)) => Ok((ra, rb)),
            (Err(payload), _) | (_, Err(payload)) => resume(payload),
        }
    }
}

/// Resumes a caught panic (a separate function so `join` stays generic-light).
fn resume(payload: Box<dyn Any + Send>) -> ! {
    panic::resume_unwind(payload)
}

impl Default for OneShotWorker {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for OneShotWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneShotWorker")
            .field("started", &self.is_started())
            .finish()
    }
}

impl Drop for OneShotWorker {
    fn drop(&mut self) {
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            // `&mut self`: no join is in flight, so the helper is idle.
            self.shared.state.word().store(STOP, Ordering::Release);
            self.shared.state.wake_all();
            // The helper catches job panics, so it never panics itself.
            let _ = handle.join();
        }
    }
}
