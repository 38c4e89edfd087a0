//! The exact Gaussian mapping: splitmix64 + Box–Muller in f64.

use crate::stream::{at, splitmix64};
use crate::{float, math};

/// `2^-53`.
pub(crate) const TWO_POW_M53: f64 = f64::from_bits(0x3ca0_0000_0000_0000);

/// The two f32 values of Box–Muller pair number `p` built from the stream
/// outputs `a = at(seed, 2p)` and `b = at(seed, 2p + 1)`.
#[inline]
fn pair(a: u64, b: u64, scale: f64) -> (f32, f32) {
    let ua = ((a >> 11) as f64 + 1.0) * TWO_POW_M53; // (0, 1]
    let ub = (b >> 11) as f64 * TWO_POW_M53; // [0, 1)
    let radius = float::sqrt(-2.0 * math::ln(ua));
    let angle = 2.0 * core::f64::consts::PI * ub;
    let (sin, cos) = math::sin_cos(angle);
    ((radius * cos * scale) as f32, (radius * sin * scale) as f32)
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
    let scale = f64::from(scale);
    let mut state = seed;
    let mut pairs = out.chunks_exact_mut(2);
    for two in &mut pairs {
        let a = splitmix64(&mut state);
        let b = splitmix64(&mut state);
        let (c, s) = pair(a, b, scale);
        two[0] = c;
        two[1] = s;
    }
    if let [last] = pairs.into_remainder() {
        let a = splitmix64(&mut state);
        let b = splitmix64(&mut state);
        *last = pair(a, b, scale).0;
    }
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
    let scale = f64::from(scale);
    let pair_at = |p: u64| {
        let i = p.wrapping_mul(2);
        pair(at(seed, i), at(seed, i.wrapping_add(1)), scale)
    };
    let (rest, p) = split_odd_head(first, out, pair_at);
    fill_pairs(p, rest, pair_at);
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
