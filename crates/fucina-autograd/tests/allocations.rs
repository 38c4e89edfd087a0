//! Heap allocations of a training step after warm-up, counted by a global
//! allocator of this test binary. The counter sees every thread but the test
//! harness's first one, and the pool-miss counter is process-wide too, so each
//! test runs alone in a process of its own (`counting::in_own_process`) under
//! plain `cargo test` as under nextest.

use fucina_autograd::exec::{ExecContext, RawTensor};
use fucina_autograd::{
    AutogradError, BackwardOptions, Tensor, custom_vjp, custom_vjp_unsaved, free_graph_nodes,
};

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
/// `tanh(w * x)` as one op that recomputes itself in its backward: the
/// forward runs without a graph, the backward records it again over fresh
/// variables of the saved inputs and runs a backward of its own (the
/// gradient checkpointing pattern).
fn recomputed(ctx: &ExecContext, w: &Tensor, x: &Tensor) -> Tensor {
    let f = |ctx: &ExecContext, w: &Tensor, x: &Tensor| w.mul(ctx, x)?.tanh(ctx);
    let out = {
        let _g = fucina_autograd::no_grad();
        f(ctx, w, x).unwrap().raw().clone()
    };
    let saved = [w.raw().clone(), x.raw().clone()];
    custom_vjp_unsaved(
        ctx,
        "recomputed",
        &[w, x],
        move |_, _| Ok(out),
        move |ctx, a| {
            let wv = Tensor::constant(saved[0].clone()).into_variable();
            let y = f(ctx, &wv, &Tensor::constant(saved[1].clone()))?;
            y.backward_with(ctx, Some(a.grad), BackwardOptions::default())?;
            let gw: Option<RawTensor> = wv.grad(ctx)?.map(|g| g.raw().clone());
            Ok([gw, None])
        },
    )
    .unwrap()
}

/// A step through custom ops: a recomputed block, a `custom_vjp` that keeps
/// its inputs, and a `concat` of two parts; backward, SGD, `zero_grad`.
fn custom_step(ctx: &ExecContext, w: &mut Tensor, x: &Tensor) {
    let y = recomputed(ctx, w, x);
    let z = custom_vjp(
        ctx,
        "double",
        &[&y],
        |ctx, a| Ok(ctx.scale(&a[0], 2.0)?),
        |ctx, a| -> Result<[Option<RawTensor>; 1], AutogradError> {
            Ok([Some(ctx.scale(a.grad, 2.0)?)])
        },
    )
    .unwrap();
    let loss = Tensor::concat(ctx, &[&y, &z], 0)
        .unwrap()
        .sum_all(ctx)
        .unwrap();
    loss.backward(ctx).unwrap();
    drop((y, z, loss));
    w.sgd_step_(0.1).unwrap();
    w.zero_grad();
}

#[test]
fn zero_allocations_per_step_through_custom_ops_and_an_inner_backward() {
    in_own_process(
        "zero_allocations_per_step_through_custom_ops_and_an_inner_backward",
        || {
            let ctx = ExecContext::with_threads(1);
            let x = Tensor::randn(&ctx, &[4, 8], 1.0, 1).unwrap();
            let mut w = Tensor::randn(&ctx, &[8], 0.1, 3).unwrap().into_variable();
            custom_step(&ctx, &mut w, &x);
            let (per_step, misses) = count(|| custom_step(&ctx, &mut w, &x));
            assert_eq!(misses, 0, "pool misses after warm-up");
            assert_eq!(per_step, 0, "{per_step} heap allocations per step");
        },
    );
}

#[test]
fn the_counter_sees_the_test_thread_and_other_threads() {
    in_own_process(
        "the_counter_sees_the_test_thread_and_other_threads",
        alloc_count::counting::check_the_counter,
    );
}
