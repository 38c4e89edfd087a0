//! `nn::TransformerEncoderLayer` and `nn::TransformerDecoderLayer`: outputs
//! and every gradient against PyTorch's layers run in float64 in evaluation
//! mode (fixtures/transformer.txt, written by fixtures/transformer.py:
//! post- and pre-norm, ReLU and GELU, batch-first and sequence-first, causal
//! masks, key-padding masks on the target and the memory, `bias=False`),
//! loaded through a state dict by PyTorch's names in PyTorch's order;
//! defaults; dropout (the attention weights' too) in training mode only, the
//! same bits for 1 and 2 threads; bad input as errors.

use std::collections::HashMap;

#[path = "fixtures/parse.rs"]
mod parse;

use fucina::nn::{
    AttentionOptions, AttnMask, Forward, Module, StateDict, TransformerActivation,
    TransformerDecoderLayer, TransformerEncoderLayer, TransformerOptions,
};
use fucina::{Error, ExecContext, RawTensor, Tensor};

struct Case {
    kv: HashMap<String, String>,
    tensors: HashMap<String, (Vec<usize>, Vec<f64>)>,
    params: Vec<String>,
}

fn parse() -> Vec<Case> {
    let cases: Vec<Case> = parse::blocks(include_str!("fixtures/transformer.txt"))
        .into_iter()
        .map(|b| Case {
            kv: b.keys(),
            params: b
                .order
                .iter()
                .filter_map(|n| n.strip_prefix("param.").map(String::from))
                .collect(),
            tensors: b.tensors,
        })
        .collect();
    assert_eq!(cases.len(), 6);
    cases
}

impl Case {
    fn n(&self, k: &str) -> usize {
        self.kv[k].parse().unwrap()
    }
    fn flag(&self, k: &str) -> bool {
        self.kv[k] == "1"
    }
    fn tensor(&self, ctx: &ExecContext, name: &str) -> Option<Tensor> {
        let (shape, vals) = self.tensors.get(name)?;
        let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
        Some(Tensor::variable_from_slice(ctx, shape, &v).unwrap())
    }
    fn mask(&self, ctx: &ExecContext, name: &str) -> Option<RawTensor<bool>> {
        let (shape, vals) = self.tensors.get(name)?;
        let v: Vec<bool> = vals.iter().map(|&x| x != 0.0).collect();
        Some(ctx.from_slice_typed::<bool>(shape, &v).unwrap())
    }
    fn want(&self, name: &str) -> &[f64] {
        &self.tensors[name].1
    }
    fn options(&self) -> TransformerOptions {
        TransformerOptions {
            dim_feedforward: self.n("ff"),
            activation: match self.kv["activation"].as_str() {
                "relu" => TransformerActivation::Relu,
                _ => TransformerActivation::Gelu,
            },
            batch_first: self.flag("batch_first"),
            norm_first: self.flag("norm_first"),
            bias: self.flag("bias"),
            ..TransformerOptions::default()
        }
    }
    fn state(&self, ctx: &ExecContext, names: &[String]) -> StateDict {
        assert_eq!(names, self.params, "PyTorch's names, in its order");
        let mut sd = StateDict::new();
        for n in &self.params {
            let t = self.tensor(ctx, &format!("param.{n}")).unwrap();
            sd.insert(n.clone(), t.detach()).unwrap();
        }
        sd
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
fn outputs_and_gradients_match_pytorch() {
    let ctx = ExecContext::with_threads(2);
    for c in parse() {
        let what = format!("{:?}", c.kv);
        let (d, h, opts) = (c.n("d_model"), c.n("heads"), c.options());
        let x = c.tensor(&ctx, "x").unwrap();
        let mask = c.mask(&ctx, "mask");
        let pad = c.mask(&ctx, "key_padding_mask");
        let self_masks = AttentionOptions {
            key_padding_mask: pad.as_ref(),
            attn_mask: mask.as_ref().map(AttnMask::Bool),
            ..Default::default()
        };
        let (y, params, memory) = if c.kv["kind"] == "encoder" {
            let mut layer = TransformerEncoderLayer::new(&ctx, d, h, opts, 5).unwrap();
            layer.train(false);
            let names: Vec<String> = layer
                .named_parameters()
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            layer.load_state_dict(&c.state(&ctx, &names)).unwrap();
            let y = layer.forward_with(&ctx, &x, self_masks).unwrap();
            (y, layer.named_parameters(), None)
        } else {
            let mut layer = TransformerDecoderLayer::new(&ctx, d, h, opts, 5).unwrap();
            layer.train(false);
            let names: Vec<String> = layer
                .named_parameters()
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            layer.load_state_dict(&c.state(&ctx, &names)).unwrap();
            let memory = c.tensor(&ctx, "memory").unwrap();
            let mpad = c.mask(&ctx, "memory_key_padding_mask");
            let memory_masks = AttentionOptions {
                key_padding_mask: mpad.as_ref(),
                ..Default::default()
            };
            let y = layer
                .forward(&ctx, &x, &memory, self_masks, memory_masks)
                .unwrap();
            (y, layer.named_parameters(), Some(memory))
        };
        close(&format!("{what} y"), &y, c.want("y"));
        let gy = c.tensor(&ctx, "gy").unwrap().detach();
        y.mul(&ctx, &gy)
            .unwrap()
            .sum_all(&ctx)
            .unwrap()
            .backward(&ctx)
            .unwrap();
        close(
            &format!("{what} grad_x"),
            &x.grad(&ctx).unwrap().unwrap(),
            c.want("grad_x"),
        );
        if let Some(m) = memory {
            close(
                &format!("{what} grad_memory"),
                &m.grad(&ctx).unwrap().unwrap(),
                c.want("grad_memory"),
            );
        }
        for (name, p) in params {
            let g = p.tensor().grad(&ctx).unwrap().unwrap();
            close(
                &format!("{what} grad {name}"),
                &g,
                c.want(&format!("grad.{name}")),
            );
        }
    }
}

#[test]
fn defaults_names_and_dropout() {
    let ctx = ExecContext::new();
    let o = TransformerOptions::default();
    assert_eq!(
        (o.dim_feedforward, o.dropout, o.activation, o.layer_norm_eps),
        (2048, 0.1, TransformerActivation::Relu, 1e-5)
    );
    assert!(!o.batch_first && !o.norm_first);
    let enc = TransformerEncoderLayer::new(&ctx, 16, 4, o, 1).unwrap();
    let shapes: Vec<(String, Vec<usize>)> = enc
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.shape().as_slice().to_vec()))
        .collect();
    assert_eq!(shapes[4], ("linear1.weight".to_string(), vec![2048, 16]));
    assert_eq!(shapes[6], ("linear2.weight".to_string(), vec![16, 2048]));
    assert_eq!(shapes.len(), 12);
    let dec = TransformerDecoderLayer::new(&ctx, 16, 4, o, 1).unwrap();
    let names: Vec<String> = dec.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 18);
    assert_eq!(names[4], "multihead_attn.in_proj_weight");
    assert_eq!(names[17], "norm3.bias");

    // Training mode: dropout changes the output; evaluation mode: the same
    // bits twice.
    let small = TransformerOptions {
        dim_feedforward: 32,
        dropout: 0.5,
        batch_first: true,
        ..o
    };
    let mut enc = TransformerEncoderLayer::new(&ctx, 8, 2, small, 2).unwrap();
    let x = Tensor::uniform(&ctx, &[2, 5, 8], -1.0, 1.0, 3).unwrap();
    let a = enc.forward(&ctx, &x).unwrap().to_vec();
    let b = enc.forward(&ctx, &x).unwrap().to_vec();
    assert_ne!(a, b, "dropout draws a new mask each call");
    enc.train(false);
    let a = enc.forward(&ctx, &x).unwrap().to_vec();
    assert_eq!(a, enc.forward(&ctx, &x).unwrap().to_vec());
    let no_drop = TransformerOptions {
        dropout: 0.0,
        ..small
    };
    let mut same = TransformerEncoderLayer::new(&ctx, 8, 2, no_drop, 2).unwrap();
    same.train(true);
    assert_eq!(
        same.forward(&ctx, &x).unwrap().to_vec(),
        a,
        "eval = no dropout"
    );
}

#[test]
fn bad_arguments_and_inputs_are_errors() {
    let ctx = ExecContext::new();
    let o = TransformerOptions {
        dim_feedforward: 8,
        ..TransformerOptions::default()
    };
    let invalid = |r: Result<(), Error>| matches!(r, Err(Error::InvalidArgument { .. }));
    assert!(invalid(
        TransformerEncoderLayer::new(&ctx, 6, 4, o, 1).map(drop)
    ));
    assert!(invalid(
        TransformerEncoderLayer::new(&ctx, 0, 1, o, 1).map(drop)
    ));
    let bad_drop = TransformerOptions { dropout: 1.0, ..o };
    assert!(invalid(
        TransformerDecoderLayer::new(&ctx, 4, 2, bad_drop, 1).map(drop)
    ));
    let zero_ff = TransformerOptions {
        dim_feedforward: 0,
        ..o
    };
    assert!(invalid(
        TransformerDecoderLayer::new(&ctx, 4, 2, zero_ff, 1).map(drop)
    ));

    let enc = TransformerEncoderLayer::new(&ctx, 4, 2, o, 1).unwrap();
    let e = enc
        .forward(&ctx, &Tensor::zeros(&ctx, &[3, 5]).unwrap())
        .unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { .. })
            && e.to_string().contains("TransformerEncoderLayer"),
        "{e}"
    );
    let e = enc
        .forward(&ctx, &Tensor::zeros(&ctx, &[3, 2, 5]).unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    let dec = TransformerDecoderLayer::new(&ctx, 4, 2, o, 1).unwrap();
    let tgt = Tensor::zeros(&ctx, &[3, 2, 4]).unwrap();
    let none = AttentionOptions::default;
    let e = dec
        .forward(
            &ctx,
            &tgt,
            &Tensor::zeros(&ctx, &[5, 2, 3]).unwrap(),
            none(),
            none(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("TransformerDecoderLayer"), "{e}");
    // A memory with another batch size.
    let mem = Tensor::zeros(&ctx, &[5, 3, 4]).unwrap();
    assert!(dec.forward(&ctx, &tgt, &mem, none(), none()).is_err());
    // A key padding mask of the wrong shape.
    let pad = ctx.from_slice_typed::<bool>(&[2, 4], &[false; 8]).unwrap();
    let masks = AttentionOptions {
        key_padding_mask: Some(&pad),
        ..Default::default()
    };
    assert!(enc.forward_with(&ctx, &tgt, masks).is_err());
}

#[test]
fn no_bias_has_no_bias_parameters() {
    let ctx = ExecContext::new();
    let o = TransformerOptions {
        dim_feedforward: 16,
        bias: false,
        ..TransformerOptions::default()
    };
    let enc = TransformerEncoderLayer::new(&ctx, 8, 2, o, 1).unwrap();
    let names: Vec<String> = enc.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "self_attn.in_proj_weight",
            "self_attn.out_proj.weight",
            "linear1.weight",
            "linear2.weight",
            "norm1.weight",
            "norm2.weight"
        ]
    );
    let dec = TransformerDecoderLayer::new(&ctx, 8, 2, o, 1).unwrap();
    assert_eq!(dec.named_parameters().len(), 9);
    assert!(
        dec.named_parameters()
            .iter()
            .all(|(n, _)| !n.contains("bias"))
    );
}

/// One training-mode forward and backward of an encoder and a decoder layer
/// with dropout on `threads` threads: the outputs and every gradient's bits.
fn dropout_step(threads: usize) -> Vec<Vec<u32>> {
    let ctx = ExecContext::with_threads(threads);
    let o = TransformerOptions {
        dim_feedforward: 24,
        dropout: 0.3,
        batch_first: true,
        ..TransformerOptions::default()
    };
    let enc = TransformerEncoderLayer::new(&ctx, 16, 4, o, 7).unwrap();
    let dec = TransformerDecoderLayer::new(&ctx, 16, 4, o, 8).unwrap();
    let x0 = Tensor::uniform(&ctx, &[3, 9, 16], -1.0, 1.0, 1).unwrap();
    let x = Tensor::variable_from_slice(&ctx, &[3, 9, 16], &x0.to_vec()).unwrap();
    let mem = Tensor::uniform(&ctx, &[3, 5, 16], -1.0, 1.0, 2).unwrap();
    let none = AttentionOptions::default;
    let h = enc.forward(&ctx, &x).unwrap();
    let y = dec.forward(&ctx, &h, &mem, none(), none()).unwrap();
    y.mul(&ctx, &y)
        .unwrap()
        .sum_all(&ctx)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect();
    let mut out = vec![bits(&y), bits(&x.grad(&ctx).unwrap().unwrap())];
    for (_, p) in enc
        .named_parameters()
        .into_iter()
        .chain(dec.named_parameters())
    {
        out.push(bits(&p.tensor().grad(&ctx).unwrap().unwrap()));
    }
    out
}

#[test]
fn training_dropout_is_the_same_bits_for_any_thread_count() {
    let one = dropout_step(1);
    assert_eq!(one, dropout_step(2));
    assert_eq!(one, dropout_step(1), "the same seed, the same masks");
}

#[test]
fn attention_weight_dropout_is_on_in_training_only() {
    // The attention's dropout draws a mask per training-mode call and none
    // in evaluation mode.
    let ctx = ExecContext::new();
    let o = TransformerOptions {
        dim_feedforward: 16,
        dropout: 0.5,
        batch_first: true,
        ..TransformerOptions::default()
    };
    let mut enc = TransformerEncoderLayer::new(&ctx, 8, 2, o, 3).unwrap();
    assert_eq!(enc.self_attn().attn_dropout().step(), 0);
    let x = Tensor::uniform(&ctx, &[2, 6, 8], -1.0, 1.0, 4).unwrap();
    enc.forward(&ctx, &x).unwrap();
    assert_eq!(
        enc.self_attn().attn_dropout().step(),
        1,
        "the attention drew one mask"
    );
    enc.train(false);
    enc.forward(&ctx, &x).unwrap();
    assert_eq!(
        enc.self_attn().attn_dropout().step(),
        1,
        "none in eval mode"
    );
    assert!(!enc.self_attn().attn_dropout().is_training());
}
