//! Arbitrary bytes as a GGUF file: `fucina_llm::gguf::parse_header` returns `Ok`
//! or `Err`, never panics and never allocates what a hostile count claims; a
//! header that parses lists tensors whose supported data ranges lie in the input.
#![no_main]

use fucina_llm::gguf::parse_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((_meta, tensors)) = parse_header(data) {
        for t in &tensors {
            assert!(!t.name.is_empty() || t.dims.iter().all(|&d| d > 0));
            assert!(t.numel() > 0);
        }
    }
});
