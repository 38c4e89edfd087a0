//! `Qwen3ForCausalLM`: Llama with an RMSNorm over each head of q and k
//! (`self_attn.q_norm`, `self_attn.k_norm`; llama.cpp's `attn_q_norm`,
//! `attn_k_norm`) before RoPE, no biases unless `attention_bias` (then on q,
//! k, v and o), and Qwen2's sliding-window keys.

use super::{ArchSpec, COMMON_LAYER_NAMES, Defaults, no_gguf_keys};
use crate::config::{Architecture, ModelConfig, Obj};
use crate::error::LlmError;

/// Qwen3's tensors: the common ones and the q/k norms.
pub(super) const NAMES: [(&str, &str); 11] = {
    let c = COMMON_LAYER_NAMES;
    [
        c[0],
        c[1],
        c[2],
        c[3],
        c[4],
        c[5],
        c[6],
        c[7],
        c[8],
        ("attn_q_norm", "self_attn.q_norm"),
        ("attn_k_norm", "self_attn.k_norm"),
    ]
};

pub(super) const SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Qwen3,
    hf_class: "Qwen3ForCausalLM",
    model_type: "qwen3",
    gguf_arch: "qwen3",
    defaults: Defaults {
        num_key_value_heads: Some(32),
        head_dim: Some(128),
        max_position_embeddings: 32768,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_ids: &[],
    },
    heads_divide_hidden: false,
    qk_norm: true,
    gguf_permuted_qk: false,
    gguf_layer_names: &NAMES,
    parse,
    gguf_config: no_gguf_keys,
    ..super::llama::SPEC
};

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    let b = o.bool_opt("attention_bias")?.unwrap_or(false);
    (c.qkv_bias, c.o_bias) = (b, b);
    c.sliding_window = super::qwen2::sliding_window(o, c.num_hidden_layers)?;
    Ok(())
}
