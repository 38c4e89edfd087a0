//! The fused multi-head attention `Tensor::attention`: gradcheck of every
//! input (contiguous, transposed and narrowed), with and without a
//! key-padding mask, self-attention with one
//! operand in all three places, and zero heap allocations and pool misses
//! per training step after warm-up (a counting global allocator; each test
//! in a process of its own, see `allocations.rs`).

mod support;

use fucina_autograd::Tensor;
use fucina_autograd::exec::{ExecContext, RawTensor};
use support::{check_layouts, values};

#[path = "support/alloc_count.rs"]
mod alloc_count;
use alloc_count::{Counting, assert_steady_step, count, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn gradcheck_attention_every_input_and_layout() {
    let ctx = ExecContext::new();
    let (n, l, s, e) = (2, 3, 4, 6);
    let ins: [(&[usize], Vec<f32>); 3] = [
        (&[n, l, e], values(n * l * e, 1, -1.0, 1.0)),
        (&[n, s, e], values(n * s * e, 2, -1.0, 1.0)),
        (&[n, s, e], values(n * s * e, 3, -1.0, 1.0)),
    ];
    check_layouts(
        &ctx,
        "attention, 2 heads",
        |c, t| t[0].attention(c, &t[1], &t[2], 2, 0.8)?.tanh(c),
        &ins,
    );
    check_layouts(
        &ctx,
        "attention, 3 heads",
        |c, t| t[0].attention(c, &t[1], &t[2], 3, 1.3)?.sin(c),
        &ins,
    );
    check_layouts(
        &ctx,
        "self-attention, one operand three times",
        |c, t| t[0].attention(c, &t[0], &t[0], 2, 0.6)?.tanh(c),
        &ins[..1],
    );
    let packed: [(&[usize], Vec<f32>); 1] = [(&[2, 3, 12], values(72, 4, -1.0, 1.0))];
    check_layouts(
        &ctx,
        "attention_packed, 2 heads",
        |c, t| t[0].attention_packed(c, 2, 0.9)?.tanh(c),
        &packed,
    );
    // Key padding: sample 0 ignores keys 1 and 3, sample 1 key 0.
    let pad = ctx
        .from_slice_typed::<bool>(
            &[n, s],
            &[false, true, false, true, true, false, false, false],
        )
        .unwrap();
    check_layouts(
        &ctx,
        "attention_masked, 2 heads",
        |c, t| {
            t[0].attention_masked(c, &t[1], &t[2], &pad, 2, 0.8)?
                .tanh(c)
        },
        &ins,
    );
    let pad3 = ctx
        .from_slice_typed::<bool>(&[2, 3], &[false, false, true, true, false, false])
        .unwrap();
    check_layouts(
        &ctx,
        "attention_packed_masked, 2 heads",
        |c, t| t[0].attention_packed_masked(c, &pad3, 2, 0.9)?.tanh(c),
        &packed,
    );
}

/// Self-attention of `x` through the projection `w` (`attention`) and the
/// packed one `w3` (`attention_packed`, and `attention_packed_masked` with
/// the key-padding mask `pad`), a loss, backward, SGD.
fn step(
    ctx: &ExecContext,
    (w, w3): (&mut Tensor, &mut Tensor),
    (x, pad): (&Tensor, &RawTensor<bool>),
    scoped: bool,
) -> f32 {
    let scope = scoped.then(|| ctx.open_exec_scope());
    let p = x.linear(ctx, w, None).unwrap();
    let y = p.attention(ctx, &p, &p, 4, 0.25).unwrap();
    let packed = x.linear(ctx, w3, None).unwrap();
    let z = packed.attention_packed(ctx, 4, 0.25).unwrap();
    let zm = packed.attention_packed_masked(ctx, pad, 4, 0.25).unwrap();
    let loss = y
        .mul(ctx, &z)
        .unwrap()
        .add(ctx, &zm)
        .unwrap()
        .mean_all(ctx)
        .unwrap();
    let value = loss.item().unwrap();
    loss.backward(ctx).unwrap();
    drop((p, y, packed, z, zm, loss));
    if let Some(scope) = scope {
        ctx.close_exec_scope(scope);
    }
    for t in [w, w3] {
        t.sgd_step_(0.5).unwrap();
        t.zero_grad();
    }
    value
}

fn run(threads: usize, scoped: bool) {
    let ctx = ExecContext::with_threads(threads);
    let x = Tensor::randn(&ctx, &[4, 16, 32], 1.0, 1).unwrap();
    let mut w = Tensor::randn(&ctx, &[32, 32], 0.3, 2)
        .unwrap()
        .into_variable();
    let mut w3 = Tensor::randn(&ctx, &[96, 32], 0.3, 3)
        .unwrap()
        .into_variable();
    let flags: Vec<bool> = (0..4 * 16).map(|i| i % 5 == 3).collect();
    let pad = ctx.from_slice_typed::<bool>(&[4, 16], &flags).unwrap();
    let first = step(&ctx, (&mut w, &mut w3), (&x, &pad), scoped); // warm-up
    step(&ctx, (&mut w, &mut w3), (&x, &pad), scoped);
    let mut last = first;
    let (allocs, misses) = count(|| {
        for _ in 0..3 {
            last = step(&ctx, (&mut w, &mut w3), (&x, &pad), scoped);
        }
    });
    assert_steady_step(
        &ctx,
        (first, last),
        (allocs, misses),
        &format!("{threads} threads, scoped {scoped}"),
    );
}

#[test]
fn zero_allocations_per_attention_step_one_thread() {
    in_own_process("zero_allocations_per_attention_step_one_thread", || {
        run(1, true);
        run(1, false);
    });
}

#[test]
fn zero_allocations_per_attention_step_two_threads() {
    in_own_process("zero_allocations_per_attention_step_two_threads", || {
        run(2, true);
        run(2, false);
    });
}
