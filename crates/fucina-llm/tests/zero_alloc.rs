//! After a warm-up step with the largest batch, decoding allocates nothing:
//! no heap allocation per decoded token (on any thread of the process, team
//! workers included), whether the attention runs on the caller or is split
//! over the team, for a dense decoder and a mixture-of-experts one (whose
//! expert products run as one grouped call), in float and block-quantized
//! weights; nor does a mixed step (a prompt chunk with the decode batch)
//! after a warm-up one. A repeated prefill of the same length allocates
//! nothing either. Each test runs alone in a process of its own
//! (`counting::in_own_process`), the counting allocator being process-wide.

mod model_support;

use std::collections::HashMap;

use fucina::ExecContext;
use fucina::exec::{QuantFormat, WeightFormat};
use fucina_llm::{KvCache, Model, ModelConfig, PromptChunk, Weight, WeightStore};

#[path = "../../fucina-thread/tests/support/counting.rs"]
mod counting;
use counting::{Counting, allocations, check_the_counter, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

fn decode_steps(threads: usize, bf16_products: bool) {
    let mut c = model_support::llama(64);
    c.head_dim = 32;
    c.qkv_bias = true;
    let mut model = model_support::model(&c, WeightFormat::BF16, 5);
    if bf16_products {
        model.use_bf16_products().unwrap();
    }
    decode_steps_of(&model, &c, threads);
}

/// Prefills three caches, warms up with batches of three, then counts the
/// allocations of 10 decode steps of three sequences and of a batch of one
/// and of two: none.
fn decode_steps_of(model: &Model, c: &ModelConfig, threads: usize) {
    let vocab = c.vocab_size;
    let ctx = ExecContext::with_threads(threads);
    // Three sequences of different lengths; their attention (3 x 4 heads x
    // 40..60 positions x 32) is large enough to be split over the team.
    let mut caches: Vec<KvCache> = (0..3).map(|_| model.new_cache(&ctx, 80).unwrap()).collect();
    let mut last = vec![0.0f32; vocab];
    for (i, cache) in caches.iter_mut().enumerate() {
        let prompt = model_support::tokens(i as u64, 40 + 8 * i, vocab);
        model
            .prefill(&ctx, cache, &prompt, None, &mut last)
            .unwrap();
    }
    let mut logits = vec![0.0f32; 3 * vocab];
    let mut step = |caches: &mut [KvCache], t: u32| {
        let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
        let before = allocations();
        model
            .decode(&ctx, &mut refs, &[t, t + 1, t + 2], &mut logits)
            .unwrap();
        let n = allocations() - before;
        drop(refs);
        n
    };
    // Warm-up: sizes the workspace, creates and starts the team.
    step(&mut caches, 3);
    step(&mut caches, 4);
    let mut total = 0;
    for t in 0..10 {
        total += step(&mut caches, 10 + t);
    }
    assert_eq!(caches[0].len(), 52);
    if threads > 1 {
        assert!(
            ctx.team().is_some_and(|t| t.is_started()),
            "the team ran the attention"
        );
    }
    assert_eq!(
        total, 0,
        "heap allocations in 10 decode steps ({threads} threads)"
    );
    // A batch of one, then two, after the batch of three: no growth either.
    let before = allocations();
    let [a, b, c] = &mut caches[..] else {
        unreachable!()
    };
    model
        .decode(&ctx, &mut [a], &[1], &mut logits[..vocab])
        .unwrap();
    model
        .decode(&ctx, &mut [c, b], &[1, 2], &mut logits[..2 * vocab])
        .unwrap();
    assert_eq!(
        allocations() - before,
        0,
        "smaller batches allocate nothing"
    );
    mixed_steps(model, &ctx, &mut caches);
}

/// A fourth sequence's prompt in chunks of 16 tokens, each in a mixed step
/// with the three caches decoding: after a warm-up step, none allocates (with
/// and without the chunk's last logits).
fn mixed_steps(model: &Model, ctx: &ExecContext, caches: &mut [KvCache]) {
    let vocab = model.config().vocab_size;
    let mut reader = model.new_cache(ctx, 128).unwrap();
    let prompt = model_support::tokens(9, 64, vocab);
    let mut logits = vec![0.0f32; 3 * vocab];
    let mut last = vec![0.0f32; vocab];
    let mut counted = 0;
    for (i, chunk) in prompt.chunks(16).enumerate() {
        let [a, b, c] = caches else { unreachable!() };
        let t = i as u32;
        let before = allocations();
        let chunk = PromptChunk {
            cache: &mut reader,
            tokens: chunk,
            last_logits: (i % 2 == 0).then_some(&mut last[..]),
        };
        model
            .step(
                ctx,
                Some(chunk),
                &mut [a, b, c],
                &[t, t + 1, t + 2],
                &mut logits,
            )
            .unwrap();
        if i > 0 {
            counted += allocations() - before;
        }
    }
    assert_eq!(reader.len(), 64);
    assert_eq!(counted, 0, "heap allocations in 3 mixed steps");
}

/// A Qwen3-MoE-shaped model, 256 wide (a whole Q4_K super-block): 8 experts,
/// 3 per token, layer 1 dense; every matrix but the embedding stored as
/// `quant` (f32 when `None`), repacked where the format is.
fn moe_model(quant: Option<QuantFormat>) -> (Model, ModelConfig) {
    let mut c = model_support::moe(256);
    if let Some(m) = &mut c.params.moe {
        m.moe_intermediate_size = 256;
    }
    let ctx = ExecContext::new();
    let mut tensors: HashMap<String, Weight> =
        model_support::random_weights(&c, WeightFormat::F32, 8);
    if let Some(q) = quant {
        for (name, w) in tensors.iter_mut() {
            if w.shape().len() != 2 || name.contains("embed_tokens") {
                continue;
            }
            let (rows, cols) = (w.shape()[0], w.shape()[1]);
            let bytes = ctx
                .quantize(q, rows, cols, &w.to_f32_vec())
                .unwrap()
                .into_bytes();
            *w = Weight::quantized(name, q, &[rows, cols], bytes).unwrap();
        }
    }
    let mut store = WeightStore::from_tensors(tensors);
    store.repack_quantized(&ctx).unwrap();
    (Model::from_parts(c.clone(), store).unwrap(), c)
}

/// The MoE model's formats: f32, Q8_0 (repacked strips) and Q4_K (read in
/// place, super-block activations).
fn moe_formats() -> [Option<QuantFormat>; 3] {
    [None, Some(QuantFormat::Q8_0), Some(QuantFormat::Q4_K)]
}

#[test]
fn a_moe_decode_step_allocates_nothing_at_steady_state() {
    in_own_process(
        "a_moe_decode_step_allocates_nothing_at_steady_state",
        || {
            for q in moe_formats() {
                let (model, c) = moe_model(q);
                for threads in [1, 2] {
                    eprintln!("{q:?}, {threads} threads");
                    decode_steps_of(&model, &c, threads);
                }
            }
        },
    );
}

#[test]
fn a_repeated_moe_prefill_allocates_nothing() {
    in_own_process("a_repeated_moe_prefill_allocates_nothing", || {
        for q in moe_formats() {
            let (model, c) = moe_model(q);
            for threads in [1, 2] {
                repeated_prefill(&model, &c, threads);
            }
        }
    });
}

#[test]
fn the_counter_counts() {
    in_own_process("the_counter_counts", check_the_counter);
}

#[test]
fn a_decode_step_allocates_nothing_at_steady_state() {
    in_own_process("a_decode_step_allocates_nothing_at_steady_state", || {
        decode_steps(1, false);
        decode_steps(2, false);
    });
}

#[test]
fn a_decode_step_with_bf16_products_allocates_nothing_at_steady_state() {
    in_own_process(
        "a_decode_step_with_bf16_products_allocates_nothing_at_steady_state",
        || {
            decode_steps(1, true);
            decode_steps(2, true);
        },
    );
}

#[test]
fn a_repeated_prefill_allocates_nothing() {
    in_own_process("a_repeated_prefill_allocates_nothing", || {
        let c = model_support::llama(64);
        let f32_model = model_support::model(&c, WeightFormat::F32, 6);
        let mut bf16_model = model_support::model(&c, WeightFormat::BF16, 6);
        bf16_model.use_bf16_products().unwrap();
        // 4 threads: each head's rows are split in two attention tasks.
        for (model, threads) in [(&f32_model, 2), (&f32_model, 4), (&bf16_model, 2)] {
            repeated_prefill(model, &c, threads);
        }
    });
}

/// Prefills 100 tokens once, then counts the allocations of three more
/// prefills of them: none.
fn repeated_prefill(model: &Model, c: &ModelConfig, threads: usize) {
    let ctx = ExecContext::with_threads(threads);
    let prompt = model_support::tokens(9, 100, c.vocab_size);
    let mut cache = model.new_cache(&ctx, 100).unwrap();
    let mut all = vec![0.0f32; 100 * c.vocab_size];
    let mut last = vec![0.0f32; c.vocab_size];
    model
        .prefill(&ctx, &mut cache, &prompt, Some(&mut all), &mut last)
        .unwrap();
    let before = allocations();
    for _ in 0..3 {
        cache.clear();
        model
            .prefill(&ctx, &mut cache, &prompt, Some(&mut all), &mut last)
            .unwrap();
    }
    assert_eq!(
        allocations() - before,
        0,
        "heap allocations in 3 prefills ({threads} threads)"
    );
}
