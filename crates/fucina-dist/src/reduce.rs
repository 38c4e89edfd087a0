//! The pieces of the reduction that do not talk to MPI: the split of the
//! microbatches over the ranks, the buckets, the flat gradient copy of a
//! parameter list, and [`LocalDataParallel`], the single-process run of the
//! same microbatch split (the fixed summation tree is in `tree.rs`).

use std::ops::Range;
use std::time::Instant;

use fucina::autograd::{AutogradError, Tensor};
use fucina::exec::ExecContext;

use crate::error::{DistError, Result};
use crate::tree::{tree_mean_contiguous, tree_ops};

/// The microbatches rank `rank` of `size` owns: the contiguous slice
/// `floor(m * rank / size) .. floor(m * (rank + 1) / size)` of `0 .. m`
/// (balanced: slice lengths differ by at most one; empty when `m < size` for
/// some ranks).
///
/// # Panics
/// If `size == 0` or `rank >= size` (a contract of the caller).
///
/// ```
/// use fucina_dist::shard_range;
/// assert_eq!(shard_range(8, 0, 4), 0..2);
/// assert_eq!(shard_range(8, 3, 4), 6..8);
/// assert_eq!(shard_range(5, 1, 2), 2..5);
/// ```
pub fn shard_range(microbatches: usize, rank: usize, size: usize) -> Range<usize> {
    assert!(
        rank < size,
        "shard_range: rank {rank} is not below size {size}"
    );
    let at = |r: usize| (microbatches as u128 * r as u128 / size as u128) as usize;
    at(rank)..at(rank + 1)
}

/// The rank that owns microbatch `m` under [`shard_range`].
pub(crate) fn owner(microbatches: usize, size: usize, m: usize) -> usize {
    // The last rank whose slice starts at or before m and is not empty.
    (0..size)
        .rev()
        .find(|&r| shard_range(microbatches, r, size).contains(&m))
        .expect("every microbatch has an owner")
}

/// Splits `0 .. total` into consecutive ranges of at most `cap` elements
/// (`cap >= 1`), the exchange buckets.
pub(crate) fn bucket_ranges(total: usize, cap: usize) -> Vec<Range<usize>> {
    let cap = cap.max(1);
    (0..total.div_ceil(cap))
        .map(|b| b * cap..((b + 1) * cap).min(total))
        .collect()
}

/// A parameter handle that [`DataParallel`](crate::DataParallel) and
/// [`LocalDataParallel`] can hold: a variable [`Tensor`], or a
/// [`fucina::nn::Parameter`] (the handle `fucina::nn` layers and
/// `fucina::optim` optimizers share, so the wrapped parameters are the
/// model's own).
pub trait DistParam {
    /// The current value as a variable handle (sharing the gradient state).
    fn variable(&self) -> Tensor;
    /// Overwrites the values (`values` holds every element, row-major).
    ///
    /// # Errors
    /// Out of memory (a copy-on-write copy).
    fn overwrite(&mut self, values: &[f32]) -> Result<()>;
}

impl DistParam for Tensor {
    fn variable(&self) -> Tensor {
        self.clone()
    }

    fn overwrite(&mut self, values: &[f32]) -> Result<()> {
        // Copy-on-write: a handle the caller kept keeps its old values.
        self.update_(|d| d.copy_from_slice(values))?;
        Ok(())
    }
}

impl DistParam for fucina::nn::Parameter {
    fn variable(&self) -> Tensor {
        self.tensor()
    }

    fn overwrite(&mut self, values: &[f32]) -> Result<()> {
        // Through the shared handle: the model's layers see the new values.
        self.copy_from_slice(values)
            .map_err(|e| DistError::Config(format!("overwriting a parameter: {e}")))
    }
}

/// A model's parameters and their layout in the flat gradient vector (parameter
/// `i` at `offsets[i] .. offsets[i + 1]`, then one slot for the microbatch's
/// scalar, e.g. its loss).
#[derive(Debug)]
pub(crate) struct ParamSet<P = Tensor> {
    pub(crate) params: Vec<P>,
    pub(crate) offsets: Vec<usize>,
}

impl<P: DistParam> ParamSet<P> {
    pub(crate) fn new(params: Vec<P>) -> Result<ParamSet<P>> {
        let mut offsets = vec![0];
        for (i, p) in params.iter().enumerate() {
            let p = p.variable();
            if !p.is_variable() {
                return Err(DistError::Config(format!(
                    "parameter {i} (shape {:?}) is not a variable (make it with \
                     Tensor::variable_from_slice or into_variable)",
                    p.shape()
                )));
            }
            offsets.push(offsets[i] + p.numel());
        }
        Ok(ParamSet { params, offsets })
    }

    /// The number of parameter elements.
    pub(crate) fn numel(&self) -> usize {
        *self.offsets.last().expect("offsets starts with 0")
    }

    /// The flat width: every parameter element and the scalar slot.
    pub(crate) fn width(&self) -> usize {
        self.numel() + 1
    }

    /// Releases every parameter's gradient.
    pub(crate) fn zero_grads(&self) {
        for p in &self.params {
            p.variable().zero_grad();
        }
    }

    /// Copies every parameter's gradient (zeros where none reached it) and
    /// `value` into `out` (`width()` long), and releases the gradients.
    pub(crate) fn take_grads(&self, value: f32, out: &mut [f32]) -> Result<()> {
        for (i, p) in self.params.iter().enumerate() {
            let p = p.variable();
            let dst = &mut out[self.offsets[i]..self.offsets[i + 1]];
            match p.grad_view() {
                None => dst.fill(0.0),
                // Any layout, in logical order, without an intermediate copy.
                Some(g) => g.raw().copy_into(dst).map_err(AutogradError::from)?,
            }
            p.zero_grad();
        }
        out[self.numel()] = value;
        Ok(())
    }

    /// Sets every parameter's gradient to its slice of `flat`.
    pub(crate) fn set_grads(&self, ctx: &ExecContext, flat: &[f32]) -> Result<()> {
        for (i, p) in self.params.iter().enumerate() {
            let p = p.variable();
            let g = ctx
                .from_slice(p.shape(), &flat[self.offsets[i]..self.offsets[i + 1]])
                .map_err(fucina::autograd::AutogradError::from)?;
            p.zero_grad();
            // Backward from the leaf itself with seed `g`: its gradient becomes `g`.
            p.backward_with_grad(ctx, &g)?;
        }
        Ok(())
    }
}

/// What one training step returned.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepOutput {
    /// The mean, over the global batch's microbatches (summed in the fixed
    /// tree), of the scalar each microbatch returned (its loss, typically). The
    /// same bits on every rank.
    pub value: f32,
    /// Seconds this rank spent in the microbatch closures (forward, backward
    /// and copying the gradients out).
    pub compute_s: f64,
    /// Seconds this rank spent in MPI: posting, progressing and waiting for the
    /// exchanges (0 for [`LocalDataParallel`]).
    pub exchange_s: f64,
    /// Seconds spent summing the partials in the fixed tree and setting the
    /// gradients.
    pub reduce_s: f64,
    /// Bytes this rank received from other ranks in the step's exchange (the
    /// element counts it posted to MPI, times 4; see
    /// [`DataParallel::bytes_received_per_step`](crate::DataParallel::bytes_received_per_step)).
    pub bytes_received: u64,
}

/// The same microbatch split as [`DataParallel`](crate::DataParallel) in one
/// process without MPI: every microbatch's gradient is computed here, the
/// partials are summed in the fixed binary tree over microbatch indices (the
/// one every [`Reduction`](crate::Reduction) of `DataParallel` follows), and
/// the parameters' gradients are set to their mean. Its gradients, and so a
/// training run, have the same bits as a `DataParallel` run over any number of
/// ranks.
#[derive(Debug)]
pub struct LocalDataParallel<P = Tensor> {
    set: ParamSet<P>,
    microbatches: usize,
    /// The fixed tree's additions over the microbatch slots.
    ops: Vec<(usize, usize)>,
    partials: Vec<f32>,
    mean: Vec<f32>,
}

impl<P: DistParam> LocalDataParallel<P> {
    /// Wraps `params` (variables, or `fucina::nn::Parameter`s) for steps of
    /// `microbatches` microbatches.
    ///
    /// # Errors
    /// [`DistError::Config`] if `microbatches == 0` or a parameter is not a
    /// variable.
    pub fn new(params: Vec<P>, microbatches: usize) -> Result<LocalDataParallel<P>> {
        if microbatches == 0 {
            return Err(DistError::Config("microbatches must be at least 1".into()));
        }
        let set = ParamSet::new(params)?;
        let w = set.width();
        let mut ops = Vec::with_capacity(microbatches - 1);
        tree_ops(microbatches, 0, 0, 0, &mut ops);
        Ok(LocalDataParallel {
            set,
            microbatches,
            ops,
            partials: vec![0.0; microbatches * w],
            mean: vec![0.0; w],
        })
    }

    /// One step: `f(ctx, params, m)` runs the forward and backward of microbatch `m` for
    /// `m = 0 .. microbatches` (the gradients are released before each call) and
    /// returns its scalar (the loss); then every parameter's gradient is the
    /// fixed-tree mean of the microbatch gradients. `f`'s error type is any that
    /// converts into a [`DistError`] (as for [`DataParallel::step`](crate::DataParallel::step)).
    ///
    /// # Errors
    /// The first error of `f`, or of setting the gradients.
    pub fn step<F, E>(&mut self, ctx: &ExecContext, mut f: F) -> Result<StepOutput>
    where
        F: FnMut(&ExecContext, &[P], usize) -> std::result::Result<f32, E>,
        E: Into<DistError>,
    {
        let w = self.set.width();
        let t0 = Instant::now();
        for (m, part) in self.partials.chunks_mut(w).enumerate() {
            self.set.zero_grads();
            let value = f(ctx, &self.set.params, m).map_err(Into::into)?;
            self.set.take_grads(value, part)?;
        }
        let t1 = Instant::now();
        tree_mean_contiguous(&mut self.mean, &mut self.partials, w, &self.ops);
        self.set.set_grads(ctx, &self.mean[..w - 1])?;
        Ok(StepOutput {
            value: self.mean[w - 1],
            compute_s: (t1 - t0).as_secs_f64(),
            exchange_s: 0.0,
            reduce_s: t1.elapsed().as_secs_f64(),
            bytes_received: 0,
        })
    }

    /// The number of microbatches of a step.
    pub fn microbatches(&self) -> usize {
        self.microbatches
    }

    /// The parameters.
    pub fn params(&self) -> &[P] {
        &self.set.params
    }

    /// The parameters, for an optimizer step.
    pub fn params_mut(&mut self) -> &mut [P] {
        &mut self.set.params
    }

    /// The parameters back.
    pub fn into_params(self) -> Vec<P> {
        self.set.params
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_microbatch_once_in_order() {
        for m in 0..20 {
            for size in 1..9 {
                let mut next = 0;
                for r in 0..size {
                    let s = shard_range(m, r, size);
                    assert_eq!(s.start, next, "m={m} size={size} r={r}");
                    assert!(s.len() <= m.div_ceil(size));
                    next = s.end;
                }
                assert_eq!(next, m);
                for mb in 0..m {
                    assert!(shard_range(m, owner(m, size, mb), size).contains(&mb));
                }
            }
        }
    }

    #[test]
    fn buckets_are_bounded_and_cover() {
        for total in [0, 1, 7, 64, 65] {
            for cap in [1, 8, 64, 1000] {
                let b = bucket_ranges(total, cap);
                assert!(b.iter().all(|r| !r.is_empty() && r.len() <= cap));
                assert_eq!(b.first().map_or(0, |r| r.start), 0);
                assert_eq!(b.last().map_or(0, |r| r.end), total);
                assert!(b.windows(2).all(|w| w[0].end == w[1].start));
            }
        }
    }

    #[test]
    fn local_step_averages_microbatch_gradients() {
        let ctx = ExecContext::with_threads(1);
        let w = Tensor::variable_from_slice(&ctx, &[2], &[1.0, 2.0]).unwrap();
        let mut dp = LocalDataParallel::new(vec![w], 4).unwrap();
        // Microbatch m: loss = (m + 1) * sum(w), gradient (m + 1) per element.
        let out = dp
            .step(&ctx, |_, _, m| Ok::<_, DistError>(m as f32))
            .map(|o| o.value);
        // The closure above does not touch the parameter: zero gradients.
        assert_eq!(out.unwrap(), 1.5);
        let g = dp.params()[0].grad(&ctx).unwrap().unwrap().to_vec();
        assert_eq!(g, [0.0, 0.0]);
        let out = dp
            .step(&ctx, |ctx, p, m| {
                let loss = p[0].sum_all(ctx)?.scale(ctx, (m + 1) as f32)?;
                loss.backward(ctx)?;
                loss.item()
            })
            .unwrap();
        assert_eq!(out.value, (3.0 + 6.0 + 9.0 + 12.0) / 4.0);
        let g = dp.params()[0].grad(&ctx).unwrap().unwrap().to_vec();
        assert_eq!(g, [2.5, 2.5]);
    }

    #[test]
    fn local_step_sums_in_the_fixed_tree() {
        // Microbatch m's gradient and value are c[m]: the tree gives
        // ((1e8 + 1) + (-1e8 + 1)) / 4 = 0, the sequential sum 1 / 4.
        let c = [1e8f32, 1.0, -1e8, 1.0];
        let ctx = ExecContext::with_threads(1);
        let w = Tensor::variable_from_slice(&ctx, &[1], &[0.0]).unwrap();
        let mut dp = LocalDataParallel::new(vec![w], 4).unwrap();
        let out = dp
            .step(&ctx, |ctx, p, m| {
                let loss = p[0].sum_all(ctx)?.scale(ctx, c[m])?;
                loss.backward(ctx)?;
                Ok::<_, DistError>(c[m])
            })
            .unwrap();
        assert_eq!(out.value.to_bits(), 0f32.to_bits());
        let g = dp.params()[0].grad(&ctx).unwrap().unwrap().to_vec();
        assert_eq!(g[0].to_bits(), 0f32.to_bits());
    }

    #[test]
    fn constants_are_refused() {
        let ctx = ExecContext::with_threads(1);
        let c = Tensor::from_slice(&ctx, &[1], &[1.0]).unwrap();
        let err = LocalDataParallel::new(vec![c], 2).unwrap_err();
        assert!(err.to_string().contains("not a variable"), "{err}");
        let w = Tensor::variable_from_slice(&ctx, &[1], &[1.0]).unwrap();
        assert!(LocalDataParallel::new(vec![w], 0).is_err());
    }
}
