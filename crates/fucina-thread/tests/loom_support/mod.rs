//! Shared support of the loom models (`#![cfg(loom)]` test binaries).

/// A loom-tracked cell shared by tasks; loom itself checks the accesses.
pub(crate) struct Cell(loom::cell::UnsafeCell<usize>);

// SAFETY: every access goes through loom's `with`/`with_mut`, which fail the
// model on any unsynchronized conflicting access: that is what we test.
unsafe impl Sync for Cell {}

impl Cell {
    pub(crate) fn new(v: usize) -> Self {
        Cell(loom::cell::UnsafeCell::new(v))
    }
    pub(crate) fn set(&self, v: usize) {
        // SAFETY: checked by loom (see the `Sync` impl).
        self.0.with_mut(|p| unsafe { *p = v });
    }
    pub(crate) fn get(&self) -> usize {
        // SAFETY: checked by loom (see the `Sync` impl).
        self.0.with(|p| unsafe { *p })
    }
}
