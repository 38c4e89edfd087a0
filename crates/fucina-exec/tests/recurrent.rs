//! The fused recurrent cells `lstm_cell` and `gru_cell` and their backward
//! kernels: values against a float64 reference of PyTorch's formulas,
//! gradients against float64 central differences of that reference, on
//! contiguous, transposed and narrowed inputs; bad shapes as errors naming the
//! op and the shapes; the same bits for 1 to 4 threads; batch invariance.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{ExecContext, ExecError, RawTensor};
use support::{assert_close, fd_grad, layouts, nan_bits, values};

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// PyTorch's LSTM cell in f64 over `[b, 4h]` gates and `[b, h]` state: `h'`
/// then `c'` (`[2, b, h]`).
fn lstm_ref(gi: &[f64], gh: &[f64], c: &[f64], b: usize, h: usize) -> Vec<f64> {
    let mut out = vec![0.0; 2 * b * h];
    for r in 0..b {
        for j in 0..h {
            let a = |k: usize| gi[r * 4 * h + k * h + j] + gh[r * 4 * h + k * h + j];
            let (i, f, g, o) = (sig(a(0)), sig(a(1)), a(2).tanh(), sig(a(3)));
            let cn = f * c[r * h + j] + i * g;
            out[r * h + j] = o * cn.tanh();
            out[b * h + r * h + j] = cn;
        }
    }
    out
}

/// PyTorch's GRU cell in f64 over `[b, 3h]` gates and `[b, h]` state.
fn gru_ref(gi: &[f64], gh: &[f64], hp: &[f64], b: usize, h: usize) -> Vec<f64> {
    let mut out = vec![0.0; b * h];
    for row in 0..b {
        for j in 0..h {
            let (x, y) = (
                |k: usize| gi[row * 3 * h + k * h + j],
                |k: usize| gh[row * 3 * h + k * h + j],
            );
            let r = sig(x(0) + y(0));
            let z = sig(x(1) + y(1));
            let n = (x(2) + r * y(2)).tanh();
            out[row * h + j] = (1.0 - z) * n + z * hp[row * h + j];
        }
    }
    out
}

fn f64s(t: &RawTensor) -> Vec<f64> {
    t.to_vec().into_iter().map(f64::from).collect()
}

#[test]
fn lstm_cell_matches_the_f64_reference_and_its_gradients() {
    let ctx = ExecContext::new();
    let (b, h) = (3, 5);
    let gis = layouts(&ctx, &[b, 4 * h], 1);
    let ghs = layouts(&ctx, &[b, 4 * h], 2);
    let cs = layouts(&ctx, &[b, h], 3);
    let gy = values(2 * b * h, 4);
    let gyt = ctx.from_slice(&[2, b, h], &gy).unwrap();
    let gy64: Vec<f64> = gy.iter().map(|&v| f64::from(v)).collect();
    for (k, ((gi, gh), c)) in gis.iter().zip(&ghs).zip(&cs).enumerate() {
        let (x, y, s) = (f64s(gi), f64s(gh), f64s(c));
        let (hc, saved) = ctx.lstm_cell(gi, gh, c).unwrap();
        assert_eq!(hc.shape(), [2, b, h]);
        assert_eq!(saved.shape(), [b, 5 * h]);
        assert_close(
            &hc.to_vec(),
            &lstm_ref(&x, &y, &s, b, h),
            1e-6,
            &format!("lstm_cell layout {k}"),
        );
        let (dg, dc) = ctx.lstm_cell_backward(&saved, c, &gyt).unwrap();
        let want_g = fd_grad(&x, &gy64, |p| lstm_ref(p, &y, &s, b, h));
        let want_gh = fd_grad(&y, &gy64, |p| lstm_ref(&x, p, &s, b, h));
        let want_c = fd_grad(&s, &gy64, |p| lstm_ref(&x, &y, p, b, h));
        assert_close(&dg.to_vec(), &want_g, 1e-5, "lstm_cell d gi");
        assert_close(&dg.to_vec(), &want_gh, 1e-5, "lstm_cell d gh");
        assert_close(&dc.to_vec(), &want_c, 1e-5, "lstm_cell d c");
    }
}

#[test]
fn gru_cell_matches_the_f64_reference_and_its_gradients() {
    let ctx = ExecContext::new();
    let (b, h) = (3, 5);
    let gis = layouts(&ctx, &[b, 3 * h], 5);
    let ghs = layouts(&ctx, &[b, 3 * h], 6);
    let hs = layouts(&ctx, &[b, h], 7);
    let gy = values(b * h, 8);
    let gyt = ctx.from_slice(&[b, h], &gy).unwrap();
    let gy64: Vec<f64> = gy.iter().map(|&v| f64::from(v)).collect();
    for (k, ((gi, gh), hp)) in gis.iter().zip(&ghs).zip(&hs).enumerate() {
        let (x, y, s) = (f64s(gi), f64s(gh), f64s(hp));
        let (out, saved) = ctx.gru_cell(gi, gh, hp).unwrap();
        assert_eq!(saved.shape(), [b, 4 * h]);
        assert_close(
            &out.to_vec(),
            &gru_ref(&x, &y, &s, b, h),
            1e-6,
            &format!("gru_cell layout {k}"),
        );
        let (dgi, dgh, dh) = ctx.gru_cell_backward(&saved, hp, &gyt).unwrap();
        let want_gi = fd_grad(&x, &gy64, |p| gru_ref(p, &y, &s, b, h));
        let want_gh = fd_grad(&y, &gy64, |p| gru_ref(&x, p, &s, b, h));
        let want_h = fd_grad(&s, &gy64, |p| gru_ref(&x, &y, p, b, h));
        assert_close(&dgi.to_vec(), &want_gi, 1e-5, "gru_cell d gi");
        assert_close(&dgh.to_vec(), &want_gh, 1e-5, "gru_cell d gh");
        assert_close(&dh.to_vec(), &want_h, 1e-5, "gru_cell d h");
    }
}

/// Asserts `r` is an error of `op` whose message names `shapes`.
fn refused<T>(r: Result<T, ExecError>, op: &str, shapes: &[&str]) {
    let Err(e) = r else {
        panic!("{op}: accepted a bad shape")
    };
    let msg = e.to_string();
    assert!(msg.starts_with(op), "{msg}");
    for s in shapes {
        assert!(msg.contains(s), "{msg} should name {s}");
    }
}

#[test]
fn bad_shapes_are_errors_naming_the_op_and_the_shapes() {
    let ctx = ExecContext::new();
    let t = |s: &[usize]| ctx.from_slice(s, &values(s.iter().product(), 1)).unwrap();
    let (g8, g6, s2) = (t(&[3, 8]), t(&[3, 6]), t(&[3, 2]));
    // Gates not a multiple of 4 (LSTM) or 3 (GRU) wide, or not 2-D.
    refused(ctx.lstm_cell(&g6, &g6, &s2), "lstm_cell", &["[3, 6]"]);
    refused(
        ctx.lstm_cell(&t(&[3, 8, 1]), &g8, &s2),
        "lstm_cell",
        &["[3, 8, 1]"],
    );
    refused(ctx.gru_cell(&g8, &g8, &s2), "gru_cell", &["[3, 8]"]);
    // The two gate tensors disagree.
    refused(
        ctx.lstm_cell(&g8, &t(&[2, 8]), &s2),
        "lstm_cell",
        &["[3, 8]", "[2, 8]"],
    );
    refused(
        ctx.gru_cell(&g6, &t(&[3, 9]), &s2),
        "gru_cell",
        &["[3, 6]", "[3, 9]"],
    );
    // The state is not [B, H].
    refused(
        ctx.lstm_cell(&g8, &g8, &t(&[3, 3])),
        "lstm_cell",
        &["[3, 3]"],
    );
    refused(ctx.gru_cell(&g6, &g6, &t(&[2, 2])), "gru_cell", &["[2, 2]"]);
    // The backward kernels check what they are given.
    let (_, saved) = ctx.lstm_cell(&g8, &g8, &s2).unwrap();
    refused(
        ctx.lstm_cell_backward(&saved, &s2, &s2),
        "lstm_cell_backward",
        &["[3, 2]", "[2, 3, 2]"],
    );
    refused(
        ctx.lstm_cell_backward(&g8, &s2, &t(&[2, 3, 2])),
        "lstm_cell_backward",
        &["[3, 8]"],
    );
    refused(
        ctx.lstm_cell_backward(&saved, &g8.reshape(&[24]).unwrap(), &s2),
        "lstm_cell_backward",
        &["[24]"],
    );
    let (_, saved) = ctx.gru_cell(&g6, &g6, &s2).unwrap();
    refused(
        ctx.gru_cell_backward(&saved, &s2, &t(&[3, 3])),
        "gru_cell_backward",
        &["[3, 3]"],
    );
    refused(
        ctx.gru_cell_backward(&g6, &s2, &s2),
        "gru_cell_backward",
        &["[3, 6]"],
    );
}

/// Every output of both cells and their backward kernels at batch `b`,
/// hidden `h`, as bits.
fn run_cells(ctx: &ExecContext, b: usize, h: usize) -> Vec<Vec<u32>> {
    let t = |s: &[usize], seed| {
        ctx.from_slice(s, &values(s.iter().product(), seed))
            .unwrap()
    };
    let st = t(&[b, h], 3);
    let (hc, saved) = ctx
        .lstm_cell(&t(&[b, 4 * h], 1), &t(&[b, 4 * h], 2), &st)
        .unwrap();
    let (dg, dc) = ctx
        .lstm_cell_backward(&saved, &st, &t(&[2, b, h], 4))
        .unwrap();
    let (h1, gsaved) = ctx
        .gru_cell(&t(&[b, 3 * h], 5), &t(&[b, 3 * h], 6), &st)
        .unwrap();
    let (dgi, dgh, dh) = ctx.gru_cell_backward(&gsaved, &st, &t(&[b, h], 7)).unwrap();
    [hc, saved, dg, dc, h1, gsaved, dgi, dgh, dh]
        .iter()
        .map(nan_bits)
        .collect()
}

#[test]
fn the_same_bits_for_every_thread_count() {
    // 64 rows of hidden 256: enough work to split on every team size.
    let want = run_cells(&ExecContext::with_threads(1), 64, 256);
    for threads in 2..=4 {
        let got = run_cells(&ExecContext::with_threads(threads), 64, 256);
        assert!(got == want, "{threads} threads differ from 1");
    }
}

#[test]
fn a_row_does_not_depend_on_the_other_rows() {
    let ctx = ExecContext::with_threads(2);
    let (b, h) = (64, 96);
    let t = |s: &[usize], seed| {
        ctx.from_slice(s, &values(s.iter().product(), seed))
            .unwrap()
    };
    let (gi, gh, st) = (t(&[b, 4 * h], 1), t(&[b, 4 * h], 2), t(&[b, h], 3));
    let (hc, _) = ctx.lstm_cell(&gi, &gh, &st).unwrap();
    let (gi3, gh3, st3) = (t(&[b, 3 * h], 4), t(&[b, 3 * h], 5), t(&[b, h], 6));
    let (h1, _) = ctx.gru_cell(&gi3, &gh3, &st3).unwrap();
    for r in [0, 17, 63] {
        let row = |x: &RawTensor| x.narrow(0, r, 1).unwrap();
        let (one, _) = ctx.lstm_cell(&row(&gi), &row(&gh), &row(&st)).unwrap();
        for k in 0..2 {
            let part = hc.narrow(0, k, 1).unwrap().narrow(1, r, 1).unwrap();
            let alone = one.narrow(0, k, 1).unwrap();
            assert_eq!(
                nan_bits(&ctx.materialize(&part).unwrap()),
                nan_bits(&alone),
                "lstm row {r}"
            );
        }
        let (one, _) = ctx.gru_cell(&row(&gi3), &row(&gh3), &row(&st3)).unwrap();
        let part = ctx.materialize(&h1.narrow(0, r, 1).unwrap()).unwrap();
        assert_eq!(nan_bits(&part), nan_bits(&one), "gru row {r}");
    }
}
