//! Negative axes (`-1` is the last axis, `-rank` the first) give the same shape
//! and bits as the positive axis they name, for every op that takes an axis; an
//! axis outside `-rank..rank` is `InvalidAxis` naming the op, the axis as given
//! and the rank, with nothing allocated.

// `ExecError` is as large as a tensor (inline shapes); the library allows this too.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;

use fucina_exec::{Axis, AxisReduction, Element, ExecContext, ExecError, RawTensor, SoftmaxOp};

type R<T = f32> = Result<RawTensor<T>, ExecError>;

/// `[2, 3, 4]` of distinct-ish values with some ties (for argmax/argmin).
fn x3(ctx: &ExecContext) -> RawTensor {
    let v: Vec<f32> = (0..24)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.25)
        .collect();
    ctx.from_slice(&[2, 3, 4], &v).unwrap()
}

/// Same shape and same bits (`Debug` prints the shortest string that reads back
/// as the same float, and tells `-0.0` from `0.0`).
fn same<T: Element + Debug>(what: &str, a: R<T>, b: R<T>) {
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    assert_eq!(
        format!("{:?}", a.to_vec()),
        format!("{:?}", b.to_vec()),
        "{what}: values"
    );
}

/// `InvalidAxis { op, axis, rank }` with no buffer kept or acquired.
fn invalid<T: Debug>(
    ctx: &ExecContext,
    op: &str,
    axis: i64,
    rank: usize,
    f: impl FnOnce() -> Result<T, ExecError>,
) {
    ctx.pool().trim();
    let before = ctx.outstanding_buffers();
    match f() {
        Err(ExecError::InvalidAxis {
            op: o,
            axis: a,
            rank: r,
        }) => {
            assert_eq!((o, a, r), (op, axis, rank), "{op}");
        }
        other => panic!("{op} axis {axis}: expected InvalidAxis, got {other:?}"),
    }
    assert_eq!(ctx.outstanding_buffers(), before, "{op}: a buffer was kept");
    assert_eq!(ctx.pool().cached_bytes(), 0, "{op}: a buffer was acquired");
}

#[test]
fn axis_resolution_rule() {
    assert_eq!((-1).resolve("t", 3).unwrap(), 2);
    assert_eq!((-3i64).resolve("t", 3).unwrap(), 0);
    assert_eq!(2usize.resolve("t", 3).unwrap(), 2);
    assert_eq!((-2isize).resolve("t", 3).unwrap(), 1);
    assert!((-4).resolve("t", 3).is_err());
    assert!(3.resolve("t", 3).is_err());
}

#[test]
fn reductions_accept_negative_axes() {
    let ctx = ExecContext::new();
    let x = x3(&ctx);
    for a in 0..3usize {
        let n = a as i32 - 3;
        for keepdim in [false, true] {
            let w = format!("axis {a} / {n}, keepdim {keepdim}");
            same(
                &format!("sum {w}"),
                ctx.sum(&x, n, keepdim),
                ctx.sum(&x, a, keepdim),
            );
            same(
                &format!("mean {w}"),
                ctx.mean(&x, n as i64, keepdim),
                ctx.mean(&x, a, keepdim),
            );
            same(
                &format!("max {w}"),
                ctx.max(&x, n as isize, keepdim),
                ctx.max(&x, a, keepdim),
            );
            same(
                &format!("min {w}"),
                ctx.min(&x, n, keepdim),
                ctx.min(&x, a, keepdim),
            );
            same(
                &format!("argmax {w}"),
                ctx.argmax(&x, n, keepdim),
                ctx.argmax(&x, a, keepdim),
            );
            same(
                &format!("argmin {w}"),
                ctx.argmin(&x, n, keepdim),
                ctx.argmin(&x, a, keepdim),
            );
            same(
                &format!("variance {w}"),
                ctx.variance(&x, n, keepdim, true),
                ctx.variance(&x, a, keepdim, true),
            );
            same(
                &format!("logsumexp {w}"),
                ctx.logsumexp(&x, n, keepdim),
                ctx.logsumexp(&x, a, keepdim),
            );
            for &op in AxisReduction::ALL {
                same(
                    &format!("reduce {op:?} {w}"),
                    ctx.reduce(op, &x, n, keepdim),
                    ctx.reduce(op, &x, a, keepdim),
                );
                let y = ctx.reduce(op, &x, a, keepdim).unwrap();
                let g = ctx.full(y.shape(), 0.5).unwrap();
                same(
                    &format!("reduce_backward {op:?} {w}"),
                    ctx.reduce_backward(op, Some(&x), x.shape(), &g, n, keepdim),
                    ctx.reduce_backward(op, Some(&x), x.shape(), &g, a, keepdim),
                );
            }
            let g = ctx
                .full(ctx.sum(&x, a, keepdim).unwrap().shape(), 0.5)
                .unwrap();
            same(
                &format!("sum_backward {w}"),
                ctx.sum_backward(&g, n, keepdim, x.shape()),
                ctx.sum_backward(&g, a, keepdim, x.shape()),
            );
            same(
                &format!("mean_backward {w}"),
                ctx.mean_backward(&g, n, keepdim, x.shape()),
                ctx.mean_backward(&g, a, keepdim, x.shape()),
            );
            same(
                &format!("max_backward {w}"),
                ctx.max_backward(&x, &g, n, keepdim),
                ctx.max_backward(&x, &g, a, keepdim),
            );
            same(
                &format!("min_backward {w}"),
                ctx.min_backward(&x, &g, n, keepdim),
                ctx.min_backward(&x, &g, a, keepdim),
            );
            same(
                &format!("variance_backward {w}"),
                ctx.variance_backward(&x, &g, n, keepdim, false),
                ctx.variance_backward(&x, &g, a, keepdim, false),
            );
            let l = ctx.logsumexp(&x, a, keepdim).unwrap();
            same(
                &format!("logsumexp_backward {w}"),
                ctx.logsumexp_backward(&x, &l, &g, n, keepdim),
                ctx.logsumexp_backward(&x, &l, &g, a, keepdim),
            );
        }
    }
}

#[test]
fn softmax_family_accepts_negative_axes() {
    let ctx = ExecContext::new();
    let x = x3(&ctx);
    let g = ctx.full(&[2, 3, 4], 0.25).unwrap();
    for a in 0..3usize {
        let n = a as i32 - 3;
        same("softmax", ctx.softmax(&x, n), ctx.softmax(&x, a));
        same(
            "log_softmax",
            ctx.log_softmax(&x, n),
            ctx.log_softmax(&x, a),
        );
        let y = ctx.softmax(&x, a).unwrap();
        same(
            "softmax_backward",
            ctx.softmax_backward(&y, &g, n),
            ctx.softmax_backward(&y, &g, a),
        );
        same(
            "log_softmax_backward",
            ctx.log_softmax_backward(&y, &g, n),
            ctx.log_softmax_backward(&y, &g, a),
        );
        for &op in SoftmaxOp::ALL {
            same(
                "softmax_op",
                ctx.softmax_op(op, &x, n),
                ctx.softmax_op(op, &x, a),
            );
            same(
                "softmax_op_backward",
                ctx.softmax_op_backward(op, &y, &g, n),
                ctx.softmax_op_backward(op, &y, &g, a),
            );
        }
    }
}

#[test]
fn joining_indexing_and_selection_accept_negative_axes() {
    let ctx = ExecContext::new();
    let x = x3(&ctx);
    for a in 0..3usize {
        let n = a as i32 - 3;
        same("concat", ctx.concat(&[&x, &x], n), ctx.concat(&[&x, &x], a));
        let (ps, pa) = (ctx.split(&x, n, &[1, 1]), ctx.split(&x, a, &[1, 1]));
        if a == 0 {
            let (ps, pa) = (ps.unwrap(), pa.unwrap());
            for (s, p) in ps.into_iter().zip(pa) {
                same("split", Ok(s), Ok(p));
            }
        } else {
            // Axis 1 and 2 are not of length 2: the same error either way.
            assert_eq!(format!("{:?}", ps.err()), format!("{:?}", pa.err()));
        }
        let idx = ctx.from_slice_typed::<i64>(&[3], &[1, 0, 1]).unwrap();
        same(
            "index_select",
            ctx.index_select(&x, n, &idx),
            ctx.index_select(&x, a, &idx),
        );
        let sel = ctx.index_select(&x, a, &idx).unwrap();
        let gs = ctx.full(sel.shape(), 1.5).unwrap();
        same(
            "index_select_backward",
            ctx.index_select_backward(&gs, n, &idx, x.shape()),
            ctx.index_select_backward(&gs, a, &idx, x.shape()),
        );
        let gi = ctx.from_slice_typed::<i64>(&[2, 1, 1], &[1, 0]).unwrap();
        same("gather", ctx.gather(&x, n, &gi), ctx.gather(&x, a, &gi));
        let gg = ctx.full(&[2, 1, 1], 2.0).unwrap();
        same(
            "gather_backward",
            ctx.gather_backward(&gg, n, &gi, x.shape()),
            ctx.gather_backward(&gg, a, &gi, x.shape()),
        );
        let (tv, ti) = ctx.topk(&x, 2, n, true).unwrap();
        let (pv, pi) = ctx.topk(&x, 2, a, true).unwrap();
        same("topk values", Ok(tv), Ok(pv));
        same("topk indices", Ok(ti), Ok(pi));
        same(
            "argsort",
            ctx.argsort(&x, n, true),
            ctx.argsort(&x, a, true),
        );
        same("narrow", x.narrow(n, 1, 1), x.narrow(a, 1, 1));
        for b in 0..3usize {
            same("transpose", x.transpose(n, b as i64 - 3), x.transpose(a, b));
        }
        let one = x.narrow(a, 0, 1).unwrap();
        same("squeeze", one.squeeze(n), one.squeeze(a));
    }
    // Ops that insert an axis count from the end of the result: -1 is last.
    for a in 0..4usize {
        let n = a as i32 - 4;
        same("stack", ctx.stack(&[&x, &x], n), ctx.stack(&[&x, &x], a));
        same("unsqueeze", x.unsqueeze(n), x.unsqueeze(a));
    }
    assert_eq!(x.unsqueeze(-1).unwrap().shape(), [2, 3, 4, 1]);
    assert_eq!(ctx.stack(&[&x, &x], -1).unwrap().shape(), [2, 3, 4, 2]);
}

#[test]
fn out_of_range_axes_are_errors_naming_op_axis_and_rank() {
    let ctx = ExecContext::new();
    let x = x3(&ctx);
    let g = ctx.full(&[2, 3, 4], 1.0).unwrap();
    let idx = ctx.from_slice_typed::<i64>(&[1], &[0]).unwrap();
    let gi = ctx.from_slice_typed::<i64>(&[2, 3, 4], &[0; 24]).unwrap();
    for axis in [-4i64, 3, -100, i64::MIN] {
        invalid(&ctx, "sum", axis, 3, || ctx.sum(&x, axis, false));
        invalid(&ctx, "mean", axis, 3, || ctx.mean(&x, axis, true));
        invalid(&ctx, "max", axis, 3, || ctx.max(&x, axis, false));
        invalid(&ctx, "min", axis, 3, || ctx.min(&x, axis, false));
        invalid(&ctx, "argmax", axis, 3, || ctx.argmax(&x, axis, false));
        invalid(&ctx, "argmin", axis, 3, || ctx.argmin(&x, axis, false));
        invalid(&ctx, "variance", axis, 3, || {
            ctx.variance(&x, axis, false, true)
        });
        invalid(&ctx, "logsumexp", axis, 3, || {
            ctx.logsumexp(&x, axis, false)
        });
        invalid(&ctx, "sum", axis, 3, || {
            ctx.reduce(AxisReduction::Sum, &x, axis, false)
        });
        invalid(&ctx, "sum_backward", axis, 3, || {
            ctx.sum_backward(&g, axis, true, x.shape())
        });
        invalid(&ctx, "mean_backward", axis, 3, || {
            ctx.mean_backward(&g, axis, true, x.shape())
        });
        invalid(&ctx, "max_backward", axis, 3, || {
            ctx.max_backward(&x, &g, axis, true)
        });
        invalid(&ctx, "min_backward", axis, 3, || {
            ctx.min_backward(&x, &g, axis, true)
        });
        invalid(&ctx, "variance_backward", axis, 3, || {
            ctx.variance_backward(&x, &g, axis, true, true)
        });
        invalid(&ctx, "logsumexp_backward", axis, 3, || {
            ctx.logsumexp_backward(&x, &g, &g, axis, true)
        });
        invalid(&ctx, "softmax", axis, 3, || ctx.softmax(&x, axis));
        invalid(&ctx, "log_softmax", axis, 3, || ctx.log_softmax(&x, axis));
        invalid(&ctx, "softmax_backward", axis, 3, || {
            ctx.softmax_backward(&x, &g, axis)
        });
        invalid(&ctx, "log_softmax_backward", axis, 3, || {
            ctx.log_softmax_backward(&x, &g, axis)
        });
        invalid(&ctx, "softmax", axis, 3, || {
            ctx.softmax_op(SoftmaxOp::Softmax, &x, axis)
        });
        invalid(&ctx, "concat", axis, 3, || ctx.concat(&[&x, &x], axis));
        invalid(&ctx, "split", axis, 3, || ctx.split(&x, axis, &[1]));
        invalid(&ctx, "index_select", axis, 3, || {
            ctx.index_select(&x, axis, &idx)
        });
        invalid(&ctx, "index_select_backward", axis, 3, || {
            ctx.index_select_backward(&g, axis, &idx, x.shape())
        });
        invalid(&ctx, "gather", axis, 3, || ctx.gather(&x, axis, &gi));
        invalid(&ctx, "gather_backward", axis, 3, || {
            ctx.gather_backward(&g, axis, &gi, x.shape())
        });
        invalid(&ctx, "topk", axis, 3, || ctx.topk(&x, 1, axis, true));
        invalid(&ctx, "argsort", axis, 3, || ctx.argsort(&x, axis, false));
        invalid(&ctx, "narrow", axis, 3, || x.narrow(axis, 0, 1));
        invalid(&ctx, "squeeze", axis, 3, || x.squeeze(axis));
        invalid(&ctx, "transpose", axis, 3, || x.transpose(0, axis));
        invalid(&ctx, "transpose", axis, 3, || x.transpose(axis, -1));
    }
    for axis in [-5i64, 4] {
        invalid(&ctx, "stack", axis, 4, || ctx.stack(&[&x, &x], axis));
        invalid(&ctx, "unsqueeze", axis, 4, || x.unsqueeze(axis));
    }
    // A `usize` too large for an `i64` is reported saturated.
    invalid(&ctx, "sum", i64::MAX, 3, || ctx.sum(&x, usize::MAX, false));
    // The message shows the axis as given.
    let e = ctx.softmax(&x, -7).unwrap_err();
    assert_eq!(e.to_string(), "softmax: axis -7 is out of range for rank 3");
}
