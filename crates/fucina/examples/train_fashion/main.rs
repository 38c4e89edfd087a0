//! Trains a small CNN on Fashion-MNIST (60,000 training and 10,000 test 28x28
//! images of clothing, ten classes):
//!
//! ```sh
//! apt-get install dataset-fashion-mnist   # Debian: /usr/share/datasets/fashion-mnist/
//! cargo run --release -p fucina --example train_fashion
//! ```
//!
//! The model: conv 3x3 (32) -> batch norm -> ReLU -> max pool -> conv 3x3 (64)
//! -> batch norm -> ReLU -> max pool -> linear 128 -> ReLU -> linear 10, AdamW
//! with a warmup + cosine schedule, batches of 64 from a seeded
//! [`fucina::data::DataLoader`]. The defaults (5 epochs) reach at least 91 %
//! test accuracy. Prints a progress bar (a plain line every 5 s when stderr is
//! not a terminal), the test accuracy after every epoch, the pool and
//! allocation statistics, and writes the loss and accuracy curves to
//! `target/train_fashion.svg` under the current directory. `--threads`
//! defaults to every core (what `ExecContext::new()` picks); the results are
//! the same bits for any count. `--help` lists the flags; `--data DIR` reads
//! the four `*-idx?-ubyte.gz` files from elsewhere.
//!
//! Checkpoints: `--stop-after 2 --save ck.safetensors` stops after epoch 2 and
//! saves the parameters, the batch-norm running statistics, the optimizer
//! state and the configuration; `--resume ck.safetensors` continues from there,
//! with the same losses, bit for bit, as a run that never stopped.

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
    let (train, test) = job::load_data(&args.data, args.limit, args.test_limit)?;
    let cfg = args.config();
    println!(
        "fashion-mnist: {} train / {} test images of {}x{}, CNN conv{}-conv{}-fc{}-10 with batch norm, \
         AdamW lr {}, batch {}, {} epochs, {} thread(s), seed {}",
        train.len(),
        test.len(),
        train.rows,
        train.cols,
        cfg.conv1,
        cfg.conv2,
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
        job::resume_point(&ctx, args, &train),
        |s| s.epoch,
        cfg.epochs,
    )?;
    let first_epoch = resume.as_ref().map_or(0, |s| s.epoch);
    let steps_per_epoch = job::train_loader(&train, &cfg)?.batches_per_epoch();
    let last = args.stop_after.unwrap_or(cfg.epochs);
    // The example prints its own line at each epoch's end (below).
    let mut display =
        cli::StepDisplay::new(steps_per_epoch * last, steps_per_epoch).without_epoch_lines();
    display.set_position(steps_per_epoch * first_epoch);
    // Allocations inside the training steps only (the progress display's and the
    // evaluations' excluded): counted from the end of one callback to the start
    // of the next, skipping each epoch's first step (it follows an evaluation).
    const WARMUP: usize = 5;
    let (mut in_steps, mut mark, mut counted, mut after_warmup) =
        (0u64, allocations(), 0usize, 0u64);
    let mut on_step = |p: &Progress| {
        let now = allocations();
        if !(p.step - 1).is_multiple_of(steps_per_epoch) {
            in_steps += now - mark;
            counted += 1;
            if counted == WARMUP {
                after_warmup = in_steps;
            }
        }
        display.show(p, 10, "images");
        if p.step.is_multiple_of(steps_per_epoch) {
            // Printed on a terminal and off it alike.
            display.suspend(|| {
                println!(
                    "epoch {}: {:.1} s of training so far, loss {:.4}",
                    p.epoch + 1,
                    p.elapsed.as_secs_f64(),
                    p.loss
                )
            });
        }
        mark = allocations();
    };
    let (report, snapshot) = job::run_job(&ctx, args, &train, &test, resume, &mut on_step)?;
    display.finish();
    let steps = report.losses.len();
    let secs = report.train_time.as_secs_f64();
    let epochs_run = report.accuracies.len();
    println!(
        "trained {steps} steps in {secs:.2} s ({:.2} s per epoch): {:.0} images/s, final loss {:.4}",
        secs / epochs_run.max(1) as f64,
        report.examples as f64 / secs.max(1e-9),
        report.losses.last().copied().unwrap_or(f32::NAN)
    );
    for (i, a) in report.accuracies.iter().enumerate() {
        println!(
            "epoch {}: test accuracy {:.2}%",
            first_epoch + i + 1,
            100.0 * a
        );
    }
    if snapshot.epoch < cfg.epochs {
        println!("stopped after epoch {} of {}", snapshot.epoch, cfg.epochs);
    }
    println!(
        "test accuracy: {:.2}% ({} images)",
        100.0 * report.test_accuracy(),
        test.len()
    );
    cli::print_pool(&report.pool, &report.shared_pool, report.outstanding);
    let measured = counted.saturating_sub(WARMUP).max(1);
    println!(
        "heap allocations in training steps: {in_steps} in total, {:.2} per step after {WARMUP} warm-up steps",
        (in_steps - after_warmup) as f64 / measured as f64
    );
    if let Some(path) = &args.save {
        println!("checkpoint (epoch {}): {}", snapshot.epoch, path.display());
    }
    job::write_svg(&args.svg, &report, steps_per_epoch, first_epoch)?;
    let shown = cli::shown(&args.svg);
    println!("loss and accuracy curves: {}", shown.display());
    Ok(())
}
