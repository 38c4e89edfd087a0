//! `pad` and `interpolate` with their backward kernels: values and input
//! gradients against PyTorch's (committed float64 references from
//! `scripts/resize_oracle.py`, crops and 3-D pads among them), forward against float64 references computed
//! here with direct loops over many shapes, the backward as the exact adjoint
//! of the forward (`<f(x), g> = <x, f'(g)>` in f64), contiguous and strided
//! inputs, bad input as an error naming the op and the value, the same bits
//! for 1 to 4 threads, and batch invariance.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{
    ExecContext, ExecError, InterpolateMode, InterpolateOptions, PadMode, PadOptions, RawTensor,
};
use support::{assert_close, nan_bits, strided, values};

include!("fixtures/resize_reference.rs");

const NEAREST: InterpolateMode = InterpolateMode::Nearest;
const BILINEAR: InterpolateMode = InterpolateMode::Bilinear {
    align_corners: false,
};
const ALIGNED: InterpolateMode = InterpolateMode::Bilinear {
    align_corners: true,
};

/// The oracle's input and output gradient.
fn oracle_x(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((0.7 * i as f64 + 0.3).sin() * 2.0) as f32)
        .collect()
}
fn oracle_g(n: usize) -> Vec<f32> {
    (0..n).map(|j| (0.37 * j as f64).cos() as f32).collect()
}

fn pad(pads: &[isize], mode: PadMode) -> PadOptions {
    PadOptions::new(pads, mode).unwrap()
}

#[test]
fn values_and_gradients_match_pytorch() -> Result<(), ExecError> {
    let ctx = ExecContext::new();
    type Fwd<'a> = Box<dyn Fn(&RawTensor) -> Result<RawTensor, ExecError> + 'a>;
    type Bwd<'a> = Box<dyn Fn(&RawTensor, &[usize]) -> Result<RawTensor, ExecError> + 'a>;
    let interp = |o: InterpolateOptions| -> (Fwd<'_>, Bwd<'_>) {
        let ctx = &ctx;
        (
            Box::new(move |x| ctx.interpolate(x, o)),
            Box::new(move |g, s| ctx.interpolate_backward(g, s, o)),
        )
    };
    let padded = |o: PadOptions| -> (Fwd<'_>, Bwd<'_>) {
        let ctx = &ctx;
        (
            Box::new(move |x| ctx.pad(x, o)),
            Box::new(move |g, s| ctx.pad_backward(g, s, o)),
        )
    };
    let s4: &[usize] = &[1, 2, 3, 4];
    let s3: &[usize] = &[2, 3, 4];
    let s5: &[usize] = &[1, 2, 3, 4, 5];
    type Case<'a> = (
        &'a str,
        &'a [usize],
        (Fwd<'a>, Bwd<'a>),
        &'a [f64],
        &'a [f64],
    );
    let cases: Vec<Case> = vec![
        (
            "nearest size",
            s4,
            interp(InterpolateOptions::size([5, 7], NEAREST)),
            NEAREST_SIZE_Y,
            NEAREST_SIZE_GX,
        ),
        (
            "nearest scale",
            s4,
            interp(InterpolateOptions::scale([1.5, 0.75], NEAREST)),
            NEAREST_SCALE_Y,
            NEAREST_SCALE_GX,
        ),
        (
            "nearest down",
            s4,
            interp(InterpolateOptions::size([2, 3], NEAREST)),
            NEAREST_DOWN_Y,
            NEAREST_DOWN_GX,
        ),
        (
            "bilinear size",
            s4,
            interp(InterpolateOptions::size([5, 7], BILINEAR)),
            BILINEAR_SIZE_Y,
            BILINEAR_SIZE_GX,
        ),
        (
            "bilinear aligned",
            s4,
            interp(InterpolateOptions::size([5, 7], ALIGNED)),
            BILINEAR_ALIGNED_Y,
            BILINEAR_ALIGNED_GX,
        ),
        (
            "bilinear scale",
            s4,
            interp(InterpolateOptions::scale([2.0, 1.5], BILINEAR)),
            BILINEAR_SCALE_Y,
            BILINEAR_SCALE_GX,
        ),
        (
            "bilinear down",
            s4,
            interp(InterpolateOptions::size([2, 3], BILINEAR)),
            BILINEAR_DOWN_Y,
            BILINEAR_DOWN_GX,
        ),
        (
            "pad constant",
            s4,
            padded(pad(&[1, 2, 2, 0], PadMode::Constant(0.5))),
            PAD_CONSTANT_Y,
            PAD_CONSTANT_GX,
        ),
        (
            "pad reflect",
            s4,
            padded(pad(&[3, 1, 2, 1], PadMode::Reflect)),
            PAD_REFLECT_Y,
            PAD_REFLECT_GX,
        ),
        (
            "pad replicate",
            s4,
            padded(pad(&[2, 3, 1, 4], PadMode::Replicate)),
            PAD_REPLICATE_Y,
            PAD_REPLICATE_GX,
        ),
        (
            "pad reflect 1-D",
            s3,
            padded(pad(&[3, 2], PadMode::Reflect)),
            PAD_REFLECT_1D_Y,
            PAD_REFLECT_1D_GX,
        ),
        (
            "pad replicate 1-D",
            s3,
            padded(pad(&[1, 5], PadMode::Replicate)),
            PAD_REPLICATE_1D_Y,
            PAD_REPLICATE_1D_GX,
        ),
        (
            "pad crop constant",
            s4,
            padded(pad(&[-1, 2, 1, -2], PadMode::Constant(0.5))),
            PAD_CROP_CONSTANT_Y,
            PAD_CROP_CONSTANT_GX,
        ),
        (
            "pad crop reflect",
            s4,
            padded(pad(&[-2, 3, 2, -1], PadMode::Reflect)),
            PAD_CROP_REFLECT_Y,
            PAD_CROP_REFLECT_GX,
        ),
        (
            "pad crop replicate 1-D",
            s3,
            padded(pad(&[2, -3], PadMode::Replicate)),
            PAD_CROP_REPLICATE_1D_Y,
            PAD_CROP_REPLICATE_1D_GX,
        ),
        (
            "pad 3-D constant",
            s5,
            padded(pad(&[1, 2, 0, 1, 2, 1], PadMode::Constant(-0.25))),
            PAD3D_CONSTANT_Y,
            PAD3D_CONSTANT_GX,
        ),
        (
            "pad 3-D reflect",
            s5,
            padded(pad(&[4, 1, 2, 3, 2, 1], PadMode::Reflect)),
            PAD3D_REFLECT_Y,
            PAD3D_REFLECT_GX,
        ),
        (
            "pad 3-D replicate",
            s5,
            padded(pad(&[2, 3, 1, 4, 3, 2], PadMode::Replicate)),
            PAD3D_REPLICATE_Y,
            PAD3D_REPLICATE_GX,
        ),
        (
            "pad 3-D crop",
            s5,
            padded(pad(&[-2, 1, 1, -3, -1, 2], PadMode::Constant(1.5))),
            PAD3D_CROP_Y,
            PAD3D_CROP_GX,
        ),
        (
            "pad 3-D crop reflect",
            s5,
            padded(pad(&[-1, 2, 1, -1, -2, 1], PadMode::Reflect)),
            PAD3D_CROP_REFLECT_Y,
            PAD3D_CROP_REFLECT_GX,
        ),
    ];
    for (what, shape, (f, b), want_y, want_gx) in cases {
        let n: usize = shape.iter().product();
        let x = ctx.from_slice(shape, &oracle_x(n))?;
        let y = f(&x)?;
        assert_close(&y.to_vec(), want_y, 2e-6, what);
        let g = ctx.from_slice(y.shape(), &oracle_g(y.numel()))?;
        assert_close(&b(&g, shape)?.to_vec(), want_gx, 2e-6, what);
    }
    Ok(())
}

/// The f64 reference of `pad`: each output element from its source index
/// per axis (written independently of the crate's mapping).
fn ref_pad(x: &[f32], shape: &[usize], o: PadOptions) -> (Vec<usize>, Vec<f64>) {
    let r = shape.len();
    // The last three axes' sizes and pads, the outermost first.
    let mut n = [1i64; 3];
    let mut before = [0i64; 3];
    let mut on = [1i64; 3];
    for a in 0..o.axes {
        let k = 2 - a;
        n[k] = shape[r - 1 - a] as i64;
        before[k] = o.pads[2 * a] as i64;
        on[k] = n[k] + o.pads[2 * a] as i64 + o.pads[2 * a + 1] as i64;
    }
    let map = |i: i64, n: i64| -> Option<usize> {
        match o.mode {
            PadMode::Constant(_) => (i >= 0 && i < n).then_some(i as usize),
            PadMode::Replicate => Some(i.max(0).min(n - 1) as usize),
            PadMode::Reflect => {
                let mut j = i;
                if j < 0 {
                    j = -j;
                }
                if j >= n {
                    j = 2 * (n - 1) - j;
                }
                Some(j as usize)
            }
        }
    };
    let vol = (n[0] * n[1] * n[2]) as usize;
    let mut out = Vec::new();
    for p in 0..x.len() / vol {
        for oz in 0..on[0] {
            for oy in 0..on[1] {
                for ox in 0..on[2] {
                    let sz = map(oz - before[0], n[0]);
                    let sy = map(oy - before[1], n[1]);
                    let sx = map(ox - before[2], n[2]);
                    out.push(match (sz, sy, sx) {
                        (Some(sz), Some(sy), Some(sx)) => {
                            let (h, w) = (n[1] as usize, n[2] as usize);
                            f64::from(x[p * vol + (sz * h + sy) * w + sx])
                        }
                        _ => match o.mode {
                            PadMode::Constant(v) => f64::from(v),
                            _ => unreachable!(),
                        },
                    });
                }
            }
        }
    }
    let mut s = shape.to_vec();
    for a in 0..o.axes {
        s[r - 1 - a] = on[2 - a] as usize;
    }
    (s, out)
}

/// The f64 reference of `interpolate`, PyTorch's formulas in f64.
fn ref_interpolate(x: &[f32], s: &[usize], o: InterpolateOptions) -> (Vec<usize>, Vec<f64>) {
    let (h, w) = (s[2], s[3]);
    let [oh, ow] = o.size.unwrap_or_else(|| {
        let f = o.scale_factor.unwrap();
        [
            (h as f64 * f[0]).floor() as usize,
            (w as f64 * f[1]).floor() as usize,
        ]
    });
    let axis = |d: usize, n: usize, out: usize, a: usize| -> (usize, usize, f64) {
        if n == out {
            return (d, d, 0.0);
        }
        let inv = o.scale_factor.map(|f| 1.0 / f[a]);
        match o.mode {
            InterpolateMode::Nearest => {
                let sc = inv.unwrap_or(n as f64 / out as f64);
                let i = ((d as f64 * sc).floor() as usize).min(n - 1);
                (i, i, 0.0)
            }
            InterpolateMode::Bilinear { align_corners } => {
                let real = if align_corners {
                    let sc = if out > 1 {
                        (n - 1) as f64 / (out - 1) as f64
                    } else {
                        0.0
                    };
                    sc * d as f64
                } else {
                    let sc = inv.unwrap_or(n as f64 / out as f64);
                    (sc * (d as f64 + 0.5) - 0.5).max(0.0)
                };
                let i0 = (real.floor() as usize).min(n - 1);
                let l = (real - i0 as f64).clamp(0.0, 1.0);
                (i0, (i0 + 1).min(n - 1), l)
            }
        }
    };
    let mut out = Vec::new();
    for p in 0..s[0] * s[1] {
        let xp = &x[p * h * w..];
        for oy in 0..oh {
            let (y0, y1, ly) = axis(oy, h, oh, 0);
            for ox in 0..ow {
                let (x0, x1, lx) = axis(ox, w, ow, 1);
                let v = |y: usize, x: usize| f64::from(xp[y * w + x]);
                out.push(
                    (1.0 - ly) * ((1.0 - lx) * v(y0, x0) + lx * v(y0, x1))
                        + ly * ((1.0 - lx) * v(y1, x0) + lx * v(y1, x1)),
                );
            }
        }
    }
    (vec![s[0], s[1], oh, ow], out)
}

fn pad_cases() -> Vec<(Vec<usize>, PadOptions)> {
    let mut cases = Vec::new();
    for mode in [
        PadMode::Constant(-1.5),
        PadMode::Reflect,
        PadMode::Replicate,
    ] {
        for (shape, pads) in [
            (vec![7], vec![2, 3]),
            (vec![3, 7], vec![0, 6]),
            (vec![2, 3, 5, 6], vec![1, 2, 3, 4]),
            (vec![2, 3, 5, 6], vec![5, 0, 0, 4]),
            (vec![4, 1, 33], vec![4, 4]),
            (vec![2, 2, 2, 3, 4], vec![3, 3, 2, 2]),
            (vec![5, 6], vec![0, 0, 1, 1]),
            (vec![1, 1, 1, 1], vec![0, 0, 0, 0]),
        ] {
            cases.push((shape, pad(&pads, mode)));
        }
    }
    // Replicate and constant go past the axis size.
    cases.push((vec![2, 2, 2], pad(&[5, 7], PadMode::Replicate)));
    cases.push((vec![2, 2, 3], pad(&[4, 9, 3, 0], PadMode::Constant(2.0))));
    // Negative widths crop, in every mode, on one to three axes; three-axis
    // pads over ranks 3 to 5.
    for mode in [PadMode::Constant(0.5), PadMode::Reflect, PadMode::Replicate] {
        for (shape, pads) in [
            (vec![2, 9], vec![-2, 3]),
            (vec![3, 7], vec![-7, 1]),
            (vec![2, 5, 6], vec![-1, -2, 2, -3]),
            (vec![4, 3, 5], vec![1, 2, 1, 1, 2, 0]),
            (vec![2, 3, 4, 5, 6], vec![2, -1, -3, 2, 1, 2]),
            (vec![2, 4, 4, 5], vec![0, 0, 0, 0, -1, -2]),
            (vec![3, 1, 2], vec![0, 1, 1, 0, 0, 0]),
        ] {
            if mode == PadMode::Reflect && shape == [3, 1, 2] {
                continue; // a reflect pad of an axis of 1
            }
            cases.push((shape, pad(&pads, mode)));
        }
    }
    cases
}

fn interp_cases() -> Vec<(Vec<usize>, InterpolateOptions)> {
    let mut cases = Vec::new();
    for mode in [NEAREST, BILINEAR, ALIGNED] {
        for (s, size) in [
            ([2, 3, 4, 5], [8, 10]),
            ([2, 3, 4, 5], [7, 3]),
            ([1, 2, 9, 7], [4, 4]),
            ([1, 1, 1, 6], [3, 13]),
            ([3, 1, 5, 5], [5, 5]),
            ([1, 2, 6, 4], [1, 1]),
        ] {
            cases.push((s.to_vec(), InterpolateOptions::size(size, mode)));
        }
        for f in [[2.0, 2.0], [1.5, 0.6], [3.0, 1.0], [0.5, 2.5]] {
            cases.push((vec![2, 2, 5, 6], InterpolateOptions::scale(f, mode)));
        }
    }
    cases
}

/// `<y, g>` and `<x, gx>` in f64: equal (up to rounding) exactly when the
/// backward is the forward's adjoint.
fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

#[test]
fn pad_matches_f64_reference_and_its_backward_is_the_adjoint() -> Result<(), ExecError> {
    let ctx = ExecContext::new();
    for (k, (shape, o)) in pad_cases().into_iter().enumerate() {
        let what = format!("pad {shape:?} {o:?}");
        let n: usize = shape.iter().product();
        let xv = values(n, 10 + k as u64);
        let (want_shape, want) = ref_pad(&xv, &shape, o);
        assert_eq!(o.out_shape(&shape)?.as_slice(), want_shape, "{what}");
        for x in [ctx.from_slice(&shape, &xv)?, strided(&ctx, &shape, &xv)] {
            let y = ctx.pad(&x, o)?;
            assert_eq!(y.shape(), want_shape, "{what}");
            assert_close(&y.to_vec(), &want, 0.0, &what);
        }
        let m: usize = want_shape.iter().product();
        let gv = values(m, 50 + k as u64);
        let g = strided(&ctx, &want_shape, &gv);
        let gx = ctx.pad_backward(&g, &shape, o)?.to_vec();
        let zero_fill = PadOptions {
            mode: match o.mode {
                PadMode::Constant(_) => PadMode::Constant(0.0),
                m => m,
            },
            ..o
        };
        let y0 = ctx.pad(&ctx.from_slice(&shape, &xv)?, zero_fill)?.to_vec();
        let (lhs, rhs) = (dot(&y0, &gv), dot(&xv, &gx));
        assert!(
            (lhs - rhs).abs() <= 1e-5 * (1.0 + lhs.abs()),
            "{what}: {lhs} vs {rhs}"
        );
    }
    Ok(())
}

#[test]
fn interpolate_matches_f64_reference_and_its_backward_is_the_adjoint() -> Result<(), ExecError> {
    let ctx = ExecContext::new();
    for (k, (shape, o)) in interp_cases().into_iter().enumerate() {
        let what = format!("interpolate {shape:?} {o:?}");
        let n: usize = shape.iter().product();
        let xv = values(n, 100 + k as u64);
        let (want_shape, want) = ref_interpolate(&xv, &shape, o);
        assert_eq!(o.out_shape(&shape)?.as_slice(), want_shape, "{what}");
        for x in [ctx.from_slice(&shape, &xv)?, strided(&ctx, &shape, &xv)] {
            let y = ctx.interpolate(&x, o)?;
            assert_eq!(y.shape(), want_shape, "{what}");
            assert_close(&y.to_vec(), &want, 1e-6, &what);
        }
        let m: usize = want_shape.iter().product();
        let gv = values(m, 150 + k as u64);
        let g = strided(&ctx, &want_shape, &gv);
        let gx = ctx.interpolate_backward(&g, &shape, o)?.to_vec();
        let y = ctx.interpolate(&ctx.from_slice(&shape, &xv)?, o)?.to_vec();
        let (lhs, rhs) = (dot(&y, &gv), dot(&xv, &gx));
        assert!(
            (lhs - rhs).abs() <= 1e-5 * (1.0 + lhs.abs()),
            "{what}: {lhs} vs {rhs}"
        );
    }
    Ok(())
}

/// A 2-D input `[2, 3]`: fewer axes than a three-axis pad.
fn v_of(ctx: &ExecContext) -> Result<RawTensor, ExecError> {
    ctx.from_slice(&[2, 3], &values(6, 3))
}

fn err_text<T: std::fmt::Debug>(r: Result<T, ExecError>) -> String {
    r.expect_err("bad input must be an error").to_string()
}

fn assert_names(e: &str, op: &str, what: &str) {
    assert!(
        e.contains(op) && e.contains(what),
        "error {e:?} should name {op:?} and {what:?}"
    );
}

#[test]
fn bad_input_is_an_error_naming_the_op_and_the_value() -> Result<(), ExecError> {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 3, 4], &values(24, 1))?;
    let x4 = ctx.from_slice(&[1, 2, 3, 4], &values(24, 2))?;
    let e = err_text(PadOptions::new(&[1, 2, 3], PadMode::Reflect));
    assert_names(&e, "pad", "2 widths");
    // Crops larger than the axis (of 4), crops that leave it empty.
    let e = err_text(ctx.pad(&x, pad(&[-5, 2], PadMode::Constant(0.0))));
    assert_names(&e, "pad", "pads[0] = -5");
    let e = err_text(ctx.pad(&x, pad(&[0, 0, 1, -4], PadMode::Replicate)));
    assert_names(&e, "pad", "pads[3] = -4");
    let e = err_text(ctx.pad(&x, pad(&[-2, -2], PadMode::Constant(0.0))));
    assert_names(&e, "pad", "pads[0] = -2");
    assert!(e.contains("no elements"), "{e}");
    let e = err_text(ctx.pad(&x, pad(&[0, 0, 0, 0, -1, -1], PadMode::Reflect)));
    assert_names(&e, "pad", "pads[4] = -1");
    let e = err_text(ctx.pad(&x, pad(&[0, 0, 0, 0, 1, 2], PadMode::Reflect)));
    assert_names(&e, "pad", "pads[5] = 2");
    let e = err_text(ctx.pad(&v_of(&ctx)?, pad(&[0, 0, 0, 0, 1, 1], PadMode::Replicate)));
    assert_names(&e, "pad", "fewer axes");
    let e = err_text(ctx.pad(&x, pad(&[4, 0], PadMode::Reflect)));
    assert_names(&e, "pad", "pads[0]");
    let e = err_text(ctx.pad(&x, pad(&[0, 0, 0, 3], PadMode::Reflect)));
    assert_names(&e, "pad", "pads[3]");
    let v = ctx.from_slice(&[3], &[1., 2., 3.])?;
    let e = err_text(ctx.pad(&v, pad(&[1, 1, 1, 1], PadMode::Replicate)));
    assert_names(&e, "pad", "fewer axes");
    let bad_axes = PadOptions {
        axes: 4,
        ..pad(&[1, 1], PadMode::Replicate)
    };
    assert_names(&err_text(ctx.pad(&x, bad_axes)), "pad", "axes");
    let stray = PadOptions {
        pads: [1, 1, 1, 0, 0, 0],
        ..pad(&[1, 1], PadMode::Replicate)
    };
    assert_names(&err_text(ctx.pad(&x, stray)), "pad", "pads[2..]");
    let stray = PadOptions {
        pads: [1, 1, 1, 0, 0, 1],
        ..pad(&[1, 1, 1, 1], PadMode::Replicate)
    };
    assert_names(&err_text(ctx.pad(&x, stray)), "pad", "pads[4..]");
    let huge = pad(&[isize::MAX - 1, 2], PadMode::Constant(0.0));
    assert_names(&err_text(ctx.pad(&x, huge)), "pad", "overflow");
    let g = ctx.zeros(&[2, 3, 5])?;
    let e = err_text(ctx.pad_backward(&g, &[2, 3, 4], pad(&[1, 1], PadMode::Reflect)));
    assert_names(&e, "pad_backward", "[2, 3, 6]");

    let e = err_text(ctx.interpolate(&x, InterpolateOptions::size([2, 2], NEAREST)));
    assert_names(&e, "upsample_nearest2d", "rank 4");
    let e = err_text(ctx.interpolate(&x4, InterpolateOptions::size([0, 2], BILINEAR)));
    assert_names(&e, "upsample_bilinear2d", "size[0]");
    let e = err_text(ctx.interpolate(&x4, InterpolateOptions::scale([0.1, 1.0], BILINEAR)));
    assert_names(&e, "upsample_bilinear2d", "size[0]");
    for f in [f64::NAN, -1.0, 0.0, f64::INFINITY] {
        let e = err_text(ctx.interpolate(&x4, InterpolateOptions::scale([1.0, f], NEAREST)));
        assert_names(&e, "upsample_nearest2d", "scale_factor");
    }
    let both = InterpolateOptions {
        size: Some([2, 2]),
        ..InterpolateOptions::scale([2.0, 2.0], NEAREST)
    };
    assert_names(
        &err_text(ctx.interpolate(&x4, both)),
        "upsample_nearest2d",
        "exactly one",
    );
    let neither = InterpolateOptions {
        size: None,
        ..InterpolateOptions::size([2, 2], NEAREST)
    };
    assert_names(
        &err_text(ctx.interpolate(&x4, neither)),
        "upsample_nearest2d",
        "exactly one",
    );
    let e = err_text(ctx.interpolate(&x4, InterpolateOptions::scale([1e300, 1.0], NEAREST)));
    assert_names(&e, "upsample_nearest2d", "overflow");
    let g = ctx.zeros(&[1, 2, 6, 7])?;
    let e = err_text(ctx.interpolate_backward(
        &g,
        &[1, 2, 3, 4],
        InterpolateOptions::scale([2.0, 2.0], ALIGNED),
    ));
    assert_names(&e, "upsample_bilinear2d_backward", "[1, 2, 6, 8]");
    Ok(())
}

fn all_bits(ctx: &ExecContext) -> Result<Vec<(String, Vec<u32>)>, ExecError> {
    let mut out = Vec::new();
    let shape = [3, 5, 37, 41];
    let n: usize = shape.iter().product();
    let x = ctx.from_slice(&shape, &values(n, 7))?;
    for o in [
        pad(&[3, 2, 1, 4], PadMode::Reflect),
        pad(&[3, 2, 1, 4], PadMode::Replicate),
        pad(&[3, 2], PadMode::Constant(0.25)),
        pad(&[-3, 2, 1, -4, 2, -1], PadMode::Reflect),
        pad(&[2, -5, -1, 3, -1, 2], PadMode::Constant(0.5)),
    ] {
        let y = ctx.pad(&x, o)?;
        let g = ctx.from_slice(y.shape(), &values(y.numel(), 8))?;
        out.push((format!("{o:?}"), nan_bits(&y)));
        let gx = ctx.pad_backward(&g, &shape, o)?;
        out.push((format!("{o:?} backward"), nan_bits(&gx)));
    }
    for mode in [NEAREST, BILINEAR, ALIGNED] {
        for o in [
            InterpolateOptions::scale([2.0, 2.0], mode),
            InterpolateOptions::size([23, 50], mode),
        ] {
            let y = ctx.interpolate(&x, o)?;
            let g = ctx.from_slice(y.shape(), &values(y.numel(), 9))?;
            out.push((format!("{o:?}"), nan_bits(&y)));
            let gx = ctx.interpolate_backward(&g, &shape, o)?;
            out.push((format!("{o:?} backward"), nan_bits(&gx)));
        }
    }
    Ok(out)
}

#[test]
fn bitwise_identical_for_one_to_four_threads() -> Result<(), ExecError> {
    let base = all_bits(&ExecContext::with_threads(1))?;
    for threads in 2..=4 {
        let got = all_bits(&ExecContext::with_threads(threads))?;
        for ((name, a), (_, b)) in base.iter().zip(&got) {
            assert!(a == b, "{name}: {threads} threads differ from 1");
        }
    }
    Ok(())
}

#[test]
fn a_sample_alone_gives_its_bits_in_the_batch() -> Result<(), ExecError> {
    let ctx = ExecContext::with_threads(2);
    let s = [4, 3, 20, 21];
    let per: usize = s[1..].iter().product();
    let xv = values(s[0] * per, 31);
    let x = ctx.from_slice(&s, &xv)?;
    let one = [1, s[1], s[2], s[3]];
    type Op<'a> = Box<dyn Fn(&RawTensor) -> Result<RawTensor, ExecError> + 'a>;
    let ops: Vec<(&str, Op)> = vec![
        (
            "pad",
            Box::new(|x| ctx.pad(x, pad(&[2, 3, 4, 1], PadMode::Reflect))),
        ),
        (
            "bilinear",
            Box::new(|x| ctx.interpolate(x, InterpolateOptions::scale([2.0, 2.0], BILINEAR))),
        ),
        (
            "bilinear backward",
            Box::new(|g| {
                let o = InterpolateOptions::size([20, 21], ALIGNED);
                ctx.interpolate_backward(g, &[g.shape()[0], 3, 10, 7], o)
            }),
        ),
    ];
    for (name, f) in ops {
        let all = f(&x)?.to_vec();
        let m = all.len() / s[0];
        for k in 0..s[0] {
            let x1 = ctx.from_slice(&one, &xv[k * per..(k + 1) * per])?;
            let got = f(&x1)?.to_vec();
            let same = got
                .iter()
                .zip(&all[k * m..(k + 1) * m])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name}: sample {k}");
        }
    }
    Ok(())
}
