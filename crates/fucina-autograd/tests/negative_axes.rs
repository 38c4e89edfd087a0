//! Negative axes on the differentiable ops: the same output and the same input
//! gradient, bit for bit, as the positive axis they name; out-of-range axes are
//! `InvalidAxis` naming the op, the axis as given and the rank.

use fucina_autograd::exec::{AxisReduction, ExecContext, ExecError, RawTensor, SoftmaxOp};
use fucina_autograd::{AutogradError, Tensor};

type Op<'a> = dyn Fn(&ExecContext, &Tensor) -> Result<Tensor, AutogradError> + 'a;

const SHAPE: [usize; 3] = [2, 3, 4];

fn data() -> Vec<f32> {
    (0..24)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.25)
        .collect()
}

/// `(output shape, output, input gradient)` of `f` applied to a fresh `x`, with
/// a non-uniform weighting of the output so every output element matters.
fn run(f: &Op<'_>) -> (Vec<usize>, String, String) {
    let ctx = ExecContext::new();
    let x = Tensor::variable_from_slice(&ctx, &SHAPE, &data()).unwrap();
    let y = f(&ctx, &x).unwrap();
    let n = y.numel();
    let w: Vec<f32> = (0..n).map(|i| 1.0 + (i % 5) as f32 * 0.375).collect();
    let w = Tensor::constant(ctx.from_slice(y.shape(), &w).unwrap());
    y.mul(&ctx, &w)
        .unwrap()
        .sum_all(&ctx)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    let g = x.grad(&ctx).unwrap().expect("a gradient").to_vec();
    (
        y.shape().to_vec(),
        format!("{:?}", y.to_vec()),
        format!("{g:?}"),
    )
}

fn same(what: &str, neg: &Op<'_>, pos: &Op<'_>) {
    assert_eq!(run(neg), run(pos), "{what}");
}

fn invalid(op: &str, axis: i64, rank: usize, r: Result<impl std::fmt::Debug, AutogradError>) {
    match r.as_ref().map_err(AutogradError::as_exec) {
        Err(Some(&ExecError::InvalidAxis {
            op: o,
            axis: a,
            rank: k,
        })) => {
            assert_eq!((o, a, k), (op, axis, rank), "{op}");
        }
        _ => panic!("{op} axis {axis}: expected InvalidAxis, got {r:?}"),
    }
}

#[test]
fn negative_axes_give_the_same_values_and_gradients() {
    for a in 0..3usize {
        let n = a as i32 - 3;
        for keepdim in [false, true] {
            for &op in AxisReduction::ALL {
                same(
                    &format!("{op:?} {a} {keepdim}"),
                    &|c, x| x.reduce(c, op, n, keepdim),
                    &|c, x| x.reduce(c, op, a, keepdim),
                );
            }
            same("sum", &|c, x| x.sum(c, n, keepdim), &|c, x| {
                x.sum(c, a, keepdim)
            });
            same("mean", &|c, x| x.mean(c, n as i64, keepdim), &|c, x| {
                x.mean(c, a, keepdim)
            });
            same("max", &|c, x| x.max(c, n as isize, keepdim), &|c, x| {
                x.max(c, a, keepdim)
            });
            same("min", &|c, x| x.min(c, n, keepdim), &|c, x| {
                x.min(c, a, keepdim)
            });
            same(
                "variance",
                &|c, x| x.variance(c, n, keepdim, true),
                &|c, x| x.variance(c, a, keepdim, true),
            );
            same("logsumexp", &|c, x| x.logsumexp(c, n, keepdim), &|c, x| {
                x.logsumexp(c, a, keepdim)
            });
        }
        same("softmax", &|c, x| x.softmax(c, n), &|c, x| x.softmax(c, a));
        same("log_softmax", &|c, x| x.log_softmax(c, n), &|c, x| {
            x.log_softmax(c, a)
        });
        for &op in SoftmaxOp::ALL {
            same("softmax_op", &|c, x| x.softmax_op(c, op, n), &|c, x| {
                x.softmax_op(c, op, a)
            });
        }
        same(
            "l2_normalize",
            &|c, x| x.l2_normalize(c, n, 1e-6),
            &|c, x| x.l2_normalize(c, a, 1e-6),
        );
        same(
            "cosine_similarity",
            &|c, x| x.cosine_similarity(c, &x.exp(c)?, n, 1e-6),
            &|c, x| x.cosine_similarity(c, &x.exp(c)?, a, 1e-6),
        );
        same("concat", &|c, x| Tensor::concat(c, &[x, x], n), &|c, x| {
            Tensor::concat(c, &[x, x], a)
        });
        same(
            "index_select",
            &|c, x| x.index_select(c, n, &c.from_slice_typed::<i64>(&[3], &[1, 0, 1])?),
            &|c, x| x.index_select(c, a, &c.from_slice_typed::<i64>(&[3], &[1, 0, 1])?),
        );
        same(
            "gather",
            &|c, x| x.gather(c, n, &c.from_slice_typed::<i64>(&[2, 1, 1], &[1, 0])?),
            &|c, x| x.gather(c, a, &c.from_slice_typed::<i64>(&[2, 1, 1], &[1, 0])?),
        );
        same("topk", &|c, x| Ok(x.topk(c, 2, n, true)?.0), &|c, x| {
            Ok(x.topk(c, 2, a, true)?.0)
        });
        same("narrow", &|c, x| x.narrow(c, n, 1, 1), &|c, x| {
            x.narrow(c, a, 1, 1)
        });
        for b in 0..3usize {
            same(
                "transpose",
                &|c, x| x.transpose(c, n, b as i64 - 3),
                &|c, x| x.transpose(c, a, b),
            );
        }
        same(
            "squeeze",
            &|c, x| x.narrow(c, a, 0, 1)?.squeeze(c, n),
            &|c, x| x.narrow(c, a, 0, 1)?.squeeze(c, a),
        );
        let ctx = ExecContext::new();
        let x = Tensor::variable_from_slice(&ctx, &SHAPE, &data()).unwrap();
        assert_eq!(
            x.argmax(&ctx, n, false).unwrap().to_vec(),
            x.argmax(&ctx, a, false).unwrap().to_vec()
        );
        assert_eq!(
            x.argmin(&ctx, n, true).unwrap().to_vec(),
            x.argmin(&ctx, a, true).unwrap().to_vec()
        );
    }
    for a in 0..4usize {
        let n = a as i32 - 4;
        same("stack", &|c, x| Tensor::stack(c, &[x, x], n), &|c, x| {
            Tensor::stack(c, &[x, x], a)
        });
        same("unsqueeze", &|c, x| x.unsqueeze(c, n), &|c, x| {
            x.unsqueeze(c, a)
        });
    }
}

#[test]
fn out_of_range_axes_are_errors() {
    let ctx = ExecContext::new();
    let x = Tensor::variable_from_slice(&ctx, &SHAPE, &data()).unwrap();
    let idx: RawTensor<i64> = ctx.from_slice_typed(&[1], &[0]).unwrap();
    for axis in [-4i64, 3] {
        invalid("sum", axis, 3, x.sum(&ctx, axis, false));
        invalid("mean", axis, 3, x.mean(&ctx, axis, false));
        invalid("max", axis, 3, x.max(&ctx, axis, true));
        invalid("min", axis, 3, x.min(&ctx, axis, true));
        invalid("variance", axis, 3, x.variance(&ctx, axis, true, true));
        invalid("logsumexp", axis, 3, x.logsumexp(&ctx, axis, true));
        invalid("argmax", axis, 3, x.argmax(&ctx, axis, true));
        invalid("argmin", axis, 3, x.argmin(&ctx, axis, true));
        invalid("softmax", axis, 3, x.softmax(&ctx, axis));
        invalid("log_softmax", axis, 3, x.log_softmax(&ctx, axis));
        invalid("l2_normalize", axis, 3, x.l2_normalize(&ctx, axis, 1e-6));
        invalid(
            "cosine_similarity",
            axis,
            3,
            x.cosine_similarity(&ctx, &x, axis, 1e-6),
        );
        invalid("concat", axis, 3, Tensor::concat(&ctx, &[&x, &x], axis));
        invalid("index_select", axis, 3, x.index_select(&ctx, axis, &idx));
        invalid("gather", axis, 3, x.gather(&ctx, axis, &idx));
        invalid("topk", axis, 3, x.topk(&ctx, 1, axis, true));
        invalid("narrow", axis, 3, x.narrow(&ctx, axis, 0, 1));
        invalid("squeeze", axis, 3, x.squeeze(&ctx, axis));
        invalid("transpose", axis, 3, x.transpose(&ctx, -1, axis));
    }
    for axis in [-5i64, 4] {
        invalid("stack", axis, 4, Tensor::stack(&ctx, &[&x, &x], axis));
        invalid("unsqueeze", axis, 4, x.unsqueeze(&ctx, axis));
    }
}
