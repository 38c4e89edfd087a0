//! What the tests against llama.cpp's logits share: the reference ids and
//! fucina's logits rows teacher-forced with llama.cpp's greedy ids.

#![allow(dead_code)]

use fucina_llm::Model;
use fucina_llm::fucina::ExecContext;
use serde_json::Value;

/// A JSON array of token ids.
pub(crate) fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// The index of the largest value (the first of equal ones).
pub(crate) fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// Prefill `prompt` (every row's logits), then one decode step per id of
/// llama.cpp's `greedy` but the last (teacher-forced: its id, whatever
/// `model` chose): the logits rows `[prompt + greedy - 1, vocab]` in
/// llama.cpp's layout, and how many of the greedy ids are `model`'s argmax.
pub(crate) fn teacher_forced_rows(
    model: &Model,
    ctx: &ExecContext,
    prompt: &[u32],
    greedy: &[u32],
) -> (Vec<f32>, usize) {
    let vocab = model.config().vocab_size;
    let (t, n) = (prompt.len(), greedy.len());
    let mut cache = model.new_cache(ctx, t + n).expect("a cache");
    let mut rows = vec![0f32; (t + n - 1) * vocab];
    let mut logits = vec![0f32; vocab];
    model
        .prefill(
            ctx,
            &mut cache,
            prompt,
            Some(&mut rows[..t * vocab]),
            &mut logits,
        )
        .expect("prefill");
    let mut top1 = 0;
    for (step, &tok) in greedy.iter().enumerate() {
        top1 += usize::from(argmax(&logits) == tok);
        if step + 1 < n {
            model
                .decode(ctx, &mut [&mut cache], &[tok], &mut logits)
                .expect("decode");
            rows[(t + step) * vocab..(t + step + 1) * vocab].copy_from_slice(&logits);
        }
    }
    (rows, top1)
}
