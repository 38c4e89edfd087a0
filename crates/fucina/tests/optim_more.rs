//! `RmsProp`, `Adagrad` and `Lion` against reference trajectories (PyTorch's
//! `torch.optim.RMSprop` and `Adagrad` in float64, the Lion paper's update in
//! float64: `fixtures/optim_more.py`), their state through `state_dict` and a
//! `save_module`/`load_module` checkpoint (the same bits as an uninterrupted
//! run), validation of loaded state, bad hyperparameters, groups, and no heap
//! allocation per step after the first.

use fucina::checkpoint;
use fucina::nn::{Module, Parameter};
use fucina::optim::{
    Adagrad, AdagradConfig, Lion, LionConfig, Optimizer, ParamGroup, RmsProp, RmsPropConfig,
};
use fucina::{Error, ExecContext, Tensor};

include!("fixtures/optim_reference.rs");

const W0: [f32; 5] = [0.5, -1.25, 2.0, 0.0, -0.3];
const C0: [f32; 5] = [1.0, 0.5, -0.4, 3.0, 0.25];
const D0: [f32; 5] = [0.1, -0.2, 0.3, 0.7, -0.05];
const W1: [f32; 6] = [0.2, -0.7, 1.1, -0.4, 0.9, 0.05];
const C1: [f32; 6] = [0.3, 1.2, 0.6, 2.0, 0.1, 0.8];
const D1: [f32; 6] = [-0.3, 0.15, 0.2, 0.05, -0.6, 0.4];
const STEPS: usize = 6;

fn params(ctx: &ExecContext) -> Vec<Parameter> {
    vec![
        Parameter::from_slice(ctx, &[5], &W0).unwrap(),
        Parameter::from_slice(ctx, &[2, 3], &W1).unwrap(),
    ]
}

/// Backward of `sum(c * w * w + d * w)` over the parameters (gradient
/// `2 c w + d`; the coefficients of the first parameter for a 5-element one,
/// of the second otherwise).
fn backward(ctx: &ExecContext, ps: &[Parameter]) {
    for p in ps {
        let s = p.shape();
        let (c, d) = if s.as_slice() == [5] {
            (&C0[..], &D0[..])
        } else {
            (&C1[..], &D1[..])
        };
        let c = Tensor::from_slice(ctx, s.as_slice(), c).unwrap();
        let d = Tensor::from_slice(ctx, s.as_slice(), d).unwrap();
        let w = p.tensor();
        let loss = w.mul(ctx, &w).unwrap().mul(ctx, &c).unwrap();
        let loss = loss.add(ctx, &w.mul(ctx, &d).unwrap()).unwrap();
        loss.sum_all(ctx).unwrap().backward(ctx).unwrap();
    }
}

/// `steps` steps; the parameters' values after each, flattened.
fn run(ctx: &ExecContext, opt: &mut dyn Optimizer, steps: usize) -> Vec<f32> {
    let ps = opt.parameters().to_vec();
    let mut out = Vec::new();
    for _ in 0..steps {
        backward(ctx, &ps);
        opt.step(ctx).unwrap();
        opt.zero_grad();
        for p in &ps {
            out.extend(p.to_vec());
        }
    }
    out
}

type Make = Box<dyn Fn(Vec<Parameter>) -> Box<dyn Optimizer>>;

fn rmsprop(cfg: RmsPropConfig) -> Make {
    Box::new(move |p| Box::new(RmsProp::new(p, cfg).unwrap()))
}
fn adagrad(cfg: AdagradConfig) -> Make {
    Box::new(move |p| Box::new(Adagrad::new(p, cfg).unwrap()))
}
fn lion(cfg: LionConfig) -> Make {
    Box::new(move |p| Box::new(Lion::new(p, cfg).unwrap()))
}

/// Every configuration with its reference trajectory.
fn cases() -> Vec<(&'static str, Make, &'static [f64])> {
    vec![
        (
            "rmsprop default",
            rmsprop(RmsPropConfig::default()),
            RMSPROP_DEFAULT,
        ),
        (
            "rmsprop momentum",
            rmsprop(RmsPropConfig {
                lr: 0.01,
                alpha: 0.9,
                momentum: 0.9,
                ..RmsPropConfig::default()
            }),
            RMSPROP_MOMENTUM,
        ),
        (
            "rmsprop centered",
            rmsprop(RmsPropConfig {
                centered: true,
                ..RmsPropConfig::default()
            }),
            RMSPROP_CENTERED,
        ),
        (
            "rmsprop all",
            rmsprop(RmsPropConfig {
                lr: 0.02,
                alpha: 0.95,
                eps: 1e-6,
                weight_decay: 0.1,
                momentum: 0.5,
                centered: true,
            }),
            RMSPROP_ALL,
        ),
        (
            "adagrad default",
            adagrad(AdagradConfig::from(0.1)),
            ADAGRAD_DEFAULT,
        ),
        (
            "adagrad all",
            adagrad(AdagradConfig {
                lr: 0.1,
                lr_decay: 0.05,
                weight_decay: 0.1,
                initial_accumulator_value: 0.5,
                eps: 1e-8,
            }),
            ADAGRAD_ALL,
        ),
        ("lion default", lion(LionConfig::from(0.01)), LION_DEFAULT),
        (
            "lion all",
            lion(LionConfig {
                lr: 0.02,
                betas: (0.8, 0.95),
                weight_decay: 0.5,
            }),
            LION_ALL,
        ),
    ]
}

#[test]
fn trajectories_match_the_references() {
    let ctx = ExecContext::new();
    for (name, make, want) in cases() {
        let mut opt = make(params(&ctx));
        let got = run(&ctx, &mut *opt, STEPS);
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let tol = 2e-6 * (1.0 + w.abs());
            assert!(
                (f64::from(g) - w).abs() <= tol,
                "{name}: step {} value {}: {g} vs {w}",
                i / 11,
                i % 11
            );
        }
        assert_eq!(opt.step_count(), STEPS as u64);
    }
}

#[test]
fn state_names_are_pytorchs() {
    let ctx = ExecContext::new();
    let names = |make: Make| {
        let mut opt = make(params(&ctx));
        run(&ctx, &mut *opt, 1);
        opt.state_dict()
            .into_iter()
            .map(|(n, _)| n)
            .collect::<Vec<_>>()
    };
    let all = RmsPropConfig {
        momentum: 0.5,
        centered: true,
        ..RmsPropConfig::default()
    };
    assert_eq!(
        names(rmsprop(all)),
        [
            "step",
            "square_avg.0",
            "square_avg.1",
            "momentum_buffer.0",
            "momentum_buffer.1",
            "grad_avg.0",
            "grad_avg.1"
        ]
    );
    assert_eq!(
        names(rmsprop(RmsPropConfig::default())),
        ["step", "square_avg.0", "square_avg.1"]
    );
    assert_eq!(
        names(adagrad(AdagradConfig::default())),
        ["step", "sum.0", "sum.1"]
    );
    assert_eq!(
        names(lion(LionConfig::default())),
        ["step", "exp_avg.0", "exp_avg.1"]
    );
}

/// Three steps, a checkpoint (the model's parameters and the optimizer's
/// state through `save_module`), three more; then the checkpoint loaded into
/// a fresh model and optimizer runs the same three steps bit for bit.
#[test]
fn a_checkpoint_resumes_with_the_same_bits() {
    #[derive(Module)]
    struct Model {
        a: Parameter,
        b: Parameter,
    }
    let ctx = ExecContext::new();
    let dir = std::env::temp_dir().join(format!("fucina-optim-more-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, make, _) in cases() {
        let ps = params(&ctx);
        let model = Model {
            a: ps[0].clone(),
            b: ps[1].clone(),
        };
        let mut opt = make(ps);
        run(&ctx, &mut *opt, 3);
        let path = dir.join("ckpt.safetensors");
        checkpoint::save_module(&path, &model, Some(&*opt), &[]).unwrap();
        let cont = run(&ctx, &mut *opt, 3);

        let ps2 = vec![
            Parameter::from_slice(&ctx, &[5], &[0.0; 5]).unwrap(),
            Parameter::from_slice(&ctx, &[2, 3], &[0.0; 6]).unwrap(),
        ];
        let model2 = Model {
            a: ps2[0].clone(),
            b: ps2[1].clone(),
        };
        let mut opt2 = make(ps2);
        checkpoint::load_module(&ctx, &path, &model2, Some(&mut *opt2)).unwrap();
        assert_eq!(opt2.step_count(), 3, "{name}");
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(run(&ctx, &mut *opt2, 3)), bits(cont), "{name}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn loaded_state_is_validated_before_anything_changes() {
    let ctx = ExecContext::new();
    let mut opt = Adagrad::new(params(&ctx), 0.1).unwrap();
    run(&ctx, &mut opt, 2);
    let before = opt.state_dict();
    let snapshot = |o: &Adagrad| {
        o.state_dict()
            .into_iter()
            .map(|(n, t)| (n, t.to_vec()))
            .collect::<Vec<_>>()
    };
    let was = snapshot(&opt);
    let mut good: Vec<(String, Tensor)> = before
        .into_iter()
        .map(|(n, t)| (n, Tensor::constant(ctx.clone(t.raw()).unwrap())))
        .collect();
    // A negative sum of squares, a wrong shape, an unknown name.
    let neg = Tensor::from_slice(&ctx, &[5], &[1.0, -1.0, 1.0, 1.0, 1.0]).unwrap();
    let cases: Vec<(usize, (String, Tensor), &str)> = vec![
        (1, ("sum.0".into(), neg), "sum.0"),
        (
            1,
            ("sum.0".into(), Tensor::zeros(&ctx, &[4]).unwrap()),
            "shape",
        ),
        (
            1,
            ("exp_avg.0".into(), Tensor::zeros(&ctx, &[5]).unwrap()),
            "unknown entry",
        ),
    ];
    for (at, entry, what) in cases {
        let saved = std::mem::replace(&mut good[at], entry);
        let e = opt.load_state_dict(&ctx, &good).unwrap_err();
        assert!(
            matches!(e, Error::StateDict { .. }) && e.to_string().contains(what),
            "{e}"
        );
        assert_eq!(snapshot(&opt), was);
        good[at] = saved;
    }
    opt.load_state_dict(&ctx, &good).unwrap();
    assert_eq!(snapshot(&opt), was);
    // RMSprop without momentum refuses a momentum buffer; Lion a NaN momentum.
    let mut r = RmsProp::new(params(&ctx), RmsPropConfig::default()).unwrap();
    run(&ctx, &mut r, 1);
    let mut sd: Vec<(String, Tensor)> = r.state_dict().into_iter().collect();
    sd.push((
        "momentum_buffer.0".into(),
        Tensor::zeros(&ctx, &[5]).unwrap(),
    ));
    assert!(r.load_state_dict(&ctx, &sd).is_err());
    let mut l = Lion::new(params(&ctx), 0.01).unwrap();
    run(&ctx, &mut l, 1);
    let mut sd: Vec<(String, Tensor)> = l.state_dict().into_iter().collect();
    sd[1].1 = Tensor::from_slice(&ctx, &[5], &[f32::NAN; 5]).unwrap();
    assert!(l.load_state_dict(&ctx, &sd).is_err());
}

#[test]
fn bad_hyperparameters_are_errors() {
    let ctx = ExecContext::new();
    let bad = |r: Result<(), Error>| matches!(r, Err(Error::InvalidArgument { .. }));
    let p = || params(&ctx);
    assert!(bad(RmsProp::new(p(), -1.0).map(drop)));
    for cfg in [
        RmsPropConfig {
            alpha: 1.5,
            ..RmsPropConfig::default()
        },
        RmsPropConfig {
            eps: f32::NAN,
            ..RmsPropConfig::default()
        },
        RmsPropConfig {
            momentum: -0.1,
            ..RmsPropConfig::default()
        },
        RmsPropConfig {
            weight_decay: f32::INFINITY,
            ..RmsPropConfig::default()
        },
    ] {
        assert!(bad(RmsProp::new(p(), cfg).map(drop)), "{cfg:?}");
    }
    for cfg in [
        AdagradConfig {
            lr_decay: -1.0,
            ..AdagradConfig::default()
        },
        AdagradConfig {
            initial_accumulator_value: -0.5,
            ..AdagradConfig::default()
        },
        AdagradConfig {
            eps: -1e-10,
            ..AdagradConfig::default()
        },
    ] {
        assert!(bad(Adagrad::new(p(), cfg).map(drop)), "{cfg:?}");
    }
    for cfg in [
        LionConfig {
            betas: (1.1, 0.9),
            ..LionConfig::default()
        },
        LionConfig {
            betas: (0.9, -0.1),
            ..LionConfig::default()
        },
        LionConfig {
            weight_decay: f32::NAN,
            ..LionConfig::default()
        },
    ] {
        assert!(bad(Lion::new(p(), cfg).map(drop)), "{cfg:?}");
    }
    // A parameter listed twice; set_lr refuses a bad rate.
    let q = p();
    assert!(bad(
        Lion::new(vec![q[0].clone(), q[0].clone()], 0.1).map(drop)
    ));
    let mut r = RmsProp::new(p(), 0.1).unwrap();
    assert!(bad(r.set_lr(f32::NAN)));
    assert_eq!(r.lr(), 0.1);
    r.set_lr(0.05).unwrap();
    assert_eq!(r.config().lr, 0.05);
}

#[test]
fn groups_give_each_their_weight_decay() {
    let ctx = ExecContext::new();
    // Group decays [0.1, 0]: the same as one optimizer per parameter.
    type Grouped = Box<dyn Fn(Vec<ParamGroup>) -> Box<dyn Optimizer>>;
    let makers: Vec<(&str, Grouped, Make, Make)> = vec![
        (
            "rmsprop",
            Box::new(|g| Box::new(RmsProp::with_groups(g, 0.01).unwrap())),
            rmsprop(RmsPropConfig {
                weight_decay: 0.1,
                ..RmsPropConfig::default()
            }),
            rmsprop(RmsPropConfig::default()),
        ),
        (
            "adagrad",
            Box::new(|g| Box::new(Adagrad::with_groups(g, 0.1).unwrap())),
            adagrad(AdagradConfig {
                weight_decay: 0.1,
                ..AdagradConfig::from(0.1)
            }),
            adagrad(AdagradConfig::from(0.1)),
        ),
        (
            "lion",
            Box::new(|g| Box::new(Lion::with_groups(g, 0.01).unwrap())),
            lion(LionConfig {
                weight_decay: 0.1,
                ..LionConfig::from(0.01)
            }),
            lion(LionConfig::from(0.01)),
        ),
    ];
    for (name, grouped, first, second) in makers {
        let ps = params(&ctx);
        let groups = vec![
            ParamGroup::new(vec![ps[0].clone()]).with_weight_decay(0.1),
            ParamGroup::new(vec![ps[1].clone()]).with_weight_decay(0.0),
        ];
        let mut g = grouped(groups);
        let got = run(&ctx, &mut *g, 3);
        let (ps_a, ps_b) = (params(&ctx), params(&ctx));
        let mut a = first(vec![ps_a[0].clone()]);
        let mut b = second(vec![ps_b[1].clone()]);
        let (ra, rb) = (run(&ctx, &mut *a, 3), run(&ctx, &mut *b, 3));
        let want: Vec<f32> = (0..3)
            .flat_map(|s| {
                ra[s * 5..(s + 1) * 5]
                    .iter()
                    .chain(&rb[s * 6..(s + 1) * 6])
                    .copied()
            })
            .collect();
        assert_eq!(got, want, "{name}");
        let names: Vec<String> = g.state_dict().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"group_weight_decay".to_string()), "{name}");
    }
}

#[test]
fn parameters_without_gradients_are_skipped() {
    let ctx = ExecContext::new();
    for (name, make, _) in cases() {
        let ps = params(&ctx);
        let mut opt = make(ps.clone());
        backward(&ctx, &ps[..1]);
        opt.step(&ctx).unwrap();
        assert_eq!(ps[1].to_vec(), W1, "{name}");
        assert_ne!(ps[0].to_vec(), W0, "{name}");
        let names: Vec<String> = opt.state_dict().into_iter().map(|(n, _)| n).collect();
        assert!(
            names.iter().all(|n| !n.ends_with(".1")),
            "{name}: {names:?}"
        );
    }
}
