//! The `train_digits` job as functions (the example's `main` and the tests call
//! them): the command line, the data set loader, the seeded split, the training
//! loop, the checkpoints and the SVG loss curve.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/train.rs"]
mod train;

use clap::Parser;
use fucina::nn::{Forward, Linear, Module, Relu, Sequential, StateDict, sub_seed};
use fucina::optim::{AdamW, AdamWConfig, WarmupCosine};
use fucina::storage::PoolStats;
use fucina::{Error, ExecContext, Result, Tensor, no_grad};

/// Pixels per image (8x8) and classes.
pub(crate) const PIXELS: usize = fucina::data::DIGITS_PIXELS;
pub(crate) const CLASSES: usize = 10;
/// Images held out for the test set (the rest, 1,437 of 1,797, train).
pub(crate) const TEST_IMAGES: usize = 360;

/// Trains a 64-128-10 MLP on the 8x8 handwritten digits shipped with fucina and
/// reports the test accuracy.
///
/// Holds out 360 of the 1,797 images (a split drawn from --seed) as the test
/// set and trains on the rest with AdamW. Prints a progress bar (when stderr
/// is not a terminal, a plain line every 5 s and at each epoch's end), the
/// test accuracy, the buffer-pool and heap-allocation statistics, and writes
/// the loss curve as an SVG (--svg). The same --seed gives the same losses,
/// bit for bit, for every --threads.
#[derive(Debug, Parser)]
#[command(name = "train_digits", version)]
pub(crate) struct Args {
    /// Worker threads of the execution context. The default is what
    /// ExecContext::new() picks: one per physical core this process may run
    /// on (lowered by a cgroup CPU quota and by FUCINA_MAX_THREADS), at most
    /// 64. The results are bitwise identical for every count.
    #[arg(long, default_value_t = common::default_threads())]
    pub(crate) threads: usize,
    /// Passes over the training set.
    #[arg(long, default_value_t = 20)]
    pub(crate) epochs: usize,
    /// Learning rate of AdamW (peak of the warmup + cosine schedule).
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    pub(crate) lr: f32,
    /// Mini-batch size.
    #[arg(long, default_value_t = TrainConfig::default().batch)]
    pub(crate) batch: usize,
    /// Width of the hidden layer.
    #[arg(long, default_value_t = TrainConfig::default().hidden)]
    pub(crate) hidden: usize,
    /// Seed of the weights, the split and the batch order.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// The data set (gzip-compressed CSV: 64 pixels 0..=16, then the label).
    #[arg(long, default_value = default_data_path())]
    pub(crate) data: PathBuf,
    /// Where to write the loss curve (SVG). A relative path is relative to
    /// the current directory; missing directories are created.
    #[arg(long, default_value = DEFAULT_SVG)]
    pub(crate) svg: PathBuf,
    /// Save a checkpoint (parameters, optimizer state, epoch and configuration,
    /// in the safetensors format) when training stops.
    #[arg(long, value_name = "PATH")]
    pub(crate) save: Option<PathBuf>,
    /// Resume from a checkpoint written by --save. The run continues bit for bit
    /// as if it had never stopped; the configuration flags (--epochs, --lr,
    /// --batch, --hidden, --seed) must be those the checkpoint was written with.
    #[arg(long, value_name = "PATH")]
    pub(crate) resume: Option<PathBuf>,
    /// Stop after this epoch (counted from the start of the whole run, at most
    /// --epochs), e.g. to --save a checkpoint mid-training. The learning-rate
    /// schedule still spans all --epochs.
    #[arg(long, value_name = "EPOCH")]
    pub(crate) stop_after: Option<usize>,
}

/// The data set shipped in the repository.
pub(crate) fn default_data_path() -> &'static str {
    fucina::data::digits_path()
}

/// The default of `--svg`, relative to the current directory.
pub(crate) const DEFAULT_SVG: &str = "target/train_digits_loss.svg";

impl Args {
    /// Checks what the flags cannot express in their types.
    pub(crate) fn validate(&self) -> Result<()> {
        common::check_threads(self.threads)?;
        common::check_at_least_one(&[
            ("--epochs", self.epochs),
            ("--batch", self.batch),
            ("--hidden", self.hidden),
        ])?;
        train::check_stop_after(self.stop_after, self.epochs)
    }

    /// The training configuration of these flags.
    pub(crate) fn config(&self) -> TrainConfig {
        TrainConfig {
            epochs: self.epochs,
            seed: self.seed,
            lr: self.lr,
            batch: self.batch,
            hidden: self.hidden,
            ..TrainConfig::default()
        }
    }
}

pub(crate) use fucina::data::Digits;

/// Reads the digits file ([`fucina::data::load_digits`]) and checks it holds more
/// images than the test split takes.
pub(crate) fn load_digits(path: &Path) -> Result<Digits> {
    let d = fucina::data::load_digits(path)?;
    if d.len() <= TEST_IMAGES {
        return Err(Error::Data {
            path: path.display().to_string(),
            reason: format!("{} images; need more than {TEST_IMAGES}", d.len()),
        });
    }
    Ok(d)
}

/// The seeded split ([`Digits::split`]): `TEST_IMAGES` images test, the rest
/// train. `d` holds more than that ([`load_digits`] checks it).
pub(crate) fn split(d: &Digits, seed: u64) -> Result<(Digits, Digits)> {
    d.split(seed, TEST_IMAGES)
}

/// The training hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TrainConfig {
    pub(crate) epochs: usize,
    pub(crate) batch: usize,
    pub(crate) hidden: usize,
    pub(crate) lr: f32,
    pub(crate) weight_decay: f32,
    pub(crate) seed: u64,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            epochs: 20,
            batch: 32,
            hidden: 128,
            lr: 1e-2,
            weight_decay: 1e-4,
            seed: 0,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub(crate) struct TrainReport {
    /// The loss of every step.
    pub(crate) losses: Vec<f32>,
    /// The fraction of test images classified correctly.
    pub(crate) test_accuracy: f32,
    /// Training examples processed (epochs x training images).
    pub(crate) examples: usize,
    /// Wall time of the training steps (the evaluation excluded).
    pub(crate) train_time: Duration,
    /// The context's local pool counters at the end of training.
    pub(crate) pool: PoolStats,
    /// The shared pool's counters (its misses are fresh allocations).
    pub(crate) shared_pool: PoolStats,
    /// Pooled buffers still handed out after training (the parameters, the
    /// optimizer state, the data).
    pub(crate) outstanding: usize,
}

pub(crate) use train::Progress;

/// The model: 64 -> hidden -> ReLU -> 10.
pub(crate) fn model(ctx: &ExecContext, hidden: usize, seed: u64) -> Result<Sequential> {
    Ok(Sequential::new()
        .push_named("fc1", Linear::new(ctx, PIXELS, hidden, sub_seed(seed, 1))?)
        .push(Relu)
        .push_named("fc2", Linear::new(ctx, hidden, CLASSES, sub_seed(seed, 2))?))
}

/// The model of `cfg` and its AdamW optimizer (no state yet).
pub(crate) fn model_and_optimizer(
    ctx: &ExecContext,
    cfg: &TrainConfig,
) -> Result<(Sequential, AdamW)> {
    let net = model(ctx, cfg.hidden, cfg.seed)?;
    let opt = AdamW::new(
        net.parameters(),
        AdamWConfig {
            lr: cfg.lr,
            weight_decay: cfg.weight_decay,
            ..AdamWConfig::default()
        },
    )?;
    Ok((net, opt))
}

/// Where a run stands after a whole number of epochs: everything a checkpoint
/// must hold to resume it bit-identically (the data order and the schedule
/// regenerate from the seed and the step).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// Epochs completed.
    pub(crate) epoch: usize,
    /// The model's parameters by name (`"fc1.weight"`, ...).
    pub(crate) params: StateDict,
    /// The optimizer state (`"step"`, `"exp_avg.0"`, ...).
    pub(crate) optimizer: StateDict,
}

/// Trains on `train` with AdamW, mini-batches in a seeded order per epoch, and
/// evaluates on `test`; optionally resumed from `resume` and stopped after epoch
/// `stop_after` (both within `cfg.epochs`, which fixes the schedule); returns the
/// report of the epochs run and the snapshot at the end. A snapshot that does not
/// fit the model or optimizer is an error. `on_step` runs after every step
/// (outside the step).
pub(crate) fn train_from(
    ctx: &ExecContext,
    train: &Digits,
    test: &Digits,
    cfg: &TrainConfig,
    resume: Option<Snapshot>,
    stop_after: Option<usize>,
    on_step: &mut dyn FnMut(&Progress),
) -> Result<(TrainReport, Snapshot)> {
    let (net, mut opt) = model_and_optimizer(ctx, cfg)?;
    let n = train.len();
    let per_epoch = n.div_ceil(cfg.batch);
    let steps = per_epoch * cfg.epochs;
    let schedule = WarmupCosine::new(cfg.lr, cfg.lr * 0.05, per_epoch as u64, steps as u64)?;
    let first = match resume {
        None => 0,
        Some(snap) => {
            train::check_snapshot_epoch(snap.epoch, cfg.epochs)?;
            net.load_state_dict(&snap.params)?;
            opt.load_state_dict(ctx, &snap.optimizer)?;
            // The snapshot's tensors are released here, before training (the
            // model and optimizer hold copies).
            snap.epoch
        }
    };
    let last = stop_after.unwrap_or(cfg.epochs).clamp(first, cfg.epochs);
    let mut step = first * per_epoch;
    let mut losses = Vec::with_capacity(steps);
    let mut order = vec![0i64; n];
    let mut xb = Vec::with_capacity(cfg.batch * PIXELS);
    let mut yb = Vec::with_capacity(cfg.batch);
    let start = Instant::now();
    let mut examples = 0;
    for epoch in first..last {
        fucina::rng::randperm_fill(sub_seed(cfg.seed, 100 + epoch as u64), &mut order);
        for chunk in order.chunks(cfg.batch) {
            xb.clear();
            yb.clear();
            for &i in chunk {
                let i = i as usize;
                xb.extend_from_slice(&train.x[i * PIXELS..(i + 1) * PIXELS]);
                yb.push(train.y[i]);
            }
            let b = chunk.len();
            let x = Tensor::from_slice(ctx, &[b, PIXELS], &xb)?;
            let y = ctx.from_slice_typed::<i64>(&[b], &yb)?;
            let loss = ctx.exec_scope(|ctx| -> Result<f32> {
                let loss = net.forward(ctx, &x)?.cross_entropy(ctx, &y)?;
                loss.backward(ctx)?;
                Ok(loss.item()?)
            })?;
            opt.set_lr(schedule.lr(step as u64))?;
            opt.step(ctx)?;
            opt.zero_grad();
            drop((x, y));
            losses.push(loss);
            examples += b;
            step += 1;
            on_step(&Progress {
                step,
                steps,
                epoch,
                loss,
                examples,
                elapsed: start.elapsed(),
            });
        }
    }
    let train_time = start.elapsed();
    let (pool, shared_pool) = (ctx.pool().stats(), ctx.pool().pool().stats());
    let outstanding = ctx.outstanding_buffers();
    let test_accuracy = accuracy(ctx, &net, test)?;
    let snapshot = Snapshot {
        epoch: last,
        params: net.state_dict(),
        optimizer: opt.state_dict(),
    };
    let report = TrainReport {
        losses,
        test_accuracy,
        examples,
        train_time,
        pool,
        shared_pool,
        outstanding,
    };
    Ok((report, snapshot))
}

/// The `format` metadata entry of a `train_digits` checkpoint.
pub(crate) const CHECKPOINT_FORMAT: &str = "fucina.train_digits.v1";
/// The configuration entries of a checkpoint's metadata: `(key, flag, value)`.
/// Values are written with `Display`, which round-trips `f32` exactly.
fn config_entries(cfg: &TrainConfig) -> [train::ConfigEntry; 6] {
    [
        ("seed", "--seed", cfg.seed.to_string()),
        ("epochs", "--epochs", cfg.epochs.to_string()),
        ("lr", "--lr", cfg.lr.to_string()),
        ("batch", "--batch", cfg.batch.to_string()),
        ("hidden", "--hidden", cfg.hidden.to_string()),
        ("weight_decay", "weight decay", cfg.weight_decay.to_string()),
    ]
}

/// Saves `snap` and the configuration `cfg` to `path` with
/// [`fucina::checkpoint::save_module`] (safetensors, written atomically): the
/// parameters under `model.<name>`, the optimizer state under `optim.<name>`,
/// and `format`, `epoch` and the configuration as metadata.
pub(crate) fn save_checkpoint(
    ctx: &ExecContext,
    path: &Path,
    cfg: &TrainConfig,
    snap: &Snapshot,
) -> Result<()> {
    let (net, mut opt) = model_and_optimizer(ctx, cfg)?;
    net.load_state_dict(&snap.params)?;
    opt.load_state_dict(ctx, &snap.optimizer)?;
    checkpoint(path, cfg).save(&net, &opt, snap.epoch)
}

/// The [`train::Checkpoint`] of a `train_digits` run of `cfg` at `path`.
fn checkpoint<'a>(path: &'a Path, cfg: &TrainConfig) -> train::Checkpoint<'a> {
    let entries = config_entries(cfg).into();
    train::Checkpoint::new(path, "train_digits", CHECKPOINT_FORMAT, entries, cfg.epochs)
}

/// Reads the checkpoint at `path` for a run of `cfg` with `steps_per_epoch`
/// steps per epoch, and checks it completely before anything trains: its format,
/// that it was written with the same configuration (an error names the flag and
/// both values), and that its tensors fit the model and optimizer of `cfg`
/// (names, shapes, the optimizer's step count).
///
/// # Errors
/// [`Error::Checkpoint`] if the file cannot be read or is not a valid
/// safetensors file; [`Error::InvalidArgument`] (`--resume`, naming the file)
/// for a checkpoint that does not belong to this run.
pub(crate) fn load_checkpoint(
    ctx: &ExecContext,
    path: &Path,
    cfg: &TrainConfig,
    steps_per_epoch: usize,
) -> Result<Snapshot> {
    let (epoch, net, opt) = checkpoint(path, cfg).load(
        ctx,
        steps_per_epoch,
        &format!("the model 64-{}-10", cfg.hidden),
        || model_and_optimizer(ctx, cfg),
    )?;
    Ok(Snapshot {
        epoch,
        params: net.state_dict(),
        optimizer: opt.state_dict(),
    })
}

/// The snapshot to resume from (`--resume`), checked with [`load_checkpoint`]
/// for a training set of `train_len` images, and that `--stop-after` lies after it.
pub(crate) fn resume_point(
    ctx: &ExecContext,
    args: &Args,
    train_len: usize,
) -> Result<Option<Snapshot>> {
    let Some(path) = &args.resume else {
        return Ok(None);
    };
    let cfg = args.config();
    let snap = load_checkpoint(ctx, path, &cfg, train_len.div_ceil(cfg.batch))?;
    train::check_stop_after_resume(args.stop_after, path, snap.epoch)?;
    Ok(Some(snap))
}

/// The run the flags ask for: trains from `resume` (or from the start) up to
/// `--stop-after` (or `--epochs`), then saves the checkpoint to `--save` if
/// given. Returns the report of the epochs run and the snapshot at the end.
pub(crate) fn run_job(
    ctx: &ExecContext,
    args: &Args,
    train_set: &Digits,
    test: &Digits,
    resume: Option<Snapshot>,
    on_step: &mut dyn FnMut(&Progress),
) -> Result<(TrainReport, Snapshot)> {
    let cfg = args.config();
    let (report, snap) = train_from(ctx, train_set, test, &cfg, resume, args.stop_after, on_step)?;
    if let Some(path) = &args.save {
        save_checkpoint(ctx, path, &cfg, &snap)?;
    }
    Ok((report, snap))
}

/// The fraction of `d` that `net` classifies correctly (under `no_grad`).
pub(crate) fn accuracy(ctx: &ExecContext, net: &Sequential, d: &Digits) -> Result<f32> {
    let _guard = no_grad();
    let x = Tensor::from_slice(ctx, &[d.len(), PIXELS], &d.x)?;
    let pred = net.forward(ctx, &x)?.argmax(ctx, 1, false)?;
    let correct = pred
        .to_vec()
        .iter()
        .zip(&d.y)
        .filter(|(p, y)| p == y)
        .count();
    Ok(correct as f32 / d.len() as f32)
}

/// A line chart of `losses` (one point per step) as a standalone SVG
/// ([`train::loss_svg`]). The epoch axis is labelled from `first_epoch` (a
/// resumed run's first epoch).
pub(crate) fn loss_svg(losses: &[f32], steps_per_epoch: usize, first_epoch: usize) -> String {
    train::loss_svg(
        "train_digits: training loss per step",
        losses,
        steps_per_epoch,
        first_epoch,
    )
}

/// Writes the SVG, creating the directory if needed.
pub(crate) fn write_svg(
    path: &Path,
    losses: &[f32],
    steps_per_epoch: usize,
    first_epoch: usize,
) -> Result<()> {
    train::write_file(path, &loss_svg(losses, steps_per_epoch, first_epoch))
}
