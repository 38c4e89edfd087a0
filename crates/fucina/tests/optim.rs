//! Optimizers against hand-written f64 references of PyTorch's formulas; state
//! dict round trips and validation; clipping; the schedule.

use fucina::nn::Parameter;
use fucina::optim::{
    Adam, AdamConfig, AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig, WarmupCosine, clip_grad_norm,
};
use fucina::{Error, ExecContext, Tensor};

const W0: [f32; 5] = [0.5, -1.25, 2.0, 0.0, -0.3];
const C: [f32; 5] = [1.0, 0.5, -2.0, 3.0, 0.25];

/// Backward of `sum(c * w * w)`: the gradient is `2 c w`.
fn backward(ctx: &ExecContext, p: &Parameter) {
    let c = Tensor::from_slice(ctx, &[5], &C).unwrap();
    let w = p.tensor();
    w.mul(ctx, &w)
        .unwrap()
        .mul(ctx, &c)
        .unwrap()
        .sum_all(ctx)
        .unwrap()
        .backward(ctx)
        .unwrap();
}

fn grad64(w: &[f64]) -> Vec<f64> {
    w.iter()
        .zip(C)
        .map(|(w, c)| 2.0 * f64::from(c) * w)
        .collect()
}

fn run(ctx: &ExecContext, opt: &mut dyn Optimizer, steps: usize) -> Vec<Vec<f32>> {
    let p = opt.parameters()[0].clone();
    (0..steps)
        .map(|_| {
            backward(ctx, &p);
            opt.step(ctx).unwrap();
            opt.zero_grad();
            p.to_vec()
        })
        .collect()
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f64>]) {
    for (s, (g, w)) in got.iter().zip(want).enumerate() {
        for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
            let tol = 1e-5 * (1.0 + w.abs());
            assert!(
                (f64::from(g) - w).abs() <= tol,
                "step {s} elem {i}: {g} vs {w}"
            );
        }
    }
}

/// PyTorch's SGD in f64.
fn sgd_ref(cfg: SgdConfig, steps: usize) -> Vec<Vec<f64>> {
    let (lr, mom, damp, wd) = (
        f64::from(cfg.lr),
        f64::from(cfg.momentum),
        f64::from(cfg.dampening),
        f64::from(cfg.weight_decay),
    );
    let mut w: Vec<f64> = W0.iter().map(|&x| f64::from(x)).collect();
    let mut buf: Option<Vec<f64>> = None;
    let mut out = Vec::new();
    for _ in 0..steps {
        let g = grad64(&w);
        let mut d: Vec<f64> = g.iter().zip(&w).map(|(g, w)| g + wd * w).collect();
        if mom != 0.0 {
            let b = match buf.take() {
                None => d.clone(),
                Some(b) => b
                    .iter()
                    .zip(&d)
                    .map(|(b, d)| mom * b + (1.0 - damp) * d)
                    .collect(),
            };
            d = if cfg.nesterov {
                d.iter().zip(&b).map(|(d, b)| d + mom * b).collect()
            } else {
                b.clone()
            };
            buf = Some(b);
        }
        for (w, d) in w.iter_mut().zip(&d) {
            *w -= lr * d;
        }
        out.push(w.clone());
    }
    out
}

/// PyTorch's Adam / AdamW in f64.
fn adam_ref(
    lr: f32,
    betas: (f32, f32),
    eps: f32,
    wd: f32,
    decoupled: bool,
    steps: usize,
) -> Vec<Vec<f64>> {
    let (lr, b1, b2, eps, wd) = (
        f64::from(lr),
        f64::from(betas.0),
        f64::from(betas.1),
        f64::from(eps),
        f64::from(wd),
    );
    let mut w: Vec<f64> = W0.iter().map(|&x| f64::from(x)).collect();
    let (mut m, mut v) = (vec![0.0; 5], vec![0.0; 5]);
    let mut out = Vec::new();
    for t in 1..=steps {
        let mut g = grad64(&w);
        if decoupled {
            w.iter_mut().for_each(|w| *w *= 1.0 - lr * wd);
        } else {
            g.iter_mut().zip(&w).for_each(|(g, w)| *g += wd * w);
        }
        let (bc1, bc2) = (1.0 - b1.powi(t as i32), 1.0 - b2.powi(t as i32));
        for i in 0..5 {
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let denom = (v[i] / bc2).sqrt() + eps;
            w[i] -= lr / bc1 * m[i] / denom;
        }
        out.push(w.clone());
    }
    out
}

fn param(ctx: &ExecContext) -> Parameter {
    Parameter::from_slice(ctx, &[5], &W0).unwrap()
}

#[test]
fn sgd_matches_the_reference() {
    let ctx = ExecContext::new();
    for cfg in [
        SgdConfig {
            lr: 0.1,
            ..SgdConfig::default()
        },
        SgdConfig {
            lr: 0.05,
            weight_decay: 0.1,
            ..SgdConfig::default()
        },
        SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.1,
            weight_decay: 0.01,
            ..SgdConfig::default()
        },
        SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.01,
            ..SgdConfig::default()
        },
    ] {
        let mut opt = Sgd::new(vec![param(&ctx)], cfg).unwrap();
        assert_close(&run(&ctx, &mut opt, 4), &sgd_ref(cfg, 4));
    }
}

#[test]
fn adam_and_adamw_match_the_reference() {
    let ctx = ExecContext::new();
    for wd in [0.0, 0.1] {
        let cfg = AdamConfig {
            lr: 0.01,
            betas: (0.9, 0.99),
            eps: 1e-8,
            weight_decay: wd,
        };
        let mut opt = Adam::new(vec![param(&ctx)], cfg).unwrap();
        assert_close(
            &run(&ctx, &mut opt, 5),
            &adam_ref(0.01, (0.9, 0.99), 1e-8, wd, false, 5),
        );
        let cfg = AdamWConfig {
            lr: 0.01,
            betas: (0.8, 0.999),
            eps: 1e-6,
            weight_decay: wd,
        };
        let mut opt = AdamW::new(vec![param(&ctx)], cfg).unwrap();
        assert_close(
            &run(&ctx, &mut opt, 5),
            &adam_ref(0.01, (0.8, 0.999), 1e-6, wd, true, 5),
        );
    }
    // Adam's L2 and AdamW's decoupled decay differ.
    let a = run(
        &ctx,
        &mut Adam::new(
            vec![param(&ctx)],
            AdamConfig {
                weight_decay: 0.5,
                lr: 0.1,
                ..AdamConfig::default()
            },
        )
        .unwrap(),
        3,
    );
    let b = run(
        &ctx,
        &mut AdamW::new(
            vec![param(&ctx)],
            AdamWConfig {
                weight_decay: 0.5,
                lr: 0.1,
                ..AdamWConfig::default()
            },
        )
        .unwrap(),
        3,
    );
    assert_ne!(a, b);
}

#[test]
fn parameters_without_gradients_are_skipped() {
    let ctx = ExecContext::new();
    let (p, q) = (param(&ctx), param(&ctx));
    let mut opt = AdamW::new(vec![p.clone(), q.clone()], AdamWConfig::default()).unwrap();
    backward(&ctx, &p);
    opt.step(&ctx).unwrap();
    assert_ne!(p.to_vec(), W0);
    assert_eq!(q.to_vec(), W0);
    let names: Vec<String> = opt.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["step", "exp_avg.0", "exp_avg_sq.0"]);
}

/// Runs `a` steps, saves, runs `b` more; then restores into a fresh optimizer and
/// runs the same `b`: the trajectories are bit-identical.
fn round_trip<O: Optimizer>(make: impl Fn(Vec<Parameter>) -> O) {
    let ctx = ExecContext::new();
    let p = param(&ctx);
    let mut opt = make(vec![p.clone()]);
    run(&ctx, &mut opt, 3);
    let saved_w = p.to_vec();
    let saved: Vec<(String, Tensor)> = opt
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, Tensor::constant(ctx.clone(t.raw()).unwrap())))
        .collect();
    let cont = run(&ctx, &mut opt, 3);
    // The state dict handles did not change under the later steps.
    assert_eq!(saved[0].1.to_vec(), [3.0, 0.0, 0.0]);
    let p2 = Parameter::from_slice(&ctx, &[5], &saved_w).unwrap();
    let mut opt2 = make(vec![p2]);
    opt2.load_state_dict(&ctx, &saved).unwrap();
    assert_eq!(run(&ctx, &mut opt2, 3), cont);
    // Without the state the continuation differs.
    let mut opt3 = make(vec![Parameter::from_slice(&ctx, &[5], &saved_w).unwrap()]);
    assert_ne!(run(&ctx, &mut opt3, 3), cont);
}

#[test]
fn state_dict_round_trips_bit_identically() {
    round_trip(|p| {
        AdamW::new(
            p,
            AdamWConfig {
                lr: 0.05,
                ..AdamWConfig::default()
            },
        )
        .unwrap()
    });
    round_trip(|p| {
        Adam::new(
            p,
            AdamConfig {
                lr: 0.05,
                ..AdamConfig::default()
            },
        )
        .unwrap()
    });
    round_trip(|p| {
        Sgd::new(
            p,
            SgdConfig {
                lr: 0.05,
                momentum: 0.9,
                ..SgdConfig::default()
            },
        )
        .unwrap()
    });
}

#[test]
fn load_state_dict_validates_before_changing_anything() {
    let ctx = ExecContext::new();
    let p = param(&ctx);
    let mut opt = AdamW::new(vec![p], AdamWConfig::default()).unwrap();
    run(&ctx, &mut opt, 2);
    let good = opt.state_dict();
    let before: Vec<(String, Vec<f32>)> =
        good.iter().map(|(n, t)| (n.clone(), t.to_vec())).collect();
    let t5 = Tensor::zeros(&ctx, &[5]).unwrap();
    let t4 = Tensor::zeros(&ctx, &[4]).unwrap();
    let step = |v: f32| Tensor::from_slice(&ctx, &[1], &[v]).unwrap();
    let digits = |v: [f32; 3]| Tensor::from_slice(&ctx, &[3], &v).unwrap();
    let with = |i: usize, v: f32| {
        let mut x = [0.5f32; 5];
        x[i] = v;
        Tensor::from_slice(&ctx, &[5], &x).unwrap()
    };
    let cases: Vec<(Vec<(String, Tensor)>, &str)> = vec![
        (
            vec![("step".into(), step(1.0)), ("exp_avg.0".into(), t5.clone())],
            "exp_avg_sq.0",
        ),
        (
            vec![
                ("step".into(), step(1.0)),
                ("exp_avg.0".into(), t4.clone()),
                ("exp_avg_sq.0".into(), t5.clone()),
            ],
            "shape",
        ),
        (
            vec![
                ("exp_avg.0".into(), t5.clone()),
                ("exp_avg_sq.0".into(), t5.clone()),
            ],
            "missing entry \"step\"",
        ),
        (vec![("step".into(), step(1.5))], "not a step count"),
        (vec![("step".into(), step(-1.0))], "not a step count"),
        (vec![("step".into(), t5.clone())], "not [3]"),
        (
            vec![("step".into(), digits([1.0, 16_777_216.0, 0.0]))],
            "not a step count",
        ),
        (
            vec![("step".into(), digits([1.0, 0.0, 65_536.0]))],
            "not a step count",
        ),
        (
            vec![("step".into(), digits([1.0, f32::NAN, 0.0]))],
            "not a step count",
        ),
        (
            vec![("step".into(), step(16_777_218.0))],
            "not a step count",
        ),
        (
            vec![
                ("step".into(), step(1.0)),
                ("exp_avg.0".into(), t5.clone()),
                ("exp_avg_sq.0".into(), with(3, -1e-30)),
            ],
            "\"exp_avg_sq.0\" holds -0.00000",
        ),
        (
            vec![
                ("step".into(), step(1.0)),
                ("exp_avg.0".into(), t5.clone()),
                ("exp_avg_sq.0".into(), with(1, f32::NAN)),
            ],
            "element 1",
        ),
        (
            vec![
                ("step".into(), step(1.0)),
                ("exp_avg.0".into(), with(4, f32::INFINITY)),
                ("exp_avg_sq.0".into(), t5.clone()),
            ],
            "\"exp_avg.0\" holds inf at element 4",
        ),
        (
            vec![("step".into(), step(1.0)), ("exp_avg.1".into(), t5.clone())],
            "unknown entry \"exp_avg.1\"",
        ),
        (
            vec![
                ("step".into(), step(1.0)),
                ("momentum_buffer.0".into(), t5.clone()),
            ],
            "unknown entry",
        ),
        (
            vec![("step".into(), step(1.0)), ("step".into(), step(1.0))],
            "duplicate",
        ),
    ];
    for (state, needle) in cases {
        let e = opt.load_state_dict(&ctx, &state).unwrap_err();
        assert!(matches!(e, Error::StateDict { .. }), "{e:?}");
        assert!(
            e.to_string().contains(needle),
            "{e} should mention {needle}"
        );
        let now: Vec<(String, Vec<f32>)> = opt
            .state_dict()
            .iter()
            .map(|(n, t)| (n.clone(), t.to_vec()))
            .collect();
        assert_eq!(now, before, "a rejected state changed the optimizer");
    }
    // SGD without momentum keeps no buffers.
    let mut sgd = Sgd::new(vec![param(&ctx)], 0.1).unwrap();
    let e = sgd
        .load_state_dict(
            &ctx,
            &[("step".into(), step(1.0)), ("momentum_buffer.0".into(), t5)],
        )
        .unwrap_err();
    assert!(e.to_string().contains("unexpected"), "{e}");
    // An empty state resets.
    opt.load_state_dict(&ctx, &[]).unwrap();
    assert!(opt.state_dict().is_empty());
}

#[test]
fn bad_hyperparameters_are_errors() {
    let ctx = ExecContext::new();
    let bad = |r: fucina::Result<()>| matches!(r, Err(Error::InvalidArgument { .. }));
    assert!(bad(Sgd::new(vec![param(&ctx)], -0.1).map(drop)));
    assert!(bad(Sgd::new(vec![param(&ctx)], f32::NAN).map(drop)));
    assert!(bad(Sgd::new(
        vec![],
        SgdConfig {
            nesterov: true,
            ..SgdConfig::default()
        }
    )
    .map(drop)));
    assert!(bad(Sgd::new(
        vec![],
        SgdConfig {
            momentum: -1.0,
            ..SgdConfig::default()
        }
    )
    .map(drop)));
    assert!(bad(AdamW::new(
        vec![],
        AdamWConfig {
            betas: (1.0, 0.9),
            ..AdamWConfig::default()
        }
    )
    .map(drop)));
    assert!(bad(Adam::new(
        vec![],
        AdamConfig {
            eps: -1.0,
            ..AdamConfig::default()
        }
    )
    .map(drop)));
    assert!(bad(AdamW::new(
        vec![],
        AdamWConfig {
            weight_decay: f32::INFINITY,
            ..AdamWConfig::default()
        }
    )
    .map(drop)));
    assert!(bad(clip_grad_norm(&ctx, &[], 0.0).map(drop)));
    assert!(bad(WarmupCosine::new(1.0, 2.0, 0, 10).map(drop)));
    assert!(bad(WarmupCosine::new(1.0, 0.0, 11, 10).map(drop)));
}

#[test]
fn clip_grad_norm_scales_to_the_max_norm() {
    let ctx = ExecContext::new();
    let a = Parameter::from_slice(&ctx, &[1], &[1.0]).unwrap();
    let b = Parameter::from_slice(&ctx, &[1], &[1.0]).unwrap();
    let unused = Parameter::from_slice(&ctx, &[1], &[1.0]).unwrap();
    let ca = Tensor::from_slice(&ctx, &[1], &[3.0]).unwrap();
    let cb = Tensor::from_slice(&ctx, &[1], &[4.0]).unwrap();
    let loss = a
        .tensor()
        .mul(&ctx, &ca)
        .unwrap()
        .add(&ctx, &b.tensor().mul(&ctx, &cb).unwrap())
        .unwrap();
    loss.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    let params = [a.clone(), b.clone(), unused.clone()];
    // Under the limit: unchanged.
    assert_eq!(clip_grad_norm(&ctx, &params, 10.0).unwrap(), 5.0);
    assert_eq!(a.grad(&ctx).unwrap().unwrap().to_vec(), [3.0]);
    // Over it: scaled to norm 1.
    assert_eq!(clip_grad_norm(&ctx, &params, 1.0).unwrap(), 5.0);
    let (ga, gb) = (
        a.grad(&ctx).unwrap().unwrap().item().unwrap(),
        b.grad(&ctx).unwrap().unwrap().item().unwrap(),
    );
    assert!(
        (ga - 0.6).abs() < 1e-6 && (gb - 0.8).abs() < 1e-6,
        "{ga} {gb}"
    );
    assert!(unused.grad_view().is_none());
    // The next backward accumulates onto the clipped gradient.
    a.tensor()
        .mul(&ctx, &ca)
        .unwrap()
        .sum_all(&ctx)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    assert!((a.grad(&ctx).unwrap().unwrap().item().unwrap() - 3.6).abs() < 1e-6);
}

#[test]
fn warmup_cosine_schedule() {
    let s = WarmupCosine::new(0.1, 0.01, 5, 25).unwrap();
    assert!((s.lr(0) - 0.02).abs() < 1e-7);
    assert!((s.lr(4) - 0.1).abs() < 1e-7);
    assert!((s.lr(5) - 0.1).abs() < 1e-7);
    assert!((s.lr(15) - 0.055).abs() < 1e-7);
    assert!((s.lr(25) - 0.01).abs() < 1e-7);
    assert!((s.lr(1000) - 0.01).abs() < 1e-7);
    let lrs: Vec<f32> = (5..26).map(|i| s.lr(i)).collect();
    assert!(lrs.windows(2).all(|w| w[1] <= w[0]));
    // With the optimizer.
    let ctx = ExecContext::new();
    let mut opt = Sgd::new(vec![param(&ctx)], 1.0).unwrap();
    opt.set_lr(s.lr(0)).unwrap();
    assert_eq!(opt.lr(), s.lr(0));
}

#[test]
fn the_step_count_is_exact_past_two_to_the_24() {
    let ctx = ExecContext::new();
    for start in [16_777_215u64, (1 << 40) + 12_345, u64::MAX - 2] {
        let p = param(&ctx);
        let mut opt = AdamW::new(vec![p.clone()], AdamWConfig::default()).unwrap();
        run(&ctx, &mut opt, 1);
        // The state of an optimizer `start` steps in: the digits of `start`.
        let mut state = opt.state_dict();
        let d = [0, 1, 2].map(|k| ((start >> (24 * k)) % (1 << 24)) as f32);
        *state.get_mut("step").unwrap() = Tensor::from_slice(&ctx, &[3], &d).unwrap();
        opt.load_state_dict(&ctx, &state).unwrap();
        assert_eq!(opt.step_count(), start);
        for k in 1..=2 {
            backward(&ctx, &p);
            opt.step(&ctx).unwrap();
            opt.zero_grad();
            assert_eq!(opt.step_count(), start + k);
            // It survives its own state dict, through a checkpoint, exactly.
            let saved = opt.state_dict();
            let named: Vec<(&str, &Tensor)> = saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let bytes = fucina::checkpoint::save_to_bytes(&named, &[]).unwrap();
            let (back, _) = fucina::checkpoint::read_from_bytes(&ctx, &bytes).unwrap();
            let mut opt2 = AdamW::new(vec![param(&ctx)], AdamWConfig::default()).unwrap();
            opt2.load_state_dict(&ctx, &back).unwrap();
            assert_eq!(opt2.step_count(), start + k);
        }
    }
    // Past u64::MAX: an error, not a wrap.
    let p = param(&ctx);
    let mut opt = Sgd::new(vec![p.clone()], 0.1).unwrap();
    let max = [0, 1, 2].map(|k| ((u64::MAX >> (24 * k)) % (1 << 24)) as f32);
    opt.load_state_dict(
        &ctx,
        &[("step".into(), Tensor::from_slice(&ctx, &[3], &max).unwrap())],
    )
    .unwrap();
    backward(&ctx, &p);
    assert!(matches!(opt.step(&ctx), Err(Error::InvalidArgument { .. })));
    assert_eq!(opt.step_count(), u64::MAX);
}

#[test]
fn an_old_format_step_is_still_read() {
    // Earlier versions stored "step" as one f32.
    let ctx = ExecContext::new();
    let p = param(&ctx);
    let mut opt = AdamW::new(vec![p.clone()], AdamWConfig::default()).unwrap();
    run(&ctx, &mut opt, 2);
    let mut state = opt.state_dict();
    *state.get_mut("step").unwrap() = Tensor::from_slice(&ctx, &[1], &[16_777_216.0]).unwrap();
    // Through a checkpoint file of the old format.
    let named: Vec<(&str, &Tensor)> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let bytes = fucina::checkpoint::save_to_bytes(&named, &[]).unwrap();
    let (state, _) = fucina::checkpoint::read_from_bytes(&ctx, &bytes).unwrap();
    assert_eq!(
        state.iter().find(|(n, _)| n == "step").unwrap().1.shape(),
        [1]
    );
    opt.load_state_dict(&ctx, &state).unwrap();
    assert_eq!(opt.step_count(), 16_777_216);
    backward(&ctx, &p);
    opt.step(&ctx).unwrap();
    assert_eq!(opt.step_count(), 16_777_217);
    assert_eq!(opt.state_dict()[0].1.to_vec(), [1.0, 1.0, 0.0]);
}

#[test]
fn set_lr_refuses_what_the_constructors_refuse() {
    let ctx = ExecContext::new();
    let mut opts: Vec<Box<dyn Optimizer>> = vec![
        Box::new(Sgd::new(vec![param(&ctx)], 0.1).unwrap()),
        Box::new(Adam::new(vec![param(&ctx)], AdamConfig::default()).unwrap()),
        Box::new(AdamW::new(vec![param(&ctx)], AdamWConfig::default()).unwrap()),
    ];
    for opt in &mut opts {
        let lr = opt.lr();
        for bad in [f32::NAN, -1.0, f32::INFINITY, -0.0001] {
            let e = opt.set_lr(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            assert!(e.to_string().contains("lr"), "{e}");
            assert_eq!(opt.lr(), lr);
        }
        opt.set_lr(0.0).unwrap();
        assert_eq!(opt.lr(), 0.0);
    }
}

#[test]
fn a_parameter_listed_twice_is_refused() {
    let ctx = ExecContext::new();
    let (p, q) = (param(&ctx), param(&ctx));
    let twice = || vec![p.clone(), q.clone(), p.clone()];
    let errs = [
        Sgd::new(twice(), 0.1).map(|_| ()).unwrap_err(),
        Adam::new(twice(), AdamConfig::default())
            .map(|_| ())
            .unwrap_err(),
        AdamW::new(twice(), AdamWConfig::default())
            .map(|_| ())
            .unwrap_err(),
        clip_grad_norm(&ctx, &twice(), 1.0).map(|_| ()).unwrap_err(),
    ];
    for e in errs {
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("parameter 2 is the same parameter as parameter 0"),
            "{e}"
        );
    }
    // The gradient was not scaled by the refused clip.
    backward(&ctx, &p);
    let g = p.grad(&ctx).unwrap().unwrap().to_vec();
    assert!(clip_grad_norm(&ctx, &twice(), 1e-3).is_err());
    assert_eq!(p.grad(&ctx).unwrap().unwrap().to_vec(), g);
    // Listed once each, the same lists are fine, again and again.
    for _ in 0..3 {
        clip_grad_norm(&ctx, &[p.clone(), q.clone()], 1e9).unwrap();
        AdamW::new(vec![p.clone(), q.clone()], AdamWConfig::default()).unwrap();
    }
}

#[test]
fn clipping_scales_in_place_and_keeps_views_and_shared_gradients_apart() {
    let ctx = ExecContext::new();
    let (a, b) = (param(&ctx), param(&ctx));
    // `a + b`: both gradients are the same buffer of ones.
    a.tensor()
        .add(&ctx, &b.tensor())
        .unwrap()
        .sum_all(&ctx)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    let view = a.grad_view().unwrap();
    let total = clip_grad_norm(&ctx, &[a.clone(), b.clone()], 1.0).unwrap();
    assert!((total - 10f32.sqrt()).abs() < 1e-6);
    let coef = 1.0 / (total + 1e-6);
    // Each scaled once (not twice through the shared buffer).
    assert_eq!(a.grad(&ctx).unwrap().unwrap().to_vec(), [coef; 5]);
    assert_eq!(b.grad(&ctx).unwrap().unwrap().to_vec(), [coef; 5]);
    assert_eq!(view.to_vec(), [1.0; 5]); // a view keeps the unclipped values
}

/// A long parameter (past the size at which Adam's update splits over the
/// team, with a ragged last chunk) gets the same bits for every team size, and
/// those of the serial loop.
#[test]
fn adam_updates_of_a_long_parameter_do_not_depend_on_the_team() {
    const N: usize = 100_003;
    let mut got = Vec::new();
    for threads in [1, 2, 3] {
        let ctx = ExecContext::with_threads(threads);
        let w0 = Tensor::uniform(&ctx, &[N], -1.0, 1.0, 1).unwrap();
        let c = Tensor::uniform(&ctx, &[N], -2.0, 2.0, 2).unwrap();
        for decoupled in [true, false] {
            let p = Parameter::new(w0.clone());
            let mut opt: Box<dyn Optimizer> = if decoupled {
                let cfg = AdamWConfig {
                    weight_decay: 0.1,
                    ..AdamWConfig::default()
                };
                Box::new(AdamW::new(vec![p.clone()], cfg).unwrap())
            } else {
                let cfg = AdamConfig {
                    weight_decay: 0.1,
                    ..AdamConfig::default()
                };
                Box::new(Adam::new(vec![p.clone()], cfg).unwrap())
            };
            for _ in 0..3 {
                let w = p.tensor();
                w.mul(&ctx, &w)
                    .unwrap()
                    .mul(&ctx, &c)
                    .unwrap()
                    .sum_all(&ctx)
                    .unwrap()
                    .backward(&ctx)
                    .unwrap();
                opt.step(&ctx).unwrap();
                opt.zero_grad();
            }
            let bits: Vec<u32> = p.tensor().to_vec().iter().map(|v| v.to_bits()).collect();
            got.push((threads, decoupled, bits));
        }
    }
    for (t, d, b) in &got[2..] {
        let (_, _, want) = got.iter().find(|(t0, d0, _)| *t0 == 1 && d0 == d).unwrap();
        assert!(b == want, "{t} threads, decoupled {d}");
    }
}
