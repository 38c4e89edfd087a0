//! What the `train_digits` and `train_fashion` mains share (each `main.rs`
//! includes this file with `#[path]`): the allocation-counting global
//! allocator, the exit code, the progress display and the report lines.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fucina::storage::PoolStats;
use indicatif::{ProgressBar, ProgressStyle};

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

/// Heap allocations so far (every thread).
pub(crate) fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// The exit code of a run: success, or the error printed to stderr.
pub(crate) fn exit_code(result: fucina::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Passes `resume` (the checkpoint read for `--resume path`) on, saying on
/// stderr which file could not be read, or on stdout from which epoch (of
/// `epochs`, `epoch_of` the snapshot's) the run resumes.
pub(crate) fn announce_resume<S>(
    path: Option<&Path>,
    resume: fucina::Result<Option<S>>,
    epoch_of: impl Fn(&S) -> usize,
    epochs: usize,
) -> fucina::Result<Option<S>> {
    let resume = resume.inspect_err(|_| {
        if let Some(path) = path {
            eprintln!("cannot resume from {}", path.display());
        }
    })?;
    if let (Some(snap), Some(path)) = (&resume, path) {
        println!(
            "resuming from {} at epoch {} of {}",
            path.display(),
            epoch_of(snap),
            epochs
        );
    }
    Ok(resume)
}

/// The progress display of a training run. On a terminal (stderr), an
/// indicatif bar; otherwise (output piped or logged) a plain line on stderr
/// every [`PLAIN_EVERY`] and at the end of every epoch, so that a logged run is
/// never silent for minutes.
pub(crate) struct StepDisplay {
    /// The bar, when stderr is a terminal.
    bar: Option<ProgressBar>,
    /// Steps of the run (where the bar ends) and per epoch.
    steps: usize,
    steps_per_epoch: usize,
    /// Whether the plain display prints a line at each epoch's end (the
    /// example may print its own).
    epoch_lines: bool,
    /// When the display was made, and when it last printed a plain line.
    start: Instant,
    last: Instant,
}

/// How often the plain (not a terminal) display prints a line.
pub(crate) const PLAIN_EVERY: Duration = Duration::from_secs(5);

impl StepDisplay {
    /// A display of a run that ends at step `steps` (counted from the start
    /// of the whole run), `steps_per_epoch` steps per epoch.
    pub(crate) fn new(steps: usize, steps_per_epoch: usize) -> StepDisplay {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(steps as u64);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:40.cyan/blue} {pos}/{len} steps  epoch {prefix}  {msg}",
                )
                .expect("a valid template"),
            );
            bar
        });
        let now = Instant::now();
        StepDisplay {
            bar,
            steps,
            steps_per_epoch: steps_per_epoch.max(1),
            epoch_lines: true,
            start: now,
            last: now,
        }
    }

    /// Leaves the line at each epoch's end to the caller (plain display).
    #[allow(dead_code)] // train_fashion's alone
    pub(crate) fn without_epoch_lines(mut self) -> StepDisplay {
        self.epoch_lines = false;
        self
    }

    /// Starts the bar at `step` (a resumed run).
    pub(crate) fn set_position(&self, step: usize) {
        if let Some(bar) = &self.bar {
            bar.set_position(step as u64);
        }
    }

    /// Shows step `p`: on the bar every `every` steps and the last (the
    /// epoch, the loss and the rate in `unit`s per second); in plain lines
    /// every [`PLAIN_EVERY`] and at each epoch's end (the epoch of the run's
    /// `--epochs`, the step of the steps this run ends at, the loss, the rate
    /// and the wall time since the display was made).
    pub(crate) fn show(&mut self, p: &crate::job::Progress, every: usize, unit: &str) {
        let rate = p.examples as f64 / p.elapsed.as_secs_f64().max(1e-9);
        match &self.bar {
            Some(bar) => {
                if p.step.is_multiple_of(every) || p.step == self.steps {
                    bar.set_prefix(format!("{}", p.epoch + 1));
                    bar.set_message(format!("loss {:.4}  {:.0} {unit}/s", p.loss, rate));
                    bar.set_position(p.step as u64);
                }
            }
            None => {
                let epoch_end = p.step.is_multiple_of(self.steps_per_epoch);
                if (epoch_end && self.epoch_lines) || self.last.elapsed() >= PLAIN_EVERY {
                    self.last = Instant::now();
                    eprintln!(
                        "epoch {}/{}  step {}/{}  loss {:.4}  {:.0} {unit}/s  elapsed {:.1} s",
                        p.epoch + 1,
                        p.steps / self.steps_per_epoch,
                        p.step,
                        self.steps,
                        p.loss,
                        rate,
                        self.start.elapsed().as_secs_f64()
                    );
                }
            }
        }
    }

    /// Runs `f` (which prints) with the bar out of the way.
    #[allow(dead_code)] // train_fashion's alone
    pub(crate) fn suspend(&self, f: impl FnOnce()) {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// Ends the bar (it stays on the terminal, full).
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// Prints the buffer pool's counters: the context's local tier `p`, the
/// shared tier and the buffers still handed out.
pub(crate) fn print_pool(p: &PoolStats, shared: &PoolStats, outstanding: usize) {
    println!(
        "buffer pool: {} hits, {} misses ({:.2}% hit rate), {} returned, {} discarded; shared tier: {} hits, {} misses; {} buffers outstanding (parameters, optimizer state)",
        p.hits,
        p.misses,
        100.0 * p.hits as f64 / (p.hits + p.misses).max(1) as f64,
        p.returned,
        p.discarded,
        shared.hits,
        shared.misses,
        outstanding
    );
}

/// `path` as shown in the report: absolute where it can be.
pub(crate) fn shown(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}
