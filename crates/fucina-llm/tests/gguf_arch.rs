//! The Qwen3, Gemma 2, Gemma 3 and Phi-3 fixtures converted to GGUF the way
//! llama.cpp's converter writes those architectures (`general.architecture`
//! `qwen3`, `gemma2`, `gemma3`, `phi3`; their `{arch}.*` keys; llama.cpp's
//! tensor names, Gemma's norms stored as `1 + w`, Phi-3's fused `attn_qkv` and
//! `ffn_up` and its LongRoPE factors as tensors; no q/k row reordering, as
//! llama.cpp rotates these architectures' halves) load through the generic
//! loader and give the same logit bits as the safetensors originals; so does
//! the Mixtral fixture written as llama.cpp writes Mixtral (a `llama` file
//! with experts, q/k rows reordered).

use std::io::Write;
use std::path::PathBuf;

use fucina::ExecContext;
use fucina::exec::WeightFormat;
use fucina_llm::arch::gguf::load_gguf;
use fucina_llm::{Architecture, Model, ModelConfig, WeightStore};

mod gguf_support;
use gguf_support::{Writer, f32v, llama_gguf_name, permute, str_v, u32v};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// llama.cpp's name of a Hugging Face tensor of these architectures.
fn gguf_name(hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, tail) = rest.split_once('.').unwrap();
    let part = [
        ("input_layernorm.weight", "attn_norm.weight"),
        ("mlp.gate.weight", "ffn_gate_inp.weight"),
        ("self_attn.qkv_proj.weight", "attn_qkv.weight"),
        ("mlp.gate_up_proj.weight", "ffn_up.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.k_proj.weight", "attn_k.weight"),
        ("self_attn.v_proj.weight", "attn_v.weight"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
        // Llama-like: the MLP's input norm; Gemma: the attention output's norm.
        ("post_attention_layernorm.weight", "POST_ATTENTION"),
        ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
    ]
    .iter()
    .find(|(h, _)| *h == tail)
    .unwrap_or_else(|| panic!("unmapped tensor {hf}"))
    .1;
    format!("blk.{layer}.{part}")
}

/// The GGUF image of a Hugging Face model of `arch`, as llama.cpp writes it.
fn convert(arch: &str, cfg: &ModelConfig, store: &WeightStore) -> Vec<u8> {
    let gemma = arch.starts_with("gemma");
    let p = &cfg.params;
    let k = |s: &str| format!("{arch}.{s}");
    let mut meta: Vec<(String, u32, Vec<u8>)> = vec![
        ("general.architecture".into(), 8, str_v(arch)),
        (k("embedding_length"), 4, u32v(cfg.hidden_size)),
        (k("feed_forward_length"), 4, u32v(cfg.intermediate_size)),
        (k("block_count"), 4, u32v(cfg.num_hidden_layers)),
        (k("attention.head_count"), 4, u32v(cfg.num_attention_heads)),
        (
            k("attention.head_count_kv"),
            4,
            u32v(cfg.num_key_value_heads),
        ),
        (k("attention.key_length"), 4, u32v(cfg.head_dim)),
        (k("attention.value_length"), 4, u32v(cfg.head_dim)),
        (k("rope.dimension_count"), 4, u32v(cfg.rotary_dim())),
        (k("context_length"), 4, u32v(cfg.max_position_embeddings)),
        (
            k("attention.layer_norm_rms_epsilon"),
            6,
            f32v(cfg.rms_norm_eps),
        ),
        (k("rope.freq_base"), 6, f32v(cfg.rope_theta)),
        (
            "tokenizer.ggml.eos_token_id".into(),
            4,
            u32v(cfg.eos_token_ids[0] as usize),
        ),
    ];
    if let Some(w) = cfg.sliding_window {
        meta.push((k("attention.sliding_window"), 4, u32v(w)));
    }
    if let Some(c) = p.attn_logit_softcapping {
        meta.push((k("attn_logit_softcapping"), 6, f32v(c)));
    }
    if let Some(c) = p.final_logit_softcapping {
        meta.push((k("final_logit_softcapping"), 6, f32v(c)));
    }
    if let Some(t) = p.local_rope_theta {
        meta.push((k("rope.freq_base_swa"), 6, f32v(t)));
    }
    if let Some(m) = &p.moe {
        meta.push((k("expert_count"), 4, u32v(m.num_experts)));
        meta.push((k("expert_used_count"), 4, u32v(m.num_experts_per_tok)));
        meta.push((
            k("expert_feed_forward_length"),
            4,
            u32v(m.moe_intermediate_size),
        ));
    }
    if let Some(lr) = &p.longrope {
        meta.push((
            k("rope.scaling.original_context_length"),
            4,
            u32v(lr.original_max_position_embeddings),
        ));
        meta.push((k("rope.scaling.attn_factor"), 6, f32v(lr.attention_factor)));
    }
    if let fucina_llm::RopeScaling::Linear { factor } = cfg.rope_scaling {
        meta.push((k("rope.scaling.type"), 8, str_v("linear")));
        meta.push((k("rope.scaling.factor"), 6, f32v(factor)));
    }
    let mut w = Writer::default();
    for (key, t, v) in &meta {
        w.kv(key, *t, v);
    }
    if let Some(lr) = &p.longrope {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let n = lr.short_factor.len() as u64;
        w.tensor(
            "rope_factors_short.weight",
            &[n],
            0,
            &f32s(&lr.short_factor),
        );
        w.tensor("rope_factors_long.weight", &[n], 0, &f32s(&lr.long_factor));
    }
    // The experts of a layer, stacked as llama.cpp stores them.
    if let Some(m) = &p.moe {
        for l in 0..cfg.num_hidden_layers {
            let e0 = format!("model.layers.{l}.mlp.experts.0.gate_proj.weight");
            if !store.contains(&e0) {
                continue;
            }
            for (part, gguf) in [
                ("gate_proj", "ffn_gate_exps"),
                ("up_proj", "ffn_up_exps"),
                ("down_proj", "ffn_down_exps"),
            ] {
                let mut bytes = Vec::new();
                let mut dims = Vec::new();
                for e in 0..m.num_experts {
                    let w = store
                        .get(&format!("model.layers.{l}.mlp.experts.{e}.{part}.weight"))
                        .unwrap();
                    bytes.extend_from_slice(w.bytes());
                    dims = w.shape().iter().rev().map(|&d| d as u64).collect();
                }
                dims.push(m.num_experts as u64);
                w.tensor(&format!("blk.{l}.{gguf}.weight"), &dims, 0, &bytes);
            }
        }
    }
    for (name, weight) in store.iter() {
        if name.contains(".experts.") {
            continue;
        }
        assert_eq!(weight.format(), WeightFormat::F32);
        let shape = weight.shape();
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let mut g = gguf_name(name);
        if g.ends_with("POST_ATTENTION") {
            g = g.replace(
                "POST_ATTENTION",
                if gemma {
                    "post_attention_norm.weight"
                } else {
                    "ffn_norm.weight"
                },
            );
        }
        let bytes: Vec<u8> = if gemma && name.ends_with("norm.weight") {
            // llama.cpp's converter stores Gemma's norms as 1 + w (in f32).
            weight
                .to_f32_vec()
                .iter()
                .flat_map(|x| (x + 1.0).to_le_bytes())
                .collect()
        } else {
            weight.bytes().to_vec()
        };
        w.tensor(&g, &dims, 0, &bytes);
    }
    w.bytes()
}

fn write(bytes: &[u8], tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fucina-gguf-arch-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("model.gguf");
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

/// The bits of the prefill logits of every prompt position and of 8 decode
/// steps.
fn logit_bits(m: &Model, ctx: &ExecContext) -> Vec<u32> {
    let vocab = m.config().vocab_size;
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % vocab as u32).collect();
    // 20 positions: past Phi-3's original context of 16 (its long factors).
    let mut cache = m.new_cache(ctx, prompt.len() + 8).unwrap();
    let mut all = vec![0.0f32; prompt.len() * vocab];
    let mut last = vec![0.0f32; vocab];
    m.prefill(ctx, &mut cache, &prompt, Some(&mut all), &mut last)
        .unwrap();
    let mut bits: Vec<u32> = all.iter().map(|v| v.to_bits()).collect();
    for step in 0..8u32 {
        m.decode(
            ctx,
            &mut [&mut cache],
            &[(step * 11) % vocab as u32],
            &mut last,
        )
        .unwrap();
        bits.extend(last.iter().map(|v| v.to_bits()));
    }
    bits
}

#[test]
fn converted_qwen3_gemma_and_phi3_give_the_same_logit_bits() {
    let ctx = ExecContext::with_threads(2);
    for (name, arch, want) in [
        ("qwen3_f32", "qwen3", Architecture::Qwen3),
        ("gemma2_f32", "gemma2", Architecture::Gemma2),
        ("gemma3_f32", "gemma3", Architecture::Gemma3),
        ("phi3_f32", "phi3", Architecture::Phi3),
        ("phi4_mini_f32", "phi3", Architecture::Phi3),
        ("qwen3_moe_f32", "qwen3moe", Architecture::Qwen3Moe),
    ] {
        let dir = fixture(name);
        let mut cfg = ModelConfig::from_file(dir.join("config.json")).unwrap();
        if want == Architecture::Gemma2 {
            // GGUF records no query scale: llama.cpp scales Gemma 2's queries
            // by head_dim^-0.5 (the fixture's config asks for 24^-0.5).
            cfg.params.query_pre_attn_scalar = Some(cfg.head_dim as f32);
        }
        let store = WeightStore::open(&dir).unwrap();
        let path = write(&convert(arch, &cfg, &store), name);
        let (gcfg, gstore, file) = load_gguf(&path).unwrap();
        let extra = if want == Architecture::Phi3 { 2 } else { 0 };
        let experts = store.names().filter(|n| n.contains(".experts.")).count();
        // Each layer's experts in three stacked tensors.
        let stacked = if experts > 0 { 3 * 2 } else { 0 };
        assert_eq!(
            file.tensors().len(),
            store.len() + extra + stacked - experts,
            "{name}"
        );
        assert_eq!(gstore.len(), store.len(), "{name}");
        assert_eq!(gcfg.architecture, want, "{name}");
        assert_eq!(gcfg.head_dim, cfg.head_dim, "{name}");
        assert_eq!(gcfg.sliding_window, cfg.sliding_window, "{name}");
        assert_eq!(gcfg.rope_scaling, cfg.rope_scaling, "{name}");
        let (mut p, mut gp) = (cfg.params.clone(), gcfg.params.clone());
        // The safetensors norms hold w, the GGUF ones 1 + w.
        let gemma = matches!(want, Architecture::Gemma2 | Architecture::Gemma3);
        assert_eq!(gp.norms_include_one, gemma, "{name}");
        (p.norms_include_one, gp.norms_include_one) = (false, false);
        assert_eq!(gp, p, "{name}");
        let reference = Model::from_parts(cfg, store).unwrap();
        let converted = Model::from_parts(gcfg, gstore).unwrap();
        assert!(
            logit_bits(&reference, &ctx) == logit_bits(&converted, &ctx),
            "{name}: the GGUF model's logits differ from the safetensors model's"
        );
    }
}

/// The Mixtral fixture as llama.cpp writes it: `general.architecture`
/// `llama` with `llama.expert_count`, the router `ffn_gate_inp`, the experts
/// stacked per layer, the q and k rows in llama.cpp's rotary order.
/// `per_expert` writes one tensor per expert instead (llama.cpp's older
/// layout); `skip` leaves a metadata key out.
fn mixtral_gguf(cfg: &ModelConfig, store: &WeightStore, per_expert: bool, skip: &str) -> Vec<u8> {
    let moe = cfg.params.moe.clone().unwrap();
    let mut w = Writer::default();
    w.kv("general.architecture", 8, &str_v("llama"));
    for (key, v) in [
        ("embedding_length", cfg.hidden_size),
        ("feed_forward_length", cfg.intermediate_size),
        ("block_count", cfg.num_hidden_layers),
        ("attention.head_count", cfg.num_attention_heads),
        ("attention.head_count_kv", cfg.num_key_value_heads),
        ("context_length", cfg.max_position_embeddings),
        ("expert_count", moe.num_experts),
        ("expert_used_count", moe.num_experts_per_tok),
        ("attention.sliding_window", cfg.sliding_window.unwrap()),
    ] {
        if key != skip {
            w.kv(&format!("llama.{key}"), 4, &u32v(v));
        }
    }
    w.kv(
        "llama.attention.layer_norm_rms_epsilon",
        6,
        &f32v(cfg.rms_norm_eps),
    );
    w.kv("llama.rope.freq_base", 6, &f32v(cfg.rope_theta));
    w.kv(
        "tokenizer.ggml.eos_token_id",
        4,
        &u32v(cfg.eos_token_ids[0] as usize),
    );
    let expert = |l: usize, e: usize, part: &str| {
        store
            .get(&format!(
                "model.layers.{l}.block_sparse_moe.experts.{e}.{part}.weight"
            ))
            .unwrap()
    };
    for l in 0..cfg.num_hidden_layers {
        for (part, gguf) in [("w1", "ffn_gate"), ("w3", "ffn_up"), ("w2", "ffn_down")] {
            let dims: Vec<u64> = expert(l, 0, part)
                .shape()
                .iter()
                .rev()
                .map(|&d| d as u64)
                .collect();
            if per_expert {
                for e in 0..moe.num_experts {
                    w.tensor(
                        &format!("blk.{l}.{gguf}.{e}.weight"),
                        &dims,
                        0,
                        expert(l, e, part).bytes(),
                    );
                }
            } else {
                let bytes: Vec<u8> = (0..moe.num_experts)
                    .flat_map(|e| expert(l, e, part).bytes().to_vec())
                    .collect();
                let mut dims = dims.clone();
                dims.push(moe.num_experts as u64);
                w.tensor(&format!("blk.{l}.{gguf}_exps.weight"), &dims, 0, &bytes);
            }
        }
    }
    for (name, weight) in store.iter() {
        if name.contains(".experts.") {
            continue;
        }
        let shape = weight.shape();
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let gguf = match name.strip_suffix("block_sparse_moe.gate.weight") {
            Some(layer) => format!(
                "{}ffn_gate_inp.weight",
                layer.replace("model.layers.", "blk.")
            ),
            None => llama_gguf_name(name),
        };
        let mut bytes = weight.bytes().to_vec();
        if name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight") {
            bytes = permute(&bytes, shape[0], bytes.len() / shape[0], cfg.head_dim);
        }
        w.tensor(&gguf, &dims, 0, &bytes);
    }
    w.bytes()
}

#[test]
fn a_llama_file_with_experts_is_mixtral_with_the_safetensors_logit_bits() {
    let ctx = ExecContext::with_threads(2);
    let dir = fixture("mixtral_f32");
    let cfg = ModelConfig::from_file(dir.join("config.json")).unwrap();
    let store = WeightStore::open(&dir).unwrap();
    let path = write(&mixtral_gguf(&cfg, &store, false, ""), "mixtral");
    let (gcfg, gstore, _file) = load_gguf(&path).unwrap();
    assert_eq!(gcfg.architecture, Architecture::Mixtral);
    assert_eq!(gstore.len(), store.len());
    assert_eq!(gcfg.params, cfg.params);
    assert_eq!(gcfg.sliding_window, cfg.sliding_window);
    let reference = Model::from_parts(cfg.clone(), store.clone()).unwrap();
    let converted = Model::from_parts(gcfg, gstore).unwrap();
    assert!(
        logit_bits(&reference, &ctx) == logit_bits(&converted, &ctx),
        "the Mixtral GGUF model's logits differ from the safetensors model's"
    );

    // One tensor per expert (llama.cpp's older layout): an error naming it.
    let path = write(&mixtral_gguf(&cfg, &store, true, ""), "mixtral-per-expert");
    let err = load_gguf(&path).unwrap_err().to_string();
    assert!(
        err.contains("blk.0.ffn_gate.0.weight") && err.contains("one tensor per expert"),
        "{err}"
    );
    // A missing expert count of a Mixtral file: an error naming the key.
    let path = write(
        &mixtral_gguf(&cfg, &store, false, "expert_used_count"),
        "mixtral-no-used",
    );
    let err = load_gguf(&path).unwrap_err().to_string();
    assert!(err.contains("llama.expert_used_count"), "{err}");
}
