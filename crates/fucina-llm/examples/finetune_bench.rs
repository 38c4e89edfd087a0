//! Times LoRA training steps on a model directory with synthetic token ids
//! (no tokenizer needed: a random-weight model of a real shape serves), for
//! comparisons with other trainers on the same configuration.
//!
//! ```text
//! cargo run --release -p fucina-llm --example finetune_bench -- \
//!     --model DIR --batch 4 --seq-len 256 --lora-r 8 --target all --steps 5 --threads 2 \
//!     [--grad-checkpoint] [--bf16-products] [--pool-cache-mib N]
//! ```
//!
//! Each step is a full optimizer step (forward, backward, clipping, AdamW) on
//! a batch of `--batch` rows of `--seq-len` ids (every token after the first
//! predicted). It prints one line per step (its loss and seconds), then the
//! median step time over the steps after the first (the warm-up), the
//! training tokens per second at that median (`batch · seq-len` tokens per
//! step), and the process's peak resident memory (`VmHWM` of
//! `/proc/self/status`, where there is one).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use fucina_llm::finetune::data::{Batch, Example};
use fucina_llm::finetune::{
    FinetuneError, LoraConfig, Target, TrainOptions, TrainableDecoder, Trainer,
};
use fucina_llm::fucina::ExecContext;

/// Time LoRA training steps on synthetic data.
#[derive(Parser, Debug)]
#[command(name = "finetune_bench")]
struct Args {
    /// Model directory (config.json, safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Rows per step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Tokens per row.
    #[arg(long, default_value_t = 256)]
    seq_len: usize,
    /// Adapter rank.
    #[arg(long, default_value_t = 8)]
    lora_r: usize,
    /// Adapter alpha.
    #[arg(long, default_value_t = 16.0)]
    lora_alpha: f32,
    /// Target projections, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    target: String,
    /// Steps to run (the first is a warm-up).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Gradient checkpointing per layer.
    #[arg(long)]
    grad_checkpoint: bool,
    /// bf16 products with the AMX rule for the frozen bf16 base
    /// (`TrainableDecoder::use_bf16_products`).
    #[arg(long)]
    bf16_products: bool,
    /// Worker threads (default: the available parallelism).
    #[arg(long)]
    threads: Option<usize>,
    /// The context pool's cache cap in MiB, both tiers (default 8192, as the
    /// `finetune` example: a step's buffers come back from the pool the next
    /// step; 0 keeps the pool's own caps, 1 GiB shared and 256 MiB local,
    /// past which a step maps, and the kernel zeroes, fresh pages).
    #[arg(long, default_value_t = 8192)]
    pool_cache_mib: usize,
}

/// `VmHWM` of `/proc/self/status` in kB, where there is one.
fn peak_rss_kb() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn run(args: &Args) -> Result<(), FinetuneError> {
    let invalid = |reason: &str| FinetuneError::Invalid {
        op: "finetune_bench",
        reason: reason.to_string(),
    };
    if args.batch == 0 || args.seq_len < 2 || args.steps < 2 {
        return Err(invalid(
            "need --batch >= 1, --seq-len >= 2 and --steps >= 2",
        ));
    }
    let ctx = match args.threads {
        Some(n) => ExecContext::with_threads(n.max(1)),
        None => ExecContext::new(),
    };
    if args.pool_cache_mib > 0 {
        let bytes = args.pool_cache_mib.saturating_mul(1 << 20);
        ctx.pool().pool().set_max_cached_bytes(bytes);
        ctx.pool().set_max_cached_bytes(bytes);
    }
    let lora = LoraConfig {
        r: args.lora_r,
        alpha: args.lora_alpha,
        dropout: 0.0,
        targets: Target::parse_list(&args.target)?,
        seed: 0,
    };
    let t = Instant::now();
    let mut model = TrainableDecoder::load(&ctx, &args.model, &lora)?;
    model.set_checkpointing(args.grad_checkpoint);
    if args.bf16_products {
        model.use_bf16_products()?;
    }
    eprintln!("loaded in {:.2} s", t.elapsed().as_secs_f64());
    let vocab = model.config().vocab_size;
    let examples: Vec<Example> = (0..args.batch)
        .map(|r| Example {
            ids: (0..args.seq_len)
                .map(|i| (fucina_llm::fucina::rng::at(r as u64, i as u64) % vocab as u64) as u32)
                .collect(),
            prompt_len: 0,
        })
        .collect();
    let refs: Vec<&Example> = examples.iter().collect();
    let batch = Batch::new(&refs, 0).ok_or_else(|| invalid("no example"))?;
    let opts = TrainOptions {
        lr: 1e-4,
        batch: args.batch,
        ..TrainOptions::default()
    };
    let mut trainer = Trainer::new(model, opts, args.steps as u64)?;
    let mut times = Vec::new();
    for s in 0..args.steps {
        let t = Instant::now();
        let loss = trainer.step(&ctx, &batch)?;
        let dt = t.elapsed().as_secs_f64();
        println!("step {} loss {loss} {dt:.3} s", s + 1);
        if s > 0 {
            times.push(dt);
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let tokens = (args.batch * args.seq_len) as f64;
    println!(
        "median step {median:.3} s, {:.1} training tokens/s, {} threads",
        tokens / median,
        ctx.threads()
    );
    match peak_rss_kb() {
        Some(kb) => println!("peak RSS {:.1} MiB", kb as f64 / 1024.0),
        None => println!("peak RSS unknown"),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
