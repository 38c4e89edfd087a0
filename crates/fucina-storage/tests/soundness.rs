//! Small, Miri-friendly runs of the unsafe paths: the closed-pool release racing the
//! last handle's drop, the unique-handle drop shortcut on another thread, writes
//! through zero-copy wraps, recycled `bool` memory, and arena slices of mixed types.
//!
//! They pass under plain `cargo test` too; their point is
//! `cargo +nightly miri test -p fucina-storage --test soundness`, where a use-after-free,
//! an aliasing violation, a data race or an invalid `bool` is reported as UB.

use fucina_storage::{Arena, Buffer, BufferPool};

fn rounds() -> usize {
    if cfg!(miri) { 8 } else { 200 }
}

#[test]
fn release_racing_the_last_pool_handle() {
    for round in 0..rounds() {
        let pool = BufferPool::new();
        drop(pool.acquire(4).unwrap()); // one cached buffer, freed by the close
        let mut a = pool.acquire(8).unwrap();
        a.get_mut().unwrap()[7] = 1.0;
        let b = a.clone();
        let mut lease = pool.acquire_scratch::<u16>(3).unwrap();
        lease[2] = 5;
        let flags = pool.acquire_typed::<bool>(2).unwrap();
        let t = std::thread::spawn(move || {
            assert_eq!((b[7], lease[2]), (1.0, 5));
            if round % 2 == 0 {
                drop(b);
                lease.release();
            } else {
                lease.release();
                drop(b);
            }
            drop(flags);
        });
        if round % 3 == 0 {
            drop(pool);
            drop(a);
        } else {
            drop(a);
            drop(pool);
        }
        t.join().unwrap();
    }
}

#[test]
fn unique_drop_shortcut_after_a_remote_release() {
    let pool = BufferPool::new();
    for _ in 0..rounds() {
        let mut a = pool.acquire(16).unwrap();
        let b = a.clone();
        // The other thread reads, then drops its handle; ours is then unique and takes
        // the load-only drop path, which must see the other thread's reads as done.
        let t = std::thread::spawn(move || b.iter().sum::<f32>());
        t.join().unwrap();
        a.get_mut().unwrap().fill(2.0);
        drop(a);
    }
    assert_eq!(pool.outstanding_buffers(), 0);
}

#[test]
fn recycled_slabs_hold_valid_bools() {
    let pool = BufferPool::new();
    let mut lease = pool.acquire_scratch::<u8>(4096).unwrap();
    lease.fill(0xA5); // not a valid bool
    drop(lease);
    let mut wide = pool.acquire_typed::<i16>(2048).unwrap();
    wide.get_mut().unwrap().fill(-1);
    drop(wide);
    let flags = pool.acquire_typed::<bool>(4096).unwrap();
    // Reading every element as `bool` is UB under Miri unless the slab was zeroed.
    assert_eq!(flags.iter().filter(|&&b| b).count(), 0);
}

#[test]
fn zero_copy_writes_and_reads() {
    let mut v = Buffer::from_vec(vec![1i32, 2, 3]);
    v.get_mut().unwrap()[0] = 7;
    let alias = v.clone();
    let t = std::thread::spawn(move || alias[0]);
    assert_eq!(t.join().unwrap(), 7);
    v.get_mut().unwrap()[2] = 9;
    assert_eq!(&v[..], &[7, 2, 9]);

    let mut arc = Buffer::from_arc(std::sync::Arc::<[bool]>::from(vec![false, true]));
    arc.get_mut().unwrap()[0] = true;
    assert_eq!(&arc[..], &[true, true]);

    let arena = Arena::new(256).unwrap();
    let a = arena.alloc_slice::<u8>(3).unwrap();
    let b = arena.alloc_slice::<u64>(4).unwrap();
    let c = arena.alloc_slice::<[u16; 3]>(2).unwrap();
    a.fill(1);
    b.fill(u64::MAX);
    c[1] = [4, 5, 6];
    assert_eq!((a[2], b[3], c[1][2]), (1, u64::MAX, 6));
}
