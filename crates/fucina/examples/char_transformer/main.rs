//! Trains a 2-layer character-level transformer on Jane Austen's *Pride and
//! Prejudice* (shipped with fucina) and samples text from it:
//!
//! ```sh
//! cargo run --release -p fucina --example char_transformer
//! ```
//!
//! Prints the loss every `--log-every` steps with the throughput in characters
//! (tokens) per second, the held-out loss, and a seeded sample of
//! `--sample-chars` characters. The same `--seed` gives the same losses and the
//! same sample, bit for bit, for every `--threads` (default: every core, what
//! `ExecContext::new()` picks). `--help` lists the flags.
//! `--eval-quantized` also reports the held-out loss with the linear weights
//! rounded through Q8_0 and Q4_0 (see `docs/QUANTIZATION.md`).

mod job;

use std::process::ExitCode;

use clap::Parser;
use fucina::ExecContext;
use fucina::exec::QuantFormat;
use fucina::nn::sub_seed;

use job::{Args, Corpus, Progress};

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

fn run(args: &Args) -> fucina::Result<()> {
    args.validate()?;
    let cfg = args.config();
    let corpus = Corpus::new(&job::load_text(&args.data, 1)?);
    let prompt = corpus.encode(&args.prompt)?;
    let ctx = ExecContext::with_threads(args.threads);
    println!(
        "text: {} characters, vocabulary {}; model: {} layers, d_model {}, {} heads, context {}; batch {}, {} steps, AdamW lr {} (warmup {}, cosine), clip {}, {} thread(s), seed {}",
        corpus.ids.len(),
        corpus.vocab.len(),
        cfg.layers,
        cfg.d_model,
        cfg.heads,
        cfg.context,
        cfg.batch,
        cfg.steps,
        cfg.lr,
        cfg.warmup.min(cfg.steps),
        cfg.clip,
        ctx.threads(),
        cfg.seed
    );
    let log_every = args.log_every;
    let mut on_step = |p: &Progress| {
        if p.step.is_multiple_of(log_every) || p.step == 1 || p.step == p.steps {
            println!(
                "step {:>5}/{}  loss {:.4}  lr {:.2e}  {:.0} tokens/s",
                p.step,
                p.steps,
                p.loss,
                p.lr,
                p.tokens as f64 / p.elapsed.as_secs_f64().max(1e-9)
            );
        }
    };
    let (report, model) = job::train(&ctx, &corpus, &cfg, &mut on_step)?;
    let secs = report.train_time.as_secs_f64();
    println!(
        "trained {} steps ({} parameters) in {secs:.2} s: {:.0} tokens/s; held-out loss {:.4} ({} batches)",
        report.losses.len(),
        report.parameters,
        report.tokens as f64 / secs.max(1e-9),
        report.val_loss,
        job::VAL_BATCHES
    );
    if args.eval_quantized {
        for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
            let loss = job::quantized_held_out_loss(&ctx, &model, &corpus, &cfg, format)?;
            println!(
                "held-out loss with {} linear weights: {loss:.6} ({:+.4} % over f32 {:.6})",
                format.name(),
                (f64::from(loss) / f64::from(report.val_loss) - 1.0) * 100.0,
                report.val_loss
            );
        }
    }
    let sampled = job::sample(
        &ctx,
        &model,
        &prompt,
        args.sample_chars,
        args.temperature,
        sub_seed(args.seed, 6),
    )?;
    println!(
        "sample (temperature {}, seed {}):\n----\n{}{}\n----",
        args.temperature,
        args.seed,
        args.prompt,
        corpus.decode(&sampled)
    );
    Ok(())
}
