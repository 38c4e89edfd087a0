//! Adagrad (PyTorch's `torch.optim.Adagrad`: `lr_decay`,
//! `initial_accumulator_value`, `eps`, L2 weight decay).

use fucina_exec::ExecContext;

use super::groups::Groups;
use super::state::State;
use super::{basic_optimizer, check_distinct, check_lr, check_nonneg};
use crate::error::Result;
use crate::nn::Parameter;

/// The hyperparameters of [`Adagrad`] (PyTorch's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdagradConfig {
    /// The learning rate (default `1e-2`).
    pub lr: f32,
    /// The learning rate's decay: step `t` uses `lr / (1 + (t - 1) *
    /// lr_decay)` (default 0).
    pub lr_decay: f32,
    /// L2 penalty: `weight_decay * w` is added to the gradient (default 0).
    pub weight_decay: f32,
    /// The starting value of every element of the sum of squares (default 0).
    pub initial_accumulator_value: f32,
    /// Added to the denominator (default `1e-10`).
    pub eps: f32,
}

impl Default for AdagradConfig {
    fn default() -> AdagradConfig {
        AdagradConfig {
            lr: 1e-2,
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
        }
    }
}

impl From<f32> for AdagradConfig {
    /// The defaults with learning rate `lr`.
    fn from(lr: f32) -> AdagradConfig {
        AdagradConfig {
            lr,
            ..AdagradConfig::default()
        }
    }
}

/// Adagrad with PyTorch's update, per element in f32 (the step's rate
/// computed in f64 and rounded once):
///
/// ```text
/// g = g + weight_decay * w                      (weight_decay != 0)
/// clr = lr / (1 + (t - 1) * lr_decay)           (t: this step's number, from 1)
/// sum = sum + g * g                             (sum starts at initial_accumulator_value)
/// w = w - clr * g / (sqrt(sum) + eps)
/// ```
///
/// The state holds `"sum.{i}"` (PyTorch's name). PyTorch creates the sum when
/// the optimizer is built; here it is created by the first step that sees the
/// parameter's gradient, with the same starting value, so the trajectories
/// agree.
///
/// ```
/// use fucina::nn::Parameter;
/// use fucina::optim::{Adagrad, AdagradConfig};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let p = Parameter::from_slice(&ctx, &[1], &[1.0])?;
/// let cfg = AdagradConfig { lr: 0.5, initial_accumulator_value: 5.0, ..AdagradConfig::default() };
/// let mut opt = Adagrad::new(vec![p.clone()], cfg)?;
/// p.tensor().set_grad(&ctx, Some(&Tensor::from_slice(&ctx, &[1], &[2.0])?))?;
/// opt.step(&ctx)?;
/// // sum = 5 + 4 = 9: w = 1 - 0.5 * 2 / 3
/// assert!((p.to_vec()[0] - 2.0 / 3.0).abs() < 1e-6);
/// assert_eq!(opt.state_dict().get("sum.0").unwrap().to_vec(), [9.0]);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug)]
pub struct Adagrad {
    params: Vec<Parameter>,
    cfg: AdagradConfig,
    groups: Option<Groups>,
    state: State,
}

impl Adagrad {
    fn build(
        params: Vec<Parameter>,
        cfg: AdagradConfig,
        groups: Option<Groups>,
    ) -> Result<Adagrad> {
        check_lr("AdagradConfig::lr", cfg.lr)?;
        check_nonneg(&[
            ("AdagradConfig::lr_decay", cfg.lr_decay),
            ("AdagradConfig::weight_decay", cfg.weight_decay),
            (
                "AdagradConfig::initial_accumulator_value",
                cfg.initial_accumulator_value,
            ),
            ("AdagradConfig::eps", cfg.eps),
        ])?;
        check_distinct("Adagrad", &params)?;
        let n = params.len();
        Ok(Adagrad {
            params,
            cfg,
            groups,
            state: State::new(&["sum"], n),
        })
    }

    /// One update of every parameter that has a gradient.
    ///
    /// # Errors
    /// Out of memory (the first step allocates the sums; a copy-on-write copy
    /// of a parameter a graph still holds);
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) past
    /// `u64::MAX` steps. Nothing changes on an error.
    pub fn step(&mut self, ctx: &ExecContext) -> Result<()> {
        let AdagradConfig {
            lr,
            lr_decay,
            weight_decay: cfg_wd,
            initial_accumulator_value: init,
            eps,
        } = self.cfg;
        // Phase one: everything that can fail; nothing changes on an error.
        let t = self.state.prepare(ctx, &self.params, true)?;
        let clr = (f64::from(lr) / (1.0 + (t - 1) as f64 * f64::from(lr_decay))) as f32;
        // Phase two: in place (every write was prepared; nothing allocates).
        let State { bufs, prepared, .. } = &mut self.state;
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = &prepared[i].grad else {
                continue;
            };
            let g = g.data()?;
            let wd = self.groups.as_ref().map_or(cfg_wd, |gr| gr.wd_of(i));
            let fresh = prepared[i].fresh;
            let Some(sum) = &mut bufs[0][i] else {
                unreachable!("prepare created the sum of a parameter with a gradient")
            };
            sum.update_(|s| {
                if fresh {
                    s.fill(init);
                }
                p.update_(|w| {
                    for ((w, s), &g) in w.iter_mut().zip(s.iter_mut()).zip(g) {
                        let g = if wd != 0.0 { g + wd * *w } else { g };
                        *s += g * g;
                        *w += -clr * (g / (s.sqrt() + eps));
                    }
                })
            })??;
        }
        self.state.finish(t)
    }
}

basic_optimizer!(Adagrad, AdagradConfig, "Adagrad");
