//! `conv1d` / `conv2d` and their backward kernels: values against a float64
//! direct-loop reference for many option combinations, every bad input, the same
//! bits for 1-4 threads and every vector level, batch invariance.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{
    Conv1dOptions, Conv2dOptions, ExecContext, ExecError, RawTensor, SimdLevel,
    detected_simd_level, force_simd_level,
};
use support::values;

/// One 2-D case: input shape, weight shape, options, with a bias or not.
#[derive(Clone, Copy, Debug)]
struct Case {
    x: [usize; 4],
    w: [usize; 4],
    o: Conv2dOptions,
    bias: bool,
}

fn o2(s: [usize; 2], p: [usize; 2], d: [usize; 2], g: usize) -> Conv2dOptions {
    Conv2dOptions {
        stride: s,
        padding: p,
        dilation: d,
        groups: g,
    }
}

fn cases() -> Vec<Case> {
    let c = |x, w, o, bias| Case { x, w, o, bias };
    vec![
        c(
            [2, 3, 7, 6],
            [4, 3, 3, 3],
            o2([1, 1], [1, 1], [1, 1], 1),
            true,
        ),
        c(
            [2, 4, 9, 8],
            [6, 2, 3, 2],
            o2([2, 1], [1, 0], [1, 2], 2),
            false,
        ),
        // depthwise (groups == in == out): the direct kernels
        c(
            [2, 3, 6, 7],
            [3, 1, 3, 3],
            o2([2, 2], [1, 1], [1, 1], 3),
            true,
        ),
        c(
            [1, 4, 7, 5],
            [4, 1, 2, 3],
            o2([1, 2], [0, 2], [2, 1], 4),
            false,
        ),
        // 1x1 stride 1 (straight to the GEMM) and 1x1 stride 2
        c([3, 5, 4, 5], [7, 5, 1, 1], Conv2dOptions::default(), true),
        c(
            [2, 4, 5, 5],
            [3, 4, 1, 1],
            o2([2, 2], [0, 0], [1, 1], 1),
            false,
        ),
        c(
            [1, 6, 3, 4],
            [4, 3, 1, 1],
            o2([1, 1], [0, 0], [1, 1], 2),
            true,
        ),
        // several column blocks, a depth above one GEMM depth block
        c(
            [1, 3, 30, 30],
            [5, 3, 3, 3],
            o2([1, 1], [1, 1], [1, 1], 1),
            true,
        ),
        c(
            [1, 64, 24, 24],
            [8, 64, 3, 3],
            o2([1, 1], [1, 1], [1, 1], 1),
            false,
        ),
        // kernel exactly the padded input (1x1 output), dilation with padding
        c(
            [1, 2, 3, 3],
            [2, 2, 5, 5],
            o2([1, 1], [1, 1], [1, 1], 1),
            true,
        ),
        c(
            [2, 2, 8, 8],
            [4, 2, 3, 3],
            o2([1, 1], [2, 2], [2, 2], 1),
            false,
        ),
        // one input channel per group, two outputs each (not depthwise)
        c(
            [1, 2, 5, 5],
            [4, 1, 3, 3],
            o2([1, 1], [1, 1], [1, 1], 2),
            true,
        ),
        // depthwise with taps wholly in the padding (iw = s * dw - pw >= W)
        c(
            [1, 2, 3, 2],
            [2, 1, 2, 2],
            o2([1, 1], [1, 1], [2, 3], 2),
            true,
        ),
        c(
            [1, 2, 2, 1],
            [2, 1, 1, 2],
            o2([1, 1], [0, 3], [1, 6], 2),
            true,
        ),
        c(
            [2, 2, 2, 5],
            [2, 1, 2, 2],
            o2([1, 2], [2, 1], [3, 1], 2),
            false,
        ),
        // stride larger than the kernel, padding larger than the kernel
        c(
            [2, 3, 9, 10],
            [2, 3, 2, 2],
            o2([3, 4], [3, 2], [1, 1], 1),
            true,
        ),
    ]
}

/// The float64 direct loops: `y`, and for the output gradient `dy` the
/// gradients of the input, the weight and the bias.
struct Reference {
    y: Vec<f64>,
    /// Per output element, the sum of the absolute values of its terms.
    y_mag: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
    oshape: [usize; 4],
}

fn reference(case: &Case, x: &[f32], w: &[f32], b: Option<&[f32]>, dy: &[f32]) -> Reference {
    let [n, c, h, wd] = case.x;
    let [co, cg, kh, kw] = case.w;
    let o = case.o;
    let og = co / o.groups;
    let oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
    let ow = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
    let mut r = Reference {
        y: vec![0.0; n * co * oh * ow],
        y_mag: vec![0.0; n * co * oh * ow],
        dx: vec![0.0; x.len()],
        dw: vec![0.0; w.len()],
        db: vec![0.0; co],
        oshape: [n, co, oh, ow],
    };
    for ni in 0..n {
        for oc in 0..co {
            let gi = oc / og;
            for i in 0..oh {
                for j in 0..ow {
                    let yi = ((ni * co + oc) * oh + i) * ow + j;
                    let g = dy[yi] as f64;
                    let mut acc = b.map_or(0.0, |b| b[oc] as f64);
                    let mut mag = acc.abs();
                    for ci in 0..cg {
                        let cin = gi * cg + ci;
                        for rr in 0..kh {
                            for ss in 0..kw {
                                let ih = (i * o.stride[0] + rr * o.dilation[0]) as isize
                                    - o.padding[0] as isize;
                                let iw = (j * o.stride[1] + ss * o.dilation[1]) as isize
                                    - o.padding[1] as isize;
                                if ih < 0 || iw < 0 || ih >= h as isize || iw >= wd as isize {
                                    continue;
                                }
                                let xi = ((ni * c + cin) * h + ih as usize) * wd + iw as usize;
                                let wi = ((oc * cg + ci) * kh + rr) * kw + ss;
                                let t = x[xi] as f64 * w[wi] as f64;
                                acc += t;
                                mag += t.abs();
                                r.dx[xi] += w[wi] as f64 * g;
                                r.dw[wi] += x[xi] as f64 * g;
                            }
                        }
                    }
                    r.y[yi] = acc;
                    r.y_mag[yi] = mag;
                    r.db[oc] += g;
                }
            }
        }
    }
    r
}

fn close(what: &str, case: &Case, got: &[f32], want: &[f64], mag: Option<&[f64]>) {
    assert_eq!(got.len(), want.len(), "{what} {case:?}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let scale = mag.map_or(w.abs() + 1.0, |m| m[i] + 1.0);
        assert!(
            (g as f64 - w).abs() <= 2e-5 * scale * 8.0,
            "{what} {case:?}: element {i}: got {g}, want {w}"
        );
    }
}

/// The four outputs of a case: y, dx, dw, db.
fn run_case(
    ctx: &ExecContext,
    case: &Case,
    x: &RawTensor,
    w: &RawTensor,
    b: Option<&RawTensor>,
    dy: &RawTensor,
) -> Result<[RawTensor; 4], ExecError> {
    let y = ctx.conv2d(x, w, b, case.o)?;
    let dx = ctx.conv2d_input_grad(x.shape(), w, dy, case.o)?;
    let dw = ctx.conv2d_weight_grad(x, w.shape(), dy, case.o)?;
    let db = ctx.conv_bias_grad(dy)?;
    Ok([y, dx, dw, db])
}

struct Inputs {
    x: RawTensor,
    w: RawTensor,
    b: Option<RawTensor>,
    dy: RawTensor,
}

fn inputs(ctx: &ExecContext, case: &Case, seed: u64) -> (Inputs, Reference) {
    let nx: usize = case.x.iter().product();
    let nw: usize = case.w.iter().product();
    let xv = values(nx, seed);
    let wv = values(nw, seed + 1);
    let bv = values(case.w[0], seed + 2);
    let bias = case.bias.then_some(&bv[..]);
    let ny = out_len(case);
    let dyv = values(ny, seed + 3);
    let r = reference(case, &xv, &wv, bias, &dyv);
    let t = |shape: &[usize], v: &[f32]| ctx.from_slice(shape, v).unwrap();
    let inp = Inputs {
        x: t(&case.x, &xv),
        w: t(&case.w, &wv),
        b: case.bias.then(|| t(&[case.w[0]], &bv)),
        dy: t(&r.oshape, &dyv),
    };
    (inp, r)
}

fn out_len(case: &Case) -> usize {
    let [n, _, h, wd] = case.x;
    let [co, _, kh, kw] = case.w;
    let o = case.o;
    let oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
    let ow = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
    n * co * oh * ow
}

#[test]
fn conv2d_and_its_gradients_match_the_f64_reference() {
    let ctx = ExecContext::with_threads(2);
    for (i, case) in cases().iter().enumerate() {
        let (inp, r) = inputs(&ctx, case, 10 * i as u64);
        let [y, dx, dw, db] =
            run_case(&ctx, case, &inp.x, &inp.w, inp.b.as_ref(), &inp.dy).unwrap();
        assert_eq!(y.shape(), &r.oshape, "{case:?}");
        close("y", case, &y.to_vec(), &r.y, Some(&r.y_mag));
        close("dx", case, &dx.to_vec(), &r.dx, None);
        close("dw", case, &dw.to_vec(), &r.dw, None);
        close("db", case, &db.to_vec(), &r.db, None);
    }
}

/// A 1-D case is the 2-D one with height 1: checked against the 2-D reference.
#[test]
fn conv1d_and_its_gradients_match_the_f64_reference() {
    let ctx = ExecContext::new();
    let c1 = |x: [usize; 3], w: [usize; 3], s, p, d, g, bias| {
        (
            Case {
                x: [x[0], x[1], 1, x[2]],
                w: [w[0], w[1], 1, w[2]],
                o: o2([1, s], [0, p], [1, d], g),
                bias,
            },
            Conv1dOptions {
                stride: s,
                padding: p,
                dilation: d,
                groups: g,
            },
        )
    };
    for (i, (case, o1)) in [
        c1([2, 3, 10], [4, 3, 3], 2, 1, 1, 1, true),
        c1([2, 4, 11], [4, 1, 3], 1, 2, 2, 4, false),
        c1([1, 6, 7], [3, 2, 1], 1, 0, 1, 3, true),
        c1([3, 2, 40], [5, 2, 4], 3, 3, 2, 1, true),
    ]
    .into_iter()
    .enumerate()
    {
        let (inp, r) = inputs(&ctx, &case, 100 + 10 * i as u64);
        let x = inp.x.reshape(&[case.x[0], case.x[1], case.x[3]]).unwrap();
        let w = inp.w.reshape(&[case.w[0], case.w[1], case.w[3]]).unwrap();
        let [n, co, _, ol] = r.oshape;
        let dy = inp.dy.reshape(&[n, co, ol]).unwrap();
        let y = ctx.conv1d(&x, &w, inp.b.as_ref(), o1).unwrap();
        assert_eq!(y.shape(), &[n, co, ol]);
        close("y1", &case, &y.to_vec(), &r.y, Some(&r.y_mag));
        let dx = ctx.conv1d_input_grad(x.shape(), &w, &dy, o1).unwrap();
        assert_eq!(dx.shape(), x.shape());
        close("dx1", &case, &dx.to_vec(), &r.dx, None);
        let dw = ctx.conv1d_weight_grad(&x, w.shape(), &dy, o1).unwrap();
        assert_eq!(dw.shape(), w.shape());
        close("dw1", &case, &dw.to_vec(), &r.dw, None);
        close(
            "db1",
            &case,
            &ctx.conv_bias_grad(&dy).unwrap().to_vec(),
            &r.db,
            None,
        );
    }
}

/// Non-contiguous operands (a transposed input) give the contiguous results.
#[test]
fn strided_operands_give_the_contiguous_results() {
    let ctx = ExecContext::new();
    let case = cases()[0];
    let (inp, _) = inputs(&ctx, &case, 5);
    let xt = ctx
        .materialize(&inp.x.transpose(2, 3).unwrap())
        .unwrap()
        .transpose(2, 3)
        .unwrap();
    assert!(!xt.is_contiguous());
    let a = ctx.conv2d(&inp.x, &inp.w, inp.b.as_ref(), case.o).unwrap();
    let b = ctx.conv2d(&xt, &inp.w, inp.b.as_ref(), case.o).unwrap();
    assert_eq!(bits(&a), bits(&b));
}

fn bits(t: &RawTensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

/// Cases large enough to run on the team (above the parallel threshold).
fn big_cases() -> Vec<Case> {
    vec![
        // stride-1 depthwise with padding, dilation and rows longer than a
        // register: the AVX-512 depthwise kernels
        Case {
            x: [3, 6, 9, 37],
            w: [6, 1, 3, 3],
            o: o2([1, 1], [1, 2], [1, 2], 6),
            bias: true,
        },
        Case {
            x: [2, 4, 20, 20],
            w: [4, 1, 5, 5],
            o: o2([1, 1], [2, 2], [1, 1], 4),
            bias: false,
        },
        // few taps at stride 1 (K = 9, 12): the direct small-K forward at the
        // AVX-512 level; 29 and 7 output channels take every channel block
        Case {
            x: [3, 1, 20, 28],
            w: [29, 1, 3, 3],
            o: o2([1, 1], [1, 1], [1, 1], 1),
            bias: false,
        },
        Case {
            x: [2, 2, 9, 19],
            w: [7, 2, 2, 3],
            o: o2([1, 1], [1, 0], [2, 1], 1),
            bias: true,
        },
        // few K rows (27): the weight gradient split over output channels
        // (40: one panel and a part, or chunks of 20, 14 and 10 channels)
        Case {
            x: [6, 3, 12, 12],
            w: [40, 3, 3, 3],
            o: o2([1, 1], [1, 1], [1, 1], 1),
            bias: true,
        },
        Case {
            x: [6, 8, 12, 12],
            w: [16, 8, 3, 3],
            o: o2([1, 1], [1, 1], [1, 1], 1),
            bias: true,
        },
        Case {
            x: [5, 8, 11, 13],
            w: [8, 1, 3, 3],
            o: o2([2, 1], [1, 1], [1, 1], 8),
            bias: true,
        },
        // stride 2: the implicit packer over the column matrix and col2im
        Case {
            x: [5, 8, 13, 11],
            w: [12, 8, 3, 3],
            o: o2([2, 2], [1, 1], [1, 1], 1),
            bias: true,
        },
        Case {
            x: [5, 16, 10, 10],
            w: [24, 8, 1, 1],
            o: o2([1, 1], [0, 0], [1, 1], 2),
            bias: false,
        },
    ]
}

/// Forward and every gradient: the same bits for 1-4 threads and at every vector
/// level the CPU has. (One test: the vector level is a process-wide setting.)
#[test]
fn same_bits_for_every_thread_count_and_vector_level() {
    let best = detected_simd_level();
    let levels: Vec<SimdLevel> = SimdLevel::available().collect();
    for case in big_cases() {
        let mut want: Option<Vec<Vec<u32>>> = None;
        for &level in &levels {
            assert!(force_simd_level(level));
            for threads in 1..=4 {
                let ctx = ExecContext::with_threads(threads);
                let (inp, _) = inputs(&ctx, &case, 7);
                let outs = run_case(&ctx, &case, &inp.x, &inp.w, inp.b.as_ref(), &inp.dy).unwrap();
                let got: Vec<Vec<u32>> = outs.iter().map(bits).collect();
                match &want {
                    None => want = Some(got),
                    Some(w) => assert!(
                        *w == got,
                        "{case:?}: {level:?} with {threads} threads differs"
                    ),
                }
            }
        }
    }
    force_simd_level(best);
}

/// A sample's forward and input gradient are the same bits alone or in a batch.
#[test]
fn forward_and_input_grad_are_batch_invariant() {
    let ctx = ExecContext::with_threads(2);
    for case in big_cases() {
        let (inp, _) = inputs(&ctx, &case, 3);
        let y = ctx.conv2d(&inp.x, &inp.w, inp.b.as_ref(), case.o).unwrap();
        let dx = ctx
            .conv2d_input_grad(inp.x.shape(), &inp.w, &inp.dy, case.o)
            .unwrap();
        for s in 0..case.x[0] {
            let one = |t: &RawTensor| ctx.materialize(&t.narrow(0, s, 1).unwrap()).unwrap();
            let ys = ctx
                .conv2d(&one(&inp.x), &inp.w, inp.b.as_ref(), case.o)
                .unwrap();
            assert_eq!(bits(&ys), bits(&one(&y)), "{case:?} sample {s}: forward");
            let dxs = ctx
                .conv2d_input_grad(one(&inp.x).shape(), &inp.w, &one(&inp.dy), case.o)
                .unwrap();
            assert_eq!(
                bits(&dxs),
                bits(&one(&dx)),
                "{case:?} sample {s}: input grad"
            );
        }
    }
}

/// Every bad input is an `Err` naming the op and the value.
#[test]
fn bad_inputs_are_errors_naming_the_op_and_the_value() {
    let ctx = ExecContext::new();
    let t = |shape: &[usize]| ctx.zeros(shape).unwrap();
    let x = t(&[2, 4, 5, 5]);
    let w = t(&[6, 4, 3, 3]);
    let d = Conv2dOptions::default();
    let err = |r: Result<RawTensor, ExecError>| r.unwrap_err().to_string();
    let cases: Vec<(String, &[&str])> = vec![
        // kernel larger than the padded input
        (
            err(ctx.conv2d(&x, &t(&[6, 4, 6, 3]), None, d)),
            &["conv2d", "[6, 4, 6, 3]", "larger than the padded input"],
        ),
        (
            err(ctx.conv2d(&x, &t(&[6, 4, 3, 3]), None, o2([1, 1], [0, 0], [3, 1], 1))),
            &["conv2d", "larger than the padded input"],
        ),
        // channels not divisible by groups
        (
            err(ctx.conv2d(&x, &t(&[6, 1, 3, 3]), None, o2([1, 1], [0, 0], [1, 1], 3))),
            &["conv2d", "groups = 3", "input channels"],
        ),
        (
            err(ctx.conv2d(&x, &t(&[5, 2, 3, 3]), None, o2([1, 1], [0, 0], [1, 1], 2))),
            &["conv2d", "groups = 2", "output channels"],
        ),
        // wrong ranks
        (
            err(ctx.conv2d(&t(&[4, 5, 5]), &w, None, d)),
            &["conv2d", "[4, 5, 5]", "4-D"],
        ),
        (
            err(ctx.conv2d(&x, &t(&[6, 4, 9]), None, d)),
            &["conv2d", "[6, 4, 9]", "weight must be 4-D"],
        ),
        // weight in-channels != in / groups
        (
            err(ctx.conv2d(&x, &t(&[6, 3, 3, 3]), None, d)),
            &["conv2d", "[6, 3, 3, 3]", "in_channels / groups"],
        ),
        // bias length
        (
            err(ctx.conv2d(&x, &w, Some(&t(&[5])), d)),
            &["conv2d", "[5]", "bias"],
        ),
        (
            err(ctx.conv2d(&x, &w, Some(&t(&[6, 1])), d)),
            &["conv2d", "[6, 1]", "bias"],
        ),
        // zero stride, dilation, groups
        (
            err(ctx.conv2d(&x, &w, None, o2([1, 0], [0, 0], [1, 1], 1))),
            &["conv2d", "stride[1] = 0"],
        ),
        (
            err(ctx.conv2d(&x, &w, None, o2([1, 1], [0, 0], [0, 1], 1))),
            &["conv2d", "dilation[0] = 0"],
        ),
        (
            err(ctx.conv2d(&x, &w, None, o2([1, 1], [0, 0], [1, 1], 0))),
            &["conv2d", "groups = 0"],
        ),
        (
            err(ctx.conv2d(&x, &w, None, o2([1, 1], [usize::MAX, 0], [1, 1], 1))),
            &["conv2d", "padding[0]"],
        ),
        // conv1d
        (
            err(ctx.conv1d(
                &t(&[1, 2, 4]),
                &t(&[3, 2, 5]),
                None,
                Conv1dOptions::default(),
            )),
            &["conv1d", "larger than the padded input"],
        ),
        (
            err(ctx.conv1d(
                &t(&[1, 2, 4]),
                &t(&[3, 2, 2]),
                None,
                Conv1dOptions {
                    stride: 0,
                    ..Default::default()
                },
            )),
            &["conv1d", "stride = 0"],
        ),
        (
            err(ctx.conv1d(
                &t(&[1, 2, 4]),
                &t(&[3, 2, 2]),
                None,
                Conv1dOptions {
                    dilation: 0,
                    ..Default::default()
                },
            )),
            &["conv1d", "dilation = 0"],
        ),
        (
            err(ctx.conv1d(
                &t(&[1, 3, 4]),
                &t(&[3, 1, 2]),
                None,
                Conv1dOptions {
                    groups: 2,
                    ..Default::default()
                },
            )),
            &["conv1d", "groups = 2"],
        ),
        (
            err(ctx.conv1d(&x, &t(&[3, 4, 2]), None, Conv1dOptions::default())),
            &["conv1d", "3-D"],
        ),
        // backward kernels: the same checks, and the grad's shape
        (
            err(ctx.conv2d_input_grad(&[2, 4, 5, 5], &w, &t(&[2, 6, 3, 4]), d)),
            &["conv2d_input_grad", "[2, 6, 3, 4]", "output shape"],
        ),
        (
            err(ctx.conv2d_weight_grad(&x, &[6, 4, 3, 3], &t(&[2, 6, 4, 3]), d)),
            &["conv2d_weight_grad", "[2, 6, 4, 3]"],
        ),
        (
            err(ctx.conv2d_weight_grad(
                &x,
                &[6, 4, 3, 3],
                &t(&[2, 6, 3, 3]),
                o2([0, 1], [0, 0], [1, 1], 1),
            )),
            &["conv2d_weight_grad", "stride[0] = 0"],
        ),
        (
            err(ctx.conv1d_input_grad(
                &[1, 2, 4],
                &t(&[3, 2, 2]),
                &t(&[1, 3, 4]),
                Conv1dOptions::default(),
            )),
            &["conv1d_input_grad", "[1, 3, 4]"],
        ),
        (
            err(ctx.conv_bias_grad(&t(&[6]))),
            &["conv_bias_grad", "[6]"],
        ),
    ];
    for (msg, needles) in cases {
        for n in needles {
            assert!(msg.contains(n), "`{msg}` should mention `{n}`");
        }
    }
}
