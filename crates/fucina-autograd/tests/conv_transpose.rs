//! `conv_transpose1d` / `conv_transpose2d` through autograd: finite-difference
//! gradient checks of the input, the weight and the bias over strides,
//! paddings, output paddings, dilations, groups (depthwise included) and 1x1
//! kernels, bad input through the differentiable surface, and zero heap
//! allocations per training step of a small encoder-decoder at steady state
//! (the counting allocator sees the whole process, so that test runs alone in
//! a process of its own).

mod support;

use fucina_autograd::exec::ExecContext;
use fucina_autograd::{Conv2dOptions, ConvTranspose1dOptions, ConvTranspose2dOptions, Tensor};
use support::{check, values};

#[path = "support/alloc_count.rs"]
mod alloc_count;
use alloc_count::{Counting, count, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

fn o2(
    s: [usize; 2],
    p: [usize; 2],
    op: [usize; 2],
    d: [usize; 2],
    g: usize,
) -> ConvTranspose2dOptions {
    ConvTranspose2dOptions {
        stride: s,
        padding: p,
        output_padding: op,
        dilation: d,
        groups: g,
    }
}

/// Gradcheck of input, weight and bias (when given) for one 2-D case.
fn check2(x: [usize; 4], w: [usize; 4], o: ConvTranspose2dOptions, bias: bool, seed: u64) {
    let ctx = ExecContext::new();
    let t = |shape: &[usize], s: u64| {
        let n: usize = shape.iter().product();
        ctx.from_slice(shape, &values(n, s, -1.0, 1.0)).unwrap()
    };
    let mut inputs = vec![t(&x, seed), t(&w, seed + 1)];
    if bias {
        inputs.push(t(&[w[1] * o.groups], seed + 2));
    }
    let what = format!("conv_transpose2d x={x:?} w={w:?} {o:?} bias={bias}");
    check(
        &ctx,
        &what,
        |ctx, t| t[0].conv_transpose2d(ctx, &t[1], t.get(2), o),
        &inputs,
    );
}

#[test]
fn conv_transpose2d_gradcheck_stride_padding_output_padding() {
    // the U-Net upsampler
    check2(
        [2, 3, 3, 4],
        [3, 2, 2, 2],
        o2([2, 2], [0, 0], [0, 0], [1, 1], 1),
        true,
        1,
    );
    // 3x3, stride 2, padding 1, output padding 1
    check2(
        [1, 2, 3, 3],
        [2, 3, 3, 3],
        o2([2, 2], [1, 1], [1, 1], [1, 1], 1),
        false,
        2,
    );
    // stride 1 with padding (the padded-plane kernels)
    check2(
        [2, 2, 4, 3],
        [2, 3, 3, 3],
        o2([1, 1], [1, 1], [0, 0], [1, 1], 1),
        true,
        3,
    );
    // uneven stride, dilation, output padding on one axis
    check2(
        [1, 2, 3, 4],
        [2, 2, 3, 2],
        o2([3, 2], [2, 1], [2, 0], [2, 3], 1),
        true,
        4,
    );
}

#[test]
fn conv_transpose2d_gradcheck_groups_depthwise_and_pointwise() {
    // groups with two channels each
    check2(
        [1, 4, 3, 3],
        [4, 3, 3, 3],
        o2([2, 1], [1, 1], [1, 0], [1, 1], 2),
        true,
        5,
    );
    // depthwise (groups == in == out): the direct kernels
    check2(
        [2, 3, 4, 3],
        [3, 1, 3, 3],
        o2([1, 1], [1, 1], [0, 0], [1, 1], 3),
        true,
        6,
    );
    check2(
        [1, 2, 3, 4],
        [2, 1, 2, 2],
        o2([2, 2], [0, 1], [1, 0], [2, 1], 2),
        false,
        7,
    );
    // 1x1, stride 1 and stride 2
    check2(
        [2, 4, 3, 3],
        [4, 5, 1, 1],
        ConvTranspose2dOptions::default(),
        true,
        8,
    );
    check2(
        [1, 4, 3, 3],
        [4, 1, 1, 1],
        o2([2, 2], [0, 0], [1, 1], [1, 1], 2),
        true,
        9,
    );
}

#[test]
fn conv_transpose1d_gradcheck_every_option() {
    let ctx = ExecContext::new();
    let o1 = |stride, padding, output_padding, dilation, groups| ConvTranspose1dOptions {
        stride,
        padding,
        output_padding,
        dilation,
        groups,
    };
    for (i, (x, w, o, bias)) in [
        ([2, 3, 5], [3, 4, 3], o1(2, 1, 1, 1, 1), true),
        ([1, 2, 6], [2, 3, 2], o1(3, 2, 2, 3, 1), false),
        ([2, 4, 4], [4, 1, 3], o1(1, 1, 0, 1, 4), true),
        ([1, 4, 5], [4, 3, 1], o1(1, 0, 0, 1, 2), true),
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
            inputs.push(t(&[w[1] * o.groups], s + 2));
        }
        check(
            &ctx,
            &format!("conv_transpose1d x={x:?} w={w:?} {o:?}"),
            |ctx, t| t[0].conv_transpose1d(ctx, &t[1], t.get(2), o),
            &inputs,
        );
    }
}

/// Bad input is an `Err` from the differentiable surface too.
#[test]
fn bad_input_is_an_error_through_autograd() {
    let ctx = ExecContext::new();
    let x = Tensor::zeros(&ctx, &[1, 4, 5, 5]).unwrap().into_variable();
    let w = Tensor::zeros(&ctx, &[4, 2, 3, 3]).unwrap().into_variable();
    let e = x
        .conv_transpose2d(&ctx, &w, None, o2([1, 1], [0, 0], [0, 0], [1, 1], 3))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("conv_transpose2d") && e.contains("groups = 3"),
        "{e}"
    );
    let e = x
        .conv_transpose2d(&ctx, &w, None, o2([2, 2], [0, 0], [2, 0], [1, 1], 1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("output_padding[0] = 2"), "{e}");
    let b = Tensor::zeros(&ctx, &[4]).unwrap();
    let e = x
        .conv_transpose2d(&ctx, &w, Some(&b), ConvTranspose2dOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("bias"), "{e}");
    let x1 = Tensor::zeros(&ctx, &[1, 4, 5]).unwrap();
    let w1 = Tensor::zeros(&ctx, &[3, 2, 7]).unwrap();
    let e = x1
        .conv_transpose1d(&ctx, &w1, None, ConvTranspose1dOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("conv_transpose1d") && e.contains("first dimension"),
        "{e}"
    );
}

/// One training step of a small encoder-decoder: conv (3x3, stride 2) ->
/// relu -> transposed conv (2x2, stride 2) -> depthwise transposed conv
/// (3x3, stride 2, output padding 1) -> transposed conv1d over the rows ->
/// mean square; backward; SGD.
fn step(ctx: &ExecContext, p: &mut [Tensor; 7], x: &Tensor) -> f32 {
    let scope = ctx.open_exec_scope();
    let conv = Conv2dOptions {
        stride: [2, 2],
        padding: [1, 1],
        ..Default::default()
    };
    let h = x
        .conv2d(ctx, &p[0], Some(&p[1]), conv)
        .unwrap()
        .relu(ctx)
        .unwrap();
    let up = o2([2, 2], [0, 0], [0, 0], [1, 1], 1);
    let h = h.conv_transpose2d(ctx, &p[2], Some(&p[3]), up).unwrap();
    let dw = o2([2, 2], [1, 1], [1, 1], [1, 1], 4);
    let h = h.conv_transpose2d(ctx, &p[4], None, dw).unwrap();
    let h = h.reshape(ctx, &[4, 4, 24 * 24]).unwrap();
    let o1 = ConvTranspose1dOptions {
        stride: 2,
        padding: 1,
        ..Default::default()
    };
    let h = h.conv_transpose1d(ctx, &p[5], Some(&p[6]), o1).unwrap();
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

fn allocations(threads: usize) {
    let ctx = ExecContext::with_threads(threads);
    let x = Tensor::randn(&ctx, &[4, 3, 12, 12], 1.0, 1).unwrap();
    let shapes: [&[usize]; 7] = [
        &[8, 3, 3, 3],
        &[8],
        &[8, 4, 2, 2],
        &[4],
        &[4, 1, 3, 3],
        &[4, 2, 3],
        &[2],
    ];
    let mut p: [Tensor; 7] = std::array::from_fn(|i| {
        Tensor::randn(&ctx, shapes[i], 0.3, 10 + i as u64)
            .unwrap()
            .into_variable()
    });
    let first = step(&ctx, &mut p, &x); // warm-up
    let mut last = first;
    let (allocs, misses) = count(|| {
        for _ in 0..3 {
            last = step(&ctx, &mut p, &x);
        }
    });
    assert!(last < first, "the loss decreases ({first} -> {last})");
    assert_eq!(misses, 0, "pool misses in 3 steps ({threads} threads)");
    assert_eq!(allocs, 0, "heap allocations in 3 steps ({threads} threads)");
}

#[test]
fn zero_allocations_per_transposed_conv_step_after_warm_up() {
    in_own_process(
        "zero_allocations_per_transposed_conv_step_after_warm_up",
        || {
            allocations(1);
            allocations(2);
        },
    );
}

/// Gradcheck with each input transposed or narrowed in turn (the kernels read
/// through `contiguous`).
#[test]
fn conv_transpose2d_gradcheck_over_layouts() {
    let ctx = ExecContext::new();
    let o = o2([2, 2], [1, 0], [1, 1], [1, 1], 1);
    support::check_layouts(
        &ctx,
        "conv_transpose2d layouts",
        |ctx, t| t[0].conv_transpose2d(ctx, &t[1], t.get(2), o),
        &[
            (&[1, 2, 3, 3], values(18, 70, -1.0, 1.0)),
            (&[2, 2, 3, 2], values(24, 71, -1.0, 1.0)),
            (&[2], values(2, 72, -1.0, 1.0)),
        ],
    );
}
