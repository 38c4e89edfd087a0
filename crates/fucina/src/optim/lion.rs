//! Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023):
//! the sign of an interpolated momentum, with decoupled weight decay.

use fucina_exec::ExecContext;

use super::groups::Groups;
use super::state::State;
use super::{basic_optimizer, check_distinct, check_lr, check_nonneg};
use crate::error::{Error, Result};
use crate::nn::Parameter;

/// The hyperparameters of [`Lion`] (the paper's defaults, as the
/// `lion-pytorch` package has them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LionConfig {
    /// The learning rate (default `1e-4`: Lion's steps are signs, so its rate
    /// is typically 3–10 times below AdamW's).
    pub lr: f32,
    /// The interpolation factor of the update and the decay of the momentum
    /// (default `(0.9, 0.99)`, each in `[0, 1]`).
    pub betas: (f32, f32),
    /// Decoupled decay: `w *= 1 - lr * weight_decay` before the update
    /// (default 0).
    pub weight_decay: f32,
}

impl Default for LionConfig {
    fn default() -> LionConfig {
        LionConfig {
            lr: 1e-4,
            betas: (0.9, 0.99),
            weight_decay: 0.0,
        }
    }
}

impl From<f32> for LionConfig {
    /// The defaults with learning rate `lr`.
    fn from(lr: f32) -> LionConfig {
        LionConfig {
            lr,
            ..LionConfig::default()
        }
    }
}

/// Lion, per element in f32 (PyTorch has no `torch.optim.Lion`; this is the
/// paper's Algorithm 2, as `lion-pytorch` implements it):
///
/// ```text
/// w = w * (1 - lr * weight_decay)
/// w = w - lr * sign(beta1 * m + (1 - beta1) * g)      (sign(0) = 0)
/// m = beta2 * m + (1 - beta2) * g
/// ```
///
/// The state holds `"exp_avg.{i}"`, starting at zero.
///
/// ```
/// use fucina::nn::Parameter;
/// use fucina::optim::{Lion, LionConfig};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let p = Parameter::from_slice(&ctx, &[2], &[1.0, 1.0])?;
/// let mut opt = Lion::new(vec![p.clone()], LionConfig { lr: 0.25, ..LionConfig::default() })?;
/// p.tensor().set_grad(&ctx, Some(&Tensor::from_slice(&ctx, &[2], &[3.0, -0.001])?))?;
/// opt.step(&ctx)?;
/// assert_eq!(p.to_vec(), [0.75, 1.25]); // each element moves by lr, against its gradient's sign
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug)]
pub struct Lion {
    params: Vec<Parameter>,
    cfg: LionConfig,
    groups: Option<Groups>,
    state: State,
}

impl Lion {
    fn build(params: Vec<Parameter>, cfg: LionConfig, groups: Option<Groups>) -> Result<Lion> {
        check_lr("LionConfig::lr", cfg.lr)?;
        check_nonneg(&[
            ("LionConfig::betas", cfg.betas.0),
            ("LionConfig::betas", cfg.betas.1),
            ("LionConfig::weight_decay", cfg.weight_decay),
        ])?;
        if cfg.betas.0 > 1.0 || cfg.betas.1 > 1.0 {
            return Err(Error::invalid(
                "LionConfig::betas",
                format!("must be in [0, 1] (got {:?})", cfg.betas),
            ));
        }
        check_distinct("Lion", &params)?;
        let n = params.len();
        Ok(Lion {
            params,
            cfg,
            groups,
            state: State::new(&["exp_avg"], n),
        })
    }

    /// One update of every parameter that has a gradient.
    ///
    /// # Errors
    /// Out of memory (the first step allocates the momenta; a copy-on-write
    /// copy of a parameter a graph still holds); [`Error::InvalidArgument`]
    /// past `u64::MAX` steps. Nothing changes on an error.
    pub fn step(&mut self, ctx: &ExecContext) -> Result<()> {
        let LionConfig {
            lr,
            betas: (b1, b2),
            weight_decay: cfg_wd,
        } = self.cfg;
        // Phase one: everything that can fail; nothing changes on an error.
        let next = self.state.prepare(ctx, &self.params, true)?;
        let (one_m_b1, one_m_b2) = ((1.0 - f64::from(b1)) as f32, (1.0 - f64::from(b2)) as f32);
        // Phase two: in place (every write was prepared; nothing allocates).
        let State { bufs, prepared, .. } = &mut self.state;
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = &prepared[i].grad else {
                continue;
            };
            let g = g.data()?;
            let wd = self.groups.as_ref().map_or(cfg_wd, |gr| gr.wd_of(i));
            let decay = (1.0 - f64::from(lr) * f64::from(wd)) as f32;
            let Some(m) = &mut bufs[0][i] else {
                unreachable!("prepare created the momentum of a parameter with a gradient")
            };
            m.update_(|m| {
                p.update_(|w| {
                    for ((w, m), &g) in w.iter_mut().zip(m.iter_mut()).zip(g) {
                        let c = b1 * *m + one_m_b1 * g;
                        let sign = if c > 0.0 {
                            1.0
                        } else if c < 0.0 {
                            -1.0
                        } else {
                            c // 0 (or NaN, which propagates)
                        };
                        *w = *w * decay - lr * sign;
                        *m = b2 * *m + one_m_b2 * g;
                    }
                })
            })??;
        }
        self.state.finish(next)
    }
}

basic_optimizer!(Lion, LionConfig, "Lion");
