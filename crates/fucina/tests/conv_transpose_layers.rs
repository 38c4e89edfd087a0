//! `nn::ConvTranspose2d` and `nn::ConvTranspose1d`: PyTorch's weight layout
//! and default init drawn from the seed, the layer's bits equal to its op's,
//! the state dict names (alone, in `#[derive(Module)]` structs and in
//! `Sequential`) and round trip, and bad arguments and inputs as errors.

use fucina::exec::ConvTranspose1dOptions;
use fucina::nn::{ConvTranspose1d, ConvTranspose2d, Forward, Module, Relu, Sequential, sub_seed};
use fucina::prelude::{Conv2dOptions, ConvTranspose2dOptions};
use fucina::{Error, ExecContext, Tensor};

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|x| x.to_bits()).collect()
}

fn input(ctx: &ExecContext, shape: &[usize], seed: u64) -> Tensor {
    Tensor::uniform(ctx, shape, -1.0, 1.0, seed).unwrap()
}

#[test]
fn conv_transpose2d_is_its_op_with_pytorch_default_init() {
    let ctx = ExecContext::new();
    let opts = ConvTranspose2dOptions {
        stride: [2, 1],
        padding: [1, 0],
        output_padding: [1, 0],
        dilation: [1, 2],
        groups: 2,
    };
    let conv = ConvTranspose2d::new(&ctx, 4, 6, [3, 2], opts, 11).unwrap();
    // PyTorch's layout: [in, out / groups, kh, kw].
    assert_eq!(conv.weight.shape().as_slice(), [4, 3, 3, 2]);
    assert_eq!(conv.bias.as_ref().unwrap().shape().as_slice(), [6]);
    assert_eq!(
        (conv.in_channels(), conv.out_channels(), conv.kernel_size()),
        (4, 6, [3, 2])
    );
    assert_eq!(conv.options(), opts);
    // PyTorch's fan-in is the weight's second dimension times the kernel:
    // out / groups * kh * kw = 18. Weight U(-b, b) from the seed, bias from
    // sub_seed(seed, 1): bitwise what the rng crate draws.
    let b = (1.0f64 / 18.0).sqrt() as f32;
    let mut w = vec![0.0f32; 72];
    fucina::rng::kaiming_uniform_fill(11, &mut w, 18);
    assert_eq!(
        conv.weight
            .to_vec()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        w.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let mut bias = vec![0.0f32; 6];
    fucina::rng::uniform_fill(sub_seed(11, 1), &mut bias, -b, b);
    assert_eq!(conv.bias.as_ref().unwrap().to_vec(), bias);
    // The layer's output is the op's, bit for bit.
    let x = input(&ctx, &[2, 4, 4, 5], 3);
    let y = conv.forward(&ctx, &x).unwrap();
    let want = x
        .conv_transpose2d(
            &ctx,
            &conv.weight.tensor(),
            Some(&conv.bias.as_ref().unwrap().tensor()),
            opts,
        )
        .unwrap();
    // H' = 3 * 2 - 2 + 2 + 1 + 1 = 8, W' = 4 * 1 - 0 + 2 * 1 + 0 + 1 = 7.
    assert_eq!(y.shape(), [2, 6, 8, 7]);
    assert_eq!(bits(&y), bits(&want));
    // Gradients reach the parameters.
    y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
    assert!(conv.weight.grad(&ctx).unwrap().is_some());
    assert!(conv.bias.as_ref().unwrap().grad(&ctx).unwrap().is_some());
    let nb = ConvTranspose2d::no_bias(&ctx, 4, 6, [3, 2], opts, 11).unwrap();
    assert!(nb.bias.is_none());
    assert_eq!(nb.weight.to_vec(), w);
    let names: Vec<String> = conv
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["weight", "bias"]);
    let names: Vec<String> = nb.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight"]);
}

#[test]
fn conv_transpose1d_is_its_op() {
    let ctx = ExecContext::new();
    let opts = ConvTranspose1dOptions {
        stride: 2,
        padding: 1,
        output_padding: 1,
        ..Default::default()
    };
    let conv = ConvTranspose1d::new(&ctx, 3, 5, 3, opts, 2).unwrap();
    assert_eq!(conv.weight.shape().as_slice(), [3, 5, 3]);
    assert_eq!(conv.options(), opts);
    let mut w = vec![0.0f32; 45];
    fucina::rng::kaiming_uniform_fill(2, &mut w, 15);
    assert_eq!(conv.weight.to_vec(), w);
    let x = input(&ctx, &[2, 3, 9], 4);
    let y = conv.forward(&ctx, &x).unwrap();
    let want = x
        .conv_transpose1d(
            &ctx,
            &conv.weight.tensor(),
            Some(&conv.bias.as_ref().unwrap().tensor()),
            opts,
        )
        .unwrap();
    assert_eq!(y.shape(), [2, 5, 18]);
    assert_eq!(bits(&y), bits(&want));
    assert!(matches!(
        conv.forward(&ctx, &input(&ctx, &[2, 4, 9], 4)),
        Err(Error::ShapeMismatch { .. })
    ));
}

#[derive(Module)]
struct Decoder {
    up: ConvTranspose2d,
    up1: ConvTranspose1d,
}

#[test]
fn state_dict_names_and_round_trip() {
    let ctx = ExecContext::new();
    let s2 = ConvTranspose2dOptions {
        stride: [2, 2],
        ..Default::default()
    };
    let net = Decoder {
        up: ConvTranspose2d::new(&ctx, 4, 2, [2, 2], s2, 1).unwrap(),
        up1: ConvTranspose1d::no_bias(&ctx, 2, 2, 3, ConvTranspose1dOptions::default(), 2).unwrap(),
    };
    let names: Vec<String> = net.state_dict().names().map(String::from).collect();
    assert_eq!(names, ["up.weight", "up.bias", "up1.weight"]);
    let seq = Sequential::new()
        .push(ConvTranspose2d::new(&ctx, 4, 3, [2, 2], s2, 3).unwrap())
        .push(Relu)
        .push_named(
            "out",
            ConvTranspose2d::new(&ctx, 3, 1, [3, 3], ConvTranspose2dOptions::default(), 4).unwrap(),
        );
    let names: Vec<String> = seq.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "out.weight", "out.bias"]);
    let x = input(&ctx, &[2, 4, 3, 3], 5);
    assert_eq!(seq.forward(&ctx, &x).unwrap().shape(), [2, 1, 8, 8]);
    // A round trip into a layer with other weights gives the same outputs.
    let a = ConvTranspose2d::new(&ctx, 4, 2, [2, 2], s2, 7).unwrap();
    let b = ConvTranspose2d::new(&ctx, 4, 2, [2, 2], s2, 8).unwrap();
    assert_ne!(
        bits(&a.forward(&ctx, &x).unwrap()),
        bits(&b.forward(&ctx, &x).unwrap())
    );
    b.load_state_dict(&a.state_dict()).unwrap();
    assert_eq!(
        bits(&a.forward(&ctx, &x).unwrap()),
        bits(&b.forward(&ctx, &x).unwrap())
    );
}

#[test]
fn bad_arguments_and_inputs_are_errors() {
    let ctx = ExecContext::new();
    let d = ConvTranspose2dOptions::default();
    let cases = [
        ConvTranspose2d::new(&ctx, 0, 4, [3, 3], d, 1),
        ConvTranspose2d::new(&ctx, 4, 0, [3, 3], d, 1),
        ConvTranspose2d::new(&ctx, 4, 4, [0, 3], d, 1),
        ConvTranspose2d::new(
            &ctx,
            4,
            4,
            [3, 3],
            ConvTranspose2dOptions {
                stride: [1, 0],
                ..d
            },
            1,
        ),
        ConvTranspose2d::new(
            &ctx,
            4,
            4,
            [3, 3],
            ConvTranspose2dOptions {
                dilation: [0, 1],
                ..d
            },
            1,
        ),
        ConvTranspose2d::new(
            &ctx,
            4,
            4,
            [3, 3],
            ConvTranspose2dOptions { groups: 0, ..d },
            1,
        ),
        ConvTranspose2d::new(
            &ctx,
            4,
            6,
            [3, 3],
            ConvTranspose2dOptions { groups: 4, ..d },
            1,
        ),
        ConvTranspose2d::new(
            &ctx,
            4,
            4,
            [3, 3],
            ConvTranspose2dOptions {
                stride: [2, 2],
                output_padding: [0, 2],
                ..d
            },
            1,
        ),
    ];
    for (i, r) in cases.into_iter().enumerate() {
        match r {
            Err(Error::InvalidArgument { what, .. }) => {
                assert_eq!(what, "ConvTranspose2d::new", "case {i}")
            }
            other => panic!("case {i}: {other:?}"),
        }
    }
    let bad1 = ConvTranspose1d::new(
        &ctx,
        3,
        4,
        3,
        ConvTranspose1dOptions {
            output_padding: 1,
            ..Default::default()
        },
        1,
    );
    assert!(matches!(
        bad1,
        Err(Error::InvalidArgument {
            what: "ConvTranspose1d::new",
            ..
        })
    ));
    // Depthwise is fine: weight [in, 1, kh, kw].
    let dw = ConvTranspose2d::new(
        &ctx,
        4,
        4,
        [3, 3],
        ConvTranspose2dOptions { groups: 4, ..d },
        1,
    )
    .unwrap();
    assert_eq!(dw.weight.shape().as_slice(), [4, 1, 3, 3]);
    // Input that does not fit: a ShapeMismatch naming the layer; a padding
    // that leaves no output: the op's error.
    let conv = ConvTranspose2d::new(&ctx, 4, 4, [3, 3], d, 1).unwrap();
    match conv.forward(&ctx, &input(&ctx, &[1, 3, 5, 5], 1)) {
        Err(Error::ShapeMismatch { layer, .. }) => {
            assert!(layer.starts_with("ConvTranspose2d(in = 4"), "{layer}")
        }
        other => panic!("{other:?}"),
    }
    assert!(conv.forward(&ctx, &input(&ctx, &[4, 5, 5], 1)).is_err());
    let crop = ConvTranspose2d::new(
        &ctx,
        4,
        4,
        [1, 1],
        ConvTranspose2dOptions {
            padding: [1, 1],
            ..d
        },
        1,
    )
    .unwrap();
    let e = crop
        .forward(&ctx, &input(&ctx, &[1, 4, 2, 2], 1))
        .unwrap_err();
    assert!(e.to_string().contains("empty output"), "{e}");
    // The conv layer and the transposed one undo each other's shapes.
    let down = fucina::nn::Conv2d::new(
        &ctx,
        4,
        8,
        [3, 3],
        Conv2dOptions {
            stride: [2, 2],
            padding: [1, 1],
            ..Default::default()
        },
        1,
    )
    .unwrap();
    let up = ConvTranspose2d::new(
        &ctx,
        8,
        4,
        [3, 3],
        ConvTranspose2dOptions {
            stride: [2, 2],
            padding: [1, 1],
            output_padding: [1, 1],
            ..d
        },
        2,
    )
    .unwrap();
    let x = input(&ctx, &[2, 4, 10, 10], 9);
    let y = up.forward(&ctx, &down.forward(&ctx, &x).unwrap()).unwrap();
    assert_eq!(y.shape(), x.shape());
}
