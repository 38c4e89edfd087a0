//! An OpenAI-compatible HTTP server for [`fucina_llm`] models, with continuous
//! batching whose answers do not depend on the load.
//!
//! The same request with the same `seed` gets the same tokens and the same
//! log-probability bits whether it runs alone or among other requests arriving
//! at any time: every sequence's logits are the same bits whatever the batch it
//! is decoded in ([`fucina_llm::Model::decode`]), its prompt's chunks give the
//! bits of one prefill, and its sampler draws from its own seeded stream.
//!
//! The layers, bottom up:
//! - [`prefix`]: the prefix cache (blocks of prompt prefixes' keys and values
//!   reused by later requests with the same prefix).
//! - [`engine`]: the scheduler thread (continuous batching, chunked prefill,
//!   a KV-cache budget, a bounded waiting queue, cancellation).
//! - [`api`]: OpenAI's request bodies, checked field by field, and its error
//!   body.
//! - [`server`]: the routes (`/v1/completions`, `/v1/chat/completions`,
//!   `/v1/models`, `/health`, `/metrics`), JSON answers and server-sent events.
//! - [`metrics`]: counters and gauges in Prometheus' text format.
//!
//! ```no_run
//! use std::sync::Arc;
//! use fucina_serve::engine::{Engine, EngineOptions};
//! use fucina_serve::metrics::Metrics;
//! use fucina_serve::server::{AppState, serve};
//!
//! let engine = Engine::start(EngineOptions::default(), Arc::new(Metrics::default()), |ctx| {
//!     fucina_llm::open_model("models/SmolLM2-135M-Instruct", ctx, None)
//! })?;
//! let state = AppState::new(engine, "smollm2".into(), 1 << 20);
//! let rt = tokio::runtime::Runtime::new()?;
//! rt.block_on(async {
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//!     serve(listener, state, std::future::pending()).await
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod api;
mod chat;
pub mod engine;
pub mod metrics;
pub mod prefix;
pub mod server;
mod text;
