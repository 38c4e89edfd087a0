//! # fucina-storage
//!
//! Tensor memory for the fucina runtime, usable on its own: 64-byte-aligned blocks with
//! process-wide counters, refcounted typed buffers with copy-on-write
//! ([`Buffer::make_mut`]), a two-arm [`BufferPool`] that recycles buffers so that
//! steady-state workloads allocate nothing, with a lock-free per-thread tier in front
//! of it ([`LocalPool`]), a bump [`Arena`], and the storage [`DType`]s.
//!
//! | item | what it is |
//! |---|---|
//! | [`AlignedBlock`] | an owned 64-byte-aligned block; huge requests are `Err`, never an abort |
//! | [`allocation_stats`], [`reset_peak_allocation`] | allocations, frees, live and peak bytes of every block |
//! | [`Buffer<T>`] | a refcounted handle to `[T]`: clone = one atomic increment, last drop runs the release rule once; zero-copy `From<Vec<T>>`, `From<Arc<[T]>>`, `From<&'static [T]>`, [`Buffer::from_owner`] |
//! | [`BufferPool`] | the shared tier: f32 arm (whole buffer objects) + slab arm (typed buffers, [`ScratchLease`]s), one cap, O(1) first fit |
//! | [`LocalPool`] | the local tier: a per-thread cache in front of a pool, no lock on a hit or an owner-thread release |
//! | [`PoolStats`] | hits, misses and releases of a pool or a local tier |
//! | [`Arena`] | bump allocation from one block, reset all at once |
//! | [`DType`], [`Scalar`] | storage dtypes in the reference order, and the Rust types behind them |
//!
//! ## Example
//!
//! ```
//! use fucina_storage::{BufferPool, allocation_stats};
//!
//! let pool = BufferPool::new();
//!
//! // A miss allocates a fresh, zeroed, 64-byte-aligned block (it shows in the counters).
//! let before = allocation_stats();
//! let mut x = pool.acquire(3000)?; // rounded up to 3072 elements
//! assert_eq!(x.len(), 3072);
//! assert!(allocation_stats().allocations > before.allocations);
//!
//! // A unique buffer may be written; a clone is a refcounted alias.
//! x.get_mut().unwrap()[..3].copy_from_slice(&[1.0, 2.0, 3.0]);
//! let alias = x.clone();
//! assert!(x.get_mut().is_none());
//! let addr = x.as_ptr();
//! drop((x, alias)); // the last drop returns the buffer to the pool
//!
//! // The same size again is a hit: the same object comes back and nothing is allocated.
//! let y = pool.acquire(3000)?;
//! assert_eq!(y.as_ptr(), addr);
//! assert_eq!(pool.outstanding_buffers(), 1);
//!
//! // Other dtypes share the slab arm; slabs are reused across dtypes.
//! let h = pool.acquire_typed::<half::f16>(1000)?; // 2000 bytes -> one 4096-byte slab
//! assert_eq!(h.len(), 2048);
//! drop(h);
//! let bytes = pool.acquire_typed::<u8>(4096)?;
//! assert_eq!(pool.cached_slabs(), 0); // served by the f16 slab
//! # drop((y, bytes));
//! # Ok::<(), fucina_storage::StorageError>(())
//! ```
//!
//! ## Guarantees
//!
//! - **Alignment.** Plain and pooled buffers, slabs and arenas start on 64 bytes.
//!   Zero-copy wraps ([`Buffer::from_vec`], [`Buffer::from_arc`], ...) keep their
//!   owner's alignment (at least `align_of::<T>()`).
//! - **No uninitialized reads.** Fresh blocks behind buffers are zeroed (through the
//!   allocator's `alloc_zeroed`, free up front for freshly mapped pages); recycled ones
//!   hold earlier values; recycled `bool` memory is zeroed again.
//! - **Zero allocation on a pool hit**, in both arms: the f32 arm recycles whole buffer
//!   objects, the slab arm recycles slabs together with their headers, and the free
//!   lists are linked through the cached headers themselves, so caching a release
//!   allocates nothing either (also after [`BufferPool::trim`]). Only a miss allocates,
//!   plus one small index chunk the first time a release lands in a group of 64 size
//!   classes never seen before.
//! - **O(1) free lists.** A hit and a release cost the same however many size classes
//!   are cached: per-class LIFO stacks and a bitmap of the non-empty classes (buffers of
//!   1 GiB and more excepted: they sit in one sorted list).
//! - **Pool lifetime.** Every pooled buffer and lease keeps its pool alive, so handles
//!   can outlive the `BufferPool` they came from. Dropping the last `BufferPool` handle
//!   frees the cache at once; objects still out are freed (not cached) when they drop.
//! - **Errors, not aborts.** Overflowing sizes, refused allocations and zero-length
//!   pool requests return [`StorageError`].
//!
//! See `docs/MEMORY.md` in the repository for the memory model of the whole runtime.

mod aligned;
mod arena;
mod buffer;
mod dtype;
mod error;
mod freelist;
mod lease;
mod local;
mod pool;
mod sync;

/// The `half` crate, re-exported for its `f16` and `bf16` element types.
pub use half;

pub use aligned::{
    ALIGNMENT, AlignedBlock, AllocationStats, OVERHEAD, allocation_stats, reset_peak_allocation,
};
pub use arena::Arena;
pub use buffer::Buffer;
pub use dtype::{DType, Scalar};
pub use error::StorageError;
pub use lease::ScratchLease;
pub use local::{DEFAULT_LOCAL_MAX_CACHED_BYTES, LocalPool};
pub use pool::{
    BufferPool, DEFAULT_MAX_CACHED_BYTES, F32_ROUNDING_THRESHOLD, PoolStats, SLAB_QUANTUM,
    round_f32_len, round_slab_bytes,
};
