//! Losses: `cross_entropy` (fused log-softmax and negative log-likelihood),
//! `nll_loss`, `mse_loss`, and their backward kernels.
//!
//! All three average over the batch (PyTorch's default `reduction = "mean"`);
//! there is no `ignore_index` and no class weighting. Labels are validated before
//! any work: a label outside `0..C` is [`ExecError::IndexOutOfBounds`].

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::reduce::{sum, sum_map2};
use crate::kernels::simd::vectorized;
use crate::kernels::{prefetch, rowwise};
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, check_shape};

/// Checks the shapes `[N, C]` of scores and `[N]` of labels; returns `(N, C)`.
fn label_shapes(
    op: &'static str,
    scores: &[usize],
    labels: &[usize],
) -> Result<(usize, usize), ExecError> {
    check_shape(op, labels)?;
    let &[n, c] = scores else {
        return Err(ExecError::InvalidShape {
            op,
            shape: Dims::new(scores),
            reason: "the scores must have shape [N, C]",
        });
    };
    check_shape(op, scores)?;
    if labels != [n] {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: Dims::new(scores),
            rhs: Dims::new(labels),
            reason: "the labels must have shape [N] for scores of shape [N, C]",
        });
    }
    Ok((n, c))
}

/// Checks `[N, C]` scores against `[N]` labels with values in `0..C`; returns
/// `(N, C)` and the contiguous labels.
fn check_labels(
    ctx: &ExecContext,
    op: &'static str,
    scores: &RawTensor,
    labels: &RawTensor<i64>,
) -> Result<(usize, usize, RawTensor<i64>), ExecError> {
    let (n, c) = label_shapes(op, scores.shape(), labels.shape())?;
    // Validate the values without allocating (read through the strides).
    let ls: &[i64] = labels.buffer();
    let mut bad = None;
    labels.layout().for_each_index(|i| {
        let l = ls[i];
        if bad.is_none() && !(0..c as i64).contains(&l) {
            bad = Some(l);
        }
    });
    if let Some(index) = bad {
        return Err(ExecError::IndexOutOfBounds {
            op,
            index,
            bound: c,
        });
    }
    Ok((n, c, ctx.contiguous(labels)?))
}

impl ExecContext {
    /// The per-row cross-entropy terms of `logits [N, C]` against class `labels
    /// [N]`: `logsumexp(row) - row[label]` (PyTorch's `reduction = "none"`), shape
    /// `[N]`. Each term depends only on its row.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `logits` is not rank 2;
    /// [`ExecError::ShapeMismatch`] if `labels` is not of shape `[N]`;
    /// [`ExecError::IndexOutOfBounds`] for a label outside `0..C`;
    /// [`ExecError::OutOfMemory`].
    pub fn cross_entropy_per_row(
        &self,
        logits: &RawTensor,
        labels: &RawTensor<i64>,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "cross_entropy";
        let (n, c, lab) = check_labels(self, OP, logits, labels)?;
        let xc = self.contiguous(logits)?;
        let (xs, ls) = (xc.contiguous_slice(), lab.contiguous_slice());
        self.new_tensor(OP, &[n], |out| {
            self.par_rows(out, 1, c * 8, |rows, o| {
                let end = rows.end;
                vectorized!(for (r, v) in rows.zip(o.iter_mut()) {
                    prefetch::next_row(xs, r + 1, end, c);
                    let row = &xs[r * c..][..c];
                    *v = rowwise::logsumexp(row) - row[ls[r] as usize];
                })
            });
        })
    }

    /// The cross-entropy loss of `logits [N, C]` against class `labels [N]`, averaged
    /// over the batch (PyTorch's `cross_entropy` with `reduction = "mean"`), shape
    /// `[1]`. Fused and stable: each row's term is `logsumexp(row) - row[label]`
    /// with the row max subtracted inside the log-sum-exp; the `N` terms are summed
    /// in the fixed pairwise order of the reductions and divided by `N`.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let logits = ctx.from_slice(&[2, 2], &[0., 0., 1000., 0.])?;
    /// let labels = ctx.from_slice_typed::<i64>(&[2], &[1, 0])?;
    /// let loss = ctx.cross_entropy(&logits, &labels)?.item()?;
    /// assert!((loss - std::f32::consts::LN_2 / 2.0).abs() < 1e-6);
    /// let bad = ctx.from_slice_typed::<i64>(&[2], &[1, 2])?;
    /// assert!(ctx.cross_entropy(&logits, &bad).is_err());
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`cross_entropy_per_row`](ExecContext::cross_entropy_per_row).
    pub fn cross_entropy(
        &self,
        logits: &RawTensor,
        labels: &RawTensor<i64>,
    ) -> Result<RawTensor, ExecError> {
        let terms = self.cross_entropy_per_row(logits, labels)?;
        self.mean_of_terms("cross_entropy", &terms)
    }

    /// `[1]` holding the fixed-order mean of the contiguous `terms`.
    fn mean_of_terms(&self, op: &'static str, terms: &RawTensor) -> Result<RawTensor, ExecError> {
        let ts = terms.contiguous_slice();
        let s = self.full_sum(op, ts.len(), |r| vectorized!(sum(&ts[r])))?;
        let m = s / ts.len() as f32;
        self.new_tensor(op, &[1], |o| o[0] = m)
    }

    /// The gradient of [`cross_entropy`](ExecContext::cross_entropy) with respect to
    /// the logits, for the loss gradient `grad` (a scalar):
    /// `grad_logits = (softmax(logits) - onehot(labels)) * grad / N`, shape `[N, C]`.
    ///
    /// # Errors
    /// As [`cross_entropy`](ExecContext::cross_entropy).
    pub fn cross_entropy_backward(
        &self,
        logits: &RawTensor,
        labels: &RawTensor<i64>,
        grad: f32,
    ) -> Result<RawTensor, ExecError> {
        let n = logits.shape().first().copied().unwrap_or(0);
        self.ce_backward(
            "cross_entropy_backward",
            logits,
            labels,
            grad / n.max(1) as f32,
        )
    }

    /// `(softmax(logits) - onehot(labels)) * s`, shape `[N, C]`: the gradient
    /// of the rows of a larger batch's mean cross-entropy, for `s` the loss
    /// gradient divided by that batch's row count (what
    /// [`cross_entropy_backward`](ExecContext::cross_entropy_backward)
    /// computes with `s = grad / N`, the same bits row for row). Lets a
    /// caller compute a large batch's logits and their gradient a block of
    /// rows at a time.
    ///
    /// # Errors
    /// As [`cross_entropy`](ExecContext::cross_entropy).
    pub fn cross_entropy_backward_scaled(
        &self,
        logits: &RawTensor,
        labels: &RawTensor<i64>,
        s: f32,
    ) -> Result<RawTensor, ExecError> {
        self.ce_backward("cross_entropy_backward_scaled", logits, labels, s)
    }

    fn ce_backward(
        &self,
        op: &'static str,
        logits: &RawTensor,
        labels: &RawTensor<i64>,
        s: f32,
    ) -> Result<RawTensor, ExecError> {
        let (n, c, lab) = check_labels(self, op, logits, labels)?;
        let xc = self.contiguous(logits)?;
        let (xs, ls) = (xc.contiguous_slice(), lab.contiguous_slice());
        self.new_tensor(op, &[n, c], |out| {
            self.par_rows(out, c, c * 8, |rows, o| {
                let end = rows.end;
                vectorized!(for (r, orow) in rows.zip(o.chunks_exact_mut(c)) {
                    prefetch::next_row(xs, r + 1, end, c);
                    // (softmax - onehot) * s, with s folded into the softmax's
                    // normalization pass (one pass over the row fewer).
                    rowwise::softmax_scaled(&xs[r * c..][..c], orow, s);
                    orow[ls[r] as usize] -= s;
                })
            });
        })
    }

    /// The negative log-likelihood loss of `log_probs [N, C]` (log-probabilities,
    /// e.g. a [`log_softmax`](ExecContext::log_softmax) output) against class
    /// `labels [N]`: `-mean(log_probs[i, labels[i]])`, shape `[1]`.
    ///
    /// # Errors
    /// As [`cross_entropy`](ExecContext::cross_entropy).
    pub fn nll_loss(
        &self,
        log_probs: &RawTensor,
        labels: &RawTensor<i64>,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "nll_loss";
        let (n, _, lab) = check_labels(self, OP, log_probs, labels)?;
        let ls = lab.contiguous_slice();
        let (lp, lay) = (log_probs.buffer(), *log_probs.layout());
        let (s0, s1) = (lay.strides()[0], lay.strides()[1]);
        let picked = self.new_tensor(OP, &[n], |o| {
            for (i, v) in o.iter_mut().enumerate() {
                *v = -lp[lay.offset() + i * s0 + ls[i] as usize * s1];
            }
        })?;
        self.mean_of_terms(OP, &picked)
    }

    /// The gradient of [`nll_loss`](ExecContext::nll_loss) with respect to
    /// `log_probs`, for the loss gradient `grad`: `-grad / N` at `[i, labels[i]]`,
    /// zero elsewhere; shape `[N, C]` (`log_probs` gives the shape).
    ///
    /// # Errors
    /// As [`nll_loss`](ExecContext::nll_loss).
    pub fn nll_loss_backward(
        &self,
        log_probs: &RawTensor,
        labels: &RawTensor<i64>,
        grad: f32,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "nll_loss_backward";
        let (n, c, lab) = check_labels(self, OP, log_probs, labels)?;
        let ls = lab.contiguous_slice();
        let g = -grad / n as f32;
        self.new_tensor(OP, &[n, c], |out| {
            self.par_rows(out, c, c, |rows, o| {
                for (r, orow) in rows.zip(o.chunks_exact_mut(c)) {
                    orow.fill(0.0);
                    orow[ls[r] as usize] = g;
                }
            });
        })
    }

    /// The mean squared error `mean((a - b)^2)` over every element, shape `[1]`
    /// (PyTorch's `mse_loss` with `reduction = "mean"`; no broadcasting: the shapes
    /// must be equal).
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`] if the shapes differ; [`ExecError::OutOfMemory`].
    pub fn mse_loss(&self, a: &RawTensor, b: &RawTensor) -> Result<RawTensor, ExecError> {
        const OP: &str = "mse_loss";
        check_same_shape(OP, a, b)?;
        let (ac, bc) = (self.contiguous(a)?, self.contiguous(b)?);
        let (xs, ys) = (ac.contiguous_slice(), bc.contiguous_slice());
        let s = self.full_sum(OP, xs.len(), |r| {
            vectorized!(sum_map2(&xs[r.clone()], &ys[r.clone()], |u, v| {
                let d = u - v;
                d * d
            }))
        })?;
        let m = s / xs.len() as f32;
        self.new_tensor(OP, &[1], |o| o[0] = m)
    }

    /// The gradients of [`mse_loss`](ExecContext::mse_loss) for the loss gradient
    /// `grad`: `grad_a = 2 * (a - b) * grad / numel` and `grad_b = -grad_a`.
    ///
    /// # Errors
    /// As [`mse_loss`](ExecContext::mse_loss).
    pub fn mse_loss_backward(
        &self,
        a: &RawTensor,
        b: &RawTensor,
        grad: f32,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        const OP: &str = "mse_loss_backward";
        check_same_shape(OP, a, b)?;
        let (ac, bc) = (self.contiguous(a)?, self.contiguous(b)?);
        let (xs, ys) = (ac.contiguous_slice(), bc.contiguous_slice());
        let s = 2.0 * grad / xs.len() as f32;
        let ga = self.new_tensor(OP, a.shape(), |out| {
            self.par_rows(out, 1, 1, |r, o| {
                vectorized!(for ((v, &u), &w) in
                    o.iter_mut().zip(&xs[r.clone()]).zip(&ys[r.clone()])
                {
                    *v = (u - w) * s;
                })
            });
        })?;
        let gas = ga.contiguous_slice();
        let gb = self.new_tensor(OP, a.shape(), |out| {
            self.par_rows(out, 1, 1, |r, o| {
                vectorized!(for (v, &g) in o.iter_mut().zip(&gas[r.clone()]) {
                    *v = -g;
                })
            });
        })?;
        Ok((ga, gb))
    }
}

/// The descriptor of the classification losses (`cross_entropy`, `nll_loss`:
/// scores `[N, C]` against class labels `[N]`, averaged over the batch): one
/// variant per op, naming its forward kernel ([`ExecContext::class_loss`]) and
/// its backward kernel ([`ExecContext::class_loss_backward`]). The named methods
/// run the same kernels; the autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClassLoss {
    /// [`ExecContext::cross_entropy`] (the scores are logits).
    CrossEntropy,
    /// [`ExecContext::nll_loss`] (the scores are log-probabilities).
    NllLoss,
}

impl ClassLoss {
    /// Every classification loss, in declaration order.
    pub const ALL: &'static [ClassLoss] = &[ClassLoss::CrossEntropy, ClassLoss::NllLoss];

    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            ClassLoss::CrossEntropy => "cross_entropy",
            ClassLoss::NllLoss => "nll_loss",
        }
    }

    /// The name of the op's backward kernel.
    pub fn backward_name(self) -> &'static str {
        match self {
            ClassLoss::CrossEntropy => "cross_entropy_backward",
            ClassLoss::NllLoss => "nll_loss_backward",
        }
    }

    /// The shape of the loss for scores of shape `scores` (`[N, C]`) and labels of
    /// shape `labels` (`[N]`): `[1]`, the batch mean. The labels' values are not
    /// needed (nor checked).
    ///
    /// # Errors
    /// The shape errors of the op's forward: [`ExecError::InvalidShape`] unless
    /// the scores are rank 2 (or for a shape no tensor can have),
    /// [`ExecError::ShapeMismatch`] unless the labels are `[N]`.
    pub fn out_shape(self, scores: &[usize], labels: &[usize]) -> Result<Dims, ExecError> {
        label_shapes(self.name(), scores, labels)?;
        Ok(Dims::new(&[1]))
    }
}

/// The descriptor of the losses between two tensors of one shape (`mse_loss`;
/// averaged over every element): one variant per op, naming its forward kernel
/// ([`ExecContext::regression_loss`]) and its backward kernel
/// ([`ExecContext::regression_loss_backward`]). The named method runs the same
/// kernels; the autograd layer records the variant in its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RegressionLoss {
    /// [`ExecContext::mse_loss`].
    Mse,
}

impl RegressionLoss {
    /// Every regression loss, in declaration order.
    pub const ALL: &'static [RegressionLoss] = &[RegressionLoss::Mse];

    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            RegressionLoss::Mse => "mse_loss",
        }
    }

    /// The name of the op's backward kernel.
    pub fn backward_name(self) -> &'static str {
        match self {
            RegressionLoss::Mse => "mse_loss_backward",
        }
    }

    /// The shape of the loss between operands of shapes `a` and `b`: `[1]`, the
    /// mean over every element.
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`] unless the shapes are equal (no
    /// broadcasting); [`ExecError::InvalidShape`] for a shape no tensor can have.
    pub fn out_shape(self, a: &[usize], b: &[usize]) -> Result<Dims, ExecError> {
        same_shape(self.name(), a, b)?;
        Ok(Dims::new(&[1]))
    }
}

impl ExecContext {
    /// Runs the forward kernel of the classification loss `op` (the same kernel,
    /// and the same bits, as the op's named method).
    ///
    /// # Errors
    /// As [`cross_entropy`](ExecContext::cross_entropy).
    pub fn class_loss(
        &self,
        op: ClassLoss,
        scores: &RawTensor,
        labels: &RawTensor<i64>,
    ) -> Result<RawTensor, ExecError> {
        match op {
            ClassLoss::CrossEntropy => self.cross_entropy(scores, labels),
            ClassLoss::NllLoss => self.nll_loss(scores, labels),
        }
    }

    /// Runs the backward kernel of the classification loss `op`: the scores'
    /// gradient for the loss gradient `grad`.
    ///
    /// # Errors
    /// As [`cross_entropy`](ExecContext::cross_entropy).
    pub fn class_loss_backward(
        &self,
        op: ClassLoss,
        scores: &RawTensor,
        labels: &RawTensor<i64>,
        grad: f32,
    ) -> Result<RawTensor, ExecError> {
        match op {
            ClassLoss::CrossEntropy => self.cross_entropy_backward(scores, labels, grad),
            ClassLoss::NllLoss => self.nll_loss_backward(scores, labels, grad),
        }
    }

    /// Runs the forward kernel of the regression loss `op` (the same kernel, and
    /// the same bits, as the op's named method).
    ///
    /// # Errors
    /// As [`mse_loss`](ExecContext::mse_loss).
    pub fn regression_loss(
        &self,
        op: RegressionLoss,
        a: &RawTensor,
        b: &RawTensor,
    ) -> Result<RawTensor, ExecError> {
        match op {
            RegressionLoss::Mse => self.mse_loss(a, b),
        }
    }

    /// Runs the backward kernel of the regression loss `op`: the gradients of
    /// both operands for the loss gradient `grad`.
    ///
    /// # Errors
    /// As [`mse_loss`](ExecContext::mse_loss).
    pub fn regression_loss_backward(
        &self,
        op: RegressionLoss,
        a: &RawTensor,
        b: &RawTensor,
        grad: f32,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        match op {
            RegressionLoss::Mse => self.mse_loss_backward(a, b, grad),
        }
    }
}

fn check_same_shape(op: &'static str, a: &RawTensor, b: &RawTensor) -> Result<(), ExecError> {
    same_shape(op, a.shape(), b.shape())
}

fn same_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<(), ExecError> {
    check_shape(op, a)?;
    if a != b {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: Dims::new(a),
            rhs: Dims::new(b),
            reason: "the operands must have the same shape",
        });
    }
    Ok(())
}
