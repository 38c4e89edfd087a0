//! The counting global allocator of `fucina-thread`'s test support plus
//! [`count`], the heap-allocation and pool-miss measurement shared by the
//! zero-allocation tests of this crate (`allocations.rs`, `cnn_alloc.rs`,
//! `conv.rs`, `attention.rs`, `recurrent.rs`; the last two also check their
//! steady state with [`assert_steady_step`]), which include this file with `#[path]` and install
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

/// The steady state of a training-step test after warm-up: the step still
/// trains (`last` finite and not `first`), it took no fresh pooled block and
/// no heap allocation, and its graph nodes went back to the free list.
pub(crate) fn assert_steady_step(
    ctx: &fucina_autograd::exec::ExecContext,
    (first, last): (f32, f32),
    (allocs, misses): (usize, usize),
    what: &str,
) {
    assert!(
        last.is_finite() && last != first,
        "the step trains ({first} -> {last})"
    );
    assert_eq!(misses, 0, "pool misses after warm-up ({what})");
    assert_eq!(allocs, 0, "heap allocations per step ({what})");
    assert!(
        fucina_autograd::free_graph_nodes(ctx) > 0,
        "the step's nodes are back in the free list"
    );
}
