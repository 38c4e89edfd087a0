//! The free-list index of one pool arm: per-size-class LIFO stacks linked through the
//! cached headers, a three-level bitmap of the non-empty classes for first fit, and a
//! front slot holding the most recently cached header (so that a same-size
//! acquire/release cycle touches neither the stacks nor the bitmaps).
//!
//! Every operation is O(1) in the number of cached size classes (and of cached
//! entries), except for buffers of 1 GiB and more (class index `FLAT` and up), which
//! are kept in one ascending list: linear in the number of such buffers cached, which
//! the cap bounds (one with the default 1 GiB cap).
//!
//! The index owns the headers it holds (as raw pointers from `Box::into_raw`) and frees
//! them when dropped; [`FreeIndex::drain`] moves them all out as a [`Chain`] that the
//! caller frees outside its lock. No operation allocates except [`FreeIndex::push`]
//! into a group of 64 classes never seen before (one small chunk, kept for the index's
//! life: `drain` keeps it too).

use std::ptr::NonNull;

use crate::buffer::{Arm, Header};

/// Class indexes below this live in the bitmap; the rest in the sorted `huge` list.
/// `2^18` classes reach 1 GiB in both arms.
pub(crate) const FLAT: usize = 1 << 18;

/// The class index of a size-class capacity of `bytes` in `arm`: dense, and ascending
/// with the capacity. f32 classes are powers of two up to 1024 elements (indexes
/// 0..=10), then multiples of 1024 (2048 elements is 11); slab classes are multiples of
/// 4096 bytes (4096 is 0).
#[inline]
pub(crate) fn class_index(arm: Arm, bytes: usize) -> usize {
    match arm {
        Arm::F32 => {
            let len = bytes / size_of::<f32>();
            if len <= crate::F32_ROUNDING_THRESHOLD {
                debug_assert!(len.is_power_of_two(), "not an f32 size class: {len}");
                len.trailing_zeros() as usize
            } else {
                debug_assert_eq!(len % crate::F32_ROUNDING_THRESHOLD, 0);
                9 + len / crate::F32_ROUNDING_THRESHOLD
            }
        }
        Arm::Slab => {
            debug_assert!(
                bytes >= crate::SLAB_QUANTUM && bytes.is_multiple_of(crate::SLAB_QUANTUM)
            );
            bytes / crate::SLAB_QUANTUM - 1
        }
    }
}

/// 64 consecutive classes: a bit per non-empty class and the top of each stack.
struct Chunk {
    bits: u64,
    heads: [Option<NonNull<Header>>; 64],
}

/// An owned singly linked chain of headers (through `Header::next`), freed on drop.
pub(crate) struct Chain {
    head: Option<NonNull<Header>>,
}

impl Chain {
    pub(crate) fn new() -> Self {
        Self { head: None }
    }

    /// Adds `hdr` at the front.
    pub(crate) fn push(&mut self, mut hdr: Box<Header>) {
        hdr.next = self.head;
        self.head = Some(NonNull::from(Box::leak(hdr)));
    }

    /// Takes the front header.
    pub(crate) fn pop(&mut self) -> Option<Box<Header>> {
        let ptr = self.head?;
        // SAFETY: every pointer in a chain came from `Box::leak`/`Box::into_raw` and is
        // owned by the chain, which gives it up here exactly once.
        let mut hdr = unsafe { Box::from_raw(ptr.as_ptr()) };
        self.head = hdr.next.take();
        Some(hdr)
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        while let Some(hdr) = self.pop() {
            drop(hdr);
        }
    }
}

// SAFETY: a chain exclusively owns its headers, which are `Send`.
unsafe impl Send for Chain {}

/// The free lists of one arm (see the module docs).
pub(crate) struct FreeIndex {
    arm: Arm,
    /// The most recently cached header, kept out of the stacks: the newest of its class,
    /// so an acquire of exactly its class takes it (first fit, LIFO) without touching
    /// the stacks or the bitmaps, and the next release pushes it down. This makes a
    /// same-size acquire/release cycle a pointer swap.
    front: Option<NonNull<Header>>,
    /// Bit `i`: `mid[i] != 0`.
    top: u64,
    /// Bit `j` of `mid[i]`: chunk `64 * i + j` has a non-empty class.
    mid: [u64; 64],
    /// Chunk `c` covers classes `64 * c .. 64 * c + 64`; allocated on first use.
    chunks: Vec<Option<Box<Chunk>>>,
    /// Headers of class `FLAT` and up, ascending by capacity, LIFO among equals.
    huge: Option<NonNull<Header>>,
    /// Number of cached headers.
    len: usize,
    /// Sum of their capacities.
    bytes: usize,
}

// SAFETY: the index exclusively owns the headers it points to (which are `Send`); it
// is only ever used by one thread at a time (under a lock, or by its owner thread).
unsafe impl Send for FreeIndex {}

impl FreeIndex {
    pub(crate) fn new(arm: Arm) -> Self {
        Self {
            arm,
            front: None,
            top: 0,
            mid: [0; 64],
            chunks: Vec::new(),
            huge: None,
            len: 0,
            bytes: 0,
        }
    }

    /// Number of cached headers.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Sum of the cached capacities in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The smallest non-empty class index `>= idx` below `FLAT`, or `None`.
    fn next_class(&self, idx: usize) -> Option<usize> {
        if idx >= FLAT {
            return None;
        }
        let (c, b) = (idx >> 6, idx & 63);
        if let Some(Some(chunk)) = self.chunks.get(c) {
            let m = chunk.bits & (!0u64 << b);
            if m != 0 {
                return Some(c << 6 | m.trailing_zeros() as usize);
            }
        }
        // The next non-empty chunk after `c`: first in `c`'s word of `mid`, then above.
        let (i, j) = (c >> 6, c & 63);
        let above = |word: u64, bit: usize| {
            if bit == 63 {
                0
            } else {
                word & (!0u64 << (bit + 1))
            }
        };
        let next_chunk = match above(self.mid[i], j) {
            0 => match above(self.top, i) {
                0 => return None,
                t => {
                    let i2 = t.trailing_zeros() as usize;
                    i2 << 6 | self.mid[i2].trailing_zeros() as usize
                }
            },
            m => i << 6 | m.trailing_zeros() as usize,
        };
        let chunk = self.chunks[next_chunk]
            .as_ref()
            .expect("a marked chunk is allocated");
        debug_assert_ne!(chunk.bits, 0);
        Some(next_chunk << 6 | chunk.bits.trailing_zeros() as usize)
    }

    #[inline]
    fn front_bytes(&self) -> Option<usize> {
        // SAFETY: the index owns the front header; `&self` keeps it in place.
        self.front.map(|f| unsafe { f.as_ref() }.bytes)
    }

    #[inline]
    fn take_front(&mut self) -> Box<Header> {
        let ptr = self.front.take().expect("a front header");
        // SAFETY: the index owned the front header (from `Box::leak`) and gives it up
        // here exactly once.
        let hdr = unsafe { Box::from_raw(ptr.as_ptr()) };
        self.len -= 1;
        self.bytes -= hdr.bytes;
        hdr
    }

    /// First fit: removes and returns the most recently cached header of the smallest
    /// non-empty class whose capacity is at least `bytes` (a class capacity).
    #[inline]
    pub(crate) fn pop_fit(&mut self, bytes: usize) -> Option<Box<Header>> {
        if let Some(fb) = self.front_bytes() {
            if fb == bytes {
                return Some(self.take_front());
            }
            if fb > bytes {
                let fclass = class_index(self.arm, fb);
                if fclass < FLAT {
                    // The front fits; a smaller fitting class in the stacks wins (the
                    // huge list holds only larger ones), else the front does (it is
                    // the newest of its class).
                    return match self.next_class(class_index(self.arm, bytes)) {
                        Some(c) if c < fclass => Some(self.pop_class(c)),
                        _ => Some(self.take_front()),
                    };
                }
                // A huge front: compare within the sorted huge list.
                let front = self.take_front();
                if let Err(front) = self.push_stacked(front) {
                    return Some(front);
                }
            }
        }
        self.pop_fit_stacked(bytes)
    }

    fn pop_fit_stacked(&mut self, bytes: usize) -> Option<Box<Header>> {
        let idx = class_index(self.arm, bytes);
        match self.next_class(idx) {
            Some(class) => Some(self.pop_class(class)),
            None => self.pop_huge(bytes),
        }
    }

    /// Removes the top header of class `exact` if that class is non-empty (no first
    /// fit: for batched refills of one class).
    pub(crate) fn pop_exact(&mut self, bytes: usize) -> Option<Box<Header>> {
        if self.front_bytes() == Some(bytes) {
            return Some(self.take_front());
        }
        let idx = class_index(self.arm, bytes);
        if idx >= FLAT {
            return None;
        }
        let nonempty =
            matches!(self.chunks.get(idx >> 6), Some(Some(c)) if c.bits & (1 << (idx & 63)) != 0);
        nonempty.then(|| self.pop_class(idx))
    }

    fn pop_class(&mut self, class: usize) -> Box<Header> {
        let (c, b) = (class >> 6, class & 63);
        let chunk = self.chunks[c]
            .as_mut()
            .expect("a marked chunk is allocated");
        let ptr = chunk.heads[b].expect("a marked class is non-empty");
        // SAFETY: the index owns every header it links (from `Box::into_raw`) and gives
        // this one up exactly once, unlinking it below.
        let mut hdr = unsafe { Box::from_raw(ptr.as_ptr()) };
        chunk.heads[b] = hdr.next.take();
        if chunk.heads[b].is_none() {
            chunk.bits &= !(1 << b);
            if chunk.bits == 0 {
                let (i, j) = (c >> 6, c & 63);
                self.mid[i] &= !(1 << j);
                if self.mid[i] == 0 {
                    self.top &= !(1 << i);
                }
            }
        }
        self.len -= 1;
        self.bytes -= hdr.bytes;
        hdr
    }

    fn pop_huge(&mut self, bytes: usize) -> Option<Box<Header>> {
        // The first entry of at least `bytes` in the ascending list.
        let mut link: *mut Option<NonNull<Header>> = &mut self.huge;
        // SAFETY: `link` points at `self.huge` or at the `next` field of a header the
        // index owns; we hold `&mut self`, so nothing else accesses them.
        unsafe {
            while let Some(ptr) = *link {
                if (*ptr.as_ptr()).bytes >= bytes {
                    let mut hdr = Box::from_raw(ptr.as_ptr());
                    *link = hdr.next.take();
                    self.len -= 1;
                    self.bytes -= hdr.bytes;
                    return Some(hdr);
                }
                link = &raw mut (*ptr.as_ptr()).next;
            }
        }
        None
    }

    /// Caches `hdr` as the newest of its class (LIFO). `Err(hdr)` only when a new chunk
    /// of classes could not be allocated (the caller frees the header instead).
    #[inline]
    pub(crate) fn push(&mut self, hdr: Box<Header>) -> Result<(), Box<Header>> {
        let class = class_index(self.arm, hdr.bytes);
        if class < FLAT && !self.ensure_chunk(class) {
            return Err(hdr);
        }
        if self.front.is_some() {
            let old = self.take_front();
            if let Err(old) = self.push_stacked(old) {
                // Keep the old front; the new header is the one given back.
                self.set_front(old);
                return Err(hdr);
            }
        }
        self.set_front(hdr);
        Ok(())
    }

    #[inline]
    fn set_front(&mut self, hdr: Box<Header>) {
        debug_assert!(self.front.is_none());
        self.len += 1;
        self.bytes += hdr.bytes;
        self.front = Some(NonNull::from(Box::leak(hdr)));
    }

    /// Pushes `hdr` on its class stack (or into the huge list).
    fn push_stacked(&mut self, mut hdr: Box<Header>) -> Result<(), Box<Header>> {
        let bytes = hdr.bytes;
        let class = class_index(self.arm, bytes);
        if class >= FLAT {
            self.push_huge(hdr);
        } else {
            if !self.ensure_chunk(class) {
                return Err(hdr);
            }
            let (c, b) = (class >> 6, class & 63);
            let chunk = self.chunks[c].as_mut().expect("ensured above");
            hdr.next = chunk.heads[b];
            chunk.heads[b] = Some(NonNull::from(Box::leak(hdr)));
            if chunk.bits == 0 {
                let (i, j) = (c >> 6, c & 63);
                self.mid[i] |= 1 << j;
                self.top |= 1 << i;
            }
            chunk.bits |= 1 << b;
        }
        self.len += 1;
        self.bytes += bytes;
        Ok(())
    }

    /// Allocates the chunk of `class` (below `FLAT`) if it is new; `false` if that
    /// allocation failed. Done when a header of the class is first cached, even into
    /// the front slot, so that pushing it down later never allocates.
    #[inline]
    fn ensure_chunk(&mut self, class: usize) -> bool {
        let c = class >> 6;
        if self.chunks.len() <= c {
            if self.chunks.try_reserve(c + 1 - self.chunks.len()).is_err() {
                return false;
            }
            self.chunks.resize_with(c + 1, || None);
        }
        if self.chunks[c].is_none() {
            let mut one = Vec::new();
            if one.try_reserve_exact(1).is_err() {
                return false;
            }
            one.push(Chunk {
                bits: 0,
                heads: [None; 64],
            });
            let boxed: Box<[Chunk]> = one.into_boxed_slice();
            // SAFETY: a boxed slice of exactly one `Chunk` has the layout of a
            // `Box<Chunk>` (same allocation, same alignment), so it can be re-typed.
            self.chunks[c] = Some(unsafe { Box::from_raw(Box::into_raw(boxed).cast::<Chunk>()) });
        }
        true
    }

    fn push_huge(&mut self, mut hdr: Box<Header>) {
        // Before the first entry of at least the same capacity (LIFO among equals).
        let bytes = hdr.bytes;
        let mut link: *mut Option<NonNull<Header>> = &mut self.huge;
        // SAFETY: as in `pop_huge`.
        unsafe {
            while let Some(ptr) = *link {
                if (*ptr.as_ptr()).bytes >= bytes {
                    break;
                }
                link = &raw mut (*ptr.as_ptr()).next;
            }
            hdr.next = *link;
            *link = Some(NonNull::from(Box::leak(hdr)));
        }
    }

    /// Moves every cached header out (to be freed, or re-cached, by the caller outside
    /// any lock); the index keeps its chunks.
    pub(crate) fn drain(&mut self) -> Chain {
        let mut out = Chain::new();
        if self.front.is_some() {
            out.push(self.take_front());
        }
        while self.top != 0 {
            let i = self.top.trailing_zeros() as usize;
            let c = i << 6 | self.mid[i].trailing_zeros() as usize;
            let bits = self.chunks[c].as_ref().expect("marked").bits;
            out.push(self.pop_class(c << 6 | bits.trailing_zeros() as usize));
        }
        while let Some(hdr) = self.pop_huge(0) {
            out.push(hdr);
        }
        debug_assert_eq!((self.len, self.bytes), (0, 0));
        out
    }

    /// Calls `f` on every cached header (the front first, then the stacks in ascending
    /// order of capacity, LIFO within a class) and checks the bitmaps against the
    /// stacks (test support).
    pub(crate) fn for_each_checked(&self, mut f: impl FnMut(&Header)) {
        let mut count = 0;
        if let Some(ptr) = self.front {
            // SAFETY: the index owns the header; `&self` keeps it in place.
            f(unsafe { ptr.as_ref() });
            count += 1;
        }
        let mut last = 0;
        for (c, chunk) in self.chunks.iter().enumerate() {
            let Some(chunk) = chunk else { continue };
            let (i, j) = (c >> 6, c & 63);
            assert_eq!(
                chunk.bits != 0,
                self.mid[i] & (1 << j) != 0,
                "mid bit of chunk {c}"
            );
            for b in 0..64 {
                assert_eq!(
                    chunk.bits & (1 << b) != 0,
                    chunk.heads[b].is_some(),
                    "class bit"
                );
                let mut link = chunk.heads[b];
                while let Some(ptr) = link {
                    // SAFETY: the index owns the header; `&self` keeps it in place.
                    let hdr = unsafe { ptr.as_ref() };
                    assert_eq!(class_index(self.arm, hdr.bytes), c << 6 | b, "wrong class");
                    assert!(hdr.bytes >= last, "classes out of order");
                    last = hdr.bytes;
                    f(hdr);
                    count += 1;
                    link = hdr.next;
                }
            }
        }
        for i in 0..64 {
            assert_eq!(self.mid[i] != 0, self.top & (1 << i) != 0, "top bit {i}");
        }
        let mut link = self.huge;
        while let Some(ptr) = link {
            // SAFETY: as above.
            let hdr = unsafe { ptr.as_ref() };
            assert!(hdr.bytes >= last, "huge list out of order");
            last = hdr.bytes;
            f(hdr);
            count += 1;
            link = hdr.next;
        }
        assert_eq!(count, self.len);
    }
}

impl Drop for FreeIndex {
    fn drop(&mut self) {
        drop(self.drain());
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::AlignedBlock;

    fn hdr(bytes: usize) -> Box<Header> {
        Header::with_block(AlignedBlock::new(bytes).unwrap())
    }

    #[test]
    fn class_indexes_ascend_with_capacity() {
        let f32_caps = [1usize, 2, 4, 512, 1024, 2048, 3072, 1 << 28];
        let idx: Vec<_> = f32_caps
            .iter()
            .map(|&l| class_index(Arm::F32, l * 4))
            .collect();
        assert_eq!(idx, vec![0, 1, 2, 9, 10, 11, 12, 9 + (1 << 18)]);
        assert_eq!(class_index(Arm::Slab, 4096), 0);
        assert_eq!(class_index(Arm::Slab, 1 << 30), FLAT - 1);
    }

    #[test]
    #[cfg_attr(miri, ignore = "reserves several GiB of (untouched) blocks")]
    fn first_fit_lifo_and_bitmap_levels() {
        let mut ix = FreeIndex::new(Arm::Slab);
        // Classes spread over several chunks and `mid` words.
        let classes = [
            0usize,
            1,
            63,
            64,
            4095,
            4096,
            70_000,
            FLAT - 1,
            FLAT + 5,
            FLAT,
        ];
        for &c in &classes {
            ix.push(hdr((c + 1) * 4096)).unwrap();
        }
        let extra = hdr(4096 * 64);
        let extra_ptr = extra.data;
        ix.push(extra).unwrap(); // class 63, on top of the other one
        ix.for_each_checked(|_| {});
        assert_eq!(ix.len(), classes.len() + 1);
        assert_eq!(ix.pop_fit(4096 * 2).unwrap().bytes, 4096 * 2);
        assert_eq!(
            ix.pop_fit(4096 * 3).unwrap().data,
            extra_ptr,
            "LIFO within a class"
        );
        assert_eq!(ix.pop_fit(4096 * 3).unwrap().bytes, 4096 * 64);
        assert_eq!(ix.pop_fit(4096 * 66).unwrap().bytes, 4096 * 4096);
        assert_eq!(ix.pop_fit(4096 * 5000).unwrap().bytes, 4096 * 70_001);
        assert_eq!(ix.pop_fit(4096 * 70_002).unwrap().bytes, 4096 * FLAT);
        // Past the bitmap: the ascending huge list.
        assert_eq!(ix.pop_fit(4096 * 70_002).unwrap().bytes, 4096 * (FLAT + 1));
        assert_eq!(
            ix.pop_fit(4096 * (FLAT + 2)).unwrap().bytes,
            4096 * (FLAT + 6)
        );
        assert!(ix.pop_fit(4096 * 70_002).is_none());
        ix.for_each_checked(|_| {});
        let mut rest = ix.drain();
        let mut left = Vec::new();
        while let Some(h) = rest.pop() {
            left.push(h.bytes);
        }
        left.sort_unstable();
        assert_eq!(left, vec![4096, 4096 * 65, 4096 * 4097]);
        assert_eq!((ix.len(), ix.bytes()), (0, 0));
    }
}
