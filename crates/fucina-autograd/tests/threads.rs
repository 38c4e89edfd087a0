//! Tensors cross threads: a graph built on one thread is differentiated on
//! another (with the context moved along), and parameters are shared read-only.

use fucina_autograd::Tensor;
use fucina_autograd::exec::ExecContext;

static_assertions::assert_impl_all!(Tensor: Send, Sync);
static_assertions::assert_impl_all!(ExecContext: Send);
static_assertions::assert_not_impl_any!(ExecContext: Sync);
static_assertions::assert_not_impl_any!(fucina_autograd::NoGradGuard: Send, Sync);

#[test]
fn a_graph_moves_to_another_thread_with_its_context() {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.]).unwrap();
    let loss = w.mul(&ctx, &w).unwrap().sum_all(&ctx).unwrap();
    let w2 = w.clone();
    let (ctx, w2) = std::thread::spawn(move || {
        loss.backward(&ctx).unwrap();
        drop(loss);
        (ctx, w2)
    })
    .join()
    .unwrap();
    // The gradient is visible through the original handle.
    assert_eq!(w.grad(&ctx).unwrap().unwrap().to_vec(), [2., 4., 6.]);
    drop((w, w2));
    ctx.close().unwrap();
}

#[test]
fn parameters_are_read_from_several_threads() {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[4], &[1., 2., 3., 4.]).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            let w = &w;
            s.spawn(move || assert_eq!(w.to_vec(), [1., 2., 3., 4.]));
        }
    });
}
