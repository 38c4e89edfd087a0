//! The counting global allocator of `fucina-thread`'s test support plus
//! [`count`], the heap-allocation and pool-miss measurement shared by the
//! zero-allocation tests of this crate (`allocations.rs`, `cnn_alloc.rs`,
//! `conv.rs`), which include this file with `#[path]` and install
//! [`Counting`] with `#[global_allocator]`.
#![allow(dead_code)] // not every including test uses every helper

use std::sync::atomic::Ordering;

#[path = "../../../fucina-thread/tests/support/counting.rs"]
pub(crate) mod counting;
pub(crate) use counting::{ALLOCATIONS, Counting, in_own_process};

/// Heap allocations and pool misses (fresh pooled blocks) of `f`.
pub(crate) fn count(f: impl FnOnce()) -> (usize, usize) {
    let misses = fucina_autograd::exec::storage::allocation_stats().allocations;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    f();
    (
        ALLOCATIONS.load(Ordering::Relaxed) - before,
        fucina_autograd::exec::storage::allocation_stats().allocations - misses,
    )
}
