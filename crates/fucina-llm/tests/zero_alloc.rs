//! After a warm-up step with the largest batch, decoding allocates nothing:
//! no heap allocation per decoded token (on any thread of the process, team
//! workers included), whether the attention runs on the caller or is split
//! over the team. A repeated prefill of the same length allocates nothing
//! either. Each test runs alone in a process of its own
//! (`counting::in_own_process`), the counting allocator being process-wide.

mod model_support;

use fucina::ExecContext;
use fucina::exec::WeightFormat;
use fucina_llm::KvCache;

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
    });
}
