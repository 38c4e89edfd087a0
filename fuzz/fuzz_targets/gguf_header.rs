//! Arbitrary bytes as a GGUF file: `fucina_llm::gguf::parse_header` returns `Ok`
//! or `Err`, never panics and never allocates what a hostile count claims (the
//! property is the absence of a crash; the reader's own checks are tested in
//! `crates/fucina-llm/tests/gguf.rs`). A header that parses is parsed again
//! from a copy with one more trailing byte: trailing data never changes it.
#![no_main]

use fucina_llm::gguf::parse_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(parsed) = parse_header(data) {
        let mut longer = data.to_vec();
        longer.push(0);
        // Compared as text: a NaN metadata value is not equal to itself.
        let again = parse_header(&longer).expect("a trailing byte made a valid header invalid");
        assert_eq!(format!("{again:?}"), format!("{parsed:?}"));
    }
});
