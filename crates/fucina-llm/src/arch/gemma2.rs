//! `Gemma2ForCausalLM`: GeGLU (tanh GELU), `1 + w` RMSNorms, a sandwich of
//! norms around attention and the MLP, embeddings scaled by `sqrt(hidden)`,
//! attention and final-logit soft-capping, queries scaled by
//! `query_pre_attn_scalar^-0.5`, and sliding-window attention on every other
//! layer (the even ones, unless `layer_types` says otherwise).
//!
//! In GGUF (llama.cpp's `gemma2`): the norms hold `1 + w` already, the
//! window is `gemma2.attention.sliding_window`, the caps
//! `gemma2.attn_logit_softcapping` and `gemma2.final_logit_softcapping`, and
//! the query scale is `key_length^-0.5` (as llama.cpp computes it for the 2B
//! and 9B models; a 27B model's `hidden / heads` is not recorded in the file).

use super::{Activation, ArchSpec, COMMON_LAYER_NAMES, Defaults, GgufMeta, NormStyle, layer_types};
use crate::config::{Architecture, ModelConfig, Obj};
use crate::error::LlmError;

/// Gemma's tensors: the common ones, with llama.cpp's `ffn_norm` the
/// pre-feed-forward norm, and the two post norms.
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
        ("ffn_norm", "pre_feedforward_layernorm"),
        ("post_attention_norm", "post_attention_layernorm"),
        ("post_ffw_norm", "post_feedforward_layernorm"),
    ]
};

pub(super) const SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Gemma2,
    hf_class: "Gemma2ForCausalLM",
    model_type: "gemma2",
    gguf_arch: "gemma2",
    defaults: Defaults {
        num_key_value_heads: Some(4),
        head_dim: Some(256),
        max_position_embeddings: 8192,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        tie_word_embeddings: true,
        bos_token_id: Some(2),
        eos_token_ids: &[1],
    },
    heads_divide_hidden: false,
    activation: Activation::GeluTanh,
    norm: NormStyle::RmsOnePlus,
    sandwich_norms: true,
    embed_scale: true,
    gguf_permuted_qk: false,
    gguf_layer_names: &NAMES,
    parse,
    gguf_config,
    ..super::llama::SPEC
};

/// A positive number that is absent (`default`) or `null` (none).
pub(super) fn f32_or(
    o: &Obj<'_>,
    key: &str,
    default: Option<f32>,
) -> Result<Option<f32>, LlmError> {
    if !o.has(key) {
        return Ok(default);
    }
    Ok(match o.positive_opt(key)? {
        Some(_) => Some(o.positive_f32(key)?),
        None => None,
    })
}

/// The keys Gemma 2 and Gemma 3 share: the bias switch, the window, the query
/// scale and the caps (`caps`: Gemma 2's defaults).
pub(super) fn parse_gemma(
    o: &Obj<'_>,
    c: &mut ModelConfig,
    caps: (Option<f32>, Option<f32>),
) -> Result<(), LlmError> {
    let b = o.bool_opt("attention_bias")?.unwrap_or(false);
    (c.qkv_bias, c.o_bias) = (b, b);
    c.sliding_window = if o.has("sliding_window") {
        o.size_opt("sliding_window")?
    } else {
        Some(4096)
    };
    c.params.query_pre_attn_scalar = f32_or(o, "query_pre_attn_scalar", Some(256.0))?;
    c.params.attn_logit_softcapping = f32_or(o, "attn_logit_softcapping", caps.0)?;
    c.params.final_logit_softcapping = f32_or(o, "final_logit_softcapping", caps.1)?;
    Ok(())
}

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    parse_gemma(o, c, (Some(50.0), Some(30.0)))?;
    c.params.sliding_layers = layer_types(o, c.num_hidden_layers, |i| i % 2 == 0)?;
    Ok(())
}

/// The GGUF keys Gemma 2 and Gemma 3 share (the window, the query scale of
/// llama.cpp, norms holding `1 + w`), with every `period`-th layer global.
pub(super) fn gguf_gemma(
    m: &GgufMeta<'_>,
    c: &mut ModelConfig,
    period: usize,
) -> Result<(), LlmError> {
    c.sliding_window = m.window_opt("attention.sliding_window")?;
    c.params.sliding_layers = (0..c.num_hidden_layers)
        .map(|i| !(i + 1).is_multiple_of(period))
        .collect();
    c.params.query_pre_attn_scalar = Some(c.head_dim as f32);
    c.params.norms_include_one = true;
    Ok(())
}

fn gguf_config(m: &GgufMeta<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    gguf_gemma(m, c, 2)?;
    c.params.attn_logit_softcapping = m.f32_opt("attn_logit_softcapping")?;
    c.params.final_logit_softcapping = m.f32_opt("final_logit_softcapping")?;
    Ok(())
}
