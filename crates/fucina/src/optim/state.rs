//! The per-parameter buffers and the step count shared by the optimizers.

use fucina_autograd::Tensor;
use fucina_exec::{ExecContext, RawTensor};

use crate::error::{Error, Result};
use crate::nn::Parameter;

/// The base of the digits of the `"step"` entry: every integer below it is
/// exact in `f32`.
const STEP_BASE: u64 = 1 << 24;
/// The number of base-2^24 digits of a `u64` (72 bits >= 64).
const STEP_DIGITS: usize = 3;

/// The step count as the `"step"` entry stores it: three `f32` digits, least
/// significant first, each an integer below 2^24 (exact in `f32`, so the count
/// survives a checkpoint bit for bit up to `u64::MAX`).
fn step_digits(step: u64) -> [f32; STEP_DIGITS] {
    [0, 1, 2].map(|k| ((step >> (24 * k)) % STEP_BASE) as f32)
}

/// Reads a `"step"` entry: three digits (see [`step_digits`]) or, as written by
/// earlier versions, one `f32` holding the count (exact up to 2^24).
fn parse_step(t: &Tensor) -> Result<u64> {
    if !matches!(t.shape(), [1] | [STEP_DIGITS]) {
        return Err(Error::state(format!(
            "\"step\" has shape {:?}, not [3] (or [1], the format of earlier versions)",
            t.shape()
        )));
    }
    let values = t.to_vec();
    let is_digit = |v: f32| v.is_finite() && v >= 0.0 && v.fract() == 0.0 && (v as u64) < STEP_BASE;
    match *values.as_slice() {
        [v] if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= 16_777_216.0 => Ok(v as u64),
        [v] => Err(Error::state(format!("\"step\" = {v} is not a step count"))),
        [lo, mid, hi] if is_digit(lo) && is_digit(mid) && is_digit(hi) && (hi as u64) < 1 << 16 => {
            Ok(lo as u64 | (mid as u64) << 24 | (hi as u64) << 48)
        }
        [_, _, _] => Err(Error::state(format!(
            "\"step\" = {values:?} is not a step count (three integer digits below 2^24, least significant first, the last below 2^16)"
        ))),
        _ => unreachable!("the shape was checked"),
    }
}

/// Named per-parameter buffers (`kinds[k]` -> `bufs[k][i]`) and a step count.
#[derive(Debug)]
pub(crate) struct State {
    kinds: &'static [&'static str],
    pub(crate) bufs: Vec<Vec<Option<Tensor>>>,
    /// The step count as a `[3]` tensor of digits (created at the first step).
    step_t: Option<Tensor>,
    pub(crate) step: u64,
    /// What [`prepare`](State::prepare) made ready for the step in progress,
    /// one entry per parameter (the capacity is kept: no allocation per step).
    pub(crate) prepared: Vec<Prepared>,
    /// Whether `step_t` was created by the step in progress.
    step_t_fresh: bool,
}

/// What phase one of a step made ready for one parameter.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The parameter's gradient, contiguous (`None`: the parameter is skipped).
    pub(crate) grad: Option<RawTensor>,
    /// Whether its buffers were created by this step (its first update).
    pub(crate) fresh: bool,
}

impl State {
    pub(crate) fn new(kinds: &'static [&'static str], n: usize) -> State {
        State {
            kinds,
            bufs: kinds.iter().map(|_| vec![None; n]).collect(),
            step_t: None,
            step: 0,
            prepared: Vec::with_capacity(n),
            step_t_fresh: false,
        }
    }

    /// Phase one of a step: everything that can fail, before any value changes.
    /// Gets every parameter's gradient (contiguous), creates the missing buffers
    /// (with `with_bufs`) and the step tensor, and gives every buffer, the step
    /// tensor and every parameter to be updated storage of its own (the
    /// copy-on-write copies a later in-place write would make), so that phase
    /// two writes in place and allocates nothing. Returns the new step number.
    /// On an error, undoes what it created: the state is as it was.
    pub(crate) fn prepare(
        &mut self,
        ctx: &ExecContext,
        params: &[Parameter],
        with_bufs: bool,
    ) -> Result<u64> {
        let Some(next) = self.step.checked_add(1) else {
            return Err(Error::invalid("step", "the step count would pass u64::MAX"));
        };
        self.prepared.clear();
        self.step_t_fresh = false;
        let r = self.prepare_all(ctx, params, with_bufs);
        if r.is_err() {
            for (i, p) in self.prepared.iter().enumerate() {
                if p.fresh {
                    for kind in &mut self.bufs {
                        kind[i] = None;
                    }
                }
            }
            if self.step_t_fresh {
                self.step_t = None;
            }
            self.prepared.clear();
        }
        r.map(|()| next)
    }

    fn prepare_all(
        &mut self,
        ctx: &ExecContext,
        params: &[Parameter],
        with_bufs: bool,
    ) -> Result<()> {
        fault::point()?;
        match &mut self.step_t {
            Some(t) => t.update_(|_| ())?,
            None => {
                let digits = step_digits(self.step);
                self.step_t = Some(Tensor::from_slice(ctx, &[STEP_DIGITS], &digits)?);
                self.step_t_fresh = true;
            }
        }
        for (i, p) in params.iter().enumerate() {
            fault::point()?;
            let Some(grad) = grad_of(ctx, p)? else {
                self.prepared.push(Prepared {
                    grad: None,
                    fresh: false,
                });
                continue;
            };
            // Buffers of one parameter exist together (`load` checks it).
            let fresh = with_bufs && self.bufs[0][i].is_none();
            // Recorded first, so that an error below undoes what it created.
            self.prepared.push(Prepared { grad: None, fresh });
            if with_bufs {
                for kind in &mut self.bufs {
                    fault::point()?;
                    match &mut kind[i] {
                        Some(b) => b.update_(|_| ())?,
                        slot => *slot = Some(zeros_like(ctx, p)?),
                    }
                }
            }
            fault::point()?;
            p.update_(|_| ())?;
            if let Some(last) = self.prepared.last_mut() {
                last.grad = Some(grad);
            }
        }
        Ok(())
    }

    /// Phase two's bookkeeping: records step `next` (prepared: in place) and
    /// drops the prepared gradient handles.
    pub(crate) fn finish(&mut self, next: u64) -> Result<()> {
        let digits = step_digits(next);
        if let Some(t) = &mut self.step_t {
            t.update_(|v| v.copy_from_slice(&digits))?;
        }
        self.step = next;
        self.prepared.clear();
        Ok(())
    }

    pub(crate) fn state_dict(&self) -> crate::nn::StateDict {
        let mut out = Vec::new();
        if let Some(t) = &self.step_t {
            out.push(("step".to_string(), t.clone()));
        }
        for (kind, bufs) in self.kinds.iter().zip(&self.bufs) {
            for (i, b) in bufs.iter().enumerate() {
                if let Some(b) = b {
                    out.push((format!("{kind}.{i}"), b.clone()));
                }
            }
        }
        crate::nn::StateDict::from_unique(out)
    }

    /// Validates `state` against `params` and, only if all of it fits, replaces
    /// this state with copies. All kinds of a parameter must be present together
    /// (Adam's two moments); `allow_bufs`: whether buffers may be given at all.
    pub(crate) fn load(
        &mut self,
        ctx: &ExecContext,
        params: &[Parameter],
        state: &[(String, Tensor)],
        allow_bufs: bool,
    ) -> Result<()> {
        let n = params.len();
        let mut step: Option<u64> = None;
        let mut slots: Vec<Vec<Option<&RawTensor>>> =
            self.kinds.iter().map(|_| vec![None; n]).collect();
        for (name, t) in state {
            if name == "step" {
                if step.is_some() {
                    return Err(Error::state("duplicate entry \"step\""));
                }
                step = Some(parse_step(t)?);
                continue;
            }
            let parsed = name.rsplit_once('.').and_then(|(kind, idx)| {
                let k = self.kinds.iter().position(|&x| x == kind)?;
                let i: usize = idx.parse().ok().filter(|&i| i < n)?;
                (idx == i.to_string()).then_some((k, i))
            });
            let Some((k, i)) = parsed else {
                return Err(Error::state(format!(
                    "unknown entry \"{name}\" (expected \"step\" or {}.<index below {n}>)",
                    self.kinds.join("/")
                )));
            };
            if !allow_bufs {
                return Err(Error::state(format!(
                    "unexpected entry \"{name}\" (this configuration keeps no buffers)"
                )));
            }
            if slots[k][i].is_some() {
                return Err(Error::state(format!("duplicate entry \"{name}\"")));
            }
            let want = params[i].shape();
            if t.shape() != want.as_slice() {
                return Err(Error::state(format!(
                    "\"{name}\" has shape {:?}, but parameter {i} has shape {:?}",
                    t.shape(),
                    want.as_slice()
                )));
            }
            check_values(name, self.kinds[k], t)?;
            slots[k][i] = Some(t.raw());
        }
        let any_buf = slots.iter().flatten().any(Option::is_some);
        if any_buf && step.is_none() {
            return Err(Error::state("missing entry \"step\""));
        }
        for i in 0..n {
            // A parameter with some kinds given must have all of them.
            let missing = slots.iter().position(|s| s[i].is_none());
            if let Some(j) = missing
                && slots.iter().any(|s| s[i].is_some())
            {
                let kind = self.kinds[j];
                return Err(Error::state(format!("missing entry \"{kind}.{i}\"")));
            }
        }
        // Everything fits: copy (the optimizer owns its buffers).
        let mut bufs: Vec<Vec<Option<Tensor>>> = Vec::with_capacity(self.kinds.len());
        for kind_slots in &slots {
            let mut v = Vec::with_capacity(n);
            for s in kind_slots {
                v.push(match s {
                    Some(raw) => Some(Tensor::constant(ctx.clone(raw)?)),
                    None => None,
                });
            }
            bufs.push(v);
        }
        let step_t = match step {
            Some(s) => Some(Tensor::from_slice(ctx, &[STEP_DIGITS], &step_digits(s))?),
            None => None,
        };
        self.bufs = bufs;
        self.step = step.unwrap_or(0);
        self.step_t = step_t;
        self.prepared.clear();
        Ok(())
    }
}

/// Refuses a buffer holding a value no step could have produced: a NaN or an
/// infinity, or a negative second moment (`exp_avg_sq`, `square_avg`: running
/// means of squares; `sum`: Adagrad's sum of squares, from a non-negative
/// start).
fn check_values(name: &str, kind: &str, t: &Tensor) -> Result<()> {
    let nonneg = matches!(kind, "exp_avg_sq" | "square_avg" | "sum");
    let values = t.to_vec();
    let bad = values
        .iter()
        .position(|&v| !v.is_finite() || (nonneg && v < 0.0));
    if let Some(j) = bad {
        let need = if nonneg {
            "finite and >= 0 (a mean of squares)"
        } else {
            "finite"
        };
        return Err(Error::state(format!(
            "\"{name}\" holds {} at element {j}; its values must be {need}",
            values[j]
        )));
    }
    Ok(())
}

/// The gradient of `p` as a contiguous raw tensor (`None` without one).
pub(crate) fn grad_of(ctx: &ExecContext, p: &Parameter) -> Result<Option<RawTensor>> {
    let Some(g) = p.grad_view() else {
        return Ok(None);
    };
    Ok(Some(ctx.contiguous(g.raw())?))
}

/// A zero buffer of `p`'s shape.
pub(crate) fn zeros_like(ctx: &ExecContext, p: &Parameter) -> Result<Tensor> {
    Ok(Tensor::zeros(ctx, p.shape().as_slice())?)
}

/// Failure injection for the unit tests of the two-phase step: in test builds,
/// [`point`](fault::point) fails once the number of points passed on this
/// thread reaches a set count; elsewhere it compiles to nothing.
mod fault {
    use crate::error::Result;

    #[cfg(test)]
    thread_local! {
        /// Points left before the failure (`usize::MAX`: never).
        pub(crate) static LEFT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    }

    #[inline(always)]
    pub(super) fn point() -> Result<()> {
        #[cfg(test)]
        {
            let left = LEFT.with(|l| l.get());
            if left == 0 {
                return Err(crate::Error::invalid("fault", "an injected failure"));
            }
            LEFT.with(|l| l.set(left.saturating_sub(if left == usize::MAX { 0 } else { 1 })));
        }
        Ok(())
    }
}

/// The autograd tests' `sum(w * w)` step (the integration tests use it too).
#[cfg(test)]
#[path = "../../../fucina-autograd/tests/support/square.rs"]
mod square;

#[cfg(test)]
mod tests {
    use super::fault::LEFT;
    use super::square;
    use crate::nn::Parameter;
    use crate::optim::{
        Adagrad, AdagradConfig, AdamW, AdamWConfig, Lion, Optimizer, RmsProp, RmsPropConfig, Sgd,
        SgdConfig,
    };
    use fucina_exec::ExecContext;

    /// Everything a step can change: parameters, state entries, step count.
    type Snapshot = (Vec<Vec<u32>>, Vec<(String, Vec<u32>)>, u64);
    type MakeOpt = Box<dyn Fn(Vec<Parameter>) -> Box<dyn Optimizer>>;

    fn snapshot(opt: &dyn Optimizer) -> Snapshot {
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        (
            opt.parameters().iter().map(|p| bits(p.to_vec())).collect(),
            opt.state_dict()
                .into_iter()
                .map(|(n, t)| (n, bits(t.to_vec())))
                .collect(),
            opt.step_count(),
        )
    }

    fn backward(ctx: &ExecContext, params: &[Parameter]) {
        for p in params {
            p.zero_grad();
            square::backward_sum_of_squares(ctx, &p.tensor());
        }
    }

    #[test]
    fn a_step_that_fails_in_phase_one_changes_nothing() {
        let ctx = ExecContext::with_threads(1);
        let make = |ctx: &ExecContext| -> Vec<Parameter> {
            (0..3)
                .map(|i| Parameter::from_slice(ctx, &[4], &[i as f32 + 0.5; 4]).unwrap())
                .collect()
        };
        let sgd_cfg = SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.5,
            ..SgdConfig::default()
        };
        let opts: Vec<MakeOpt> = vec![
            Box::new(|p| Box::new(AdamW::new(p, AdamWConfig::default()).unwrap())),
            Box::new(move |p| Box::new(Sgd::new(p, sgd_cfg).unwrap())),
            Box::new(|p| {
                let cfg = RmsPropConfig {
                    momentum: 0.5,
                    centered: true,
                    ..RmsPropConfig::default()
                };
                Box::new(RmsProp::new(p, cfg).unwrap())
            }),
            Box::new(|p| {
                let cfg = AdagradConfig {
                    initial_accumulator_value: 0.5,
                    ..AdagradConfig::default()
                };
                Box::new(Adagrad::new(p, cfg).unwrap())
            }),
            Box::new(|p| Box::new(Lion::new(p, 0.01).unwrap())),
        ];
        for make_opt in &opts {
            // Fresh (the first step creates the state) and after one step.
            for warm in [false, true] {
                let params = make(&ctx);
                let mut opt = make_opt(params.clone());
                // A reference run without failures.
                let ref_params = make(&ctx);
                let mut reference = make_opt(ref_params.clone());
                for _ in 0..usize::from(warm) + 1 {
                    backward(&ctx, &ref_params);
                    reference.step(&ctx).unwrap();
                }
                if warm {
                    backward(&ctx, &params);
                    opt.step(&ctx).unwrap();
                }
                backward(&ctx, &params);
                // Hold handles on the state, so that phase one must copy.
                let held = opt.state_dict();
                let before = snapshot(&*opt);
                let mut failures = 0;
                for at in 0.. {
                    LEFT.with(|l| l.set(at));
                    let r = opt.step(&ctx);
                    LEFT.with(|l| l.set(usize::MAX));
                    match r {
                        Err(e) => {
                            assert!(e.to_string().contains("injected"), "{e}");
                            assert_eq!(snapshot(&*opt), before, "failure at point {at}");
                            failures += 1;
                        }
                        Ok(()) => break,
                    }
                }
                assert!(failures >= 8, "{failures} failure points");
                // After the failures, the step is the one the reference took.
                assert_eq!(snapshot(&*opt), snapshot(&*reference));
                drop(held);
            }
        }
    }
}
