//! Layers: initialization, parameter names and sharing, shape errors, dropout
//! determinism, causal attention, group norm's defaults and state dict.

use fucina::nn::{
    Block, CausalSelfAttention, Dropout, Embedding, Forward, GroupNorm, LayerNorm, Linear, Module,
    Parameter, Relu, RmsNorm, Sequential, sub_seed,
};
use fucina::prelude::GroupNormOptions;
use fucina::{Error, ExecContext, Tensor};

fn ramp(ctx: &ExecContext, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
    Tensor::from_slice(ctx, shape, &v).unwrap()
}

#[test]
fn linear_init_is_pytorch_default_from_the_seed() {
    let ctx = ExecContext::new();
    let l = Linear::new(&ctx, 5, 3, 42).unwrap();
    assert_eq!(l.weight.shape().as_slice(), [3, 5]);
    let bias = l.bias.as_ref().unwrap();
    assert_eq!(bias.shape().as_slice(), [3]);
    let bound = (1.0f64 / 5.0).sqrt() as f32;
    let mut w = [0.0f32; 15];
    fucina::rng::uniform_fill(42, &mut w, -bound, bound);
    assert_eq!(l.weight.to_vec(), w);
    let mut b = [0.0f32; 3];
    fucina::rng::uniform_fill(sub_seed(42, 1), &mut b, -bound, bound);
    assert_eq!(bias.to_vec(), b);
    // Same seed, same layer; another seed, another layer.
    assert_eq!(Linear::new(&ctx, 5, 3, 42).unwrap().weight.to_vec(), w);
    assert_ne!(Linear::new(&ctx, 5, 3, 43).unwrap().weight.to_vec(), w);
    assert!(w.iter().all(|x| x.abs() < bound));
}

#[test]
fn linear_forward_matches_x_wt_plus_b() {
    let ctx = ExecContext::new();
    let l = Linear::new(&ctx, 3, 2, 1).unwrap();
    let x = ramp(&ctx, &[4, 3]);
    let y = l.forward(&ctx, &x).unwrap().to_vec();
    let (w, b, xv) = (
        l.weight.to_vec(),
        l.bias.as_ref().unwrap().to_vec(),
        x.to_vec(),
    );
    for r in 0..4 {
        for o in 0..2 {
            let want: f32 = (0..3).map(|i| xv[r * 3 + i] * w[o * 3 + i]).sum::<f32>() + b[o];
            assert!((y[r * 2 + o] - want).abs() < 1e-5);
        }
    }
}

fn assert_shape_err(r: fucina::Result<Tensor>, layer: &str) {
    match r {
        Err(Error::ShapeMismatch { layer: l, .. }) => assert!(l.starts_with(layer), "{l}"),
        other => panic!("expected a shape error from {layer}, got {other:?}"),
    }
}

#[test]
fn shape_mismatches_are_errors_naming_the_layer() {
    let ctx = ExecContext::new();
    let x = ramp(&ctx, &[2, 5]);
    assert_shape_err(
        Linear::new(&ctx, 4, 3, 0).unwrap().forward(&ctx, &x),
        "Linear",
    );
    assert_shape_err(
        LayerNorm::new(&ctx, 4, 1e-5).unwrap().forward(&ctx, &x),
        "LayerNorm",
    );
    assert_shape_err(
        RmsNorm::new(&ctx, 4, 1e-5).unwrap().forward(&ctx, &x),
        "RmsNorm",
    );
    let attn = CausalSelfAttention::new(&ctx, 4, 2, 0).unwrap();
    assert_shape_err(
        attn.forward(&ctx, &ramp(&ctx, &[2, 4])),
        "CausalSelfAttention",
    ); // rank 2
    assert_shape_err(
        attn.forward(&ctx, &ramp(&ctx, &[1, 3, 5])),
        "CausalSelfAttention",
    );
    let block = Block::new(&ctx, 4, 2, 0.0, 0).unwrap();
    assert_shape_err(block.forward(&ctx, &ramp(&ctx, &[1, 3, 5])), "LayerNorm");
    // A chain whose second layer does not fit the first.
    let seq = Sequential::new()
        .push(Linear::new(&ctx, 5, 8, 0).unwrap())
        .push(Relu)
        .push(Linear::new(&ctx, 7, 2, 0).unwrap());
    assert_shape_err(seq.forward(&ctx, &x), "Linear(in = 7");
    // Embedding: an id out of range is an error, not a panic.
    let emb = Embedding::new(&ctx, 10, 4, 0).unwrap();
    let ids = ctx.from_slice_typed::<i64>(&[3], &[1, 10, 2]).unwrap();
    assert!(emb.forward(&ctx, &ids).is_err());
    let ids = ctx
        .from_slice_typed::<i64>(&[2, 3], &[1, 9, 2, 0, 0, 3])
        .unwrap();
    assert_eq!(emb.forward(&ctx, &ids).unwrap().shape(), [2, 3, 4]);
}

#[test]
fn bad_constructor_arguments_are_errors() {
    let ctx = ExecContext::new();
    let invalid = |r: fucina::Result<()>| matches!(r, Err(Error::InvalidArgument { .. }));
    assert!(invalid(Linear::new(&ctx, 0, 3, 0).map(drop)));
    assert!(invalid(Linear::new(&ctx, 3, 0, 0).map(drop)));
    assert!(invalid(Embedding::new(&ctx, 0, 3, 0).map(drop)));
    assert!(invalid(LayerNorm::new(&ctx, 3, -1.0).map(drop)));
    // A non-finite eps is refused up front, not by every forward.
    for eps in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        assert!(invalid(LayerNorm::new(&ctx, 3, eps).map(drop)), "{eps}");
        assert!(invalid(RmsNorm::new(&ctx, 3, eps).map(drop)), "{eps}");
    }
    assert!(invalid(RmsNorm::new(&ctx, 0, 1e-5).map(drop)));
    assert!(invalid(Dropout::new(1.0, 0).map(drop)));
    assert!(invalid(Dropout::new(-0.1, 0).map(drop)));
    assert!(invalid(CausalSelfAttention::new(&ctx, 6, 4, 0).map(drop)));
    let e = Linear::new(&ctx, 0, 3, 0).unwrap_err().to_string();
    assert!(e.contains("in_features"), "{e}");
}

#[test]
fn parameter_clones_are_the_same_parameter() {
    let ctx = ExecContext::new();
    let l = Linear::new(&ctx, 2, 2, 3).unwrap();
    let params = l.parameters();
    assert!(params[0].ptr_eq(&l.weight));
    params[0].update_(|w| w.fill(1.0)).unwrap();
    assert_eq!(l.weight.to_vec(), [1.0; 4]);
    // Gradients recorded through the layer are visible through the handle.
    let x = Tensor::from_slice(&ctx, &[1, 2], &[2.0, 3.0]).unwrap();
    l.forward(&ctx, &x)
        .unwrap()
        .sum_all(&ctx)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    assert_eq!(
        params[0].grad(&ctx).unwrap().unwrap().to_vec(),
        [2., 3., 2., 3.]
    );
    assert_eq!(params[1].grad(&ctx).unwrap().unwrap().to_vec(), [1., 1.]);
    l.zero_grad();
    assert!(params[0].grad_view().is_none());
    // copy_from_slice checks the length.
    assert!(params[1].copy_from_slice(&[1.0, 2.0, 3.0]).is_err());
    params[1].copy_from_slice(&[5.0, 6.0]).unwrap();
    assert_eq!(l.bias.as_ref().unwrap().to_vec(), [5.0, 6.0]);
}

#[test]
fn an_update_after_forward_keeps_the_graphs_saved_values() {
    let ctx = ExecContext::new();
    let p = Parameter::from_slice(&ctx, &[2], &[1.0, 2.0]).unwrap();
    let x = Tensor::variable_from_slice(&ctx, &[2], &[3.0, 4.0]).unwrap();
    let loss = x.mul(&ctx, &p.tensor()).unwrap().sum_all(&ctx).unwrap();
    p.update_(|w| w.fill(100.0)).unwrap(); // copy-on-write: the graph saved [1, 2]
    loss.backward(&ctx).unwrap();
    assert_eq!(x.grad(&ctx).unwrap().unwrap().to_vec(), [1.0, 2.0]);
    assert_eq!(p.to_vec(), [100.0, 100.0]);
}

#[test]
fn named_parameters_are_stable_dotted_names() {
    let ctx = ExecContext::new();
    let block = Block::new(&ctx, 8, 2, 0.1, 5).unwrap();
    let names: Vec<String> = block
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "ln1.weight",
            "ln1.bias",
            "attn.qkv.weight",
            "attn.qkv.bias",
            "attn.proj.weight",
            "attn.proj.bias",
            "ln2.weight",
            "ln2.bias",
            "mlp.fc.weight",
            "mlp.fc.bias",
            "mlp.proj.weight",
            "mlp.proj.bias",
        ]
    );
    assert_eq!(
        block.num_parameters(),
        2 * 16 + 8 * 24 + 24 + 64 + 8 + 8 * 32 + 32 + 32 * 8 + 8
    );
    let seq = Sequential::new()
        .push_named("fc1", Linear::new(&ctx, 2, 3, 0).unwrap())
        .push(Relu)
        .push_named("fc2", Linear::new(&ctx, 3, 1, 0).unwrap());
    let names: Vec<String> = seq.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
}

#[test]
fn dropout_masks_regenerate_from_seed_and_step() {
    let ctx = ExecContext::new();
    let x = Tensor::ones(&ctx, &[256]).unwrap();
    let d = Dropout::new(0.5, 9).unwrap();
    let a = d.forward(&ctx, &x).unwrap().to_vec();
    let b = d.forward(&ctx, &x).unwrap().to_vec();
    assert_ne!(a, b, "each call draws a new mask");
    assert!(a.iter().all(|&v| v == 0.0 || v == 2.0));
    assert!(a.iter().filter(|&&v| v == 0.0).count() > 64);
    assert_eq!(d.step(), 2);
    // A fresh layer resumed at step 1 draws the second mask again.
    let resumed = Dropout::new(0.5, 9).unwrap();
    resumed.set_step(1);
    assert_eq!(resumed.forward(&ctx, &x).unwrap().to_vec(), b);
    // Evaluation mode passes through and does not advance.
    let mut m = resumed.clone();
    m.eval();
    assert_eq!(m.forward(&ctx, &x).unwrap().to_vec(), [1.0; 256]);
    assert_eq!(m.step(), 2);
}

#[test]
fn attention_is_causal_and_differentiable() {
    let ctx = ExecContext::new();
    let attn = CausalSelfAttention::new(&ctx, 8, 2, 11).unwrap();
    let x1 = ramp(&ctx, &[2, 5, 8]);
    // Change only the last position.
    let mut v = x1.to_vec();
    for b in 0..2 {
        for k in 0..8 {
            v[b * 40 + 4 * 8 + k] += 1.0;
        }
    }
    let x2 = Tensor::from_slice(&ctx, &[2, 5, 8], &v).unwrap();
    let (y1, y2) = (
        attn.forward(&ctx, &x1).unwrap(),
        attn.forward(&ctx, &x2).unwrap(),
    );
    assert_eq!(y1.shape(), [2, 5, 8]);
    let (y1, y2) = (y1.to_vec(), y2.to_vec());
    for b in 0..2 {
        let (s, e) = (b * 40, b * 40 + 32);
        assert_eq!(y1[s..e], y2[s..e], "positions 0..4 do not see position 4");
        assert_ne!(y1[e..e + 8], y2[e..e + 8]);
    }
    // The block trains end to end.
    let block = Block::new(&ctx, 8, 2, 0.0, 3).unwrap();
    let loss = block.forward(&ctx, &x1).unwrap().mean_all(&ctx).unwrap();
    loss.backward(&ctx).unwrap();
    assert!(block.parameters().iter().all(|p| p.grad_view().is_some()));
}

#[test]
fn cross_entropy_labels_out_of_range_are_errors() {
    let ctx = ExecContext::new();
    let l = Linear::new(&ctx, 4, 3, 0).unwrap();
    let logits = l.forward(&ctx, &ramp(&ctx, &[2, 4])).unwrap();
    for bad in [[0i64, 3], [-1, 0]] {
        let labels = ctx.from_slice_typed::<i64>(&[2], &bad).unwrap();
        let e: Error = logits.cross_entropy(&ctx, &labels).unwrap_err().into();
        assert!(e.as_exec().is_some(), "{e:?}");
        assert!(e.to_string().contains("cross_entropy"), "{e}");
    }
    // A label count that does not match the rows.
    let labels = ctx.from_slice_typed::<i64>(&[3], &[0, 1, 2]).unwrap();
    assert!(logits.cross_entropy(&ctx, &labels).is_err());
}

#[test]
fn load_parameters_checks_everything_first() {
    let ctx = ExecContext::new();
    let a = Sequential::new()
        .push_named("fc1", Linear::new(&ctx, 3, 4, 1).unwrap())
        .push(Relu)
        .push_named("fc2", Linear::new(&ctx, 4, 2, 2).unwrap());
    let b = Sequential::new()
        .push_named("fc1", Linear::new(&ctx, 3, 4, 7).unwrap())
        .push(Relu)
        .push_named("fc2", Linear::new(&ctx, 4, 2, 8).unwrap());
    let snap = |m: &Sequential| -> Vec<(String, Tensor)> {
        m.named_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.tensor().detach()))
            .collect()
    };
    let values = |m: &Sequential| -> Vec<Vec<f32>> {
        m.parameters().iter().map(Parameter::to_vec).collect()
    };
    let before = values(&b);
    let good = snap(&a);
    let mut missing = good.clone();
    missing.pop();
    let mut unknown = good.clone();
    unknown[0].0 = "fc3.weight".into();
    let mut misshapen = good.clone();
    misshapen[1].1 = Tensor::zeros(&ctx, &[5]).unwrap();
    let mut duplicate = good.clone();
    duplicate.push(good[0].clone());
    for (bad, needle) in [
        (missing, "missing parameter \"fc2.bias\""),
        (unknown, "unknown parameter \"fc3.weight\""),
        (misshapen, "\"fc1.bias\" has shape [5]"),
        (duplicate, "duplicate parameter \"fc1.weight\""),
    ] {
        let e = b.load_parameters(&bad).unwrap_err();
        assert!(e.to_string().contains(needle), "{e}");
        assert_eq!(values(&b), before, "a rejected list changed the model");
    }
    b.load_parameters(&good).unwrap();
    assert_eq!(values(&b), values(&a));
}

#[test]
fn lower_layer_errors_convert_into_fucina_error() {
    fn io() -> fucina::Result<()> {
        std::fs::read("/nonexistent/fucina")?;
        Ok(())
    }
    assert!(matches!(io(), Err(Error::Io(_))));
    let storage: Error = fucina::storage::Buffer::<f32>::zeroed(usize::MAX / 2)
        .unwrap_err()
        .into();
    assert!(matches!(storage, Error::Storage(_)), "{storage:?}");
    let ctx = ExecContext::new();
    let exec: Error = ctx.zeros(&[0]).unwrap_err().into();
    assert!(matches!(exec, Error::Exec(_)) && exec.as_exec().is_some());
    let autograd: Error = Tensor::zeros(&ctx, &[2])
        .unwrap()
        .backward(&ctx)
        .unwrap_err()
        .into();
    assert!(matches!(autograd, Error::Autograd(_)) && autograd.as_exec().is_none());
    assert!(
        autograd.to_string().contains("no gradient graph"),
        "{autograd}"
    );
}

/// Runs `f` on a thread of its own and waits at most 20 s for it: a deadlock
/// fails the test instead of hanging it.
fn within_timeout<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the call did not return within 20 s (deadlock)")
}

#[test]
fn using_a_parameter_inside_its_own_update_is_an_error_not_a_deadlock() {
    let (read, nested, copy, tensor) = within_timeout(|| {
        let ctx = ExecContext::with_threads(1);
        let p = Parameter::from_slice(&ctx, &[2], &[1.0, 2.0]).unwrap();
        let q = p.clone();
        let read = p.update_(|w| w[0] = q.to_vec()[1]);
        let nested = p.update_(|_| q.update_(|w| w[0] = 9.0));
        let copy = p.update_(|_| q.copy_from_slice(&[7.0, 7.0]));
        let tensor = p.update_(|_| q.tensor().numel());
        // The parameter is usable afterwards (no lock left held).
        p.update_(|w| w[1] = 5.0).unwrap();
        assert_eq!(q.to_vec(), [1.0, 5.0]);
        (read, nested, copy, tensor)
    });
    for r in [read.map(|_| ()), copy.map(|_| ()), tensor.map(|_| ())] {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("Parameter::update_"), "{e}");
    }
    // The inner update is refused; the outer one completes.
    assert!(matches!(nested, Ok(Err(Error::InvalidArgument { .. }))));
}

#[test]
fn other_threads_and_other_parameters_are_unaffected_by_an_update() {
    within_timeout(|| {
        let ctx = ExecContext::with_threads(1);
        let p = Parameter::from_slice(&ctx, &[2], &[1.0, 2.0]).unwrap();
        let o = Parameter::from_slice(&ctx, &[2], &[3.0, 4.0]).unwrap();
        let p2 = p.clone();
        // Another parameter inside the update: fine.
        p.update_(|w| w[0] = o.to_vec()[1]).unwrap();
        assert_eq!(p.to_vec(), [4.0, 2.0]);
        // Another thread reading during an update waits for it, then sees the
        // new values.
        p.update_(|w| {
            let reader = std::thread::spawn(move || p2.to_vec());
            std::thread::sleep(std::time::Duration::from_millis(20));
            w[1] = 8.0;
            reader
        })
        .unwrap()
        .join()
        .map(|v| assert_eq!(v, [4.0, 8.0]))
        .unwrap();
        // A user panic inside an update propagates and leaves no lock held.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.update_(|_| panic!("user panic")).unwrap();
        }));
        assert!(r.is_err());
        assert_eq!(p.to_vec(), [4.0, 8.0]);
    });
}

#[test]
fn a_tensor_read_inside_its_own_update_sees_the_old_values() {
    within_timeout(|| {
        let ctx = ExecContext::with_threads(1);
        let mut t = Tensor::variable_from_slice(&ctx, &[2], &[1.0, 2.0]).unwrap();
        let q = t.clone();
        t.update_(|w| w[0] = q.to_vec()[1] * 10.0).unwrap();
        assert_eq!(t.to_vec(), [20.0, 2.0]);
        assert_eq!(q.to_vec(), [1.0, 2.0]); // copy-on-write: q keeps the old values
    });
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn group_norm_has_pytorch_defaults_and_is_its_op() {
    let ctx = ExecContext::new();
    let gn = GroupNorm::new(&ctx, 3, 6).unwrap();
    assert_eq!((gn.num_groups(), gn.num_channels()), (3, 6));
    assert_eq!(gn.eps(), 1e-5);
    assert!(gn.is_affine());
    let (w, b) = (gn.weight.as_ref().unwrap(), gn.bias.as_ref().unwrap());
    assert_eq!(w.shape().as_slice(), [6]);
    assert_eq!(w.to_vec(), [1.0; 6]);
    assert_eq!(b.to_vec(), [0.0; 6]);
    let names: Vec<String> = gn.state_dict().names().map(String::from).collect();
    assert_eq!(names, ["weight", "bias"]);
    assert_eq!(gn.num_parameters(), 12);

    // The layer is its op, with the parameters as inputs that get gradients.
    w.copy_from_slice(&[0.5, 1.0, 1.5, 2.0, -1.0, 0.25])
        .unwrap();
    b.copy_from_slice(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]).unwrap();
    for shape in [&[2, 6][..], &[2, 6, 5][..], &[2, 6, 3, 4][..]] {
        let x = Tensor::uniform(&ctx, shape, -1.0, 1.0, 5).unwrap();
        let y = gn.forward(&ctx, &x).unwrap();
        let opts = GroupNormOptions::new(3);
        let want = x
            .group_norm(&ctx, Some(&w.tensor()), Some(&b.tensor()), opts)
            .unwrap();
        assert_eq!(bits(&y), bits(&want), "{shape:?}");
        let through_trait = Forward::forward(&gn, &ctx, &x).unwrap();
        assert_eq!(bits(&through_trait), bits(&want));
    }
    let x = Tensor::uniform(&ctx, &[2, 6, 4], -1.0, 1.0, 6).unwrap();
    let loss = gn
        .forward(&ctx, &x)
        .unwrap()
        .mul(&ctx, &x)
        .unwrap()
        .sum_all(&ctx)
        .unwrap();
    loss.backward(&ctx).unwrap();
    assert!(w.grad(&ctx).unwrap().is_some() && b.grad(&ctx).unwrap().is_some());
    gn.zero_grad();

    // A state dict round trip into a fresh layer gives the same outputs.
    let other = GroupNorm::new(&ctx, 3, 6).unwrap();
    other.load_state_dict(&gn.state_dict()).unwrap();
    assert_eq!(
        bits(&other.forward(&ctx, &x).unwrap()),
        bits(&gn.forward(&ctx, &x).unwrap())
    );
}

#[test]
fn group_norm_without_affine_has_no_parameters() {
    let ctx = ExecContext::new();
    let gn = GroupNorm::with_options(&ctx, 2, 4, 1e-3, false).unwrap();
    assert!(!gn.is_affine() && gn.weight.is_none() && gn.bias.is_none());
    assert_eq!(gn.eps(), 1e-3);
    assert!(gn.named_parameters().is_empty());
    assert_eq!(gn.state_dict().names().count(), 0);
    let x = Tensor::uniform(&ctx, &[3, 4, 7], -2.0, 2.0, 8).unwrap();
    let opts = GroupNormOptions {
        num_groups: 2,
        eps: 1e-3,
    };
    let want = x.group_norm(&ctx, None, None, opts).unwrap();
    assert_eq!(bits(&gn.forward(&ctx, &x).unwrap()), bits(&want));
    // The defaults of an affine layer give the same bits.
    let affine = GroupNorm::with_options(&ctx, 2, 4, 1e-3, true).unwrap();
    assert_eq!(bits(&affine.forward(&ctx, &x).unwrap()), bits(&want));
}

#[derive(Module)]
struct GnNet {
    fc: Linear,
    gn: GroupNorm,
    plain: GroupNorm,
}

#[test]
fn group_norm_parameters_are_named_in_derived_modules() {
    let ctx = ExecContext::new();
    let net = GnNet {
        fc: Linear::new(&ctx, 3, 4, 1).unwrap(),
        gn: GroupNorm::new(&ctx, 2, 4).unwrap(),
        plain: GroupNorm::with_options(&ctx, 1, 4, 1e-5, false).unwrap(),
    };
    let names: Vec<String> = net.state_dict().names().map(String::from).collect();
    assert_eq!(names, ["fc.weight", "fc.bias", "gn.weight", "gn.bias"]);
    let seq = Sequential::new()
        .push(Linear::new(&ctx, 3, 4, 1).unwrap())
        .push_named("norm", GroupNorm::new(&ctx, 4, 4).unwrap());
    let names: Vec<String> = seq.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "norm.weight", "norm.bias"]);
    let x = Tensor::uniform(&ctx, &[5, 3], -1.0, 1.0, 2).unwrap();
    assert_eq!(seq.forward(&ctx, &x).unwrap().shape(), [5, 4]);
}

#[test]
fn group_norm_bad_arguments_and_inputs_are_errors() {
    let ctx = ExecContext::new();
    let invalid = |r: fucina::Result<GroupNorm>, what: &str| match r {
        Err(e @ Error::InvalidArgument { .. }) => {
            let m = e.to_string();
            assert!(m.contains("GroupNorm") && m.contains(what), "{m}");
        }
        other => panic!("expected an invalid argument naming {what}, got {other:?}"),
    };
    invalid(GroupNorm::new(&ctx, 0, 4), "num_groups");
    invalid(GroupNorm::new(&ctx, 2, 0), "num_channels");
    invalid(GroupNorm::new(&ctx, 3, 4), "divisible");
    for eps in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1e-5] {
        invalid(GroupNorm::with_options(&ctx, 2, 4, eps, true), "eps");
    }
    let gn = GroupNorm::new(&ctx, 2, 4).unwrap();
    assert_shape_err(gn.forward(&ctx, &ramp(&ctx, &[4])), "GroupNorm");
    assert_shape_err(gn.forward(&ctx, &ramp(&ctx, &[2, 3, 5])), "GroupNorm");
    assert_shape_err(gn.forward(&ctx, &ramp(&ctx, &[2, 5])), "GroupNorm");
    assert!(gn.forward(&ctx, &ramp(&ctx, &[2, 4])).is_ok());
}
