//! The heap allocations of a LoRA training step after warm-up (a counting
//! global allocator around `Trainer::step` and `Trainer::step_accumulated`,
//! one thread, dropout on): none, on an f32 base (runtime tensors) and on a
//! bf16 base (read in place by the inference kernel), with one micro-batch
//! or two; with gradient checkpointing on, the exact count of
//! [`CHECKPOINTED_PER_LAYER`] per layer and micro-batch.
//!
//! The counting allocator is the workspace's shared one (process-wide: each
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

fn trainer(
    ctx: &ExecContext,
    fixture: &str,
    grad_accum: usize,
    checkpointing: bool,
    bf16_products: bool,
) -> Trainer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(fixture);
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.1,
        targets: Target::ALL.to_vec(),
        seed: 3,
    };
    let mut model = TrainableDecoder::load(ctx, &dir, &lora).unwrap();
    model.set_checkpointing(checkpointing);
    if bf16_products {
        model.use_bf16_products().unwrap();
    }
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

/// The heap allocations that one micro-batch makes per decoder layer after
/// warm-up with gradient checkpointing on, all in `decoder::checkpointed_layer`
/// (its one custom op has an input per trained tensor of the layer, 15 here,
/// past what the graph keeps inline): the layer's list of trained tensors,
/// the op's list of inputs, the node's list of input links, the op's saved
/// input handles (`custom_vjp`), the backward's gradient list and the
/// node's copy of it. Counted with a fixed seed and shapes: a change that adds
/// an allocation to the step fails here.
const CHECKPOINTED_PER_LAYER: usize = 6;

/// Allocations per step of one micro-batch and of two, four steps each after
/// three warm-up steps, on `fixture`.
fn one_and_two(
    fixture: &str,
    checkpointing: bool,
    bf16_products: bool,
) -> (Vec<usize>, Vec<usize>) {
    let ctx = ExecContext::with_threads(1);
    let mut t = trainer(&ctx, fixture, 1, checkpointing, bf16_products);
    let b = batch(0);
    let one = per_step(3, 4, || {
        t.step(&ctx, &b).unwrap();
    });
    eprintln!("{fixture}: allocations per step (one micro-batch): {one:?}");
    let mut t = trainer(&ctx, fixture, 2, checkpointing, bf16_products);
    let bs = [batch(0), batch(5)];
    let two = per_step(3, 4, || {
        t.step_accumulated(&ctx, &bs).unwrap();
    });
    eprintln!("{fixture}: allocations per step (two micro-batches): {two:?}");
    (one, two)
}

#[test]
fn steady_state_lora_steps_allocate_nothing() {
    in_own_process("steady_state_lora_steps_allocate_nothing", || {
        for fixture in ["llama_f32", "llama_bf16"] {
            let (one, two) = one_and_two(fixture, false, false);
            assert_eq!(one, [0; 4], "{fixture}");
            assert_eq!(two, [0; 4], "{fixture}");
        }
    });
}

/// The same with the frozen bf16 products on the AMX rule
/// (`TrainableDecoder::use_bf16_products`): their scratch is pooled too.
#[test]
fn steady_state_bf16_product_steps_allocate_nothing() {
    in_own_process("steady_state_bf16_product_steps_allocate_nothing", || {
        let (one, two) = one_and_two("llama_bf16", false, true);
        assert_eq!(one, [0; 4]);
        assert_eq!(two, [0; 4]);
    });
}

#[test]
fn checkpointed_lora_steps_allocate_a_fixed_count_per_layer() {
    in_own_process(
        "checkpointed_lora_steps_allocate_a_fixed_count_per_layer",
        || {
            let layers = 2; // the fixture's `num_hidden_layers`
            let (one, two) = one_and_two("llama_f32", true, false);
            assert_eq!(one, [CHECKPOINTED_PER_LAYER * layers; 4]);
            assert_eq!(two, [2 * CHECKPOINTED_PER_LAYER * layers; 4]);
        },
    );
}
