//! The sequence ops `lstm_sequence` and `gru_sequence` and their backward
//! kernels: the forward is bitwise the step-by-step loop of `linear` and the
//! fused cells (both directions, with and without biases); the backward's
//! gradients match float64 central differences; bad shapes are errors naming
//! the op; the same bits for 1 to 4 threads.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{ExecContext, ExecError, RawTensor};
use support::{nan_bits, values};

/// A tensor of `values` of `shape` from `seed`, scaled by `scale`.
fn t(ctx: &ExecContext, shape: &[usize], seed: u64, scale: f32) -> RawTensor {
    let v: Vec<f32> = values(shape.iter().product(), seed)
        .into_iter()
        .map(|x| x * scale)
        .collect();
    ctx.from_slice(shape, &v).unwrap()
}

/// The flat weight `[g·h, i + h (+ 2)]` from its parts.
fn flat(ctx: &ExecContext, parts: &[&RawTensor]) -> RawTensor {
    let refs: Vec<&RawTensor> = parts.to_vec();
    ctx.concat(&refs, 1).unwrap()
}

/// The step-by-step loop of `linear` and the cell: the outputs the sequence
/// op returns (LSTM: `[T + 1, B, H]` with `c_n` last; GRU: `[T, B, H]`).
#[allow(clippy::too_many_arguments)]
fn cell_loop(
    ctx: &ExecContext,
    lstm: bool,
    x: &RawTensor,
    w_ih: &RawTensor,
    w_hh: &RawTensor,
    b: Option<(&RawTensor, &RawTensor)>,
    state: &RawTensor,
    reverse: bool,
) -> Vec<u32> {
    let (steps, batch, hid) = (x.shape()[0], x.shape()[1], w_hh.shape()[1]);
    let (mut h, mut c) = if lstm {
        (
            state.narrow(0, 0, 1).unwrap().squeeze(0).unwrap(),
            state.narrow(0, 1, 1).unwrap().squeeze(0).unwrap(),
        )
    } else {
        (state.clone(), state.clone())
    };
    let mut outs = vec![None; steps];
    for s in 0..steps {
        let tt = if reverse { steps - 1 - s } else { s };
        let xt = x.narrow(0, tt, 1).unwrap().squeeze(0).unwrap();
        let gi = ctx.linear(&xt, w_ih, b.map(|b| b.0)).unwrap();
        let gh = ctx.linear(&h, w_hh, b.map(|b| b.1)).unwrap();
        if lstm {
            let (hc, _) = ctx.lstm_cell(&gi, &gh, &c).unwrap();
            h = hc.narrow(0, 0, 1).unwrap().squeeze(0).unwrap();
            c = hc.narrow(0, 1, 1).unwrap().squeeze(0).unwrap();
        } else {
            h = ctx.gru_cell(&gi, &gh, &h).unwrap().0;
        }
        outs[tt] = Some(nan_bits(&h));
    }
    let mut bits: Vec<u32> = outs.into_iter().flatten().flatten().collect();
    if lstm {
        bits.extend(nan_bits(&c));
    }
    assert_eq!(bits.len(), (steps + usize::from(lstm)) * batch * hid);
    bits
}

#[test]
fn the_forward_is_bitwise_the_cell_loop() {
    let ctx = ExecContext::with_threads(2);
    let (steps, b, i) = (5, 7, 11);
    let x = t(&ctx, &[steps, b, i], 1, 1.0);
    // Hidden 37: gate rows of partial panels (the row split); 32: whole
    // panels (the few-row products by column blocks).
    for (lstm, h) in [(true, 37), (false, 37), (true, 32), (false, 32)] {
        let g = if lstm { 4 * h } else { 3 * h };
        let (w_ih, w_hh) = (t(&ctx, &[g, i], 2, 0.5), t(&ctx, &[g, h], 3, 0.5));
        let (b_ih, b_hh) = (t(&ctx, &[g, 1], 4, 0.5), t(&ctx, &[g, 1], 5, 0.5));
        let (bi, bh) = (b_ih.squeeze(1).unwrap(), b_hh.squeeze(1).unwrap());
        let state = if lstm {
            t(&ctx, &[2, b, h], 6, 1.0)
        } else {
            t(&ctx, &[b, h], 6, 1.0)
        };
        for bias in [true, false] {
            let w = if bias {
                flat(&ctx, &[&w_ih, &w_hh, &b_ih, &b_hh])
            } else {
                flat(&ctx, &[&w_ih, &w_hh])
            };
            let biases = bias.then_some((&bi, &bh));
            for reverse in [false, true] {
                let want = cell_loop(&ctx, lstm, &x, &w_ih, &w_hh, biases, &state, reverse);
                let got = if lstm {
                    ctx.lstm_sequence(&x, &w, &state, reverse).unwrap().0
                } else {
                    ctx.gru_sequence(&x, &w, &state, reverse).unwrap().0
                };
                assert!(
                    nan_bits(&got) == want,
                    "lstm {lstm}, hidden {h}, bias {bias}, reverse {reverse}: not the cell loop's bits"
                );
            }
        }
    }
}

/// A scalar loss of the sequence op's output in f64: `Σ out · r` for fixed
/// weights `r`.
fn loss(ctx: &ExecContext, lstm: bool, ins: &[RawTensor], r: &[f32], reverse: bool) -> f64 {
    let out = if lstm {
        ctx.lstm_sequence(&ins[0], &ins[1], &ins[2], reverse)
    } else {
        ctx.gru_sequence(&ins[0], &ins[1], &ins[2], reverse)
    };
    let out = out.unwrap().0.to_vec();
    out.iter()
        .zip(r)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

#[test]
fn the_backward_matches_central_differences() {
    let ctx = ExecContext::new();
    let (steps, b, i, h) = (3, 2, 3, 4);
    for lstm in [true, false] {
        let g = if lstm { 4 * h } else { 3 * h };
        let st: &[usize] = if lstm { &[2, b, h] } else { &[b, h] };
        let ins = [
            t(&ctx, &[steps, b, i], 7, 1.0),
            t(&ctx, &[g, i + h + 2], 8, 0.5),
            t(&ctx, st, 9, 1.0),
        ];
        let out_len = (steps + usize::from(lstm)) * b * h;
        let r: Vec<f32> = values(out_len, 10);
        for reverse in [false, true] {
            let (_, saved) = if lstm {
                ctx.lstm_sequence(&ins[0], &ins[1], &ins[2], reverse)
            } else {
                ctx.gru_sequence(&ins[0], &ins[1], &ins[2], reverse)
            }
            .unwrap();
            let out_shape: &[usize] = if lstm {
                &[steps + 1, b, h]
            } else {
                &[steps, b, h]
            };
            let grad = ctx.from_slice(out_shape, &r).unwrap();
            let (gx, gw, gs) = if lstm {
                ctx.lstm_sequence_backward(&ins[1], &saved, &grad, reverse)
            } else {
                ctx.gru_sequence_backward(&ins[1], &saved, &grad, reverse)
            }
            .unwrap();
            for (k, got) in [gx, gw, gs].iter().enumerate() {
                let base = ins[k].to_vec();
                let got = got.to_vec();
                assert_eq!(got.len(), base.len());
                for (e, &gv) in got.iter().enumerate() {
                    let eps = 1e-2f32;
                    let at = |d: f32| {
                        let mut v = base.clone();
                        v[e] += d;
                        let mut moved = ins.clone();
                        moved[k] = ctx.from_slice(ins[k].shape(), &v).unwrap();
                        loss(&ctx, lstm, &moved, &r, reverse)
                    };
                    let fd = (at(eps) - at(-eps)) / (2.0 * f64::from(eps));
                    let err = (f64::from(gv) - fd).abs();
                    assert!(
                        err <= 2e-3 + 2e-2 * fd.abs(),
                        "lstm {lstm}, reverse {reverse}, input {k}[{e}]: {gv} vs {fd}"
                    );
                }
            }
        }
    }
}

/// Forward and backward outputs of both ops, as bits.
fn run_all(ctx: &ExecContext) -> Vec<Vec<u32>> {
    let (steps, b, i, h) = (6, 64, 40, 96);
    let x = t(ctx, &[steps, b, i], 11, 1.0);
    let mut bits = Vec::new();
    for (lstm, g) in [(true, 4 * h), (false, 3 * h)] {
        let w = t(ctx, &[g, i + h + 2], 12, 0.3);
        let (st, gshape): (&[usize], &[usize]) = if lstm {
            (&[2, b, h], &[steps + 1, b, h])
        } else {
            (&[b, h], &[steps, b, h])
        };
        let state = t(ctx, st, 13, 1.0);
        let grad = t(ctx, gshape, 14, 1.0);
        for reverse in [false, true] {
            let (out, saved) = if lstm {
                ctx.lstm_sequence(&x, &w, &state, reverse)
            } else {
                ctx.gru_sequence(&x, &w, &state, reverse)
            }
            .unwrap();
            let (gx, gw, gs) = if lstm {
                ctx.lstm_sequence_backward(&w, &saved, &grad, reverse)
            } else {
                ctx.gru_sequence_backward(&w, &saved, &grad, reverse)
            }
            .unwrap();
            bits.extend([out, saved, gx, gw, gs].iter().map(nan_bits));
        }
    }
    bits
}

#[test]
fn the_same_bits_for_every_thread_count() {
    let want = run_all(&ExecContext::with_threads(1));
    for threads in 2..=4 {
        let got = run_all(&ExecContext::with_threads(threads));
        assert!(got == want, "{threads} threads differ from 1");
    }
}

fn refused<T>(r: Result<T, ExecError>, op: &str) {
    match r {
        Ok(_) => panic!("{op}: a bad shape was accepted"),
        Err(e) => assert!(e.to_string().contains(op), "{op}: {e}"),
    }
}

#[test]
fn bad_shapes_are_errors_naming_the_op() {
    let ctx = ExecContext::new();
    let (steps, b, i, h) = (3, 2, 3, 4);
    let x = t(&ctx, &[steps, b, i], 1, 1.0);
    let w4 = t(&ctx, &[4 * h, i + h], 2, 1.0);
    let w3 = t(&ctx, &[3 * h, i + h + 2], 3, 1.0);
    let s2 = t(&ctx, &[2, b, h], 4, 1.0);
    let s1 = t(&ctx, &[b, h], 5, 1.0);
    // Input not 3-D, a weight of the wrong width or rows, a wrong state.
    refused(ctx.lstm_sequence(&s1, &w4, &s2, false), "lstm_sequence");
    let wide = t(&ctx, &[4 * h, i + h + 1], 6, 1.0);
    refused(ctx.lstm_sequence(&x, &wide, &s2, false), "lstm_sequence");
    let odd = t(&ctx, &[4 * h + 1, i + h], 6, 1.0);
    refused(ctx.lstm_sequence(&x, &odd, &s2, false), "lstm_sequence");
    refused(ctx.lstm_sequence(&x, &w4, &s1, false), "lstm_sequence");
    refused(ctx.gru_sequence(&x, &w3, &s2, false), "gru_sequence");
    refused(ctx.gru_sequence(&x, &w4, &s1, false), "gru_sequence");
    // Backward: a saved tensor or a gradient of the wrong shape.
    let (_, saved) = ctx.lstm_sequence(&x, &w4, &s2, false).unwrap();
    let g = t(&ctx, &[steps + 1, b, h], 7, 1.0);
    refused(
        ctx.lstm_sequence_backward(&w4, &s2, &g, false),
        "lstm_sequence_backward",
    );
    refused(
        ctx.lstm_sequence_backward(&w4, &saved, &s2, false),
        "lstm_sequence_backward",
    );
    let (_, saved) = ctx.gru_sequence(&x, &w3, &s1, false).unwrap();
    refused(
        ctx.gru_sequence_backward(&w3, &saved, &g, false),
        "gru_sequence_backward",
    );
}
