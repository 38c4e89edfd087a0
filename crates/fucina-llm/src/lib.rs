//! Run pretrained decoder language models from Hugging Face files on the fucina
//! runtime, with the same tokens and the same logit bits whatever the thread
//! count, the vector level and the other sequences decoded in the same batch.
//!
//! The layers of the crate, bottom up:
//! - [`arch`]: one spec per architecture (what differs from Llama), and the
//!   GGUF loader they make generic.
//! - [`config`]: `config.json` (architecture, sizes, RoPE parameters).
//! - [`weights`]: memory-mapped safetensors tensors kept in their file format.
//! - [`format_report`]: what each tensor is stored as, and the rule converting
//!   at load follows.
//! - [`model`]: the decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU
//!   or GeGLU), reading its architecture's spec.
//! - [`cache`]: the per-sequence KV cache.
//! - [`sample`]: greedy and seeded sampling.
//! - [`tokenizer`]: `tokenizer.json` (or a GGUF file's tokenizer) through the `tokenizers` crate.
//! - [`chat`]: the model's chat template, rendering a conversation as its prompt text.
//! - [`open`]: a model directory or a GGUF file, converted at load if asked.
//! - [`finetune`]: LoRA fine-tuning: the decoder as a differentiable module,
//!   adapters saved as PEFT writes them.

pub mod arch;
pub mod cache;
pub mod chat;
pub mod config;
pub mod error;
mod files;
pub mod finetune;
pub mod format_report;
pub mod gguf;
pub mod model;
pub mod open;
pub mod sample;
pub mod tokenizer;
pub mod weights;

pub use arch::{Activation, ArchParams, ArchSpec, ExpertNames, LongRope, MoeParams, NormStyle};
pub use cache::{KV_BLOCK, KvCache};
pub use chat::{ChatMessage, ChatOptions, ChatTemplate};
pub use config::GenerationConfig;
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use error::LlmError;
pub use format_report::{FormatChoice, FormatReport, TensorFormatEntry, conversion_target};
pub use model::{Model, PREFILL_CHUNK, PromptChunk};
pub use open::{OpenOptions, OpenedModel, open_model};
pub use sample::{Sampler, SamplingParams};
pub use tokenizer::Tokenizer;
pub use weights::{LoadDtype, Weight, WeightStore, k_fallback};

pub use fucina;
