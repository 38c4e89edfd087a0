//! Trains a 64-128-10 MLP on the 8x8 handwritten digits shipped with fucina:
//!
//! ```sh
//! cargo run --release -p fucina --example train_digits
//! ```
//!
//! Prints a progress bar (loss, examples/s), the test accuracy, the buffer-pool
//! and heap-allocation statistics of the run, and writes the loss curve to
//! `target/train_digits_loss.svg`. `--help` lists the flags.
//!
//! Checkpoints: `--stop-after 10 --save ck.safetensors` stops after epoch 10 and
//! saves the parameters, the optimizer state and the configuration;
//! `--resume ck.safetensors` continues from there, with the same losses, bit for
//! bit, as a run that never stopped.

mod job;

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::Parser;
use fucina::ExecContext;
use indicatif::{ProgressBar, ProgressStyle};

use job::{Args, Progress};

/// Counts heap allocations (every thread) to report the run's allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged; counting has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
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

fn run(args: &Args) -> fucina::Result<()> {
    args.validate()?;
    let data = job::load_digits(&args.data)?;
    let (train, test) = job::split(&data, args.seed);
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
    let resume = job::resume_point(&ctx, args, train.len()).inspect_err(|_| {
        if let Some(path) = &args.resume {
            eprintln!("cannot resume from {}", path.display());
        }
    })?;
    if let (Some(snap), Some(path)) = (&resume, &args.resume) {
        println!(
            "resuming from {} at epoch {} of {}",
            path.display(),
            snap.epoch,
            cfg.epochs
        );
    }
    let steps_per_epoch = train.len().div_ceil(cfg.batch);
    let last = args.stop_after.unwrap_or(cfg.epochs);
    let bar = ProgressBar::new((steps_per_epoch * last) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40.cyan/blue} {pos}/{len} steps  epoch {prefix}  {msg}")
            .expect("a valid template"),
    );
    // Allocations inside the training steps only (the progress bar's own are
    // excluded): counted from the end of one callback to the start of the next.
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
        if p.step.is_multiple_of(5) || p.step == p.steps {
            let rate = p.examples as f64 / p.elapsed.as_secs_f64().max(1e-9);
            bar.set_prefix(format!("{}", p.epoch + 1));
            bar.set_message(format!("loss {:.4}  {:.0} examples/s", p.loss, rate));
            bar.set_position(p.step as u64);
        }
        mark = allocations();
    };
    let (report, snapshot) = job::run_job(&ctx, args, &train, &test, resume, &mut on_step)?;
    bar.finish();
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
    let p = report.pool;
    println!(
        "buffer pool: {} hits, {} misses ({:.2}% hit rate), {} returned, {} discarded; shared tier: {} hits, {} misses; {} buffers outstanding (parameters, optimizer state)",
        p.hits,
        p.misses,
        100.0 * p.hits as f64 / (p.hits + p.misses).max(1) as f64,
        p.returned,
        p.discarded,
        report.shared_pool.hits,
        report.shared_pool.misses,
        report.outstanding
    );
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
    let shown = args.svg.canonicalize().unwrap_or_else(|_| args.svg.clone());
    println!("loss curve: {}", shown.display());
    Ok(())
}
