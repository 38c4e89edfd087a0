//! Adam (L2 weight decay) and AdamW (decoupled weight decay), PyTorch's
//! `torch.optim.Adam` and `torch.optim.AdamW` without `amsgrad`.

use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

use super::groups::{Groups, ParamGroup, split_state};
use super::state::State;
use super::{check_distinct, check_lr, delegate_optimizer};
use crate::error::{Error, Result};
use crate::nn::{Parameter, StateDict};

/// The hyperparameters of [`Adam`] (PyTorch's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// The learning rate.
    pub lr: f32,
    /// The decay rates of the first and second moments.
    pub betas: (f32, f32),
    /// Added to the denominator.
    pub eps: f32,
    /// L2 penalty: `weight_decay * w` is added to the gradient.
    pub weight_decay: f32,
}

impl Default for AdamConfig {
    fn default() -> AdamConfig {
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// The hyperparameters of [`AdamW`] (PyTorch's defaults: `weight_decay = 0.01`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// The learning rate.
    pub lr: f32,
    /// The decay rates of the first and second moments.
    pub betas: (f32, f32),
    /// Added to the denominator.
    pub eps: f32,
    /// Decoupled decay: `w *= 1 - lr * weight_decay` before the Adam update.
    pub weight_decay: f32,
}

impl From<f32> for AdamConfig {
    /// The defaults with learning rate `lr`.
    fn from(lr: f32) -> AdamConfig {
        AdamConfig {
            lr,
            ..AdamConfig::default()
        }
    }
}

impl From<f32> for AdamWConfig {
    /// The defaults with learning rate `lr`.
    fn from(lr: f32) -> AdamWConfig {
        AdamWConfig {
            lr,
            ..AdamWConfig::default()
        }
    }
}

impl Default for AdamWConfig {
    fn default() -> AdamWConfig {
        AdamWConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

fn check(what: &'static str, lr: f32, betas: (f32, f32), eps: f32, wd: f32) -> Result<()> {
    check_lr(what, lr)?;
    for b in [betas.0, betas.1] {
        if !(0.0..1.0).contains(&b) {
            return Err(Error::invalid(
                what,
                format!("betas must be in [0, 1) (got {b})"),
            ));
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(
            what,
            format!("eps must be finite and >= 0 (got {eps})"),
        ));
    }
    if !(wd.is_finite() && wd >= 0.0) {
        return Err(Error::invalid(
            what,
            format!("weight_decay must be finite and >= 0 (got {wd})"),
        ));
    }
    Ok(())
}

/// The shared Adam core.
#[derive(Debug)]
struct Core {
    params: Vec<Parameter>,
    lr: f32,
    betas: (f32, f32),
    eps: f32,
    wd: f32,
    decoupled: bool,
    /// The grouping, for an optimizer built with groups.
    groups: Option<Groups>,
    state: State,
}

impl Core {
    fn new(
        params: Vec<Parameter>,
        lr: f32,
        betas: (f32, f32),
        eps: f32,
        wd: f32,
        decoupled: bool,
        groups: Option<Groups>,
    ) -> Core {
        let n = params.len();
        Core {
            params,
            lr,
            betas,
            eps,
            wd,
            decoupled,
            groups,
            state: State::new(&["exp_avg", "exp_avg_sq"], n),
        }
    }

    /// PyTorch's single-tensor Adam(W), per element in f32 with the scalar
    /// factors computed in f64 (as Python floats) and rounded once:
    ///
    /// ```text
    /// w = w * (1 - lr * wd)                       (AdamW)
    /// g = g + wd * w                              (Adam with wd != 0)
    /// m = m + (1 - b1) * (g - m)                  (lerp)
    /// v = v * b2 + (1 - b2) * g * g
    /// denom = sqrt(v) / sqrt(1 - b2^t) + eps
    /// w = w + (-lr / (1 - b1^t)) * m / denom
    /// ```
    fn step(&mut self, ctx: &ExecContext) -> Result<()> {
        // Phase one: everything that can fail; nothing changes on an error.
        let t = self.state.prepare(ctx, &self.params, true)?;
        let (b1, b2) = self.betas;
        let exp = i32::try_from(t).unwrap_or(i32::MAX);
        let bc1 = 1.0 - f64::from(b1).powi(exp);
        let bc2 = 1.0 - f64::from(b2).powi(exp);
        let base = Kernel {
            decay: 1.0,
            wd: 0.0,
            one_m_b1: (1.0 - f64::from(b1)) as f32,
            b2,
            one_m_b2: (1.0 - f64::from(b2)) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            eps: self.eps,
            step_size: -(f64::from(self.lr) / bc1) as f32,
        };
        let lr = self.lr;
        let (cfg_wd, groups, decoupled) = (self.wd, &self.groups, self.decoupled);
        let kernel_of = |i: usize| {
            let wd = groups.as_ref().map_or(cfg_wd, |g| g.wd_of(i));
            Kernel {
                decay: (1.0 - f64::from(lr) * f64::from(wd)) as f32,
                wd,
                ..base
            }
        };
        // Phase two: in place (every write was prepared; nothing allocates).
        let State { bufs, prepared, .. } = &mut self.state;
        let [ms, vs] = &mut bufs[..] else {
            unreachable!("two buffer kinds")
        };
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = &prepared[i].grad else {
                continue;
            };
            let g = g.data()?;
            let k = kernel_of(i);
            let (Some(m), Some(v)) = (&mut ms[i], &mut vs[i]) else {
                unreachable!("prepare created the moments of a parameter with a gradient")
            };
            m.update_(|m| -> Result<()> {
                v.update_(|v| p.update_(|w| k.run_split(ctx, decoupled, w, m, v, g)))??;
                Ok(())
            })??;
        }
        self.state.finish(t)
    }
}

/// The scalar factors of one Adam(W) step.
#[derive(Clone, Copy)]
struct Kernel {
    decay: f32,
    wd: f32,
    one_m_b1: f32,
    b2: f32,
    one_m_b2: f32,
    bc2_sqrt: f32,
    eps: f32,
    step_size: f32,
}

/// Parameters at least this long update on the context's team, in chunks
/// (each element's update depends on that element alone, so the split never
/// changes a bit); shorter ones on the caller.
const PARALLEL_MIN: usize = 1 << 16;

/// Most chunks of a parallel update (their slices live on the stack).
const MAX_CHUNKS: usize = 16;

/// One chunk of an update: the weights, both moments and the gradient.
type Chunk<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32], &'a [f32]);

impl Kernel {
    /// [`run`](Kernel::run) in the mode of `decoupled` and `wd`, split over
    /// the context's team for a long parameter.
    fn run_split(
        self,
        ctx: &ExecContext,
        decoupled: bool,
        w: &mut [f32],
        m: &mut [f32],
        v: &mut [f32],
        g: &[f32],
    ) {
        let one = |(w, m, v, g): &mut (&mut [f32], &mut [f32], &mut [f32], &[f32])| match (
            decoupled,
            self.wd != 0.0,
        ) {
            (true, _) => self.run::<true, false>(w, m, v, g),
            (false, true) => self.run::<false, true>(w, m, v, g),
            (false, false) => self.run::<false, false>(w, m, v, g),
        };
        let n = w.len();
        let team = ctx
            .team()
            .filter(|t| t.participants() > 1 && n >= PARALLEL_MIN);
        let Some(team) = team else {
            return one(&mut (w, m, v, g));
        };
        let parts = team.participants().min(MAX_CHUNKS);
        // Chunks of whole 16-float vectors.
        let size = n.div_ceil(parts).div_ceil(16) * 16;
        let mut pieces: [Chunk<'_>; MAX_CHUNKS] =
            std::array::from_fn(|_| (&mut [][..], &mut [][..], &mut [][..], &[][..]));
        let (mut w, mut m, mut v, mut g) = (w, &mut m[..n], &mut v[..n], &g[..n]);
        let mut k = 0;
        while !w.is_empty() {
            let len = size.min(w.len());
            let (w0, w1) = w.split_at_mut(len);
            let (m0, m1) = m.split_at_mut(len);
            let (v0, v1) = v.split_at_mut(len);
            let (g0, g1) = g.split_at(len);
            pieces[k] = (w0, m0, v0, g0);
            (w, m, v, g) = (w1, m1, v1, g1);
            k += 1;
        }
        team.parallel_chunks_mut(&mut pieces[..k], one);
    }

    /// The element update, monomorphized per mode so that the loop has no
    /// branches and vectorizes (`DECOUPLED`: AdamW's decay; `L2`: Adam's).
    #[inline]
    fn run<const DECOUPLED: bool, const L2: bool>(
        self,
        w: &mut [f32],
        m: &mut [f32],
        v: &mut [f32],
        g: &[f32],
    ) {
        let n = w.len();
        let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
        for i in 0..n {
            let mut gi = g[i];
            if DECOUPLED {
                w[i] *= self.decay;
            }
            if L2 {
                gi += self.wd * w[i];
            }
            m[i] += self.one_m_b1 * (gi - m[i]);
            v[i] = v[i] * self.b2 + self.one_m_b2 * gi * gi;
            let denom = v[i].sqrt() / self.bc2_sqrt + self.eps;
            w[i] += self.step_size * m[i] / denom;
        }
    }
}

macro_rules! adam_like {
    ($(#[$doc:meta])* $name:ident, $cfg:ident, $decoupled:expr, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            core: Core,
        }

        impl $name {
            /// An optimizer over `params` with `cfg`: a full configuration, or
            /// a bare learning rate (`f32`) for the defaults with that rate.
            ///
            /// # Errors
            /// [`Error::InvalidArgument`] for a negative or non-finite rate,
            /// betas outside `[0, 1)`, a negative `eps` or `weight_decay`, or a
            /// parameter listed twice.
            pub fn new(params: Vec<Parameter>, cfg: impl Into<$cfg>) -> Result<$name> {
                let cfg = cfg.into();
                check($what, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay)?;
                check_distinct($what, &params)?;
                Ok($name {
                    core: Core::new(params, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay, $decoupled, None),
                })
            }

            /// An optimizer over parameter groups, each with its own weight
            /// decay (see [`ParamGroup`]; the other hyperparameters are `cfg`'s).
            /// The state records the grouping and the groups' decays.
            ///
            /// # Errors
            /// As [`new`](Self::new), and for a group's negative or non-finite
            /// weight decay.
            pub fn with_groups(groups: Vec<ParamGroup>, cfg: impl Into<$cfg>) -> Result<$name> {
                let cfg = cfg.into();
                check($what, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay)?;
                let (params, groups) = Groups::build($what, groups, cfg.weight_decay)?;
                check_distinct($what, &params)?;
                Ok($name {
                    core: Core::new(params, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay, $decoupled, Some(groups)),
                })
            }

            /// The hyperparameters (with the current learning rate).
            pub fn config(&self) -> $cfg {
                $cfg {
                    lr: self.core.lr,
                    betas: self.core.betas,
                    eps: self.core.eps,
                    weight_decay: self.core.wd,
                }
            }

            /// One update of every parameter that has a gradient.
            ///
            /// # Errors
            /// Out of memory (the first step allocates the moments; a copy-on-write
            /// copy of a parameter a graph still holds); [`Error::InvalidArgument`]
            /// past `u64::MAX` steps. Nothing changes on an error: everything that
            /// can fail is done before the first value is written.
            pub fn step(&mut self, ctx: &ExecContext) -> Result<()> {
                self.core.step(ctx)
            }

            /// Releases every parameter's gradient.
            pub fn zero_grad(&self) {
                for p in &self.core.params {
                    p.zero_grad();
                }
            }

            /// The learning rate.
            pub fn lr(&self) -> f32 {
                self.core.lr
            }

            /// Sets the learning rate.
            ///
            /// # Errors
            /// [`Error::InvalidArgument`] unless `lr` is finite and `>= 0` (the
            /// rate is then unchanged).
            pub fn set_lr(&mut self, lr: f32) -> Result<()> {
                check_lr(concat!($what, "::lr"), lr)?;
                self.core.lr = lr;
                Ok(())
            }

            /// The number of steps taken.
            pub fn step_count(&self) -> u64 {
                self.core.state.step
            }

            /// The parameters.
            pub fn parameters(&self) -> &[Parameter] {
                &self.core.params
            }

            /// The state: `"step"`, `"exp_avg.{i}"`, `"exp_avg_sq.{i}"` (after the
            /// first step), and for an optimizer built with groups
            /// `"param_groups"` and `"group_weight_decay"`.
            pub fn state_dict(&self) -> StateDict {
                let mut sd = self.core.state.state_dict();
                if let Some(g) = &self.core.groups {
                    for (n, t) in g.entries() {
                        sd.insert(n, t).expect("the grouping entries have names of their own");
                    }
                }
                sd
            }

            /// Replaces the state (see
            /// [`Optimizer::load_state_dict`](super::Optimizer::load_state_dict)).
            ///
            /// # Errors
            /// [`Error::StateDict`] naming the entry that does not fit; nothing
            /// changes.
            pub fn load_state_dict(&mut self, ctx: &ExecContext, state: &[(String, Tensor)]) -> Result<()> {
                let (rest, wd) = split_state(self.core.groups.as_ref(), state)?;
                self.core.state.load(ctx, &self.core.params, &rest, true)?;
                if let (Some(g), Some(wd)) = (&mut self.core.groups, wd) {
                    g.wd = wd;
                }
                Ok(())
            }
        }

        delegate_optimizer!($name);
    };
}

adam_like!(
    /// Adam with L2 weight decay (added to the gradient), PyTorch's update
    /// formulas (see the crate-level description of [`AdamW`] for the element
    /// update).
    Adam, AdamConfig, false, "AdamConfig"
);
adam_like!(
    /// AdamW: Adam with decoupled weight decay, PyTorch's update formulas, per
    /// element in f32 with the scalar factors computed in f64 and rounded once:
    ///
    /// ```text
    /// w = w * (1 - lr * wd)                       (AdamW only)
    /// g = g + wd * w                              (Adam only, wd != 0)
    /// m = m + (1 - b1) * (g - m)
    /// v = v * b2 + (1 - b2) * g * g
    /// denom = sqrt(v) / sqrt(1 - b2^t) + eps
    /// w = w + (-lr / (1 - b1^t)) * m / denom
    /// ```
    AdamW, AdamWConfig, true, "AdamWConfig"
);
