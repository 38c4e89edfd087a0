//! `Qwen3MoeForCausalLM`: Qwen3's attention (q/k norms per head) with a
//! mixture of experts in place of the MLP on the sparse layers (every
//! `decoder_sparse_step`-th, except `mlp_only_layers`): the router
//! `mlp.gate` `[num_experts, hidden]`, the experts
//! `mlp.experts.{e}.{gate,up,down}_proj`, `num_experts_per_tok` of them per
//! token, their probabilities normalized when `norm_topk_prob`.
//!
//! In GGUF (llama.cpp's `qwen3moe`): `qwen3moe.expert_count`,
//! `qwen3moe.expert_used_count`, `qwen3moe.expert_feed_forward_length`, the
//! router `ffn_gate_inp` and the experts stacked in `ffn_gate_exps`,
//! `ffn_up_exps`, `ffn_down_exps` (`[experts, out, in]`, each expert's slice
//! kept mapped); a layer without a router has the dense `ffn_gate`,
//! `ffn_up`, `ffn_down`; the probabilities are normalized, as llama.cpp runs
//! them.

use super::{ArchSpec, Defaults, GgufMeta, MoeParams, qwen3};
use crate::config::{Architecture, ModelConfig, Obj};
use crate::error::LlmError;

/// Qwen3's tensors and the experts' (`*` stands for the expert index).
const NAMES: [(&str, &str); 15] = {
    let q = qwen3::NAMES;
    [
        q[0],
        q[1],
        q[2],
        q[3],
        q[4],
        q[5],
        q[6],
        q[7],
        q[8],
        q[9],
        q[10],
        ("ffn_gate_inp", "mlp.gate"),
        ("ffn_gate_exps", "mlp.experts.*.gate_proj"),
        ("ffn_up_exps", "mlp.experts.*.up_proj"),
        ("ffn_down_exps", "mlp.experts.*.down_proj"),
    ]
};

pub(super) const SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Qwen3Moe,
    hf_class: "Qwen3MoeForCausalLM",
    model_type: "qwen3_moe",
    gguf_arch: "qwen3moe",
    defaults: Defaults {
        num_key_value_heads: Some(4),
        head_dim: None,
        max_position_embeddings: 32768,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_ids: &[],
    },
    parse,
    gguf_config,
    gguf_layer_names: &NAMES,
    ..super::qwen3::SPEC
};

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    let b = o.bool_opt("attention_bias")?.unwrap_or(false);
    (c.qkv_bias, c.o_bias) = (b, b);
    c.sliding_window = super::qwen2::sliding_window(o, c.num_hidden_layers)?;
    // transformers 5 writes `num_local_experts` (its alias of `num_experts`).
    let num_experts = match o.size_opt("num_experts")? {
        Some(n) => n,
        None => o.size_opt("num_local_experts")?.unwrap_or(128),
    };
    let step = o.size_opt("decoder_sparse_step")?.unwrap_or(1);
    let dense: Vec<usize> = match o.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|l| {
                l.iter()
                    .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| {
                o.err(
                    "mlp_only_layers",
                    format!("expected a list of layer indices, found {v}"),
                )
            })?,
    };
    c.params.moe = Some(MoeParams {
        num_experts,
        num_experts_per_tok: o.size_opt("num_experts_per_tok")?.unwrap_or(8),
        moe_intermediate_size: o.size_opt("moe_intermediate_size")?.unwrap_or(768),
        norm_topk_prob: o.bool_opt("norm_topk_prob")?.unwrap_or(false),
        sparse_layers: (0..c.num_hidden_layers)
            .map(|i| !dense.contains(&i) && (i + 1).is_multiple_of(step))
            .collect(),
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
    c.params.moe = Some(MoeParams {
        num_experts: need("expert_count")?,
        num_experts_per_tok: need("expert_used_count")?,
        moe_intermediate_size: need("expert_feed_forward_length")?,
        norm_topk_prob: true,
        // A layer with a router is sparse; the others have a dense MLP.
        sparse_layers: (0..c.num_hidden_layers)
            .map(|i| {
                let router = format!("blk.{i}.ffn_gate_inp.weight");
                m.file.tensors().iter().any(|t| t.name == router)
            })
            .collect(),
    });
    Ok(())
}
