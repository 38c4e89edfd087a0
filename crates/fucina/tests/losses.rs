//! The losses of `fucina::nn` against PyTorch (fixtures/losses.txt, written
//! by fixtures/losses.py in float64): the value and the input gradient of
//! each loss for every reduction; stability at extreme logits; bad input as
//! errors.

use std::collections::HashMap;

use fucina::nn::{
    ClassLossOptions, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits,
    cross_entropy_with, huber_loss, kl_div, l1_loss, nll_loss_with, smooth_l1_loss,
};
use fucina::{Error, ExecContext, RawTensor, Tensor};

type Named = HashMap<String, (Vec<usize>, Vec<f64>)>;

/// The shared inputs, the labels and, per `(loss, reduction)`, the value
/// and the gradient.
fn parse() -> (Named, Vec<i64>, Vec<(String, String, Named)>) {
    let text = include_str!("fixtures/losses.txt");
    let (mut inputs, mut labels, mut cases) = (Named::new(), Vec::new(), Vec::new());
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("labels") => labels = words.map(|v| v.parse().unwrap()).collect(),
            Some("case") => {
                let (n, r) = (words.next().unwrap(), words.next().unwrap());
                cases.push((n.to_string(), r.to_string(), Named::new()));
            }
            Some("tensor") => {
                let name = words.next().unwrap().to_string();
                let shape = words
                    .next()
                    .unwrap()
                    .split(',')
                    .map(|d| d.parse().unwrap())
                    .collect();
                let vals = words.map(|v| v.parse().unwrap()).collect();
                match cases.last_mut() {
                    Some((_, _, t)) => t.insert(name, (shape, vals)),
                    None => inputs.insert(name, (shape, vals)),
                };
            }
            _ => {}
        }
    }
    (inputs, labels, cases)
}

fn tensor(ctx: &ExecContext, named: &Named, name: &str) -> Tensor {
    let (shape, vals) = &named[name];
    let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
    Tensor::from_slice(ctx, shape, &v).unwrap()
}

fn close(what: &str, got: &Tensor, want: &[f64]) {
    let g = got.to_vec();
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        assert!(
            (a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{what}[{i}]: got {a}, PyTorch {b}"
        );
    }
}

fn reduction(r: &str) -> Reduction {
    match r {
        "none" => Reduction::None,
        "mean" => Reduction::Mean,
        "sum" => Reduction::Sum,
        "batchmean" => Reduction::BatchMean,
        _ => unreachable!("{r}"),
    }
}

#[test]
fn values_and_gradients_match_pytorch() {
    let ctx = ExecContext::new();
    let (inp, labels, cases) = parse();
    assert_eq!(cases.len(), 38);
    let t = |n: &str| tensor(&ctx, &inp, n);
    let (y, t01, pw, w, tq) = (t("y"), t("t01"), t("pw"), t("w"), t("tq"));
    let log_tq = tq.clamp(&ctx, 1e-3, 1.0).unwrap().log(&ctx).unwrap();
    let lab = |v: &[i64]| ctx.from_slice_typed::<i64>(&[v.len()], v).unwrap();
    let clamped: Vec<i64> = labels.iter().map(|&l| l.max(0)).collect();
    let (labels, clamped) = (lab(&labels), lab(&clamped));
    for (name, r, want) in &cases {
        let red = reduction(r);
        let input_name = match name.as_str() {
            "bce" | "bce_w" => "p",
            "kl" | "kl_log" => "logq",
            _ => "x",
        };
        let a = t(input_name).into_variable();
        let co = |ignore: Option<i64>, s: f32| ClassLossOptions {
            ignore_index: ignore,
            label_smoothing: s,
            reduction: red,
        };
        let v = match name.as_str() {
            "l1" => l1_loss(&ctx, &a, &y, red),
            "smooth_l1_b0.7" => smooth_l1_loss(&ctx, &a, &y, 0.7, red),
            "huber_d1.5" => huber_loss(&ctx, &a, &y, 1.5, red),
            "bce_logits" => binary_cross_entropy_with_logits(&ctx, &a, &t01, None, red),
            "bce_logits_pw" => binary_cross_entropy_with_logits(&ctx, &a, &t01, Some(&pw), red),
            "ce_ignore_smooth" => cross_entropy_with(&ctx, &a, &labels, co(Some(-100), 0.1)),
            "ce_smooth" => cross_entropy_with(&ctx, &a, &clamped, co(None, 0.2)),
            "nll_ignore" => nll_loss_with(
                &ctx,
                &a.log_softmax(&ctx, 1).unwrap(),
                &labels,
                co(Some(-100), 0.0),
            ),
            "bce" => binary_cross_entropy(&ctx, &a, &t01, None, red),
            "bce_w" => binary_cross_entropy(&ctx, &a, &t01, Some(&w), red),
            "kl" => kl_div(&ctx, &a, &tq, red, false),
            "kl_log" => kl_div(&ctx, &a, &log_tq, red, true),
            other => panic!("unknown case {other}"),
        }
        .unwrap();
        let what = format!("{name} {r}");
        close(&format!("{what} value"), &v, &want["value"].1);
        let loss = if red == Reduction::None {
            let g = if v.shape().len() == 1 {
                t("g_rows")
            } else {
                t("g")
            };
            v.mul(&ctx, &g).unwrap().sum_all(&ctx).unwrap()
        } else {
            v
        };
        loss.backward(&ctx).unwrap();
        close(
            &format!("{what} grad"),
            &a.grad(&ctx).unwrap().expect("a variable"),
            &want["grad"].1,
        );
    }
}

#[test]
fn logit_losses_are_stable_at_extreme_logits() {
    let ctx = ExecContext::new();
    let x = Tensor::from_slice(&ctx, &[4], &[1e4, -1e4, 1e4, -1e4])
        .unwrap()
        .into_variable();
    let y = Tensor::from_slice(&ctx, &[4], &[1.0, 0.0, 0.0, 1.0]).unwrap();
    let l = binary_cross_entropy_with_logits(&ctx, &x, &y, None, Reduction::None).unwrap();
    assert_eq!(l.to_vec(), [0.0, 0.0, 1e4, 1e4]);
    l.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    // d/dx = σ(x) - y.
    assert_eq!(
        x.grad(&ctx).unwrap().unwrap().to_vec(),
        [0.0, 0.0, 1.0, -1.0]
    );
    // BCE on probabilities clamps its logs at -100, as PyTorch does.
    let p = Tensor::from_slice(&ctx, &[2], &[0.0, 1.0]).unwrap();
    let t = Tensor::from_slice(&ctx, &[2], &[1.0, 0.0]).unwrap();
    let l = binary_cross_entropy(&ctx, &p, &t, None, Reduction::None).unwrap();
    assert_eq!(l.to_vec(), [100.0, 100.0]);
}

#[test]
fn bad_inputs_are_errors() {
    let ctx = ExecContext::new();
    let a = Tensor::zeros(&ctx, &[2, 3]).unwrap();
    let b = Tensor::zeros(&ctx, &[3, 2]).unwrap();
    let m = Reduction::Mean;
    for r in [
        l1_loss(&ctx, &a, &b, m),
        smooth_l1_loss(&ctx, &a, &b, 1.0, m),
        huber_loss(&ctx, &a, &b, 1.0, m),
        binary_cross_entropy(&ctx, &a, &b, None, m),
        binary_cross_entropy_with_logits(&ctx, &a, &b, None, m),
        kl_div(&ctx, &a, &b, m, false),
    ] {
        assert!(matches!(r, Err(Error::ShapeMismatch { .. })), "{r:?}");
    }
    assert!(matches!(
        smooth_l1_loss(&ctx, &a, &a, 0.0, m),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        huber_loss(&ctx, &a, &a, f32::NAN, m),
        Err(Error::InvalidArgument { .. })
    ));
    let labels =
        |v: &[i64]| -> RawTensor<i64> { ctx.from_slice_typed::<i64>(&[v.len()], v).unwrap() };
    let d = ClassLossOptions::default();
    let e = cross_entropy_with(&ctx, &a, &labels(&[0, 3]), d).unwrap_err();
    assert!(e.to_string().contains("label 3 at row 1"), "{e}");
    let e = cross_entropy_with(&ctx, &a, &labels(&[0, -100]), d).unwrap_err();
    assert!(e.to_string().contains("label -100"), "{e}");
    assert!(cross_entropy_with(&ctx, &a, &labels(&[0]), d).is_err());
    let smooth = ClassLossOptions {
        label_smoothing: 1.0,
        ..d
    };
    assert!(matches!(
        cross_entropy_with(&ctx, &a, &labels(&[0, 1]), smooth),
        Err(Error::InvalidArgument { .. })
    ));
}
