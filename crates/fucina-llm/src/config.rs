//! `config.json` and `generation_config.json`: the architecture, its sizes, its
//! RoPE parameters and its special tokens.
//!
//! [`ModelConfig::from_file`] reads a Hugging Face `config.json` of an
//! architecture the crate runs (each one's keys and defaults are its
//! [`ArchSpec`](crate::arch::ArchSpec)'s, in `arch/`) and fills in what the
//! file leaves out with the defaults `transformers` gives the same
//! architecture, so that a file means here what it means there. For Llama,
//! Qwen2 and Mistral:
//!
//! | key | when absent |
//! | --- | --- |
//! | `num_key_value_heads` | Llama: `num_attention_heads`; Qwen2: 32; Mistral: 8 (`null`: `num_attention_heads`) |
//! | `head_dim` | `hidden_size / num_attention_heads` |
//! | `max_position_embeddings` | Llama: 2048; Qwen2: 32768; Mistral: 131072 |
//! | `rms_norm_eps` | `1e-6` |
//! | `rope_theta` | 10000 |
//! | `tie_word_embeddings` | `false` |
//! | `bos_token_id`, `eos_token_id` | Llama and Mistral: 1 and 2; Qwen2: none |
//! | `sliding_window` | Mistral: 4096 (`null`: no window); Qwen2: see below |
//!
//! `hidden_size`, `intermediate_size`, `num_hidden_layers`,
//! `num_attention_heads` and `vocab_size` are required: a model's shapes are
//! never guessed.
//!
//! **RoPE.** Both spellings are read: the `rope_theta` key with a
//! `rope_scaling` object (`{"type" | "rope_type": "linear" | "llama3", "factor":
//! .., "low_freq_factor": .., "high_freq_factor": ..,
//! "original_max_position_embeddings": ..}`) that older files hold, and the
//! `rope_parameters` object (`{"rope_type": "default" | "linear" | "llama3",
//! "rope_theta": .., ..}`) that `transformers` 5 writes. When both objects are
//! present, `rope_scaling` wins (as in `transformers`); a `rope_theta` inside the
//! object wins over the top-level key. For `llama3`, the top-level
//! `original_max_position_embeddings` wins over the object's, and
//! `max_position_embeddings` is used when neither gives it. Other RoPE types
//! (`dynamic`, `yarn`, `longrope`, ...), per-layer-type RoPE parameters and a
//! `partial_rotary_factor` other than 1 are refused (Phi-3's spec reads
//! LongRoPE and a partial rotary embedding: [`crate::arch`]).
//!
//! **Biases.** Llama: `attention_bias` puts a bias on the q, k, v and o
//! projections; `mlp_bias: true` is refused (not implemented). Qwen2: q, k and v
//! have a bias, o has none. Mistral: no bias.
//!
//! **Sliding window.** Mistral's `sliding_window` applies to every layer. Qwen2's
//! applies only when `use_sliding_window` is true, and then only to the layers
//! from `max_window_layers` on (or those `layer_types` marks
//! `"sliding_attention"`): a configuration where some layers slide and others do
//! not is refused, as [`ModelConfig::sliding_window`] is one window for the whole
//! model. A window of `w` lets position `i` attend to positions `j` with
//! `i - w < j <= i` (the `w` most recent positions, itself included).
//!
//! **Special tokens.** `bos_token_id` and `eos_token_id` (one id or a list) come
//! from `config.json`; a `generation_config.json` beside it, when present,
//! replaces each one it gives (it is what `transformers`' `generate` stops on).
//!
//! Every refusal is an [`LlmError::BadFile`] naming the file and the key.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::arch::ArchParams;
use crate::error::LlmError;

/// The decoder families the crate runs; each one's differences from Llama
/// are its [`ArchSpec`](crate::arch::ArchSpec) ([`Architecture::spec`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`.
    Llama,
    /// `Qwen2ForCausalLM` (bias on the q, k and v projections).
    Qwen2,
    /// `MistralForCausalLM` (sliding-window attention).
    Mistral,
    /// `Qwen3ForCausalLM` (an RMSNorm over each q and k head).
    Qwen3,
    /// `Gemma2ForCausalLM` (GeGLU, `1 + w` norms, sandwich norms,
    /// soft-capping, alternating sliding-window layers).
    Gemma2,
    /// `Gemma3ForCausalLM` (Gemma 2's layers with q/k norms and local layers
    /// of their own RoPE base instead of soft-capping).
    Gemma3,
    /// `Phi3ForCausalLM` (fused q/k/v and gate/up projections, LongRoPE).
    Phi3,
    /// `Qwen3MoeForCausalLM` (Qwen3's attention, a mixture of experts).
    Qwen3Moe,
    /// `MixtralForCausalLM` (Mistral's attention, a mixture of experts).
    Mixtral,
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

impl RopeScaling {
    /// Whether the parameters are usable: every factor finite and positive as
    /// an f32, Llama 3's high-frequency bound above its low-frequency one and
    /// its original context length positive. A description of the first
    /// problem, if any.
    pub(crate) fn problem(&self) -> Option<String> {
        let usable = |x: f32| x.is_finite() && x > 0.0;
        match *self {
            RopeScaling::None => None,
            RopeScaling::Linear { factor } if !usable(factor) => Some(format!(
                "linear RoPE scaling factor {factor} is not positive and finite"
            )),
            RopeScaling::Linear { .. } => None,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                if !(usable(factor) && usable(low_freq_factor) && usable(high_freq_factor)) {
                    Some(format!(
                        "llama3 RoPE factors {factor} / {low_freq_factor} / {high_freq_factor} are not all positive and finite"
                    ))
                } else if high_freq_factor <= low_freq_factor {
                    Some(format!(
                        "llama3 RoPE high_freq_factor {high_freq_factor} is not above low_freq_factor {low_freq_factor}"
                    ))
                } else if original_max_position_embeddings == 0 {
                    Some("llama3 RoPE original_max_position_embeddings is 0".to_string())
                } else {
                    None
                }
            }
        }
    }
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
    /// Attention looks back at most this many positions, the current one
    /// included (position `i` sees `j` with `i - w < j <= i`), if set.
    pub sliding_window: Option<usize>,
    /// The beginning-of-sequence token, if any.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (`eos_token_id` may be one id or a list).
    pub eos_token_ids: Vec<u32>,
    /// What the architecture adds to the Llama decoder (all off for Llama,
    /// Qwen2 and Mistral).
    pub params: ArchParams,
}

/// The file beside `config.json` whose special tokens replace its own.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

impl ModelConfig {
    /// The dimensions of each head that RoPE rotates (the first ones, in the
    /// rotate-half convention within them): `head_dim`, or fewer for a
    /// partial rotary embedding ([`ArchParams::rotary_dim`](crate::arch::ArchParams::rotary_dim)).
    pub fn rotary_dim(&self) -> usize {
        self.params.rotary_dim.unwrap_or(self.head_dim)
    }

    /// Reads `config.json` (`path` is the file) and, when a
    /// `generation_config.json` lies beside it, takes the `bos_token_id` and
    /// `eos_token_id` that file gives (see the [module docs](self)).
    ///
    /// # Errors
    /// [`LlmError::Io`] if a file cannot be read; [`LlmError::BadFile`] naming
    /// the file and the key for bad JSON, an unknown architecture, a missing
    /// required key, a value of the wrong type, a zero size, heads that do not
    /// divide `hidden_size` (when `head_dim` is not given), key/value heads that
    /// do not divide the query heads, an odd `head_dim`, or a feature the crate
    /// does not implement (a RoPE type, `mlp_bias`, a per-layer sliding window,
    /// an activation other than SiLU).
    pub fn from_file(path: impl AsRef<Path>) -> Result<ModelConfig, LlmError> {
        let path = path.as_ref();
        let text = read_text(path)?;
        let mut config = ModelConfig::parse(&text, path)?;
        let gen_path = match path.parent() {
            Some(dir) => dir.join(GENERATION_CONFIG_FILE),
            None => PathBuf::from(GENERATION_CONFIG_FILE),
        };
        if gen_path.is_file() {
            config.apply_generation_config(&GenerationConfig::from_file(&gen_path)?);
        }
        Ok(config)
    }

    /// Parses the text of a `config.json` alone (no `generation_config.json` is
    /// looked for); `path` names the file in errors.
    ///
    /// # Errors
    /// As [`ModelConfig::from_file`], without the I/O error.
    pub fn parse(json: &str, path: impl AsRef<Path>) -> Result<ModelConfig, LlmError> {
        let path = path.as_ref();
        let value: Value = serde_json::from_str(json).map_err(|e| LlmError::BadFile {
            path: path.to_path_buf(),
            reason: format!("not valid JSON: {e}"),
        })?;
        let Value::Object(map) = &value else {
            return Err(bad(path, "the file is not a JSON object".to_string()));
        };
        parse_config(&Obj { map, path, at: "" })
    }

    /// Replaces the special tokens that `generation` gives
    /// (`bos_token_id`, `eos_token_id`); the others are kept.
    pub fn apply_generation_config(&mut self, generation: &GenerationConfig) {
        if let Some(bos) = generation.bos_token_id {
            self.bos_token_id = Some(bos);
        }
        if let Some(eos) = &generation.eos_token_ids {
            self.eos_token_ids = eos.clone();
        }
    }
}

/// `generation_config.json`: the special tokens and sampling defaults a model
/// is published with. Every field is `None` when the file does not give it (or
/// gives `null`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// The beginning-of-sequence token.
    pub bos_token_id: Option<u32>,
    /// The tokens that end generation (`eos_token_id`: one id or a list).
    pub eos_token_ids: Option<Vec<u32>>,
    /// Whether the model's authors sample (`true`) or decode greedily (`false`);
    /// `transformers` ignores the sampling parameters below when it is `false`.
    pub do_sample: Option<bool>,
    /// Softmax temperature (non-negative).
    pub temperature: Option<f32>,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (in
    /// `[0, 1]`).
    pub top_p: Option<f32>,
    /// Repetition penalty (positive; 1: none).
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// Reads `generation_config.json` (`path` is the file).
    ///
    /// # Errors
    /// [`LlmError::Io`] if it cannot be read; [`LlmError::BadFile`] naming the
    /// file and the key for bad JSON, a value of the wrong type, a token id that
    /// is negative or above `u32::MAX`, or a sampling parameter out of its range.
    pub fn from_file(path: impl AsRef<Path>) -> Result<GenerationConfig, LlmError> {
        let path = path.as_ref();
        GenerationConfig::parse(&read_text(path)?, path)
    }

    /// Parses the text of a `generation_config.json`; `path` names the file in
    /// errors.
    ///
    /// # Errors
    /// As [`GenerationConfig::from_file`], without the I/O error.
    pub fn parse(json: &str, path: impl AsRef<Path>) -> Result<GenerationConfig, LlmError> {
        let path = path.as_ref();
        let value: Value = serde_json::from_str(json).map_err(|e| LlmError::BadFile {
            path: path.to_path_buf(),
            reason: format!("not valid JSON: {e}"),
        })?;
        let Value::Object(map) = &value else {
            return Err(bad(path, "the file is not a JSON object".to_string()));
        };
        let o = Obj { map, path, at: "" };
        let temperature = o.f64_opt("temperature")?;
        if let Some(t) = temperature
            && t < 0.0
        {
            return Err(o.err("temperature", format!("must not be negative, found {t}")));
        }
        let top_p = o.f64_opt("top_p")?;
        if let Some(p) = top_p
            && !(0.0..=1.0).contains(&p)
        {
            return Err(o.err("top_p", format!("must be in [0, 1], found {p}")));
        }
        let repetition_penalty = o.f64_opt("repetition_penalty")?;
        if let Some(r) = repetition_penalty
            && r <= 0.0
        {
            return Err(o.err("repetition_penalty", format!("must be positive, found {r}")));
        }
        Ok(GenerationConfig {
            bos_token_id: o.token_opt("bos_token_id")?,
            eos_token_ids: o.tokens_opt("eos_token_id")?,
            do_sample: o.bool_opt("do_sample")?,
            temperature: temperature.map(|v| v as f32),
            top_k: o.usize_opt("top_k")?,
            top_p: top_p.map(|v| v as f32),
            repetition_penalty: repetition_penalty.map(|v| v as f32),
        })
    }
}

fn read_text(path: &Path) -> Result<String, LlmError> {
    crate::files::read_regular_text(path)
}

fn bad(path: &Path, reason: String) -> LlmError {
    LlmError::BadFile {
        path: path.to_path_buf(),
        reason,
    }
}

/// A JSON object of a file, with typed getters whose errors name the file and
/// the key (`at` prefixes nested keys: `rope_scaling.factor`).
pub(crate) struct Obj<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) path: &'a Path,
    pub(crate) at: &'a str,
}

impl Obj<'_> {
    pub(crate) fn err(&self, key: &str, what: String) -> LlmError {
        bad(self.path, format!("key `{}{key}`: {what}", self.at))
    }

    /// The value of `key`, `None` when absent or `null`.
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn u64_opt(&self, key: &str) -> Result<Option<u64>, LlmError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                self.err(key, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    pub(crate) fn usize_opt(&self, key: &str) -> Result<Option<usize>, LlmError> {
        match self.u64_opt(key)? {
            None => Ok(None),
            Some(n) => usize::try_from(n)
                .map(Some)
                .map_err(|_| self.err(key, format!("{n} does not fit in a usize"))),
        }
    }

    /// A positive integer, `None` when absent or `null`.
    pub(crate) fn size_opt(&self, key: &str) -> Result<Option<usize>, LlmError> {
        match self.usize_opt(key)? {
            Some(0) => Err(self.err(key, "must be positive, found 0".to_string())),
            n => Ok(n),
        }
    }

    /// A required positive integer.
    pub(crate) fn size(&self, key: &str) -> Result<usize, LlmError> {
        self.size_opt(key)?
            .ok_or_else(|| self.err(key, "missing or null (required)".to_string()))
    }

    /// A finite number, `None` when absent or `null`.
    pub(crate) fn f64_opt(&self, key: &str) -> Result<Option<f64>, LlmError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.err(key, format!("expected a finite number, found {v}"))),
            },
        }
    }

    /// A finite positive number, `None` when absent or `null`.
    pub(crate) fn positive_opt(&self, key: &str) -> Result<Option<f64>, LlmError> {
        match self.f64_opt(key)? {
            Some(x) if x <= 0.0 => Err(self.err(key, format!("must be positive, found {x}"))),
            x => Ok(x),
        }
    }

    /// A required number that is finite and positive once rounded to f32 (a
    /// value positive as f64 may round to 0 or overflow to infinity).
    pub(crate) fn positive_f32(&self, key: &str) -> Result<f32, LlmError> {
        let x = self.positive(key)?;
        let y = x as f32;
        if !(y.is_finite() && y > 0.0) {
            return Err(self.err(
                key,
                format!("{x} is not a positive finite f32 (it rounds to {y})"),
            ));
        }
        Ok(y)
    }

    pub(crate) fn positive(&self, key: &str) -> Result<f64, LlmError> {
        self.positive_opt(key)?
            .ok_or_else(|| self.err(key, "missing or null (required)".to_string()))
    }

    pub(crate) fn bool_opt(&self, key: &str) -> Result<Option<bool>, LlmError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    pub(crate) fn str_opt(&self, key: &str) -> Result<Option<&str>, LlmError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a string, found {v}"))),
        }
    }

    pub(crate) fn token(&self, key: &str, v: &Value) -> Result<u32, LlmError> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                self.err(
                    key,
                    format!("expected a token id (0 to 2^32 - 1), found {v}"),
                )
            })
    }

    pub(crate) fn token_opt(&self, key: &str) -> Result<Option<u32>, LlmError> {
        self.get(key).map(|v| self.token(key, v)).transpose()
    }

    /// One token id or a list of them, `None` when absent or `null`.
    pub(crate) fn tokens_opt(&self, key: &str) -> Result<Option<Vec<u32>>, LlmError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| self.token(key, v))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Ok(Some(vec![self.token(key, v)?])),
        }
    }

    /// A key present, even as `null`.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }
}

/// The names of the architectures the crate runs, for error messages.
fn supported_architectures() -> String {
    crate::arch::ARCHITECTURES
        .map(Architecture::hf_name)
        .join(", ")
}

fn parse_architecture(o: &Obj<'_>) -> Result<Architecture, LlmError> {
    if let Some(v) = o.get("architectures") {
        let Some(list) = v.as_array() else {
            return Err(o.err(
                "architectures",
                format!("expected a list of names, found {v}"),
            ));
        };
        let mut names = Vec::with_capacity(list.len());
        for item in list {
            let Some(name) = item.as_str() else {
                return Err(o.err(
                    "architectures",
                    format!("expected a list of names, found the entry {item}"),
                ));
            };
            if let Some(arch) = Architecture::from_hf_name(name) {
                return Ok(arch);
            }
            names.push(name);
        }
        return Err(o.err(
            "architectures",
            format!(
                "unsupported architecture {names:?} (supported: {})",
                supported_architectures()
            ),
        ));
    }
    match o.str_opt("model_type")? {
        Some(t) => Architecture::from_model_type(t).ok_or_else(|| {
            o.err(
                "model_type",
                format!(
                    "unsupported model type `{t}` and no `architectures` list (supported: {})",
                    crate::arch::ARCHITECTURES
                        .map(|a| a.spec().model_type)
                        .join(", ")
                ),
            )
        }),
        None => Err(o.err(
            "architectures",
            "missing (required; no `model_type` either)".to_string(),
        )),
    }
}

/// (Every value comes from the file: the lint keeps the arithmetic checked.)
#[warn(clippy::arithmetic_side_effects)]
fn parse_config(o: &Obj<'_>) -> Result<ModelConfig, LlmError> {
    let architecture = parse_architecture(o)?;
    let spec = architecture.spec();
    let defaults = &spec.defaults;

    let hidden_size = o.size("hidden_size")?;
    let intermediate_size = o.size("intermediate_size")?;
    let num_hidden_layers = o.size("num_hidden_layers")?;
    let num_attention_heads = o.size("num_attention_heads")?;
    let vocab_size = o.size("vocab_size")?;

    // Absent: the class default; `null`: as many as the query heads.
    let num_key_value_heads = match o.size_opt("num_key_value_heads")? {
        Some(n) => n,
        None if o.has("num_key_value_heads") => num_attention_heads,
        None => defaults.num_key_value_heads.unwrap_or(num_attention_heads),
    };
    let divides = hidden_size.is_multiple_of(num_attention_heads);
    let head_dim = match o.size_opt("head_dim")? {
        Some(d) => d,
        None if !o.has("head_dim") && defaults.head_dim.is_some() => defaults.head_dim.unwrap_or(0),
        // `num_attention_heads` is positive (`size`).
        None if divides => hidden_size.checked_div(num_attention_heads).unwrap_or(0),
        None => {
            return Err(o.err(
                "num_attention_heads",
                format!(
                    "{num_attention_heads} heads do not divide hidden_size {hidden_size} (and no head_dim is given)"
                ),
            ));
        }
    };
    // `transformers` checks this for Llama even when `head_dim` is given.
    if spec.heads_divide_hidden && !divides {
        return Err(o.err(
            "num_attention_heads",
            format!("{num_attention_heads} heads do not divide hidden_size {hidden_size}"),
        ));
    }
    if num_key_value_heads > num_attention_heads
        || !num_attention_heads.is_multiple_of(num_key_value_heads)
    {
        return Err(o.err(
            "num_key_value_heads",
            format!(
                "{num_key_value_heads} key/value heads do not divide the {num_attention_heads} attention heads"
            ),
        ));
    }
    if !head_dim.is_multiple_of(2) {
        return Err(o.err(
            "head_dim",
            format!("{head_dim} is odd (rotary embeddings rotate pairs of dimensions)"),
        ));
    }

    let max_position_embeddings = o
        .size_opt("max_position_embeddings")?
        .unwrap_or(defaults.max_position_embeddings);
    let rms_norm_eps = match o.f64_opt("rms_norm_eps")? {
        Some(e) if e < 0.0 => {
            return Err(o.err("rms_norm_eps", format!("must not be negative, found {e}")));
        }
        Some(e) => e,
        None => defaults.rms_norm_eps,
    };
    crate::arch::check_activation(o, spec.activation)?;
    let tie_word_embeddings = o
        .bool_opt("tie_word_embeddings")?
        .unwrap_or(defaults.tie_word_embeddings);

    let (rope_theta, rope_scaling) = (spec.rope)(o, max_position_embeddings, defaults.rope_theta)?;

    let bos_token_id = if o.has("bos_token_id") {
        o.token_opt("bos_token_id")?
    } else {
        defaults.bos_token_id
    };
    let eos_token_ids = if o.has("eos_token_id") {
        o.tokens_opt("eos_token_id")?.unwrap_or_default()
    } else {
        defaults.eos_token_ids.to_vec()
    };

    let mut config = ModelConfig {
        architecture,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size,
        max_position_embeddings,
        rms_norm_eps: rms_norm_eps as f32,
        rope_theta: rope_theta as f32,
        rope_scaling,
        tie_word_embeddings,
        qkv_bias: false,
        o_bias: false,
        sliding_window: None,
        bos_token_id,
        eos_token_ids,
        params: ArchParams::default(),
    };
    (spec.parse)(o, &mut config)?;
    Ok(config)
}

/// The RoPE base and rescaling, from `rope_scaling` / `rope_parameters` and
/// `rope_theta` (see the module docs for the precedence).
pub(crate) fn parse_rope(
    o: &Obj<'_>,
    max_position_embeddings: usize,
    default_theta: f64,
) -> Result<(f64, RopeScaling), LlmError> {
    if let Some(f) = o.f64_opt("partial_rotary_factor")?
        && f != 1.0
    {
        return Err(o.err(
            "partial_rotary_factor",
            format!("{f}: rotating part of each head is not supported"),
        ));
    }
    parse_rope_with(o, max_position_embeddings, default_theta, false)
}

/// [`parse_rope`] for an architecture that reads `partial_rotary_factor`
/// itself when `partial_ok` (Phi-3's spec), else refusing it as
/// [`parse_rope`] does.
pub(crate) fn parse_rope_with(
    o: &Obj<'_>,
    max_position_embeddings: usize,
    default_theta: f64,
    partial_ok: bool,
) -> Result<(f64, RopeScaling), LlmError> {
    let top_theta = o.positive_opt("rope_theta")?;
    // `transformers` takes `rope_scaling` over `rope_parameters` (an empty object
    // counts as absent).
    let nonempty = |key: &str| {
        o.get(key)
            .filter(|v| !v.as_object().is_some_and(Map::is_empty))
    };
    let (key, value) = match (nonempty("rope_scaling"), nonempty("rope_parameters")) {
        (Some(v), _) => ("rope_scaling", v),
        (None, Some(v)) => ("rope_parameters", v),
        (None, None) => return Ok((top_theta.unwrap_or(default_theta), RopeScaling::None)),
    };
    let Some(map) = value.as_object() else {
        return Err(o.err(key, format!("expected an object, found {value}")));
    };
    let at = format!("{key}.");
    let p = Obj {
        map,
        path: o.path,
        at: &at,
    };
    if p.has("full_attention") || p.has("sliding_attention") {
        return Err(o.err(
            key,
            "RoPE parameters per layer type are not supported".to_string(),
        ));
    }
    rope_object(
        o,
        &p,
        top_theta,
        default_theta,
        max_position_embeddings,
        partial_ok,
    )
}

/// The RoPE base and rescaling an object of RoPE parameters `p` (found in
/// `o`) gives: its `rope_theta`, else `top_theta`, else `default_theta`, and
/// its `rope_type` (or `type`).
pub(crate) fn rope_object(
    o: &Obj<'_>,
    p: &Obj<'_>,
    top_theta: Option<f64>,
    default_theta: f64,
    max_position_embeddings: usize,
    partial_ok: bool,
) -> Result<(f64, RopeScaling), LlmError> {
    let theta = p
        .positive_opt("rope_theta")?
        .or(top_theta)
        .unwrap_or(default_theta);
    if let Some(f) = p.f64_opt("partial_rotary_factor")?
        && f != 1.0
        && !partial_ok
    {
        return Err(p.err(
            "partial_rotary_factor",
            format!("{f}: rotating part of each head is not supported"),
        ));
    }
    let rope_type = match p.str_opt("rope_type")? {
        Some(t) => t,
        None => p.str_opt("type")?.unwrap_or("default"),
    };
    let scaling = match rope_type {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: p.positive_f32("factor")?,
        },
        "llama3" => {
            let factor = p.positive_f32("factor")?;
            let low_freq_factor = p.positive_f32("low_freq_factor")?;
            let high_freq_factor = p.positive_f32("high_freq_factor")?;
            if high_freq_factor <= low_freq_factor {
                return Err(p.err(
                    "high_freq_factor",
                    format!("{high_freq_factor} must be above low_freq_factor {low_freq_factor}"),
                ));
            }
            let original = match o.size_opt("original_max_position_embeddings")? {
                Some(n) => n,
                None => p
                    .size_opt("original_max_position_embeddings")?
                    .unwrap_or(max_position_embeddings),
            };
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: original,
            }
        }
        other => {
            return Err(p.err(
                if p.has("rope_type") {
                    "rope_type"
                } else {
                    "type"
                },
                format!("unsupported RoPE type `{other}` (supported: default, linear, llama3)"),
            ));
        }
    };
    Ok((theta, scaling))
}
