//! One error type at the user level: `gradcheck` takes closures that return the
//! facade's `Error` (so a layer can be checked), and the closures of
//! `custom_vjp` can apply `?` to a layer's result.

use fucina::autograd::{AutogradError, CustomVjpArgs, GradcheckOptions, gradcheck};
use fucina::nn::{Block, Linear};
use fucina::{Error, ExecContext, Tensor, custom_vjp};

#[test]
fn gradcheck_of_a_linear_layer() -> fucina::Result<()> {
    let ctx = ExecContext::new();
    let lin = Linear::new(&ctx, 3, 4, 7)?;
    let x = ctx.from_slice(&[2, 3], &[0.1, -0.4, 0.9, 1.3, -1.1, 0.5])?;
    // The closure returns `fucina::Result<Tensor>`, and so does the check.
    let r = gradcheck(
        &ctx,
        |ctx, t| lin.forward(ctx, &t[0]),
        &[x],
        &GradcheckOptions::default(),
    )?;
    assert!(r.passed, "{r:?}");
    assert_eq!(r.checked, 6);
    Ok(())
}

#[test]
fn gradcheck_of_a_transformer_block() -> fucina::Result<()> {
    let ctx = ExecContext::new();
    let block = Block::new(&ctx, 8, 2, 0.0, 11)?;
    let values: Vec<f32> = (0..2 * 3 * 8)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 10.0)
        .collect();
    let x = ctx.from_slice(&[2, 3, 8], &values)?;
    let r = gradcheck(
        &ctx,
        |ctx, t| block.forward(ctx, &t[0])?.tanh(ctx).map_err(Error::from),
        &[x],
        &GradcheckOptions::default(),
    )?;
    assert!(r.passed, "{r:?}");
    assert_eq!(r.checked, 48);
    Ok(())
}

#[test]
fn a_layer_error_inside_gradcheck_is_the_layers_error() -> fucina::Result<()> {
    let ctx = ExecContext::new();
    let lin = Linear::new(&ctx, 3, 4, 7)?;
    // Rows of 2 features for a layer of 3: the layer's own error comes back.
    let x = ctx.from_slice(&[1, 2], &[0.1, 0.2])?;
    let err = gradcheck(
        &ctx,
        |ctx, t| lin.forward(ctx, &t[0]),
        &[x],
        &GradcheckOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    Ok(())
}

/// `y = lin(x)` through a custom op whose forward calls the layer (`?` on a
/// `fucina::Result` inside a closure returning `AutogradError`) and whose
/// backward is the layer's weight applied to the output gradient.
#[test]
fn custom_vjp_closures_can_call_layers() -> fucina::Result<()> {
    let ctx = ExecContext::new();
    let lin = Linear::no_bias(&ctx, 3, 2, 5)?;
    let w = lin.weight.tensor().raw().clone();
    let x = Tensor::variable_from_slice(&ctx, &[1, 3], &[0.5, -1.0, 2.0])?;
    let y = custom_vjp(
        &ctx,
        "linear_via_layer",
        &[&x],
        |ctx, xs| {
            let out = lin.forward(ctx, &Tensor::constant(xs[0].clone()))?;
            Ok(out.raw().clone())
        },
        move |ctx, a: &CustomVjpArgs<'_>| {
            let g = ctx.matmul(a.grad, &w)?;
            Ok(vec![Some(g)])
        },
    )?;
    let direct = lin.forward(&ctx, &x)?;
    assert_eq!(y.to_vec(), direct.to_vec());
    y.sum_all(&ctx)?.backward(&ctx)?;
    let via_custom = x.grad(&ctx)?.expect("x is a variable").to_vec();
    x.zero_grad();
    direct.sum_all(&ctx)?.backward(&ctx)?;
    let via_layer = x.grad(&ctx)?.expect("x is a variable").to_vec();
    assert_eq!(via_custom, via_layer);

    // A facade error raised inside the forward reaches the caller whole.
    let bad = Tensor::variable_from_slice(&ctx, &[1, 2], &[0.5, -1.0])?;
    let err = custom_vjp(
        &ctx,
        "linear_via_layer",
        &[&bad],
        |ctx, xs| {
            Ok(lin
                .forward(ctx, &Tensor::constant(xs[0].clone()))?
                .raw()
                .clone())
        },
        |_, _| Ok(vec![None]),
    )
    .unwrap_err();
    let shown = err.to_string();
    assert!(matches!(err, AutogradError::External(_)), "{err:?}");
    assert!(shown.contains("Linear"), "{shown}");
    let back = Error::from(err);
    assert_eq!(back.to_string(), shown);
    Ok(())
}
