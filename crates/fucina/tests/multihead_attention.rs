//! `nn::MultiheadAttention`: outputs, attention weights and every gradient
//! against PyTorch's `nn.MultiheadAttention` run in float64
//! (fixtures/attention.txt, written by fixtures/attention.py: self- and
//! cross-attention, batch-first and sequence-first, with and without biases,
//! key-padding masks, boolean, additive and per-head attention masks,
//! averaged and per-head weights), loaded through a state dict by
//! PyTorch's names; gradcheck; init; bad input as errors.

use std::collections::HashMap;

#[path = "fixtures/parse.rs"]
mod parse;

use fucina::autograd::{GradcheckOptions, gradcheck};
use fucina::nn::{AttentionOptions, AttnMask, Forward, Module, MultiheadAttention, StateDict};
use fucina::{Error, ExecContext, RawTensor, Tensor};

struct Case {
    kv: HashMap<String, String>,
    tensors: HashMap<String, (Vec<usize>, Vec<f64>)>,
    params: Vec<String>,
}

fn parse() -> Vec<Case> {
    let cases: Vec<Case> = parse::blocks(include_str!("fixtures/attention.txt"))
        .into_iter()
        .map(|b| Case {
            kv: b.keys(),
            params: b
                .order
                .iter()
                .filter(|n| n.starts_with("in_proj") || n.starts_with("out_proj"))
                .cloned()
                .collect(),
            tensors: b.tensors,
        })
        .collect();
    assert_eq!(cases.len(), 4);
    cases
}

impl Case {
    fn n(&self, k: &str) -> usize {
        self.kv[k].parse().unwrap()
    }
    fn flag(&self, k: &str) -> bool {
        self.kv[k] == "1"
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn tensor(&self, ctx: &ExecContext, name: &str) -> Tensor {
        let (shape, vals) = &self.tensors[name];
        let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
        Tensor::variable_from_slice(ctx, shape, &v).unwrap()
    }
    fn mask(&self, ctx: &ExecContext, name: &str) -> RawTensor<bool> {
        let (shape, vals) = &self.tensors[name];
        let v: Vec<bool> = vals.iter().map(|&x| x != 0.0).collect();
        ctx.from_slice_typed::<bool>(shape, &v).unwrap()
    }
    fn want(&self, name: &str) -> &[f64] {
        &self.tensors[name].1
    }
    fn layer(&self, ctx: &ExecContext) -> MultiheadAttention {
        let mha = MultiheadAttention::new(
            ctx,
            self.n("embed"),
            self.n("heads"),
            self.flag("bias"),
            self.flag("batch_first"),
            3,
        )
        .unwrap();
        let names: Vec<String> = mha.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, self.params, "PyTorch's names, in its order");
        let mut sd = StateDict::new();
        for n in &self.params {
            sd.insert(n.clone(), self.tensor(ctx, n).detach()).unwrap();
        }
        mha.load_state_dict(&sd).unwrap();
        mha
    }
}

fn close(what: &str, got: &Tensor, want: &[f64]) {
    let g = got.to_vec();
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        assert!(
            (a as f64 - b).abs() <= 2e-4 * (1.0 + b.abs()),
            "{what}[{i}]: got {a}, PyTorch {b}"
        );
    }
}

#[test]
fn values_weights_and_gradients_match_pytorch() {
    let ctx = ExecContext::with_threads(2);
    for c in parse() {
        let what = format!("{:?}", c.kv);
        let mha = c.layer(&ctx);
        let q = c.tensor(&ctx, "query");
        let (k, v) = if c.flag("self") {
            (q.clone(), q.clone())
        } else {
            (c.tensor(&ctx, "key"), c.tensor(&ctx, "value"))
        };
        let kpm = c
            .has("key_padding_mask")
            .then(|| c.mask(&ctx, "key_padding_mask"));
        let bool_mask = c.has("attn_mask").then(|| c.mask(&ctx, "attn_mask"));
        let float_mask = c
            .has("attn_mask")
            .then(|| c.tensor(&ctx, "attn_mask").detach());
        let attn_mask = match c.kv["mask"].as_str() {
            "none" => None,
            "float" => Some(AttnMask::Additive(float_mask.as_ref().unwrap())),
            _ => Some(AttnMask::Bool(bool_mask.as_ref().unwrap())),
        };
        let opts = AttentionOptions {
            key_padding_mask: kpm.as_ref(),
            attn_mask,
            need_weights: c.flag("need_weights"),
            average_attn_weights: c.flag("average"),
        };
        let (y, w) = mha.forward(&ctx, &q, &k, &v, opts).unwrap();
        close(&format!("{what} y"), &y, c.want("y"));
        let dot = |t: &Tensor, name: &str| {
            t.mul(&ctx, &c.tensor(&ctx, name).detach())
                .unwrap()
                .sum_all(&ctx)
                .unwrap()
        };
        let mut loss = dot(&y, "gy");
        assert_eq!(w.is_some(), c.flag("need_weights"));
        if let Some(w) = &w {
            close(&format!("{what} weights"), w, c.want("w"));
            loss = loss.add(&ctx, &dot(w, "gw")).unwrap();
        }
        loss.backward(&ctx).unwrap();
        let grad = |t: &Tensor| t.grad(&ctx).unwrap().expect("a variable");
        close(
            &format!("{what} grad query"),
            &grad(&q),
            c.want("grad_query"),
        );
        if !c.flag("self") {
            close(&format!("{what} grad key"), &grad(&k), c.want("grad_key"));
            close(
                &format!("{what} grad value"),
                &grad(&v),
                c.want("grad_value"),
            );
        }
        for (n, p) in mha.named_parameters() {
            let g = p.grad(&ctx).unwrap().expect("a gradient");
            close(
                &format!("{what} grad {n}"),
                &g,
                c.want(&format!("grad_{n}")),
            );
        }
    }
}

#[test]
fn gradcheck_cross_attention_with_masks() {
    let ctx = ExecContext::new();
    let mha = MultiheadAttention::new(&ctx, 4, 2, true, true, 5).unwrap();
    // Non-zero biases, so their gradients are checked away from the init.
    for (_, p) in mha.named_parameters() {
        p.update_(|w| {
            for (i, x) in w.iter_mut().enumerate() {
                *x += 0.1 * ((i % 5) as f32 - 2.0);
            }
        })
        .unwrap();
    }
    let pad = ctx
        .from_slice_typed::<bool>(&[2, 3], &[false, false, true, false, false, false])
        .unwrap();
    let am = ctx
        .from_slice_typed::<bool>(&[2, 3], &[false, true, false, false, false, false])
        .unwrap();
    let q = Tensor::uniform(&ctx, &[2, 2, 4], -1.0, 1.0, 1).unwrap();
    let kv = Tensor::uniform(&ctx, &[2, 3, 4], -1.0, 1.0, 2).unwrap();
    let raw = [q.raw().clone(), kv.raw().clone()];
    let f = |ctx: &ExecContext, t: &[Tensor]| -> fucina::Result<Tensor> {
        let opts = AttentionOptions {
            key_padding_mask: Some(&pad),
            attn_mask: Some(AttnMask::Bool(&am)),
            ..Default::default()
        };
        let (y, w) = mha.forward(ctx, &t[0], &t[1], &t[1], opts)?;
        let w = w.unwrap().reshape(ctx, &[2, 6])?;
        Ok(Tensor::concat(ctx, &[&y.reshape(ctx, &[2, 8])?, &w], 1)?)
    };
    let r = gradcheck(&ctx, f, &raw, &GradcheckOptions::default()).unwrap();
    assert!(r.passed, "{r:?}");
}

#[test]
fn init_and_forward_trait() {
    let ctx = ExecContext::new();
    let mha = MultiheadAttention::new(&ctx, 16, 4, true, false, 9).unwrap();
    let b = (6.0f64 / 64.0).sqrt() as f32;
    let w = mha.in_proj_weight.to_vec();
    assert_eq!(mha.in_proj_weight.shape().as_slice(), [48, 16]);
    assert!(w.iter().all(|x| x.abs() <= b));
    assert!(w.iter().any(|x| x.abs() > b / 2.0));
    assert!(
        mha.in_proj_bias
            .as_ref()
            .unwrap()
            .to_vec()
            .iter()
            .all(|&x| x == 0.0)
    );
    assert!(
        mha.out_proj
            .bias
            .as_ref()
            .unwrap()
            .to_vec()
            .iter()
            .all(|&x| x == 0.0)
    );
    assert_eq!(
        (mha.embed_dim(), mha.num_heads(), mha.batch_first()),
        (16, 4, false)
    );
    let no_bias = MultiheadAttention::new(&ctx, 16, 4, false, false, 9).unwrap();
    let names: Vec<String> = no_bias
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["in_proj_weight", "out_proj.weight"]);
    // Forward: unmasked self-attention, the output alone.
    let x = Tensor::uniform(&ctx, &[5, 2, 16], -1.0, 1.0, 1).unwrap();
    let a = Forward::forward(&mha, &ctx, &x).unwrap();
    let (b2, _) = mha
        .forward(&ctx, &x, &x, &x, AttentionOptions::default())
        .unwrap();
    assert_eq!(a.to_vec(), b2.to_vec());
    assert_eq!(a.shape(), [5, 2, 16]);
}

#[test]
fn bad_arguments_and_inputs_are_errors() {
    let ctx = ExecContext::new();
    assert!(matches!(
        MultiheadAttention::new(&ctx, 6, 4, true, true, 1),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(MultiheadAttention::new(&ctx, 0, 1, true, true, 1).is_err());
    let mha = MultiheadAttention::new(&ctx, 8, 2, true, true, 1).unwrap();
    let t = |s: &[usize]| Tensor::zeros(&ctx, s).unwrap();
    let d = AttentionOptions::default;
    let bad = |r: fucina::Result<(Tensor, Option<Tensor>)>, needle: &str| {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        assert!(
            e.to_string().contains(needle),
            "`{e}` should mention `{needle}`"
        );
    };
    let (q, kv) = (t(&[2, 3, 8]), t(&[2, 5, 8]));
    bad(mha.forward(&ctx, &t(&[2, 3, 7]), &kv, &kv, d()), "query");
    bad(
        mha.forward(&ctx, &q, &t(&[3, 5, 8]), &t(&[3, 5, 8]), d()),
        "batch",
    );
    bad(mha.forward(&ctx, &q, &kv, &t(&[2, 4, 8]), d()), "value");
    let pad = ctx.from_slice_typed::<bool>(&[2, 4], &[false; 8]).unwrap();
    let opts = AttentionOptions {
        key_padding_mask: Some(&pad),
        ..d()
    };
    bad(mha.forward(&ctx, &q, &kv, &kv, opts), "key padding mask");
    let m = ctx.from_slice_typed::<bool>(&[3, 4], &[false; 12]).unwrap();
    let opts = AttentionOptions {
        attn_mask: Some(AttnMask::Bool(&m)),
        ..d()
    };
    bad(mha.forward(&ctx, &q, &kv, &kv, opts), "attention mask");
    // Per-head masks: [N * heads, L, S].
    let m = ctx
        .from_slice_typed::<bool>(&[4, 3, 5], &[false; 60])
        .unwrap();
    let opts = AttentionOptions {
        attn_mask: Some(AttnMask::Bool(&m)),
        ..d()
    };
    let (y, w) = mha.forward(&ctx, &q, &kv, &kv, opts).unwrap();
    assert_eq!(y.shape(), [2, 3, 8]);
    assert_eq!(w.unwrap().shape(), [2, 3, 5]);
}

/// The per-head weights of one call of a dropout-0.4 attention in training
/// or evaluation mode, with the output's bits, on `threads` threads.
fn dropped(threads: usize, training: bool, step: u64) -> (Vec<f32>, Vec<u32>) {
    let ctx = ExecContext::with_threads(threads);
    let mut mha = MultiheadAttention::new(&ctx, 16, 4, true, true, 9)
        .unwrap()
        .with_dropout(0.4)
        .unwrap();
    mha.train(training);
    mha.attn_dropout().set_step(step);
    let x = Tensor::uniform(&ctx, &[4, 24, 16], -1.0, 1.0, 1).unwrap();
    let opts = AttentionOptions {
        average_attn_weights: false,
        ..Default::default()
    };
    let (y, w) = mha.forward(&ctx, &x, &x, &x, opts).unwrap();
    let bits = y.to_vec().iter().map(|v| v.to_bits()).collect();
    (w.unwrap().to_vec(), bits)
}

#[test]
fn weight_dropout_statistics_determinism_and_eval() {
    let (eval, eval_y) = dropped(1, false, 0);
    let (train, train_y) = dropped(1, true, 0);
    // Each weight is dropped (0) or kept and scaled by 1 / (1 - p).
    let mut zeros = 0;
    for (&t, &e) in train.iter().zip(&eval) {
        if t == 0.0 {
            zeros += 1;
        } else {
            assert!((t - e / 0.6).abs() <= 1e-6 * (1.0 + t.abs()), "{t} vs {e}");
        }
    }
    let frac = zeros as f64 / train.len() as f64;
    // 9216 weights: the dropped fraction within 5 sigma of p = 0.4.
    let sigma = (0.4f64 * 0.6 / train.len() as f64).sqrt();
    assert!((frac - 0.4).abs() < 5.0 * sigma, "dropped {frac}");
    assert_ne!(train_y, eval_y);
    // The same bits for 1 and 2 threads; the next call draws another mask,
    // and restoring the counter repeats it.
    assert_eq!(dropped(2, true, 0), (train.clone(), train_y.clone()));
    let next = dropped(1, true, 1);
    assert_ne!(next.0, train);
    assert_eq!(dropped(2, true, 1), next);
    // Evaluation mode is the layer without dropout.
    let ctx = ExecContext::new();
    let plain = MultiheadAttention::new(&ctx, 16, 4, true, true, 9).unwrap();
    let x = Tensor::uniform(&ctx, &[4, 24, 16], -1.0, 1.0, 1).unwrap();
    let y = Forward::forward(&plain, &ctx, &x).unwrap().to_vec();
    let y: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
    assert_eq!(y, eval_y);
    assert!(matches!(
        plain.with_dropout(1.0),
        Err(Error::InvalidArgument { .. })
    ));
}

/// The output and the gradients (`[y, dq, (dk, dv), parameters...]`) of
/// `sum(y * y)`, the gradients cleared after.
fn outputs_and_grads(
    ctx: &ExecContext,
    mha: &MultiheadAttention,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    need_weights: bool,
    key_padding_mask: Option<&RawTensor<bool>>,
) -> Vec<Vec<f32>> {
    let opts = AttentionOptions {
        need_weights,
        key_padding_mask,
        ..Default::default()
    };
    let (y, _) = mha.forward(ctx, q, k, v, opts).unwrap();
    y.mul(ctx, &y)
        .unwrap()
        .sum_all(ctx)
        .unwrap()
        .backward(ctx)
        .unwrap();
    let mut out = vec![y.to_vec()];
    let mut inputs = vec![q];
    if !std::ptr::eq(q, k) {
        inputs.extend([k, v]);
    }
    for t in inputs {
        out.push(t.grad(ctx).unwrap().expect("a variable").to_vec());
        t.zero_grad();
    }
    for (_, p) in mha.named_parameters() {
        out.push(p.grad(ctx).unwrap().expect("a gradient").to_vec());
        p.zero_grad();
    }
    out
}

#[test]
fn the_fused_paths_match_pytorch_and_the_composition() {
    let ctx = ExecContext::with_threads(2);
    // The fixture's first case (self-attention, no mask) without the
    // weights: the packed fused path, its output against PyTorch.
    let c = &parse()[0];
    assert!(c.flag("self") && c.kv["mask"] == "none");
    let mha = c.layer(&ctx);
    let q = c.tensor(&ctx, "query");
    let opts = AttentionOptions {
        need_weights: false,
        ..Default::default()
    };
    let (y, w) = mha.forward(&ctx, &q, &q, &q, opts).unwrap();
    assert!(w.is_none());
    close("fused self-attention y", &y, c.want("y"));
    // Self-attention (one tensor: the packed op) and cross-attention (three:
    // the three-operand op), batch-first and sequence-first: the output and
    // every gradient as the composition's (`need_weights` takes it).
    for batch_first in [true, false] {
        let mha = MultiheadAttention::new(&ctx, 16, 4, true, batch_first, 21).unwrap();
        let x = Tensor::randn(&ctx, &[3, 5, 16], 1.0, 22)
            .unwrap()
            .into_variable();
        let k = Tensor::randn(&ctx, &[3, 7, 16], 1.0, 23)
            .unwrap()
            .into_variable();
        let v = Tensor::randn(&ctx, &[3, 7, 16], 1.0, 24)
            .unwrap()
            .into_variable();
        let (k, v) = if batch_first {
            (k, v)
        } else {
            // [S, N, E] with N = 3: another batch, the same shapes.
            (
                k.reshape(&ctx, &[7, 3, 16]).unwrap(),
                v.reshape(&ctx, &[7, 3, 16]).unwrap(),
            )
        };
        let (k, v) = (k.detach().into_variable(), v.detach().into_variable());
        let x = if batch_first {
            x
        } else {
            x.reshape(&ctx, &[5, 3, 16])
                .unwrap()
                .detach()
                .into_variable()
        };
        // Key padding (`[N, S]`): sample b ignores the keys j with (j + b) % 3
        // == 1; the fused ops take it in, the composition fills the scores.
        let flags =
            |s: usize| -> Vec<bool> { (0..3 * s).map(|i| (i % s + i / s) % 3 == 1).collect() };
        let pad_self = ctx.from_slice_typed::<bool>(&[3, 5], &flags(5)).unwrap();
        let pad_cross = ctx.from_slice_typed::<bool>(&[3, 7], &flags(7)).unwrap();
        for (name, ins, pad) in [
            ("self", (&x, &x, &x), None),
            ("cross", (&x, &k, &v), None),
            ("self, key padding", (&x, &x, &x), Some(&pad_self)),
            ("cross, key padding", (&x, &k, &v), Some(&pad_cross)),
        ] {
            let fused = outputs_and_grads(&ctx, &mha, ins, false, pad);
            let composed = outputs_and_grads(&ctx, &mha, ins, true, pad);
            assert_eq!(fused.len(), composed.len());
            for (i, (a, b)) in fused.iter().zip(&composed).enumerate() {
                for (j, (&p, &r)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (p - r).abs() <= 1e-4 * (1.0 + r.abs()),
                        "{name} batch_first {batch_first}: output {i}[{j}]: fused {p}, composed {r}"
                    );
                }
            }
        }
    }
}
