//! Integer mappings: `randint_fill` and `randperm_fill`.

use crate::stream::{at, splitmix64};

/// The high 64 bits of the 128-bit product `x * span`: a value in `[0, span)`.
#[inline(always)]
fn high64(x: u64, span: u64) -> u64 {
    ((u128::from(x) * u128::from(span)) >> 64) as u64
}

/// Fills `out` with integers on the half-open interval `[low, high)`.
///
/// With `x` the sequential stream from `seed` and `span = high - low` in
/// wrapping `u64` arithmetic, each value is `low + ((x * span) >> 64)`
/// (128-bit product, wrapping add). The bias is below `span * 2^-64`; the
/// full `i64` range (`i64::MIN..i64::MAX`) works.
///
/// # Panics
///
/// If `low >= high` (a contract violation: the interval is empty).
///
/// ```
/// let mut dice = [0i64; 100];
/// fucina_rng::randint_fill(6, &mut dice, 1, 7);
/// assert!(dice.iter().all(|d| (1..7).contains(d)));
/// ```
pub fn randint_fill(seed: u64, out: &mut [i64], low: i64, high: i64) {
    assert!(
        low < high,
        "randint_fill: requires low < high (got low = {low}, high = {high})"
    );
    let span = (high as u64).wrapping_sub(low as u64);
    let mut state = seed;
    for v in out {
        let offset = high64(splitmix64(&mut state), span);
        *v = (low as u64).wrapping_add(offset) as i64;
    }
}

/// Overwrites `out` with a uniformly shuffled permutation of `0 .. out.len()`.
///
/// Fisher–Yates over the counter stream: `out[i] = i`, then for `k = n - 1`
/// down to `1` with a counter `c = 0, 1, 2, ...`, swap `out[k]` with
/// `out[(at(seed, c) * (k + 1)) >> 64]` (128-bit product).
///
/// ```
/// let mut p = [0i64; 10];
/// fucina_rng::randperm_fill(3, &mut p);
/// let mut sorted = p;
/// sorted.sort();
/// assert_eq!(sorted, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
/// ```
pub fn randperm_fill(seed: u64, out: &mut [i64]) {
    for (i, v) in out.iter_mut().enumerate() {
        *v = i as i64;
    }
    let n = out.len();
    if n < 2 {
        return;
    }
    for (c, k) in (1..n).rev().enumerate() {
        let j = high64(at(seed, c as u64), k as u64 + 1) as usize;
        out.swap(k, j);
    }
}
