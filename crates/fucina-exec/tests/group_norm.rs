//! `group_norm` and its backward: forward and gradients against float64
//! references computed here with direct loops (every rank from 2, every group
//! count, with and without each affine parameter, contiguous and strided
//! inputs), bad input as an error naming the op and the value, the same bits
//! for 1 to 4 threads, batch invariance, and `needs` computing only what it
//! asks for with the same bits.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{ExecContext, ExecError, GroupNormOptions, RawTensor};
use support::{layouts, nan_bits, values};

/// `(N, C, spatial)` of a shape.
fn dims(s: &[usize]) -> (usize, usize, usize) {
    (s[0], s[1], s[2..].iter().product())
}

/// Per (sample, group): the mean and `1 / sqrt(biased var + eps)`, in f64.
fn ref_stats(x: &[f32], s: &[usize], groups: usize, eps: f64) -> Vec<(f64, f64)> {
    let (n, c, plane) = dims(s);
    let len = c / groups * plane;
    (0..n * groups)
        .map(|r| {
            let row: Vec<f64> = x[r * len..(r + 1) * len]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let mean = row.iter().sum::<f64>() / len as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / len as f64;
            (mean, 1.0 / (var + eps).sqrt())
        })
        .collect()
}

/// The f64 reference of `group_norm` (a missing weight is 1, a missing bias 0).
fn ref_forward(
    x: &[f32],
    s: &[usize],
    groups: usize,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    eps: f64,
) -> Vec<f64> {
    let (_, c, plane) = dims(s);
    let st = ref_stats(x, s, groups, eps);
    (0..x.len())
        .map(|i| {
            let (k, ch) = (i / (c * plane), i / plane % c);
            let (mean, rstd) = st[k * groups + ch / (c / groups)];
            let wv = w.map_or(1.0, |w| f64::from(w[ch]));
            let bv = b.map_or(0.0, |b| f64::from(b[ch]));
            (f64::from(x[i]) - mean) * rstd * wv + bv
        })
        .collect()
}

/// The f64 reference of the gradients `(grad_x, grad_weight, grad_bias)`,
/// from the definition: with `xhat = (x - mean) * rstd` and `g = gy * w`, per
/// (sample, group) of `M` elements, `grad_x = rstd * (g - sum(g) / M - xhat *
/// sum(g * xhat) / M)`; `grad_w[c] = sum(gy * xhat)`, `grad_b[c] = sum(gy)`
/// over the samples and the plane.
fn ref_backward(
    x: &[f32],
    gy: &[f32],
    s: &[usize],
    groups: usize,
    w: Option<&[f32]>,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, c, plane) = dims(s);
    let per = c / groups;
    let len = per * plane;
    let st = ref_stats(x, s, groups, eps);
    let mut gx = vec![0.0; x.len()];
    let (mut gw, mut gb) = (vec![0.0; c], vec![0.0; c]);
    for k in 0..n {
        for grp in 0..groups {
            let (mean, rstd) = st[k * groups + grp];
            let base = (k * c + grp * per) * plane;
            let ch = |i: usize| grp * per + i / plane;
            let xhat = |i: usize| (f64::from(x[base + i]) - mean) * rstd;
            let g = |i: usize| f64::from(gy[base + i]) * w.map_or(1.0, |w| f64::from(w[ch(i)]));
            let sum_g: f64 = (0..len).map(g).sum();
            let sum_gx: f64 = (0..len).map(|i| g(i) * xhat(i)).sum();
            for i in 0..len {
                let m = len as f64;
                gx[base + i] = rstd * (g(i) - sum_g / m - xhat(i) * sum_gx / m);
                gw[ch(i)] += f64::from(gy[base + i]) * xhat(i);
                gb[ch(i)] += f64::from(gy[base + i]);
            }
        }
    }
    (gx, gw, gb)
}

fn assert_close(what: &str, got: &RawTensor, want: &[f64], tol: f64) {
    let got = got.to_vec();
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= tol * (1.0 + w.abs()),
            "{what}: element {i} is {g}, want {w} (error {err:e})"
        );
    }
}

/// Every rank from 2 (no spatial axis) to 5, one value per group and many.
const SHAPES: [&[usize]; 6] = [
    &[3, 6],
    &[2, 4, 5],
    &[2, 6, 3, 4],
    &[1, 8, 2, 3, 2],
    &[4, 3, 1, 1],
    &[2, 4, 130],
];

/// The group counts of `c`: 1, every divisor, `c`.
fn group_counts(c: usize) -> Vec<usize> {
    (1..=c).filter(|&g| c.is_multiple_of(g)).collect()
}

#[test]
fn forward_and_backward_match_f64_references() -> Result<(), ExecError> {
    let ctx = ExecContext::new();
    for (si, &s) in SHAPES.iter().enumerate() {
        let numel: usize = s.iter().product();
        let c = s[1];
        let seed = 10 * si as u64;
        let xv = values(numel, seed + 1);
        let gyv = values(numel, seed + 2);
        let wv = values(c, seed + 3);
        let bv = values(c, seed + 4);
        let gy = ctx.from_slice(s, &gyv)?;
        let (w, b) = (ctx.from_slice(&[c], &wv)?, ctx.from_slice(&[c], &bv)?);
        for groups in group_counts(c) {
            for eps in [1e-5f32, 0.5] {
                let opts = GroupNormOptions {
                    num_groups: groups,
                    eps,
                };
                let eps64 = f64::from(eps);
                for (wp, bp) in [(true, true), (true, false), (false, true), (false, false)] {
                    let (wt, bt) = (wp.then_some(&w), bp.then_some(&b));
                    let (ws, bs) = (wp.then_some(&wv[..]), bp.then_some(&bv[..]));
                    let want = ref_forward(&xv, s, groups, ws, bs, eps64);
                    let (wgx, wgw, wgb) = ref_backward(&xv, &gyv, s, groups, ws, eps64);
                    // The input contiguous, transposed and narrowed.
                    for (li, x) in layouts(&ctx, s, seed + 1).iter().enumerate() {
                        let tag =
                            format!("{s:?} groups {groups} eps {eps} w {wp} b {bp} layout {li}");
                        let y = ctx.group_norm(x, wt, bt, opts)?;
                        assert_eq!(y.shape(), s, "{tag}");
                        assert_close(&format!("forward {tag}"), &y, &want, 1e-5);
                        let [gx, gw, gb] =
                            ctx.group_norm_backward(x, wt, &gy, opts, [true, true, true])?;
                        assert_close(&format!("grad_x {tag}"), &gx.unwrap(), &wgx, 1e-4);
                        let gw = gw.unwrap();
                        assert_eq!(gw.shape(), [c]);
                        assert_close(&format!("grad_weight {tag}"), &gw, &wgw, 1e-4);
                        assert_close(&format!("grad_bias {tag}"), &gb.unwrap(), &wgb, 1e-5);
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn strided_parameters_and_gradients_are_read_through_their_strides() -> Result<(), ExecError> {
    let ctx = ExecContext::new();
    let s = [2, 6, 7];
    let numel = 84;
    let x = ctx.from_slice(&s, &values(numel, 1))?;
    let gy_c = ctx.from_slice(&s, &values(numel, 2))?;
    // Column 1 of a [6, 2] tensor: a weight with stride 2.
    let wide = ctx.from_slice(&[6, 2], &values(12, 3))?;
    let w = wide.narrow(1, 1, 1)?.squeeze(1)?;
    assert!(!w.is_contiguous());
    let wc = ctx.materialize(&w)?;
    let gy = layouts(&ctx, &s, 2).pop().expect("a narrowed layout");
    assert!(!gy.is_contiguous());
    let opts = GroupNormOptions::new(3);
    assert_eq!(
        nan_bits(&ctx.group_norm(&x, Some(&w), Some(&w), opts)?),
        nan_bits(&ctx.group_norm(&x, Some(&wc), Some(&wc), opts)?)
    );
    let a = ctx.group_norm_backward(&x, Some(&w), &gy, opts, [true; 3])?;
    let b = ctx.group_norm_backward(&x, Some(&wc), &gy_c, opts, [true; 3])?;
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert_eq!(nan_bits(a), nan_bits(b), "gradient {i}");
    }
    Ok(())
}

#[test]
fn missing_parameters_are_ones_and_zeros_bit_for_bit() -> Result<(), ExecError> {
    let ctx = ExecContext::new();
    let s = [3, 4, 9];
    let x = ctx.from_slice(&s, &values(108, 5))?;
    let gy = ctx.from_slice(&s, &values(108, 6))?;
    let (ones, zeros) = (ctx.ones(&[4])?, ctx.zeros(&[4])?);
    let opts = GroupNormOptions::new(2);
    let with = ctx.group_norm(&x, Some(&ones), Some(&zeros), opts)?;
    for (w, b) in [(None, None), (Some(&ones), None), (None, Some(&zeros))] {
        assert_eq!(nan_bits(&ctx.group_norm(&x, w, b, opts)?), nan_bits(&with));
    }
    let a = ctx.group_norm_backward(&x, None, &gy, opts, [true; 3])?;
    let b = ctx.group_norm_backward(&x, Some(&ones), &gy, opts, [true; 3])?;
    for (a, b) in a.iter().zip(&b) {
        assert_eq!(nan_bits(a.as_ref().unwrap()), nan_bits(b.as_ref().unwrap()));
    }
    Ok(())
}

#[test]
fn needs_computes_only_what_it_asks_for_with_the_same_bits() -> Result<(), ExecError> {
    let ctx = ExecContext::new();
    let s = [2, 6, 5];
    let x = ctx.from_slice(&s, &values(60, 7))?;
    let gy = ctx.from_slice(&s, &values(60, 8))?;
    let w = ctx.from_slice(&[6], &values(6, 9))?;
    let opts = GroupNormOptions::new(3);
    let all = ctx.group_norm_backward(&x, Some(&w), &gy, opts, [true; 3])?;
    for mask in 0..8u8 {
        let needs = [mask & 1 != 0, mask & 2 != 0, mask & 4 != 0];
        let got = ctx.group_norm_backward(&x, Some(&w), &gy, opts, needs)?;
        for i in 0..3 {
            assert_eq!(got[i].is_some(), needs[i], "needs {needs:?}");
            if let Some(t) = &got[i] {
                assert_eq!(nan_bits(t), nan_bits(all[i].as_ref().unwrap()));
            }
        }
    }
    Ok(())
}

fn err_text<T: std::fmt::Debug>(r: Result<T, ExecError>) -> String {
    r.expect_err("bad input must be an error").to_string()
}

fn assert_names(e: &str, op: &str, what: &str) {
    assert!(
        e.contains(op) && e.contains(what),
        "error {e:?} should name {op:?} and {what:?}"
    );
}

#[test]
fn bad_input_is_an_error_naming_the_op_and_the_value() -> Result<(), ExecError> {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 6, 4], &values(48, 1))?;
    let gy = ctx.from_slice(&[2, 6, 4], &values(48, 2))?;
    let (w6, w4) = (ctx.ones(&[6])?, ctx.ones(&[4])?);
    let w2d = ctx.ones(&[6, 1])?;
    let g = |num_groups| GroupNormOptions::new(num_groups);
    let fwd = "group_norm";
    let bwd = "group_norm_backward";

    // Rank below 2.
    let flat = ctx.from_slice(&[6], &values(6, 3))?;
    assert_names(
        &err_text(ctx.group_norm(&flat, None, None, g(1))),
        fwd,
        "[6]",
    );
    assert_names(
        &err_text(ctx.group_norm(&flat, None, None, g(1))),
        fwd,
        "rank",
    );
    // num_groups 0, or not dividing C.
    let e = err_text(ctx.group_norm(&x, None, None, g(0)));
    assert_names(&e, fwd, "num_groups = 0");
    let e = err_text(ctx.group_norm(&x, None, None, g(4)));
    assert_names(&e, fwd, "num_groups = 4");
    assert_names(&e, fwd, "divide the channels");
    assert!(ctx.group_norm(&x, None, None, g(6)).is_ok());
    // A weight or bias not of shape [C].
    let e = err_text(ctx.group_norm(&x, Some(&w4), None, g(2)));
    assert_names(&e, fwd, "[4]");
    let e = err_text(ctx.group_norm(&x, Some(&w6), Some(&w4), g(2)));
    assert_names(&e, fwd, "[4]");
    let e = err_text(ctx.group_norm(&x, None, Some(&w2d), g(2)));
    assert_names(&e, fwd, "[6, 1]");
    // A non-finite or negative eps.
    for eps in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1e-5] {
        let opts = GroupNormOptions { num_groups: 2, eps };
        let e = err_text(ctx.group_norm(&x, Some(&w6), None, opts));
        assert_names(&e, fwd, "eps");
        let e = err_text(ctx.group_norm_backward(&x, None, &gy, opts, [true; 3]));
        assert_names(&e, bwd, "eps");
    }
    // The backward: the same checks, and a gradient of the wrong shape.
    let e = err_text(ctx.group_norm_backward(&x, None, &gy, g(5), [true; 3]));
    assert_names(&e, bwd, "num_groups = 5");
    let e = err_text(ctx.group_norm_backward(&x, Some(&w4), &gy, g(2), [true; 3]));
    assert_names(&e, bwd, "[4]");
    let e = err_text(ctx.group_norm_backward(&flat, None, &flat, g(1), [true; 3]));
    assert_names(&e, bwd, "rank");
    let gy_bad = ctx.from_slice(&[2, 6, 3], &values(36, 4))?;
    let e = err_text(ctx.group_norm_backward(&x, None, &gy_bad, g(2), [true; 3]));
    assert_names(&e, bwd, "[2, 6, 3]");
    Ok(())
}

/// Forward and backward bits of shapes large enough to split over the team.
fn all_bits(ctx: &ExecContext) -> Result<Vec<(String, Vec<u32>)>, ExecError> {
    let mut out = Vec::new();
    for (s, groups) in [
        (&[8, 12, 20, 20][..], 4),
        (&[64, 32][..], 8),
        (&[6, 4, 3000][..], 2),
        (&[3, 6, 70000][..], 1),
    ] {
        let numel: usize = s.iter().product();
        let c = s[1];
        let x = ctx.from_slice(s, &values(numel, 11))?;
        let gy = ctx.from_slice(s, &values(numel, 12))?;
        let w = ctx.from_slice(&[c], &values(c, 13))?;
        let b = ctx.from_slice(&[c], &values(c, 14))?;
        let opts = GroupNormOptions::new(groups);
        out.push((
            format!("forward {s:?}"),
            nan_bits(&ctx.group_norm(&x, Some(&w), Some(&b), opts)?),
        ));
        let grads = ctx.group_norm_backward(&x, Some(&w), &gy, opts, [true; 3])?;
        for (name, t) in ["x", "weight", "bias"].iter().zip(&grads) {
            out.push((format!("grad {name} {s:?}"), nan_bits(t.as_ref().unwrap())));
        }
    }
    Ok(out)
}

#[test]
fn bitwise_identical_for_one_to_four_threads() -> Result<(), ExecError> {
    let base = all_bits(&ExecContext::with_threads(1))?;
    for threads in 2..=4 {
        let got = all_bits(&ExecContext::with_threads(threads))?;
        for ((name, a), (_, b)) in base.iter().zip(&got) {
            assert!(a == b, "{name}: {threads} threads differ from 1");
        }
    }
    Ok(())
}

#[test]
fn a_sample_alone_gives_its_bits_in_the_batch() -> Result<(), ExecError> {
    let ctx = ExecContext::with_threads(2);
    let s = [5, 6, 30, 31];
    let numel: usize = s.iter().product();
    let per = numel / s[0];
    let (xv, gyv) = (values(numel, 21), values(numel, 22));
    let x = ctx.from_slice(&s, &xv)?;
    let gy = ctx.from_slice(&s, &gyv)?;
    let w = ctx.from_slice(&[6], &values(6, 23))?;
    let b = ctx.from_slice(&[6], &values(6, 24))?;
    let opts = GroupNormOptions::new(3);
    let y = ctx.group_norm(&x, Some(&w), Some(&b), opts)?.to_vec();
    let [gx, ..] = ctx.group_norm_backward(&x, Some(&w), &gy, opts, [true, false, false])?;
    let gx = gx.unwrap().to_vec();
    let one_shape = [1, s[1], s[2], s[3]];
    for k in 0..s[0] {
        let part = k * per..(k + 1) * per;
        let x1 = ctx.from_slice(&one_shape, &xv[part.clone()])?;
        let gy1 = ctx.from_slice(&one_shape, &gyv[part.clone()])?;
        let y1 = ctx.group_norm(&x1, Some(&w), Some(&b), opts)?.to_vec();
        let [gx1, ..] = ctx.group_norm_backward(&x1, Some(&w), &gy1, opts, [true, false, false])?;
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same(&y1, &y[part.clone()]), "forward of sample {k}");
        assert!(
            same(&gx1.unwrap().to_vec(), &gx[part]),
            "grad_x of sample {k}"
        );
    }
    Ok(())
}
