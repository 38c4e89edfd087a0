//! The non-shared tier: a per-thread cache in front of a pool's shared tier.
//!
//! A [`LocalPool`] owns a `LocalInner`: two free indexes (one per arm) that only its
//! **owner thread** touches, without locks or atomic read-modify-writes. The owner is
//! the thread that last used the `LocalPool`; the inner is bound to that thread's
//! thread-local slot, so when a pooled buffer's last handle drops on the owner thread,
//! the release hook finds the inner there and caches the buffer locally. Releases on
//! any other thread take the shared path (the arm locks) or that thread's own bound
//! local tier of the same pool.
//!
//! Moving a `LocalPool` to another thread is allowed (`Send`): on its first use there
//! it detaches the old inner (which only the old owner thread may touch; it gives the
//! cache back to the shared tier on its next release into it, or when it exits) and
//! starts a fresh one. An inner's cache is given back to the shared tier by whoever
//! drops the last reference to it (the `LocalPool`, or the owner thread's slot), with
//! exclusive access guaranteed by the `Arc`.
//!
//! Outstanding accounting: each inner counts the objects it hands out minus those it
//! takes back, written only by its owner (a plain load and store); the pool's
//! [`crate::BufferPool::outstanding_buffers`] sums the arms, every registered inner and
//! the counts folded in by inners already gone, so it stays exact whichever tier an
//! object leaves and returns through.

use std::cell::UnsafeCell;
use std::fmt;
use std::ptr::NonNull;

use crate::buffer::{Arm, Buffer, Header, Home};
use crate::freelist::{Chain, FreeIndex};
use crate::lease::ScratchLease;
use crate::pool::{
    BufferPool, PoolShared, PoolStats, scratch_request, typed_buffer, typed_request,
};
use crate::sync::{Arc, AtomicBool, AtomicUsize, LocalCell, Ordering};
use crate::{AlignedBlock, Scalar, StorageError};

/// Default cap on the bytes one local tier caches: 256 MiB (or the pool's cap, if
/// smaller, when the `LocalPool` is made).
pub const DEFAULT_LOCAL_MAX_CACHED_BYTES: usize = 256 << 20;

/// How many cached entries of the requested size class a local miss moves from the
/// shared tier at once (under one lock).
const REFILL_BATCH: usize = 4;

/// A thread id that is never reused (0: not assigned yet).
#[inline]
fn thread_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    THREAD_ID.with(|id| {
        let v = id.get();
        if v != 0 {
            return v;
        }
        let v = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        id.set(v);
        v
    })
}

/// The slot of the local tier bound to this thread. Holds one `Arc` to it; dropped
/// (giving the cache back when it is the last reference) at thread exit.
struct Slot(std::cell::Cell<Option<Arc<LocalInner>>>);

impl Drop for Slot {
    fn drop(&mut self) {
        // Before the `Arc` goes (with this slot's fields): no dangling fast-path copy.
        let _ = BOUND_PTR.try_with(|p| p.set(std::ptr::null()));
    }
}

#[cfg(not(loom))]
std::thread_local! {
    static THREAD_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static BOUND: Slot = const { Slot(std::cell::Cell::new(None)) };
    /// A copy of `BOUND`'s pointer for the release fast path, in a slot without a
    /// destructor (the cheapest thread-local access). Non-null exactly while `BOUND`
    /// holds that `Arc`.
    static BOUND_PTR: std::cell::Cell<*const LocalInner> = const { std::cell::Cell::new(std::ptr::null()) };
}

#[cfg(loom)]
loom::thread_local! {
    static THREAD_ID: std::cell::Cell<u64> = std::cell::Cell::new(0);
    static BOUND: Slot = Slot(std::cell::Cell::new(None));
    static BOUND_PTR: std::cell::Cell<*const LocalInner> = std::cell::Cell::new(std::ptr::null());
}

/// Takes this thread's bound tier out of its slot (and clears the fast-path copy).
fn take_bound() -> Option<Arc<LocalInner>> {
    let _ = BOUND_PTR.try_with(|p| p.set(std::ptr::null()));
    BOUND.try_with(|slot| slot.0.take()).ok().flatten()
}

/// Binds `inner` to this thread (the slot must be empty). `false` while the thread
/// exits (its slots are gone).
fn put_bound(inner: Arc<LocalInner>) -> bool {
    let ptr = Arc::as_ptr(&inner);
    let put = BOUND.try_with(|slot| {
        debug_assert!(slot.0.take().is_none(), "a bound slot is replaced");
        slot.0.set(Some(inner));
    });
    put.is_ok() && BOUND_PTR.try_with(|p| p.set(ptr)).is_ok()
}

/// The owner-only state of a local tier.
struct LocalState {
    free: [FreeIndex; 2],
    max_cached_bytes: usize,
    stats: PoolStats,
}

impl LocalState {
    fn cached_bytes(&self) -> usize {
        self.free[0].bytes() + self.free[1].bytes()
    }
}

/// What a local tier's owner counts and every thread may read.
pub(crate) struct LocalCounters {
    /// Objects this tier handed out minus those it took back (wrapping). Written only
    /// by the owner thread.
    outstanding: AtomicUsize,
}

impl LocalCounters {
    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// `outstanding += delta` by the owner thread (the only writer): no
    /// read-modify-write needed.
    fn add(&self, delta: usize) {
        let v = self.outstanding.load(Ordering::Relaxed);
        self.outstanding
            .store(v.wrapping_add(delta), Ordering::Release);
    }
}

/// One local tier (see the module docs).
struct LocalInner {
    /// The thread allowed to touch `state` (besides the last `Arc` holder, in `Drop`).
    owner: u64,
    /// Set when the `LocalPool` moved away: the owner thread gives the cache back at
    /// its next release into it.
    detached: AtomicBool,
    shared: Arc<PoolShared>,
    counters: Arc<LocalCounters>,
    state: LocalCell<LocalState>,
}

// SAFETY: `state` is only accessed by the owner thread (checked against `owner`
// before every access) or, in `Drop`, by the holder of the last `Arc`, whose access is
// ordered after every other holder's by the `Arc` count; the other fields are
// immutable or atomic. The headers it caches are `Send`.
unsafe impl Send for LocalInner {}
// SAFETY: as for `Send`: shared references only reach `state` on the owner thread.
unsafe impl Sync for LocalInner {}

impl LocalInner {
    #[inline]
    fn is_mine(&self) -> bool {
        self.owner == thread_id() && !self.detached.load(Ordering::Relaxed)
    }

    /// Runs `f` on the owner-only state.
    ///
    /// # Safety
    /// The caller is on the owner thread (`is_mine`) or holds the only reference, and
    /// `f` does not reach this inner's state again (no release of a pooled buffer
    /// happens inside: only headers move, and cached headers own plain blocks).
    unsafe fn with_state<R>(&self, f: impl FnOnce(&mut LocalState) -> R) -> R {
        // SAFETY: forwarded to the caller.
        unsafe { self.state.with_mut(f) }
    }

    /// Gives every cached header back to the shared tier (one lock per arm).
    ///
    /// # Safety
    /// As [`LocalInner::with_state`].
    unsafe fn flush(&self) -> usize {
        // SAFETY: forwarded to the caller.
        let chains = unsafe { self.with_state(|st| st.free.each_mut().map(|f| f.drain())) };
        let [f, s] = chains;
        let mut bytes = 0;
        bytes += self.shared.reclaim_chain(Arm::F32, f);
        bytes += self.shared.reclaim_chain(Arm::Slab, s);
        bytes
    }
}

impl Drop for LocalInner {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: the last reference, so no other access can happen.
        unsafe { self.flush() };
        self.shared.unregister_local(&self.counters);
    }
}

/// The acquire path's local hit: on a thread whose bound local tier belongs to the
/// pool `shared`, takes the first fit for `bytes` from that tier (counted there, as a
/// [`LocalPool`] hit), so that `BufferPool::acquire*` on the owner thread sees the
/// buffers its releases cached locally. `None` otherwise (the shared path follows).
#[inline]
pub(crate) fn try_acquire(
    shared: *const PoolShared,
    arm: Arm,
    bytes: usize,
) -> Option<Box<Header>> {
    let ptr = BOUND_PTR
        .try_with(std::cell::Cell::get)
        .unwrap_or(std::ptr::null());
    if ptr.is_null() {
        return None;
    }
    // SAFETY: as in `try_release`: a non-null `BOUND_PTR` is the pointer of the `Arc`
    // that `BOUND` holds on this thread, so the inner is alive.
    let inner = unsafe { &*ptr };
    if !std::ptr::eq(&*inner.shared, shared) || inner.detached.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: the slot only holds inners owned by this thread, and this thread is not
    // inside another access to its state (acquires never happen inside one).
    unsafe {
        inner.with_state(|st| {
            let hdr = st.free[arm as usize].pop_fit(bytes);
            if hdr.is_some() {
                st.stats.hits += 1;
                inner.counters.add(1);
            }
            hdr
        })
    }
}

/// The release hook's local path: caches `hdr` in this thread's bound local tier if it
/// belongs to the same pool and has room; otherwise hands it back (`Some`) for the
/// shared path.
#[inline]
pub(crate) fn try_release(
    shared: NonNull<PoolShared>,
    arm: Arm,
    hdr: Box<Header>,
) -> Option<Box<Header>> {
    let ptr = BOUND_PTR
        .try_with(std::cell::Cell::get)
        .unwrap_or(std::ptr::null());
    if ptr.is_null() {
        return Some(hdr);
    }
    // SAFETY: a non-null `BOUND_PTR` is the pointer of the `Arc` that `BOUND` holds
    // (both are set and cleared together, on this thread), so the inner is alive; the
    // slot is not touched while `inner` is in use below.
    let inner = unsafe { &*ptr };
    if !std::ptr::eq(&*inner.shared, shared.as_ptr()) {
        return Some(hdr);
    }
    if inner.detached.load(Ordering::Relaxed) {
        // The `LocalPool` moved away: drop this thread's reference (the last one gives
        // the cache back) and take the shared path. `inner` is not used after this.
        drop(take_bound());
        return Some(hdr);
    }
    // SAFETY: the slot only holds inners owned by this thread (bound by their owner),
    // and this thread is not inside another access to it (releases of pooled buffers
    // never happen inside one).
    unsafe { inner.with_state(|st| st.release(arm, hdr, &inner.counters)) }
}

impl LocalState {
    /// Caches a header released on the owner thread, or hands it back when this tier is
    /// full (the shared path then counts the release).
    #[inline]
    fn release(
        &mut self,
        arm: Arm,
        hdr: Box<Header>,
        counters: &LocalCounters,
    ) -> Option<Box<Header>> {
        if hdr.bytes > self.max_cached_bytes.saturating_sub(self.cached_bytes()) {
            self.stats.discarded += 1;
            return Some(hdr);
        }
        match self.free[arm as usize].push(hdr) {
            Ok(()) => {
                counters.add(usize::MAX);
                self.stats.returned += 1;
                None
            }
            Err(hdr) => {
                self.stats.discarded += 1;
                Some(hdr)
            }
        }
    }
}

/// A per-thread cache in front of a [`BufferPool`]'s shared tier, for a context driven
/// by one thread (see [`BufferPool::local`]).
///
/// It has the pool's `acquire`, `acquire_typed` and `acquire_scratch`. A hit in the
/// local tier takes no lock and performs no atomic read-modify-write, and when a pooled
/// buffer's last handle drops on the thread using this `LocalPool`, the buffer comes
/// back here the same way. A local miss refills from the shared tier (the first fit,
/// plus up to three more cached entries of the same size class, under one lock);
/// buffers released on other threads go back through the shared tier. On the thread
/// that uses it, the pool's own `acquire*` methods take from the local tier first too
/// (so scratch taken through a shared `&BufferPool` is recycled). The local tier
/// holds at most [`LocalPool::max_cached_bytes`]; a release past that goes to the
/// shared tier (under the pool's cap).
///
/// The cache goes back to the shared tier on [`LocalPool::flush`], [`LocalPool::trim`]
/// and drop. [`BufferPool::outstanding_buffers`] counts objects handed out by any tier.
///
/// `Send` but not `Sync`: it can move to another thread (its next use there starts a
/// fresh local tier; the old thread gives the old one back on its next release into
/// it or when it exits), but not be shared between threads.
///
/// ```
/// use fucina_storage::BufferPool;
///
/// let pool = BufferPool::new();
/// let local = pool.local();
/// let a = local.acquire(1000)?; // a miss in both tiers: a fresh block
/// let addr = a.as_ptr();
/// drop(a); // released on this thread: back into the local tier
/// assert_eq!((local.cached_buffers(), pool.cached_buffers()), (1, 0));
/// let b = local.acquire(1000)?; // a local hit: no lock
/// assert_eq!(b.as_ptr(), addr);
/// assert_eq!(pool.outstanding_buffers(), 1);
/// let t = std::thread::spawn(move || drop(b)); // another thread: the shared tier
/// t.join().unwrap();
/// assert_eq!((local.cached_buffers(), pool.cached_buffers()), (0, 1));
/// assert_eq!(pool.outstanding_buffers(), 0);
/// # Ok::<(), fucina_storage::StorageError>(())
/// ```
pub struct LocalPool {
    pool: BufferPool,
    /// Replaced (on this `LocalPool`'s thread only: it is `!Sync`) when it is used on a
    /// thread other than its inner's owner.
    inner: UnsafeCell<Arc<LocalInner>>,
}

impl LocalPool {
    pub(crate) fn new(pool: BufferPool) -> Self {
        let max = pool.max_cached_bytes().min(DEFAULT_LOCAL_MAX_CACHED_BYTES);
        let inner = Self::bind_new(&pool, max, PoolStats::default());
        Self {
            pool,
            inner: UnsafeCell::new(inner),
        }
    }

    /// A fresh inner owned by this thread, registered with the pool and bound to this
    /// thread's slot (unless the slot holds another live local tier: then releases on
    /// this thread keep going there, and this one only serves acquires).
    fn bind_new(pool: &BufferPool, max: usize, stats: PoolStats) -> Arc<LocalInner> {
        let shared = pool.shared_arc();
        let counters = Arc::new(LocalCounters {
            outstanding: AtomicUsize::new(0),
        });
        shared.register_local(&counters);
        let inner = Arc::new(LocalInner {
            owner: thread_id(),
            detached: AtomicBool::new(false),
            shared: Arc::clone(shared),
            counters,
            state: LocalCell::new(LocalState {
                free: [FreeIndex::new(Arm::F32), FreeIndex::new(Arm::Slab)],
                max_cached_bytes: max,
                stats,
            }),
        });
        let old = take_bound();
        match old {
            Some(o) if !o.detached.load(Ordering::Relaxed) => {
                // Another live local tier is bound here: it keeps the slot.
                put_bound(o);
            }
            old => {
                put_bound(Arc::clone(&inner));
                // A detached previous inner: our reference may be its last one.
                drop(old);
            }
        }
        inner
    }

    /// This thread's inner: the current one if this thread owns it, else a fresh one
    /// (the old one is detached, for its owner thread to give back).
    ///
    /// The returned reference is valid until the next call (which may replace the
    /// inner); crate code never holds it across one.
    #[inline]
    fn inner(&self) -> &LocalInner {
        // SAFETY: `LocalPool` is `!Sync`, so only this thread reaches `self.inner`, and
        // the cell is only written below, when no reference from an earlier call is
        // alive (see above).
        let current = unsafe { &*self.inner.get() };
        if current.is_mine() {
            return current;
        }
        // SAFETY: as above; the shared borrow `current` is not used past this point,
        // so this exclusive one aliases nothing.
        let cell = unsafe { &mut *self.inner.get() };
        // The owner thread (not this one) drops its slot's reference at its next
        // release into it; the last reference gives the cache back.
        cell.detached.store(true, Ordering::Relaxed);
        let max = self
            .pool
            .max_cached_bytes()
            .min(DEFAULT_LOCAL_MAX_CACHED_BYTES);
        *cell = Self::bind_new(&self.pool, max, PoolStats::default());
        cell
    }

    /// Runs `f` on this thread's local state.
    #[inline]
    fn with_state<R>(&self, f: impl FnOnce(&mut LocalState, &LocalInner) -> R) -> R {
        let inner = self.inner();
        // SAFETY: `inner()` returned an inner this thread owns, and `f` (crate code
        // below) releases no pooled buffer inside.
        unsafe { inner.with_state(|st| f(st, inner)) }
    }

    /// Takes a header of at least `bytes` (class capacity) from the local tier, else
    /// from the shared tier (with a batched refill), else fresh, counted as handed out
    /// by this tier.
    #[inline]
    fn checkout(&self, arm: Arm, bytes: usize) -> Result<(Box<Header>, bool), StorageError> {
        let local = self.with_state(|st, inner| {
            let hdr = st.free[arm as usize].pop_fit(bytes);
            if hdr.is_some() {
                st.stats.hits += 1;
                inner.counters.add(1);
            } else {
                st.stats.misses += 1;
            }
            hdr
        });
        let (hdr, hit) = match local {
            Some(hdr) => (hdr, true),
            None => self.refill(arm, bytes)?,
        };
        hdr.refs.store(1, Ordering::Relaxed);
        Ok((hdr, hit))
    }

    /// A local miss: the first fit from the shared tier plus up to `REFILL_BATCH - 1`
    /// more of the requested class (kept locally), or a fresh block.
    fn refill(&self, arm: Arm, bytes: usize) -> Result<(Box<Header>, bool), StorageError> {
        let room = self.with_state(|st, _| st.max_cached_bytes.saturating_sub(st.cached_bytes()));
        let extra = (room / bytes).min(REFILL_BATCH - 1);
        let shared = self.pool.shared_arc();
        let (first, mut more) = shared.take_for_local(arm, bytes, extra);
        let hit = first.is_some();
        let hdr = match first {
            Some(hdr) => hdr,
            None => {
                let block = AlignedBlock::new_zeroed(bytes)?;
                let mut hdr = Header::with_block(block);
                hdr.home = Some(Home {
                    shared: Arc::clone(shared),
                    arm,
                });
                hdr
            }
        };
        self.with_state(|st, inner| {
            inner.counters.add(1);
            while let Some(h) = more.pop() {
                if let Err(h) = st.free[arm as usize].push(h) {
                    // Cannot happen (the class is known to this index after one push,
                    // and the batch is of one class); give it back rather than leak.
                    let mut back = Chain::new();
                    back.push(h);
                    inner.shared.reclaim_chain(arm, back);
                }
            }
        });
        Ok((hdr, hit))
    }

    /// As [`BufferPool::acquire`], from this thread's local tier first.
    ///
    /// # Errors
    /// As [`BufferPool::acquire`].
    pub fn acquire(&self, len: usize) -> Result<Buffer<f32>, StorageError> {
        self.acquire_typed(len)
    }

    /// As [`BufferPool::acquire_typed`], from this thread's local tier first.
    ///
    /// # Errors
    /// As [`BufferPool::acquire_typed`].
    pub fn acquire_typed<T: Scalar>(&self, len: usize) -> Result<Buffer<T>, StorageError> {
        let (arm, bytes) = typed_request::<T>(len)?;
        let (hdr, hit) = self.checkout(arm, bytes)?;
        Ok(typed_buffer(hdr, hit))
    }

    /// As [`BufferPool::acquire_scratch`], from this thread's local tier first.
    ///
    /// # Errors
    /// As [`BufferPool::acquire_scratch`].
    pub fn acquire_scratch<T: bytemuck::Pod>(
        &self,
        len: usize,
    ) -> Result<ScratchLease<T>, StorageError> {
        let bytes = scratch_request::<T>(len)?;
        let (hdr, _) = self.checkout(Arm::Slab, bytes)?;
        Ok(ScratchLease::new(hdr, len))
    }

    /// The pool this tier sits in front of.
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// Pooled objects handed out by any tier of the pool (as
    /// [`BufferPool::outstanding_buffers`]).
    pub fn outstanding_buffers(&self) -> usize {
        self.pool.outstanding_buffers()
    }

    /// Number of f32 buffers in this local tier.
    pub fn cached_buffers(&self) -> usize {
        self.with_state(|st, _| st.free[Arm::F32 as usize].len())
    }

    /// Number of slabs in this local tier.
    pub fn cached_slabs(&self) -> usize {
        self.with_state(|st, _| st.free[Arm::Slab as usize].len())
    }

    /// Bytes cached in this local tier.
    pub fn cached_bytes(&self) -> usize {
        self.with_state(|st, _| st.cached_bytes())
    }

    /// The cap on this local tier's cached bytes (default: the pool's cap or
    /// [`DEFAULT_LOCAL_MAX_CACHED_BYTES`], whichever is smaller).
    pub fn max_cached_bytes(&self) -> usize {
        self.with_state(|st, _| st.max_cached_bytes)
    }

    /// Changes this local tier's cap (for later releases; see [`LocalPool::flush`]).
    pub fn set_max_cached_bytes(&self, bytes: usize) {
        self.with_state(|st, _| st.max_cached_bytes = bytes);
    }

    /// This local tier's counters: `hits` were served locally, `misses` went to the
    /// shared tier (which counts them again as its own hits or misses), `returned`
    /// releases were cached locally and `discarded` ones passed on to the shared tier
    /// because the local tier was full. Releases on other threads do not show here.
    pub fn stats(&self) -> PoolStats {
        self.with_state(|st, _| st.stats)
    }

    /// Moves everything cached locally to the shared tier (under the pool's cap; one
    /// lock per arm) and returns the bytes moved or freed.
    pub fn flush(&self) -> usize {
        let inner = self.inner();
        // SAFETY: this thread owns `inner` (just checked by `inner()`).
        unsafe { inner.flush() }
    }

    /// Flushes the local tier and trims the pool ([`BufferPool::trim`]): every cached
    /// buffer of the shared tier and of this local tier is freed. Returns the bytes
    /// freed.
    pub fn trim(&self) -> usize {
        self.flush();
        self.pool.trim()
    }
}

impl Drop for LocalPool {
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        if inner.is_mine() {
            // Unbind from this thread's slot, so that our reference (dropped next) is
            // the last one and gives the cache back now.
            match take_bound() {
                Some(b) if Arc::ptr_eq(&b, inner) => drop(b),
                Some(other) => {
                    put_bound(other);
                }
                None => {}
            }
        } else {
            // The owner thread drops its slot reference on its next release into it (or
            // at exit); the last reference gives the cache back.
            inner.detached.store(true, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for LocalPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalPool")
            .field("cached_buffers", &self.cached_buffers())
            .field("cached_slabs", &self.cached_slabs())
            .field("cached_bytes", &self.cached_bytes())
            .field("max_cached_bytes", &self.max_cached_bytes())
            .field("pool", &self.pool)
            .finish()
    }
}
