//! Loading: `config.json` / `generation_config.json` parsing (every key variant
//! and every refusal) and memory-mapped safetensors files (single and sharded,
//! every malformed file a specific error naming the file and the tensor).

use std::path::{Path, PathBuf};

use fucina::exec::WeightFormat;
use fucina_llm::config::GENERATION_CONFIG_FILE;
use fucina_llm::{Architecture, GenerationConfig, LlmError, ModelConfig, RopeScaling, WeightStore};
use serde_json::{Value, json};

/// A fresh empty directory for one test.
fn tmp_dir(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("llm-load-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------

/// A small valid config of `arch` (the required keys only).
fn base(arch: &str) -> Value {
    json!({
        "architectures": [arch],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
    })
}

/// `cfg` with `key` set to `value` (`Value::Null` included) or, for `None`,
/// removed.
fn with(mut cfg: Value, key: &str, value: Option<Value>) -> Value {
    let map = cfg.as_object_mut().unwrap();
    match value {
        Some(v) => {
            map.insert(key.to_string(), v);
        }
        None => {
            map.remove(key);
        }
    }
    cfg
}

fn parse(cfg: &Value) -> Result<ModelConfig, LlmError> {
    ModelConfig::parse(&cfg.to_string(), "dir/config.json")
}

/// The reason of a `BadFile` error for `dir/config.json`, asserting the variant
/// and the path.
fn config_err(cfg: &Value) -> String {
    match parse(cfg) {
        Err(LlmError::BadFile { path, reason }) => {
            assert_eq!(path, Path::new("dir/config.json"));
            reason
        }
        other => panic!("expected BadFile, got {other:?}"),
    }
}

#[test]
fn llama_defaults_are_those_of_transformers() {
    let c = parse(&base("LlamaForCausalLM")).unwrap();
    assert_eq!(
        c,
        ModelConfig {
            architecture: Architecture::Llama,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 4,
            head_dim: 16,
            vocab_size: 100,
            max_position_embeddings: 2048,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: false,
            qkv_bias: false,
            o_bias: false,
            sliding_window: None,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            params: Default::default(),
        }
    );
}

#[test]
fn a_full_llama_config_is_read_as_written() {
    let cfg = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000,
        "rope_scaling": null,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "mlp_bias": false,
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 0,
        "torch_dtype": "bfloat16",
        "pretraining_tp": 1,
    });
    let c = parse(&cfg).unwrap();
    assert_eq!(c.num_key_value_heads, 3);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.max_position_embeddings, 8192);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.bos_token_id, Some(0));
    assert_eq!(c.eos_token_ids, [0]);
}

#[test]
fn an_explicit_head_dim_need_not_divide_the_width() {
    // Qwen2 and Mistral take head_dim as given.
    let cfg = with(base("MistralForCausalLM"), "hidden_size", Some(json!(60)));
    let cfg = with(cfg, "num_key_value_heads", Some(json!(2)));
    let c = parse(&with(cfg, "head_dim", Some(json!(32)))).unwrap();
    assert_eq!((c.hidden_size, c.head_dim), (60, 32));
}

#[test]
fn qwen2_defaults_and_biases() {
    let c = parse(&with(
        base("Qwen2ForCausalLM"),
        "num_attention_heads",
        Some(json!(32)),
    ))
    .unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    // Absent: the class default of 32; null: the query heads.
    assert_eq!(c.num_key_value_heads, 32);
    assert_eq!(c.head_dim, 2);
    assert_eq!(c.max_position_embeddings, 32768);
    assert!(c.qkv_bias && !c.o_bias);
    assert_eq!(c.bos_token_id, None);
    assert!(c.eos_token_ids.is_empty());
    assert_eq!(c.sliding_window, None);
    let c = parse(&with(
        base("Qwen2ForCausalLM"),
        "num_key_value_heads",
        Some(Value::Null),
    ))
    .unwrap();
    assert_eq!(c.num_key_value_heads, 4);
    let c = parse(&with(
        base("Qwen2ForCausalLM"),
        "num_key_value_heads",
        Some(json!(2)),
    ))
    .unwrap();
    assert_eq!(c.num_key_value_heads, 2);
}

#[test]
fn mistral_window_and_defaults() {
    let m = with(
        base("MistralForCausalLM"),
        "num_key_value_heads",
        Some(json!(2)),
    );
    let c = parse(&m).unwrap();
    assert_eq!(c.architecture, Architecture::Mistral);
    assert_eq!(c.sliding_window, Some(4096)); // the class default
    assert_eq!(c.max_position_embeddings, 131072);
    assert!(!c.qkv_bias && !c.o_bias);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.as_slice()),
        (Some(1), &[2][..])
    );
    let c = parse(&with(m.clone(), "sliding_window", Some(Value::Null))).unwrap();
    assert_eq!(c.sliding_window, None);
    let c = parse(&with(m.clone(), "sliding_window", Some(json!(256)))).unwrap();
    assert_eq!(c.sliding_window, Some(256));
    assert!(
        config_err(&with(m.clone(), "sliding_window", Some(json!(0)))).contains("sliding_window")
    );
    // Absent key/value heads: the class default of 8 (which does not divide 4).
    let r = config_err(&base("MistralForCausalLM"));
    assert!(r.contains("num_key_value_heads") && r.contains('8'), "{r}");
}

#[test]
fn qwen2_sliding_window_follows_use_sliding_window_and_max_window_layers() {
    let q = base("Qwen2ForCausalLM");
    let q = with(q, "num_key_value_heads", Some(json!(4)));
    let q = with(q, "sliding_window", Some(json!(32)));
    // Off unless use_sliding_window.
    assert_eq!(parse(&q).unwrap().sliding_window, None);
    let q = with(q, "use_sliding_window", Some(json!(true)));
    // Layers from max_window_layers on slide: 0 -> every layer.
    let all = with(q.clone(), "max_window_layers", Some(json!(0)));
    assert_eq!(parse(&all).unwrap().sliding_window, Some(32));
    // Past the last layer -> none (the default 28 with 2 layers too).
    assert_eq!(parse(&q).unwrap().sliding_window, None);
    let none = with(q.clone(), "max_window_layers", Some(json!(2)));
    assert_eq!(parse(&none).unwrap().sliding_window, None);
    // Some layers only: refused, naming the key.
    let mixed = with(q.clone(), "max_window_layers", Some(json!(1)));
    let r = config_err(&mixed);
    assert!(
        r.contains("max_window_layers") && r.contains("not supported"),
        "{r}"
    );
    // An explicit layer_types list decides.
    let lt = with(
        q.clone(),
        "layer_types",
        Some(json!(["sliding_attention", "sliding_attention"])),
    );
    assert_eq!(parse(&lt).unwrap().sliding_window, Some(32));
    let lt = with(
        q.clone(),
        "layer_types",
        Some(json!(["full_attention", "sliding_attention"])),
    );
    assert!(config_err(&lt).contains("layer_types"));
    let lt = with(q.clone(), "layer_types", Some(json!(["full_attention"])));
    assert!(config_err(&lt).contains("layer_types"));
    let lt = with(
        q.clone(),
        "layer_types",
        Some(json!(["chunked_attention", "full_attention"])),
    );
    assert!(config_err(&lt).contains("chunked_attention"));
    // A null window slides over nothing: full attention everywhere.
    let nw = with(all, "sliding_window", Some(Value::Null));
    assert_eq!(parse(&nw).unwrap().sliding_window, None);
}

#[test]
fn llama_attention_bias_and_mlp_bias() {
    let l = base("LlamaForCausalLM");
    let c = parse(&with(l.clone(), "attention_bias", Some(json!(true)))).unwrap();
    assert!(c.qkv_bias && c.o_bias);
    let r = config_err(&with(l.clone(), "mlp_bias", Some(json!(true))));
    assert!(r.contains("mlp_bias") && r.contains("not supported"), "{r}");
    let r = config_err(&with(l, "attention_bias", Some(json!("yes"))));
    assert!(r.contains("attention_bias"), "{r}");
}

#[test]
fn tied_and_untied_embeddings() {
    let l = base("LlamaForCausalLM");
    assert!(!parse(&l).unwrap().tie_word_embeddings);
    assert!(
        parse(&with(l.clone(), "tie_word_embeddings", Some(json!(true))))
            .unwrap()
            .tie_word_embeddings
    );
    assert!(
        !parse(&with(l, "tie_word_embeddings", Some(json!(false))))
            .unwrap()
            .tie_word_embeddings
    );
}

#[test]
fn eos_as_an_int_a_list_or_null() {
    let l = base("LlamaForCausalLM");
    assert_eq!(
        parse(&with(l.clone(), "eos_token_id", Some(json!(7))))
            .unwrap()
            .eos_token_ids,
        [7]
    );
    assert_eq!(
        parse(&with(
            l.clone(),
            "eos_token_id",
            Some(json!([128001, 128008, 128009]))
        ))
        .unwrap()
        .eos_token_ids,
        [128001, 128008, 128009]
    );
    assert!(
        parse(&with(l.clone(), "eos_token_id", Some(Value::Null)))
            .unwrap()
            .eos_token_ids
            .is_empty()
    );
    assert_eq!(
        parse(&with(l.clone(), "bos_token_id", Some(Value::Null)))
            .unwrap()
            .bos_token_id,
        None
    );
    let r = config_err(&with(l.clone(), "eos_token_id", Some(json!(-1))));
    assert!(r.contains("eos_token_id"), "{r}");
    let r = config_err(&with(l, "eos_token_id", Some(json!([1, "2"]))));
    assert!(r.contains("eos_token_id"), "{r}");
}

#[test]
fn old_rope_keys_linear() {
    let l = with(
        base("LlamaForCausalLM"),
        "rope_theta",
        Some(json!(500000.0)),
    );
    let c = parse(&with(
        l.clone(),
        "rope_scaling",
        Some(json!({"type": "linear", "factor": 4.0})),
    ))
    .unwrap();
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 4.0 });
    // `rope_type` as well as the older `type`.
    let c = parse(&with(
        l.clone(),
        "rope_scaling",
        Some(json!({"rope_type": "linear", "factor": 2})),
    ))
    .unwrap();
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
    let r = config_err(&with(
        l.clone(),
        "rope_scaling",
        Some(json!({"type": "linear"})),
    ));
    assert!(
        r.contains("rope_scaling.factor") && r.contains("missing"),
        "{r}"
    );
    let r = config_err(&with(
        l,
        "rope_scaling",
        Some(json!({"type": "linear", "factor": 0})),
    ));
    assert!(r.contains("rope_scaling.factor"), "{r}");
}

#[test]
fn old_rope_keys_llama3() {
    let scaling = json!({
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    });
    let l = with(
        base("LlamaForCausalLM"),
        "rope_theta",
        Some(json!(500000.0)),
    );
    let l = with(l, "max_position_embeddings", Some(json!(131072)));
    let c = parse(&with(l.clone(), "rope_scaling", Some(scaling.clone()))).unwrap();
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    );
    // Without original_max_position_embeddings: max_position_embeddings.
    let mut s = scaling.clone();
    s.as_object_mut()
        .unwrap()
        .remove("original_max_position_embeddings");
    let c = parse(&with(l.clone(), "rope_scaling", Some(s))).unwrap();
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            original_max_position_embeddings: 131072,
            ..
        }
    ));
    // A top-level original_max_position_embeddings wins over the object's.
    let top = with(
        l.clone(),
        "original_max_position_embeddings",
        Some(json!(4096)),
    );
    let c = parse(&with(top, "rope_scaling", Some(scaling.clone()))).unwrap();
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            original_max_position_embeddings: 4096,
            ..
        }
    ));
    // A missing band factor and inverted bands are refused, naming the key.
    let mut s = scaling.clone();
    s.as_object_mut().unwrap().remove("low_freq_factor");
    let r = config_err(&with(l.clone(), "rope_scaling", Some(s)));
    assert!(r.contains("rope_scaling.low_freq_factor"), "{r}");
    let mut s = scaling;
    s["high_freq_factor"] = json!(1.0);
    let r = config_err(&with(l, "rope_scaling", Some(s)));
    assert!(r.contains("rope_scaling.high_freq_factor"), "{r}");
}

#[test]
fn rope_parameters_of_transformers_5() {
    let l = base("LlamaForCausalLM");
    let c = parse(&with(
        l.clone(),
        "rope_parameters",
        Some(json!({"rope_type": "default", "rope_theta": 1000000.0})),
    ))
    .unwrap();
    assert_eq!(
        (c.rope_theta, c.rope_scaling),
        (1000000.0, RopeScaling::None)
    );
    // Without rope_theta inside: the top-level key, else 10000.
    let c = parse(&with(
        with(l.clone(), "rope_theta", Some(json!(20000))),
        "rope_parameters",
        Some(json!({"rope_type": "default"})),
    ))
    .unwrap();
    assert_eq!(c.rope_theta, 20000.0);
    let c = parse(&with(
        l.clone(),
        "rope_parameters",
        Some(json!({"rope_type": "default"})),
    ))
    .unwrap();
    assert_eq!(c.rope_theta, 10000.0);
    // The object's rope_theta wins over the top-level key.
    let c = parse(&with(
        with(l.clone(), "rope_theta", Some(json!(20000))),
        "rope_parameters",
        Some(json!({"rope_type": "default", "rope_theta": 30000})),
    ))
    .unwrap();
    assert_eq!(c.rope_theta, 30000.0);
    let c = parse(&with(
        l.clone(),
        "rope_parameters",
        Some(json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})),
    ))
    .unwrap();
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
    let c = parse(&with(
        l.clone(),
        "rope_parameters",
        Some(json!({
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        })),
    ))
    .unwrap();
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    );
    // rope_scaling wins over rope_parameters, as in transformers.
    let both = with(
        with(
            l.clone(),
            "rope_parameters",
            Some(json!({"rope_type": "linear", "factor": 2.0})),
        ),
        "rope_scaling",
        Some(json!({"type": "linear", "factor": 3.0})),
    );
    assert_eq!(
        parse(&both).unwrap().rope_scaling,
        RopeScaling::Linear { factor: 3.0 }
    );
    // Per-layer-type parameters are refused.
    let r = config_err(&with(
        l,
        "rope_parameters",
        Some(json!({"full_attention": {"rope_type": "default"}})),
    ));
    assert!(
        r.contains("rope_parameters") && r.contains("per layer type"),
        "{r}"
    );
}

#[test]
fn unsupported_rope_types_are_refused_by_name() {
    let l = base("LlamaForCausalLM");
    for (key, obj, ty) in [
        (
            "rope_scaling",
            json!({"type": "dynamic", "factor": 2.0}),
            "dynamic",
        ),
        (
            "rope_scaling",
            json!({"rope_type": "yarn", "factor": 4.0}),
            "yarn",
        ),
        (
            "rope_parameters",
            json!({"rope_type": "longrope", "rope_theta": 1e4}),
            "longrope",
        ),
    ] {
        let r = config_err(&with(l.clone(), key, Some(obj)));
        assert!(r.contains(&format!("`{ty}`")) && r.contains(key), "{r}");
    }
    let r = config_err(&with(l.clone(), "partial_rotary_factor", Some(json!(0.5))));
    assert!(r.contains("partial_rotary_factor"), "{r}");
    // Phi-3 reads it (Phi-4-mini), as an even number of a head's dimensions.
    let phi = |f: Value| with(base("Phi3ForCausalLM"), "partial_rotary_factor", Some(f));
    let c = parse(&phi(json!(0.75))).unwrap();
    assert_eq!(c.rotary_dim(), 3 * c.head_dim / 4);
    for bad in [json!(0.7), json!(1.5), json!(-0.5), json!(0.01)] {
        let r = config_err(&phi(bad.clone()));
        assert!(r.contains("partial_rotary_factor"), "{bad}: {r}");
    }
    let r = config_err(&with(l.clone(), "rope_scaling", Some(json!(4))));
    assert!(r.contains("rope_scaling"), "{r}");
    let r = config_err(&with(l, "rope_theta", Some(json!(-1.0))));
    assert!(r.contains("rope_theta"), "{r}");
}

#[test]
fn architectures_and_model_type() {
    let r = config_err(&base("GPT2LMHeadModel"));
    assert!(
        r.contains("GPT2LMHeadModel") && r.contains("architectures"),
        "{r}"
    );
    let err = parse(&base("BertModel")).unwrap_err().to_string();
    assert!(
        err.contains("dir/config.json") && err.contains("BertModel"),
        "{err}"
    );
    // A known one further down the list is taken.
    let cfg = with(
        base("X"),
        "architectures",
        Some(json!(["Foo", "Qwen2ForCausalLM"])),
    );
    let cfg = with(cfg, "num_key_value_heads", Some(json!(4)));
    assert_eq!(parse(&cfg).unwrap().architecture, Architecture::Qwen2);
    // Without `architectures`: `model_type`.
    let cfg = with(base("X"), "architectures", None);
    assert!(config_err(&cfg).contains("architectures"));
    let c = parse(&with(cfg.clone(), "model_type", Some(json!("llama")))).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    let r = config_err(&with(cfg, "model_type", Some(json!("gpt_neox"))));
    assert!(r.contains("gpt_neox"), "{r}");
    let r = config_err(&with(
        base("X"),
        "architectures",
        Some(json!("LlamaForCausalLM")),
    ));
    assert!(r.contains("architectures"), "{r}");
}

#[test]
fn missing_wrong_and_zero_sizes_are_refused_by_key() {
    let l = base("LlamaForCausalLM");
    for key in [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    ] {
        let r = config_err(&with(l.clone(), key, None));
        assert!(
            r.contains(&format!("`{key}`")) && r.contains("missing"),
            "{r}"
        );
        let r = config_err(&with(l.clone(), key, Some(json!("64"))));
        assert!(
            r.contains(&format!("`{key}`")) && r.contains("integer"),
            "{r}"
        );
        let r = config_err(&with(l.clone(), key, Some(json!(64.5))));
        assert!(r.contains(&format!("`{key}`")), "{r}");
        let r = config_err(&with(l.clone(), key, Some(json!(0))));
        assert!(
            r.contains(&format!("`{key}`")) && r.contains("positive"),
            "{r}"
        );
        let r = config_err(&with(l.clone(), key, Some(json!(-4))));
        assert!(r.contains(&format!("`{key}`")), "{r}");
    }
    for key in ["num_key_value_heads", "head_dim", "max_position_embeddings"] {
        let r = config_err(&with(l.clone(), key, Some(json!(0))));
        assert!(r.contains(&format!("`{key}`")), "{r}");
    }
    let r = config_err(&with(l.clone(), "rms_norm_eps", Some(json!("small"))));
    assert!(r.contains("rms_norm_eps"), "{r}");
    let r = config_err(&with(l, "tie_word_embeddings", Some(json!(1))));
    assert!(r.contains("tie_word_embeddings"), "{r}");
}

#[test]
fn heads_that_do_not_divide_are_refused() {
    let l = base("LlamaForCausalLM");
    let r = config_err(&with(l.clone(), "num_attention_heads", Some(json!(5))));
    assert!(
        r.contains("num_attention_heads") && r.contains("divide"),
        "{r}"
    );
    // transformers checks this for Llama even with head_dim given.
    let r = config_err(&with(
        with(l.clone(), "num_attention_heads", Some(json!(5))),
        "head_dim",
        Some(json!(16)),
    ));
    assert!(r.contains("num_attention_heads"), "{r}");
    let r = config_err(&with(l.clone(), "num_key_value_heads", Some(json!(3))));
    assert!(
        r.contains("num_key_value_heads") && r.contains("divide"),
        "{r}"
    );
    let r = config_err(&with(l.clone(), "num_key_value_heads", Some(json!(8))));
    assert!(r.contains("num_key_value_heads"), "{r}");
    let r = config_err(&with(l.clone(), "head_dim", Some(json!(15))));
    assert!(r.contains("head_dim") && r.contains("odd"), "{r}");
    let r = config_err(&with(l, "hidden_act", Some(json!("gelu"))));
    assert!(r.contains("hidden_act") && r.contains("gelu"), "{r}");
}

#[test]
fn bad_json_and_unreadable_files() {
    let r = match ModelConfig::parse("{\"hidden_size\": ", "dir/config.json") {
        Err(LlmError::BadFile { path, reason }) => {
            assert_eq!(path, Path::new("dir/config.json"));
            reason
        }
        other => panic!("{other:?}"),
    };
    assert!(r.contains("JSON"), "{r}");
    assert!(matches!(
        ModelConfig::parse("[1, 2]", "dir/config.json"),
        Err(LlmError::BadFile { .. })
    ));
    let dir = tmp_dir("config-missing");
    let path = dir.join("config.json");
    match ModelConfig::from_file(&path) {
        Err(LlmError::Io { path: p, .. }) => assert_eq!(p, path),
        other => panic!("{other:?}"),
    }
}

#[test]
fn generation_config_is_parsed_and_its_tokens_replace_the_configs() {
    let dir = tmp_dir("generation-config");
    let cfg = with(base("LlamaForCausalLM"), "eos_token_id", Some(json!(2)));
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    // Without generation_config.json: config.json's tokens.
    let c = ModelConfig::from_file(dir.join("config.json")).unwrap();
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );

    let generation = json!({
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128009],
        "do_sample": true,
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 50,
        "repetition_penalty": 1.1,
        "transformers_version": "4.45.0",
    });
    let gpath = dir.join(GENERATION_CONFIG_FILE);
    std::fs::write(&gpath, generation.to_string()).unwrap();
    let g = GenerationConfig::from_file(&gpath).unwrap();
    assert_eq!(
        g,
        GenerationConfig {
            bos_token_id: Some(128000),
            eos_token_ids: Some(vec![128001, 128009]),
            do_sample: Some(true),
            temperature: Some(0.6),
            top_k: Some(50),
            top_p: Some(0.9),
            repetition_penalty: Some(1.1),
        }
    );
    let c = ModelConfig::from_file(dir.join("config.json")).unwrap();
    assert_eq!(c.bos_token_id, Some(128000));
    assert_eq!(c.eos_token_ids, [128001, 128009]);

    // Keys it does not give keep config.json's values; an int eos is one id.
    std::fs::write(&gpath, json!({"eos_token_id": 5}).to_string()).unwrap();
    let c = ModelConfig::from_file(dir.join("config.json")).unwrap();
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![5])
    );
    let g = GenerationConfig::from_file(&gpath).unwrap();
    assert_eq!(g.temperature, None);
    assert_eq!(g.do_sample, None);

    // A bad generation_config.json fails the load, naming it and the key.
    for (key, v) in [
        ("top_p", json!(1.5)),
        ("temperature", json!(-1)),
        ("repetition_penalty", json!(0)),
        ("top_k", json!(-3)),
        ("do_sample", json!("yes")),
        ("eos_token_id", json!([1, -2])),
    ] {
        std::fs::write(&gpath, json!({ key: v }).to_string()).unwrap();
        match ModelConfig::from_file(dir.join("config.json")) {
            Err(LlmError::BadFile { path, reason }) => {
                assert_eq!(path, gpath);
                assert!(reason.contains(key), "{reason}");
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    std::fs::write(&gpath, "not json").unwrap();
    assert!(matches!(
        GenerationConfig::from_file(&gpath),
        Err(LlmError::BadFile { .. })
    ));
}

// ---------------------------------------------------------------------------
// safetensors
// ---------------------------------------------------------------------------

/// A tensor to write: name, dtype string, shape, raw data bytes.
struct T<'a> {
    name: &'a str,
    dtype: &'a str,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn t<'a>(name: &'a str, dtype: &'a str, shape: &[usize], data: Vec<u8>) -> T<'a> {
    T {
        name,
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

/// The bytes of a safetensors file holding `tensors` in the order given (the
/// header padded so that the data starts 8-byte aligned, as transformers
/// writes it).
fn st_bytes(tensors: &[T<'_>]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0;
    for t in tensors {
        header.insert(
            t.name.to_string(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.data.len()]}),
        );
        offset += t.data.len();
    }
    let mut h = Value::Object(header).to_string();
    while !h.len().is_multiple_of(8) {
        h.push(' ');
    }
    let data: Vec<u8> = tensors
        .iter()
        .flat_map(|t| t.data.iter().copied())
        .collect();
    st_raw(&h, &data)
}

/// A safetensors file from a header string and a data section.
fn st_raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| fucina::storage::half::f16::from_f32(x).to_le_bytes())
        .collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| fucina::storage::half::bf16::from_f32(x).to_le_bytes())
        .collect()
}

/// Three tensors of the three dtypes.
fn sample_tensors() -> Vec<T<'static>> {
    vec![
        t(
            "model.embed_tokens.weight",
            "BF16",
            &[3, 2],
            bf16_bytes(&[1.0, -2.0, 0.5, 3.0, -0.25, 8.0]),
        ),
        t("model.norm.weight", "F32", &[2], f32_bytes(&[1.5, -0.0])),
        t(
            "lm_head.weight",
            "F16",
            &[3, 2],
            f16_bytes(&[0.1, 0.2, -0.3, 1024.0, 6e-5, -1.0]),
        ),
    ]
}

fn open_err(dir: &Path) -> LlmError {
    match WeightStore::open(dir) {
        Ok(s) => panic!("opened a bad model: {} tensors", s.len()),
        Err(e) => e,
    }
}

/// Asserts `e` is a `BadTensorInFile` for `file` and `name` whose reason holds
/// every one of `words`.
fn assert_tensor_err(e: &LlmError, file: &Path, name: &str, words: &[&str]) {
    match e {
        LlmError::BadTensorInFile {
            path,
            name: n,
            reason,
        } => {
            assert_eq!(path, file, "{e}");
            assert_eq!(n, name, "{e}");
            for w in words {
                assert!(reason.contains(w), "{reason} lacks {w}");
            }
            let msg = e.to_string();
            assert!(
                msg.contains(&file.display().to_string()) && msg.contains(name),
                "{msg}"
            );
        }
        other => panic!("expected BadTensorInFile for {name}, got {other:?}"),
    }
}

fn assert_file_err(e: &LlmError, file: &Path, words: &[&str]) {
    match e {
        LlmError::BadFile { path, reason } => {
            assert_eq!(path, file, "{e}");
            for w in words {
                assert!(reason.contains(w), "{reason} lacks {w}");
            }
        }
        other => panic!("expected BadFile, got {other:?}"),
    }
}

#[test]
fn a_single_file_is_mapped_in_its_dtypes() {
    let dir = tmp_dir("single");
    let bytes = st_bytes(&sample_tensors());
    std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
    let store = WeightStore::open(&dir).unwrap();
    assert_eq!(store.len(), 3);
    assert_eq!(
        store.names().collect::<Vec<_>>(),
        [
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.norm.weight"
        ]
    );
    assert_eq!(store.file_bytes(), bytes.len() as u64);
    let files: Vec<_> = store.files().collect();
    assert_eq!(
        files,
        [(dir.join("model.safetensors").as_path(), bytes.len() as u64)]
    );
    assert_eq!(store.tensor_bytes(), 12 + 8 + 12);

    let e = store.get("model.embed_tokens.weight").unwrap();
    assert_eq!(e.format(), WeightFormat::BF16);
    assert_eq!(e.shape(), [3, 2]);
    assert!(e.is_mapped());
    assert_eq!(e.to_f32_vec(), [1.0, -2.0, 0.5, 3.0, -0.25, 8.0]);
    let n = store.get("model.norm.weight").unwrap();
    assert_eq!(n.format(), WeightFormat::F32);
    assert_eq!(
        n.to_f32_vec()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        [1.5f32.to_bits(), (-0.0f32).to_bits()]
    );
    let h = store.get("lm_head.weight").unwrap();
    assert_eq!(h.format(), WeightFormat::F16);
    let want: Vec<f32> = [0.1f32, 0.2, -0.3, 1024.0, 6e-5, -1.0]
        .iter()
        .map(|&v| fucina::storage::half::f16::from_f32(v).to_f32())
        .collect();
    assert_eq!(h.to_f32_vec(), want);
    let m = h.matrix().unwrap();
    assert_eq!((m.rows, m.cols, m.format), (3, 2, WeightFormat::F16));
    assert!(matches!(store.get("nope"), Err(LlmError::BadTensor { name, .. }) if name == "nope"));
    let m = store.matrix("model.embed_tokens.weight").unwrap();
    assert_eq!((m.rows, m.cols, m.format), (3, 2, WeightFormat::BF16));
    assert!(
        matches!(store.matrix("nope"), Err(LlmError::BadTensor { name, .. }) if name == "nope")
    );
    assert!(matches!(
        store.matrix("model.norm.weight"),
        Err(LlmError::BadTensor { name, reason }) if name == "model.norm.weight" && reason.contains("rank 1")
    ));
}

#[test]
fn mapped_bytes_are_the_file_bytes_in_place() {
    let dir = tmp_dir("zero-copy");
    let bytes = st_bytes(&sample_tensors());
    std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
    let store = WeightStore::open(&dir).unwrap();
    let data_start = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    // In file order: embed [0, 12), norm [12, 20), lm_head [20, 32).
    let e = store.get("model.embed_tokens.weight").unwrap().bytes();
    let n = store.get("model.norm.weight").unwrap().bytes();
    let h = store.get("lm_head.weight").unwrap().bytes();
    assert_eq!(e, &bytes[data_start..data_start + 12]);
    assert_eq!(h, &bytes[data_start + 20..data_start + 32]);
    // One contiguous mapping: the tensors lie at their file offsets from each
    // other (separate copies could not), and a clone shares the bytes.
    assert_eq!(n.as_ptr() as usize - e.as_ptr() as usize, 12);
    assert_eq!(h.as_ptr() as usize - e.as_ptr() as usize, 20);
    let clone = store.clone();
    assert_eq!(
        clone
            .get("model.embed_tokens.weight")
            .unwrap()
            .bytes()
            .as_ptr(),
        e.as_ptr()
    );
    // The store outlives nothing it needs: drop the original, keep a weight.
    let w = store.get("lm_head.weight").unwrap().clone();
    drop(store);
    drop(clone);
    assert_eq!(w.bytes(), &bytes[data_start + 20..data_start + 32]);
}

#[test]
fn sharded_models_are_mapped_per_shard() {
    let dir = tmp_dir("sharded");
    let [a, b, c] = <[T<'static>; 3]>::try_from(sample_tensors()).ok().unwrap();
    let shard1 = st_bytes(&[a, t("extra.not.listed", "F32", &[1], f32_bytes(&[9.0]))]);
    let shard2 = st_bytes(&[b, c]);
    std::fs::write(dir.join("model-00001-of-00002.safetensors"), &shard1).unwrap();
    std::fs::write(dir.join("model-00002-of-00002.safetensors"), &shard2).unwrap();
    let index = json!({
        "metadata": {"total_size": 32},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        }
    });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let store = WeightStore::open(&dir).unwrap();
    assert_eq!(store.len(), 3);
    assert!(!store.contains("extra.not.listed"));
    assert_eq!(store.file_bytes(), (shard1.len() + shard2.len()) as u64);
    assert_eq!(store.files().count(), 2);
    assert_eq!(
        store.get("model.norm.weight").unwrap().to_f32_vec(),
        [1.5, -0.0]
    );
    assert_eq!(
        store.get("model.embed_tokens.weight").unwrap().to_f32_vec(),
        [1.0, -2.0, 0.5, 3.0, -0.25, 8.0]
    );
    assert!(store.iter().all(|(_, w)| w.is_mapped()));

    // model.safetensors, when present, is preferred (as transformers does).
    std::fs::write(
        dir.join("model.safetensors"),
        st_bytes(&[t("only", "F32", &[1], f32_bytes(&[1.0]))]),
    )
    .unwrap();
    let store = WeightStore::open(&dir).unwrap();
    assert_eq!(store.names().collect::<Vec<_>>(), ["only"]);
}

#[test]
fn a_directory_without_weights_is_refused() {
    let dir = tmp_dir("empty");
    assert_file_err(&open_err(&dir), &dir, &["model.safetensors"]);
}

#[test]
fn bad_framing_is_a_bad_file() {
    let dir = tmp_dir("framing");
    let path = dir.join("model.safetensors");
    // Too short for the length prefix.
    std::fs::write(&path, [1u8, 2, 3]).unwrap();
    assert_file_err(&open_err(&dir), &path, &["too short"]);
    std::fs::write(&path, []).unwrap();
    assert_file_err(&open_err(&dir), &path, &["too short"]);
    // A header length past the end of the file.
    let mut b = st_bytes(&sample_tensors());
    let n = u64::from_le_bytes(b[..8].try_into().unwrap());
    b[..8].copy_from_slice(&(n + 1000).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    assert_file_err(&open_err(&dir), &path, &["runs past the end"]);
    // A header length above the format's limit.
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    assert_file_err(&open_err(&dir), &path, &["limit"]);
    // Bad JSON, and JSON that is not an object.
    std::fs::write(&path, st_raw("{\"a\": {\"dtype\": ", &[])).unwrap();
    assert_file_err(&open_err(&dir), &path, &["JSON"]);
    std::fs::write(&path, st_raw("[1, 2, 3]", &[])).unwrap();
    assert_file_err(&open_err(&dir), &path, &["JSON"]);
    // Bytes after the last tensor.
    let mut b = st_bytes(&sample_tensors());
    b.extend_from_slice(&[0; 4]);
    std::fs::write(&path, &b).unwrap();
    assert_file_err(&open_err(&dir), &path, &["4 bytes follow the last tensor"]);
    // A metadata map of non-strings; twice.
    std::fs::write(&path, st_raw(r#"{"__metadata__": {"a": 1}}"#, &[])).unwrap();
    assert_file_err(&open_err(&dir), &path, &["__metadata__"]);
    std::fs::write(
        &path,
        st_raw(r#"{"__metadata__": {}, "__metadata__": null}"#, &[]),
    )
    .unwrap();
    assert_file_err(&open_err(&dir), &path, &["twice"]);
    // An empty header is a valid, empty file.
    std::fs::write(&path, st_raw("{}", &[])).unwrap();
    assert!(WeightStore::open(&dir).unwrap().is_empty());
}

#[test]
fn an_unsupported_dtype_names_the_tensor_and_the_dtype() {
    let dir = tmp_dir("dtype");
    let path = dir.join("model.safetensors");
    for dtype in ["I32", "F64", "I8", "U8", "BOOL", "F8_E4M3", "Q4"] {
        let mut ts = sample_tensors();
        ts.push(t(
            "model.layers.0.mlp.up_proj.weight",
            dtype,
            &[2],
            vec![0; 8],
        ));
        std::fs::write(&path, st_bytes(&ts)).unwrap();
        assert_tensor_err(
            &open_err(&dir),
            &path,
            "model.layers.0.mlp.up_proj.weight",
            &[dtype, "not supported"],
        );
    }
}

#[test]
fn truncated_files_name_the_tensor_cut() {
    let dir = tmp_dir("truncated");
    let path = dir.join("model.safetensors");
    let bytes = st_bytes(&sample_tensors());
    let n = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    // Cut inside the data: the last tensor whose data is cut is named (the
    // tensors are checked in file order, so the first one reaching past the end).
    for (cut, name) in [
        (1, "lm_head.weight"),
        (12, "lm_head.weight"),
        (13, "model.norm.weight"),
        (32, "model.embed_tokens.weight"),
    ] {
        std::fs::write(&path, &bytes[..bytes.len() - cut]).unwrap();
        assert_tensor_err(&open_err(&dir), &path, name, &["past the end", "truncated"]);
    }
    // Every cut is an error, never a panic.
    for cut in 0..bytes.len() {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let e = open_err(&dir);
        if cut < n {
            assert!(matches!(e, LlmError::BadFile { .. }), "cut {cut}: {e}");
        } else {
            assert!(
                matches!(e, LlmError::BadTensorInFile { .. }),
                "cut {cut}: {e}"
            );
        }
    }
}

#[test]
fn misdeclared_overlapping_and_gapped_offsets() {
    let dir = tmp_dir("offsets");
    let path = dir.join("model.safetensors");
    let data = [0u8; 40];
    let write =
        |header: &str, len: usize| std::fs::write(&path, st_raw(header, &data[..len])).unwrap();
    // Length disagrees with the shape.
    write(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[8,12]}}"#,
        12,
    );
    assert_tensor_err(&open_err(&dir), &path, "b", &["[8, 12]", "[3]", "6 bytes"]);
    // End before start.
    write(
        r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}"#,
        8,
    );
    assert_tensor_err(&open_err(&dir), &path, "a", &["[8, 0]"]);
    // Overlap: b starts inside a.
    write(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
        12,
    );
    assert_tensor_err(&open_err(&dir), &path, "b", &["overlap", "`a`"]);
    // Two tensors sharing the same bytes.
    write(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}}"#,
        8,
    );
    assert_tensor_err(&open_err(&dir), &path, "b", &["overlap", "`a`"]);
    // A gap between a and b, and before the first tensor.
    write(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}"#,
        20,
    );
    assert_tensor_err(&open_err(&dir), &path, "b", &["gap", "`a`"]);
    write(
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
        8,
    );
    assert_tensor_err(
        &open_err(&dir),
        &path,
        "a",
        &["gap", "start of the data section"],
    );
    // A shape whose byte size overflows.
    write(
        r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
        8,
    );
    assert_tensor_err(&open_err(&dir), &path, "a", &["shape"]);
    // Malformed entries, a repeated name, an empty name.
    write(r#"{"a":{"dtype":"F32","data_offsets":[0,8]}}"#, 8);
    assert_tensor_err(&open_err(&dir), &path, "a", &["malformed", "shape"]);
    write(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}"#,
        8,
    );
    assert_tensor_err(&open_err(&dir), &path, "a", &["malformed"]);
    write(
        r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
        8,
    );
    assert_tensor_err(&open_err(&dir), &path, "a", &["malformed"]);
    write(
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
        8,
    );
    assert_tensor_err(&open_err(&dir), &path, "a", &["twice"]);
    write(
        r#"{"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        4,
    );
    assert_tensor_err(&open_err(&dir), &path, "", &["empty"]);
    // Zero-element tensors and rank 0 are fine.
    write(
        r#"{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"z":{"dtype":"BF16","shape":[0,3],"data_offsets":[4,4]}}"#,
        4,
    );
    let store = WeightStore::open(&dir).unwrap();
    assert_eq!(store.get("s").unwrap().shape(), [] as [usize; 0]);
    assert_eq!(store.get("z").unwrap().bytes().len(), 0);
}

#[test]
fn flipped_header_bytes_never_panic() {
    let dir = tmp_dir("flipped");
    let path = dir.join("model.safetensors");
    let bytes = st_bytes(&sample_tensors());
    let n = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for i in 0..n {
        for mask in [0x01u8, 0x20, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= mask;
            std::fs::write(&path, &b).unwrap();
            // Some flips keep a valid file (a digit of a name); none may panic.
            let _ = WeightStore::open(&dir);
        }
    }
}

/// A sharded model directory: two valid shards and an index `weight_map`.
fn sharded(test: &str, weight_map: Value) -> PathBuf {
    let dir = tmp_dir(test);
    let [a, b, c] = <[T<'static>; 3]>::try_from(sample_tensors()).ok().unwrap();
    std::fs::write(dir.join("s1.safetensors"), st_bytes(&[a])).unwrap();
    std::fs::write(dir.join("s2.safetensors"), st_bytes(&[b, c])).unwrap();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    dir
}

#[test]
fn bad_shards_name_the_shard_and_the_tensor() {
    // A shard listed but missing.
    let dir = sharded(
        "shard-missing",
        json!({"model.embed_tokens.weight": "s1.safetensors", "model.norm.weight": "s3.safetensors"}),
    );
    assert_tensor_err(
        &open_err(&dir),
        &dir.join("s3.safetensors"),
        "model.norm.weight",
        &["cannot be opened"],
    );
    // A tensor the index puts in a shard that lacks it.
    let dir = sharded(
        "shard-lacks",
        json!({"model.embed_tokens.weight": "s1.safetensors", "model.norm.weight": "s1.safetensors"}),
    );
    assert_tensor_err(
        &open_err(&dir),
        &dir.join("s1.safetensors"),
        "model.norm.weight",
        &["lacks it"],
    );
    // A corrupt shard: its own error, naming it.
    let dir = sharded(
        "shard-corrupt",
        json!({"model.norm.weight": "s2.safetensors"}),
    );
    let bytes = std::fs::read(dir.join("s2.safetensors")).unwrap();
    std::fs::write(dir.join("s2.safetensors"), &bytes[..bytes.len() - 2]).unwrap();
    assert_tensor_err(
        &open_err(&dir),
        &dir.join("s2.safetensors"),
        "lm_head.weight",
        &["past the end"],
    );
    // A shard outside the directory, a non-string entry, a repeated tensor.
    let index = |dir: &Path| dir.join("model.safetensors.index.json");
    let dir = sharded(
        "shard-escape",
        json!({"model.norm.weight": "../s2.safetensors"}),
    );
    assert_tensor_err(
        &open_err(&dir),
        &index(&dir),
        "model.norm.weight",
        &["not a file name"],
    );
    let dir = sharded("shard-abs", json!({"model.norm.weight": "/etc/passwd"}));
    assert_tensor_err(
        &open_err(&dir),
        &index(&dir),
        "model.norm.weight",
        &["not a file name"],
    );
    let dir = sharded("shard-type", json!({"model.norm.weight": 2}));
    assert_tensor_err(
        &open_err(&dir),
        &index(&dir),
        "model.norm.weight",
        &["file name"],
    );
    let dir = sharded("shard-dup", json!({}));
    std::fs::write(
        index(&dir),
        r#"{"weight_map": {"model.norm.weight": "s2.safetensors", "model.norm.weight": "s2.safetensors"}}"#,
    )
    .unwrap();
    assert_tensor_err(
        &open_err(&dir),
        &index(&dir),
        "model.norm.weight",
        &["twice"],
    );
    // A malformed index.
    std::fs::write(index(&dir), r#"{"metadata": {}}"#).unwrap();
    assert_file_err(&open_err(&dir), &index(&dir), &["weight_map"]);
    std::fs::write(index(&dir), "{").unwrap();
    assert_file_err(&open_err(&dir), &index(&dir), &["index"]);
    std::fs::write(index(&dir), r#"{"weight_map": []}"#).unwrap();
    assert_file_err(&open_err(&dir), &index(&dir), &["weight_map"]);
}

#[test]
fn qwen3_and_gemma_defaults_are_those_of_transformers() {
    let mut cfg = base("Qwen3ForCausalLM");
    cfg["num_attention_heads"] = json!(32);
    let q = parse(&cfg).unwrap();
    assert_eq!(q.architecture, Architecture::Qwen3);
    assert_eq!((q.num_key_value_heads, q.head_dim), (32, 128));
    assert_eq!((q.qkv_bias, q.sliding_window), (false, None));
    assert_eq!(q.params, Default::default());

    let mut cfg = base("Gemma2ForCausalLM");
    cfg["num_hidden_layers"] = json!(4);
    let g = parse(&cfg).unwrap();
    assert_eq!((g.num_key_value_heads, g.head_dim), (4, 256));
    assert_eq!(g.max_position_embeddings, 8192);
    assert!(g.tie_word_embeddings);
    assert_eq!(
        (g.bos_token_id, g.eos_token_ids.clone()),
        (Some(2), vec![1])
    );
    assert_eq!(g.sliding_window, Some(4096));
    assert_eq!(g.params.sliding_layers, [true, false, true, false]);
    assert_eq!(g.params.attn_logit_softcapping, Some(50.0));
    assert_eq!(g.params.final_logit_softcapping, Some(30.0));
    assert_eq!(g.params.query_pre_attn_scalar, Some(256.0));
    // `null` turns a cap off.
    let g = parse(&with(cfg, "final_logit_softcapping", Some(Value::Null))).unwrap();
    assert_eq!(g.params.final_logit_softcapping, None);

    let mut cfg = base("Gemma3ForCausalLM");
    cfg["num_hidden_layers"] = json!(7);
    let g = parse(&cfg).unwrap();
    assert_eq!(g.rope_theta, 1e6);
    assert_eq!(g.params.local_rope_theta, Some(1e4));
    assert_eq!(
        g.params.sliding_layers,
        [true, true, true, true, true, false, true]
    );
    assert_eq!(g.params.attn_logit_softcapping, None);
    // The older keys: rope_local_base_freq and sliding_window_pattern.
    cfg["rope_local_base_freq"] = json!(500.0);
    cfg["sliding_window_pattern"] = json!(2);
    let g = parse(&cfg).unwrap();
    assert_eq!(g.params.local_rope_theta, Some(500.0));
    assert_eq!(
        g.params.sliding_layers,
        [true, false, true, false, true, false, true]
    );
    // RoPE scaling on the local layers is refused by name.
    cfg["rope_parameters"] = json!({
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
    });
    let r = config_err(&cfg);
    assert!(r.contains("rope_parameters.sliding_attention"), "{r}");
    // Gemma's activation is GeGLU: silu is refused.
    let r = config_err(&with(cfg, "hidden_activation", Some(json!("silu"))));
    assert!(r.contains("hidden_activation") && r.contains("silu"), "{r}");
}

#[test]
fn phi3_longrope_is_read_with_transformers_defaults() {
    let mut cfg = base("Phi3ForCausalLM");
    cfg["max_position_embeddings"] = json!(4096);
    cfg["original_max_position_embeddings"] = json!(1024);
    cfg["rope_scaling"] = json!({
        "type": "longrope",
        "short_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
        "long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    });
    let c = parse(&cfg).unwrap();
    assert_eq!(c.architecture, Architecture::Phi3);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    let lr = c.params.longrope.clone().unwrap();
    assert_eq!(lr.original_max_position_embeddings, 1024);
    assert_eq!(lr.short_factor[1], 1.5);
    assert_eq!(lr.long_factor[7], 9.0);
    // sqrt(1 + ln(4096 / 1024) / ln(1024))
    let want = (1.0 + 4f64.ln() / 1024f64.ln()).sqrt() as f32;
    assert_eq!(lr.attention_factor, want);
    // The factors must number head_dim / 2 (here 8).
    cfg["rope_scaling"]["long_factor"] = json!([1.0, 2.0]);
    let r = config_err(&cfg);
    assert!(
        r.contains("rope_scaling.long_factor") && r.contains("2 factors"),
        "{r}"
    );
    // Without longrope, Phi-3 reads RoPE as Llama does.
    let c = parse(&with(cfg, "rope_scaling", None)).unwrap();
    assert_eq!(c.params.longrope, None);
}

/// `Model::load` reads no tokenizer: a directory whose `tokenizer.json` is
/// broken still loads, while `open_model` (which returns the tokenizer)
/// names the file.
#[test]
fn model_load_skips_the_tokenizer_that_open_model_reads() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_f32");
    let dir = std::env::temp_dir().join(format!("fucina-load-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        if f.is_file() {
            std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(dir.join("tokenizer.json"), b"{ not json").unwrap();
    let model = fucina_llm::Model::load(&dir).unwrap();
    assert_eq!(model.config().hidden_size, 64);
    let ctx = fucina_llm::fucina::ExecContext::with_threads(1);
    let err = fucina_llm::open_model(&dir, &ctx, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
