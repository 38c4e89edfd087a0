//! A backward that fails part-way changes nothing: no leaf gradient, no
//! consumed node. The same backward can run again once the cause is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use fucina_autograd::exec::{ExecContext, ExecError};
use fucina_autograd::{AutogradError, BackwardOptions, Tensor, custom_vjp};

type R = Result<(), AutogradError>;

/// An identity op whose backward fails while `fails` is above zero (counting
/// it down), with a wrong gradient shape when `bad_shape`, else with an error of
/// its own (standing for an allocation that failed).
fn flaky(ctx: &ExecContext, x: &Tensor, fails: &Arc<AtomicUsize>, bad_shape: bool) -> Tensor {
    let fails = Arc::clone(fails);
    custom_vjp(
        ctx,
        "flaky",
        &[x],
        |_, xs| Ok(xs[0].clone()),
        move |ctx, a| {
            let failing = fails
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if !failing {
                return Ok(vec![Some(a.grad.clone())]);
            }
            if bad_shape {
                Ok(vec![Some(ctx.ones(&[a.grad.numel() + 1])?)])
            } else {
                Err(ExecError::InvalidArgument {
                    op: "flaky",
                    reason: "simulated failure",
                }
                .into())
            }
        },
    )
    .unwrap()
}

/// `loss = sum(w * w) + sum(flaky(w))`, the failing branch recorded first, so
/// that backward reaches `w` through the good branch before the failure.
fn graph(ctx: &ExecContext, w: &Tensor, fails: &Arc<AtomicUsize>, bad_shape: bool) -> Tensor {
    let bad = flaky(ctx, w, fails, bad_shape).sum_all(ctx).unwrap();
    let good = w.mul(ctx, w).unwrap().sum_all(ctx).unwrap();
    good.add(ctx, &bad).unwrap()
}

fn grad(ctx: &ExecContext, w: &Tensor) -> Option<Vec<f32>> {
    w.grad(ctx).unwrap().map(|g| g.to_vec())
}

#[test]
fn a_failed_backward_leaves_no_gradient_and_can_run_again() -> R {
    for bad_shape in [false, true] {
        let ctx = ExecContext::new();
        let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
        let fails = Arc::new(AtomicUsize::new(1));
        let loss = graph(&ctx, &w, &fails, bad_shape);
        let err = loss.backward(&ctx).unwrap_err();
        if bad_shape {
            assert!(
                matches!(
                    err,
                    AutogradError::GradientShapeMismatch { op: "flaky", .. }
                ),
                "{err}"
            );
        } else {
            assert!(matches!(err, AutogradError::Exec(_)), "{err}");
        }
        // The good branch ran before the failure, but nothing was committed.
        assert_eq!(grad(&ctx, &w), None);
        // Not consumed: the same backward runs, now that the cause is gone.
        loss.backward(&ctx)?;
        assert_eq!(grad(&ctx, &w), Some(vec![3., 5., 7.]));
        assert_eq!(loss.backward(&ctx), Err(AutogradError::BackwardAlreadyRun));
        assert_eq!(grad(&ctx, &w), Some(vec![3., 5., 7.]));
    }
    Ok(())
}

#[test]
fn a_failed_backward_keeps_an_accumulated_gradient_bit_for_bit() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[0.1, -0.7, 1.3])?;
    w.mul(&ctx, &w)?.sum_all(&ctx)?.backward(&ctx)?;
    let before: Vec<u32> = grad(&ctx, &w)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    // A grad view alive, and one without: both commit paths.
    for hold_view in [true, false] {
        let view = hold_view.then(|| w.grad_view());
        let fails = Arc::new(AtomicUsize::new(1));
        let loss = graph(&ctx, &w, &fails, false);
        assert!(loss.backward(&ctx).is_err());
        let after: Vec<u32> = grad(&ctx, &w)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(after, before);
        drop(view);
    }
    Ok(())
}

#[test]
fn a_retained_graph_stays_retained_after_a_failure() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let fails = Arc::new(AtomicUsize::new(1));
    let loss = graph(&ctx, &w, &fails, true);
    let keep = BackwardOptions {
        retain_graph: true,
        ..BackwardOptions::default()
    };
    assert!(loss.backward_with(&ctx, None, keep).is_err());
    assert_eq!(grad(&ctx, &w), None);
    loss.backward_with(&ctx, None, keep)?;
    loss.backward(&ctx)?;
    assert_eq!(grad(&ctx, &w), Some(vec![6., 10.]));
    Ok(())
}

#[test]
fn a_graph_sharing_a_consumed_node_changes_nothing() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let v = Tensor::variable_from_slice(&ctx, &[2], &[3., 4.])?;
    let shared = w.exp(&ctx)?;
    shared.sum_all(&ctx)?.backward(&ctx)?;
    let gw = grad(&ctx, &w);
    // `v`'s branch is newer and runs first; the shared node then refuses.
    let loss = shared
        .sum_all(&ctx)?
        .add(&ctx, &v.mul(&ctx, &v)?.sum_all(&ctx)?)?;
    assert_eq!(loss.backward(&ctx), Err(AutogradError::BackwardAlreadyRun));
    assert_eq!(grad(&ctx, &v), None);
    assert_eq!(grad(&ctx, &w), gw);
    Ok(())
}

#[test]
fn gradients_of_a_leaf_reached_twice_are_summed_then_added() -> R {
    // Two contributions in one pass, onto an existing gradient, with and without
    // a grad view alive (the second commits into fresh storage).
    for hold_view in [false, true] {
        let ctx = ExecContext::new();
        let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
        w.sum_all(&ctx)?.backward(&ctx)?;
        let view = hold_view.then(|| w.grad_view().unwrap());
        let loss = w.add(&ctx, &w)?.sum_all(&ctx)?;
        loss.backward(&ctx)?;
        assert_eq!(grad(&ctx, &w), Some(vec![3., 3.]));
        if let Some(v) = view {
            assert_eq!(v.to_vec(), [1., 1.]); // a view never changes
        }
    }
    Ok(())
}

/// `release_as_it_goes`: a failed pass changes no leaf gradient, and the ops
/// that ran have released what they saved (the graph is consumed).
#[test]
fn a_pass_releasing_as_it_goes_fails_without_changing_a_leaf() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let fails = Arc::new(AtomicUsize::new(1));
    let loss = graph(&ctx, &w, &fails, false);
    let early = BackwardOptions {
        release_as_it_goes: true,
        ..BackwardOptions::default()
    };
    assert!(loss.backward_with(&ctx, None, early).is_err());
    assert_eq!(grad(&ctx, &w), None);
    assert_eq!(
        loss.backward_with(&ctx, None, early),
        Err(AutogradError::BackwardAlreadyRun)
    );
    assert_eq!(grad(&ctx, &w), None);
    Ok(())
}

/// An op whose VJP records whether `probe` (held only by the VJP of a later
/// op) is still alive when it runs.
fn observer(
    ctx: &ExecContext,
    x: &Tensor,
    probe: std::sync::Weak<()>,
    seen: &Arc<AtomicUsize>,
) -> Tensor {
    let seen = Arc::clone(seen);
    custom_vjp(
        ctx,
        "observer",
        &[x],
        |_, xs| Ok(xs[0].clone()),
        move |_, a| {
            seen.store(1 + usize::from(probe.upgrade().is_some()), Ordering::SeqCst);
            Ok(vec![Some(a.grad.clone())])
        },
    )
    .unwrap()
}

#[test]
fn releasing_as_it_goes_frees_an_op_before_the_ops_before_it_run() -> R {
    for early in [false, true] {
        let ctx = ExecContext::new();
        let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
        let held = Arc::new(());
        let seen = Arc::new(AtomicUsize::new(0));
        let first = observer(&ctx, &w, Arc::downgrade(&held), &seen);
        // The later op's VJP holds the probe (as an op holds its saved tensors).
        let holder = Arc::clone(&held);
        drop(held);
        let second = custom_vjp(
            &ctx,
            "holder",
            &[&first],
            |_, xs| Ok(xs[0].clone()),
            move |_, a| {
                let _ = &holder;
                Ok(vec![Some(a.grad.clone())])
            },
        )?;
        let opts = BackwardOptions {
            release_as_it_goes: early,
            ..BackwardOptions::default()
        };
        second.sum_all(&ctx)?.backward_with(&ctx, None, opts)?;
        // 1: released before the earlier op ran; 2: still alive.
        assert_eq!(seen.load(Ordering::SeqCst), if early { 1 } else { 2 });
        assert_eq!(grad(&ctx, &w), Some(vec![1., 1.]));
    }
    Ok(())
}
