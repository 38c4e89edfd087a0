//! The tokenizer against the ids and texts the Python `tokenizers` library gave
//! for the fixture `tokenizer.json` (tests/fixtures/llama_f32/, written by
//! scripts/make_fixtures.py), and its errors; the same tokenizer written into
//! GGUF metadata as llama.cpp's converter writes it (`Tokenizer::from_gguf`),
//! a SentencePiece-style ("llama") GGUF vocabulary built by hand, and the
//! errors of malformed `tokenizer.ggml.*` metadata.

use std::path::{Path, PathBuf};

use std::io::Write;

use fucina_llm::LlmError;
use fucina_llm::gguf::GgufFile;
use fucina_llm::tokenizer::Tokenizer;
use serde_json::Value;

mod gguf_support;
mod gguf_vocab;
use gguf_vocab::{
    T_ARRAY, T_BOOL, T_STRING, T_U32, f32_array, gpt2_metadata, i32_array, metadata_only,
    str_array, str_value,
};

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

type Meta = Vec<(String, u32, Vec<u8>)>;

/// Writes a metadata-only GGUF image and opens it.
fn gguf_file(meta: &Meta, tag: &str) -> GgufFile {
    let dir = std::env::temp_dir().join(format!("fucina-gguf-tok-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("tok.gguf");
    std::fs::File::create(&p)
        .unwrap()
        .write_all(&metadata_only(meta))
        .unwrap();
    GgufFile::open(&p).unwrap()
}

/// `meta` with `key` replaced by `value` (or removed when `None`).
fn with(meta: &Meta, key: &str, value: Option<(u32, Vec<u8>)>) -> Meta {
    let mut m: Meta = meta.iter().filter(|(k, _, _)| k != key).cloned().collect();
    if let Some((t, v)) = value {
        m.push((key.to_string(), t, v));
    }
    m
}

#[test]
fn a_gguf_tokenizer_encodes_and_decodes_as_its_tokenizer_json() {
    let json = Tokenizer::from_file(dir().join("tokenizer.json")).unwrap();
    let file = gguf_file(&gpt2_metadata(&dir()), "gpt2");
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.path(), file.path());
    assert_eq!(tok.vocab_size(), json.vocab_size());
    assert_eq!(tok.special_tokens(), json.special_tokens());
    let r = reference();
    for case in r["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let with_special = ids(&case["ids_with_special"]);
        assert_eq!(tok.encode(text, true).unwrap(), with_special, "{text:?}");
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids(&case["ids_without_special"]),
            "{text:?}"
        );
        assert_eq!(
            tok.decode(&with_special, true).unwrap(),
            case["decode_skip_special"].as_str().unwrap()
        );
        assert_eq!(
            tok.decode(&with_special, false).unwrap(),
            case["decode_keep_special"].as_str().unwrap()
        );
    }
    // More text than the reference: whitespace runs, newlines, digits,
    // punctuation, special tokens written in the text, every vocabulary id.
    for text in [
        "  two  spaces\n\nnew lines\tand tabs 1234567 it's don't",
        "<|bos|>inline special<|eos|>",
        "ünïcödé ∑ ∞ — “quotes”",
    ] {
        for add in [false, true] {
            let e = json.encode(text, add).unwrap();
            assert_eq!(tok.encode(text, add).unwrap(), e, "{text:?} {add}");
            for skip in [false, true] {
                assert_eq!(
                    tok.decode(&e, skip).unwrap(),
                    json.decode(&e, skip).unwrap()
                );
            }
        }
    }
    let all: Vec<u32> = (0..json.vocab_size() as u32).collect();
    assert_eq!(
        tok.decode(&all, false).unwrap(),
        json.decode(&all, false).unwrap()
    );
    // add_bos_token = false: nothing is added.
    let no_bos = with(
        &gpt2_metadata(&dir()),
        "tokenizer.ggml.add_bos_token",
        Some((T_BOOL, vec![0])),
    );
    let tok = Tokenizer::from_gguf(&gguf_file(&no_bos, "nobos")).unwrap();
    assert_eq!(
        tok.encode("The quick", true).unwrap(),
        json.encode("The quick", false).unwrap()
    );
}

/// A SentencePiece-style vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte
/// tokens, then pieces whose scores order the merges.
fn spm_metadata() -> Meta {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    let pieces = [
        ("▁", -20.0),
        ("h", -21.0),
        ("e", -22.0),
        ("l", -23.0),
        ("o", -24.0),
        ("w", -25.0),
        ("r", -26.0),
        ("d", -27.0),
        ("ll", -1.0),
        ("he", -2.0),
        ("llo", -3.0),
        ("▁he", -4.0),
        ("▁hello", -5.0),
        ("▁w", -6.0),
        ("or", -7.0),
        ("a", -30.0),
        ("b", -31.0),
        ("c", -32.0),
        ("ab", -8.0),
        ("bc", -9.0),
    ];
    for (p, s) in pieces {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(s);
    }
    vec![
        ("tokenizer.ggml.model".into(), T_STRING, str_value("llama")),
        ("tokenizer.ggml.tokens".into(), T_ARRAY, str_array(&tokens)),
        ("tokenizer.ggml.scores".into(), T_ARRAY, f32_array(&scores)),
        (
            "tokenizer.ggml.token_type".into(),
            T_ARRAY,
            i32_array(&types),
        ),
        (
            "tokenizer.ggml.bos_token_id".into(),
            T_U32,
            1u32.to_le_bytes().to_vec(),
        ),
        (
            "tokenizer.ggml.eos_token_id".into(),
            T_U32,
            2u32.to_le_bytes().to_vec(),
        ),
        (
            "tokenizer.ggml.unknown_token_id".into(),
            T_U32,
            0u32.to_le_bytes().to_vec(),
        ),
    ]
}

#[test]
fn a_sentencepiece_gguf_vocabulary_merges_by_score_with_byte_fallback() {
    let tok = Tokenizer::from_gguf(&gguf_file(&spm_metadata(), "spm")).unwrap();
    let id = |p: &str| tok.token_to_id(p).unwrap();
    let byte = |b: u8| 3 + u32::from(b);
    // "▁hello▁world": ll, he, llo, ▁he, ▁hello, ▁w, or in score order.
    assert_eq!(
        tok.encode("hello world", false).unwrap(),
        [id("▁hello"), id("▁w"), id("or"), id("l"), id("d")]
    );
    // "ab" scores higher than "bc", so it merges first.
    assert_eq!(
        tok.encode("abc", false).unwrap(),
        [id("▁"), id("ab"), id("c")]
    );
    // A bos token by default; '€' is not a piece: its three UTF-8 bytes.
    let e = tok.encode("hello €", true).unwrap();
    assert_eq!(
        e,
        [1, id("▁hello"), id("▁"), byte(0xE2), byte(0x82), byte(0xAC)]
    );
    assert_eq!(tok.decode(&e, true).unwrap(), "hello €");
    assert_eq!(tok.decode(&e, false).unwrap(), "<s> hello €");
    assert_eq!(tok.special_tokens().len(), 3);
    // Without the bos/eos/unknown ids, llama.cpp's defaults for this kind of
    // vocabulary (bos 1, eos 2, unknown 0) apply.
    let mut bare = spm_metadata();
    for key in ["bos", "eos", "unknown"] {
        bare = with(&bare, &format!("tokenizer.ggml.{key}_token_id"), None);
    }
    let bare = Tokenizer::from_gguf(&gguf_file(&bare, "spm-bare")).unwrap();
    assert_eq!(bare.encode("hello €", true).unwrap(), e);
    // Without the space prefix.
    let meta = with(
        &spm_metadata(),
        "tokenizer.ggml.add_space_prefix",
        Some((T_BOOL, vec![0])),
    );
    let tok = Tokenizer::from_gguf(&gguf_file(&meta, "spm-noprefix")).unwrap();
    assert_eq!(
        tok.encode("hello", false).unwrap(),
        [
            tok.token_to_id("he").unwrap(),
            tok.token_to_id("llo").unwrap()
        ]
    );
    assert_eq!(
        tok.decode(&tok.encode("hello", true).unwrap(), true)
            .unwrap(),
        "hello"
    );
}

#[test]
fn malformed_gguf_tokenizer_metadata_is_refused_by_key() {
    let gpt2 = gpt2_metadata(&dir());
    let spm = spm_metadata();
    let cases: Vec<(Meta, &str, &str)> = vec![
        (
            with(
                &gpt2,
                "tokenizer.ggml.model",
                Some((T_STRING, str_value("bert"))),
            ),
            "tokenizer.ggml.model",
            "\"bert\" is not supported",
        ),
        (
            with(&gpt2, "tokenizer.ggml.model", None),
            "tokenizer.ggml.model",
            "missing",
        ),
        (
            with(
                &gpt2,
                "tokenizer.ggml.pre",
                Some((T_STRING, str_value("falcon"))),
            ),
            "tokenizer.ggml.pre",
            "\"falcon\"",
        ),
        (
            with(
                &gpt2,
                "tokenizer.ggml.tokens",
                Some((T_ARRAY, i32_array(&[1, 2]))),
            ),
            "tokenizer.ggml.tokens",
            "element 0",
        ),
        (
            with(&gpt2, "tokenizer.ggml.tokens", Some((T_U32, vec![0; 4]))),
            "tokenizer.ggml.tokens",
            "an array was expected",
        ),
        (
            with(
                &gpt2,
                "tokenizer.ggml.token_type",
                Some((T_ARRAY, i32_array(&[1; 5]))),
            ),
            "tokenizer.ggml.token_type",
            "5 entries for 320 tokens",
        ),
        (
            with(
                &gpt2,
                "tokenizer.ggml.merges",
                Some((T_ARRAY, str_array(&["h e".into(), "he".into()]))),
            ),
            "tokenizer.ggml.merges",
            "element 1",
        ),
        (
            // "t" and "h" are tokens, "th" is not.
            with(
                &gpt2,
                "tokenizer.ggml.merges",
                Some((T_ARRAY, str_array(&["h e".into(), "t h".into()]))),
            ),
            "tokenizer.ggml.merges",
            "element 1 \"t h\"",
        ),
        (
            with(&gpt2, "tokenizer.ggml.merges", None),
            "tokenizer.ggml.merges",
            "missing",
        ),
        (
            with(
                &gpt2,
                "tokenizer.ggml.bos_token_id",
                Some((T_U32, 320u32.to_le_bytes().to_vec())),
            ),
            "tokenizer.ggml.bos_token_id",
            "not a token id",
        ),
        (
            with(&spm, "tokenizer.ggml.scores", None),
            "tokenizer.ggml.scores",
            "missing",
        ),
        (
            with(
                &spm,
                "tokenizer.ggml.scores",
                Some((T_ARRAY, f32_array(&[0.0; 3]))),
            ),
            "tokenizer.ggml.scores",
            "3 entries",
        ),
        (
            with(
                &spm,
                "tokenizer.ggml.scores",
                Some((T_ARRAY, str_array(&vec!["x".to_string(); 279]))),
            ),
            "tokenizer.ggml.scores",
            "not an f32",
        ),
        (
            with(
                &spm,
                "tokenizer.ggml.add_space_prefix",
                Some((T_U32, vec![1, 0, 0, 0])),
            ),
            "tokenizer.ggml.add_space_prefix",
            "a bool was expected",
        ),
    ];
    for (i, (meta, key, what)) in cases.iter().enumerate() {
        let file = gguf_file(meta, &format!("bad{i}"));
        match Tokenizer::from_gguf(&file) {
            Err(e @ LlmError::BadFile { .. }) => {
                let s = e.to_string();
                assert!(s.contains(key) && s.contains(what), "case {i}: {s}");
                assert!(s.contains("tok.gguf"), "case {i}: {s}");
            }
            other => panic!("case {i} ({key}): expected an error, got {other:?}"),
        }
    }
}

/// `tokenizer.ggml.pre` selects the split before the merges: with the merges
/// `3 4`, `1 2`, `12 3`, `4 5` (in this order), "12345" is one GPT-2 piece
/// (12 34 5), Llama 3's groups of three digits (123 45), one digit per piece for
/// Qwen2 and SmolLM.
#[test]
fn the_pre_tokenizer_follows_tokenizer_ggml_pre() {
    let tokens: Vec<String> = ["1", "2", "3", "4", "5", "12", "34", "123", "45"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let merges: Vec<String> = ["3 4", "1 2", "12 3", "4 5"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let base: Meta = vec![
        ("tokenizer.ggml.model".into(), T_STRING, str_value("gpt2")),
        ("tokenizer.ggml.tokens".into(), T_ARRAY, str_array(&tokens)),
        ("tokenizer.ggml.merges".into(), T_ARRAY, str_array(&merges)),
        (
            "tokenizer.ggml.bos_token_id".into(),
            T_U32,
            0u32.to_le_bytes().to_vec(),
        ),
    ];
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    for (pre, want, bos) in [
        (Some("gpt-2"), vec!["12", "34", "5"], false),
        (None, vec!["12", "34", "5"], false),
        (Some("llama-bpe"), vec!["123", "45"], true),
        (Some("qwen2"), vec!["1", "2", "3", "4", "5"], false),
        (Some("smollm"), vec!["1", "2", "3", "4", "5"], false),
    ] {
        let meta = with(
            &base,
            "tokenizer.ggml.pre",
            pre.map(|p| (T_STRING, str_value(p))),
        );
        let tok = Tokenizer::from_gguf(&gguf_file(&meta, pre.unwrap_or("none"))).unwrap();
        let want: Vec<u32> = want.iter().map(|t| id(t)).collect();
        assert_eq!(tok.encode("12345", false).unwrap(), want, "{pre:?}");
        // Llama 3 adds its bos token by default, the others add nothing.
        let with_special = tok.encode("12345", true).unwrap();
        assert_eq!(with_special.len(), want.len() + bos as usize, "{pre:?}");
        assert_eq!(tok.decode(&want, true).unwrap(), "12345");
    }
}
