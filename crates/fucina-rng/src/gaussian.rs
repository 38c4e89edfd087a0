//! The exact Gaussian mapping: splitmix64 + Box–Muller in f64.

use crate::dispatch::Path;
use crate::stream::at;
use crate::{float, math};

/// `2^-53`.
pub(crate) const TWO_POW_M53: f64 = f64::from_bits(0x3ca0_0000_0000_0000);

/// The two f32 values of Box–Muller pair number `p` built from the stream
/// outputs `a = at(seed, 2p)` and `b = at(seed, 2p + 1)`.
#[inline(always)]
fn pair(a: u64, b: u64, scale: f64) -> (f32, f32) {
    let ua = ((a >> 11) as f64 + 1.0) * TWO_POW_M53; // (0, 1]
    let ub = (b >> 11) as f64 * TWO_POW_M53; // [0, 1)
    let radius = float::sqrt(-2.0 * math::ln(ua));
    let angle = 2.0 * core::f64::consts::PI * ub;
    let (sin, cos) = math::sin_cos_box_muller(angle);
    ((radius * cos * scale) as f32, (radius * sin * scale) as f32)
}

/// [`pair`] without a data-dependent branch, for one vector lane: the cosine
/// half, the sine half, and whether the pair is one of the rare ones
/// (see [`math::sin_cos_lane`]) that must be redone with [`pair`]. Equal to
/// [`pair`] bit for bit when not rare.
#[inline(always)]
fn pair_lane(a: u64, b: u64, scale: f64) -> (f32, f32, bool) {
    let ua = ((a >> 11) as f64 + 1.0) * TWO_POW_M53;
    let ub = (b >> 11) as f64 * TWO_POW_M53;
    let radius = float::sqrt(-2.0 * math::ln_unit(ua));
    let angle = 2.0 * core::f64::consts::PI * ub;
    let (sin, cos, rare) = math::sin_cos_lane(angle);
    (
        (radius * cos * scale) as f32,
        (radius * sin * scale) as f32,
        rare,
    )
}

/// Pairs per block of [`exact_blocks`].
const BLOCK: usize = 16;

/// Fills `blocks` with whole pairs starting at pair `p`, [`BLOCK`] pairs at a
/// time: first the block's stream outputs (`stream(i)` is output `i`, in the
/// fills `at(seed, i)`), then [`pair_lane`] over the block in one
/// branch-free loop (which the compiler vectorizes: every lane runs the same
/// IEEE operations, so the bits do not change), then, only if a pair of the
/// block was rare, the whole block again with [`pair`].
#[inline(always)]
fn exact_blocks(
    stream: impl Fn(u64) -> u64,
    mut p: u64,
    blocks: &mut [[f32; 2 * BLOCK]],
    scale: f64,
) {
    for block in blocks {
        let mut a = [0u64; BLOCK];
        let mut b = [0u64; BLOCK];
        for k in 0..BLOCK {
            let i = p.wrapping_add(k as u64).wrapping_mul(2);
            a[k] = stream(i);
            b[k] = stream(i.wrapping_add(1));
        }
        let mut rare = false;
        for k in 0..BLOCK {
            let (c, s, r) = pair_lane(a[k], b[k], scale);
            block[2 * k] = c;
            block[2 * k + 1] = s;
            rare |= r;
        }
        if rare {
            for k in 0..BLOCK {
                let (c, s) = pair(a[k], b[k], scale);
                block[2 * k] = c;
                block[2 * k + 1] = s;
            }
        }
        p = p.wrapping_add(BLOCK as u64);
    }
}

/// [`exact_blocks`] compiled for AVX2 (4 f64 lanes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exact_blocks_avx2(
    stream: impl Fn(u64) -> u64,
    p: u64,
    blocks: &mut [[f32; 2 * BLOCK]],
    scale: f64,
) {
    exact_blocks(stream, p, blocks, scale);
}

/// [`exact_blocks`] compiled for AVX-512 (8 f64 lanes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
fn exact_blocks_avx512(
    stream: impl Fn(u64) -> u64,
    p: u64,
    blocks: &mut [[f32; 2 * BLOCK]],
    scale: f64,
) {
    exact_blocks(stream, p, blocks, scale);
}

/// [`exact_blocks`] on `path`.
#[inline(always)]
fn exact_blocks_on(
    path: Path,
    stream: impl Fn(u64) -> u64,
    p: u64,
    blocks: &mut [[f32; 2 * BLOCK]],
    scale: f64,
) {
    match path {
        Path::Scalar => exact_blocks(stream, p, blocks, scale),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Path::Avx2` carries a `Detected` token, which only
        // `dispatch` creates, after detecting AVX2.
        Path::Avx2(_) => unsafe { exact_blocks_avx2(stream, p, blocks, scale) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Path::Avx512` carries a `Detected` token, which only
        // `dispatch` creates, after detecting AVX2 and AVX-512 F, DQ and VL.
        Path::Avx512(_) => unsafe { exact_blocks_avx512(stream, p, blocks, scale) },
    }
}

/// [`gaussian_fill_at`] on an explicit path (all paths give the same bits).
/// A vector `path` carries the proof of its runtime detection (only
/// [`Path::detect`] and [`Path::available`] make one), so any `path` is
/// sound here.
pub(crate) fn exact_fill_with(path: Path, seed: u64, first: u64, out: &mut [f32], scale: f32) {
    let scale = f64::from(scale);
    let pair_at = |p: u64| {
        let i = p.wrapping_mul(2);
        pair(at(seed, i), at(seed, i.wrapping_add(1)), scale)
    };
    let (rest, p) = split_odd_head(first, out, pair_at);
    let (blocks, tail) = rest.as_chunks_mut::<{ 2 * BLOCK }>();
    let body_pairs = (blocks.len() * BLOCK) as u64;
    exact_blocks_on(path, |i| at(seed, i), p, blocks, scale);
    fill_pairs(p.wrapping_add(body_pairs), tail, pair_at);
}

/// Fills `out` with standard normal values times `scale`: the exact
/// (seed -> values) Box–Muller mapping of the checkpoint contract.
///
/// Pair `p` uses the stream outputs `a = at(seed, 2p)`, `b = at(seed, 2p + 1)`;
/// with `ua = ((a >> 11) + 1) * 2^-53` and `ub = (b >> 11) * 2^-53`,
/// `radius = sqrt(-2 ln ua)` and `angle = 2 pi ub`, element `2p` is
/// `radius * cos(angle) * scale` and element `2p + 1` is
/// `radius * sin(angle) * scale`, all in f64, each rounded once to f32.
/// An odd length drops the last sine half. The transcendental functions are
/// this crate's own portable f64 implementations, so the bits do not depend on
/// the platform's libm.
///
/// Equal to [`gaussian_fill_at(seed, 0, out, scale)`](gaussian_fill_at) bit for bit.
///
/// ```
/// let mut w = [0.0f32; 5];
/// fucina_rng::gaussian_fill(42, &mut w, 1.5);
/// assert_eq!(w[0].to_bits(), 0x3f1f_409c); // the reference implementation's bits
/// ```
pub fn gaussian_fill(seed: u64, out: &mut [f32], scale: f32) {
    exact_fill_with(Path::detect(), seed, 0, out, scale);
}

/// Fills `out` with elements `first .. first + out.len()` of the
/// [`gaussian_fill`] stream for `seed` (counter form, O(1) random access).
///
/// Element `j` uses the pair `j / 2` and takes its cosine half when `j` is
/// even, its sine half when odd. Any decomposition of a range into windows
/// reproduces the one-shot fill bit for bit, so disjoint windows can be
/// filled in parallel.
///
/// ```
/// use fucina_rng::{gaussian_fill, gaussian_fill_at};
///
/// let mut whole = [0.0f32; 9];
/// gaussian_fill(7, &mut whole, 1.0);
/// let mut parts = [0.0f32; 9];
/// let (left, right) = parts.split_at_mut(3);
/// gaussian_fill_at(7, 0, left, 1.0);
/// gaussian_fill_at(7, 3, right, 1.0); // odd start: takes the sine half of pair 1
/// assert_eq!(whole.map(f32::to_bits), parts.map(f32::to_bits));
/// ```
pub fn gaussian_fill_at(seed: u64, first: u64, out: &mut [f32], scale: f32) {
    exact_fill_with(Path::detect(), seed, first, out, scale);
}

/// The head of a window starting at element `first` of a pair stream (element
/// `2p` is the cosine half `pair_at(p).0`, element `2p + 1` the sine half
/// `pair_at(p).1`): when `first` is odd and `out` is not empty, writes the sine
/// half of pair `first / 2` into `out[0]`. Returns the rest of `out`, which
/// starts on a pair boundary, and the index of its first pair.
#[inline(always)]
pub(crate) fn split_odd_head(
    first: u64,
    out: &mut [f32],
    pair_at: impl FnOnce(u64) -> (f32, f32),
) -> (&mut [f32], u64) {
    let p = first / 2;
    if first.is_multiple_of(2) {
        return (out, p);
    }
    match out {
        [head, rest @ ..] => {
            *head = pair_at(p).1;
            (rest, p.wrapping_add(1))
        }
        [] => (out, p),
    }
}

/// Fills `out`, which starts on a pair boundary at pair `p`, with whole pairs
/// `(pair_at(p).0, pair_at(p).1, ...)`; an odd length ends with a cosine half.
#[inline(always)]
pub(crate) fn fill_pairs(mut p: u64, out: &mut [f32], pair_at: impl Fn(u64) -> (f32, f32)) {
    let mut pairs = out.chunks_exact_mut(2);
    for two in &mut pairs {
        let (c, s) = pair_at(p);
        two[0] = c;
        two[1] = s;
        p = p.wrapping_add(1);
    }
    if let [last] = pairs.into_remainder() {
        *last = pair_at(p).0;
    }
}

/// Fills `out` with normal values of mean `mean` and standard deviation
/// `std_dev`: [`gaussian_fill(seed, out, std_dev)`](gaussian_fill), then, only
/// when `mean != 0`, `mean` is added to every element in f32.
///
/// ```
/// let mut w = [0.0f32; 4];
/// fucina_rng::normal_fill(3, &mut w, 2.0, 0.5);
/// let mut z = [0.0f32; 4];
/// fucina_rng::gaussian_fill(3, &mut z, 0.5);
/// assert!(w.iter().zip(&z).all(|(w, z)| *w == *z + 2.0));
/// ```
pub fn normal_fill(seed: u64, out: &mut [f32], mean: f32, std_dev: f32) {
    gaussian_fill(seed, out, std_dev);
    if mean != 0.0 {
        for v in out.iter_mut() {
            *v += mean;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::SplitMix64;

    /// Element `j` of the exact stream straight from the contract, with the
    /// general `ln` and `sin_cos` (no blocking, no branch-free kernels).
    fn reference_element(seed: u64, j: u64, scale: f32) -> f32 {
        let p = j / 2;
        let a = at(seed, p.wrapping_mul(2));
        let b = at(seed, p.wrapping_mul(2).wrapping_add(1));
        let ua = ((a >> 11) as f64 + 1.0) * TWO_POW_M53;
        let ub = (b >> 11) as f64 * TWO_POW_M53;
        let radius = (-2.0 * math::ln(ua)).sqrt();
        let (sin, cos) = math::sin_cos(2.0 * core::f64::consts::PI * ub);
        let trig = if j.is_multiple_of(2) { cos } else { sin };
        (radius * trig * f64::from(scale)) as f32
    }

    fn reference(seed: u64, first: u64, len: usize, scale: f32) -> Vec<u32> {
        (0..len as u64)
            .map(|k| reference_element(seed, first.wrapping_add(k), scale).to_bits())
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn every_path_matches_the_per_element_reference_on_random_windows() {
        const N: usize = 3001;
        let mut rng = SplitMix64::new(0xE4AC);
        for seed in [0u64, 42, u64::MAX, 0xDEAD_BEEF_CAFE_F00D] {
            for scale in [1.0f32, -0.37, 1e-30] {
                let want = reference(seed, 0, N, scale);
                for path in Path::available() {
                    let mut whole = vec![0.0f32; N];
                    exact_fill_with(path, seed, 0, &mut whole, scale);
                    assert_eq!(bits(&whole), want, "{path:?} seed {seed:#x} scale {scale}");
                    for _ in 0..20 {
                        let start = (rng.next_u64() % N as u64) as usize;
                        let len = (rng.next_u64() % (N - start) as u64) as usize;
                        let mut w = vec![0.0f32; len];
                        exact_fill_with(path, seed, start as u64, &mut w, scale);
                        assert_eq!(bits(&w), want[start..start + len], "{path:?} {start}+{len}");
                    }
                }
            }
        }
    }

    /// Every small length and offset around the block size, at ordinary and
    /// wrapping counters, each path writing exactly its window.
    #[test]
    fn every_path_matches_the_reference_for_small_lengths_and_offsets() {
        const CANARY: u32 = 0x7fc0_dead;
        for base in [0u64, u64::MAX - 100, (1 << 63) - 17] {
            for off in 0..=3u64 {
                let first = base.wrapping_add(off);
                for len in 0..=(4 * BLOCK + 3) {
                    let want = reference(0x5EED, first, len, 1.5);
                    for path in Path::available() {
                        let mut buf = vec![f32::from_bits(CANARY); len + 2];
                        exact_fill_with(path, 0x5EED, first, &mut buf[1..=len], 1.5);
                        assert_eq!(buf[0].to_bits(), CANARY, "{path:?} wrote before");
                        assert_eq!(buf[len + 1].to_bits(), CANARY, "{path:?} wrote after");
                        assert_eq!(bits(&buf[1..=len]), want, "{path:?} {first:#x}+{len}");
                    }
                }
            }
        }
    }

    /// Angles a few ulps from pi/2, pi and 3pi/2, where one round of
    /// reduction is not enough: the branch-free lane flags them, and its f64
    /// result is off there (by about 1e-26 absolute), which shows in the
    /// f32 output when that lands next to an f32 rounding boundary. Such
    /// pairs are found by scanning, placed in a block through an injected
    /// stream, and must come out exact on every path.
    #[test]
    fn angles_next_to_multiples_of_half_pi_are_redone_exactly() {
        let mut cases = Vec::new(); // (a, b) where the lane's f32 bits are wrong
        'scan: for quarter in [1u64, 2, 3] {
            for j in 1..64u64 {
                let b = ((quarter << 51) + j) << 11; // ub = quarter/4 + j 2^-53
                for i in 0..4096 {
                    let a = at(9, i);
                    let (c, s, rare) = pair_lane(a, b, 1.0);
                    assert!(rare, "ub = {quarter}/4 + {j} ulp");
                    let (ec, es) = pair(a, b, 1.0);
                    if (c.to_bits(), s.to_bits()) != (ec.to_bits(), es.to_bits()) {
                        cases.push((a, b));
                        if cases.len() == 3 {
                            break 'scan;
                        }
                        break;
                    }
                }
            }
        }
        assert_eq!(cases.len(), 3, "no pair where one round of reduction shows");
        // A stream that is `at(7, i)` except for three pairs, set to the
        // found ones (in the first block and twice in the second).
        let at_pair = [3u64, BLOCK as u64 + 2, 2 * BLOCK as u64 - 1];
        let stream = |i: u64| match at_pair.iter().position(|&p| p == i / 2) {
            Some(k) if i.is_multiple_of(2) => cases[k].0,
            Some(k) => cases[k].1,
            None => at(7, i),
        };
        let mut want = Vec::new();
        for p in 0..2 * BLOCK as u64 {
            let (a, b) = (stream(2 * p), stream(2 * p + 1));
            let ua = ((a >> 11) as f64 + 1.0) * TWO_POW_M53;
            let ub = (b >> 11) as f64 * TWO_POW_M53;
            let radius = (-2.0 * math::ln(ua)).sqrt();
            let (sin, cos) = math::sin_cos(2.0 * core::f64::consts::PI * ub);
            want.extend([
                ((radius * cos) as f32).to_bits(),
                ((radius * sin) as f32).to_bits(),
            ]);
        }
        for path in Path::available() {
            let mut blocks = [[0.0f32; 2 * BLOCK]; 2];
            exact_blocks_on(path, stream, 0, &mut blocks, 1.0);
            assert_eq!(bits(blocks.as_flattened()), want, "{path:?}");
        }
    }
}
