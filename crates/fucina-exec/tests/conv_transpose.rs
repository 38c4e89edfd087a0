//! `conv_transpose1d` / `conv_transpose2d` and their backward kernels: values
//! against a float64 scatter-loop reference for many option combinations
//! (stride, padding, output padding, dilation, groups, depthwise, 1x1), every
//! bad input, the same bits for 1-4 threads and every vector level, batch
//! invariance.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{
    ConvTranspose1dOptions, ConvTranspose2dOptions, ExecContext, ExecError, RawTensor, SimdLevel,
    detected_simd_level, force_simd_level,
};
use support::values;

/// One 2-D case: input shape, weight shape (`[C_in, C_out / groups, KH,
/// KW]`), options, with a bias or not.
#[derive(Clone, Copy, Debug)]
struct Case {
    x: [usize; 4],
    w: [usize; 4],
    o: ConvTranspose2dOptions,
    bias: bool,
}

fn o2(
    s: [usize; 2],
    p: [usize; 2],
    op: [usize; 2],
    d: [usize; 2],
    g: usize,
) -> ConvTranspose2dOptions {
    ConvTranspose2dOptions {
        stride: s,
        padding: p,
        output_padding: op,
        dilation: d,
        groups: g,
    }
}

fn cases() -> Vec<Case> {
    let c = |x, w, o, bias| Case { x, w, o, bias };
    vec![
        // the U-Net upsampler: 2x2, stride 2
        c(
            [2, 3, 4, 5],
            [3, 4, 2, 2],
            o2([2, 2], [0, 0], [0, 0], [1, 1], 1),
            true,
        ),
        // 3x3 stride 2 padding 1 output padding 1 (doubles the size)
        c(
            [2, 4, 3, 4],
            [4, 3, 3, 3],
            o2([2, 2], [1, 1], [1, 1], [1, 1], 1),
            false,
        ),
        // stride 1 (the padded-plane kernels), with and without padding
        c(
            [2, 3, 5, 6],
            [3, 2, 3, 3],
            ConvTranspose2dOptions::default(),
            true,
        ),
        c(
            [1, 2, 6, 5],
            [2, 5, 3, 2],
            o2([1, 1], [1, 1], [0, 0], [1, 1], 1),
            false,
        ),
        // groups, uneven strides, dilation
        c(
            [2, 4, 4, 3],
            [4, 3, 3, 2],
            o2([2, 1], [1, 0], [1, 0], [1, 2], 2),
            true,
        ),
        c(
            [1, 6, 3, 3],
            [6, 1, 2, 3],
            o2([3, 2], [2, 1], [2, 1], [2, 1], 3),
            false,
        ),
        // depthwise (groups == in == out): the direct kernels
        c(
            [2, 3, 5, 4],
            [3, 1, 3, 3],
            o2([1, 1], [1, 1], [0, 0], [1, 1], 3),
            true,
        ),
        c(
            [1, 4, 4, 5],
            [4, 1, 2, 3],
            o2([2, 2], [0, 1], [1, 0], [2, 1], 4),
            false,
        ),
        // 1x1, stride 1 (straight to the GEMM) and stride 2
        c(
            [3, 5, 4, 3],
            [5, 7, 1, 1],
            ConvTranspose2dOptions::default(),
            true,
        ),
        c(
            [2, 4, 3, 3],
            [4, 3, 1, 1],
            o2([2, 2], [0, 0], [1, 1], [1, 1], 1),
            false,
        ),
        // stride 1 with dilation (the flipped-weight convolution, padded by
        // dilation * (K - 1) - padding), and a padding above dilation * (K -
        // 1) (the input-gradient form)
        c(
            [2, 3, 6, 5],
            [3, 4, 3, 2],
            o2([1, 1], [2, 1], [0, 0], [2, 2], 1),
            true,
        ),
        c(
            [1, 3, 5, 5],
            [3, 2, 1, 1],
            o2([1, 1], [1, 1], [0, 0], [1, 1], 1),
            true,
        ),
        // padding that crops most of the full output
        c(
            [1, 2, 4, 4],
            [2, 2, 5, 5],
            o2([1, 1], [3, 3], [0, 0], [1, 1], 1),
            true,
        ),
        // several column blocks, a depth above one GEMM depth block
        c(
            [1, 64, 12, 12],
            [64, 8, 2, 2],
            o2([2, 2], [0, 0], [0, 0], [1, 1], 1),
            true,
        ),
    ]
}

fn out_hw(case: &Case) -> [usize; 2] {
    let o = case.o;
    [0, 1].map(|a| {
        (case.x[2 + a] - 1) * o.stride[a]
            + o.dilation[a] * (case.w[2 + a] - 1)
            + o.output_padding[a]
            + 1
            - 2 * o.padding[a]
    })
}

/// The float64 scatter loops: `y`, and for the output gradient `dy` the
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
    let [_, og, kh, kw] = case.w;
    let o = case.o;
    let cg = c / o.groups;
    let co = og * o.groups;
    let [oh, ow] = out_hw(case);
    let ny = n * co * oh * ow;
    let mut r = Reference {
        y: vec![0.0; ny],
        y_mag: vec![0.0; ny],
        dx: vec![0.0; x.len()],
        dw: vec![0.0; w.len()],
        db: vec![0.0; co],
        oshape: [n, co, oh, ow],
    };
    for ni in 0..n {
        for oc in 0..co {
            let bv = b.map_or(0.0, |b| b[oc] as f64);
            for p in 0..oh * ow {
                let yi = (ni * co + oc) * oh * ow + p;
                r.y[yi] = bv;
                r.y_mag[yi] = bv.abs();
                r.db[oc] += dy[yi] as f64;
            }
        }
        for ci in 0..c {
            let gi = ci / cg;
            for i in 0..h {
                for j in 0..wd {
                    let xi = ((ni * c + ci) * h + i) * wd + j;
                    for oo in 0..og {
                        let oc = gi * og + oo;
                        for rr in 0..kh {
                            for ss in 0..kw {
                                let yh = (i * o.stride[0] + rr * o.dilation[0]) as isize
                                    - o.padding[0] as isize;
                                let yw = (j * o.stride[1] + ss * o.dilation[1]) as isize
                                    - o.padding[1] as isize;
                                if yh < 0 || yw < 0 || yh >= oh as isize || yw >= ow as isize {
                                    continue;
                                }
                                let yi = ((ni * co + oc) * oh + yh as usize) * ow + yw as usize;
                                let wi = ((ci * og + oo) * kh + rr) * kw + ss;
                                let t = x[xi] as f64 * w[wi] as f64;
                                r.y[yi] += t;
                                r.y_mag[yi] += t.abs();
                                r.dx[xi] += w[wi] as f64 * dy[yi] as f64;
                                r.dw[wi] += x[xi] as f64 * dy[yi] as f64;
                            }
                        }
                    }
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
fn run_case(ctx: &ExecContext, case: &Case, inp: &Inputs) -> Result<[RawTensor; 4], ExecError> {
    let (x, w) = (&inp.x, &inp.w);
    let y = ctx.conv_transpose2d(x, w, inp.b.as_ref(), case.o)?;
    let dx = ctx.conv_transpose2d_input_grad(x.shape(), w, &inp.dy, case.o)?;
    let dw = ctx.conv_transpose2d_weight_grad(x, w.shape(), &inp.dy, case.o)?;
    let db = ctx.conv_bias_grad(&inp.dy)?;
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
    let co = case.w[1] * case.o.groups;
    let xv = values(nx, seed);
    let wv = values(nw, seed + 1);
    let bv = values(co, seed + 2);
    let bias = case.bias.then_some(&bv[..]);
    let [oh, ow] = out_hw(case);
    let dyv = values(case.x[0] * co * oh * ow, seed + 3);
    let r = reference(case, &xv, &wv, bias, &dyv);
    let t = |shape: &[usize], v: &[f32]| ctx.from_slice(shape, v).unwrap();
    let inp = Inputs {
        x: t(&case.x, &xv),
        w: t(&case.w, &wv),
        b: case.bias.then(|| t(&[co], &bv)),
        dy: t(&r.oshape, &dyv),
    };
    (inp, r)
}

#[test]
fn conv_transpose2d_and_its_gradients_match_the_f64_reference() {
    let ctx = ExecContext::with_threads(2);
    for (i, case) in cases().iter().enumerate() {
        let (inp, r) = inputs(&ctx, case, 10 * i as u64);
        let [y, dx, dw, db] = run_case(&ctx, case, &inp).unwrap();
        assert_eq!(y.shape(), &r.oshape, "{case:?}");
        let want = case.o.out_shape(&case.x, &case.w).unwrap();
        assert_eq!(want.as_slice(), &r.oshape, "{case:?}: out_shape");
        close("y", case, &y.to_vec(), &r.y, Some(&r.y_mag));
        close("dx", case, &dx.to_vec(), &r.dx, None);
        close("dw", case, &dw.to_vec(), &r.dw, None);
        close("db", case, &db.to_vec(), &r.db, None);
    }
}

/// A 1-D case is the 2-D one with height 1: checked against the 2-D reference.
#[test]
fn conv_transpose1d_and_its_gradients_match_the_f64_reference() {
    let ctx = ExecContext::new();
    let c1 = |x: [usize; 3], w: [usize; 3], s, p, op, d, g, bias| {
        (
            Case {
                x: [x[0], x[1], 1, x[2]],
                w: [w[0], w[1], 1, w[2]],
                o: o2([1, s], [0, p], [0, op], [1, d], g),
                bias,
            },
            ConvTranspose1dOptions {
                stride: s,
                padding: p,
                output_padding: op,
                dilation: d,
                groups: g,
            },
        )
    };
    for (i, (case, o1)) in [
        c1([2, 3, 6], [3, 4, 3], 2, 1, 1, 1, 1, true),
        c1([2, 4, 7], [4, 1, 3], 1, 2, 0, 2, 4, false),
        c1([1, 6, 5], [6, 1, 1], 1, 0, 0, 1, 3, true),
        c1([3, 2, 9], [2, 5, 4], 3, 2, 2, 2, 1, true),
    ]
    .into_iter()
    .enumerate()
    {
        let (inp, r) = inputs(&ctx, &case, 100 + 10 * i as u64);
        let x = inp.x.reshape(&[case.x[0], case.x[1], case.x[3]]).unwrap();
        let w = inp.w.reshape(&[case.w[0], case.w[1], case.w[3]]).unwrap();
        let [n, co, _, ol] = r.oshape;
        let dy = inp.dy.reshape(&[n, co, ol]).unwrap();
        let y = ctx.conv_transpose1d(&x, &w, inp.b.as_ref(), o1).unwrap();
        assert_eq!(y.shape(), &[n, co, ol]);
        assert_eq!(
            o1.out_shape(x.shape(), w.shape()).unwrap().as_slice(),
            &[n, co, ol]
        );
        close("y1", &case, &y.to_vec(), &r.y, Some(&r.y_mag));
        let dx = ctx
            .conv_transpose1d_input_grad(x.shape(), &w, &dy, o1)
            .unwrap();
        assert_eq!(dx.shape(), x.shape());
        close("dx1", &case, &dx.to_vec(), &r.dx, None);
        let dw = ctx
            .conv_transpose1d_weight_grad(&x, w.shape(), &dy, o1)
            .unwrap();
        assert_eq!(dw.shape(), w.shape());
        close("dw1", &case, &dw.to_vec(), &r.dw, None);
    }
}

/// Non-contiguous operands (a transposed input) give the contiguous results.
#[test]
fn strided_operands_give_the_contiguous_results() {
    let ctx = ExecContext::new();
    let case = cases()[1];
    let (inp, _) = inputs(&ctx, &case, 5);
    let xt = ctx
        .materialize(&inp.x.transpose(2, 3).unwrap())
        .unwrap()
        .transpose(2, 3)
        .unwrap();
    assert!(!xt.is_contiguous());
    let a = ctx.conv_transpose2d(&inp.x, &inp.w, None, case.o).unwrap();
    let b = ctx.conv_transpose2d(&xt, &inp.w, None, case.o).unwrap();
    assert_eq!(bits(&a), bits(&b));
}

fn bits(t: &RawTensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

/// Cases large enough to run on the team (above the parallel threshold).
fn big_cases() -> Vec<Case> {
    vec![
        // the U-Net upsampler
        Case {
            x: [4, 16, 8, 8],
            w: [16, 8, 2, 2],
            o: o2([2, 2], [0, 0], [0, 0], [1, 1], 1),
            bias: true,
        },
        // stride 1, 3x3 padding 1 (the padded planes, wide columns)
        Case {
            x: [3, 8, 11, 13],
            w: [8, 12, 3, 3],
            o: o2([1, 1], [1, 1], [0, 0], [1, 1], 1),
            bias: true,
        },
        // few K rows at stride 1: the weight gradient split by channel
        Case {
            x: [6, 40, 10, 10],
            w: [40, 3, 3, 3],
            o: o2([1, 1], [1, 1], [0, 0], [1, 1], 1),
            bias: false,
        },
        // depthwise, stride 1 and stride 2
        Case {
            x: [3, 6, 9, 33],
            w: [6, 1, 3, 3],
            o: o2([1, 1], [1, 2], [0, 0], [1, 2], 6),
            bias: true,
        },
        Case {
            x: [5, 8, 6, 7],
            w: [8, 1, 3, 3],
            o: o2([2, 2], [1, 1], [1, 1], [1, 1], 8),
            bias: false,
        },
        // grouped, stride 2 with output padding
        Case {
            x: [5, 12, 7, 6],
            w: [12, 4, 3, 3],
            o: o2([2, 2], [1, 1], [1, 1], [1, 1], 3),
            bias: true,
        },
    ]
}

/// Forward and every gradient: the same bits for 1-4 threads and at every
/// vector level the CPU has. (One test: the vector level is a process-wide
/// setting.)
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
                let outs = run_case(&ctx, &case, &inp).unwrap();
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

/// A sample's forward and input gradient are the same bits alone or in a
/// batch.
#[test]
fn forward_and_input_grad_are_batch_invariant() {
    let ctx = ExecContext::with_threads(2);
    for case in big_cases() {
        let (inp, _) = inputs(&ctx, &case, 3);
        let y = ctx
            .conv_transpose2d(&inp.x, &inp.w, inp.b.as_ref(), case.o)
            .unwrap();
        let dx = ctx
            .conv_transpose2d_input_grad(inp.x.shape(), &inp.w, &inp.dy, case.o)
            .unwrap();
        for s in 0..case.x[0] {
            let one = |t: &RawTensor| ctx.materialize(&t.narrow(0, s, 1).unwrap()).unwrap();
            let ys = ctx
                .conv_transpose2d(&one(&inp.x), &inp.w, inp.b.as_ref(), case.o)
                .unwrap();
            assert_eq!(bits(&ys), bits(&one(&y)), "{case:?} sample {s}: forward");
            let dxs = ctx
                .conv_transpose2d_input_grad(one(&inp.x).shape(), &inp.w, &one(&inp.dy), case.o)
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
    let w = t(&[4, 3, 3, 3]);
    let d = ConvTranspose2dOptions::default();
    let s2 = o2([2, 2], [0, 0], [0, 0], [1, 1], 1);
    let err = |r: Result<RawTensor, ExecError>| r.unwrap_err().to_string();
    let cases: Vec<(String, &[&str])> = vec![
        // wrong ranks
        (
            err(ctx.conv_transpose2d(&t(&[4, 5, 5]), &w, None, d)),
            &["conv_transpose2d", "[4, 5, 5]", "4-D"],
        ),
        (
            err(ctx.conv_transpose2d(&x, &t(&[4, 3, 9]), None, d)),
            &["conv_transpose2d", "[4, 3, 9]", "weight must be 4-D"],
        ),
        // zero dimension (through a backward kernel's weight shape)
        (
            err(ctx.conv_transpose2d_weight_grad(&x, &[4, 3, 0, 3], &t(&[2, 3, 7, 7]), d)),
            &["conv_transpose2d_weight_grad", "[4, 3, 0, 3]"],
        ),
        // weight's first dimension != in channels
        (
            err(ctx.conv_transpose2d(&x, &t(&[5, 3, 3, 3]), None, d)),
            &["conv_transpose2d", "[5, 3, 3, 3]", "input channels"],
        ),
        // groups
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([1, 1], [0, 0], [0, 0], [1, 1], 3))),
            &["conv_transpose2d", "groups = 3", "input channels"],
        ),
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([1, 1], [0, 0], [0, 0], [1, 1], 0))),
            &["conv_transpose2d", "groups = 0"],
        ),
        (
            err(ctx.conv_transpose2d_weight_grad(
                &x,
                &[4, usize::MAX / 2 + 1, 1, 1],
                &t(&[2, 3, 7, 7]),
                o2([1, 1], [0, 0], [0, 0], [1, 1], 2),
            )),
            &["conv_transpose2d_weight_grad", "overflows"],
        ),
        // bias length: C_out = weight[1] * groups
        (
            err(ctx.conv_transpose2d(&x, &w, Some(&t(&[4])), d)),
            &["conv_transpose2d", "[4]", "bias"],
        ),
        // zero stride, dilation
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([1, 0], [0, 0], [0, 0], [1, 1], 1))),
            &["conv_transpose2d", "stride[1] = 0"],
        ),
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([1, 1], [0, 0], [0, 0], [0, 1], 1))),
            &["conv_transpose2d", "dilation[0] = 0"],
        ),
        // output padding not below the stride
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([2, 2], [0, 0], [0, 2], [1, 1], 1))),
            &["conv_transpose2d", "output_padding[1] = 2", "stride"],
        ),
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([1, 1], [0, 0], [1, 0], [2, 2], 1))),
            &["conv_transpose2d", "output_padding[0] = 1"],
        ),
        // padding that leaves nothing (full output 7: padding 4 crops 8)
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([1, 1], [4, 0], [0, 0], [1, 1], 1))),
            &["conv_transpose2d", "padding[0] = 4", "empty output"],
        ),
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([1, 1], [0, usize::MAX], [0, 0], [1, 1], 1))),
            &["conv_transpose2d", "padding[1]"],
        ),
        // sizes that overflow
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([usize::MAX, 1], [0, 0], [0, 0], [1, 1], 1))),
            &["conv_transpose2d", "overflows"],
        ),
        (
            err(ctx.conv_transpose2d(&x, &w, None, o2([1, 1], [0, 0], [0, 0], [1, usize::MAX], 1))),
            &["conv_transpose2d", "overflows"],
        ),
        // 1-D
        (
            err(ctx.conv_transpose1d(
                &t(&[1, 2, 4]),
                &t(&[2, 3, 2]),
                None,
                ConvTranspose1dOptions {
                    stride: 0,
                    ..Default::default()
                },
            )),
            &["conv_transpose1d", "stride = 0"],
        ),
        (
            err(ctx.conv_transpose1d(
                &t(&[1, 2, 4]),
                &t(&[2, 3, 2]),
                None,
                ConvTranspose1dOptions {
                    stride: 2,
                    output_padding: 2,
                    ..Default::default()
                },
            )),
            &["conv_transpose1d", "output_padding = 2"],
        ),
        (
            err(ctx.conv_transpose1d(&x, &w, None, ConvTranspose1dOptions::default())),
            &["conv_transpose1d", "3-D"],
        ),
        // backward kernels: the same checks, and the grad's shape
        (
            err(ctx.conv_transpose2d_input_grad(&[2, 4, 5, 5], &w, &t(&[2, 3, 7, 6]), d)),
            &[
                "conv_transpose2d_input_grad",
                "[2, 3, 7, 6]",
                "output shape",
            ],
        ),
        (
            err(ctx.conv_transpose2d_weight_grad(&x, &[4, 3, 3, 3], &t(&[2, 3, 6, 7]), d)),
            &["conv_transpose2d_weight_grad", "[2, 3, 6, 7]"],
        ),
        (
            err(ctx.conv_transpose2d_weight_grad(&x, &[4, 3, 3, 3], &t(&[2, 3, 7, 7]), s2)),
            &["conv_transpose2d_weight_grad", "[2, 3, 7, 7]"],
        ),
        (
            err(ctx.conv_transpose1d_input_grad(
                &[1, 2, 4],
                &t(&[2, 3, 2]),
                &t(&[1, 3, 4]),
                ConvTranspose1dOptions::default(),
            )),
            &["conv_transpose1d_input_grad", "[1, 3, 4]"],
        ),
    ];
    for (msg, needles) in cases {
        for n in needles {
            assert!(msg.contains(n), "`{msg}` should mention `{n}`");
        }
    }
    // The good shapes of these operands work.
    let y = ctx.conv_transpose2d(&x, &w, Some(&t(&[3])), d).unwrap();
    assert_eq!(y.shape(), &[2, 3, 7, 7]);
    assert_eq!(
        ctx.conv_transpose2d(&x, &w, None, s2).unwrap().shape(),
        &[2, 3, 11, 11]
    );
}
