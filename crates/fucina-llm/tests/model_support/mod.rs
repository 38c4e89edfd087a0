//! Tiny random-weight decoders for the model tests (shared by `model.rs`,
//! `invariance.rs`, `mixed_step.rs` and `zero_alloc.rs` through `mod model_support;`).

#![allow(dead_code)] // each test binary uses part of it

use std::collections::HashMap;

use fucina::exec::WeightFormat;
use fucina_llm::{Architecture, ModelConfig, RopeScaling, Weight, WeightStore};

/// A small Llama config: `hidden` wide, 2 layers, 4 heads, 2 key/value heads,
/// vocabulary 97, untied, no bias, no window, no RoPE scaling.
pub(crate) fn llama(hidden: usize) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        hidden_size: hidden,
        intermediate_size: 2 * hidden,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: hidden / 4,
        vocab_size: 97,
        max_position_embeddings: 512,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: false,
        qkv_bias: false,
        o_bias: false,
        sliding_window: None,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        params: Default::default(),
    }
}

/// A Qwen3-MoE-shaped [`llama`] config, `hidden` wide, 3 layers: 8 experts
/// of 48, 3 per token, normalized, layer 1 dense.
pub(crate) fn moe(hidden: usize) -> ModelConfig {
    let mut c = llama(hidden);
    c.architecture = Architecture::Qwen3Moe;
    c.num_hidden_layers = 3;
    c.params.moe = Some(fucina_llm::MoeParams {
        num_experts: 8,
        num_experts_per_tok: 3,
        moe_intermediate_size: 48,
        norm_topk_prob: true,
        sparse_layers: vec![true, false, true],
    });
    c
}

/// Uniform values in `[-a, a)` from `seed` (fucina's counter-based RNG).
fn uniform(seed: u64, n: usize, a: f32) -> Vec<f32> {
    let mut v = vec![0.0f32; n];
    fucina::rng::uniform_fill(seed, &mut v, -a, a);
    v
}

/// Every tensor `config` calls for, random, stored in `format`: matrices with
/// unit-variance outputs, norm weights near 1, biases and embeddings in
/// `[-0.3, 0.3)` and `[-1, 1)`.
pub(crate) fn random_weights(
    c: &ModelConfig,
    format: WeightFormat,
    seed: u64,
) -> HashMap<String, Weight> {
    let mut t = HashMap::new();
    let mut next = seed;
    let mut add = |name: String, shape: &[usize], kind: u8| {
        next += 1;
        let n: usize = shape.iter().product();
        let v = match kind {
            // matrix [out, in]
            0 => uniform(next, n, (3.0 / shape[1] as f32).sqrt()),
            // norm weight
            1 => uniform(next, n, 0.2).iter().map(|x| 1.0 + x).collect(),
            // bias
            2 => uniform(next, n, 0.3),
            // embedding
            _ => uniform(next, n, 1.0),
        };
        t.insert(name, Weight::from_f32(format, shape, &v).unwrap());
    };
    let (h, hd) = (c.hidden_size, c.head_dim);
    let (qd, kvd) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    add("model.embed_tokens.weight".into(), &[c.vocab_size, h], 3);
    for i in 0..c.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        add(p("input_layernorm.weight"), &[h], 1);
        let spec = c.architecture.spec();
        if spec.fused_qkv {
            add(p("self_attn.qkv_proj.weight"), &[qd + 2 * kvd, h], 0);
        } else {
            add(p("self_attn.q_proj.weight"), &[qd, h], 0);
            add(p("self_attn.k_proj.weight"), &[kvd, h], 0);
            add(p("self_attn.v_proj.weight"), &[kvd, h], 0);
        }
        add(p("self_attn.o_proj.weight"), &[h, qd], 0);
        if c.qkv_bias {
            add(p("self_attn.q_proj.bias"), &[qd], 2);
            add(p("self_attn.k_proj.bias"), &[kvd], 2);
            add(p("self_attn.v_proj.bias"), &[kvd], 2);
        }
        if c.o_bias {
            add(p("self_attn.o_proj.bias"), &[h], 2);
        }
        add(p("post_attention_layernorm.weight"), &[h], 1);
        if spec.qk_norm {
            add(p("self_attn.q_norm.weight"), &[hd], 1);
            add(p("self_attn.k_norm.weight"), &[hd], 1);
        }
        if spec.sandwich_norms {
            add(p("pre_feedforward_layernorm.weight"), &[h], 1);
            add(p("post_feedforward_layernorm.weight"), &[h], 1);
        }
        let sparse = c
            .params
            .moe
            .as_ref()
            .filter(|m| m.sparse_layers.get(i).copied().unwrap_or(true));
        if let Some(m) = sparse {
            let inter = m.moe_intermediate_size;
            add(p("mlp.gate.weight"), &[m.num_experts, h], 0);
            for e in 0..m.num_experts {
                add(
                    p(&format!("mlp.experts.{e}.gate_proj.weight")),
                    &[inter, h],
                    0,
                );
                add(
                    p(&format!("mlp.experts.{e}.up_proj.weight")),
                    &[inter, h],
                    0,
                );
                add(
                    p(&format!("mlp.experts.{e}.down_proj.weight")),
                    &[h, inter],
                    0,
                );
            }
        } else if spec.fused_gate_up {
            add(
                p("mlp.gate_up_proj.weight"),
                &[2 * c.intermediate_size, h],
                0,
            );
        } else {
            add(p("mlp.gate_proj.weight"), &[c.intermediate_size, h], 0);
            add(p("mlp.up_proj.weight"), &[c.intermediate_size, h], 0);
        }
        add(p("mlp.down_proj.weight"), &[h, c.intermediate_size], 0);
    }
    add("model.norm.weight".into(), &[h], 1);
    if !c.tie_word_embeddings {
        add("lm_head.weight".into(), &[c.vocab_size, h], 0);
    }
    t
}

/// A model of `config` with random weights in `format`.
pub(crate) fn model(c: &ModelConfig, format: WeightFormat, seed: u64) -> fucina_llm::Model {
    fucina_llm::Model::from_parts(
        c.clone(),
        WeightStore::from_tensors(random_weights(c, format, seed)),
    )
    .expect("a consistent random model")
}

/// `n` token ids below `vocab` from `seed`.
pub(crate) fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| (fucina::rng::at(seed, i) % vocab as u64) as u32)
        .collect()
}
