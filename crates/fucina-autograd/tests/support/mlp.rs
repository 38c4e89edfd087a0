//! The 784-256-10 MLP training step shared by the allocation test
//! (`tests/allocations.rs`) and the step bench (`benches/step.rs`), which include
//! this file with `#[path]` (it is no test target of its own).

use fucina_autograd::Tensor;
use fucina_autograd::exec::{ExecContext, RawTensor};

pub(crate) const BATCH: usize = 64;
pub(crate) const IN: usize = 784;
pub(crate) const HIDDEN: usize = 256;
pub(crate) const OUT: usize = 10;

/// The inputs `[BATCH, IN]` and the labels `[BATCH]` of one batch.
pub(crate) fn mlp_batch(ctx: &ExecContext) -> (Tensor, RawTensor<i64>) {
    let x = Tensor::randn(ctx, &[BATCH, IN], 1.0, 1).unwrap();
    let l: Vec<i64> = (0..BATCH as i64).map(|i| (i * 7) % OUT as i64).collect();
    let labels = ctx.from_slice_typed::<i64>(&[BATCH], &l).unwrap();
    (x, labels)
}

/// The parameters of the MLP (`nn.Linear` layout and initialization), as
/// variables.
pub(crate) fn mlp_params(ctx: &ExecContext) -> [Tensor; 4] {
    [
        Tensor::kaiming_uniform(ctx, &[HIDDEN, IN], 2).unwrap(),
        Tensor::zeros(ctx, &[HIDDEN]).unwrap(),
        Tensor::kaiming_uniform(ctx, &[OUT, HIDDEN], 3).unwrap(),
        Tensor::zeros(ctx, &[OUT]).unwrap(),
    ]
    .map(Tensor::into_variable)
}

/// One training step of the MLP: linear, ReLU, linear, cross-entropy, backward,
/// plain SGD (learning rate 0.01), zero_grad; returns the loss. `scoped`: the
/// forward runs under an exec scope closed after backward; otherwise every
/// intermediate drops as it goes (the graph is released when the loss drops).
pub(crate) fn mlp_step(
    ctx: &ExecContext,
    p: &mut [Tensor; 4],
    x: &Tensor,
    labels: &RawTensor<i64>,
    scoped: bool,
) -> f32 {
    let scope = scoped.then(|| ctx.open_exec_scope());
    let h = x
        .linear(ctx, &p[0], Some(&p[1]))
        .unwrap()
        .relu(ctx)
        .unwrap();
    let logits = h.linear(ctx, &p[2], Some(&p[3])).unwrap();
    drop(h);
    let loss = logits.cross_entropy(ctx, labels).unwrap();
    drop(logits);
    loss.backward(ctx).unwrap();
    let v = loss.item().unwrap();
    drop(loss);
    if let Some(scope) = scope {
        ctx.close_exec_scope(scope);
    }
    for t in p.iter_mut() {
        assert!(t.sgd_step_(0.01).unwrap());
        t.zero_grad();
    }
    v
}
