//! Shared helpers of the autograd integration tests.
#![allow(dead_code, unreachable_pub)]

use fucina_autograd::exec::{ExecContext, RawTensor};
use fucina_autograd::{AutogradError, GradcheckOptions, Tensor, gradcheck};

/// Deterministic pseudo-random values in `[lo, hi)`.
pub fn values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let u = (fucina_autograd::exec::rng::at(seed, i) >> 40) as f32 / (1u64 << 24) as f32;
            lo + (hi - lo) * u
        })
        .collect()
}

/// Values in `[-hi, -lo] ∪ [lo, hi]`: away from a kink at 0.
pub fn away_from_zero(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    values(n, seed, -1.0, 1.0)
        .into_iter()
        .map(|u| u.signum() * (lo + (hi - lo) * u.abs()))
        .collect()
}

/// The same logical values as a contiguous tensor, as a transposed view (stored
/// transposed, viewed back; rank >= 2) and as a narrowed view of a wider tensor.
pub fn layouts(ctx: &ExecContext, shape: &[usize], vals: &[f32]) -> Vec<RawTensor> {
    let r = shape.len();
    let mut out = vec![ctx.from_slice(shape, vals).unwrap()];
    if r >= 2 {
        let t = ctx
            .from_slice(shape, vals)
            .unwrap()
            .transpose(r - 2, r - 1)
            .unwrap();
        let stored = ctx.materialize(&t).unwrap();
        let back = stored.transpose(r - 2, r - 1).unwrap();
        out.push(back);
    }
    let mut wide = shape.to_vec();
    wide[r - 1] += 2;
    let wn: usize = wide.iter().product();
    let mut wv = vec![99.0; wn];
    for (i, v) in vals.iter().enumerate() {
        let row = i / shape[r - 1];
        let col = i % shape[r - 1];
        wv[row * wide[r - 1] + col + 1] = *v;
    }
    let narrowed = ctx
        .from_slice(&wide, &wv)
        .unwrap()
        .narrow(r - 1, 1, shape[r - 1])
        .unwrap();
    // Non-contiguous except for a rank-1 or single-column shape.
    assert!(r == 1 || shape[r - 1] == 1 || !narrowed.is_contiguous());
    out.push(narrowed);
    out
}

/// Asserts that `f` passes gradcheck at `inputs`.
pub fn check<F>(ctx: &ExecContext, what: &str, f: F, inputs: &[RawTensor])
where
    F: Fn(&ExecContext, &[Tensor]) -> Result<Tensor, AutogradError>,
{
    let r = gradcheck(ctx, f, inputs, &GradcheckOptions::default())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(r.passed, "{what}: {r:?}");
    assert!(r.checked > 0);
}

/// Asserts `f` passes gradcheck for every combination of layouts of inputs with
/// the given shapes and values.
pub fn check_layouts<F>(ctx: &ExecContext, what: &str, f: F, inputs: &[(&[usize], Vec<f32>)])
where
    F: Fn(&ExecContext, &[Tensor]) -> Result<Tensor, AutogradError>,
{
    let per: Vec<Vec<RawTensor>> = inputs.iter().map(|(s, v)| layouts(ctx, s, v)).collect();
    // Each input in each of its layouts, the others contiguous (the full product
    // grows too fast).
    check(
        ctx,
        what,
        &f,
        &per.iter().map(|l| l[0].clone()).collect::<Vec<_>>(),
    );
    for (i, l) in per.iter().enumerate() {
        for (k, raw) in l.iter().enumerate().skip(1) {
            let mut ins: Vec<RawTensor> = per.iter().map(|l| l[0].clone()).collect();
            ins[i] = raw.clone();
            check(ctx, &format!("{what} (input {i}, layout {k})"), &f, &ins);
        }
    }
}
