//! Pooling, batch norm, group norm, cumsum, scatter_add, pad and interpolate give the same bits at every
//! vector level the CPU supports (portable, AVX2, AVX-512), forward and
//! backward, at 1 and 3 threads. One test function, because the level is a
//! process-wide setting.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{
    ExecContext, ExecError, InterpolateMode, InterpolateOptions, PadMode, PadOptions, Pool2dOp,
    Pool2dOptions, SimdLevel, detected_simd_level, force_simd_level,
};
use support::{nan_bits, values};

fn opts(kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Pool2dOptions {
    Pool2dOptions {
        kernel,
        stride,
        padding,
    }
}

fn run_all(ctx: &ExecContext) -> Result<Vec<(String, Vec<u32>)>, ExecError> {
    let mut out = Vec::new();
    // Odd plane sizes: vector bodies and scalar tails in every row.
    let s = [3, 5, 37, 41];
    let n: usize = s.iter().product();
    let x = ctx.from_slice(&s, &values(n, 1))?;
    let mut ops = Vec::new();
    for o in [
        opts([2, 2], [2, 2], [0, 0]),
        opts([3, 3], [1, 1], [1, 1]),
        opts([3, 3], [2, 2], [1, 1]),
        opts([2, 3], [1, 3], [1, 1]),
        opts([5, 4], [3, 1], [2, 0]),
    ] {
        ops.push(Pool2dOp::Max(o));
        ops.push(Pool2dOp::Avg(o));
        ops.push(Pool2dOp::ReluMax(o));
    }
    ops.push(Pool2dOp::AdaptiveAvg([1, 1]));
    ops.push(Pool2dOp::AdaptiveAvg([6, 9]));
    for op in ops {
        let y = ctx.pool2d(op, &x)?;
        let g = ctx.from_slice(y.shape(), &values(y.numel(), 2))?;
        out.push((format!("{op:?}"), nan_bits(&y)));
        let gx = ctx.pool2d_backward(op, &s, Some(&x), &g)?;
        out.push((format!("{op:?} backward"), nan_bits(&gx)));
    }
    for shape in [&s[..], &[64, 70][..], &[6, 5, 333][..]] {
        let n: usize = shape.iter().product();
        let c = shape[1];
        let x = ctx.from_slice(shape, &values(n, 3))?;
        let gy = ctx.from_slice(shape, &values(n, 4))?;
        let gamma = ctx.from_slice(&[c], &values(c, 5))?;
        let beta = ctx.from_slice(&[c], &values(c, 6))?;
        let rv = ctx.add_scalar(&ctx.abs(&gamma)?, 0.5)?;
        let (y, st) = ctx.batch_norm(&x, &gamma, &beta, 1e-5)?;
        for (name, t) in [
            ("bn", y),
            ("bn mean", st.mean.clone()),
            ("bn var", st.unbiased_var.clone()),
            ("bn inv_std", st.inv_std.clone()),
            (
                "bn eval",
                ctx.batch_norm_eval(&x, &beta, &rv, &gamma, &beta, 1e-5)?,
            ),
        ] {
            out.push((format!("{name} {shape:?}"), nan_bits(&t)));
        }
        for training in [true, false] {
            let (gx, gg, gb) =
                ctx.batch_norm_backward(&x, &gamma, &st.mean, &st.inv_std, &gy, training)?;
            for (name, t) in [("gx", gx), ("ggamma", gg), ("gbeta", gb)] {
                out.push((
                    format!("bn backward {training} {name} {shape:?}"),
                    nan_bits(&t),
                ));
            }
        }
    }
    // Group norm: rows of 3 * 37 * 41 (vector bodies and tails), of 2 (no
    // spatial axis, tails only), and above one super-chunk of the sums.
    for (shape, groups) in [(&s[..], 5), (&[64, 70][..], 35), (&[2, 6, 23000][..], 2)] {
        let n: usize = shape.iter().product();
        let c = shape[1];
        let x = ctx.from_slice(shape, &values(n, 8))?;
        let gy = ctx.from_slice(shape, &values(n, 9))?;
        let w = ctx.from_slice(&[c], &values(c, 10))?;
        let b = ctx.from_slice(&[c], &values(c, 11))?;
        let opts = fucina_exec::GroupNormOptions::new(groups);
        for (affine, (w, b)) in [(true, (Some(&w), Some(&b))), (false, (None, None))] {
            let y = ctx.group_norm(&x, w, b, opts)?;
            out.push((format!("gn {affine} {shape:?}"), nan_bits(&y)));
            let grads = ctx.group_norm_backward(&x, w, &gy, opts, [true; 3])?;
            for (name, t) in ["gx", "gw", "gb"].iter().zip(&grads) {
                let t = t.as_ref().expect("asked for");
                out.push((
                    format!("gn backward {affine} {name} {shape:?}"),
                    nan_bits(t),
                ));
            }
        }
    }
    let x = ctx.from_slice(&[37, 301], &values(37 * 301, 7))?;
    for axis in [0, 1] {
        out.push((format!("cumsum {axis}"), nan_bits(&ctx.cumsum(&x, axis)?)));
        out.push((
            format!("cumsum_backward {axis}"),
            nan_bits(&ctx.cumsum_backward(&x, axis)?),
        ));
    }
    let idx: Vec<i64> = (0..37 * 301).map(|i| (i * 13 % 301) as i64).collect();
    let idx = ctx.from_slice_typed::<i64>(&[37, 301], &idx)?;
    out.push((
        "scatter_add".into(),
        nan_bits(&ctx.scatter_add(&x, 1, &idx, &x)?),
    ));
    // pad and interpolate, forward and backward, on the odd-sized planes.
    let x = ctx.from_slice(&s, &values(n, 12))?;
    for mode in [PadMode::Constant(0.5), PadMode::Reflect, PadMode::Replicate] {
        let o = PadOptions::new(&[3, 2, 1, 4], mode)?;
        let y = ctx.pad(&x, o)?;
        let g = ctx.from_slice(y.shape(), &values(y.numel(), 13))?;
        out.push((format!("{o:?}"), nan_bits(&y)));
        out.push((
            format!("{o:?} backward"),
            nan_bits(&ctx.pad_backward(&g, &s, o)?),
        ));
    }
    for mode in [
        InterpolateMode::Nearest,
        InterpolateMode::Bilinear {
            align_corners: false,
        },
        InterpolateMode::Bilinear {
            align_corners: true,
        },
    ] {
        for o in [
            InterpolateOptions::scale([2.0, 1.5], mode),
            InterpolateOptions::size([20, 50], mode),
        ] {
            let y = ctx.interpolate(&x, o)?;
            let g = ctx.from_slice(y.shape(), &values(y.numel(), 14))?;
            out.push((format!("{o:?}"), nan_bits(&y)));
            let gx = ctx.interpolate_backward(&g, &s, o)?;
            out.push((format!("{o:?} backward"), nan_bits(&gx)));
        }
    }
    Ok(out)
}

#[test]
fn cnn_ops_give_the_same_bits_at_every_vector_level() {
    let best = detected_simd_level();
    let levels: Vec<SimdLevel> = SimdLevel::available().collect();
    let mut want: Option<Vec<(String, Vec<u32>)>> = None;
    for &level in &levels {
        assert!(force_simd_level(level));
        for threads in [1, 3] {
            let got = run_all(&ExecContext::with_threads(threads)).unwrap();
            match &want {
                None => want = Some(got),
                Some(w) => {
                    for ((name, g), (_, w)) in got.iter().zip(w) {
                        let diff = g.iter().zip(w).filter(|(x, y)| x != y).count();
                        assert_eq!(
                            diff, 0,
                            "{name}: {diff} elements differ at {level:?}, {threads} threads"
                        );
                    }
                }
            }
        }
    }
    assert!(force_simd_level(best));
}
