//! `config.json`: the architecture and its sizes.
//!
//! PLACEHOLDER: the types are fixed (the model is written against them); parsing
//! `config.json` is being written.

/// The decoder families the crate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`.
    Llama,
    /// `Qwen2ForCausalLM` (bias on the q, k and v projections).
    Qwen2,
    /// `MistralForCausalLM` (sliding-window attention).
    Mistral,
}

/// How rotary position frequencies are rescaled for long contexts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// No rescaling.
    None,
    /// Positions divided by `factor` (`"type": "linear"`).
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3's frequency-band rescaling (`"rope_type": "llama3"`).
    Llama3 {
        /// Scale of the low-frequency band.
        factor: f32,
        /// Wavelength bound of the low-frequency band.
        low_freq_factor: f32,
        /// Wavelength bound of the high-frequency band.
        high_freq_factor: f32,
        /// The context length the model was trained with.
        original_max_position_embeddings: usize,
    },
}

/// A decoder's hyper-parameters, as `config.json` gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The architecture.
    pub architecture: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than the query heads).
    pub num_key_value_heads: usize,
    /// Width of one head (`hidden_size / num_attention_heads` unless given).
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// The longest context the model supports.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE rescaling.
    pub rope_scaling: RopeScaling,
    /// The output projection is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// The q, k and v projections have a bias.
    pub qkv_bias: bool,
    /// The output projection of attention has a bias.
    pub o_bias: bool,
    /// Attention looks back at most this many positions (Mistral), if set.
    pub sliding_window: Option<usize>,
    /// The beginning-of-sequence token, if any.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (`eos_token_id` may be one id or a list).
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Reads `config.json` (`path` is the file).
    ///
    /// PLACEHOLDER: returns an error until the parser lands.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<ModelConfig, crate::LlmError> {
        Err(crate::LlmError::BadFile {
            path: path.as_ref().to_path_buf(),
            reason: "config.json parsing is not written yet (placeholder)".to_string(),
        })
    }
}
