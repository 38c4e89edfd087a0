//! `MixtralForCausalLM`: Mistral's attention (one sliding window for every
//! layer when `sliding_window` is set) with a mixture of experts in every
//! layer's place of the MLP: the router `block_sparse_moe.gate`, the experts
//! `block_sparse_moe.experts.{e}.{w1,w3,w2}` (gate, up, down),
//! `num_experts_per_tok` of `num_local_experts` per token, their
//! probabilities always normalized.
//!
//! In GGUF, llama.cpp writes Mixtral as its `llama` architecture with
//! experts: `llama.expert_count` and `llama.expert_used_count` (a `llama`
//! file with `llama.expert_count` is read with this spec), the router
//! `ffn_gate_inp` and each layer's experts stacked in `ffn_gate_exps`,
//! `ffn_up_exps`, `ffn_down_exps` (`[experts, out, in]`, each expert's slice
//! kept mapped), the q and k rows in llama.cpp's rotary order as for Llama.
//! Every expert has `llama.feed_forward_length` rows. Older llama.cpp files
//! with one tensor per expert (`blk.N.ffn_gate.E.weight`) are refused with an
//! error naming the tensor. The window, which llama.cpp does not record for
//! Mixtral, is read from `llama.attention.sliding_window` when present.

use super::{ArchSpec, COMMON_LAYER_NAMES, Defaults, ExpertNames, GgufMeta, MoeParams};
use crate::config::{Architecture, ModelConfig, Obj};
use crate::error::LlmError;

/// Llama's attention tensors and the experts' (`*` stands for the expert
/// index); Mixtral has no dense MLP.
const NAMES: [(&str, &str); 10] = {
    let c = COMMON_LAYER_NAMES;
    [
        c[0],
        c[1],
        c[2],
        c[3],
        c[4],
        c[8],
        ("ffn_gate_inp", "block_sparse_moe.gate"),
        ("ffn_gate_exps", "block_sparse_moe.experts.*.w1"),
        ("ffn_up_exps", "block_sparse_moe.experts.*.w3"),
        ("ffn_down_exps", "block_sparse_moe.experts.*.w2"),
    ]
};

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
    gguf_layer_names: &NAMES,
    parse,
    gguf_config,
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

fn gguf_config(m: &GgufMeta<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    let need = |k: &str| {
        m.u64_opt(k)?.ok_or_else(|| LlmError::BadFile {
            path: m.file.path().to_path_buf(),
            reason: format!("metadata {}.{k} is missing", m.arch),
        })
    };
    // One tensor per expert, as llama.cpp wrote Mixtral before it stacked
    // them: refused by name rather than read as a model without experts.
    let per_expert = |name: &str| {
        let parts: Vec<&str> = name.split('.').collect();
        matches!(parts.as_slice(), ["blk", _, "ffn_gate" | "ffn_up" | "ffn_down", e, _]
            if e.parse::<usize>().is_ok())
    };
    if let Some(t) = m.file.tensors().iter().find(|t| per_expert(&t.name)) {
        return Err(LlmError::BadTensor {
            name: t.name.clone(),
            reason: "one tensor per expert (an older llama.cpp layout) is not supported: \
                     requantize the file with a current llama.cpp, which stacks them"
                .into(),
        });
    }
    c.sliding_window = m.window_opt("attention.sliding_window")?;
    c.params.moe = Some(MoeParams {
        num_experts: need("expert_count")?,
        num_experts_per_tok: need("expert_used_count")?,
        moe_intermediate_size: c.intermediate_size,
        norm_topk_prob: true,
        sparse_layers: Vec::new(),
    });
    Ok(())
}
