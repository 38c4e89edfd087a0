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
    (0..n)
        .map(|i| collect(engine.submit(request(i)).unwrap()))
        .collect()
}

/// All `n` requests from their own threads, request `i` after a delay drawn
/// from `i` and `salt` (so they join a batch that is already running).
fn concurrent(engine: &Engine, n: usize, salt: usize) -> Vec<Vec<String>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                s.spawn(move || {
                    let delay = ((i * 37 + salt * 11) % 9) as u64;
                    std::thread::sleep(Duration::from_millis(delay));
                    collect(engine.submit(request(i)).unwrap())
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
    for level in SimdLevel::ALL.into_iter().filter(|&l| l <= best) {
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
