//! The standalone API: copy-on-write `make_mut`, the `From` conversions, the safe
//! `from_owner` wrap and the pool's counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use fucina_storage::{Buffer, BufferPool, PoolStats};

#[test]
fn make_mut_writes_in_place_when_unique() {
    let mut b = Buffer::<i32>::from_slice(&[1, 2, 3]).unwrap();
    let addr = b.as_ptr();
    Buffer::make_mut(&mut b).unwrap()[0] = 9;
    assert_eq!((b.as_ptr(), &b[..]), (addr, &[9, 2, 3][..]));

    let pool = BufferPool::new();
    let mut p = pool.acquire(10).unwrap();
    let addr = p.as_ptr();
    Buffer::make_mut(&mut p).unwrap()[0] = 1.5;
    assert_eq!((p.as_ptr(), p[0]), (addr, 1.5));
    assert_eq!(pool.outstanding_buffers(), 1);
}

#[test]
fn make_mut_copies_shared_and_read_only_storage() {
    let mut a = Buffer::<u8>::from_slice(&[1, 2, 3]).unwrap();
    let alias = a.clone();
    Buffer::make_mut(&mut a).unwrap()[1] = 20;
    assert!(!Buffer::ptr_eq(&a, &alias));
    assert_eq!((&a[..], &alias[..]), (&[1, 20, 3][..], &[1, 2, 3][..]));
    assert!(a.is_unique() && alias.is_unique());
    assert_eq!(
        a.as_ptr() as usize % 64,
        0,
        "the copy is a plain aligned block"
    );
    assert!(!a.is_pooled());

    static TABLE: [f64; 2] = [0.5, 1.5];
    let mut s = Buffer::from_static(&TABLE);
    Buffer::make_mut(&mut s).unwrap()[0] = 7.0;
    assert_eq!((&s[..], TABLE[0]), (&[7.0, 1.5][..], 0.5));
    assert!(s.is_writable());

    let shared: Arc<[i16]> = vec![4, 5].into();
    let keep = shared.clone();
    let mut w = Buffer::from(shared);
    assert!(!w.is_writable());
    Buffer::make_mut(&mut w).unwrap()[1] = -5;
    assert_eq!((&w[..], &keep[..]), (&[4, -5][..], &[4, 5][..]));
    drop(w);
    assert_eq!(Arc::strong_count(&keep), 1, "the old wrap was released");
}

#[test]
fn make_mut_copies_a_pooled_buffer_from_its_pool() {
    let pool = BufferPool::new();
    // Cache one 1024-f32 buffer and one slab so that the copies are hits.
    let cached = pool.acquire(1000).unwrap().as_ptr();
    let slab = pool.acquire_typed::<u16>(100).unwrap().as_ptr() as usize;
    let before = pool.stats();

    let mut a = pool.acquire(600).unwrap(); // 1024: the cached buffer
    let a_addr = a.as_ptr();
    assert_eq!(a_addr, cached, "first fit takes the cached buffer");
    Buffer::make_mut(&mut a).unwrap()[3] = 3.0;
    let alias = a.clone();
    Buffer::make_mut(&mut a).unwrap()[3] = 4.0;
    assert!(a.is_pooled());
    assert_eq!((alias[3], a[3], a.len()), (3.0, 4.0, 1024));
    assert_eq!(pool.outstanding_buffers(), 2, "the copy came from the pool");
    drop(alias);
    assert_eq!(pool.cached_buffers(), 1);

    let mut t = pool.acquire_typed::<u16>(2048).unwrap();
    assert_eq!(t.as_ptr() as usize, slab);
    Buffer::make_mut(&mut t).unwrap()[0] = 11;
    let alias = t.clone();
    drop(t); // the alias is now unique: in place
    let mut t = alias.clone();
    Buffer::make_mut(&mut t).unwrap()[0] = 12; // shared again: a copy from the slab arm
    assert!(t.is_pooled() && t.len() >= 2048);
    assert_eq!((alias[0], t[0]), (11, 12));
    let after = pool.stats();
    assert!(after.hits + after.misses >= before.hits + before.misses + 4);
}

#[test]
fn make_mut_on_a_pooled_bool_copy_keeps_valid_bools() {
    let pool = BufferPool::new();
    let mut h = pool.acquire_typed::<u8>(8192).unwrap();
    h.get_mut().unwrap().fill(0xff); // not valid bools
    drop(h);
    let mut flags = pool.acquire_typed::<bool>(10).unwrap(); // 4096 class: miss, zeroed
    Buffer::make_mut(&mut flags).unwrap()[0] = true;
    let alias = flags.clone();
    // The copy is first fit from the slab arm: the 8192 slab full of 0xff.
    Buffer::make_mut(&mut flags).unwrap()[1] = true;
    assert_eq!(flags.len(), 8192);
    assert!(flags[..2].iter().all(|&b| b) && flags[2..].iter().all(|&b| !b));
    drop(alias);
}

struct Counted(Arc<AtomicUsize>, [i32; 4]);
impl AsRef<[i32]> for Counted {
    fn as_ref(&self) -> &[i32] {
        &self.1
    }
}
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn from_owner_wraps_inline_and_heap_owners() {
    let drops = Arc::new(AtomicUsize::new(0));
    let b = Buffer::from_owner(Counted(drops.clone(), [1, 2, 3, 4]));
    assert_eq!(&b[..], &[1, 2, 3, 4]);
    assert!(!b.is_writable() && !b.is_pooled());
    let c = b.clone();
    drop(b);
    std::thread::spawn(move || assert_eq!(c[3], 4))
        .join()
        .unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1);

    let v: Box<[f32]> = vec![0.25; 1000].into_boxed_slice();
    let addr = v.as_ptr();
    let mut w = Buffer::from_owner(v);
    assert_eq!(w.as_ptr(), addr, "no copy");
    assert!(w.get_mut().is_none());
    Buffer::make_mut(&mut w).unwrap()[0] = 1.0;
    assert_ne!(w.as_ptr(), addr);
}

#[test]
fn from_conversions_are_zero_copy() {
    let v = vec![1i64, 2, 3];
    let addr = v.as_ptr();
    let mut b: Buffer<i64> = v.into();
    assert_eq!(b.as_ptr(), addr);
    assert!(b.get_mut().is_some());

    let arc: Arc<[f32]> = vec![1.0, 2.0].into();
    let addr = arc.as_ptr();
    let mut b = Buffer::from(arc);
    assert_eq!(b.as_ptr(), addr);
    assert!(b.get_mut().is_some(), "the sole Arc reference: writable");

    static S: [i8; 2] = [-1, 1];
    let s: &'static [i8] = &S;
    let b = Buffer::from(s);
    assert_eq!((b.as_ptr(), b.is_writable()), (S.as_ptr(), false));
}

#[test]
fn pool_stats_count_hits_misses_and_releases() {
    let pool = BufferPool::with_max_cached_bytes(8192);
    assert_eq!(pool.stats(), PoolStats::default());
    let a = pool.acquire(1024).unwrap(); // miss
    let b = pool.acquire_typed::<u8>(4096).unwrap(); // miss
    let l = pool.acquire_scratch::<u8>(1).unwrap(); // miss
    drop(a); // returned (4096 cached)
    drop(b); // returned (8192 cached: at the cap)
    l.release(); // over the cap: discarded
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.returned, s.discarded), (0, 3, 2, 1));
    drop(pool.acquire(1000).unwrap()); // hit, returned
    drop(pool.acquire_scratch::<u16>(2000).unwrap()); // hit, returned
    drop(pool.acquire(2048).unwrap()); // miss, discarded (8192 + 8192 > cap)
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.returned, s.discarded), (2, 4, 4, 2));
}
