//! A bump allocator over one aligned block.

use std::cell::Cell;
use std::fmt;

use crate::StorageError;
use crate::aligned::AlignedBlock;

/// A bump allocator over one [`AlignedBlock`]: allocating moves an offset forward and
/// [`Arena::reset`] takes everything back at once. No allocation ever reaches the heap
/// after [`Arena::new`].
///
/// Slices are handed out through `&self` (so several can be alive together) and
/// `reset` needs `&mut self`, so the borrow checker rejects a reset while any slice
/// lives: a rule that is checked at compile time, not just documented.
///
/// Contents: the block is zeroed once at creation, so a fresh slice reads zeros and a
/// slice handed out after a reset reads whatever the previous round wrote.
///
/// ```
/// use fucina_storage::Arena;
///
/// let mut arena = Arena::new(1024)?;
/// for _step in 0..3 {
///     let a = arena.alloc_slice::<f32>(100).unwrap();
///     let b = arena.alloc_slice::<u8>(10).unwrap(); // `a` is still usable
///     a[0] = 1.0;
///     b[0] = 2;
///     assert!(arena.alloc_slice::<f64>(1000).is_none()); // does not fit
///     arena.reset(); // `a` and `b` must be dead here
/// }
/// assert_eq!(arena.used(), 0);
/// # Ok::<(), fucina_storage::StorageError>(())
/// ```
///
/// Handing out slices from a `&self` bump, e.g. keeping one past a reset, is rejected:
///
/// ```compile_fail,E0502
/// let mut arena = fucina_storage::Arena::new(64).unwrap();
/// let a = arena.alloc_slice::<u32>(4).unwrap();
/// arena.reset();
/// a[0] = 1;
/// ```
pub struct Arena {
    block: AlignedBlock,
    /// Bytes used from the start of the block; only grows between resets.
    offset: Cell<usize>,
}

impl Arena {
    /// An arena over a fresh zeroed block of `capacity_bytes` (64-byte aligned).
    ///
    /// # Errors
    /// The errors of [`AlignedBlock::new_zeroed`].
    pub fn new(capacity_bytes: usize) -> Result<Self, StorageError> {
        Ok(Self {
            block: AlignedBlock::new_zeroed(capacity_bytes)?,
            offset: Cell::new(0),
        })
    }

    /// Bump-allocates `n` values of `T`, aligned for `T`; `None` when they do not fit
    /// (or the byte size overflows). The slice borrows the arena until the next
    /// [`Arena::reset`].
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_slice<T: bytemuck::Pod>(&self, n: usize) -> Option<&mut [T]> {
        let bytes = n.checked_mul(size_of::<T>())?;
        let base = self.block.as_ptr() as usize;
        let start_addr = (base + self.offset.get()).checked_next_multiple_of(align_of::<T>())?;
        let start = start_addr - base;
        let end = start.checked_add(bytes)?;
        if end > self.block.len() {
            return None;
        }
        self.offset.set(end);
        // SAFETY:
        // - `[start, end)` lies inside the block, is aligned for `T`, and is disjoint from
        //   every slice handed out since the last reset (the offset only moves forward
        //   and `reset` takes `&mut self`, so no earlier slice can still be alive across
        //   one); so this `&mut` aliases nothing. `Arena` is `!Sync` (the `Cell`), so no
        //   other thread bumps concurrently.
        // - every byte is initialized (zeroed at creation; later written only with `Pod`
        //   values, which have no padding), and any bytes are a valid `T` (Pod).
        // - the pointer is derived from the block's own allocation, which has write
        //   provenance, and the block lives as long as `&self`.
        unsafe {
            let ptr = self.block.as_ptr().cast_mut().add(start).cast::<T>();
            Some(std::slice::from_raw_parts_mut(ptr, n))
        }
    }

    /// Takes back every allocation (no slice can be alive: this needs `&mut self`).
    pub fn reset(&mut self) {
        self.offset.set(0);
    }

    /// Bytes consumed since the last reset, alignment padding included.
    pub fn used(&self) -> usize {
        self.offset.get()
    }

    /// Size of the block in bytes.
    pub fn capacity(&self) -> usize {
        self.block.len()
    }

    /// Bytes left before the arena is full (ignoring future alignment padding).
    pub fn remaining(&self) -> usize {
        self.capacity() - self.used()
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("used", &self.used())
            .field("capacity", &self.capacity())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_padding_and_full() {
        let arena = Arena::new(256).unwrap();
        let a = arena.alloc_slice::<u8>(3).unwrap();
        assert_eq!(a, &[0, 0, 0]);
        a[0] = 9;
        let b = arena.alloc_slice::<f64>(2).unwrap();
        assert_eq!(b.as_ptr() as usize % 8, 0);
        assert_eq!(arena.used(), 8 + 16);
        let c = arena.alloc_slice::<u16>(1).unwrap();
        assert_eq!(arena.used(), 26);
        // The exact remainder fits, one more byte does not.
        assert!(arena.alloc_slice::<u8>(231).is_none());
        let d = arena.alloc_slice::<u8>(230).unwrap();
        assert_eq!(arena.remaining(), 0);
        assert!(arena.alloc_slice::<u8>(1).is_none());
        assert!(arena.alloc_slice::<u8>(0).is_some());
        assert!(arena.alloc_slice::<u64>(usize::MAX).is_none());
        b[1] = 2.5;
        c[0] = 7;
        d[229] = 1;
        assert_eq!((a[0], b[1], c[0], d[229]), (9, 2.5, 7, 1));
    }

    #[test]
    fn reset_reuses_the_same_memory() {
        let mut arena = Arena::new(128).unwrap();
        let first = arena.alloc_slice::<u32>(4).unwrap();
        first.copy_from_slice(&[1, 2, 3, 4]);
        let addr = first.as_ptr();
        arena.reset();
        assert_eq!(arena.used(), 0);
        let again = arena.alloc_slice::<u32>(4).unwrap();
        assert_eq!(again.as_ptr(), addr);
        assert_eq!(again, &[1, 2, 3, 4], "stale-but-initialized after reset");
        assert_eq!(arena.capacity(), 128);
    }
}
