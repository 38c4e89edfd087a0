//! Group normalization (PyTorch's `group_norm`) with its input, weight and
//! bias gradients.

use fucina_exec::{ExecContext, GroupNormOptions};

use crate::error::Result;
use crate::record::{grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// Group normalization of `self` (`[N, C, *]`, rank at least 2): the `C`
    /// channels form `opts.num_groups` groups of consecutive channels, each
    /// (sample, group) is normalized with its mean and biased variance, then
    /// scaled by `weight` and shifted by `bias` (each `[C]`, optional):
    /// PyTorch's `torch.nn.functional.group_norm(x, num_groups, weight, bias,
    /// eps)`. See [`ExecContext::group_norm`] for the definition and the
    /// determinism promise; the gradients of the input, the weight and the bias
    /// are recorded (the node keeps the input and the weight).
    ///
    /// ```
    /// use fucina_autograd::{GroupNormOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 4, 2], &[1., 2., 3., 4., 5., 6., 7., 8.])?;
    /// let w = Tensor::ones(&ctx, &[4])?.into_variable();
    /// let b = Tensor::zeros(&ctx, &[4])?.into_variable();
    /// let y = x.group_norm(&ctx, Some(&w), Some(&b), GroupNormOptions::new(2))?;
    /// assert_eq!(y.shape(), &[1, 4, 2]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(b.grad(&ctx)?.expect("a variable").to_vec(), [2., 2., 2., 2.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::group_norm`]: rank below 2, a `num_groups` of 0 or
    /// one that does not divide `C`, a weight or bias not of shape `[C]`, a bad
    /// `eps`; out of memory.
    pub fn group_norm(
        &self,
        ctx: &ExecContext,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        opts: GroupNormOptions,
    ) -> Result<Tensor> {
        let out = ctx.group_norm(
            &self.raw,
            weight.map(|w| &w.raw),
            bias.map(|b| &b.raw),
            opts,
        )?;
        let mut inputs = [self; 3];
        let mut count = 1;
        for p in [weight, bias].into_iter().flatten() {
            inputs[count] = p;
            count += 1;
        }
        let (x, w) = (self.raw.clone(), weight.map(|w| w.raw.clone()));
        record!(
            ctx,
            "group_norm",
            out,
            &inputs[..count],
            GroupNorm {
                x,
                weight: w,
                opts,
                bias: bias.is_some(),
            },
            |ctx, g, needs| {
                // needs: [x, weight if present, bias if present].
                let has_w = weight.is_some();
                let need_w = has_w && needs[1];
                let need_b = *bias && needs[1 + usize::from(has_w)];
                let [gx, gw, gb] = ctx.group_norm_backward(
                    x,
                    weight.as_ref(),
                    g,
                    *opts,
                    [needs[0], need_w, need_b],
                )?;
                Ok(match (has_w, *bias) {
                    (true, true) => grads![gx, gw, gb],
                    (true, false) => grads![gx, gw],
                    (false, true) => grads![gx, gb],
                    (false, false) => grads![gx],
                })
            }
        )
    }
}
