//! The decoder's small kernels on f32 slices: RMSNorm, RoPE, SiLU, the dot
//! product and the one-row attention. Each reduction runs in one fixed order
//! that depends only on its own inputs' lengths (never on threads, batch or the
//! vector level: this code is compiled once, for the baseline target, and Rust
//! never fuses or reassociates float operations), and every transcendental is
//! computed in f64 and rounded once to f32.

use crate::config::RopeScaling;

/// Lanes of the fixed summation order of [`dot`] and [`sum_squares`]: lane `l`
/// takes the terms `i ≡ l (mod 8)` in increasing `i`, then the lanes are folded
/// in halves (`l + 4` into `l`, then `l + 2`, `l + 1`).
const LANES: usize = 8;

/// Folds the lanes in halves (see [`LANES`]).
#[inline(always)]
fn fold(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `Σ a[i] · b[i]` in the fixed order of [`LANES`] (no fused multiply-add).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] += x * y;
    }
    fold(acc)
}

/// `Σ x[i]²` in the fixed order of [`LANES`].
#[inline]
fn sum_squares(x: &[f32]) -> f32 {
    dot(x, x)
}

/// `exp(x)` computed in f64 and rounded once to f32 (so the result is the
/// correctly rounded one except in vanishingly rare double-rounding cases, on
/// any C library).
#[inline]
pub(crate) fn exp(x: f32) -> f32 {
    (x as f64).exp() as f32
}

/// RMSNorm of one row, as transformers computes it in f32:
/// `out = weight · (x · 1/sqrt(mean(x²) + eps))`.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mean = sum_squares(x) / x.len() as f32;
    let r = 1.0 / (mean + eps).sqrt();
    for ((o, &xi), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (xi * r);
    }
}

/// `silu(gate) · up` in place in `gate`, `silu(g) = g / (1 + exp(-g))`.
pub(crate) fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp(-*g)) * u;
    }
}

/// Adds `bias` to every row of `rows` (rows of `bias.len()` elements).
pub(crate) fn add_bias(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        for (o, &b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
}

/// `acc += x`, element-wise.
pub(crate) fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// The rotary inverse frequencies (`head_dim / 2` of them) of a RoPE base and
/// scaling, computed in f32 as transformers does: `1 / base^(2i / head_dim)`,
/// then divided by the factor (`linear`) or rescaled by wavelength band
/// (`llama3`).
pub(crate) fn inv_freq(head_dim: usize, theta: f32, scaling: &RopeScaling) -> Vec<f32> {
    let half = head_dim / 2;
    (0..half)
        .map(|i| {
            let e = (2 * i) as f32 / head_dim as f32;
            let inv = 1.0f32 / (theta as f64).powf(e as f64) as f32;
            match *scaling {
                RopeScaling::None => inv,
                RopeScaling::Linear { factor } => inv / factor,
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                } => {
                    let old = original_max_position_embeddings as f64;
                    let low_wavelen = (old / low_freq_factor as f64) as f32;
                    let high_wavelen = (old / high_freq_factor as f64) as f32;
                    let wavelen = (2.0 * std::f64::consts::PI) as f32 / inv;
                    let scaled = if wavelen > low_wavelen {
                        inv / factor
                    } else {
                        inv
                    };
                    let smooth = (old as f32 / wavelen - low_freq_factor)
                        / (high_freq_factor as f64 - low_freq_factor as f64) as f32;
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    if medium {
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    }
                }
            }
        })
        .collect()
}

/// The cosines and sines of position `pos` (`inv_freq.len()` each): angle
/// `pos · inv_freq[i]` rounded to f32 (as transformers forms it), its cosine
/// and sine computed in f64 and rounded to f32.
pub(crate) fn rope_angles(pos: usize, inv_freq: &[f32], cos: &mut [f32], sin: &mut [f32]) {
    for ((&f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        let angle = (pos as f32 * f) as f64;
        *c = angle.cos() as f32;
        *s = angle.sin() as f32;
    }
}

/// Rotates every head of `row` (heads of `2 · cos.len()` elements) in place in
/// the rotate-half convention of Hugging Face: element `i` pairs with element
/// `i + head_dim / 2`.
pub(crate) fn apply_rope(row: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for head in row.chunks_exact_mut(2 * half) {
        let (lo, hi) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (lo[i], hi[i]);
            lo[i] = a * cos[i] - b * sin[i];
            hi[i] = b * cos[i] + a * sin[i];
        }
    }
}

/// One query row of one head attending to `n = keys.len() / q.len()` cached
/// positions: `out = Σ_j softmax(scale · q·k_j)_j · v_j`, every sum in
/// increasing `j` (the softmax's max, the exponentials' sum, and each output
/// element's weighted sum), using `scores[..n]` as scratch.
pub(crate) fn attend_row(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let d = q.len();
    let n = keys.len() / d;
    let scores = &mut scores[..n];
    let mut max = f32::NEG_INFINITY;
    for (s, k) in scores.iter_mut().zip(keys.chunks_exact(d)) {
        *s = dot(q, k) * scale;
        max = max.max(*s);
    }
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = exp(*s - max);
        sum += *s;
    }
    out.fill(0.0);
    for (&e, v) in scores.iter().zip(values.chunks_exact(d)) {
        let p = e / sum;
        for (o, &vi) in out.iter_mut().zip(v) {
            *o += p * vi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_and_the_lane_order() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-5);
        // The fixed order, written out.
        let mut lanes = [0.0f32; 8];
        for i in 0..37 {
            lanes[i % 8] += a[i] * b[i];
        }
        for w in [4, 2, 1] {
            for l in 0..w {
                lanes[l] += lanes[l + w];
            }
        }
        assert_eq!(dot(&a, &b).to_bits(), lanes[0].to_bits());
    }

    #[test]
    fn linear_scaling_divides_the_frequencies() {
        let plain = inv_freq(8, 10_000.0, &RopeScaling::None);
        let lin = inv_freq(8, 10_000.0, &RopeScaling::Linear { factor: 4.0 });
        assert_eq!(plain[0], 1.0);
        for (p, l) in plain.iter().zip(&lin) {
            assert_eq!(*l, p / 4.0);
        }
    }

    #[test]
    fn llama3_keeps_high_frequencies_and_divides_low_ones() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let plain = inv_freq(32, 10_000.0, &RopeScaling::None);
        let scaled = inv_freq(32, 10_000.0, &s);
        for (p, q) in plain.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f64::consts::PI / *p as f64;
            if wavelen < 16.0 {
                assert_eq!(p, q);
            } else if wavelen > 64.0 {
                assert_eq!(*q, p / 8.0);
            } else {
                assert!(*q < *p && *q > p / 8.0);
            }
        }
    }
}
