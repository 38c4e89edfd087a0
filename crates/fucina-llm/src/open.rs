//! Opening a model for generation from what a user has on disk: a Hugging Face
//! model directory or a llama.cpp GGUF file, at the precision of its file or
//! converted at load (the `generate` example's `--model` and `--dtype`).
//!
//! ```no_run
//! use fucina_llm::fucina::ExecContext;
//! use fucina_llm::{LoadDtype, open_model};
//!
//! let ctx = ExecContext::new();
//! let opened = open_model("models/tinyllama-q8_0.gguf", &ctx, None)?;
//! let tok = opened.tokenizer.as_ref().expect("the file stores its tokenizer");
//! let ids = tok.encode("Hello", true)?;
//! // The same directory as Hugging Face wrote it, quantized to Q4_0 at load.
//! let q4 = open_model("models/TinyLlama-1.1B", &ctx, Some(LoadDtype::Q4_0))?;
//! # Ok::<(), fucina_llm::LlmError>(())
//! ```

use std::path::Path;

use fucina::ExecContext;

use crate::arch::gguf::load_gguf;
use crate::config::{GENERATION_CONFIG_FILE, GenerationConfig, ModelConfig};
use crate::error::LlmError;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use crate::weights::{LoadDtype, WeightStore};

/// A model opened by [`open_model`], with what generating text from it needs.
#[derive(Debug)]
pub struct OpenedModel {
    /// The model.
    pub model: Model,
    /// The tokenizer: the directory's `tokenizer.json`, or the one a GGUF file
    /// stores in its `tokenizer.ggml.*` metadata; `None` when there is neither.
    pub tokenizer: Option<Tokenizer>,
    /// The end-of-sequence tokens that stop a sequence: those of
    /// `generation_config.json` when the directory has one and it names some,
    /// else the config's (`config.json`'s `eos_token_id`, or a GGUF file's
    /// `tokenizer.ggml.eos_token_id`).
    pub stop_tokens: Vec<u32>,
}

/// Opens `path` — a GGUF file (a path whose name ends in `.gguf`; the
/// architectures the specs name, read by [`load_gguf`], its tokenizer by
/// [`Tokenizer::from_gguf`] when the file stores one) or a Hugging Face model
/// directory (`config.json`, safetensors weights, optional `tokenizer.json` and
/// `generation_config.json`) — and converts its matrices to `dtype` when given
/// ([`WeightStore::convert`]; `None` keeps the file's own formats, mapped).
///
/// # Errors
/// Those of the loaders ([`Model::load`], [`load_gguf`],
/// [`Tokenizer::from_file`], [`Tokenizer::from_gguf`],
/// [`GenerationConfig::from_file`]) and of [`WeightStore::convert`], each naming
/// the file, key or tensor at fault.
pub fn open_model(
    path: impl AsRef<Path>,
    ctx: &ExecContext,
    dtype: Option<LoadDtype>,
) -> Result<OpenedModel, LlmError> {
    let path = path.as_ref();
    // Converted as asked, then every quantized matrix repacked for the kernels.
    let convert = |config: &ModelConfig, weights: WeightStore| {
        let mut w = match dtype {
            Some(d) => weights.convert(ctx, d, config.tie_word_embeddings)?,
            None => weights,
        };
        w.repack_quantized(ctx)?;
        Ok::<_, LlmError>(w)
    };
    let is_gguf = !path.is_dir()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if is_gguf {
        let (config, weights, file) = load_gguf(path)?;
        let weights = convert(&config, weights)?;
        let tokenizer = if file.get("tokenizer.ggml.model").is_some() {
            Some(Tokenizer::from_gguf(&file)?)
        } else {
            None
        };
        let stop_tokens = config.eos_token_ids.clone();
        return Ok(OpenedModel {
            model: Model::from_parts(config, weights)?,
            tokenizer,
            stop_tokens,
        });
    }
    let config = ModelConfig::from_file(path.join("config.json"))?;
    let weights = convert(&config, WeightStore::open(path)?)?;
    let tok_path = path.join("tokenizer.json");
    let tokenizer = match tok_path.exists() {
        true => Some(Tokenizer::from_file(&tok_path)?),
        false => None,
    };
    let gen_path = path.join(GENERATION_CONFIG_FILE);
    let generation_eos = match gen_path.exists() {
        true => GenerationConfig::from_file(&gen_path)?.eos_token_ids,
        false => None,
    };
    let stop_tokens = generation_eos.unwrap_or_else(|| config.eos_token_ids.clone());
    Ok(OpenedModel {
        model: Model::from_parts(config, weights)?,
        tokenizer,
        stop_tokens,
    })
}
