//! The `train_fashion` job as functions (the example's `main` and the tests
//! call them): the command line, the data, the CNN, the training loop over a
//! [`DataLoader`], the checkpoints and the SVG of the loss and the test
//! accuracy.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/train.rs"]
mod train;

use clap::Parser;
use fucina::data::{DataLoader, ImageSet};
use fucina::nn::{
    BatchNorm2d, Conv2d, Flatten, Forward, Linear, MaxPool2d, Module, Relu, Sequential, StateDict,
    sub_seed,
};
use fucina::optim::{AdamW, AdamWConfig, WarmupCosine};
use fucina::prelude::Conv2dOptions;
use fucina::storage::PoolStats;
use fucina::{Error, ExecContext, Result, no_grad};

/// Classes of Fashion-MNIST.
pub(crate) const CLASSES: usize = 10;
/// The mean and standard deviation of Fashion-MNIST's training pixels (in
/// `[0, 1]`): inputs are normalized with them.
pub(crate) const PIXEL_MEAN: f32 = 0.2860;
pub(crate) const PIXEL_STD: f32 = 0.3530;

/// Trains a small CNN (conv-bn-relu-pool twice, then two linear layers) on
/// Fashion-MNIST and reports the test accuracy after every epoch.
///
/// Reads the 60,000 training and 10,000 test 28x28 images from --data
/// (Debian: apt-get install dataset-fashion-mnist) and trains with AdamW
/// (warmup + cosine schedule) on seeded batches; the defaults reach at least
/// 91% test accuracy in 5 epochs. Prints a progress bar (when stderr is not a
/// terminal, a plain line every 5 s), a line and the test accuracy per epoch,
/// the buffer-pool and heap-allocation statistics, and writes the loss and
/// accuracy curves as an SVG (--svg). The same --seed gives the same losses,
/// bit for bit, for every --threads.
#[derive(Debug, Parser)]
#[command(name = "train_fashion", version)]
pub(crate) struct Args {
    /// Worker threads of the execution context. The default is what
    /// ExecContext::new() picks: one per physical core this process may run
    /// on (lowered by a cgroup CPU quota and by FUCINA_MAX_THREADS), at most
    /// 64. The results are bitwise identical for every count.
    #[arg(long, default_value_t = common::default_threads())]
    pub(crate) threads: usize,
    /// Passes over the training set.
    #[arg(long, default_value_t = TrainConfig::default().epochs)]
    pub(crate) epochs: usize,
    /// Learning rate of AdamW (peak of the warmup + cosine schedule).
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    pub(crate) lr: f32,
    /// Mini-batch size.
    #[arg(long, default_value_t = TrainConfig::default().batch)]
    pub(crate) batch: usize,
    /// Channels of the first convolution.
    #[arg(long, default_value_t = TrainConfig::default().conv1)]
    pub(crate) conv1: usize,
    /// Channels of the second convolution.
    #[arg(long, default_value_t = TrainConfig::default().conv2)]
    pub(crate) conv2: usize,
    /// Width of the hidden linear layer.
    #[arg(long, default_value_t = TrainConfig::default().hidden)]
    pub(crate) hidden: usize,
    /// Seed of the weights and the batch order.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Train on the first N training images only (0: all 60,000).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) limit: usize,
    /// Test on the first N test images only (0: all 10,000).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) test_limit: usize,
    /// The directory of the four Fashion-MNIST files (*-idx?-ubyte.gz).
    #[arg(long, default_value = fucina::data::FASHION_MNIST_DIR)]
    pub(crate) data: PathBuf,
    /// Where to write the loss and accuracy curves (SVG). A relative path is
    /// relative to the current directory; missing directories are created.
    #[arg(long, default_value = DEFAULT_SVG)]
    pub(crate) svg: PathBuf,
    /// Save a checkpoint (parameters, batch-norm statistics, optimizer state,
    /// epoch and configuration, in the safetensors format) when training
    /// stops.
    #[arg(long, value_name = "PATH")]
    pub(crate) save: Option<PathBuf>,
    /// Resume from a checkpoint written by --save. The run continues bit for
    /// bit as if it had never stopped; the configuration flags must be those
    /// the checkpoint was written with.
    #[arg(long, value_name = "PATH")]
    pub(crate) resume: Option<PathBuf>,
    /// Stop after this epoch (counted from the start of the whole run, at most
    /// --epochs). The learning-rate schedule still spans all --epochs.
    #[arg(long, value_name = "EPOCH")]
    pub(crate) stop_after: Option<usize>,
}

/// The default of `--svg`, relative to the current directory.
pub(crate) const DEFAULT_SVG: &str = "target/train_fashion.svg";

impl Args {
    /// Checks what the flags cannot express in their types.
    pub(crate) fn validate(&self) -> Result<()> {
        common::check_threads(self.threads)?;
        common::check_at_least_one(&[
            ("--epochs", self.epochs),
            ("--batch", self.batch),
            ("--conv1", self.conv1),
            ("--conv2", self.conv2),
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
            conv1: self.conv1,
            conv2: self.conv2,
            hidden: self.hidden,
            limit: self.limit,
            ..TrainConfig::default()
        }
    }
}

/// Reads Fashion-MNIST from `dir` (the first `limit` training and
/// `test_limit` test images; 0: all), normalized with [`PIXEL_MEAN`] and
/// [`PIXEL_STD`]. A missing file is an error naming it and the `apt-get`
/// command that installs the data set.
pub(crate) fn load_data(
    dir: &Path,
    limit: usize,
    test_limit: usize,
) -> Result<(ImageSet, ImageSet)> {
    let (mut train, mut test) = fucina::data::load_mnist_dir(dir).map_err(|e| match e {
        Error::Data { path, reason } if reason.starts_with("not found") => Error::Data {
            path,
            reason:
                "not found: install Fashion-MNIST with `apt-get install dataset-fashion-mnist` \
                     (Debian), or pass --data DIR with its four files"
                    .to_string(),
        },
        e => e,
    })?;
    for (set, n, flag) in [
        (&mut train, limit, "--limit"),
        (&mut test, test_limit, "--test-limit"),
    ] {
        if n > 0 {
            if n > set.len() {
                return Err(Error::InvalidArgument {
                    what: flag,
                    reason: format!("{n} images asked for, the set has {}", set.len()),
                });
            }
            *set = set.slice(0..n)?;
        }
        for p in &mut set.images {
            *p = (*p - PIXEL_MEAN) / PIXEL_STD;
        }
    }
    Ok((train, test))
}

/// The training hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TrainConfig {
    pub(crate) epochs: usize,
    pub(crate) batch: usize,
    pub(crate) conv1: usize,
    pub(crate) conv2: usize,
    pub(crate) hidden: usize,
    pub(crate) lr: f32,
    pub(crate) weight_decay: f32,
    pub(crate) seed: u64,
    /// Training images used (0: all).
    pub(crate) limit: usize,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            epochs: 5,
            batch: 64,
            conv1: 32,
            conv2: 64,
            hidden: 128,
            lr: 2e-3,
            weight_decay: 1e-4,
            seed: 0,
            limit: 0,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub(crate) struct TrainReport {
    /// The loss of every step.
    pub(crate) losses: Vec<f32>,
    /// The test accuracy after every epoch run.
    pub(crate) accuracies: Vec<f32>,
    /// Training examples processed.
    pub(crate) examples: usize,
    /// Wall time of the training steps (the evaluations excluded).
    pub(crate) train_time: Duration,
    /// The context's local pool counters at the end of training.
    pub(crate) pool: PoolStats,
    /// The shared pool's counters (its misses are fresh allocations).
    pub(crate) shared_pool: PoolStats,
    /// Pooled buffers still handed out after training.
    pub(crate) outstanding: usize,
}

impl TrainReport {
    /// The test accuracy after the last epoch run (NaN if none ran).
    pub(crate) fn test_accuracy(&self) -> f32 {
        self.accuracies.last().copied().unwrap_or(f32::NAN)
    }
}

pub(crate) use train::Progress;

/// The model for `rows x cols` images: conv 3x3 (`conv1` channels, padding 1,
/// no bias) -> batch norm -> ReLU -> max pool 2x2 -> conv 3x3 (`conv2`) ->
/// batch norm -> ReLU -> max pool 2x2 -> flatten -> linear (`hidden`) -> ReLU
/// -> linear (10).
pub(crate) fn model(
    ctx: &ExecContext,
    cfg: &TrainConfig,
    rows: usize,
    cols: usize,
) -> Result<Sequential> {
    let same = Conv2dOptions {
        padding: [1, 1],
        ..Conv2dOptions::default()
    };
    let (c1, c2, seed) = (cfg.conv1, cfg.conv2, cfg.seed);
    let flat = c2 * (rows / 4) * (cols / 4);
    Ok(Sequential::new()
        .push_named(
            "conv1",
            Conv2d::no_bias(ctx, 1, c1, [3, 3], same, sub_seed(seed, 1))?,
        )
        .push_named("bn1", BatchNorm2d::new(ctx, c1)?)
        .push_named("relu1", Relu)
        .push_named("pool1", MaxPool2d::new([2, 2])?)
        .push_named(
            "conv2",
            Conv2d::no_bias(ctx, c1, c2, [3, 3], same, sub_seed(seed, 2))?,
        )
        .push_named("bn2", BatchNorm2d::new(ctx, c2)?)
        .push_named("relu2", Relu)
        .push_named("pool2", MaxPool2d::new([2, 2])?)
        .push_named("flatten", Flatten::new())
        .push_named(
            "fc1",
            Linear::new(ctx, flat, cfg.hidden, sub_seed(seed, 3))?,
        )
        .push_named("relu3", Relu)
        .push_named(
            "fc2",
            Linear::new(ctx, cfg.hidden, CLASSES, sub_seed(seed, 4))?,
        ))
}

/// The model of `cfg` and its AdamW optimizer (no state yet).
pub(crate) fn model_and_optimizer(
    ctx: &ExecContext,
    cfg: &TrainConfig,
    rows: usize,
    cols: usize,
) -> Result<(Sequential, AdamW)> {
    let net = model(ctx, cfg, rows, cols)?;
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
/// must hold to resume it bit-identically (the batch order and the schedule
/// regenerate from the seed, the epoch and the step).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// Epochs completed.
    pub(crate) epoch: usize,
    /// The model's parameters and buffers by name (`"conv1.weight"`,
    /// `"bn1.running_mean"`, ...).
    pub(crate) model: StateDict,
    /// The optimizer state.
    pub(crate) optimizer: StateDict,
}

/// The loader of the training set: batches of `cfg.batch` images
/// `[1, rows, cols]`, shuffled per epoch from the seed, the last batch ragged.
pub(crate) fn train_loader<'a>(train: &'a ImageSet, cfg: &TrainConfig) -> Result<DataLoader<'a>> {
    Ok(DataLoader::new(
        &train.images,
        &train.labels,
        &[1, train.rows, train.cols],
        cfg.batch,
    )?
    .shuffle(sub_seed(cfg.seed, 100)))
}

/// Trains on `train` with AdamW and evaluates on `test` after every epoch;
/// optionally resumed from `resume` and stopped after epoch `stop_after`
/// (both within `cfg.epochs`, which fixes the schedule). `on_step` runs after
/// every step.
pub(crate) fn train_from(
    ctx: &ExecContext,
    train: &ImageSet,
    test: &ImageSet,
    cfg: &TrainConfig,
    resume: Option<Snapshot>,
    stop_after: Option<usize>,
    on_step: &mut dyn FnMut(&Progress),
) -> Result<(TrainReport, Snapshot)> {
    let (mut net, mut opt) = model_and_optimizer(ctx, cfg, train.rows, train.cols)?;
    let mut loader = train_loader(train, cfg)?;
    let per_epoch = loader.batches_per_epoch();
    let steps = per_epoch * cfg.epochs;
    let schedule = WarmupCosine::new(cfg.lr, cfg.lr * 0.02, (per_epoch / 4) as u64, steps as u64)?;
    let first = match resume {
        None => 0,
        Some(snap) => {
            train::check_snapshot_epoch(snap.epoch, cfg.epochs)?;
            net.load_state_dict(&snap.model)?;
            opt.load_state_dict(ctx, &snap.optimizer)?;
            snap.epoch
        }
    };
    let last = stop_after.unwrap_or(cfg.epochs).clamp(first, cfg.epochs);
    let mut step = first * per_epoch;
    let mut losses = Vec::with_capacity(steps);
    let mut accuracies = Vec::with_capacity(cfg.epochs);
    let mut examples = 0;
    let mut train_time = Duration::ZERO;
    for epoch in first..last {
        net.train(true);
        let start = Instant::now();
        loader.for_each_batch(ctx, epoch as u64, |batch| {
            let b = batch.len();
            let loss = ctx.exec_scope(|ctx| -> Result<f32> {
                let loss = net.forward(ctx, &batch.x)?.cross_entropy(ctx, &batch.y)?;
                loss.backward(ctx)?;
                Ok(loss.item()?)
            })?;
            drop(batch);
            opt.set_lr(schedule.lr(step as u64))?;
            opt.step(ctx)?;
            opt.zero_grad();
            losses.push(loss);
            examples += b;
            step += 1;
            on_step(&Progress {
                step,
                steps,
                epoch,
                loss,
                examples,
                elapsed: train_time + start.elapsed(),
            });
            Ok(())
        })?;
        train_time += start.elapsed();
        accuracies.push(accuracy(ctx, &mut net, test)?);
    }
    let (pool, shared_pool) = (ctx.pool().stats(), ctx.pool().pool().stats());
    let outstanding = ctx.outstanding_buffers();
    net.train(true);
    let snapshot = Snapshot {
        epoch: last,
        model: net.state_dict(),
        optimizer: opt.state_dict(),
    };
    let report = TrainReport {
        losses,
        accuracies,
        examples,
        train_time,
        pool,
        shared_pool,
        outstanding,
    };
    Ok((report, snapshot))
}

/// The fraction of `d` that `net` classifies correctly, in evaluation mode
/// (running batch-norm statistics) under `no_grad`, in batches of 500; `net`
/// is left in evaluation mode.
pub(crate) fn accuracy(ctx: &ExecContext, net: &mut Sequential, d: &ImageSet) -> Result<f32> {
    net.eval();
    let _guard = no_grad();
    let mut loader = DataLoader::new(&d.images, &d.labels, &[1, d.rows, d.cols], 500)?;
    let mut correct = 0;
    loader.for_each_batch(ctx, 0, |b| {
        let pred = ctx.exec_scope(|ctx| -> Result<Vec<i64>> {
            Ok(net.forward(ctx, &b.x)?.argmax(ctx, 1, false)?.to_vec())
        })?;
        correct += pred.iter().zip(b.y.data()?).filter(|(p, y)| p == y).count();
        Ok(())
    })?;
    Ok(correct as f32 / d.len() as f32)
}

/// The `format` metadata entry of a `train_fashion` checkpoint.
pub(crate) const CHECKPOINT_FORMAT: &str = "fucina.train_fashion.v1";

/// The configuration entries of a checkpoint's metadata: `(key, flag, value)`.
fn config_entries(cfg: &TrainConfig) -> [train::ConfigEntry; 9] {
    [
        ("seed", "--seed", cfg.seed.to_string()),
        ("epochs", "--epochs", cfg.epochs.to_string()),
        ("lr", "--lr", cfg.lr.to_string()),
        ("batch", "--batch", cfg.batch.to_string()),
        ("conv1", "--conv1", cfg.conv1.to_string()),
        ("conv2", "--conv2", cfg.conv2.to_string()),
        ("hidden", "--hidden", cfg.hidden.to_string()),
        ("limit", "--limit", cfg.limit.to_string()),
        ("weight_decay", "weight decay", cfg.weight_decay.to_string()),
    ]
}

/// Saves `snap` and the configuration to `path` with
/// [`fucina::checkpoint::save_module`]: the parameters and batch-norm
/// statistics under `model.<name>`, the optimizer state under `optim.<name>`,
/// and `format`, `epoch` and the configuration as metadata.
pub(crate) fn save_checkpoint(
    ctx: &ExecContext,
    path: &Path,
    cfg: &TrainConfig,
    image: [usize; 2],
    snap: &Snapshot,
) -> Result<()> {
    let (net, mut opt) = model_and_optimizer(ctx, cfg, image[0], image[1])?;
    net.load_state_dict(&snap.model)?;
    opt.load_state_dict(ctx, &snap.optimizer)?;
    checkpoint(path, cfg).save(&net, &opt, snap.epoch)
}

/// The [`train::Checkpoint`] of a `train_fashion` run of `cfg` at `path`.
fn checkpoint<'a>(path: &'a Path, cfg: &TrainConfig) -> train::Checkpoint<'a> {
    let entries = config_entries(cfg).into();
    train::Checkpoint::new(
        path,
        "train_fashion",
        CHECKPOINT_FORMAT,
        entries,
        cfg.epochs,
    )
}

/// Reads the checkpoint at `path` for a run of `cfg` with `steps_per_epoch`
/// steps per epoch and checks it completely before anything trains: its
/// format, its configuration (an error names the flag and both values), and
/// that its tensors fit the model and optimizer.
pub(crate) fn load_checkpoint(
    ctx: &ExecContext,
    path: &Path,
    cfg: &TrainConfig,
    image: [usize; 2],
    steps_per_epoch: usize,
) -> Result<Snapshot> {
    let (epoch, net, opt) =
        checkpoint(path, cfg).load(ctx, steps_per_epoch, "the model", || {
            model_and_optimizer(ctx, cfg, image[0], image[1])
        })?;
    Ok(Snapshot {
        epoch,
        model: net.state_dict(),
        optimizer: opt.state_dict(),
    })
}

/// The snapshot to resume from (`--resume`), checked with [`load_checkpoint`].
pub(crate) fn resume_point(
    ctx: &ExecContext,
    args: &Args,
    train: &ImageSet,
) -> Result<Option<Snapshot>> {
    let Some(path) = &args.resume else {
        return Ok(None);
    };
    let cfg = args.config();
    let per_epoch = train_loader(train, &cfg)?.batches_per_epoch();
    let snap = load_checkpoint(ctx, path, &cfg, [train.rows, train.cols], per_epoch)?;
    train::check_stop_after_resume(args.stop_after, path, snap.epoch)?;
    Ok(Some(snap))
}

/// The run the flags ask for: trains from `resume` (or from the start) up to
/// `--stop-after` (or `--epochs`), then saves the checkpoint to `--save` if
/// given.
pub(crate) fn run_job(
    ctx: &ExecContext,
    args: &Args,
    train: &ImageSet,
    test: &ImageSet,
    resume: Option<Snapshot>,
    on_step: &mut dyn FnMut(&Progress),
) -> Result<(TrainReport, Snapshot)> {
    let cfg = args.config();
    let (report, snap) = train_from(ctx, train, test, &cfg, resume, args.stop_after, on_step)?;
    if let Some(path) = &args.save {
        save_checkpoint(ctx, path, &cfg, [train.rows, train.cols], &snap)?;
    }
    Ok((report, snap))
}

/// The training loss per step (left axis) and the test accuracy after each
/// epoch (right axis, percent) as a standalone SVG; the epoch axis is labelled
/// from `first_epoch` (a resumed run's first epoch).
pub(crate) fn curves_svg(
    losses: &[f32],
    accuracies: &[f32],
    steps_per_epoch: usize,
    first_epoch: usize,
) -> String {
    let (w, h, pad) = (760.0f32, 380.0f32, 56.0f32);
    let max = losses.iter().copied().fold(f32::MIN, f32::max).max(1e-6);
    let n = losses.len().max(2) as f32 - 1.0;
    let px = |i: usize| pad + (w - 2.0 * pad) * i as f32 / n;
    let py = |v: f32| h - pad - (h - 2.0 * pad) * (v / max).clamp(0.0, 1.0);
    // Accuracy axis: from the lowest accuracy (rounded down to 10 %) to 100 %.
    let lowest = accuracies.iter().copied().fold(1.0f32, f32::min);
    let lo = (lowest * 10.0).floor().clamp(0.0, 9.0) / 10.0;
    let pa = |a: f32| h - pad - (h - 2.0 * pad) * ((a - lo) / (1.0 - lo)).clamp(0.0, 1.0);
    let mut s = String::new();
    train::svg_open(
        &mut s,
        w,
        h,
        pad,
        "train_fashion: training loss per step (blue), test accuracy per epoch (orange)",
    );
    let _ = writeln!(
        s,
        "<line x1=\"{}\" y1=\"{pad}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
        w - pad,
        w - pad,
        h - pad
    );
    for k in 0..=4 {
        let v = max * k as f32 / 4.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#1f77b4\">{v:.2}</text>",
            pad - 4.0,
            py(v) + 4.0
        );
        let a = lo + (1.0 - lo) * k as f32 / 4.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"start\" fill=\"#ff7f0e\">{:.1}%</text>",
            w - pad + 4.0,
            pa(a) + 4.0,
            100.0 * a
        );
    }
    train::svg_epoch_axis(
        &mut s,
        (w, h, pad),
        losses.len(),
        steps_per_epoch,
        first_epoch,
        px,
    );
    s.push_str("<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1\" points=\"");
    train::svg_loss_points(&mut s, losses, px, py);
    s.push_str("\"/>\n<polyline fill=\"none\" stroke=\"#ff7f0e\" stroke-width=\"2\" points=\"");
    for (e, &a) in accuracies.iter().enumerate() {
        let _ = write!(s, "{:.1},{:.1} ", px((e + 1) * steps_per_epoch), pa(a));
    }
    s.push_str("\"/>\n");
    for (e, &a) in accuracies.iter().enumerate() {
        let _ = writeln!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#ff7f0e\"/>",
            px((e + 1) * steps_per_epoch),
            pa(a)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Writes the SVG, creating the directory if needed.
pub(crate) fn write_svg(
    path: &Path,
    report: &TrainReport,
    steps_per_epoch: usize,
    first_epoch: usize,
) -> Result<()> {
    let svg = curves_svg(
        &report.losses,
        &report.accuracies,
        steps_per_epoch,
        first_epoch,
    );
    train::write_file(path, &svg)
}
