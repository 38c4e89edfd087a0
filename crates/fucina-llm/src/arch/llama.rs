//! `LlamaForCausalLM`: the decoder every other spec departs from.
//! `attention_bias` puts a bias on the q, k, v and o projections;
//! `mlp_bias: true` is refused (not implemented).

use super::{Activation, ArchSpec, COMMON_LAYER_NAMES, Defaults, NormStyle, no_gguf_keys};
use crate::config::{Architecture, ModelConfig, Obj, parse_rope};
use crate::error::LlmError;

pub(super) const SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Llama,
    hf_class: "LlamaForCausalLM",
    model_type: "llama",
    gguf_arch: "llama",
    defaults: Defaults {
        num_key_value_heads: None,
        head_dim: None,
        max_position_embeddings: 2048,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        tie_word_embeddings: false,
        bos_token_id: Some(1),
        eos_token_ids: &[2],
    },
    heads_divide_hidden: true,
    activation: Activation::Silu,
    norm: NormStyle::Rms,
    qk_norm: false,
    sandwich_norms: false,
    embed_scale: false,
    fused_qkv: false,
    fused_gate_up: false,
    expert_names: super::MLP_EXPERTS,
    gguf_permuted_qk: true,
    gguf_layer_names: &COMMON_LAYER_NAMES,
    rope: parse_rope,
    parse,
    gguf_config: no_gguf_keys,
};

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    if o.bool_opt("mlp_bias")? == Some(true) {
        return Err(o.err(
            "mlp_bias",
            "a bias on the MLP projections is not supported".to_string(),
        ));
    }
    let b = o.bool_opt("attention_bias")?.unwrap_or(false);
    (c.qkv_bias, c.o_bias) = (b, b);
    Ok(())
}
