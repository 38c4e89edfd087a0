//! Heap allocations of a training step after warm-up, counted by a global
//! allocator of this test binary. The counter sees every thread but the test
//! harness's first one, and the pool-miss counter is process-wide too, so each
//! test runs alone in a process of its own (`counting::in_own_process`) under
//! plain `cargo test` as under nextest.

use fucina_autograd::exec::ExecContext;
use fucina_autograd::{Tensor, free_graph_nodes};

#[path = "support/mlp.rs"]
mod mlp;
use mlp::{mlp_batch, mlp_params, mlp_step};

#[path = "support/alloc_count.rs"]
mod alloc_count;
use alloc_count::{Counting, count, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

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
    in_own_process(
        "zero_allocations_per_elementwise_step_after_warm_up",
        elementwise_step,
    );
}

fn elementwise_step() {
    let ctx = ExecContext::with_threads(1);
    let x = Tensor::randn(&ctx, &[8, 16], 1.0, 1).unwrap();
    let t = Tensor::randn(&ctx, &[8, 16], 1.0, 2).unwrap();
    let mut w = Tensor::randn(&ctx, &[16], 0.1, 3).unwrap().into_variable();
    let mut b = Tensor::zeros(&ctx, &[16]).unwrap().into_variable();
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
    in_own_process("zero_allocations_per_mlp_step_scoped", || {
        mlp_allocations(1, true)
    });
}

#[test]
fn zero_allocations_per_mlp_step_unscoped() {
    in_own_process("zero_allocations_per_mlp_step_unscoped", || {
        mlp_allocations(1, false)
    });
}

#[test]
fn zero_allocations_per_mlp_step_two_threads() {
    in_own_process("zero_allocations_per_mlp_step_two_threads", || {
        mlp_allocations(2, true);
        mlp_allocations(2, false);
    });
}

#[test]
fn zero_allocations_per_mlp_step_under_autocast_bf16() {
    in_own_process("zero_allocations_per_mlp_step_under_autocast_bf16", || {
        // The rounded operands come from the pool like every op's output.
        let _bf16 = fucina_autograd::autocast_bf16();
        assert!(fucina_autograd::is_autocast_bf16());
        mlp_allocations(1, true);
        mlp_allocations(1, false);
        mlp_allocations(2, true);
    });
}

/// The counter is not vacuous: it sees the test's thread and other threads.
#[test]
fn the_counter_sees_the_test_thread_and_other_threads() {
    in_own_process(
        "the_counter_sees_the_test_thread_and_other_threads",
        alloc_count::counting::check_the_counter,
    );
}
