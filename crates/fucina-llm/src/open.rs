//! Opening a model for generation from what a user has on disk: a Hugging Face
//! model directory or a llama.cpp GGUF file, at the precision of its file or
//! converted at load (the `generate` example's `--model` and `--dtype`).
//! [`OpenOptions::open`] is the one implementation; [`open_model`],
//! [`Model::load`] and [`Model::load_as`] are its shortcuts.
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

/// How [`OpenOptions::open`] opens a model: the one implementation behind
/// [`open_model`], [`Model::load`] and [`Model::load_as`].
///
/// ```no_run
/// use fucina_llm::fucina::ExecContext;
/// use fucina_llm::{LoadDtype, OpenOptions};
///
/// let ctx = ExecContext::new();
/// // A directory quantized to Q4_K at load, its blocks read in place (no
/// // repacked copy).
/// let opened = OpenOptions::new()
///     .dtype(LoadDtype::Q4_K)
///     .in_place(true)
///     .open("models/TinyLlama-1.1B", &ctx)?;
/// # Ok::<(), fucina_llm::LlmError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    dtype: Option<LoadDtype>,
    in_place: bool,
}

impl OpenOptions {
    /// The defaults: the file's own formats, quantized matrices repacked for
    /// the kernels.
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    /// Converts the matrices to `dtype` at load ([`WeightStore::convert`]:
    /// llama.cpp's rules and per-tensor fallbacks).
    pub fn dtype(mut self, dtype: LoadDtype) -> OpenOptions {
        self.dtype = Some(dtype);
        self
    }

    /// [`dtype`](OpenOptions::dtype) when `Some`; the file's own formats for
    /// `None`.
    pub fn dtype_opt(mut self, dtype: Option<LoadDtype>) -> OpenOptions {
        self.dtype = dtype;
        self
    }

    /// Reads quantized matrices in place (`true`) instead of repacking them
    /// once into the kernels' strip layout (the default: the same bits,
    /// faster, at the cost of a copy of those matrices).
    pub fn in_place(mut self, yes: bool) -> OpenOptions {
        self.in_place = yes;
        self
    }

    /// Opens `path` — a GGUF file (a path whose name ends in `.gguf`; the
    /// architectures the specs name, read by [`load_gguf`], its tokenizer by
    /// [`Tokenizer::from_gguf`] when the file stores one) or a Hugging Face
    /// model directory (`config.json`, safetensors weights, optional
    /// `tokenizer.json` and `generation_config.json`) — with these options
    /// (conversion and repacking run on `ctx`'s team).
    ///
    /// # Errors
    /// Those of the loaders ([`ModelConfig::from_file`],
    /// [`WeightStore::open`], [`load_gguf`], [`Tokenizer::from_file`],
    /// [`Tokenizer::from_gguf`], [`GenerationConfig::from_file`]), of
    /// [`WeightStore::convert`] and of [`Model::from_parts`], each naming the
    /// file, key or tensor at fault.
    pub fn open(&self, path: impl AsRef<Path>, ctx: &ExecContext) -> Result<OpenedModel, LlmError> {
        let path = path.as_ref();
        let parts = read_parts(path, true)?;
        let mut weights = match self.dtype {
            Some(d) => parts
                .weights
                .convert(ctx, d, parts.config.tie_word_embeddings)?,
            None => parts.weights,
        };
        if !self.in_place {
            weights.repack_quantized(ctx)?;
        }
        Ok(OpenedModel {
            model: Model::from_parts(parts.config, weights)?,
            tokenizer: parts.tokenizer,
            stop_tokens: parts.stop_tokens,
        })
    }
}

/// What a model's files hold, before any conversion.
pub(crate) struct Parts {
    pub(crate) config: ModelConfig,
    pub(crate) weights: WeightStore,
    tokenizer: Option<Tokenizer>,
    stop_tokens: Vec<u32>,
}

/// Reads the config, weights, stop tokens and, when `with_tokenizer`, the
/// tokenizer of a GGUF file or a model directory (see [`OpenOptions::open`]).
pub(crate) fn read_parts(path: &Path, with_tokenizer: bool) -> Result<Parts, LlmError> {
    let is_gguf = !path.is_dir()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if is_gguf {
        let (config, weights, file) = load_gguf(path)?;
        let tokenizer = if with_tokenizer && file.get("tokenizer.ggml.model").is_some() {
            Some(Tokenizer::from_gguf(&file)?)
        } else {
            None
        };
        let stop_tokens = config.eos_token_ids.clone();
        return Ok(Parts {
            config,
            weights,
            tokenizer,
            stop_tokens,
        });
    }
    let config = ModelConfig::from_file(path.join("config.json"))?;
    let weights = WeightStore::open(path)?;
    let tok_path = path.join("tokenizer.json");
    let tokenizer = match with_tokenizer && tok_path.exists() {
        true => Some(Tokenizer::from_file(&tok_path)?),
        false => None,
    };
    let gen_path = path.join(GENERATION_CONFIG_FILE);
    let generation_eos = match gen_path.exists() {
        true => GenerationConfig::from_file(&gen_path)?.eos_token_ids,
        false => None,
    };
    let stop_tokens = generation_eos.unwrap_or_else(|| config.eos_token_ids.clone());
    Ok(Parts {
        config,
        weights,
        tokenizer,
        stop_tokens,
    })
}

/// Opens `path` with its matrices converted to `dtype` when given (`None`
/// keeps the file's own formats): `OpenOptions::new().dtype_opt(dtype)`
/// [`.open(path, ctx)`](OpenOptions::open).
///
/// # Errors
/// Those of [`OpenOptions::open`].
pub fn open_model(
    path: impl AsRef<Path>,
    ctx: &ExecContext,
    dtype: Option<LoadDtype>,
) -> Result<OpenedModel, LlmError> {
    OpenOptions::new().dtype_opt(dtype).open(path, ctx)
}
