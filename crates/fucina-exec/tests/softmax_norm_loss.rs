//! softmax / log_softmax, layer_norm / rms_norm and the losses against naive f64
//! references; backward kernels against f64 finite differences of the forward;
//! error cases; thread-count determinism; batch invariance.

use fucina_exec::{ExecContext, ExecError, RawTensor};
use proptest::prelude::*;

mod support;
use support::{assert_close, bits, fd_grad, numel, strided, uniform};

// ---------------------------------------------------------------- helpers

fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Applies `f` to every line along `axis` of `x` (shape `shape`), in place.
fn along_axis(shape: &[usize], x: &[f64], axis: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let outer = numel(&shape[..axis]);
    let n = shape[axis];
    let inner = numel(&shape[axis + 1..]);
    let mut out = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            let line: Vec<f64> = (0..n).map(|k| x[at(k)]).collect();
            for (k, v) in f(&line).into_iter().enumerate() {
                out[at(k)] = v;
            }
        }
    }
    out
}

fn softmax64(r: &[f64]) -> Vec<f64> {
    let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = r.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

fn log_softmax64(r: &[f64]) -> Vec<f64> {
    let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + r.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    r.iter().map(|v| v - lse).collect()
}

fn layer_norm64(r: &[f64], g: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let n = r.len() as f64;
    let m = r.iter().sum::<f64>() / n;
    let var = r.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n;
    let rstd = 1.0 / (var + eps).sqrt();
    r.iter()
        .zip(g)
        .zip(b)
        .map(|((v, g), b)| (v - m) * rstd * g + b)
        .collect()
}

fn rms_norm64(r: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
    let ms = r.iter().map(|v| v * v).sum::<f64>() / r.len() as f64;
    let rstd = 1.0 / (ms + eps).sqrt();
    r.iter().zip(g).map(|(v, g)| v * rstd * g).collect()
}

fn rows64(c: usize, x: &[f64], f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    x.chunks(c).flat_map(f).collect()
}

fn ce64(c: usize, x: &[f64], labels: &[i64]) -> f64 {
    let n = labels.len() as f64;
    x.chunks(c)
        .zip(labels)
        .map(|(r, &l)| -log_softmax64(r)[l as usize])
        .sum::<f64>()
        / n
}

// ---------------------------------------------------------------- softmax

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..=7, 1..=4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn softmax_family_matches_f64(shape in shape_strategy(), axis_pick in 0usize..8, seed in any::<u64>()) {
        let axis = axis_pick % shape.len();
        let ctx = ExecContext::with_threads(2);
        let data = uniform(seed, numel(&shape), -4.0, 4.0);
        let x64 = to64(&data);
        let want_sm = along_axis(&shape, &x64, axis, softmax64);
        let want_lsm = along_axis(&shape, &x64, axis, log_softmax64);
        for x in [ctx.from_slice(&shape, &data).unwrap(), strided(&ctx, &shape, &data)] {
            let y = ctx.softmax(&x, axis).unwrap();
            prop_assert_eq!(y.shape(), shape.as_slice());
            prop_assert!(y.is_contiguous());
            assert_close(&y.to_vec(), &want_sm, 1e-5, "softmax");
            let l = ctx.log_softmax(&x, axis).unwrap();
            assert_close(&l.to_vec(), &want_lsm, 1e-5, "log_softmax");
        }
    }

    #[test]
    fn norms_match_f64(rows in 1usize..6, lead in 1usize..3, c in 1usize..40, seed in any::<u64>()) {
        let ctx = ExecContext::with_threads(2);
        let shape = [lead, rows, c];
        let data = uniform(seed, numel(&shape), -3.0, 3.0);
        let g = uniform(seed ^ 1, c, 0.5, 1.5);
        let b = uniform(seed ^ 2, c, -1.0, 1.0);
        let eps = 1e-5;
        let want_ln = rows64(c, &to64(&data), |r| layer_norm64(r, &to64(&g), &to64(&b), eps));
        let want_rms = rows64(c, &to64(&data), |r| rms_norm64(r, &to64(&g), eps));
        let gt = ctx.from_slice(&[c], &g).unwrap();
        let gs = strided(&ctx, &[c], &g);
        let bt = ctx.from_slice(&[c], &b).unwrap();
        for x in [ctx.from_slice(&shape, &data).unwrap(), strided(&ctx, &shape, &data)] {
            for gamma in [&gt, &gs] {
                let y = ctx.layer_norm(&x, gamma, &bt, eps as f32).unwrap();
                prop_assert_eq!(y.shape(), shape.as_slice());
                assert_close(&y.to_vec(), &want_ln, 2e-4, "layer_norm");
                let y = ctx.rms_norm(&x, gamma, eps as f32).unwrap();
                assert_close(&y.to_vec(), &want_rms, 2e-5, "rms_norm");
            }
        }
    }

    #[test]
    fn losses_match_f64(n in 1usize..9, c in 1usize..30, seed in any::<u64>()) {
        let ctx = ExecContext::with_threads(2);
        let data = uniform(seed, n * c, -5.0, 5.0);
        let mut labels = vec![0i64; n];
        fucina_exec::rng::randint_fill(seed, &mut labels, 0, c as i64);
        let x64 = to64(&data);
        let lab = ctx.from_slice_typed::<i64>(&[n], &labels).unwrap();
        let want_rows: Vec<f64> = x64
            .chunks(c)
            .zip(&labels)
            .map(|(r, &l)| -log_softmax64(r)[l as usize])
            .collect();
        for x in [ctx.from_slice(&[n, c], &data).unwrap(), strided(&ctx, &[n, c], &data)] {
            let rows = ctx.cross_entropy_per_row(&x, &lab).unwrap();
            prop_assert_eq!(rows.shape(), &[n][..]);
            assert_close(&rows.to_vec(), &want_rows, 1e-5, "cross_entropy_per_row");
            let loss = ctx.cross_entropy(&x, &lab).unwrap();
            prop_assert_eq!(loss.shape(), &[1][..]);
            assert_close(&loss.to_vec(), &[ce64(c, &x64, &labels)], 1e-5, "cross_entropy");
            // nll of log_softmax is cross entropy.
            let lsm = ctx.log_softmax(&x, 1).unwrap();
            let nll = ctx.nll_loss(&lsm, &lab).unwrap();
            assert_close(&nll.to_vec(), &[ce64(c, &x64, &labels)], 1e-5, "nll_loss");
            // nll on a strided view of log-probs.
            let nll_s = ctx.nll_loss(&strided(&ctx, &[n, c], &lsm.to_vec()), &lab).unwrap();
            prop_assert_eq!(nll_s.to_vec(), nll.to_vec());
        }
        let other = uniform(seed ^ 7, n * c, -5.0, 5.0);
        let want_mse = data
            .iter()
            .zip(&other)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum::<f64>()
            / (n * c) as f64;
        let a = strided(&ctx, &[n, c], &data);
        let b = ctx.from_slice(&[n, c], &other).unwrap();
        assert_close(&ctx.mse_loss(&a, &b).unwrap().to_vec(), &[want_mse], 1e-5, "mse_loss");
    }
}

#[test]
fn softmax_is_stable_and_follows_pytorch_on_infinities() {
    let ctx = ExecContext::new();
    let inf = f32::INFINITY;
    let x = ctx
        .from_slice(
            &[3, 3],
            &[1e30, 1e30, -1e30, 0., -inf, 0., -inf, -inf, -inf],
        )
        .unwrap();
    let y = ctx.softmax(&x, 1).unwrap().to_vec();
    assert_eq!(&y[..6], [0.5, 0.5, 0.0, 0.5, 0.0, 0.5]);
    assert!(y[6..].iter().all(|v| v.is_nan()), "all -inf row gives NaN");
    let l = ctx.log_softmax(&x, 1).unwrap().to_vec();
    assert_eq!(l[4], -inf);
    assert!((l[0] + std::f32::consts::LN_2).abs() < 1e-6);
    // A NaN anywhere in a row (in the vector body or the tail, next to +inf)
    // makes the whole row NaN in the softmax family, other rows untouched.
    let c = 67;
    for at in [0, 5, 64, 66] {
        let mut d: Vec<f32> = (0..2 * c).map(|i| (i % 7) as f32 - 3.0).collect();
        d[at] = f32::NAN;
        d[(at + 1) % c] = inf;
        let x = ctx.from_slice(&[2, c], &d).unwrap();
        for (name, y) in [
            ("softmax", ctx.softmax(&x, 1).unwrap().to_vec()),
            ("log_softmax", ctx.log_softmax(&x, 1).unwrap().to_vec()),
            ("logsumexp", ctx.logsumexp(&x, 1, false).unwrap().to_vec()),
        ] {
            let per_row = y.len() / 2;
            assert!(
                y[..per_row].iter().all(|v| v.is_nan()),
                "{name}, NaN at {at}"
            );
            assert!(
                y[per_row..].iter().all(|v| v.is_finite()),
                "{name}, NaN at {at}"
            );
        }
    }
    // Huge logits in cross entropy stay finite.
    let z = ctx.from_slice(&[1, 3], &[1e4, 0., -1e4]).unwrap();
    let lab = ctx.from_slice_typed::<i64>(&[1], &[1]).unwrap();
    assert!((ctx.cross_entropy(&z, &lab).unwrap().item().unwrap() - 1e4).abs() < 1e-1);
}

// ---------------------------------------------------------------- backward

#[test]
fn softmax_backward_matches_finite_differences() {
    let ctx = ExecContext::with_threads(2);
    for (shape, axis) in [
        (vec![3, 5], 1),
        (vec![3, 5], 0),
        (vec![2, 3, 4], 1),
        (vec![7], 0),
    ] {
        let data = uniform(3, numel(&shape), -2.0, 2.0);
        let gdata = uniform(4, numel(&shape), -1.0, 1.0);
        let (x64, g64) = (to64(&data), to64(&gdata));
        let x = ctx.from_slice(&shape, &data).unwrap();
        let g = strided(&ctx, &shape, &gdata);
        let y = ctx.softmax(&x, axis).unwrap();
        let fd = fd_grad(&x64, &g64, |p| along_axis(&shape, p, axis, softmax64));
        let got = ctx.softmax_backward(&y, &g, axis).unwrap();
        assert_close(&got.to_vec(), &fd, 1e-4, "softmax_backward");
        let y = ctx.log_softmax(&x, axis).unwrap();
        let fd = fd_grad(&x64, &g64, |p| along_axis(&shape, p, axis, log_softmax64));
        let got = ctx.log_softmax_backward(&y, &g, axis).unwrap();
        assert_close(&got.to_vec(), &fd, 1e-4, "log_softmax_backward");
    }
}

#[test]
fn norm_backward_matches_finite_differences() {
    let ctx = ExecContext::with_threads(2);
    let eps = 1e-5f32;
    for (shape, seed) in [
        (vec![4, 6], 1u64),
        (vec![2, 3, 5], 2),
        (vec![7], 3),
        (vec![3, 1], 4),
    ] {
        let c = shape[shape.len() - 1];
        let data = uniform(seed, numel(&shape), -2.0, 2.0);
        let gam = uniform(seed + 10, c, 0.5, 1.5);
        let bet = uniform(seed + 20, c, -1.0, 1.0);
        let gy = uniform(seed + 30, numel(&shape), -1.0, 1.0);
        let (x64, g64, b64, w64) = (to64(&data), to64(&gam), to64(&bet), to64(&gy));
        let e = f64::from(eps);
        let x = ctx.from_slice(&shape, &data).unwrap();
        let gamma = ctx.from_slice(&[c], &gam).unwrap();
        let grad_y = ctx.from_slice(&shape, &gy).unwrap();

        let (gx, gg, gb) = ctx.layer_norm_backward(&x, &gamma, &grad_y, eps).unwrap();
        let fd_x = fd_grad(&x64, &w64, |p| {
            rows64(c, p, |r| layer_norm64(r, &g64, &b64, e))
        });
        let fd_g = fd_grad(&g64, &w64, |p| {
            rows64(c, &x64, |r| layer_norm64(r, p, &b64, e))
        });
        let fd_b = fd_grad(&b64, &w64, |p| {
            rows64(c, &x64, |r| layer_norm64(r, &g64, p, e))
        });
        assert_eq!((gg.shape(), gb.shape()), (&[c][..], &[c][..]));
        // A length-1 row has a zero input gradient analytically; finite
        // differences see eps only.
        assert_close(&gx.to_vec(), &fd_x, 2e-3, "layer_norm grad_x");
        assert_close(&gg.to_vec(), &fd_g, 1e-4, "layer_norm grad_gamma");
        assert_close(&gb.to_vec(), &fd_b, 1e-4, "layer_norm grad_beta");

        let (gx, gg) = ctx.rms_norm_backward(&x, &gamma, &grad_y, eps).unwrap();
        let fd_x = fd_grad(&x64, &w64, |p| rows64(c, p, |r| rms_norm64(r, &g64, e)));
        let fd_g = fd_grad(&g64, &w64, |p| rows64(c, &x64, |r| rms_norm64(r, p, e)));
        assert_close(&gx.to_vec(), &fd_x, 1e-3, "rms_norm grad_x");
        assert_close(&gg.to_vec(), &fd_g, 1e-4, "rms_norm grad_gamma");
    }
}

#[test]
fn norm_parameter_grads_over_many_rows() {
    // More rows than a column block: grad_gamma / grad_beta against f64 sums.
    let ctx = ExecContext::with_threads(3);
    let (r, c) = (700, 70);
    let data = uniform(11, r * c, -2.0, 2.0);
    let gy = uniform(12, r * c, -1.0, 1.0);
    let gam = uniform(13, c, 0.5, 1.5);
    let x = ctx.from_slice(&[r, c], &data).unwrap();
    let gamma = ctx.from_slice(&[c], &gam).unwrap();
    let grad_y = ctx.from_slice(&[r, c], &gy).unwrap();
    let (_, gg, gb) = ctx.layer_norm_backward(&x, &gamma, &grad_y, 1e-5).unwrap();
    let mut want_g = vec![0.0f64; c];
    let mut want_b = vec![0.0f64; c];
    for (row, grow) in data.chunks(c).zip(gy.chunks(c)) {
        let r64 = to64(row);
        let xhat = layer_norm64(&r64, &vec![1.0; c], &vec![0.0; c], 1e-5);
        for j in 0..c {
            want_g[j] += f64::from(grow[j]) * xhat[j];
            want_b[j] += f64::from(grow[j]);
        }
    }
    assert_close(&gg.to_vec(), &want_g, 1e-4, "grad_gamma");
    assert_close(&gb.to_vec(), &want_b, 1e-5, "grad_beta");
}

#[test]
fn loss_backward_matches_finite_differences_and_formulas() {
    let ctx = ExecContext::with_threads(2);
    let (n, c) = (5, 4);
    let data = uniform(21, n * c, -3.0, 3.0);
    let labels = [3i64, 0, 1, 1, 2];
    let x64 = to64(&data);
    let x = ctx.from_slice(&[n, c], &data).unwrap();
    let lab = ctx.from_slice_typed::<i64>(&[n], &labels).unwrap();
    let grad = 0.7f32;
    let fd = fd_grad(&x64, &[f64::from(grad)], |p| vec![ce64(c, p, &labels)]);
    let got = ctx.cross_entropy_backward(&x, &lab, grad).unwrap();
    assert_eq!(got.shape(), [n, c]);
    assert_close(&got.to_vec(), &fd, 1e-4, "cross_entropy_backward");

    // nll: -grad / N at the labels.
    let got = ctx.nll_loss_backward(&x, &lab, grad).unwrap().to_vec();
    for (i, row) in got.chunks(c).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            let want = if j as i64 == labels[i] {
                -grad / n as f32
            } else {
                0.0
            };
            assert_eq!(v, want);
        }
    }

    let other = uniform(22, n * c, -3.0, 3.0);
    let o64 = to64(&other);
    let b = ctx.from_slice(&[n, c], &other).unwrap();
    let mse = |a: &[f64], b: &[f64]| {
        vec![a.iter().zip(b).map(|(u, v)| (u - v) * (u - v)).sum::<f64>() / a.len() as f64]
    };
    let (ga, gb) = ctx.mse_loss_backward(&x, &b, grad).unwrap();
    let fd_a = fd_grad(&x64, &[f64::from(grad)], |p| mse(p, &o64));
    let fd_b = fd_grad(&o64, &[f64::from(grad)], |p| mse(&x64, p));
    assert_close(&ga.to_vec(), &fd_a, 1e-4, "mse grad_a");
    assert_close(&gb.to_vec(), &fd_b, 1e-4, "mse grad_b");
}

// ---------------------------------------------------------------- errors

#[test]
fn errors_are_reported_before_any_work() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.]).unwrap();
    let g3 = ctx.ones(&[3]).unwrap();
    let g2 = ctx.ones(&[2]).unwrap();
    let x3 = ctx.ones(&[3, 2]).unwrap();
    let ok_labels = ctx.from_slice_typed::<i64>(&[2], &[0, 2]).unwrap();
    let before = ctx.outstanding_buffers();

    assert!(matches!(
        ctx.softmax(&x, 2),
        Err(ExecError::InvalidAxis { op: "softmax", .. })
    ));
    assert!(matches!(
        ctx.log_softmax(&x, 9),
        Err(ExecError::InvalidAxis {
            op: "log_softmax",
            ..
        })
    ));
    assert!(matches!(
        ctx.softmax_backward(&x, &x3, 1),
        Err(ExecError::ShapeMismatch {
            op: "softmax_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.log_softmax_backward(&x, &x, 2),
        Err(ExecError::InvalidAxis {
            op: "log_softmax_backward",
            ..
        })
    ));

    assert!(matches!(
        ctx.layer_norm(&x, &g2, &g3, 1e-5),
        Err(ExecError::ShapeMismatch {
            op: "layer_norm",
            ..
        })
    ));
    assert!(matches!(
        ctx.layer_norm(&x, &g3, &g2, 1e-5),
        Err(ExecError::ShapeMismatch {
            op: "layer_norm",
            ..
        })
    ));
    assert!(matches!(
        ctx.layer_norm(&x, &x, &g3, 1e-5),
        Err(ExecError::ShapeMismatch {
            op: "layer_norm",
            ..
        })
    ));
    for eps in [-1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            ctx.layer_norm(&x, &g3, &g3, eps),
            Err(ExecError::InvalidArgument {
                op: "layer_norm",
                ..
            })
        ));
        assert!(matches!(
            ctx.rms_norm(&x, &g3, eps),
            Err(ExecError::InvalidArgument { op: "rms_norm", .. })
        ));
    }
    assert!(matches!(
        ctx.rms_norm(&x, &g2, 1e-5),
        Err(ExecError::ShapeMismatch { op: "rms_norm", .. })
    ));
    assert!(matches!(
        ctx.layer_norm_backward(&x, &g3, &x3, 1e-5),
        Err(ExecError::ShapeMismatch {
            op: "layer_norm_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.rms_norm_backward(&x, &g2, &x, 1e-5),
        Err(ExecError::ShapeMismatch {
            op: "rms_norm_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.rms_norm_backward(&x, &g3, &x3, 1e-5),
        Err(ExecError::ShapeMismatch {
            op: "rms_norm_backward",
            ..
        })
    ));

    // Labels out of range: an error naming the label and the class count.
    for bad in [[0i64, 3], [-1, 0]] {
        let l = ctx.from_slice_typed::<i64>(&[2], &bad).unwrap();
        let before = ctx.outstanding_buffers();
        let want_index = if bad[1] == 3 { 3 } else { -1 };
        for r in [
            ctx.cross_entropy(&x, &l),
            ctx.cross_entropy_per_row(&x, &l),
            ctx.cross_entropy_backward(&x, &l, 1.0),
            ctx.nll_loss(&x, &l),
            ctx.nll_loss_backward(&x, &l, 1.0),
        ] {
            match r {
                Err(ExecError::IndexOutOfBounds {
                    index, bound: 3, ..
                }) => {
                    assert_eq!(index, want_index)
                }
                other => panic!("expected IndexOutOfBounds, got {other:?}"),
            }
        }
        assert_eq!(ctx.outstanding_buffers(), before, "nothing allocated");
    }
    // Label shape and logits rank.
    let l3 = ctx.from_slice_typed::<i64>(&[3], &[0, 0, 0]).unwrap();
    assert!(matches!(
        ctx.cross_entropy(&x, &l3),
        Err(ExecError::ShapeMismatch {
            op: "cross_entropy",
            ..
        })
    ));
    let l21 = ctx.from_slice_typed::<i64>(&[2, 1], &[0, 0]).unwrap();
    assert!(matches!(
        ctx.nll_loss(&x, &l21),
        Err(ExecError::ShapeMismatch { op: "nll_loss", .. })
    ));
    assert!(matches!(
        ctx.cross_entropy(&g3, &ok_labels),
        Err(ExecError::InvalidShape {
            op: "cross_entropy",
            ..
        })
    ));
    let r3 = ctx.ones(&[2, 3, 1]).unwrap();
    assert!(matches!(
        ctx.cross_entropy_backward(&r3, &ok_labels, 1.0),
        Err(ExecError::InvalidShape {
            op: "cross_entropy_backward",
            ..
        })
    ));
    assert!(matches!(
        ctx.mse_loss(&x, &x3),
        Err(ExecError::ShapeMismatch { op: "mse_loss", .. })
    ));
    assert!(matches!(
        ctx.mse_loss_backward(&x, &g3, 1.0),
        Err(ExecError::ShapeMismatch {
            op: "mse_loss_backward",
            ..
        })
    ));
    drop((l3, l21, r3));
    assert_eq!(
        ctx.outstanding_buffers(),
        before,
        "failed ops leave nothing behind"
    );
}

// ---------------------------------------------------------------- determinism

#[test]
fn bitwise_identical_for_every_team_size() {
    let (r, c) = (300, 257);
    let data = uniform(42, r * c, -3.0, 3.0);
    let gy = uniform(43, r * c, -1.0, 1.0);
    let gam = uniform(44, c, 0.5, 1.5);
    let bet = uniform(45, c, -1.0, 1.0);
    let mut labels = vec![0i64; r];
    fucina_exec::rng::randint_fill(46, &mut labels, 0, c as i64);
    let run = |threads: usize| -> Vec<Vec<u32>> {
        let ctx = ExecContext::with_threads(threads);
        let x = ctx.from_slice(&[r, c], &data).unwrap();
        let xs = strided(&ctx, &[r, c], &data);
        let g = ctx.from_slice(&[r, c], &gy).unwrap();
        let gamma = ctx.from_slice(&[c], &gam).unwrap();
        let beta = ctx.from_slice(&[c], &bet).unwrap();
        let lab = ctx.from_slice_typed::<i64>(&[r], &labels).unwrap();
        let mut outs = Vec::new();
        let mut push = |t: RawTensor| outs.push(bits(&t.to_vec()));
        for axis in [0, 1] {
            let y = ctx.softmax(&x, axis).unwrap();
            push(ctx.softmax_backward(&y, &g, axis).unwrap());
            push(y);
            let y = ctx.log_softmax(&xs, axis).unwrap();
            push(ctx.log_softmax_backward(&y, &g, axis).unwrap());
            push(y);
        }
        push(ctx.layer_norm(&xs, &gamma, &beta, 1e-5).unwrap());
        push(ctx.rms_norm(&x, &gamma, 1e-5).unwrap());
        let (a, b, d) = ctx.layer_norm_backward(&x, &gamma, &g, 1e-5).unwrap();
        push(a);
        push(b);
        push(d);
        let (a, b) = ctx.rms_norm_backward(&xs, &gamma, &g, 1e-5).unwrap();
        push(a);
        push(b);
        push(ctx.cross_entropy_per_row(&x, &lab).unwrap());
        push(ctx.cross_entropy(&xs, &lab).unwrap());
        push(ctx.cross_entropy_backward(&x, &lab, 0.5).unwrap());
        push(ctx.nll_loss(&x, &lab).unwrap());
        push(ctx.nll_loss_backward(&x, &lab, 0.5).unwrap());
        push(ctx.mse_loss(&x, &g).unwrap());
        let (a, b) = ctx.mse_loss_backward(&xs, &g, 0.5).unwrap();
        push(a);
        push(b);
        drop((x, xs, g, gamma, beta, lab));
        outs
    };
    let one = run(1);
    for threads in 2..=4 {
        assert!(one == run(threads), "results differ for {threads} threads");
    }
}

#[test]
fn rowwise_ops_are_batch_invariant() {
    let ctx = ExecContext::with_threads(4);
    let c = 1001;
    let data = uniform(5, 64 * c, -3.0, 3.0);
    let gam = uniform(6, c, 0.5, 1.5);
    let bet = uniform(7, c, -1.0, 1.0);
    let mut labels = vec![0i64; 64];
    fucina_exec::rng::randint_fill(8, &mut labels, 0, c as i64);
    let gamma = ctx.from_slice(&[c], &gam).unwrap();
    let beta = ctx.from_slice(&[c], &bet).unwrap();
    let run = |x: &RawTensor, l: &RawTensor<i64>| -> Vec<Vec<f32>> {
        vec![
            ctx.softmax(x, 1).unwrap().to_vec(),
            ctx.log_softmax(x, 1).unwrap().to_vec(),
            ctx.layer_norm(x, &gamma, &beta, 1e-5).unwrap().to_vec(),
            ctx.rms_norm(x, &gamma, 1e-5).unwrap().to_vec(),
            ctx.cross_entropy_per_row(x, l).unwrap().to_vec(),
            ctx.cross_entropy_backward(x, l, x.shape()[0] as f32)
                .unwrap()
                .to_vec(),
        ]
    };
    let x = ctx.from_slice(&[64, c], &data).unwrap();
    let lab = ctx.from_slice_typed::<i64>(&[64], &labels).unwrap();
    let batch = run(&x, &lab);
    let names = [
        "softmax",
        "log_softmax",
        "layer_norm",
        "rms_norm",
        "ce_rows",
        "ce_backward",
    ];
    for r in 0..64 {
        let xr = ctx.from_slice(&[1, c], &data[r * c..(r + 1) * c]).unwrap();
        let lr = ctx
            .from_slice_typed::<i64>(&[1], &labels[r..r + 1])
            .unwrap();
        let single = run(&xr, &lr);
        for (k, name) in names.iter().enumerate() {
            let w = single[k].len();
            assert_eq!(
                bits(&batch[k][r * w..(r + 1) * w]),
                bits(&single[k]),
                "{name} row {r}"
            );
        }
    }
}

/// A `[3, 4]` input with repeats and both signs, and a `[3, 4]` gradient (or
/// target) of other values.
fn input_and_grad_3x4(ctx: &ExecContext) -> (RawTensor, RawTensor) {
    let xv: Vec<f32> = (0..12).map(|i| ((i * 5) % 12) as f32 * 0.3 - 1.0).collect();
    let gv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.15).collect();
    (
        ctx.from_slice(&[3, 4], &xv).unwrap(),
        ctx.from_slice(&[3, 4], &gv).unwrap(),
    )
}

/// The softmax-family descriptor runs the named forward and backward kernels,
/// bit for bit.
#[test]
fn softmax_descriptor_matches_named_methods() {
    use fucina_exec::SoftmaxOp;
    let ctx = ExecContext::with_threads(1);
    let (x, g) = input_and_grad_3x4(&ctx);
    let b = |t: Result<fucina_exec::RawTensor, fucina_exec::ExecError>| {
        t.unwrap()
            .to_vec()
            .iter()
            .map(|f| f.to_bits())
            .collect::<Vec<_>>()
    };
    for &op in SoftmaxOp::ALL {
        for axis in 0..2 {
            let (y, dx) = match op {
                SoftmaxOp::Softmax => {
                    let y = ctx.softmax(&x, axis).unwrap();
                    let dx = ctx.softmax_backward(&y, &g, axis);
                    (y, dx)
                }
                _ => {
                    let y = ctx.log_softmax(&x, axis).unwrap();
                    let dx = ctx.log_softmax_backward(&y, &g, axis);
                    (y, dx)
                }
            };
            assert_eq!(b(ctx.softmax_op(op, &x, axis)), b(Ok(y.clone())), "{op:?}");
            assert_eq!(
                b(ctx.softmax_op_backward(op, &y, &g, axis)),
                b(dx),
                "{op:?}"
            );
        }
        assert!(
            ctx.softmax_op(op, &x, 2).is_err(),
            "{op:?}: axis out of range"
        );
    }
}

/// The normalization descriptor runs the named forward and backward kernels,
/// bit for bit; a shift given to `rms_norm` or missing for `layer_norm` is an
/// error.
#[test]
fn norm_descriptor_matches_named_methods() {
    use fucina_exec::NormOp;
    let ctx = ExecContext::with_threads(1);
    let (x, gy) = input_and_grad_3x4(&ctx);
    let gamma = ctx.from_slice(&[4], &[1.0, 0.5, -2.0, 1.5]).unwrap();
    let beta = ctx.from_slice(&[4], &[0.1, -0.2, 0.3, 0.0]).unwrap();
    let b = |t: &RawTensor| bits(&t.to_vec());
    let ln = NormOp::LayerNorm { eps: 1e-5 };
    assert_eq!((ln.name(), ln.has_shift()), ("layer_norm", true));
    let y = ctx.norm_op(ln, &x, &gamma, Some(&beta)).unwrap();
    assert_eq!(b(&y), b(&ctx.layer_norm(&x, &gamma, &beta, 1e-5).unwrap()));
    let (gx, gg, gb) = ctx.norm_op_backward(ln, &x, &gamma, &gy).unwrap();
    let (wx, wg, wb) = ctx.layer_norm_backward(&x, &gamma, &gy, 1e-5).unwrap();
    assert_eq!((b(&gx), b(&gg), b(&gb.unwrap())), (b(&wx), b(&wg), b(&wb)));

    let rms = NormOp::RmsNorm { eps: 1e-6 };
    assert_eq!((rms.name(), rms.has_shift()), ("rms_norm", false));
    assert_eq!(rms.backward_name(), "rms_norm_backward");
    let y = ctx.norm_op(rms, &x, &gamma, None).unwrap();
    assert_eq!(b(&y), b(&ctx.rms_norm(&x, &gamma, 1e-6).unwrap()));
    let (gx, gg, gb) = ctx.norm_op_backward(rms, &x, &gamma, &gy).unwrap();
    let (wx, wg) = ctx.rms_norm_backward(&x, &gamma, &gy, 1e-6).unwrap();
    assert_eq!((b(&gx), b(&gg)), (b(&wx), b(&wg)));
    assert!(gb.is_none());

    for r in [
        ctx.norm_op(ln, &x, &gamma, None),
        ctx.norm_op(rms, &x, &gamma, Some(&beta)),
    ] {
        assert!(matches!(r, Err(ExecError::InvalidArgument { .. })));
    }
}

/// The loss descriptors run the named forward and backward kernels, bit for
/// bit.
#[test]
fn loss_descriptors_match_named_methods() {
    use fucina_exec::{ClassLoss, RegressionLoss};
    let ctx = ExecContext::with_threads(1);
    let (x, t) = input_and_grad_3x4(&ctx);
    let labels = ctx.from_slice_typed::<i64>(&[3], &[2, 0, 3]).unwrap();
    let b = |t: &RawTensor| bits(&t.to_vec());
    assert_eq!(ClassLoss::ALL.len(), 2);
    for &op in ClassLoss::ALL {
        let (fwd, bwd) = match op {
            ClassLoss::CrossEntropy => (
                ctx.cross_entropy(&x, &labels).unwrap(),
                ctx.cross_entropy_backward(&x, &labels, 0.7).unwrap(),
            ),
            _ => (
                ctx.nll_loss(&x, &labels).unwrap(),
                ctx.nll_loss_backward(&x, &labels, 0.7).unwrap(),
            ),
        };
        assert!(op.backward_name().starts_with(op.name()));
        assert_eq!(b(&ctx.class_loss(op, &x, &labels).unwrap()), b(&fwd));
        let got = ctx.class_loss_backward(op, &x, &labels, 0.7).unwrap();
        assert_eq!(b(&got), b(&bwd), "{op:?}");
        let bad = ctx.from_slice_typed::<i64>(&[3], &[2, 4, 0]).unwrap();
        assert!(matches!(
            ctx.class_loss(op, &x, &bad),
            Err(ExecError::IndexOutOfBounds { .. })
        ));
    }
    let mse = RegressionLoss::Mse;
    assert_eq!(RegressionLoss::ALL, &[mse]);
    assert_eq!(
        (mse.name(), mse.backward_name()),
        ("mse_loss", "mse_loss_backward")
    );
    let fwd = ctx.mse_loss(&x, &t).unwrap();
    assert_eq!(b(&ctx.regression_loss(mse, &x, &t).unwrap()), b(&fwd));
    let (ga, gb) = ctx.regression_loss_backward(mse, &x, &t, 0.7).unwrap();
    let (wa, wb) = ctx.mse_loss_backward(&x, &t, 0.7).unwrap();
    assert_eq!((b(&ga), b(&gb)), (b(&wa), b(&wb)));
}
