//! The tokenizer against the ids and texts the Python `tokenizers` library gave
//! for the fixture `tokenizer.json` (tests/fixtures/llama_f32/, written by
//! scripts/make_fixtures.py), and its errors.

use std::path::{Path, PathBuf};

use fucina_llm::LlmError;
use fucina_llm::tokenizer::Tokenizer;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_f32")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(dir().join("tokenizer_reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn encodes_and_decodes_as_the_python_library() {
    let tok = Tokenizer::from_file(dir().join("tokenizer.json")).unwrap();
    let r = reference();
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let with = ids(&case["ids_with_special"]);
        let without = ids(&case["ids_without_special"]);
        assert_eq!(
            tok.encode(text, true).unwrap(),
            with,
            "encode {text:?} with special tokens"
        );
        assert_eq!(
            tok.encode(text, false).unwrap(),
            without,
            "encode {text:?} without"
        );
        assert_eq!(
            tok.decode(&with, true).unwrap(),
            case["decode_skip_special"].as_str().unwrap(),
            "decode {with:?} skipping special tokens"
        );
        assert_eq!(
            tok.decode(&with, false).unwrap(),
            case["decode_keep_special"].as_str().unwrap(),
            "decode {with:?} keeping special tokens"
        );
    }
    // The non-ASCII case exercises the byte-level alphabet (several ids per
    // character) and round-trips.
    let text = "café naïve 日本 🙂";
    let e = tok.encode(text, false).unwrap();
    assert!(e.len() > text.chars().count());
    assert_eq!(tok.decode(&e, true).unwrap(), text);
}

#[test]
fn special_tokens_and_vocabulary() {
    let tok = Tokenizer::from_file(dir().join("tokenizer.json")).unwrap();
    let r = reference();
    assert_eq!(tok.vocab_size() as u64, r["vocab_size"].as_u64().unwrap());
    let want: Vec<(u32, String)> = {
        let mut v: Vec<(u32, String)> = r["special_tokens"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (v.as_u64().unwrap() as u32, k.clone()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(tok.special_tokens(), &want[..]);
    for (id, s) in &want {
        assert_eq!(tok.token_to_id(s), Some(*id));
        assert_eq!(tok.id_to_token(*id).as_deref(), Some(s.as_str()));
        assert!(tok.is_special(*id));
    }
    assert!(!tok.is_special(100));
    assert_eq!(tok.token_to_id("no such token"), None);
    // The tokenizer's vocabulary is the fixture model's.
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("config.json")).unwrap()).unwrap();
    assert_eq!(
        tok.vocab_size() as u64,
        config["vocab_size"].as_u64().unwrap()
    );
    assert_eq!(tok.path(), dir().join("tokenizer.json"));
}

#[test]
fn errors_name_the_file_or_the_id() {
    let missing = dir().join("no_such_tokenizer.json");
    match Tokenizer::from_file(&missing) {
        Err(e @ LlmError::Io { .. }) => assert!(e.to_string().contains("no_such_tokenizer.json")),
        other => panic!("expected an I/O error, got {other:?}"),
    }
    // Not a tokenizer: the model's config.
    let config = dir().join("config.json");
    match Tokenizer::from_file(&config) {
        Err(e @ LlmError::BadFile { .. }) => assert!(e.to_string().contains("config.json"), "{e}"),
        other => panic!("expected a bad-file error, got {other:?}"),
    }
    // A truncated tokenizer.json.
    let bytes = std::fs::read(dir().join("tokenizer.json")).unwrap();
    match Tokenizer::from_bytes(&bytes[..bytes.len() / 2], "half.json") {
        Err(e @ LlmError::BadFile { .. }) => assert!(e.to_string().contains("half.json"), "{e}"),
        other => panic!("expected a bad-file error, got {other:?}"),
    }
    // An id past the vocabulary is an error, not silently dropped.
    let tok = Tokenizer::from_file(dir().join("tokenizer.json")).unwrap();
    match tok.decode(&[0, 5, 320], true) {
        Err(e @ LlmError::InvalidRequest { .. }) => assert!(e.to_string().contains("320"), "{e}"),
        other => panic!("expected an error naming id 320, got {other:?}"),
    }
}
