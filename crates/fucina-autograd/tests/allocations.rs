//! Heap allocations of a training step after warm-up, counted by a global
//! allocator of this test binary (its own binary: the counter is process-wide).
#![allow(clippy::result_large_err)] // `AutogradError` carries inline shapes

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use fucina_autograd::exec::ExecContext;
use fucina_autograd::{Tensor, free_graph_nodes};

#[path = "support/mlp.rs"]
mod mlp;
use mlp::{mlp_batch, mlp_params, mlp_step};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

use std::cell::Cell;

thread_local! {
    /// Whether this thread's allocations count: 0 not known yet, 1 no (the
    /// process's first thread, libtest's main thread, which never runs a test
    /// but under load may reach its first blocking channel receive, which
    /// allocates, only after a test has started measuring), 2 yes.
    static KIND: Cell<u8> = const { Cell::new(0) };
}

/// Whether the calling thread's allocations are counted (never allocates).
fn counted() -> bool {
    KIND.try_with(|k| {
        if k.get() == 0 {
            #[cfg(target_os = "linux")]
            // SAFETY: `gettid` and `getpid` are plain system calls without
            // preconditions; the first thread's id is the process id.
            let first = unsafe { libc::gettid() == libc::getpid() };
            #[cfg(not(target_os = "linux"))]
            let first = false;
            k.set(if first { 1 } else { 2 });
        }
        k.get() == 2
    })
    // A thread being torn down: count it.
    .unwrap_or(true)
}

// SAFETY: every method forwards to `System` with the caller's arguments, so the
// `GlobalAlloc` contract is `System`'s; the counter has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counted() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if counted() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counted() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counters are process-wide: the tests of this binary take turns (`cargo
/// test` runs them on parallel threads).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Heap allocations and pool misses (fresh pooled blocks) of `f`.
fn count(f: impl FnOnce()) -> (usize, usize) {
    let misses = fucina_autograd::exec::storage::allocation_stats().allocations;
    let before = ALLOCS.load(Ordering::Relaxed);
    f();
    (
        ALLOCS.load(Ordering::Relaxed) - before,
        fucina_autograd::exec::storage::allocation_stats().allocations - misses,
    )
}

/// One step of a tiny regression model built from elementwise ops:
/// `loss = mean((tanh(x * w + b) - t)^2)`, backward, SGD, zero_grad.
fn step(ctx: &ExecContext, w: &mut Tensor, b: &mut Tensor, x: &Tensor, t: &Tensor) {
    let scope = ctx.open_exec_scope();
    let y = x
        .mul(ctx, w)
        .unwrap()
        .add(ctx, b)
        .unwrap()
        .tanh(ctx)
        .unwrap();
    let d = y.sub(ctx, t).unwrap();
    let loss = d.mul(ctx, &d).unwrap().mean_all(ctx).unwrap();
    loss.backward(ctx).unwrap();
    drop((y, d, loss));
    ctx.close_exec_scope(scope);
    w.sgd_step_(0.1).unwrap();
    b.sgd_step_(0.1).unwrap();
    w.zero_grad();
    b.zero_grad();
}

#[test]
fn zero_allocations_per_elementwise_step_after_warm_up() {
    let ctx = ExecContext::with_threads(1);
    let x = Tensor::randn(&ctx, &[8, 16], 1.0, 1).unwrap();
    let t = Tensor::randn(&ctx, &[8, 16], 1.0, 2).unwrap();
    let mut w = Tensor::randn(&ctx, &[16], 0.1, 3).unwrap().into_variable();
    let mut b = Tensor::zeros(&ctx, &[16]).unwrap().into_variable();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    step(&ctx, &mut w, &mut b, &x, &t);
    let (per_step, misses) = count(|| step(&ctx, &mut w, &mut b, &x, &t));
    assert_eq!(misses, 0, "pool misses after warm-up");
    assert_eq!(per_step, 0, "{per_step} heap allocations per step");
    // Six recorded ops: their nodes went back to the context's free list.
    assert_eq!(free_graph_nodes(&ctx), 6);
}

fn mlp_allocations(threads: usize, scoped: bool) {
    let ctx = ExecContext::with_threads(threads);
    let (x, labels) = mlp_batch(&ctx);
    let mut p = mlp_params(&ctx);
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let first = mlp_step(&ctx, &mut p, &x, &labels, scoped); // warm-up
    let mut last = first;
    let (allocs, misses) = count(|| {
        for _ in 0..3 {
            last = mlp_step(&ctx, &mut p, &x, &labels, scoped);
        }
    });
    assert!(last < first, "the loss decreases ({first} -> {last})");
    assert_eq!(
        misses, 0,
        "pool misses in 3 steps after warm-up ({threads} threads, scoped {scoped})"
    );
    assert_eq!(
        allocs, 0,
        "heap allocations in 3 steps after warm-up ({threads} threads, scoped {scoped})"
    );
    // Four recorded ops (linear, relu, linear, cross_entropy), all released.
    assert_eq!(free_graph_nodes(&ctx), 4);
}

#[test]
fn zero_allocations_per_mlp_step_scoped() {
    mlp_allocations(1, true);
}

#[test]
fn zero_allocations_per_mlp_step_unscoped() {
    mlp_allocations(1, false);
}

#[test]
fn zero_allocations_per_mlp_step_two_threads() {
    mlp_allocations(2, true);
    mlp_allocations(2, false);
}

/// The counter is not vacuous: it sees an allocation on the test's thread and
/// on any other thread but the harness's first one (workers are such threads).
#[test]
fn the_counter_sees_the_test_thread_and_other_threads() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = ALLOCS.load(Ordering::SeqCst);
    drop(std::hint::black_box(vec![0u8; 64]));
    assert!(ALLOCS.load(Ordering::SeqCst) > before);
    std::thread::spawn(|| {
        let before = ALLOCS.load(Ordering::SeqCst);
        drop(std::hint::black_box(vec![0u8; 64]));
        assert!(ALLOCS.load(Ordering::SeqCst) > before);
    })
    .join()
    .unwrap();
}
