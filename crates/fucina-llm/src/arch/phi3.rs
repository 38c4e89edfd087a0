//! `Phi3ForCausalLM`: Llama with the q, k and v projections fused into one
//! matrix (`self_attn.qkv_proj`, rows `[q; k; v]`) and the MLP's gate and up
//! projections into another (`mlp.gate_up_proj`, rows `[gate; up]`), split
//! after each product; a `sliding_window` (none when absent) on every layer;
//! and LongRoPE (`rope_type: "longrope"`: short and long per-frequency
//! factors, the attention factor on the cosines and sines; see
//! [`LongRope`]).
//!
//! In GGUF (llama.cpp's `phi3`): `attn_qkv` and `ffn_up` (which holds gate and
//! up), the LongRoPE factors as the tensors `rope_factors_short.weight` and
//! `rope_factors_long.weight`, the original context as
//! `phi3.rope.scaling.original_context_length` and the attention factor as
//! `phi3.rope.scaling.attn_factor` (computed as transformers does when
//! absent).
//!
//! `partial_rotary_factor` (Phi-4-mini: 0.75, at the top level or in the RoPE
//! object) rotates only the first `int(head_dim · factor)` dimensions of each
//! head ([`ArchParams::rotary_dim`](super::ArchParams::rotary_dim)), the
//! LongRoPE factors then one per pair of those; in GGUF it is
//! `phi3.rope.dimension_count` below the head dim.

use serde_json::{Map, Value};

use super::{ArchSpec, COMMON_LAYER_NAMES, Defaults, GgufMeta, LongRope};
use crate::config::{Architecture, ModelConfig, Obj, RopeScaling, parse_rope_with};
use crate::error::LlmError;

/// Phi-3's tensors: the common ones with the fused projections.
const NAMES: [(&str, &str); 6] = {
    let c = COMMON_LAYER_NAMES;
    [
        c[0],
        ("attn_qkv", "self_attn.qkv_proj"),
        c[4],
        ("ffn_up", "mlp.gate_up_proj"),
        c[7],
        c[8],
    ]
};

pub(super) const SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Phi3,
    hf_class: "Phi3ForCausalLM",
    model_type: "phi3",
    gguf_arch: "phi3",
    defaults: Defaults {
        num_key_value_heads: None,
        head_dim: None,
        max_position_embeddings: 4096,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        tie_word_embeddings: false,
        bos_token_id: Some(1),
        eos_token_ids: &[32000],
    },
    heads_divide_hidden: false,
    fused_qkv: true,
    fused_gate_up: true,
    gguf_permuted_qk: false,
    gguf_layer_names: &NAMES,
    rope,
    parse,
    gguf_config,
    ..super::llama::SPEC
};

/// The RoPE object of the config when its type is `longrope`, with its key.
fn longrope_object<'a>(o: &'a Obj<'_>) -> Option<(&'static str, &'a Map<String, Value>)> {
    let nonempty = |key: &'static str| {
        o.get(key)
            .and_then(Value::as_object)
            .filter(|m| !m.is_empty())
            .map(|m| (key, m))
    };
    let (key, map) = nonempty("rope_scaling").or_else(|| nonempty("rope_parameters"))?;
    let ty = map.get("rope_type").or_else(|| map.get("type"))?;
    (ty.as_str() == Some("longrope")).then_some((key, map))
}

fn rope(o: &Obj<'_>, max_pos: usize, default_theta: f64) -> Result<(f64, RopeScaling), LlmError> {
    let Some((key, map)) = longrope_object(o) else {
        return parse_rope_with(o, max_pos, default_theta, true);
    };
    let at = format!("{key}.");
    let p = Obj {
        map,
        path: o.path,
        at: &at,
    };
    let theta = match p.positive_opt("rope_theta")? {
        Some(t) => t,
        None => o.positive_opt("rope_theta")?.unwrap_or(default_theta),
    };
    Ok((theta, RopeScaling::None))
}

/// A list of `len` positive finite f32 factors under `key` of `p`.
fn factors(p: &Obj<'_>, key: &str, len: usize) -> Result<Vec<f32>, LlmError> {
    let Some(Value::Array(items)) = p.get(key) else {
        return Err(p.err(key, "missing or not a list (required)".to_string()));
    };
    if items.len() != len {
        return Err(p.err(
            key,
            format!("{} factors, expected rotary_dim / 2 = {len}", items.len()),
        ));
    }
    items
        .iter()
        .map(|v| {
            v.as_f64()
                .map(|x| x as f32)
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| p.err(key, format!("{v} is not a positive finite f32")))
        })
        .collect()
}

/// transformers' default attention factor: `sqrt(1 + ln(factor) /
/// ln(original))` when `factor > 1`, else 1.
fn default_attention_factor(factor: f64, original: usize) -> f32 {
    if factor <= 1.0 || original <= 1 {
        1.0
    } else {
        (1.0 + factor.ln() / (original as f64).ln()).sqrt() as f32
    }
}

/// `partial_rotary_factor` at the top level of the config or in its RoPE
/// object (`rope_scaling` or `rope_parameters`), as the rotary dimensions it
/// gives: `int(head_dim · factor)` (transformers' rule), `None` for 1.
fn partial_rotary(o: &Obj<'_>, head_dim: usize) -> Result<Option<usize>, LlmError> {
    for key in ["rope_scaling", "rope_parameters"] {
        if let Some(map) = o.get(key).and_then(Value::as_object) {
            let at = format!("{key}.");
            let p = Obj {
                map,
                path: o.path,
                at: &at,
            };
            if let Some(f) = p.f64_opt("partial_rotary_factor")? {
                return rotary_dims(&p, f, head_dim);
            }
        }
    }
    match o.f64_opt("partial_rotary_factor")? {
        Some(f) => rotary_dims(o, f, head_dim),
        None => Ok(None),
    }
}

/// The rotary dimensions a `partial_rotary_factor` of `f` (read from `q`)
/// gives a head of `head_dim`.
fn rotary_dims(q: &Obj<'_>, f: f64, head_dim: usize) -> Result<Option<usize>, LlmError> {
    if f == 1.0 {
        return Ok(None);
    }
    let dims = head_dim as f64 * f;
    if !(f > 0.0 && f < 1.0) || dims < 2.0 || !(dims as usize).is_multiple_of(2) {
        return Err(q.err(
            "partial_rotary_factor",
            format!(
                "{f}: the rotary part of a head of {head_dim} must be an even number of dimensions in 2..{head_dim}"
            ),
        ));
    }
    Ok(Some(dims as usize))
}

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    c.sliding_window = o.size_opt("sliding_window")?;
    c.params.rotary_dim = partial_rotary(o, c.head_dim)?;
    let Some((key, map)) = longrope_object(o) else {
        return Ok(());
    };
    let at = format!("{key}.");
    let p = Obj {
        map,
        path: o.path,
        at: &at,
    };
    let half = c.rotary_dim() / 2;
    let original = match p.size_opt("original_max_position_embeddings")? {
        Some(n) => n,
        None => o
            .size_opt("original_max_position_embeddings")?
            .unwrap_or(c.max_position_embeddings),
    };
    let factor = match p.positive_opt("factor")? {
        Some(f) => f,
        None => c.max_position_embeddings as f64 / original as f64,
    };
    let attention_factor = match p.positive_opt("attention_factor")? {
        Some(_) => p.positive_f32("attention_factor")?,
        None => default_attention_factor(factor, original),
    };
    c.params.longrope = Some(LongRope {
        short_factor: factors(&p, "short_factor", half)?,
        long_factor: factors(&p, "long_factor", half)?,
        original_max_position_embeddings: original,
        attention_factor,
    });
    Ok(())
}

/// The f32 values of the GGUF tensor `name` (F32, `len` of them).
fn f32_tensor(m: &GgufMeta<'_>, name: &str, len: usize) -> Result<Vec<f32>, LlmError> {
    let (info, bytes) = m.file.tensor(name)?;
    if info.ggml_type.format() != Some(fucina::exec::TensorFormat::F32) || bytes.len() != 4 * len {
        return Err(LlmError::BadTensor {
            name: name.to_string(),
            reason: format!(
                "expected {len} F32 values, found type {} of {} bytes",
                info.ggml_type.name(),
                bytes.len()
            ),
        });
    }
    let v: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if let Some(x) = v.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        return Err(LlmError::BadTensor {
            name: name.to_string(),
            reason: format!("factor {x} is not positive and finite"),
        });
    }
    Ok(v)
}

fn gguf_config(m: &GgufMeta<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    c.sliding_window = m.window_opt("attention.sliding_window")?;
    let has = |n: &str| m.file.tensors().iter().any(|t| t.name == n);
    if !has("rope_factors_short.weight") && !has("rope_factors_long.weight") {
        return Ok(());
    }
    let half = c.rotary_dim() / 2;
    let original = m
        .u64_opt("rope.scaling.original_context_length")?
        .unwrap_or(c.max_position_embeddings);
    let attention_factor = match m.f32_opt("rope.scaling.attn_factor")? {
        Some(f) => f,
        None => {
            default_attention_factor(c.max_position_embeddings as f64 / original as f64, original)
        }
    };
    c.params.longrope = Some(LongRope {
        short_factor: f32_tensor(m, "rope_factors_short.weight", half)?,
        long_factor: f32_tensor(m, "rope_factors_long.weight", half)?,
        original_max_position_embeddings: original,
        attention_factor,
    });
    Ok(())
}
