//! `fucina-serve`: serves a model directory or GGUF file over OpenAI's HTTP API.
//!
//! ```text
//! cargo run --release -p fucina-serve -- --model models/SmolLM2-135M-Instruct --port 8080
//! curl -s localhost:8080/v1/completions -H 'content-type: application/json' \
//!     -d '{"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0}'
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use fucina_llm::LoadDtype;
use fucina_serve::engine::{Engine, EngineOptions};
use fucina_serve::metrics::Metrics;
use fucina_serve::server::{AppState, serve};

/// Serve a language model over OpenAI's HTTP API.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// A Hugging Face model directory or a GGUF file.
    #[arg(long)]
    model: PathBuf,
    /// Convert the matrices at load (f32, f16, bf16, q8_0, q4_0, q4_k).
    #[arg(long)]
    dtype: Option<LoadDtype>,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Worker threads of the model.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The most sequences decoded together.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// The most requests waiting for a place; more get 429.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Positions per sequence (0: the model's max_position_embeddings).
    #[arg(long, default_value_t = 0)]
    ctx_len: usize,
    /// KV-cache memory for all running sequences, in MiB (default: max-batch
    /// sequences of ctx-len positions).
    #[arg(long)]
    kv_budget_mib: Option<usize>,
    /// Prompt tokens per prefill chunk, between decode steps (a chunk that
    /// rides along with a decode step holds at most 256).
    #[arg(long, default_value_t = fucina_llm::PREFILL_CHUNK)]
    prefill_chunk: usize,
    /// Memory for the prefix cache (prompt prefixes' keys and values kept for
    /// later requests), in MiB, besides the KV budget; 0 turns it off.
    #[arg(long, default_value_t = 0)]
    prefix_cache_mib: usize,
    /// The largest request body, in KiB.
    #[arg(long, default_value_t = 1024)]
    max_body_kib: usize,
    /// The model's name in the API (default: the file or directory name).
    #[arg(long)]
    model_id: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fucina-serve: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let model_id = args.model_id.clone().unwrap_or_else(|| {
        args.model
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned())
    });
    let options = EngineOptions {
        threads: args.threads,
        max_batch: args.max_batch,
        max_queue: args.max_queue,
        ctx_len: args.ctx_len,
        kv_budget_bytes: args.kv_budget_mib.map(|m| m.saturating_mul(1 << 20)),
        prefix_cache_bytes: args.prefix_cache_mib.saturating_mul(1 << 20),
        prefill_chunk: args.prefill_chunk,
    };
    let (path, dtype) = (args.model.clone(), args.dtype);
    eprintln!("fucina-serve: loading {}", path.display());
    let engine = Engine::start(options, Arc::new(Metrics::default()), move |ctx| {
        let opened = fucina_llm::open_model(&path, ctx, dtype)?;
        // What each tensor is stored as (the fallbacks of --dtype by name).
        eprintln!("fucina-serve: {}", opened.model.formats());
        Ok(opened)
    })?;
    let info = engine.info();
    eprintln!(
        "fucina-serve: {model_id}: context {} tokens, vocabulary {}",
        info.ctx_len, info.vocab
    );
    let state = AppState::new(engine, model_id, args.max_body_kib.saturating_mul(1024));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await?;
        let addr: SocketAddr = listener.local_addr()?;
        println!("fucina-serve: listening on http://{addr}");
        println!("fucina-serve: ready");
        serve(listener, state, shutdown_signal()).await
    })?;
    eprintln!("fucina-serve: stopped");
    Ok(())
}

/// Completes on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
