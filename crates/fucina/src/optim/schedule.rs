//! Learning-rate schedules.

use crate::error::{Error, Result};

/// Linear warmup from `base_lr / warmup` to `base_lr` over the first `warmup`
/// steps, then a cosine decay to `min_lr` at step `total` (constant `min_lr`
/// after it):
///
/// ```text
/// lr(s) = base_lr * (s + 1) / warmup                                  s < warmup
/// lr(s) = min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2         p = (s - warmup) / (total - warmup), at most 1
/// ```
///
/// ```
/// use fucina::optim::WarmupCosine;
///
/// let s = WarmupCosine::new(1.0, 0.0, 10, 110)?;
/// assert_eq!(s.lr(0), 0.1);
/// assert_eq!(s.lr(9), 1.0);
/// assert_eq!(s.lr(10), 1.0);
/// assert!((s.lr(60) - 0.5).abs() < 1e-6);
/// assert_eq!(s.lr(110), 0.0);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosine {
    base_lr: f32,
    min_lr: f32,
    warmup: u64,
    total: u64,
}

impl WarmupCosine {
    /// A schedule peaking at `base_lr` after `warmup` steps and reaching `min_lr`
    /// at step `total`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a negative or non-finite rate, `min_lr >
    /// base_lr`, or `warmup > total`.
    pub fn new(base_lr: f32, min_lr: f32, warmup: u64, total: u64) -> Result<WarmupCosine> {
        if !(base_lr.is_finite() && min_lr.is_finite() && min_lr >= 0.0 && min_lr <= base_lr) {
            return Err(Error::invalid(
                "WarmupCosine::new",
                format!(
                    "need 0 <= min_lr <= base_lr, both finite (got min_lr = {min_lr}, base_lr = {base_lr})"
                ),
            ));
        }
        if warmup > total {
            return Err(Error::invalid(
                "WarmupCosine::new",
                format!("warmup ({warmup}) exceeds total ({total})"),
            ));
        }
        Ok(WarmupCosine {
            base_lr,
            min_lr,
            warmup,
            total,
        })
    }

    /// The learning rate at step `step` (counting from 0), computed in f64.
    pub fn lr(&self, step: u64) -> f32 {
        let (base, min) = (f64::from(self.base_lr), f64::from(self.min_lr));
        if step < self.warmup {
            return (base * (step + 1) as f64 / self.warmup as f64) as f32;
        }
        let span = self.total - self.warmup;
        let p = if span == 0 {
            1.0
        } else {
            ((step - self.warmup) as f64 / span as f64).min(1.0)
        };
        (min + (base - min) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())) as f32
    }
}
