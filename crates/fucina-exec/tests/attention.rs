//! The fused multi-head attention `attention` and its backward: values and
//! gradients against a float64 reference computed with direct loops (head
//! widths inside one GEMM panel and across panels, query and key lengths that
//! differ), bad operands as errors naming the op, the same bits for 1 to 4
//! threads, and a sample's results independent of the other samples; the
//! key-padding forms (`attention_masked`, `attention_packed_masked`) against
//! the reference with the masked keys left out, and with no key masked, the
//! bits of the unmasked ops.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{ExecContext, ExecError, RawTensor};
use support::{nan_bits, values};

fn t(ctx: &ExecContext, shape: &[usize], seed: u64) -> RawTensor {
    ctx.from_slice(shape, &values(shape.iter().product(), seed))
        .unwrap()
}

/// The float64 forward and gradients: `(out, dq, dk, dv)` for the output
/// gradient `g`.
#[allow(clippy::type_complexity)]
fn reference(
    (q, k, v, g): (&[f32], &[f32], &[f32], &[f32]),
    (n, l, s, e, heads): (usize, usize, usize, usize, usize),
    scale: f64,
    pad: Option<&[bool]>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = e / heads;
    let (mut out, mut dq) = (vec![0.0; n * l * e], vec![0.0; n * l * e]);
    let (mut dk, mut dv) = (vec![0.0; n * s * e], vec![0.0; n * s * e]);
    let qa = |b: usize, i: usize, c: usize| f64::from(q[(b * l + i) * e + c]);
    let ka = |b: usize, j: usize, c: usize| f64::from(k[(b * s + j) * e + c]);
    let va = |b: usize, j: usize, c: usize| f64::from(v[(b * s + j) * e + c]);
    let ga = |b: usize, i: usize, c: usize| f64::from(g[(b * l + i) * e + c]);
    for b in 0..n {
        for h in 0..heads {
            let cols = h * d..(h + 1) * d;
            for i in 0..l {
                let sc: Vec<f64> = (0..s)
                    .map(|j| {
                        if pad.is_some_and(|m| m[b * s + j]) {
                            return f64::NEG_INFINITY;
                        }
                        scale * cols.clone().map(|c| qa(b, i, c) * ka(b, j, c)).sum::<f64>()
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = ex.iter().sum();
                let p: Vec<f64> = ex.iter().map(|x| x / z).collect();
                for c in cols.clone() {
                    out[(b * l + i) * e + c] = (0..s).map(|j| p[j] * va(b, j, c)).sum();
                }
                let dp: Vec<f64> = (0..s)
                    .map(|j| cols.clone().map(|c| ga(b, i, c) * va(b, j, c)).sum())
                    .collect();
                let dot: f64 = (0..s).map(|j| p[j] * dp[j]).sum();
                for j in 0..s {
                    let ds = scale * p[j] * (dp[j] - dot);
                    for c in cols.clone() {
                        dq[(b * l + i) * e + c] += ds * ka(b, j, c);
                        dk[(b * s + j) * e + c] += ds * qa(b, i, c);
                        dv[(b * s + j) * e + c] += p[j] * ga(b, i, c);
                    }
                }
            }
        }
    }
    (out, dq, dk, dv)
}

fn close(name: &str, got: &RawTensor, want: &[f64]) {
    let got = got.to_vec();
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        let tol = 1e-5 + 1e-4 * b.abs();
        assert!(
            (f64::from(a) - b).abs() <= tol,
            "{name}[{i}]: {a} against {b}"
        );
    }
}

#[test]
fn values_and_gradients_match_float64() {
    let ctx = ExecContext::with_threads(2);
    // (n, l, s, e, heads): narrow heads (packed panels), 32-wide heads (the
    // value read in place on AVX-512) with 33 keys (two panels), 48-wide
    // heads (a panel and a half).
    for (case, &(n, l, s, e, heads)) in [
        (2, 5, 7, 12, 3),
        (2, 3, 33, 64, 2),
        (3, 9, 4, 96, 2),
        (1, 1, 1, 4, 4),
    ]
    .iter()
    .enumerate()
    {
        let seed = 10 * case as u64;
        let q = t(&ctx, &[n, l, e], seed + 1);
        let k = t(&ctx, &[n, s, e], seed + 2);
        let v = t(&ctx, &[n, s, e], seed + 3);
        let g = t(&ctx, &[n, l, e], seed + 4);
        let scale = 0.7;
        let (y, p) = ctx.attention(&q, &k, &v, heads, scale).unwrap();
        assert_eq!(p.shape(), [n, heads, l, s]);
        let (dq, dk, dv) = ctx
            .attention_backward(&q, &k, &v, &p, &g, heads, scale)
            .unwrap();
        let (qv, kv, vv, gv) = (q.to_vec(), k.to_vec(), v.to_vec(), g.to_vec());
        let (wy, wdq, wdk, wdv) = reference(
            (&qv, &kv, &vv, &gv),
            (n, l, s, e, heads),
            f64::from(scale),
            None,
        );
        close(&format!("case {case} out"), &y, &wy);
        close(&format!("case {case} dq"), &dq, &wdq);
        close(&format!("case {case} dk"), &dk, &wdk);
        close(&format!("case {case} dv"), &dv, &wdv);
    }
}

#[test]
fn the_key_padding_mask_leaves_the_masked_keys_out() {
    let ctx = ExecContext::with_threads(2);
    for (case, &(n, l, s, e, heads)) in [(3, 5, 7, 12, 3), (2, 3, 33, 64, 2)].iter().enumerate() {
        let seed = 100 + 10 * case as u64;
        let q = t(&ctx, &[n, l, e], seed + 1);
        let k = t(&ctx, &[n, s, e], seed + 2);
        let v = t(&ctx, &[n, s, e], seed + 3);
        let g = t(&ctx, &[n, l, e], seed + 4);
        // Sample b ignores every key j with (j + b) % 3 == 0.
        let flags: Vec<bool> = (0..n * s).map(|i| (i % s + i / s) % 3 == 0).collect();
        let pad = ctx.from_slice_typed::<bool>(&[n, s], &flags).unwrap();
        let (y, p) = ctx.attention_masked(&q, &k, &v, &pad, heads, 0.7).unwrap();
        let (dq, dk, dv) = ctx
            .attention_backward(&q, &k, &v, &p, &g, heads, 0.7)
            .unwrap();
        let (qv, kv, vv, gv) = (q.to_vec(), k.to_vec(), v.to_vec(), g.to_vec());
        let (wy, wdq, wdk, wdv) =
            reference((&qv, &kv, &vv, &gv), (n, l, s, e, heads), 0.7, Some(&flags));
        close(&format!("masked case {case} out"), &y, &wy);
        close(&format!("masked case {case} dq"), &dq, &wdq);
        close(&format!("masked case {case} dk"), &dk, &wdk);
        close(&format!("masked case {case} dv"), &dv, &wdv);
        // The masked keys' weights are exactly zero.
        let pv = p.to_vec();
        for (i, &w) in pv.iter().enumerate() {
            let (b, j) = (i / (heads * l * s), i % s);
            if flags[b * s + j] {
                assert_eq!(w, 0.0, "masked case {case}: weight {i}");
            }
        }
    }
    // No key masked: the bits of the unmasked ops, packed or not; every key
    // of a sample masked: NaN (as PyTorch).
    let (n, l, e, heads) = (2, 6, 16, 2);
    let x = t(&ctx, &[n, l, 3 * e], 7);
    let q = t(&ctx, &[n, l, e], 8);
    let none = ctx.from_slice_typed::<bool>(&[n, l], &[false; 12]).unwrap();
    let (y0, p0) = ctx.attention(&q, &q, &q, heads, 0.5).unwrap();
    let (y1, p1) = ctx.attention_masked(&q, &q, &q, &none, heads, 0.5).unwrap();
    assert_eq!(nan_bits(&y0), nan_bits(&y1));
    assert_eq!(nan_bits(&p0), nan_bits(&p1));
    let (y0, p0) = ctx.attention_packed(&x, heads, 0.5).unwrap();
    let (y1, p1) = ctx.attention_packed_masked(&x, &none, heads, 0.5).unwrap();
    assert_eq!(nan_bits(&y0), nan_bits(&y1));
    assert_eq!(nan_bits(&p0), nan_bits(&p1));
    let mut flags = [false; 12];
    flags[..l].fill(true);
    let all = ctx.from_slice_typed::<bool>(&[n, l], &flags).unwrap();
    let (y, _) = ctx.attention_packed_masked(&x, &all, heads, 0.5).unwrap();
    let y = y.to_vec();
    assert!(y[..l * e].iter().all(|v| v.is_nan()));
    assert!(y[l * e..].iter().all(|v| v.is_finite()));
}

#[test]
fn strided_operands_give_the_contiguous_bits() {
    let ctx = ExecContext::new();
    let (n, l, e) = (2, 6, 8);
    // `[L, N, E]` transposed to `[N, L, E]`: a view, not contiguous.
    let qt = t(&ctx, &[l, n, e], 5).transpose(0, 1).unwrap();
    let qc = ctx.contiguous(&qt).unwrap();
    let a = ctx.attention(&qt, &qt, &qt, 2, 0.5).unwrap().0;
    let b = ctx.attention(&qc, &qc, &qc, 2, 0.5).unwrap().0;
    assert_eq!(nan_bits(&a), nan_bits(&b));
}

fn run_all(ctx: &ExecContext) -> Vec<Vec<u32>> {
    let (n, l, s, e, heads) = (5, 7, 9, 64, 2);
    let q = t(ctx, &[n, l, e], 1);
    let k = t(ctx, &[n, s, e], 2);
    let v = t(ctx, &[n, s, e], 3);
    let g = t(ctx, &[n, l, e], 4);
    let (y, p) = ctx.attention(&q, &k, &v, heads, 0.3).unwrap();
    let (dq, dk, dv) = ctx
        .attention_backward(&q, &k, &v, &p, &g, heads, 0.3)
        .unwrap();
    [y, p, dq, dk, dv].iter().map(nan_bits).collect()
}

#[test]
fn the_same_bits_for_every_thread_count() {
    let want = run_all(&ExecContext::with_threads(1));
    for threads in 2..=4 {
        let got = run_all(&ExecContext::with_threads(threads));
        assert!(got == want, "{threads} threads differ from 1");
    }
}

#[test]
fn a_sample_does_not_depend_on_the_others() {
    let ctx = ExecContext::with_threads(2);
    let (n, l, e, heads) = (4, 6, 16, 4);
    let x = t(&ctx, &[n, l, e], 7);
    let g = t(&ctx, &[n, l, e], 8);
    let (y, p) = ctx.attention(&x, &x, &x, heads, 0.5).unwrap();
    let (dq, _, _) = ctx
        .attention_backward(&x, &x, &x, &p, &g, heads, 0.5)
        .unwrap();
    let one = |t: &RawTensor| ctx.contiguous(&t.narrow(0, 2, 1).unwrap()).unwrap();
    let (x2, g2) = (one(&x), one(&g));
    let (y2, p2) = ctx.attention(&x2, &x2, &x2, heads, 0.5).unwrap();
    let (dq2, _, _) = ctx
        .attention_backward(&x2, &x2, &x2, &p2, &g2, heads, 0.5)
        .unwrap();
    assert_eq!(nan_bits(&one(&y)), nan_bits(&y2));
    assert_eq!(nan_bits(&one(&dq)), nan_bits(&dq2));
}

#[test]
fn the_packed_operand_gives_the_bits_of_its_three_parts() {
    let ctx = ExecContext::with_threads(2);
    for (n, l, e, heads) in [(3, 7, 64, 2), (2, 5, 12, 3)] {
        let x = t(&ctx, &[n, l, 3 * e], 11);
        let g = t(&ctx, &[n, l, e], 12);
        let part = |i: usize| ctx.contiguous(&x.narrow(2, i * e, e).unwrap()).unwrap();
        let (q, k, v) = (part(0), part(1), part(2));
        let (y, p) = ctx.attention(&q, &k, &v, heads, 0.6).unwrap();
        let (yp, pp) = ctx.attention_packed(&x, heads, 0.6).unwrap();
        assert_eq!(nan_bits(&y), nan_bits(&yp));
        assert_eq!(nan_bits(&p), nan_bits(&pp));
        let (dq, dk, dv) = ctx
            .attention_backward(&q, &k, &v, &p, &g, heads, 0.6)
            .unwrap();
        let dx = ctx
            .attention_packed_backward(&x, &pp, &g, heads, 0.6)
            .unwrap();
        let joined = ctx.concat(&[&dq, &dk, &dv], 2).unwrap();
        assert_eq!(nan_bits(&dx), nan_bits(&joined));
    }
}

fn refused<T>(r: Result<T, ExecError>, op: &str) {
    match r {
        Ok(_) => panic!("{op}: a bad operand was accepted"),
        Err(e) => assert!(e.to_string().contains(op), "{op}: {e}"),
    }
}

#[test]
fn bad_operands_are_errors_naming_the_op() {
    let ctx = ExecContext::new();
    let q = t(&ctx, &[2, 3, 8], 1);
    let k = t(&ctx, &[2, 5, 8], 2);
    let flat = t(&ctx, &[6, 8], 3);
    let other_batch = t(&ctx, &[3, 5, 8], 4);
    let other_width = t(&ctx, &[2, 5, 6], 5);
    let op = "attention";
    refused(ctx.attention(&flat, &k, &k, 2, 1.0), op);
    refused(ctx.attention(&q, &flat, &flat, 2, 1.0), op);
    refused(ctx.attention(&q, &other_batch, &other_batch, 2, 1.0), op);
    refused(ctx.attention(&q, &other_width, &other_width, 2, 1.0), op);
    refused(ctx.attention(&q, &k, &q, 2, 1.0), op);
    refused(ctx.attention(&q, &k, &k, 3, 1.0), op);
    refused(ctx.attention(&q, &k, &k, 0, 1.0), op);
    refused(ctx.attention(&q, &k, &k, 2, f32::NAN), op);
    // A key-padding mask of the query's length (3), not the key's (5).
    let pad = ctx.from_slice_typed::<bool>(&[2, 3], &[false; 6]).unwrap();
    refused(
        ctx.attention_masked(&q, &k, &k, &pad, 2, 1.0),
        "attention_masked",
    );
    let pad5 = ctx.from_slice_typed::<bool>(&[2, 5], &[false; 10]).unwrap();
    assert!(ctx.attention_masked(&q, &k, &k, &pad5, 2, 1.0).is_ok());
    let x = t(&ctx, &[2, 3, 24], 6);
    refused(
        ctx.attention_packed_masked(&x, &pad5, 2, 1.0),
        "attention_packed_masked",
    );
    let op = "attention_packed";
    refused(ctx.attention_packed(&flat, 2, 1.0), op);
    refused(ctx.attention_packed(&q, 2, 1.0), op); // 8 is not 3E
    let x = t(&ctx, &[2, 3, 12], 7);
    refused(ctx.attention_packed(&x, 3, 1.0), op);
    let (yx, px) = ctx.attention_packed(&x, 2, 1.0).unwrap();
    let op = "attention_packed_backward";
    refused(ctx.attention_packed_backward(&x, &yx, &yx, 2, 1.0), op);
    refused(ctx.attention_packed_backward(&x, &px, &x, 2, 1.0), op);
    let (y, p) = ctx.attention(&q, &k, &k, 2, 1.0).unwrap();
    let op = "attention_backward";
    refused(ctx.attention_backward(&q, &k, &k, &y, &y, 2, 1.0), op);
    refused(ctx.attention_backward(&q, &k, &k, &p, &p, 2, 1.0), op);
    refused(ctx.attention_backward(&q, &k, &k, &p, &k, 2, 1.0), op);
}
