//! Pooling (2-D and 1-D), batch norm, group norm, flatten, cumsum, scatter_add, pad and
//! interpolate: forward values against
//! float64 references computed here with direct loops, gradcheck of every op and
//! option, the max-pool tie rule, bad input, bit-identical results for 1-4
//! threads, and batch invariance.

mod support;

use fucina_autograd::exec::{ExecContext, ExecError, RawTensor};
use fucina_autograd::{
    AutogradError, GroupNormOptions, InterpolateMode, InterpolateOptions, PadMode, PadOptions,
    Pool1dOptions, Pool2dOp, Pool2dOptions, Tensor,
};
use support::{check, check_layouts, values};

fn opts(kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Pool2dOptions {
    Pool2dOptions {
        kernel,
        stride,
        padding,
    }
}

/// Every window option the tests walk: square and not, strided and not,
/// padded on one or both axes, overlapping and not.
fn pool_options() -> Vec<Pool2dOptions> {
    vec![
        opts([2, 2], [2, 2], [0, 0]),
        opts([3, 3], [1, 1], [1, 1]),
        opts([3, 2], [2, 1], [1, 0]),
        opts([2, 3], [1, 2], [0, 1]),
        opts([1, 1], [1, 1], [0, 0]),
        opts([3, 3], [3, 2], [0, 1]),
        opts([4, 5], [1, 3], [2, 2]),
    ]
}

/// Distinct values (no ties, spaced far beyond the gradcheck step): a scrambled
/// permutation of `0..n` times `0.05`, shifted to straddle 0.
fn distinct(n: usize, seed: u64) -> Vec<f32> {
    let mut keys: Vec<(u64, usize)> = (0..n)
        .map(|i| (fucina_autograd::exec::rng::at(seed, i as u64), i))
        .collect();
    keys.sort();
    let mut v = vec![0.0; n];
    for (rank, &(_, i)) in keys.iter().enumerate() {
        v[i] = (rank as f32 - n as f32 / 2.0) * 0.05;
    }
    v
}

/// The f64 reference of a pooling op, by direct loops over the definition.
fn ref_pool(op: Pool2dOp, x: &[f32], s: [usize; 4]) -> (Vec<f64>, [usize; 4]) {
    let [n, c, h, w] = s;
    let (oh, ow) = match op {
        Pool2dOp::Max(o) | Pool2dOp::Avg(o) | Pool2dOp::ReluMax(o) => (
            (h + 2 * o.padding[0] - o.kernel[0]) / o.stride[0] + 1,
            (w + 2 * o.padding[1] - o.kernel[1]) / o.stride[1] + 1,
        ),
        Pool2dOp::AdaptiveAvg(sz) => (sz[0], sz[1]),
    };
    let mut out = Vec::new();
    for p in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let mut vals = Vec::new();
                let (mut lo_h, mut hi_h, mut lo_w, mut hi_w, divisor);
                match op {
                    Pool2dOp::Max(o) | Pool2dOp::Avg(o) | Pool2dOp::ReluMax(o) => {
                        lo_h = (i * o.stride[0]) as i64 - o.padding[0] as i64;
                        hi_h = lo_h + o.kernel[0] as i64;
                        lo_w = (j * o.stride[1]) as i64 - o.padding[1] as i64;
                        hi_w = lo_w + o.kernel[1] as i64;
                        divisor = (o.kernel[0] * o.kernel[1]) as f64;
                    }
                    Pool2dOp::AdaptiveAvg(_) => {
                        lo_h = ((i * h) as f64 / oh as f64).floor() as i64;
                        hi_h = (((i + 1) * h) as f64 / oh as f64).ceil() as i64;
                        lo_w = ((j * w) as f64 / ow as f64).floor() as i64;
                        hi_w = (((j + 1) * w) as f64 / ow as f64).ceil() as i64;
                        divisor = ((hi_h - lo_h) * (hi_w - lo_w)) as f64;
                    }
                }
                lo_h = lo_h.max(0);
                lo_w = lo_w.max(0);
                hi_h = hi_h.min(h as i64);
                hi_w = hi_w.min(w as i64);
                for a in lo_h..hi_h {
                    for b in lo_w..hi_w {
                        vals.push(f64::from(x[p * h * w + a as usize * w + b as usize]));
                    }
                }
                out.push(match op {
                    Pool2dOp::Max(_) => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                    Pool2dOp::ReluMax(_) => vals.iter().fold(0.0, |m: f64, &v| m.max(v)),
                    _ => vals.iter().sum::<f64>() / divisor,
                });
            }
        }
    }
    (out, [n, c, oh, ow])
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= tol * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

fn raw(ctx: &ExecContext, shape: &[usize], v: &[f32]) -> RawTensor {
    ctx.from_slice(shape, v).unwrap()
}

#[test]
fn pooling_forward_matches_f64_reference() {
    let ctx = ExecContext::new();
    for s in [[2, 3, 7, 9], [1, 2, 5, 5], [1, 1, 6, 13]] {
        let n: usize = s.iter().product();
        let xv = values(n, 11, -2.0, 2.0);
        let x = Tensor::from_slice(&ctx, &s, &xv).unwrap();
        let mut ops: Vec<Pool2dOp> = Vec::new();
        for o in pool_options() {
            if o.kernel[0] > s[2] + 2 * o.padding[0] || o.kernel[1] > s[3] + 2 * o.padding[1] {
                continue;
            }
            ops.push(Pool2dOp::Max(o));
            ops.push(Pool2dOp::Avg(o));
            ops.push(Pool2dOp::ReluMax(o));
        }
        for sz in [
            [1, 1],
            [2, 3],
            [3, 4],
            [5, 5],
            [s[2], s[3]],
            [s[2] + 2, s[3] + 3],
        ] {
            ops.push(Pool2dOp::AdaptiveAvg(sz));
        }
        for op in ops {
            let y = match op {
                Pool2dOp::Max(o) => x.max_pool2d(&ctx, o),
                Pool2dOp::ReluMax(o) => x.relu_max_pool2d(&ctx, o),
                Pool2dOp::Avg(o) => x.avg_pool2d(&ctx, o),
                Pool2dOp::AdaptiveAvg(sz) => x.adaptive_avg_pool2d(&ctx, sz),
            }
            .unwrap();
            let (want, shape) = ref_pool(op, &xv, s);
            assert_eq!(y.shape(), shape, "{op:?} on {s:?}");
            let tol = if matches!(op, Pool2dOp::Max(_) | Pool2dOp::ReluMax(_)) {
                0.0
            } else {
                1e-6
            };
            assert_close(&format!("{op:?} on {s:?}"), &y.to_vec(), &want, tol);
            // The generic descriptor call is the named method.
            assert_eq!(x.pool2d(&ctx, op).unwrap().to_vec(), y.to_vec());
        }
    }
}

#[test]
fn pooling_reads_strided_inputs() {
    let ctx = ExecContext::new();
    let xv = values(2 * 3 * 6 * 5, 12, -1.0, 1.0);
    // Stored as [N, C, W, H] and viewed as [N, C, H, W].
    let t = raw(&ctx, &[2, 3, 6, 5], &xv).transpose(2, 3).unwrap();
    let c = ctx.materialize(&t).unwrap();
    for op in [
        Pool2dOp::Max(opts([3, 3], [1, 1], [1, 1])),
        Pool2dOp::Avg(opts([2, 2], [2, 2], [0, 0])),
        Pool2dOp::AdaptiveAvg([2, 2]),
    ] {
        assert_eq!(
            ctx.pool2d(op, &t).unwrap().to_vec(),
            ctx.pool2d(op, &c).unwrap().to_vec()
        );
    }
}

#[test]
fn max_pool_ties_go_to_the_first_index_in_window_order() {
    let ctx = ExecContext::new();
    // One 2x2 window over equal values: the gradient goes to (0, 0).
    let x = Tensor::variable_from_slice(&ctx, &[1, 1, 2, 2], &[3.; 4]).unwrap();
    let y = x.max_pool2d(&ctx, Pool2dOptions::new([2, 2])).unwrap();
    y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    assert_eq!(x.grad(&ctx).unwrap().unwrap().to_vec(), [1., 0., 0., 0.]);

    // Ties at (0, 1) and (1, 0): row-major order picks (0, 1); a later equal
    // value never wins, an earlier smaller one loses.
    let x = Tensor::variable_from_slice(&ctx, &[1, 1, 2, 2], &[1., 5., 5., 2.]).unwrap();
    let y = x.max_pool2d(&ctx, Pool2dOptions::new([2, 2])).unwrap();
    y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    assert_eq!(x.grad(&ctx).unwrap().unwrap().to_vec(), [0., 1., 0., 0.]);

    // Overlapping windows (3x3, stride 1, padding 1) over a constant plane: each
    // window's first valid element gets its gradient, summed over windows.
    let x = Tensor::variable_from_slice(&ctx, &[1, 1, 3, 3], &[7.; 9]).unwrap();
    let y = x.max_pool2d(&ctx, opts([3, 3], [1, 1], [1, 1])).unwrap();
    assert_eq!(y.to_vec(), [7.; 9]);
    y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    // Window (i, j) starts at (max(i-1, 0), max(j-1, 0)).
    assert_eq!(
        x.grad(&ctx).unwrap().unwrap().to_vec(),
        [4., 2., 0., 2., 1., 0., 0., 0., 0.]
    );

    // Signed zeros tie: the first one is the result, bit for bit.
    let x = raw(&ctx, &[1, 1, 1, 2], &[-0.0, 0.0]);
    let y = ctx.max_pool2d(&x, opts([1, 2], [1, 1], [0, 0])).unwrap();
    assert_eq!(y.to_vec()[0].to_bits(), (-0.0f32).to_bits());

    // Signed zeros tie in the backward too: -0 at (0, 1) comes first, so +0 at
    // (1, 0) gets nothing (2x2 and a padded 3x3 window, two different kernels).
    for o in [Pool2dOptions::new([2, 2]), opts([3, 3], [2, 2], [1, 1])] {
        let x = Tensor::variable_from_slice(&ctx, &[1, 1, 2, 2], &[-1., -0.0, 0.0, -2.]).unwrap();
        let y = x.max_pool2d(&ctx, o).unwrap();
        y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
        assert_eq!(
            x.grad(&ctx).unwrap().unwrap().to_vec(),
            [0., 1., 0., 0.],
            "{o:?}"
        );
    }

    // A NaN propagates and is selected.
    let x = Tensor::variable_from_slice(&ctx, &[1, 1, 2, 2], &[1., f32::NAN, 9., 2.]).unwrap();
    let y = x.max_pool2d(&ctx, Pool2dOptions::new([2, 2])).unwrap();
    assert!(y.to_vec()[0].is_nan());
    y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    assert_eq!(x.grad(&ctx).unwrap().unwrap().to_vec(), [0., 1., 0., 0.]);
}

#[test]
fn gradcheck_pooling_every_option() {
    let ctx = ExecContext::new();
    let s = [2, 2, 5, 6];
    let n: usize = s.iter().product();
    let x = raw(&ctx, &s, &distinct(n, 21));
    // Half a step off the grid: no value at the ReLU's kink.
    let half: Vec<f32> = distinct(n, 21).iter().map(|v| v + 0.025).collect();
    let shifted = raw(&ctx, &s, &half);
    for o in pool_options() {
        check(
            &ctx,
            &format!("max_pool2d {o:?}"),
            move |ctx, t| t[0].max_pool2d(ctx, o),
            std::slice::from_ref(&x),
        );
        check(
            &ctx,
            &format!("avg_pool2d {o:?}"),
            move |ctx, t| t[0].avg_pool2d(ctx, o),
            std::slice::from_ref(&x),
        );
        check(
            &ctx,
            &format!("relu_max_pool2d {o:?}"),
            move |ctx, t| t[0].relu_max_pool2d(ctx, o),
            std::slice::from_ref(&shifted),
        );
    }
    // Odd height and width: the 2x2 kernels leave the last row and column to
    // the zero fill (over recycled, non-zero buffers by now).
    let odd = raw(&ctx, &[1, 2, 5, 7], &distinct(70, 22));
    let o = Pool2dOptions::new([2, 2]);
    check(
        &ctx,
        "max_pool2d 2x2 odd",
        move |ctx, t| t[0].max_pool2d(ctx, o),
        std::slice::from_ref(&odd),
    );
    check(
        &ctx,
        "avg_pool2d 2x2 odd",
        move |ctx, t| t[0].avg_pool2d(ctx, o),
        std::slice::from_ref(&odd),
    );
    for sz in [[1, 1], [2, 3], [3, 4], [5, 6], [7, 8]] {
        check(
            &ctx,
            &format!("adaptive_avg_pool2d {sz:?}"),
            move |ctx, t| t[0].adaptive_avg_pool2d(ctx, sz),
            std::slice::from_ref(&x),
        );
    }
}

/// The f64 reference of a training-mode batch norm and its statistics
/// `(y, mean, unbiased var)`.
fn ref_batch_norm(
    x: &[f32],
    s: &[usize],
    gamma: &[f32],
    beta: &[f32],
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, c) = (s[0], s[1]);
    let plane: usize = s[2..].iter().product();
    let m = (n * plane) as f64;
    let at = |k: usize, ch: usize, i: usize| f64::from(x[(k * c + ch) * plane + i]);
    let mut mean = vec![0.0; c];
    let mut var = vec![0.0; c];
    for ch in 0..c {
        for k in 0..n {
            for i in 0..plane {
                mean[ch] += at(k, ch, i) / m;
            }
        }
        for k in 0..n {
            for i in 0..plane {
                var[ch] += (at(k, ch, i) - mean[ch]).powi(2) / m;
            }
        }
    }
    let mut y = vec![0.0; x.len()];
    for k in 0..n {
        for ch in 0..c {
            for i in 0..plane {
                y[(k * c + ch) * plane + i] = (at(k, ch, i) - mean[ch]) / (var[ch] + eps).sqrt()
                    * f64::from(gamma[ch])
                    + f64::from(beta[ch]);
            }
        }
    }
    let unbiased = var.iter().map(|v| v * m / (m - 1.0)).collect();
    (y, mean, unbiased)
}

const BN_SHAPES: [&[usize]; 4] = [&[6, 3], &[3, 2, 5], &[2, 3, 4, 3], &[5, 2, 1, 1]];

#[test]
fn batch_norm_forward_matches_f64_reference() {
    let ctx = ExecContext::new();
    for (k, &s) in BN_SHAPES.iter().enumerate() {
        let n: usize = s.iter().product();
        let c = s[1];
        let xv = values(n, 31 + k as u64, -3.0, 5.0);
        let (gv, bv) = (values(c, 41, 0.5, 2.0), values(c, 42, -1.0, 1.0));
        let x = Tensor::from_slice(&ctx, s, &xv).unwrap();
        let g = Tensor::from_slice(&ctx, &[c], &gv).unwrap();
        let b = Tensor::from_slice(&ctx, &[c], &bv).unwrap();
        for eps in [0.0f32, 1e-5, 0.1] {
            let (y, st) = x.batch_norm_with_stats(&ctx, &g, &b, eps).unwrap();
            let (wy, wm, wv) = ref_batch_norm(&xv, s, &gv, &bv, f64::from(eps));
            assert_close(
                &format!("batch_norm {s:?} eps {eps}"),
                &y.to_vec(),
                &wy,
                1e-5,
            );
            assert_close("mean", &st.mean.to_vec(), &wm, 1e-6);
            assert_close("unbiased_var", &st.unbiased_var.to_vec(), &wv, 1e-5);
            let bv64: Vec<f64> = wv
                .iter()
                .map(|v| {
                    let m = (n / c) as f64;
                    1.0 / (v * (m - 1.0) / m + f64::from(eps)).sqrt()
                })
                .collect();
            assert_close("inv_std", &st.inv_std.to_vec(), &bv64, 1e-5);
            assert_eq!(st.mean.shape(), [c]);
            assert_eq!(
                x.batch_norm(&ctx, &g, &b, eps).unwrap().to_vec(),
                y.to_vec()
            );

            // Eval mode with running statistics.
            let rm = Tensor::from_slice(&ctx, &[c], &values(c, 43, -1.0, 1.0)).unwrap();
            let rv = Tensor::from_slice(&ctx, &[c], &values(c, 44, 0.5, 3.0)).unwrap();
            let ye = x.batch_norm_eval(&ctx, &rm, &rv, &g, &b, eps).unwrap();
            let (rmv, rvv) = (rm.to_vec(), rv.to_vec());
            let plane = n / s[0] / c;
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    let ch = i / plane % c;
                    (f64::from(xv[i]) - f64::from(rmv[ch]))
                        / (f64::from(rvv[ch]) + f64::from(eps)).sqrt()
                        * f64::from(gv[ch])
                        + f64::from(bv[ch])
                })
                .collect();
            assert_close(&format!("batch_norm_eval {s:?}"), &ye.to_vec(), &want, 1e-5);
        }
    }
}

#[test]
fn gradcheck_batch_norm_every_shape_and_mode() {
    let ctx = ExecContext::new();
    for (k, &s) in BN_SHAPES.iter().enumerate() {
        let n: usize = s.iter().product();
        let c = s[1];
        let inputs = [
            raw(&ctx, s, &values(n, 51 + k as u64, -2.0, 2.0)),
            raw(&ctx, &[c], &values(c, 52, 0.5, 1.5)),
            raw(&ctx, &[c], &values(c, 53, -0.5, 0.5)),
        ];
        check(
            &ctx,
            &format!("batch_norm {s:?}"),
            |ctx, t| t[0].batch_norm(ctx, &t[1], &t[2], 1e-5),
            &inputs,
        );
        let rm = Tensor::from_slice(&ctx, &[c], &values(c, 54, -1.0, 1.0)).unwrap();
        let rv = Tensor::from_slice(&ctx, &[c], &values(c, 55, 0.5, 2.0)).unwrap();
        check(
            &ctx,
            &format!("batch_norm_eval {s:?}"),
            |ctx, t| t[0].batch_norm_eval(ctx, &rm, &rv, &t[1], &t[2], 1e-5),
            &inputs,
        );
    }
}

/// Group norm's shapes and group counts: no spatial axis, one, two, three;
/// one group, one channel per group, and between.
const GN_CASES: [(&[usize], usize); 6] = [
    (&[3, 4], 2),
    (&[2, 6, 5], 3),
    (&[2, 4, 3, 3], 1),
    (&[2, 4, 3, 3], 4),
    (&[1, 6, 2, 2, 3], 2),
    (&[3, 2, 1, 7], 2),
];

#[test]
fn group_norm_forward_matches_f64_reference() {
    let ctx = ExecContext::new();
    for (k, &(s, groups)) in GN_CASES.iter().enumerate() {
        let n: usize = s.iter().product();
        let c = s[1];
        let plane: usize = s[2..].iter().product();
        let len = c / groups * plane;
        let xv = values(n, 61 + k as u64, -3.0, 5.0);
        let (wv, bv) = (values(c, 62, 0.5, 2.0), values(c, 63, -1.0, 1.0));
        let x = Tensor::from_slice(&ctx, s, &xv).unwrap();
        let w = Tensor::from_slice(&ctx, &[c], &wv).unwrap();
        let b = Tensor::from_slice(&ctx, &[c], &bv).unwrap();
        for eps in [0.0f32, 1e-5, 0.1] {
            let opts = GroupNormOptions {
                num_groups: groups,
                eps,
            };
            let mut want = vec![0.0; n];
            for (r, row) in xv.chunks(len).enumerate() {
                let m = row.iter().map(|&v| f64::from(v)).sum::<f64>() / len as f64;
                let var = row.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / len as f64;
                for (i, &v) in row.iter().enumerate() {
                    let at = r * len + i;
                    let ch = at / plane % c;
                    want[at] = (f64::from(v) - m) / (var + f64::from(eps)).sqrt()
                        * f64::from(wv[ch])
                        + f64::from(bv[ch]);
                }
            }
            let y = x.group_norm(&ctx, Some(&w), Some(&b), opts).unwrap();
            assert_close(
                &format!("group_norm {s:?} / {groups}"),
                &y.to_vec(),
                &want,
                1e-5,
            );
        }
    }
}

#[test]
fn gradcheck_group_norm_every_shape_layout_and_affine() {
    let ctx = ExecContext::new();
    for (k, &(s, groups)) in GN_CASES.iter().enumerate() {
        let n: usize = s.iter().product();
        let c = s[1];
        let opts = GroupNormOptions::new(groups);
        let xv = values(n, 71 + k as u64, -2.0, 2.0);
        let (wv, bv) = (values(c, 72, 0.5, 1.5), values(c, 73, -0.5, 0.5));
        let what = format!("group_norm {s:?} / {groups}");
        // Every input contiguous, transposed and narrowed (one at a time).
        check_layouts(
            &ctx,
            &format!("{what} affine"),
            |ctx, t| t[0].group_norm(ctx, Some(&t[1]), Some(&t[2]), opts),
            &[(s, xv.clone()), (&[c], wv.clone()), (&[c], bv.clone())],
        );
        check_layouts(
            &ctx,
            &format!("{what} weight only"),
            |ctx, t| t[0].group_norm(ctx, Some(&t[1]), None, opts),
            &[(s, xv.clone()), (&[c], wv.clone())],
        );
        check_layouts(
            &ctx,
            &format!("{what} bias only"),
            |ctx, t| t[0].group_norm(ctx, None, Some(&t[1]), opts),
            &[(s, xv.clone()), (&[c], bv.clone())],
        );
        check_layouts(
            &ctx,
            &format!("{what} no affine"),
            |ctx, t| t[0].group_norm(ctx, None, None, opts),
            &[(s, xv.clone())],
        );
    }
}

#[test]
fn group_norm_gradients_reach_only_the_inputs_that_need_them() {
    // A constant input with variable parameters, and the other way round: the
    // node asks the exec backward only for the gradients its inputs need.
    let ctx = ExecContext::new();
    let s = [2, 4, 3];
    let xv = values(24, 81, -2.0, 2.0);
    let opts = GroupNormOptions::new(2);
    let x = Tensor::from_slice(&ctx, &s, &xv).unwrap();
    let w = Tensor::variable_from_slice(&ctx, &[4], &values(4, 82, 0.5, 1.5)).unwrap();
    let b = Tensor::variable_from_slice(&ctx, &[4], &values(4, 83, -0.5, 0.5)).unwrap();
    let y = x.group_norm(&ctx, Some(&w), Some(&b), opts).unwrap();
    y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    assert_eq!(b.grad(&ctx).unwrap().unwrap().to_vec(), [6.0; 4]);
    // sum(xhat) over each channel's samples and plane.
    let gw = w.grad(&ctx).unwrap().unwrap().to_vec();
    let xhat = ctx.group_norm(x.raw(), None, None, opts).unwrap().to_vec();
    for (ch, &got) in gw.iter().enumerate() {
        let want: f32 = (0..2)
            .flat_map(|k| (0..3).map(move |i| (k * 4 + ch) * 3 + i))
            .map(|i| xhat[i])
            .sum();
        assert!((got - want).abs() < 1e-5, "channel {ch}: {got} vs {want}");
    }
    let xv = Tensor::variable_from_slice(&ctx, &s, &xv).unwrap();
    let (ones, bc) = (Tensor::ones(&ctx, &[4]).unwrap(), b.detach());
    let y = xv.group_norm(&ctx, Some(&ones), Some(&bc), opts).unwrap();
    y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    // With a weight constant over each group, the output's sum is the bias's
    // (the normalized values of a group sum to 0): no gradient reaches x.
    for v in xv.grad(&ctx).unwrap().unwrap().to_vec() {
        assert!(v.abs() < 1e-5, "{v}");
    }
}

#[test]
fn cumsum_forward_and_gradcheck() {
    let ctx = ExecContext::new();
    let s = [3, 4, 5];
    let xv = values(60, 61, -1.0, 1.0);
    let x = Tensor::from_slice(&ctx, &s, &xv).unwrap();
    for axis in [0i64, 1, 2, -1] {
        let a = axis.rem_euclid(3) as usize;
        let y = x.cumsum(&ctx, axis).unwrap();
        let stride: usize = s[a + 1..].iter().product();
        let want: Vec<f64> = (0..60)
            .map(|i| {
                let k = i / stride % s[a];
                (0..=k)
                    .map(|j| f64::from(xv[i - (k - j) * stride]))
                    .sum::<f64>()
            })
            .collect();
        assert_close(&format!("cumsum axis {axis}"), &y.to_vec(), &want, 1e-6);
        check(
            &ctx,
            &format!("cumsum axis {axis}"),
            move |ctx, t| t[0].cumsum(ctx, axis),
            &[x.raw().clone()],
        );
    }
    // The first element is copied, not added to 0: a -0 stays -0.
    let z = ctx.cumsum(&raw(&ctx, &[2], &[-0.0, 1.0]), 0).unwrap();
    assert_eq!(z.to_vec()[0].to_bits(), (-0.0f32).to_bits());
    // A strided input.
    let t = x.raw().transpose(0, 2).unwrap();
    let m = ctx.materialize(&t).unwrap();
    assert_eq!(
        ctx.cumsum(&t, 1).unwrap().to_vec(),
        ctx.cumsum(&m, 1).unwrap().to_vec()
    );
}

#[test]
fn scatter_add_forward_and_gradcheck() {
    let ctx = ExecContext::new();
    let xv = values(12, 71, -1.0, 1.0);
    let x = raw(&ctx, &[3, 4], &xv);
    // Along axis 0 with an index of 2 x 3 (smaller than x off the axis).
    let iv: [i64; 6] = [2, 0, 2, 2, 1, 0];
    let idx = ctx.from_slice_typed::<i64>(&[2, 3], &iv).unwrap();
    let sv = values(6, 72, -1.0, 1.0);
    let src = raw(&ctx, &[2, 3], &sv);
    let y = ctx.scatter_add(&x, 0, &idx, &src).unwrap();
    let mut want: Vec<f64> = xv.iter().map(|&v| f64::from(v)).collect();
    for i in 0..2 {
        for j in 0..3 {
            want[iv[i * 3 + j] as usize * 4 + j] += f64::from(sv[i * 3 + j]);
        }
    }
    assert_close("scatter_add axis 0", &y.to_vec(), &want, 1e-6);
    let idx0 = idx.clone();
    check(
        &ctx,
        "scatter_add axis 0",
        move |ctx, t| t[0].scatter_add(ctx, 0, &idx0, &t[1]),
        &[x.clone(), src.clone()],
    );
    // Along the last axis, with repeated targets.
    let iv: [i64; 9] = [3, 3, 0, 1, 1, 1, 0, 2, 3];
    let idx = ctx.from_slice_typed::<i64>(&[3, 3], &iv).unwrap();
    let sv = values(9, 73, -1.0, 1.0);
    let src = raw(&ctx, &[3, 3], &sv);
    let y = ctx.scatter_add(&x, -1, &idx, &src).unwrap();
    let mut want: Vec<f64> = xv.iter().map(|&v| f64::from(v)).collect();
    for i in 0..3 {
        for j in 0..3 {
            want[i * 4 + iv[i * 3 + j] as usize] += f64::from(sv[i * 3 + j]);
        }
    }
    assert_close("scatter_add axis 1", &y.to_vec(), &want, 1e-6);
    check(
        &ctx,
        "scatter_add axis 1",
        move |ctx, t| t[0].scatter_add(ctx, 1, &idx, &t[1]),
        &[x, src],
    );
}

#[test]
fn flatten_shapes_and_gradient() {
    let ctx = ExecContext::new();
    let x = raw(&ctx, &[2, 3, 2, 2], &values(24, 81, -1.0, 1.0));
    let t = Tensor::constant(x.clone());
    assert_eq!(t.flatten(&ctx, 0).unwrap().shape(), [24]);
    assert_eq!(t.flatten(&ctx, 1).unwrap().shape(), [2, 12]);
    assert_eq!(t.flatten(&ctx, 3).unwrap().shape(), [2, 3, 2, 2]);
    assert_eq!(t.flatten(&ctx, 1).unwrap().to_vec(), x.to_vec());
    check(
        &ctx,
        "flatten",
        |ctx, t| t[0].flatten(ctx, 1)?.tanh(ctx),
        &[x.transpose(2, 3).unwrap()],
    );
}

/// Asserts that `r` is an error whose message names `op` and `what`.
fn assert_err<T: std::fmt::Debug>(r: Result<T, AutogradError>, op: &str, what: &str) {
    let e = r.expect_err(what).to_string();
    assert!(
        e.contains(op) && e.contains(what),
        "error {e:?} should name {op:?} and {what:?}"
    );
}

#[test]
fn bad_input_is_an_error_naming_the_op_and_the_value() {
    let ctx = ExecContext::new();
    let x = Tensor::zeros(&ctx, &[1, 2, 4, 4]).unwrap();
    let p = |x: &Tensor, o| x.max_pool2d(&ctx, o);
    assert_err(
        p(&x, opts([5, 5], [1, 1], [0, 0])),
        "max_pool2d",
        "[1, 2, 4, 4]",
    );
    assert_err(
        p(&x, opts([5, 5], [1, 1], [0, 0])),
        "max_pool2d",
        "larger than the padded",
    );
    assert!(p(&x, opts([5, 5], [1, 1], [1, 1])).is_ok());
    assert_err(p(&x, opts([0, 2], [1, 1], [0, 0])), "max_pool2d", "[0, 2]");
    assert_err(p(&x, opts([2, 2], [1, 0], [0, 0])), "max_pool2d", "[1, 0]");
    assert_err(p(&x, opts([2, 2], [1, 0], [0, 0])), "max_pool2d", "stride");
    assert_err(p(&x, opts([3, 3], [1, 1], [1, 2])), "max_pool2d", "[1, 2]");
    assert_err(p(&x, opts([3, 3], [1, 1], [1, 2])), "max_pool2d", "padding");
    // Huge windows are refused, not overflowed.
    let huge = usize::MAX;
    assert_err(
        p(&x, opts([huge, 2], [1, 1], [huge / 2, 0])),
        "max_pool2d",
        "2^40",
    );
    assert_err(p(&x, opts([2, 2], [huge, 1], [0, 0])), "max_pool2d", "2^40");
    let x3 = Tensor::zeros(&ctx, &[2, 4, 4]).unwrap();
    assert_err(
        p(&x3, Pool2dOptions::new([2, 2])),
        "max_pool2d",
        "[2, 4, 4]",
    );
    assert_err(
        x.avg_pool2d(&ctx, opts([2, 2], [0, 1], [0, 0])),
        "avg_pool2d",
        "stride",
    );
    assert_err(
        x.adaptive_avg_pool2d(&ctx, [0, 3]),
        "adaptive_avg_pool2d",
        "[0, 3]",
    );
    assert_err(
        x3.adaptive_avg_pool2d(&ctx, [1, 1]),
        "adaptive_avg_pool2d",
        "rank 4",
    );

    let (g3, b2) = (
        Tensor::ones(&ctx, &[3]).unwrap(),
        Tensor::zeros(&ctx, &[2]).unwrap(),
    );
    let g2 = Tensor::ones(&ctx, &[2]).unwrap();
    assert_err(x.batch_norm(&ctx, &g3, &b2, 1e-5), "batch_norm", "[3]");
    assert_err(x.batch_norm(&ctx, &g2, &g3, 1e-5), "batch_norm", "[3]");
    assert_err(x.batch_norm(&ctx, &g2, &b2, -1.0), "batch_norm", "eps");
    assert_err(x.batch_norm(&ctx, &g2, &b2, f32::NAN), "batch_norm", "eps");
    let one = Tensor::zeros(&ctx, &[1, 2]).unwrap();
    assert_err(
        one.batch_norm(&ctx, &g2, &b2, 1e-5),
        "batch_norm",
        "one value",
    );
    let flat = Tensor::zeros(&ctx, &[4]).unwrap();
    assert_err(flat.batch_norm(&ctx, &g2, &b2, 1e-5), "batch_norm", "[4]");
    assert_err(
        x.batch_norm_eval(&ctx, &g3, &g2, &g2, &b2, 1e-5),
        "batch_norm_eval",
        "[3]",
    );
    assert_err(
        x.batch_norm_eval(&ctx, &g2, &g3, &g2, &b2, 1e-5),
        "batch_norm_eval",
        "[3]",
    );

    let gn = |x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, groups: usize, eps: f32| {
        x.group_norm(
            &ctx,
            w,
            b,
            GroupNormOptions {
                num_groups: groups,
                eps,
            },
        )
    };
    assert_err(gn(&x, None, None, 0, 1e-5), "group_norm", "num_groups = 0");
    assert_err(gn(&x, None, None, 3, 1e-5), "group_norm", "num_groups = 3");
    assert_err(gn(&x, Some(&g3), None, 2, 1e-5), "group_norm", "[3]");
    assert_err(gn(&x, Some(&g2), Some(&g3), 2, 1e-5), "group_norm", "[3]");
    assert_err(gn(&x, None, Some(&g3), 1, 1e-5), "group_norm", "[3]");
    assert_err(gn(&x, None, None, 1, f32::NAN), "group_norm", "eps");
    assert_err(gn(&x, None, None, 1, f32::INFINITY), "group_norm", "eps");
    assert_err(gn(&x, None, None, 1, -1.0), "group_norm", "eps");
    assert_err(gn(&flat, None, None, 1, 1e-5), "group_norm", "[4]");
    assert!(gn(&x, Some(&g2), Some(&b2), 2, 1e-5).is_ok());

    assert_err(x.flatten(&ctx, 4), "flatten", "axis 4");
    assert_err(x.cumsum(&ctx, -5), "cumsum", "axis -5");

    let s = Tensor::zeros(&ctx, &[2, 3]).unwrap();
    let src = Tensor::ones(&ctx, &[2, 3]).unwrap();
    let idx = |v: &[i64], shape: &[usize]| ctx.from_slice_typed::<i64>(shape, v).unwrap();
    assert_err(
        s.scatter_add(&ctx, 1, &idx(&[0, 1, 3, 0, 0, 0], &[2, 3]), &src),
        "scatter_add",
        "index 3",
    );
    assert_err(
        s.scatter_add(&ctx, 1, &idx(&[0, 1, -1, 0, 0, 0], &[2, 3]), &src),
        "scatter_add",
        "index -1",
    );
    assert_err(
        s.scatter_add(&ctx, 1, &idx(&[0, 1, 0, 0], &[2, 2]), &src),
        "scatter_add",
        "[2, 2]",
    );
    let big = Tensor::ones(&ctx, &[3, 3]).unwrap();
    assert_err(
        s.scatter_add(&ctx, 1, &idx(&[0; 9], &[3, 3]), &big),
        "scatter_add",
        "[3, 3]",
    );
    assert_err(
        s.scatter_add(&ctx, 2, &idx(&[0; 6], &[2, 3]), &src),
        "scatter_add",
        "axis 2",
    );

    // The exec backward refuses a gradient of the wrong shape and a max pool
    // without its input.
    let o = Pool2dOp::Max(Pool2dOptions::new([2, 2]));
    let g = ctx.zeros(&[1, 2, 3, 3]).unwrap();
    let e: ExecError = ctx
        .pool2d_backward(o, &[1, 2, 4, 4], Some(x.raw()), &g)
        .unwrap_err();
    assert!(e.to_string().contains("[1, 2, 3, 3]"), "{e}");
    let g = ctx.zeros(&[1, 2, 2, 2]).unwrap();
    assert!(ctx.pool2d_backward(o, &[1, 2, 4, 4], None, &g).is_err());
}

/// The bits of every op's forward and backward on inputs large enough to split
/// over the team.
fn all_bits(ctx: &ExecContext) -> Vec<(String, Vec<u32>)> {
    let mut out = Vec::new();
    let bits = |t: &RawTensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let s = [4, 6, 18, 20];
    let n: usize = s.iter().product();
    let xv = values(n, 91, -2.0, 2.0);
    let (gv, bv) = (values(6, 92, 0.5, 1.5), values(6, 93, -1.0, 1.0));
    let mut ops: Vec<Pool2dOp> = pool_options()
        .into_iter()
        .flat_map(|o| [Pool2dOp::Max(o), Pool2dOp::Avg(o), Pool2dOp::ReluMax(o)])
        .collect();
    ops.push(Pool2dOp::AdaptiveAvg([5, 7]));
    ops.push(Pool2dOp::AdaptiveAvg([1, 1]));
    for op in ops {
        let x = Tensor::variable_from_slice(ctx, &s, &xv).unwrap();
        let y = x.pool2d(ctx, op).unwrap();
        let w = Tensor::from_slice(ctx, y.shape(), &values(y.numel(), 94, 0.0, 1.0)).unwrap();
        y.mul(ctx, &w)
            .unwrap()
            .sum_all(ctx)
            .unwrap()
            .backward(ctx)
            .unwrap();
        out.push((format!("{op:?}"), bits(y.raw())));
        out.push((
            format!("{op:?} grad"),
            bits(x.grad(ctx).unwrap().unwrap().raw()),
        ));
    }
    for shape in [&s[..], &[64, 40][..], &[8, 6, 300][..]] {
        let n: usize = shape.iter().product();
        let c = shape[1];
        let x = Tensor::variable_from_slice(ctx, shape, &values(n, 95, -2.0, 3.0)).unwrap();
        let g = Tensor::variable_from_slice(ctx, &[c], &gv[..c.min(6)].repeat(c.div_ceil(6))[..c])
            .unwrap();
        let b = Tensor::variable_from_slice(ctx, &[c], &bv[..c.min(6)].repeat(c.div_ceil(6))[..c])
            .unwrap();
        let rm = Tensor::from_slice(ctx, &[c], &values(c, 96, -1.0, 1.0)).unwrap();
        let rv = Tensor::from_slice(ctx, &[c], &values(c, 97, 0.5, 2.0)).unwrap();
        let w = Tensor::from_slice(ctx, shape, &values(n, 98, 0.0, 1.0)).unwrap();
        for train in [true, false] {
            let (y, stats) = if train {
                let (y, st) = x.batch_norm_with_stats(ctx, &g, &b, 1e-5).unwrap();
                (y, Some(st))
            } else {
                (
                    x.batch_norm_eval(ctx, &rm, &rv, &g, &b, 1e-5).unwrap(),
                    None,
                )
            };
            y.mul(ctx, &w)
                .unwrap()
                .sum_all(ctx)
                .unwrap()
                .backward(ctx)
                .unwrap();
            let tag = format!("bn {shape:?} train {train}");
            out.push((tag.clone(), bits(y.raw())));
            if let Some(st) = stats {
                out.push((format!("{tag} mean"), bits(&st.mean)));
                out.push((format!("{tag} var"), bits(&st.unbiased_var)));
            }
            for (name, t) in [("x", &x), ("gamma", &g), ("beta", &b)] {
                out.push((
                    format!("{tag} grad {name}"),
                    bits(t.grad(ctx).unwrap().unwrap().raw()),
                ));
                t.zero_grad();
            }
        }
    }
    for (shape, groups) in [(&s[..], 3), (&[64, 40][..], 8), (&[8, 6, 300][..], 2)] {
        let n: usize = shape.iter().product();
        let c = shape[1];
        let x = Tensor::variable_from_slice(ctx, shape, &values(n, 105, -2.0, 3.0)).unwrap();
        let g = Tensor::variable_from_slice(ctx, &[c], &values(c, 106, 0.5, 1.5)).unwrap();
        let b = Tensor::variable_from_slice(ctx, &[c], &values(c, 107, -1.0, 1.0)).unwrap();
        let w = Tensor::from_slice(ctx, shape, &values(n, 108, 0.0, 1.0)).unwrap();
        for affine in [true, false] {
            let (gp, bp) = if affine {
                (Some(&g), Some(&b))
            } else {
                (None, None)
            };
            let y = x
                .group_norm(ctx, gp, bp, GroupNormOptions::new(groups))
                .unwrap();
            y.mul(ctx, &w)
                .unwrap()
                .sum_all(ctx)
                .unwrap()
                .backward(ctx)
                .unwrap();
            let tag = format!("gn {shape:?} affine {affine}");
            out.push((tag.clone(), bits(y.raw())));
            let params: &[(&str, &Tensor)] = if affine {
                &[("x", &x), ("weight", &g), ("bias", &b)]
            } else {
                &[("x", &x)]
            };
            for (name, t) in params {
                out.push((
                    format!("{tag} grad {name}"),
                    bits(t.grad(ctx).unwrap().unwrap().raw()),
                ));
                t.zero_grad();
            }
        }
    }
    let x = ctx
        .from_slice(&[64, 300], &values(64 * 300, 99, -1.0, 1.0))
        .unwrap();
    for axis in [0, 1] {
        out.push((
            format!("cumsum {axis}"),
            bits(&ctx.cumsum(&x, axis).unwrap()),
        ));
        out.push((
            format!("cumsum_backward {axis}"),
            bits(&ctx.cumsum_backward(&x, axis).unwrap()),
        ));
    }
    let idx: Vec<i64> = (0..64 * 300).map(|i| (i * 7 % 300) as i64).collect();
    let idx = ctx.from_slice_typed::<i64>(&[64, 300], &idx).unwrap();
    out.push((
        "scatter_add".into(),
        bits(&ctx.scatter_add(&x, 1, &idx, &x).unwrap()),
    ));
    out
}

#[test]
fn every_op_is_bit_identical_for_one_to_four_threads() {
    let base = all_bits(&ExecContext::with_threads(1));
    for t in 2..=4 {
        let got = all_bits(&ExecContext::with_threads(t));
        for ((name, a), (_, b)) in base.iter().zip(&got) {
            assert!(a == b, "{name}: {t} threads differ from 1");
        }
    }
}

#[test]
fn pooling_eval_batch_norm_group_norm_and_cumsum_are_batch_invariant() {
    let ctx = ExecContext::with_threads(2);
    let s = [5, 3, 12, 14];
    let n: usize = s.iter().product();
    let per = n / s[0];
    let xv = values(n, 101, -2.0, 2.0);
    let x = ctx.from_slice(&s, &xv).unwrap();
    let c = s[1];
    let (rm, rv) = (
        ctx.from_slice(&[c], &values(c, 102, -1.0, 1.0)).unwrap(),
        ctx.from_slice(&[c], &values(c, 103, 0.5, 2.0)).unwrap(),
    );
    let (g, b) = (ctx.ones(&[c]).unwrap(), ctx.zeros(&[c]).unwrap());
    type Op<'a> = Box<dyn Fn(&RawTensor) -> RawTensor + 'a>;
    let mut ops: Vec<(String, Op)> = Vec::new();
    for o in pool_options() {
        for op in [Pool2dOp::Max(o), Pool2dOp::Avg(o), Pool2dOp::ReluMax(o)] {
            let ctx = &ctx;
            ops.push((
                format!("{op:?}"),
                Box::new(move |x| ctx.pool2d(op, x).unwrap()),
            ));
        }
    }
    ops.push((
        "adaptive".into(),
        Box::new(|x| ctx.adaptive_avg_pool2d(x, [5, 4]).unwrap()),
    ));
    ops.push((
        "batch_norm_eval".into(),
        Box::new(|x| ctx.batch_norm_eval(x, &rm, &rv, &g, &b, 1e-5).unwrap()),
    ));
    ops.push(("cumsum".into(), Box::new(|x| ctx.cumsum(x, 3).unwrap())));
    ops.push((
        "group_norm".into(),
        Box::new(|x| {
            let opts = GroupNormOptions::new(3);
            ctx.group_norm(x, Some(&rv), Some(&rm), opts).unwrap()
        }),
    ));
    for (name, f) in &ops {
        let all = f(&x).to_vec();
        let out_per = all.len() / s[0];
        for k in 0..s[0] {
            let one = ctx
                .from_slice(&[1, s[1], s[2], s[3]], &xv[k * per..(k + 1) * per])
                .unwrap();
            let alone = f(&one).to_vec();
            let same = alone
                .iter()
                .zip(&all[k * out_per..(k + 1) * out_per])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name}: sample {k} alone differs from the batch");
        }
    }
}

#[test]
fn training_batch_norm_depends_on_the_batch() {
    // By definition: the same sample normalizes differently in another batch.
    let ctx = ExecContext::new();
    let (g, b) = (ctx.ones(&[1]).unwrap(), ctx.zeros(&[1]).unwrap());
    let a = ctx.from_slice(&[2, 1], &[1., 2.]).unwrap();
    let c = ctx.from_slice(&[2, 1], &[1., 5.]).unwrap();
    let ya = ctx.batch_norm(&a, &g, &b, 0.0).unwrap().0.to_vec();
    let yc = ctx.batch_norm(&c, &g, &b, 0.0).unwrap().0.to_vec();
    assert_eq!((ya[0], yc[0]), (-1.0, -1.0));
    let three = ctx.from_slice(&[3, 1], &[1., 2., 6.]).unwrap();
    assert_ne!(
        ctx.batch_norm(&three, &g, &b, 0.0).unwrap().0.to_vec()[0],
        -1.0
    );
}

#[test]
fn exec_backward_accepts_views_and_eval_uses_running_inv_std() {
    // The packed statistics views the autograd node reads are exact.
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[3, 2], &[1., 4., 2., 6., 3., 2.]).unwrap();
    let (g, b) = (ctx.ones(&[2]).unwrap(), ctx.zeros(&[2]).unwrap());
    let (_, st) = ctx.batch_norm(&x, &g, &b, 1e-5).unwrap();
    assert_eq!(st.mean.to_vec(), [2., 4.]);
    let rv = ctx.from_slice(&[2], &[3., 0.5]).unwrap();
    let is = ctx.batch_norm_inv_std(&rv, 1e-5).unwrap().to_vec();
    assert_eq!(
        is,
        [1.0 / (3.0f32 + 1e-5).sqrt(), 1.0 / (0.5f32 + 1e-5).sqrt()]
    );
}

#[test]
fn gradcheck_through_a_small_cnn_block() {
    // pool -> batch norm -> flatten -> cumsum, all in one graph. The batch norm
    // output sums to a constant, so the objective cancels a lot: a step of 1e-2
    // (the max pool's inputs are 0.05 apart, so no window changes its pick)
    // keeps the f32 rounding of the differences below the tolerance.
    let ctx = ExecContext::new();
    let x = raw(&ctx, &[2, 2, 4, 4], &distinct(64, 111));
    let g = raw(&ctx, &[2], &[1.2, 0.8]);
    let b = raw(&ctx, &[2], &[0.1, -0.2]);
    let r = fucina_autograd::gradcheck(
        &ctx,
        |ctx, t| {
            t[0].max_pool2d(ctx, opts([3, 3], [1, 1], [1, 1]))?
                .batch_norm(ctx, &t[1], &t[2], 1e-5)?
                .avg_pool2d(ctx, Pool2dOptions::new([2, 2]))?
                .flatten(ctx, 1)?
                .cumsum(ctx, 1)
        },
        &[x, g, b],
        &fucina_autograd::GradcheckOptions {
            eps: 1e-2,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.passed && r.checked == 68, "{r:?}");
}

#[test]
fn gradcheck_pad_every_mode_and_axis_count() {
    let ctx = ExecContext::new();
    for mode in [PadMode::Constant(0.7), PadMode::Reflect, PadMode::Replicate] {
        for (s, pads) in [
            (&[2, 3, 4][..], &[2, 3][..]),
            (&[1, 2, 3, 4][..], &[1, 2, 2, 1][..]),
            (&[3, 5][..], &[0, 4, 2, 0][..]),
            (&[2, 3, 4][..], &[-1, 2, 1, -2][..]),
            (&[2, 3, 3, 4][..], &[1, -2, 2, 1, -1, 1][..]),
            (&[3, 4, 5][..], &[-2, 1, 0, 0, 1, -1][..]),
        ] {
            let o = PadOptions::new(pads, mode).unwrap();
            let n: usize = s.iter().product();
            check_layouts(
                &ctx,
                &format!("pad {s:?} {o:?}"),
                |ctx, t| t[0].pad(ctx, o),
                &[(s, values(n, 201, -2.0, 2.0))],
            );
        }
    }
}

#[test]
fn gradcheck_interpolate_every_mode() {
    let ctx = ExecContext::new();
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
            InterpolateOptions::scale([2.0, 2.0], mode),
            InterpolateOptions::size([5, 2], mode),
            InterpolateOptions::scale([1.5, 0.75], mode),
        ] {
            let s: &[usize] = &[2, 2, 3, 4];
            check_layouts(
                &ctx,
                &format!("interpolate {o:?}"),
                |ctx, t| t[0].interpolate(ctx, o),
                &[(s, values(48, 202, -2.0, 2.0))],
            );
        }
    }
}

#[test]
fn pool1d_is_the_2d_pool_over_a_unit_height_and_passes_gradcheck() {
    let ctx = ExecContext::new();
    let s = [2, 3, 11];
    let xv = distinct(66, 203);
    for o in [
        Pool1dOptions::new(2),
        Pool1dOptions {
            kernel: 3,
            stride: 2,
            padding: 1,
        },
        Pool1dOptions {
            kernel: 4,
            stride: 1,
            padding: 2,
        },
    ] {
        let x = Tensor::from_slice(&ctx, &s, &xv).unwrap();
        let x4 = Tensor::from_slice(&ctx, &[2, 3, 1, 11], &xv).unwrap();
        let mx = x.max_pool1d(&ctx, o).unwrap();
        let av = x.avg_pool1d(&ctx, o).unwrap();
        assert_eq!(
            mx.shape(),
            o.out_shape("max_pool1d", &s).unwrap().as_slice()
        );
        let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&mx), bits(&x4.max_pool2d(&ctx, o.to_2d()).unwrap()));
        assert_eq!(bits(&av), bits(&x4.avg_pool2d(&ctx, o.to_2d()).unwrap()));
        // Direct reference of the max and mean windows (padding -inf / 0).
        let ol = mx.shape()[2];
        for (r, row) in xv.chunks(11).enumerate() {
            for i in 0..ol {
                let lo = (i * o.stride) as isize - o.padding as isize;
                let win = (lo..lo + o.kernel as isize).filter(|&j| (0..11).contains(&j));
                let m = win
                    .clone()
                    .map(|j| row[j as usize])
                    .fold(f32::MIN, f32::max);
                let sum: f64 = win.map(|j| f64::from(row[j as usize])).sum();
                assert_eq!(mx.to_vec()[r * ol + i], m);
                let a = f64::from(av.to_vec()[r * ol + i]);
                assert!((a - sum / o.kernel as f64).abs() < 1e-6);
            }
        }
        for (name, avg) in [("max", false), ("avg", true)] {
            check_layouts(
                &ctx,
                &format!("{name}_pool1d {o:?}"),
                |ctx, t| {
                    if avg {
                        t[0].avg_pool1d(ctx, o)
                    } else {
                        t[0].max_pool1d(ctx, o)
                    }
                },
                &[(&s, xv.clone())],
            );
        }
    }
    // Bad input names the 1-D op.
    let x = Tensor::from_slice(&ctx, &s, &xv).unwrap();
    for (o, what) in [
        (Pool1dOptions::new(0), "kernel size"),
        (
            Pool1dOptions {
                kernel: 2,
                stride: 0,
                padding: 0,
            },
            "stride",
        ),
        (
            Pool1dOptions {
                kernel: 2,
                stride: 1,
                padding: 2,
            },
            "padding",
        ),
        (Pool1dOptions::new(12), "larger than the padded input"),
    ] {
        let e = x.max_pool1d(&ctx, o).unwrap_err().to_string();
        assert!(e.contains("max_pool1d") && e.contains(what), "{e}");
        let e = x.avg_pool1d(&ctx, o).unwrap_err().to_string();
        assert!(e.contains("avg_pool1d") && e.contains(what), "{e}");
    }
    let x4 = Tensor::from_slice(&ctx, &[2, 3, 1, 11], &xv).unwrap();
    let e = x4
        .max_pool1d(&ctx, Pool1dOptions::new(2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_pool1d") && e.contains("rank 3"), "{e}");
}
