//! The losses PyTorch models train with besides cross-entropy and MSE:
//! [`l1_loss`], [`smooth_l1_loss`], [`huber_loss`],
//! [`binary_cross_entropy`], [`binary_cross_entropy_with_logits`] (the
//! stable form, with `pos_weight`), [`kl_div`], and cross-entropy / NLL with
//! `ignore_index` and label smoothing ([`cross_entropy_with`],
//! [`nll_loss_with`]), each with PyTorch's definition and a [`Reduction`].
//!
//! They are composed from the differentiable ops (`abs`, `clamp`, `softplus`,
//! `log_softmax`, products and sums), so autograd records their gradients
//! and they keep the ops' determinism (the same bits for every thread
//! count and vector level).

use fucina_autograd::Tensor;
use fucina_exec::{ExecContext, RawTensor};

use crate::error::{Error, Result};

/// How a loss reduces its per-element values (PyTorch's `reduction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Reduction {
    /// The per-element values, the input's shape.
    None,
    /// Their mean (the default).
    #[default]
    Mean,
    /// Their sum.
    Sum,
    /// Their sum divided by the first dimension (`kl_div`'s `"batchmean"`,
    /// the mathematically correct KL divergence per sample).
    BatchMean,
}

fn reduce(ctx: &ExecContext, t: Tensor, r: Reduction) -> Result<Tensor> {
    Ok(match r {
        Reduction::None => t,
        Reduction::Mean => t.mean_all(ctx)?,
        Reduction::Sum => t.sum_all(ctx)?,
        Reduction::BatchMean => {
            let n = t.shape().first().copied().unwrap_or(1).max(1);
            t.sum_all(ctx)?.scale(ctx, 1.0 / n as f32)?
        }
    })
}

fn same_shape(what: &str, input: &Tensor, target: &Tensor) -> Result<()> {
    if input.shape() != target.shape() {
        return Err(Error::ShapeMismatch {
            layer: what.to_string(),
            got: target.shape().to_vec(),
            reason: format!("the target must have the input's shape {:?}", input.shape()),
        });
    }
    Ok(())
}

fn check_positive(what: &'static str, name: &str, v: f32) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        return Err(Error::invalid(
            what,
            format!("{name} must be finite and positive (got {v})"),
        ));
    }
    Ok(())
}

/// `|input - target|`, reduced: PyTorch's `l1_loss` (the gradient at
/// `input == target` is 0).
///
/// ```
/// use fucina::nn::{Reduction, l1_loss};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let x = Tensor::from_slice(&ctx, &[3], &[1.0, -2.0, 3.0])?;
/// let y = Tensor::from_slice(&ctx, &[3], &[0.0, 0.0, 3.0])?;
/// assert_eq!(l1_loss(&ctx, &x, &y, Reduction::Sum)?.item()?, 3.0);
/// # Ok::<(), fucina::Error>(())
/// ```
///
/// # Errors
/// [`Error::ShapeMismatch`] if the shapes differ; out of memory.
pub fn l1_loss(ctx: &ExecContext, input: &Tensor, target: &Tensor, r: Reduction) -> Result<Tensor> {
    same_shape("l1_loss", input, target)?;
    reduce(ctx, input.sub(ctx, target)?.abs(ctx)?, r)
}

/// `c * (|d| - c / 2) / beta` with `d = input - target`, `c = min(|d|,
/// beta)`: `d² / (2 beta)` below `beta`, `|d| - beta / 2` above, reduced:
/// PyTorch's `smooth_l1_loss`.
///
/// # Errors
/// [`Error::ShapeMismatch`] if the shapes differ;
/// [`Error::InvalidArgument`] for a `beta` that is not finite and positive;
/// out of memory.
pub fn smooth_l1_loss(
    ctx: &ExecContext,
    input: &Tensor,
    target: &Tensor,
    beta: f32,
    r: Reduction,
) -> Result<Tensor> {
    same_shape("smooth_l1_loss", input, target)?;
    check_positive("smooth_l1_loss", "beta", beta)?;
    let t = huber_terms(ctx, input, target, beta)?.scale(ctx, 1.0 / beta)?;
    reduce(ctx, t, r)
}

/// `c * (|d| - c / 2)`, `c = min(|d|, delta)`: `d² / 2` below `delta`,
/// `delta * (|d| - delta / 2)` above, reduced: PyTorch's `huber_loss`
/// (`delta` times [`smooth_l1_loss`] with `beta = delta`).
///
/// ```
/// use fucina::nn::{Reduction, huber_loss};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let x = Tensor::from_slice(&ctx, &[2], &[0.5, 3.0])?;
/// let y = Tensor::zeros(&ctx, &[2])?;
/// assert_eq!(huber_loss(&ctx, &x, &y, 1.0, Reduction::None)?.to_vec(), [0.125, 2.5]);
/// # Ok::<(), fucina::Error>(())
/// ```
///
/// # Errors
/// As [`smooth_l1_loss`], for `delta`.
pub fn huber_loss(
    ctx: &ExecContext,
    input: &Tensor,
    target: &Tensor,
    delta: f32,
    r: Reduction,
) -> Result<Tensor> {
    same_shape("huber_loss", input, target)?;
    check_positive("huber_loss", "delta", delta)?;
    reduce(ctx, huber_terms(ctx, input, target, delta)?, r)
}

/// `c * (|d| - c / 2)` with `c = min(|d|, k)`.
fn huber_terms(ctx: &ExecContext, input: &Tensor, target: &Tensor, k: f32) -> Result<Tensor> {
    let ad = input.sub(ctx, target)?.abs(ctx)?;
    let c = ad.clamp(ctx, 0.0, k)?;
    Ok(c.mul(ctx, &ad.sub(ctx, &c.scale(ctx, 0.5)?)?)?)
}

/// `-w * (y log p + (1 - y) log(1 - p))` for probabilities `input = p` and
/// targets `y` in `[0, 1]`, each log clamped at `-100` as PyTorch does,
/// with an optional `weight` broadcast to the input, reduced: PyTorch's
/// `binary_cross_entropy`. Prefer [`binary_cross_entropy_with_logits`] on
/// logits (stable, and one op fewer).
///
/// # Errors
/// [`Error::ShapeMismatch`] if the shapes differ (the weight must
/// broadcast); out of memory.
pub fn binary_cross_entropy(
    ctx: &ExecContext,
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    r: Reduction,
) -> Result<Tensor> {
    same_shape("binary_cross_entropy", input, target)?;
    let log_p = input.log(ctx)?.clamp(ctx, -100.0, f32::INFINITY)?;
    let log_q = input
        .scale(ctx, -1.0)?
        .add_scalar(ctx, 1.0)?
        .log(ctx)?
        .clamp(ctx, -100.0, f32::INFINITY)?;
    let one_minus_y = target.scale(ctx, -1.0)?.add_scalar(ctx, 1.0)?;
    let mut t = target
        .mul(ctx, &log_p)?
        .add(ctx, &one_minus_y.mul(ctx, &log_q)?)?
        .scale(ctx, -1.0)?;
    if let Some(w) = weight {
        t = t.mul(ctx, w)?;
    }
    reduce(ctx, t, r)
}

/// `pw * y * softplus(-x) + (1 - y) * softplus(x)` for logits `input = x`
/// and targets `y`: `-(pw y log σ(x) + (1 - y) log(1 - σ(x)))` in the
/// stable form (no `exp` of a large value, no `log` of 0), with the
/// optional `pos_weight` (`pw`, broadcast over the last dimension: one per
/// class), reduced: PyTorch's `binary_cross_entropy_with_logits` /
/// `BCEWithLogitsLoss`.
///
/// ```
/// use fucina::nn::{Reduction, binary_cross_entropy_with_logits};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let x = Tensor::from_slice(&ctx, &[2], &[100.0, -100.0])?; // confident and right
/// let y = Tensor::from_slice(&ctx, &[2], &[1.0, 0.0])?;
/// let l = binary_cross_entropy_with_logits(&ctx, &x, &y, None, Reduction::Mean)?;
/// assert!(l.item()? < 1e-40); // no overflow, no NaN: softplus(-100) = exp(-100)
/// # Ok::<(), fucina::Error>(())
/// ```
///
/// # Errors
/// [`Error::ShapeMismatch`] if the shapes differ (`pos_weight` must
/// broadcast); out of memory.
pub fn binary_cross_entropy_with_logits(
    ctx: &ExecContext,
    input: &Tensor,
    target: &Tensor,
    pos_weight: Option<&Tensor>,
    r: Reduction,
) -> Result<Tensor> {
    same_shape("binary_cross_entropy_with_logits", input, target)?;
    let pos = input.scale(ctx, -1.0)?.softplus(ctx)?; // -log σ(x)
    let neg = input.softplus(ctx)?; // -log(1 - σ(x))
    let mut yp = target.mul(ctx, &pos)?;
    if let Some(pw) = pos_weight {
        yp = yp.mul(ctx, pw)?;
    }
    let one_minus_y = target.scale(ctx, -1.0)?.add_scalar(ctx, 1.0)?;
    reduce(ctx, yp.add(ctx, &one_minus_y.mul(ctx, &neg)?)?, r)
}

/// The Kullback-Leibler divergence of the log-probabilities `input` from
/// `target`: `target * (log target - input)` (0 where `target` is 0), or
/// with `log_target` `exp(target) * (target - input)`, reduced: PyTorch's
/// `kl_div` (use [`Reduction::BatchMean`] for the divergence per sample).
///
/// # Errors
/// [`Error::ShapeMismatch`] if the shapes differ; out of memory.
pub fn kl_div(
    ctx: &ExecContext,
    input: &Tensor,
    target: &Tensor,
    r: Reduction,
    log_target: bool,
) -> Result<Tensor> {
    same_shape("kl_div", input, target)?;
    let t = if log_target {
        target.exp(ctx)?.mul(ctx, &target.sub(ctx, input)?)?
    } else {
        // xlogy: the log of the smallest normal instead of -inf at 0 makes
        // the product 0 there (and leaves every positive target unchanged).
        let log_t = target
            .clamp(ctx, f32::MIN_POSITIVE, f32::INFINITY)?
            .log(ctx)?;
        target.mul(ctx, &log_t.sub(ctx, input)?)?
    };
    reduce(ctx, t, r)
}

/// The options of [`cross_entropy_with`] and [`nll_loss_with`]. `Default`
/// is PyTorch's: no ignored label, no smoothing, the mean.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct ClassLossOptions {
    /// A label whose rows count neither in the loss nor in the mean's
    /// denominator (PyTorch's `ignore_index`, often `-100`).
    pub ignore_index: Option<i64>,
    /// `ε` in `[0, 1)`: the target is `1 - ε` at the label plus `ε / C` on
    /// every class (PyTorch's `label_smoothing`).
    pub label_smoothing: f32,
    /// `Mean` over the rows not ignored, `Sum`, or `None` (`[N]`, 0 at the
    /// ignored rows).
    pub reduction: Reduction,
}

/// Cross-entropy of `logits` (`[N, C]`) against integer `labels` (`[N]`)
/// with PyTorch's `ignore_index` and `label_smoothing`: [`nll_loss_with`]
/// of `log_softmax(logits)`.
///
/// ```
/// use fucina::nn::{ClassLossOptions, cross_entropy_with};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let logits = Tensor::from_slice(&ctx, &[3, 2], &[2.0, 0.0, 0.0, 2.0, 5.0, -5.0])?;
/// let labels = ctx.from_slice_typed::<i64>(&[3], &[0, 1, -100])?;
/// let opts = ClassLossOptions { ignore_index: Some(-100), ..Default::default() };
/// let l = cross_entropy_with(&ctx, &logits, &labels, opts)?;
/// let want = logits.narrow(&ctx, 0, 0, 2)?.cross_entropy(&ctx, &ctx.from_slice_typed::<i64>(&[2], &[0, 1])?)?;
/// assert!((l.item()? - want.item()?).abs() < 1e-6); // the third row is ignored
/// # Ok::<(), fucina::Error>(())
/// ```
///
/// # Errors
/// As [`nll_loss_with`].
pub fn cross_entropy_with(
    ctx: &ExecContext,
    logits: &Tensor,
    labels: &RawTensor<i64>,
    opts: ClassLossOptions,
) -> Result<Tensor> {
    check_class_shapes("cross_entropy_with", logits, labels)?;
    nll_loss_with(ctx, &logits.log_softmax(ctx, 1)?, labels, opts)
}

fn check_class_shapes(what: &str, x: &Tensor, labels: &RawTensor<i64>) -> Result<()> {
    let s = x.shape();
    if s.len() != 2 || labels.shape() != [s[0]] {
        return Err(Error::ShapeMismatch {
            layer: what.to_string(),
            got: labels.shape().to_vec(),
            reason: format!("the input must be [N, C] and the labels [N] (input {s:?})"),
        });
    }
    Ok(())
}

/// The negative log-likelihood of log-probabilities `input` (`[N, C]`) at
/// integer `labels` (`[N]`) with PyTorch's `ignore_index` and
/// `label_smoothing`: row `i`'s loss is `-Σ_c t[i, c] input[i, c]` with `t`
/// the smoothed one-hot target (`1 - ε + ε / C` at the label, `ε / C`
/// elsewhere), 0 for an ignored row; `Mean` divides by the rows not ignored.
///
/// # Errors
/// [`Error::ShapeMismatch`] unless the input is `[N, C]` and the labels
/// `[N]`; [`Error::InvalidArgument`] for a label outside `0..C` (and not
/// the ignored one) or a smoothing outside `[0, 1)`; out of memory.
pub fn nll_loss_with(
    ctx: &ExecContext,
    input: &Tensor,
    labels: &RawTensor<i64>,
    opts: ClassLossOptions,
) -> Result<Tensor> {
    let what = "nll_loss_with";
    check_class_shapes(what, input, labels)?;
    let eps = opts.label_smoothing;
    if !(0.0..1.0).contains(&eps) {
        return Err(Error::invalid(
            what,
            format!("label_smoothing must be in [0, 1) (got {eps})"),
        ));
    }
    let (n, c) = (input.shape()[0], input.shape()[1]);
    let mut t = vec![0.0f32; n * c];
    let mut kept = 0usize;
    for (i, &y) in labels.to_vec().iter().enumerate() {
        if opts.ignore_index == Some(y) {
            continue;
        }
        let Some(y) = usize::try_from(y).ok().filter(|&y| y < c) else {
            return Err(Error::invalid(
                what,
                format!("label {y} at row {i} is outside 0..{c}"),
            ));
        };
        kept += 1;
        let row = &mut t[i * c..][..c];
        row.fill(eps / c as f32);
        row[y] += 1.0 - eps;
    }
    let t = Tensor::from_slice(ctx, &[n, c], &t)?;
    let per_row = input.mul(ctx, &t)?.sum(ctx, 1, false)?.scale(ctx, -1.0)?;
    match opts.reduction {
        Reduction::Mean => Ok(per_row.sum_all(ctx)?.scale(ctx, 1.0 / kept as f32)?),
        r => reduce(ctx, per_row, r),
    }
}
