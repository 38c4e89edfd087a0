//! `gradcheck`: the analytic gradient of a function against central finite
//! differences.

use fucina_exec::{ExecContext, RawTensor};

use crate::error::{AutogradError, Result};
use crate::grad_mode::no_grad;
use crate::tensor::Tensor;

/// Settings of [`gradcheck`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradcheckOptions {
    /// The perturbation of each input element (the forward runs in f32, so much
    /// smaller steps drown in rounding).
    pub eps: f32,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance (of the numeric derivative's magnitude).
    pub rtol: f64,
    /// Seed of the fixed random projection that turns a non-scalar output into a
    /// scalar objective.
    pub seed: u64,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-3,
            atol: 2e-3,
            rtol: 2e-2,
            seed: 0x5eed,
        }
    }
}

/// The worst element of a [`gradcheck`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradcheckMismatch {
    /// Which input.
    pub input: usize,
    /// The element of that input, in logical row-major order.
    pub index: usize,
    /// The backward's derivative.
    pub analytic: f64,
    /// The central finite difference.
    pub numeric: f64,
}

/// The outcome of a [`gradcheck`].
#[derive(Debug, Clone, PartialEq)]
pub struct GradcheckResult {
    /// Whether every element was within `atol + rtol * |numeric|`.
    pub passed: bool,
    /// The largest `|analytic - numeric|`.
    pub max_abs_error: f64,
    /// The element with the largest error relative to its tolerance.
    pub worst: Option<GradcheckMismatch>,
    /// How many derivatives were compared.
    pub checked: usize,
}

/// Compares the gradient that backward computes for `f` at `inputs` with central
/// finite differences.
///
/// Every input becomes a variable (over the given raw tensor, with its layout:
/// non-contiguous views are checked as such) and `f` runs once with gradients;
/// its output `y` (any shape) is reduced to the objective `J = sum_k w_k y_k` with
/// fixed pseudo-random weights `w_k` in `[0.5, 1.5)`, and backward is seeded with
/// `w`. Then, for every input element, `f` runs twice more under
/// [`no_grad`](crate::no_grad) at `x ± eps`, and `J` is accumulated in f64 to get
/// `(J(x + eps) - J(x - eps)) / 2 eps`.
///
/// ```
/// use fucina_autograd::{GradcheckOptions, Tensor, gradcheck};
/// use fucina_autograd::exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let x = ctx.from_slice(&[2, 3], &[0.1, -0.4, 0.9, 1.3, -1.1, 0.5])?;
/// let b = ctx.from_slice(&[3], &[0.3, 0.2, -0.7])?;
/// let r = gradcheck(&ctx, |ctx, t| t[0].mul(ctx, &t[1])?.tanh(ctx), &[x, b],
///                   &GradcheckOptions::default())?;
/// assert!(r.passed, "{r:?}");
/// # Ok::<(), fucina_autograd::AutogradError>(())
/// ```
///
/// `f` may return any error type that an [`AutogradError`] converts into (the
/// errors of gradcheck itself are converted to it): a closure over a layer of
/// the `fucina` facade returns `fucina::Error`, and so does the check. When `f`
/// ends with `Ok(..)` rather than a call, name the error type, for example
/// `gradcheck::<_, AutogradError>(..)`.
///
/// # Errors
/// Any error of `f` or of backward.
pub fn gradcheck<F, E>(
    ctx: &ExecContext,
    f: F,
    inputs: &[RawTensor],
    opts: &GradcheckOptions,
) -> Result<GradcheckResult, E>
where
    F: Fn(&ExecContext, &[Tensor]) -> Result<Tensor, E>,
    E: From<AutogradError>,
{
    // Analytic pass.
    let vars: Vec<Tensor> = inputs
        .iter()
        .map(|r| Tensor::constant(r.clone()).into_variable())
        .collect();
    let y = f(ctx, &vars)?;
    let weights: Vec<f32> = (0..y.numel() as u64)
        .map(|i| {
            let u = (fucina_exec::rng::at(opts.seed, i) >> 40) as f32 / (1u64 << 24) as f32;
            0.5 + u
        })
        .collect();
    let seed = ctx
        .from_slice(y.shape(), &weights)
        .map_err(AutogradError::from)?;
    y.backward_with_grad(ctx, &seed)?;
    drop((y, seed));
    let analytic: Vec<Vec<f32>> = vars
        .iter()
        .map(|v| {
            Ok(match v.grad(ctx)? {
                Some(g) => g.to_vec(),
                None => vec![0.0; v.numel()],
            })
        })
        .collect::<Result<_>>()?;
    drop(vars);

    // Numeric pass, without recording.
    let _guard = no_grad();
    let objective = |xs: &[Tensor]| -> Result<f64, E> {
        let y = f(ctx, xs)?;
        Ok(y.to_vec()
            .iter()
            .zip(&weights)
            .map(|(&v, &w)| f64::from(v) * f64::from(w))
            .sum())
    };
    let mut consts: Vec<Tensor> = inputs.iter().map(|r| Tensor::constant(r.clone())).collect();
    let mut result = GradcheckResult {
        passed: true,
        max_abs_error: 0.0,
        worst: None,
        checked: 0,
    };
    let mut worst_ratio = -1.0f64;
    for (i, input) in inputs.iter().enumerate() {
        let base = input.to_vec();
        let mut values = base.clone();
        for j in 0..base.len() {
            values[j] = base[j] + opts.eps;
            let plus_x = ctx
                .from_slice(input.shape(), &values)
                .map_err(AutogradError::from)?;
            let h_plus = f64::from(values[j]) - f64::from(base[j]);
            consts[i] = Tensor::constant(plus_x);
            let plus = objective(&consts)?;
            values[j] = base[j] - opts.eps;
            let h_minus = f64::from(base[j]) - f64::from(values[j]);
            let minus_x = ctx
                .from_slice(input.shape(), &values)
                .map_err(AutogradError::from)?;
            consts[i] = Tensor::constant(minus_x);
            let minus = objective(&consts)?;
            values[j] = base[j];
            // The perturbations actually applied (after f32 rounding).
            let numeric = (plus - minus) / (h_plus + h_minus);
            let a = f64::from(analytic[i][j]);
            let err = (a - numeric).abs();
            let tol = opts.atol + opts.rtol * numeric.abs();
            if err.is_nan() || err > tol {
                result.passed = false;
            }
            result.max_abs_error = result.max_abs_error.max(err);
            let ratio = if err.is_nan() {
                f64::INFINITY
            } else {
                err / tol
            };
            if ratio > worst_ratio {
                worst_ratio = ratio;
                result.worst = Some(GradcheckMismatch {
                    input: i,
                    index: j,
                    analytic: a,
                    numeric,
                });
            }
            result.checked += 1;
        }
        consts[i] = Tensor::constant(input.clone());
    }
    Ok(result)
}
