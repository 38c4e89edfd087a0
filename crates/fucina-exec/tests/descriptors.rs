//! The descriptors of the matrix-product, joining, gathering and view families
//! run the same kernels as the named methods: the same bits forward and
//! backward, and the same errors. Each descriptor's `out_shape` gives the
//! shape of its forward's result, and the same errors.
#![allow(clippy::result_large_err)] // `ExecError` carries inline shapes

mod support;

use fucina_exec::{
    AxisReduction, AxisStatistic, BinaryOp, ClassLoss, Dims, ExecContext, ExecError, FullReduction,
    IndexOp, JoinOp, MaskOp, MatmulOptions, NormOp, ProductOp, RawTensor, RegressionLoss,
    RhsLifetime, ScalarOp, SoftmaxOp, UnaryOp, ViewOp,
};
use support::values;

type R = Result<(), ExecError>;

fn bits(t: &RawTensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

fn opt_bits(t: &Option<RawTensor>) -> Option<Vec<u32>> {
    t.as_ref().map(bits)
}

fn tensor(ctx: &ExecContext, shape: &[usize], seed: u64) -> RawTensor {
    let n = shape.iter().product();
    ctx.from_slice(shape, &values(n, seed)).unwrap()
}

/// Every needs mask over `n` operands.
fn masks(n: usize) -> impl Iterator<Item = [bool; 3]> {
    (0..1u8 << n).map(move |m| std::array::from_fn(|i| i < n && m & (1 << i) != 0))
}

#[test]
fn product_descriptor_matches_matmul_and_linear() -> R {
    let ctx = ExecContext::with_threads(2);
    // A broadcast batch on the left, a transposed right-hand side.
    let a = tensor(&ctx, &[2, 3, 5, 7], 1);
    let b = tensor(&ctx, &[4, 7], 2).transpose(0, 1)?; // [7, 4], column-major
    let y = ctx.matmul(&a, &b)?;
    let d = MatmulOptions::default();
    assert_eq!(
        bits(&ctx.product(ProductOp::Matmul, &a, &b, None, d)?),
        bits(&y)
    );
    let g = tensor(&ctx, y.shape(), 3);
    let (ga, gb) = ctx.matmul_backward(&a, &b, &g)?;
    for needs in masks(2) {
        let [da, db, dbias] = ctx.product_backward(ProductOp::Matmul, &a, &b, &g, needs)?;
        assert_eq!(opt_bits(&da), needs[0].then(|| bits(&ga)), "{needs:?}");
        assert_eq!(opt_bits(&db), needs[1].then(|| bits(&gb)), "{needs:?}");
        assert!(dbias.is_none());
    }

    // linear: batched input, with and without a bias, transient and stable.
    let x = tensor(&ctx, &[3, 6, 40], 4);
    let w = ctx.from_vec(&[24, 40], values(24 * 40, 5))?;
    let bias = tensor(&ctx, &[24], 6);
    for bias in [None, Some(&bias)] {
        let y = ctx.linear(&x, &w, bias)?;
        for lifetime in [RhsLifetime::Transient, RhsLifetime::StableProcess] {
            let o = MatmulOptions {
                rhs_lifetime: lifetime,
            };
            let p = ctx.product(ProductOp::Linear, &x, &w, bias, o)?;
            assert_eq!(bits(&p), bits(&y), "{lifetime:?}");
        }
    }
    let g = tensor(&ctx, &[3, 6, 24], 7);
    let (gx, gw, gb) = ctx.linear_backward(&x, &w, &g)?;
    let rows_sum = ctx.sum(&g.reshape(&[18, 24])?, 0, false)?;
    assert_eq!(bits(&rows_sum), bits(&gb));
    for needs in masks(3) {
        let [dx, dw, dbias] = ctx.product_backward(ProductOp::Linear, &x, &w, &g, needs)?;
        assert_eq!(opt_bits(&dx), needs[0].then(|| bits(&gx)), "{needs:?}");
        // Without the input's gradient the weight's is the same product.
        assert_eq!(opt_bits(&dw), needs[1].then(|| bits(&gw)), "{needs:?}");
        // Either path gives the bias's gradient of `linear_backward` (its row
        // loop and the sum along axis 0 agree here, 18 rows).
        assert_eq!(opt_bits(&dbias), needs[2].then(|| bits(&gb)), "{needs:?}");
    }
    Ok(())
}

#[test]
fn product_descriptor_errors() {
    let ctx = ExecContext::with_threads(1);
    let (a, b) = (tensor(&ctx, &[2, 3], 1), tensor(&ctx, &[3, 4], 2));
    let bias = tensor(&ctx, &[4], 3);
    let d = MatmulOptions::default();
    assert!(matches!(
        ctx.product(ProductOp::Matmul, &a, &b, Some(&bias), d),
        Err(ExecError::InvalidArgument { op: "matmul", .. })
    ));
    let g = tensor(&ctx, &[2, 4], 4);
    assert!(matches!(
        ctx.product_backward(ProductOp::Matmul, &a, &b, &g, [true, true, true]),
        Err(ExecError::InvalidArgument { .. })
    ));
    // A gradient of the wrong shape is refused on both linear paths.
    let w = tensor(&ctx, &[4, 3], 5);
    let bad = tensor(&ctx, &[2, 5], 6);
    for needs in [[true, true, true], [false, true, true]] {
        assert!(matches!(
            ctx.product_backward(ProductOp::Linear, &a, &w, &bad, needs),
            Err(ExecError::ShapeMismatch {
                op: "linear_backward",
                ..
            })
        ));
    }
    assert_eq!(ProductOp::ALL.len(), 2);
    assert!(ProductOp::Linear.takes_bias() && !ProductOp::Matmul.takes_bias());
}

#[test]
fn join_descriptor_matches_concat_and_stack() -> R {
    let ctx = ExecContext::with_threads(1);
    let a = tensor(&ctx, &[2, 3], 1);
    let b = tensor(&ctx, &[2, 4], 2).narrow(1, 1, 3)?; // a strided part
    let c = tensor(&ctx, &[2, 3], 3);
    for axis in 0..2 {
        let parts = [&a, &b, &c];
        assert_eq!(
            bits(&ctx.join(JoinOp::Concat, &parts, axis)?),
            bits(&ctx.concat(&parts, axis)?)
        );
        let y = ctx.concat(&parts, axis)?;
        let g = tensor(&ctx, y.shape(), 4);
        let pieces = ctx.split(&g, axis, &[2 * (1 - axis) + 3 * axis; 3])?;
        for (i, piece) in pieces.iter().enumerate() {
            let n = piece.shape()[axis];
            let part = ctx.join_backward(JoinOp::Concat, &g, axis, i * n, n)?;
            assert_eq!(bits(&part), bits(piece));
        }
    }
    for axis in 0..3 {
        let s = ctx.stack(&[&a, &b, &c], axis)?;
        assert_eq!(
            bits(&ctx.join(JoinOp::Stack, &[&a, &b, &c], axis)?),
            bits(&s)
        );
        let g = tensor(&ctx, s.shape(), 5);
        for i in 0..3 {
            let part = ctx.join_backward(JoinOp::Stack, &g, axis, i, 1)?;
            assert_eq!(bits(&part), bits(&g.narrow(axis, i, 1)?.squeeze(axis)?));
        }
    }
    let g = tensor(&ctx, &[3, 2, 3], 6);
    assert!(matches!(
        ctx.join_backward(JoinOp::Stack, &g, 0, 0, 2),
        Err(ExecError::InvalidArgument { .. })
    ));
    assert!(ctx.join_backward(JoinOp::Concat, &g, 0, 2, 2).is_err());
    assert!(
        ctx.join(JoinOp::Concat, &[&a, &tensor(&ctx, &[3, 3], 7)], 1)
            .is_err()
    );
    Ok(())
}

#[test]
fn index_descriptor_matches_the_gathering_ops() -> R {
    let ctx = ExecContext::with_threads(2);
    let x = tensor(&ctx, &[4, 5, 3], 1);
    let idx = ctx.from_slice_typed::<i64>(&[6], &[3, 0, 3, 1, 2, 0])?;
    for axis in 0..2 {
        let y = ctx.index_select(&x, axis, &idx)?;
        assert_eq!(
            bits(&ctx.index_op(IndexOp::IndexSelect, &x, axis, &idx)?),
            bits(&y)
        );
        let g = tensor(&ctx, y.shape(), 2);
        assert_eq!(
            bits(&ctx.index_op_backward(IndexOp::IndexSelect, &g, axis, &idx, x.shape())?),
            bits(&ctx.index_select_backward(&g, axis, &idx, x.shape())?)
        );
    }
    let gi = ctx.from_slice_typed::<i64>(
        &[4, 2, 3],
        &[
            1, 0, 4, 2, 2, 3, 0, 1, 1, 4, 4, 0, 3, 3, 2, 1, 0, 0, 2, 4, 1, 0, 3, 2,
        ],
    )?;
    let y = ctx.gather(&x, 1, &gi)?;
    assert_eq!(bits(&ctx.index_op(IndexOp::Gather, &x, 1, &gi)?), bits(&y));
    let g = tensor(&ctx, y.shape(), 3);
    assert_eq!(
        bits(&ctx.index_op_backward(IndexOp::Gather, &g, 1, &gi, x.shape())?),
        bits(&ctx.gather_backward(&g, 1, &gi, x.shape())?)
    );
    let table = tensor(&ctx, &[5, 3], 4);
    let ids = ctx.from_slice_typed::<i64>(&[2, 3], &[4, 0, 4, 1, 2, 0])?;
    let e = ctx.embedding(&table, &ids)?;
    assert_eq!(
        bits(&ctx.index_op(IndexOp::Embedding, &table, 0, &ids)?),
        bits(&e)
    );
    let g = tensor(&ctx, e.shape(), 5);
    assert_eq!(
        bits(&ctx.index_op_backward(IndexOp::Embedding, &g, 0, &ids, &[5, 3])?),
        bits(&ctx.embedding_backward(&g, &ids, 5)?)
    );
    // An embedding looks rows up: axis 0 only, a 2-D table, a matching width.
    assert!(matches!(
        ctx.index_op(IndexOp::Embedding, &table, 1, &ids),
        Err(ExecError::InvalidArgument {
            op: "embedding",
            ..
        })
    ));
    assert!(matches!(
        ctx.index_op_backward(IndexOp::Embedding, &g, 0, &ids, &[5, 3, 1]),
        Err(ExecError::InvalidShape { .. })
    ));
    assert!(matches!(
        ctx.index_op_backward(IndexOp::Embedding, &g, 0, &ids, &[5, 4]),
        Err(ExecError::ShapeMismatch { .. })
    ));
    let bad = ctx.from_slice_typed::<i64>(&[1], &[5])?;
    assert!(matches!(
        ctx.index_op(IndexOp::IndexSelect, &x, 1, &bad),
        Err(ExecError::IndexOutOfBounds { .. })
    ));
    for op in IndexOp::ALL {
        assert!(op.backward_name().starts_with(op.name()));
    }
    Ok(())
}

#[test]
fn view_descriptor_matches_the_views() -> R {
    let ctx = ExecContext::with_threads(1);
    let x = tensor(&ctx, &[2, 3, 4], 1);
    let xt = x.transpose(0, 2)?; // [4, 3, 2], not contiguous
    let x1 = tensor(&ctx, &[2, 1, 4], 2);
    let cases: [(ViewOp, &RawTensor, RawTensor); 9] = [
        (ViewOp::Reshape(Dims::new(&[6, 4])), &x, x.reshape(&[6, 4])?),
        (
            ViewOp::Reshape(Dims::new(&[24])),
            &xt,
            ctx.materialize(&xt)?.reshape(&[24])?,
        ),
        (
            ViewOp::Permute(Dims::new(&[2, 0, 1])),
            &x,
            x.permute(&[2, 0, 1])?,
        ),
        (ViewOp::Transpose(0, 2), &x, x.transpose(0, 2)?),
        (
            ViewOp::Narrow {
                axis: 1,
                start: 1,
                len: 2,
            },
            &x,
            x.narrow(1, 1, 2)?,
        ),
        (ViewOp::Squeeze(1), &x1, x1.squeeze(1)?),
        (ViewOp::Unsqueeze(3), &x, x.unsqueeze(3)?),
        (
            ViewOp::BroadcastTo(Dims::new(&[3, 2, 5, 4])),
            &x1,
            x1.broadcast_to(&[3, 2, 5, 4])?,
        ),
        (ViewOp::Materialize, &xt, ctx.materialize(&xt)?),
    ];
    for (op, input, want) in cases {
        let y = ctx.view_op(op, input)?;
        assert_eq!((y.shape(), bits(&y)), (want.shape(), bits(&want)), "{op:?}");
        // The backward gives the input's shape; composed with the forward of a
        // gradient it is the adjoint: <view(x), g> = <x, view_backward(g)>.
        let g = tensor(&ctx, y.shape(), 3);
        let gx = ctx.view_op_backward(op, input.shape(), &g)?;
        assert_eq!(gx.shape(), input.shape(), "{op:?}");
        let dot = |a: &RawTensor, b: &RawTensor| -> f64 {
            a.to_vec()
                .iter()
                .zip(b.to_vec())
                .map(|(&p, q)| f64::from(p) * f64::from(q))
                .sum()
        };
        let (lhs, rhs) = (dot(&y, &g), dot(input, &gx));
        assert!(
            (lhs - rhs).abs() <= 1e-4 * lhs.abs().max(1.0),
            "{op:?}: {lhs} vs {rhs}"
        );
    }
    // The kernels of the old named backward paths, bit for bit.
    let g = tensor(&ctx, &[2, 2, 4], 4);
    let gx = ctx.view_op_backward(
        ViewOp::Narrow {
            axis: 1,
            start: 1,
            len: 2,
        },
        x.shape(),
        &g,
    )?;
    let mut want = vec![0.0; 24];
    for (k, v) in g.to_vec().into_iter().enumerate() {
        let (i, j, l) = (k / 8, (k / 4) % 2, k % 4);
        want[i * 12 + (j + 1) * 4 + l] = v;
    }
    assert_eq!(gx.to_vec(), want);
    let g = tensor(&ctx, &[3, 2, 5, 4], 5);
    assert_eq!(
        bits(&ctx.view_op_backward(
            ViewOp::BroadcastTo(Dims::new(&[3, 2, 5, 4])),
            x1.shape(),
            &g
        )?),
        bits(&ctx.sum_to(&g, x1.shape())?)
    );
    Ok(())
}

#[test]
fn view_descriptor_errors() {
    let ctx = ExecContext::with_threads(1);
    let x = tensor(&ctx, &[2, 3], 1);
    // A shape longer than eight is refused, not cut to eight values.
    let nine = Dims::new(&[1; 9]);
    for op in [
        ViewOp::Reshape(nine),
        ViewOp::BroadcastTo(nine),
        ViewOp::Permute(nine),
    ] {
        assert!(
            matches!(ctx.view_op(op, &x), Err(ExecError::InvalidShape { .. })),
            "{op:?}"
        );
    }
    assert!(ctx.view_op(ViewOp::Reshape(Dims::new(&[4])), &x).is_err());
    assert!(matches!(
        ctx.view_op(ViewOp::Transpose(0, 2), &x),
        Err(ExecError::InvalidAxis { .. })
    ));
    // A gradient that does not fit the view is refused, not misread.
    let g = tensor(&ctx, &[2, 2], 2);
    let narrow = ViewOp::Narrow {
        axis: 1,
        start: 1,
        len: 2,
    };
    assert!(ctx.view_op_backward(narrow, &[2, 3], &g).is_ok());
    for (op, shape) in [
        (narrow, &[3, 3][..]),
        (
            ViewOp::Narrow {
                axis: 2,
                start: 0,
                len: 2,
            },
            &[2, 3][..],
        ),
        (ViewOp::Transpose(0, 1), &[2, 3][..]),
        (ViewOp::Permute(Dims::new(&[1, 5])), &[2, 2][..]),
        (ViewOp::Materialize, &[4][..]),
    ] {
        assert!(
            ctx.view_op_backward(op, shape, &g).is_err(),
            "{op:?} {shape:?}"
        );
    }
}

/// The shape of a forward's result, or its error, as `out_shape` reports them.
fn shape_of(r: Result<RawTensor, ExecError>) -> Result<Vec<usize>, ExecError> {
    r.map(|t| t.shape().to_vec())
}

fn dims_of(r: Result<Dims, ExecError>) -> Result<Vec<usize>, ExecError> {
    r.map(|d| d.as_slice().to_vec())
}

/// Shapes and axes (negative, out of range) for the axis-reduction families.
const AXIS_CASES: &[(&[usize], i32)] = &[
    (&[2, 3, 4], 0),
    (&[2, 3, 4], 1),
    (&[2, 3, 4], 2),
    (&[2, 3, 4], -1),
    (&[2, 3, 4], -3),
    (&[2, 3, 4], 3),
    (&[2, 3, 4], -4),
    (&[5], 0),
    (&[5], -1),
    (&[5], 1),
];

#[test]
fn reduction_out_shapes_match_the_forwards() -> R {
    let ctx = ExecContext::with_threads(1);
    for (seed, &(shape, axis)) in AXIS_CASES.iter().enumerate() {
        let x = tensor(&ctx, shape, seed as u64);
        for keepdim in [false, true] {
            let case = format!("{shape:?} axis {axis} keepdim {keepdim}");
            for &op in AxisReduction::ALL {
                assert_eq!(
                    shape_of(ctx.reduce(op, &x, axis, keepdim)),
                    dims_of(op.out_shape(shape, axis, keepdim)),
                    "{op:?} {case}"
                );
            }
            for op in [
                AxisStatistic::Variance { unbiased: true },
                AxisStatistic::Variance { unbiased: false },
                AxisStatistic::LogSumExp,
            ] {
                assert_eq!(
                    shape_of(ctx.statistic(op, &x, axis, keepdim)),
                    dims_of(op.out_shape(shape, axis, keepdim)),
                    "{op:?} {case}"
                );
            }
        }
    }
    // The gradient-shape checks use the same rule: a gradient of the forward's
    // shape is accepted, one of the other keepdim's shape refused.
    let x = tensor(&ctx, &[2, 3, 4], 1);
    for &op in AxisReduction::ALL {
        let g = tensor(&ctx, op.out_shape(x.shape(), -2, true)?.as_slice(), 2);
        ctx.reduce_backward(op, Some(&x), x.shape(), &g, -2, true)?;
        assert!(matches!(
            ctx.reduce_backward(op, Some(&x), x.shape(), &g, -2, false),
            Err(ExecError::ShapeMismatch { .. })
        ));
    }
    for shape in [&[2, 3, 4][..], &[5], &[1, 1]] {
        let x = tensor(&ctx, shape, 3);
        for &op in FullReduction::ALL {
            assert_eq!(
                ctx.reduce_all(op, &x)?.shape(),
                op.out_shape(shape).as_slice(),
                "{op:?} {shape:?}"
            );
        }
    }
    Ok(())
}

#[test]
fn elementwise_out_shapes_match_the_forwards() -> R {
    let ctx = ExecContext::with_threads(1);
    // Broadcasting on either side, equal shapes, and shapes that do not
    // broadcast.
    let pairs: &[(&[usize], &[usize])] = &[
        (&[2, 3], &[2, 3]),
        (&[2, 3], &[3]),
        (&[3, 1], &[2, 1, 4]),
        (&[1], &[4, 2]),
        (&[2, 3], &[4]),
        (&[2, 3], &[3, 2]),
    ];
    for (seed, &(sa, sb)) in pairs.iter().enumerate() {
        let (a, b) = (tensor(&ctx, sa, 2 * seed as u64), tensor(&ctx, sb, 7));
        for &op in BinaryOp::ALL {
            assert_eq!(
                shape_of(ctx.binary(op, &a, &b)),
                dims_of(op.out_shape(sa, sb)),
                "{op:?} {sa:?} {sb:?}"
            );
        }
        // The mask as the first shape, the operands the second (and a third).
        let mask = ctx.ones_typed::<bool>(sa)?;
        let other = tensor(&ctx, &[1, 1], 3);
        assert_eq!(
            shape_of(ctx.mask_op(MaskOp::Where, &mask, &b, Some(&other))),
            dims_of(MaskOp::Where.out_shape(sa, sb, Some(&[1, 1]))),
            "where {sa:?} {sb:?}"
        );
        let fill = MaskOp::MaskedFill(9.0);
        assert_eq!(
            shape_of(ctx.mask_op(fill, &mask, &b, None)),
            dims_of(fill.out_shape(sa, sb, None)),
            "masked_fill {sa:?} {sb:?}"
        );
    }
    // A wrong operand count is the same error from both.
    let (mask, x) = (ctx.ones_typed::<bool>(&[2])?, tensor(&ctx, &[2], 1));
    for (op, other) in [(MaskOp::Where, None), (MaskOp::MaskedFill(0.0), Some(&x))] {
        assert_eq!(
            shape_of(ctx.mask_op(op, &mask, &x, other)),
            dims_of(op.out_shape(&[2], &[2], other.map(|t| t.shape()))),
            "{op:?}"
        );
    }

    // The shape-preserving families.
    for shape in [&[2, 3][..], &[4], &[2, 1, 3]] {
        let x = ctx.from_slice(
            shape,
            &support::uniform(5, shape.iter().product(), 0.5, 2.0),
        )?;
        for &op in UnaryOp::ALL {
            assert_eq!(ctx.unary(op, &x)?.shape(), op.out_shape(shape).as_slice());
        }
        for op in [
            ScalarOp::Scale(2.0),
            ScalarOp::AddScalar(1.0),
            ScalarOp::PowScalar(2.0),
            ScalarOp::Clamp { min: 0.0, max: 1.0 },
            ScalarOp::Dropout { p: 0.5, seed: 3 },
        ] {
            assert_eq!(
                ctx.scalar_op(op, &x)?.shape(),
                op.out_shape(shape).as_slice()
            );
        }
        for &op in SoftmaxOp::ALL {
            assert_eq!(
                ctx.softmax_op(op, &x, -1)?.shape(),
                op.out_shape(shape).as_slice()
            );
        }
        let last = *shape.last().unwrap();
        let (gamma, beta) = (tensor(&ctx, &[last], 8), tensor(&ctx, &[last], 9));
        for (op, beta) in [
            (NormOp::LayerNorm { eps: 1e-5 }, Some(&beta)),
            (NormOp::RmsNorm { eps: 1e-5 }, None),
        ] {
            assert_eq!(
                ctx.norm_op(op, &x, &gamma, beta)?.shape(),
                op.out_shape(shape).as_slice()
            );
        }
    }
    Ok(())
}

#[test]
fn product_out_shapes_match_the_forwards() -> R {
    let ctx = ExecContext::with_threads(1);
    // Vectors, matrices, broadcast batches, inner-dimension and batch mismatches.
    let cases: &[(&[usize], &[usize])] = &[
        (&[3], &[3]),
        (&[3], &[3, 4]),
        (&[2, 3], &[3]),
        (&[2, 3], &[3, 4]),
        (&[5, 1, 2, 3], &[7, 3, 4]),
        (&[2, 3], &[4, 5]),
        (&[2, 2, 3], &[3, 3, 4]),
        (&[3], &[4]),
    ];
    for (seed, &(sa, sb)) in cases.iter().enumerate() {
        let (a, b) = (tensor(&ctx, sa, seed as u64), tensor(&ctx, sb, 9));
        assert_eq!(
            shape_of(ctx.matmul(&a, &b)),
            dims_of(ProductOp::Matmul.out_shape(sa, sb)),
            "matmul {sa:?} {sb:?}"
        );
    }
    // linear: x [..., in] against w [out, in]; 1-D inputs, bad weights.
    let cases: &[(&[usize], &[usize])] = &[
        (&[4], &[3, 4]),
        (&[2, 4], &[3, 4]),
        (&[2, 5, 4], &[3, 4]),
        (&[2, 4], &[4, 3]),
        (&[2, 4], &[3, 4, 1]),
        (&[2, 4], &[4]),
    ];
    for (seed, &(sx, sw)) in cases.iter().enumerate() {
        let (x, w) = (tensor(&ctx, sx, seed as u64), tensor(&ctx, sw, 8));
        assert_eq!(
            shape_of(ctx.linear(&x, &w, None)),
            dims_of(ProductOp::Linear.out_shape(sx, sw)),
            "linear {sx:?} {sw:?}"
        );
    }
    // Shapes no tensor can have are errors, not panics.
    assert!(ProductOp::Matmul.out_shape(&[], &[3]).is_err());
    assert!(ProductOp::Linear.out_shape(&[0, 3], &[2, 3]).is_err());
    Ok(())
}

#[test]
fn join_and_index_out_shapes_match_the_forwards() -> R {
    let ctx = ExecContext::with_threads(1);
    let part_cases: &[&[&[usize]]] = &[
        &[&[2, 3], &[2, 1], &[2, 2]],
        &[&[2, 3], &[2, 3]],
        &[&[2, 3], &[4, 3]],
        &[&[2, 3], &[2, 3, 1]],
        &[&[4]],
        &[],
    ];
    for parts_shapes in part_cases {
        let parts: Vec<RawTensor> = parts_shapes
            .iter()
            .enumerate()
            .map(|(i, s)| tensor(&ctx, s, i as u64))
            .collect();
        let refs: Vec<&RawTensor> = parts.iter().collect();
        for axis in [0, 1, -1, 2, -3, 3] {
            for &op in JoinOp::ALL {
                assert_eq!(
                    shape_of(ctx.join(op, &refs, axis)),
                    dims_of(op.out_shape(parts_shapes.iter().copied(), axis)),
                    "{op:?} {parts_shapes:?} axis {axis}"
                );
            }
        }
    }
    // Gathers: the index's shape decides, its values do not.
    let x = tensor(&ctx, &[4, 5], 1);
    let index_cases: &[&[usize]] = &[&[3], &[2, 2], &[4, 6], &[5, 5], &[2, 2, 1]];
    for &ishape in index_cases {
        let n: usize = ishape.iter().product();
        let index = ctx.from_slice_typed::<i64>(ishape, &vec![0; n])?;
        for axis in [0, 1, -1, 2] {
            for &op in IndexOp::ALL {
                assert_eq!(
                    shape_of(ctx.index_op(op, &x, axis, &index)),
                    dims_of(op.out_shape(x.shape(), axis, ishape)),
                    "{op:?} index {ishape:?} axis {axis}"
                );
            }
        }
    }
    assert!(IndexOp::Gather.out_shape(&[4, 5], 0, &[]).is_err());
    Ok(())
}

#[test]
fn view_and_loss_out_shapes_match_the_forwards() -> R {
    let ctx = ExecContext::with_threads(1);
    let x = tensor(&ctx, &[2, 3, 4], 1);
    let views = [
        ViewOp::Reshape(Dims::new(&[6, 4])),
        ViewOp::Reshape(Dims::new(&[5, 4])),
        ViewOp::Permute(Dims::new(&[2, 0, 1])),
        ViewOp::Permute(Dims::new(&[0, 0, 1])),
        ViewOp::Transpose(0, 2),
        ViewOp::Transpose(0, 3),
        ViewOp::Narrow {
            axis: 1,
            start: 1,
            len: 2,
        },
        ViewOp::Narrow {
            axis: 1,
            start: 2,
            len: 2,
        },
        ViewOp::Squeeze(0),
        ViewOp::Unsqueeze(3),
        ViewOp::Unsqueeze(4),
        ViewOp::BroadcastTo(Dims::new(&[5, 2, 3, 4])),
        ViewOp::BroadcastTo(Dims::new(&[2, 2, 4])),
        ViewOp::Materialize,
    ];
    for op in views {
        assert_eq!(
            shape_of(ctx.view_op(op, &x)),
            dims_of(op.out_shape(x.shape())),
            "{op:?}"
        );
    }
    // A transposed input: the rule is the same (reshape copies first).
    let t = x.transpose(0, 2)?;
    let op = ViewOp::Reshape(Dims::new(&[4, 6]));
    assert_eq!(
        shape_of(ctx.view_op(op, &t)),
        dims_of(op.out_shape(t.shape()))
    );

    // Losses: [1], or the shape errors of the forwards.
    let score_cases: &[(&[usize], &[usize])] = &[
        (&[3, 4], &[3]),
        (&[3, 4], &[4]),
        (&[3, 4, 1], &[3]),
        (&[12], &[3]),
    ];
    for &(ss, ls) in score_cases {
        let scores = tensor(&ctx, ss, 2);
        let labels = ctx.from_slice_typed::<i64>(ls, &vec![0; ls.iter().product()])?;
        for &op in ClassLoss::ALL {
            assert_eq!(
                shape_of(ctx.class_loss(op, &scores, &labels)),
                dims_of(op.out_shape(ss, ls)),
                "{op:?} {ss:?} {ls:?}"
            );
        }
    }
    for (sa, sb) in [(&[2, 3][..], &[2, 3][..]), (&[2, 3][..], &[3, 2][..])] {
        let (a, b) = (tensor(&ctx, sa, 3), tensor(&ctx, sb, 4));
        for &op in RegressionLoss::ALL {
            assert_eq!(
                shape_of(ctx.regression_loss(op, &a, &b)),
                dims_of(op.out_shape(sa, sb)),
                "{op:?} {sa:?} {sb:?}"
            );
        }
    }
    Ok(())
}
