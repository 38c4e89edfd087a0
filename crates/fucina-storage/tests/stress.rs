//! Several threads hammer one pool with random sizes of every kind, hold objects for a
//! while, release some on other threads, and check that no object is ever handed to
//! two holders at once. Afterwards nothing is outstanding and the cached-bytes counter
//! equals the sum of the cached capacities.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use fucina_storage::{Buffer, BufferPool, LocalPool, ScratchLease, StorageError};

const THREADS: usize = 4;

fn run_time() -> Duration {
    if cfg!(miri) {
        Duration::from_millis(50)
    } else {
        Duration::from_secs(2)
    }
}

/// splitmix64: a tiny deterministic generator (no dependency needed).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
    /// Mostly small sizes, sometimes large, so that size classes repeat.
    fn len(&mut self) -> usize {
        match self.below(10) {
            0 => 1 + self.below(300_000),
            1..=3 => 1 + self.below(5000),
            _ => 1 + self.below(64),
        }
    }
}

enum Held {
    F32(Buffer<f32>, f32),
    I16(Buffer<i16>, i16),
    Flags(Buffer<bool>),
    Scratch(ScratchLease<u64>, u64),
}

impl Held {
    /// Panics if anyone else wrote into this object while we held it.
    fn check(&self) {
        match self {
            Held::F32(b, tag) => assert!(b[..b.len().min(16)].iter().all(|x| x == tag)),
            Held::I16(b, tag) => assert!(b[..b.len().min(16)].iter().all(|x| x == tag)),
            Held::Flags(b) => assert!(b[..b.len().min(16)].iter().all(|&x| x)),
            Held::Scratch(l, tag) => assert!(l.iter().take(16).all(|x| x == tag)),
        }
    }
}

/// The shared pool or a thread's local tier.
trait Source {
    fn f32(&self, n: usize) -> Result<Buffer<f32>, StorageError>;
    fn i16(&self, n: usize) -> Result<Buffer<i16>, StorageError>;
    fn flags(&self, n: usize) -> Result<Buffer<bool>, StorageError>;
    fn scratch(&self, n: usize) -> Result<ScratchLease<u64>, StorageError>;
}

macro_rules! source {
    ($t:ty) => {
        impl Source for $t {
            fn f32(&self, n: usize) -> Result<Buffer<f32>, StorageError> {
                self.acquire(n)
            }
            fn i16(&self, n: usize) -> Result<Buffer<i16>, StorageError> {
                self.acquire_typed(n)
            }
            fn flags(&self, n: usize) -> Result<Buffer<bool>, StorageError> {
                self.acquire_typed(n)
            }
            fn scratch(&self, n: usize) -> Result<ScratchLease<u64>, StorageError> {
                self.acquire_scratch(n)
            }
        }
    };
}
source!(BufferPool);
source!(LocalPool);

fn make(pool: &dyn Source, rng: &mut Rng, tag: u64) -> Held {
    let n = rng.len();
    match rng.below(5) {
        0 | 1 => {
            let mut b = pool.f32(n).unwrap();
            assert!(b.len() >= n);
            let t = tag as f32;
            let m = b.len().min(16);
            b.get_mut().expect("a fresh pooled buffer is unique")[..m].fill(t);
            Held::F32(b, t)
        }
        2 => {
            let mut b = pool.i16(n).unwrap();
            let t = tag as i16;
            let m = b.len().min(16);
            b.get_mut().unwrap()[..m].fill(t);
            Held::I16(b, t)
        }
        3 => {
            let mut b = pool.flags(n).unwrap();
            assert!(b.iter().all(|&x| !x), "recycled bool memory must be zeroed");
            let m = b.len().min(16);
            b.get_mut().unwrap()[..m].fill(true);
            Held::Flags(b)
        }
        _ => {
            let mut l = pool.scratch(n).unwrap();
            assert_eq!(l.len(), n);
            let m = n.min(16);
            l[..m].fill(tag);
            Held::Scratch(l, tag)
        }
    }
}

#[test]
fn concurrent_acquire_release_keeps_the_books() {
    run(false);
}

/// As above with a local tier per thread (one thread in four stays on the shared
/// tier): owner-thread releases go to the local tiers, the others through the shared
/// tier, and local misses refill in batches; the books still balance exactly.
#[test]
fn local_tiers_keep_the_books() {
    run(true);
}

fn run(locals: bool) {
    let cap = 8 << 20;
    let pool = BufferPool::with_max_cached_bytes(cap);
    let deadline = Instant::now() + run_time();
    // Each thread sends some objects to its neighbour, which releases them.
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<Held>()).unzip();
    let mut receivers: Vec<Option<mpsc::Receiver<Held>>> =
        receivers.into_iter().map(Some).collect();
    let mut ops = 0usize;
    std::thread::scope(|s| {
        let mut joins = Vec::new();
        for t in 0..THREADS {
            let pool = pool.clone();
            let next = senders[(t + 1) % THREADS].clone();
            let inbox = receivers[t].take().unwrap();
            joins.push(s.spawn(move || {
                let local = (locals && t % 4 != 3).then(|| {
                    let l = pool.local();
                    l.set_max_cached_bytes(2 << 20);
                    l
                });
                let source: &dyn Source = match &local {
                    Some(l) => l,
                    None => &pool,
                };
                let mut rng = Rng(0x5eed ^ t as u64);
                let mut held: Vec<Held> = Vec::new();
                let mut tag = (t as u64) << 40;
                let mut n = 0usize;
                while Instant::now() < deadline {
                    tag += 1;
                    n += 1;
                    held.push(make(source, &mut rng, tag % 30_000));
                    // Aliases: a second handle keeps a buffer out after the first drops,
                    // and whichever drops last (maybe on another thread) releases it.
                    if rng.below(4) == 0
                        && let Some(Held::F32(b, tag)) = held.last()
                    {
                        let alias = Held::F32(b.clone(), *tag);
                        held.push(alias);
                    }
                    while held.len() > 8 {
                        let victim = held.swap_remove(rng.below(held.len() as u64));
                        victim.check();
                        if rng.below(3) == 0 {
                            let _ = next.send(victim); // released on another thread
                        }
                    }
                    while let Ok(h) = inbox.try_recv() {
                        h.check();
                    }
                }
                drop(next);
                for h in held {
                    h.check();
                }
                if let Some(l) = &local {
                    assert!(l.cached_bytes() <= 2 << 20);
                    if locals {
                        assert!(l.stats().hits > 0, "the local tier served nothing");
                    }
                }
                n
            }));
        }
        drop(senders);
        for j in joins {
            ops += j.join().unwrap();
        }
    });
    // Remaining in-flight messages were dropped with the receivers.
    assert!(ops > 1000, "stress did too little work: {ops}");
    assert_eq!(pool.outstanding_buffers(), 0);
    assert_eq!(pool.cached_bytes(), pool.debug_sum_cached_capacities());
    assert!(pool.cached_bytes() <= cap);
    assert!(pool.cached_buffers() + pool.cached_slabs() > 0);
}
