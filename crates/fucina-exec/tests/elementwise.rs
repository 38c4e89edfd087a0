//! Elementwise ops against a naive reference, over every layout class.

mod support;

use fucina_exec::{ExecContext, ExecError, PARALLEL_THRESHOLD, RawTensor};
use proptest::prelude::*;
use support::{bits, layouts, naive_binary, unravel, values};

type Binary = fn(&ExecContext, &RawTensor, &RawTensor) -> Result<RawTensor, ExecError>;
type BinaryRow = (&'static str, Binary, fn(f32, f32) -> f32);

fn binary_table() -> Vec<BinaryRow> {
    vec![
        ("add", ExecContext::add, |a, b| a + b),
        ("sub", ExecContext::sub, |a, b| a - b),
        ("mul", ExecContext::mul, |a, b| a * b),
        ("div", ExecContext::div, |a, b| a / b),
        ("maximum", ExecContext::maximum, f32::max),
        ("minimum", ExecContext::minimum, f32::min),
        ("pow", ExecContext::pow, f32::powf),
    ]
}

type Unary = fn(&ExecContext, &RawTensor) -> Result<RawTensor, ExecError>;
/// An op, its reference, and the allowed relative error in units of `2^-23`
/// (`0`: bitwise equal to the f32 reference). The libm-free transcendentals are
/// checked against f64 within their documented bounds.
type UnaryRow = (&'static str, Unary, fn(f32) -> f32, f64);

fn sigmoid64(x: f32) -> f32 {
    (1.0 / (1.0 + (-f64::from(x)).exp())) as f32
}

fn unary_table() -> Vec<UnaryRow> {
    vec![
        ("neg", ExecContext::neg, |x| -x, 0.0),
        ("abs", ExecContext::abs, f32::abs, 0.0),
        ("exp", ExecContext::exp, |x| f64::from(x).exp() as f32, 2.0),
        ("log", ExecContext::log, |x| f64::from(x).ln() as f32, 1.0),
        ("sqrt", ExecContext::sqrt, f32::sqrt, 0.0),
        ("rsqrt", ExecContext::rsqrt, |x| 1.0 / x.sqrt(), 0.0),
        ("sigmoid", ExecContext::sigmoid, sigmoid64, 2.0),
        (
            "tanh",
            ExecContext::tanh,
            |x| f64::from(x).tanh() as f32,
            2.0,
        ),
        ("relu", ExecContext::relu, |x| x.max(0.0), 0.0),
        ("sin", ExecContext::sin, f32::sin, 0.0),
        ("cos", ExecContext::cos, f32::cos, 0.0),
        ("silu", ExecContext::silu, |x| x * sigmoid64(x), 3.0),
        (
            "softplus",
            ExecContext::softplus,
            |x| f64::from(x).exp().ln_1p() as f32,
            4.0,
        ),
        (
            "logsigmoid",
            ExecContext::logsigmoid,
            |x| -(-f64::from(x)).exp().ln_1p() as f32,
            4.0,
        ),
        (
            "mish",
            ExecContext::mish,
            |x| {
                let x = f64::from(x);
                (x * x.exp().ln_1p().tanh()) as f32
            },
            8.0,
        ),
        (
            "hardswish",
            ExecContext::hardswish,
            |x| {
                let x = f64::from(x);
                (x * (x + 3.0).clamp(0.0, 6.0) / 6.0) as f32
            },
            2.0,
        ),
    ]
}

/// Whether `got` is within `tol` (relative, units of `2^-23`, plus half an ulp
/// for the rounding of the f64 reference; bitwise when `tol == 0`) of `want`.
fn close(got: f32, want: f32, tol: f64) -> bool {
    if tol == 0.0 {
        return got.to_bits() == want.to_bits();
    }
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    let err = (f64::from(got) - f64::from(want)).abs();
    err <= (tol + 0.5) * f64::from(f32::EPSILON) * f64::from(want.abs()) || got == want
}

/// A pair of broadcast-compatible shapes.
fn shape_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (1usize..=4, 1usize..=4)
        .prop_flat_map(|(ra, rb)| {
            let r = ra.max(rb);
            (
                proptest::collection::vec(1usize..=5, r),
                proptest::collection::vec(0u8..3, r),
                Just((ra, rb)),
            )
        })
        .prop_map(|(full, mode, (ra, rb))| {
            let r = full.len();
            // each operand takes the full dim, or 1 (broadcast), per axis
            let a: Vec<usize> = (r - ra..r)
                .map(|i| if mode[i] == 1 { 1 } else { full[i] })
                .collect();
            let b: Vec<usize> = (r - rb..r)
                .map(|i| if mode[i] == 2 { 1 } else { full[i] })
                .collect();
            (a, b)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn binary_ops_match_the_naive_broadcast((ashape, bshape) in shape_pair(), seed in 0u64..1000) {
        let ctx = ExecContext::new();
        let av = values(ashape.iter().product(), seed);
        let bv = values(bshape.iter().product(), seed + 1);
        for a in layouts(&ctx, &ashape, seed) {
            for b in layouts(&ctx, &bshape, seed + 1) {
                prop_assert_eq!(a.to_vec(), av.clone());
                for (name, op, f) in binary_table() {
                    let (shape, want) = naive_binary(&av, &ashape, &bv, &bshape, f);
                    let got = op(&ctx, &a, &b).unwrap();
                    prop_assert_eq!(got.shape(), &shape[..], "{}", name);
                    prop_assert_eq!(bits(&got.to_vec()), bits(&want), "{}", name);
                }
                let (_, want) = naive_binary(&av, &ashape, &bv, &bshape, |x, y| f32::from(u8::from(x < y)));
                let got: Vec<f32> = ctx.less(&a, &b).unwrap().to_vec().iter().map(|&c| f32::from(u8::from(c))).collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn unary_ops_match_scalar_math(shape in proptest::collection::vec(1usize..=6, 1..=4), seed in 0u64..1000) {
        let ctx = ExecContext::new();
        let n: usize = shape.iter().product();
        let v = values(n, seed);
        for x in layouts(&ctx, &shape, seed) {
            for (name, op, f, tol) in unary_table() {
                let got = op(&ctx, &x).unwrap();
                prop_assert_eq!(got.shape(), &shape[..]);
                for (&g, &xv) in got.to_vec().iter().zip(&v) {
                    prop_assert!(close(g, f(xv), tol), "{}({}) = {} vs {}", name, xv, g, f(xv));
                }
            }
        }
    }
}

#[test]
fn broadcast_errors_name_the_shapes() {
    let ctx = ExecContext::new();
    let a = ctx.zeros(&[2, 3]).unwrap();
    let b = ctx.zeros(&[4]).unwrap();
    let e = ctx.add(&a, &b).unwrap_err();
    assert!(matches!(e, ExecError::ShapeMismatch { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("add") && msg.contains("[2, 3]") && msg.contains("[4]"),
        "{msg}"
    );
    let m = ctx.ones_typed::<bool>(&[4]).unwrap();
    assert!(matches!(
        ctx.masked_fill(&a, &m, 0.0),
        Err(ExecError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ctx.where_(&m, &a, &a),
        Err(ExecError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ctx.clamp(&a, 1.0, 0.0),
        Err(ExecError::InvalidArgument { .. })
    ));
    assert!(matches!(
        ctx.clamp(&a, f32::NAN, 0.0),
        Err(ExecError::InvalidArgument { .. })
    ));
    assert!(matches!(
        ctx.dropout(&a, 1.0, 0),
        Err(ExecError::InvalidArgument { .. })
    ));
    assert!(matches!(
        ctx.dropout(&a, -0.1, 0),
        Err(ExecError::InvalidArgument { .. })
    ));
}

#[test]
fn scalar_forms_where_and_masked_fill() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 2], &[-1., 0.5, 2., 3.]).unwrap();
    assert_eq!(ctx.scale(&x, 2.0).unwrap().to_vec(), [-2., 1., 4., 6.]);
    assert_eq!(ctx.add_scalar(&x, 1.0).unwrap().to_vec(), [0., 1.5, 3., 4.]);
    assert_eq!(
        ctx.pow_scalar(&x, 2.0).unwrap().to_vec(),
        [1., 0.25, 4., 9.]
    );
    assert_eq!(
        ctx.pow_scalar(&x, 3.0).unwrap().to_vec(),
        [-1., 0.125, 8., 27.]
    );
    assert_eq!(
        ctx.clamp(&x, 0.0, 2.5).unwrap().to_vec(),
        [0., 0.5, 2., 2.5]
    );
    let c = ctx.from_slice_typed::<bool>(&[2], &[true, false]).unwrap();
    let z = ctx.scalar(0.0).unwrap();
    // cond [2] broadcast over rows, b a scalar
    assert_eq!(ctx.where_(&c, &x, &z).unwrap().to_vec(), [-1., 0., 2., 0.]);
    assert_eq!(
        ctx.masked_fill(&x, &c, 9.0).unwrap().to_vec(),
        [9., 0.5, 9., 3.]
    );
    let eq = ctx.equal(&x, &x.transpose(0, 1).unwrap()).unwrap();
    assert_eq!(eq.to_vec(), [true, false, false, true]);
    let nan = ctx.from_slice(&[2], &[f32::NAN, 1.0]).unwrap();
    let one = ctx.scalar(1.0).unwrap();
    assert_eq!(ctx.not_equal(&nan, &one).unwrap().to_vec(), [true, false]);
    assert!(ctx.maximum(&nan, &one).unwrap().to_vec()[0].is_nan());
    assert_eq!(
        ctx.greater_equal(&nan, &one).unwrap().to_vec(),
        [false, true]
    );
}

#[test]
fn gelu_variants_match_pytorch_values() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[4], &[-2.0, -0.5, 0.5, 3.0]).unwrap();
    // torch.nn.functional.gelu(x, approximate="tanh") and the exact form
    let tanh = [-0.045_402_3_f32, -0.154_286, 0.345_714, 2.996_362_7];
    let exact = [-0.045_500_26_f32, -0.154_268_7, 0.345_731_3, 2.995_950_5];
    for (g, w) in ctx.gelu(&x).unwrap().to_vec().iter().zip(tanh) {
        assert!((g - w).abs() < 1e-5, "{g} vs {w}");
    }
    for (g, w) in ctx.gelu_erf(&x).unwrap().to_vec().iter().zip(exact) {
        assert!((g - w).abs() < 1e-5, "{g} vs {w}");
    }
    let sp = ctx
        .softplus(&ctx.from_slice(&[2], &[0.0, 30.0]).unwrap())
        .unwrap();
    assert!((sp.to_vec()[0] - std::f32::consts::LN_2).abs() < 1e-7);
    assert_eq!(sp.to_vec()[1], 30.0);
}

#[test]
fn unary_backward_kernels_match_finite_differences() {
    let ctx = ExecContext::new();
    let xs = [-1.7f32, -0.3, 0.4, 1.2, 2.5];
    let x = ctx.from_slice(&[5], &xs).unwrap();
    let g = ctx.from_slice(&[5], &[1.0, -2.0, 0.5, 3.0, 1.5]).unwrap();
    type Bwd = fn(&ExecContext, &RawTensor, &RawTensor) -> Result<RawTensor, ExecError>;
    let table: Vec<(Unary, Bwd)> = vec![
        (ExecContext::exp, ExecContext::exp_backward),
        (ExecContext::sigmoid, ExecContext::sigmoid_backward),
        (ExecContext::tanh, ExecContext::tanh_backward),
        (ExecContext::gelu, ExecContext::gelu_backward),
        (ExecContext::gelu_erf, ExecContext::gelu_erf_backward),
        (ExecContext::silu, ExecContext::silu_backward),
        (ExecContext::softplus, ExecContext::softplus_backward),
        (ExecContext::logsigmoid, ExecContext::logsigmoid_backward),
        (ExecContext::mish, ExecContext::mish_backward),
        (ExecContext::hardswish, ExecContext::hardswish_backward),
        (ExecContext::sin, ExecContext::sin_backward),
        (ExecContext::cos, ExecContext::cos_backward),
        (ExecContext::relu, ExecContext::relu_backward),
        (ExecContext::abs, ExecContext::abs_backward),
        (ExecContext::neg, ExecContext::neg_backward),
    ];
    for (i, (f, b)) in table.into_iter().enumerate() {
        let got = b(&ctx, &x, &g).unwrap().to_vec();
        for (j, &x0) in xs.iter().enumerate() {
            let h = 1e-2f32;
            let p = ctx.from_slice(&[1], &[x0 + h]).unwrap();
            let m = ctx.from_slice(&[1], &[x0 - h]).unwrap();
            let fd = (f(&ctx, &p).unwrap().item().unwrap() - f(&ctx, &m).unwrap().item().unwrap())
                / (2.0 * h);
            let want = fd * g.to_vec()[j];
            assert!(
                (got[j] - want).abs() < 5e-3 * (1.0 + want.abs()),
                "op {i} at {x0}: {} vs {want}",
                got[j]
            );
        }
    }
    // positive-domain ops
    let xp = ctx.from_slice(&[3], &[0.5, 1.0, 4.0]).unwrap();
    let gp = ctx.ones(&[3]).unwrap();
    let l = ctx.log_backward(&xp, &gp).unwrap().to_vec();
    assert_eq!(l, [2.0, 1.0, 0.25]);
    let s = ctx.sqrt_backward(&xp, &gp).unwrap().to_vec();
    assert!((s[2] - 0.25).abs() < 1e-7);
    let r = ctx.rsqrt_backward(&xp, &gp).unwrap().to_vec();
    assert!((r[2] + 0.0625).abs() < 1e-7);
    let pw = ctx.pow_scalar_backward(&xp, 3.0, &gp).unwrap().to_vec();
    assert!((pw[2] - 48.0).abs() < 1e-4);
    let cb = ctx.clamp_backward(&x, -1.0, 1.0, &g).unwrap().to_vec();
    assert_eq!(cb, [0.0, -2.0, 0.5, 0.0, 0.0]);
    let a = ctx.from_slice(&[3], &[1.0, 2.0, 3.0]).unwrap();
    let b = ctx.from_slice(&[3], &[3.0, 2.0, 1.0]).unwrap();
    let (ga, gb) = ctx.extremum_backward(&a, &b, &gp, true).unwrap();
    assert_eq!(ga.to_vec(), [0.0, 0.5, 1.0]);
    assert_eq!(gb.to_vec(), [1.0, 0.5, 0.0]);
    let (ga, gb) = ctx.pow_backward(&a, &b, &gp).unwrap();
    assert_eq!(ga.to_vec()[1], 4.0); // 2 * 2^1
    assert!((gb.to_vec()[1] - 4.0 * std::f32::consts::LN_2).abs() < 1e-6);
}

#[test]
fn take_ops_reuse_unique_storage() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.]).unwrap();
    let row = ctx.from_slice(&[3], &[10., 20., 30.]).unwrap();
    let addr = x.buffer().as_ptr();
    let y = ctx.take_add_no_grad(x, &row).unwrap();
    assert_eq!(y.buffer().as_ptr(), addr);
    assert_eq!(y.to_vec(), [11., 22., 33., 14., 25., 36.]);
    let y = ctx.take_scale_no_grad(y, 0.5).unwrap();
    assert_eq!(y.buffer().as_ptr(), addr);
    assert_eq!(y.to_vec()[0], 5.5);
    // shared storage: falls back to a fresh output, the other handle is untouched
    let keep = y.clone();
    let z = ctx.take_scale_no_grad(y, 2.0).unwrap();
    assert!(!z.same_storage(&keep));
    assert_eq!(keep.to_vec()[0], 5.5);
    assert_eq!(z.to_vec()[0], 11.0);
    // a result that would grow the operand falls back too
    let col = ctx.from_slice(&[2, 1], &[1., 2.]).unwrap();
    let grown = ctx
        .take_add_no_grad(row, &ctx.zeros(&[2, 3]).unwrap())
        .unwrap();
    assert_eq!(grown.shape(), [2, 3]);
    drop(col);
}

#[test]
fn dropout_regenerates_its_mask() {
    let ctx = ExecContext::new();
    let n = 100_000;
    let x = ctx.ones(&[n]).unwrap();
    let y = ctx.dropout(&x, 0.25, 7).unwrap().to_vec();
    let kept = y.iter().filter(|&&v| v != 0.0).count();
    assert!((kept as f64 / n as f64 - 0.75).abs() < 0.01, "{kept}");
    assert!(y.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75));
    let g = ctx.dropout_backward(&x, 0.25, 7).unwrap().to_vec();
    assert_eq!(bits(&g), bits(&y));
    let other = ctx.dropout(&x, 0.25, 8).unwrap().to_vec();
    assert_ne!(bits(&other), bits(&y));
    // element i depends only on (seed, i): a prefix gives the same mask
    let head = ctx
        .dropout(&ctx.ones(&[1000]).unwrap(), 0.25, 7)
        .unwrap()
        .to_vec();
    assert_eq!(bits(&head), bits(&y[..1000]));
    assert_eq!(ctx.dropout(&x, 0.0, 7).unwrap().to_vec(), x.to_vec());
}

#[test]
fn results_are_bitwise_identical_for_every_team_size() {
    let shape = [300, 257];
    let run = |threads: usize| {
        let ctx = ExecContext::with_threads(threads);
        let n = shape.iter().product();
        let a = ctx.from_slice(&shape, &values(n, 1)).unwrap();
        let b = ctx.from_slice(&[257], &values(257, 2)).unwrap();
        let t = ctx
            .from_slice(&[257, 300], &values(n, 3))
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        let mut out = vec![
            ctx.add(&a, &b).unwrap().to_vec(),
            ctx.mul(&a, &t).unwrap().to_vec(),
        ];
        out.push(ctx.gelu(&t).unwrap().to_vec());
        out.push(ctx.exp(&a).unwrap().to_vec());
        out.push(ctx.dropout(&t, 0.3, 11).unwrap().to_vec());
        let c = ctx.greater(&a, &b).unwrap();
        out.push(ctx.where_(&c, &a, &t).unwrap().to_vec());
        out.push(
            ctx.take_add_no_grad(ctx.materialize(&a).unwrap(), &t)
                .unwrap()
                .to_vec(),
        );
        out.into_iter().map(|v| bits(&v)).collect::<Vec<_>>()
    };
    let one = run(1);
    for threads in 2..=4 {
        assert_eq!(run(threads), one, "threads = {threads}");
    }
}

/// `x` (contiguous, of `shape`) permuted by `perm`, computed index by index.
fn naive_permute(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let mut strides = vec![1; shape.len()];
    for ax in (0..shape.len() - 1).rev() {
        strides[ax] = strides[ax + 1] * shape[ax + 1];
    }
    (0..x.len())
        .map(|i| {
            let idx = unravel(i, &out_shape);
            x[idx
                .iter()
                .zip(perm)
                .map(|(&j, &p)| j * strides[p])
                .sum::<usize>()]
        })
        .collect()
}

#[test]
fn materialize_of_permuted_views_matches_naive() {
    let perms3 = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    for threads in [1, 2, 3] {
        let ctx = ExecContext::with_threads(threads);
        // Odd, non-square, size-1 axes; [33, 17, 65] is above the parallel threshold.
        for shape in [
            [3, 5, 7],
            [33, 17, 65],
            [1, 40, 3],
            [64, 1, 70],
            [2, 31, 33],
        ] {
            let n = shape.iter().product();
            let vals = values(n, 11);
            let x = ctx.from_slice(&shape, &vals).unwrap();
            for perm in perms3 {
                let m = ctx.materialize(&x.permute(&perm).unwrap()).unwrap();
                let want = naive_permute(&vals, &shape, &perm);
                assert_eq!(bits(&m.to_vec()), bits(&want), "{shape:?} {perm:?}");
                // A unary op over the same view takes the same tiled walk.
                let y = ctx.neg(&x.permute(&perm).unwrap()).unwrap().to_vec();
                let want: Vec<f32> = want.iter().map(|v| -v).collect();
                assert_eq!(bits(&y), bits(&want), "neg {shape:?} {perm:?}");
            }
        }
        // 2-D transposes, including a stepped (every other column) source.
        for (r, c) in [(1, 33), (33, 1), (31, 33), (64, 100), (257, 3), (300, 129)] {
            let vals = values(r * c, 12);
            let x = ctx.from_slice(&[r, c], &vals).unwrap();
            let t = ctx.materialize(&x.transpose(0, 1).unwrap()).unwrap();
            assert_eq!(
                bits(&t.to_vec()),
                bits(&naive_permute(&vals, &[r, c], &[1, 0])),
                "{r}x{c}"
            );
            if c >= 2 {
                let w = ctx.from_slice(&[r, 2 * c], &values(2 * r * c, 13)).unwrap();
                let stepped = w.reshape(&[r, c, 2]).unwrap().narrow(2, 1, 1).unwrap();
                let m = ctx.materialize(&stepped.transpose(0, 1).unwrap()).unwrap();
                let wv = w.to_vec();
                let want: Vec<f32> = (0..r * c)
                    .map(|i| {
                        let (j, k) = (i / r, i % r);
                        wv[k * 2 * c + 2 * j + 1]
                    })
                    .collect();
                assert_eq!(bits(&m.to_vec()), bits(&want), "stepped {r}x{c}");
                drop((w, stepped, m));
            }
            drop((x, t));
        }
        ctx.close().unwrap();
    }
}

/// Below `PARALLEL_THRESHOLD` elements of work an op stays on the caller (the team
/// never starts); each parallel chunk holds at least a threshold's worth of work,
/// so a cheap op splits from twice the threshold on. Same bits either way.
#[test]
fn ops_go_parallel_at_the_threshold() {
    let serial = ExecContext::with_threads(1);
    let t = PARALLEL_THRESHOLD;
    for (n, parallel) in [(t - 1, false), (t, false), (2 * t, true)] {
        let ctx = ExecContext::with_threads(2);
        let (a, b) = (values(n, 1), values(n, 2));
        let (x, y) = (
            ctx.from_slice(&[n], &a).unwrap(),
            ctx.from_slice(&[n], &b).unwrap(),
        );
        let z = ctx.add(&x, &y).unwrap();
        let started = ctx.team().unwrap().is_started();
        assert_eq!(started, parallel, "add of {n} elements");
        let (xs, ys) = (
            serial.from_slice(&[n], &a).unwrap(),
            serial.from_slice(&[n], &b).unwrap(),
        );
        assert_eq!(
            bits(&z.to_vec()),
            bits(&serial.add(&xs, &ys).unwrap().to_vec())
        );
        drop((x, y, z, xs, ys));
        ctx.close().unwrap();
    }
}

/// The unary descriptor names the right kernels: for every `UnaryOp`, the
/// generic entry points give the bits of the named methods its `name()` and
/// `backward_name()` spell, and every named unary method has a variant.
#[test]
fn unary_descriptors_name_their_kernels() {
    use fucina_exec::UnaryOp;
    type Bwd = fn(&ExecContext, &RawTensor, &RawTensor) -> Result<RawTensor, ExecError>;
    let named: [(&str, Unary, &str, Bwd); 18] = [
        (
            "neg",
            ExecContext::neg,
            "neg_backward",
            ExecContext::neg_backward,
        ),
        (
            "abs",
            ExecContext::abs,
            "abs_backward",
            ExecContext::abs_backward,
        ),
        (
            "exp",
            ExecContext::exp,
            "exp_backward",
            ExecContext::exp_backward,
        ),
        (
            "log",
            ExecContext::log,
            "log_backward",
            ExecContext::log_backward,
        ),
        (
            "sqrt",
            ExecContext::sqrt,
            "sqrt_backward",
            ExecContext::sqrt_backward,
        ),
        (
            "rsqrt",
            ExecContext::rsqrt,
            "rsqrt_backward",
            ExecContext::rsqrt_backward,
        ),
        (
            "sigmoid",
            ExecContext::sigmoid,
            "sigmoid_backward",
            ExecContext::sigmoid_backward,
        ),
        (
            "tanh",
            ExecContext::tanh,
            "tanh_backward",
            ExecContext::tanh_backward,
        ),
        (
            "relu",
            ExecContext::relu,
            "relu_backward",
            ExecContext::relu_backward,
        ),
        (
            "gelu",
            ExecContext::gelu,
            "gelu_backward",
            ExecContext::gelu_backward,
        ),
        (
            "gelu_erf",
            ExecContext::gelu_erf,
            "gelu_erf_backward",
            ExecContext::gelu_erf_backward,
        ),
        (
            "silu",
            ExecContext::silu,
            "silu_backward",
            ExecContext::silu_backward,
        ),
        (
            "softplus",
            ExecContext::softplus,
            "softplus_backward",
            ExecContext::softplus_backward,
        ),
        (
            "logsigmoid",
            ExecContext::logsigmoid,
            "logsigmoid_backward",
            ExecContext::logsigmoid_backward,
        ),
        (
            "mish",
            ExecContext::mish,
            "mish_backward",
            ExecContext::mish_backward,
        ),
        (
            "hardswish",
            ExecContext::hardswish,
            "hardswish_backward",
            ExecContext::hardswish_backward,
        ),
        (
            "sin",
            ExecContext::sin,
            "sin_backward",
            ExecContext::sin_backward,
        ),
        (
            "cos",
            ExecContext::cos,
            "cos_backward",
            ExecContext::cos_backward,
        ),
    ];
    assert_eq!(UnaryOp::ALL.len(), named.len());
    let ctx = ExecContext::with_threads(1);
    let xv: Vec<f32> = (0..64).map(|i| (i as f32 - 20.5) * 0.37).collect();
    let gv: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 * 0.01).collect();
    let x = ctx.from_slice(&[8, 8], &xv).unwrap();
    let g = ctx.from_slice(&[8, 8], &gv).unwrap();
    for &op in UnaryOp::ALL {
        let (_, fwd, bwd_name, bwd) = named
            .iter()
            .find(|row| row.0 == op.name())
            .unwrap_or_else(|| panic!("{op:?}: no named method {}", op.name()));
        assert_eq!(op.backward_name(), *bwd_name, "{op:?}");
        let want = bits(&fwd(&ctx, &x).unwrap().to_vec());
        assert_eq!(bits(&ctx.unary(op, &x).unwrap().to_vec()), want, "{op:?}");
        let want = bits(&bwd(&ctx, &x, &g).unwrap().to_vec());
        let got = ctx.unary_backward(op, &x, &g).unwrap().to_vec();
        assert_eq!(bits(&got), want, "{op:?} backward");
    }
}

/// The binary descriptor runs the named method's kernel (same bits, broadcasting
/// included), and its backward gives the textbook gradients of the broadcast
/// shape, only those asked for.
#[test]
fn binary_descriptor_matches_named_methods_and_gradients() {
    use fucina_exec::BinaryOp;
    let table = binary_table();
    assert_eq!(BinaryOp::ALL.len(), table.len());
    let ctx = ExecContext::with_threads(1);
    let av: Vec<f32> = (0..12).map(|i| 0.5 + i as f32 * 0.3).collect();
    let bv: Vec<f32> = vec![1.5, 0.25, 2.0, 1.5];
    let a = ctx.from_slice(&[3, 4], &av).unwrap();
    let b = ctx.from_slice(&[4], &bv).unwrap();
    let gv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.1).collect();
    let g = ctx.from_slice(&[3, 4], &gv).unwrap();
    for &op in BinaryOp::ALL {
        let (_, named, _) = table
            .iter()
            .find(|row| row.0 == op.name())
            .unwrap_or_else(|| panic!("{op:?}: no named method {}", op.name()));
        let want = bits(&named(&ctx, &a, &b).unwrap().to_vec());
        assert_eq!(
            bits(&ctx.binary(op, &a, &b).unwrap().to_vec()),
            want,
            "{op:?}"
        );
        let (ga, gb) = ctx
            .binary_backward(op, Some((&a, &b)), &g, [true, true])
            .unwrap();
        let (ga, gb) = (ga.unwrap().to_vec(), gb.unwrap().to_vec());
        assert_eq!((ga.len(), gb.len()), (12, 12), "{op:?}: broadcast shape");
        for i in 0..12 {
            let (x, y, gi) = (av[i], bv[i % 4], gv[i]);
            let (wa, wb) = match op {
                BinaryOp::Add => (gi, gi),
                BinaryOp::Sub => (gi, -gi),
                BinaryOp::Mul => (gi * y, gi * x),
                BinaryOp::Div => (gi / y, -gi * x / (y * y)),
                BinaryOp::Pow => (gi * y * x.powf(y - 1.0), gi * x.powf(y) * x.ln()),
                BinaryOp::Maximum | BinaryOp::Minimum => {
                    let first = if op == BinaryOp::Maximum {
                        x > y
                    } else {
                        x < y
                    };
                    let w = if x == y {
                        0.5
                    } else if first {
                        1.0
                    } else {
                        0.0
                    };
                    (gi * w, gi * (1.0 - w))
                }
                _ => unreachable!(),
            };
            let close = |p: f32, q: f32| (p - q).abs() <= 1e-4 * (1.0 + q.abs());
            assert!(close(ga[i], wa) && close(gb[i], wb), "{op:?} at {i}");
        }
        if !op.keeps_operands() {
            let (ga, gb) = ctx.binary_backward(op, None, &g, [false, true]).unwrap();
            assert!(ga.is_none(), "{op:?}: an unwanted gradient is not computed");
            assert!(gb.is_some(), "{op:?}");
        } else {
            let err = ctx.binary_backward(op, None, &g, [true, true]).unwrap_err();
            assert!(err.to_string().contains("binary_backward"), "{op:?}: {err}");
        }
    }
}

/// A positive `[3, 4]` input and a `[3, 4]` gradient of both signs.
fn input_and_grad_3x4(ctx: &ExecContext) -> (RawTensor, RawTensor) {
    let xv: Vec<f32> = (0..12).map(|i| 0.25 + i as f32 * 0.3).collect();
    let gv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.1).collect();
    (
        ctx.from_slice(&[3, 4], &xv).unwrap(),
        ctx.from_slice(&[3, 4], &gv).unwrap(),
    )
}

/// The scalar descriptor runs the named method's kernel and its backward is the
/// named backward kernel (bit for bit); an op that reads its input refuses a
/// missing input with an error.
#[test]
fn scalar_descriptor_matches_named_methods() {
    use fucina_exec::ScalarOp;
    let ctx = ExecContext::with_threads(1);
    let (x, g) = input_and_grad_3x4(&ctx);
    let v = |t: Result<RawTensor, ExecError>| bits(&t.unwrap().to_vec());
    let ops = [
        ScalarOp::Scale(-1.5),
        ScalarOp::AddScalar(0.75),
        ScalarOp::PowScalar(2.0),
        ScalarOp::PowScalar(1.7),
        ScalarOp::Clamp { min: 1.0, max: 2.5 },
        ScalarOp::Dropout { p: 0.4, seed: 7 },
    ];
    for op in ops {
        let (fwd, bwd) = match op {
            ScalarOp::Scale(s) => (ctx.scale(&x, s), ctx.scale(&g, s)),
            ScalarOp::AddScalar(s) => (ctx.add_scalar(&x, s), Ok(g.clone())),
            ScalarOp::PowScalar(p) => (ctx.pow_scalar(&x, p), ctx.pow_scalar_backward(&x, p, &g)),
            ScalarOp::Clamp { min, max } => (
                ctx.clamp(&x, min, max),
                ctx.clamp_backward(&x, min, max, &g),
            ),
            ScalarOp::Dropout { p, seed } => {
                (ctx.dropout(&x, p, seed), ctx.dropout_backward(&g, p, seed))
            }
            _ => unreachable!(),
        };
        assert_eq!(v(ctx.scalar_op(op, &x)), v(fwd), "{op:?}");
        assert_eq!(
            v(ctx.scalar_op_backward(op, Some(&x), &g)),
            v(bwd),
            "{op:?}"
        );
        let missing = ctx.scalar_op_backward(op, None, &g);
        assert_eq!(missing.is_err(), op.keeps_input(), "{op:?}");
    }
    let bad = ScalarOp::Clamp { min: 2.0, max: 1.0 };
    assert!(matches!(
        ctx.scalar_op(bad, &x),
        Err(ExecError::InvalidArgument { .. })
    ));
    let bad = ScalarOp::Dropout { p: 1.0, seed: 7 };
    assert_eq!(bad.name(), "dropout");
    for r in [
        ctx.scalar_op(bad, &x),
        ctx.scalar_op_backward(bad, None, &g),
    ] {
        assert!(matches!(r, Err(ExecError::InvalidArgument { .. })));
    }
}

/// The comparison descriptor runs the named method's kernel (same booleans,
/// broadcasting and NaN handling included) and names it.
#[test]
fn compare_descriptor_matches_named_methods() {
    use fucina_exec::CompareOp;
    type Cmp = fn(&ExecContext, &RawTensor, &RawTensor) -> Result<RawTensor<bool>, ExecError>;
    let named: [(&str, Cmp); 6] = [
        ("equal", ExecContext::equal),
        ("not_equal", ExecContext::not_equal),
        ("less", ExecContext::less),
        ("less_equal", ExecContext::less_equal),
        ("greater", ExecContext::greater),
        ("greater_equal", ExecContext::greater_equal),
    ];
    assert_eq!(CompareOp::ALL.len(), named.len());
    let ctx = ExecContext::with_threads(1);
    let a = ctx
        .from_slice(&[2, 3], &[1.0, 2.0, f32::NAN, -0.0, 3.0, 2.0])
        .unwrap();
    let b = ctx.from_slice(&[3], &[2.0, 2.0, 1.0]).unwrap();
    for (&op, (name, f)) in CompareOp::ALL.iter().zip(named) {
        assert_eq!(op.name(), name);
        let got = ctx.compare(op, &a, &b).unwrap();
        assert_eq!(got.to_vec(), f(&ctx, &a, &b).unwrap().to_vec(), "{op:?}");
        let bad = ctx.from_slice(&[2], &[1.0, 2.0]).unwrap();
        assert!(matches!(
            ctx.compare(op, &a, &bad),
            Err(ExecError::ShapeMismatch { .. })
        ));
    }
}

/// The mask descriptor runs the named forward kernels (`where_`,
/// `masked_fill`) and its backward routes the gradient to the selected operand
/// (what the composition of the named kernels gives, bit for bit); a wrong
/// operand count is an error.
#[test]
fn mask_descriptor_matches_named_methods() {
    use fucina_exec::MaskOp;
    let ctx = ExecContext::with_threads(1);
    let (x, g) = input_and_grad_3x4(&ctx);
    let y = ctx.from_slice(&[4], &[9.0, -1.0, 0.5, 2.0]).unwrap();
    let mv: Vec<bool> = (0..12).map(|i| i % 3 == 1).collect();
    let mask = ctx.from_slice_typed::<bool>(&[3, 4], &mv).unwrap();
    let v = |t: Result<RawTensor, ExecError>| bits(&t.unwrap().to_vec());
    let zero = ctx.scalar(0.0).unwrap();

    let w = MaskOp::Where;
    assert_eq!((w.name(), w.arity()), ("where", 2));
    assert_eq!(
        v(ctx.mask_op(w, &mask, &x, Some(&y))),
        v(ctx.where_(&mask, &x, &y))
    );
    let (ga, gb) = ctx.mask_op_backward(w, &mask, &g, [true, true]).unwrap();
    assert_eq!(v(Ok(ga.unwrap())), v(ctx.where_(&mask, &g, &zero)));
    assert_eq!(v(Ok(gb.unwrap())), v(ctx.where_(&mask, &zero, &g)));
    let (ga, gb) = ctx.mask_op_backward(w, &mask, &g, [false, true]).unwrap();
    assert!(ga.is_none() && gb.is_some());

    let m = MaskOp::MaskedFill(-3.5);
    assert_eq!((m.name(), m.arity()), ("masked_fill", 1));
    assert_eq!(
        v(ctx.mask_op(m, &mask, &x, None)),
        v(ctx.masked_fill(&x, &mask, -3.5))
    );
    let (ga, gb) = ctx.mask_op_backward(m, &mask, &g, [true, false]).unwrap();
    assert_eq!(v(Ok(ga.unwrap())), v(ctx.masked_fill(&g, &mask, 0.0)));
    assert!(gb.is_none());

    for r in [
        ctx.mask_op(w, &mask, &x, None),
        ctx.mask_op(m, &mask, &x, Some(&y)),
    ] {
        assert!(matches!(r, Err(ExecError::InvalidArgument { .. })));
    }
}
