//! The two-arm buffer pool (spec §6.5, reference-behaviors §1).

use std::fmt;
use std::ptr::NonNull;

use crate::aligned::AlignedBlock;
use crate::buffer::{Arm, Buffer, Header, Home};
use crate::dtype::Scalar;
use crate::lease::ScratchLease;
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

/// Counters of one [`BufferPool`] since it was created, from [`BufferPool::stats`].
///
/// Each counts events of both arms (f32 buffers, typed buffers and scratch leases).
/// They are updated under the pool's lock, so a snapshot is consistent, and they never
/// reset (compare snapshots as deltas).
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

/// A cached object: its capacity in bytes (the sort key, kept inline so a lookup does
/// not chase header pointers) and the header, which owns the block.
struct Entry {
    bytes: usize,
    hdr: Box<Header>,
}

struct PoolState {
    /// Whole f32 buffer objects, ascending by capacity, LIFO among equals.
    f32_free: Vec<Entry>,
    /// Untyped slabs (each with a recycled header), ascending, LIFO among equals.
    slab_free: Vec<Entry>,
    cached_bytes: usize,
    max_cached_bytes: usize,
    /// Set (with the free lists emptied) when the last [`BufferPool`] handle drops;
    /// later releases destroy instead of caching.
    closed: bool,
    /// The counters of [`BufferPool::stats`], written under the lock.
    stats: PoolStats,
}

impl PoolState {
    fn list(&mut self, arm: Arm) -> &mut Vec<Entry> {
        match arm {
            Arm::F32 => &mut self.f32_free,
            Arm::Slab => &mut self.slab_free,
        }
    }

    /// Empties both free lists, returning them (for the caller to drop outside the
    /// lock) and the bytes they held.
    fn take_cache(&mut self) -> ([Vec<Entry>; 2], usize) {
        let lists = [
            std::mem::take(&mut self.f32_free),
            std::mem::take(&mut self.slab_free),
        ];
        (lists, std::mem::take(&mut self.cached_bytes))
    }
}

/// The state every clone of a [`BufferPool`] and every pooled object shares.
pub(crate) struct PoolShared {
    state: Mutex<PoolState>,
    /// Live pooled objects of both arms (buffers and leases). Atomic so observers read
    /// it without the lock; written only under the lock (see `add_outstanding`).
    outstanding: AtomicUsize,
}

impl PoolShared {
    /// First fit: removes and returns the smallest cached entry of `arm` holding at least
    /// `bytes`, or `None` (a miss). Either way it counts one more outstanding object
    /// (a miss that then fails to allocate calls [`PoolShared::cancel_checkout`]).
    fn take(&self, arm: Arm, bytes: usize) -> Option<Box<Header>> {
        let mut state = self.state.lock();
        self.add_outstanding(&state);
        let list = state.list(arm);
        let pos = list.partition_point(|e| e.bytes < bytes);
        if pos == list.len() {
            state.stats.misses += 1;
            return None;
        }
        let entry = list.remove(pos);
        state.cached_bytes -= entry.bytes;
        state.stats.hits += 1;
        Some(entry.hdr)
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
                    this.cancel_checkout();
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
        let (arm, bytes) = if T::DTYPE == DType::F32 {
            (Arm::F32, round_f32_len(len)? * size_of::<f32>())
        } else {
            (Arm::Slab, slab_request::<T>(len)?)
        };
        let (hdr, hit) = Self::checkout(this, arm, bytes)?;
        if hit && !T::ANY_BIT_PATTERN {
            hdr.cell.write();
            // SAFETY: we own the header exclusively; `data` is valid for `bytes` writes.
            unsafe { hdr.data.as_ptr().write_bytes(0, hdr.bytes) };
        }
        Ok(Buffer::from_header(hdr))
    }

    /// Undoes the outstanding count of a checkout whose fresh allocation failed.
    fn cancel_checkout(&self) {
        let state = self.state.lock();
        self.sub_outstanding(&state);
    }

    /// `outstanding += 1`. The `_locked` borrow of the guarded state proves the caller
    /// holds the lock: every writer does, so a plain load and store is exact and avoids
    /// a locked read-modify-write on the hot path; readers load it without the lock.
    fn add_outstanding(&self, _locked: &PoolState) {
        let v = self.outstanding.load(Ordering::Relaxed);
        self.outstanding.store(v + 1, Ordering::Release);
    }

    /// `outstanding -= 1`; the caller holds the lock (see `add_outstanding`).
    fn sub_outstanding(&self, _locked: &PoolState) {
        let v = self.outstanding.load(Ordering::Relaxed);
        debug_assert!(v > 0, "BufferPool outstanding counter underflow");
        self.outstanding.store(v.wrapping_sub(1), Ordering::Release);
    }

    /// The release hook: caches `hdr` (before equal capacities: LIFO) unless that would
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
        let bytes = hdr.bytes;
        // `shared` and the guard live in this block only: once `hdr` is cached and the
        // lock released, a concurrent close may drain the list and free the state, so
        // nothing past the block may refer to it. A rejected header comes out of the
        // block and is destroyed after it.
        let rejected = {
            // SAFETY: `hdr` holds an `Arc` to the state, so it is alive while we own
            // `hdr`; once `hdr` is cached, the free list keeps it alive until the lock is
            // released (draining needs the lock), which is the end of this block.
            let shared = unsafe { this.as_ref() };
            let mut state = shared.state.lock();
            shared.sub_outstanding(&state);
            let room = state.max_cached_bytes.saturating_sub(state.cached_bytes);
            // `bytes <= room` is `bytes <= cap && cached + bytes <= cap` without overflow:
            // reaching the cap exactly is allowed. The closed check is made under the
            // same lock as the drain in `close`: a release either lands in the list
            // before the drain (and is freed by it) or sees `closed` (and frees itself).
            // Once warmed the list has retained capacity, so the insert does not
            // allocate; a failed growth destroys the buffer instead of aborting.
            if bytes <= room && !state.closed && state.list(arm).try_reserve(1).is_ok() {
                let list = state.list(arm);
                let pos = list.partition_point(|e| e.bytes < bytes);
                list.insert(pos, Entry { bytes, hdr });
                state.cached_bytes += bytes;
                state.stats.returned += 1;
                None
            } else {
                state.stats.discarded += 1;
                Some(hdr)
            }
        };
        // Destroyed outside the lock. This may drop the last `Arc` to the state (a
        // closed pool).
        drop(rejected);
    }

    /// Empties both free lists and makes later releases destroy their objects. Called
    /// once, by the last [`BufferPool`] handle.
    fn close(&self) {
        let cache = {
            let mut state = self.state.lock();
            state.closed = true;
            state.take_cache()
        };
        // Freed outside the lock; the caller still holds an `Arc` to `self`.
        drop(cache);
    }
}

impl Drop for PoolShared {
    fn drop(&mut self) {
        // Every pooled object holds an `Arc` to this state, so none can be alive here,
        // and the last handle emptied the free lists before dropping its own `Arc`.
        debug_assert_eq!(self.outstanding.load(Ordering::Acquire), 0);
        #[cfg(not(loom))]
        debug_assert!({
            let state = self.state.get_mut();
            state.closed && state.f32_free.is_empty() && state.slab_free.is_empty()
        });
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

/// A pool that recycles tensor buffers across ops (spec §6.5).
///
/// Cheap to clone: clones share one pool (`Arc`). Two arms share one byte budget:
/// - the **f32 arm** caches whole [`Buffer<f32>`] objects (header and data), serving
///   [`BufferPool::acquire`] and `acquire_typed::<f32>`;
/// - the **slab arm** caches 64-aligned raw slabs (each with a recycled header),
///   serving every other dtype ([`BufferPool::acquire_typed`]) and scratch leases
///   ([`BufferPool::acquire_scratch`]); a slab released by one dtype serves any other.
///
/// Sizes are rounded ([`round_f32_len`], [`round_slab_bytes`]), a request takes the
/// smallest cached entry that fits (first fit over an ascending list), and a release is
/// inserted before equal capacities, so same-size acquire/release cycles return the
/// same address (LIFO). A release that would push the cached bytes over
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
                    state: Mutex::new(PoolState {
                        f32_free: Vec::new(),
                        slab_free: Vec::new(),
                        cached_bytes: 0,
                        max_cached_bytes: bytes,
                        closed: false,
                        stats: PoolStats::default(),
                    }),
                    outstanding: AtomicUsize::new(0),
                }),
            }),
        }
    }

    fn shared(&self) -> &PoolShared {
        &self.handle.shared
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
        const {
            assert!(size_of::<T>() > 0, "scratch items must not be zero-sized");
            assert!(
                align_of::<T>() <= crate::ALIGNMENT,
                "scratch items need align <= 64"
            );
        }
        let bytes = slab_request::<T>(len)?;
        let (hdr, _) = PoolShared::checkout(&self.handle.shared, Arm::Slab, bytes)?;
        Ok(ScratchLease::new(hdr, len))
    }

    /// Number of f32 buffers in the f32 free list.
    pub fn cached_buffers(&self) -> usize {
        self.shared().state.lock().f32_free.len()
    }

    /// Number of slabs in the slab free list.
    pub fn cached_slabs(&self) -> usize {
        self.shared().state.lock().slab_free.len()
    }

    /// The pool's hit, miss and release counters (see [`PoolStats`]).
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
        self.shared().state.lock().stats
    }

    /// Bytes sitting in both free lists (capacities, not requests).
    pub fn cached_bytes(&self) -> usize {
        self.shared().state.lock().cached_bytes
    }

    /// Pooled objects of both arms currently handed out (buffers and leases).
    pub fn outstanding_buffers(&self) -> usize {
        self.shared().outstanding.load(Ordering::Acquire)
    }

    /// The cap on cached bytes.
    pub fn max_cached_bytes(&self) -> usize {
        self.shared().state.lock().max_cached_bytes
    }

    /// Changes the cap. It applies to later releases; what is cached stays (use
    /// [`BufferPool::trim`] to drop it).
    pub fn set_max_cached_bytes(&self, bytes: usize) {
        self.shared().state.lock().max_cached_bytes = bytes;
    }

    /// Frees every cached buffer and slab (outstanding ones are unaffected) and returns
    /// the number of bytes freed. The free lists keep their capacity, so later releases
    /// still cache without allocating.
    pub fn trim(&self) -> usize {
        let (entries, bytes) = {
            let mut state = self.shared().state.lock();
            // Moved out into a fresh vector (allocating here, in the trim, is fine) so
            // that the lists keep their storage.
            let mut entries = Vec::new();
            if entries
                .try_reserve_exact(state.f32_free.len() + state.slab_free.len())
                .is_err()
            {
                // Out of memory: give the lists' storage up rather than abort.
                let (lists, bytes) = state.take_cache();
                drop(state);
                drop(lists);
                return bytes;
            }
            entries.append(&mut state.f32_free);
            entries.append(&mut state.slab_free);
            (entries, std::mem::take(&mut state.cached_bytes))
        };
        // Freed outside the lock.
        drop(entries);
        bytes
    }

    /// Whether two handles are clones of one pool.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.handle, &b.handle)
    }

    /// Test support: checks that both free lists are ascending and that their keys match
    /// the headers, and returns the sum of the cached capacities (which must equal
    /// [`BufferPool::cached_bytes`]).
    #[doc(hidden)]
    pub fn debug_sum_cached_capacities(&self) -> usize {
        let state = self.shared().state.lock();
        let mut sum = 0;
        for (arm, list) in [(Arm::F32, &state.f32_free), (Arm::Slab, &state.slab_free)] {
            assert!(
                list.windows(2).all(|w| w[0].bytes <= w[1].bytes),
                "free list not sorted"
            );
            for e in list {
                assert_eq!(e.bytes, e.hdr.bytes);
                assert_eq!(e.hdr.refs.load(Ordering::Relaxed), 0);
                let home = e.hdr.home.as_ref().expect("a cached header has a home");
                assert_eq!(home.arm, arm);
                assert!(std::ptr::eq(&*home.shared, self.shared()));
                sum += e.bytes;
            }
        }
        assert!(state.slab_free.iter().all(|e| e.bytes % SLAB_QUANTUM == 0));
        sum
    }
}

/// The rounded slab size for `len` items of `T`.
fn slab_request<T>(len: usize) -> Result<usize, StorageError> {
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

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared().state.lock();
        f.debug_struct("BufferPool")
            .field("cached_buffers", &state.f32_free.len())
            .field("cached_slabs", &state.slab_free.len())
            .field("cached_bytes", &state.cached_bytes)
            .field("max_cached_bytes", &state.max_cached_bytes)
            .field(
                "outstanding",
                &self.shared().outstanding.load(Ordering::Acquire),
            )
            .finish()
    }
}
