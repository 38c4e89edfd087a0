//! Writes a Hugging Face `tokenizer.json` into GGUF metadata the way llama.cpp's
//! `convert_hf_to_gguf.py` does for a byte-level BPE ("gpt2") vocabulary: the
//! token list by id (ids the vocabulary lacks become `[PAD<id>]` of type
//! UNUSED), token types (added special tokens CONTROL, other added tokens
//! USER_DEFINED, the rest NORMAL), the merges as `"left right"` strings, the
//! bos/eos ids from `config.json` and `add_bos_token` from the post-processor's
//! template.

#![allow(dead_code)]

use std::path::Path;

use serde_json::Value;

use crate::gguf_support::{Writer, string};

/// GGUF metadata value types.
pub(crate) const T_U32: u32 = 4;
pub(crate) const T_I32: u32 = 5;
pub(crate) const T_F32: u32 = 6;
pub(crate) const T_BOOL: u32 = 7;
pub(crate) const T_STRING: u32 = 8;
pub(crate) const T_ARRAY: u32 = 9;

pub(crate) fn str_value(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    string(&mut out, s);
    out
}

/// An ARRAY value of strings.
pub(crate) fn str_array(items: &[String]) -> Vec<u8> {
    let mut out = T_STRING.to_le_bytes().to_vec();
    out.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for s in items {
        string(&mut out, s);
    }
    out
}

/// An ARRAY value of INT32.
pub(crate) fn i32_array(items: &[i32]) -> Vec<u8> {
    let mut out = T_I32.to_le_bytes().to_vec();
    out.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for v in items {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// An ARRAY value of FLOAT32.
pub(crate) fn f32_array(items: &[f32]) -> Vec<u8> {
    let mut out = T_F32.to_le_bytes().to_vec();
    out.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for v in items {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// The `tokenizer.ggml.*` entries, `(key, type, value bytes)`, of the model
/// directory `dir` (its `tokenizer.json` and `config.json`), as the converter
/// writes them for a byte-level BPE tokenizer with the GPT-2 pre-tokenizer.
pub(crate) fn gpt2_metadata(dir: &Path) -> Vec<(String, u32, Vec<u8>)> {
    let tok: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap())
            .unwrap();
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let model = &tok["model"];
    assert_eq!(model["type"], "BPE");
    let vocab_size = cfg["vocab_size"].as_u64().unwrap() as usize;
    let mut by_id: Vec<Option<String>> = vec![None; vocab_size];
    for (t, id) in model["vocab"].as_object().unwrap() {
        by_id[id.as_u64().unwrap() as usize] = Some(t.clone());
    }
    let mut types = vec![1i32; vocab_size];
    for a in tok["added_tokens"].as_array().unwrap() {
        let id = a["id"].as_u64().unwrap() as usize;
        by_id[id] = Some(a["content"].as_str().unwrap().to_string());
        let content = a["content"].as_str().unwrap();
        let looks_special = content.starts_with("<|") && content.ends_with("|>");
        types[id] = if a["special"].as_bool().unwrap() || looks_special {
            3
        } else {
            4
        };
    }
    let tokens: Vec<String> = by_id
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.unwrap_or_else(|| {
                types[i] = 5;
                format!("[PAD{i}]")
            })
        })
        .collect();
    let merges: Vec<String> = model["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            other => panic!("merge {other}"),
        })
        .collect();
    // add_bos_token: the post-processor's single template starts with a special token.
    let single = tok["post_processor"]["single"].as_array().unwrap();
    let add_bos = single.first().unwrap().get("SpecialToken").is_some();
    let add_eos = single.last().unwrap().get("SpecialToken").is_some();
    let u32v = |v: &Value| (v.as_u64().unwrap() as u32).to_le_bytes().to_vec();
    vec![
        ("tokenizer.ggml.model".into(), T_STRING, str_value("gpt2")),
        ("tokenizer.ggml.pre".into(), T_STRING, str_value("gpt-2")),
        ("tokenizer.ggml.tokens".into(), T_ARRAY, str_array(&tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            T_ARRAY,
            i32_array(&types),
        ),
        ("tokenizer.ggml.merges".into(), T_ARRAY, str_array(&merges)),
        (
            "tokenizer.ggml.bos_token_id".into(),
            T_U32,
            u32v(&cfg["bos_token_id"]),
        ),
        (
            "tokenizer.ggml.eos_token_id".into(),
            T_U32,
            u32v(&cfg["eos_token_id"]),
        ),
        (
            "tokenizer.ggml.add_bos_token".into(),
            T_BOOL,
            vec![add_bos as u8],
        ),
        (
            "tokenizer.ggml.add_eos_token".into(),
            T_BOOL,
            vec![add_eos as u8],
        ),
    ]
}

/// A GGUF image holding only `meta` (no tensors).
pub(crate) fn metadata_only(meta: &[(String, u32, Vec<u8>)]) -> Vec<u8> {
    let mut w = Writer::default();
    w.kv("general.architecture", T_STRING, &str_value("llama"));
    for (k, t, v) in meta {
        w.kv(k, *t, v);
    }
    w.bytes()
}
