//! PyTorch's learning-rate schedulers: [`StepLr`] (`StepLR`),
//! [`MultiStepLr`] (`MultiStepLR`), [`ExponentialLr`] (`ExponentialLR`),
//! [`LinearLr`] (`LinearLR`), [`OneCycleLr`] (`OneCycleLR`), a linear
//! warmup before any of them ([`WithWarmup`], PyTorch's `SequentialLR` of a
//! `LinearLR` and the schedule), and [`ReduceLrOnPlateau`]
//! (`ReduceLROnPlateau`).
//!
//! All but the last are pure functions of the step ([`LrSchedule::lr`]):
//! the rate of step `s` is PyTorch's rate after `s` calls of
//! `scheduler.step()`, computed in closed form in f64. A training loop sets
//! it before each optimizer step, `opt.set_lr(schedule.lr(opt.step_count()))`,
//! so the schedule's position is the optimizer's step count, which the
//! optimizer's state (and so a checkpoint) already holds: resuming needs
//! nothing else. [`ReduceLrOnPlateau`] follows a metric instead; its state
//! is a [`StateDict`] of its own.

use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

use super::WarmupCosine;
use crate::error::{Error, Result};
use crate::nn::StateDict;

/// A learning rate as a function of the step (counting from 0).
pub trait LrSchedule {
    /// The learning rate of step `step`.
    fn lr(&self, step: u64) -> f32;
}

impl LrSchedule for WarmupCosine {
    fn lr(&self, step: u64) -> f32 {
        WarmupCosine::lr(self, step)
    }
}

fn check_rate(what: &'static str, name: &str, v: f32) -> Result<()> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(Error::invalid(
            what,
            format!("{name} must be finite and >= 0 (got {v})"),
        ));
    }
    Ok(())
}

fn check_factor(what: &'static str, name: &str, v: f32) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        return Err(Error::invalid(
            what,
            format!("{name} must be finite and > 0 (got {v})"),
        ));
    }
    Ok(())
}

/// `base_lr * gamma^floor(step / step_size)`: PyTorch's `StepLR`.
///
/// ```
/// use fucina::optim::{LrSchedule, StepLr};
///
/// let s = StepLr::new(0.1, 30, 0.1)?;
/// assert_eq!(s.lr(29), 0.1);
/// assert!((s.lr(30) - 0.01).abs() < 1e-9 && (s.lr(60) - 0.001).abs() < 1e-9);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLr {
    base_lr: f32,
    step_size: u64,
    gamma: f32,
}

impl StepLr {
    /// Decays `base_lr` by `gamma` every `step_size` steps.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a negative or non-finite rate, a zero
    /// `step_size` or a `gamma` that is not finite and positive.
    pub fn new(base_lr: f32, step_size: u64, gamma: f32) -> Result<StepLr> {
        check_rate("StepLr::new", "base_lr", base_lr)?;
        check_factor("StepLr::new", "gamma", gamma)?;
        if step_size == 0 {
            return Err(Error::invalid(
                "StepLr::new",
                "step_size must be at least 1",
            ));
        }
        Ok(StepLr {
            base_lr,
            step_size,
            gamma,
        })
    }
}

impl LrSchedule for StepLr {
    fn lr(&self, step: u64) -> f32 {
        let k = (step / self.step_size).min(i32::MAX as u64) as i32;
        (f64::from(self.base_lr) * f64::from(self.gamma).powi(k)) as f32
    }
}

/// `base_lr * gamma^(milestones passed)`: PyTorch's `MultiStepLR` (the
/// rate drops at each milestone step).
#[derive(Debug, Clone, PartialEq)]
pub struct MultiStepLr {
    base_lr: f32,
    milestones: Vec<u64>,
    gamma: f32,
}

impl MultiStepLr {
    /// Decays `base_lr` by `gamma` at each of `milestones` (a milestone
    /// listed twice decays twice, as in PyTorch).
    ///
    /// # Errors
    /// As [`StepLr::new`].
    pub fn new(base_lr: f32, milestones: &[u64], gamma: f32) -> Result<MultiStepLr> {
        check_rate("MultiStepLr::new", "base_lr", base_lr)?;
        check_factor("MultiStepLr::new", "gamma", gamma)?;
        let mut milestones = milestones.to_vec();
        milestones.sort_unstable();
        Ok(MultiStepLr {
            base_lr,
            milestones,
            gamma,
        })
    }
}

impl LrSchedule for MultiStepLr {
    fn lr(&self, step: u64) -> f32 {
        let k = self.milestones.partition_point(|&m| m <= step);
        let k = k.min(i32::MAX as usize) as i32;
        (f64::from(self.base_lr) * f64::from(self.gamma).powi(k)) as f32
    }
}

/// `base_lr * gamma^step`: PyTorch's `ExponentialLR`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExponentialLr {
    base_lr: f32,
    gamma: f32,
}

impl ExponentialLr {
    /// Decays `base_lr` by `gamma` every step.
    ///
    /// # Errors
    /// As [`StepLr::new`].
    pub fn new(base_lr: f32, gamma: f32) -> Result<ExponentialLr> {
        check_rate("ExponentialLr::new", "base_lr", base_lr)?;
        check_factor("ExponentialLr::new", "gamma", gamma)?;
        Ok(ExponentialLr { base_lr, gamma })
    }
}

impl LrSchedule for ExponentialLr {
    fn lr(&self, step: u64) -> f32 {
        let k = step.min(i32::MAX as u64) as i32;
        (f64::from(self.base_lr) * f64::from(self.gamma).powi(k)) as f32
    }
}

/// `base_lr * (start + (end - start) * min(step, total_iters) /
/// total_iters)`: PyTorch's `LinearLR` (its defaults: `start_factor = 1/3`,
/// `end_factor = 1`, `total_iters = 5`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearLr {
    base_lr: f32,
    start_factor: f32,
    end_factor: f32,
    total_iters: u64,
}

impl LinearLr {
    /// Scales `base_lr` from `start_factor` to `end_factor` linearly over
    /// `total_iters` steps, then holds `end_factor`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a negative or non-finite rate, a
    /// `start_factor` outside `(0, 1]`, an `end_factor` outside `[0, 1]`,
    /// or a zero `total_iters`.
    pub fn new(
        base_lr: f32,
        start_factor: f32,
        end_factor: f32,
        total_iters: u64,
    ) -> Result<LinearLr> {
        let what = "LinearLr::new";
        check_rate(what, "base_lr", base_lr)?;
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(Error::invalid(
                what,
                format!("start_factor must be in (0, 1] (got {start_factor})"),
            ));
        }
        if !(0.0..=1.0).contains(&end_factor) {
            return Err(Error::invalid(
                what,
                format!("end_factor must be in [0, 1] (got {end_factor})"),
            ));
        }
        if total_iters == 0 {
            return Err(Error::invalid(what, "total_iters must be at least 1"));
        }
        Ok(LinearLr {
            base_lr,
            start_factor,
            end_factor,
            total_iters,
        })
    }
}

impl LrSchedule for LinearLr {
    fn lr(&self, step: u64) -> f32 {
        let (s, e) = (f64::from(self.start_factor), f64::from(self.end_factor));
        let p = step.min(self.total_iters) as f64 / self.total_iters as f64;
        (f64::from(self.base_lr) * (s + (e - s) * p)) as f32
    }
}

/// How [`OneCycleLr`] moves between two rates (PyTorch's
/// `anneal_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Anneal {
    /// `end + (start - end) * (1 + cos(pi * p)) / 2` (the default).
    #[default]
    Cos,
    /// `start + (end - start) * p`.
    Linear,
}

impl Anneal {
    fn at(self, start: f64, end: f64, p: f64) -> f64 {
        match self {
            Anneal::Cos => end + (start - end) / 2.0 * ((std::f64::consts::PI * p).cos() + 1.0),
            Anneal::Linear => (end - start) * p + start,
        }
    }
}

/// The 1cycle policy, PyTorch's `OneCycleLR` (the learning rate only; its
/// momentum cycling is not done): from `max_lr / div_factor` up to
/// `max_lr` over the first `pct_start` of `total_steps`, then down to
/// `max_lr / div_factor / final_div_factor` (with `three_phase`, back to
/// the initial rate over as many steps first). Steps past `total_steps`
/// keep the rate of step `total_steps` (PyTorch raises an error there).
///
/// ```
/// use fucina::optim::{LrSchedule, OneCycleLr};
///
/// let s = OneCycleLr::new(1.0, 100)?; // PyTorch's defaults otherwise
/// assert_eq!(s.lr(0), 0.04); // max_lr / 25
/// assert!((s.lr(29) - 1.0).abs() < 1e-6); // the peak at 30 % - 1
/// assert!(s.lr(99) < 1e-5); // max_lr / 25 / 1e4 at the end
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OneCycleLr {
    /// The peak rate.
    pub max_lr: f32,
    /// The schedule's length.
    pub total_steps: u64,
    /// The share of the steps spent rising (PyTorch's default 0.3).
    pub pct_start: f64,
    /// How the rate moves (cosine by default).
    pub anneal: Anneal,
    /// `max_lr / initial rate` (default 25).
    pub div_factor: f64,
    /// `initial rate / final rate` (default 1e4).
    pub final_div_factor: f64,
    /// Rise, fall back to the initial rate, then anneal to the final one.
    pub three_phase: bool,
}

impl OneCycleLr {
    /// A cycle peaking at `max_lr` over `total_steps` with PyTorch's
    /// defaults (`pct_start = 0.3`, cosine, `div_factor = 25`,
    /// `final_div_factor = 1e4`, two phases); change the public fields for
    /// other settings, then [`validate`](OneCycleLr::validate).
    ///
    /// # Errors
    /// As [`validate`](OneCycleLr::validate).
    pub fn new(max_lr: f32, total_steps: u64) -> Result<OneCycleLr> {
        let s = OneCycleLr {
            max_lr,
            total_steps,
            pct_start: 0.3,
            anneal: Anneal::Cos,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        };
        s.validate()?;
        Ok(s)
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a negative or non-finite `max_lr`, a
    /// zero `total_steps`, a `pct_start` outside `[0, 1]`, or a divisor
    /// that is not finite and positive.
    pub fn validate(&self) -> Result<()> {
        let what = "OneCycleLr";
        check_rate(what, "max_lr", self.max_lr)?;
        if self.total_steps == 0 {
            return Err(Error::invalid(what, "total_steps must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.pct_start) {
            return Err(Error::invalid(
                what,
                format!("pct_start must be in [0, 1] (got {})", self.pct_start),
            ));
        }
        for (name, v) in [
            ("div_factor", self.div_factor),
            ("final_div_factor", self.final_div_factor),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::invalid(
                    what,
                    format!("{name} must be finite and > 0 (got {v})"),
                ));
            }
        }
        Ok(())
    }
}

impl LrSchedule for OneCycleLr {
    fn lr(&self, step: u64) -> f32 {
        let max = f64::from(self.max_lr);
        let initial = max / self.div_factor;
        let min = initial / self.final_div_factor;
        let total = self.total_steps as f64;
        let rise = self.pct_start * total - 1.0;
        // (end step, start rate, end rate) of each phase, as PyTorch lists them.
        let phases: &[(f64, f64, f64)] = if self.three_phase {
            &[
                (rise, initial, max),
                (2.0 * self.pct_start * total - 2.0, max, initial),
                (total - 1.0, initial, min),
            ]
        } else {
            &[(rise, initial, max), (total - 1.0, max, min)]
        };
        let s = step.min(self.total_steps) as f64;
        let mut start = 0.0;
        for (i, &(end, from, to)) in phases.iter().enumerate() {
            if s <= end || i + 1 == phases.len() {
                let p = (s - start) / (end - start);
                return self.anneal.at(from, to, p) as f32;
            }
            start = end;
        }
        unreachable!("the last phase always answers")
    }
}

/// A linear warmup before a schedule: the first `warmup` steps scale the
/// schedule's first rate from `start_factor` to 1, then step `warmup + s`
/// has the schedule's rate of step `s` (PyTorch's `SequentialLR` of
/// `LinearLR(start_factor, 1, warmup)` and the schedule, milestone
/// `warmup`).
///
/// ```
/// use fucina::optim::{LrSchedule, StepLr, WithWarmup};
///
/// let s = WithWarmup::new(StepLr::new(1.0, 10, 0.5)?, 4, 0.25)?;
/// assert_eq!((s.lr(0), s.lr(2), s.lr(4), s.lr(14)), (0.25, 0.625, 1.0, 0.5));
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct WithWarmup<S> {
    /// The schedule after the warmup.
    pub then: S,
    warmup: u64,
    start_factor: f32,
}

impl<S: LrSchedule> WithWarmup<S> {
    /// `warmup` steps rising from `start_factor` times `then`'s first rate,
    /// then `then`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `start_factor` outside `(0, 1]`.
    pub fn new(then: S, warmup: u64, start_factor: f32) -> Result<WithWarmup<S>> {
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(Error::invalid(
                "WithWarmup::new",
                format!("start_factor must be in (0, 1] (got {start_factor})"),
            ));
        }
        Ok(WithWarmup {
            then,
            warmup,
            start_factor,
        })
    }
}

impl<S: LrSchedule> LrSchedule for WithWarmup<S> {
    fn lr(&self, step: u64) -> f32 {
        if step >= self.warmup {
            return self.then.lr(step - self.warmup);
        }
        let s = f64::from(self.start_factor);
        let f = s + (1.0 - s) * step as f64 / self.warmup as f64;
        (f64::from(self.then.lr(0)) * f) as f32
    }
}

/// Whether [`ReduceLrOnPlateau`] watches a metric that should fall (a
/// loss) or rise (an accuracy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PlateauMode {
    /// Lower is better (the default).
    #[default]
    Min,
    /// Higher is better.
    Max,
}

/// PyTorch's `ReduceLROnPlateau` (relative threshold): after more than
/// `patience` calls of [`step`](ReduceLrOnPlateau::step) without the metric
/// improving on its best by the relative `threshold`, the rate is
/// multiplied by `factor` (not below `min_lr`; changes smaller than `eps`
/// are skipped), then `cooldown` calls pass before counting again. Its
/// state (the rate, the best metric and the counters) saves and loads as a
/// [`StateDict`].
///
/// ```
/// use fucina::optim::ReduceLrOnPlateau;
///
/// let mut s = ReduceLrOnPlateau::new(1.0)?;
/// s.patience = 2;
/// for loss in [3.0, 2.0, 2.0, 2.0] {
///     s.step(loss);
/// }
/// assert_eq!(s.lr(), 1.0); // two calls without improvement: still patient
/// s.step(2.0);
/// assert!((s.lr() - 0.1).abs() < 1e-7);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ReduceLrOnPlateau {
    /// Whether lower or higher is better.
    pub mode: PlateauMode,
    /// The rate's multiplier on a plateau (default 0.1).
    pub factor: f64,
    /// Calls without improvement tolerated (default 10).
    pub patience: u64,
    /// The relative improvement that counts (default 1e-4).
    pub threshold: f64,
    /// Calls after a reduction before counting again (default 0).
    pub cooldown: u64,
    /// The lowest rate (default 0).
    pub min_lr: f64,
    /// The smallest change applied (default 1e-8).
    pub eps: f64,
    lr: f64,
    /// `None` before the first metric (PyTorch's "worse than anything").
    best: Option<f64>,
    num_bad: u64,
    cooldown_counter: u64,
}

impl ReduceLrOnPlateau {
    /// Starts at `lr` with PyTorch's defaults (change the public fields for
    /// others).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a negative or non-finite rate.
    pub fn new(lr: f32) -> Result<ReduceLrOnPlateau> {
        check_rate("ReduceLrOnPlateau::new", "lr", lr)?;
        Ok(ReduceLrOnPlateau {
            mode: PlateauMode::Min,
            factor: 0.1,
            patience: 10,
            threshold: 1e-4,
            cooldown: 0,
            min_lr: 0.0,
            eps: 1e-8,
            lr: f64::from(lr),
            best: None,
            num_bad: 0,
            cooldown_counter: 0,
        })
    }

    /// The current rate (set it on the optimizer after each
    /// [`step`](ReduceLrOnPlateau::step)).
    pub fn lr(&self) -> f32 {
        self.lr as f32
    }

    /// The best metric seen so far (`None` before the first).
    pub fn best(&self) -> Option<f64> {
        self.best
    }

    fn is_better(&self, v: f64) -> bool {
        match (self.best, self.mode) {
            (None, _) => true,
            (Some(b), PlateauMode::Min) => v < b * (1.0 - self.threshold),
            (Some(b), PlateauMode::Max) => v > b * (1.0 + self.threshold),
        }
    }

    /// Records one value of the metric (once per epoch) and returns the
    /// rate to use next.
    pub fn step(&mut self, metric: f64) -> f32 {
        if self.is_better(metric) {
            self.best = Some(metric);
            self.num_bad = 0;
        } else {
            self.num_bad += 1;
        }
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            self.num_bad = 0;
        }
        if self.num_bad > self.patience {
            let new = (self.lr * self.factor).max(self.min_lr);
            if self.lr - new > self.eps {
                self.lr = new;
            }
            self.cooldown_counter = self.cooldown;
            self.num_bad = 0;
        }
        self.lr()
    }

    /// The state: `"plateau"` (`[4]`: the rate, the best metric (NaN before
    /// the first), the calls without improvement and the cooldown left; f32
    /// values, exact for counts below 2^24).
    ///
    /// # Errors
    /// Out of memory.
    pub fn state_dict(&self, ctx: &ExecContext) -> Result<StateDict> {
        let v = [
            self.lr as f32,
            self.best.map_or(f32::NAN, |b| b as f32),
            self.num_bad as f32,
            self.cooldown_counter as f32,
        ];
        let mut sd = StateDict::new();
        sd.insert("plateau", Tensor::from_slice(ctx, &[4], &v)?)?;
        Ok(sd)
    }

    /// Restores the state of [`state_dict`](ReduceLrOnPlateau::state_dict).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a missing or misshapen `"plateau"`
    /// entry or values out of range (nothing changes then).
    pub fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        let what = "ReduceLrOnPlateau::load_state_dict";
        let Some(t) = state.get("plateau").filter(|t| t.shape() == [4]) else {
            return Err(Error::invalid(
                what,
                "needs a \"plateau\" entry of shape [4]",
            ));
        };
        let v = t.to_vec();
        let count = |x: f32| (x.is_finite() && x >= 0.0 && x.fract() == 0.0).then_some(x as u64);
        match (v[0].is_finite() && v[0] >= 0.0, count(v[2]), count(v[3])) {
            (true, Some(bad), Some(cool)) => {
                self.lr = f64::from(v[0]);
                self.best = (!v[1].is_nan()).then_some(f64::from(v[1]));
                self.num_bad = bad;
                self.cooldown_counter = cool;
                Ok(())
            }
            _ => Err(Error::invalid(what, format!("invalid state {v:?}"))),
        }
    }
}
