//! The parameterless layers of `nn/resize.rs` (`Upsample`, `MaxPool1d`,
//! `AvgPool1d`, the padding layers) and the new activation layers: the same
//! bits as their ops, PyTorch's defaults, no parameters in a derived module's
//! state dict, and bad arguments or inputs as errors naming the layer.

use fucina::exec::{
    Conv2dOptions, InterpolateMode, InterpolateOptions, PadMode, PadOptions, Pool1dOptions,
};
use fucina::nn::{
    AvgPool1d, ConstantPad1d, ConstantPad2d, ConstantPad3d, Conv2d, Forward, Hardswish, LogSigmoid,
    MaxPool1d, Mish, Module, ReflectionPad1d, ReflectionPad2d, ReflectionPad3d, ReplicationPad1d,
    ReplicationPad2d, ReplicationPad3d, Sigmoid, Silu, Softplus, Upsample, ZeroPad2d, ZeroPad3d,
};
use fucina::{Error, ExecContext, Tensor};

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn upsample_is_interpolate_with_pytorch_defaults() -> Result<(), Error> {
    let ctx = ExecContext::new();
    let x = Tensor::randn(&ctx, &[2, 3, 5, 4], 1.0, 3)?;
    let bilinear = InterpolateMode::Bilinear {
        align_corners: false,
    };
    for (layer, opts) in [
        (
            Upsample::scale(2.0, InterpolateMode::Nearest)?,
            InterpolateOptions::scale([2.0, 2.0], InterpolateMode::Nearest),
        ),
        (
            Upsample::scale2([1.5, 3.0], bilinear)?,
            InterpolateOptions::scale([1.5, 3.0], bilinear),
        ),
        (
            Upsample::size([7, 9], bilinear)?,
            InterpolateOptions::size([7, 9], bilinear),
        ),
    ] {
        assert_eq!(layer.options(), opts);
        assert!(layer.named_parameters().is_empty());
        let y = layer.forward(&ctx, &x)?;
        assert_eq!(bits(&y), bits(&x.interpolate(&ctx, opts)?));
    }
    assert_eq!(
        Upsample::scale(2.0, InterpolateMode::Nearest)?
            .forward(&ctx, &x)?
            .shape(),
        [2, 3, 10, 8]
    );
    // Bad arguments and inputs.
    for bad in [
        Upsample::scale(-1.0, InterpolateMode::Nearest),
        Upsample::scale(f64::NAN, InterpolateMode::Nearest),
        Upsample::size([0, 3], InterpolateMode::Nearest),
    ] {
        assert!(matches!(bad, Err(Error::InvalidArgument { .. })), "{bad:?}");
    }
    let up = Upsample::scale(2.0, InterpolateMode::Nearest)?;
    let e = up
        .forward(&ctx, &Tensor::zeros(&ctx, &[3, 4, 5])?)
        .unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { .. }) && e.to_string().contains("Upsample"),
        "{e}"
    );
    let tiny = Upsample::scale(0.1, InterpolateMode::Nearest)?;
    assert!(tiny.forward(&ctx, &x).is_err()); // an output size of 0
    Ok(())
}

#[test]
fn pool1d_layers_are_their_ops() -> Result<(), Error> {
    let ctx = ExecContext::new();
    let x = Tensor::randn(&ctx, &[2, 3, 17], 1.0, 4)?;
    let o = Pool1dOptions {
        kernel: 4,
        stride: 3,
        padding: 2,
    };
    assert_eq!(MaxPool1d::new(3)?.options(), Pool1dOptions::new(3));
    assert_eq!(
        bits(&MaxPool1d::with_options(o)?.forward(&ctx, &x)?),
        bits(&x.max_pool1d(&ctx, o)?)
    );
    assert_eq!(
        bits(&AvgPool1d::with_options(o)?.forward(&ctx, &x)?),
        bits(&x.avg_pool1d(&ctx, o)?)
    );
    assert!(matches!(
        MaxPool1d::new(0),
        Err(Error::InvalidArgument { .. })
    ));
    let bad = AvgPool1d::with_options(Pool1dOptions {
        kernel: 2,
        stride: 1,
        padding: 2,
    });
    assert!(matches!(bad, Err(Error::InvalidArgument { .. })));
    let e = MaxPool1d::new(2)?
        .forward(&ctx, &Tensor::zeros(&ctx, &[3, 4])?)
        .unwrap_err();
    assert!(e.to_string().contains("max_pool1d"), "{e}");
    Ok(())
}

#[test]
fn pad_layers_are_their_ops() -> Result<(), Error> {
    let ctx = ExecContext::new();
    let x = Tensor::randn(&ctx, &[2, 3, 5, 6], 1.0, 5)?;
    let o = |pads: &[isize], mode| PadOptions::new(pads, mode).unwrap();
    let cases: Vec<(Box<dyn Forward>, PadOptions)> = vec![
        (
            Box::new(ZeroPad2d::new([1, 2, 3, 4])),
            o(&[1, 2, 3, 4], PadMode::Constant(0.0)),
        ),
        (
            Box::new(ConstantPad1d::new([2, 0], 1.5)),
            o(&[2, 0], PadMode::Constant(1.5)),
        ),
        (
            Box::new(ConstantPad2d::uniform(1, -2.0)),
            o(&[1, 1, 1, 1], PadMode::Constant(-2.0)),
        ),
        (
            Box::new(ReflectionPad1d::new([3, 4])),
            o(&[3, 4], PadMode::Reflect),
        ),
        (
            Box::new(ReflectionPad2d::uniform(2)),
            o(&[2, 2, 2, 2], PadMode::Reflect),
        ),
        (
            Box::new(ReplicationPad1d::new([0, 7])),
            o(&[0, 7], PadMode::Replicate),
        ),
        (
            Box::new(ReplicationPad2d::new([1, 0, 6, 2])),
            o(&[1, 0, 6, 2], PadMode::Replicate),
        ),
        (
            Box::new(ZeroPad2d::new([-1, -1, -2, 0])),
            o(&[-1, -1, -2, 0], PadMode::Constant(0.0)),
        ),
        (
            Box::new(ConstantPad3d::new([1, -1, 0, 2, -1, 1], 0.5)),
            o(&[1, -1, 0, 2, -1, 1], PadMode::Constant(0.5)),
        ),
        (
            Box::new(ZeroPad3d::uniform(1)),
            o(&[1, 1, 1, 1, 1, 1], PadMode::Constant(0.0)),
        ),
        (
            Box::new(ReflectionPad3d::new([2, 1, -1, 3, 1, 2])),
            o(&[2, 1, -1, 3, 1, 2], PadMode::Reflect),
        ),
        (
            Box::new(ReplicationPad3d::new([-2, 4, 1, 1, 0, 3])),
            o(&[-2, 4, 1, 1, 0, 3], PadMode::Replicate),
        ),
    ];
    for (layer, opts) in cases {
        assert_eq!(
            bits(&layer.forward(&ctx, &x)?),
            bits(&x.pad(&ctx, opts)?),
            "{opts:?}"
        );
    }
    assert_eq!(
        ZeroPad2d::uniform(1).forward(&ctx, &x)?.shape(),
        [2, 3, 7, 8]
    );
    // A reflect pad as large as the axis, an input with too few axes.
    let e = ReflectionPad2d::uniform(5).forward(&ctx, &x).unwrap_err();
    assert!(e.to_string().contains("pads[2] = 5"), "{e}");
    let v = Tensor::zeros(&ctx, &[4, 4])?;
    let e = ReflectionPad2d::uniform(1).forward(&ctx, &v).unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { .. }) && e.to_string().contains("ReflectionPad2d"),
        "{e}"
    );
    let e = ReplicationPad3d::uniform(1)
        .forward(&ctx, &Tensor::zeros(&ctx, &[4, 4, 4])?)
        .unwrap_err();
    assert!(e.to_string().contains("ReplicationPad3d"), "{e}");
    // A crop past the axis names the op and the pad.
    let e = ConstantPad3d::new([0, 0, 0, 0, -4, 0], 1.0)
        .forward(&ctx, &x)
        .unwrap_err();
    assert!(e.to_string().contains("pads[4] = -4"), "{e}");
    Ok(())
}

#[test]
fn activation_layers_are_their_ops() -> Result<(), Error> {
    let ctx = ExecContext::new();
    let x = Tensor::randn(&ctx, &[4, 9], 3.0, 6)?;
    type Op = fn(&Tensor, &ExecContext) -> fucina::autograd::Result<Tensor>;
    let cases: Vec<(Box<dyn Forward>, Op)> = vec![
        (Box::new(Sigmoid), Tensor::sigmoid),
        (Box::new(Silu), Tensor::silu),
        (Box::new(Softplus), Tensor::softplus),
        (Box::new(LogSigmoid), Tensor::logsigmoid),
        (Box::new(Mish), Tensor::mish),
        (Box::new(Hardswish), Tensor::hardswish),
    ];
    for (layer, op) in cases {
        assert_eq!(bits(&layer.forward(&ctx, &x)?), bits(&op(&x, &ctx)?));
    }
    Ok(())
}

/// A derived module holding the layers: only the convolution's parameters
/// are listed.
#[derive(Module)]
struct Decoder {
    up: Upsample,
    pad: ReflectionPad2d,
    conv: Conv2d,
    act: Mish,
}

#[test]
fn a_derived_module_lists_only_the_convolution() -> Result<(), Error> {
    let ctx = ExecContext::new();
    let d = Decoder {
        up: Upsample::scale(2.0, InterpolateMode::Nearest)?,
        pad: ReflectionPad2d::uniform(1),
        conv: Conv2d::new(&ctx, 2, 3, [3, 3], Conv2dOptions::default(), 1)?,
        act: Mish,
    };
    let names: Vec<String> = d.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["conv.weight", "conv.bias"]);
    let x = Tensor::randn(&ctx, &[1, 2, 4, 4], 1.0, 7)?;
    let h = d.pad.forward(&ctx, &d.up.forward(&ctx, &x)?)?;
    let y = d.act.forward(&ctx, &d.conv.forward(&ctx, &h)?)?;
    assert_eq!(y.shape(), [1, 3, 8, 8]);
    Ok(())
}
