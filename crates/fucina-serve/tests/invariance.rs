//! The promise: a request's tokens and log-probability bits do not depend on
//! the requests that run beside it, when they arrive, how its prompt is
//! chunked, the thread count or the vector level.

mod support;

use std::time::Duration;

use fucina_llm::SamplingParams;
use fucina_llm::fucina::exec::{SimdLevel, detected_simd_level, force_simd_level};
use fucina_serve::engine::{Engine, EngineOptions, Event, GenRequest};

/// Request `i` of the mix: its own prompt, length, seed and sampling.
fn request(i: usize) -> GenRequest {
    let len = 3 + (i * 7) % 40;
    let prompt: Vec<u32> = (0..len)
        .map(|j| ((i * 31 + j * 17) % 300) as u32 + 3)
        .collect();
    GenRequest {
        prompt,
        max_tokens: 8 + (i * 5) % 30,
        sampling: SamplingParams {
            temperature: if i.is_multiple_of(4) {
                0.0
            } else {
                0.7 + (i % 3) as f32 * 0.2
            },
            top_k: if i.is_multiple_of(3) { 0 } else { 20 },
            top_p: if i.is_multiple_of(5) { 0.9 } else { 1.0 },
            repetition_penalty: if i.is_multiple_of(2) { 1.0 } else { 1.15 },
            seed: 1000 + i as u64,
            stop_tokens: Vec::new(),
        },
        stop: if i % 6 == 1 {
            vec!["e".into()]
        } else {
            Vec::new()
        },
        logprobs: Some(3),
        stop_tokens: Vec::new(),
    }
}

/// Everything a request's receiver got, with the log-probabilities as bits.
fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(e) = rx.blocking_recv() {
        match e {
            Event::Text { text, tokens } => {
                let toks: Vec<String> = tokens
                    .iter()
                    .map(|t| {
                        let top: Vec<String> = t
                            .top
                            .iter()
                            .map(|(id, _, lp)| format!("{id}:{:08x}", lp.to_bits()))
                            .collect();
                        format!(
                            "{}@{:08x}[{}]",
                            t.id,
                            t.logprob.unwrap().to_bits(),
                            top.join(",")
                        )
                    })
                    .collect();
                out.push(format!("text {text:?} {}", toks.join(" ")));
            }
            other => out.push(format!("{other:?}")),
        }
    }
    out
}

fn solo(engine: &Engine, n: usize) -> Vec<Vec<String>> {
    solo_of(engine, n, request)
}

fn solo_of(engine: &Engine, n: usize, req: fn(usize) -> GenRequest) -> Vec<Vec<String>> {
    (0..n)
        .map(|i| collect(engine.submit(req(i)).unwrap()))
        .collect()
}

/// All `n` requests from their own threads, request `i` after a delay drawn
/// from `i` and `salt` (so they join a batch that is already running).
fn concurrent(engine: &Engine, n: usize, salt: usize) -> Vec<Vec<String>> {
    concurrent_of(engine, n, salt, request)
}

fn concurrent_of(
    engine: &Engine,
    n: usize,
    salt: usize,
    req: fn(usize) -> GenRequest,
) -> Vec<Vec<String>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                s.spawn(move || {
                    let delay = ((i * 37 + salt * 11) % 9) as u64;
                    std::thread::sleep(Duration::from_millis(delay));
                    collect(engine.submit(req(i)).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn answers_do_not_depend_on_the_load_threads_chunks_or_vector_level() {
    const N: usize = 16;
    let best = detected_simd_level();
    let reference = {
        let engine = support::engine(EngineOptions::default());
        solo(&engine, N)
    };
    // Every sequence ended with Done, and the mix exercises both endings.
    assert!(
        reference
            .iter()
            .all(|r| r.last().is_some_and(|e| e.starts_with("Done")))
    );
    for level in SimdLevel::available() {
        assert!(force_simd_level(level));
        for threads in [1, 2] {
            for (chunk, batch) in [(fucina_llm::PREFILL_CHUNK, 16), (3, 4)] {
                let engine = support::engine(EngineOptions {
                    threads,
                    max_batch: batch,
                    prefill_chunk: chunk,
                    ..EngineOptions::default()
                });
                let got = concurrent(&engine, N, threads + chunk);
                // Sequences did share decode steps: fewer steps than the
                // tokens they decoded (each sequence's first token comes from
                // its prefill).
                let m = engine.metrics();
                assert!(
                    m.decode_steps() + (N as u64) < m.generated_tokens(),
                    "{} steps for {} tokens: the requests never shared a batch",
                    m.decode_steps(),
                    m.generated_tokens()
                );
                // Prompt chunks rode along with decode steps.
                assert!(m.mixed_steps() > 0, "no mixed step ran");
                for (i, (g, r)) in got.iter().zip(&reference).enumerate() {
                    assert_eq!(
                        g, r,
                        "request {i}: {level:?}, {threads} threads, chunk {chunk}, batch {batch}"
                    );
                }
            }
        }
    }
    assert!(force_simd_level(best));
}

#[test]
fn shutdown_lets_running_and_waiting_sequences_finish() {
    let engine = support::engine(EngineOptions {
        max_batch: 2,
        ..EngineOptions::default()
    });
    let receivers: Vec<_> = (0..6).map(|i| engine.submit(request(i)).unwrap()).collect();
    engine.shutdown();
    for rx in receivers {
        let events = collect(rx);
        assert!(events.last().unwrap().starts_with("Done"), "{events:?}");
    }
}

#[test]
fn a_kv_budget_for_one_sequence_runs_them_one_at_a_time_and_equal_to_solo() {
    // Requests of 20 prompt tokens and 20 new ones: caches of 48 positions
    // (rounded up to 16). With a context of 48 and a budget of one such
    // cache, sequences run one at a time.
    let req = |i: usize| GenRequest {
        prompt: (0..20)
            .map(|j| ((i * 13 + j * 7) % 300) as u32 + 3)
            .collect(),
        max_tokens: 20,
        ..request(i)
    };
    let run = |engine: &Engine, concurrent: bool| -> Vec<Vec<String>> {
        if !concurrent {
            return (0..4)
                .map(|i| collect(engine.submit(req(i)).unwrap()))
                .collect();
        }
        let rxs: Vec<_> = (0..4).map(|i| engine.submit(req(i)).unwrap()).collect();
        rxs.into_iter().map(collect).collect()
    };
    let reference = run(&support::engine(EngineOptions::default()), false);
    // The fixture's caches: 2 layers x 2 kv heads x 16 x 2 (k and v) f32.
    let per_position = 2 * 2 * 16 * 2 * 4;
    let engine = support::engine(EngineOptions {
        ctx_len: 48,
        kv_budget_bytes: Some(48 * per_position),
        ..EngineOptions::default()
    });
    assert_eq!(run(&engine, true), reference);
    let m = engine.metrics();
    // No decode step ran two sequences: one step per token after the first.
    assert_eq!(m.decode_steps() + 4, m.generated_tokens());
    // A budget below one sequence of the context is refused at start.
    let path = support::fixture();
    let e = Engine::start(
        EngineOptions {
            ctx_len: 48,
            kv_budget_bytes: Some(47 * per_position),
            ..EngineOptions::default()
        },
        std::sync::Arc::new(fucina_serve::metrics::Metrics::default()),
        move |ctx| fucina_llm::open_model(&path, ctx, None),
    );
    assert!(e.is_err());
}

/// Request `i` of a mix that shares a 40-token system prompt (two whole
/// blocks of the prefix cache and a part): its own continuation of 1 to 7
/// tokens (20 more every third, a third block of its own), or (every fifth)
/// only the first 32 tokens, a prompt of whole blocks.
fn shared_prefix_request(i: usize) -> GenRequest {
    let mut prompt: Vec<u32> = (0..40).map(|j| ((j * 29) % 300) as u32 + 3).collect();
    if i.is_multiple_of(5) {
        prompt.truncate(2 * fucina_llm::KV_BLOCK);
    } else {
        let extra = 1 + i % 7 + if i.is_multiple_of(3) { 20 } else { 0 };
        prompt.extend((0..extra).map(|j| ((i * 41 + j * 13) % 300) as u32 + 3));
    }
    GenRequest {
        prompt,
        ..request(i)
    }
}

fn engine_with(dtype: Option<fucina_llm::LoadDtype>, options: EngineOptions) -> Engine {
    let path = support::fixture();
    Engine::start(
        options,
        std::sync::Arc::new(fucina_serve::metrics::Metrics::default()),
        move |ctx| fucina_llm::open_model(&path, ctx, dtype),
    )
    .expect("the fixture loads")
}

#[test]
fn a_prefix_cache_hit_gives_the_bits_of_a_cold_prefill() {
    const N: usize = 12;
    // The fixture's blocks: 2 layers x 2 kv heads x 16 x 2 (k and v) x 16
    // positions, f32.
    let block_bytes = 2 * 2 * 16 * 2 * 16 * 4;
    for dtype in [None, Some(fucina_llm::LoadDtype::Q8_0)] {
        let reference = solo_of(
            &engine_with(dtype, EngineOptions::default()),
            N,
            shared_prefix_request,
        );
        let best = detected_simd_level();
        let levels = SimdLevel::available();
        for level in levels {
            assert!(force_simd_level(level));
            for (threads, chunk) in [(1, fucina_llm::PREFILL_CHUNK), (2, 16), (2, 5)] {
                let what = format!("{dtype:?}, {level:?}, {threads} threads, chunk {chunk}");
                let options = EngineOptions {
                    threads,
                    prefill_chunk: chunk,
                    prefix_cache_bytes: 1 << 20,
                    ..EngineOptions::default()
                };
                let engine = engine_with(dtype, options.clone());
                // One at a time: the first fills the cache, the others hit it.
                let got = solo_of(&engine, N, shared_prefix_request);
                assert_eq!(got, reference, "solo, {what}");
                let m = engine.metrics();
                let hits = m.prefix_hits();
                assert_eq!(hits, N as u64 - 1, "{what}");
                // Each copies the shared blocks, its last token excepted.
                let shared: usize = (1..N)
                    .map(|i| ((shared_prefix_request(i).prompt.len() - 1) / 16 * 16).min(32))
                    .sum();
                assert_eq!(m.prefix_hit_tokens(), shared as u64, "{what}");
                // The two shared blocks and the whole blocks past them of
                // every third.
                let own: usize = (0..N)
                    .map(|i| (shared_prefix_request(i).prompt.len() / 16).saturating_sub(2))
                    .sum();
                assert!(own >= 3);
                assert_eq!(m.prefix_cache_bytes(), (2 + own) * block_bytes);
                // All together, arriving at staggered times, on a warm cache.
                let got = concurrent_of(&engine, N, threads + chunk, shared_prefix_request);
                assert_eq!(got, reference, "concurrent, warm, {what}");
                assert!(engine.metrics().prefix_hits() >= hits + N as u64, "{what}");
                // All together on a cold cache of three blocks (evictions).
                let engine = engine_with(
                    dtype,
                    EngineOptions {
                        prefix_cache_bytes: 3 * block_bytes,
                        ..options
                    },
                );
                let got = concurrent_of(&engine, N, threads + chunk + 1, shared_prefix_request);
                assert_eq!(got, reference, "concurrent, cold, {what}");
                assert!(engine.metrics().prefix_cache_bytes() <= 3 * block_bytes);
            }
        }
        assert!(force_simd_level(best));
    }
}
