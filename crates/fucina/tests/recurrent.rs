//! `nn::Lstm`, `nn::Gru` and their functional forms: outputs, final states and
//! every gradient against PyTorch's `nn.LSTM` / `nn.GRU` run in float64
//! (fixtures/recurrent.txt, written by fixtures/recurrent.py: several layers,
//! both directions, batch-first, with and without biases and initial
//! states), a PyTorch state dict loaded by name, gradcheck on small sizes,
//! PyTorch's init bounds, and bad input as errors. The fused cells
//! `lstm_cell` / `gru_cell` and the layers `LstmCell` / `GruCell` against
//! PyTorch's `nn.LSTMCell` / `nn.GRUCell` (fixtures/recurrent_cells.txt).

use std::collections::HashMap;

#[path = "fixtures/parse.rs"]
mod parse;

use fucina::autograd::{GradcheckOptions, gradcheck};
use fucina::nn::{Gru, GruCell, Lstm, LstmCell, Module, RnnOptions, StateDict, gru, lstm};
use fucina::{Error, ExecContext, Tensor};

/// One case of the fixture: its options and its named tensors.
struct Case {
    kind: String,
    input: usize,
    hidden: usize,
    opts: RnnOptions,
    state: bool,
    tensors: HashMap<String, (Vec<usize>, Vec<f64>)>,
    /// The parameter names in the file's (PyTorch's) order.
    params: Vec<String>,
}

fn parse() -> Vec<Case> {
    let cases: Vec<Case> = parse::blocks(include_str!("fixtures/recurrent.txt"))
        .into_iter()
        .map(|b| {
            let kv: HashMap<String, usize> = b.keys();
            Case {
                kind: b.header[0].clone(),
                input: kv["input"],
                hidden: kv["hidden"],
                opts: RnnOptions {
                    num_layers: kv["layers"],
                    bias: kv["bias"] == 1,
                    batch_first: kv["batch_first"] == 1,
                    bidirectional: kv["bidirectional"] == 1,
                },
                state: kv["state"] == 1,
                // The parameters come first among the tensors named like them.
                params: b
                    .order
                    .iter()
                    .filter(|n| n.starts_with("weight_") || n.starts_with("bias_"))
                    .cloned()
                    .collect(),
                tensors: b.tensors,
            }
        })
        .collect();
    assert_eq!(cases.len(), 4);
    cases
}

impl Case {
    fn tensor(&self, ctx: &ExecContext, name: &str) -> Tensor {
        let (shape, vals) = &self.tensors[name];
        let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
        Tensor::variable_from_slice(ctx, shape, &v).unwrap()
    }
    fn want(&self, name: &str) -> &[f64] {
        &self.tensors[name].1
    }
}

fn close(what: &str, got: &Tensor, want: &[f64]) {
    let g = got.to_vec();
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        assert!(
            (a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "{what}[{i}]: got {a}, PyTorch {b}"
        );
    }
}

/// Runs the functional form of a case: the output and the final states.
fn run(
    ctx: &ExecContext,
    c: &Case,
    x: &Tensor,
    h0: Option<&Tensor>,
    c0: Option<&Tensor>,
    w: &[Tensor],
) -> (Tensor, Tensor, Option<Tensor>) {
    if c.kind == "lstm" {
        let state = h0.zip(c0);
        let (y, (h, cn)) = lstm(ctx, x, state, w, c.hidden, c.opts).unwrap();
        (y, h, Some(cn))
    } else {
        let (y, h) = gru(ctx, x, h0, w, c.hidden, c.opts).unwrap();
        (y, h, None)
    }
}

#[test]
fn values_and_gradients_match_pytorch() {
    let ctx = ExecContext::with_threads(2);
    for c in parse() {
        let what = format!("{} {:?}", c.kind, c.opts);
        let x = c.tensor(&ctx, "x");
        let h0 = c.state.then(|| c.tensor(&ctx, "h0"));
        let c0 = (c.state && c.kind == "lstm").then(|| c.tensor(&ctx, "c0"));
        let w: Vec<Tensor> = c.params.iter().map(|n| c.tensor(&ctx, n)).collect();
        let (y, h, cn) = run(&ctx, &c, &x, h0.as_ref(), c0.as_ref(), &w);
        close(&format!("{what} y"), &y, c.want("y"));
        close(&format!("{what} h"), &h, c.want("h"));
        let dot = |t: &Tensor, name: &str| {
            t.mul(&ctx, &c.tensor(&ctx, name).detach())
                .unwrap()
                .sum_all(&ctx)
                .unwrap()
        };
        let mut loss = dot(&y, "gy").add(&ctx, &dot(&h, "gh")).unwrap();
        if let Some(cn) = &cn {
            close(&format!("{what} c"), cn, c.want("c"));
            loss = loss.add(&ctx, &dot(cn, "gc")).unwrap();
        }
        loss.backward(&ctx).unwrap();
        let grad = |t: &Tensor| t.grad(&ctx).unwrap().expect("a variable");
        close(&format!("{what} grad x"), &grad(&x), c.want("grad_x"));
        if let Some(h0) = &h0 {
            close(&format!("{what} grad h0"), &grad(h0), c.want("grad_h0"));
        }
        if let Some(c0) = &c0 {
            close(&format!("{what} grad c0"), &grad(c0), c.want("grad_c0"));
        }
        for (n, t) in c.params.iter().zip(&w) {
            close(
                &format!("{what} grad {n}"),
                &grad(t),
                c.want(&format!("grad_{n}")),
            );
        }
    }
}

/// The layers have PyTorch's parameter names, so a PyTorch state dict loads
/// into them by name, and then they compute what PyTorch computed.
#[test]
fn layers_load_pytorch_state_dicts_by_name() {
    let ctx = ExecContext::new();
    for c in parse() {
        let mut sd = StateDict::new();
        for n in &c.params {
            sd.insert(n.clone(), c.tensor(&ctx, n).detach()).unwrap();
        }
        let x = c.tensor(&ctx, "x").detach();
        let h0 = c.state.then(|| c.tensor(&ctx, "h0").detach());
        let (y, h) = if c.kind == "lstm" {
            let layer = Lstm::new(&ctx, c.input, c.hidden, c.opts, 9).unwrap();
            let names: Vec<String> = layer
                .named_parameters()
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            assert_eq!(names, c.params);
            layer.load_state_dict(&sd).unwrap();
            let c0 = c.state.then(|| c.tensor(&ctx, "c0").detach());
            let (y, (h, cn)) = layer
                .forward(&ctx, &x, h0.as_ref().zip(c0.as_ref()))
                .unwrap();
            close("layer c", &cn, c.want("c"));
            (y, h)
        } else {
            let layer = Gru::new(&ctx, c.input, c.hidden, c.opts, 9).unwrap();
            let names: Vec<String> = layer
                .named_parameters()
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            assert_eq!(names, c.params);
            layer.load_state_dict(&sd).unwrap();
            layer.forward(&ctx, &x, h0.as_ref()).unwrap()
        };
        close("layer y", &y, c.want("y"));
        close("layer h", &h, c.want("h"));
    }
}

/// Finite differences of every input of small LSTMs and GRUs (two layers,
/// both directions, batch-first, with initial states).
#[test]
fn gradcheck_small_recurrent_layers() {
    let ctx = ExecContext::new();
    let opts = RnnOptions {
        num_layers: 2,
        bias: true,
        batch_first: true,
        bidirectional: true,
    };
    let (inp, hid, steps, batch) = (2, 3, 3, 2);
    for kind in ["lstm", "gru"] {
        let layer_params: Vec<Tensor> = if kind == "lstm" {
            Lstm::new(&ctx, inp, hid, opts, 4)
                .unwrap()
                .named_parameters()
        } else {
            Gru::new(&ctx, inp, hid, opts, 4)
                .unwrap()
                .named_parameters()
        }
        .into_iter()
        .map(|(_, p)| p.tensor())
        .collect();
        let mut inputs = vec![
            Tensor::uniform(&ctx, &[batch, steps, inp], -1.0, 1.0, 1).unwrap(),
            Tensor::uniform(&ctx, &[4, batch, hid], -1.0, 1.0, 2).unwrap(),
            Tensor::uniform(&ctx, &[4, batch, hid], -1.0, 1.0, 3).unwrap(),
        ];
        inputs.extend(layer_params);
        let raw: Vec<_> = inputs.iter().map(|t| t.raw().clone()).collect();
        let f = |ctx: &ExecContext, t: &[Tensor]| -> fucina::Result<Tensor> {
            let w = &t[3..];
            let flat = |t: &Tensor| t.reshape(ctx, &[t.numel()]);
            if kind == "lstm" {
                let (y, (h, c)) = lstm(ctx, &t[0], Some((&t[1], &t[2])), w, hid, opts)?;
                Ok(Tensor::concat(
                    ctx,
                    &[&flat(&y)?, &flat(&h)?, &flat(&c)?],
                    0,
                )?)
            } else {
                let (y, h) = gru(ctx, &t[0], Some(&t[1]), w, hid, opts)?;
                let h = h.add(ctx, &t[2])?; // so that every input is used
                Ok(Tensor::concat(ctx, &[&flat(&y)?, &flat(&h)?], 0)?)
            }
        };
        let r = gradcheck(&ctx, f, &raw, &GradcheckOptions::default()).unwrap();
        assert!(r.passed, "{kind}: {r:?}");
        assert!(r.checked > 0);
    }
}

#[test]
fn init_is_pytorch_default_and_seeded() {
    let ctx = ExecContext::new();
    let opts = RnnOptions {
        num_layers: 2,
        ..Default::default()
    };
    let a = Lstm::new(&ctx, 10, 16, opts, 3).unwrap();
    let b = Lstm::new(&ctx, 10, 16, opts, 3).unwrap();
    let k = 0.25f32; // 1 / sqrt(16)
    let shapes: Vec<Vec<usize>> = a
        .named_parameters()
        .iter()
        .map(|(_, p)| p.shape().as_slice().to_vec())
        .collect();
    assert_eq!(
        shapes,
        [
            vec![64, 10],
            vec![64, 16],
            vec![64],
            vec![64],
            vec![64, 16],
            vec![64, 16],
            vec![64],
            vec![64]
        ]
    );
    for ((_, p), (_, q)) in a.named_parameters().iter().zip(b.named_parameters()) {
        let v = p.to_vec();
        assert!(v.iter().all(|x| x.abs() <= k));
        assert_eq!(v, q.to_vec());
    }
    let g = Gru::new(
        &ctx,
        10,
        16,
        RnnOptions {
            bias: false,
            ..Default::default()
        },
        3,
    )
    .unwrap();
    let names: Vec<String> = g.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight_ih_l0", "weight_hh_l0"]);
    assert_eq!(g.named_parameters()[0].1.shape().as_slice(), [48, 10]);
    assert_eq!((g.input_size(), g.hidden_size()), (10, 16));
}

#[test]
fn bad_arguments_and_inputs_are_errors() {
    let ctx = ExecContext::new();
    let d = RnnOptions::default();
    assert!(matches!(
        Lstm::new(&ctx, 0, 4, d, 1),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        Gru::new(&ctx, 3, 0, d, 1),
        Err(Error::InvalidArgument { .. })
    ));
    let zero_layers = RnnOptions { num_layers: 0, ..d };
    assert!(matches!(
        Lstm::new(&ctx, 3, 4, zero_layers, 1),
        Err(Error::InvalidArgument { .. })
    ));
    let l = Lstm::new(&ctx, 3, 4, d, 1).unwrap();
    let bad = |r: fucina::Result<(Tensor, (Tensor, Tensor))>, needle: &str| {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        assert!(
            e.to_string().contains(needle),
            "`{e}` should mention `{needle}`"
        );
    };
    let x = Tensor::zeros(&ctx, &[5, 2, 3]).unwrap();
    bad(
        l.forward(&ctx, &Tensor::zeros(&ctx, &[5, 2, 4]).unwrap(), None),
        "LSTM(input = 3",
    );
    bad(
        l.forward(&ctx, &Tensor::zeros(&ctx, &[5, 3]).unwrap(), None),
        "3 features",
    );
    let s = Tensor::zeros(&ctx, &[1, 3, 4]).unwrap();
    bad(l.forward(&ctx, &x, Some((&s, &s))), "initial state");
    let g = Gru::new(&ctx, 3, 4, d, 1).unwrap();
    let e = g
        .forward(&ctx, &x, Some(&Tensor::zeros(&ctx, &[2, 2, 4]).unwrap()))
        .unwrap_err();
    assert!(e.to_string().contains("[1, 2, 4]"), "{e}");
    // The functional form checks the weights.
    let w: Vec<Tensor> = l
        .named_parameters()
        .into_iter()
        .map(|(_, p)| p.tensor())
        .collect();
    let e = lstm(&ctx, &x, None, &w[..3], 4, d).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let e = lstm(&ctx, &x, None, &w, 5, d).unwrap_err();
    assert!(
        e.to_string().contains("weight_ih_l0 must be [20, 3]"),
        "{e}"
    );
    let e = gru(&ctx, &x, None, &w, 4, d).unwrap_err();
    assert!(
        e.to_string().contains("weight_ih_l0 must be [12, 3]"),
        "{e}"
    );
    // Good input works, from zeros: h stays bounded.
    let (y, (h, c)) = l.forward(&ctx, &x, None).unwrap();
    assert_eq!(y.shape(), [5, 2, 4]);
    assert_eq!(h.shape(), [1, 2, 4]);
    assert_eq!(c.shape(), [1, 2, 4]);
}

/// The output and the gradients are the same bits for 1 to 4 threads (the
/// ops' promise, kept by the composition).
#[test]
fn same_bits_for_every_thread_count() {
    let opts = RnnOptions {
        num_layers: 2,
        bidirectional: true,
        ..Default::default()
    };
    let mut want: Option<Vec<Vec<u32>>> = None;
    for threads in 1..=4 {
        let ctx = ExecContext::with_threads(threads);
        let l = Lstm::new(&ctx, 16, 32, opts, 5).unwrap();
        let x = Tensor::uniform(&ctx, &[6, 8, 16], -1.0, 1.0, 6)
            .unwrap()
            .into_variable();
        let (y, (h, _)) = l.forward(&ctx, &x, None).unwrap();
        let loss = y
            .mul(&ctx, &y)
            .unwrap()
            .sum_all(&ctx)
            .unwrap()
            .add(&ctx, &h.sum_all(&ctx).unwrap())
            .unwrap();
        loss.backward(&ctx).unwrap();
        let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        let mut got = vec![bits(&y), bits(&x.grad(&ctx).unwrap().unwrap())];
        for (_, p) in l.named_parameters() {
            got.push(bits(&p.grad(&ctx).unwrap().unwrap()));
        }
        match &want {
            None => want = Some(got),
            Some(w) => assert!(*w == got, "{threads} threads differ"),
        }
    }
}

/// The fused cells against PyTorch's `nn.LSTMCell` / `nn.GRUCell` in float64
/// (fixtures/recurrent_cells.txt, written by fixtures/recurrent.py): one step
/// from `x`, `h0` (and `c0`), the gates from `linear` into
/// `Tensor::lstm_cell` / `Tensor::gru_cell`, with and without biases; the
/// outputs and the gradients of every input and parameter.
#[test]
fn fused_cells_match_pytorch_lstm_cell_and_gru_cell() {
    let ctx = ExecContext::with_threads(2);
    let blocks = parse::blocks(include_str!("fixtures/recurrent_cells.txt"));
    assert_eq!(blocks.len(), 4);
    for b in blocks {
        let kind = b.header[0].clone();
        let bias = b.keys::<usize>()["bias"] == 1;
        let t = |name: &str| {
            let (shape, vals) = &b.tensors[name];
            let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
            Tensor::variable_from_slice(&ctx, shape, &v).unwrap()
        };
        let want = |name: &str| &b.tensors[name].1;
        let what = format!("{kind}_cell bias={bias}");
        let (x, h0, w_ih, w_hh) = (t("x"), t("h0"), t("weight_ih"), t("weight_hh"));
        let (b_ih, b_hh) = if bias {
            (Some(t("bias_ih")), Some(t("bias_hh")))
        } else {
            (None, None)
        };
        let gi = x.linear(&ctx, &w_ih, b_ih.as_ref()).unwrap();
        let gh = h0.linear(&ctx, &w_hh, b_hh.as_ref()).unwrap();
        let dot = |y: &Tensor, name: &str| {
            y.mul(&ctx, &t(name).detach())
                .unwrap()
                .sum_all(&ctx)
                .unwrap()
        };
        let c0 = (kind == "lstm").then(|| t("c0"));
        let loss = if let Some(c0) = &c0 {
            let (h, c) = gi.lstm_cell(&ctx, &gh, c0).unwrap();
            close(&format!("{what} h"), &h, want("h"));
            close(&format!("{what} c"), &c, want("c"));
            dot(&h, "gh").add(&ctx, &dot(&c, "gc")).unwrap()
        } else {
            let h = gi.gru_cell(&ctx, &gh, &h0).unwrap();
            close(&format!("{what} h"), &h, want("h"));
            dot(&h, "gh")
        };
        loss.backward(&ctx).unwrap();
        let grad = |t: &Tensor| t.grad(&ctx).unwrap().expect("a variable");
        let mut checks = vec![
            ("x", &x),
            ("h0", &h0),
            ("weight_ih", &w_ih),
            ("weight_hh", &w_hh),
        ];
        if let Some(c0) = &c0 {
            checks.push(("c0", c0));
        }
        if let (Some(bi), Some(bh)) = (&b_ih, &b_hh) {
            checks.extend([("bias_ih", bi), ("bias_hh", bh)]);
        }
        for (name, v) in checks {
            close(
                &format!("{what} grad {name}"),
                &grad(v),
                want(&format!("grad_{name}")),
            );
        }
    }
}

/// `LstmCell` and `GruCell`: PyTorch's parameter names, shapes and init
/// bounds; a PyTorch `nn.LSTMCell` / `nn.GRUCell` state dict loads by name and
/// gives PyTorch's step; the layer's bits are the fused op's; bad input is an
/// error naming the layer.
#[test]
fn cell_layers_are_pytorchs_cells() {
    let ctx = ExecContext::new();
    for b in parse::blocks(include_str!("fixtures/recurrent_cells.txt")) {
        let kv = b.keys::<usize>();
        let (inp, hid, bias) = (kv["input"], kv["hidden"], kv["bias"] == 1);
        let t = |name: &str| {
            let (shape, vals) = &b.tensors[name];
            let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
            Tensor::from_slice(&ctx, shape, &v).unwrap()
        };
        let params: Vec<String> = b
            .order
            .iter()
            .filter(|n| n.starts_with("weight_") || n.starts_with("bias_"))
            .cloned()
            .collect();
        let mut sd = StateDict::new();
        for n in &params {
            sd.insert(n.clone(), t(n)).unwrap();
        }
        let (x, h0) = (t("x"), t("h0"));
        let k = 1.0 / (hid as f32).sqrt();
        let check_init = |named: Vec<(String, fucina::nn::Parameter)>, gates: usize| {
            let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
            assert_eq!(names, params);
            for (n, p) in &named {
                let v = p.tensor().to_vec();
                assert_eq!(p.tensor().shape()[0], gates * hid, "{n}");
                assert!(v.iter().all(|x| x.abs() <= k), "{n} within U(-k, k)");
            }
        };
        if b.header[0] == "lstm" {
            let cell = LstmCell::new(&ctx, inp, hid, bias, 3).unwrap();
            assert_eq!((cell.input_size(), cell.hidden_size()), (inp, hid));
            check_init(cell.named_parameters(), 4);
            cell.load_state_dict(&sd).unwrap();
            let c0 = t("c0");
            let (h, c) = cell.forward(&ctx, &x, Some((&h0, &c0))).unwrap();
            close("LstmCell h", &h, &b.tensors["h"].1);
            close("LstmCell c", &c, &b.tensors["c"].1);
            // The layer is the linear gates into the fused op, bit for bit.
            let bi = bias.then(|| t("bias_ih"));
            let bh = bias.then(|| t("bias_hh"));
            let gi = x.linear(&ctx, &t("weight_ih"), bi.as_ref()).unwrap();
            let gh = h0.linear(&ctx, &t("weight_hh"), bh.as_ref()).unwrap();
            let (oh, oc) = gi.lstm_cell(&ctx, &gh, &c0).unwrap();
            assert_eq!(oh.to_vec(), h.to_vec());
            assert_eq!(oc.to_vec(), c.to_vec());
            // A zero state is the default.
            let z = Tensor::zeros(&ctx, h0.shape()).unwrap();
            let (hz, _) = cell.forward(&ctx, &x, None).unwrap();
            assert_eq!(
                hz.to_vec(),
                cell.forward(&ctx, &x, Some((&z, &z))).unwrap().0.to_vec()
            );
            let e = cell.forward(&ctx, &h0, None).unwrap_err();
            assert!(
                matches!(e, Error::ShapeMismatch { .. }) && e.to_string().contains("LstmCell"),
                "{e}"
            );
            let e = cell.forward(&ctx, &x, Some((&h0, &x))).unwrap_err();
            assert!(e.to_string().contains("state"), "{e}");
        } else {
            let cell = GruCell::new(&ctx, inp, hid, bias, 3).unwrap();
            assert_eq!((cell.input_size(), cell.hidden_size()), (inp, hid));
            check_init(cell.named_parameters(), 3);
            cell.load_state_dict(&sd).unwrap();
            let h = cell.forward(&ctx, &x, Some(&h0)).unwrap();
            close("GruCell h", &h, &b.tensors["h"].1);
            let e = cell.forward(&ctx, &x, Some(&x)).unwrap_err();
            assert!(
                matches!(e, Error::ShapeMismatch { .. }) && e.to_string().contains("GruCell"),
                "{e}"
            );
        }
    }
    assert!(matches!(
        LstmCell::new(&ctx, 0, 4, true, 1),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        GruCell::new(&ctx, 3, 0, false, 1),
        Err(Error::InvalidArgument { .. })
    ));
}
