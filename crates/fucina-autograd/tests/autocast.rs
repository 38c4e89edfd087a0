//! bf16 autocast: inside the scope the products and convolutions equal the
//! f32 results of explicitly bf16-rounded operands (forward and backward,
//! straight-through rounding); outside it nothing changes; the same bits for
//! 1 and 2 threads and at every vector level; nesting; a panic leaves the
//! scope off.

mod support;

use fucina_autograd::exec::{ExecContext, SimdLevel, force_simd_level, round_to_bf16, simd_level};
use fucina_autograd::{
    Conv1dOptions, Conv2dOptions, ConvTranspose1dOptions, ConvTranspose2dOptions, Tensor,
    autocast_bf16, einsum, is_autocast_bf16,
};
use support::values;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn rounded(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| round_to_bf16(x)).collect()
}

#[test]
fn round_to_bf16_is_nearest_even() {
    assert_eq!(round_to_bf16(1.0 + 2f32.powi(-8)), 1.0);
    assert_eq!(
        round_to_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20)),
        1.0 + 2f32.powi(-7)
    );
    assert_eq!(
        round_to_bf16(1.0 + 3.0 * 2f32.powi(-8)),
        1.0 + 2f32.powi(-6)
    );
    assert_eq!(round_to_bf16(f32::MAX), f32::INFINITY);
    assert_eq!(round_to_bf16(f32::NEG_INFINITY), f32::NEG_INFINITY);
    assert!(round_to_bf16(f32::NAN).is_nan());
    // A subnormal rounds like any value (no flush).
    let tiny = f32::from_bits(0x0001_8000);
    assert_eq!(round_to_bf16(tiny).to_bits(), 0x0002_0000);
    for i in 0..10_000u64 {
        let x = f32::from_bits((fucina_autograd::exec::rng::at(7, i) >> 32) as u32);
        if !x.is_finite() || round_to_bf16(x).is_infinite() {
            continue;
        }
        let r = round_to_bf16(x);
        assert_eq!(r.to_bits() & 0xffff, 0);
        // No other bf16 is closer.
        let up = f32::from_bits(r.to_bits() + 0x1_0000);
        let down = f32::from_bits(r.to_bits().wrapping_sub(0x1_0000));
        let d = (f64::from(x) - f64::from(r)).abs();
        for o in [up, down] {
            if o.is_finite() {
                assert!(d <= (f64::from(x) - f64::from(o)).abs(), "{x:e} -> {r:e}");
            }
        }
    }
}

/// One op of the tests: its name, the operand shapes, and the op.
type Op = (
    &'static str,
    &'static [usize],
    &'static [usize],
    fn(&ExecContext, &Tensor, &Tensor) -> Tensor,
);

/// A 3x3 convolution with padding 1.
fn conv3x3(ctx: &ExecContext, a: &Tensor, b: &Tensor) -> Tensor {
    let opts = Conv2dOptions {
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    };
    a.conv2d(ctx, b, None, opts).unwrap()
}

const OPS: &[Op] = &[
    ("matmul", &[6, 40], &[40, 9], |c, a, b| {
        a.matmul(c, b).unwrap()
    }),
    ("batched matmul", &[2, 5, 40], &[2, 40, 7], |c, a, b| {
        a.matmul(c, b).unwrap()
    }),
    (
        "matmul of a transposed view",
        &[6, 40],
        &[9, 40],
        |c, a, b| a.matmul(c, &b.transpose(c, 0, 1).unwrap()).unwrap(),
    ),
    ("linear", &[6, 40], &[9, 40], |c, a, b| {
        a.linear(c, b, None).unwrap()
    }),
    ("conv2d", &[2, 3, 9, 9], &[4, 3, 3, 3], conv3x3),
    ("conv1d", &[2, 3, 17], &[4, 3, 3], |c, a, b| {
        a.conv1d(
            c,
            b,
            None,
            Conv1dOptions {
                stride: 1,
                padding: 1,
                ..Default::default()
            },
        )
        .unwrap()
    }),
    ("einsum", &[2, 3, 4, 40], &[2, 3, 5, 40], |c, a, b| {
        einsum(c, "bhqd,bhkd->bhqk", &[a, b]).unwrap()
    }),
    (
        "conv_transpose2d",
        &[2, 6, 5, 5],
        &[6, 4, 3, 3],
        |c, a, b| {
            let opts = ConvTranspose2dOptions {
                stride: [2, 1],
                padding: [1, 0],
                output_padding: [1, 0],
                ..Default::default()
            };
            a.conv_transpose2d(c, b, None, opts).unwrap()
        },
    ),
    ("conv_transpose1d", &[2, 6, 9], &[6, 4, 3], |c, a, b| {
        let opts = ConvTranspose1dOptions {
            stride: 2,
            ..Default::default()
        };
        a.conv_transpose1d(c, b, None, opts).unwrap()
    }),
];

/// The U-Net up-step: kernel 2, stride 2.
fn up2x2(ctx: &ExecContext, a: &Tensor, b: &Tensor) -> Tensor {
    let opts = ConvTranspose2dOptions {
        stride: [2, 2],
        ..Default::default()
    };
    a.conv_transpose2d(ctx, b, None, opts).unwrap()
}

/// The output and both gradients (`sum` of the output weighted by a fixed
/// pattern as the loss) of `op` on operands `a`, `b`.
fn run(ctx: &ExecContext, op: &Op, a: &[f32], b: &[f32]) -> [Vec<f32>; 3] {
    let (_, sa, sb, f) = *op;
    let ta = Tensor::variable_from_slice(ctx, sa, a).unwrap();
    let tb = Tensor::variable_from_slice(ctx, sb, b).unwrap();
    let y = f(ctx, &ta, &tb);
    let w = Tensor::from_slice(ctx, y.shape(), &values(y.numel(), 9, -1.0, 1.0)).unwrap();
    y.mul(ctx, &w)
        .unwrap()
        .sum_all(ctx)
        .unwrap()
        .backward(ctx)
        .unwrap();
    [
        y.to_vec(),
        ta.grad(ctx).unwrap().unwrap().to_vec(),
        tb.grad(ctx).unwrap().unwrap().to_vec(),
    ]
}

fn operands(op: &Op) -> (Vec<f32>, Vec<f32>) {
    let (_, sa, sb, _) = *op;
    (
        values(sa.iter().product(), 1, -3.0, 3.0),
        values(sb.iter().product(), 2, -3.0, 3.0),
    )
}

#[test]
fn inside_the_scope_results_are_those_of_rounded_operands() {
    let ctx = ExecContext::new();
    for op in OPS {
        let (a, b) = operands(op);
        let (ra, rb) = (rounded(&a), rounded(&b));
        assert_ne!(bits(&a), bits(&ra));
        let reference = run(&ctx, op, &ra, &rb);
        let plain = run(&ctx, op, &a, &b);
        let cast = {
            let _g = autocast_bf16();
            run(&ctx, op, &a, &b)
        };
        // The forward and both gradients (straight-through) equal the f32
        // results of the explicitly rounded operands, bit for bit...
        for k in 0..3 {
            assert_eq!(bits(&cast[k]), bits(&reference[k]), "{} part {k}", op.0);
        }
        // ...and differ from the unrounded ones.
        assert_ne!(bits(&cast[0]), bits(&plain[0]), "{}", op.0);
        // Outside the scope again: the plain f32 bits.
        assert_eq!(
            run(&ctx, op, &a, &b).map(|v| bits(&v)),
            plain.map(|v| bits(&v)),
            "{}",
            op.0
        );
    }
}

#[test]
fn the_bias_and_other_ops_are_not_rounded() {
    let ctx = ExecContext::new();
    let x = Tensor::from_slice(&ctx, &[1, 2], &[1.0, 0.0]).unwrap();
    let w = Tensor::from_slice(&ctx, &[1, 2], &[1.0, 0.0]).unwrap();
    let fine = 1.0 + 2f32.powi(-12);
    let bias = Tensor::from_slice(&ctx, &[1], &[fine]).unwrap();
    let _g = autocast_bf16();
    assert_eq!(
        x.linear(&ctx, &w, Some(&bias)).unwrap().to_vec(),
        [1.0 + fine]
    );
    let s = Tensor::from_slice(&ctx, &[1], &[fine]).unwrap();
    assert_eq!(s.mul(&ctx, &s).unwrap().to_vec(), [fine * fine]);
}

#[test]
fn the_backward_follows_where_the_product_was_recorded() {
    let ctx = ExecContext::new();
    let op = &OPS[0];
    let (a, b) = operands(op);
    let reference = run(&ctx, op, &rounded(&a), &rounded(&b));
    let ta = Tensor::variable_from_slice(&ctx, op.1, &a).unwrap();
    let tb = Tensor::variable_from_slice(&ctx, op.2, &b).unwrap();
    let y = {
        let _g = autocast_bf16();
        ta.matmul(&ctx, &tb).unwrap()
    };
    // backward outside the scope still uses the rounded operands.
    let w = Tensor::from_slice(&ctx, y.shape(), &values(y.numel(), 9, -1.0, 1.0)).unwrap();
    y.mul(&ctx, &w)
        .unwrap()
        .sum_all(&ctx)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    assert_eq!(
        bits(&ta.grad(&ctx).unwrap().unwrap().to_vec()),
        bits(&reference[1])
    );
    assert_eq!(
        bits(&tb.grad(&ctx).unwrap().unwrap().to_vec()),
        bits(&reference[2])
    );
}

/// Every op's output and gradients inside the scope, as bits, on operands
/// large enough that the kernels split the work.
fn all_bits(ctx: &ExecContext) -> Vec<u32> {
    let big: [Op; 3] = [
        ("matmul", &[96, 200], &[200, 80], |c, a, b| {
            a.matmul(c, b).unwrap()
        }),
        ("conv2d", &[4, 8, 24, 24], &[16, 8, 3, 3], conv3x3),
        ("conv_transpose2d", &[4, 16, 12, 12], &[16, 8, 2, 2], up2x2),
    ];
    let _g = autocast_bf16();
    let mut out = Vec::new();
    for op in OPS.iter().chain(&big) {
        let (a, b) = operands(op);
        for v in run(ctx, op, &a, &b) {
            out.extend(bits(&v));
        }
    }
    out
}

#[test]
fn same_bits_for_threads_and_vector_levels() {
    let base = all_bits(&ExecContext::with_threads(1));
    assert_eq!(base, all_bits(&ExecContext::with_threads(2)), "2 threads");
    let before = simd_level();
    for level in SimdLevel::available() {
        assert!(force_simd_level(level));
        for t in [1, 2] {
            assert_eq!(
                base,
                all_bits(&ExecContext::with_threads(t)),
                "{} x{t}",
                level.name()
            );
        }
    }
    assert!(force_simd_level(before));
}

#[test]
fn scopes_nest_and_close() {
    assert!(!is_autocast_bf16());
    let outer = autocast_bf16();
    {
        let _inner = autocast_bf16();
        assert!(is_autocast_bf16());
    }
    assert!(is_autocast_bf16(), "the outer scope is still open");
    outer.close();
    assert!(!is_autocast_bf16());
    // Per thread: another thread does not see this thread's scope.
    let _g = autocast_bf16();
    assert!(!std::thread::spawn(is_autocast_bf16).join().unwrap());
}

#[test]
fn a_panic_inside_the_scope_leaves_it_off() {
    let r = std::panic::catch_unwind(|| {
        let _g = autocast_bf16();
        let _h = autocast_bf16();
        assert!(is_autocast_bf16());
        panic!("inside the scope");
    });
    assert!(r.is_err());
    assert!(!is_autocast_bf16());
    let ctx = ExecContext::new();
    let op = &OPS[0];
    let (a, b) = operands(op);
    let plain = {
        let ta = Tensor::from_slice(&ctx, op.1, &a).unwrap();
        let tb = Tensor::from_slice(&ctx, op.2, &b).unwrap();
        ta.matmul(&ctx, &tb).unwrap().to_vec()
    };
    assert_eq!(bits(&run(&ctx, op, &a, &b)[0]), bits(&plain));
}
