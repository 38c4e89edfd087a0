//! Memory diagnostics: [`memory_stats`] (the buffer pool's two tiers and the
//! autograd graph-node list of a context, with per-step deltas) and
//! [`CountingAllocator`], a global allocator that counts heap allocations, to
//! check the zero-allocation promise of a steady-state loop in your own
//! program.
//!
//! `docs/GUIDE.md` ("Memory and diagnostics") walks through both.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt;
use std::ops::Sub;
use std::sync::atomic::{AtomicU64, Ordering};

use fucina_exec::ExecContext;
use fucina_storage::PoolStats;

/// A snapshot of the memory a context manages, from [`memory_stats`].
///
/// Two kinds of numbers: the pool *counters* (`hits`, `misses`, `returned`,
/// `discarded` of each tier) only grow, and the *gauges* (cached bytes,
/// outstanding buffers, free graph nodes) go up and down. Subtracting two
/// snapshots (`after - before`) gives a [`MemoryDelta`]: what one step cost.
///
/// In steady state a training step shows `shared.misses == 0` in its delta (no
/// buffer came from the system allocator) and unchanged gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MemoryStats {
    /// The counters of the context's local tier (the calling thread's cache in
    /// front of the shared pool): `hits` were served locally, `misses` went on
    /// to the shared tier, `returned` releases were cached locally and
    /// `discarded` ones passed on to the shared tier. Acquires and releases on
    /// the team's worker threads go to the shared tier and do not show here.
    pub local: PoolStats,
    /// The counters of the shared tier: its `misses` are the acquires that
    /// allocated a fresh block from the system allocator, its `discarded` the
    /// releases that freed one.
    pub shared: PoolStats,
    /// Bytes cached in the local tier.
    pub local_cached_bytes: usize,
    /// Bytes cached in the shared tier.
    pub shared_cached_bytes: usize,
    /// Pooled buffers of the context currently alive (tensors, views' storage,
    /// scratch leases): what [`ExecContext::close`] would report as leaked.
    pub outstanding_buffers: usize,
    /// Released autograd graph nodes waiting for reuse
    /// ([`free_graph_nodes`](crate::free_graph_nodes)): an op that records a
    /// node takes one from this list instead of allocating, so the list
    /// shrinking to zero during a step means nodes were allocated.
    pub free_graph_nodes: usize,
}

/// The memory a context manages, now: both tiers of its buffer pool and its
/// autograd graph-node list. Reading it takes the pool's locks briefly and
/// allocates nothing.
///
/// ```
/// use fucina::{ExecContext, Tensor, memory_stats};
///
/// let ctx = ExecContext::new();
/// let w = Tensor::variable_from_slice(&ctx, &[256], &[0.5; 256])?;
/// let step = |ctx: &ExecContext| -> fucina::Result<()> {
///     let loss = w.mul(ctx, &w)?.sum_all(ctx)?;
///     loss.backward(ctx)?;
///     w.zero_grad();
///     Ok(())
/// };
/// step(&ctx)?; // warm-up: fills the pool and the node list
/// let before = memory_stats(&ctx);
/// step(&ctx)?;
/// let delta = memory_stats(&ctx) - before;
/// assert_eq!(delta.shared.misses, 0, "{delta}"); // no fresh buffer
/// assert!(delta.is_steady(), "{delta}");
/// # Ok::<(), fucina::Error>(())
/// ```
pub fn memory_stats(ctx: &ExecContext) -> MemoryStats {
    let local = ctx.pool();
    let shared = local.pool();
    MemoryStats {
        local: local.stats(),
        shared: shared.stats(),
        local_cached_bytes: local.cached_bytes(),
        shared_cached_bytes: shared.cached_bytes(),
        outstanding_buffers: local.outstanding_buffers(),
        free_graph_nodes: fucina_autograd::free_graph_nodes(ctx),
    }
}

/// [`memory_stats`] as a method: `ctx.memory_stats()`.
pub trait MemoryStatsExt {
    /// See [`memory_stats`].
    fn memory_stats(&self) -> MemoryStats;
}

impl MemoryStatsExt for ExecContext {
    fn memory_stats(&self) -> MemoryStats {
        memory_stats(self)
    }
}

/// The difference of two [`MemoryStats`] (`after - before`): the counters'
/// increments and the gauges' signed changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MemoryDelta {
    /// Local-tier counter increments.
    pub local: PoolStats,
    /// Shared-tier counter increments (`misses`: fresh blocks allocated,
    /// `discarded`: blocks freed).
    pub shared: PoolStats,
    /// Change of the local tier's cached bytes.
    pub local_cached_bytes: i64,
    /// Change of the shared tier's cached bytes.
    pub shared_cached_bytes: i64,
    /// Change of the live pooled buffers.
    pub outstanding_buffers: i64,
    /// Change of the free graph-node list.
    pub free_graph_nodes: i64,
}

impl MemoryDelta {
    /// Whether the interval was a steady state: no buffer allocated or freed
    /// by the pool (no shared-tier miss or discard), and every gauge back where
    /// it was (same cached bytes, live buffers and free graph nodes).
    pub fn is_steady(&self) -> bool {
        self.shared.misses == 0
            && self.shared.discarded == 0
            && self.local_cached_bytes == 0
            && self.shared_cached_bytes == 0
            && self.outstanding_buffers == 0
            && self.free_graph_nodes == 0
    }
}

fn counter_delta(after: PoolStats, before: PoolStats) -> PoolStats {
    let mut d = after;
    d.hits = after.hits.wrapping_sub(before.hits);
    d.misses = after.misses.wrapping_sub(before.misses);
    d.returned = after.returned.wrapping_sub(before.returned);
    d.discarded = after.discarded.wrapping_sub(before.discarded);
    d
}

fn gauge_delta(after: usize, before: usize) -> i64 {
    (after as i64).wrapping_sub(before as i64)
}

impl Sub for MemoryStats {
    type Output = MemoryDelta;

    fn sub(self, before: MemoryStats) -> MemoryDelta {
        MemoryDelta {
            local: counter_delta(self.local, before.local),
            shared: counter_delta(self.shared, before.shared),
            local_cached_bytes: gauge_delta(self.local_cached_bytes, before.local_cached_bytes),
            shared_cached_bytes: gauge_delta(self.shared_cached_bytes, before.shared_cached_bytes),
            outstanding_buffers: gauge_delta(self.outstanding_buffers, before.outstanding_buffers),
            free_graph_nodes: gauge_delta(self.free_graph_nodes, before.free_graph_nodes),
        }
    }
}

fn write_counters(
    f: &mut fmt::Formatter<'_>,
    tier: &str,
    sign: &str,
    s: &PoolStats,
) -> fmt::Result {
    write!(
        f,
        "{tier}: hits {sign}{} misses {sign}{} returned {sign}{} discarded {sign}{}",
        s.hits, s.misses, s.returned, s.discarded
    )
}

impl fmt::Display for MemoryStats {
    /// One line: both tiers' counters and cached bytes, live buffers, free graph nodes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_counters(f, "local", "", &self.local)?;
        write!(f, " cached {} B; ", self.local_cached_bytes)?;
        write_counters(f, "shared", "", &self.shared)?;
        write!(
            f,
            " cached {} B; live buffers {}; free graph nodes {}",
            self.shared_cached_bytes, self.outstanding_buffers, self.free_graph_nodes
        )
    }
}

impl fmt::Display for MemoryDelta {
    /// One line, as [`MemoryStats`]'s, with signed changes for the gauges.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_counters(f, "local", "+", &self.local)?;
        write!(f, " cached {:+} B; ", self.local_cached_bytes)?;
        write_counters(f, "shared", "+", &self.shared)?;
        write!(
            f,
            " cached {:+} B; live buffers {:+}; free graph nodes {:+}",
            self.shared_cached_bytes, self.outstanding_buffers, self.free_graph_nodes
        )
    }
}

thread_local! {
    /// Allocations made by this thread through a [`CountingAllocator`].
    static THREAD_ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Heap-allocation counts of a [`CountingAllocator`] (process-wide).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AllocCounts {
    /// Calls of `alloc`, `alloc_zeroed` and `realloc` (a reallocation is an
    /// allocation: it may move the block).
    pub allocations: u64,
    /// Calls of `dealloc`.
    pub deallocations: u64,
    /// Bytes requested by those allocations (a `realloc` counts its new size).
    pub bytes_allocated: u64,
}

impl Sub for AllocCounts {
    type Output = AllocCounts;

    /// The counts of the interval between two snapshots (`after - before`).
    fn sub(self, before: AllocCounts) -> AllocCounts {
        AllocCounts {
            allocations: self.allocations.wrapping_sub(before.allocations),
            deallocations: self.deallocations.wrapping_sub(before.deallocations),
            bytes_allocated: self.bytes_allocated.wrapping_sub(before.bytes_allocated),
        }
    }
}

/// A global allocator that forwards to the system allocator and counts the
/// heap allocations, process-wide and per thread: install it to check that a
/// loop of yours allocates nothing once warm.
///
/// Counting costs a few relaxed atomic additions per allocation and changes
/// nothing about the memory handed out.
///
/// Prefer the per-thread count ([`CountingAllocator::thread_allocations`],
/// [`CountingAllocator::count_thread`]) for a check: other threads (a test
/// harness reporting progress, a logger) may allocate at any moment. With a
/// one-thread context (`ExecContext::with_threads(1)`) everything a step
/// does runs on the calling thread.
///
/// ```
/// use fucina::diag::CountingAllocator;
/// use fucina::{ExecContext, Tensor};
///
/// #[global_allocator]
/// static ALLOC: CountingAllocator = CountingAllocator::new();
///
/// # fn main() -> fucina::Result<()> {
/// let ctx = ExecContext::with_threads(1);
/// let w = Tensor::variable_from_slice(&ctx, &[64], &[0.5; 64])?;
/// let step = || -> fucina::Result<()> {
///     let scope = ctx.open_exec_scope();
///     let loss = w.mul(&ctx, &w)?.sum_all(&ctx)?;
///     loss.backward(&ctx)?;
///     drop(loss);
///     ctx.close_exec_scope(scope);
///     w.zero_grad();
///     Ok(())
/// };
/// step()?; // warm-up
/// let (result, allocations) = CountingAllocator::count_thread(step);
/// result?;
/// assert_eq!(allocations, 0);
/// assert!(ALLOC.counts().allocations > 0); // the warm-up allocated
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Default)]
pub struct CountingAllocator {
    allocations: AtomicU64,
    deallocations: AtomicU64,
    bytes_allocated: AtomicU64,
}

impl CountingAllocator {
    /// A counter at zero, for `#[global_allocator] static A: CountingAllocator
    /// = CountingAllocator::new();`.
    pub const fn new() -> CountingAllocator {
        CountingAllocator {
            allocations: AtomicU64::new(0),
            deallocations: AtomicU64::new(0),
            bytes_allocated: AtomicU64::new(0),
        }
    }

    /// The process-wide counts so far (subtract two snapshots for an interval).
    pub fn counts(&self) -> AllocCounts {
        AllocCounts {
            allocations: self.allocations.load(Ordering::Relaxed),
            deallocations: self.deallocations.load(Ordering::Relaxed),
            bytes_allocated: self.bytes_allocated.load(Ordering::Relaxed),
        }
    }

    /// The allocations the calling thread has made so far through the
    /// installed `CountingAllocator` (0 if none is installed).
    pub fn thread_allocations() -> u64 {
        THREAD_ALLOCATIONS.try_with(Cell::get).unwrap_or(0)
    }

    /// Runs `f` and returns its result with the number of heap allocations the
    /// calling thread made meanwhile (those of other threads are not counted).
    pub fn count_thread<R>(f: impl FnOnce() -> R) -> (R, u64) {
        let before = Self::thread_allocations();
        let r = f();
        let after = Self::thread_allocations();
        (r, after.wrapping_sub(before))
    }

    fn record(&self, bytes: usize) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.bytes_allocated
            .fetch_add(bytes as u64, Ordering::Relaxed);
        // `try_with`: during thread teardown the slot may be gone; a const
        // initializer and no destructor mean it never allocates.
        let _ = THREAD_ALLOCATIONS.try_with(|c| c.set(c.get().wrapping_add(1)));
    }
}

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged and returns its result; counting (atomics and a
// const-initialized thread-local without destructor, neither of which
// allocates) has no effect on the memory handed out.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.record(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.deallocations.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by this allocator (hence by `System`)
        // with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.record(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.record(new_size);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract; `ptr`
        // came from `System` through this allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
