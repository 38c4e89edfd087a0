//! The layers of convolutional networks: each layer's output is its op's,
//! the initialization is PyTorch's default drawn from the seed, batch norm's
//! running statistics follow PyTorch's update and are buffers saved and loaded
//! with the parameters, `train()`/`eval()` switch the mode (through containers
//! and `#[derive(Module)]` too), and bad arguments are errors.

use fucina::nn::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Buffer, Conv1d, Conv2d, Flatten,
    Forward, Linear, MaxPool2d, Module, Parameter, Relu, Sequential, StateDict, sub_seed,
};
use fucina::prelude::{Conv1dOptions, Conv2dOptions, Pool2dOptions};
use fucina::{Error, ExecContext, Tensor};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn input(ctx: &ExecContext, shape: &[usize], seed: u64) -> Tensor {
    Tensor::uniform(ctx, shape, -1.0, 1.0, seed).unwrap()
}

#[test]
fn conv2d_is_its_op_with_pytorch_default_init() {
    let ctx = ExecContext::new();
    let opts = Conv2dOptions {
        stride: [2, 1],
        padding: [1, 0],
        dilation: [1, 2],
        groups: 2,
    };
    let conv = Conv2d::new(&ctx, 4, 6, [3, 2], opts, 11).unwrap();
    assert_eq!(conv.weight.shape().as_slice(), [6, 2, 3, 2]);
    assert_eq!(conv.bias.as_ref().unwrap().shape().as_slice(), [6]);
    assert_eq!(
        (conv.in_channels(), conv.out_channels(), conv.kernel_size()),
        (4, 6, [3, 2])
    );
    assert_eq!(conv.options(), opts);
    // Weight U(-b, b) from the seed, bias from sub_seed(seed, 1), b = 1/sqrt(fan_in)
    // with fan_in = in / groups * kh * kw = 12: bitwise what the rng crate draws.
    let b = (1.0f64 / 12.0).sqrt() as f32;
    let mut w = vec![0.0f32; 72];
    fucina::rng::kaiming_uniform_fill(11, &mut w, 12);
    assert_eq!(bits(&conv.weight.to_vec()), bits(&w));
    let mut bias = vec![0.0f32; 6];
    fucina::rng::uniform_fill(sub_seed(11, 1), &mut bias, -b, b);
    assert_eq!(bits(&conv.bias.as_ref().unwrap().to_vec()), bits(&bias));
    // The layer's output is the op's, bit for bit.
    let x = input(&ctx, &[2, 4, 7, 6], 3);
    let y = conv.forward(&ctx, &x).unwrap();
    let want = x
        .conv2d(
            &ctx,
            &conv.weight.tensor(),
            Some(&conv.bias.as_ref().unwrap().tensor()),
            opts,
        )
        .unwrap();
    assert_eq!(y.shape(), want.shape());
    assert_eq!(bits(&y.to_vec()), bits(&want.to_vec()));
    // Gradients reach the parameters.
    y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    assert!(conv.weight.grad(&ctx).unwrap().is_some());
    let nb = Conv2d::no_bias(&ctx, 4, 6, [3, 2], opts, 11).unwrap();
    assert!(nb.bias.is_none());
    assert_eq!(bits(&nb.weight.to_vec()), bits(&w));
    let names: Vec<String> = conv
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["weight", "bias"]);
}

#[test]
fn conv_init_statistics_match_the_uniform_bound() {
    let ctx = ExecContext::new();
    let conv = Conv2d::new(&ctx, 32, 64, [3, 3], Conv2dOptions::default(), 5).unwrap();
    let w = conv.weight.to_vec();
    let b = 1.0 / (32.0f64 * 9.0).sqrt();
    assert!(w.iter().all(|&v| f64::from(v).abs() <= b));
    let n = w.len() as f64;
    let mean = w.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = w
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    // U(-b, b): mean 0, variance b^2 / 3 (18,432 draws: a few standard errors).
    assert!(mean.abs() < 4.0 * (b * b / 3.0 / n).sqrt(), "mean {mean}");
    assert!((var / (b * b / 3.0) - 1.0).abs() < 0.05, "var {var}");
    // Another seed, other weights; the same seed, the same.
    let again = Conv2d::new(&ctx, 32, 64, [3, 3], Conv2dOptions::default(), 5).unwrap();
    assert_eq!(bits(&again.weight.to_vec()), bits(&w));
    let other = Conv2d::new(&ctx, 32, 64, [3, 3], Conv2dOptions::default(), 6).unwrap();
    assert_ne!(bits(&other.weight.to_vec()), bits(&w));
}

#[test]
fn conv1d_is_its_op() {
    let ctx = ExecContext::new();
    let opts = Conv1dOptions {
        stride: 2,
        padding: 1,
        ..Default::default()
    };
    let conv = Conv1d::new(&ctx, 3, 5, 3, opts, 2).unwrap();
    assert_eq!(conv.weight.shape().as_slice(), [5, 3, 3]);
    let mut w = vec![0.0f32; 45];
    fucina::rng::kaiming_uniform_fill(2, &mut w, 9);
    assert_eq!(bits(&conv.weight.to_vec()), bits(&w));
    let x = input(&ctx, &[2, 3, 9], 4);
    let y = conv.forward(&ctx, &x).unwrap();
    let want = x
        .conv1d(
            &ctx,
            &conv.weight.tensor(),
            Some(&conv.bias.as_ref().unwrap().tensor()),
            opts,
        )
        .unwrap();
    assert_eq!(y.shape(), [2, 5, 5]);
    assert_eq!(bits(&y.to_vec()), bits(&want.to_vec()));
    assert!(matches!(
        conv.forward(&ctx, &input(&ctx, &[2, 4, 9], 4)),
        Err(Error::ShapeMismatch { .. })
    ));
}

/// Mean and unbiased variance per channel of `[N, C, plane]` values, in f64.
fn channel_stats(x: &[f32], n: usize, c: usize, plane: usize) -> (Vec<f64>, Vec<f64>) {
    let m = (n * plane) as f64;
    let mut mean = vec![0.0; c];
    let mut var = vec![0.0; c];
    for ch in 0..c {
        let vals: Vec<f64> = (0..n)
            .flat_map(|i| (0..plane).map(move |p| (i, p)))
            .map(|(i, p)| f64::from(x[(i * c + ch) * plane + p]))
            .collect();
        mean[ch] = vals.iter().sum::<f64>() / m;
        var[ch] = vals.iter().map(|v| (v - mean[ch]).powi(2)).sum::<f64>() / (m - 1.0);
    }
    (mean, var)
}

#[test]
fn batch_norm2d_trains_with_batch_statistics_and_evaluates_with_running_ones() {
    let ctx = ExecContext::new();
    let mut bn = BatchNorm2d::new(&ctx, 3).unwrap();
    assert!(bn.is_training());
    assert_eq!((bn.eps(), bn.momentum(), bn.num_features()), (1e-5, 0.1, 3));
    assert_eq!(bn.running_mean().to_vec(), [0.0; 3]);
    assert_eq!(bn.running_var().to_vec(), [1.0; 3]);
    bn.weight().copy_from_slice(&[1.5, 0.5, -1.0]).unwrap();
    bn.bias().copy_from_slice(&[0.1, 0.2, 0.3]).unwrap();
    let x1 = input(&ctx, &[4, 3, 5, 5], 1).scale(&ctx, 2.0).unwrap();
    let x2 = input(&ctx, &[4, 3, 5, 5], 2).add_scalar(&ctx, 0.5).unwrap();
    // Training mode: the op with the batch's statistics.
    let y = bn.forward(&ctx, &x1).unwrap();
    let want = x1
        .batch_norm(&ctx, &bn.weight().tensor(), &bn.bias().tensor(), 1e-5)
        .unwrap();
    assert_eq!(bits(&y.to_vec()), bits(&want.to_vec()));
    // Running statistics: PyTorch's momentum update with the unbiased variance,
    // checked against an independent f64 computation over two steps.
    bn.forward(&ctx, &x2).unwrap();
    let (m1, v1) = channel_stats(&x1.to_vec(), 4, 3, 25);
    let (m2, v2) = channel_stats(&x2.to_vec(), 4, 3, 25);
    for c in 0..3 {
        let rm = 0.1 * m2[c] + 0.9 * (0.1 * m1[c]);
        let rv = 0.1 * v2[c] + 0.9 * (0.1 * v1[c] + 0.9);
        let (gm, gv) = (bn.running_mean().to_vec()[c], bn.running_var().to_vec()[c]);
        assert!((f64::from(gm) - rm).abs() < 1e-5, "mean {c}: {gm} vs {rm}");
        assert!((f64::from(gv) - rv).abs() < 1e-5, "var {c}: {gv} vs {rv}");
    }
    // Evaluation mode: the eval op with the running statistics, which stay put,
    // and each sample's output does not depend on the rest of the batch.
    bn.eval();
    assert!(!bn.is_training());
    let before = (bn.running_mean().to_vec(), bn.running_var().to_vec());
    let y = bn.forward(&ctx, &x1).unwrap();
    let want = x1
        .batch_norm_eval(
            &ctx,
            &bn.running_mean().tensor(),
            &bn.running_var().tensor(),
            &bn.weight().tensor(),
            &bn.bias().tensor(),
            1e-5,
        )
        .unwrap();
    assert_eq!(bits(&y.to_vec()), bits(&want.to_vec()));
    assert_eq!(
        (bn.running_mean().to_vec(), bn.running_var().to_vec()),
        before
    );
    let one = Tensor::from_slice(&ctx, &[1, 3, 5, 5], &x1.to_vec()[..75]).unwrap();
    assert_eq!(
        bits(&bn.forward(&ctx, &one).unwrap().to_vec()),
        bits(&y.to_vec()[..75])
    );
    // Back to training: the batch statistics again.
    bn.train(true);
    let y = bn.forward(&ctx, &x1).unwrap();
    let want = x1
        .batch_norm(&ctx, &bn.weight().tensor(), &bn.bias().tensor(), 1e-5)
        .unwrap();
    assert_eq!(bits(&y.to_vec()), bits(&want.to_vec()));
    // Options, and what does not fit.
    let bn = BatchNorm2d::new(&ctx, 3)
        .unwrap()
        .with_options(1e-3, 0.5)
        .unwrap();
    assert_eq!((bn.eps(), bn.momentum()), (1e-3, 0.5));
    bn.forward(&ctx, &x1).unwrap();
    let (m1, _) = channel_stats(&x1.to_vec(), 4, 3, 25);
    assert!((f64::from(bn.running_mean().to_vec()[0]) - 0.5 * m1[0]).abs() < 1e-6);
    for (eps, m) in [(-1.0, 0.1), (f32::NAN, 0.1), (1e-5, 1.5), (1e-5, -0.1)] {
        let r = BatchNorm2d::new(&ctx, 3).unwrap().with_options(eps, m);
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{eps} {m}");
    }
    assert!(BatchNorm2d::new(&ctx, 0).is_err());
    for bad in [&[4, 2, 5, 5][..], &[4, 3, 25]] {
        match bn.forward(&ctx, &input(&ctx, bad, 1)) {
            Err(Error::ShapeMismatch { layer, got, .. }) => {
                assert_eq!(layer, "BatchNorm2d(num_features = 3)");
                assert_eq!(got, bad);
            }
            other => panic!("{other:?}"),
        }
    }
}

/// A non-finite `eps` (or momentum) is refused by the constructor, naming it,
/// not accepted and then refused by every `forward`.
#[test]
fn batch_norm_options_refuse_non_finite_values_up_front() {
    let ctx = ExecContext::new();
    for (eps, m) in [
        (f32::INFINITY, 0.1),
        (f32::NEG_INFINITY, 0.1),
        (1e-5, f32::INFINITY),
        (1e-5, f32::NAN),
    ] {
        for r in [
            BatchNorm2d::new(&ctx, 3)
                .unwrap()
                .with_options(eps, m)
                .map(drop),
            BatchNorm1d::new(&ctx, 3)
                .unwrap()
                .with_options(eps, m)
                .map(drop),
        ] {
            match r {
                Err(Error::InvalidArgument { what, reason }) => {
                    assert!(what.ends_with("::with_options"), "{what}");
                    let name = if eps.is_finite() { "momentum" } else { "eps" };
                    assert!(reason.contains(name), "{reason}");
                }
                other => panic!("eps {eps}, momentum {m}: expected an error, got {other:?}"),
            }
        }
    }
    let e = BatchNorm2d::new(&ctx, 3)
        .unwrap()
        .with_options(f32::INFINITY, 0.1)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "BatchNorm2d::with_options: eps must be finite and >= 0 (got inf)"
    );
    // The extremes that are valid stay valid.
    let bn = BatchNorm2d::new(&ctx, 3)
        .unwrap()
        .with_options(f32::MAX, 1.0)
        .unwrap();
    assert_eq!((bn.eps(), bn.momentum()), (f32::MAX, 1.0));
    BatchNorm2d::new(&ctx, 3)
        .unwrap()
        .with_options(0.0, 0.0)
        .unwrap();
}

#[test]
fn batch_norm1d_takes_two_and_three_dimensional_input() {
    let ctx = ExecContext::new();
    let bn = BatchNorm1d::new(&ctx, 4).unwrap();
    for shape in [&[6, 4][..], &[3, 4, 5]] {
        let x = input(&ctx, shape, 9);
        let y = bn.forward(&ctx, &x).unwrap();
        let want = x
            .batch_norm(&ctx, &bn.weight().tensor(), &bn.bias().tensor(), 1e-5)
            .unwrap();
        assert_eq!(bits(&y.to_vec()), bits(&want.to_vec()));
    }
    assert!(bn.forward(&ctx, &input(&ctx, &[6, 5], 1)).is_err());
    assert!(bn.forward(&ctx, &input(&ctx, &[2, 4, 2, 2], 1)).is_err());
}

#[test]
fn pooling_and_flatten_layers_are_their_ops() {
    let ctx = ExecContext::new();
    let x = input(&ctx, &[2, 3, 8, 6], 4);
    let o = Pool2dOptions {
        kernel: [3, 3],
        stride: [2, 1],
        padding: [1, 1],
    };
    let mp = MaxPool2d::with_options(o).unwrap();
    assert_eq!(
        bits(&mp.forward(&ctx, &x).unwrap().to_vec()),
        bits(&x.max_pool2d(&ctx, o).unwrap().to_vec())
    );
    let ap = AvgPool2d::with_options(o).unwrap();
    assert_eq!(
        bits(&ap.forward(&ctx, &x).unwrap().to_vec()),
        bits(&x.avg_pool2d(&ctx, o).unwrap().to_vec())
    );
    // new(kernel): stride = kernel.
    let mp2 = MaxPool2d::new([2, 2]).unwrap();
    assert_eq!(mp2.options(), Pool2dOptions::new([2, 2]));
    assert_eq!(mp2.forward(&ctx, &x).unwrap().shape(), [2, 3, 4, 3]);
    let ad = AdaptiveAvgPool2d::new([1, 1]).unwrap();
    let g = ad.forward(&ctx, &x).unwrap();
    assert_eq!(g.shape(), [2, 3, 1, 1]);
    assert_eq!(
        bits(&g.to_vec()),
        bits(&x.adaptive_avg_pool2d(&ctx, [1, 1]).unwrap().to_vec())
    );
    assert_eq!(Flatten::new().forward(&ctx, &x).unwrap().shape(), [2, 144]);
    assert_eq!(
        Flatten::from_axis(-2).forward(&ctx, &x).unwrap().shape(),
        [2, 3, 48]
    );
    assert!(Flatten::from_axis(4).forward(&ctx, &x).is_err());
    // Bad windows.
    assert!(MaxPool2d::new([0, 2]).is_err());
    assert!(
        AvgPool2d::with_options(Pool2dOptions {
            kernel: [2, 2],
            stride: [0, 1],
            padding: [0, 0]
        })
        .is_err()
    );
    assert!(
        MaxPool2d::with_options(Pool2dOptions {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [2, 0]
        })
        .is_err()
    );
    assert!(AdaptiveAvgPool2d::new([0, 1]).is_err());
    for l in [&mp as &dyn Module, &ap, &ad, &Flatten::new()] {
        assert!(l.named_parameters().is_empty() && l.named_buffers().is_empty());
    }
}

#[test]
fn conv_constructors_refuse_bad_arguments() {
    let ctx = ExecContext::new();
    let d = Conv2dOptions::default();
    let cases = [
        Conv2d::new(&ctx, 0, 4, [3, 3], d, 1),
        Conv2d::new(&ctx, 4, 0, [3, 3], d, 1),
        Conv2d::new(&ctx, 4, 4, [0, 3], d, 1),
        Conv2d::new(
            &ctx,
            4,
            4,
            [3, 3],
            Conv2dOptions {
                stride: [1, 0],
                ..d
            },
            1,
        ),
        Conv2d::new(
            &ctx,
            4,
            4,
            [3, 3],
            Conv2dOptions {
                dilation: [0, 1],
                ..d
            },
            1,
        ),
        Conv2d::new(&ctx, 4, 4, [3, 3], Conv2dOptions { groups: 0, ..d }, 1),
        Conv2d::new(&ctx, 4, 6, [3, 3], Conv2dOptions { groups: 4, ..d }, 1),
        Conv2d::new(&ctx, 6, 4, [3, 3], Conv2dOptions { groups: 4, ..d }, 1),
    ];
    for (i, r) in cases.into_iter().enumerate() {
        match r {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "Conv2d::new", "case {i}"),
            other => panic!("case {i}: {other:?}"),
        }
    }
    assert!(
        Conv1d::new(
            &ctx,
            3,
            4,
            3,
            Conv1dOptions {
                groups: 2,
                ..Default::default()
            },
            1
        )
        .is_err()
    );
    // Depthwise is fine.
    let dw = Conv2d::new(&ctx, 4, 8, [3, 3], Conv2dOptions { groups: 4, ..d }, 1).unwrap();
    assert_eq!(dw.weight.shape().as_slice(), [8, 1, 3, 3]);
    // Input that does not fit: a ShapeMismatch naming the layer; a kernel larger
    // than the input: the op's error.
    let conv = Conv2d::new(&ctx, 4, 4, [3, 3], d, 1).unwrap();
    match conv.forward(&ctx, &input(&ctx, &[1, 3, 5, 5], 1)) {
        Err(Error::ShapeMismatch { layer, .. }) => assert!(layer.starts_with("Conv2d(in = 4")),
        other => panic!("{other:?}"),
    }
    assert!(conv.forward(&ctx, &input(&ctx, &[4, 5, 5], 1)).is_err());
    assert!(conv.forward(&ctx, &input(&ctx, &[1, 4, 2, 5], 1)).is_err());
}

fn cnn(ctx: &ExecContext, seed: u64) -> Sequential {
    let same = Conv2dOptions {
        padding: [1, 1],
        ..Default::default()
    };
    Sequential::new()
        .push_named(
            "conv",
            Conv2d::no_bias(ctx, 1, 4, [3, 3], same, seed).unwrap(),
        )
        .push_named("bn", BatchNorm2d::new(ctx, 4).unwrap())
        .push(Relu)
        .push(MaxPool2d::new([2, 2]).unwrap())
        .push(Flatten::new())
        .push_named("fc", Linear::new(ctx, 4 * 3 * 3, 3, seed + 1).unwrap())
}

#[test]
fn state_dicts_and_checkpoints_carry_the_buffers() {
    let ctx = ExecContext::new();
    let mut net = cnn(&ctx, 1);
    let x = input(&ctx, &[5, 1, 6, 6], 2);
    for _ in 0..3 {
        net.forward(&ctx, &x).unwrap();
    }
    let bufs: Vec<String> = net.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(bufs, ["bn.running_mean", "bn.running_var"]);
    let sd = net.state_dict();
    let names: Vec<&str> = sd.names().collect();
    assert_eq!(
        names,
        [
            "conv.weight",
            "bn.weight",
            "bn.bias",
            "fc.weight",
            "fc.bias",
            "bn.running_mean",
            "bn.running_var"
        ]
    );
    // The optimizer sees only the parameters.
    assert_eq!(net.parameters().len(), 5);
    // A fresh model (another seed) takes everything, buffers included, and then
    // evaluates exactly as the original.
    let mut fresh = cnn(&ctx, 7);
    fresh.load_state_dict(&sd).unwrap();
    assert_eq!(
        fresh.named_buffers()[0].1.to_vec(),
        net.named_buffers()[0].1.to_vec()
    );
    assert_ne!(fresh.named_buffers()[0].1.to_vec(), [0.0; 4]);
    net.eval();
    fresh.eval();
    assert_eq!(
        bits(&net.forward(&ctx, &x).unwrap().to_vec()),
        bits(&fresh.forward(&ctx, &x).unwrap().to_vec())
    );
    // A state dict without a buffer, or with a misshapen one, is refused and
    // changes nothing.
    let without: Vec<(String, Tensor)> = sd
        .iter()
        .filter(|(n, _)| n != "bn.running_var")
        .cloned()
        .collect();
    let other = cnn(&ctx, 9);
    let before = other.state_dict();
    let r = other.load_state_dict(&StateDict::from_entries(without.clone()).unwrap());
    match r {
        Err(Error::StateDict { reason }) => {
            assert_eq!(reason, "missing buffer \"bn.running_var\"")
        }
        other => panic!("{other:?}"),
    }
    let mut bad = without;
    bad.push(("bn.running_var".into(), Tensor::zeros(&ctx, &[5]).unwrap()));
    let e = other
        .load_state_dict(&StateDict::from_entries(bad).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("buffer \"bn.running_var\" has shape [5]"), "{e}");
    for ((_, a), (_, b)) in other.state_dict().iter().zip(before.iter()) {
        assert_eq!(bits(&a.to_vec()), bits(&b.to_vec()));
    }
    // Checkpoints: save_module writes the buffers, load_module restores them.
    let path = std::env::temp_dir().join(format!(
        "fucina-conv-layers-{}.safetensors",
        std::process::id()
    ));
    fucina::checkpoint::save_module(&path, &net, None, &[]).unwrap();
    let loaded = cnn(&ctx, 11);
    fucina::checkpoint::load_module(&ctx, &path, &loaded, None).unwrap();
    for ((n, a), (_, b)) in loaded.state_dict().iter().zip(net.state_dict().iter()) {
        assert_eq!(bits(&a.to_vec()), bits(&b.to_vec()), "{n}");
    }
    std::fs::remove_file(&path).ok();
}

#[derive(Module)]
struct Tower {
    convs: Vec<Conv2d>,
    norms: [BatchNorm2d; 2],
    extra: Option<BatchNorm1d>,
    scale: Buffer,
    gain: Parameter,
}

#[test]
fn derive_module_gathers_buffers_and_passes_train_on() {
    let ctx = ExecContext::new();
    let d = Conv2dOptions::default();
    let mut t = Tower {
        convs: vec![Conv2d::new(&ctx, 2, 2, [1, 1], d, 1).unwrap()],
        norms: [
            BatchNorm2d::new(&ctx, 2).unwrap(),
            BatchNorm2d::new(&ctx, 2).unwrap(),
        ],
        extra: Some(BatchNorm1d::new(&ctx, 3).unwrap()),
        scale: Buffer::from_slice(&ctx, &[1], &[2.0]).unwrap(),
        gain: Parameter::from_slice(&ctx, &[1], &[1.0]).unwrap(),
    };
    let bufs: Vec<String> = t.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        bufs,
        [
            "norms.0.running_mean",
            "norms.0.running_var",
            "norms.1.running_mean",
            "norms.1.running_var",
            "extra.running_mean",
            "extra.running_var",
            "scale"
        ]
    );
    let params: Vec<String> = t.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(params.len(), 2 + 4 + 2 + 1);
    assert!(!params.iter().any(|n| n.contains("running") || n == "scale"));
    t.eval();
    assert!(t.norms.iter().all(|b| !b.is_training()));
    assert!(!t.extra.as_ref().unwrap().is_training());
    t.train(true);
    assert!(t.norms[1].is_training());
    // The state dict round-trips the plain buffer field too.
    let sd = t.state_dict();
    t.scale.copy_from_slice(&[5.0]).unwrap();
    t.load_state_dict(&sd).unwrap();
    assert_eq!(t.scale.to_vec(), [2.0]);
    // Sequential passes eval on as well.
    let mut s = Sequential::new().push(BatchNorm1d::new(&ctx, 2).unwrap());
    s.eval();
    let x = Tensor::from_slice(&ctx, &[1, 2], &[3.0, 4.0]).unwrap();
    // One sample in eval mode is fine (running statistics); in training mode the
    // op refuses a single value per channel.
    assert!(s.forward(&ctx, &x).is_ok());
    s.train(true);
    assert!(s.forward(&ctx, &x).is_err());
}

/// A layer that passes its input through: placed between `Relu` and
/// `MaxPool2d`, it keeps `Sequential` from fusing them.
struct Identity;

impl Module for Identity {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }
}

impl Forward for Identity {
    fn forward(&self, _ctx: &ExecContext, x: &Tensor) -> fucina::Result<Tensor> {
        Ok(x.clone())
    }
}

#[test]
fn sequential_fuses_relu_then_max_pool_with_the_same_bits() {
    let ctx = ExecContext::with_threads(2);
    let pool = || MaxPool2d::new([2, 2]).unwrap();
    let conv = |seed| Conv2d::new(&ctx, 3, 4, [3, 3], Conv2dOptions::default(), seed).unwrap();
    let fused = Sequential::new().push(conv(5)).push(Relu).push(pool());
    let plain = Sequential::new()
        .push(conv(5))
        .push(Relu)
        .push(Identity)
        .push(pool());
    let x = Tensor::uniform(&ctx, &[2, 3, 11, 12], -1.0, 1.0, 9)
        .unwrap()
        .into_variable();
    let mut got = Vec::new();
    for net in [&fused, &plain] {
        let y = net.forward(&ctx, &x).unwrap();
        assert_eq!(y.shape(), [2, 4, 4, 5]);
        let w = Tensor::uniform(&ctx, y.shape(), -1.0, 1.0, 3).unwrap();
        y.mul(&ctx, &w)
            .unwrap()
            .sum_all(&ctx)
            .unwrap()
            .backward(&ctx)
            .unwrap();
        let gx = x.grad(&ctx).unwrap().unwrap().to_vec();
        let gw: Vec<Vec<f32>> = net
            .parameters()
            .iter()
            .map(|p| p.grad(&ctx).unwrap().unwrap().to_vec())
            .collect();
        got.push((
            bits(&y.to_vec()),
            bits(&gx),
            gw.iter().map(|g| bits(g)).collect::<Vec<_>>(),
        ));
        x.zero_grad();
    }
    assert_eq!(got[0], got[1]);
    // The fused pair still reports a bad input (rank 3) as an error.
    let bad = Tensor::uniform(&ctx, &[3, 4, 4], -1.0, 1.0, 1).unwrap();
    let e = Sequential::new()
        .push(Relu)
        .push(pool())
        .forward(&ctx, &bad);
    assert!(e.unwrap_err().to_string().contains("relu_max_pool2d"));
}

/// Output, input gradient, parameter gradients and buffers of one training
/// forward/backward of `net` on `x`, as bits.
fn run_bits(ctx: &ExecContext, net: &Sequential, x: &Tensor) -> Vec<Vec<u32>> {
    let y = net.forward(ctx, x).unwrap();
    let w = Tensor::uniform(ctx, y.shape(), -1.0, 1.0, 3).unwrap();
    y.mul(ctx, &w)
        .unwrap()
        .sum_all(ctx)
        .unwrap()
        .backward(ctx)
        .unwrap();
    let mut out = vec![
        bits(&y.to_vec()),
        bits(&x.grad(ctx).unwrap().unwrap().to_vec()),
    ];
    out.extend(
        net.parameters()
            .iter()
            .map(|p| bits(&p.grad(ctx).unwrap().unwrap().to_vec())),
    );
    out.extend(net.named_buffers().iter().map(|(_, b)| bits(&b.to_vec())));
    x.zero_grad();
    out
}

#[test]
fn sequential_fuses_batch_norm_relu_max_pool_with_the_same_bits() {
    let same = Conv2dOptions {
        padding: [1, 1],
        ..Default::default()
    };
    // `relu`: BatchNorm2d -> Relu -> MaxPool2d, else BatchNorm2d -> MaxPool2d;
    // `split`: an Identity after the batch norm keeps it apart.
    let net = |ctx: &ExecContext, relu: bool, split: bool| {
        let mut s = Sequential::new()
            .push(Conv2d::no_bias(ctx, 2, 5, [3, 3], same, 4).unwrap())
            .push(BatchNorm2d::new(ctx, 5).unwrap());
        if split {
            s = s.push(Identity);
        }
        if relu {
            s = s.push(Relu);
        }
        s.push(MaxPool2d::new([2, 2]).unwrap())
            .push(Flatten::new())
            .push(Linear::new(ctx, 5 * 3 * 4, 3, 8).unwrap())
    };
    let mut first = None;
    for threads in [1, 2, 3] {
        let ctx = ExecContext::with_threads(threads);
        let x = Tensor::uniform(&ctx, &[3, 2, 7, 9], -1.0, 1.0, 9)
            .unwrap()
            .into_variable();
        for relu in [true, false] {
            let (mut fused, mut plain) = (net(&ctx, relu, false), net(&ctx, relu, true));
            // Two training steps (the running statistics move), then eval
            // (the fused group falls back to the separate ops).
            let mut got = Vec::new();
            for step in 0..3 {
                if step == 2 {
                    fused.eval();
                    plain.eval();
                }
                let a = run_bits(&ctx, &fused, &x);
                let b = run_bits(&ctx, &plain, &x);
                assert_eq!(a, b, "relu {relu}, step {step}, {threads} threads");
                got.push(a);
            }
            // And the same bits for every team size.
            match &first {
                None if relu => first = Some(got),
                Some(f) if relu => assert_eq!(&got, f, "{threads} threads"),
                _ => {}
            }
        }
    }
    // A bad input to the fused group is an error naming the layer.
    let ctx = ExecContext::new();
    let bad = Tensor::uniform(&ctx, &[3, 4, 4, 4], -1.0, 1.0, 1).unwrap();
    let e = Sequential::new()
        .push(BatchNorm2d::new(&ctx, 5).unwrap())
        .push(Relu)
        .push(MaxPool2d::new([2, 2]).unwrap())
        .forward(&ctx, &bad)
        .unwrap_err();
    assert!(
        e.to_string().contains("BatchNorm2d(num_features = 5)"),
        "{e}"
    );
}
