//! Stochastic gradient descent with momentum, dampening, Nesterov and L2 weight
//! decay (PyTorch's `torch.optim.SGD`).

use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

use super::groups::{Groups, ParamGroup, split_state};
use super::state::State;
use super::{check_distinct, check_lr, delegate_optimizer};
use crate::error::{Error, Result};
use crate::nn::{Parameter, StateDict};

/// The hyperparameters of [`Sgd`] (PyTorch's names and defaults: all zero but
/// the learning rate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// The learning rate.
    pub lr: f32,
    /// The momentum factor (0: plain SGD, no buffer).
    pub momentum: f32,
    /// The dampening of the momentum (the new gradient enters with `1 - dampening`).
    pub dampening: f32,
    /// Nesterov momentum (needs `momentum > 0` and `dampening == 0`).
    pub nesterov: bool,
    /// L2 penalty: `weight_decay * w` is added to the gradient.
    pub weight_decay: f32,
}

impl From<f32> for SgdConfig {
    /// Plain SGD (the defaults) with learning rate `lr`.
    fn from(lr: f32) -> SgdConfig {
        SgdConfig {
            lr,
            ..SgdConfig::default()
        }
    }
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
}

/// SGD with PyTorch's update, per element in f32:
///
/// ```text
/// d = g + weight_decay * w
/// if momentum != 0:
///     buf = d                                         (first step)
///     buf = momentum * buf + (1 - dampening) * d      (later steps)
///     d = d + momentum * buf   if nesterov   else   buf
/// w = w + (-lr) * d
/// ```
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Parameter>,
    cfg: SgdConfig,
    /// The grouping, for an optimizer built with groups.
    groups: Option<Groups>,
    state: State,
}

impl Sgd {
    /// SGD over `params` with `cfg`: a full configuration, or a bare learning
    /// rate (`f32`) for plain SGD with that rate.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a negative or non-finite value, Nesterov
    /// without momentum or with dampening, or a parameter listed twice.
    pub fn new(params: Vec<Parameter>, cfg: impl Into<SgdConfig>) -> Result<Sgd> {
        Sgd::build(params, cfg.into(), None)
    }

    /// SGD over parameter groups, each with its own weight decay (see
    /// [`ParamGroup`]; the other hyperparameters are `cfg`'s). The state
    /// records the grouping and the groups' decays.
    ///
    /// # Errors
    /// As [`Sgd::new`], and for a group's negative or non-finite weight decay.
    pub fn with_groups(groups: Vec<ParamGroup>, cfg: impl Into<SgdConfig>) -> Result<Sgd> {
        let cfg = cfg.into();
        let (params, groups) = Groups::build("Sgd", groups, cfg.weight_decay)?;
        Sgd::build(params, cfg, Some(groups))
    }

    /// SGD with the given hyperparameters.
    ///
    /// # Errors
    /// As [`Sgd::new`].
    #[deprecated(
        since = "0.1.0",
        note = "use `Sgd::new(params, cfg)`, which takes a config or a learning rate"
    )]
    pub fn with_config(params: Vec<Parameter>, cfg: SgdConfig) -> Result<Sgd> {
        Sgd::build(params, cfg, None)
    }

    fn build(params: Vec<Parameter>, cfg: SgdConfig, groups: Option<Groups>) -> Result<Sgd> {
        check_lr("SgdConfig::lr", cfg.lr)?;
        check_distinct("Sgd", &params)?;
        for (what, v) in [
            ("SgdConfig::momentum", cfg.momentum),
            ("SgdConfig::dampening", cfg.dampening),
            ("SgdConfig::weight_decay", cfg.weight_decay),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::invalid(
                    what,
                    format!("must be finite and >= 0 (got {v})"),
                ));
            }
        }
        if cfg.nesterov && (cfg.momentum <= 0.0 || cfg.dampening != 0.0) {
            return Err(Error::invalid(
                "SgdConfig::nesterov",
                "Nesterov momentum requires momentum > 0 and dampening = 0",
            ));
        }
        let n = params.len();
        Ok(Sgd {
            params,
            cfg,
            groups,
            state: State::new(&["momentum_buffer"], n),
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> SgdConfig {
        self.cfg
    }

    /// One update of every parameter that has a gradient.
    ///
    /// # Errors
    /// Out of memory (the first step allocates the momentum buffers; a
    /// copy-on-write copy of a parameter a graph still holds);
    /// [`Error::InvalidArgument`] past `u64::MAX` steps. Nothing changes on an
    /// error: everything that can fail is done before the first value is written.
    pub fn step(&mut self, ctx: &ExecContext) -> Result<()> {
        let SgdConfig {
            lr,
            momentum,
            dampening,
            nesterov,
            weight_decay: cfg_wd,
        } = self.cfg;
        // Phase one: everything that can fail; nothing changes on an error.
        let next = self.state.prepare(ctx, &self.params, momentum != 0.0)?;
        // Phase two: in place (every write was prepared; nothing allocates).
        let State { bufs, prepared, .. } = &mut self.state;
        for (i, p) in self.params.iter().enumerate() {
            let wd = self.groups.as_ref().map_or(cfg_wd, |g| g.wd_of(i));
            let Some(g) = &prepared[i].grad else {
                continue;
            };
            let g = g.data()?;
            if momentum == 0.0 {
                p.update_(|w| {
                    for (w, &g) in w.iter_mut().zip(g) {
                        let d = if wd != 0.0 { g + wd * *w } else { g };
                        *w += -lr * d;
                    }
                })?;
                continue;
            }
            let first = prepared[i].fresh;
            let Some(buf) = &mut bufs[0][i] else {
                unreachable!("prepare created the buffer of a parameter with a gradient")
            };
            buf.update_(|b| {
                p.update_(|w| {
                    for ((w, b), &g) in w.iter_mut().zip(b.iter_mut()).zip(g) {
                        let d = if wd != 0.0 { g + wd * *w } else { g };
                        *b = if first {
                            d
                        } else {
                            momentum * *b + (1.0 - dampening) * d
                        };
                        let d = if nesterov { d + momentum * *b } else { *b };
                        *w += -lr * d;
                    }
                })
            })??;
        }
        self.state.finish(next)
    }

    /// Releases every parameter's gradient.
    pub fn zero_grad(&self) {
        for p in &self.params {
            p.zero_grad();
        }
    }

    /// The learning rate.
    pub fn lr(&self) -> f32 {
        self.cfg.lr
    }

    /// Sets the learning rate.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `lr` is finite and `>= 0` (the rate is
    /// then unchanged).
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        check_lr("SgdConfig::lr", lr)?;
        self.cfg.lr = lr;
        Ok(())
    }

    /// The number of steps taken.
    pub fn step_count(&self) -> u64 {
        self.state.step
    }

    /// The parameters.
    pub fn parameters(&self) -> &[Parameter] {
        &self.params
    }

    /// The state: `"step"` and `"momentum_buffer.{i}"` (after the first step),
    /// and for an optimizer built with groups `"param_groups"` and
    /// `"group_weight_decay"`.
    pub fn state_dict(&self) -> StateDict {
        let mut sd = self.state.state_dict();
        if let Some(g) = &self.groups {
            for (n, t) in g.entries() {
                sd.insert(n, t)
                    .expect("the grouping entries have names of their own");
            }
        }
        sd
    }

    /// Replaces the state (see [`Optimizer::load_state_dict`](super::Optimizer::load_state_dict)).
    ///
    /// # Errors
    /// [`Error::StateDict`] naming the entry that does not fit; nothing changes.
    pub fn load_state_dict(&mut self, ctx: &ExecContext, state: &[(String, Tensor)]) -> Result<()> {
        let allow = self.cfg.momentum != 0.0;
        let (rest, wd) = split_state(self.groups.as_ref(), state)?;
        self.state.load(ctx, &self.params, &rest, allow)?;
        if let (Some(g), Some(wd)) = (&mut self.groups, wd) {
            g.wd = wd;
        }
        Ok(())
    }
}

delegate_optimizer!(Sgd);
