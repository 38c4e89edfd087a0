//! The matrix-product, joining, gathering and view families record their
//! descriptor: the node is named after the op, the gradients are the
//! descriptor's backward kernel, and the generic apply gives the same bits,
//! forward and backward, as the named method.

mod support;

use fucina_autograd::exec::{Dims, ExecContext, IndexOp, JoinOp, ProductOp, RawTensor, ViewOp};
use fucina_autograd::{AutogradError, Tensor};
use support::values;

type R = Result<(), AutogradError>;
type Op<'a> = &'a dyn Fn(&[Tensor]) -> Result<Tensor, AutogradError>;
/// Every input's gradient bits (`None` where it got none).
type Grads = Vec<Option<Vec<u32>>>;
/// The output's node name and bits, the input gradients and the seed.
type Run = (Option<&'static str>, Vec<u32>, Grads, RawTensor);

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Fresh variables of `shapes` (fixed values), `f` applied to them, and a
/// backward seeded with fixed values: the output's name and bits and every
/// input's gradient bits (`None` for an input that got none).
fn run(ctx: &ExecContext, shapes: &[&[usize]], f: Op<'_>) -> Result<Run, AutogradError> {
    let xs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = s.iter().product();
            Tensor::variable_from_slice(ctx, s, &values(n, 10 + i as u64, -1.0, 1.0))
        })
        .collect::<Result<_, _>>()?;
    let y = f(&xs)?;
    let g = ctx.from_slice(y.shape(), &values(y.numel(), 99, -1.0, 1.0))?;
    y.backward_with_grad(ctx, &g)?;
    let grads = xs
        .iter()
        .map(|x| Ok(x.grad(ctx)?.map(|t| bits(&t.to_vec()))))
        .collect::<Result<_, AutogradError>>()?;
    Ok((y.op_name(), bits(&y.to_vec()), grads, g))
}

/// The named method and the descriptor's apply: the same node name, the same
/// bits forward and backward. Returns the seed gradient and the input gradients.
fn same(
    ctx: &ExecContext,
    name: &str,
    shapes: &[&[usize]],
    named: Op<'_>,
    apply: Op<'_>,
) -> Result<(RawTensor, Grads), AutogradError> {
    let (n1, y1, g1, seed) = run(ctx, shapes, named)?;
    let (n2, y2, g2, _) = run(ctx, shapes, apply)?;
    assert_eq!(n1, Some(name));
    assert_eq!((n2, &y2, &g2), (Some(name), &y1, &g1), "{name}");
    Ok((seed, g1))
}

fn raw_bits(t: &RawTensor) -> Vec<u32> {
    bits(&t.to_vec())
}

#[test]
fn products_record_their_descriptor() -> R {
    let ctx = ExecContext::with_threads(2);
    let (xs, ws) = (&[2usize, 3, 4][..], &[4usize, 5][..]);
    let (seed, g) = same(
        &ctx,
        "matmul",
        &[xs, ws],
        &|t| t[0].matmul(&ctx, &t[1]),
        &|t| t[0].product(&ctx, ProductOp::Matmul, &t[1], None),
    )?;
    let (x, w) = (
        ctx.from_slice(xs, &values(24, 10, -1.0, 1.0))?,
        ctx.from_slice(ws, &values(20, 11, -1.0, 1.0))?,
    );
    let (ga, gb) = ctx.matmul_backward(&x, &w, &seed)?;
    assert_eq!(g, [Some(raw_bits(&ga)), Some(raw_bits(&gb))]);

    let (ws, bs) = (&[5usize, 4][..], &[5usize][..]);
    let (seed, g) = same(
        &ctx,
        "linear",
        &[xs, ws, bs],
        &|t| t[0].linear(&ctx, &t[1], Some(&t[2])),
        &|t| t[0].product(&ctx, ProductOp::Linear, &t[1], Some(&t[2])),
    )?;
    let w = ctx.from_slice(ws, &values(20, 11, -1.0, 1.0))?;
    let (gx, gw, gbias) = ctx.linear_backward(&x, &w, &seed)?;
    assert_eq!(
        g,
        [
            Some(raw_bits(&gx)),
            Some(raw_bits(&gw)),
            Some(raw_bits(&gbias))
        ]
    );
    // Over data (the input needs no gradient): the descriptor's weight-only
    // path, the same weight gradient.
    let data = Tensor::from_slice(&ctx, xs, &values(24, 10, -1.0, 1.0))?;
    let wv = Tensor::variable_from_slice(&ctx, ws, &values(20, 11, -1.0, 1.0))?;
    let y = data.product(&ctx, ProductOp::Linear, &wv, None)?;
    y.backward_with_grad(&ctx, &seed)?;
    assert_eq!(bits(&wv.grad(&ctx)?.unwrap().to_vec()), raw_bits(&gw));
    // matmul takes no bias.
    assert!(
        data.product(&ctx, ProductOp::Matmul, &wv, Some(&wv))
            .is_err()
    );
    Ok(())
}

#[test]
fn joins_record_their_descriptor() -> R {
    let ctx = ExecContext::with_threads(1);
    let (a, b) = (&[2usize, 3][..], &[2usize, 1][..]);
    let (seed, g) = same(
        &ctx,
        "concat",
        &[a, b, a],
        &|t| Tensor::concat(&ctx, &[&t[0], &t[1], &t[2]], -1),
        &|t| Tensor::join(&ctx, JoinOp::Concat, &[&t[0], &t[1], &t[2]], 1),
    )?;
    let want: Vec<_> = [(0, 3), (3, 1), (4, 3)]
        .into_iter()
        .map(|(s, n)| {
            Ok(Some(raw_bits(&ctx.join_backward(
                JoinOp::Concat,
                &seed,
                1,
                s,
                n,
            )?)))
        })
        .collect::<Result<_, AutogradError>>()?;
    assert_eq!(g, want);
    let (seed, g) = same(
        &ctx,
        "stack",
        &[a, a],
        &|t| Tensor::stack(&ctx, &[&t[0], &t[1]], -1),
        &|t| Tensor::join(&ctx, JoinOp::Stack, &[&t[0], &t[1]], 2),
    )?;
    for (i, gi) in g.iter().enumerate() {
        let want = ctx.join_backward(JoinOp::Stack, &seed, 2, i, 1)?;
        assert_eq!(gi.as_ref(), Some(&raw_bits(&want)));
    }
    // More parts than the node keeps inline: the same gradients.
    let shapes = [&[1usize, 2][..]; 11];
    let (seed, g) = same(
        &ctx,
        "concat",
        &shapes,
        &|t| Tensor::concat(&ctx, &t.iter().collect::<Vec<_>>(), 0),
        &|t| Tensor::join(&ctx, JoinOp::Concat, &t.iter().collect::<Vec<_>>(), 0),
    )?;
    for (i, gi) in g.iter().enumerate() {
        let want = seed.narrow(0, i, 1)?;
        assert_eq!(gi.as_ref(), Some(&raw_bits(&want)));
    }
    Ok(())
}

#[test]
fn gathering_ops_record_their_descriptor() -> R {
    let ctx = ExecContext::with_threads(1);
    let xs = &[4usize, 3][..];
    let x = ctx.from_slice(xs, &values(12, 10, -1.0, 1.0))?;
    let idx = ctx.from_slice_typed::<i64>(&[5], &[3, 0, 3, 1, 3])?;
    let (seed, g) = same(
        &ctx,
        "index_select",
        &[xs],
        &|t| t[0].index_select(&ctx, 0, &idx),
        &|t| t[0].index_op(&ctx, IndexOp::IndexSelect, 0, &idx),
    )?;
    let want = ctx.index_op_backward(IndexOp::IndexSelect, &seed, 0, &idx, xs)?;
    assert_eq!(g, [Some(raw_bits(&want))]);

    let gi = ctx.from_slice_typed::<i64>(&[4, 2], &[2, 0, 1, 1, 0, 2, 2, 2])?;
    let (seed, g) = same(
        &ctx,
        "gather",
        &[xs],
        &|t| t[0].gather(&ctx, -1, &gi),
        &|t| t[0].index_op(&ctx, IndexOp::Gather, 1, &gi),
    )?;
    let want = ctx.gather_backward(&seed, 1, &gi, xs)?;
    assert_eq!(g, [Some(raw_bits(&want))]);

    let ids = ctx.from_slice_typed::<i64>(&[2, 2], &[3, 3, 0, 2])?;
    let (seed, g) = same(
        &ctx,
        "embedding",
        &[xs],
        &|t| t[0].embedding(&ctx, &ids),
        &|t| t[0].index_op(&ctx, IndexOp::Embedding, 0, &ids),
    )?;
    let want = ctx.embedding_backward(&seed, &ids, 4)?;
    assert_eq!(g, [Some(raw_bits(&want))]);

    // topk's values are recorded as a gather at the returned indices.
    let xv = Tensor::constant(x.clone()).into_variable();
    let (top, at) = xv.topk(&ctx, 2, 1, true)?;
    assert_eq!(top.op_name(), Some("topk"));
    let seed = ctx.from_slice(&[4, 2], &values(8, 99, -1.0, 1.0))?;
    top.backward_with_grad(&ctx, &seed)?;
    let want = ctx.index_op_backward(IndexOp::Gather, &seed, 1, &at, xs)?;
    assert_eq!(bits(&xv.grad(&ctx)?.unwrap().to_vec()), raw_bits(&want));
    Ok(())
}

#[test]
fn views_record_their_descriptor() -> R {
    let ctx = ExecContext::with_threads(1);
    let s = &[2usize, 3, 4][..];
    let s1 = &[2usize, 1, 4][..];
    type Named<'a> = &'a dyn Fn(&Tensor) -> Result<Tensor, AutogradError>;
    let cases: [(&str, &[usize], Named<'_>, ViewOp); 8] = [
        (
            "reshape",
            s,
            &|t| t.reshape(&ctx, &[6, 4]),
            ViewOp::Reshape(Dims::new(&[6, 4])),
        ),
        (
            "permute",
            s,
            &|t| t.permute(&ctx, &[2, 0, 1]),
            ViewOp::Permute(Dims::new(&[2, 0, 1])),
        ),
        (
            "transpose",
            s,
            &|t| t.transpose(&ctx, -1, 0),
            ViewOp::Transpose(2, 0),
        ),
        (
            "narrow",
            s,
            &|t| t.narrow(&ctx, -2, 1, 2),
            ViewOp::Narrow {
                axis: 1,
                start: 1,
                len: 2,
            },
        ),
        ("squeeze", s1, &|t| t.squeeze(&ctx, 1), ViewOp::Squeeze(1)),
        (
            "unsqueeze",
            s,
            &|t| t.unsqueeze(&ctx, -1),
            ViewOp::Unsqueeze(3),
        ),
        (
            "broadcast_to",
            s1,
            &|t| t.broadcast_to(&ctx, &[3, 2, 5, 4]),
            ViewOp::BroadcastTo(Dims::new(&[3, 2, 5, 4])),
        ),
        (
            "materialize",
            s,
            &|t| t.materialize(&ctx),
            ViewOp::Materialize,
        ),
    ];
    for (name, shape, named, op) in cases {
        assert_eq!(op.name(), name);
        let (seed, g) = same(&ctx, name, &[shape], &|t| named(&t[0]), &|t| {
            t[0].view_op(&ctx, op)
        })?;
        let want = ctx.view_op_backward(op, shape, &seed)?;
        assert_eq!(g, [Some(raw_bits(&want))], "{name}");
    }
    // Through a non-contiguous input, reshape copies first: same bits.
    let (seed, g) = same(
        &ctx,
        "reshape",
        &[s],
        &|t| t[0].transpose(&ctx, 0, 2)?.reshape(&ctx, &[24]),
        &|t| {
            t[0].transpose(&ctx, 0, 2)?
                .view_op(&ctx, ViewOp::Reshape(Dims::new(&[24])))
        },
    )?;
    let back = ctx.view_op_backward(ViewOp::Reshape(Dims::new(&[24])), &[4, 3, 2], &seed)?;
    assert_eq!(g, [Some(raw_bits(&back.transpose(0, 2)?))]);
    Ok(())
}

#[test]
fn linear_bias_gradient_bits_do_not_depend_on_which_operands_need_gradients() -> R {
    // With the input's gradient the bias gradient came from a row loop; without
    // it, from `sum` along axis 0, a blocked order: the bits differed once the
    // rows outgrew one block. Both paths now share one kernel.
    let ctx = ExecContext::with_threads(2);
    for rows in [3usize, 300, 5000] {
        let (inn, out) = (7, 5);
        let xv: Vec<f32> = (0..rows * inn)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let wv: Vec<f32> = (0..out * inn)
            .map(|i| ((i * 11 % 23) as f32 - 11.0) * 0.07)
            .collect();
        let bv: Vec<f32> = (0..out).map(|i| i as f32 * 0.1).collect();
        let mut got = Vec::new();
        for x_needs_grad in [true, false] {
            let x = Tensor::from_slice(&ctx, &[rows, inn], &xv)?;
            let x = if x_needs_grad { x.into_variable() } else { x };
            let w = Tensor::variable_from_slice(&ctx, &[out, inn], &wv)?;
            let b = Tensor::variable_from_slice(&ctx, &[out], &bv)?;
            let y = x.linear(&ctx, &w, Some(&b))?;
            // A loss whose gradient varies by row, so the summation order shows.
            y.mul(&ctx, &y)?.sum_all(&ctx)?.backward(&ctx)?;
            got.push(bits(&b.grad(&ctx)?.expect("b is a variable").to_vec()));
        }
        assert_eq!(got[0], got[1], "{rows} rows: bias gradient bits differ");
    }
    Ok(())
}
