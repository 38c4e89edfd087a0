//! 64-byte-aligned blocks and the four process-wide allocation counters.
//!
//! Every block comes from the global allocator with a [`Layout`] of the request plus
//! [`OVERHEAD`] bytes at the allocator's natural 16-byte alignment, and the returned
//! pointer is rounded up to [`ALIGNMENT`] inside it (over-allocate and round up; the
//! original pointer is kept in the block struct rather than in a header word in front
//! of the data). Asking for the natural alignment rather
//! than 64 lets [`AlignedBlock::new_zeroed`] go through `calloc` (with the system
//! allocator), which skips the `memset` whenever it hands out freshly mapped pages (the
//! OS zeroes them lazily, on first touch); `std`'s `alloc_zeroed` with a 64-byte
//! `Layout` always falls back to `posix_memalign` + `memset`, touching every page up
//! front. When `calloc` reuses a freed chunk it clears it, so zeroing then costs a
//! `memset` (see `benches/pool.rs`).

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;

use crate::StorageError;
use crate::sync::counter::{AtomicUsize, Ordering};

/// Alignment in bytes of every block: one cache line on x86-64 and Apple Silicon, and
/// enough for any SIMD load.
pub const ALIGNMENT: usize = 64;

/// Alignment asked of the global allocator (what `malloc`/`calloc` give for free).
const BASE_ALIGN: usize = 16;

/// Extra bytes requested so that a 64-aligned start fits inside a 16-aligned block.
pub const OVERHEAD: usize = ALIGNMENT - BASE_ALIGN;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static FREES: AtomicUsize = AtomicUsize::new(0);
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A snapshot of the four process-wide counters kept by [`AlignedBlock`].
///
/// They count only aligned blocks (every pool miss, every plain [`crate::Buffer`],
/// every [`crate::Arena`]); a `Vec`, a zero-copy wrap or a pool hit does not show.
/// Tests running in parallel share them, so compare snapshots as deltas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocationStats {
    /// Successful block allocations since the process started.
    pub allocations: usize,
    /// Blocks freed since the process started.
    pub frees: usize,
    /// Requested bytes of the blocks alive now (the overhead is not counted).
    pub live_bytes: usize,
    /// The largest `live_bytes` seen since the start or the last
    /// [`reset_peak_allocation`].
    pub peak_live_bytes: usize,
}

/// Reads the four counters (relaxed loads: each value is exact, the four are not one
/// atomic snapshot while other threads allocate).
pub fn allocation_stats() -> AllocationStats {
    AllocationStats {
        allocations: ALLOCATIONS.load(Ordering::Relaxed),
        frees: FREES.load(Ordering::Relaxed),
        live_bytes: LIVE_BYTES.load(Ordering::Relaxed),
        peak_live_bytes: PEAK_LIVE_BYTES.load(Ordering::Relaxed),
    }
}

/// Sets the peak back to the current live bytes, so a caller can measure the peak of
/// one region of code.
pub fn reset_peak_allocation() {
    PEAK_LIVE_BYTES.store(LIVE_BYTES.load(Ordering::Relaxed), Ordering::Relaxed);
}

fn count_allocation(bytes: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let live = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
    // Raise the peak; retry only while our live total is still above the stored peak
    // (a concurrent raise to a higher value ends the loop).
    let mut peak = PEAK_LIVE_BYTES.load(Ordering::Relaxed);
    while live > peak {
        match PEAK_LIVE_BYTES.compare_exchange_weak(
            peak,
            live,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => break,
            Err(current) => peak = current,
        }
    }
}

fn count_free(bytes: usize) {
    FREES.fetch_add(1, Ordering::Relaxed);
    LIVE_BYTES.fetch_sub(bytes, Ordering::Relaxed);
}

/// An owned, 64-byte-aligned block of raw memory, freed on drop.
///
/// Creating and dropping one updates the process-wide counters of
/// [`allocation_stats`]. A request whose size plus [`OVERHEAD`] overflows, or that the
/// system refuses, is an `Err` rather than an abort.
///
/// A zero-byte request is accepted: it allocates only the overhead and yields a
/// non-null, 64-aligned pointer to zero usable bytes (so a zero-length buffer needs no
/// special case); it counts as one allocation of 0 bytes.
///
/// ```
/// use fucina_storage::{AlignedBlock, StorageError};
///
/// let block = AlignedBlock::new_zeroed(1000)?;
/// assert_eq!(block.as_ptr() as usize % 64, 0);
/// assert_eq!(block.len(), 1000);
/// assert!(AlignedBlock::new(usize::MAX - 8).is_err());
/// # Ok::<(), StorageError>(())
/// ```
pub struct AlignedBlock {
    /// What the global allocator returned (freed with `layout`).
    base: NonNull<u8>,
    /// `base` rounded up to [`ALIGNMENT`].
    ptr: NonNull<u8>,
    /// Requested bytes (usable from `ptr`).
    len: usize,
}

// SAFETY: the block exclusively owns its memory (like a `Box<[u8]>`); nothing in it is
// tied to a thread, and `&AlignedBlock` only hands out a `*const u8`.
unsafe impl Send for AlignedBlock {}
// SAFETY: as above; shared access gives no way to write.
unsafe impl Sync for AlignedBlock {}

impl AlignedBlock {
    /// Allocates `bytes` uninitialized bytes at a 64-byte-aligned address.
    ///
    /// # Errors
    /// [`StorageError::TooLarge`] when `bytes` plus the overhead overflows (or exceeds
    /// `isize::MAX`); [`StorageError::AllocationFailed`] when the allocator refuses.
    pub fn new(bytes: usize) -> Result<Self, StorageError> {
        Self::allocate(bytes, false)
    }

    /// Allocates `bytes` zeroed bytes at a 64-byte-aligned address.
    ///
    /// Goes through the allocator's `alloc_zeroed` (`calloc` for the system allocator):
    /// free of charge up front for freshly mapped pages, a `memset` for reused memory.
    ///
    /// # Errors
    /// As [`AlignedBlock::new`].
    pub fn new_zeroed(bytes: usize) -> Result<Self, StorageError> {
        Self::allocate(bytes, true)
    }

    fn layout(bytes: usize) -> Result<Layout, StorageError> {
        let total = bytes
            .checked_add(OVERHEAD)
            .ok_or(StorageError::TooLarge { bytes })?;
        Layout::from_size_align(total, BASE_ALIGN).map_err(|_| StorageError::TooLarge { bytes })
    }

    fn allocate(bytes: usize, zeroed: bool) -> Result<Self, StorageError> {
        let layout = Self::layout(bytes)?;
        // SAFETY: `layout` has a non-zero size (at least OVERHEAD) and a valid alignment.
        let raw = unsafe {
            if zeroed {
                alloc::alloc_zeroed(layout)
            } else {
                alloc::alloc(layout)
            }
        };
        let base = NonNull::new(raw).ok_or(StorageError::AllocationFailed { bytes })?;
        let pad = (ALIGNMENT - (raw as usize % ALIGNMENT)) % ALIGNMENT;
        debug_assert!(
            pad <= OVERHEAD,
            "allocator returned a pointer below 16-byte alignment"
        );
        // SAFETY: `raw` is 16-aligned, so `pad <= OVERHEAD` and `pad + bytes` stays inside
        // the `bytes + OVERHEAD` bytes just allocated.
        let ptr = unsafe { base.add(pad) };
        count_allocation(bytes);
        Ok(Self {
            base,
            ptr,
            len: bytes,
        })
    }

    /// The 64-byte-aligned start of the block.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The 64-byte-aligned start of the block, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The start as a `NonNull` (with write provenance; writing needs exclusive access).
    pub(crate) fn non_null(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The usable size in bytes (the request).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block has zero usable bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        // The layout was valid when the block was allocated, so it still is.
        let layout = Self::layout(self.len).expect("layout was valid at allocation");
        // SAFETY: `base` came from the global allocator with exactly this layout and is
        // freed only here, once.
        unsafe { alloc::dealloc(self.base.as_ptr(), layout) };
        count_free(self.len);
    }
}

impl fmt::Debug for AlignedBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBlock")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_and_sized() {
        for bytes in [0usize, 1, 3, 63, 64, 65, 4096, 1 << 20] {
            let b = AlignedBlock::new(bytes).unwrap();
            assert_eq!(b.as_ptr() as usize % ALIGNMENT, 0, "bytes={bytes}");
            assert_eq!(b.len(), bytes);
            let z = AlignedBlock::new_zeroed(bytes).unwrap();
            assert_eq!(z.as_ptr() as usize % ALIGNMENT, 0);
            // SAFETY: a zeroed block of `bytes` initialized bytes.
            let s = unsafe { std::slice::from_raw_parts(z.as_ptr(), bytes) };
            assert!(s.iter().all(|&x| x == 0));
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri reports resource exhaustion where the allocator would return null"
    )]
    fn huge_requests_fail_cleanly() {
        assert_eq!(
            AlignedBlock::new(usize::MAX - 8).unwrap_err(),
            StorageError::TooLarge {
                bytes: usize::MAX - 8
            }
        );
        assert!(matches!(
            AlignedBlock::new(usize::MAX),
            Err(StorageError::TooLarge { .. })
        ));
        // Fits a Layout but no system can provide it.
        assert!(matches!(
            AlignedBlock::new(isize::MAX as usize - 4096),
            Err(StorageError::AllocationFailed { .. })
        ));
        assert!(AlignedBlock::new_zeroed(usize::MAX - 8).is_err());
    }

    #[test]
    fn counters_move_by_at_least_our_own_work() {
        // Other tests allocate concurrently, so only monotone counters are checked here;
        // exact deltas live in the single-test binary `tests/counters.rs`.
        let before = allocation_stats();
        let b = AlignedBlock::new(1234).unwrap();
        let mid = allocation_stats();
        assert!(mid.allocations > before.allocations);
        assert!(mid.peak_live_bytes >= 1234);
        drop(b);
        assert!(allocation_stats().frees > before.frees);
    }
}
