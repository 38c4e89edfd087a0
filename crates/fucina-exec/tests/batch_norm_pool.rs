//! The fused `batch_norm_pool2d` (training-mode batch norm, then a pooling op)
//! gives the same bits as `batch_norm` then `pool2d`, and its backward the same
//! bits as `pool2d_backward` then `batch_norm_backward`, for every pooling op
//! (the 2x2 fast paths and the general windows), odd plane sizes, ties, signed
//! zeros, infinities and NaNs in the gradient, at 1 and 3 threads; bad input is
//! an error naming the op, before anything is computed.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{ExecContext, ExecError, Pool2dOp, Pool2dOptions, RawTensor};
use support::{nan_bits, values};

fn opts(kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Pool2dOptions {
    Pool2dOptions {
        kernel,
        stride,
        padding,
    }
}

/// `values` with every 5th element replaced by a tie-maker or a special value.
fn spiced(n: usize, seed: u64) -> Vec<f32> {
    let special = [0.0, -0.0, 1.0, 1.0, f32::INFINITY, -1.0, f32::NAN, 0.0];
    values(n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            if i % 5 == 2 {
                special[(i / 5) % special.len()]
            } else {
                v
            }
        })
        .collect()
}

fn ops() -> Vec<Pool2dOp> {
    let mut ops = Vec::new();
    for o in [
        opts([2, 2], [2, 2], [0, 0]),
        opts([3, 3], [1, 1], [1, 1]),
        opts([2, 3], [1, 3], [1, 1]),
    ] {
        ops.push(Pool2dOp::ReluMax(o));
        ops.push(Pool2dOp::Max(o));
        ops.push(Pool2dOp::Avg(o));
    }
    ops.push(Pool2dOp::AdaptiveAvg([1, 1]));
    ops.push(Pool2dOp::AdaptiveAvg([3, 2]));
    ops
}

fn check(ctx: &ExecContext, shape: [usize; 4], op: Pool2dOp) -> Result<(), ExecError> {
    let n: usize = shape.iter().product();
    let c = shape[1];
    // Rounded inputs make ties in the normalized values (the max pool's first
    // index rule) likely.
    let xs: Vec<f32> = values(n, 11).iter().map(|v| (v * 4.0).round()).collect();
    let x = ctx.from_slice(&shape, &xs)?;
    let gamma = ctx.from_slice(&[c], &values(c, 12))?;
    let beta = ctx.from_slice(&[c], &values(c, 13))?;
    let (y, st) = ctx.batch_norm(&x, &gamma, &beta, 1e-5)?;
    let want = ctx.pool2d(op, &y)?;
    let (got, gst) = ctx.batch_norm_pool2d(&x, &gamma, &beta, 1e-5, op)?;
    assert_eq!(got.shape(), want.shape(), "{op:?} {shape:?}");
    assert_eq!(nan_bits(&got), nan_bits(&want), "forward {op:?} {shape:?}");
    for (a, b) in [
        (&gst.mean, &st.mean),
        (&gst.unbiased_var, &st.unbiased_var),
        (&gst.inv_std, &st.inv_std),
    ] {
        assert_eq!(nan_bits(a), nan_bits(b), "statistics {op:?} {shape:?}");
    }
    for seed in [14, 15] {
        let m = want.numel();
        let gp = if seed == 14 {
            values(m, seed)
        } else {
            spiced(m, seed)
        };
        let gp = ctx.from_slice(want.shape(), &gp)?;
        let gz = ctx.pool2d_backward(op, &shape, Some(&y), &gp)?;
        let (wx, wg, wb) = ctx.batch_norm_backward(&x, &gamma, &st.mean, &st.inv_std, &gz, true)?;
        let (gx, gg, gb) =
            ctx.batch_norm_pool2d_backward(&x, &gamma, &beta, &st.mean, &st.inv_std, op, &gp)?;
        assert_eq!(
            nan_bits(&gx),
            nan_bits(&wx),
            "grad_x {op:?} {shape:?} {seed}"
        );
        assert_eq!(
            nan_bits(&gg),
            nan_bits(&wg),
            "grad_gamma {op:?} {shape:?} {seed}"
        );
        assert_eq!(
            nan_bits(&gb),
            nan_bits(&wb),
            "grad_beta {op:?} {shape:?} {seed}"
        );
    }
    Ok(())
}

#[test]
fn batch_norm_pool_is_batch_norm_then_pool_bit_for_bit() {
    for threads in [1, 3] {
        let ctx = ExecContext::with_threads(threads);
        for shape in [
            [2, 3, 4, 4],
            [3, 2, 5, 7],
            [5, 4, 28, 28],
            [2, 1, 9, 2],
            [2, 3, 6, 40],
            [1, 2, 5, 35],
            [3, 2, 14, 14],
        ] {
            for op in ops() {
                check(&ctx, shape, op).unwrap();
            }
        }
    }
}

#[test]
fn bad_input_is_an_error_naming_the_op() {
    let ctx = ExecContext::new();
    let op = Pool2dOp::ReluMax(Pool2dOptions::new([2, 2]));
    let x = ctx.from_slice(&[2, 3, 4, 4], &values(96, 1)).unwrap();
    let (g, b) = (ctx.ones(&[3]).unwrap(), ctx.zeros(&[3]).unwrap());
    let msg = |r: Result<(RawTensor, fucina_exec::BatchNormStats), ExecError>| {
        r.expect_err("an error").to_string()
    };
    // Not [N, C, H, W]: the pool's error.
    let x3 = ctx.from_slice(&[2, 3, 16], &values(96, 1)).unwrap();
    assert!(msg(ctx.batch_norm_pool2d(&x3, &g, &b, 1e-5, op)).contains("relu_max_pool2d"));
    // A window larger than the input.
    let big = Pool2dOp::Max(Pool2dOptions::new([5, 5]));
    assert!(msg(ctx.batch_norm_pool2d(&x, &g, &b, 1e-5, big)).contains("larger"));
    // A parameter of the wrong length, a bad eps, one value per channel.
    let g2 = ctx.ones(&[2]).unwrap();
    let e = msg(ctx.batch_norm_pool2d(&x, &g2, &b, 1e-5, op));
    assert!(e.contains("batch_norm_pool2d"), "{e}");
    let e = msg(ctx.batch_norm_pool2d(&x, &g, &b, f32::NAN, op));
    assert!(e.contains("batch_norm_pool2d"), "{e}");
    let one = ctx.from_slice(&[1, 3, 1, 1], &[1., 2., 3.]).unwrap();
    let e = msg(ctx.batch_norm_pool2d(&one, &g, &b, 1e-5, Pool2dOp::AdaptiveAvg([1, 1])));
    assert!(e.contains("more than one value"), "{e}");
    // The backward: a gradient of the wrong shape, a statistic of the wrong length.
    let (_, st) = ctx.batch_norm_pool2d(&x, &g, &b, 1e-5, op).unwrap();
    let gp = ctx.ones(&[2, 3, 2, 3]).unwrap();
    let e = ctx
        .batch_norm_pool2d_backward(&x, &g, &b, &st.mean, &st.inv_std, op, &gp)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("batch_norm_pool2d_backward") && e.contains("pooled"),
        "{e}"
    );
    let gp = ctx.ones(&[2, 3, 2, 2]).unwrap();
    let e = ctx
        .batch_norm_pool2d_backward(&x, &g, &b, &g2, &st.inv_std, op, &gp)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch_norm_pool2d_backward"), "{e}");
}
