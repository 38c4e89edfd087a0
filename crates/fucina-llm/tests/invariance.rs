//! Batch, thread and vector-level invariance: a sequence's logits are the same
//! bits decoded alone on one thread as decoded in a batch of three sequences of
//! different lengths (one of which joins mid-way, in varying batch orders), on
//! 1, 2, 3 and 4 threads, at every vector level the CPU has; with bf16
//! products also with and without the AMX tiles.

mod model_support;

use fucina::ExecContext;
use fucina::exec::{SimdLevel, WeightFormat, detected_simd_level, force_amx, force_simd_level};
use fucina_llm::{KvCache, Model, ModelConfig};
use model_support::tokens;

/// Three sequences: a prompt and the tokens then decoded one at a time.
struct Seq {
    prompt: Vec<u32>,
    next: Vec<u32>,
}

fn sequences(vocab: usize) -> Vec<Seq> {
    [(20, 6), (31, 6), (42, 4)]
        .iter()
        .enumerate()
        .map(|(i, &(p, n))| Seq {
            prompt: tokens(100 + i as u64, p, vocab),
            next: tokens(200 + i as u64, n, vocab),
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Per sequence: the prefill's last logits, then each decode step's logits.
type Trace = Vec<Vec<Vec<u32>>>;

/// Each sequence alone (batch of one).
fn alone(model: &Model, ctx: &ExecContext, seqs: &[Seq]) -> Trace {
    let vocab = model.config().vocab_size;
    seqs.iter()
        .map(|s| {
            let mut cache = model.new_cache(ctx, 64).unwrap();
            let mut logits = vec![0.0f32; vocab];
            model
                .prefill(ctx, &mut cache, &s.prompt, None, &mut logits)
                .unwrap();
            let mut out = vec![bits(&logits)];
            for &t in &s.next {
                model
                    .decode(ctx, &mut [&mut cache], &[t], &mut logits)
                    .unwrap();
                out.push(bits(&logits));
            }
            out
        })
        .collect()
}

/// The sequences decoded together: 0 and 1 from the start (batch [1, 0]),
/// 2 joining at step 2 (batches [1, 2, 0] then [2, 0, 1]), each sequence
/// leaving when its tokens are done.
fn batched(model: &Model, ctx: &ExecContext, seqs: &[Seq]) -> Trace {
    let vocab = model.config().vocab_size;
    let mut caches: Vec<KvCache> = seqs
        .iter()
        .map(|_| model.new_cache(ctx, 64).unwrap())
        .collect();
    let mut trace: Trace = vec![Vec::new(); seqs.len()];
    let prefill = |i: usize, caches: &mut [KvCache], trace: &mut Trace| {
        let mut logits = vec![0.0f32; vocab];
        model
            .prefill(ctx, &mut caches[i], &seqs[i].prompt, None, &mut logits)
            .unwrap();
        trace[i].push(bits(&logits));
    };
    prefill(0, &mut caches, &mut trace);
    prefill(1, &mut caches, &mut trace);
    let mut done = [0usize; 3];
    for step in 0..8 {
        if step == 2 {
            prefill(2, &mut caches, &mut trace);
        }
        let order: &[usize] = match step {
            0 | 1 => &[1, 0],
            2 | 3 => &[1, 2, 0],
            _ => &[2, 0, 1],
        };
        let order: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| done[i] < seqs[i].next.len())
            .collect();
        if order.is_empty() {
            break;
        }
        let toks: Vec<u32> = order.iter().map(|&i| seqs[i].next[done[i]]).collect();
        let mut refs: Vec<&mut KvCache> = Vec::new();
        // Hand out the caches in `order` (disjoint mutable borrows).
        let mut slots: Vec<Option<&mut KvCache>> = caches.iter_mut().map(Some).collect();
        for &i in &order {
            refs.push(slots[i].take().unwrap());
        }
        let mut logits = vec![0.0f32; order.len() * vocab];
        model.decode(ctx, &mut refs, &toks, &mut logits).unwrap();
        for (k, &i) in order.iter().enumerate() {
            trace[i].push(bits(&logits[k * vocab..(k + 1) * vocab]));
            done[i] += 1;
        }
    }
    trace
}

fn check(c: &ModelConfig, format: WeightFormat) {
    check_model(&model_support::model(c, format, 77), c);
}

/// [`check`] of a given model; at the AVX-512 level also with the AMX tiles
/// turned off, then on again where the CPU has them (bf16 products).
fn check_model(model: &Model, c: &ModelConfig) {
    let seqs = sequences(c.vocab_size);
    let best = detected_simd_level();
    let levels: Vec<SimdLevel> = SimdLevel::available().collect();
    eprintln!("levels compared: {levels:?}");
    let reference = alone(model, &ExecContext::with_threads(1), &seqs);
    for s in &reference {
        assert!(s.len() > 4);
    }
    for &level in &levels {
        assert!(force_simd_level(level));
        for threads in 1..=4 {
            let ctx = ExecContext::with_threads(threads);
            let got = batched(model, &ctx, &seqs);
            assert_eq!(
                got, reference,
                "batched decode at {level:?} on {threads} threads differs from alone"
            );
        }
        let got = alone(model, &ExecContext::with_threads(3), &seqs);
        assert_eq!(
            got, reference,
            "alone decode at {level:?} on 3 threads differs"
        );
        if level == SimdLevel::Avx512 && model.uses_bf16_products() {
            let amx = fucina::exec::amx_available();
            force_amx(false);
            let got = batched(model, &ExecContext::with_threads(2), &seqs);
            force_amx(amx);
            assert_eq!(got, reference, "batched decode without AMX tiles differs");
        }
    }
    assert!(force_simd_level(best));
}

#[test]
fn decode_is_batch_thread_and_level_invariant_bf16() {
    // Head dim 32: the attention of a batch of three is large enough to be
    // split over the team, that of one sequence is not.
    let mut c = model_support::llama(64);
    c.head_dim = 32;
    c.intermediate_size = 160;
    c.vocab_size = 160;
    c.qkv_bias = true;
    check(&c, WeightFormat::BF16);
}

#[test]
fn decode_is_batch_thread_and_level_invariant_f32_with_a_window() {
    let mut c = model_support::llama(64);
    c.sliding_window = Some(25);
    c.tie_word_embeddings = true;
    check(&c, WeightFormat::F32);
}

#[test]
fn qwen3_gemma_and_phi3_decode_is_batch_thread_and_level_invariant() {
    // Qwen3: q/k norms. Gemma 2: GeGLU, sandwich norms, soft-capped attention
    // (the one-row path) and logits, a window on every other layer, a query
    // scale. Gemma 3: q/k norms and local layers with their own RoPE base.
    let mut qwen3 = model_support::llama(64);
    qwen3.architecture = fucina_llm::Architecture::Qwen3;
    qwen3.head_dim = 32;
    check(&qwen3, WeightFormat::F32);

    let mut gemma2 = model_support::llama(64);
    gemma2.architecture = fucina_llm::Architecture::Gemma2;
    gemma2.num_hidden_layers = 3;
    gemma2.tie_word_embeddings = true;
    gemma2.sliding_window = Some(9);
    gemma2.params.sliding_layers = vec![true, false, true];
    gemma2.params.attn_logit_softcapping = Some(2.0);
    gemma2.params.final_logit_softcapping = Some(10.0);
    gemma2.params.query_pre_attn_scalar = Some(20.0);
    check(&gemma2, WeightFormat::BF16);

    let mut gemma3 = gemma2.clone();
    gemma3.architecture = fucina_llm::Architecture::Gemma3;
    gemma3.params.attn_logit_softcapping = None;
    gemma3.params.final_logit_softcapping = None;
    gemma3.params.sliding_layers = vec![true, true, false];
    gemma3.params.local_rope_theta = Some(100.0);
    check(&gemma3, WeightFormat::F32);

    // Phi-3: fused projections, LongRoPE (the caches of 64 positions exceed
    // the original context of 32: the long factors), a window.
    let mut phi3 = model_support::llama(64);
    phi3.architecture = fucina_llm::Architecture::Phi3;
    phi3.sliding_window = Some(30);
    phi3.params.longrope = Some(fucina_llm::LongRope {
        short_factor: (0..8).map(|i| 1.0 + i as f32 / 4.0).collect(),
        long_factor: (0..8).map(|i| 1.0 + i as f32).collect(),
        original_max_position_embeddings: 32,
        attention_factor: 1.2,
    });
    check(&phi3, WeightFormat::BF16);

    // Phi-4-mini: the same with a partial rotary embedding (12 of 16
    // dimensions per head, 6 factors of each kind).
    phi3.params.rotary_dim = Some(12);
    if let Some(lr) = &mut phi3.params.longrope {
        lr.short_factor.truncate(6);
        lr.long_factor.truncate(6);
    }
    check(&phi3, WeightFormat::BF16);
}

#[test]
fn moe_decode_is_batch_thread_and_level_invariant() {
    // The tokens of a batch (and of a prefill) routed to an expert share one
    // product; a token's logits must not depend on which others share it.
    check(&model_support::moe(64), WeightFormat::F32);
    check(&model_support::moe(64), WeightFormat::BF16);
}

#[test]
fn moe_prefill_gives_the_bits_of_token_by_token_decoding() {
    let c = model_support::moe(64);
    let model = model_support::model(&c, WeightFormat::F32, 5);
    let ctx = ExecContext::with_threads(2);
    let prompt = tokens(9, 40, c.vocab_size);
    let vocab = c.vocab_size;
    let mut cache = model.new_cache(&ctx, 64).unwrap();
    let mut all = vec![0.0f32; prompt.len() * vocab];
    let mut last = vec![0.0f32; vocab];
    model
        .prefill(&ctx, &mut cache, &prompt, Some(&mut all), &mut last)
        .unwrap();
    let mut one = model.new_cache(&ctx, 64).unwrap();
    for (t, &tok) in prompt.iter().enumerate() {
        model
            .decode(&ctx, &mut [&mut one], &[tok], &mut last)
            .unwrap();
        assert_eq!(
            bits(&last),
            bits(&all[t * vocab..(t + 1) * vocab]),
            "position {t}"
        );
    }
}

#[test]
fn bf16_products_are_batch_thread_level_and_amx_invariant() {
    // Prompts of 20-42 rows: the projections of a prefill run on the AMX
    // tiles where the CPU has them, those of a decode batch too or on the
    // emulation; every path gives the same bits.
    let mut c = model_support::llama(64);
    c.head_dim = 32;
    c.intermediate_size = 160;
    c.vocab_size = 160;
    c.qkv_bias = true;
    let mut model = model_support::model(&c, WeightFormat::BF16, 77);
    model.use_bf16_products().unwrap();
    eprintln!("AMX-rule path: {}", fucina::exec::amx_rule_path());
    check_model(&model, &c);
}
