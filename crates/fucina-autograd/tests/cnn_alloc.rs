//! Heap allocations of a pooling + batch-norm + group-norm + pad + interpolate +
//! 1-D pooling training step after warm-up,
//! counted by a global allocator of this test binary (each test in a process of
//! its own, see `allocations.rs`).

use fucina_autograd::exec::{ExecContext, RawTensor};
use fucina_autograd::{
    GroupNormOptions, InterpolateMode, InterpolateOptions, PadMode, PadOptions, Pool1dOptions,
    Pool2dOptions, Tensor, free_graph_nodes,
};

#[path = "support/alloc_count.rs"]
mod alloc_count;
use alloc_count::{Counting, count, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

struct Params {
    gamma: Tensor,
    beta: Tensor,
    gn_weight: Tensor,
    gn_bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
}

/// max pool -> batch norm (training, with the statistics) -> group norm ->
/// reflect pad -> nearest and bilinear interpolate -> avg pool -> adaptive
/// avg pool -> flatten -> 1-D max pool -> flatten -> cumsum -> scatter_add -> loss,
/// backward, SGD; then an eval-mode forward. Returns the loss.
fn step(
    ctx: &ExecContext,
    p: &mut Params,
    x: &Tensor,
    index: &RawTensor<i64>,
    scoped: bool,
) -> f32 {
    let scope = scoped.then(|| ctx.open_exec_scope());
    let h = x.max_pool2d(ctx, Pool2dOptions::new([2, 2])).unwrap();
    let (h, stats) = h
        .batch_norm_with_stats(ctx, &p.gamma, &p.beta, 1e-5)
        .unwrap();
    let h = h
        .group_norm(
            ctx,
            Some(&p.gn_weight),
            Some(&p.gn_bias),
            GroupNormOptions::new(3),
        )
        .unwrap()
        .pad(
            ctx,
            PadOptions::new(&[1, 1, 2, 0], PadMode::Reflect).unwrap(),
        )
        .unwrap()
        .interpolate(
            ctx,
            InterpolateOptions::scale([2.0, 2.0], InterpolateMode::Nearest),
        )
        .unwrap()
        .interpolate(
            ctx,
            InterpolateOptions::size(
                [21, 20],
                InterpolateMode::Bilinear {
                    align_corners: false,
                },
            ),
        )
        .unwrap()
        .avg_pool2d(
            ctx,
            Pool2dOptions {
                kernel: [3, 3],
                stride: [1, 1],
                padding: [1, 1],
            },
        )
        .unwrap()
        .adaptive_avg_pool2d(ctx, [2, 2])
        .unwrap()
        .flatten(ctx, 2)
        .unwrap()
        .max_pool1d(
            ctx,
            Pool1dOptions {
                kernel: 3,
                stride: 1,
                padding: 1,
            },
        )
        .unwrap()
        .flatten(ctx, 1)
        .unwrap()
        .cumsum(ctx, 1)
        .unwrap();
    let zeros = Tensor::constant(ctx.zeros(&[16, 3]).unwrap());
    let s = zeros.scatter_add(ctx, 1, index, &h).unwrap();
    let loss = s.mul(ctx, &s).unwrap().mean_all(ctx).unwrap();
    let value = loss.item().unwrap();
    loss.backward(ctx).unwrap();
    drop((h, s, loss, zeros));
    if let Some(scope) = scope {
        ctx.close_exec_scope(scope);
    }
    p.gamma.sgd_step_(0.1).unwrap();
    p.beta.sgd_step_(0.1).unwrap();
    p.gn_weight.sgd_step_(0.1).unwrap();
    p.gn_bias.sgd_step_(0.1).unwrap();
    p.gamma.zero_grad();
    p.beta.zero_grad();
    p.gn_weight.zero_grad();
    p.gn_bias.zero_grad();
    assert!(x.grad_view().is_some(), "the max pool backward ran");
    x.zero_grad();
    // Running statistics, PyTorch's momentum convention (0.1).
    let (m, v) = (
        stats.mean.data().unwrap(),
        stats.unbiased_var.data().unwrap(),
    );
    let ema = |r: &mut [f32], b: &[f32]| {
        for (r, &b) in r.iter_mut().zip(b) {
            *r = 0.9 * *r + 0.1 * b;
        }
    };
    p.running_mean.update_(|r| ema(r, m)).unwrap();
    p.running_var.update_(|r| ema(r, v)).unwrap();
    drop(stats);
    let guard = fucina_autograd::no_grad();
    let y = x
        .max_pool2d(ctx, Pool2dOptions::new([2, 2]))
        .unwrap()
        .batch_norm_eval(
            ctx,
            &p.running_mean,
            &p.running_var,
            &p.gamma,
            &p.beta,
            1e-5,
        )
        .unwrap();
    drop(guard);
    assert!(y.raw().data().unwrap()[0].is_finite());
    value
}

fn run(threads: usize, scoped: bool) {
    let ctx = ExecContext::with_threads(threads);
    // Large enough that every op splits over the team.
    let x = Tensor::randn(&ctx, &[16, 3, 40, 40], 1.0, 1)
        .unwrap()
        .into_variable();
    let mut p = Params {
        gamma: Tensor::ones(&ctx, &[3]).unwrap().into_variable(),
        beta: Tensor::zeros(&ctx, &[3]).unwrap().into_variable(),
        running_mean: Tensor::zeros(&ctx, &[3]).unwrap(),
        running_var: Tensor::ones(&ctx, &[3]).unwrap(),
        gn_weight: Tensor::ones(&ctx, &[3]).unwrap().into_variable(),
        gn_bias: Tensor::zeros(&ctx, &[3]).unwrap().into_variable(),
    };
    let idx: Vec<i64> = (0..16 * 12).map(|i| (i % 3) as i64).collect();
    let index = ctx.from_slice_typed::<i64>(&[16, 12], &idx).unwrap();
    let first = step(&ctx, &mut p, &x, &index, scoped); // warm-up
    step(&ctx, &mut p, &x, &index, scoped);
    let mut last = first;
    let (allocs, misses) = count(|| {
        for _ in 0..3 {
            last = step(&ctx, &mut p, &x, &index, scoped);
        }
    });
    assert!(
        last.is_finite() && last != first,
        "the step trains ({first} -> {last})"
    );
    assert_eq!(
        misses, 0,
        "pool misses after warm-up ({threads} threads, scoped {scoped})"
    );
    assert_eq!(
        allocs, 0,
        "heap allocations per step ({threads} threads, scoped {scoped})"
    );
    // max_pool, batch_norm, group_norm, pad, 2 interpolates, avg_pool,
    // adaptive, reshape, max_pool1d (unsqueeze, pool, squeeze), reshape,
    // cumsum, scatter_add, mul, mean_all: all released to the free list.
    let free = free_graph_nodes(&ctx);
    assert_eq!(free, 17, "graph nodes back in the free list");
}

#[test]
fn zero_allocations_per_pool_batch_norm_step_one_thread() {
    in_own_process(
        "zero_allocations_per_pool_batch_norm_step_one_thread",
        || {
            run(1, true);
            run(1, false);
        },
    );
}

#[test]
fn zero_allocations_per_pool_batch_norm_step_two_threads() {
    in_own_process(
        "zero_allocations_per_pool_batch_norm_step_two_threads",
        || {
            run(2, true);
            run(2, false);
        },
    );
}
