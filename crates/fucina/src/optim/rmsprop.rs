//! RMSprop (PyTorch's `torch.optim.RMSprop`: smoothing `alpha`, `eps`,
//! momentum, the centered variant, L2 weight decay).

use fucina_exec::ExecContext;

use super::groups::Groups;
use super::state::State;
use super::{basic_optimizer, check_distinct, check_lr, check_nonneg};
use crate::error::{Error, Result};
use crate::nn::Parameter;

/// The hyperparameters of [`RmsProp`] (PyTorch's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsPropConfig {
    /// The learning rate (default `1e-2`).
    pub lr: f32,
    /// The smoothing constant of the running mean of squares (default
    /// `0.99`, in `[0, 1]`).
    pub alpha: f32,
    /// Added to the denominator (default `1e-8`).
    pub eps: f32,
    /// L2 penalty: `weight_decay * w` is added to the gradient (default 0).
    pub weight_decay: f32,
    /// The momentum factor (default 0: no momentum buffer).
    pub momentum: f32,
    /// Normalize by the variance estimate `square_avg - grad_avg^2` instead of
    /// the mean of squares (default `false`).
    pub centered: bool,
}

impl Default for RmsPropConfig {
    fn default() -> RmsPropConfig {
        RmsPropConfig {
            lr: 1e-2,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
        }
    }
}

impl From<f32> for RmsPropConfig {
    /// The defaults with learning rate `lr`.
    fn from(lr: f32) -> RmsPropConfig {
        RmsPropConfig {
            lr,
            ..RmsPropConfig::default()
        }
    }
}

/// RMSprop with PyTorch's update, per element in f32:
///
/// ```text
/// g = g + weight_decay * w                      (weight_decay != 0)
/// square_avg = alpha * square_avg + (1 - alpha) * g * g
/// if centered:
///     grad_avg = grad_avg + (1 - alpha) * (g - grad_avg)
///     avg = sqrt(square_avg - grad_avg * grad_avg) + eps
/// else:
///     avg = sqrt(square_avg) + eps
/// if momentum > 0:
///     buf = momentum * buf + g / avg
///     w = w - lr * buf
/// else:
///     w = w - lr * g / avg
/// ```
///
/// The state holds `"square_avg.{i}"`, with momentum `"momentum_buffer.{i}"`,
/// centered `"grad_avg.{i}"` (PyTorch's names), all starting at zero.
///
/// ```
/// use fucina::nn::Parameter;
/// use fucina::optim::{RmsProp, RmsPropConfig};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let p = Parameter::from_slice(&ctx, &[1], &[1.0])?;
/// let mut opt = RmsProp::new(vec![p.clone()], RmsPropConfig { lr: 0.1, ..RmsPropConfig::default() })?;
/// p.tensor().set_grad(&ctx, Some(&Tensor::from_slice(&ctx, &[1], &[2.0])?))?;
/// opt.step(&ctx)?;
/// // square_avg = 0.01 * 4 = 0.04, so w = 1 - 0.1 * 2 / (0.2 + 1e-8)
/// assert!((p.to_vec()[0] - 0.0).abs() < 1e-6);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug)]
pub struct RmsProp {
    params: Vec<Parameter>,
    cfg: RmsPropConfig,
    groups: Option<Groups>,
    state: State,
}

impl RmsProp {
    fn build(
        params: Vec<Parameter>,
        cfg: RmsPropConfig,
        groups: Option<Groups>,
    ) -> Result<RmsProp> {
        check_lr("RmsPropConfig::lr", cfg.lr)?;
        check_nonneg(&[
            ("RmsPropConfig::alpha", cfg.alpha),
            ("RmsPropConfig::eps", cfg.eps),
            ("RmsPropConfig::weight_decay", cfg.weight_decay),
            ("RmsPropConfig::momentum", cfg.momentum),
        ])?;
        if cfg.alpha > 1.0 {
            return Err(Error::invalid(
                "RmsPropConfig::alpha",
                format!("must be in [0, 1] (got {})", cfg.alpha),
            ));
        }
        check_distinct("RmsProp", &params)?;
        let kinds: &'static [&'static str] = match (cfg.momentum > 0.0, cfg.centered) {
            (false, false) => &["square_avg"],
            (true, false) => &["square_avg", "momentum_buffer"],
            (false, true) => &["square_avg", "grad_avg"],
            (true, true) => &["square_avg", "momentum_buffer", "grad_avg"],
        };
        let n = params.len();
        Ok(RmsProp {
            params,
            cfg,
            groups,
            state: State::new(kinds, n),
        })
    }

    /// One update of every parameter that has a gradient.
    ///
    /// # Errors
    /// Out of memory (the first step allocates the buffers; a copy-on-write
    /// copy of a parameter a graph still holds); [`Error::InvalidArgument`]
    /// past `u64::MAX` steps. Nothing changes on an error.
    pub fn step(&mut self, ctx: &ExecContext) -> Result<()> {
        let RmsPropConfig {
            lr,
            alpha,
            eps,
            weight_decay: cfg_wd,
            momentum,
            centered,
        } = self.cfg;
        // Phase one: everything that can fail; nothing changes on an error.
        let next = self.state.prepare(ctx, &self.params, true)?;
        let one_m_alpha = (1.0 - f64::from(alpha)) as f32;
        let with_momentum = momentum > 0.0;
        // Phase two: in place (every write was prepared; nothing allocates).
        let State { bufs, prepared, .. } = &mut self.state;
        let (sq_k, rest) = bufs.split_first_mut().expect("square_avg is a kind");
        let (mut mom_k, rest) = match rest.split_first_mut() {
            Some((m, r)) if with_momentum => (Some(m), r),
            _ => (None, rest),
        };
        let mut avg_k = rest.first_mut().filter(|_| centered);
        let hyper = Hyper {
            alpha,
            one_m_alpha,
            eps,
            momentum,
            lr,
            wd: cfg_wd,
        };
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = &prepared[i].grad else {
                continue;
            };
            let g = g.data()?;
            let h = Hyper {
                wd: self.groups.as_ref().map_or(cfg_wd, |gr| gr.wd_of(i)),
                ..hyper
            };
            let created = "prepare created the buffers of a parameter with a gradient";
            let sq = sq_k[i].as_mut().expect(created);
            let mom = mom_k.as_deref_mut().map(|k| k[i].as_mut().expect(created));
            let ga = avg_k.as_deref_mut().map(|k| k[i].as_mut().expect(created));
            sq.update_(|sq| {
                with_slice(mom, |b| {
                    with_slice(ga, |a| p.update_(|w| h.update(w, g, sq, b, a)))
                })
            })??;
        }
        self.state.finish(next)
    }
}

/// `f` over the values of `t`, or over `None` without a tensor.
fn with_slice<R>(
    t: Option<&mut fucina_autograd::Tensor>,
    f: impl FnOnce(Option<&mut [f32]>) -> Result<R>,
) -> Result<R> {
    match t {
        Some(t) => t.update_(|v| f(Some(v)))?,
        None => f(None),
    }
}

/// The scalar factors of one parameter's update.
#[derive(Clone, Copy)]
struct Hyper {
    alpha: f32,
    one_m_alpha: f32,
    eps: f32,
    momentum: f32,
    lr: f32,
    wd: f32,
}

impl Hyper {
    /// The element update of one parameter (see [`RmsProp`]); `buf` is the
    /// momentum buffer, `grad_avg` the centered variant's mean.
    #[inline]
    fn update(
        self,
        w: &mut [f32],
        g: &[f32],
        sq: &mut [f32],
        mut buf: Option<&mut [f32]>,
        mut grad_avg: Option<&mut [f32]>,
    ) {
        for j in 0..w.len() {
            let gj = if self.wd != 0.0 {
                g[j] + self.wd * w[j]
            } else {
                g[j]
            };
            sq[j] = self.alpha * sq[j] + self.one_m_alpha * gj * gj;
            let avg = match grad_avg.as_deref_mut() {
                Some(ga) => {
                    ga[j] += self.one_m_alpha * (gj - ga[j]);
                    (sq[j] - ga[j] * ga[j]).sqrt() + self.eps
                }
                None => sq[j].sqrt() + self.eps,
            };
            match buf.as_deref_mut() {
                Some(b) => {
                    b[j] = self.momentum * b[j] + gj / avg;
                    w[j] += -self.lr * b[j];
                }
                None => w[j] += -self.lr * (gj / avg),
            }
        }
    }
}

basic_optimizer!(RmsProp, RmsPropConfig, "RmsProp");
