//! Optimizers with PyTorch's update formulas ([`Sgd`], [`Adam`], [`AdamW`],
//! [`RmsProp`], [`Adagrad`]; [`Lion`] with its paper's),
//! gradient clipping ([`clip_grad_norm`]) and a warmup + cosine learning-rate
//! schedule ([`WarmupCosine`]), with PyTorch's schedulers ([`StepLr`],
//! [`MultiStepLr`], [`ExponentialLr`], [`LinearLr`], [`OneCycleLr`],
//! [`WithWarmup`], [`ReduceLrOnPlateau`]; see [`LrSchedule`]).
//!
//! An optimizer holds [`Parameter`] handles (the same parameters the model
//! reads) and updates them in place with [`step`](Optimizer::step); parameters
//! without a gradient are skipped. Updates are copy-on-write: a graph that still
//! holds a parameter's old values keeps them. After warm-up a step allocates
//! nothing (the state buffers are created on the first step and then updated in
//! place). A step is all or nothing: it first does everything that can fail
//! (fetching gradients, creating buffers, the copy-on-write copies), then
//! writes; an error leaves the parameters, the state and the step count as they
//! were. Constructors and [`clip_grad_norm`] refuse a parameter listed twice.
//!
//! The optimizer state is a list of named tensors ([`state_dict`](Optimizer::state_dict)):
//! `"step"` (shape `[3]`: the number of steps taken, exactly, as three base-2^24
//! digits, least significant first; the `[1]` form of earlier versions, exact up
//! to 2^24, is still read) and one
//! entry per parameter and buffer, `"momentum_buffer.{i}"` for [`Sgd`],
//! `"exp_avg.{i}"` and `"exp_avg_sq.{i}"` for [`Adam`] and [`AdamW`],
//! `"square_avg.{i}"` (and `"momentum_buffer.{i}"` with momentum,
//! `"grad_avg.{i}"` when centered) for [`RmsProp`], `"sum.{i}"` for
//! [`Adagrad`], `"exp_avg.{i}"` for [`Lion`] (PyTorch's names), where `i`
//! is the parameter's index in the list the optimizer was built with.
//! An optimizer built with [`ParamGroup`]s (`with_groups`; [`decay_groups`]
//! gives the usual no-decay-on-vectors split) also records `"param_groups"`
//! (each parameter's group) and `"group_weight_decay"` (each group's decay).
//! [`load_state_dict`](Optimizer::load_state_dict) validates every entry before
//! it changes anything.
//!
//! Constructors follow one convention: `new(params, cfg)`, where `cfg` is the
//! optimizer's configuration struct or a bare learning rate (`f32`: the
//! defaults with that rate), and `with_groups(groups, cfg)` for groups.
//!
//! ```
//! use fucina::nn::{Linear, Module};
//! use fucina::optim::{AdamW, AdamWConfig, Optimizer};
//! use fucina::{ExecContext, Tensor};
//!
//! let ctx = ExecContext::new();
//! let fc = Linear::new(&ctx, 3, 1, 7)?;
//! let mut opt = AdamW::new(fc.parameters(), AdamWConfig { lr: 0.1, ..AdamWConfig::default() })?;
//! let x = Tensor::from_slice(&ctx, &[2, 3], &[1., 2., 3., 4., 5., 6.])?;
//! let y = Tensor::from_slice(&ctx, &[2, 1], &[1., -1.])?;
//! let mut losses = Vec::new();
//! for _ in 0..20 {
//!     let loss = fc.forward(&ctx, &x)?.mse_loss(&ctx, &y)?;
//!     losses.push(loss.item()?);
//!     loss.backward(&ctx)?;
//!     opt.step(&ctx)?;
//!     opt.zero_grad();
//! }
//! assert!(losses[19] < losses[0] * 0.1);
//! assert_eq!(opt.state_dict()[0].0, "step");
//! # Ok::<(), fucina::Error>(())
//! ```

mod adagrad;
mod adam;
mod clip;
mod groups;
mod lion;
mod lr_schedules;
mod rmsprop;
mod schedule;
mod sgd;
mod state;
mod tree;

pub use adagrad::{Adagrad, AdagradConfig};
pub use adam::{Adam, AdamConfig, AdamW, AdamWConfig};
pub use clip::clip_grad_norm;
pub use groups::{ParamGroup, decay_groups};
pub use lion::{Lion, LionConfig};
pub use lr_schedules::{
    Anneal, ExponentialLr, LinearLr, LrSchedule, MultiStepLr, OneCycleLr, PlateauMode,
    ReduceLrOnPlateau, StepLr, WithWarmup,
};
pub use rmsprop::{RmsProp, RmsPropConfig};
pub use schedule::WarmupCosine;
pub use sgd::{Sgd, SgdConfig};
pub use tree::{run_tree_sum, tree_mean_from_sum, tree_node_start, tree_sum_ops};

use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

use crate::error::Result;
use crate::nn::{Parameter, StateDict};

/// What every optimizer offers (the same methods exist inherently on each
/// optimizer, so this trait is only needed for generic code).
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    ///
    /// # Errors
    /// Out of memory (the first step allocates the state); the step count
    /// passing `u64::MAX`. Nothing changes on an error (parameters, state,
    /// step count): everything that can fail is done before the first write.
    fn step(&mut self, ctx: &ExecContext) -> Result<()>;
    /// Releases every parameter's gradient.
    fn zero_grad(&self);
    /// The learning rate.
    fn lr(&self) -> f32;
    /// Sets the learning rate (what a schedule calls before each step).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) unless `lr` is
    /// finite and `>= 0` (the rate is then unchanged).
    fn set_lr(&mut self, lr: f32) -> Result<()>;
    /// The number of steps taken (restored by
    /// [`load_state_dict`](Optimizer::load_state_dict)).
    fn step_count(&self) -> u64;
    /// The parameters, in the order of the state's indices.
    fn parameters(&self) -> &[Parameter];
    /// The state as named tensors (handles: the next step copies rather than
    /// changes what they hold).
    fn state_dict(&self) -> StateDict;
    /// Replaces the state with `state` (copied), after checking every entry: an
    /// unknown, missing or duplicate name, a wrong shape or an invalid step
    /// count is an error and leaves the optimizer unchanged. An empty list
    /// resets the state.
    ///
    /// # Errors
    /// [`Error::StateDict`](crate::Error::StateDict) naming the entry.
    fn load_state_dict(&mut self, ctx: &ExecContext, state: &[(String, Tensor)]) -> Result<()>;
}

/// Implements [`Optimizer`] by delegating to the inherent methods.
macro_rules! delegate_optimizer {
    ($t:ty) => {
        impl $crate::optim::Optimizer for $t {
            fn step(&mut self, ctx: &fucina_exec::ExecContext) -> $crate::Result<()> {
                <$t>::step(self, ctx)
            }
            fn zero_grad(&self) {
                <$t>::zero_grad(self)
            }
            fn lr(&self) -> f32 {
                <$t>::lr(self)
            }
            fn set_lr(&mut self, lr: f32) -> $crate::Result<()> {
                <$t>::set_lr(self, lr)
            }
            fn step_count(&self) -> u64 {
                <$t>::step_count(self)
            }
            fn parameters(&self) -> &[$crate::nn::Parameter] {
                <$t>::parameters(self)
            }
            fn state_dict(&self) -> $crate::nn::StateDict {
                <$t>::state_dict(self)
            }
            fn load_state_dict(
                &mut self,
                ctx: &fucina_exec::ExecContext,
                state: &[(String, fucina_autograd::Tensor)],
            ) -> $crate::Result<()> {
                <$t>::load_state_dict(self, ctx, state)
            }
        }
    };
}
pub(crate) use delegate_optimizer;

/// The constructors and inherent methods every optimizer with `params`,
/// `cfg` (with `lr` and `weight_decay`), `groups` and `state` fields and a
/// `build(params, cfg, groups)` checking `cfg` shares, and its [`Optimizer`]
/// impl: `basic_optimizer!(Type, ConfigType, "Type")`. Its state is loaded
/// with buffers allowed.
macro_rules! basic_optimizer {
    ($t:ident, $cfg:ident, $name:literal) => {
        impl $t {
            #[doc = concat!("An optimizer over `params` with `cfg`: a full [`", stringify!($cfg), "`], or a")]
            /// bare learning rate (`f32`) for the defaults with that rate.
            ///
            /// # Errors
            /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a
            /// hyperparameter outside its range (see the configuration's
            /// fields) or a parameter listed twice.
            pub fn new(params: Vec<$crate::nn::Parameter>, cfg: impl Into<$cfg>) -> $crate::Result<$t> {
                $t::build(params, cfg.into(), None)
            }

            /// An optimizer over parameter groups, each with its own weight
            /// decay (see [`ParamGroup`](crate::optim::ParamGroup); the other
            /// hyperparameters are `cfg`'s). The state records the grouping
            /// and the groups' decays.
            ///
            /// # Errors
            /// As [`new`](Self::new), and for a group's negative or non-finite
            /// weight decay.
            pub fn with_groups(
                groups: Vec<$crate::optim::ParamGroup>,
                cfg: impl Into<$cfg>,
            ) -> $crate::Result<$t> {
                let cfg = cfg.into();
                let (params, groups) =
                    $crate::optim::groups::Groups::build($name, groups, cfg.weight_decay)?;
                $t::build(params, cfg, Some(groups))
            }

            /// The hyperparameters (with the current learning rate).
            pub fn config(&self) -> $cfg {
                self.cfg
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
            /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) unless
            /// `lr` is finite and `>= 0` (the rate is then unchanged).
            pub fn set_lr(&mut self, lr: f32) -> $crate::Result<()> {
                $crate::optim::check_lr(concat!(stringify!($cfg), "::lr"), lr)?;
                self.cfg.lr = lr;
                Ok(())
            }

            /// The number of steps taken.
            pub fn step_count(&self) -> u64 {
                self.state.step
            }

            /// The parameters.
            pub fn parameters(&self) -> &[$crate::nn::Parameter] {
                &self.params
            }

            /// The state: `"step"` and the per-parameter buffers named in the
            /// type's documentation (after the first step), and for an
            /// optimizer built with groups `"param_groups"` and
            /// `"group_weight_decay"`.
            pub fn state_dict(&self) -> $crate::nn::StateDict {
                let mut sd = self.state.state_dict();
                if let Some(g) = &self.groups {
                    for (n, t) in g.entries() {
                        sd.insert(n, t)
                            .expect("the grouping entries have names of their own");
                    }
                }
                sd
            }

            /// Replaces the state (see
            /// [`Optimizer::load_state_dict`](crate::optim::Optimizer::load_state_dict)).
            ///
            /// # Errors
            /// [`Error::StateDict`](crate::Error::StateDict) naming the entry
            /// that does not fit; nothing changes.
            pub fn load_state_dict(
                &mut self,
                ctx: &fucina_exec::ExecContext,
                state: &[(String, fucina_autograd::Tensor)],
            ) -> $crate::Result<()> {
                let (rest, wd) = $crate::optim::groups::split_state(self.groups.as_ref(), state)?;
                self.state.load(ctx, &self.params, &rest, true)?;
                if let (Some(g), Some(wd)) = (&mut self.groups, wd) {
                    g.wd = wd;
                }
                Ok(())
            }
        }

        $crate::optim::delegate_optimizer!($t);
    };
}
pub(crate) use basic_optimizer;

/// Checks that each `(name, value)` is finite and `>= 0`.
pub(crate) fn check_nonneg(values: &[(&'static str, f32)]) -> Result<()> {
    for &(what, v) in values {
        if !(v.is_finite() && v >= 0.0) {
            return Err(crate::Error::invalid(
                what,
                format!("must be finite and >= 0 (got {v})"),
            ));
        }
    }
    Ok(())
}

/// Refuses a parameter list that names a parameter twice (it would be updated
/// twice per step, or counted twice by [`clip_grad_norm`]). Allocation-free and
/// linear: each parameter is stamped with a fresh pass number. (Two threads
/// checking lists that share a parameter at the same instant can overwrite
/// each other's stamps and miss a repeat; they never report a false one.)
pub(crate) fn check_distinct(what: &'static str, params: &[Parameter]) -> Result<()> {
    let pass = Parameter::new_pass();
    for (i, p) in params.iter().enumerate() {
        if !p.mark(pass) {
            let first = params[..i].iter().position(|q| q.ptr_eq(p)).unwrap_or(i);
            return Err(crate::Error::invalid(
                what,
                format!(
                    "parameter {i} is the same parameter as parameter {first} (list each parameter once)"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks a learning rate.
pub(crate) fn check_lr(what: &'static str, lr: f32) -> Result<()> {
    if !(lr.is_finite() && lr >= 0.0) {
        return Err(crate::Error::invalid(
            what,
            format!("lr must be finite and >= 0 (got {lr})"),
        ));
    }
    Ok(())
}
