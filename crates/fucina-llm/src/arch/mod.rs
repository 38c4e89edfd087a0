//! The architecture seam: one [`ArchSpec`] per decoder family, each in its own
//! file, saying what differs from the Llama decoder — the names and defaults of
//! its `config.json`, its GGUF key prefix and tensor names, its activation and
//! norm, the extra norms and scales it applies — so that the decoder
//! ([`crate::model`]) and the loaders ([`crate::config`], [`gguf`]) read the
//! spec instead of testing the architecture.
//!
//! What a spec fixes is the same for every model of the family (Gemma 2's
//! `1 + w` norms); what a model's files choose (its soft-capping values, which
//! layers slide) is read by the spec's hooks into [`ModelConfig`] and its
//! [`ArchParams`].
//!
//! | architecture | file | activation | norm | q/k norm | extra |
//! | --- | --- | --- | --- | --- | --- |
//! | `LlamaForCausalLM` | `llama.rs` | SwiGLU | RMSNorm | no | `attention_bias` |
//! | `MistralForCausalLM` | `mistral.rs` | SwiGLU | RMSNorm | no | one sliding window |
//! | `Qwen2ForCausalLM` | `qwen2.rs` | SwiGLU | RMSNorm | no | q/k/v bias |
//! | `Qwen3ForCausalLM` | `qwen3.rs` | SwiGLU | RMSNorm | per head | |
//! | `Gemma2ForCausalLM` | `gemma2.rs` | GeGLU (tanh) | `1 + w` | no | sandwich norms, √hidden embedding scale, soft-capping, alternating windows |
//! | `Gemma3ForCausalLM` | `gemma3.rs` | GeGLU (tanh) | `1 + w` | per head | sandwich norms, √hidden embedding scale, local/global layers with their own RoPE bases |
//! | `Phi3ForCausalLM` | `phi3.rs` | SwiGLU | RMSNorm | no | fused `qkv_proj` and `gate_up_proj`, `longrope` |
//! | `Qwen3MoeForCausalLM` | `qwen3_moe.rs` | SwiGLU experts | RMSNorm | per head | top-k routed experts |
//! | `MixtralForCausalLM` | `mixtral.rs` | SwiGLU experts | RMSNorm | no | Mistral's attention, top-k routed experts (normalized) |

mod gemma2;
mod gemma3;
pub mod gguf;
mod llama;
mod mistral;
mod mixtral;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_moe;

use crate::config::{Architecture, ModelConfig, Obj, RopeScaling};
use crate::error::LlmError;
use crate::gguf::GgufFile;

/// The MLP's gated activation: `down(act(gate(x)) · up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `act = silu`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// How a norm applies its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormStyle {
    /// RMSNorm: `w · x / rms(x)`.
    Rms,
    /// RMSNorm with `1 + w` (Gemma): `(1 + w) · x / rms(x)`, the sum formed
    /// in f32 at load.
    RmsOnePlus,
}

/// What `config.json` means when it leaves a key out (the defaults of the
/// architecture's `transformers` config class).
#[derive(Clone, Copy, Debug)]
pub struct Defaults {
    /// `num_key_value_heads` when absent (`None`: as many as the query heads).
    pub num_key_value_heads: Option<usize>,
    /// `head_dim` when absent (`None`: `hidden_size / num_attention_heads`).
    pub head_dim: Option<usize>,
    /// `max_position_embeddings` when absent.
    pub max_position_embeddings: usize,
    /// `rms_norm_eps` when absent.
    pub rms_norm_eps: f64,
    /// `rope_theta` when absent.
    pub rope_theta: f64,
    /// `tie_word_embeddings` when absent.
    pub tie_word_embeddings: bool,
    /// `bos_token_id` when absent.
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` when absent.
    pub eos_token_ids: &'static [u32],
}

/// The parameters of a model that its architecture adds to the Llama decoder,
/// read from its files (all off by default: a Llama model).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArchParams {
    /// Which layers use [`ModelConfig::sliding_window`]: empty when every
    /// layer does (or none, when there is no window); else one entry per
    /// layer.
    pub sliding_layers: Vec<bool>,
    /// Attention scores become `cap · tanh(score / cap)` before the softmax.
    pub attn_logit_softcapping: Option<f32>,
    /// Logits become `cap · tanh(logit / cap)`.
    pub final_logit_softcapping: Option<f32>,
    /// Queries are scaled by `query_pre_attn_scalar^-0.5` instead of
    /// `head_dim^-0.5`.
    pub query_pre_attn_scalar: Option<f32>,
    /// The RoPE base of the sliding layers, when it differs from
    /// [`ModelConfig::rope_theta`] (Gemma 3's local layers; without scaling).
    pub local_rope_theta: Option<f32>,
    /// A mixture of experts in place of the MLP (Qwen3-MoE).
    pub moe: Option<MoeParams>,
    /// LongRoPE (Phi-3's `longrope`): per-frequency divisors of the inverse
    /// frequencies, short or long by position, and a factor on the cosines
    /// and sines.
    pub longrope: Option<LongRope>,
    /// RoPE rotates only the first `rotary_dim` dimensions of each head
    /// (Phi-4-mini's `partial_rotary_factor`, `int(head_dim · factor)`; even);
    /// `None` when it rotates all of them. See [`ModelConfig::rotary_dim`].
    pub rotary_dim: Option<usize>,
    /// The stored norm weights already hold the `1` of a
    /// [`NormStyle::RmsOnePlus`] norm (llama.cpp's converter adds it to the
    /// norms of Gemma models).
    pub norms_include_one: bool,
}

/// A mixture-of-experts MLP: each token's `num_experts_per_tok` most likely
/// experts (softmax of the router's logits), weighted by their probabilities
/// (divided by their sum when `norm_topk_prob`).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeParams {
    /// Experts per sparse layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub num_experts_per_tok: usize,
    /// Width of an expert's MLP.
    pub moe_intermediate_size: usize,
    /// The chosen probabilities are normalized to sum to 1.
    pub norm_topk_prob: bool,
    /// Which layers are sparse (empty: all; the others have the dense MLP of
    /// `intermediate_size`).
    pub sparse_layers: Vec<bool>,
}

/// LongRoPE's parameters (`rope_type: "longrope"`): the inverse frequency `i`
/// of a position `p` is `1 / (factor[i] · theta^(2i / head_dim))`, with the
/// short factors while `p + 1 <= original_max_position_embeddings` and the
/// long ones after (as transformers chooses them for the token it decodes),
/// and every cosine and sine is multiplied by `attention_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// The divisors within the original context (`head_dim / 2` of them).
    pub short_factor: Vec<f32>,
    /// The divisors past it (`head_dim / 2` of them).
    pub long_factor: Vec<f32>,
    /// The context length the model was trained with.
    pub original_max_position_embeddings: usize,
    /// The factor on the cosines and sines.
    pub attention_factor: f32,
}

/// Reads the RoPE base and scaling of a `config.json`.
pub(crate) type RopeParser = fn(&Obj<'_>, usize, f64) -> Result<(f64, RopeScaling), LlmError>;

/// The GGUF metadata of one file under its architecture's key prefix.
pub(crate) struct GgufMeta<'a> {
    /// The file.
    pub(crate) file: &'a GgufFile,
    /// `general.architecture`: the prefix of the architecture's keys.
    pub(crate) arch: &'a str,
}

/// One decoder family: what the decoder and the loaders read instead of
/// testing the architecture.
#[derive(Debug)]
pub struct ArchSpec {
    /// The architecture.
    pub architecture: Architecture,
    /// Its class name in `config.json`'s `architectures` list.
    pub hf_class: &'static str,
    /// Its `model_type` in `config.json`.
    pub model_type: &'static str,
    /// Its `general.architecture` in a GGUF file, the prefix of its keys
    /// (`{arch}.block_count`).
    pub gguf_arch: &'static str,
    /// Defaults of `config.json`.
    pub defaults: Defaults,
    /// `transformers` refuses a `hidden_size` that the heads do not divide even
    /// when `head_dim` is given.
    pub heads_divide_hidden: bool,
    /// The MLP's activation.
    pub activation: Activation,
    /// How the norms apply their weights.
    pub norm: NormStyle,
    /// An RMSNorm over each head of q and k (`self_attn.q_norm`,
    /// `self_attn.k_norm`, `[head_dim]`), before RoPE.
    pub qk_norm: bool,
    /// Gemma's sandwich: the attention output and the MLP output are normed
    /// (`post_attention_layernorm`, `post_feedforward_layernorm`) before their
    /// residual adds, and the MLP's input norm is `pre_feedforward_layernorm`.
    pub sandwich_norms: bool,
    /// Embedding rows are multiplied by `sqrt(hidden_size)` (rounded to f32).
    pub embed_scale: bool,
    /// The q, k and v projections are one matrix, `self_attn.qkv_proj`
    /// (`[q; k; v]` rows), split after the product.
    pub fused_qkv: bool,
    /// The MLP's gate and up projections are one matrix, `mlp.gate_up_proj`
    /// (`[gate; up]` rows), split after the product.
    pub fused_gate_up: bool,
    /// Hugging Face's names of a mixture of experts' tensors, under
    /// `model.layers.N.`: the router, the experts' prefix (`{prefix}.{e}.`),
    /// and each expert's gate, up and down projections.
    pub expert_names: ExpertNames,
    /// llama.cpp's converter reorders the rows of each q and k head (its
    /// rotary embedding rotates adjacent pairs); the loader puts them back.
    pub gguf_permuted_qk: bool,
    /// llama.cpp's names of a layer's tensors (`attn_q`) and Hugging Face's
    /// (`self_attn.q_proj`), without the `blk.N.` / `model.layers.N.` prefix
    /// and the `.weight` / `.bias` suffix.
    pub gguf_layer_names: &'static [(&'static str, &'static str)],
    /// Reads the RoPE base and scaling of the (global) attention layers from
    /// `config.json`, given `max_position_embeddings` and the default base.
    pub(crate) rope: RopeParser,
    /// Reads the architecture's own keys of `config.json` into `config`
    /// (biases, windows, [`ArchParams`]), after the common ones.
    pub(crate) parse: fn(&Obj<'_>, &mut ModelConfig) -> Result<(), LlmError>,
    /// Reads the architecture's own GGUF keys into `config`, after the common
    /// ones.
    pub(crate) gguf_config: fn(&GgufMeta<'_>, &mut ModelConfig) -> Result<(), LlmError>,
}

/// Hugging Face's names of a mixture of experts' tensors (see
/// [`ArchSpec::expert_names`]).
#[derive(Clone, Copy, Debug)]
pub struct ExpertNames {
    /// The router (`[experts, hidden]`).
    pub router: &'static str,
    /// The experts' prefix.
    pub experts: &'static str,
    /// An expert's gate, up and down projections.
    pub gate: &'static str,
    /// See `gate`.
    pub up: &'static str,
    /// See `gate`.
    pub down: &'static str,
}

/// Qwen-MoE's expert names (`mlp.gate`, `mlp.experts.{e}.gate_proj`, ...).
pub(crate) const MLP_EXPERTS: ExpertNames = ExpertNames {
    router: "mlp.gate",
    experts: "mlp.experts",
    gate: "gate_proj",
    up: "up_proj",
    down: "down_proj",
};

/// llama.cpp's names of the tensors every Llama-like layer has.
pub(crate) const COMMON_LAYER_NAMES: [(&str, &str); 9] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    // Llama's single post-attention norm is llama.cpp's pre-MLP norm.
    ("ffn_norm", "post_attention_layernorm"),
];

/// Every architecture the crate runs, in the order errors list them.
pub const ARCHITECTURES: [Architecture; 9] = [
    Architecture::Llama,
    Architecture::Qwen2,
    Architecture::Mistral,
    Architecture::Qwen3,
    Architecture::Gemma2,
    Architecture::Gemma3,
    Architecture::Phi3,
    Architecture::Qwen3Moe,
    Architecture::Mixtral,
];

impl Architecture {
    /// The architecture's spec.
    pub fn spec(self) -> &'static ArchSpec {
        match self {
            Architecture::Llama => &llama::SPEC,
            Architecture::Qwen2 => &qwen2::SPEC,
            Architecture::Mistral => &mistral::SPEC,
            Architecture::Qwen3 => &qwen3::SPEC,
            Architecture::Gemma2 => &gemma2::SPEC,
            Architecture::Gemma3 => &gemma3::SPEC,
            Architecture::Phi3 => &phi3::SPEC,
            Architecture::Qwen3Moe => &qwen3_moe::SPEC,
            Architecture::Mixtral => &mixtral::SPEC,
        }
    }

    /// The architecture's name in `config.json`'s `architectures` list.
    pub fn hf_name(self) -> &'static str {
        self.spec().hf_class
    }

    /// The architecture of a `config.json` class name.
    pub fn from_hf_name(name: &str) -> Option<Architecture> {
        ARCHITECTURES.into_iter().find(|a| a.hf_name() == name)
    }

    /// The architecture of a `config.json` `model_type`.
    pub fn from_model_type(model_type: &str) -> Option<Architecture> {
        ARCHITECTURES
            .into_iter()
            .find(|a| a.spec().model_type == model_type)
    }

    /// The architecture of a GGUF `general.architecture`.
    pub fn from_gguf_name(name: &str) -> Option<Architecture> {
        ARCHITECTURES
            .into_iter()
            .find(|a| a.spec().gguf_arch == name)
    }
}

/// The GGUF hook of an architecture with no keys of its own.
pub(crate) fn no_gguf_keys(_: &GgufMeta<'_>, _: &mut ModelConfig) -> Result<(), LlmError> {
    Ok(())
}

/// Refuses an MLP activation other than `want` (`hidden_act` or, for Gemma,
/// `hidden_activation`, which wins when both are given).
pub(crate) fn check_activation(o: &Obj<'_>, want: Activation) -> Result<(), LlmError> {
    let (key, act) = match o.str_opt("hidden_activation")? {
        Some(a) => ("hidden_activation", Some(a)),
        None => ("hidden_act", o.str_opt("hidden_act")?),
    };
    let ok = |a: &str| match want {
        Activation::Silu => a == "silu" || a == "swish",
        Activation::GeluTanh => a == "gelu_pytorch_tanh" || a == "gelu_new",
    };
    match act {
        Some(a) if !ok(a) => Err(o.err(
            key,
            format!(
                "activation `{a}` is not supported (the MLP is {})",
                match want {
                    Activation::Silu => "SwiGLU: silu",
                    Activation::GeluTanh => "GeGLU: gelu_pytorch_tanh",
                }
            ),
        )),
        _ => Ok(()),
    }
}

/// Which of `layers` layers `config.json` marks sliding: its `layer_types`
/// list when given (`"sliding_attention"` / `"full_attention"`), else
/// `default(i)`.
pub(crate) fn layer_types(
    o: &Obj<'_>,
    layers: usize,
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>, LlmError> {
    let Some(v) = o.get("layer_types") else {
        return Ok((0..layers).map(default).collect());
    };
    let Some(list) = v.as_array() else {
        return Err(o.err("layer_types", format!("expected a list, found {v}")));
    };
    if list.len() != layers {
        return Err(o.err(
            "layer_types",
            format!("{} entries for {layers} layers", list.len()),
        ));
    }
    list.iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(false),
            Some("sliding_attention") => Ok(true),
            _ => Err(o.err(
                "layer_types",
                format!(
                    "unsupported layer type {t} (supported: \"full_attention\", \"sliding_attention\")"
                ),
            )),
        })
        .collect()
}
