//! Data-parallel training of a small MLP (64 → hidden → 10, ReLU, cross-entropy,
//! AdamW) on the 8x8 digits set (1,437 of its 1,797 images; the other 360, the
//! same seeded split as `train_digits`, are the test set), bit-identical for
//! any rank count, with checkpoints that resume on any rank count:
//!
//! ```text
//! cargo build --release -p fucina-dist --example train_digits_dist
//! mpirun -np 4 target/release/examples/train_digits_dist --epochs 3 --seed 1
//! target/release/examples/train_digits_dist --local --epochs 3 --seed 1   # no MPI
//!
//! # stop after epoch 1, saving; go on at 2 ranks (or --local): the same lines
//! mpirun -np 4 target/release/examples/train_digits_dist --epochs 3 --seed 1 \
//!     --save run.safetensors --stop-after-epoch 1
//! mpirun -np 2 target/release/examples/train_digits_dist --epochs 3 --seed 1 \
//!     --resume run.safetensors
//! ```
//!
//! Rank 0 prints the run's configuration, `epoch {e} loss {loss:.6} bits
//! {bits:08x}` per epoch (the epoch's mean loss and its bits), then at the end
//! `test accuracy: {a:.2}% (360 images)`, `params {fnv1a:016x}` (FNV-1a over
//! the bits of every final parameter: a fingerprint to compare runs by) and
//! `bytes/step {n} ring {r}`: the bytes rank 0 received from the other ranks
//! per step in the gradient exchange (the gradient and the loss, 4 bytes a
//! value), and what each rank receives in a ring all-reduce of the gradient
//! alone over the same ranks (`2 (N-1)/N` times its bytes; both 0 for
//! `--local`). The `epoch`, `test accuracy` and `params` lines are the same for
//! every `-np` and for `--local` (the single-process run of the same
//! microbatch split), and a run resumed from a checkpoint prints the same
//! lines for the epochs it runs as the run that was never stopped. `--bench`
//! adds a `timing` line per epoch.
//!
//! `--save PATH` writes a checkpoint after every epoch (rank 0 writes, behind a
//! barrier; atomic, so a run killed at any moment leaves the last complete
//! one): the parameters, the optimizer's state (AdamW's moments and step
//! count), the next epoch and the sampler's seed and shape, and this example's
//! `--optim`, `--lr` and `--steps` (a resumed run must pass the same values, and
//! is refused otherwise). `--resume PATH` loads one (rank 0 reads it and sends
//! it to the other ranks) and goes on from the epoch after the saved one, up to
//! `--epochs` in all; the rank count may differ from the saving run's.
//! `--stop-after-epoch N` ends the run after epoch `N` (counted from 0).
//!
//! The MLP is a `fucina::nn::Sequential` of two `Linear` layers, run by each
//! microbatch closure through `Forward::forward` (its `fucina::Error` converts
//! into the step's error with `?`); `DataParallel` holds the model's
//! `Parameter` handles (the ones the layers read and the optimizer,
//! `fucina::optim::AdamW` or with `--optim sgd` `fucina::optim::Sgd`, updates),
//! and the data set comes from `fucina::data`.
// The autograd error carries inline shapes (no heap on the error path).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use fucina::autograd::Tensor;
use fucina::data::{DIGITS_PIXELS, Digits};
use fucina::exec::{ExecContext, MAX_THREADS};
use fucina::nn::{Forward, Linear, Module, Parameter, Relu, Sequential, sub_seed};
use fucina::optim::{AdamW, Optimizer, Sgd};
use fucina_dist::{
    DataParallel, DataParallelOptions, LocalDataParallel, Reduction, Resumed, ShardedSampler,
    StepOutput, TrainPosition, World,
};

const USAGE: &str = "\
train_digits_dist: data-parallel training of an MLP (64-H-10, ReLU) on the 8x8
digits over MPI ranks, with the same loss and parameter bits for any rank count
and for one process (--local). It trains on 1,437 of the 1,797 images and tests
on the other 360 (the seeded split of train_digits).

run: mpirun -np 4 --oversubscribe target/release/examples/train_digits_dist --epochs 3 --seed 1
     (as root, also --allow-run-as-root)

usage: train_digits_dist [--epochs E] [--seed S] [--hidden H] [--batch B]
                         [--microbatches M] [--optim adamw|sgd] [--lr LR] [--steps K]
                         [--threads T] [--bucket-bytes N] [--no-overlap] [--local]
                         [--bench] [--reduction auto|tree|allgather]
                         [--save PATH] [--resume PATH] [--stop-after-epoch N]
                         [--data digits.csv.gz]
  defaults: --epochs 3 --seed 0 --hidden 64 --batch 128 --microbatches 8 --optim adamw
            --lr 0.01 (adamw) or 0.5 (sgd)
  --local      one process, no MPI (the reference the MPI runs match bit for bit)
  --steps K    at most K steps per epoch
  --threads T  worker threads of each rank's ExecContext, 1 to 64 (default: what
               ExecContext::new() picks, one per physical core the rank may run
               on, divided by the rank count, at least 1; all of them with
               --local); the bits do not depend on it
  --reduction  how ranks combine gradients (default auto: tree where the rank
               count allows it, else allgather; the same bits either way)
  --bench      print a `timing` line per epoch (steps/s, compute, exchange, reduce)
  --save PATH  write a checkpoint (safetensors) after every epoch
  --resume PATH          go on from a checkpoint (any rank count, or --local)
  --stop-after-epoch N   end the run after epoch N (from 0)

output (rank 0): the configuration; per epoch `epoch E loss L bits B`, the
epoch's mean training loss and its f32 bits; then
  test accuracy: A% (360 images)   the trained model on the held-out images
  params H     FNV-1a hash of the bits of every final parameter: the same for
               any rank count, thread count and --local, so runs can be compared
  bytes/step N ring R   N: bytes rank 0 received from the other ranks per step
               in the gradient exchange (the gradient plus the loss, 4 bytes a
               value); R: what each rank receives in a ring all-reduce of the
               gradient alone over the same ranks, 2 (ranks-1)/ranks times its
               bytes (both 0 with --local)";

/// The optimizer of the run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Optim {
    AdamW,
    Sgd,
}

impl Optim {
    fn name(self) -> &'static str {
        match self {
            Optim::AdamW => "adamw",
            Optim::Sgd => "sgd",
        }
    }
}

struct Args {
    epochs: u64,
    seed: u64,
    hidden: usize,
    batch: usize,
    microbatches: usize,
    optim: Optim,
    lr: f32,
    steps: Option<usize>,
    threads: Option<usize>,
    bucket_bytes: usize,
    overlap: bool,
    reduction: Reduction,
    local: bool,
    bench: bool,
    save: Option<PathBuf>,
    resume: Option<PathBuf>,
    stop_after_epoch: Option<u64>,
    data: PathBuf,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        epochs: 3,
        seed: 0,
        hidden: 64,
        batch: 128,
        microbatches: 8,
        optim: Optim::AdamW,
        lr: f32::NAN,
        steps: None,
        threads: None,
        bucket_bytes: DataParallelOptions::default().bucket_bytes,
        overlap: true,
        reduction: Reduction::Auto,
        local: false,
        bench: false,
        save: None,
        resume: None,
        stop_after_epoch: None,
        data: fucina::data::digits_path().into(),
    };
    let mut lr = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{flag}: `{v}` is not a valid number"))
        }
        match flag.as_str() {
            "--epochs" => a.epochs = num(&flag, value()?)?,
            "--seed" => a.seed = num(&flag, value()?)?,
            "--hidden" => a.hidden = num(&flag, value()?)?,
            "--batch" => a.batch = num(&flag, value()?)?,
            "--microbatches" => a.microbatches = num(&flag, value()?)?,
            "--optim" => {
                a.optim = match value()?.as_str() {
                    "adamw" => Optim::AdamW,
                    "sgd" => Optim::Sgd,
                    other => return Err(format!("--optim: `{other}` is not adamw or sgd")),
                }
            }
            "--lr" => lr = Some(num(&flag, value()?)?),
            "--steps" => a.steps = Some(num(&flag, value()?)?),
            "--threads" => a.threads = Some(num(&flag, value()?)?),
            "--bucket-bytes" => a.bucket_bytes = num(&flag, value()?)?,
            "--save" => a.save = Some(value()?.into()),
            "--resume" => a.resume = Some(value()?.into()),
            "--stop-after-epoch" => a.stop_after_epoch = Some(num(&flag, value()?)?),
            "--data" => a.data = value()?.into(),
            "--reduction" => {
                a.reduction = value()?.parse().map_err(|e| format!("--reduction: {e}"))?
            }
            "--no-overlap" => a.overlap = false,
            "--local" => a.local = true,
            "--bench" => a.bench = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if a.hidden == 0 {
        return Err("--hidden must be at least 1".into());
    }
    if let Some(t) = a.threads
        && !(1..=MAX_THREADS).contains(&t)
    {
        return Err(format!("--threads must be in 1..={MAX_THREADS} (got {t})"));
    }
    a.lr = lr.unwrap_or(match a.optim {
        Optim::AdamW => 0.01,
        Optim::Sgd => 0.5,
    });
    Ok(a)
}

/// The MLP (64 → hidden → ReLU → 10) from `seed`.
fn mlp(ctx: &ExecContext, hidden: usize, seed: u64) -> fucina::Result<Sequential> {
    Ok(Sequential::new()
        .push_named(
            "fc1",
            Linear::new(ctx, DIGITS_PIXELS, hidden, sub_seed(seed, 0))?,
        )
        .push(Relu)
        .push_named("fc2", Linear::new(ctx, hidden, 10, sub_seed(seed, 1))?))
}

/// Images held out for the test set (the rest, 1,437 of 1,797, train).
const TEST_IMAGES: usize = 360;

/// The fraction of `d` that `model` classifies correctly (under `no_grad`).
fn accuracy(ctx: &ExecContext, model: &Sequential, d: &Digits) -> fucina::Result<f32> {
    let _guard = fucina::no_grad();
    let x = Tensor::from_slice(ctx, &[d.len(), DIGITS_PIXELS], &d.x)?;
    let pred = model.forward(ctx, &x)?.argmax(ctx, 1, false)?;
    let correct = pred
        .to_vec()
        .iter()
        .zip(&d.y)
        .filter(|(p, y)| p == y)
        .count();
    Ok(correct as f32 / d.len() as f32)
}

/// Prints the test accuracy line.
fn report_accuracy(ctx: &ExecContext, model: &Sequential, test: &Digits) -> Result<(), String> {
    let a = accuracy(ctx, model, test).map_err(|e| e.to_string())?;
    println!("test accuracy: {:.2}% ({} images)", 100.0 * a, test.len());
    Ok(())
}

/// The run's configuration line.
fn announce(args: &Args, train: &Digits, test: &Digits, ranks: &str, threads: usize) {
    println!(
        "digits: {} train / {} test images, MLP 64-{}-10, {} lr {}, batch {} in {} microbatches, \
         {} epochs, {ranks} x {threads} thread(s), seed {}",
        train.len(),
        test.len(),
        args.hidden,
        args.optim.name(),
        args.lr,
        args.batch,
        args.microbatches,
        args.epochs,
        args.seed
    );
}

/// The optimizer of `args` over `params`.
fn optimizer(args: &Args, params: Vec<Parameter>) -> fucina::Result<Box<dyn Optimizer>> {
    Ok(match args.optim {
        Optim::AdamW => Box::new(AdamW::new(params, args.lr)?),
        Optim::Sgd => Box::new(Sgd::new(params, args.lr)?),
    })
}

/// Forward and backward of one microbatch (sample indices `idx`) through the
/// model's own layers; its loss. The model's parameters are the handles
/// `DataParallel` holds, so the gradients land where it collects them.
fn microbatch(
    ctx: &ExecContext,
    model: &Sequential,
    data: &Digits,
    idx: &[usize],
) -> fucina::Result<f32> {
    let mut xb = Vec::with_capacity(idx.len() * DIGITS_PIXELS);
    let mut yb = Vec::with_capacity(idx.len());
    for &i in idx {
        xb.extend_from_slice(&data.x[i * DIGITS_PIXELS..(i + 1) * DIGITS_PIXELS]);
        yb.push(data.y[i]);
    }
    let x = Tensor::from_slice(ctx, &[idx.len(), DIGITS_PIXELS], &xb)?;
    let y = ctx.from_slice_typed::<i64>(&[idx.len()], &yb)?;
    let loss = model.forward(ctx, &x)?.cross_entropy(ctx, &y)?;
    loss.backward(ctx)?;
    Ok(loss.item()?)
}

/// The parameters' current values as tensors (for the hash).
fn values(params: &[Parameter]) -> Vec<Tensor> {
    params.iter().map(Parameter::tensor).collect()
}

/// Sums of the per-step outputs of an epoch.
#[derive(Default)]
struct Epoch {
    loss: f32,
    steps: usize,
    compute_s: f64,
    exchange_s: f64,
    reduce_s: f64,
    bytes: u64,
    /// What a ring all-reduce of the gradient would receive per rank and step.
    ring: u64,
}

impl Epoch {
    fn add(&mut self, o: &StepOutput) {
        self.loss += o.value;
        self.steps += 1;
        self.compute_s += o.compute_s;
        self.exchange_s += o.exchange_s;
        self.reduce_s += o.reduce_s;
        self.bytes += o.bytes_received;
    }

    fn report(&self, e: u64, bench: bool, wall_s: f64, ranks: usize, threads: usize) {
        if self.steps == 0 {
            return; // resumed at the end of an epoch's --steps: nothing ran
        }
        let loss = self.loss / self.steps as f32;
        println!("epoch {e} loss {loss:.6} bits {:08x}", loss.to_bits());
        if bench {
            let s = self.steps as f64;
            println!(
                "timing epoch {e} ranks {ranks} threads {threads} steps/s {:.1} step_ms {:.3} \
                 compute_ms {:.3} exchange_ms {:.3} reduce_ms {:.3} exchange_share {:.1}% \
                 bytes_received_per_step {} ring_bytes_per_step {}",
                s / wall_s,
                wall_s / s * 1e3,
                self.compute_s / s * 1e3,
                self.exchange_s / s * 1e3,
                self.reduce_s / s * 1e3,
                100.0 * self.exchange_s / wall_s,
                self.bytes / self.steps as u64,
                self.ring,
            );
        }
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            // --help: the usage on stdout.
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("train_digits_dist: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // What ExecContext::new() picks: one per physical core this process may
    // run on.
    let cores = ExecContext::new().threads();
    if args.local {
        let threads = args.threads.unwrap_or(cores);
        match run_local(&args, threads) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("train_digits_dist: {e}");
                ExitCode::FAILURE
            }
        }
    } else {
        let world = match World::init() {
            Ok(w) => w,
            Err(e) => {
                eprintln!("train_digits_dist: {e}");
                return ExitCode::FAILURE;
            }
        };
        let threads = args.threads.unwrap_or((cores / world.size()).max(1));
        // An error of one rank ends every rank (no rank is left waiting).
        world.abort_on_error(run_dist(&world, &args, threads));
        ExitCode::SUCCESS
    }
}

/// The training and test sets and this rank's sampler over the training set.
fn setup(
    args: &Args,
    rank: usize,
    size: usize,
) -> Result<(Digits, Digits, ShardedSampler), String> {
    let all = fucina::data::load_digits(&args.data).map_err(|e| e.to_string())?;
    // The seeded split of `train_digits` (the same held-out images).
    let (data, test) = all
        .split(args.seed, TEST_IMAGES)
        .map_err(|e| e.to_string())?;
    let sampler = ShardedSampler::new(
        data.len(),
        args.batch,
        args.microbatches,
        args.seed,
        rank,
        size,
    )
    .map_err(|e| e.to_string())?;
    Ok((data, test, sampler))
}

fn steps(args: &Args, sampler: &ShardedSampler) -> usize {
    args.steps.map_or(sampler.steps_per_epoch(), |k| {
        k.min(sampler.steps_per_epoch())
    })
}

/// This example's own checkpoint entries: what else a resumed run must share
/// with the saving run to go on with the same bits.
fn run_metadata(args: &Args, sampler: &ShardedSampler) -> [(&'static str, String); 3] {
    [
        ("train_digits_dist.optim", args.optim.name().to_string()),
        ("train_digits_dist.lr", args.lr.to_string()),
        ("train_digits_dist.steps", steps(args, sampler).to_string()),
    ]
}

/// Where to start: the checkpoint's position after checking this run's
/// arguments against it, or the beginning.
fn start(
    args: &Args,
    sampler: &ShardedSampler,
    resumed: Option<(&Path, Resumed)>,
) -> Result<TrainPosition, String> {
    let Some((path, r)) = resumed else {
        return Ok(TrainPosition::default());
    };
    for (key, mine) in run_metadata(args, sampler) {
        let flag = key.trim_start_matches("train_digits_dist.");
        match r.metadata.get(key) {
            Some(saved) if saved == mine => {}
            saved => {
                return Err(format!(
                    "checkpoint {}: saved with --{flag} {}, this run has --{flag} {mine} \
                     (resume with the saved value)",
                    path.display(),
                    saved.unwrap_or("(none)")
                ));
            }
        }
    }
    Ok(r.position)
}

/// `meta`'s entries as `(&str, &str)` pairs.
fn pairs<'a>(meta: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    meta.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn run_local(args: &Args, threads: usize) -> Result<(), String> {
    let (data, test, sampler) = setup(args, 0, 1)?;
    announce(args, &data, &test, "1 process (--local)", threads);
    let ctx = ExecContext::with_threads(threads);
    let model = mlp(&ctx, args.hidden, args.seed).map_err(|e| e.to_string())?;
    let mut opt = optimizer(args, model.parameters()).map_err(|e| e.to_string())?;
    let mut dp =
        LocalDataParallel::new(model.parameters(), args.microbatches).map_err(|e| e.to_string())?;
    let resumed = match &args.resume {
        Some(path) => Some((
            path.as_path(),
            fucina_dist::load_checkpoint(&ctx, path, &model, Some(opt.as_mut()), &sampler)
                .map_err(|e| e.to_string())?,
        )),
        None => None,
    };
    let from = start(args, &sampler, resumed)?;
    let meta = run_metadata(args, &sampler);
    for e in from.epoch..args.epochs {
        let order = sampler.epoch_order(e);
        let first = if e == from.epoch { from.step } else { 0 };
        let mut epoch = Epoch::default();
        let t = Instant::now();
        for step in first..steps(args, &sampler) {
            let out = dp
                .step(&ctx, |ctx, _, m| {
                    microbatch(ctx, &model, &data, sampler.microbatch(&order, step, m))
                })
                .map_err(|e| e.to_string())?;
            opt.step(&ctx).map_err(|e| e.to_string())?;
            epoch.add(&out);
        }
        epoch.report(e, args.bench, t.elapsed().as_secs_f64(), 0, threads);
        if let Some(path) = &args.save {
            let next = TrainPosition {
                epoch: e + 1,
                step: 0,
            };
            fucina_dist::save_checkpoint(
                path,
                &model,
                Some(opt.as_ref()),
                &sampler,
                next,
                &pairs(&meta),
            )
            .map_err(|e| e.to_string())?;
        }
        if args.stop_after_epoch == Some(e) {
            break;
        }
    }
    report_accuracy(&ctx, &model, &test)?;
    println!(
        "params {:016x}",
        fucina_dist::params_hash(&values(dp.params()))
    );
    // One process exchanges nothing; a ring of one rank would not either.
    println!("bytes/step 0 ring 0");
    Ok(())
}

fn run_dist(world: &World, args: &Args, threads: usize) -> Result<(), String> {
    let (data, test, sampler) = setup(args, world.rank(), world.size())?;
    if world.is_root() {
        let ranks = format!("{} rank(s)", world.size());
        announce(args, &data, &test, &ranks, threads);
    }
    let ctx = ExecContext::with_threads(threads);
    // Every rank starts from its own values; DataParallel::new replaces them
    // with rank 0's (rank 0 starts from `seed`, as the local run does).
    let init_seed = args.seed ^ (world.rank() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let model = mlp(&ctx, args.hidden, init_seed).map_err(|e| e.to_string())?;
    let mut opt = optimizer(args, model.parameters()).map_err(|e| e.to_string())?;
    let opts = DataParallelOptions {
        microbatches: args.microbatches,
        bucket_bytes: args.bucket_bytes,
        overlap: args.overlap,
        reduction: args.reduction,
    };
    let mut dp = DataParallel::new(world, model.parameters(), opts).map_err(|e| e.to_string())?;
    // Collective: rank 0 reads the file, every rank loads the same bytes into
    // its model (the handles `dp` holds) and optimizer.
    let resumed = match &args.resume {
        Some(path) => Some((
            path.as_path(),
            fucina_dist::load_checkpoint_rank0(
                world,
                &ctx,
                path,
                &model,
                Some(opt.as_mut()),
                &sampler,
            )
            .map_err(|e| e.to_string())?,
        )),
        None => None,
    };
    let from = start(args, &sampler, resumed)?;
    let meta = run_metadata(args, &sampler);
    for e in from.epoch..args.epochs {
        let order = sampler.epoch_order(e);
        let first = if e == from.epoch { from.step } else { 0 };
        let mut epoch = Epoch {
            ring: dp.ring_bytes_per_step(),
            ..Epoch::default()
        };
        world.barrier();
        let t = Instant::now();
        for step in first..steps(args, &sampler) {
            let out = dp
                .step(&ctx, |ctx, _, m| {
                    microbatch(ctx, &model, &data, sampler.microbatch(&order, step, m))
                })
                .map_err(|e| e.to_string())?;
            opt.step(&ctx).map_err(|e| e.to_string())?;
            epoch.add(&out);
        }
        if world.is_root() {
            epoch.report(
                e,
                args.bench,
                t.elapsed().as_secs_f64(),
                world.size(),
                threads,
            );
        }
        if let Some(path) = &args.save {
            let next = TrainPosition {
                epoch: e + 1,
                step: 0,
            };
            fucina_dist::save_checkpoint_rank0(
                world,
                path,
                &model,
                Some(opt.as_ref()),
                &sampler,
                next,
                &pairs(&meta),
            )
            .map_err(|e| e.to_string())?;
        }
        if args.stop_after_epoch == Some(e) {
            break;
        }
    }
    if world.is_root() {
        // Every rank holds the same parameters; rank 0 tests them.
        report_accuracy(&ctx, &model, &test)?;
        println!(
            "params {:016x}",
            fucina_dist::params_hash(&values(dp.params()))
        );
        println!(
            "bytes/step {} ring {}",
            dp.bytes_received_per_step(),
            dp.ring_bytes_per_step()
        );
    }
    Ok(())
}
