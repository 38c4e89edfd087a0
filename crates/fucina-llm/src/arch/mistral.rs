//! `MistralForCausalLM`: Llama with one sliding window for every layer
//! (`sliding_window`, 4096 when absent, none when `null`). No biases.

use super::{ArchSpec, Defaults};
use crate::config::{Architecture, ModelConfig, Obj};
use crate::error::LlmError;

pub(super) const SPEC: ArchSpec = ArchSpec {
    architecture: Architecture::Mistral,
    hf_class: "MistralForCausalLM",
    model_type: "mistral",
    // GGUF: Llama's `llama` (llama.cpp converts Mistral models to it; such a
    // file loads as Llama, without a window).
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
    parse,
    ..super::llama::SPEC
};

fn parse(o: &Obj<'_>, c: &mut ModelConfig) -> Result<(), LlmError> {
    c.sliding_window = if o.has("sliding_window") {
        o.size_opt("sliding_window")?
    } else {
        Some(4096)
    };
    Ok(())
}
