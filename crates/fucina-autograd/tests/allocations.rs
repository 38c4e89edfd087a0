//! Heap allocations of a training step after warm-up, counted by a global
//! allocator of this test binary (its own binary: the counter is process-wide).
#![allow(clippy::result_large_err)] // `AutogradError` carries inline shapes

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use fucina_autograd::Tensor;
use fucina_autograd::exec::ExecContext;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments, so the
// `GlobalAlloc` contract is `System`'s; the counter has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
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
fn allocations_per_training_step_after_warm_up() {
    let ctx = ExecContext::with_threads(1);
    let x = Tensor::randn(&ctx, &[8, 16], 1.0, 1).unwrap();
    let t = Tensor::randn(&ctx, &[8, 16], 1.0, 2).unwrap();
    let mut w = Tensor::randn(&ctx, &[16], 0.1, 3).unwrap().into_variable();
    let mut b = Tensor::zeros(&ctx, &[16]).unwrap().into_variable();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..3 {
        step(&ctx, &mut w, &mut b, &x, &t);
    }
    let (per_step, misses) = count(|| step(&ctx, &mut w, &mut b, &x, &t));
    assert_eq!(misses, 0, "pool misses after warm-up");
    // Six recorded ops, one allocation each: the graph node, which holds the VJP
    // and its saved tensors and (up to three) input links inline. Backward's
    // bookkeeping and the graph's release reuse per-thread buffers, tensors come
    // from the pool. (The node itself is the allocation left: an exec scope
    // releases the nodes it adopted itself, so they cannot be recycled here.)
    println!("heap allocations per step: {per_step}");
    assert!(per_step <= 6, "{per_step} heap allocations per step");
}

/// One step of a small MLP (linear, ReLU, linear, cross-entropy, SGD) under a
/// scope, as the step benchmark runs it.
fn mlp_step(
    ctx: &ExecContext,
    p: &mut [Tensor; 4],
    x: &Tensor,
    labels: &fucina_autograd::exec::RawTensor<i64>,
) {
    let scope = ctx.open_exec_scope();
    let h = x
        .linear(ctx, &p[0], Some(&p[1]))
        .unwrap()
        .relu(ctx)
        .unwrap();
    let logits = h.linear(ctx, &p[2], Some(&p[3])).unwrap();
    let loss = logits.cross_entropy(ctx, labels).unwrap();
    loss.backward(ctx).unwrap();
    drop((h, logits, loss));
    ctx.close_exec_scope(scope);
    for t in p.iter_mut() {
        t.sgd_step_(0.01).unwrap();
        t.zero_grad();
    }
}

#[test]
fn allocations_per_mlp_step_after_warm_up() {
    let ctx = ExecContext::with_threads(1);
    let x = Tensor::randn(&ctx, &[16, 48], 1.0, 1).unwrap();
    let l: Vec<i64> = (0..16).map(|i| i % 5).collect();
    let labels = ctx.from_slice_typed::<i64>(&[16], &l).unwrap();
    let mut p = [
        Tensor::kaiming_uniform(&ctx, &[32, 48], 2)
            .unwrap()
            .into_variable(),
        Tensor::zeros(&ctx, &[32]).unwrap().into_variable(),
        Tensor::kaiming_uniform(&ctx, &[5, 32], 3)
            .unwrap()
            .into_variable(),
        Tensor::zeros(&ctx, &[5]).unwrap().into_variable(),
    ];
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..3 {
        mlp_step(&ctx, &mut p, &x, &labels);
    }
    let (per_step, misses) = count(|| mlp_step(&ctx, &mut p, &x, &labels));
    assert_eq!(misses, 0, "pool misses after warm-up");
    println!("heap allocations per MLP step: {per_step}");
    // Four recorded ops (linear, relu, linear, cross_entropy): one node each.
    assert!(per_step <= 4, "{per_step} heap allocations per MLP step");
}
