//! A context may be dropped before the tensors, parameters, gradients and layer
//! caches made on it, in any order, silently and safely, in debug and release
//! builds: every pooled buffer keeps its pool alive and is freed when it goes.
//! (Rust drops struct fields in declaration order, so a struct holding a context
//! and a model drops the context first.)

use fucina::prelude::*;

#[path = "../../fucina-autograd/tests/support/square.rs"]
mod square;

fn ramp(ctx: &ExecContext, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
    Tensor::from_slice(ctx, shape, &v).unwrap()
}

/// The report's case: the context is the first field, so it drops first.
struct Trainer {
    ctx: ExecContext,
    w: Tensor,
}

#[test]
fn a_struct_holding_its_context_first_drops_cleanly() {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.]).unwrap();
    let t = Trainer { ctx, w };
    let loss = t.w.mul(&t.ctx, &t.w).unwrap().sum_all(&t.ctx).unwrap();
    loss.backward(&t.ctx).unwrap();
    assert_eq!(t.w.grad_view().unwrap().to_vec(), [2., 4., 6.]);
    drop(loss);
    drop(t); // the context first, then `w` and its gradient
}

/// A bigger trainer: a model, an optimizer with state, a graph kept alive.
struct ModelTrainer {
    ctx: ExecContext,
    model: Linear,
    opt: AdamW,
    last_loss: Option<Tensor>,
}

#[test]
fn a_trainer_with_a_model_an_optimizer_and_a_live_graph_drops_cleanly() {
    let ctx = ExecContext::with_threads(2);
    let model = Linear::new(&ctx, 8, 4, 1).unwrap();
    let opt = AdamW::new(model.parameters(), AdamWConfig::default()).unwrap();
    let mut t = ModelTrainer {
        ctx,
        model,
        opt,
        last_loss: None,
    };
    let x = ramp(&t.ctx, &[16, 8]);
    for _ in 0..3 {
        let loss = t
            .model
            .forward(&t.ctx, &x)
            .unwrap()
            .mean_all(&t.ctx)
            .unwrap();
        loss.backward(&t.ctx).unwrap();
        t.opt.step(&t.ctx).unwrap();
        t.opt.zero_grad();
    }
    // A forward whose backward never runs: its graph outlives the context.
    t.last_loss = Some(
        t.model
            .forward(&t.ctx, &x)
            .unwrap()
            .sum_all(&t.ctx)
            .unwrap(),
    );
    let w = t.model.weight.clone();
    drop(t);
    assert_eq!(w.numel(), 32);
    assert!(w.to_vec().iter().all(|v| v.is_finite()));
}

#[test]
fn a_gradient_made_on_a_second_context_outlives_it() {
    let ctx = ExecContext::new();
    let p = Parameter::from_slice(&ctx, &[3], &[1., 2., 3.]).unwrap();
    let kept_graph;
    {
        let ctx2 = ExecContext::new();
        let w = p.tensor();
        square::backward_sum_of_squares(&ctx2, &w);
        // A second graph through ctx2 that is still alive when ctx2 goes.
        kept_graph = w.mul(&ctx2, &w).unwrap().sum_all(&ctx2).unwrap();
        drop(ctx2); // the gradient of `p` lives in ctx2's pool
    }
    assert_eq!(p.grad(&ctx).unwrap().unwrap().to_vec(), [2., 4., 6.]);
    // Training goes on through the first context: the gradient accumulates into
    // the buffer of the dropped context, then an optimizer step reads it.
    let w = p.tensor();
    square::backward_sum_of_squares(&ctx, &w);
    assert_eq!(p.grad(&ctx).unwrap().unwrap().to_vec(), [4., 8., 12.]);
    let mut sgd = Sgd::new(vec![p.clone()], 0.25).unwrap();
    sgd.step(&ctx).unwrap();
    assert_eq!(p.to_vec(), [0., 0., 0.]);
    // The graph made on the dropped context can still be differentiated on
    // this one (it only holds values).
    sgd.zero_grad();
    kept_graph.backward(&ctx).unwrap();
    assert_eq!(p.grad(&ctx).unwrap().unwrap().to_vec(), [2., 4., 6.]);
    drop(kept_graph);
    drop((w, sgd, p));
    assert_eq!(ctx.close(), Ok(()));
}

#[test]
fn a_block_run_on_a_second_context_keeps_working_after_it_is_dropped() {
    let ctx = ExecContext::new();
    let block = Block::new(&ctx, 16, 2, 0.0, 7).unwrap();
    let x = ramp(&ctx, &[2, 5, 16]);
    let want = block.forward(&ctx, &x).unwrap().to_vec();
    {
        let ctx2 = ExecContext::with_threads(2);
        let x2 = ramp(&ctx2, &[2, 5, 16]);
        // Another length, so the causal mask cached in the block comes from ctx2.
        let x3 = ramp(&ctx2, &[1, 3, 16]);
        let y = block.forward(&ctx2, &x2).unwrap();
        assert_eq!(y.to_vec(), want);
        block
            .forward(&ctx2, &x3)
            .unwrap()
            .mean_all(&ctx2)
            .unwrap()
            .backward(&ctx2)
            .unwrap();
        drop(ctx2);
        drop(y);
    }
    // Gradients from ctx2 are readable; the cached mask still serves length 3.
    assert!(block.parameters().iter().all(|p| p.grad_view().is_some()));
    let y3 = block.forward(&ctx, &ramp(&ctx, &[1, 3, 16])).unwrap();
    assert_eq!(y3.shape(), [1, 3, 16]);
    assert_eq!(block.forward(&ctx, &x).unwrap().to_vec(), want);
}

#[test]
fn threads_with_their_own_contexts_share_parameters_and_drop_their_contexts() {
    let ctx = ExecContext::new();
    let w = Parameter::from_slice(&ctx, &[4], &[1., 2., 3., 4.]).unwrap();
    let block = Block::new(&ctx, 8, 2, 0.0, 3).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let (w, block) = (&w, &block);
            s.spawn(move || {
                let ctx = ExecContext::with_threads(1);
                let c = Tensor::from_slice(&ctx, &[4], &[f32::from(t + 1); 4]).unwrap();
                let loss = w.tensor().mul(&ctx, &c).unwrap().sum_all(&ctx).unwrap();
                loss.backward(&ctx).unwrap();
                let x = ramp(&ctx, &[1, 4, 8]);
                let y = block.forward(&ctx, &x).unwrap().sum_all(&ctx).unwrap();
                y.backward(&ctx).unwrap();
                // The context goes while `loss`, `y` and the gradients it made live.
                drop(ctx);
                drop((loss, y));
            });
        }
    });
    // 1 + 2 + 3 + 4, whatever the order the threads accumulated in.
    assert_eq!(w.grad(&ctx).unwrap().unwrap().to_vec(), [10.0; 4]);
    assert!(block.parameters().iter().all(|p| p.grad_view().is_some()));
    let mut opt = Sgd::new(block.parameters(), 0.1).unwrap();
    opt.step(&ctx).unwrap();
    opt.zero_grad();
    w.zero_grad();
    drop((opt, block, w));
    assert_eq!(ctx.close(), Ok(()));
}

#[test]
fn close_still_reports_what_is_alive() {
    let ctx = ExecContext::new();
    let w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.]).unwrap();
    let y = w.mul(&ctx, &w).unwrap();
    match ctx.close() {
        Err(fucina::exec::ExecError::LeakedBuffers { count }) => assert!(count >= 2, "{count}"),
        other => panic!("expected LeakedBuffers, got {other:?}"),
    }
    assert_eq!(y.to_vec(), [1., 4., 9.]);
}
