//! Arbitrary bytes as a whole GGUF model: when the header parses
//! (`GgufFile::parse`, over an in-memory mapping of the bytes), the
//! architecture loader (`gguf_config`, `gguf_weights`) and the tokenizer built
//! from the metadata (`Tokenizer::from_gguf`) return `Ok` or `Err`, never panic
//! and never allocate what a hostile count claims; the weights it loads
//! dequantize without a panic, in every block format (the seed
//! `llama_block_formats.gguf` holds a matrix in each). Their checks are tested in
//! `crates/fucina-llm/tests/{gguf,gguf_model,tokenizer}.rs`; this target looks
//! for the inputs those tests did not think of.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use fucina_llm::gguf::GgufFile;
use fucina_llm::arch::gguf::{gguf_config, gguf_weights};
use fucina_llm::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let Ok(mut map) = memmap2::MmapMut::map_anon(data.len()) else {
        return;
    };
    map.copy_from_slice(data);
    let Ok(map) = map.make_read_only() else {
        return;
    };
    let Ok(file) = GgufFile::parse(Path::new("fuzz.gguf"), Arc::new(map)) else {
        return;
    };
    if let Ok(config) = gguf_config(&file)
        && let Ok(store) = gguf_weights(&file, &config)
    {
        // every tensor decoded: each block format's dequantize on arbitrary
        // block bytes (NaN and infinite scales included)
        for (_, w) in store.iter() {
            let _ = w.to_f32_vec();
        }
    }
    let _ = Tokenizer::from_gguf(&file);
});
