//! The non-shared tier: `LocalPool` hits, refills, releases from the owner thread and
//! from others, the local cap, flush/trim/drop, moving a `LocalPool` between threads,
//! and exact outstanding accounting across tiers.

use fucina_storage::{Buffer, BufferPool, LocalPool, allocation_stats};

#[test]
fn owner_thread_releases_come_back_to_the_local_tier() {
    let pool = BufferPool::new();
    let local = pool.local();
    let a = local.acquire(1000).unwrap();
    let addr = a.as_ptr();
    let alias = a.clone();
    drop(a);
    assert_eq!(local.cached_buffers(), 0, "an alias is still out");
    drop(alias);
    assert_eq!((local.cached_buffers(), pool.cached_buffers()), (1, 0));
    for _ in 0..3 {
        let b = local.acquire(1000).unwrap();
        assert_eq!(b.as_ptr(), addr, "LIFO reuse in the local tier");
        assert_eq!(pool.outstanding_buffers(), 1);
    }
    // Slabs and leases too, across dtypes.
    let h = local.acquire_typed::<half::f16>(100).unwrap();
    let slab = h.as_ptr() as usize;
    drop(h);
    let l = local.acquire_scratch::<[u8; 3]>(10).unwrap();
    assert_eq!(l.as_ptr() as usize, slab);
    l.release();
    let s = local.stats();
    assert_eq!((s.hits, s.misses, s.returned, s.discarded), (4, 2, 6, 0));
    assert_eq!(
        pool.stats().misses,
        2,
        "only the first misses reached the shared tier"
    );
    assert_eq!(pool.outstanding_buffers(), 0);
}

#[test]
fn local_first_fit_and_bool_zeroing() {
    let pool = BufferPool::new();
    let local = pool.local();
    let big = local.acquire(4096).unwrap();
    let small = local.acquire(1024).unwrap();
    let (big_addr, small_addr) = (big.as_ptr(), small.as_ptr());
    drop((big, small));
    assert_eq!(local.acquire(100).unwrap().as_ptr(), small_addr);
    let b = local.acquire(2000).unwrap();
    assert_eq!((b.as_ptr(), b.len()), (big_addr, 4096));
    drop(b);

    let mut u = local.acquire_typed::<u8>(4096).unwrap();
    u.get_mut().unwrap().fill(0xff);
    drop(u);
    let flags = local.acquire_typed::<bool>(10).unwrap();
    assert!(flags.iter().all(|&f| !f), "recycled bool memory is zeroed");
}

#[test]
fn other_thread_releases_take_the_shared_path() {
    let pool = BufferPool::new();
    let local = pool.local();
    let mut a = local.acquire(64).unwrap();
    a.get_mut().unwrap()[0] = 3.0;
    let lease = local.acquire_scratch::<u64>(8).unwrap();
    assert_eq!(pool.outstanding_buffers(), 2);
    std::thread::spawn(move || {
        assert_eq!(a[0], 3.0);
        drop(a);
        lease.release();
    })
    .join()
    .unwrap();
    assert_eq!(pool.outstanding_buffers(), 0);
    assert_eq!((local.cached_buffers(), local.cached_slabs()), (0, 0));
    assert_eq!((pool.cached_buffers(), pool.cached_slabs()), (1, 1));
    // A buffer from the shared tier released on the owner thread lands locally.
    let b = pool.acquire(64).unwrap();
    drop(b);
    assert_eq!((local.cached_buffers(), pool.cached_buffers()), (1, 0));
    assert_eq!(pool.outstanding_buffers(), 0);
}

#[test]
fn a_local_miss_refills_a_batch_of_the_class() {
    let pool = BufferPool::new();
    let held: Vec<_> = (0..6).map(|_| pool.acquire(2048).unwrap()).collect();
    let bigger = pool.acquire(8192).unwrap();
    // Released on a thread without a local tier: all go to the shared tier.
    std::thread::spawn(move || drop((held, bigger)))
        .join()
        .unwrap();
    assert_eq!(pool.cached_buffers(), 7);
    let local = pool.local();
    let a = local.acquire(2048).unwrap(); // first fit + 3 more of the class
    assert_eq!((local.cached_buffers(), pool.cached_buffers()), (3, 3));
    assert_eq!(pool.stats().hits, 1, "one refill is one shared hit");
    drop(a);
    assert_eq!(local.cached_buffers(), 4);
    // A first fit of a larger class moves only that one.
    let b = local.acquire(5000).unwrap();
    assert_eq!(b.len(), 8192);
    assert_eq!((local.cached_buffers(), pool.cached_buffers()), (4, 2));
    assert_eq!(pool.outstanding_buffers(), 1);
}

#[test]
fn the_local_cap_sends_overflow_to_the_shared_tier() {
    let pool = BufferPool::new();
    let local = pool.local();
    local.set_max_cached_bytes(8192);
    let bufs: Vec<_> = (0..3)
        .map(|_| local.acquire_typed::<u8>(4096).unwrap())
        .collect();
    drop(bufs);
    assert_eq!((local.cached_slabs(), local.cached_bytes()), (2, 8192));
    assert_eq!(pool.cached_slabs(), 1);
    assert_eq!(local.stats().discarded, 1);
    // The pool's own cap still applies to what overflows.
    pool.set_max_cached_bytes(0);
    let bufs: Vec<_> = (0..3)
        .map(|_| local.acquire_typed::<u8>(4096).unwrap())
        .collect();
    drop(bufs);
    // Two local hits and a refill of the shared slab; the third release overflows the
    // local tier and then the pool's cap: freed.
    assert_eq!((local.cached_slabs(), pool.cached_slabs()), (2, 0));
    assert_eq!(pool.outstanding_buffers(), 0);
}

#[test]
fn flush_trim_and_drop_give_the_cache_back() {
    let pool = BufferPool::new();
    let local = pool.local();
    drop(local.acquire(10).unwrap());
    drop(local.acquire_typed::<i32>(10).unwrap());
    assert_eq!(local.flush(), 16 * 4 + 4096);
    assert_eq!(
        (local.cached_bytes(), pool.cached_bytes()),
        (0, 16 * 4 + 4096)
    );

    drop(local.acquire(10).unwrap()); // refilled from the shared tier, back locally
    assert_eq!((local.cached_buffers(), pool.cached_buffers()), (1, 0));
    assert_eq!(local.trim(), 16 * 4 + 4096);
    assert_eq!((local.cached_bytes(), pool.cached_bytes()), (0, 0));

    drop(local.acquire(10).unwrap());
    let out = local.acquire(3000).unwrap();
    drop(local);
    assert_eq!(
        pool.cached_buffers(),
        1,
        "dropping the LocalPool flushes it"
    );
    drop(out); // its tier is gone: the shared path
    assert_eq!((pool.cached_buffers(), pool.outstanding_buffers()), (2, 0));
}

#[test]
fn a_local_pool_keeps_its_pool_open() {
    let pool = BufferPool::new();
    let local = pool.local();
    drop(pool);
    let a = local.acquire(10).unwrap();
    drop(a);
    assert_eq!(local.cached_buffers(), 1);
    let b = local.acquire(10).unwrap();
    drop(local); // the last handle: the pool closes; `b` is freed when it drops
    assert!(b.is_pooled());
    drop(b);
}

#[test]
fn a_moved_local_pool_starts_afresh_and_the_old_thread_gives_its_tier_back() {
    let pool = BufferPool::new();
    let local = pool.local();
    let a = local.acquire(100).unwrap();
    drop(local.acquire(200).unwrap()); // cached in this thread's tier
    assert_eq!(local.cached_buffers(), 1);
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        // First use here: a fresh tier owned by this thread.
        assert_eq!(local.cached_buffers(), 0);
        let b = local.acquire(300).unwrap();
        drop(b);
        assert_eq!(local.cached_buffers(), 1);
        tx.send(()).unwrap();
        local
    });
    rx.recv().unwrap();
    // This thread's old tier is detached: the release takes the shared path and this
    // thread drops its last reference to the old tier, whose cache goes back too.
    drop(a);
    assert_eq!(pool.cached_buffers(), 2, "a and the 200 buffer");
    let local = t.join().unwrap();
    assert_eq!(pool.outstanding_buffers(), 0);
    // Back on this thread: yet another fresh tier; the one of `t` was given back when
    // `t` exited or is given back when this `LocalPool` drops.
    let c = local.acquire(300).unwrap();
    drop(c);
    drop(local);
    assert_eq!(pool.outstanding_buffers(), 0);
    assert_eq!(pool.cached_buffers(), 3);
    assert_eq!(pool.debug_sum_cached_capacities(), pool.cached_bytes());
}

#[test]
fn a_second_local_pool_on_a_thread_serves_acquires_only() {
    let pool = BufferPool::new();
    let first = pool.local();
    let second = pool.local();
    drop(second.acquire(10).unwrap()); // the release goes to the bound (first) tier
    assert_eq!((first.cached_buffers(), second.cached_buffers()), (1, 0));
    assert_eq!(second.acquire(10).unwrap().len(), 16);
    drop(first);
    // Now `second` is the only one, but not bound: its releases take the shared path.
    drop(second.acquire(10).unwrap());
    assert_eq!(pool.outstanding_buffers(), 0);
    let other = BufferPool::new();
    let _l = other.local();
    // A tier of another pool never takes this pool's buffers.
    drop(pool.acquire(10).unwrap());
    assert_eq!(pool.cached_buffers(), 1);
    assert_eq!(_l.cached_buffers(), 0);
}

#[test]
fn make_mut_and_zero_copy_buffers_ignore_the_local_tier() {
    let pool = BufferPool::new();
    let local = pool.local();
    let mut a = local.acquire(10).unwrap();
    let alias = a.clone();
    Buffer::make_mut(&mut a).unwrap()[0] = 1.0; // a copy from the shared tier
    drop((a, alias));
    assert_eq!(local.cached_buffers(), 2);
    drop(Buffer::from_vec(vec![1.0f32; 16]));
    assert_eq!(local.cached_buffers(), 2);
    assert_eq!(pool.outstanding_buffers(), 0);
}

#[test]
fn debug_output_names_the_local_state() {
    let pool = BufferPool::new();
    let local = pool.local();
    drop(local.acquire(3).unwrap());
    let s = format!("{local:?}");
    assert!(
        s.contains("LocalPool") && s.contains("cached_buffers: 1"),
        "{s}"
    );
    let _: &BufferPool = local.pool();
    let _: LocalPool = pool.local();
}

/// A shared-pool acquire on the owner thread sees what that thread's releases cached
/// in the local tier (otherwise code that mixes `pool.acquire` with local releases,
/// e.g. scratch taken through the shared handle, misses on every call).
#[test]
fn shared_acquires_on_the_owner_thread_hit_the_local_tier() {
    let pool = BufferPool::new();
    let local = pool.local();
    let a = local.acquire(4096).unwrap();
    let addr = a.as_ptr();
    drop(a); // into the local tier
    assert_eq!((local.cached_buffers(), pool.cached_buffers()), (1, 0));
    let before = allocation_stats().allocations;
    let b = pool.acquire(4096).unwrap(); // the shared handle, same thread
    assert_eq!(b.as_ptr(), addr);
    assert_eq!(allocation_stats().allocations, before);
    assert_eq!(local.cached_buffers(), 0);
    assert_eq!(pool.outstanding_buffers(), 1);
    drop(b);
    let s = pool.acquire_scratch::<u8>(100).unwrap();
    drop(s); // a slab into the local tier
    let before = allocation_stats().allocations;
    for _ in 0..10 {
        drop(pool.acquire_scratch::<u8>(100).unwrap());
    }
    assert_eq!(allocation_stats().allocations, before);
    // another thread still takes the shared path
    let addr = addr as usize;
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let c = pool.acquire(4096).unwrap();
            assert_ne!(c.as_ptr() as usize, addr);
        });
    });
    assert_eq!(pool.outstanding_buffers(), 0);
}
