//! `Qwen2ForCausalLM`: Llama with a bias on the q, k and v projections (none
//! on o). Its `sliding_window` applies only when `use_sliding_window` is true,
//! and then only to the layers from `max_window_layers` on (or those
//! `layer_types` marks `"sliding_attention"`): a configuration where some
//! layers slide and others do not is refused.

use super::{ArchSpec, Defaults};
use crate::config::{Architecture, ModelConfig, Obj};
use crate::error::LlmError;

pub(super) const SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Qwen2,
    hf_class: "Qwen2ForCausalLM",
    model_type: "qwen2",
    gguf_arch: "qwen2",
    defaults: Defaults {
        num_key_value_heads: Some(32),
        head_dim: None,
        max_position_embeddings: 32768,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_ids: &[],
    },
    heads_divide_hidden: false,
    gguf_permuted_qk: false,
    parse,
    gguf_config: qkv_bias,
    ..super::llama::SPEC
};

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    (c.qkv_bias, c.o_bias) = (true, false);
    c.sliding_window = sliding_window(o, c.num_hidden_layers)?;
    Ok(())
}

/// A GGUF `qwen2` file has the q, k and v biases.
fn qkv_bias(_: &super::GgufMeta<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    c.qkv_bias = true;
    Ok(())
}

/// Qwen2's window: `sliding_window` when `use_sliding_window` is true, on the
/// layers `layer_types` marks sliding (by default those from
/// `max_window_layers` on). One window for every layer, or none.
#[warn(clippy::arithmetic_side_effects)]
pub(super) fn sliding_window(
    o: &Obj<'_>,
    num_hidden_layers: usize,
) -> Result<Option<usize>, LlmError> {
    let use_sliding = o.bool_opt("use_sliding_window")?.unwrap_or(false);
    let window = if !use_sliding {
        None
    } else if o.has("sliding_window") {
        o.size_opt("sliding_window")?
    } else {
        Some(4096)
    };
    // A sliding layer without a window attends to everything.
    let per_layer = |s: bool| if s { window } else { None };
    let differs = |i: usize| {
        o.err(
            if o.has("layer_types") {
                "layer_types"
            } else {
                "max_window_layers"
            },
            format!(
                "sliding-window attention on some layers only (layer {i} differs from layer 0) is not supported"
            ),
        )
    };
    match o.get("layer_types") {
        Some(v) => {
            let Some(list) = v.as_array() else {
                return Err(o.err("layer_types", format!("expected a list, found {v}")));
            };
            if list.len() != num_hidden_layers {
                return Err(o.err(
                    "layer_types",
                    format!("{} entries for {num_hidden_layers} layers", list.len()),
                ));
            }
            let mut first = None;
            for (i, t) in list.iter().enumerate() {
                let sliding = match t.as_str() {
                    Some("full_attention") => false,
                    Some("sliding_attention") => true,
                    _ => {
                        return Err(o.err(
                            "layer_types",
                            format!(
                                "unsupported layer type {t} (supported: \"full_attention\", \"sliding_attention\")"
                            ),
                        ));
                    }
                };
                match first {
                    None => first = Some(per_layer(sliding)),
                    Some(f) if f != per_layer(sliding) => return Err(differs(i)),
                    Some(_) => {}
                }
            }
            Ok(first.flatten())
        }
        None => {
            // Layers from `max_window_layers` on slide: all of them (from 0),
            // none (from the layer count on) or a mix. The count comes from the
            // file, so it is compared, never iterated.
            let max_window_layers = o.usize_opt("max_window_layers")?.unwrap_or(28);
            let first = per_layer(max_window_layers == 0);
            if max_window_layers < num_hidden_layers && per_layer(true) != first {
                return Err(differs(max_window_layers));
            }
            Ok(first)
        }
    }
}
