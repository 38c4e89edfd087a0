//! Reductions against naive f64 references: every op on random shapes (size-1 axes,
//! odd lengths), contiguous and strided inputs, keepdim shapes, error cases, NaN and
//! infinity rules, the backward helpers (finite differences in f64), thread-count
//! determinism and batch invariance.

use fucina_exec::{ExecContext, ExecError, RawTensor};
use proptest::prelude::*;

mod support;
use support::{assert_close, bits, fd_grad, numel, strided, uniform};

/// Inputs in [-2, 2).
fn rand_vec(seed: u64, n: usize) -> Vec<f32> {
    uniform(seed, n, -2.0, 2.0)
}

// ---------------------------------------------------------------- helpers

fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        numel(&shape[..axis]),
        shape[axis],
        numel(&shape[axis + 1..]),
    )
}

/// `f` over each column along `axis`, in row-major order of the other axes.
fn naive_axis<T>(shape: &[usize], data: &[f32], axis: usize, f: impl Fn(&[f64]) -> T) -> Vec<T> {
    let (outer, n, inner) = split(shape, axis);
    let mut out = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let col: Vec<f64> = (0..n)
                .map(|k| f64::from(data[(o * n + k) * inner + i]))
                .collect();
            out.push(f(&col));
        }
    }
    out
}

fn reduced(shape: &[usize], axis: usize, keepdim: bool) -> Vec<usize> {
    let mut s: Vec<usize> = shape.to_vec();
    if keepdim {
        s[axis] = 1;
    } else {
        s.remove(axis);
    }
    if s.is_empty() {
        s.push(1);
    }
    s
}

fn f64_sum(c: &[f64]) -> f64 {
    c.iter().sum()
}

fn f64_var(c: &[f64], corr: usize) -> f64 {
    let m = f64_sum(c) / c.len() as f64;
    c.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (c.len() - corr) as f64
}

fn f64_lse(c: &[f64]) -> f64 {
    let m = c.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + c.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
}

fn first_arg(c: &[f64], better: impl Fn(f64, f64) -> bool) -> i64 {
    let mut at = 0;
    for (i, &v) in c.iter().enumerate() {
        if better(v, c[at]) {
            at = i;
        }
    }
    at as i64
}

// ---------------------------------------------------------------- forward vs f64

fn check_all_ops(ctx: &ExecContext, x: &RawTensor, shape: &[usize], data: &[f32], axis: usize) {
    for keepdim in [false, true] {
        let want_shape = reduced(shape, axis, keepdim);
        let n = shape[axis] as f64;
        let cases: [(&str, RawTensor, Vec<f64>, f64); 8] = [
            (
                "sum",
                ctx.sum(x, axis, keepdim).unwrap(),
                naive_axis(shape, data, axis, f64_sum),
                1e-5,
            ),
            (
                "mean",
                ctx.mean(x, axis, keepdim).unwrap(),
                naive_axis(shape, data, axis, |c| f64_sum(c) / n),
                1e-5,
            ),
            (
                "max",
                ctx.max(x, axis, keepdim).unwrap(),
                naive_axis(shape, data, axis, |c| {
                    c.iter().cloned().fold(f64::MIN, f64::max)
                }),
                0.0,
            ),
            (
                "min",
                ctx.min(x, axis, keepdim).unwrap(),
                naive_axis(shape, data, axis, |c| {
                    c.iter().cloned().fold(f64::MAX, f64::min)
                }),
                0.0,
            ),
            (
                "variance_biased",
                ctx.variance(x, axis, keepdim, false).unwrap(),
                naive_axis(shape, data, axis, |c| f64_var(c, 0)),
                1e-5,
            ),
            (
                "variance_unbiased",
                ctx.variance(x, axis, keepdim, true).unwrap(),
                naive_axis(shape, data, axis, |c| {
                    if c.len() == 1 {
                        f64::NAN
                    } else {
                        f64_var(c, 1)
                    }
                }),
                1e-5,
            ),
            (
                "logsumexp",
                ctx.logsumexp(x, axis, keepdim).unwrap(),
                naive_axis(shape, data, axis, f64_lse),
                1e-5,
            ),
            (
                "sum_again",
                ctx.sum(x, axis, keepdim).unwrap(),
                naive_axis(shape, data, axis, f64_sum),
                1e-5,
            ),
        ];
        for (name, got, want, tol) in cases {
            assert_eq!(got.shape(), want_shape.as_slice(), "{name} shape");
            assert_close(&got.to_vec(), &want, tol, name);
        }
        let am = ctx.argmax(x, axis, keepdim).unwrap();
        assert_eq!(am.shape(), want_shape.as_slice());
        assert_eq!(
            am.to_vec(),
            naive_axis(shape, data, axis, |c| first_arg(c, |v, b| v > b))
        );
        let am = ctx.argmin(x, axis, keepdim).unwrap();
        assert_eq!(
            am.to_vec(),
            naive_axis(shape, data, axis, |c| first_arg(c, |v, b| v < b))
        );
    }
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..=7, 1..=4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn reductions_match_f64(shape in shape_strategy(), axis_pick in 0usize..8, seed in any::<u64>()) {
        let axis = axis_pick % shape.len();
        let ctx = ExecContext::with_threads(2);
        let mut data = rand_vec(seed, numel(&shape));
        // Ties for argmax/argmin: quantize to a few values.
        for v in data.iter_mut() {
            *v = (*v * 2.0).round() / 2.0;
        }
        let x = ctx.from_slice(&shape, &data).unwrap();
        check_all_ops(&ctx, &x, &shape, &data, axis);
        let xs = strided(&ctx, &shape, &data);
        check_all_ops(&ctx, &xs, &shape, &data, axis);
        drop((x, xs));
    }

    #[test]
    fn sum_to_matches_naive(shape in shape_strategy(), mask in any::<u8>(), drop_lead in 0usize..4, seed in any::<u64>()) {
        let ctx = ExecContext::with_threads(3);
        let data = rand_vec(seed, numel(&shape));
        let rank = shape.len();
        let lead = drop_lead.min(rank - 1);
        let target: Vec<usize> = (lead..rank)
            .map(|i| if mask >> i & 1 == 1 { 1 } else { shape[i] })
            .collect();
        // Naive: each input element adds into its target index.
        let tn = numel(&target);
        let mut want = vec![0.0f64; tn];
        for (flat, &v) in data.iter().enumerate() {
            let mut rem = flat;
            let mut idx = vec![0; rank];
            for i in (0..rank).rev() {
                idx[i] = rem % shape[i];
                rem /= shape[i];
            }
            let mut t = 0;
            for (j, &d) in target.iter().enumerate() {
                let i = lead + j;
                t = t * d + if d == 1 { 0 } else { idx[i] };
            }
            want[t] += f64::from(v);
        }
        for x in [ctx.from_slice(&shape, &data).unwrap(), strided(&ctx, &shape, &data)] {
            let got = ctx.sum_to(&x, &target).unwrap();
            prop_assert_eq!(got.shape(), target.as_slice());
            assert_close(&got.to_vec(), &want, 1e-5, "sum_to");
        }
    }
}

#[test]
fn long_reductions_match_f64() {
    let ctx = ExecContext::with_threads(4);
    // Last axis longer than a super-chunk (several block levels).
    let shape = [3, 70_001];
    let data = rand_vec(1, numel(&shape));
    let x = ctx.from_slice(&shape, &data).unwrap();
    assert_close(
        &ctx.sum(&x, 1, false).unwrap().to_vec(),
        &naive_axis(&shape, &data, 1, f64_sum),
        1e-5,
        "long row sum",
    );
    // Many rows: several row blocks along axis 0.
    let shape = [1_000, 5];
    let data = rand_vec(2, numel(&shape));
    let y = ctx.from_slice(&shape, &data).unwrap();
    assert_close(
        &ctx.sum(&y, 0, false).unwrap().to_vec(),
        &naive_axis(&shape, &data, 0, f64_sum),
        1e-5,
        "long column sum",
    );
    // Inner widths above a column tile, rows above a row block, a middle axis.
    for (shape, axis) in [(vec![600, 130], 0), (vec![3, 300, 70], 1)] {
        let data = rand_vec(3, numel(&shape));
        let y = ctx.from_slice(&shape, &data).unwrap();
        assert_close(
            &ctx.sum(&y, axis, false).unwrap().to_vec(),
            &naive_axis(&shape, &data, axis, f64_sum),
            1e-5,
            "tiled column sum",
        );
    }
    // Full reductions, above and below a super-chunk, and over a transposed view.
    for n in [1usize, 7, 1_000, 200_001] {
        let data = uniform(n as u64, n, -2.0, 2.0);
        let x = ctx.from_slice(&[n], &data).unwrap();
        let want = f64_sum(&data.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
        let s = ctx.sum_all(&x).unwrap();
        assert_eq!(s.shape(), [1]);
        assert_close(&s.to_vec(), &[want], 1e-5, "sum_all");
        assert_close(
            &ctx.mean_all(&x).unwrap().to_vec(),
            &[want / n as f64],
            1e-5,
            "mean_all",
        );
        // sum along the only axis is the same fixed order as sum_all.
        assert_eq!(
            bits(&ctx.sum(&x, 0, false).unwrap().to_vec()),
            bits(&s.to_vec())
        );
    }
    let t = ctx
        .from_slice(&[40, 50], &uniform(9, 2000, -2.0, 2.0))
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let want: f64 = t.to_vec().iter().map(|&v| f64::from(v)).sum();
    assert_close(
        &ctx.sum_all(&t).unwrap().to_vec(),
        &[want],
        1e-5,
        "sum_all view",
    );
}

#[test]
fn broadcast_views_reduce_like_their_values() {
    let ctx = ExecContext::new();
    let row = ctx.from_slice(&[1, 5], &[1., -2., 3., 0.5, 4.]).unwrap();
    let b = row.broadcast_to(&[4, 5]).unwrap();
    assert_eq!(
        ctx.sum(&b, 0, false).unwrap().to_vec(),
        [4., -8., 12., 2., 16.]
    );
    assert_eq!(ctx.max(&b, 1, false).unwrap().to_vec(), [4.; 4]);
    assert_eq!(ctx.argmin(&b, 1, true).unwrap().to_vec(), [1; 4]);
    assert_eq!(
        ctx.sum_to(&b, &[5]).unwrap().to_vec(),
        [4., -8., 12., 2., 16.]
    );
    assert_eq!(ctx.sum_all(&b).unwrap().item().unwrap(), 26.0);
}

#[test]
fn special_values() {
    let ctx = ExecContext::new();
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let x = ctx
        .from_slice(&[3, 3], &[1., nan, 5., -inf, -inf, -inf, 2., inf, 2.])
        .unwrap();
    let max = ctx.max(&x, 1, false).unwrap().to_vec();
    assert!(max[0].is_nan());
    assert_eq!(&max[1..], [-inf, inf]);
    assert!(ctx.min(&x, 1, false).unwrap().to_vec()[0].is_nan());
    assert_eq!(ctx.argmax(&x, 1, false).unwrap().to_vec(), [1, 0, 1]);
    assert_eq!(ctx.argmin(&x, 1, false).unwrap().to_vec(), [1, 0, 0]);
    let lse = ctx.logsumexp(&x, 1, false).unwrap().to_vec();
    assert!(lse[0].is_nan());
    assert_eq!(&lse[1..], [-inf, inf]);
    // Large finite values do not overflow.
    let big = ctx.from_slice(&[2], &[1000., 1000.]).unwrap();
    let l = ctx.logsumexp(&big, 0, false).unwrap().item().unwrap();
    assert!((l - (1000.0 + std::f32::consts::LN_2)).abs() < 1e-3);
    // Unbiased variance of one element is NaN; biased is 0.
    let one = ctx.from_slice(&[2, 1], &[3., 4.]).unwrap();
    assert!(ctx.variance(&one, 1, false, true).unwrap().to_vec()[0].is_nan());
    assert_eq!(
        ctx.variance(&one, 1, false, false).unwrap().to_vec(),
        [0., 0.]
    );
    // Rank 1 without keepdim reduces to [1].
    let v = ctx.from_slice(&[3], &[1., 2., 3.]).unwrap();
    let s = ctx.sum(&v, 0, false).unwrap();
    assert_eq!((s.shape(), s.item().unwrap()), (&[1][..], 6.0));
    drop((x, big, one, v, s));
}

// ---------------------------------------------------------------- errors

#[test]
fn invalid_axes_and_shapes_are_errors() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.]).unwrap();
    let bad_axis = |r: Result<RawTensor, ExecError>, op: &str| match r {
        Err(ExecError::InvalidAxis {
            op: o,
            axis: 2,
            rank: 2,
        }) => assert_eq!(o, op),
        other => panic!("{op}: expected InvalidAxis, got {other:?}"),
    };
    bad_axis(ctx.sum(&x, 2, false), "sum");
    bad_axis(ctx.mean(&x, 2, true), "mean");
    bad_axis(ctx.max(&x, 2, false), "max");
    bad_axis(ctx.min(&x, 2, false), "min");
    bad_axis(ctx.variance(&x, 2, false, true), "variance");
    bad_axis(ctx.logsumexp(&x, 2, false), "logsumexp");
    assert!(matches!(
        ctx.argmax(&x, 5, false),
        Err(ExecError::InvalidAxis { op: "argmax", .. })
    ));
    assert!(matches!(
        ctx.argmin(&x, 2, false),
        Err(ExecError::InvalidAxis { op: "argmin", .. })
    ));
    // sum_to: target does not broadcast to x.
    for target in [&[2][..], &[3, 3], &[1, 2, 3], &[2, 2]] {
        assert!(
            matches!(
                ctx.sum_to(&x, target),
                Err(ExecError::ShapeMismatch { op: "sum_to", .. })
            ),
            "{target:?}"
        );
    }
    assert!(matches!(
        ctx.sum_to(&x, &[0]),
        Err(ExecError::InvalidShape { op: "sum_to", .. })
    ));
    assert!(matches!(
        ctx.sum_to(&x, &[]),
        Err(ExecError::InvalidShape { op: "sum_to", .. })
    ));
    // Backward helpers: wrong gradient shapes and axes.
    let g = ctx.ones(&[3]).unwrap();
    assert!(matches!(
        ctx.sum_backward(&g, 1, false, &[2, 3]),
        Err(ExecError::ShapeMismatch {
            op: "sum_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.mean_backward(&g, 2, false, &[2, 3]),
        Err(ExecError::InvalidAxis {
            op: "mean_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.sum_backward(&g, 0, false, &[2, 0]),
        Err(ExecError::InvalidShape {
            op: "sum_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.max_backward(&x, &g, 1, false),
        Err(ExecError::ShapeMismatch {
            op: "max_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.min_backward(&x, &g, 0, true),
        Err(ExecError::ShapeMismatch {
            op: "min_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.variance_backward(&x, &g, 1, false, true),
        Err(ExecError::ShapeMismatch {
            op: "variance_backward",
            ..
        })
    ));
    let y = ctx.logsumexp(&x, 0, false).unwrap();
    assert!(matches!(
        ctx.logsumexp_backward(&x, &y, &g, 1, false),
        Err(ExecError::ShapeMismatch {
            op: "logsumexp_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.logsumexp_backward(&x, &g, &g, 0, true),
        Err(ExecError::ShapeMismatch {
            op: "logsumexp_backward",
            ..
        })
    ));
    drop((x, g, y));
    assert_eq!(
        ctx.outstanding_buffers(),
        0,
        "failed ops leave nothing behind"
    );
}

// ---------------------------------------------------------------- backward

fn naive_axis64(shape: &[usize], x: &[f64], axis: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let (outer, n, inner) = split(shape, axis);
    let mut out = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let col: Vec<f64> = (0..n).map(|k| x[(o * n + k) * inner + i]).collect();
            out.push(f(&col));
        }
    }
    out
}

#[test]
fn backward_helpers_match_finite_differences() {
    let ctx = ExecContext::with_threads(2);
    for (shape, axis) in [
        (vec![3, 5], 1),
        (vec![4, 3, 2], 1),
        (vec![2, 3, 4], 0),
        (vec![6], 0),
    ] {
        for keepdim in [false, true] {
            let data = rand_vec(7 + axis as u64, numel(&shape));
            let x64: Vec<f64> = data.iter().map(|&v| f64::from(v)).collect();
            let x = ctx.from_slice(&shape, &data).unwrap();
            let gshape = reduced(&shape, axis, keepdim);
            let gdata = rand_vec(99, numel(&gshape));
            let g64: Vec<f64> = gdata.iter().map(|&v| f64::from(v)).collect();
            let g = ctx.from_slice(&gshape, &gdata).unwrap();

            let sum_fd = fd_grad(&x64, &g64, |p| naive_axis64(&shape, p, axis, f64_sum));
            let got = ctx.sum_backward(&g, axis, keepdim, &shape).unwrap();
            assert_eq!(got.shape(), shape.as_slice());
            assert_close(&got.to_vec(), &sum_fd, 1e-4, "sum_backward");

            let n = shape[axis] as f64;
            let mean_fd = fd_grad(&x64, &g64, |p| {
                naive_axis64(&shape, p, axis, |c| f64_sum(c) / n)
            });
            let got = ctx.mean_backward(&g, axis, keepdim, &shape).unwrap();
            assert_close(&got.to_vec(), &mean_fd, 1e-4, "mean_backward");

            for unbiased in [false, true] {
                if unbiased && shape[axis] == 1 {
                    continue;
                }
                let c = usize::from(unbiased);
                let fd = fd_grad(&x64, &g64, |p| {
                    naive_axis64(&shape, p, axis, |col| f64_var(col, c))
                });
                let got = ctx
                    .variance_backward(&x, &g, axis, keepdim, unbiased)
                    .unwrap();
                assert_close(&got.to_vec(), &fd, 1e-3, "variance_backward");
            }

            let fd = fd_grad(&x64, &g64, |p| naive_axis64(&shape, p, axis, f64_lse));
            let y = ctx.logsumexp(&x, axis, keepdim).unwrap();
            let got = ctx.logsumexp_backward(&x, &y, &g, axis, keepdim).unwrap();
            assert_close(&got.to_vec(), &fd, 1e-3, "logsumexp_backward");

            // max/min: distinct random values, so the derivative is the indicator of
            // the extremum (finite differences agree away from ties).
            let fd = fd_grad(&x64, &g64, |p| {
                naive_axis64(&shape, p, axis, |c| {
                    c.iter().cloned().fold(f64::MIN, f64::max)
                })
            });
            let got = ctx.max_backward(&x, &g, axis, keepdim).unwrap();
            assert_close(&got.to_vec(), &fd, 1e-4, "max_backward");
            let fd = fd_grad(&x64, &g64, |p| {
                naive_axis64(&shape, p, axis, |c| {
                    c.iter().cloned().fold(f64::MAX, f64::min)
                })
            });
            let got = ctx.min_backward(&x, &g, axis, keepdim).unwrap();
            assert_close(&got.to_vec(), &fd, 1e-4, "min_backward");
            drop((x, g, y, got));
        }
    }
}

#[test]
fn max_backward_routes_to_the_first_maximum() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 3], &[5., 1., 5., 0., 0., 0.]).unwrap();
    let g = ctx.from_slice(&[2], &[10., 20.]).unwrap();
    let gx = ctx.max_backward(&x, &g, 1, false).unwrap();
    assert_eq!(gx.to_vec(), [10., 0., 0., 20., 0., 0.]);
    let gt = ctx.from_slice(&[1, 3], &[1., 2., 3.]).unwrap();
    let gx = ctx.min_backward(&x, &gt, 0, true).unwrap();
    assert_eq!(gx.to_vec(), [0., 0., 0., 1., 2., 3.]);
}

// ---------------------------------------------------------------- determinism

#[test]
fn bitwise_identical_for_every_team_size() {
    let shape = [300, 257];
    let data = rand_vec(42, numel(&shape));
    let gdata = uniform(43, 300, -2.0, 2.0);
    let run = |threads: usize| -> Vec<Vec<u32>> {
        let ctx = ExecContext::with_threads(threads);
        let x = ctx.from_slice(&shape, &data).unwrap();
        let xt = strided(&ctx, &shape, &data);
        let mut outs = Vec::new();
        for axis in [0, 1] {
            for t in [&x, &xt] {
                outs.push(bits(&ctx.sum(t, axis, false).unwrap().to_vec()));
                outs.push(bits(&ctx.mean(t, axis, true).unwrap().to_vec()));
                outs.push(bits(&ctx.max(t, axis, false).unwrap().to_vec()));
                outs.push(bits(&ctx.min(t, axis, false).unwrap().to_vec()));
                outs.push(bits(&ctx.variance(t, axis, false, true).unwrap().to_vec()));
                outs.push(bits(&ctx.logsumexp(t, axis, false).unwrap().to_vec()));
                let am = ctx.argmax(t, axis, false).unwrap().to_vec();
                outs.push(am.iter().map(|&v| v as u32).collect());
                let am = ctx.argmin(t, axis, false).unwrap().to_vec();
                outs.push(am.iter().map(|&v| v as u32).collect());
            }
        }
        outs.push(bits(&ctx.sum_all(&x).unwrap().to_vec()));
        outs.push(bits(&ctx.mean_all(&xt).unwrap().to_vec()));
        outs.push(bits(&ctx.sum_to(&x, &[1, 257]).unwrap().to_vec()));
        outs.push(bits(&ctx.sum_to(&x, &[300, 1]).unwrap().to_vec()));
        let g = ctx.from_slice(&[300], &gdata).unwrap();
        outs.push(bits(
            &ctx.variance_backward(&x, &g, 1, false, true)
                .unwrap()
                .to_vec(),
        ));
        outs.push(bits(
            &ctx.mean_backward(&g, 1, false, &shape).unwrap().to_vec(),
        ));
        outs.push(bits(&ctx.max_backward(&x, &g, 1, false).unwrap().to_vec()));
        let y = ctx.logsumexp(&x, 1, false).unwrap();
        outs.push(bits(
            &ctx.logsumexp_backward(&x, &y, &g, 1, false)
                .unwrap()
                .to_vec(),
        ));
        // A full reduction long enough for parallel super-chunks.
        let big: Vec<f32> = uniform(44, 5 * 65_536 + 17, -2.0, 2.0);
        let b = ctx.from_slice(&[big.len()], &big).unwrap();
        outs.push(bits(&ctx.sum_all(&b).unwrap().to_vec()));
        drop((x, xt, g, y, b));
        outs
    };
    let one = run(1);
    for threads in 2..=4 {
        assert!(one == run(threads), "results differ for {threads} threads");
    }
}

#[test]
fn last_axis_reductions_are_batch_invariant() {
    let ctx = ExecContext::with_threads(4);
    let c = 1001;
    let data = uniform(5, 64 * c, -2.0, 2.0);
    let x = ctx.from_slice(&[64, c], &data).unwrap();
    type Op = fn(&ExecContext, &RawTensor) -> RawTensor;
    let ops: [(&str, Op); 5] = [
        ("sum", |ctx, x| ctx.sum(x, 1, false).unwrap()),
        ("mean", |ctx, x| ctx.mean(x, 1, false).unwrap()),
        ("max", |ctx, x| ctx.max(x, 1, false).unwrap()),
        ("variance", |ctx, x| {
            ctx.variance(x, 1, false, false).unwrap()
        }),
        ("logsumexp", |ctx, x| ctx.logsumexp(x, 1, false).unwrap()),
    ];
    for (name, op) in ops {
        let batch = op(&ctx, &x).to_vec();
        for r in 0..64 {
            let row = ctx.from_slice(&[1, c], &data[r * c..(r + 1) * c]).unwrap();
            let single = op(&ctx, &row).to_vec();
            assert_eq!(batch[r].to_bits(), single[0].to_bits(), "{name} row {r}");
        }
    }
}

/// A `[3, 4]` input read through transposed strides, with repeated values
/// (ties for `max`/`min`).
fn strided_3x4(ctx: &ExecContext) -> RawTensor {
    let xv: Vec<f32> = (0..12).map(|i| ((i * 7) % 12) as f32 * 0.5 - 1.0).collect();
    ctx.from_slice(&[4, 3], &xv)
        .unwrap()
        .transpose(0, 1)
        .unwrap()
}

/// The axis-reduction descriptor runs the named forward and backward kernels
/// (bit for bit, on a strided input); a selecting reduction refuses a missing
/// input with an error.
#[test]
fn axis_reduction_descriptor_matches_named_methods() {
    use fucina_exec::AxisReduction;
    let ctx = ExecContext::with_threads(1);
    let x = strided_3x4(&ctx);
    let g = ctx.from_slice(&[3], &[1.0, -2.0, 0.5]).unwrap();
    let v = |t: Result<RawTensor, ExecError>| bits(&t.unwrap().to_vec());
    for &op in AxisReduction::ALL {
        let (fwd, bwd) = match op {
            AxisReduction::Sum => (
                ctx.sum(&x, 1, false),
                ctx.sum_backward(&g, 1, false, &[3, 4]),
            ),
            AxisReduction::Mean => (
                ctx.mean(&x, 1, false),
                ctx.mean_backward(&g, 1, false, &[3, 4]),
            ),
            AxisReduction::Max => (ctx.max(&x, 1, false), ctx.max_backward(&x, &g, 1, false)),
            AxisReduction::Min => (ctx.min(&x, 1, false), ctx.min_backward(&x, &g, 1, false)),
            _ => unreachable!(),
        };
        assert!(op.backward_name().starts_with(op.name()));
        assert_eq!(v(ctx.reduce(op, &x, 1, false)), v(fwd), "{op:?}");
        let got = ctx.reduce_backward(op, Some(&x), &[3, 4], &g, 1, false);
        assert_eq!(v(got), v(bwd), "{op:?}");
        let missing = ctx.reduce_backward(op, None, &[3, 4], &g, 1, false);
        assert_eq!(missing.is_err(), op.keeps_input(), "{op:?}");
    }
}

/// The statistic descriptor runs the named forward and backward kernels (bit
/// for bit, on a strided input, along both axes); `logsumexp`'s backward
/// refuses a missing output with an error.
#[test]
fn statistic_descriptor_matches_named_methods() {
    use fucina_exec::AxisStatistic;
    let ctx = ExecContext::with_threads(1);
    let x = strided_3x4(&ctx);
    let v = |t: Result<RawTensor, ExecError>| bits(&t.unwrap().to_vec());
    let ops = [
        AxisStatistic::Variance { unbiased: true },
        AxisStatistic::Variance { unbiased: false },
        AxisStatistic::LogSumExp,
    ];
    for op in ops {
        for (axis, keepdim) in [(0, false), (1, true)] {
            let y = ctx.statistic(op, &x, axis, keepdim).unwrap();
            let g = ctx.full(y.shape(), 0.75).unwrap();
            let (fwd, bwd) = match op {
                AxisStatistic::Variance { unbiased } => (
                    ctx.variance(&x, axis, keepdim, unbiased),
                    ctx.variance_backward(&x, &g, axis, keepdim, unbiased),
                ),
                _ => (
                    ctx.logsumexp(&x, axis, keepdim),
                    ctx.logsumexp_backward(&x, &y, &g, axis, keepdim),
                ),
            };
            assert!(op.backward_name().starts_with(op.name()));
            assert_eq!(v(Ok(y.clone())), v(fwd), "{op:?}");
            let got = ctx.statistic_backward(op, &x, Some(&y), &g, axis, keepdim);
            assert_eq!(v(got), v(bwd), "{op:?}");
            let missing = ctx.statistic_backward(op, &x, None, &g, axis, keepdim);
            assert_eq!(missing.is_err(), op.keeps_output(), "{op:?}");
        }
        assert!(matches!(
            ctx.statistic(op, &x, 2, false),
            Err(ExecError::InvalidAxis { .. })
        ));
    }
}

/// The full-reduction descriptor runs the named kernels, and its backward is
/// the one-element gradient (scaled by `1 / numel` for the mean) broadcast to
/// the input's shape, bit for bit, for a gradient of any one-element shape; a
/// gradient of more than one element is an error.
#[test]
fn full_reduction_descriptor_matches_named_methods() {
    use fucina_exec::FullReduction;
    let ctx = ExecContext::with_threads(1);
    let xv: Vec<f32> = (0..21).map(|i| 0.1 + i as f32 * 0.37).collect();
    let x = ctx.from_slice(&[3, 7], &xv).unwrap();
    let v = |t: Result<RawTensor, ExecError>| bits(&t.unwrap().to_vec());
    assert_eq!(FullReduction::ALL.len(), 2);
    for &op in FullReduction::ALL {
        let fwd = match op {
            FullReduction::Sum => ctx.sum_all(&x),
            _ => ctx.mean_all(&x),
        };
        assert_eq!(v(ctx.reduce_all(op, &x)), v(fwd), "{op:?}");
        for gshape in [&[1][..], &[1, 1]] {
            let g = ctx.from_slice(gshape, &[1.7]).unwrap();
            let want = match op {
                FullReduction::Sum => 1.7f32,
                _ => 1.7 * (1.0 / 21.0f32),
            };
            let got = ctx.reduce_all_backward(op, &g, &[3, 7]).unwrap();
            assert_eq!(got.shape(), [3, 7]);
            assert_eq!(bits(&got.to_vec()), bits(&[want; 21]), "{op:?}");
        }
        let two = ctx.from_slice(&[2], &[1.0, 2.0]).unwrap();
        assert!(matches!(
            ctx.reduce_all_backward(op, &two, &[3, 7]),
            Err(ExecError::InvalidShape { .. })
        ));
    }
    assert_eq!(
        (FullReduction::Sum.name(), FullReduction::Mean.name()),
        ("sum_all", "mean_all")
    );
}
