//! The fused `relu_max_pool2d` (`Pool2dOp::ReluMax`) gives the same bits as
//! `relu` then `max_pool2d`, forward and backward, for every window shape
//! (the 2x2 fast path and the general one), with ties, zeros of both signs,
//! infinities and NaNs in the input and the gradient, at 1 and 3 threads.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{ExecContext, ExecError, Pool2dOp, Pool2dOptions};
use support::{nan_bits, values};

/// `values`, with every 7th element replaced by a special value (ties among
/// small integers, both zeros, infinities, NaN).
fn spiced(n: usize, seed: u64) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        1.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        2.0,
        0.0,
    ];
    values(n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            if i % 7 == 3 {
                special[(i / 7) % special.len()]
            } else {
                v
            }
        })
        .collect()
}

fn check(ctx: &ExecContext, shape: [usize; 4], o: Pool2dOptions) -> Result<(), ExecError> {
    let n: usize = shape.iter().product();
    for (xs, gs) in [(values(n, 1), 2), (spiced(n, 3), 4)] {
        let x = ctx.from_slice(&shape, &xs)?;
        let r = ctx.relu(&x)?;
        let want = ctx.max_pool2d(&r, o)?;
        let got = ctx.relu_max_pool2d(&x, o)?;
        assert_eq!(got.shape(), want.shape());
        assert_eq!(nan_bits(&got), nan_bits(&want), "forward {shape:?} {o:?}");
        let m = want.numel();
        let gy = if gs == 2 {
            values(m, gs)
        } else {
            spiced(m, gs)
        };
        let gy = ctx.from_slice(want.shape(), &gy)?;
        let gr = ctx.pool2d_backward(Pool2dOp::Max(o), &shape, Some(&r), &gy)?;
        let want = ctx.relu_backward(&x, &gr)?;
        let got = ctx.pool2d_backward(Pool2dOp::ReluMax(o), &shape, Some(&x), &gy)?;
        assert_eq!(nan_bits(&got), nan_bits(&want), "backward {shape:?} {o:?}");
    }
    Ok(())
}

#[test]
fn relu_max_pool_is_relu_then_max_pool_bit_for_bit() {
    let opts = |kernel, stride, padding| Pool2dOptions {
        kernel,
        stride,
        padding,
    };
    for threads in [1, 3] {
        let ctx = ExecContext::with_threads(threads);
        for shape in [[2, 3, 28, 28], [3, 2, 7, 9], [1, 4, 37, 41]] {
            for o in [
                Pool2dOptions::new([2, 2]),
                opts([3, 3], [1, 1], [1, 1]),
                opts([3, 3], [2, 2], [1, 1]),
                opts([2, 3], [1, 3], [1, 1]),
                opts([2, 2], [1, 1], [0, 0]),
            ] {
                check(&ctx, shape, o).unwrap();
            }
        }
    }
}

#[test]
fn relu_max_pool_bad_input_is_an_error_naming_the_op() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 3, 4], &values(24, 1)).unwrap();
    let e = ctx
        .relu_max_pool2d(&x, Pool2dOptions::new([2, 2]))
        .unwrap_err();
    assert!(e.to_string().contains("relu_max_pool2d"), "{e}");
    let x = ctx.from_slice(&[1, 1, 4, 4], &values(16, 1)).unwrap();
    let g = ctx.from_slice(&[1, 1, 3, 2], &values(6, 1)).unwrap();
    let op = Pool2dOp::ReluMax(Pool2dOptions::new([2, 2]));
    let e = ctx
        .pool2d_backward(op, &[1, 1, 4, 4], Some(&x), &g)
        .unwrap_err();
    assert!(e.to_string().contains("relu_max_pool2d"), "{e}");
    let g = ctx.from_slice(&[1, 1, 2, 2], &values(4, 1)).unwrap();
    assert!(ctx.pool2d_backward(op, &[1, 1, 4, 4], None, &g).is_err());
}
