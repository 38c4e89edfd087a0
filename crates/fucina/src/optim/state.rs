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
    match values.as_slice() {
        &[v] if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= 16_777_216.0 => Ok(v as u64),
        &[v] => Err(Error::state(format!("\"step\" = {v} is not a step count"))),
        &[lo, mid, hi]
            if is_digit(lo) && is_digit(mid) && is_digit(hi) && (hi as u64) < 1 << 16 =>
        {
            Ok(lo as u64 | (mid as u64) << 24 | (hi as u64) << 48)
        }
        &[_, _, _] => Err(Error::state(format!(
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
}

impl State {
    pub(crate) fn new(kinds: &'static [&'static str], n: usize) -> State {
        State {
            kinds,
            bufs: kinds.iter().map(|_| vec![None; n]).collect(),
            step_t: None,
            step: 0,
        }
    }

    /// Advances the step count (allocating its tensor at the first step).
    pub(crate) fn advance(&mut self, ctx: &ExecContext) -> Result<u64> {
        let Some(step) = self.step.checked_add(1) else {
            return Err(Error::invalid("step", "the step count would pass u64::MAX"));
        };
        let digits = step_digits(step);
        match &mut self.step_t {
            Some(t) => t.update_(|v| v.copy_from_slice(&digits))?,
            None => self.step_t = Some(Tensor::from_slice(ctx, &[STEP_DIGITS], &digits)?),
        }
        self.step = step;
        Ok(step)
    }

    pub(crate) fn state_dict(&self) -> Vec<(String, Tensor)> {
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
        out
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
        Ok(())
    }
}

/// Refuses a buffer holding a value no step could have produced: a NaN or an
/// infinity, or a negative second moment (`exp_avg_sq`, a running mean of
/// squares).
fn check_values(name: &str, kind: &str, t: &Tensor) -> Result<()> {
    let nonneg = kind == "exp_avg_sq";
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
    let raw = g.raw();
    Ok(Some(if raw.is_contiguous() {
        raw.clone()
    } else {
        ctx.materialize(raw)?
    }))
}

/// A zero buffer of `p`'s shape.
pub(crate) fn zeros_like(ctx: &ExecContext, p: &Parameter) -> Result<Tensor> {
    Ok(Tensor::zeros(ctx, p.shape().as_slice())?)
}
