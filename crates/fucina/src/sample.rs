//! Seeded sampling from tensors: [`multinomial`], the rows of a
//! probability (or weight) tensor drawn with
//! [`rng::categorical`](crate::rng::categorical).

use fucina_autograd::Tensor;
use fucina_exec::{ExecContext, RawTensor};

use crate::error::{Error, Result};

/// Draws `n` category indices (with replacement) from each row of `probs`, a
/// `[B, V]` tensor of probabilities or of any non-negative weights (each row
/// is normalized by its own sum; for logits apply
/// [`softmax`](Tensor::softmax) first), and returns them as a `[B, n]` `i64`
/// tensor. A 1-D `probs` of `V` weights is one row and gives `[n]`.
///
/// The draws are a pure function of `(seed, probs)`: draw `j` of row `b` is
/// [`rng::categorical`](crate::rng::categorical)`(seed, b * n + j, row b)`,
/// the same for every team size and every run (PyTorch's
/// `torch.multinomial(probs, n, replacement=True)` with a seeded generator).
/// A zero weight is never drawn. Not recorded on the tape (indices have no
/// gradient).
///
/// ```
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let probs = Tensor::from_slice(&ctx, &[2, 3], &[0.2, 0.0, 0.8, 0.0, 1.0, 0.0])?;
/// let draws = fucina::sample::multinomial(&ctx, &probs, 4, 42)?;
/// assert_eq!(draws.shape(), [2, 4]);
/// let v = draws.to_vec();
/// assert!(v[..4].iter().all(|&k| k == 0 || k == 2)); // never the zero weight
/// assert_eq!(&v[4..], [1, 1, 1, 1]);
/// // the same seed, the same draws
/// assert_eq!(fucina::sample::multinomial(&ctx, &probs, 4, 42)?.to_vec(), v);
/// # Ok::<(), fucina::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`] (nothing is drawn) if `probs` is not 1-D or 2-D,
/// has rows of no elements, or `n` is 0, or if a row has a negative, NaN or
/// infinite weight or only zeros: the message names the row (and the weight's
/// position and value). The errors of reading `probs` and of allocating the
/// result.
pub fn multinomial(
    ctx: &ExecContext,
    probs: &Tensor,
    n: usize,
    seed: u64,
) -> Result<RawTensor<i64>> {
    let shape = probs.shape().to_vec();
    let (rows, width) = match shape[..] {
        [v] => (1, v),
        [b, v] => (b, v),
        _ => {
            return Err(Error::invalid(
                "multinomial",
                format!("probs must be [B, V] or [V], got shape {shape:?}"),
            ));
        }
    };
    if n == 0 {
        return Err(Error::invalid(
            "multinomial",
            "n (the number of draws per row) must be at least 1",
        ));
    }
    if width == 0 {
        return Err(Error::invalid(
            "multinomial",
            format!("probs of shape {shape:?} has rows of no categories"),
        ));
    }
    // The result comes from the pool, fallibly and before anything is drawn:
    // `B * n` draws that overflow or cannot be allocated are an `Err`, not an
    // abort. The draws go through a fixed scratch block, so nothing else of
    // that size is allocated.
    let out_shape: &[usize] = if shape.len() == 1 { &[n] } else { &[rows, n] };
    let mut result = ctx.empty_typed::<i64>(out_shape)?;
    let values = probs.try_to_vec()?;
    let out = result.data_mut()?;
    let mut scratch = [0usize; 256];
    for (b, (row, out)) in values
        .chunks_exact(width)
        .zip(out.chunks_exact_mut(n))
        .enumerate()
    {
        let mut first = (b as u64) * (n as u64);
        for block in out.chunks_mut(scratch.len()) {
            let draws = &mut scratch[..block.len()];
            fucina_rng::categorical_fill(seed, first, row, draws)
                .map_err(|e| Error::invalid("multinomial", format!("row {b} of probs: {e}")))?;
            for (o, &k) in block.iter_mut().zip(draws.iter()) {
                *o = k as i64;
            }
            first += block.len() as u64;
        }
    }
    Ok(result)
}
