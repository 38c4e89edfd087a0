//! The decoder's small kernels on f32 slices: RMSNorm, RoPE, SiLU, the dot
//! product and the one-row attention. Each reduction runs in one fixed order
//! that depends only on its own inputs' lengths (never on threads, batch or the
//! vector level: this code is compiled once, for the baseline target, and
//! Rust never fuses or reassociates float operations). The exponential is the crate's own
//! ([`exp`], IEEE operations only); sines and cosines (of RoPE angles) are
//! computed in f64 and rounded once.

use crate::config::RopeScaling;

/// Lanes of the fixed summation order of [`dot`] and [`sum_squares`]: lane `l`
/// takes the terms `i ≡ l (mod 8)` in increasing `i`, then the lanes are folded
/// in halves (`l + 4` into `l`, then `l + 2`, `l + 1`).
const LANES: usize = 8;

// Folds the lanes in halves (see `LANES`).
use fucina::exec::math::fold_lanes as fold;

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

/// `Σ x[i]` in the fixed order of [`LANES`].
#[inline(always)]
fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    for (l, &v) in rest.iter().enumerate() {
        acc[l] += v;
    }
    fold(acc)
}

/// `Σ x[i]²` in the fixed order of [`LANES`].
#[inline]
fn sum_squares(x: &[f32]) -> f32 {
    dot(x, x)
}

pub(crate) use fucina::exec::math::exp;

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

/// Positions whose scores (and output elements whose weighted sums) are
/// accumulated side by side, in vector registers: one key tile of the cache.
const BLOCK: usize = crate::cache::KEY_TILE;

/// Key tiles (and blocks of output elements) accumulated at once: independent
/// chains of additions, so that the loops are not bound by the latency of one.
const TILES: usize = 2;

/// `acc + x · row` for the `BLOCK` columns of `row` (by value, so the
/// accumulators stay in registers).
#[inline(always)]
fn axpy_block(mut acc: [f32; BLOCK], x: f32, row: &[f32; BLOCK]) -> [f32; BLOCK] {
    for c in 0..BLOCK {
        acc[c] += x * row[c];
    }
    acc
}

/// Row `i` (of `BLOCK` elements) of `m`.
#[inline(always)]
fn block_row(m: &[f32], i: usize) -> &[f32; BLOCK] {
    m[i * BLOCK..(i + 1) * BLOCK]
        .try_into()
        .expect("a full block")
}

/// The scaled scores of the `G` key tiles starting at tile `tile0` of `keys`
/// (tiled layout), into `scores` (`G · BLOCK` of them): each `Σ_i q[i] · k[i]`
/// in increasing `i`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // by-value accumulators, kept in registers
fn score_tiles<const G: usize>(
    q: &[f32],
    keys: &[f32],
    tile0: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let d = q.len();
    let tiles: [&[f32]; G] =
        std::array::from_fn(|g| &keys[(tile0 + g) * d * BLOCK..(tile0 + g + 1) * d * BLOCK]);
    let mut acc = [[0.0f32; BLOCK]; G];
    for (i, &qi) in q.iter().enumerate() {
        for g in 0..G {
            acc[g] = axpy_block(acc[g], qi, block_row(tiles[g], i));
        }
    }
    for (s, a) in scores.iter_mut().zip(acc.iter().flatten()) {
        *s = a * scale;
    }
}

/// Output elements `first .. first + G · BLOCK` of `Σ_j p[j] · v_j` (values
/// `[p.len(), d]`), each in increasing `j`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // by-value accumulators, kept in registers
fn weigh_blocks<const G: usize>(
    p: &[f32],
    values: &[f32],
    d: usize,
    first: usize,
    out: &mut [f32],
) {
    let mut acc = [[0.0f32; BLOCK]; G];
    for (&pj, v) in p.iter().zip(values.chunks_exact(d)) {
        let v = &v[first..first + G * BLOCK];
        for g in 0..G {
            acc[g] = axpy_block(acc[g], pj, block_row(v, g));
        }
    }
    for (o, a) in out[first..first + G * BLOCK]
        .iter_mut()
        .zip(acc.iter().flatten())
    {
        *o = *a;
    }
}

/// One query row `q` of one head attending to the `n = values.len() / q.len()`
/// cached positions `lo..lo + n`: `out = Σ_j softmax(scale · q·k_j)_j · v_j`.
///
/// `keys_t` holds the head's keys in the cache's tiled layout (tiles of
/// [`BLOCK`] positions, each `[head_dim, BLOCK]`). Each score is
/// `Σ_d q[d] · k_j[d]` in increasing `d` (the positions of a tile are computed
/// side by side, each its own sum), then scaled; the
/// softmax's maximum and sum run in increasing `j`, and so does each output
/// element's weighted sum of the values. `scores[..n]` is scratch.
///
/// Compiled once, for the baseline target: its vectors only hold
/// independent sums side by side (never parts of one sum) and no
/// multiply-add is fused.
pub(crate) fn attend_row(
    q: &[f32],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let d = q.len();
    let n = values.len() / d;
    let scores = &mut scores[..n];
    // Scores: the whole key tiles inside `lo..lo + n`, then the positions
    // before and after them one by one (the same sum for each).
    let end = lo + n;
    let tile = d * BLOCK;
    let key = |j: usize, i: usize| keys_t[j / BLOCK * tile + i * BLOCK + j % BLOCK];
    let one = |j: usize| {
        let mut a = 0.0f32;
        for (i, &qi) in q.iter().enumerate() {
            a += qi * key(j, i);
        }
        a * scale
    };
    let (first, last) = (lo.next_multiple_of(BLOCK).min(end), end / BLOCK * BLOCK);
    for j in lo..first {
        scores[j - lo] = one(j);
    }
    let mut start = first;
    while start + TILES * BLOCK <= last {
        let out = &mut scores[start - lo..start - lo + TILES * BLOCK];
        score_tiles::<TILES>(q, keys_t, start / BLOCK, scale, out);
        start += TILES * BLOCK;
    }
    while start < last {
        let out = &mut scores[start - lo..start - lo + BLOCK];
        score_tiles::<1>(q, keys_t, start / BLOCK, scale, out);
        start += BLOCK;
    }
    for j in last.max(first)..end {
        scores[j - lo] = one(j);
    }
    // Softmax: probabilities in place; the exponentials summed in the fixed
    // lane order of `sum_lanes`.
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for s in scores.iter_mut() {
        *s = exp(*s - max);
    }
    let sum = sum_lanes(scores);
    for s in scores.iter_mut() {
        *s /= sum;
    }
    // Weighted sum of the values: groups of blocks of output elements, then
    // single blocks, then the rest one by one (each element's sum in
    // increasing `j` either way).
    let mut first = 0;
    while first + TILES * BLOCK <= d {
        weigh_blocks::<TILES>(scores, values, d, first, out);
        first += TILES * BLOCK;
    }
    while first + BLOCK <= d {
        weigh_blocks::<1>(scores, values, d, first, out);
        first += BLOCK;
    }
    for (c, o) in out.iter_mut().enumerate().skip(first) {
        let mut a = 0.0f32;
        for (&p, v) in scores.iter().zip(values.chunks_exact(d)) {
            a += p * v[c];
        }
        *o = a;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention of one row against a direct f64 evaluation, across block
    /// boundaries of positions and of output elements.
    #[test]
    fn attend_row_matches_f64() {
        for (d, n, lo) in [
            (8usize, 5usize, 0usize),
            (16, 16, 3),
            (24, 37, 2),
            (40, 1, 0),
            (64, 50, 10),
            (8, 40, 16),
            (8, 7, 17),
        ] {
            let cap = (lo + n + 3).next_multiple_of(BLOCK);
            let q: Vec<f32> = (0..d).map(|i| ((i * 7 % 11) as f32 - 5.0) / 7.0).collect();
            // Key element i of position j: k(j, i); stored tiled.
            let k = |j: usize, i: usize| ((j * 31 + i * 13) % 17) as f32 / 9.0 - 0.9;
            let mut kt = vec![0.0f32; d * cap];
            for j in 0..cap {
                for i in 0..d {
                    kt[j / BLOCK * d * BLOCK + i * BLOCK + j % BLOCK] = k(j, i);
                }
            }
            let v: Vec<f32> = (0..n * d)
                .map(|i| ((i * 5 % 23) as f32 - 11.0) / 10.0)
                .collect();
            let mut scores = vec![0.0f32; n];
            let mut out = vec![0.0f32; d];
            attend_row(&q, &kt, lo, &v, 0.3, &mut scores, &mut out);
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    (0..d)
                        .map(|i| q[i] as f64 * k(lo + j, i) as f64)
                        .sum::<f64>()
                        * 0.3
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for c in 0..d {
                let want: f64 = (0..n)
                    .map(|j| (s[j] - m).exp() / z * v[j * d + c] as f64)
                    .sum();
                assert!((out[c] as f64 - want).abs() < 1e-5, "d {d} n {n} c {c}");
            }
        }
    }

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
