//! BufferPool behaviour: rounding, first fit, LIFO, the cap, cross-dtype slabs, leases,
//! the outstanding counter and pool lifetime, as the memory model in `docs/MEMORY.md` states them.

use fucina_storage::{
    BufferPool, DEFAULT_MAX_CACHED_BYTES, StorageError, round_f32_len, round_slab_bytes,
};
use half::f16;

#[test]
fn f32_rounding_examples() {
    for (req, want) in [
        (1, 1),
        (2, 2),
        (3, 4),
        (24, 32),
        (1000, 1024),
        (1024, 1024),
        (1025, 2048),
        (3000, 3072),
    ] {
        assert_eq!(round_f32_len(req).unwrap(), want, "round_f32_len({req})");
        let pool = BufferPool::new();
        let b = pool.acquire(req).unwrap();
        assert_eq!(b.len(), want, "acquire({req}).len()");
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert!(b.iter().all(|&x| x == 0.0), "fresh pooled memory is zeroed");
        let t = pool.acquire_typed::<f32>(req).unwrap();
        assert_eq!(t.len(), want);
    }
    assert_eq!(round_f32_len(0), Err(StorageError::ZeroLength));
    assert!(matches!(
        round_f32_len(usize::MAX),
        Err(StorageError::SizeOverflow { .. })
    ));
    // Rounds fine but its byte size overflows.
    assert!(matches!(
        round_f32_len(usize::MAX / 2),
        Err(StorageError::SizeOverflow { .. })
    ));
}

#[test]
fn slab_rounding_examples() {
    for (bytes, want) in [
        (0, 4096),
        (1, 4096),
        (2048, 4096),
        (2920, 4096),
        (4096, 4096),
        (4097, 8192),
        (5840, 8192),
        (6720, 8192),
    ] {
        assert_eq!(
            round_slab_bytes(bytes).unwrap(),
            want,
            "round_slab_bytes({bytes})"
        );
        if bytes > 0 {
            let pool = BufferPool::new();
            let b = pool.acquire_typed::<u8>(bytes).unwrap();
            assert_eq!(b.len(), want, "u8 slab for {bytes} bytes");
            let lease = pool.acquire_scratch::<u8>(bytes).unwrap();
            assert_eq!((lease.len(), lease.slab_bytes()), (bytes, want));
        }
    }
    // Typed capacity = floor(slab / element size): 1460 f16 = 2920 bytes -> 4096 -> 2048.
    let pool = BufferPool::new();
    assert_eq!(pool.acquire_typed::<f16>(1460).unwrap().len(), 2048);
    assert_eq!(pool.acquire_typed::<i64>(730).unwrap().len(), 1024); // 5840 bytes -> 8192
    assert!(matches!(
        round_slab_bytes(usize::MAX),
        Err(StorageError::SizeOverflow { .. })
    ));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri reports resource exhaustion where the allocator would return null"
)]
fn zero_and_overflowing_requests_are_errors() {
    let pool = BufferPool::new();
    assert_eq!(pool.acquire(0).unwrap_err(), StorageError::ZeroLength);
    assert_eq!(
        pool.acquire_typed::<u8>(0).unwrap_err(),
        StorageError::ZeroLength
    );
    assert_eq!(
        pool.acquire_typed::<f32>(0).unwrap_err(),
        StorageError::ZeroLength
    );
    assert_eq!(
        pool.acquire_scratch::<u64>(0).unwrap_err(),
        StorageError::ZeroLength
    );
    assert_eq!(
        pool.acquire_typed::<f64>(usize::MAX / 4).unwrap_err(),
        StorageError::SizeOverflow {
            len: usize::MAX / 4,
            element_size: 8
        }
    );
    assert!(matches!(
        pool.acquire_typed::<u8>(usize::MAX - 10),
        Err(StorageError::SizeOverflow { .. })
    ));
    assert!(matches!(
        pool.acquire_scratch::<u32>(usize::MAX / 2),
        Err(StorageError::SizeOverflow { .. })
    ));
    // Representable but refused by the system.
    assert!(matches!(
        pool.acquire(1 << 60),
        Err(StorageError::AllocationFailed { .. })
    ));
    assert_eq!(
        pool.outstanding_buffers(),
        0,
        "a failed acquire changes nothing"
    );
    assert_eq!(pool.cached_bytes(), 0);
}

#[test]
fn same_size_cycle_returns_same_address() {
    let pool = BufferPool::new();
    let addr = pool.acquire(300).unwrap().as_ptr();
    for _ in 0..10 {
        let b = pool.acquire(300).unwrap();
        assert_eq!(b.as_ptr(), addr);
        assert_eq!(pool.cached_buffers(), 0);
    }
    assert_eq!(pool.cached_buffers(), 1);
    assert_eq!(pool.cached_bytes(), 512 * 4);
    let slab_addr = pool.acquire_typed::<i32>(10).unwrap().as_ptr() as usize;
    assert_eq!(
        pool.acquire_typed::<i32>(10).unwrap().as_ptr() as usize,
        slab_addr
    );
}

#[test]
fn lifo_within_a_size_class() {
    let pool = BufferPool::new();
    let bufs: Vec<_> = (0..3).map(|_| pool.acquire(1000).unwrap()).collect();
    let addrs: Vec<_> = bufs.iter().map(|b| b.as_ptr()).collect();
    drop(bufs); // released in order 0, 1, 2
    assert_eq!(pool.cached_buffers(), 3);
    // The most recently released comes back first; an acquire/release cycle keeps
    // returning that one.
    for _ in 0..3 {
        assert_eq!(pool.acquire(1000).unwrap().as_ptr(), addrs[2]);
    }
    let held: Vec<_> = (0..3).map(|_| pool.acquire(1024).unwrap()).collect();
    let got: Vec<_> = held.iter().map(|b| b.as_ptr()).collect();
    assert_eq!(got, vec![addrs[2], addrs[1], addrs[0]]);

    // Same for slabs.
    let slabs: Vec<_> = (0..3)
        .map(|_| pool.acquire_typed::<u16>(10).unwrap())
        .collect();
    let saddrs: Vec<_> = slabs.iter().map(|b| b.as_ptr() as usize).collect();
    drop(slabs);
    let held: Vec<_> = (0..3)
        .map(|_| pool.acquire_scratch::<u8>(1).unwrap())
        .collect();
    let got: Vec<_> = held.iter().map(|l| l.as_ptr() as usize).collect();
    assert_eq!(got, vec![saddrs[2], saddrs[1], saddrs[0]]);
}

#[test]
fn first_fit_over_ascending_list() {
    let pool = BufferPool::new();
    let big = pool.acquire(4096).unwrap();
    let small = pool.acquire(1024).unwrap();
    let (big_addr, small_addr) = (big.as_ptr(), small.as_ptr());
    drop(big); // released first, yet the list is kept ascending
    drop(small);
    assert_eq!(pool.debug_sum_cached_capacities(), (4096 + 1024) * 4);
    // 100 -> 128: the smallest fitting entry is the 1024 one.
    let a = pool.acquire(100).unwrap();
    assert_eq!((a.as_ptr(), a.len()), (small_addr, 1024));
    // 2000 -> 2048: only the 4096 one fits; a larger cached buffer serves it.
    let b = pool.acquire(2000).unwrap();
    assert_eq!((b.as_ptr(), b.len()), (big_addr, 4096));
    // Nothing left: a miss gives a fresh buffer of the exact size class.
    let c = pool.acquire(2000).unwrap();
    assert_eq!(c.len(), 2048);
    assert_eq!(pool.cached_buffers(), 0);

    // A small request never takes a bigger slab when a fitting smaller one exists.
    let s_big = pool.acquire_typed::<u8>(9000).unwrap(); // 12288
    let s_small = pool.acquire_typed::<u8>(10).unwrap(); // 4096
    let s_small_addr = s_small.as_ptr();
    drop((s_big, s_small));
    let s = pool.acquire_typed::<i16>(5).unwrap();
    assert_eq!(s.as_ptr().cast::<u8>(), s_small_addr);
    let s2 = pool.acquire_typed::<i16>(3000).unwrap(); // 6000 bytes -> 8192, gets the 12288
    assert_eq!(s2.len(), 12288 / 2);
}

#[test]
fn cap_bounds_cached_bytes_and_allows_equality() {
    assert_eq!(
        BufferPool::new().max_cached_bytes(),
        DEFAULT_MAX_CACHED_BYTES
    );
    assert_eq!(DEFAULT_MAX_CACHED_BYTES, 1_073_741_824);

    // A 4096-byte slab with cap 4096 is kept when the cache is empty.
    let pool = BufferPool::with_max_cached_bytes(4096);
    let a = pool.acquire_scratch::<u8>(100).unwrap();
    let b = pool.acquire_typed::<u8>(100).unwrap();
    a.release();
    assert_eq!((pool.cached_slabs(), pool.cached_bytes()), (1, 4096));
    drop(b); // would make 8192 > 4096: destroyed
    assert_eq!((pool.cached_slabs(), pool.cached_bytes()), (1, 4096));

    // The cap is shared by both arms.
    let f = pool.acquire(1024).unwrap(); // 4096 bytes
    drop(f);
    assert_eq!(pool.cached_buffers(), 0, "cache already at the cap");
    let _slab = pool.acquire_typed::<u8>(1).unwrap(); // empties the cache
    let f = pool.acquire(1024).unwrap();
    drop(f);
    assert_eq!((pool.cached_buffers(), pool.cached_bytes()), (1, 4096));

    // A buffer that alone exceeds the cap is never cached.
    let g = pool.acquire(2048).unwrap();
    pool.trim();
    drop(g);
    assert_eq!(pool.cached_bytes(), 0);

    // The cap bounds cached bytes, never live ones.
    let live: Vec<_> = (0..4).map(|_| pool.acquire(1024).unwrap()).collect();
    assert_eq!(
        pool.outstanding_buffers(),
        4 + 1,
        "four f32 buffers and `_slab`"
    );
    drop(live);
    assert_eq!((pool.cached_buffers(), pool.cached_bytes()), (1, 4096));

    // Raising the cap applies to later releases.
    pool.set_max_cached_bytes(1 << 20);
    let live: Vec<_> = (0..4).map(|_| pool.acquire(1024).unwrap()).collect();
    drop(live);
    assert_eq!(pool.cached_bytes(), 4 * 4096);
    assert_eq!(pool.trim(), 4 * 4096);
    assert_eq!((pool.cached_buffers(), pool.cached_bytes()), (0, 0));

    // Cap 0 caches nothing.
    let none = BufferPool::with_max_cached_bytes(0);
    drop(none.acquire(1).unwrap());
    drop(none.acquire_typed::<u8>(1).unwrap());
    assert_eq!((none.cached_buffers(), none.cached_slabs()), (0, 0));
}

#[test]
fn slabs_are_reused_across_dtypes() {
    let pool = BufferPool::new();
    let mut h = pool.acquire_typed::<f16>(1000).unwrap();
    let addr = h.as_ptr() as usize;
    h.get_mut().unwrap().fill(f16::from_f32(-1.5)); // bytes 0x3e 0xbe, not valid bools
    drop(h);
    let u = pool.acquire_typed::<u8>(4000).unwrap();
    assert_eq!(u.as_ptr() as usize, addr);
    assert_eq!(u[1], 0xbe, "stale-but-initialized contents");
    drop(u);
    let lease = pool.acquire_scratch::<[u32; 4]>(100).unwrap();
    assert_eq!(lease.as_ptr() as usize, addr);
    drop(lease);
    let flags = pool.acquire_typed::<bool>(10).unwrap();
    assert_eq!(flags.as_ptr() as usize, addr);
    assert!(flags.iter().all(|&b| !b), "recycled bool memory is zeroed");
    drop(flags);
    let wide = pool.acquire_typed::<f64>(512).unwrap();
    assert_eq!((wide.as_ptr() as usize, wide.len()), (addr, 512));
    drop(wide);
    // f32 never goes to the slab arm.
    let f = pool.acquire_typed::<f32>(1024).unwrap();
    assert_ne!(f.as_ptr() as usize, addr);
    assert_eq!((pool.cached_slabs(), pool.cached_buffers()), (1, 0));
}

#[test]
fn outstanding_counts_every_live_pooled_object() {
    let pool = BufferPool::new();
    let a = pool.acquire(10).unwrap();
    let a2 = a.clone(); // a clone is the same object
    let t = pool.acquire_typed::<i32>(10).unwrap();
    let s = pool.acquire_scratch::<u8>(10).unwrap();
    assert_eq!(pool.outstanding_buffers(), 3);
    drop(a);
    assert_eq!(pool.outstanding_buffers(), 3);
    drop(a2);
    assert_eq!(pool.outstanding_buffers(), 2);
    drop(t);
    s.release();
    assert_eq!(pool.outstanding_buffers(), 0);
    assert_eq!((pool.cached_buffers(), pool.cached_slabs()), (1, 2));
    // A plain buffer is not pooled.
    let p = fucina_storage::Buffer::<f32>::zeroed(10).unwrap();
    assert!(!p.is_pooled());
    assert_eq!(pool.outstanding_buffers(), 0);
}

#[test]
fn clones_share_one_pool() {
    let pool = BufferPool::new();
    let other = pool.clone();
    assert!(BufferPool::ptr_eq(&pool, &other));
    assert!(!BufferPool::ptr_eq(&pool, &BufferPool::new()));
    let addr = pool.acquire(64).unwrap().as_ptr();
    assert_eq!(other.cached_buffers(), 1);
    assert_eq!(other.acquire(64).unwrap().as_ptr(), addr);
}

#[test]
fn lease_released_from_another_thread() {
    let pool = BufferPool::new();
    let mut lease = pool.acquire_scratch::<u64>(1000).unwrap();
    lease
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = i as u64);
    let addr = lease.as_ptr() as usize;
    let t = std::thread::spawn(move || {
        assert_eq!(lease[999], 999);
        lease.release();
    });
    t.join().unwrap();
    assert_eq!(pool.outstanding_buffers(), 0);
    assert_eq!(pool.cached_slabs(), 1);
    assert_eq!(
        pool.acquire_scratch::<u8>(1).unwrap().as_ptr() as usize,
        addr
    );

    // Buffers too may be released on another thread.
    let b = pool.acquire(5).unwrap();
    std::thread::spawn(move || drop(b)).join().unwrap();
    assert_eq!((pool.outstanding_buffers(), pool.cached_buffers()), (0, 1));
}

#[test]
fn buffers_keep_their_pool_alive() {
    let pool = BufferPool::new();
    let mut b = pool.acquire(100).unwrap();
    let lease = pool.acquire_scratch::<u8>(100).unwrap();
    drop(pool); // last handle gone while two objects are out
    b.get_mut().unwrap()[0] = 4.0;
    assert!(b.is_pooled());
    let view = b.clone();
    drop(b);
    assert_eq!(view[0], 4.0);
    drop(view); // the pool is closed (its last handle is gone): the buffer is freed
    drop(lease);
}

#[test]
fn pooled_buffers_are_writable_only_when_unique() {
    let pool = BufferPool::new();
    let mut b = pool.acquire_typed::<i64>(3).unwrap();
    b.get_mut().unwrap()[..3].copy_from_slice(&[1, 2, 3]);
    let c = b.clone();
    assert!(b.get_mut().is_none());
    assert!(!b.is_unique());
    drop(c);
    assert!(b.is_unique());
    assert_eq!(&b[..3], &[1, 2, 3]);
}

#[test]
fn debug_output_names_the_state() {
    let pool = BufferPool::with_max_cached_bytes(123);
    let s = format!("{pool:?}");
    assert!(s.contains("max_cached_bytes: 123"), "{s}");
    let b = pool.acquire(3).unwrap();
    let s = format!("{b:?}");
    assert!(
        s.contains("F32") && s.contains("len: 4") && s.contains("pooled: true"),
        "{s}"
    );
}

/// The cap is exact across the two arms whichever lock path a release takes: within
/// half the cap per arm a release takes only its arm's lock; past that, both.
#[test]
fn the_cap_is_exact_across_arms() {
    let pool = BufferPool::with_max_cached_bytes(16384);
    let f: Vec<_> = (0..3).map(|_| pool.acquire(1024).unwrap()).collect(); // 3 x 4096
    let s: Vec<_> = (0..3)
        .map(|_| pool.acquire_typed::<u8>(1).unwrap())
        .collect(); // 3 x 4096
    drop(f); // 12288 in the f32 arm: the last one past half the cap
    assert_eq!((pool.cached_buffers(), pool.cached_bytes()), (3, 12288));
    drop(s); // one slab fits (16384, exactly the cap), two do not
    assert_eq!((pool.cached_slabs(), pool.cached_bytes()), (1, 16384));
    assert_eq!(pool.stats().discarded, 2);
    assert_eq!(pool.debug_sum_cached_capacities(), 16384);
    // Taking one out makes room for exactly one again, in either arm.
    let a = pool.acquire(1024).unwrap();
    let b = pool.acquire_typed::<u8>(1).unwrap();
    let c = pool.acquire_typed::<u8>(1).unwrap(); // a miss
    drop((a, b, c));
    assert_eq!(pool.cached_bytes(), 16384);
    assert_eq!((pool.cached_buffers(), pool.cached_slabs()), (3, 1));
}
