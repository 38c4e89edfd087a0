//! The fused recurrent cells `Tensor::lstm_cell` and `Tensor::gru_cell` and
//! the sequence ops `Tensor::lstm_sequence` and `Tensor::gru_sequence`:
//! gradcheck of every input (contiguous, transposed and narrowed), the
//! gradients through a few chained steps with shared weights, the sequence
//! ops against the cell loop (values bitwise, gradients within rounding), the node names,
//! and zero heap allocations and pool misses per training step after warm-up
//! (a counting global allocator; each test in a process of its own, see
//! `allocations.rs`).

mod support;

use fucina_autograd::Tensor;
use fucina_autograd::exec::ExecContext;
use support::{check, check_layouts, values};

#[path = "support/alloc_count.rs"]
mod alloc_count;
use alloc_count::{Counting, assert_steady_step, count, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

const B: usize = 2;
const H: usize = 3;

#[test]
fn gradcheck_lstm_cell_every_input_and_layout() {
    let ctx = ExecContext::new();
    let (gi, gh) = (
        values(B * 4 * H, 1, -2.0, 2.0),
        values(B * 4 * H, 2, -2.0, 2.0),
    );
    let c = values(B * H, 3, -1.5, 1.5);
    let ins: [(&[usize], Vec<f32>); 3] = [(&[B, 4 * H], gi), (&[B, 4 * H], gh), (&[B, H], c)];
    // Both outputs, each weighted differently so a swap would show.
    check_layouts(
        &ctx,
        "lstm_cell h and c",
        |ctx, t| {
            let (h, c) = t[0].lstm_cell(ctx, &t[1], &t[2])?;
            h.add(ctx, &c.scale(ctx, 0.3)?)
        },
        &ins,
    );
    check_layouts(
        &ctx,
        "lstm_cell h only",
        |ctx, t| Ok(t[0].lstm_cell(ctx, &t[1], &t[2])?.0),
        &ins,
    );
    check_layouts(
        &ctx,
        "lstm_cell c only",
        |ctx, t| Ok(t[0].lstm_cell(ctx, &t[1], &t[2])?.1),
        &ins,
    );
}

#[test]
fn gradcheck_gru_cell_every_input_and_layout() {
    let ctx = ExecContext::new();
    let (gi, gh) = (
        values(B * 3 * H, 4, -2.0, 2.0),
        values(B * 3 * H, 5, -2.0, 2.0),
    );
    let h = values(B * H, 6, -1.5, 1.5);
    check_layouts(
        &ctx,
        "gru_cell",
        |ctx, t| t[0].gru_cell(ctx, &t[1], &t[2]),
        &[(&[B, 3 * H], gi), (&[B, 3 * H], gh), (&[B, H], h)],
    );
}

/// Three steps of each cell with the gates from `linear` over shared weights:
/// the gradients of the weights add up over the steps.
#[test]
fn gradcheck_chained_steps_with_shared_weights() {
    let ctx = ExecContext::new();
    let (i, steps) = (2, 3);
    let t = |s: &[usize], seed| {
        ctx.from_slice(s, &values(s.iter().product(), seed, -1.0, 1.0))
            .unwrap()
    };
    let ins = [
        t(&[steps * B, i], 10),
        t(&[4 * H, i], 11),
        t(&[4 * H, H], 12),
        t(&[4 * H], 13),
    ];
    check(
        &ctx,
        "lstm_cell over three steps",
        |ctx, t| {
            let (mut h, mut c) = (Tensor::zeros(ctx, &[B, H])?, Tensor::zeros(ctx, &[B, H])?);
            for s in 0..steps {
                let x = t[0].narrow(ctx, 0, s * B, B)?;
                let gi = x.linear(ctx, &t[1], Some(&t[3]))?;
                (h, c) = gi.lstm_cell(ctx, &h.linear(ctx, &t[2], None)?, &c)?;
            }
            h.mul(ctx, &c)
        },
        &ins,
    );
    let ins = [
        t(&[steps * B, i], 14),
        t(&[3 * H, i], 15),
        t(&[3 * H, H], 16),
        t(&[3 * H], 17),
        t(&[B, H], 18),
    ];
    check(
        &ctx,
        "gru_cell over three steps",
        |ctx, t| {
            let mut h = t[4].clone();
            for s in 0..steps {
                let x = t[0].narrow(ctx, 0, s * B, B)?;
                let gi = x.linear(ctx, &t[1], None)?;
                h = gi.gru_cell(ctx, &h.linear(ctx, &t[2], Some(&t[3]))?, &h)?;
            }
            Ok(h)
        },
        &ins,
    );
}

/// The parameters of one layer and direction: `w_ih`, `w_hh`, `b_ih`,
/// `b_hh`, the input and the initial state (`[2, B, H]` for the LSTM).
fn seq_inputs(ctx: &ExecContext, g: usize, i: usize, steps: usize, st: &[usize]) -> Vec<RawT> {
    let t = |s: &[usize], seed, scale: f32| {
        ctx.from_slice(s, &values(s.iter().product(), seed, -scale, scale))
            .unwrap()
    };
    let h = st[st.len() - 1];
    vec![
        t(&[g, i], 20, 0.6),
        t(&[g, h], 21, 0.6),
        t(&[g], 22, 0.6),
        t(&[g], 23, 0.6),
        t(&[steps, B, i], 24, 1.5),
        t(st, 25, 1.0),
    ]
}

type RawT = fucina_autograd::exec::RawTensor;

/// The sequence op over `t` (`w_ih, w_hh, b_ih, b_hh, x, state`).
fn sequence(
    ctx: &ExecContext,
    lstm: bool,
    t: &[Tensor],
    bias: bool,
    reverse: bool,
) -> fucina_autograd::Result<Tensor> {
    let biases = bias.then_some((&t[2], &t[3]));
    let w = Tensor::rnn_flat_weight(ctx, &t[0], &t[1], biases)?;
    if lstm {
        t[4].lstm_sequence(ctx, &w, &t[5], reverse)
    } else {
        t[4].gru_sequence(ctx, &w, &t[5], reverse)
    }
}

/// The same outputs from the step-by-step loop of `linear` and the cell.
fn cell_loop(
    ctx: &ExecContext,
    lstm: bool,
    t: &[Tensor],
    bias: bool,
    reverse: bool,
) -> fucina_autograd::Result<Tensor> {
    let steps = t[4].shape()[0];
    let (b_ih, b_hh) = if bias {
        (Some(&t[2]), Some(&t[3]))
    } else {
        (None, None)
    };
    let (mut h, mut c) = if lstm {
        (
            t[5].narrow(ctx, 0, 0, 1)?.squeeze(ctx, 0)?,
            t[5].narrow(ctx, 0, 1, 1)?.squeeze(ctx, 0)?,
        )
    } else {
        (t[5].clone(), t[5].clone())
    };
    let mut outs = vec![None; steps];
    for s in 0..steps {
        let tt = if reverse { steps - 1 - s } else { s };
        let gi = t[4]
            .narrow(ctx, 0, tt, 1)?
            .squeeze(ctx, 0)?
            .linear(ctx, &t[0], b_ih)?;
        let gh = h.linear(ctx, &t[1], b_hh)?;
        if lstm {
            (h, c) = gi.lstm_cell(ctx, &gh, &c)?;
        } else {
            h = gi.gru_cell(ctx, &gh, &h)?;
        }
        outs[tt] = Some(h.clone());
    }
    let mut refs: Vec<&Tensor> = outs.iter().flatten().collect();
    if lstm {
        refs.push(&c);
    }
    Tensor::stack(ctx, &refs, 0)
}

#[test]
fn gradcheck_sequence_ops_every_input_both_directions() {
    let ctx = ExecContext::new();
    let (i, steps) = (2, 3);
    for (lstm, g, st) in [(true, 4 * H, vec![2, B, H]), (false, 3 * H, vec![B, H])] {
        let ins = seq_inputs(&ctx, g, i, steps, &st);
        for bias in [true, false] {
            for reverse in [false, true] {
                let what = format!("sequence lstm {lstm} bias {bias} reverse {reverse}");
                check(
                    &ctx,
                    &what,
                    |ctx, t| sequence(ctx, lstm, t, bias, reverse),
                    &ins,
                );
            }
        }
    }
}

#[test]
fn sequence_ops_match_the_cell_loop() {
    let ctx = ExecContext::with_threads(2);
    let (i, steps, h) = (9, 6, 21);
    for (lstm, g, st) in [(true, 4 * h, vec![2, B, h]), (false, 3 * h, vec![B, h])] {
        let raw = seq_inputs(&ctx, g, i, steps, &st);
        for (bias, reverse) in [(true, false), (false, true)] {
            let run = |f: &dyn Fn(&[Tensor]) -> fucina_autograd::Result<Tensor>| {
                let vars: Vec<Tensor> = raw
                    .iter()
                    .map(|r| Tensor::constant(r.clone()).into_variable())
                    .collect();
                let y = f(&vars).unwrap();
                let wts = Tensor::randn(&ctx, y.shape(), 1.0, 30).unwrap();
                y.mul(&ctx, &wts)
                    .unwrap()
                    .sum_all(&ctx)
                    .unwrap()
                    .backward(&ctx)
                    .unwrap();
                let grads: Vec<Vec<f32>> = vars
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| bias || !(2..4).contains(k))
                    .map(|(_, v)| v.grad(&ctx).unwrap().unwrap().to_vec())
                    .collect();
                (y.to_vec(), grads)
            };
            let (y_seq, g_seq) = run(&|t| sequence(&ctx, lstm, t, bias, reverse));
            let (y_loop, g_loop) = run(&|t| cell_loop(&ctx, lstm, t, bias, reverse));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y_seq), bits(&y_loop), "lstm {lstm}: forward bits");
            for (k, (a, b)) in g_seq.iter().zip(&g_loop).enumerate() {
                let scale = b.iter().fold(1f32, |m, x| m.max(x.abs()));
                let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    worst <= 1e-5 * scale,
                    "lstm {lstm} bias {bias} reverse {reverse}: gradient {k} off by {worst} (scale {scale})"
                );
            }
        }
    }
}

#[test]
fn the_cells_are_one_node_each() {
    let ctx = ExecContext::new();
    let gi = Tensor::zeros(&ctx, &[B, 4 * H]).unwrap().into_variable();
    let gh = Tensor::zeros(&ctx, &[B, 4 * H]).unwrap();
    let c = Tensor::zeros(&ctx, &[B, H]).unwrap();
    let (h1, c1) = gi.lstm_cell(&ctx, &gh, &c).unwrap();
    // h' and c' are views (narrow, squeeze) of the one fused node.
    assert_eq!(h1.op_name(), Some("squeeze"));
    assert_eq!(c1.shape(), [B, H]);
    let g3 = Tensor::zeros(&ctx, &[B, 3 * H]).unwrap().into_variable();
    let h = Tensor::zeros(&ctx, &[B, H]).unwrap();
    assert_eq!(
        g3.gru_cell(&ctx, &g3, &h).unwrap().op_name(),
        Some("gru_cell")
    );
    // A bad shape is the exec layer's error, naming the op.
    let e = gi
        .lstm_cell(&ctx, &gh, &h1.reshape(&ctx, &[H, B]).unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("lstm_cell"), "{e}");
}

/// Weights of a two-step LSTM and a two-step GRU.
struct Params {
    w_ih: Tensor,
    w_hh: Tensor,
    b: Tensor,
    v_ih: Tensor,
    v_hh: Tensor,
}

/// Two LSTM steps then two GRU steps over `x` (`[2B, 8]`), the sequence ops
/// over the same two steps, a loss, backward, SGD. Returns the loss.
fn step(ctx: &ExecContext, p: &mut Params, x: &Tensor, scoped: bool) -> f32 {
    let (b, h) = (32, 64);
    let scope = scoped.then(|| ctx.open_exec_scope());
    let zeros = Tensor::constant(ctx.zeros(&[b, h]).unwrap());
    let (mut hs, mut cs) = (zeros.clone(), zeros.clone());
    let mut g = zeros.clone();
    for s in 0..2 {
        let xs = x.narrow(ctx, 0, s * b, b).unwrap();
        let gi = xs.linear(ctx, &p.w_ih, Some(&p.b)).unwrap();
        let gh = hs.linear(ctx, &p.w_hh, None).unwrap();
        (hs, cs) = gi.lstm_cell(ctx, &gh, &cs).unwrap();
        let gi = xs.linear(ctx, &p.v_ih, None).unwrap();
        g = gi
            .gru_cell(ctx, &g.linear(ctx, &p.v_hh, None).unwrap(), &g)
            .unwrap();
    }
    // The sequence ops over the same two steps, both directions.
    let xs = x.reshape(ctx, &[2, b, x.shape()[1]]).unwrap();
    let w = Tensor::rnn_flat_weight(ctx, &p.w_ih, &p.w_hh, Some((&p.b, &p.b))).unwrap();
    let st = Tensor::constant(ctx.zeros(&[2, b, h]).unwrap());
    let ls = xs.lstm_sequence(ctx, &w, &st, false).unwrap();
    let v = Tensor::rnn_flat_weight(ctx, &p.v_ih, &p.v_hh, None).unwrap();
    let gs = xs.gru_sequence(ctx, &v, &zeros, true).unwrap();
    let seq = ls
        .mean_all(ctx)
        .unwrap()
        .add(ctx, &gs.mean_all(ctx).unwrap())
        .unwrap();
    let loss = hs
        .mul(ctx, &g)
        .unwrap()
        .add(ctx, &cs)
        .unwrap()
        .mean_all(ctx)
        .unwrap()
        .add(ctx, &seq)
        .unwrap();
    let value = loss.item().unwrap();
    loss.backward(ctx).unwrap();
    drop((hs, cs, g, loss, zeros, ls, gs, seq, w, v, st));
    if let Some(scope) = scope {
        ctx.close_exec_scope(scope);
    }
    for t in [&mut p.w_ih, &mut p.w_hh, &mut p.b, &mut p.v_ih, &mut p.v_hh] {
        t.sgd_step_(0.5).unwrap();
        t.zero_grad();
    }
    value
}

fn run(threads: usize, scoped: bool) {
    let ctx = ExecContext::with_threads(threads);
    let (b, h, i) = (32, 64, 8);
    let x = Tensor::randn(&ctx, &[2 * b, i], 1.0, 1).unwrap();
    let w = |s: &[usize], seed| Tensor::randn(&ctx, s, 0.3, seed).unwrap().into_variable();
    let mut p = Params {
        w_ih: w(&[4 * h, i], 2),
        w_hh: w(&[4 * h, h], 3),
        b: w(&[4 * h], 4),
        v_ih: w(&[3 * h, i], 5),
        v_hh: w(&[3 * h, h], 6),
    };
    let first = step(&ctx, &mut p, &x, scoped); // warm-up
    step(&ctx, &mut p, &x, scoped);
    let mut last = first;
    let (allocs, misses) = count(|| {
        for _ in 0..3 {
            last = step(&ctx, &mut p, &x, scoped);
        }
    });
    assert_steady_step(
        &ctx,
        (first, last),
        (allocs, misses),
        &format!("{threads} threads, scoped {scoped}"),
    );
}

#[test]
fn zero_allocations_per_recurrent_step_one_thread() {
    in_own_process("zero_allocations_per_recurrent_step_one_thread", || {
        run(1, true);
        run(1, false);
    });
}

#[test]
fn zero_allocations_per_recurrent_step_two_threads() {
    in_own_process("zero_allocations_per_recurrent_step_two_threads", || {
        run(2, true);
        run(2, false);
    });
}
