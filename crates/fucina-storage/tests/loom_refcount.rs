//! loom models of the refcount release protocol.
//!
//! Under `--cfg loom` every access to a buffer's data (a shared view, a mutable view,
//! in-pool zeroing, the final free) touches a loom-tracked cell in the buffer's header,
//! so these models check the data handoff itself, not just the counts: with the last
//! drop's `Acquire` load weakened to `Relaxed` and its fence removed,
//! `data_handoff_through_release` reports a causality violation (a read concurrent with
//! the next user's write) and `borrowed_owner_dropped_once` fails.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p fucina-storage --release --test loom_refcount`
#![cfg(loom)]

use fucina_storage::{Buffer, BufferPool};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

#[path = "support/handoff.rs"]
mod handoff;

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

/// A reader on another thread drops its handle; whichever handle drops last returns the
/// buffer, which is then reacquired and written. The buffer's data is a loom-tracked
/// cell, so the read must happen-before the write: through the `Release` decrement and
/// the last dropper's `Acquire` (the fence, or the load of the unique-drop shortcut),
/// or through the pool's lock. Weakening either makes this model fail.
#[test]
fn data_handoff_through_release() {
    loom::model(|| {
        let pool = BufferPool::new();
        handoff::write_share_reacquire(|| pool.acquire(4).unwrap());
        assert_eq!(pool.outstanding_buffers(), 0);
    });
}

/// As `data_handoff_through_release` for a scratch lease's slab handed to a typed
/// buffer of another dtype (slab arm): the lease's writes on another thread happen
/// before the next user's writes.
#[test]
fn slab_handoff_through_release() {
    loom::model(|| {
        let pool = BufferPool::new();
        let mut lease = pool.acquire_scratch::<u8>(4).unwrap();
        let t = thread::spawn(move || {
            lease[0] = 7;
            lease.release();
        });
        let mut c = pool.acquire_typed::<u16>(2).unwrap();
        c.get_mut().unwrap()[0] = 3;
        t.join().unwrap();
        drop(c);
    });
}

/// A plain (unpooled) buffer read on another thread and freed by whichever handle
/// drops last: the free (a write, for loom) must happen after the read.
#[test]
fn plain_buffer_freed_after_remote_read() {
    loom::model(|| {
        let a = Buffer::<i32>::from_slice(&[5, 6]).unwrap();
        let b = a.clone();
        let t = thread::spawn(move || assert_eq!(b[1], 6));
        drop(a);
        t.join().unwrap();
    });
}

/// Releases into both arms race near the cap: each release takes its own arm's lock,
/// and both locks when the cap is close. Exactly two 4096-byte objects fit under the
/// 8192-byte cap whichever order the three releases land in, and the two-lock path
/// cannot deadlock.
#[test]
fn releases_into_both_arms_keep_the_cap_exact() {
    loom::model(|| {
        let pool = BufferPool::with_max_cached_bytes(8192);
        let a = pool.acquire(1024).unwrap(); // 4096 bytes, f32 arm
        let s1 = pool.acquire_scratch::<u8>(1).unwrap(); // 4096 bytes, slab arm
        let s2 = pool.acquire_typed::<u8>(1).unwrap();
        let t = thread::spawn(move || {
            s1.release();
            drop(s2);
        });
        drop(a);
        t.join().unwrap();
        assert_eq!(pool.cached_bytes(), 8192);
        assert_eq!(pool.debug_sum_cached_capacities(), 8192);
        assert_eq!(pool.outstanding_buffers(), 0);
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
