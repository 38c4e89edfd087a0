//! The parameter handle end to end: `StateDict`, `Tensor::set_grad`,
//! `checkpoint::save_module` / `load_module` (round trip, all-or-nothing,
//! bit-identical resume) and the optimizer constructor convention.

use std::path::PathBuf;

use fucina::checkpoint;
use fucina::nn::{Forward, Linear, Module, Relu, Sequential, StateDict};
use fucina::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use fucina::{Error, ExecContext, Tensor};

#[path = "../../fucina-autograd/tests/support/square.rs"]
mod square;

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "fucina-state-dict-{}-{name}.safetensors",
        std::process::id()
    ))
}

fn bits(v: Vec<f32>) -> Vec<u32> {
    v.into_iter().map(f32::to_bits).collect()
}

fn model(ctx: &ExecContext, seed: u64) -> Sequential {
    Sequential::new()
        .push_named("fc1", Linear::new(ctx, 4, 8, seed).unwrap())
        .push(Relu)
        .push_named("fc2", Linear::new(ctx, 8, 3, seed + 1).unwrap())
}

fn opt_for(m: &Sequential) -> AdamW {
    AdamW::new(
        m.parameters(),
        AdamWConfig {
            lr: 0.05,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        },
    )
    .unwrap()
}

/// One training step on a batch that depends on the step number.
fn step(ctx: &ExecContext, m: &Sequential, opt: &mut AdamW, k: usize) {
    let xs: Vec<f32> = (0..8)
        .map(|i| ((i * 7 + k * 3) % 11) as f32 * 0.1 - 0.5)
        .collect();
    let x = Tensor::from_slice(ctx, &[2, 4], &xs).unwrap();
    let y = ctx
        .from_slice_typed::<i64>(&[2], &[(k % 3) as i64, ((k + 1) % 3) as i64])
        .unwrap();
    let loss = m.forward(ctx, &x).unwrap().cross_entropy(ctx, &y).unwrap();
    loss.backward(ctx).unwrap();
    opt.step(ctx).unwrap();
    opt.zero_grad();
}

/// The bits of every entry, by name.
type Named = Vec<(String, Vec<u32>)>;

fn all_bits(m: &Sequential, opt: &AdamW) -> (Named, Named) {
    let p = m
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, bits(t.to_vec())))
        .collect();
    let s = opt
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, bits(t.to_vec())))
        .collect();
    (p, s)
}

#[test]
fn save_module_then_load_module_resumes_bit_identically() {
    let ctx = ExecContext::with_threads(1);
    // Uninterrupted: 10 steps.
    let m = model(&ctx, 1);
    let mut opt = opt_for(&m);
    for k in 0..10 {
        step(&ctx, &m, &mut opt, k);
    }
    let want = all_bits(&m, &opt);

    // 5 steps, save, load into a fresh model (other seed) and optimizer, 5 more.
    let path = tmp("resume");
    let a = model(&ctx, 1);
    let mut a_opt = opt_for(&a);
    for k in 0..5 {
        step(&ctx, &a, &mut a_opt, k);
    }
    checkpoint::save_module(&path, &a, Some(&a_opt), &[("epoch", "5")]).unwrap();
    let b = model(&ctx, 42);
    let mut b_opt = opt_for(&b);
    let meta = checkpoint::load_module(&ctx, &path, &b, Some(&mut b_opt)).unwrap();
    assert_eq!(meta.get("epoch"), Some("5"));
    assert_eq!(meta.get(checkpoint::OPTIM_MARKER), Some("1"));
    assert_eq!(all_bits(&b, &b_opt), all_bits(&a, &a_opt), "round trip");
    assert_eq!(b_opt.step_count(), 5);
    for k in 5..10 {
        step(&ctx, &b, &mut b_opt, k);
    }
    assert_eq!(all_bits(&b, &b_opt), want, "resumed run differs");
    std::fs::remove_file(&path).ok();
}

#[test]
fn load_module_is_all_or_nothing() {
    let ctx = ExecContext::with_threads(1);
    let path = tmp("atomic");
    let a = model(&ctx, 1);
    let mut a_opt = opt_for(&a);
    step(&ctx, &a, &mut a_opt, 0);
    // The optimizer state of a different parameter list: only fc1's parameters.
    let fc1_only: Vec<_> = a.parameters().into_iter().take(2).collect();
    let mut other = AdamW::new(fc1_only, 0.1).unwrap();
    a.forward(&ctx, &Tensor::ones(&ctx, &[1, 4]).unwrap())
        .unwrap()
        .sum_all(&ctx)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    other.step(&ctx).unwrap();
    checkpoint::save_module(&path, &a, Some(&other), &[]).unwrap();

    let b = model(&ctx, 42);
    let mut b_opt = opt_for(&b);
    step(&ctx, &b, &mut b_opt, 3);
    let before = all_bits(&b, &b_opt);
    // A model the checkpoint's model part fits, with an optimizer over fc2's
    // parameters only: the saved optimizer part (fc1's) does not fit it, and
    // that is found after the model part was loaded.
    let c = Sequential::new()
        .push_named("fc1", Linear::new(&ctx, 4, 8, 5).unwrap())
        .push(Relu)
        .push_named("fc2", Linear::new(&ctx, 8, 3, 6).unwrap());
    let mut c_opt = AdamW::new(c.parameters().into_iter().skip(2).collect(), 0.1).unwrap();
    // c_opt has 2 parameters of shapes [3, 8] and [3]: "exp_avg.0" of shape
    // [8, 4] does not fit, after the model part was loaded.
    let c_before = all_bits_any(&c, &c_opt);
    let err = checkpoint::load_module(&ctx, &path, &c, Some(&mut c_opt)).unwrap_err();
    assert!(matches!(err, Error::StateDict { .. }), "{err}");
    assert!(err.to_string().contains("exp_avg.0"), "{err}");
    assert_eq!(
        all_bits_any(&c, &c_opt),
        c_before,
        "a failed load changed the model"
    );

    // Without an optimizer saved, asking for one is an error; nothing changes.
    checkpoint::save_module(&path, &a, None, &[]).unwrap();
    let err = checkpoint::load_module(&ctx, &path, &b, Some(&mut b_opt)).unwrap_err();
    assert!(err.to_string().contains("no optimizer state"), "{err}");
    assert_eq!(all_bits(&b, &b_opt), before);
    // Model only: fine.
    checkpoint::load_module(&ctx, &path, &b, None).unwrap();
    assert_eq!(all_bits(&b, &b_opt).0, all_bits(&a, &a_opt).0);

    // A reserved metadata key is refused.
    assert!(
        checkpoint::save_module(&path, &a, Some(&a_opt), &[(checkpoint::OPTIM_MARKER, "x")])
            .is_err()
    );
    std::fs::remove_file(&path).ok();
}

fn all_bits_any(m: &dyn Module, opt: &dyn Optimizer) -> Vec<Vec<u32>> {
    m.state_dict()
        .iter()
        .chain(opt.state_dict().iter())
        .map(|(_, t)| bits(t.to_vec()))
        .collect()
}

#[test]
fn state_dict_refuses_repeated_names_and_splits_by_prefix() {
    let ctx = ExecContext::new();
    let t = Tensor::zeros(&ctx, &[2]).unwrap();
    let mut sd = StateDict::new();
    sd.insert("model.a", t.clone()).unwrap();
    sd.insert("optim.step", t.clone()).unwrap();
    assert!(matches!(
        sd.insert("model.a", t.clone()),
        Err(Error::StateDict { .. })
    ));
    assert!(sd.insert("", t.clone()).is_err());
    assert_eq!(sd.len(), 2);
    let model = sd.strip_prefix("model.");
    assert_eq!(model.names().collect::<Vec<_>>(), ["a"]);
    let mut other = StateDict::new();
    other.insert("optim.step", t.clone()).unwrap();
    assert!(sd.extend(other).is_err());
    assert_eq!(sd.len(), 2);
    assert!(StateDict::from_entries(vec![("x".into(), t.clone()), ("x".into(), t)]).is_err());
}

#[test]
fn state_dict_round_trips_through_a_file() {
    let ctx = ExecContext::new();
    let path = tmp("sd");
    let m = model(&ctx, 3);
    let mut sd = m.state_dict();
    sd.set_metadata("note", "hi");
    checkpoint::save_state_dict(&path, &sd, &[("epoch", "2")]).unwrap();
    let back = checkpoint::read_state_dict(&ctx, &path).unwrap();
    assert_eq!(back.metadata().get("note").map(String::as_str), Some("hi"));
    assert_eq!(back.metadata().get("epoch").map(String::as_str), Some("2"));
    let fresh = model(&ctx, 9);
    fresh.load_state_dict(&back).unwrap();
    assert_eq!(
        fresh
            .state_dict()
            .iter()
            .map(|(_, t)| bits(t.to_vec()))
            .collect::<Vec<_>>(),
        m.state_dict()
            .iter()
            .map(|(_, t)| bits(t.to_vec()))
            .collect::<Vec<_>>()
    );
    std::fs::remove_file(&path).ok();
}

#[test]
fn set_grad_replaces_the_gradient_and_refuses_bad_input() {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.]).unwrap();
    assert!(w.grad(&ctx).unwrap().is_none());
    // A gradient from a backward first: set_grad replaces, not adds.
    square::backward_sum_of_squares(&ctx, &w);
    assert_eq!(w.grad(&ctx).unwrap().unwrap().to_vec(), [2., 4., 6.]);
    let g = Tensor::from_slice(&ctx, &[3], &[0.5, -1., 7.]).unwrap();
    w.set_grad(&ctx, Some(&g)).unwrap();
    assert_eq!(w.grad(&ctx).unwrap().unwrap().to_vec(), [0.5, -1., 7.]);
    // Wrong shape, not a variable: errors, gradient unchanged.
    let bad = Tensor::from_slice(&ctx, &[2], &[1., 1.]).unwrap();
    assert!(w.set_grad(&ctx, Some(&bad)).is_err());
    assert!(g.set_grad(&ctx, Some(&g)).is_err());
    assert_eq!(w.grad(&ctx).unwrap().unwrap().to_vec(), [0.5, -1., 7.]);
    // An optimizer step uses the gradient that was set.
    let p = fucina::nn::Parameter::new(w.clone());
    let mut sgd = Sgd::new(vec![p.clone()], 1.0).unwrap();
    sgd.step(&ctx).unwrap();
    assert_eq!(p.to_vec(), [0.5, 3., -4.]);
    // Under no_grad too (an exchange of gradients often runs there).
    {
        let _guard = fucina::no_grad();
        let twos = Tensor::from_slice(&ctx, &[3], &[2.; 3]).unwrap();
        w.set_grad(&ctx, Some(&twos)).unwrap();
    }
    assert_eq!(w.grad(&ctx).unwrap().unwrap().to_vec(), [2., 2., 2.]);
    // None releases it.
    w.set_grad(&ctx, None).unwrap();
    assert!(w.grad(&ctx).unwrap().is_none());
}

#[test]
fn optimizers_take_a_config_or_a_learning_rate() {
    let ctx = ExecContext::new();
    let fc = Linear::new(&ctx, 2, 2, 1).unwrap();
    let a = Sgd::new(fc.parameters(), 0.25).unwrap();
    assert_eq!(
        a.config(),
        SgdConfig {
            lr: 0.25,
            ..SgdConfig::default()
        }
    );
    let b = Sgd::new(
        fc.parameters(),
        SgdConfig {
            lr: 0.5,
            momentum: 0.9,
            ..SgdConfig::default()
        },
    )
    .unwrap();
    assert_eq!(b.config().momentum, 0.9);
    let c = AdamW::new(fc.parameters(), 0.01).unwrap();
    assert_eq!(
        c.config(),
        AdamWConfig {
            lr: 0.01,
            ..AdamWConfig::default()
        }
    );
    #[allow(deprecated)]
    let d = Sgd::with_config(fc.parameters(), SgdConfig::from(0.3)).unwrap();
    assert_eq!(d.lr(), 0.3);
    assert!(Sgd::new(fc.parameters(), -1.0).is_err());
}
