//! The categorical sampler: `categorical` and `categorical_fill`.

use core::fmt;

use crate::stream::at;

/// Why a weight vector is not a distribution [`categorical`] can sample.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum CategoricalError {
    /// No weights were given.
    Empty,
    /// A weight is negative, NaN or infinite.
    InvalidWeight {
        /// Its position.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// Every weight is zero.
    ZeroTotal,
}

impl fmt::Display for CategoricalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CategoricalError::Empty => write!(f, "categorical: no weights were given"),
            CategoricalError::InvalidWeight { index, value } => write!(
                f,
                "categorical: weight {index} is {value}; weights must be finite and >= 0"
            ),
            CategoricalError::ZeroTotal => write!(f, "categorical: every weight is zero"),
        }
    }
}

impl core::error::Error for CategoricalError {}

/// The f64 total of `weights`, summed left to right, after checking them.
fn checked_total(weights: &[f32]) -> Result<f64, CategoricalError> {
    if weights.is_empty() {
        return Err(CategoricalError::Empty);
    }
    let mut total = 0.0f64;
    for (index, &w) in weights.iter().enumerate() {
        if !(w.is_finite() && w >= 0.0) {
            return Err(CategoricalError::InvalidWeight { index, value: w });
        }
        total += f64::from(w);
    }
    if total > 0.0 {
        Ok(total)
    } else {
        Err(CategoricalError::ZeroTotal)
    }
}

/// The draw of stream element `index` from checked `weights` with `total`.
fn draw(seed: u64, index: u64, weights: &[f32], total: f64) -> usize {
    let u = (at(seed, index) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    let target = u * total;
    let mut cumulative = 0.0f64;
    let mut last_positive = 0;
    for (k, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            cumulative += f64::from(w);
            last_positive = k;
            if target < cumulative {
                return k;
            }
        }
    }
    // Only reachable when rounding puts `target` at the very top.
    last_positive
}

/// Draws one index from the categorical distribution with probabilities
/// proportional to `weights` (they need not sum to 1), as element `index` of
/// the stream of `seed`.
///
/// The mapping: `u = (at(seed, index) >> 11) * 2^-53` (a uniform on `[0, 1)`
/// with 53 bits), `total` the f64 sum of the weights from left to right, and
/// the result the first `k` whose running f64 sum of the positive weights
/// `w_0 + .. + w_k` exceeds `u * total` (the last positive weight if rounding
/// leaves none). A zero weight is never drawn. Like every mapping of this crate
/// it is a pure function of `(seed, index, weights)`.
///
/// PyTorch's `torch.multinomial(p, 1)` with a generator, as a function of a
/// counter: draw `n` tokens with `categorical(seed, step, probs)` for `step` in
/// `0..n` (or [`categorical_fill`]).
///
/// ```
/// use fucina_rng::{CategoricalError, categorical};
///
/// let probs = [0.1f32, 0.0, 0.6, 0.3];
/// let k = categorical(42, 0, &probs)?;
/// assert!(k == 0 || k == 2 || k == 3);
/// assert_eq!(categorical(42, 0, &probs)?, k); // the same draw, every time
/// assert!(matches!(
///     categorical(1, 0, &[0.0, f32::NAN]),
///     Err(CategoricalError::InvalidWeight { index: 1, .. })
/// ));
/// assert_eq!(categorical(1, 0, &[0.0, 0.0]), Err(CategoricalError::ZeroTotal));
/// # Ok::<(), CategoricalError>(())
/// ```
///
/// # Errors
/// [`CategoricalError::Empty`] for no weights,
/// [`CategoricalError::InvalidWeight`] for a negative, NaN or infinite one,
/// [`CategoricalError::ZeroTotal`] when they are all zero.
pub fn categorical(seed: u64, index: u64, weights: &[f32]) -> Result<usize, CategoricalError> {
    let total = checked_total(weights)?;
    Ok(draw(seed, index, weights, total))
}

/// Fills `out` with independent draws from `weights` (with replacement):
/// `out[i] = categorical(seed, first + i, weights)`, so disjoint windows of a
/// long run of draws can be filled separately with the bits of one call.
///
/// The weights are checked once, before anything is written: on an error
/// `out` is unchanged.
///
/// ```
/// let mut draws = [0usize; 1000];
/// fucina_rng::categorical_fill(7, 0, &[1.0, 3.0], &mut draws)?;
/// let ones = draws.iter().filter(|&&k| k == 1).count();
/// assert!((700..800).contains(&ones)); // about three in four
/// # Ok::<(), fucina_rng::CategoricalError>(())
/// ```
///
/// # Errors
/// As [`categorical`].
pub fn categorical_fill(
    seed: u64,
    first: u64,
    weights: &[f32],
    out: &mut [usize],
) -> Result<(), CategoricalError> {
    let total = checked_total(weights)?;
    for (i, v) in (first..).zip(out.iter_mut()) {
        *v = draw(seed, i, weights, total);
    }
    Ok(())
}
