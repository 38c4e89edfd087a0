//! `nn::InstanceNorm1d`, `nn::InstanceNorm2d` and `nn::Identity`: the
//! normalization against an f64 reference (each sample's channel over its own
//! positions), the layer's bits equal to `group_norm` with one channel per
//! group, PyTorch's defaults and parameter names, gradients, and errors.

use fucina::nn::{Forward, Identity, InstanceNorm1d, InstanceNorm2d, Module};
use fucina::prelude::GroupNormOptions;
use fucina::{Error, ExecContext, Tensor};

#[test]
fn instance_norm2d_normalizes_each_plane() {
    let ctx = ExecContext::new();
    let (n, c, hw) = (2, 3, 20);
    let x = Tensor::uniform(&ctx, &[n, c, 4, 5], -2.0, 3.0, 1).unwrap();
    let norm = InstanceNorm2d::with_options(&ctx, c, 1e-3, true).unwrap();
    // Non-trivial affine parameters.
    norm.weight()
        .unwrap()
        .update_(|w| w.copy_from_slice(&[0.5, 2.0, -1.0]))
        .unwrap();
    norm.bias()
        .unwrap()
        .update_(|b| b.copy_from_slice(&[0.1, 0.0, 3.0]))
        .unwrap();
    let y = norm.forward(&ctx, &x).unwrap().to_vec();
    let xv = x.to_vec();
    let (w, b) = ([0.5, 2.0, -1.0], [0.1, 0.0, 3.0]);
    for p in 0..n * c {
        let v: Vec<f64> = xv[p * hw..][..hw].iter().map(|&a| f64::from(a)).collect();
        let mean = v.iter().sum::<f64>() / hw as f64;
        let var = v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / hw as f64;
        for (i, a) in v.iter().enumerate() {
            let want = (a - mean) / (var + 1e-3).sqrt() * w[p % c] + b[p % c];
            let got = f64::from(y[p * hw + i]);
            assert!(
                (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                "plane {p}[{i}]: {got} vs {want}"
            );
        }
    }
    // The same bits as group_norm with C groups; gradients reach the parameters.
    let opts = GroupNormOptions {
        num_groups: c,
        eps: 1e-3,
    };
    let gw = norm.weight().unwrap().tensor();
    let gb = norm.bias().unwrap().tensor();
    let want = x
        .group_norm(&ctx, Some(&gw), Some(&gb), opts)
        .unwrap()
        .to_vec();
    assert_eq!(
        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let names: Vec<String> = norm
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["weight", "bias"]);
    let xv = x.clone().into_variable();
    let out = norm.forward(&ctx, &xv).unwrap();
    out.mul(&ctx, &out)
        .unwrap()
        .sum_all(&ctx)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    assert!(norm.weight().unwrap().grad(&ctx).unwrap().is_some());
    assert!(xv.grad(&ctx).unwrap().is_some());
}

#[test]
fn defaults_identity_and_errors() {
    let ctx = ExecContext::new();
    let n2 = InstanceNorm2d::new(&ctx, 4).unwrap();
    assert!(n2.weight().is_none() && n2.named_parameters().is_empty());
    let n1 = InstanceNorm1d::new(&ctx, 4).unwrap();
    let y = n1
        .forward(
            &ctx,
            &Tensor::uniform(&ctx, &[2, 4, 9], -1.0, 1.0, 2).unwrap(),
        )
        .unwrap();
    assert_eq!(y.shape(), [2, 4, 9]);
    let e = n2
        .forward(&ctx, &Tensor::zeros(&ctx, &[2, 4, 9]).unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("InstanceNorm2d(num_features = 4)"),
        "{e}"
    );
    let e = n1
        .forward(&ctx, &Tensor::zeros(&ctx, &[2, 3, 9]).unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("InstanceNorm1d"), "{e}");
    assert!(matches!(
        InstanceNorm2d::new(&ctx, 0),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        InstanceNorm1d::with_options(&ctx, 3, -1.0, true),
        Err(Error::InvalidArgument { .. })
    ));
    let x = Tensor::uniform(&ctx, &[3, 2], -1.0, 1.0, 3).unwrap();
    assert_eq!(Identity.forward(&ctx, &x).unwrap().to_vec(), x.to_vec());
    assert!(Identity.named_parameters().is_empty());
}
