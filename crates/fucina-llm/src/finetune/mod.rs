//! LoRA fine-tuning of a pretrained decoder (`docs/FINETUNE.md` in the
//! repository is the guide):
//! - [`decoder`]: the Llama-family decoder as a differentiable module over
//!   frozen base weights, with adapters;
//! - [`lora`]: the adapters and their configuration;
//! - [`data`]: JSONL records tokenized into examples, and their batches;
//! - [`peft`]: adapters written and read as PEFT writes them;
//! - [`accumulate`]: how a step combines its micro-batches' gradients (the
//!   fixed tree that makes any number of MPI ranks give one process's bits);
//! - [`trainer`]: the job (causal-LM loss on the completion tokens, AdamW,
//!   warmup-cosine, gradient clipping, evaluation loss).

pub mod accumulate;
pub mod data;
pub mod decoder;
mod error;
pub mod lora;
pub mod peft;
pub mod trainer;

pub use accumulate::{Accumulator, TreeAccumulator};
pub use data::{Example, read_jsonl};
pub use decoder::TrainableDecoder;
pub use error::FinetuneError;
pub use lora::{LoraAdapter, LoraConfig, Target};
pub use trainer::{Event, TrainOptions, Trainer, split_eval};
