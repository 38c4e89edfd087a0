//! `Gemma3ForCausalLM` (text): Gemma 2's layers with an RMSNorm (`1 + w`)
//! over each q and k head, no soft-capping unless the config asks for it, and
//! local (sliding) and global layers in a 5:1 pattern (every
//! `sliding_window_pattern`-th layer global, unless `layer_types` says
//! otherwise), each kind with its own RoPE base: the global layers
//! `rope_parameters.full_attention` (or `rope_theta`, 1e6, with
//! `rope_scaling`), the local ones `rope_parameters.sliding_attention` (or
//! `rope_local_base_freq`, 1e4), unscaled.
//!
//! In GGUF (llama.cpp's `gemma3`): `gemma3.rope.freq_base` is the global
//! base, `gemma3.rope.freq_base_swa` the local one (1e4 when absent, as
//! llama.cpp fixes it), and every sixth layer is global (as llama.cpp fixes
//! it); the rest as for Gemma 2.

use serde_json::Map;

use super::gemma2::{f32_or, gguf_gemma, parse_gemma};
use super::{ArchSpec, Defaults, GgufMeta, layer_types};
use crate::config::{Architecture, ModelConfig, Obj, RopeScaling, parse_rope, rope_object};
use crate::error::LlmError;

/// Gemma 2's tensors and the q/k norms.
const NAMES: [(&str, &str); 13] = {
    let g = super::gemma2::NAMES;
    [
        g[0],
        g[1],
        g[2],
        g[3],
        g[4],
        g[5],
        g[6],
        g[7],
        g[8],
        g[9],
        g[10],
        ("attn_q_norm", "self_attn.q_norm"),
        ("attn_k_norm", "self_attn.k_norm"),
    ]
};

/// The local layers' RoPE base when the config does not give it.
const LOCAL_THETA: f64 = 10_000.0;

pub(super) const SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Gemma3,
    hf_class: "Gemma3ForCausalLM",
    model_type: "gemma3_text",
    gguf_arch: "gemma3",
    defaults: Defaults {
        num_key_value_heads: Some(4),
        head_dim: Some(256),
        max_position_embeddings: 131_072,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: true,
        bos_token_id: Some(2),
        eos_token_ids: &[1],
    },
    qk_norm: true,
    rope,
    parse,
    gguf_config,
    gguf_layer_names: &NAMES,
    ..super::gemma2::SPEC
};

/// `rope_parameters`' object for `layer` (`full_attention` or
/// `sliding_attention`), when the config gives RoPE parameters per layer type.
fn per_type<'a>(o: &'a Obj<'_>, layer: &str) -> Option<&'a Map<String, serde_json::Value>> {
    o.get("rope_parameters")?.get(layer)?.as_object()
}

/// The global layers' RoPE.
fn rope(o: &Obj<'_>, max_pos: usize, default_theta: f64) -> Result<(f64, RopeScaling), LlmError> {
    match per_type(o, "full_attention") {
        Some(map) if o.get("rope_scaling").is_none() => {
            let p = Obj {
                map,
                path: o.path,
                at: "rope_parameters.full_attention.",
            };
            rope_object(o, &p, None, default_theta, max_pos, false)
        }
        _ => parse_rope(o, max_pos, default_theta),
    }
}

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    parse_gemma(o, c, (None, None))?;
    let period = o.size_opt("sliding_window_pattern")?.unwrap_or(6);
    c.params.sliding_layers =
        layer_types(o, c.num_hidden_layers, |i| !(i + 1).is_multiple_of(period))?;
    let local = match per_type(o, "sliding_attention") {
        Some(map) => {
            let p = Obj {
                map,
                path: o.path,
                at: "rope_parameters.sliding_attention.",
            };
            let (theta, scaling) =
                rope_object(o, &p, None, LOCAL_THETA, c.max_position_embeddings, false)?;
            if scaling != RopeScaling::None {
                return Err(o.err(
                    "rope_parameters.sliding_attention",
                    "RoPE scaling on the local layers is not supported".to_string(),
                ));
            }
            theta
        }
        None => f32_or(o, "rope_local_base_freq", Some(LOCAL_THETA as f32))?
            .map_or(LOCAL_THETA, f64::from),
    };
    c.params.local_rope_theta = Some(local as f32);
    Ok(())
}

fn gguf_config(m: &GgufMeta<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    gguf_gemma(m, c, 6)?;
    c.params.local_rope_theta = Some(
        m.f32_opt("rope.freq_base_swa")?
            .unwrap_or(LOCAL_THETA as f32),
    );
    Ok(())
}
