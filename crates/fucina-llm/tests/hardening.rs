//! What a hostile or careless model file or caller could once turn into an
//! abort, a hang or a silently wrong model: layer counts of 2^40, FIFOs in place
//! of model files, RoPE factors that vanish or overflow as f32, a cache of a
//! longer model, a sampler scratch of 2^45 tokens, weight constructors given
//! lengths that disagree with their shapes; and a sweep of `config.json` values
//! at the edges of f32 and u64 through `Model::load` and one prefill. Cases that
//! used to abort or hang run in a child process with a timeout.

use std::path::{Path, PathBuf};

use fucina::ExecContext;
use fucina::exec::{QuantFormat, WeightFormat};
use fucina_llm::sample::{Sampler, SamplingParams};
use fucina_llm::{LlmError, Model, ModelConfig, RopeScaling, Tokenizer, Weight, WeightStore};
use serde_json::{Value, json};

#[path = "../../fucina-exec/tests/child_process/mod.rs"]
#[macro_use]
mod child_process;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fresh directory holding links to every file of the fixture `name`
/// (`config.json` copied, so a test may rewrite it).
fn fixture_copy(name: &str, test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("llm-hardening-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let from = entry.unwrap().path();
        let to = dir.join(from.file_name().unwrap());
        if from.file_name().unwrap() == "config.json" {
            std::fs::copy(&from, &to).unwrap();
        } else {
            std::os::unix::fs::symlink(&from, &to).unwrap();
        }
    }
    dir
}

fn read_config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn write_config(dir: &Path, cfg: &Value) {
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

/// Replaces `dir/name` with a FIFO that nothing ever writes.
fn fifo_in_place_of(dir: &Path, name: &str) {
    use std::os::unix::ffi::OsStrExt;
    let path = dir.join(name);
    std::fs::remove_file(&path).unwrap();
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

// ---- layer counts that would size allocations ----

#[test]
fn a_huge_layer_count_is_an_err_not_an_abort() {
    in_child!("a_huge_layer_count_is_an_err_not_an_abort");
    let dir = fixture_copy("llama_f32", "layers");
    for layers in [json!(1u64 << 40), json!(u64::MAX), json!(3)] {
        let mut cfg = read_config(&dir);
        cfg["num_hidden_layers"] = layers.clone();
        write_config(&dir, &cfg);
        let e = Model::load(&dir).unwrap_err().to_string();
        assert!(
            e.contains(&format!("declares {layers} layers")) && e.contains("model.layers."),
            "{layers}: {e}"
        );
    }
}

#[test]
fn a_qwen2_config_with_a_huge_layer_count_parses_without_a_vector_per_layer() {
    in_child!("a_qwen2_config_with_a_huge_layer_count_parses_without_a_vector_per_layer");
    let dir = fixture_copy("qwen2_f32", "qwen2-layers");
    let layers = 1u64 << 40;
    let mut cfg = read_config(&dir);
    cfg["num_hidden_layers"] = json!(layers);
    cfg.as_object_mut().unwrap().remove("layer_types");
    write_config(&dir, &cfg);
    let parsed = ModelConfig::from_file(dir.join("config.json")).unwrap();
    assert_eq!(parsed.num_hidden_layers as u64, layers);
    assert!(Model::load(&dir).is_err());
    // A window on the layers from `max_window_layers` on: every layer slides
    // (0), none does (the count or more), or the mix is refused.
    cfg["use_sliding_window"] = json!(true);
    cfg["sliding_window"] = json!(4);
    for (max_window_layers, window) in [(0, Some(4)), (layers, None), (layers + 5, None)] {
        cfg["max_window_layers"] = json!(max_window_layers);
        let c = ModelConfig::parse(&cfg.to_string(), "config.json").unwrap();
        assert_eq!(c.sliding_window, window, "{max_window_layers}");
    }
    cfg["max_window_layers"] = json!(layers / 2);
    let e = ModelConfig::parse(&cfg.to_string(), "config.json").unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("layer {} differs from layer 0", layers / 2)),
        "{e}"
    );
}

// ---- files that are not regular files ----

#[test]
fn a_fifo_in_place_of_a_model_file_is_an_err_not_a_hang() {
    in_child!("a_fifo_in_place_of_a_model_file_is_an_err_not_a_hang");
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        let dir = fixture_copy("llama_f32", &format!("fifo-{file}"));
        fifo_in_place_of(&dir, file);
        let e = match file {
            "tokenizer.json" => Tokenizer::from_file(dir.join(file)).unwrap_err(),
            _ => Model::load(&dir).unwrap_err(),
        };
        assert!(
            matches!(&e, LlmError::BadFile { path, reason }
                if path.ends_with(file) && reason.contains("not a regular file (a FIFO)")),
            "{file}: {e}"
        );
    }
    // A shard of a sharded model names the shard and a tensor it should hold.
    let dir = fixture_copy("mistral_f32", "fifo-shard");
    fifo_in_place_of(&dir, "model-00002-of-00003.safetensors");
    let e = Model::load(&dir).unwrap_err();
    assert!(
        matches!(&e, LlmError::BadTensorInFile { path, reason, .. }
            if path.ends_with("model-00002-of-00003.safetensors") && reason.contains("FIFO")),
        "{e}"
    );
    // A GGUF file, and a directory where a file is expected.
    let dir = fixture_copy("llama_f32", "fifo-gguf");
    std::fs::write(dir.join("model.gguf"), b"GGUF").unwrap();
    fifo_in_place_of(&dir, "model.gguf");
    let e = fucina_llm::gguf::GgufFile::open(dir.join("model.gguf")).unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
    let e = ModelConfig::from_file(&dir).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

// ---- RoPE factors checked as the f32 values the model uses ----

#[test]
fn rope_factors_that_vanish_or_overflow_in_f32_are_refused() {
    let base = read_config(&fixture("llama_f32"));
    let parse = |rope: Value| {
        let mut cfg = base.clone();
        cfg.as_object_mut().unwrap().remove("rope_parameters");
        cfg["rope_scaling"] = rope;
        ModelConfig::parse(&cfg.to_string(), "config.json")
    };
    let llama3 = |factor: f64, low: f64, high: f64| {
        json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
               "high_freq_factor": high, "original_max_position_embeddings": 64})
    };
    let cases = [
        (json!({"type": "linear", "factor": 1e-50}), "factor"),
        (json!({"type": "linear", "factor": 1e39}), "factor"),
        (llama3(1e-50, 1.0, 4.0), "factor"),
        (llama3(8.0, 1e-50, 4.0), "low_freq_factor"),
        (llama3(8.0, 1.0, 1e39), "high_freq_factor"),
    ];
    for (rope, key) in cases {
        let e = parse(rope.clone()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("rope_scaling.{key}")) && e.contains("not a positive finite f32"),
            "{rope}: {e}"
        );
    }
    assert!(parse(json!({"type": "linear", "factor": 2.0})).is_ok());

    // A configuration built in code (or read from a GGUF file) is checked by
    // the model.
    let dir = fixture("llama_f32");
    let good = ModelConfig::from_file(dir.join("config.json")).unwrap();
    let bad = [
        RopeScaling::Linear { factor: 0.0 },
        RopeScaling::Linear {
            factor: f32::INFINITY,
        },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: f32::INFINITY,
            high_freq_factor: f32::INFINITY,
            original_max_position_embeddings: 64,
        },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 4.0,
            high_freq_factor: 1.0,
            original_max_position_embeddings: 64,
        },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 0,
        },
    ];
    for scaling in bad {
        let cfg = ModelConfig {
            rope_scaling: scaling,
            ..good.clone()
        };
        let e = Model::from_parts(cfg, WeightStore::open(&dir).unwrap()).unwrap_err();
        assert!(e.to_string().contains("RoPE"), "{scaling:?}: {e}");
    }
}

// ---- a cache checked against the model that uses it ----

#[test]
fn a_cache_longer_than_the_models_context_is_refused() {
    let dir = fixture("llama_f32");
    let cfg = ModelConfig::from_file(dir.join("config.json")).unwrap();
    let short = Model::from_parts(
        ModelConfig {
            max_position_embeddings: 4,
            ..cfg.clone()
        },
        WeightStore::open(&dir).unwrap(),
    )
    .unwrap();
    let long = Model::from_parts(cfg, WeightStore::open(&dir).unwrap()).unwrap();
    let ctx = ExecContext::with_threads(1);
    let vocab = short.config().vocab_size;
    let mut cache = long.new_cache(&ctx, 8).unwrap();
    let mut last = vec![0.0f32; vocab];
    let prompt: Vec<u32> = (0..8).collect();
    let e = short
        .prefill(&ctx, &mut cache, &prompt, None, &mut last)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("8 positions, more than the model's max_position_embeddings 4"),
        "{e}"
    );
    assert!(cache.is_empty(), "a refused prefill stores nothing");
    // Its own cache of 4 positions takes 4 tokens.
    let mut own = short.new_cache(&ctx, 4).unwrap();
    short
        .prefill(&ctx, &mut own, &prompt[..4], None, &mut last)
        .unwrap();
}

// ---- sampler scratch ----

#[test]
fn a_sampler_for_a_huge_vocabulary_is_an_err_not_an_abort() {
    in_child!("a_sampler_for_a_huge_vocabulary_is_an_err_not_an_abort");
    for vocab in [1usize << 45, u32::MAX as usize + 1, usize::MAX] {
        let e = Sampler::with_vocab(SamplingParams::default(), vocab).unwrap_err();
        assert!(
            e.to_string().contains("more than u32 token ids"),
            "{vocab}: {e}"
        );
    }
    assert!(Sampler::with_vocab(SamplingParams::default(), 1000).is_ok());
}

// ---- weight constructors ----

#[test]
fn weight_constructors_check_lengths_against_shapes() {
    let e = Weight::from_f32(WeightFormat::F32, &[2, 3], &[0.0; 5]).unwrap_err();
    assert!(
        e.to_string()
            .contains("5 values for shape [2, 3] of 6 elements"),
        "{e}"
    );
    let e = Weight::from_f32(WeightFormat::BF16, &[1 << 62, 4], &[]).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    let w = Weight::from_f32(WeightFormat::F16, &[2, 3], &[1.0; 6]).unwrap();
    assert_eq!(w.bytes().len(), 12);
    // 2^62 · 4 elements of 4 bytes wrap to 0 bytes in unchecked arithmetic.
    let e = Weight::from_bytes("w", WeightFormat::F32, &[1 << 62, 4], vec![]).unwrap_err();
    assert!(e.to_string().contains("overflows usize"), "{e}");
    let e = Weight::from_bytes("w", WeightFormat::F32, &[2, 2], vec![0; 15]).unwrap_err();
    assert!(e.to_string().contains("15 bytes"), "{e}");
}

/// `Weight::quantized` in every block format: bytes one short of the shape's
/// blocks, columns that are not whole blocks, and a shape that is not a
/// matrix are each an error naming the weight; the exact size is accepted.
#[test]
fn quantized_weight_constructors_check_every_format() {
    for q in QuantFormat::ALL {
        let (e, b) = (q.block_elements(), q.block_bytes());
        let ok = Weight::quantized("w", q, &[3, 2 * e], vec![0; 6 * b]).unwrap();
        assert_eq!(ok.quant_format(), Some(q));
        let short = Weight::quantized("w.short", q, &[3, 2 * e], vec![0; 6 * b - 1]).unwrap_err();
        assert!(
            matches!(short, LlmError::BadTensor { ref name, .. } if name == "w.short")
                && short.to_string().contains(&(6 * b).to_string()),
            "{q:?}: {short}"
        );
        let cols = Weight::quantized("w.cols", q, &[2, e / 2], vec![0; b]).unwrap_err();
        assert!(
            matches!(cols, LlmError::BadTensor { ref name, .. } if name == "w.cols")
                && cols.to_string().contains(&e.to_string()),
            "{q:?}: {cols}"
        );
        let rank = Weight::quantized("w.rank", q, &[e], vec![0; b]).unwrap_err();
        assert!(
            matches!(rank, LlmError::BadTensor { ref name, .. } if name == "w.rank"),
            "{q:?}: {rank}"
        );
    }
}

// ---- a sweep of config.json values at the edges ----

/// Every numeric key of a Llama config, set in turn to each value at the edges
/// of f32, u32 and u64 (and to values of the wrong type), loads and prefills
/// four tokens with finite logits, or is an `Err`: never a panic, an abort or
/// a NaN.
#[test]
fn config_values_at_the_edges_load_or_are_refused() {
    in_child!("config_values_at_the_edges_load_or_are_refused");
    let dir = fixture_copy("llama_f32", "edges");
    let base = read_config(&dir);
    let keys: &[&[&str]] = &[
        &["hidden_size"],
        &["intermediate_size"],
        &["num_hidden_layers"],
        &["num_attention_heads"],
        &["num_key_value_heads"],
        &["head_dim"],
        &["vocab_size"],
        &["max_position_embeddings"],
        &["rms_norm_eps"],
        &["bos_token_id"],
        &["eos_token_id"],
        &["rope_parameters", "rope_theta"],
        &["rope_scaling", "factor"],
        &["rope_scaling", "original_max_position_embeddings"],
        &["rope_scaling", "low_freq_factor"],
        &["rope_scaling", "high_freq_factor"],
    ];
    let values = [
        json!(0),
        json!(1),
        json!(2),
        json!(3),
        json!(-1),
        json!(0.5),
        json!(1u64 << 31),
        json!((1u64 << 32) + 1),
        json!(1u64 << 53),
        json!(1u64 << 63),
        json!(u64::MAX),
        json!(-9.2e18),
        json!(1e-45),
        json!(1e-300),
        json!(3.4028235e38),
        json!(1e39),
        json!(1e308),
        json!(null),
        json!("4"),
        json!(true),
        json!([1, 2]),
    ];
    let ctx = ExecContext::with_threads(1);
    let (mut loaded, mut refused) = (0, 0);
    for key in keys {
        for value in &values {
            let mut cfg = base.clone();
            if key[0] == "rope_scaling" {
                // A llama3 scaling whose fields the sweep then edits.
                cfg["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64});
            }
            match key {
                [k] => cfg[*k] = value.clone(),
                [o, k] => cfg[*o][*k] = value.clone(),
                _ => unreachable!(),
            }
            write_config(&dir, &cfg);
            let what = format!("{} = {value}", key.join("."));
            let model = match Model::load(&dir) {
                Ok(m) => m,
                Err(_) => {
                    refused += 1;
                    continue;
                }
            };
            let c = model.config();
            let Ok(mut cache) = model.new_cache(&ctx, c.max_position_embeddings.min(4)) else {
                refused += 1;
                continue;
            };
            let vocab = c.vocab_size;
            let prompt: Vec<u32> = (0..cache.capacity() as u32)
                .map(|i| (i * 37 + 5) % vocab as u32)
                .collect();
            let mut last = vec![0.0f32; vocab];
            match model.prefill(&ctx, &mut cache, &prompt, None, &mut last) {
                Ok(()) => {
                    assert!(
                        last.iter().all(|l| l.is_finite()),
                        "{what}: non-finite logits {:?}",
                        &last[..8]
                    );
                    loaded += 1;
                }
                Err(_) => refused += 1,
            }
        }
    }
    // Both outcomes occur (the sweep reaches the prefill).
    assert!(
        loaded > 20 && refused > 100,
        "{loaded} loaded, {refused} refused"
    );
}
