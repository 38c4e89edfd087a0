//! The gradient model: accumulation, errors, ordering, depth, no_grad, in-place
//! updates.

use fucina_autograd::exec::{ExecContext, ExecError, RawTensor};
use fucina_autograd::{AutogradError, BackwardOptions, Tensor, is_grad_enabled, no_grad};

#[path = "support/square.rs"]
mod square;

type R = Result<(), AutogradError>;

fn grad_of(ctx: &ExecContext, t: &Tensor) -> Vec<f32> {
    t.grad(ctx).unwrap().expect("a gradient").to_vec()
}

#[test]
fn square_sum_gradient_and_accumulation() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    assert!(w.grad(&ctx)?.is_none());
    let loss = w.mul(&ctx, &w)?.sum_all(&ctx)?;
    assert_eq!(loss.item()?, 14.0);
    loss.backward(&ctx)?;
    assert_eq!(grad_of(&ctx, &w), [2., 4., 6.]);
    // A second graph accumulates into the same gradient (never overwrites).
    w.mul(&ctx, &w)?.sum_all(&ctx)?.backward(&ctx)?;
    assert_eq!(grad_of(&ctx, &w), [4., 8., 12.]);
    w.zero_grad();
    assert!(w.grad(&ctx)?.is_none());
    Ok(())
}

#[test]
fn grad_is_a_caller_owned_copy_and_grad_view_is_stable() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    w.scale(&ctx, 3.0)?.sum_all(&ctx)?.backward(&ctx)?;
    let copy = w.grad(&ctx)?.unwrap();
    let view = w.grad_view().unwrap();
    assert!(!copy.raw().same_storage(view.raw()));
    assert!(!copy.requires_grad() && !copy.is_scope_owned());
    w.scale(&ctx, 3.0)?.sum_all(&ctx)?.backward(&ctx)?;
    // The accumulation copied instead of writing through the shared view.
    assert_eq!(view.to_vec(), [3., 3.]);
    assert_eq!(copy.to_vec(), [3., 3.]);
    assert_eq!(grad_of(&ctx, &w), [6., 6.]);
    Ok(())
}

#[test]
fn diamond_graph_sums_both_paths() -> R {
    // y = x * x; z = y * x + y  => dz/dx = 3x^2 + 2x
    let ctx = ExecContext::new();
    let x = Tensor::variable_from_slice(&ctx, &[3], &[1., -2., 0.5])?;
    let y = x.mul(&ctx, &x)?;
    let z = y.mul(&ctx, &x)?.add(&ctx, &y)?;
    z.sum_all(&ctx)?.backward(&ctx)?;
    let g = grad_of(&ctx, &x);
    for (gi, xi) in g.iter().zip([1f32, -2., 0.5]) {
        assert!(
            (gi - (3. * xi * xi + 2. * xi)).abs() < 1e-5,
            "{gi} vs x={xi}"
        );
    }
    Ok(())
}

#[test]
fn node_numbers_follow_creation_order() -> R {
    let ctx = ExecContext::new();
    let x = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let a = x.exp(&ctx)?;
    let b = a.add(&ctx, &x)?;
    let (ix, ia, ib) = (
        x.node_id().unwrap(),
        a.node_id().unwrap(),
        b.node_id().unwrap(),
    );
    assert!(ix < ia && ia < ib);
    assert_eq!(b.op_name(), Some("add"));
    assert_eq!(x.op_name(), Some("leaf"));
    Ok(())
}

#[test]
fn broadcast_gradients_reduce_to_operand_shapes() -> R {
    let ctx = ExecContext::new();
    let a = Tensor::variable_from_slice(&ctx, &[2, 3], &[1., 2., 3., 4., 5., 6.])?;
    let b = Tensor::variable_from_slice(&ctx, &[3], &[10., 20., 30.])?;
    let c = Tensor::variable_from_slice(&ctx, &[2, 1], &[2., 3.])?;
    a.mul(&ctx, &b)?
        .add(&ctx, &c)?
        .sum_all(&ctx)?
        .backward(&ctx)?;
    assert_eq!(grad_of(&ctx, &a), [10., 20., 30., 10., 20., 30.]);
    assert_eq!(grad_of(&ctx, &b), [5., 7., 9.]);
    assert_eq!(grad_of(&ctx, &c), [3., 3.]);
    Ok(())
}

#[test]
fn backward_errors() -> R {
    let ctx = ExecContext::new();
    let c = Tensor::from_slice(&ctx, &[1], &[1.])?;
    assert!(matches!(
        c.backward(&ctx),
        Err(AutogradError::NoGradientGraph { .. })
    ));
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let y = w.exp(&ctx)?;
    assert!(matches!(
        y.backward(&ctx),
        Err(AutogradError::NonScalarLoss { .. })
    ));
    let bad_seed = ctx.ones(&[3])?;
    assert!(matches!(
        y.backward_with_grad(&ctx, &bad_seed),
        Err(AutogradError::GradientShapeMismatch { .. })
    ));
    let seed = ctx.from_slice(&[2], &[1., 0.5])?;
    y.backward_with_grad(&ctx, &seed)?;
    let e = [1f32.exp(), 0.5 * 2f32.exp()];
    let g = grad_of(&ctx, &w);
    assert!((g[0] - e[0]).abs() < 1e-5 && (g[1] - e[1]).abs() < 1e-5);
    // The graph is consumed.
    assert_eq!(
        y.backward_with_grad(&ctx, &seed),
        Err(AutogradError::BackwardAlreadyRun)
    );
    // A graph that shares a consumed node is refused too.
    let z = y.sum_all(&ctx)?;
    assert_eq!(z.backward(&ctx), Err(AutogradError::BackwardAlreadyRun));
    Ok(())
}

#[test]
fn retained_graph_runs_twice() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let loss = w.mul(&ctx, &w)?.sum_all(&ctx)?;
    let keep = BackwardOptions {
        retain_graph: true,
        ..BackwardOptions::default()
    };
    loss.backward_with(&ctx, None, keep)?;
    loss.backward_with(&ctx, None, keep)?;
    assert_eq!(grad_of(&ctx, &w), [4., 8.]);
    loss.backward(&ctx)?; // the last one consumes it
    assert_eq!(loss.backward(&ctx), Err(AutogradError::BackwardAlreadyRun));
    assert_eq!(grad_of(&ctx, &w), [6., 12.]);
    Ok(())
}

#[test]
fn hundred_thousand_op_chain_backward_and_drop() -> R {
    // Runs on a test thread with the default (2 MiB) stack: any recursion over
    // the chain, in backward or in dropping the graph, would overflow it.
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[1], &[0.5])?;
    let mut x = w.clone();
    for _ in 0..100_000 {
        x = x.add_scalar(&ctx, 1.0)?;
    }
    let y = x.scale(&ctx, 2.0)?;
    assert_eq!(y.item()?, 2.0 * 100_000.5);
    y.backward(&ctx)?;
    assert_eq!(grad_of(&ctx, &w), [2.0]);
    drop((x, y));
    // An unconsumed chain drops iteratively as well.
    let mut x = w.clone();
    for _ in 0..100_000 {
        x = x.neg(&ctx)?;
    }
    drop(x);
    Ok(())
}

#[test]
fn no_grad_records_nothing() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    assert!(is_grad_enabled());
    let y = {
        let _g = no_grad();
        let _nested = no_grad();
        assert!(!is_grad_enabled());
        w.mul(&ctx, &w)?.exp(&ctx)?
    };
    assert!(is_grad_enabled());
    assert!(!y.requires_grad() && y.node_id().is_none());
    assert!(matches!(
        y.sum_all(&ctx)?.backward(&ctx),
        Err(AutogradError::NoGradientGraph { .. })
    ));
    let g = no_grad();
    g.close();
    assert!(w.mul(&ctx, &w)?.requires_grad());
    // Constants never record, with or without no_grad.
    let c = Tensor::from_slice(&ctx, &[2], &[1., 2.])?;
    assert!(!c.mul(&ctx, &c)?.requires_grad());
    Ok(())
}

#[test]
fn no_grad_is_per_thread() -> R {
    let _g = no_grad();
    let other = std::thread::spawn(is_grad_enabled).join().unwrap();
    assert!(other);
    assert!(!is_grad_enabled());
    Ok(())
}

#[test]
fn detach_cuts_the_graph() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let d = w.mul(&ctx, &w)?.detach();
    assert!(!d.requires_grad());
    // d * w: only the direct path to w carries gradient.
    d.mul(&ctx, &w)?.sum_all(&ctx)?.backward(&ctx)?;
    assert_eq!(grad_of(&ctx, &w), [1., 4.]);
    Ok(())
}

#[test]
fn update_after_forward_keeps_saved_activations() -> R {
    let ctx = ExecContext::new();
    let mut w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    let x = Tensor::from_slice(&ctx, &[3], &[1., 1., 1.])?;
    // mul saves w for the gradient of x... and x for the gradient of w.
    let xv = x.clone().into_variable();
    let loss = w.mul(&ctx, &xv)?.sum_all(&ctx)?;
    // Update w between forward and backward.
    w.update_(|d| d.iter_mut().for_each(|v| *v = 100.0))?;
    assert_eq!(w.to_vec(), [100., 100., 100.]);
    loss.backward(&ctx)?;
    // d(loss)/dx = w at forward time, not the updated values.
    assert_eq!(grad_of(&ctx, &xv), [1., 2., 3.]);
    assert_eq!(grad_of(&ctx, &w), [1., 1., 1.]);
    // The variable keeps its gradient state through the update.
    assert!(w.is_variable());
    Ok(())
}

#[test]
fn sgd_step_after_backward() -> R {
    let ctx = ExecContext::new();
    let mut w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    assert!(!w.sgd_step_(0.1)?);
    let loss = w.mul(&ctx, &w)?.sum_all(&ctx)?;
    loss.backward(&ctx)?;
    let view = w.detach();
    assert!(w.sgd_step_(0.5)?);
    assert_eq!(w.to_vec(), [0., 0., 0.]);
    // A handle taken before the step keeps the old values (copy-on-write).
    assert_eq!(view.to_vec(), [1., 2., 3.]);
    Ok(())
}

#[test]
fn in_place_update_without_sharing_reuses_storage() -> R {
    let ctx = ExecContext::new();
    let mut w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    let before = w.data()?.as_ptr();
    w.update_(|d| d[0] = 5.0)?;
    assert_eq!(w.data()?.as_ptr(), before);
    assert_eq!(w.to_vec(), [5., 2., 3.]);
    Ok(())
}

#[test]
fn errors_of_ops_are_exec_errors() {
    let ctx = ExecContext::new();
    let a = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.]).unwrap();
    let b = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.]).unwrap();
    assert!(matches!(
        a.add(&ctx, &b).unwrap_err().as_exec(),
        Some(ExecError::ShapeMismatch { op: "add", .. })
    ));
    assert!(matches!(
        Tensor::variable_from_slice(&ctx, &[2], &[1.])
            .unwrap_err()
            .as_exec(),
        Some(ExecError::InvalidDataLength { .. })
    ));
}

#[test]
fn random_constructors_are_bitwise_equal_to_the_serial_fills() -> R {
    const N: usize = 3 * 65_536 + 77; // large enough to split across a team
    type Make = fn(&ExecContext) -> Result<Tensor, AutogradError>;
    let serial = ExecContext::with_threads(1);
    let team = ExecContext::with_threads(4);
    let cases: [(&str, Make); 3] = [
        ("randn", |c| Tensor::randn(c, &[N], 0.5, 42)),
        ("uniform", |c| Tensor::uniform(c, &[N], -0.5, 2.0, 43)),
        ("kaiming", |c| Tensor::kaiming_uniform(c, &[4, N / 4], 44)),
    ];
    for (what, make) in cases {
        let a = make(&serial)?.to_vec();
        let b = make(&team)?.to_vec();
        let mut reference = vec![0f32; a.len()];
        match what {
            "randn" => fucina_autograd::exec::rng::gaussian_fill(42, &mut reference, 0.5),
            "uniform" => fucina_autograd::exec::rng::uniform_fill(43, &mut reference, -0.5, 2.0),
            _ => fucina_autograd::exec::rng::kaiming_uniform_fill(44, &mut reference, N / 4),
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&a) == bits(&reference),
            "{what}: serial differs from fucina_rng"
        );
        assert!(
            bits(&b) == bits(&reference),
            "{what}: parallel differs from fucina_rng"
        );
    }
    Ok(())
}

#[test]
fn random_constructors_refuse_bounds_and_deviations_out_of_range() -> R {
    let ctx = ExecContext::new();
    let nan = f32::NAN;
    for (lo, hi) in [
        (1.0, 0.0),
        (nan, 1.0),
        (0.0, nan),
        (f32::NEG_INFINITY, 0.0),
        (0.0, f32::INFINITY),
        (-f32::MAX, f32::MAX), // the width overflows
    ] {
        let e = Tensor::uniform(&ctx, &[4], lo, hi, 1).unwrap_err();
        assert!(
            matches!(
                e,
                AutogradError::InvalidArgument {
                    op: "Tensor::uniform",
                    ..
                }
            ),
            "[{lo}, {hi}): {e}"
        );
    }
    for std in [nan, -1.0, f32::INFINITY] {
        let e = Tensor::randn(&ctx, &[4], std, 1).unwrap_err();
        assert!(
            matches!(
                e,
                AutogradError::InvalidArgument {
                    op: "Tensor::randn",
                    ..
                }
            ),
            "std {std}: {e}"
        );
    }
    // The edges that are fine.
    assert_eq!(Tensor::uniform(&ctx, &[3], 2.0, 2.0, 1)?.to_vec(), [2.0; 3]);
    assert_eq!(Tensor::randn(&ctx, &[3], 0.0, 1)?.to_vec(), [0.0; 3]);
    Ok(())
}

#[test]
fn a_graph_captured_by_a_custom_backward_drops_iteratively() -> R {
    // Releasing a graph drops a VJP closure that owns another deep graph, while the
    // outer release is in progress.
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[1], &[1.0])?;
    let mut deep = w.clone();
    for _ in 0..100_000 {
        deep = deep.neg(&ctx)?;
    }
    let mut outer = w.clone();
    for _ in 0..1000 {
        outer = outer.exp(&ctx)?.log(&ctx)?;
    }
    let captured = deep;
    let y = fucina_autograd::custom_vjp(
        &ctx,
        "holds_a_graph",
        &[&outer],
        |_, x| Ok(x[0].clone()),
        move |_, a| {
            let _ = &captured;
            Ok(vec![Some(a.grad.clone())])
        },
    )?;
    drop(outer);
    // Ops on top: the custom node is released from inside the iterative release of
    // `top`, and its closure releases the deep graph there (a nested release).
    let mut top = y;
    for _ in 0..10 {
        top = top.neg(&ctx)?;
    }
    drop(top);
    Ok(())
}

#[test]
fn recycled_nodes_start_clean() {
    let ctx = ExecContext::with_threads(1);
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.]).unwrap();
    // A consumed graph, and a retained one, both released.
    square::backward_sum_of_squares(&ctx, &w);
    let loss = w.mul(&ctx, &w).unwrap().sum_all(&ctx).unwrap();
    loss.backward_with(
        &ctx,
        None,
        BackwardOptions {
            retain_graph: true,
            ..BackwardOptions::default()
        },
    )
    .unwrap();
    drop(loss);
    // The second graph reused the first one's two nodes.
    assert_eq!(fucina_autograd::free_graph_nodes(&ctx), 2);
    w.zero_grad();
    // The next graph reuses them: not consumed, no stale gradient or VJP.
    let y = w.scale(&ctx, 3.0).unwrap();
    let loss = y.sum_all(&ctx).unwrap();
    assert_eq!(fucina_autograd::free_graph_nodes(&ctx), 0);
    assert_eq!(y.op_name(), Some("scale"));
    loss.backward(&ctx).unwrap();
    assert_eq!(w.grad(&ctx).unwrap().unwrap().to_vec(), [3., 3., 3.]);
    assert_eq!(loss.backward(&ctx), Err(AutogradError::BackwardAlreadyRun));
}

#[test]
fn nodes_outliving_their_context_are_released_safely() {
    let ctx = ExecContext::with_threads(1);
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.]).unwrap();
    let loss = w.mul(&ctx, &w).unwrap().sum_all(&ctx).unwrap();
    drop(w.mul(&ctx, &w).unwrap()); // one node in the free list
    assert!(matches!(ctx.close(), Err(ExecError::LeakedBuffers { .. })));
    // The free list outlives the context while nodes can still return to it.
    drop(loss);
    drop(w);
}

#[test]
fn the_free_list_keeps_at_most_16384_nodes() {
    let ctx = ExecContext::with_threads(1);
    let w = Tensor::variable_from_slice(&ctx, &[1], &[1.]).unwrap();
    let mut x = w.add_scalar(&ctx, 1.0).unwrap();
    for _ in 1..20_000 {
        x = x.add_scalar(&ctx, 1.0).unwrap();
    }
    assert_eq!(fucina_autograd::free_graph_nodes(&ctx), 0);
    drop(x);
    assert_eq!(fucina_autograd::free_graph_nodes(&ctx), 16_384);
}

/// Every unary op records its descriptor: the gradient of `sum(w * op(x))` is
/// the op's backward kernel applied to `w`, bit for bit, and the node is named
/// after the op.
#[test]
fn unary_ops_record_their_descriptor() -> R {
    use fucina_autograd::exec::UnaryOp;
    let ctx = ExecContext::with_threads(1);
    let xv: Vec<f32> = (0..12).map(|i| 0.3 + i as f32 * 0.41).collect();
    let wv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.07).collect();
    for &op in UnaryOp::ALL {
        let x = Tensor::variable_from_slice(&ctx, &[3, 4], &xv)?;
        let w = Tensor::from_slice(&ctx, &[3, 4], &wv)?;
        let y = x.unary(&ctx, op)?;
        assert_eq!(y.op_name(), Some(op.name()));
        y.mul(&ctx, &w)?.sum_all(&ctx)?.backward(&ctx)?;
        let want = ctx.unary_backward(op, x.raw(), w.raw())?.to_vec();
        let got = grad_of(&ctx, &x);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{op:?}");
    }
    Ok(())
}

/// Every binary op records its descriptor: the node is named after the op and
/// the gradients are the descriptor's backward kernel summed to each operand's
/// shape (here `b` is broadcast along the rows), bit for bit.
#[test]
fn binary_ops_record_their_descriptor() -> R {
    use fucina_autograd::exec::BinaryOp;
    let ctx = ExecContext::with_threads(1);
    let av: Vec<f32> = (0..12).map(|i| 0.3 + i as f32 * 0.41).collect();
    let bv: Vec<f32> = vec![1.3, 0.7, 2.2, 1.1];
    let wv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.07).collect();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for &op in BinaryOp::ALL {
        let a = Tensor::variable_from_slice(&ctx, &[3, 4], &av)?;
        let b = Tensor::variable_from_slice(&ctx, &[4], &bv)?;
        let w = Tensor::from_slice(&ctx, &[3, 4], &wv)?;
        let y = a.binary(&ctx, op, &b)?;
        assert_eq!(y.op_name(), Some(op.name()));
        y.mul(&ctx, &w)?.sum_all(&ctx)?.backward(&ctx)?;
        let (ga, gb) = ctx.binary_backward(op, Some((a.raw(), b.raw())), w.raw(), [true, true])?;
        let want_b = ctx.sum_to(&gb.unwrap(), &[4])?;
        assert_eq!(
            bits(&grad_of(&ctx, &a)),
            bits(&ga.unwrap().to_vec()),
            "{op:?} a"
        );
        assert_eq!(bits(&grad_of(&ctx, &b)), bits(&want_b.to_vec()), "{op:?} b");
    }
    Ok(())
}

/// Every scalar-parameter op records its descriptor: node name, and the
/// gradient is the descriptor's backward kernel, bit for bit.
#[test]
fn scalar_ops_record_their_descriptor() -> R {
    use fucina_autograd::exec::ScalarOp;
    let ctx = ExecContext::with_threads(1);
    let xv: Vec<f32> = (0..12).map(|i| 0.3 + i as f32 * 0.41).collect();
    let wv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.07).collect();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let ops = [
        ScalarOp::Scale(2.5),
        ScalarOp::AddScalar(-1.0),
        ScalarOp::PowScalar(3.0),
        ScalarOp::Clamp { min: 1.0, max: 3.0 },
    ];
    for op in ops {
        let x = Tensor::variable_from_slice(&ctx, &[3, 4], &xv)?;
        let w = Tensor::from_slice(&ctx, &[3, 4], &wv)?;
        let y = x.scalar_op(&ctx, op)?;
        assert_eq!(y.op_name(), Some(op.name()));
        y.mul(&ctx, &w)?.sum_all(&ctx)?.backward(&ctx)?;
        let want = ctx.scalar_op_backward(op, Some(x.raw()), w.raw())?;
        assert_eq!(bits(&grad_of(&ctx, &x)), bits(&want.to_vec()), "{op:?}");
    }
    Ok(())
}

/// The softmax family records its descriptor: node name, and the gradient is
/// the descriptor's backward kernel at the output, bit for bit.
#[test]
fn softmax_ops_record_their_descriptor() -> R {
    use fucina_autograd::exec::SoftmaxOp;
    let ctx = ExecContext::with_threads(1);
    let xv: Vec<f32> = (0..12).map(|i| 0.3 + i as f32 * 0.41).collect();
    let wv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.07).collect();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for &op in SoftmaxOp::ALL {
        let x = Tensor::variable_from_slice(&ctx, &[3, 4], &xv)?;
        let w = Tensor::from_slice(&ctx, &[3, 4], &wv)?;
        let y = x.softmax_op(&ctx, op, 1)?;
        assert_eq!(y.op_name(), Some(op.name()));
        y.mul(&ctx, &w)?.sum_all(&ctx)?.backward(&ctx)?;
        let want = ctx.softmax_op_backward(op, y.raw(), w.raw(), 1)?;
        assert_eq!(bits(&grad_of(&ctx, &x)), bits(&want.to_vec()), "{op:?}");
    }
    Ok(())
}

/// The axis reductions record their descriptor: node name and backward kernel
/// (checked bit for bit against the exec layer's kernel of that name).
#[test]
fn axis_reductions_record_their_descriptor() -> R {
    let ctx = ExecContext::with_threads(1);
    let xv: Vec<f32> = (0..12).map(|i| ((i * 7) % 12) as f32 * 0.5 - 1.0).collect();
    type Fwd = fn(&Tensor, &ExecContext, usize, bool) -> Result<Tensor, AutogradError>;
    let ops: [(&str, Fwd); 4] = [
        ("sum", Tensor::sum),
        ("mean", Tensor::mean),
        ("max", Tensor::max),
        ("min", Tensor::min),
    ];
    for (name, f) in ops {
        let x = Tensor::variable_from_slice(&ctx, &[3, 4], &xv)?;
        let y = f(&x, &ctx, 1, false)?;
        assert_eq!(y.op_name(), Some(name));
        let op = *fucina_autograd::exec::AxisReduction::ALL
            .iter()
            .find(|op| op.name() == name)
            .expect("every axis reduction has a descriptor");
        let z = x.reduce(&ctx, op, 1, false)?;
        assert_eq!((z.op_name(), z.to_vec()), (Some(name), y.to_vec()));
        let g = ctx.from_slice(&[3], &[1.0, -2.0, 0.5])?;
        y.backward_with_grad(&ctx, &g)?;
        let want = match name {
            "sum" => ctx.sum_backward(&g, 1, false, &[3, 4])?,
            "mean" => ctx.mean_backward(&g, 1, false, &[3, 4])?,
            "max" => ctx.max_backward(x.raw(), &g, 1, false)?,
            _ => ctx.min_backward(x.raw(), &g, 1, false)?,
        };
        let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(grad_of(&ctx, &x)), bits(want.to_vec()), "{name}");
    }
    Ok(())
}

/// Twelve values with repeats and both signs (`((i * 5) % 12) * 0.3 - 1`).
fn mixed_12() -> Vec<f32> {
    (0..12).map(|i| ((i * 5) % 12) as f32 * 0.3 - 1.0).collect()
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// What [`run_op`] observed: the node name, the output's bits and each
/// input's gradient bits.
type OpRun = (Option<&'static str>, Vec<u32>, Vec<Vec<u32>>);

/// Runs `f` on fresh variables made from `inputs` (shape, values), weights
/// its output by `w` (when it has more than one element) and runs backward:
/// the node name, the output's bits and each input's gradient bits.
fn run_op(
    ctx: &ExecContext,
    inputs: &[(&[usize], &[f32])],
    w: &[f32],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor, AutogradError>,
) -> Result<OpRun, AutogradError> {
    let xs = inputs
        .iter()
        .map(|(shape, v)| Tensor::variable_from_slice(ctx, shape, v))
        .collect::<Result<Vec<_>, _>>()?;
    let y = f(&xs)?;
    let name = y.op_name();
    let out = bits_of(&y.to_vec());
    if y.numel() == 1 {
        y.backward(ctx)?;
    } else {
        let w = Tensor::from_slice(ctx, y.shape(), w)?;
        y.mul(ctx, &w)?.sum_all(ctx)?.backward(ctx)?;
    }
    let grads = xs.iter().map(|x| bits_of(&grad_of(ctx, x))).collect();
    Ok((name, out, grads))
}

/// `dropout` records its scalar descriptor: the named method and
/// `scalar_op(Dropout)` give the same node name, output and gradient bits, and
/// the gradient is the descriptor's backward kernel.
#[test]
fn dropout_records_its_descriptor() -> R {
    use fucina_autograd::exec::ScalarOp;
    let ctx = ExecContext::with_threads(1);
    let xv: Vec<f32> = (0..12).map(|i| 0.3 + i as f32 * 0.41).collect();
    let wv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.07).collect();
    let op = ScalarOp::Dropout { p: 0.3, seed: 11 };
    let inputs: [(&[usize], &[f32]); 1] = [(&[3, 4], &xv)];
    let named = run_op(&ctx, &inputs, &wv, &|x| x[0].dropout(&ctx, 0.3, 11))?;
    let desc = run_op(&ctx, &inputs, &wv, &|x| x[0].scalar_op(&ctx, op))?;
    assert_eq!(named, desc);
    assert_eq!(named.0, Some("dropout"));
    let w = ctx.from_slice(&[3, 4], &wv)?;
    let want = ctx.scalar_op_backward(op, None, &w)?;
    assert_eq!(named.2[0], bits_of(&want.to_vec()));
    Ok(())
}

/// The mask ops record their descriptor: `where_` and `masked_fill` give the
/// bits of `mask_op` (node name, output, gradients), and the gradients are the
/// descriptor's backward kernel (summed to the broadcast operand's shape).
#[test]
fn mask_ops_record_their_descriptor() -> R {
    use fucina_autograd::exec::MaskOp;
    let ctx = ExecContext::with_threads(1);
    let av: Vec<f32> = (0..12).map(|i| 0.3 + i as f32 * 0.41).collect();
    let bv = [1.3f32, 0.7, 2.2, 1.1];
    let wv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.07).collect();
    let mv: Vec<bool> = (0..12).map(|i| i % 5 < 2).collect();
    let mask = ctx.from_slice_typed::<bool>(&[3, 4], &mv)?;
    let w = ctx.from_slice(&[3, 4], &wv)?;

    let inputs: [(&[usize], &[f32]); 2] = [(&[3, 4], &av), (&[4], &bv)];
    let named = run_op(&ctx, &inputs, &wv, &|t| {
        Tensor::where_(&ctx, &mask, &t[0], &t[1])
    })?;
    let desc = run_op(&ctx, &inputs, &wv, &|t| {
        t[0].mask_op(&ctx, MaskOp::Where, &mask, Some(&t[1]))
    })?;
    assert_eq!(named, desc);
    assert_eq!(named.0, Some(MaskOp::Where.name()));
    let (ga, gb) = ctx.mask_op_backward(MaskOp::Where, &mask, &w, [true, true])?;
    let gb = ctx.sum_to(&gb.expect("asked for"), &[4])?;
    assert_eq!(named.2[0], bits_of(&ga.expect("asked for").to_vec()));
    assert_eq!(named.2[1], bits_of(&gb.to_vec()));

    let op = MaskOp::MaskedFill(-2.0);
    let inputs: [(&[usize], &[f32]); 1] = [(&[3, 4], &av)];
    let named = run_op(&ctx, &inputs, &wv, &|t| t[0].masked_fill(&ctx, &mask, -2.0))?;
    let desc = run_op(&ctx, &inputs, &wv, &|t| t[0].mask_op(&ctx, op, &mask, None))?;
    assert_eq!(named, desc);
    assert_eq!(named.0, Some("masked_fill"));
    let (ga, _) = ctx.mask_op_backward(op, &mask, &w, [true, false])?;
    assert_eq!(named.2[0], bits_of(&ga.expect("asked for").to_vec()));

    // A wrong operand count is an error, not a node.
    let x = Tensor::variable_from_slice(&ctx, &[3, 4], &av)?;
    assert!(x.mask_op(&ctx, MaskOp::Where, &mask, None).is_err());
    assert!(x.mask_op(&ctx, op, &mask, Some(&x)).is_err());
    Ok(())
}

/// `variance` and `logsumexp` record their statistic descriptor: the named
/// methods give the bits of `statistic` (node name, output, gradient), and the
/// gradient is the descriptor's backward kernel.
#[test]
fn statistics_record_their_descriptor() -> R {
    use fucina_autograd::exec::AxisStatistic;
    let ctx = ExecContext::with_threads(1);
    let xv: Vec<f32> = (0..12).map(|i| ((i * 7) % 12) as f32 * 0.5 - 1.0).collect();
    let wv = [1.0f32, -2.0, 0.5];
    let inputs: [(&[usize], &[f32]); 1] = [(&[3, 4], &xv)];
    type Named = fn(&Tensor, &ExecContext) -> Result<Tensor, AutogradError>;
    let ops: [(AxisStatistic, Named); 3] = [
        (AxisStatistic::Variance { unbiased: true }, |x, c| {
            x.variance(c, 1, false, true)
        }),
        (AxisStatistic::Variance { unbiased: false }, |x, c| {
            x.variance(c, 1, false, false)
        }),
        (AxisStatistic::LogSumExp, |x, c| x.logsumexp(c, 1, false)),
    ];
    for (op, f) in ops {
        let named = run_op(&ctx, &inputs, &wv, &|t| f(&t[0], &ctx))?;
        let desc = run_op(&ctx, &inputs, &wv, &|t| t[0].statistic(&ctx, op, 1, false))?;
        assert_eq!(named, desc, "{op:?}");
        assert_eq!(named.0, Some(op.name()));
        let x = ctx.from_slice(&[3, 4], &xv)?;
        let y = ctx.statistic(op, &x, 1, false)?;
        let g = ctx.from_slice(&[3], &wv)?;
        let want = ctx.statistic_backward(op, &x, Some(&y), &g, 1, false)?;
        assert_eq!(named.2[0], bits_of(&want.to_vec()), "{op:?}");
    }
    Ok(())
}

/// `sum_all` and `mean_all` record their full-reduction descriptor: the same
/// bits as `reduce_all` (node name, output, gradient), the gradient being the
/// descriptor's backward kernel.
#[test]
fn full_reductions_record_their_descriptor() -> R {
    use fucina_autograd::exec::FullReduction;
    let ctx = ExecContext::with_threads(1);
    let xv: Vec<f32> = (0..21).map(|i| 0.1 + i as f32 * 0.37).collect();
    let inputs: [(&[usize], &[f32]); 1] = [(&[3, 7], &xv)];
    type Named = fn(&Tensor, &ExecContext) -> Result<Tensor, AutogradError>;
    let ops: [(FullReduction, Named); 2] = [
        (FullReduction::Sum, Tensor::sum_all),
        (FullReduction::Mean, Tensor::mean_all),
    ];
    for (op, f) in ops {
        let named = run_op(&ctx, &inputs, &[], &|t| f(&t[0], &ctx))?;
        let desc = run_op(&ctx, &inputs, &[], &|t| t[0].reduce_all(&ctx, op))?;
        assert_eq!(named, desc, "{op:?}");
        assert_eq!(named.0, Some(op.name()));
        let one = ctx.from_slice(&[1], &[1.0])?;
        let want = ctx.reduce_all_backward(op, &one, &[3, 7])?;
        assert_eq!(named.2[0], bits_of(&want.to_vec()), "{op:?}");
    }
    Ok(())
}

/// `layer_norm` and `rms_norm` record their normalization descriptor: the
/// same bits as `norm_op` (node name, output, every gradient), the gradients
/// being the descriptor's backward kernel.
#[test]
fn norms_record_their_descriptor() -> R {
    use fucina_autograd::exec::NormOp;
    let ctx = ExecContext::with_threads(1);
    let xv = mixed_12();
    let wv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.07).collect();
    let gv = [1.0f32, 0.5, -2.0, 1.5];
    let bv = [0.1f32, -0.2, 0.3, 0.0];
    let w = ctx.from_slice(&[3, 4], &wv)?;
    let x = ctx.from_slice(&[3, 4], &xv)?;
    let gamma = ctx.from_slice(&[4], &gv)?;

    let ln = NormOp::LayerNorm { eps: 1e-5 };
    let inputs: [(&[usize], &[f32]); 3] = [(&[3, 4], &xv), (&[4], &gv), (&[4], &bv)];
    let named = run_op(&ctx, &inputs, &wv, &|t| {
        t[0].layer_norm(&ctx, &t[1], &t[2], 1e-5)
    })?;
    let desc = run_op(&ctx, &inputs, &wv, &|t| {
        t[0].norm_op(&ctx, ln, &t[1], Some(&t[2]))
    })?;
    assert_eq!(named, desc);
    assert_eq!(named.0, Some("layer_norm"));
    let (gx, gg, gb) = ctx.norm_op_backward(ln, &x, &gamma, &w)?;
    let gb = gb.expect("layer_norm has a shift");
    let want = [gx, gg, gb].map(|t| bits_of(&t.to_vec()));
    assert_eq!(named.2, want);

    let rms = NormOp::RmsNorm { eps: 1e-6 };
    let inputs: [(&[usize], &[f32]); 2] = [(&[3, 4], &xv), (&[4], &gv)];
    let named = run_op(&ctx, &inputs, &wv, &|t| t[0].rms_norm(&ctx, &t[1], 1e-6))?;
    let desc = run_op(&ctx, &inputs, &wv, &|t| {
        t[0].norm_op(&ctx, rms, &t[1], None)
    })?;
    assert_eq!(named, desc);
    assert_eq!(named.0, Some("rms_norm"));
    let (gx, gg, _) = ctx.norm_op_backward(rms, &x, &gamma, &w)?;
    assert_eq!(named.2, [gx, gg].map(|t| bits_of(&t.to_vec())));
    Ok(())
}

/// The losses record their descriptor: `cross_entropy`/`nll_loss` give the
/// bits of `class_loss`, `mse_loss` those of `regression_loss` (node name,
/// loss, gradients), the gradients being the descriptor's backward kernel at a
/// unit loss gradient.
#[test]
fn losses_record_their_descriptor() -> R {
    use fucina_autograd::exec::{ClassLoss, RegressionLoss};
    let ctx = ExecContext::with_threads(1);
    let xv = mixed_12();
    let tv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.15).collect();
    let labels = ctx.from_slice_typed::<i64>(&[3], &[2, 0, 3])?;
    let x = ctx.from_slice(&[3, 4], &xv)?;
    let inputs: [(&[usize], &[f32]); 1] = [(&[3, 4], &xv)];
    type Named = fn(&Tensor, &ExecContext, &RawTensor<i64>) -> Result<Tensor, AutogradError>;
    let ops: [(ClassLoss, Named); 2] = [
        (ClassLoss::CrossEntropy, Tensor::cross_entropy),
        (ClassLoss::NllLoss, Tensor::nll_loss),
    ];
    for (op, f) in ops {
        let named = run_op(&ctx, &inputs, &[], &|t| f(&t[0], &ctx, &labels))?;
        let desc = run_op(&ctx, &inputs, &[], &|t| t[0].class_loss(&ctx, op, &labels))?;
        assert_eq!(named, desc, "{op:?}");
        assert_eq!(named.0, Some(op.name()));
        let want = ctx.class_loss_backward(op, &x, &labels, 1.0)?;
        assert_eq!(named.2[0], bits_of(&want.to_vec()), "{op:?}");
    }

    let op = RegressionLoss::Mse;
    let inputs: [(&[usize], &[f32]); 2] = [(&[3, 4], &xv), (&[3, 4], &tv)];
    let named = run_op(&ctx, &inputs, &[], &|t| t[0].mse_loss(&ctx, &t[1]))?;
    let desc = run_op(&ctx, &inputs, &[], &|t| {
        t[0].regression_loss(&ctx, op, &t[1])
    })?;
    assert_eq!(named, desc);
    assert_eq!(named.0, Some("mse_loss"));
    let t = ctx.from_slice(&[3, 4], &tv)?;
    let (ga, gb) = ctx.regression_loss_backward(op, &x, &t, 1.0)?;
    assert_eq!(named.2, [ga, gb].map(|t| bits_of(&t.to_vec())));
    Ok(())
}

/// The replacement of the deprecated `Tensor::variable` makes the same leaf: it
/// shares the storage, requires a gradient and accumulates one.
#[test]
fn constant_into_variable_is_the_leaf_variable_made() -> R {
    let ctx = ExecContext::with_threads(1);
    let raw = ctx.from_slice(&[2], &[1.0, 2.0])?;
    let x = Tensor::constant(raw.clone()).into_variable();
    #[allow(deprecated)]
    let old = Tensor::variable(&ctx, raw)?;
    assert!(x.requires_grad() && old.requires_grad());
    x.scale(&ctx, 3.0)?.sum_all(&ctx)?.backward(&ctx)?;
    assert_eq!(grad_of(&ctx, &x), vec![3.0, 3.0]);
    Ok(())
}

#[test]
fn set_grad_replaces_releases_and_refuses() -> R {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    let g = Tensor::from_slice(&ctx, &[2], &[5., 6.])?;
    w.set_grad(&ctx, Some(&g))?;
    assert_eq!(grad_of(&ctx, &w), [5., 6.]);
    // A backward accumulates on top of the gradient that was set.
    w.sum_all(&ctx)?.backward(&ctx)?;
    assert_eq!(grad_of(&ctx, &w), [6., 7.]);
    // A wrong shape and a non-leaf are refused, and the gradient stays.
    let bad = Tensor::from_slice(&ctx, &[3], &[0.; 3])?;
    assert!(matches!(
        w.set_grad(&ctx, Some(&bad)),
        Err(AutogradError::GradientShapeMismatch { .. })
    ));
    let y = w.mul(&ctx, &w)?;
    assert!(matches!(
        y.set_grad(&ctx, Some(&g)),
        Err(AutogradError::InvalidArgument { .. })
    ));
    assert_eq!(grad_of(&ctx, &w), [6., 7.]);
    w.set_grad(&ctx, None)?;
    assert!(w.grad(&ctx)?.is_none());
    Ok(())
}
