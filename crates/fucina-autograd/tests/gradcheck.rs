//! A finite-difference check of every differentiable op, on shapes with
//! broadcasting and on non-contiguous (transposed, narrowed) inputs.

mod support;

use fucina_autograd::exec::ExecContext;
use fucina_autograd::{GradcheckOptions, Tensor, gradcheck};
use support::{away_from_zero, check, check_layouts, values};

const S23: &[usize] = &[2, 3];
const S3: &[usize] = &[3];
const S21: &[usize] = &[2, 1];

#[test]
fn gradcheck_detects_a_wrong_gradient() {
    // A function whose recorded gradient is wrong: y = detach(x) * x has true
    // derivative 2x but backward sees only x.
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[3], &[0.5, 1.0, -2.0]).unwrap();
    let r = gradcheck(
        &ctx,
        |ctx, t| t[0].detach().mul(ctx, &t[0]),
        &[x],
        &GradcheckOptions::default(),
    )
    .unwrap();
    assert!(!r.passed);
    let w = r.worst.unwrap();
    assert!((w.analytic - w.numeric).abs() > 0.1, "{w:?}");
}

macro_rules! unary_checks {
    ($($test:ident: $op:ident over $vals:expr;)*) => {$(
        #[test]
        fn $test() {
            let ctx = ExecContext::new();
            let v: Vec<f32> = $vals;
            check_layouts(&ctx, stringify!($op), |ctx, t| t[0].$op(ctx), &[(S23, v)]);
        }
    )*};
}

unary_checks! {
    neg: neg over values(6, 1, -2.0, 2.0);
    abs: abs over away_from_zero(6, 2, 0.2, 2.0);
    exp: exp over values(6, 3, -2.0, 1.5);
    log: log over values(6, 4, 0.3, 3.0);
    sqrt: sqrt over values(6, 5, 0.3, 3.0);
    rsqrt: rsqrt over values(6, 6, 0.5, 3.0);
    sigmoid: sigmoid over values(6, 7, -3.0, 3.0);
    tanh: tanh over values(6, 8, -2.0, 2.0);
    relu: relu over away_from_zero(6, 9, 0.2, 2.0);
    gelu: gelu over values(6, 10, -3.0, 3.0);
    gelu_erf: gelu_erf over values(6, 11, -3.0, 3.0);
    silu: silu over values(6, 12, -3.0, 3.0);
    softplus: softplus over values(6, 13, -3.0, 3.0);
    logsigmoid: logsigmoid over values(6, 16, -3.0, 3.0);
    mish: mish over values(6, 17, -3.0, 3.0);
    hardswish: hardswish over away_from_zero(6, 18, 0.2, 2.5);
    sin: sin over values(6, 14, -3.0, 3.0);
    cos: cos over values(6, 15, -3.0, 3.0);
}

macro_rules! binary_checks {
    ($($test:ident: $op:ident over $a:expr, $b:expr;)*) => {$(
        #[test]
        fn $test() {
            let ctx = ExecContext::new();
            // Same shape, then broadcasting on either side.
            for (sa, sb) in [(S23, S23), (S23, S3), (S21, S23), (S23, S21)] {
                let na: usize = sa.iter().product();
                let nb: usize = sb.iter().product();
                let a: Vec<f32> = $a(na);
                let b: Vec<f32> = $b(nb);
                check_layouts(
                    &ctx,
                    &format!("{} {sa:?} {sb:?}", stringify!($op)),
                    |ctx, t| t[0].$op(ctx, &t[1]),
                    &[(sa, a), (sb, b)],
                );
            }
        }
    )*};
}

binary_checks! {
    add: add over |n| values(n, 21, -2.0, 2.0), |n| values(n, 22, -2.0, 2.0);
    sub: sub over |n| values(n, 23, -2.0, 2.0), |n| values(n, 24, -2.0, 2.0);
    mul: mul over |n| values(n, 25, -2.0, 2.0), |n| values(n, 26, -2.0, 2.0);
    div: div over |n| values(n, 27, -2.0, 2.0), |n| away_from_zero(n, 28, 0.5, 2.0);
    pow: pow over |n| values(n, 29, 0.5, 2.0), |n| values(n, 30, -1.5, 2.0);
    // Disjoint ranges: no ties, no kinks.
    maximum: maximum over |n| away_from_zero(n, 31, 0.6, 2.0), |n| values(n, 32, -0.4, 0.4);
    minimum: minimum over |n| away_from_zero(n, 33, 0.6, 2.0), |n| values(n, 34, -0.4, 0.4);
}

#[test]
fn scalar_forms() {
    let ctx = ExecContext::new();
    let v = values(6, 40, 0.3, 2.0);
    check_layouts(
        &ctx,
        "scale",
        |c, t| t[0].scale(c, -1.7),
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "add_scalar",
        |c, t| t[0].add_scalar(c, 0.3)?.mul(c, &t[0]),
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "pow_scalar 2",
        |c, t| t[0].pow_scalar(c, 2.0),
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "pow_scalar 1.5",
        |c, t| t[0].pow_scalar(c, 1.5),
        &[(S23, v)],
    );
    // Clamp: values away from the bounds on both sides.
    let v = [-1.5, -0.2, 0.3, 1.4, 0.1, 2.0];
    check_layouts(
        &ctx,
        "clamp",
        |c, t| t[0].clamp(c, -1.0, 1.0),
        &[(S23, v.to_vec())],
    );
}

#[test]
fn selection_and_dropout() {
    let ctx = ExecContext::new();
    let cond = ctx
        .from_slice_typed::<bool>(&[3], &[true, false, true])
        .unwrap();
    let a = values(6, 41, -2.0, 2.0);
    let b = values(2, 42, -2.0, 2.0);
    let c2 = cond.clone();
    check_layouts(
        &ctx,
        "where_",
        move |c, t| Tensor::where_(c, &c2, &t[0], &t[1])?.mul(c, &t[0]),
        &[(S23, a.clone()), (S21, b)],
    );
    check_layouts(
        &ctx,
        "masked_fill",
        move |c, t| t[0].masked_fill(c, &cond, 3.0)?.exp(c),
        &[(S23, a.clone())],
    );
    check_layouts(
        &ctx,
        "dropout",
        |c, t| t[0].dropout(c, 0.4, 99)?.tanh(c),
        &[(S23, a)],
    );
}

#[test]
fn views() {
    let ctx = ExecContext::new();
    let v = values(6, 50, -2.0, 2.0);
    check_layouts(
        &ctx,
        "reshape",
        |c, t| {
            t[0].reshape(c, &[3, 2])?
                .mul(c, &Tensor::from_slice(c, &[2], &[1.0, 2.0])?)
        },
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "transpose",
        |c, t| t[0].transpose(c, 0, 1)?.exp(c),
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "permute",
        |c, t| t[0].reshape(c, &[1, 2, 3])?.permute(c, &[2, 0, 1])?.sin(c),
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "narrow",
        |c, t| t[0].narrow(c, 1, 1, 2)?.exp(c),
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "squeeze/unsqueeze",
        |c, t| t[0].unsqueeze(c, 1)?.tanh(c)?.squeeze(c, 1),
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "broadcast_to",
        |c, t| t[0].broadcast_to(c, &[4, 2, 3])?.sin(c),
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "materialize",
        |c, t| t[0].transpose(c, 0, 1)?.materialize(c)?.cos(c),
        &[(S23, v)],
    );
}

#[test]
fn reductions() {
    let ctx = ExecContext::new();
    let v = values(6, 60, -2.0, 2.0);
    check_layouts(
        &ctx,
        "sum_all",
        |c, t| t[0].sin(c)?.sum_all(c),
        &[(S23, v.clone())],
    );
    check_layouts(
        &ctx,
        "mean_all",
        |c, t| t[0].exp(c)?.mean_all(c),
        &[(S23, v.clone())],
    );
    for axis in [0, 1] {
        for keepdim in [false, true] {
            let what = |op: &str| format!("{op} axis {axis} keepdim {keepdim}");
            check_layouts(
                &ctx,
                &what("sum"),
                move |c, t| t[0].sum(c, axis, keepdim)?.sin(c),
                &[(S23, v.clone())],
            );
            check_layouts(
                &ctx,
                &what("mean"),
                move |c, t| t[0].mean(c, axis, keepdim)?.sin(c),
                &[(S23, v.clone())],
            );
            // Distinct values: no ties for the extrema.
            check_layouts(
                &ctx,
                &what("max"),
                move |c, t| t[0].max(c, axis, keepdim)?.sin(c),
                &[(S23, v.clone())],
            );
            check_layouts(
                &ctx,
                &what("min"),
                move |c, t| t[0].min(c, axis, keepdim)?.sin(c),
                &[(S23, v.clone())],
            );
            check_layouts(
                &ctx,
                &what("logsumexp"),
                move |c, t| t[0].logsumexp(c, axis, keepdim),
                &[(S23, v.clone())],
            );
            for unbiased in [false, true] {
                check_layouts(
                    &ctx,
                    &format!("{} unbiased {unbiased}", what("variance")),
                    move |c, t| t[0].variance(c, axis, keepdim, unbiased),
                    &[(S23, v.clone())],
                );
            }
        }
    }
}

#[test]
fn softmax_family_and_norms() {
    let ctx = ExecContext::new();
    let v = values(6, 61, -2.0, 2.0);
    for axis in [0, 1] {
        check_layouts(
            &ctx,
            "softmax",
            move |c, t| t[0].softmax(c, axis)?.mul(c, &t[0]),
            &[(S23, v.clone())],
        );
        check_layouts(
            &ctx,
            "log_softmax",
            move |c, t| t[0].log_softmax(c, axis),
            &[(S23, v.clone())],
        );
    }
    let gamma = values(3, 62, 0.5, 1.5);
    let beta = values(3, 63, -0.5, 0.5);
    check_layouts(
        &ctx,
        "layer_norm",
        |c, t| t[0].layer_norm(c, &t[1], &t[2], 1e-5),
        &[(S23, v.clone()), (S3, gamma.clone()), (S3, beta)],
    );
    check_layouts(
        &ctx,
        "rms_norm",
        |c, t| t[0].rms_norm(c, &t[1], 1e-5),
        &[(S23, v.clone()), (S3, gamma)],
    );
    check_layouts(
        &ctx,
        "l2_normalize",
        |c, t| t[0].l2_normalize(c, 1, 1e-6),
        &[(S23, v.clone())],
    );
    let w = values(6, 64, -2.0, 2.0);
    check_layouts(
        &ctx,
        "cosine_similarity",
        |c, t| t[0].cosine_similarity(c, &t[1], 1, 1e-6),
        &[(S23, v), (S23, w)],
    );
}

#[test]
fn losses() {
    let ctx = ExecContext::new();
    let labels = ctx.from_slice_typed::<i64>(&[2], &[2, 0]).unwrap();
    let logits = values(6, 65, -2.0, 2.0);
    let l2 = labels.clone();
    check_layouts(
        &ctx,
        "cross_entropy",
        move |c, t| t[0].cross_entropy(c, &l2),
        &[(S23, logits.clone())],
    );
    check_layouts(
        &ctx,
        "nll_loss",
        move |c, t| t[0].log_softmax(c, 1)?.nll_loss(c, &labels),
        &[(S23, logits.clone())],
    );
    let target = values(6, 66, -2.0, 2.0);
    check_layouts(
        &ctx,
        "mse_loss",
        |c, t| t[0].mse_loss(c, &t[1]),
        &[(S23, logits), (S23, target)],
    );
}

#[test]
fn composite_with_shared_operands() {
    let ctx = ExecContext::new();
    let x = values(6, 70, -1.0, 1.0);
    let w = values(3, 71, -1.0, 1.0);
    check_layouts(
        &ctx,
        "composite",
        |c, t| {
            let h = t[0].mul(c, &t[1])?.tanh(c)?;
            h.mul(c, &t[0])?.add(c, &h)?.div(c, &t[1].exp(c)?)
        },
        &[(S23, x), (S3, w)],
    );
}

#[test]
fn a_broadcast_view_as_a_variable() {
    let ctx = ExecContext::new();
    let base = ctx.from_slice(&[3], &[0.3, -0.5, 0.9]).unwrap();
    let b = base.broadcast_to(&[2, 3]).unwrap();
    check(&ctx, "broadcast leaf", |c, t| t[0].exp(c), &[b]);
}

#[test]
fn joins_and_indexing() {
    let ctx = ExecContext::new();
    let a = values(6, 80, -2.0, 2.0);
    let b = values(2, 81, -2.0, 2.0);
    check_layouts(
        &ctx,
        "concat",
        |c, t| Tensor::concat(c, &[&t[0], &t[1]], 1)?.sin(c),
        &[(S23, a.clone()), (S21, b)],
    );
    let a2 = values(6, 82, -2.0, 2.0);
    check_layouts(
        &ctx,
        "stack",
        |c, t| Tensor::stack(c, &[&t[0], &t[1]], 1)?.sin(c),
        &[(S23, a.clone()), (S23, a2)],
    );
    // Repeated indices: their gradients add up.
    let idx = ctx.from_slice_typed::<i64>(&[4], &[2, 0, 2, 1]).unwrap();
    let i2 = idx.clone();
    check_layouts(
        &ctx,
        "index_select",
        move |c, t| t[0].index_select(c, 1, &i2)?.sin(c),
        &[(S23, a.clone())],
    );
    let ids = ctx.from_slice_typed::<i64>(&[2, 2], &[1, 2, 1, 0]).unwrap();
    check_layouts(
        &ctx,
        "embedding",
        move |c, t| t[0].transpose(c, 0, 1)?.embedding(c, &ids)?.cos(c),
        &[(S23, a.clone())],
    );
    let gi = ctx.from_slice_typed::<i64>(&[2, 2], &[2, 0, 1, 1]).unwrap();
    check_layouts(
        &ctx,
        "gather",
        move |c, t| t[0].gather(c, 1, &gi)?.exp(c),
        &[(S23, a)],
    );
    // Distinct values: no ties at the selection boundary.
    let v = [0.3, -1.2, 0.9, 1.7, -0.4, 0.1];
    check_layouts(
        &ctx,
        "topk",
        |c, t| t[0].topk(c, 2, 1, true)?.0.sin(c),
        &[(S23, v.to_vec())],
    );
}

#[test]
fn matmul_and_linear() {
    let ctx = ExecContext::new();
    let a = values(6, 90, -1.0, 1.0);
    let b = values(12, 91, -1.0, 1.0);
    check_layouts(
        &ctx,
        "matmul 2d",
        |c, t| t[0].matmul(c, &t[1]),
        &[(S23, a.clone()), (&[3, 4], b.clone())],
    );
    let a3 = values(12, 92, -1.0, 1.0);
    check_layouts(
        &ctx,
        "matmul batched, broadcast rhs",
        |c, t| t[0].matmul(c, &t[1]),
        &[(&[2, 2, 3], a3.clone()), (&[3, 4], b.clone())],
    );
    let b3 = values(24, 93, -1.0, 1.0);
    check_layouts(
        &ctx,
        "matmul batched",
        |c, t| t[0].matmul(c, &t[1])?.tanh(c),
        &[(&[2, 2, 3], a3.clone()), (&[2, 3, 4], b3)],
    );
    let w = values(12, 94, -1.0, 1.0); // [4, 3]: out 4, in 3
    let bias = values(4, 95, -1.0, 1.0);
    check_layouts(
        &ctx,
        "linear",
        |c, t| t[0].linear(c, &t[1], Some(&t[2]))?.tanh(c),
        &[(S23, a.clone()), (&[4, 3], w.clone()), (&[4], bias.clone())],
    );
    check_layouts(
        &ctx,
        "linear without bias, batched input",
        |c, t| t[0].linear(c, &t[1], None)?.sin(c),
        &[(&[2, 2, 3], a3), (&[4, 3], w.clone())],
    );
    // A constant input (the first layer over data): only the weight and bias
    // gradients are computed.
    let x = Tensor::constant(ctx.from_slice(S23, &a).unwrap());
    let x2 = x.clone();
    check_layouts(
        &ctx,
        "linear over a constant input",
        move |c, t| x2.linear(c, &t[0], Some(&t[1]))?.tanh(c),
        &[(&[4, 3], w.clone()), (&[4], bias)],
    );
    check_layouts(
        &ctx,
        "linear over a constant input, no bias",
        move |c, t| x.linear(c, &t[0], None)?.tanh(c),
        &[(&[4, 3], w)],
    );
}
