//! Gradient clipping by the global norm.

use fucina_exec::ExecContext;

use super::check_distinct;
use super::state::grad_of;
use crate::error::{Error, Result};
use crate::nn::Parameter;

/// Scales the gradients of `params` so that their global L2 norm is at most
/// `max_norm` (PyTorch's `clip_grad_norm_`: every gradient is multiplied by
/// `max_norm / (total + 1e-6)` when that is below 1) and returns the norm before
/// clipping. Parameters without a gradient are ignored.
///
/// The norm is accumulated in f64 over the parameters in order (the same bits on
/// every run and team size). The gradients are scaled in place (the next
/// backward adds to the clipped value; a grad view taken earlier keeps the
/// unclipped values).
///
/// # Errors
/// [`Error::InvalidArgument`] unless `max_norm` is finite and positive, or if a
/// parameter is listed twice (its gradient would count twice); out of memory.
/// Nothing changes on an error.
pub fn clip_grad_norm(ctx: &ExecContext, params: &[Parameter], max_norm: f32) -> Result<f32> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::invalid(
            "clip_grad_norm",
            format!("max_norm must be finite and > 0 (got {max_norm})"),
        ));
    }
    check_distinct("clip_grad_norm", params)?;
    let mut sum = 0.0f64;
    for p in params {
        if let Some(g) = grad_of(ctx, p)? {
            sum += g
                .data()?
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>();
        }
    }
    let total = sum.sqrt() as f32;
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 {
        // First what can fail (a gradient shared with a view or another
        // gradient gets storage of its own; values unchanged), then the scaling,
        // in place: an error leaves every gradient as it was.
        for p in params {
            p.tensor().own_grad(ctx)?;
        }
        for p in params {
            p.tensor().scale_grad_(ctx, coef)?;
        }
    }
    Ok(total)
}
