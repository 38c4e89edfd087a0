//! The gradient reduction alone, at any rank count, on a synthetic gradient
//! whose sum depends on the order of its additions; and the paper model of a
//! step's communication at scale.
//!
//! ```text
//! mpirun -np 16 --oversubscribe target/release/examples/reduce_sim --params 65536 --microbatches 16
//! target/release/examples/reduce_sim --table      # the model's table (no MPI needed)
//! ```
//!
//! Each step, microbatch `m`'s partial gradient is a fixed pseudo-random
//! vector (magnitudes from 2^-10 to 2^20, both signs, so a different summation
//! order gives different bits). Every rank also runs the one-process
//! `LocalDataParallel` over all microbatches and checks, step by step, that
//! its gradient and loss have the same bits (aborting the job otherwise).
//! Then every rank prints `rank {r} bytes_per_step {b} model {v}` (the element
//! counts it posted to MPI for other ranks' data, times 4, and the closed-form
//! model of the same), and rank 0 prints `sim ranks .. bits ok ..` with what a
//! ring all-reduce would receive.
//! `scripts/scale_sim.sh` runs it under Open MPI's traffic monitoring and
//! compares what MPI really moved with both.
// The autograd error carries inline shapes (no heap on the error path).

use std::process::ExitCode;

use fucina::autograd::Tensor;
use fucina::exec::ExecContext;
use fucina_dist::{
    DataParallel, DataParallelOptions, DistError, LocalDataParallel, Reduction, World,
};

const USAGE: &str = "\
usage: reduce_sim [--params N] [--microbatches M] [--steps S] [--bucket-bytes B]
                  [--reduction auto|tree|allgather]
       reduce_sim --table
  defaults: --params 65536 --microbatches 16 --steps 2 (bucket bytes: the default 1 MiB)";

struct Args {
    params: usize,
    microbatches: usize,
    steps: usize,
    bucket_bytes: usize,
    reduction: Reduction,
    table: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        params: 65536,
        microbatches: 16,
        steps: 2,
        bucket_bytes: DataParallelOptions::default().bucket_bytes,
        reduction: Reduction::Auto,
        table: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| -> Result<usize, String> {
            v.parse()
                .map_err(|_| format!("{flag}: `{v}` is not a count"))
        };
        match flag.as_str() {
            "--params" => a.params = num(value()?)?,
            "--microbatches" => a.microbatches = num(value()?)?,
            "--steps" => a.steps = num(value()?)?,
            "--bucket-bytes" => a.bucket_bytes = num(value()?)?,
            "--reduction" => {
                a.reduction = value()?.parse().map_err(|e| format!("--reduction: {e}"))?
            }
            "--table" => a.table = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if a.params == 0 {
        return Err("--params must be at least 1".into());
    }
    Ok(a)
}

/// Microbatch `m`'s partial at step `step`: element `j` is a hash of
/// `(step, m, j)` scaled to 2^-10 .. 2^20 with either sign.
fn partial(step: usize, m: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|j| {
            let mut h = (step as u64) << 48 ^ (m as u64) << 32 ^ j as u64;
            h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^= h >> 29;
            h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h ^= h >> 32;
            let mant = 1.0 + (h & 0xffff) as f32 / 65536.0;
            let exp = ((h >> 16) % 31) as i32 - 10;
            let sign = if h >> 63 == 1 { -1.0 } else { 1.0 };
            sign * mant * 2f32.powi(exp)
        })
        .collect()
}

/// Forward and backward of microbatch `m`: `loss = sum(p · c)` with `c` the
/// partial, so `p`'s gradient is `c`; the scalar is `c`'s first element.
fn microbatch(ctx: &ExecContext, p: &Tensor, c: &[f32]) -> fucina::autograd::Result<f32> {
    let c_t = Tensor::from_slice(ctx, p.shape(), c)?;
    let loss = p.mul(ctx, &c_t)?.sum_all(ctx)?;
    loss.backward(ctx)?;
    Ok(c[0])
}

fn bits(ctx: &ExecContext, p: &Tensor) -> Vec<u32> {
    p.grad(ctx)
        .ok()
        .flatten()
        .map(|g| g.to_vec().iter().map(|v| v.to_bits()).collect())
        .unwrap_or_default()
}

fn run(world: &World, args: &Args) -> Result<(), DistError> {
    let ctx = ExecContext::with_threads(1);
    let (n, m) = (args.params, args.microbatches);
    let p = Tensor::variable_from_slice(&ctx, &[n], &vec![0.0; n])?;
    let q = Tensor::variable_from_slice(&ctx, &[n], &vec![0.0; n])?;
    let opts = DataParallelOptions {
        microbatches: m,
        bucket_bytes: args.bucket_bytes,
        reduction: args.reduction,
        ..Default::default()
    };
    let mut dp = DataParallel::new(world, vec![p], opts)?;
    let mut local = LocalDataParallel::new(vec![q], m)?;
    let mut bytes = 0;
    let mut exchange_s = 0.0;
    for step in 0..args.steps {
        let parts: Vec<Vec<f32>> = (0..m).map(|mb| partial(step, mb, n)).collect();
        let want = local.step(&ctx, |ctx, p, mb| microbatch(ctx, &p[0], &parts[mb]))?;
        let got = dp.step(&ctx, |ctx, p, mb| microbatch(ctx, &p[0], &parts[mb]))?;
        if got.value.to_bits() != want.value.to_bits()
            || bits(&ctx, &dp.params()[0]) != bits(&ctx, &local.params()[0])
        {
            world.abort(&format!(
                "step {step}: the {:?} reduction's gradient differs from the one-process run",
                dp.reduction()
            ));
        }
        bytes = got.bytes_received;
        exchange_s += got.exchange_s;
    }
    // The closed-form model of this rank's bytes per step: the tree moves
    // 2 (N - 1) / N of the flat gradient (parameters and the loss slot), the
    // allgather every microbatch partial but this rank's own.
    let ranks = world.size();
    let w = (n + 1) as f64 * 4.0;
    let own = fucina_dist::shard_range(m, world.rank(), ranks).len();
    let model = match dp.reduction() {
        Reduction::Tree => 2.0 * (ranks - 1) as f64 / ranks as f64 * w,
        _ => (m - own) as f64 * w,
    };
    // One line per rank, whole (for the script's per-rank comparison).
    println!(
        "rank {} bytes_per_step {bytes} model {model:.0}",
        world.rank()
    );
    world.barrier();
    if world.is_root() {
        println!(
            "sim ranks {ranks} microbatches {m} params {n} reduction {:?} steps {} bits ok \
             bytes_per_step {bytes} ring {} exchange_ms_per_step {:.4}",
            dp.reduction(),
            args.steps,
            dp.ring_bytes_per_step(),
            exchange_s / args.steps.max(1) as f64 * 1e3
        );
    }
    Ok(())
}

/// The model of one step's gradient exchange: `stages × latency + messages ×
/// overhead + bytes / bandwidth` per rank.
struct Net {
    /// Seconds per sequential message stage (network latency).
    latency: f64,
    /// Seconds of software overhead per message a rank receives.
    overhead: f64,
    /// Payload bytes per second.
    bandwidth: f64,
}

impl Net {
    fn time(&self, stages: f64, messages: f64, bytes: f64) -> f64 {
        stages * self.latency + messages * self.overhead + bytes / self.bandwidth
    }

    /// Ring all-reduce of `s` bytes over `p` ranks (no buckets).
    fn ring(&self, p: f64, s: f64) -> f64 {
        self.time(2.0 * (p - 1.0), 2.0 * (p - 1.0), 2.0 * (p - 1.0) / p * s)
    }

    /// `Reduction::Tree` with buckets of `b` bytes: per bucket a pairwise
    /// all-to-all (p − 1 stages) and a ring allgather (p − 1 stages); the
    /// buckets are posted together, so their stages overlap but every message
    /// costs its overhead.
    fn tree(&self, p: f64, s: f64, b: f64) -> f64 {
        let k = (s / b).ceil();
        self.time(
            2.0 * (p - 1.0),
            2.0 * (p - 1.0) * k,
            2.0 * (p - 1.0) / p * s,
        )
    }

    /// `Reduction::Allgather` with one microbatch per rank (`M = p`): a ring
    /// allgather of every partial.
    fn allgather(&self, p: f64, s: f64, b: f64) -> f64 {
        let k = (s / b).ceil();
        self.time(p - 1.0, (p - 1.0) * k, (p - 1.0) * s)
    }
}

/// Samples per global batch in the model's step time.
const BATCH: f64 = 1024.0;
/// Floating-point operations per parameter and sample (forward + backward).
const FLOPS_PER_PARAM_SAMPLE: f64 = 6.0;
/// Sustained floating-point operations per second of one rank.
const RANK_FLOPS: f64 = 100e9;

fn table() {
    println!(
        "| model | link | ranks | compute / rank | ring all-reduce | tree, 1 MiB buckets | \
         tree, 64 MiB buckets | allgather (M = ranks) | step: tree 64 MiB | step: allgather | \
         tree bytes / rank |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let show = |t: f64| {
        if t < 1.0 {
            format!("{:.1} ms", t * 1e3)
        } else {
            format!("{t:.2} s")
        }
    };
    for (name, params) in [("10M", 10e6), ("100M", 100e6)] {
        let s = params * 4.0;
        let compute = params * BATCH * FLOPS_PER_PARAM_SAMPLE / RANK_FLOPS;
        for gbit in [25.0, 100.0] {
            let net = Net {
                latency: 10e-6,
                overhead: 2e-6,
                // 90% of the line rate is payload.
                bandwidth: gbit * 1e9 / 8.0 * 0.9,
            };
            for p in [8.0, 16.0, 32.0, 64.0, 128.0, 256.0] {
                let tree = net.tree(p, s, 67108864.0);
                let gather = net.allgather(p, s, 1048576.0);
                println!(
                    "| {name} | {gbit} Gb/s | {p} | {} | {} | {} | {} | {} | {} | {} | {:.0} MB |",
                    show(compute / p),
                    show(net.ring(p, s)),
                    show(net.tree(p, s, 1048576.0)),
                    show(tree),
                    show(gather),
                    show(compute / p + tree),
                    show(compute / p + gather),
                    2.0 * (p - 1.0) / p * s / 1e6,
                );
            }
        }
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("reduce_sim: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if e.is_empty() { 0 } else { 2 });
        }
    };
    if args.table {
        table();
        return ExitCode::SUCCESS;
    }
    let world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("reduce_sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&world, &args) {
        Ok(()) => ExitCode::SUCCESS,
        // Errors of `new` (a refused rank count) come back on every rank alike.
        Err(e @ DistError::TreeRankCount { .. }) => {
            if world.is_root() {
                println!("refused: {e}");
            }
            // Leave together: mpirun ends the job at the first non-zero exit.
            world.barrier();
            ExitCode::from(3)
        }
        Err(e) => world.abort(&format!("error: {e}")),
    }
}
