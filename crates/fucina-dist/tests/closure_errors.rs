//! The microbatch closures of `LocalDataParallel::step` (and
//! `DataParallel::step`, same bounds) may return the facade's `fucina::Error`,
//! so they call `fucina::nn` layers with `?`: the same bits as the autograd-
//! error closure over the layer's raw ops, and a layer's error comes back as
//! the step's error with its message.
// The autograd error carries inline shapes (no heap on the error path).

use fucina::nn::{Linear, Module, Parameter};
use fucina::{ExecContext, Tensor};
use fucina_dist::{DistError, LocalDataParallel};

fn input(ctx: &ExecContext, m: usize, features: usize) -> fucina::Result<Tensor> {
    Ok(Tensor::randn(ctx, &[3, features], 1.0, 70 + m as u64)?)
}

fn grads(ctx: &ExecContext, p: &[Parameter]) -> Vec<Vec<u32>> {
    p.iter()
        .map(|p| {
            let g = p.grad(ctx).unwrap().unwrap().to_vec();
            g.into_iter().map(f32::to_bits).collect()
        })
        .collect()
}

#[test]
fn a_closure_calling_a_layer_returns_the_facade_error() {
    let ctx = ExecContext::with_threads(1);
    // Through the layer: `Linear::forward` returns `fucina::Result`.
    let fc = Linear::new(&ctx, 4, 2, 3).unwrap();
    let mut dp = LocalDataParallel::new(fc.parameters(), 4).unwrap();
    let a = dp
        .step(&ctx, |ctx, _, m| -> fucina::Result<f32> {
            let y = fc.forward(ctx, &input(ctx, m, 4)?)?;
            let l = y.mul(ctx, &y)?.mean_all(ctx)?;
            l.backward(ctx)?;
            Ok(l.item()?)
        })
        .unwrap();
    // The same model by its raw ops, with an autograd-error closure.
    let twin = Linear::new(&ctx, 4, 2, 3).unwrap();
    let mut dp2 = LocalDataParallel::new(twin.parameters(), 4).unwrap();
    let b = dp2
        .step(&ctx, |ctx, p: &[Parameter], m| {
            let x = Tensor::randn(ctx, &[3, 4], 1.0, 70 + m as u64)?;
            let y = x.linear(ctx, &p[0].tensor(), Some(&p[1].tensor()))?;
            let l = y.mul(ctx, &y)?.mean_all(ctx)?;
            l.backward(ctx)?;
            l.item()
        })
        .unwrap();
    assert_eq!(a.value.to_bits(), b.value.to_bits());
    assert_eq!(grads(&ctx, dp.params()), grads(&ctx, dp2.params()));
}

#[test]
fn a_layer_error_in_the_closure_is_the_step_error() {
    let ctx = ExecContext::with_threads(1);
    let fc = Linear::new(&ctx, 4, 2, 3).unwrap();
    let mut dp = LocalDataParallel::new(fc.parameters(), 2).unwrap();
    // Rows of 5 features into `Linear(in = 4)`: the layer's shape error.
    let err = dp
        .step(&ctx, |ctx, _, m| -> fucina::Result<f32> {
            let y = fc.forward(ctx, &input(ctx, m, 5)?)?;
            Ok(y.mean_all(ctx)?.item()?)
        })
        .unwrap_err();
    let want = fc
        .forward(&ctx, &input(&ctx, 0, 5).unwrap())
        .unwrap_err()
        .to_string();
    assert!(matches!(err, DistError::Autograd(_)), "{err:?}");
    assert_eq!(err.to_string(), want);
    assert!(want.contains("[3, 5]"), "{want}");
}

#[test]
fn a_closure_may_return_a_dist_error() {
    let ctx = ExecContext::with_threads(1);
    let fc = Linear::new(&ctx, 4, 2, 3).unwrap();
    let mut dp = LocalDataParallel::new(fc.parameters(), 2).unwrap();
    let err = dp
        .step(&ctx, |_, _, m| -> fucina_dist::Result<f32> {
            Err(DistError::Config(format!("microbatch {m} refused")))
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: microbatch 0 refused"
    );
}
