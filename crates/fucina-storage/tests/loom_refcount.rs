//! loom models of the refcount release protocol.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p fucina-storage --release --test loom_refcount`
#![cfg(loom)]

use fucina_storage::{Buffer, BufferPool};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// Two threads drop the two handles of one pooled buffer: the release hook runs exactly
/// once, so the pool sees the buffer come back exactly once.
#[test]
fn pooled_buffer_returns_once() {
    loom::model(|| {
        let pool = BufferPool::new();
        let a = pool.acquire(8).unwrap();
        let b = a.clone();
        let t = thread::spawn(move || drop(b));
        drop(a);
        t.join().unwrap();
        assert_eq!(pool.outstanding_buffers(), 0);
        assert_eq!(pool.cached_buffers(), 1);
        assert_eq!(pool.cached_bytes(), 8 * 4);
    });
}

/// A release on one thread races an acquire on another: either the acquire hits the
/// released buffer or it misses; the books balance either way.
#[test]
fn release_races_acquire() {
    loom::model(|| {
        let pool = BufferPool::new();
        let lease = pool.acquire_scratch::<u8>(10).unwrap();
        let t = thread::spawn(move || lease.release());
        let other = pool.acquire_typed::<u16>(5).unwrap();
        t.join().unwrap();
        assert_eq!(pool.outstanding_buffers(), 1);
        drop(other);
        assert_eq!(pool.outstanding_buffers(), 0);
        assert!((1..=2).contains(&pool.cached_slabs()));
    });
}

/// A release (a buffer whose two handles drop on two threads, and a lease) races the
/// drop of the last pool handle, which empties the cache and closes the pool. Whichever
/// wins, every object is freed exactly once and the pool state with the last of them:
/// a release cached after the drain would keep a header (holding an `Arc` to the state)
/// in a list nobody empties, which loom reports as a leaked `Arc`.
#[test]
fn release_races_last_handle_drop() {
    loom::model(|| {
        let pool = BufferPool::new();
        drop(pool.acquire(4).unwrap()); // one cached buffer
        let a = pool.acquire(8).unwrap(); // a miss, out
        let b = a.clone();
        let lease = pool.acquire_scratch::<u8>(3).unwrap();
        let t = thread::spawn(move || {
            drop(b);
            lease.release();
        });
        drop(a);
        drop(pool);
        t.join().unwrap();
    });
}

/// The last handle drops on one thread while another handle (a clone) acquires, and
/// the buffer it got is released after the pool is gone.
#[test]
fn clone_outlives_the_other_handle() {
    loom::model(|| {
        let pool = BufferPool::new();
        drop(pool.acquire(4).unwrap());
        let other = pool.clone();
        let t = thread::spawn(move || {
            let b = other.acquire(4).unwrap();
            drop(other);
            b
        });
        drop(pool);
        let b = t.join().unwrap();
        assert_eq!(b.len(), 4);
        drop(b);
    });
}

struct Owner(Arc<AtomicUsize>);
impl Drop for Owner {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A zero-copy wrap released from two threads drops its owner exactly once, after both
/// readers are done.
#[test]
fn borrowed_owner_dropped_once() {
    static DATA: [i32; 2] = [7, 9];
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let ptr = std::ptr::NonNull::from(&DATA).cast::<i32>();
        // SAFETY: `DATA` is 'static, initialized and never written; read-only wrap.
        let a = unsafe { Buffer::from_raw_parts_with_owner(ptr, 2, Owner(drops.clone()), false) };
        let b = a.clone();
        let t = thread::spawn(move || {
            assert_eq!(b[1], 9);
            drop(b);
        });
        assert_eq!(a[0], 7);
        drop(a);
        t.join().unwrap();
        assert_eq!(drops.load(Ordering::Relaxed), 1);
    });
}
