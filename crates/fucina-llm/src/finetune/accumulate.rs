//! How an optimizer step combines the gradients of its micro-batches: the
//! [`Accumulator`] seam, and [`TreeAccumulator`], the single-process one.
//!
//! A step of `M` micro-batches takes each micro-batch's *partial* gradient
//! (the gradient of its loss weighted by `M` times its share of the step's
//! predicted tokens) and sums the `M` partials in the fixed binary tree over
//! micro-batch indices (`fucina::optim::tree_sum_ops`), then divides by `M`:
//! the gradient of the mean loss over every predicted token of the step. The
//! tree is the one `fucina-dist`'s `DataParallel` sums in, whatever the rank
//! count, so an accumulator over `DataParallel` (a few lines, in
//! `fucina-dist`'s `finetune_dist` example) gives the same bits on 1, 2 or 4
//! ranks as [`TreeAccumulator`] in one process.

use fucina::nn::Parameter;
use fucina::optim::{run_tree_sum, tree_mean_from_sum, tree_sum_ops};
use fucina::{AutogradError, ExecContext};

use super::error::FinetuneError;

/// A micro-batch's forward and backward: `run(ctx, m)` adds micro-batch `m`'s
/// partial gradient to the parameters' gradients and returns its scalar (its
/// weighted loss).
pub type MicroBatchFn<'a> = dyn FnMut(&ExecContext, usize) -> Result<f32, FinetuneError> + 'a;

/// How a step turns its micro-batches' partial gradients into the step's
/// gradient.
pub trait Accumulator {
    /// Calls `run(ctx, m)` for the micro-batches `m` of `0 .. microbatches`
    /// this accumulator computes here, in increasing order, with the
    /// parameters' gradients released before each call; then leaves in every
    /// parameter of `params` the gradient `(Σ partials) / microbatches`, the
    /// sum taken in the fixed tree over micro-batch indices, and returns the
    /// same mean of the scalars `run` returned (the mean over every
    /// micro-batch of the step, computed here or elsewhere).
    ///
    /// # Errors
    /// The first error of `run`; the accumulator's own (a micro-batch count it
    /// was not made for, a failed exchange).
    fn accumulate(
        &mut self,
        ctx: &ExecContext,
        params: &[Parameter],
        microbatches: usize,
        run: &mut MicroBatchFn<'_>,
    ) -> Result<f32, FinetuneError>;
}

/// The single-process [`Accumulator`]: every micro-batch here, one partial per
/// micro-batch kept (`microbatches ×` the parameters' size; the buffers are
/// made on the first step of a given shape and reused), summed in the fixed
/// tree. With one micro-batch it runs it and keeps its gradient as it is
/// (the tree of one partial, divided by 1, is the partial).
#[derive(Debug, Default)]
pub struct TreeAccumulator {
    microbatches: usize,
    width: usize,
    ops: Vec<(usize, usize)>,
    partials: Vec<f32>,
    mean: Vec<f32>,
}

impl TreeAccumulator {
    /// An accumulator (its buffers come with its first step).
    pub fn new() -> TreeAccumulator {
        TreeAccumulator::default()
    }
}

/// The flat width of `params`: every element and one scalar slot.
fn width(params: &[Parameter]) -> usize {
    params.iter().map(Parameter::numel).sum::<usize>() + 1
}

/// Copies every parameter's gradient (zeros where it has none) and `value`
/// into `out` (`width(params)` long), and releases the gradients.
pub fn take_gradients(
    params: &[Parameter],
    value: f32,
    out: &mut [f32],
) -> Result<(), FinetuneError> {
    let mut at = 0;
    for p in params {
        let dst = &mut out[at..at + p.numel()];
        match p.grad_view() {
            None => dst.fill(0.0),
            Some(g) => g.raw().copy_into(dst).map_err(AutogradError::from)?,
        }
        p.zero_grad();
        at += p.numel();
    }
    out[at] = value;
    Ok(())
}

/// Sets every parameter's gradient to its slice of `flat` (parameters in
/// order, row-major).
pub fn set_gradients(
    ctx: &ExecContext,
    params: &[Parameter],
    flat: &[f32],
) -> Result<(), FinetuneError> {
    let mut at = 0;
    for p in params {
        let g = ctx
            .from_slice(&p.shape(), &flat[at..at + p.numel()])
            .map_err(AutogradError::from)?;
        let v = p.tensor();
        v.zero_grad();
        // Backward from the leaf itself with seed `g`: its gradient becomes `g`.
        v.backward_with_grad(ctx, &g)?;
        at += p.numel();
    }
    Ok(())
}

impl Accumulator for TreeAccumulator {
    fn accumulate(
        &mut self,
        ctx: &ExecContext,
        params: &[Parameter],
        microbatches: usize,
        run: &mut MicroBatchFn<'_>,
    ) -> Result<f32, FinetuneError> {
        for p in params {
            p.zero_grad();
        }
        if microbatches == 1 {
            return run(ctx, 0);
        }
        let w = width(params);
        if self.microbatches != microbatches || self.width != w {
            self.ops.clear();
            tree_sum_ops(microbatches, 0, 0, 0, &mut self.ops);
            self.partials = vec![0.0; microbatches * w];
            self.mean = vec![0.0; w];
            (self.microbatches, self.width) = (microbatches, w);
        }
        for (m, part) in self.partials.chunks_mut(w).enumerate() {
            let value = run(ctx, m)?;
            take_gradients(params, value, part)?;
        }
        run_tree_sum(&mut self.partials, w, &self.ops, |i| i * w);
        tree_mean_from_sum(&mut self.mean, &self.partials[..w], microbatches);
        set_gradients(ctx, params, &self.mean[..w - 1])?;
        Ok(self.mean[w - 1])
    }
}
