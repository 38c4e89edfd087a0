//! Arbitrary bytes as a `config.json` over the weights of the `llama_f32`
//! fixture: `ModelConfig::parse`, `Model::from_parts` and a four-token prefill
//! give an `Err`, or logits that are all finite; never a panic, an abort, an
//! allocation of a size the input claims or a NaN. The ordinary test
//! `crates/fucina-llm/tests/hardening.rs` sweeps every numeric key over values
//! at the edges of f32 and u64; this target looks for the inputs it did not
//! think of (seeds: the fixtures' configs).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use fucina::ExecContext;
use fucina_llm::{Model, ModelConfig, WeightStore};
use libfuzzer_sys::fuzz_target;

fn weights() -> &'static WeightStore {
    static WEIGHTS: OnceLock<WeightStore> = OnceLock::new();
    WEIGHTS.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../crates/fucina-llm/tests/fixtures/llama_f32");
        WeightStore::open(dir).expect("the llama_f32 fixture")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = ModelConfig::parse(text, "config.json") else {
        return;
    };
    let Ok(model) = Model::from_parts(config, weights().clone()) else {
        return;
    };
    let ctx = ExecContext::with_threads(1);
    let c = model.config();
    let Ok(mut cache) = model.new_cache(&ctx, c.max_position_embeddings.min(4)) else {
        return;
    };
    let vocab = c.vocab_size;
    let prompt: Vec<u32> = (0..cache.capacity() as u32)
        .map(|i| (i * 37 + 5) % vocab as u32)
        .collect();
    let mut last = vec![0.0f32; vocab];
    if model
        .prefill(&ctx, &mut cache, &prompt, None, &mut last)
        .is_ok()
    {
        assert!(last.iter().all(|l| l.is_finite()), "non-finite logits");
    }
});
