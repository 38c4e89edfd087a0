//! Chained dispatch: a dependency graph of tasks in which a
//! running task makes successors runnable through [`Chain::enqueue`].
//!
//! Runnable indices live on an intrusive Treiber (lock-free LIFO) stack: the
//! per-team `next` array links indices and `head` holds the top
//! ([`EMPTY`] = empty). Seeds `0..initial_count` are pre-linked in ascending
//! order, so they pop as 0, 1, 2, …
//!
//! Soundness does not rest on the caller keeping the contract: every pop swaps
//! a per-index `claimed` flag, in release builds too, so an index can be handed
//! out (as `&mut T`) at most once per dispatch even if a double enqueue
//! corrupted the stack; a second claim panics instead of aliasing. Debug builds
//! add the contract checks (a task enqueued twice, or never claimed; see
//! `team/README.md`).

use crate::sync::{self, AtomicBool, AtomicUsize, Ordering};
use crate::team::PanicSlot;
use crate::team::dispatch::{Payload, Share};
use crossbeam_utils::CachePadded;

/// The empty-stack sentinel of the chained stack's `head` and `next` links.
pub(crate) const EMPTY: usize = usize::MAX;

/// Consecutive samples of a certain stall (nothing runnable, nothing running,
/// work outstanding) after which a debug build panics with "stalled".
#[cfg(debug_assertions)]
pub(crate) const STALL_CONFIRM_SAMPLES: u32 = 1024;

/// The per-team chained arrays, grown to the task count, never shrunk.
#[derive(Default)]
pub(crate) struct ChainArrays {
    next: Vec<AtomicUsize>,
    claimed: Vec<AtomicBool>,
    #[cfg(debug_assertions)]
    seen: Vec<AtomicBool>,
}

impl ChainArrays {
    /// Grows the arrays to `n` entries; `false` when memory is exhausted.
    pub(crate) fn grow(&mut self, n: usize) -> bool {
        fn grow_vec<T>(v: &mut Vec<T>, n: usize, f: impl Fn() -> T) -> bool {
            if v.len() >= n {
                return true;
            }
            if v.try_reserve_exact(n - v.len()).is_err() {
                return false;
            }
            v.resize_with(n, f);
            true
        }
        let ok = grow_vec(&mut self.next, n, || AtomicUsize::new(EMPTY))
            && grow_vec(&mut self.claimed, n, || AtomicBool::new(false));
        #[cfg(debug_assertions)]
        let ok = ok && grow_vec(&mut self.seen, n, || AtomicBool::new(false));
        ok
    }
}

/// The handle a chained task gets: [`Chain::enqueue`] makes another task runnable.
///
/// Within one `parallel_chained` call, the seeds (`0..initial_count`) together
/// with every `enqueue` must name each task index exactly once.
pub struct Chain<'a> {
    head: CachePadded<AtomicUsize>,
    next: &'a [AtomicUsize],
    n: usize,
    #[cfg(debug_assertions)]
    seen: &'a [AtomicBool],
    #[cfg(debug_assertions)]
    enqueued: AtomicUsize,
}

impl std::fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("tasks", &self.n)
            .finish_non_exhaustive()
    }
}

impl<'a> Chain<'a> {
    /// Builds the stack for `n` tasks over the first `n` entries of `arrays`,
    /// with seeds `0..seeds` linked so they pop in ascending order.
    pub(crate) fn new(arrays: &'a ChainArrays, n: usize, seeds: usize) -> Self {
        debug_assert!(seeds >= 1 && seeds <= n && arrays.next.len() >= n);
        let next = &arrays.next[..n];
        for (i, link) in next[..seeds].iter().enumerate() {
            link.store(if i + 1 < seeds { i + 1 } else { EMPTY }, Ordering::Relaxed);
        }
        for c in &arrays.claimed[..n] {
            c.store(false, Ordering::Relaxed);
        }
        #[cfg(debug_assertions)]
        for (i, s) in arrays.seen[..n].iter().enumerate() {
            s.store(i < seeds, Ordering::Relaxed);
        }
        Chain {
            head: CachePadded::new(AtomicUsize::new(0)),
            next,
            n,
            #[cfg(debug_assertions)]
            seen: &arrays.seen[..n],
            #[cfg(debug_assertions)]
            enqueued: AtomicUsize::new(0),
        }
    }

    /// The number of tasks in this chained dispatch.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the dispatch has no tasks (never true inside a running task).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Makes task `i` runnable (pushes it on the LIFO stack).
    ///
    /// # Panics
    /// When `i` is out of range; in debug builds also when `i` was already a
    /// seed or enqueued in this dispatch ("enqueued twice").
    pub fn enqueue(&self, i: usize) {
        assert!(
            i < self.n,
            "Chain::enqueue: task index {i} out of range for {} tasks",
            self.n
        );
        #[cfg(debug_assertions)]
        {
            if self.seen[i].swap(true, Ordering::Relaxed) {
                panic!(
                    "Chain::enqueue: task {i} enqueued twice (seeds + enqueues must name each task once)"
                );
            }
            self.enqueued.fetch_add(1, Ordering::Relaxed);
        }
        let mut h = self.head.load(Ordering::Relaxed);
        loop {
            self.next[i].store(h, Ordering::Relaxed);
            match self
                .head
                .compare_exchange_weak(h, i, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => h = actual,
            }
        }
    }

    /// Pops the most recently made-runnable task, `None` when the stack is empty.
    fn pop(&self) -> Option<usize> {
        let mut h = self.head.load(Ordering::Acquire);
        loop {
            if h == EMPTY {
                return None;
            }
            // `h < n` always: only `enqueue` (range-checked) and the seeding
            // write `head`/`next`, so every link is an index or EMPTY.
            let nx = self.next[h].load(Ordering::Relaxed);
            match self
                .head
                .compare_exchange_weak(h, nx, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(h),
                Err(actual) => h = actual,
            }
        }
    }

    /// Debug builds: enqueues made so far.
    #[cfg(debug_assertions)]
    pub(crate) fn enqueued(&self) -> usize {
        self.enqueued.load(Ordering::Relaxed)
    }
}

/// A chained job on the dispatching caller's stack.
pub(crate) struct ChainedJob<'a, T, F> {
    tasks: *mut T,
    n: usize,
    run: &'a F,
    pub(crate) chain: Chain<'a>,
    claimed: &'a [AtomicBool],
    completed: CachePadded<AtomicUsize>,
    #[cfg(debug_assertions)]
    in_flight: CachePadded<AtomicUsize>,
    pub(crate) panic: PanicSlot,
}

impl<'a, T, F> ChainedJob<'a, T, F> {
    pub(crate) fn new(
        tasks: &'a mut [T],
        seeds: usize,
        run: &'a F,
        arrays: &'a ChainArrays,
    ) -> Self {
        let n = tasks.len();
        ChainedJob {
            tasks: tasks.as_mut_ptr(),
            n,
            run,
            chain: Chain::new(arrays, n, seeds),
            claimed: &arrays.claimed[..n],
            completed: CachePadded::new(AtomicUsize::new(0)),
            #[cfg(debug_assertions)]
            in_flight: CachePadded::new(AtomicUsize::new(0)),
            panic: PanicSlot::new(),
        }
    }

    /// Tasks that finished.
    #[cfg(debug_assertions)]
    pub(crate) fn completed(&self) -> usize {
        self.completed.load(Ordering::Acquire)
    }
}

/// One participant's share of a chained job.
///
/// # Safety
/// `payload` must hold a pointer to a live `ChainedJob<'_, T, F>` whose `tasks` pointer
/// covers `n` initialized `T`s that nothing else accesses during the dispatch.
pub(crate) unsafe fn run_chained<T: Send, F: Fn(&mut T, &Chain<'_>) + Sync>(
    payload: &Payload,
    share: Share<'_>,
) {
    let tracer = share.tracer;
    // SAFETY: the caller passes the payload this function was made for: a
    // pointer to a live `ChainedJob<'_, T, F>`.
    let job = unsafe { &*payload.get::<*const ChainedJob<'_, T, F>>() };
    if let Some(t) = tracer {
        t.claimed();
    }
    let mut ran = 0u64;
    #[cfg(debug_assertions)]
    let (mut stall_samples, mut last_completed) = (0u32, usize::MAX);
    loop {
        if job.completed.load(Ordering::Acquire) >= job.n || job.panic.panicked() {
            break;
        }
        #[cfg(debug_assertions)]
        let c0 = job.completed.load(Ordering::SeqCst);
        #[cfg(debug_assertions)]
        job.in_flight.fetch_add(1, Ordering::SeqCst);
        match job.chain.pop() {
            Some(i) => {
                if job.claimed[i].swap(true, Ordering::Relaxed) {
                    job.panic.catch(|| {
                        panic!(
                            "parallel_chained: task {i} was handed out twice in one dispatch \
                             (a task was enqueued twice)"
                        )
                    });
                } else {
                    // SAFETY: `i < n` (stack invariant) and the `claimed` swap above
                    // succeeded for the first time in this dispatch, so no other
                    // `&mut` to task `i` exists; `T: Send` lets it move threads.
                    let task = unsafe { &mut *job.tasks.add(i) };
                    job.panic.catch(|| (job.run)(task, &job.chain));
                    ran += 1;
                    job.completed.fetch_add(1, Ordering::Release);
                }
                #[cfg(debug_assertions)]
                job.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
            None => {
                #[cfg(debug_assertions)]
                {
                    job.in_flight.fetch_sub(1, Ordering::SeqCst);
                    // A certain stall: nothing was running at t0, the stack was
                    // empty at t1, nothing was running at t2 and nothing completed
                    // since before t0 (team/README.md, "stall detection").
                    let stalled = c0 < job.n
                        && job.in_flight.load(Ordering::SeqCst) == 0
                        && job.chain.head.load(Ordering::SeqCst) == EMPTY
                        && job.in_flight.load(Ordering::SeqCst) == 0
                        && job.completed.load(Ordering::SeqCst) == c0;
                    if c0 != last_completed {
                        // Progress since the last sample: start counting afresh.
                        last_completed = c0;
                        stall_samples = 0;
                    } else if stalled {
                        stall_samples += 1;
                        if stall_samples >= STALL_CONFIRM_SAMPLES {
                            job.panic.catch(|| {
                                panic!(
                                    "parallel_chained: stalled with {c0} of {} tasks completed and \
                                     none runnable (seeds + enqueues must name each task once)",
                                    job.n
                                )
                            });
                            break;
                        }
                    }
                }
                sync::spin_loop();
            }
        }
    }
    if let Some(t) = tracer {
        t.completed(ran);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn seeds_pop_in_ascending_order_and_enqueues_are_lifo() {
        let mut arrays = ChainArrays::default();
        assert!(arrays.grow(6));
        let chain = Chain::new(&arrays, 6, 3);
        assert_eq!(chain.pop(), Some(0));
        chain.enqueue(4);
        chain.enqueue(3);
        assert_eq!(chain.pop(), Some(3));
        assert_eq!(chain.pop(), Some(4));
        assert_eq!(chain.pop(), Some(1));
        chain.enqueue(5);
        assert_eq!(chain.pop(), Some(5));
        assert_eq!(chain.pop(), Some(2));
        assert_eq!(chain.pop(), None);
    }

    #[test]
    fn arrays_grow_but_never_shrink() {
        let mut arrays = ChainArrays::default();
        assert!(arrays.grow(10));
        assert!(arrays.grow(4));
        assert_eq!(arrays.next.len(), 10);
        // Reusing a prefix resets only what the dispatch uses.
        let chain = Chain::new(&arrays, 4, 4);
        assert_eq!(
            (0..5).map(|_| chain.pop()).collect::<Vec<_>>(),
            [Some(0), Some(1), Some(2), Some(3), None]
        );
    }
}
