//! Pool hit vs fresh allocation, and first touch of fresh vs recycled memory.
//!
//! `cargo bench -p fucina-storage --bench pool -- --warm-up-time 1 --measurement-time 3`
//!
//! Same run, sizes 4 KiB, 256 KiB and 4 MiB:
//! - `pool_hit`: `BufferPool::acquire` + drop of a warmed size class (f32 arm);
//! - `pool_hit_f16`: `acquire_typed::<f16>` + drop (slab arm);
//! - `local_hit`: `LocalPool::acquire` + drop on the owning thread (the local tier: no
//!   lock, no atomic read-modify-write);
//! - `aligned_block`: `AlignedBlock::new` + drop (uninitialized, the baseline);
//! - `aligned_block_zeroed`: `AlignedBlock::new_zeroed` + drop (what a pool miss costs);
//! - `vec_with_capacity`: `Vec::<f32>::with_capacity` + drop (the std baseline).
//!
//! `hit_vs_cached_classes`: a 4 KiB f32 hit (acquire + drop) while 0, 256 or 2048
//! other, larger size classes sit in the same arm, one cached buffer each (their pages
//! are never touched, so this costs address space, not memory); `pool_hit_4KiB` in the
//! shared tier, `local_hit_4KiB` in a local tier. A cost that grows with the number of
//! classes is a free-list structure that is not O(1).
//!
//! `contended_2_threads`: two threads each run the same number of 4 KiB f32
//! acquire + drop cycles on one pool at once, through the shared tier (`shared`: both
//! take the f32 arm's lock) or each through its own `LocalPool` (`local`); the time
//! is the wall time of both divided by the cycles of one thread.
//!
//! `first_touch_4MiB`: writing every byte of a fresh 4 MiB block, zeroed (what a pool
//! miss gives) or not (allocation and free included), or of freshly mapped pages, vs of
//! a recycled pooled buffer.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use fucina_storage::{AlignedBlock, BufferPool};

const SIZES: [(usize, &str); 3] = [(4 << 10, "4KiB"), (256 << 10, "256KiB"), (4 << 20, "4MiB")];

fn alloc_cycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("alloc_cycle");
    let pool = BufferPool::new();
    for (bytes, name) in SIZES {
        let elems = bytes / 4;
        // Warm the size classes.
        drop(pool.acquire(elems).unwrap());
        drop(pool.acquire_typed::<half::f16>(bytes / 2).unwrap());
        g.bench_with_input(BenchmarkId::new("pool_hit", name), &elems, |b, &n| {
            b.iter(|| drop(black_box(pool.acquire(black_box(n)).unwrap())));
        });
        g.bench_with_input(
            BenchmarkId::new("pool_hit_f16", name),
            &(bytes / 2),
            |b, &n| {
                b.iter(|| {
                    drop(black_box(
                        pool.acquire_typed::<half::f16>(black_box(n)).unwrap(),
                    ))
                });
            },
        );
        let local = pool.local();
        drop(local.acquire(elems).unwrap());
        g.bench_with_input(BenchmarkId::new("local_hit", name), &elems, |b, &n| {
            b.iter(|| drop(black_box(local.acquire(black_box(n)).unwrap())));
        });
        drop(local);
        g.bench_with_input(BenchmarkId::new("aligned_block", name), &bytes, |b, &n| {
            b.iter(|| drop(black_box(AlignedBlock::new(black_box(n)).unwrap())));
        });
        g.bench_with_input(
            BenchmarkId::new("aligned_block_zeroed", name),
            &bytes,
            |b, &n| {
                b.iter(|| drop(black_box(AlignedBlock::new_zeroed(black_box(n)).unwrap())));
            },
        );
        g.bench_with_input(
            BenchmarkId::new("vec_with_capacity", name),
            &elems,
            |b, &n| {
                b.iter(|| drop(black_box(Vec::<f32>::with_capacity(black_box(n)))));
            },
        );
    }
    g.finish();
}

fn hit_vs_cached_classes(c: &mut Criterion) {
    let mut g = c.benchmark_group("hit_vs_cached_classes");
    for classes in [0usize, 256, 2048] {
        let pool = BufferPool::with_max_cached_bytes(usize::MAX);
        // f32 classes (k + 2) * 1024 elements: all larger than the hot 1024 class.
        let hot = pool.acquire(1024).unwrap();
        let others: Vec<_> = (0..classes)
            .map(|k| pool.acquire((k + 2) * 1024).unwrap())
            .collect();
        drop(others);
        drop(hot);
        assert_eq!(pool.cached_buffers(), classes + 1);
        g.bench_with_input(
            BenchmarkId::new("pool_hit_4KiB", classes),
            &classes,
            |b, _| {
                b.iter(|| drop(black_box(pool.acquire(black_box(1024)).unwrap())));
            },
        );
        // The same classes in a local tier (released on this thread: they stay there).
        let local = pool.local();
        local.set_max_cached_bytes(usize::MAX);
        let hot = local.acquire(1024).unwrap();
        let others: Vec<_> = (0..classes)
            .map(|k| local.acquire((k + 2) * 1024).unwrap())
            .collect();
        drop(others);
        drop(hot);
        assert_eq!(local.cached_buffers(), classes + 1);
        g.bench_with_input(
            BenchmarkId::new("local_hit_4KiB", classes),
            &classes,
            |b, _| {
                b.iter(|| drop(black_box(local.acquire(black_box(1024)).unwrap())));
            },
        );
    }
    g.finish();
}

fn contended(c: &mut Criterion) {
    let mut g = c.benchmark_group("contended_2_threads");
    for local in [false, true] {
        let pool = BufferPool::new();
        let name = if local { "local" } else { "shared" };
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = std::sync::Barrier::new(2);
                std::thread::scope(|s| {
                    let run = || {
                        let tier = local.then(|| pool.local());
                        drop(pool.acquire(1024).unwrap());
                        start.wait();
                        let t = std::time::Instant::now();
                        for _ in 0..iters {
                            let buf = match &tier {
                                Some(l) => l.acquire(black_box(1024)).unwrap(),
                                None => pool.acquire(black_box(1024)).unwrap(),
                            };
                            drop(black_box(buf));
                        }
                        t.elapsed()
                    };
                    let other = s.spawn(run);
                    let mine = run();
                    mine.max(other.join().unwrap())
                })
            });
        });
    }
    g.finish();
}

fn first_touch(c: &mut Criterion) {
    let mut g = c.benchmark_group("first_touch_4MiB");
    let bytes = 4 << 20;
    let pool = BufferPool::new();
    drop(pool.acquire(bytes / 4).unwrap());
    g.bench_function("fresh_zeroed_block", |b| {
        b.iter(|| {
            let mut block = AlignedBlock::new_zeroed(bytes).unwrap();
            // SAFETY: the block holds `bytes` writable bytes.
            unsafe { block.as_mut_ptr().write_bytes(1, bytes) };
            black_box(&block);
        });
    });
    g.bench_function("fresh_uninit_block", |b| {
        b.iter(|| {
            let mut block = AlignedBlock::new(bytes).unwrap();
            // SAFETY: the block holds `bytes` writable bytes.
            unsafe { block.as_mut_ptr().write_bytes(1, bytes) };
            black_box(&block);
        });
    });
    // What a fresh block costs when the allocator cannot reuse a chunk: new pages from
    // the OS, each faulted in on first touch (glibc reuses freed 4 MiB chunks after the
    // first free, so the two `fresh_*_block` cases above see recycled heap memory).
    #[cfg(target_os = "linux")]
    g.bench_function("fresh_mmap_pages", |b| {
        b.iter(|| {
            // SAFETY: an anonymous private mapping of `bytes` bytes, written within
            // bounds, then unmapped once.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                p.cast::<u8>().write_bytes(1, bytes);
                black_box(p);
                libc::munmap(p, bytes);
            }
        });
    });
    g.bench_function("recycled_pool_buffer", |b| {
        b.iter(|| {
            let buf = pool.acquire(bytes / 4).unwrap();
            // SAFETY: a fresh unique pooled buffer of `bytes` writable bytes, nothing
            // else reads it meanwhile, and 0x01 bytes are a valid f32.
            unsafe { buf.as_mut_ptr().cast::<u8>().write_bytes(1, bytes) };
            black_box(&buf);
        });
    });
    g.finish();
}

criterion_group!(
    benches,
    alloc_cycle,
    hit_vs_cached_classes,
    contended,
    first_touch
);
criterion_main!(benches);
