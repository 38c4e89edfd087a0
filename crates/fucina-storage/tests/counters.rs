//! Exact counter deltas. This binary holds a single test so that nothing else in the
//! process allocates aligned blocks meanwhile.

use fucina_storage::{
    AlignedBlock, Arena, Buffer, BufferPool, allocation_stats, reset_peak_allocation,
};

#[test]
fn counters_track_blocks_exactly() {
    // Blocks: +1 allocation and +bytes live each; frees undo the live bytes.
    let s0 = allocation_stats();
    let a = AlignedBlock::new(1000).unwrap();
    let b = AlignedBlock::new_zeroed(24).unwrap();
    let s1 = allocation_stats();
    assert_eq!(s1.allocations - s0.allocations, 2);
    assert_eq!(s1.frees, s0.frees);
    assert_eq!(s1.live_bytes - s0.live_bytes, 1024);
    assert!(s1.peak_live_bytes >= s1.live_bytes);
    drop(a);
    let s2 = allocation_stats();
    assert_eq!(s2.frees - s0.frees, 1);
    assert_eq!(s2.live_bytes - s0.live_bytes, 24);
    drop(b);
    assert_eq!(allocation_stats().live_bytes, s0.live_bytes);

    // Failed requests count nothing.
    let s3 = allocation_stats();
    assert!(AlignedBlock::new(usize::MAX - 8).is_err());
    assert!(AlignedBlock::new(isize::MAX as usize - 4096).is_err());
    assert_eq!(allocation_stats(), s3);

    // The peak: reset to live, raised by a block, kept after it is freed.
    reset_peak_allocation();
    let base = allocation_stats();
    assert_eq!(base.peak_live_bytes, base.live_bytes);
    let big = AlignedBlock::new(1 << 20).unwrap();
    drop(big);
    let small = AlignedBlock::new(100).unwrap();
    let after = allocation_stats();
    assert_eq!(after.peak_live_bytes, base.live_bytes + (1 << 20));
    assert_eq!(after.live_bytes, base.live_bytes + 100);
    reset_peak_allocation();
    assert_eq!(allocation_stats().peak_live_bytes, base.live_bytes + 100);
    drop(small);

    // Arena: one block at creation, then 100 reset/alloc rounds touch no allocator.
    let before_arena = allocation_stats();
    let mut arena = Arena::new(4096).unwrap();
    assert_eq!(allocation_stats().allocations, before_arena.allocations + 1);
    let s4 = allocation_stats();
    for round in 0..100 {
        let x = arena.alloc_slice::<f32>(256).unwrap();
        let y = arena.alloc_slice::<u64>(64).unwrap();
        x[0] = round as f32;
        y[63] = round;
        arena.reset();
    }
    assert_eq!(allocation_stats().allocations, s4.allocations);
    drop(arena);
    assert_eq!(allocation_stats().frees, s4.frees + 1);

    // Plain buffers own a block; zero-copy wraps do not touch the counters.
    let s5 = allocation_stats();
    let p = Buffer::<f64>::zeroed(10).unwrap();
    assert_eq!(allocation_stats().live_bytes, s5.live_bytes + 80);
    let w = Buffer::from_vec(vec![1u8; 1000]);
    let r = Buffer::from_arc(std::sync::Arc::<[i32]>::from(vec![1, 2]));
    assert_eq!(allocation_stats().allocations, s5.allocations + 1);
    drop((p, w, r));
    assert_eq!(allocation_stats().live_bytes, s5.live_bytes);

    // Pool: misses are blocks, hits are not; the cap's destroy frees the block.
    let pool = BufferPool::with_max_cached_bytes(8192);
    let s6 = allocation_stats();
    let f = pool.acquire(1000).unwrap(); // 4096 bytes
    let t = pool.acquire_typed::<u16>(100).unwrap(); // 4096-byte slab
    let s7 = allocation_stats();
    assert_eq!(s7.allocations - s6.allocations, 2);
    assert_eq!(s7.live_bytes - s6.live_bytes, 8192);
    drop((f, t));
    for _ in 0..100 {
        let f = pool.acquire(1024).unwrap();
        let t = pool.acquire_typed::<i8>(4096).unwrap();
        let l = pool.acquire_scratch::<u32>(10).unwrap();
        drop((f, t));
        drop(l);
    }
    let s8 = allocation_stats();
    // Per round: the f32 buffer and the u8 slab hit; the lease misses (both cached
    // entries are taken) and its slab, released last, would push the cache to
    // 12288 > 8192, so the cap destroys it.
    assert_eq!(s8.allocations - s7.allocations, 100);
    assert_eq!(s8.frees - s7.frees, 100);
    assert_eq!(
        (
            pool.cached_buffers(),
            pool.cached_slabs(),
            pool.cached_bytes()
        ),
        (1, 1, 8192)
    );
    // Exceeding the cap on release frees the block right away.
    let over = pool.acquire(4096).unwrap(); // 16 KiB > cap
    let s9 = allocation_stats();
    drop(over);
    assert_eq!(allocation_stats().frees, s9.frees + 1);
    // Dropping the last handle frees the cache at once; a buffer outliving it is freed
    // (not cached) when it drops.
    let late = pool.acquire(1).unwrap(); // first fit: the cached 4096-byte f32 buffer
    assert_eq!(late.len(), 1024);
    let s10 = allocation_stats();
    drop(pool); // the cached slab is freed now
    assert_eq!(
        allocation_stats().frees - s10.frees,
        1,
        "the cache is freed"
    );
    drop(late);
    let s11 = allocation_stats();
    assert_eq!(s11.frees - s10.frees, 2, "the late buffer is freed too");
    assert_eq!(s11.live_bytes, s6.live_bytes);
}
