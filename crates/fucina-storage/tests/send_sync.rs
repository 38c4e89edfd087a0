//! `Send`/`Sync` exactly where sound.

use fucina_storage::{
    AlignedBlock, Arena, Buffer, BufferPool, DType, LocalPool, PoolStats, ScratchLease,
    StorageError,
};
use static_assertions::{assert_impl_all, assert_not_impl_any};

// Shared ownership of immutable-unless-unique data: like `Arc<[T]>`.
assert_impl_all!(Buffer<f32>: Send, Sync, Clone);
assert_impl_all!(Buffer<bool>: Send, Sync, Clone);
assert_impl_all!(Buffer<half::f16>: Send, Sync);
assert_impl_all!(Buffer<half::bf16>: Send, Sync);
assert_impl_all!(Buffer<u8>: Send, Sync);
assert_impl_all!(Buffer<i64>: Send, Sync);
assert_impl_all!(Buffer<f64>: Send, Sync);
// Cheap clones sharing one mutex-guarded pool.
assert_impl_all!(BufferPool: Send, Sync, Clone, Default);
// A per-thread cache: it may move to another thread, never be shared by two.
assert_impl_all!(LocalPool: Send);
assert_not_impl_any!(LocalPool: Sync, Clone);
assert_impl_all!(PoolStats: Send, Sync, Copy, Eq, Default);
// Owned raw memory.
assert_impl_all!(AlignedBlock: Send, Sync);
assert_not_impl_any!(AlignedBlock: Clone, Copy);
// A bump offset in a `Cell`: movable, not shareable.
assert_impl_all!(Arena: Send);
assert_not_impl_any!(Arena: Sync, Clone);
// Exclusive like `Box<[T]>`; releasable from another thread.
assert_impl_all!(ScratchLease<u8>: Send, Sync);
assert_impl_all!(ScratchLease<[f32; 4]>: Send, Sync);
assert_not_impl_any!(ScratchLease<u8>: Clone);
assert_impl_all!(StorageError: Send, Sync, Clone, std::error::Error);
assert_impl_all!(DType: Send, Sync, Copy, Eq, std::hash::Hash);

#[test]
fn pointer_sized_handles() {
    assert_eq!(size_of::<Buffer<f32>>(), size_of::<usize>());
    assert_eq!(size_of::<Option<Buffer<f32>>>(), size_of::<usize>());
    assert_eq!(size_of::<BufferPool>(), size_of::<usize>());
}
