//! `LocalDataParallel` over `fucina::nn::Parameter` handles (a layer's own
//! parameters, shared with an optimizer): the same gradients, bit for bit, as
//! over variable tensors holding the same values, and a step through the
//! layer's optimizer.
// The autograd error carries inline shapes (no heap on the error path).

use fucina::nn::{Linear, Module, Parameter};
use fucina::optim::Sgd;
use fucina::{ExecContext, Tensor};
use fucina_dist::LocalDataParallel;

fn loss(ctx: &ExecContext, w: &Tensor, b: &Tensor, m: usize) -> fucina::autograd::Result<f32> {
    let x = Tensor::randn(ctx, &[3, 4], 1.0, 50 + m as u64)?;
    let y = x.linear(ctx, w, Some(b))?;
    let l = y.mul(ctx, &y)?.mean_all(ctx)?;
    l.backward(ctx)?;
    l.item()
}

fn bits(v: Vec<f32>) -> Vec<u32> {
    v.into_iter().map(f32::to_bits).collect()
}

#[test]
fn parameters_of_a_layer_reduce_like_tensors() {
    let ctx = ExecContext::with_threads(1);
    let fc = Linear::new(&ctx, 4, 2, 9).unwrap();
    let tensors = vec![
        Tensor::variable_from_slice(&ctx, &[2, 4], &fc.weight.to_vec()).unwrap(),
        Tensor::variable_from_slice(&ctx, &[2], &fc.bias.as_ref().unwrap().to_vec()).unwrap(),
    ];
    let mut by_tensor = LocalDataParallel::new(tensors, 5).unwrap();
    let a = by_tensor
        .step(&ctx, |ctx, p: &[Tensor], m| loss(ctx, &p[0], &p[1], m))
        .unwrap();
    let mut by_param = LocalDataParallel::new(fc.parameters(), 5).unwrap();
    let b = by_param
        .step(&ctx, |ctx, p: &[Parameter], m| {
            loss(ctx, &p[0].tensor(), &p[1].tensor(), m)
        })
        .unwrap();
    assert_eq!(a.value.to_bits(), b.value.to_bits());
    for (t, p) in by_tensor.params().iter().zip(by_param.params()) {
        assert_eq!(
            bits(t.grad(&ctx).unwrap().unwrap().to_vec()),
            bits(p.grad(&ctx).unwrap().unwrap().to_vec())
        );
    }
    // The handles are the layer's: its optimizer steps on the reduced gradient.
    let before = fc.weight.to_vec();
    let g = fc.weight.grad(&ctx).unwrap().unwrap().to_vec();
    let mut opt = Sgd::new(fc.parameters(), 1.0).unwrap();
    opt.step(&ctx).unwrap();
    let want: Vec<f32> = before.iter().zip(&g).map(|(w, g)| w - g).collect();
    assert_eq!(bits(fc.weight.to_vec()), bits(want));
}
