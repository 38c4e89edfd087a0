//! The training step and a 20-op chain on a shared machine: quiet, then with 1
//! and 2 competing busy processes that the bench spawns itself, fucina against
//! JAX in the same run (the issue of the worker team on a shared machine).
//!
//! ```text
//! cargo bench -p fucina-benches --bench load -- [--runs 20] [--steps 200]
//!     [--busy 0,1,2] [--jax /work/venv-jax/bin/python] [--threads 2]
//! ```
//!
//! For each load level (0, 1, 2 busy processes by default) the bench starts
//! that many copies of itself that spin on one core each (each exits on its
//! own after [`BUSY_LIMIT`] even if the bench dies, and is killed when the
//! level ends), waits for them to ramp up, then alternates `--runs` runs of:
//!
//! - `mlp`: the 784-256-10 MLP training step of `train_step.rs` (batch 64,
//!   ReLU, cross-entropy, backward, SGD) on a `--threads`-thread context;
//! - `chain`: 20 elementwise ops on `[64, 256]` (1 add + 19 mul), the
//!   per-op overhead case of the exec bench, on the same context;
//! - `jax`: the same MLP step under `jax.jit` (`benches/jax/train_step.py
//!   --serve`, one process per level, compiled before the first run), when
//!   `--jax <python>` names an interpreter with JAX installed.
//!
//! A run is `--steps` steps (5x as many chain iterations); its figure is the
//! mean step time (the run's wall time over its steps: time slices lost to
//! the competing processes count, as they do for a training loop). Printed per
//! level and variant: the median over the runs, the spread (min..max of the
//! runs), and the worst run against the quiet median.

use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use fucina::autograd::Tensor;
use fucina::exec::{ExecContext, RawTensor};

/// Set in a busy child: spin for this many seconds, then exit.
const BUSY_ENV: &str = "FUCINA_LOAD_BENCH_BUSY_SECS";
/// The longest a busy child lives, whatever happens to the bench.
const BUSY_LIMIT: Duration = Duration::from_secs(600);
/// Time given to the busy processes to start spinning before measuring.
const RAMP: Duration = Duration::from_millis(500);

const LR: f32 = 0.01;
const BATCH: usize = 64;
const IN: usize = 784;
const HIDDEN: usize = 256;
const OUT: usize = 10;

/// A busy child: spins until its time is up (bounded), touching only a few
/// registers, like a compiler's hot loop competing for the core.
fn busy(secs: u64) {
    let end = Instant::now() + Duration::from_secs(secs).min(BUSY_LIMIT);
    let mut x = 1u64;
    while Instant::now() < end {
        for _ in 0..100_000 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    black_box(x);
}

/// The competing processes of one load level; killed and reaped on drop.
struct Hogs(Vec<Child>);

impl Hogs {
    fn spawn(n: usize) -> Hogs {
        let exe = std::env::current_exe().expect("the bench binary");
        let hogs = (0..n)
            .map(|_| {
                Command::new(&exe)
                    .env(BUSY_ENV, BUSY_LIMIT.as_secs().to_string())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("spawn a busy process")
            })
            .collect();
        Hogs(hogs)
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The JAX step in a serving Python process (`train_step.py --serve`).
struct Jax {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Jax {
    fn start(python: &str) -> Option<Jax> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/jax/train_step.py");
        let mut child = Command::new(python)
            .args([script, "--serve"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| eprintln!("jax: cannot start {python}: {e}"))
            .ok()?;
        let input = child.stdin.take()?;
        let mut output = BufReader::new(child.stdout.take()?);
        let mut line = String::new();
        output.read_line(&mut line).ok()?;
        if line.trim() != "ready" {
            eprintln!("jax: unexpected first line {line:?}");
            return None;
        }
        Some(Jax {
            child,
            input,
            output,
        })
    }

    /// One run of `steps` steps: the mean step time.
    fn run(&mut self, steps: usize) -> Option<Duration> {
        writeln!(self.input, "run {steps}").ok()?;
        self.input.flush().ok()?;
        let mut line = String::new();
        self.output.read_line(&mut line).ok()?;
        let us: f64 = line.split_whitespace().next()?.parse().ok()?;
        Some(Duration::from_secs_f64(us * 1e-6))
    }
}

impl Drop for Jax {
    fn drop(&mut self) {
        let _ = writeln!(self.input, "quit");
        let _ = self.input.flush();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The MLP step of `train_step.rs`, on its own context.
struct Mlp {
    p: [Tensor; 4],
    x: Tensor,
    l: RawTensor<i64>,
    /// Last: dropped after the tensors it pools.
    ctx: ExecContext,
}

impl Mlp {
    fn new(threads: usize) -> Mlp {
        let ctx = ExecContext::with_threads(threads);
        let p = [
            Tensor::kaiming_uniform(&ctx, &[HIDDEN, IN], 2).unwrap(),
            Tensor::zeros(&ctx, &[HIDDEN]).unwrap(),
            Tensor::kaiming_uniform(&ctx, &[OUT, HIDDEN], 3).unwrap(),
            Tensor::zeros(&ctx, &[OUT]).unwrap(),
        ]
        .map(Tensor::into_variable);
        let x = Tensor::randn(&ctx, &[BATCH, IN], 1.0, 1).unwrap();
        let labels: Vec<i64> = (0..BATCH as i64).map(|i| (i * 7) % OUT as i64).collect();
        let l = ctx.from_slice_typed::<i64>(&[BATCH], &labels).unwrap();
        Mlp { p, x, l, ctx }
    }

    fn step(&mut self) -> f32 {
        let ctx = &self.ctx;
        let scope = ctx.open_exec_scope();
        let h = self
            .x
            .linear(ctx, &self.p[0], Some(&self.p[1]))
            .unwrap()
            .relu(ctx)
            .unwrap();
        let logits = h.linear(ctx, &self.p[2], Some(&self.p[3])).unwrap();
        let loss = logits.cross_entropy(ctx, &self.l).unwrap();
        loss.backward(ctx).unwrap();
        let v = loss.item().unwrap();
        drop((h, logits, loss));
        ctx.close_exec_scope(scope);
        for t in self.p.iter_mut() {
            t.sgd_step_(LR).unwrap();
            t.zero_grad();
        }
        v
    }
}

/// 20 elementwise ops on `[64, 256]`.
struct Chain {
    x: RawTensor<f32>,
    y: RawTensor<f32>,
    /// Last: dropped after the tensors it pools.
    ctx: ExecContext,
}

impl Chain {
    fn new(threads: usize) -> Chain {
        let ctx = ExecContext::with_threads(threads);
        let x = ctx.full(&[64, 256], 0.5).unwrap();
        let y = ctx.full(&[64, 256], 1.0).unwrap();
        Chain { x, y, ctx }
    }

    fn run(&self) {
        let mut t = self.ctx.add(&self.x, &self.y).unwrap();
        for _ in 0..19 {
            t = self.ctx.mul(&t, &self.y).unwrap();
        }
        black_box(t);
    }
}

/// The mean time per call of `steps` calls of `f` (wall time over the run
/// divided by the calls: a preemption in the middle of the run counts, as it
/// does for a training loop).
fn mean_of(steps: usize, mut f: impl FnMut()) -> Duration {
    let t0 = Instant::now();
    for _ in 0..steps {
        f();
    }
    t0.elapsed() / u32::try_from(steps).unwrap_or(u32::MAX)
}

/// Median, min and max of run figures.
fn summary(runs: &mut [Duration]) -> (Duration, Duration, Duration) {
    runs.sort_unstable();
    (runs[runs.len() / 2], runs[0], runs[runs.len() - 1])
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Args {
    runs: usize,
    steps: usize,
    busy: Vec<usize>,
    jax: Option<String>,
    threads: usize,
}

fn args() -> Args {
    let mut a = Args {
        runs: 20,
        steps: 200,
        busy: vec![0, 1, 2],
        jax: None,
        threads: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().expect("a value after the flag");
        match arg.as_str() {
            "--runs" => a.runs = value().parse().expect("--runs N"),
            "--steps" => a.steps = value().parse().expect("--steps N"),
            "--threads" => a.threads = value().parse().expect("--threads N"),
            "--jax" => a.jax = Some(value()),
            "--busy" => {
                a.busy = value()
                    .split(',')
                    .map(|v| v.parse().expect("--busy 0,1,2"))
                    .collect()
            }
            // `cargo bench` passes `--bench`; criterion-style filters are ignored.
            _ => {}
        }
    }
    assert!(
        a.runs >= 1 && a.steps >= 1,
        "--runs and --steps must be positive"
    );
    a
}

fn main() {
    if let Some(secs) = std::env::var(BUSY_ENV).ok().and_then(|v| v.parse().ok()) {
        return busy(secs);
    }
    let a = args();
    let cpu = fucina_benches::cpu_model();
    let uptime = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load bench: {} runs x {} steps, {} threads, CPU {cpu}, {} logical CPUs, loadavg at start {}",
        a.runs,
        a.steps,
        a.threads,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        uptime.trim()
    );
    let mut mlp = Mlp::new(a.threads);
    let chain = Chain::new(a.threads);
    // Warm-up: the pools, the page faults, the workers.
    for _ in 0..50 {
        black_box(mlp.step());
        chain.run();
    }
    let mut quiet: [Option<Duration>; 3] = [None; 3];
    println!(
        "| busy | variant | median of runs | spread (min..max) | median / quiet | worst run / quiet |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for &n in &a.busy {
        let mut jax = a.jax.as_deref().and_then(Jax::start);
        if let Some(j) = &mut jax {
            // Warm the served step before the load starts.
            let _ = j.run(50);
        }
        let hogs = Hogs::spawn(n);
        std::thread::sleep(RAMP);
        let mut figures: [Vec<Duration>; 3] = Default::default();
        for _ in 0..a.runs {
            figures[0].push(mean_of(a.steps, || {
                black_box(mlp.step());
            }));
            figures[1].push(mean_of(a.steps * 5, || chain.run()));
            if let Some(j) = &mut jax
                && let Some(d) = j.run(a.steps)
            {
                figures[2].push(d);
            }
        }
        drop(hogs);
        drop(jax);
        for (k, name) in ["fucina mlp step", "fucina 20-op chain", "jax mlp step"]
            .into_iter()
            .enumerate()
        {
            if figures[k].is_empty() {
                continue;
            }
            let worst = *figures[k].iter().max().unwrap();
            let (med, lo, hi) = summary(&mut figures[k]);
            if n == 0 {
                quiet[k] = Some(med);
            }
            let ratio = |d: Duration| {
                quiet[k].map_or("-".to_owned(), |q| {
                    format!("{:.2}x", d.as_secs_f64() / q.as_secs_f64())
                })
            };
            println!(
                "| {n} | {name} | {:.1} µs | {:.1}..{:.1} µs | {} | {} |",
                us(med),
                us(lo),
                us(hi),
                ratio(med),
                ratio(worst)
            );
        }
    }
    let end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("loadavg at end {}", end.trim());
}
