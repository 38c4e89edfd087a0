//! loom models of the local tier (`LocalPool`): the cross-thread release path, and a
//! `LocalPool` moving to another thread while its old thread still releases buffers.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p fucina-storage --release --test loom_local`
//!
//! The local tier's free lists sit in a loom-tracked cell that only the owner thread
//! may touch, and every buffer's data is a tracked cell too, so these models check that
//! no two threads ever touch one tier's lists unordered and that data written before a
//! release happens before the next user's writes.
#![cfg(loom)]

use fucina_storage::BufferPool;
use loom::thread;

#[path = "support/handoff.rs"]
mod handoff;

/// A buffer acquired through the local tier has two handles; the other thread's
/// handle may drop last (the shared path, on that thread) or ours may (the local path,
/// no lock). Either way the books balance and the next local acquire may write.
#[test]
fn cross_thread_release_of_a_local_buffer() {
    loom::model(|| {
        let pool = BufferPool::new();
        let local = pool.local();
        handoff::write_share_reacquire(|| local.acquire(4).unwrap());
        assert_eq!(pool.outstanding_buffers(), 0);
        // One buffer, or two when the acquire missed before the other release landed.
        assert!((1..=2).contains(&(local.cached_buffers() + pool.cached_buffers())));
        drop(local);
        assert_eq!(pool.outstanding_buffers(), 0);
    });
}

/// The `LocalPool` moves to another thread and is used (and dropped) there while this
/// thread releases a buffer it acquired through it: this thread's old tier is detached,
/// so the release takes the shared path and this thread gives the old tier back.
#[test]
fn local_pool_moves_while_the_old_thread_releases() {
    loom::model(|| {
        let pool = BufferPool::new();
        let local = pool.local();
        let a = local.acquire(4).unwrap();
        drop(local.acquire(8).unwrap()); // cached in this thread's tier
        let t = thread::spawn(move || {
            let mut b = local.acquire(4).unwrap();
            b.get_mut().unwrap()[0] = 5.0;
            drop(b);
            drop(local);
        });
        drop(a);
        t.join().unwrap();
        assert_eq!(pool.outstanding_buffers(), 0);
    });
}

/// A local tier's buffers released on a thread with its own local tier of the same
/// pool land there; both tiers flush when their `LocalPool`s drop.
#[test]
fn release_into_another_threads_local_tier() {
    loom::model(|| {
        let pool = BufferPool::new();
        let local = pool.local();
        let a = local.acquire(4).unwrap();
        let p2 = pool.clone();
        let t = thread::spawn(move || {
            let other = p2.local();
            drop(a); // into `other`'s tier
            assert_eq!(other.cached_buffers(), 1);
            drop(other);
        });
        let b = local.acquire(4).unwrap();
        t.join().unwrap();
        drop(b);
        drop(local);
        assert_eq!(pool.outstanding_buffers(), 0);
        // `b` reused the flushed buffer, or missed before the flush landed.
        assert!((1..=2).contains(&pool.cached_buffers()));
    });
}
