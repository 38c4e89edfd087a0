//! The two-arm buffer pool: the shared tier (see `docs/MEMORY.md`).

use std::fmt;
use std::ptr::NonNull;

use crate::aligned::AlignedBlock;
use crate::buffer::{Arm, Buffer, Header, Home};
use crate::dtype::Scalar;
use crate::freelist::{Chain, FreeIndex};
use crate::lease::ScratchLease;
use crate::local::{LocalCounters, LocalPool};
use crate::sync::{Arc, AtomicUsize, Mutex, Ordering};
use crate::{DType, StorageError};

/// Default cap on cached (free-list) bytes, shared by both arms: 1 GiB.
pub const DEFAULT_MAX_CACHED_BYTES: usize = 1 << 30;

/// Slab byte sizes are rounded up to a multiple of this.
pub const SLAB_QUANTUM: usize = 4096;

/// f32 requests up to this many elements round to a power of two, larger ones to a
/// multiple of it.
pub const F32_ROUNDING_THRESHOLD: usize = 1024;

/// The f32 arm's size class for a request of `len` elements: the next power of two up
/// to 1024, then the next multiple of 1024.
///
/// ```
/// use fucina_storage::round_f32_len;
///
/// assert_eq!(round_f32_len(3)?, 4);
/// assert_eq!(round_f32_len(1025)?, 2048);
/// assert_eq!(round_f32_len(3000)?, 3072);
/// assert!(round_f32_len(0).is_err());
/// # Ok::<(), fucina_storage::StorageError>(())
/// ```
///
/// # Errors
/// [`StorageError::ZeroLength`] for 0; [`StorageError::SizeOverflow`] when the rounded
/// length or its byte size does not fit in `usize`.
pub fn round_f32_len(len: usize) -> Result<usize, StorageError> {
    let rounded = match len {
        0 => return Err(StorageError::ZeroLength),
        1..=F32_ROUNDING_THRESHOLD => Some(len.next_power_of_two()),
        _ => len.checked_next_multiple_of(F32_ROUNDING_THRESHOLD),
    };
    rounded
        .filter(|r| r.checked_mul(size_of::<f32>()).is_some())
        .ok_or(StorageError::SizeOverflow {
            len,
            element_size: size_of::<f32>(),
        })
}

/// The slab arm's size class for a request of `bytes`: `max(bytes, 1)` rounded up to a
/// multiple of [`SLAB_QUANTUM`] (so 0 and 1 both give 4096).
///
/// ```
/// use fucina_storage::round_slab_bytes;
///
/// assert_eq!(round_slab_bytes(2920)?, 4096);
/// assert_eq!(round_slab_bytes(5840)?, 8192);
/// # Ok::<(), fucina_storage::StorageError>(())
/// ```
///
/// # Errors
/// [`StorageError::SizeOverflow`] (with `element_size: 1`) when the rounding overflows.
pub fn round_slab_bytes(bytes: usize) -> Result<usize, StorageError> {
    bytes
        .max(1)
        .checked_next_multiple_of(SLAB_QUANTUM)
        .ok_or(StorageError::SizeOverflow {
            len: bytes,
            element_size: 1,
        })
}

/// Counters of one pool tier since it was created: the shared tier's from
/// [`BufferPool::stats`], a local tier's from [`LocalPool::stats`] (which documents what
/// its fields count there).
///
/// Each counts events of both arms (f32 buffers, typed buffers and scratch leases).
/// The shared tier updates them under the arm locks (a snapshot is consistent per
/// arm); they never reset (compare snapshots as deltas).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PoolStats {
    /// Acquires served from the cache (no allocation).
    pub hits: u64,
    /// Acquires that found no fitting cached entry and allocated a fresh block
    /// (including those whose allocation then failed).
    pub misses: u64,
    /// Releases that put their buffer or slab back into the cache.
    pub returned: u64,
    /// Releases that freed their buffer or slab instead: it would have pushed the
    /// cached bytes over the cap, or the pool was closed (its last handle dropped).
    pub discarded: u64,
}

/// The lock-protected part of one arm.
struct ArmState {
    /// The cached headers of this arm (whole f32 buffer objects, or untyped slabs each
    /// with a recycled header), by size class.
    free: FreeIndex,
    /// Set (with the free list emptied) when the last [`BufferPool`] handle drops;
    /// later releases destroy instead of caching.
    closed: bool,
    /// This arm's share of the counters of [`BufferPool::stats`].
    stats: PoolStats,
}

/// One arm: its lock and its outstanding count.
struct ArmShared {
    state: Mutex<ArmState>,
    /// Checkouts minus releases through this arm's lock (wrapping: a buffer checked out
    /// by one tier may come back through another, so only the sum over the arms and the
    /// local tiers is meaningful). Written only under the lock, read without it.
    outstanding: AtomicUsize,
    /// Bytes in this arm's free list: a copy of `free.bytes()`, stored under the lock
    /// after every change, for the other arm's cap check and for observers.
    cached: AtomicUsize,
}

impl ArmShared {
    fn new(arm: Arm) -> Self {
        Self {
            state: Mutex::new(ArmState {
                free: FreeIndex::new(arm),
                closed: false,
                stats: PoolStats::default(),
            }),
            outstanding: AtomicUsize::new(0),
            cached: AtomicUsize::new(0),
        }
    }

    /// Publishes the free list's byte total after a change (the caller holds the lock).
    fn sync_cached(&self, locked: &ArmState) {
        self.cached.store(locked.free.bytes(), Ordering::Relaxed);
    }

    /// `outstanding += delta` (wrapping). The `_locked` borrow of the guarded state
    /// proves the caller holds the lock: every writer does, so a plain load and store is
    /// exact and avoids a locked read-modify-write on the hot path.
    fn add_outstanding(&self, _locked: &ArmState, delta: usize) {
        let v = self.outstanding.load(Ordering::Relaxed);
        self.outstanding
            .store(v.wrapping_add(delta), Ordering::Release);
    }
}

/// The state every clone of a [`BufferPool`] and every pooled object shares: the
/// shared tier.
pub(crate) struct PoolShared {
    /// Indexed by `Arm as usize`: one lock per arm. The cap on both arms' cached bytes
    /// is kept exactly without a shared counter: see [`PoolShared::cache`].
    arms: [ArmShared; 2],
    max_cached_bytes: AtomicUsize,
    /// The local tiers' counters, for an exact outstanding total.
    locals: Mutex<LocalRegistry>,
}

/// The outstanding counters of a pool's live local tiers, and what the gone ones left.
struct LocalRegistry {
    live: Vec<Arc<LocalCounters>>,
    /// Sum (wrapping) of the counts of local tiers already unregistered.
    retired: usize,
}

impl PoolShared {
    fn arm(&self, arm: Arm) -> &ArmShared {
        &self.arms[arm as usize]
    }

    /// Bytes in both arms' free lists.
    fn cached_bytes(&self) -> usize {
        self.arms
            .iter()
            .map(|a| a.cached.load(Ordering::Relaxed))
            .sum()
    }

    /// The cap check and insert of a release into `arm`, whose lock the caller holds
    /// (`state`): `Ok` when cached, `Err(hdr)` when only both locks can decide
    /// ([`PoolShared::cache_slow`]: near the cap, or the pool is closed).
    ///
    /// The cap is exact without a counter shared by the arms: with only its own lock,
    /// a release is cached when its arm stays within half the cap and the other arm is
    /// within half the cap too. The other arm can only pass half the cap under both
    /// locks (the slow path), so it cannot do so meanwhile, and the total stays within
    /// the cap. Near the cap the slow path takes both locks (F32 then slab, the only
    /// order in which two are ever held) and checks the exact total, so a release is
    /// kept exactly when `cached + bytes <= cap`.
    fn cache_fast(
        &self,
        arm: Arm,
        state: &mut ArmState,
        hdr: Box<Header>,
    ) -> Result<(), Box<Header>> {
        let half = self.max_cached_bytes.load(Ordering::Relaxed) / 2;
        let other = self.arm(arm.other()).cached.load(Ordering::Relaxed);
        if state.closed || hdr.bytes > half.saturating_sub(state.free.bytes()) || other > half {
            return Err(hdr);
        }
        let a = self.arm(arm);
        let kept = state.free.push(hdr);
        if kept.is_ok() {
            state.stats.returned += 1;
            a.sync_cached(state);
        }
        kept
    }

    /// The exact cap check under both locks, for releases the fast path could not
    /// decide. Returns the headers to free (over the cap, or the pool is closed).
    fn cache_slow(&self, arm: Arm, mut chain: Chain) -> Chain {
        let mut rejected = Chain::new();
        let mut f32_state = self.arm(Arm::F32).state.lock();
        let mut slab_state = self.arm(Arm::Slab).state.lock();
        let cap = self.max_cached_bytes.load(Ordering::Relaxed);
        while let Some(hdr) = chain.pop() {
            let total = f32_state.free.bytes() + slab_state.free.bytes();
            let state = match arm {
                Arm::F32 => &mut *f32_state,
                Arm::Slab => &mut *slab_state,
            };
            // `bytes <= cap - total` is `total + bytes <= cap` without overflow:
            // reaching the cap exactly is allowed.
            let kept = if !state.closed && hdr.bytes <= cap.saturating_sub(total) {
                state.free.push(hdr)
            } else {
                Err(hdr)
            };
            match kept {
                Ok(()) => state.stats.returned += 1,
                Err(hdr) => {
                    state.stats.discarded += 1;
                    rejected.push(hdr);
                }
            }
        }
        self.arm(Arm::F32).sync_cached(&f32_state);
        self.arm(Arm::Slab).sync_cached(&slab_state);
        rejected
    }

    /// First fit: removes and returns the smallest cached entry of `arm` holding at least
    /// `bytes`, or `None` (a miss). Either way it counts one more outstanding object
    /// (a miss that then fails to allocate calls [`PoolShared::cancel_checkout`]).
    fn take(&self, arm: Arm, bytes: usize) -> Option<Box<Header>> {
        let a = self.arm(arm);
        let mut state = a.state.lock();
        a.add_outstanding(&state, 1);
        let hdr = state.free.pop_fit(bytes);
        match &hdr {
            Some(_) => {
                state.stats.hits += 1;
                a.sync_cached(&state);
            }
            None => state.stats.misses += 1,
        }
        hdr
    }

    /// Undoes the outstanding count of a checkout whose fresh allocation failed.
    fn cancel_checkout(&self, arm: Arm) {
        let a = self.arm(arm);
        let state = a.state.lock();
        a.add_outstanding(&state, usize::MAX);
    }

    /// Takes a cached entry or allocates a fresh zeroed one, and marks it as handed out
    /// (one reference, +1 outstanding). A fresh header gets its home (this pool's state)
    /// here and keeps it for life, so a hit needs no `Arc` clone. Returns whether it was
    /// a hit.
    pub(crate) fn checkout(
        this: &Arc<PoolShared>,
        arm: Arm,
        bytes: usize,
    ) -> Result<(Box<Header>, bool), StorageError> {
        // On the thread of a local tier of this pool, its cache first: releases on that
        // thread go there, so shared acquires made there must see them.
        if let Some(hdr) = crate::local::try_acquire(Arc::as_ptr(this), arm, bytes) {
            hdr.refs.store(1, Ordering::Relaxed);
            return Ok((hdr, true));
        }
        let (hdr, hit) = match this.take(arm, bytes) {
            Some(hdr) => {
                debug_assert!(hdr.home.as_ref().is_some_and(|h| h.arm == arm));
                (hdr, true)
            }
            // Unlocked: the fresh allocation touches no shared pool state.
            None => match AlignedBlock::new_zeroed(bytes) {
                Ok(block) => {
                    let mut hdr = Header::with_block(block);
                    hdr.home = Some(Home {
                        shared: Arc::clone(this),
                        arm,
                    });
                    (hdr, false)
                }
                Err(e) => {
                    this.cancel_checkout(arm);
                    return Err(e);
                }
            },
        };
        // We own the header exclusively (it came out of the locked list or is fresh).
        hdr.refs.store(1, Ordering::Relaxed);
        Ok((hdr, hit))
    }

    /// A typed buffer of at least `len` elements from `this` pool: `f32` from the f32
    /// arm, every other type from the slab arm (recycled `bool` memory zeroed).
    pub(crate) fn acquire_typed<T: Scalar>(
        this: &Arc<PoolShared>,
        len: usize,
    ) -> Result<Buffer<T>, StorageError> {
        let (arm, bytes) = typed_request::<T>(len)?;
        let (hdr, hit) = Self::checkout(this, arm, bytes)?;
        Ok(typed_buffer(hdr, hit))
    }

    /// The release hook: caches `hdr` (on top of its size class: LIFO) unless that would
    /// push the cached bytes over the cap or the pool is closed, in which case it is
    /// destroyed.
    ///
    /// Takes the state by pointer, not `&self`: once `hdr` is cached and the lock is
    /// released, the last handle's drop may drain the list and free the state before
    /// this function returns, so no reference to it may outlive the guard.
    ///
    /// # Safety
    /// `this` is the state `hdr.home` holds an `Arc` to.
    pub(crate) unsafe fn reclaim(this: NonNull<PoolShared>, arm: Arm, hdr: Box<Header>) {
        // `shared` and the guard live in this block only: once `hdr` is cached and the
        // lock released, a concurrent close may drain the list and free the state, so
        // nothing past the block may refer to it. A rejected header comes out of the
        // block and is destroyed after it.
        let rejected = {
            // SAFETY: `hdr` holds an `Arc` to the state, so it is alive while we own
            // `hdr`; once `hdr` is cached, the free list keeps it alive until the lock is
            // released (draining needs the lock), which is within this block.
            let shared = unsafe { this.as_ref() };
            let a = shared.arm(arm);
            let slow = {
                let mut state = a.state.lock();
                a.add_outstanding(&state, usize::MAX);
                // The closed check is made under the same lock as the drain in `close`:
                // a release either lands in the list before the drain (and is freed by
                // it) or sees `closed` (and frees itself).
                shared.cache_fast(arm, &mut state, hdr).err()
            };
            slow.map(|hdr| {
                let mut one = Chain::new();
                one.push(hdr);
                shared.cache_slow(arm, one)
            })
        };
        // Destroyed outside the lock. This may drop the last `Arc` to the state (a
        // closed pool).
        drop(rejected);
    }

    /// Empties both free lists, returning their headers (to be freed outside the locks)
    /// and the bytes they held. With `close`, later releases destroy their objects.
    fn drain(&self, close: bool) -> ([Chain; 2], usize) {
        let mut bytes = 0;
        let chains = [Arm::F32, Arm::Slab].map(|arm| {
            let mut state = self.arm(arm).state.lock();
            state.closed |= close;
            bytes += state.free.bytes();
            let chain = state.free.drain();
            self.arm(arm).sync_cached(&state);
            chain
        });
        (chains, bytes)
    }

    /// Empties both free lists and makes later releases destroy their objects. Called
    /// once, by the last [`BufferPool`] handle.
    fn close(&self) {
        // Freed outside the locks; the caller still holds an `Arc` to `self`.
        drop(self.drain(true));
    }

    /// Checked-out minus returned objects over the arms and the local tiers (each
    /// count wrapping; the sum is exact once no acquire or release is in flight).
    fn outstanding(&self) -> usize {
        let locals = {
            let reg = self.locals.lock();
            reg.live
                .iter()
                .fold(reg.retired, |n, c| n.wrapping_add(c.outstanding()))
        };
        self.arms.iter().fold(locals, |n, a| {
            n.wrapping_add(a.outstanding.load(Ordering::Acquire))
        })
    }

    /// Registers a new local tier's counters.
    pub(crate) fn register_local(&self, counters: &Arc<LocalCounters>) {
        self.locals.lock().live.push(Arc::clone(counters));
    }

    /// Folds a local tier's final count into `retired` and forgets it (its owner is done
    /// writing it: this runs in the tier's drop).
    pub(crate) fn unregister_local(&self, counters: &Arc<LocalCounters>) {
        let mut reg = self.locals.lock();
        if let Some(i) = reg.live.iter().position(|c| Arc::ptr_eq(c, counters)) {
            reg.live.swap_remove(i);
            reg.retired = reg.retired.wrapping_add(counters.outstanding());
        }
    }

    /// A local tier's refill: the first fit for `bytes` in `arm` and, when that is of
    /// the requested class exactly, up to `extra` more of that class, under one lock.
    /// Counts one hit or miss; the outstanding count is the local tier's to change.
    pub(crate) fn take_for_local(
        &self,
        arm: Arm,
        bytes: usize,
        extra: usize,
    ) -> (Option<Box<Header>>, Chain) {
        let mut more = Chain::new();
        let a = self.arm(arm);
        let mut state = a.state.lock();
        let first = state.free.pop_fit(bytes);
        match &first {
            Some(h) => {
                state.stats.hits += 1;
                if h.bytes == bytes {
                    for _ in 0..extra {
                        let Some(h) = state.free.pop_exact(bytes) else {
                            break;
                        };
                        more.push(h);
                    }
                }
                a.sync_cached(&state);
            }
            None => state.stats.misses += 1,
        }
        (first, more)
    }

    /// Caches a chain of headers that were already counted as returned (a local tier's
    /// flush), under one lock; those over the cap, or all when the pool is closed, are
    /// freed. Returns the bytes of the chain.
    pub(crate) fn reclaim_chain(&self, arm: Arm, mut chain: Chain) -> usize {
        let mut bytes = 0;
        let mut slow = Chain::new();
        {
            let mut state = self.arm(arm).state.lock();
            while let Some(hdr) = chain.pop() {
                bytes += hdr.bytes;
                if let Err(hdr) = self.cache_fast(arm, &mut state, hdr) {
                    slow.push(hdr);
                }
            }
        }
        // Those the fast path could not decide, under both locks; the rejected ones are
        // freed outside the locks.
        drop(self.cache_slow(arm, slow));
        bytes
    }
}

impl Drop for PoolShared {
    fn drop(&mut self) {
        // Every pooled object holds an `Arc` to this state, so none can be alive here,
        // and the last handle emptied the free lists before dropping its own `Arc`.
        debug_assert_eq!(self.outstanding(), 0);
        #[cfg(not(loom))]
        debug_assert!(self.arms.iter_mut().all(|a| {
            let state = a.state.get_mut();
            state.closed && state.free.len() == 0
        }));
    }
}

/// What the clones of one [`BufferPool`] share. Pooled objects point at the
/// [`PoolShared`] state directly (and keep it alive), cached ones included, so the state
/// cannot tell when the last user handle is gone; this is what does: its drop closes
/// the pool, which frees the cache and breaks the state <-> cached-header cycle.
struct PoolHandle {
    shared: Arc<PoolShared>,
}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        self.shared.close();
    }
}

/// A pool that recycles tensor buffers across ops.
///
/// Cheap to clone: clones share one pool (`Arc`). Two arms share one byte budget:
/// - the **f32 arm** caches whole [`Buffer<f32>`] objects (header and data), serving
///   [`BufferPool::acquire`] and `acquire_typed::<f32>`;
/// - the **slab arm** caches 64-aligned raw slabs (each with a recycled header),
///   serving every other dtype ([`BufferPool::acquire_typed`]) and scratch leases
///   ([`BufferPool::acquire_scratch`]); a slab released by one dtype serves any other.
///
/// Sizes are rounded ([`round_f32_len`], [`round_slab_bytes`]), a request takes the
/// smallest cached entry that fits (first fit, smallest size class first), and a
/// release goes on top of its size class, so same-size acquire/release cycles return
/// the same address (LIFO). Both are O(1) in the number of cached classes: each arm
/// keeps a LIFO stack per size class, linked through the cached headers, and a
/// three-level bitmap of the non-empty classes (buffers of 1 GiB and more share one
/// sorted list). Each arm has its own lock; the cap on both arms' cached bytes stays
/// exact (a release takes both locks only when its arm is past half the cap). A release that would push the cached bytes over
/// [`BufferPool::max_cached_bytes`] (default 1 GiB) destroys the buffer instead; the
/// cap never limits live memory. Misses allocate [`AlignedBlock`]s (zeroed, so they show
/// in [`crate::allocation_stats`]); **hits allocate nothing at all**, in either arm.
///
/// Every pooled object keeps the pool's state alive, so dropping the last `BufferPool`
/// handle while buffers are out is safe. Dropping the last handle frees every cached
/// buffer and slab at once; buffers and leases still out keep working and are freed
/// (not cached) when they drop, and the state goes with the last of them. A leak check
/// is the caller's:
/// [`BufferPool::outstanding_buffers`] should be 0 when a run is over.
///
/// ```
/// use fucina_storage::BufferPool;
///
/// let pool = BufferPool::new();
/// let a = pool.acquire(1000)?; // a miss: a fresh zeroed block of 1024 f32
/// assert_eq!(a.len(), 1024);
/// let addr = a.as_ptr();
/// drop(a); // back to the pool
/// let b = pool.acquire(1000)?; // a hit: same object, no allocation
/// assert_eq!(b.as_ptr(), addr);
/// assert_eq!(pool.outstanding_buffers(), 1);
/// # Ok::<(), fucina_storage::StorageError>(())
/// ```
#[derive(Clone)]
pub struct BufferPool {
    handle: Arc<PoolHandle>,
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new()
    }
}

impl BufferPool {
    /// An empty pool with the default cap ([`DEFAULT_MAX_CACHED_BYTES`]).
    pub fn new() -> Self {
        Self::with_max_cached_bytes(DEFAULT_MAX_CACHED_BYTES)
    }

    /// An empty pool caching at most `bytes` bytes in its free lists.
    pub fn with_max_cached_bytes(bytes: usize) -> Self {
        Self {
            handle: Arc::new(PoolHandle {
                shared: Arc::new(PoolShared {
                    arms: [ArmShared::new(Arm::F32), ArmShared::new(Arm::Slab)],
                    max_cached_bytes: AtomicUsize::new(bytes),
                    locals: Mutex::new(LocalRegistry {
                        live: Vec::new(),
                        retired: 0,
                    }),
                }),
            }),
        }
    }

    fn shared(&self) -> &PoolShared {
        &self.handle.shared
    }

    pub(crate) fn shared_arc(&self) -> &Arc<PoolShared> {
        &self.handle.shared
    }

    /// A non-shared tier in front of this pool for the thread that uses it: see
    /// [`LocalPool`]. It holds a handle, so the pool stays open while it lives.
    pub fn local(&self) -> LocalPool {
        LocalPool::new(self.clone())
    }

    /// An f32 buffer of at least `len` elements from the f32 arm. Its [`Buffer::len`]
    /// is the rounded size class or more; its contents are zero (fresh) or whatever
    /// the previous user left (recycled).
    ///
    /// # Errors
    /// [`StorageError::ZeroLength`] for `len == 0`, [`StorageError::SizeOverflow`] when
    /// the rounded byte size overflows, and the allocation errors of a miss.
    pub fn acquire(&self, len: usize) -> Result<Buffer<f32>, StorageError> {
        PoolShared::acquire_typed(&self.handle.shared, len)
    }

    /// A typed buffer of at least `len` elements: `f32` goes to the f32 arm, every other
    /// scalar type to the slab arm (whose capacity is `floor(slab_bytes / size_of::<T>())`
    /// elements). Recycled `bool` memory is zeroed so it only holds valid `bool`s; other
    /// types see stale values.
    ///
    /// # Errors
    /// As [`BufferPool::acquire`]; [`StorageError::SizeOverflow`] also when
    /// `len * size_of::<T>()` overflows.
    pub fn acquire_typed<T: Scalar>(&self, len: usize) -> Result<Buffer<T>, StorageError> {
        PoolShared::acquire_typed(&self.handle.shared, len)
    }

    /// A scratch lease of exactly `len` items of any plain-old-data type over a pooled
    /// slab (for packed layouts that are not a dtype). The slab returns to the pool when
    /// the lease drops or on [`ScratchLease::release`], from any thread. Contents are
    /// zero (fresh) or stale (recycled).
    ///
    /// `T` must have a non-zero size and an alignment of at most 64 (checked at compile
    /// time).
    ///
    /// # Errors
    /// As [`BufferPool::acquire_typed`].
    pub fn acquire_scratch<T: bytemuck::Pod>(
        &self,
        len: usize,
    ) -> Result<ScratchLease<T>, StorageError> {
        let bytes = scratch_request::<T>(len)?;
        let (hdr, _) = PoolShared::checkout(&self.handle.shared, Arm::Slab, bytes)?;
        Ok(ScratchLease::new(hdr, len))
    }

    /// Number of f32 buffers in the shared tier's f32 free list (a local tier's are
    /// counted by [`LocalPool::cached_buffers`]).
    pub fn cached_buffers(&self) -> usize {
        self.shared().arm(Arm::F32).state.lock().free.len()
    }

    /// Number of slabs in the shared tier's slab free list.
    pub fn cached_slabs(&self) -> usize {
        self.shared().arm(Arm::Slab).state.lock().free.len()
    }

    /// The shared tier's hit, miss and release counters (see [`PoolStats`]; a local
    /// tier's refill counts as one hit or miss here).
    ///
    /// ```
    /// use fucina_storage::BufferPool;
    ///
    /// let pool = BufferPool::new();
    /// drop(pool.acquire(100)?); // a miss, then a release into the cache
    /// drop(pool.acquire(100)?); // a hit, then a release
    /// let s = pool.stats();
    /// assert_eq!((s.hits, s.misses, s.returned, s.discarded), (1, 1, 2, 0));
    /// # Ok::<(), fucina_storage::StorageError>(())
    /// ```
    pub fn stats(&self) -> PoolStats {
        let [f, s] = [Arm::F32, Arm::Slab].map(|arm| self.shared().arm(arm).state.lock().stats);
        PoolStats {
            hits: f.hits + s.hits,
            misses: f.misses + s.misses,
            returned: f.returned + s.returned,
            discarded: f.discarded + s.discarded,
        }
    }

    /// Bytes sitting in the shared tier's two free lists (capacities, not requests);
    /// the cap bounds this total.
    pub fn cached_bytes(&self) -> usize {
        self.shared().cached_bytes()
    }

    /// Pooled objects of both arms currently handed out (buffers and leases) by any
    /// tier: the shared one and every [`LocalPool`]. Exact whenever no acquire or
    /// release is in flight, whichever tier an object leaves and returns through.
    pub fn outstanding_buffers(&self) -> usize {
        self.shared().outstanding()
    }

    /// The cap on cached bytes.
    pub fn max_cached_bytes(&self) -> usize {
        self.shared().max_cached_bytes.load(Ordering::Relaxed)
    }

    /// Changes the cap. It applies to later releases; what is cached stays (use
    /// [`BufferPool::trim`] to drop it).
    pub fn set_max_cached_bytes(&self, bytes: usize) {
        self.shared()
            .max_cached_bytes
            .store(bytes, Ordering::Relaxed);
    }

    /// Frees every cached buffer and slab of the shared tier (outstanding ones are
    /// unaffected) and returns the number of bytes freed. The free lists keep their
    /// index storage, so later releases still cache without allocating. A local tier's
    /// cache is another thread's to give back: [`LocalPool::trim`] and
    /// [`LocalPool::flush`], or its drop.
    pub fn trim(&self) -> usize {
        let (chains, bytes) = self.shared().drain(false);
        // Freed outside the locks.
        drop(chains);
        bytes
    }

    /// Whether two handles are clones of one pool.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.handle, &b.handle)
    }

    /// Test support: checks that both free lists are ascending, LIFO-linked by size
    /// class and consistent with their bitmaps, and returns the sum of the cached
    /// capacities (which must equal [`BufferPool::cached_bytes`] when no release is in
    /// flight).
    #[doc(hidden)]
    pub fn debug_sum_cached_capacities(&self) -> usize {
        let mut sum = 0;
        for arm in [Arm::F32, Arm::Slab] {
            let state = self.shared().arm(arm).state.lock();
            let mut arm_sum = 0;
            state.free.for_each_checked(|h| {
                assert_eq!(h.refs.load(Ordering::Relaxed), 0);
                let home = h.home.as_ref().expect("a cached header has a home");
                assert_eq!(home.arm, arm);
                assert!(std::ptr::eq(&*home.shared, self.shared()));
                if arm == Arm::Slab {
                    assert_eq!(h.bytes % SLAB_QUANTUM, 0);
                }
                arm_sum += h.bytes;
            });
            assert_eq!(arm_sum, state.free.bytes());
            sum += arm_sum;
        }
        sum
    }
}

/// The rounded slab size for `len` items of `T`.
pub(crate) fn slab_request<T>(len: usize) -> Result<usize, StorageError> {
    if len == 0 {
        return Err(StorageError::ZeroLength);
    }
    len.checked_mul(size_of::<T>())
        .and_then(|bytes| round_slab_bytes(bytes).ok())
        .ok_or(StorageError::SizeOverflow {
            len,
            element_size: size_of::<T>(),
        })
}

/// The arm and byte request of a typed acquire of `len` elements: `f32` from the
/// f32 arm (its rounding), every other type from the slab arm.
pub(crate) fn typed_request<T: Scalar>(len: usize) -> Result<(Arm, usize), StorageError> {
    if T::DTYPE == DType::F32 {
        Ok((Arm::F32, round_f32_len(len)? * size_of::<f32>()))
    } else {
        Ok((Arm::Slab, slab_request::<T>(len)?))
    }
}

/// Finishes a typed acquire of a checked-out header (`hit`: it was recycled):
/// recycled memory of a type with invalid bit patterns (`bool`) is zeroed first.
pub(crate) fn typed_buffer<T: Scalar>(hdr: Box<Header>, hit: bool) -> Buffer<T> {
    if hit && !T::ANY_BIT_PATTERN {
        hdr.cell.write();
        // SAFETY: we own the header exclusively; `data` is valid for `bytes` writes.
        unsafe { hdr.data.as_ptr().write_bytes(0, hdr.bytes) };
    }
    Buffer::from_header(hdr)
}

/// The slab byte request of a scratch lease of `len` items; `T` must have a
/// non-zero size and an alignment of at most 64 (checked at compile time).
pub(crate) fn scratch_request<T: bytemuck::Pod>(len: usize) -> Result<usize, StorageError> {
    const {
        assert!(size_of::<T>() > 0, "scratch items must not be zero-sized");
        assert!(
            align_of::<T>() <= crate::ALIGNMENT,
            "scratch items need align <= 64"
        );
    }
    slab_request::<T>(len)
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("cached_buffers", &self.cached_buffers())
            .field("cached_slabs", &self.cached_slabs())
            .field("cached_bytes", &self.cached_bytes())
            .field("max_cached_bytes", &self.max_cached_bytes())
            .field("outstanding", &self.outstanding_buffers())
            .finish()
    }
}
