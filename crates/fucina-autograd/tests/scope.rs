//! Exec-scope adoption and the memory behaviour it implies: drop-as-you-go keeps a
//! chain's working set at two buffers, a held scope keeps every intermediate until
//! it closes.

use fucina_autograd::exec::{ExecContext, ExecError};
use fucina_autograd::{AutogradError, Tensor, no_grad};

type R = Result<(), AutogradError>;

const CHAIN: usize = 16;

/// Runs a 16-op chain of same-shaped ops, dropping each intermediate as soon as
/// the next exists; returns the peak of outstanding pooled buffers above `base`.
fn chain_peak(ctx: &ExecContext, x0: &Tensor, c: &Tensor, base: usize) -> R2 {
    let mut x = x0.add(ctx, c)?;
    let mut peak = ctx.outstanding_buffers() - base;
    for _ in 1..CHAIN {
        let next = x.add(ctx, c)?;
        peak = peak.max(ctx.outstanding_buffers() - base);
        x = next; // the old intermediate drops here
    }
    Ok((peak, x))
}
type R2 = Result<(usize, Tensor), AutogradError>;

#[test]
fn unscoped_chain_recycles_two_buffers() -> R {
    let ctx = ExecContext::new();
    for variable in [false, true] {
        let x0 = Tensor::from_slice(&ctx, &[64], &[1.0; 64])?;
        let x0 = if variable { x0.into_variable() } else { x0 };
        let c = Tensor::from_slice(&ctx, &[64], &[0.5; 64])?;
        let base = ctx.outstanding_buffers();
        let (peak, x) = chain_peak(&ctx, &x0, &c, base)?;
        assert!(
            peak <= 2,
            "peak {peak} buffers above baseline (variable: {variable})"
        );
        assert_eq!(x.to_vec()[0], 1.0 + 0.5 * CHAIN as f32);
        if variable {
            x.sum_all(&ctx)?.backward(&ctx)?;
            assert_eq!(x0.grad(&ctx)?.unwrap().to_vec(), [1.0; 64]);
            x0.zero_grad();
        }
        drop(x);
        assert_eq!(ctx.outstanding_buffers(), base);
    }
    Ok(())
}

#[test]
fn one_scope_holds_all_sixteen_until_close() -> R {
    let ctx = ExecContext::new();
    let x0 = Tensor::variable_from_slice(&ctx, &[64], &[1.0; 64])?;
    let c = Tensor::from_slice(&ctx, &[64], &[0.5; 64])?;
    let base = ctx.outstanding_buffers();
    let scope = ctx.open_exec_scope();
    let (peak, x) = chain_peak(&ctx, &x0, &c, base)?;
    assert_eq!(peak, CHAIN);
    assert!(x.is_scope_owned());
    drop(x); // the scope still owns every intermediate
    assert_eq!(ctx.outstanding_buffers(), base + CHAIN);
    assert_eq!(ctx.exec_scope_len(), CHAIN);
    ctx.close_exec_scope(scope);
    assert_eq!(ctx.outstanding_buffers(), base);
    assert_eq!(ctx.exec_scope_len(), 0);
    Ok(())
}

#[test]
fn nested_scopes_release_only_their_suffix() -> R {
    let ctx = ExecContext::new();
    let x = Tensor::variable_from_slice(&ctx, &[8], &[2.0; 8])?;
    let base = ctx.outstanding_buffers();
    let outer = ctx.open_exec_scope();
    let a = x.scale(&ctx, 2.0)?;
    let b = a.exp(&ctx)?;
    let inner = ctx.open_exec_scope();
    for _ in 0..5 {
        let _ = b.add_scalar(&ctx, 1.0)?;
    }
    assert_eq!(ctx.outstanding_buffers(), base + 7);
    ctx.close_exec_scope(inner);
    assert_eq!(ctx.outstanding_buffers(), base + 2);
    // The outer values are intact and their graph still works.
    b.sum_all(&ctx)?.backward(&ctx)?;
    let g = x.grad(&ctx)?.unwrap().to_vec();
    assert!((g[0] - 2.0 * 4f32.exp()).abs() < 1e-3);
    drop((a, b, g));
    // The loss of the backward above is adopted by the outer scope too.
    assert_eq!(ctx.outstanding_buffers(), base + 3 + 1);
    ctx.close_exec_scope(outer);
    // Only x's gradient (caller-owned) remains.
    assert_eq!(ctx.outstanding_buffers(), base + 1);
    x.zero_grad();
    assert_eq!(ctx.outstanding_buffers(), base);
    Ok(())
}

#[test]
fn training_step_under_a_scope_twice() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    let base = ctx.outstanding_buffers();
    for _ in 0..2 {
        let scope = ctx.open_exec_scope();
        let y = w.mul(&ctx, &w)?;
        let loss = y.sum_all(&ctx)?;
        loss.backward(&ctx)?;
        let gw = w.grad(&ctx)?.expect("w is a variable");
        assert!(!gw.is_scope_owned());
        assert_eq!(gw.to_vec(), [2., 4., 6.]);
        w.zero_grad();
        ctx.close_exec_scope(scope);
        // y and loss are still usable after the close: the handles own references.
        assert_eq!(loss.item()?, 14.0);
        drop((y, loss, gw));
        assert_eq!(ctx.outstanding_buffers(), base);
    }
    Ok(())
}

#[test]
fn constructors_and_fetched_gradients_are_not_adopted() -> R {
    let ctx = ExecContext::new();
    let scope = ctx.open_exec_scope();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let c = Tensor::from_slice(&ctx, &[2], &[1., 2.])?;
    let _z = Tensor::zeros(&ctx, &[2])?;
    let _r = Tensor::randn(&ctx, &[2], 1.0, 7)?;
    assert_eq!(ctx.exec_scope_len(), 0);
    assert!(!w.is_scope_owned() && !c.is_scope_owned());
    let y = w.mul(&ctx, &c)?;
    assert_eq!(ctx.exec_scope_len(), 1);
    y.sum_all(&ctx)?.backward(&ctx)?;
    assert_eq!(ctx.exec_scope_len(), 2);
    let _g = w.grad(&ctx)?.unwrap();
    let _v = w.grad_view().unwrap();
    assert_eq!(ctx.exec_scope_len(), 2);
    // No-grad results and constant results are adopted too.
    {
        let _ng = no_grad();
        let _ = w.exp(&ctx)?;
    }
    let _ = c.exp(&ctx)?;
    assert_eq!(ctx.exec_scope_len(), 4);
    ctx.close_exec_scope(scope);
    Ok(())
}

#[test]
fn take_ops_refuse_scope_owned_operands() -> R {
    let ctx = ExecContext::new();
    let c = Tensor::from_slice(&ctx, &[2], &[1., 2.])?;
    let scope = ctx.open_exec_scope();
    let y = c.scale(&ctx, 2.0)?;
    assert!(matches!(
        y.clone().take_add_no_grad(&ctx, &c).unwrap_err().as_exec(),
        Some(ExecError::ActiveExecScopeUnsupported {
            op: "take_add_no_grad"
        })
    ));
    assert!(matches!(
        y.take_scale_no_grad(&ctx, 2.0).unwrap_err().as_exec(),
        Some(ExecError::ActiveExecScopeUnsupported {
            op: "take_scale_no_grad"
        })
    ));
    // A caller-owned operand is fine inside a scope, and reuses its storage.
    let own = Tensor::from_slice(&ctx, &[2], &[1., 2.])?;
    let ptr = own.data()?.as_ptr();
    let sum = own.take_add_no_grad(&ctx, &c)?;
    assert_eq!(sum.data()?.as_ptr(), ptr);
    assert_eq!(sum.to_vec(), [2., 4.]);
    let scaled = sum.take_scale_no_grad(&ctx, 0.5)?;
    assert_eq!(scaled.to_vec(), [1., 2.]);
    ctx.close_exec_scope(scope);
    Ok(())
}

#[test]
fn a_failed_op_inside_a_scope_leaks_nothing() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    let bad = Tensor::from_slice(&ctx, &[2], &[1., 2.])?;
    let base = ctx.outstanding_buffers();
    let forward = |ctx: &ExecContext| -> Result<Tensor, AutogradError> {
        let a = w.exp(ctx)?;
        let b = a.mul(ctx, &w)?;
        b.add(ctx, &bad) // shape mismatch
    };
    let r = ctx.exec_scope(forward);
    assert!(r.is_err());
    assert_eq!(ctx.outstanding_buffers(), base);
    Ok(())
}

#[test]
fn typed_results_stay_caller_owned() -> R {
    let ctx = ExecContext::new();
    let x = Tensor::variable_from_slice(&ctx, &[2, 3], &[1., 5., 3., 4., 2., 6.])?;
    let scope = ctx.open_exec_scope();
    let (values, indices) = x.topk(&ctx, 1, 1, true)?;
    // Only the f32 values arm is adopted.
    assert_eq!(ctx.exec_scope_len(), 1);
    assert!(values.is_scope_owned());
    let am = x.argmax(&ctx, 1, false)?;
    let am_min = x.argmin(&ctx, 1, false)?;
    assert_eq!(ctx.exec_scope_len(), 1);
    ctx.close_exec_scope(scope);
    assert_eq!(am.to_vec(), [1, 2]);
    assert_eq!(am_min.to_vec(), [0, 1]);
    assert_eq!(indices.to_vec(), [1, 2]);
    assert_eq!(values.to_vec(), [5., 6.]);
    Ok(())
}

#[test]
fn backward_after_the_scope_closed_still_works() -> R {
    // The handles keep their own references: closing the scope releases what only
    // the scope held, and the loss still reaches its whole graph.
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    let base = ctx.outstanding_buffers();
    let scope = ctx.open_exec_scope();
    let loss = w.exp(&ctx)?.mul(&ctx, &w)?.sum_all(&ctx)?;
    ctx.close_exec_scope(scope);
    loss.backward(&ctx)?;
    let g = w.grad(&ctx)?.unwrap().to_vec();
    for (gi, x) in g.iter().zip([1f32, 2., 3.]) {
        assert!((gi - (x + 1.0) * x.exp()).abs() < 1e-4);
    }
    drop((loss, g));
    w.zero_grad();
    assert_eq!(ctx.outstanding_buffers(), base);
    Ok(())
}
