//! `MistralForCausalLM`: Llama with one sliding window for every layer
//! (`sliding_window`, 4096 when absent, none when `null`). No biases.

use super::{Activation, ArchSpec, COMMON_LAYER_NAMES, Defaults, NormStyle, no_gguf_keys};
use crate::config::{Architecture, ModelConfig, Obj, parse_rope};
use crate::error::LlmError;

pub(super) static SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Mistral,
    hf_class: "MistralForCausalLM",
    model_type: "mistral",
    // llama.cpp converts Mistral models to its `llama` architecture (a GGUF
    // `llama` file loads as Llama, without a window).
    gguf_arch: "llama",
    defaults: Defaults {
        num_key_value_heads: Some(8),
        head_dim: None,
        max_position_embeddings: 4096 * 32,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        tie_word_embeddings: false,
        bos_token_id: Some(1),
        eos_token_ids: &[2],
    },
    heads_divide_hidden: false,
    activation: Activation::Silu,
    norm: NormStyle::Rms,
    qk_norm: false,
    sandwich_norms: false,
    embed_scale: false,
    fused_qkv: false,
    fused_gate_up: false,
    gguf_permuted_qk: true,
    gguf_layer_names: &COMMON_LAYER_NAMES,
    rope: parse_rope,
    parse,
    gguf_config: no_gguf_keys,
};

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    c.sliding_window = if o.has("sliding_window") {
        o.size_opt("sliding_window")?
    } else {
        Some(4096)
    };
    Ok(())
}
