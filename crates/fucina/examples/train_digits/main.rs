//! Trains a 64-128-10 MLP on the 8x8 handwritten digits shipped with fucina:
//!
//! ```sh
//! cargo run --release -p fucina --example train_digits
//! ```
//!
//! Prints a progress bar (loss, examples/s; a plain line every 5 s and per
//! epoch when stderr is not a terminal), the test accuracy, the buffer-pool
//! and heap-allocation statistics of the run, and writes the loss curve to
//! `target/train_digits_loss.svg` under the current directory. `--threads`
//! defaults to every core (what `ExecContext::new()` picks); the results are
//! the same bits for any count. `--help` lists the flags.
//!
//! Checkpoints: `--stop-after 10 --save ck.safetensors` stops after epoch 10 and
//! saves the parameters, the optimizer state and the configuration;
//! `--resume ck.safetensors` continues from there, with the same losses, bit for
//! bit, as a run that never stopped.

#[path = "../common/cli.rs"]
mod cli;
mod job;

use std::process::ExitCode;

use clap::Parser;
use fucina::ExecContext;

use cli::allocations;
use job::{Args, Progress};

fn main() -> ExitCode {
    cli::exit_code(run(&Args::parse()))
}

fn run(args: &Args) -> fucina::Result<()> {
    args.validate()?;
    let data = job::load_digits(&args.data)?;
    let (train, test) = job::split(&data, args.seed)?;
    let cfg = args.config();
    println!(
        "digits: {} images ({} train / {} test), MLP 64-{}-10, AdamW lr {}, batch {}, {} epochs, {} thread(s), seed {}",
        data.len(),
        train.len(),
        test.len(),
        cfg.hidden,
        cfg.lr,
        cfg.batch,
        cfg.epochs,
        args.threads,
        args.seed
    );
    let ctx = ExecContext::with_threads(args.threads);
    let resume = cli::announce_resume(
        args.resume.as_deref(),
        job::resume_point(&ctx, args, train.len()),
        |s| s.epoch,
        cfg.epochs,
    )?;
    let steps_per_epoch = train.len().div_ceil(cfg.batch);
    let last = args.stop_after.unwrap_or(cfg.epochs);
    let mut display = cli::StepDisplay::new(steps_per_epoch * last, steps_per_epoch);
    display.set_position(steps_per_epoch * resume.as_ref().map_or(0, |s| s.epoch));
    // Allocations inside the training steps only (the progress display's own
    // are excluded): counted from the end of one callback to the start of the next.
    const WARMUP: usize = 5;
    let (mut in_steps, mut mark, mut after_warmup) = (0u64, allocations(), 0u64);
    let mut run_steps = 0;
    let mut on_step = |p: &Progress| {
        let now = allocations();
        in_steps += now - mark;
        run_steps += 1;
        if run_steps == WARMUP {
            after_warmup = in_steps;
        }
        display.show(p, 5, "examples");
        mark = allocations();
    };
    let (report, snapshot) = job::run_job(&ctx, args, &train, &test, resume, &mut on_step)?;
    display.finish();
    let steps = report.losses.len();
    let secs = report.train_time.as_secs_f64();
    println!(
        "trained {steps} steps in {secs:.2} s: {:.0} examples/s, final loss {:.4}",
        report.examples as f64 / secs.max(1e-9),
        report.losses.last().copied().unwrap_or(f32::NAN)
    );
    if snapshot.epoch < cfg.epochs {
        println!("stopped after epoch {} of {}", snapshot.epoch, cfg.epochs);
    }
    println!(
        "test accuracy: {:.2}% ({} images)",
        100.0 * report.test_accuracy,
        test.len()
    );
    cli::print_pool(&report.pool, &report.shared_pool, report.outstanding);
    let measured = steps.saturating_sub(WARMUP).max(1);
    println!(
        "heap allocations in training steps: {in_steps} in total, {:.1} per step after {WARMUP} warm-up steps",
        (in_steps - after_warmup) as f64 / measured as f64
    );
    if let Some(path) = &args.save {
        println!("checkpoint (epoch {}): {}", snapshot.epoch, path.display());
    }
    let first_epoch = snapshot.epoch - report.losses.len() / steps_per_epoch;
    job::write_svg(&args.svg, &report.losses, steps_per_epoch, first_epoch)?;
    let shown = cli::shown(&args.svg);
    println!("loss curve: {}", shown.display());
    Ok(())
}
