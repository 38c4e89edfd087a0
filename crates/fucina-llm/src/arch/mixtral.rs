//! `MixtralForCausalLM`: Mistral's attention (one sliding window for every
//! layer when `sliding_window` is set) with a mixture of experts in every
//! layer's place of the MLP: the router `block_sparse_moe.gate`, the experts
//! `block_sparse_moe.experts.{e}.{w1,w3,w2}` (gate, up, down),
//! `num_experts_per_tok` of `num_local_experts` per token, their
//! probabilities always normalized. Not read from GGUF (llama.cpp writes
//! Mixtral as its `llama` architecture with experts, which the Llama spec
//! does not read).

use super::{ArchSpec, Defaults, ExpertNames, MoeParams};
use crate::config::{Architecture, ModelConfig, Obj};
use crate::error::LlmError;

pub(super) const SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Mixtral,
    hf_class: "MixtralForCausalLM",
    model_type: "mixtral",
    // GGUF: Llama's `llama` (see above).
    defaults: Defaults {
        num_key_value_heads: Some(8),
        head_dim: None,
        max_position_embeddings: 4096 * 32,
        rms_norm_eps: 1e-5,
        rope_theta: 1e6,
        tie_word_embeddings: false,
        bos_token_id: Some(1),
        eos_token_ids: &[2],
    },
    heads_divide_hidden: false,
    expert_names: ExpertNames {
        router: "block_sparse_moe.gate",
        experts: "block_sparse_moe.experts",
        gate: "w1",
        up: "w3",
        down: "w2",
    },
    parse,
    ..super::llama::SPEC
};

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    c.sliding_window = o.size_opt("sliding_window")?;
    // `router_jitter_noise` is training-time noise (transformers applies it
    // only in training): read for its type, not used.
    o.f64_opt("router_jitter_noise")?;
    c.params.moe = Some(MoeParams {
        num_experts: o.size_opt("num_local_experts")?.unwrap_or(8),
        num_experts_per_tok: o.size_opt("num_experts_per_tok")?.unwrap_or(2),
        // Every expert has the MLP's width.
        moe_intermediate_size: c.intermediate_size,
        norm_topk_prob: true,
        sparse_layers: Vec::new(),
    });
    Ok(())
}
