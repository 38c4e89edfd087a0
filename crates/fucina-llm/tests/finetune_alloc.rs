//! The heap allocations of a LoRA training step after warm-up (a counting
//! global allocator around `Trainer::step` and `Trainer::step_accumulated`
//! on the `llama_f32` fixture, one thread, dropout on): not zero yet, but
//! bounded, constant from step to step, and all in the recomputed blocks (see
//! [`PER_MICROBATCH`]).
//!
//! The counting allocator is the workspace's shared one (process-wide: the
//! test runs alone in a process of its own, `counting::in_own_process`).

use std::path::Path;

use fucina_llm::finetune::data::Batch;
use fucina_llm::finetune::{Example, LoraConfig, Target, TrainOptions, TrainableDecoder, Trainer};
use fucina_llm::fucina::ExecContext;

#[path = "../../fucina-thread/tests/support/counting.rs"]
mod counting;
use counting::{Counting, allocations, check_the_counter, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn the_counter_counts() {
    in_own_process("the_counter_counts", check_the_counter);
}

/// Allocations of each of `steps` steps of `step` after `warm` uncounted ones.
fn per_step(warm: usize, steps: usize, mut step: impl FnMut()) -> Vec<usize> {
    for _ in 0..warm {
        step();
    }
    (0..steps)
        .map(|_| {
            let before = allocations();
            step();
            allocations() - before
        })
        .collect()
}

fn trainer(ctx: &ExecContext, grad_accum: usize) -> Trainer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_f32");
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.1,
        targets: Target::ALL.to_vec(),
        seed: 3,
    };
    let model = TrainableDecoder::load(ctx, &dir, &lora).unwrap();
    let opts = TrainOptions {
        lr: 1e-3,
        warmup_steps: 2,
        grad_accum,
        ..TrainOptions::default()
    };
    Trainer::new(model, opts, 1000).unwrap()
}

fn batch(offset: u32) -> Batch {
    let ex: Vec<Example> = (0..2u32)
        .map(|k| Example {
            ids: (0..12 + k)
                .map(|i| (i * 7 + offset + k) % 200 + 3)
                .collect(),
            prompt_len: 3,
        })
        .collect();
    Batch::new(&ex.iter().collect::<Vec<_>>(), 0).unwrap()
}

/// The heap allocations one micro-batch (forward and backward) still makes
/// after warm-up on this fixture (2 layers, all seven targets: 25 a layer), every one of
/// them in the two blocks per layer that recompute in the backward
/// (`decoder::recomputed`: the attention core and SwiGLU) and in RoPE's
/// `concat`: the boxed forward and backward closures of the custom op and the
/// vectors of its inputs, the variable leaves of the inner graph its backward
/// builds and that inner backward's work lists, and the join's list of sizes.
/// Everything else of a step (the forward's other ops, the RoPE tables and
/// masks, written into pooled tensors, the loss, the backward, the
/// accumulation of micro-batches in the fixed tree, clipping, AdamW) makes
/// none. Counted with a fixed seed and shapes: a change that adds an
/// allocation to the step fails here.
const PER_MICROBATCH: usize = 50;

#[test]
fn steady_state_lora_steps_allocate_only_in_the_recomputed_blocks() {
    in_own_process(
        "steady_state_lora_steps_allocate_only_in_the_recomputed_blocks",
        lora_steps,
    );
}

fn lora_steps() {
    let ctx = ExecContext::with_threads(1);
    let mut t = trainer(&ctx, 1);
    let b = batch(0);
    let one = per_step(3, 4, || {
        t.step(&ctx, &b).unwrap();
    });
    eprintln!("allocations per step (one micro-batch): {one:?}");
    let mut t = trainer(&ctx, 2);
    let bs = [batch(0), batch(5)];
    let two = per_step(3, 4, || {
        t.step_accumulated(&ctx, &bs).unwrap();
    });
    eprintln!("allocations per step (two micro-batches): {two:?}");
    // The same count every step: nothing grows after warm-up.
    assert!(one.iter().all(|&n| n == one[0]), "{one:?}");
    assert!(two.iter().all(|&n| n == two[0]), "{two:?}");
    assert!(one[0] <= PER_MICROBATCH, "{one:?}");
    assert!(two[0] <= 2 * PER_MICROBATCH, "{two:?}");
}
