//! `Model::step`, the mixed step (one sequence's prompt chunk and one token of
//! each decoding sequence in one pass): every row's logits are the same bits
//! as the separate `prefill` and `decode` calls give, on 1 and 2 threads at
//! every vector level the CPU has, for a dense model and a mixture of experts;
//! each invalid argument is an `Err` that changes nothing.

mod model_support;

use fucina::ExecContext;
use fucina::exec::{SimdLevel, WeightFormat, detected_simd_level, force_simd_level};
use fucina_llm::{KvCache, LlmError, Model, ModelConfig, PREFILL_CHUNK, PromptChunk};
use model_support::tokens;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Sequence A is prefilled in two chunks (16 then 24 tokens) and then
/// decodes two tokens; B and C are prefilled and decode three tokens; D is
/// prefilled in one chunk of 30 tokens.
struct Case {
    a: Vec<u32>,
    a_next: Vec<u32>,
    b: Vec<u32>,
    b_next: Vec<u32>,
    c: Vec<u32>,
    c_next: Vec<u32>,
    d: Vec<u32>,
}

fn case(vocab: usize) -> Case {
    Case {
        a: tokens(1, 40, vocab),
        a_next: tokens(2, 2, vocab),
        b: tokens(3, 21, vocab),
        b_next: tokens(4, 3, vocab),
        c: tokens(5, 33, vocab),
        c_next: tokens(6, 3, vocab),
        d: tokens(7, 30, vocab),
    }
}

/// Per sequence A, B, C, D: the logits of its prompt's last token, then of
/// each decoded token, then of one more decode of A and D (after the step
/// that filled their caches).
type Trace = [Vec<Vec<u32>>; 4];

/// Each sequence alone, with `prefill` and `decode`.
fn separate(model: &Model, ctx: &ExecContext, k: &Case) -> Trace {
    let vocab = model.config().vocab_size;
    let mut trace: Trace = Default::default();
    let mut last = vec![0.0f32; vocab];
    let run = |prompt: &[&[u32]], next: &[u32], last: &mut Vec<f32>| {
        let mut cache = model.new_cache(ctx, 64).unwrap();
        for chunk in prompt {
            model.prefill(ctx, &mut cache, chunk, None, last).unwrap();
        }
        let mut out = vec![bits(last)];
        for &t in next {
            model.decode(ctx, &mut [&mut cache], &[t], last).unwrap();
            out.push(bits(last));
        }
        out
    };
    let a_next = [k.a_next.clone(), vec![3]].concat();
    trace[0] = run(&[&k.a[..16], &k.a[16..]], &a_next, &mut last);
    trace[1] = run(&[&k.b], &k.b_next, &mut last);
    trace[2] = run(&[&k.c], &k.c_next, &mut last);
    trace[3] = run(&[&k.d], &[4], &mut last);
    trace
}

/// The same tokens through mixed steps: A's first chunk with B and C
/// decoding, A's last chunk with C and B decoding, D's prompt with A
/// decoding, then A, B, C, D decoding together, then A alone.
fn mixed(model: &Model, ctx: &ExecContext, k: &Case) -> Trace {
    let vocab = model.config().vocab_size;
    let mut trace: Trace = Default::default();
    let new = || model.new_cache(ctx, 64).unwrap();
    let (mut a, mut b, mut c, mut d) = (new(), new(), new(), new());
    let mut last = vec![0.0f32; vocab];
    for (cache, prompt, t) in [(&mut b, &k.b, 1), (&mut c, &k.c, 2)] {
        model.prefill(ctx, cache, prompt, None, &mut last).unwrap();
        trace[t].push(bits(&last));
    }
    let mut logits = vec![0.0f32; 4 * vocab];
    let record = |trace: &mut Trace, order: &[usize], logits: &[f32]| {
        for (i, &s) in order.iter().enumerate() {
            trace[s].push(bits(&logits[i * vocab..(i + 1) * vocab]));
        }
    };
    let chunk = PromptChunk {
        cache: &mut a,
        tokens: &k.a[..16],
        last_logits: None,
    };
    let toks = [k.b_next[0], k.c_next[0]];
    let out = &mut logits[..2 * vocab];
    model
        .step(ctx, Some(chunk), &mut [&mut b, &mut c], &toks, out)
        .unwrap();
    record(&mut trace, &[1, 2], &logits);
    let chunk = PromptChunk {
        cache: &mut a,
        tokens: &k.a[16..],
        last_logits: Some(&mut last),
    };
    let toks = [k.c_next[1], k.b_next[1]];
    let out = &mut logits[..2 * vocab];
    model
        .step(ctx, Some(chunk), &mut [&mut c, &mut b], &toks, out)
        .unwrap();
    trace[0].push(bits(&last));
    record(&mut trace, &[2, 1], &logits);
    let chunk = PromptChunk {
        cache: &mut d,
        tokens: &k.d,
        last_logits: Some(&mut last),
    };
    let out = &mut logits[..vocab];
    model
        .step(ctx, Some(chunk), &mut [&mut a], &[k.a_next[0]], out)
        .unwrap();
    trace[3].push(bits(&last));
    record(&mut trace, &[0], &logits);
    let toks = [k.a_next[1], k.b_next[2], k.c_next[2], 4];
    model
        .step(
            ctx,
            None,
            &mut [&mut a, &mut b, &mut c, &mut d],
            &toks,
            &mut logits,
        )
        .unwrap();
    record(&mut trace, &[0, 1, 2, 3], &logits);
    let out = &mut logits[..vocab];
    model.step(ctx, None, &mut [&mut a], &[3], out).unwrap();
    record(&mut trace, &[0], &logits);
    trace
}

fn check(c: &ModelConfig, format: WeightFormat) {
    let model = model_support::model(c, format, 31);
    let k = case(c.vocab_size);
    let reference = separate(&model, &ExecContext::with_threads(1), &k);
    assert_eq!(reference.each_ref().map(|t| t.len()), [4, 4, 4, 2]);
    let best = detected_simd_level();
    let levels: Vec<SimdLevel> = SimdLevel::available().collect();
    eprintln!("levels compared: {levels:?}");
    for &level in &levels {
        assert!(force_simd_level(level));
        for threads in [1, 2] {
            let ctx = ExecContext::with_threads(threads);
            assert_eq!(
                mixed(&model, &ctx, &k),
                reference,
                "mixed steps at {level:?} on {threads} threads differ from prefill and decode"
            );
        }
    }
    assert!(force_simd_level(best));
}

#[test]
fn a_mixed_step_gives_each_row_the_bits_of_prefill_and_decode() {
    // Head dim 32: the attention is large enough to be split over the team.
    let mut c = model_support::llama(64);
    c.head_dim = 32;
    c.qkv_bias = true;
    check(&c, WeightFormat::BF16);
    let mut windowed = model_support::llama(64);
    windowed.sliding_window = Some(12);
    check(&windowed, WeightFormat::F32);
}

#[test]
fn a_moe_mixed_step_gives_each_row_the_bits_of_prefill_and_decode() {
    let c = model_support::moe(64);
    check(&c, WeightFormat::F32);
}

/// `f` on a fresh setup (a chunk cache holding 3 positions of 8, decode caches
/// holding 5 and 7 of 64) is an `InvalidRequest` of `Model::step` whose reason
/// names `words`, and no cache changed length or contents (the next decode of
/// each gives the bits it gives without the failed call).
fn refused(
    words: &str,
    f: impl FnOnce(
        &Model,
        &ExecContext,
        &mut KvCache,
        &mut KvCache,
        &mut KvCache,
    ) -> Result<(), LlmError>,
) {
    let c = model_support::llama(64);
    let model = model_support::model(&c, WeightFormat::F32, 9);
    let ctx = ExecContext::with_threads(2);
    let vocab = c.vocab_size;
    let setup = || {
        let mut caches = [
            model.new_cache(&ctx, 8).unwrap(),
            model.new_cache(&ctx, 64).unwrap(),
            model.new_cache(&ctx, 64).unwrap(),
        ];
        let mut last = vec![0.0f32; vocab];
        for (cache, n) in caches.iter_mut().zip([3, 5, 7]) {
            let prompt = tokens(n as u64, n, vocab);
            model
                .prefill(&ctx, cache, &prompt, None, &mut last)
                .unwrap();
        }
        caches
    };
    let after = |caches: &mut [KvCache; 3]| {
        let mut logits = vec![0.0f32; 3 * vocab];
        let [x, y, z] = caches;
        model
            .decode(&ctx, &mut [x, y, z], &[5, 6, 7], &mut logits)
            .unwrap();
        bits(&logits)
    };
    let want = after(&mut setup());
    let mut caches = setup();
    let [x, y, z] = &mut caches;
    match f(&model, &ctx, x, y, z) {
        Err(LlmError::InvalidRequest { op, reason }) => {
            assert_eq!(op, "Model::step");
            assert!(reason.contains(words), "{words:?} not in {reason:?}");
        }
        other => panic!("expected InvalidRequest ({words}), got {other:?}"),
    }
    assert_eq!(caches.each_ref().map(|c| c.len()), [3, 5, 7], "{words}");
    assert_eq!(after(&mut caches), want, "{words}: a cache changed");
}

fn chunk<'a>(
    cache: &'a mut KvCache,
    tokens: &'a [u32],
    last_logits: Option<&'a mut [f32]>,
) -> PromptChunk<'a> {
    PromptChunk {
        cache,
        tokens,
        last_logits,
    }
}

#[test]
fn each_invalid_step_is_an_error_that_changes_nothing() {
    let vocab = model_support::llama(64).vocab_size;
    let mut l1 = vec![0.0f32; vocab];
    let mut l2 = vec![0.0f32; 2 * vocab];
    let l1 = &mut l1;
    let l2 = &mut l2;
    refused("3 tokens for 2 caches", |m, ctx, x, y, z| {
        m.step(ctx, Some(chunk(x, &[1], None)), &mut [y, z], &[1, 2, 3], l2)
    });
    refused("no sequences to decode", |m, ctx, _, _, _| {
        m.step(ctx, None, &mut [], &[], &mut [])
    });
    refused("the prompt chunk has 0 tokens", |m, ctx, x, y, z| {
        m.step(ctx, Some(chunk(x, &[], None)), &mut [y, z], &[1, 2], l2)
    });
    let long = vec![1u32; PREFILL_CHUNK + 1];
    refused("expected 1 to 256", |m, ctx, _, y, z| {
        m.step(ctx, Some(chunk(y, &long, None)), &mut [z], &[1], l1)
    });
    refused("token id 97 is past the vocabulary", |m, ctx, x, y, z| {
        m.step(
            ctx,
            Some(chunk(x, &[1, 97], None)),
            &mut [y, z],
            &[1, 2],
            l2,
        )
    });
    refused("token id 200 is past the vocabulary", |m, ctx, x, y, z| {
        m.step(ctx, Some(chunk(x, &[1], None)), &mut [y, z], &[1, 200], l2)
    });
    refused("exceed the cache's max_len 8", |m, ctx, x, y, z| {
        let six = [1u32; 6];
        m.step(ctx, Some(chunk(x, &six, None)), &mut [y, z], &[1, 2], l2)
    });
    refused("sequence 1: the cache is full", |m, ctx, x, y, z| {
        // Fill x (8 positions) from a copy, then decode with it second.
        let mut full = x.clone();
        let mut last = vec![0.0f32; m.config().vocab_size];
        m.prefill(ctx, &mut full, &[1; 5], None, &mut last).unwrap();
        m.step(
            ctx,
            Some(chunk(y, &[1], None)),
            &mut [z, &mut full],
            &[1, 2],
            l2,
        )
    });
    refused("the cache was made for", |m, ctx, _, y, z| {
        let mut other_c = model_support::llama(64);
        other_c.num_hidden_layers = 3;
        let other = model_support::model(&other_c, WeightFormat::F32, 1);
        let mut foreign = other.new_cache(ctx, 16).unwrap();
        m.step(
            ctx,
            Some(chunk(&mut foreign, &[1], None)),
            &mut [y, z],
            &[1, 2],
            l2,
        )
    });
    refused(
        "logits has 97 elements, expected 2 sequences",
        |m, ctx, x, y, z| m.step(ctx, Some(chunk(x, &[1], None)), &mut [y, z], &[1, 2], l1),
    );
    refused("last_logits has 194 elements", |m, ctx, x, y, z| {
        let mut wrong = vec![0.0f32; 2 * vocab];
        let mut out = vec![0.0f32; 2 * vocab];
        let c = chunk(x, &[1], Some(&mut wrong[..]));
        m.step(ctx, Some(c), &mut [y, z], &[1, 2], &mut out)
    });
}
