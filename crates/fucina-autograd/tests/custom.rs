//! `custom_vjp`: user ops inside and outside scopes, checked against finite
//! differences, and the errors of a wrong backward.

mod support;

use fucina_autograd::exec::{ExecContext, RawTensor};
use fucina_autograd::{AutogradError, CustomVjpArgs, Grads, Tensor, custom_vjp, no_grad};
use support::{check, values};

/// `a * b` with broadcasting, written as a custom op with its own backward
/// (gradients reduced to each operand shape by hand through a broadcast sum).
fn custom_mul(ctx: &ExecContext, a: &Tensor, b: &Tensor) -> Result<Tensor, AutogradError> {
    custom_vjp(
        ctx,
        "custom_mul",
        &[a, b],
        |ctx, x| Ok(ctx.mul(&x[0], &x[1])?),
        |ctx, args: &CustomVjpArgs<'_>| {
            let mut out: Grads = Vec::new();
            for (i, other) in [(0usize, 1usize), (1, 0)] {
                if !args.needs[i] {
                    out.push(None);
                    continue;
                }
                let full = ctx.mul(args.grad, &args.inputs[other])?;
                out.push(Some(reduce(ctx, &full, args.inputs[i].shape())?));
            }
            Ok(out)
        },
    )
}

/// Sums `g` down to `shape` (leading or size-1 broadcast axes), by a plain loop.
fn reduce(ctx: &ExecContext, g: &RawTensor, shape: &[usize]) -> Result<RawTensor, AutogradError> {
    let gv = g.to_vec();
    let mut acc = vec![0f32; shape.iter().product()];
    let gs = g.shape();
    let lead = gs.len() - shape.len();
    for (k, v) in gv.iter().enumerate() {
        let mut rem = k;
        let mut idx = vec![0; gs.len()];
        for ax in (0..gs.len()).rev() {
            idx[ax] = rem % gs[ax];
            rem /= gs[ax];
        }
        let mut o = 0;
        for (ax, &d) in shape.iter().enumerate() {
            o = o * d + if d == 1 { 0 } else { idx[lead + ax] };
        }
        acc[o] += v;
    }
    Ok(ctx.from_slice(shape, &acc)?)
}

#[test]
fn custom_op_passes_gradcheck_with_broadcasting() {
    let ctx = ExecContext::new();
    let a = ctx.from_slice(&[2, 3], &values(6, 1, -2.0, 2.0)).unwrap();
    let b = ctx.from_slice(&[3], &values(3, 2, -2.0, 2.0)).unwrap();
    check(
        &ctx,
        "custom_mul",
        |c, t| custom_mul(c, &t[0], &t[1])?.tanh(c),
        &[a, b],
    );
}

#[test]
fn custom_op_under_a_scope_and_outside() -> Result<(), AutogradError> {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    let c = Tensor::from_slice(&ctx, &[3], &[2., 2., 2.])?;
    let base = ctx.outstanding_buffers();
    // Outside: caller-owned.
    let y = custom_mul(&ctx, &w, &c)?;
    assert!(!y.is_scope_owned() && y.requires_grad());
    assert_eq!(y.op_name(), Some("custom_mul"));
    y.sum_all(&ctx)?.backward(&ctx)?;
    assert_eq!(w.grad(&ctx)?.unwrap().to_vec(), [2., 2., 2.]);
    w.zero_grad();
    drop(y);
    assert_eq!(ctx.outstanding_buffers(), base);
    // Inside: adopted, released at close.
    let scope = ctx.open_exec_scope();
    let y = custom_mul(&ctx, &w, &c)?;
    assert!(y.is_scope_owned());
    assert_eq!(ctx.exec_scope_len(), 1);
    y.sum_all(&ctx)?.backward(&ctx)?;
    drop(y);
    ctx.close_exec_scope(scope);
    assert_eq!(w.grad(&ctx)?.unwrap().to_vec(), [2., 2., 2.]);
    w.zero_grad();
    assert_eq!(ctx.outstanding_buffers(), base);
    Ok(())
}

#[test]
fn needs_marks_constant_inputs_and_no_grad_records_nothing() -> Result<(), AutogradError> {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let c = Tensor::from_slice(&ctx, &[2], &[3., 4.])?;
    let y = custom_vjp(
        &ctx,
        "probe",
        &[&c, &w],
        |ctx, x| Ok(ctx.add(&x[0], &x[1])?),
        |_, a| {
            assert_eq!(a.needs, [false, true]);
            Ok(vec![None, Some(a.grad.clone())])
        },
    )?;
    y.sum_all(&ctx)?.backward(&ctx)?;
    assert_eq!(w.grad(&ctx)?.unwrap().to_vec(), [1., 1.]);
    let _g = no_grad();
    let z = custom_vjp(
        &ctx,
        "probe",
        &[&w],
        |_, x| Ok(x[0].clone()),
        // A backward that never returns names its gradients' type.
        |_, _| -> Result<Grads, AutogradError> { unreachable!() },
    )?;
    assert!(!z.requires_grad());
    Ok(())
}

#[test]
fn a_wrong_backward_is_an_error() -> Result<(), AutogradError> {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let too_few = custom_vjp(
        &ctx,
        "too_few",
        &[&w, &w],
        |_, x| Ok(x[0].clone()),
        |_, a| Ok(vec![Some(a.grad.clone())]),
    )?;
    assert_eq!(
        too_few.sum_all(&ctx)?.backward(&ctx),
        Err(AutogradError::GradientCountMismatch {
            op: "too_few",
            expected: 2,
            got: 1
        })
    );
    let bad_shape = custom_vjp(
        &ctx,
        "bad_shape",
        &[&w],
        |_, x| Ok(x[0].clone()),
        |ctx, _| Ok(vec![Some(ctx.ones(&[3])?)]),
    )?;
    assert!(matches!(
        bad_shape.sum_all(&ctx)?.backward(&ctx),
        Err(AutogradError::GradientShapeMismatch {
            op: "bad_shape",
            ..
        })
    ));
    // Nothing was accumulated by the failed backwards.
    assert!(w.grad(&ctx)?.is_none());
    Ok(())
}
