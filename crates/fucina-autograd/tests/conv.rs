//! `conv1d` / `conv2d` through autograd: finite-difference gradient checks of the
//! input, the weight and the bias for every option, bad input through the
//! differentiable surface, and zero heap allocations per conv training step at
//! steady state (the counting allocator sees the whole process, so that test runs
//! alone in a process of its own).

mod support;

use fucina_autograd::exec::ExecContext;
use fucina_autograd::{Conv1dOptions, Conv2dOptions, Tensor};
use support::{check, values};

#[path = "support/alloc_count.rs"]
mod alloc_count;
use alloc_count::{Counting, count, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

fn o2(s: [usize; 2], p: [usize; 2], d: [usize; 2], g: usize) -> Conv2dOptions {
    Conv2dOptions {
        stride: s,
        padding: p,
        dilation: d,
        groups: g,
    }
}

/// Gradcheck of input, weight and bias (when given) for one 2-D case.
fn check2(x: [usize; 4], w: [usize; 4], o: Conv2dOptions, bias: bool, seed: u64) {
    let ctx = ExecContext::new();
    let t = |shape: &[usize], s: u64| {
        let n: usize = shape.iter().product();
        ctx.from_slice(shape, &values(n, s, -1.0, 1.0)).unwrap()
    };
    let mut inputs = vec![t(&x, seed), t(&w, seed + 1)];
    if bias {
        inputs.push(t(&[w[0]], seed + 2));
    }
    let what = format!("conv2d x={x:?} w={w:?} {o:?} bias={bias}");
    check(
        &ctx,
        &what,
        |ctx, t| t[0].conv2d(ctx, &t[1], t.get(2), o),
        &inputs,
    );
}

#[test]
fn conv2d_gradcheck_plain_bias_and_padding() {
    check2(
        [2, 3, 5, 4],
        [4, 3, 3, 3],
        o2([1, 1], [1, 1], [1, 1], 1),
        true,
        1,
    );
    check2(
        [1, 2, 4, 5],
        [3, 2, 2, 3],
        Conv2dOptions::default(),
        false,
        2,
    );
}

#[test]
fn conv2d_gradcheck_stride_and_dilation() {
    check2(
        [1, 2, 7, 6],
        [3, 2, 3, 2],
        o2([2, 3], [1, 2], [1, 1], 1),
        true,
        3,
    );
    check2(
        [2, 2, 7, 7],
        [2, 2, 3, 3],
        o2([1, 2], [2, 1], [2, 2], 1),
        true,
        4,
    );
}

#[test]
fn conv2d_gradcheck_groups_depthwise_and_pointwise() {
    // groups with two channels each
    check2(
        [1, 4, 5, 5],
        [6, 2, 3, 3],
        o2([1, 1], [1, 1], [1, 1], 2),
        true,
        5,
    );
    // depthwise (groups == in == out): the direct kernels
    check2(
        [2, 3, 5, 6],
        [3, 1, 3, 3],
        o2([2, 1], [1, 1], [1, 1], 3),
        true,
        6,
    );
    check2(
        [1, 2, 6, 6],
        [2, 1, 2, 2],
        o2([1, 1], [0, 1], [2, 1], 2),
        false,
        7,
    );
    // 1x1 stride 1 (straight to the GEMM), and strided 1x1
    check2(
        [2, 4, 3, 3],
        [5, 4, 1, 1],
        Conv2dOptions::default(),
        true,
        8,
    );
    check2(
        [1, 4, 4, 4],
        [2, 2, 1, 1],
        o2([2, 2], [0, 0], [1, 1], 2),
        true,
        9,
    );
}

#[test]
fn conv1d_gradcheck_every_option() {
    let ctx = ExecContext::new();
    for (i, (x, w, o, bias)) in [
        (
            [2, 3, 8],
            [4, 3, 3],
            Conv1dOptions {
                padding: 1,
                ..Default::default()
            },
            true,
        ),
        (
            [1, 2, 9],
            [3, 2, 2],
            Conv1dOptions {
                stride: 2,
                dilation: 3,
                padding: 2,
                groups: 1,
            },
            false,
        ),
        (
            [2, 4, 6],
            [4, 1, 3],
            Conv1dOptions {
                groups: 4,
                padding: 1,
                ..Default::default()
            },
            true,
        ),
        (
            [1, 4, 5],
            [6, 2, 1],
            Conv1dOptions {
                groups: 2,
                ..Default::default()
            },
            true,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let t = |shape: &[usize], s: u64| {
            let n: usize = shape.iter().product();
            ctx.from_slice(shape, &values(n, s, -1.0, 1.0)).unwrap()
        };
        let s = 50 + 3 * i as u64;
        let mut inputs = vec![t(&x, s), t(&w, s + 1)];
        if bias {
            inputs.push(t(&[w[0]], s + 2));
        }
        check(
            &ctx,
            &format!("conv1d x={x:?} w={w:?} {o:?}"),
            |ctx, t| t[0].conv1d(ctx, &t[1], t.get(2), o),
            &inputs,
        );
    }
}

/// Bad input is an `Err` from the differentiable surface too, and records nothing.
#[test]
fn bad_input_is_an_error_through_autograd() {
    let ctx = ExecContext::new();
    let x = Tensor::zeros(&ctx, &[1, 4, 5, 5]).unwrap().into_variable();
    let w = Tensor::zeros(&ctx, &[6, 4, 3, 3]).unwrap().into_variable();
    let e = x
        .conv2d(&ctx, &w, None, o2([1, 1], [0, 0], [1, 1], 3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("conv2d") && e.contains("groups = 3"), "{e}");
    let e = x
        .conv2d(&ctx, &w, None, o2([0, 1], [0, 0], [1, 1], 1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("stride[0] = 0"), "{e}");
    let x1 = Tensor::zeros(&ctx, &[1, 4, 5]).unwrap();
    let w1 = Tensor::zeros(&ctx, &[2, 4, 7]).unwrap();
    let e = x1
        .conv1d(&ctx, &w1, None, Conv1dOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("conv1d") && e.contains("larger than the padded input"),
        "{e}"
    );
}

/// One training step of a small CNN: conv (3x3, pad 1) -> relu -> depthwise conv
/// -> pointwise conv -> conv1d over the flattened rows -> sum; backward; SGD.
fn cnn_step(ctx: &ExecContext, p: &mut [Tensor; 7], x: &Tensor) -> f32 {
    let scope = ctx.open_exec_scope();
    let h = x
        .conv2d(ctx, &p[0], Some(&p[1]), o2([1, 1], [1, 1], [1, 1], 1))
        .unwrap()
        .relu(ctx)
        .unwrap();
    let h = h
        .conv2d(ctx, &p[2], None, o2([2, 2], [1, 1], [1, 1], 8))
        .unwrap();
    let h = h
        .conv2d(ctx, &p[3], Some(&p[4]), Conv2dOptions::default())
        .unwrap();
    let h = h.reshape(ctx, &[4, 16, 36]).unwrap();
    let h = h
        .conv1d(
            ctx,
            &p[5],
            Some(&p[6]),
            Conv1dOptions {
                stride: 2,
                padding: 1,
                ..Default::default()
            },
        )
        .unwrap();
    let loss = h.mul(ctx, &h).unwrap().mean_all(ctx).unwrap();
    loss.backward(ctx).unwrap();
    let l = loss.item().unwrap();
    drop((h, loss));
    ctx.close_exec_scope(scope);
    for t in p.iter_mut() {
        t.sgd_step_(0.01).unwrap();
        t.zero_grad();
    }
    l
}

fn cnn_allocations(threads: usize) {
    let ctx = ExecContext::with_threads(threads);
    let x = Tensor::randn(&ctx, &[4, 3, 12, 12], 1.0, 1).unwrap();
    let shapes: [&[usize]; 7] = [
        &[8, 3, 3, 3],
        &[8],
        &[8, 1, 3, 3],
        &[16, 8, 1, 1],
        &[16],
        &[8, 16, 3],
        &[8],
    ];
    let mut p: [Tensor; 7] = std::array::from_fn(|i| {
        Tensor::randn(&ctx, shapes[i], 0.3, 10 + i as u64)
            .unwrap()
            .into_variable()
    });
    let first = cnn_step(&ctx, &mut p, &x); // warm-up
    let mut last = first;
    let (allocs, misses) = count(|| {
        for _ in 0..3 {
            last = cnn_step(&ctx, &mut p, &x);
        }
    });
    assert!(last < first, "the loss decreases ({first} -> {last})");
    assert_eq!(misses, 0, "pool misses in 3 conv steps ({threads} threads)");
    assert_eq!(
        allocs, 0,
        "heap allocations in 3 conv steps ({threads} threads)"
    );
}

#[test]
fn zero_allocations_per_conv_step_after_warm_up() {
    in_own_process("zero_allocations_per_conv_step_after_warm_up", || {
        cnn_allocations(1);
        cnn_allocations(2);
    });
}
