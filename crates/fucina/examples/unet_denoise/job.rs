//! The `unet_denoise` job as functions (the example's `main` and the tests
//! call them): the synthetic images, the U-Net, the training loop and the
//! SVG figures.

use std::fmt::Write as _;
use std::path::PathBuf;

#[path = "../common/mod.rs"]
mod common;
#[allow(dead_code)] // the loss chart and write_file only
#[path = "../common/train.rs"]
mod train;

use clap::Parser;
use fucina::exec::{ConvTranspose2dOptions, InterpolateMode, rng};
use fucina::nn::{
    Conv2d, ConvTranspose2d, GroupNorm, MaxPool2d, Module, ReflectionPad2d, Upsample, sub_seed,
};
use fucina::optim::{AdamW, AdamWConfig};
use fucina::prelude::Conv2dOptions;
use fucina::{ExecContext, Result, Tensor, no_grad};

#[allow(unused_imports)] // main writes the figures, the tests do not
pub(crate) use train::write_file;

/// Trains a small U-Net (the layers a PyTorch U-Net is made of:
/// Conv2d, GroupNorm, MaxPool2d, ConvTranspose2d, Upsample, ReflectionPad2d
/// and skip connections joined with concat) to remove Gaussian noise from
/// synthetic images of rectangles and discs, drawn from --seed.
///
/// Prints the loss every --log-every steps and the mean squared error of the
/// noisy and the denoised held-out images, and writes two SVG figures: the
/// loss curve (--svg) and held-out images noisy, denoised and clean
/// (--samples-svg). The same --seed gives the same losses, bit for bit, for
/// every --threads.
#[derive(Debug, Parser)]
#[command(name = "unet_denoise", version)]
pub(crate) struct Args {
    /// Worker threads of the execution context (the results are bitwise
    /// identical for every count).
    #[arg(long, default_value_t = common::default_threads())]
    pub(crate) threads: usize,
    /// Training steps (each on a fresh batch of images).
    #[arg(long, default_value_t = TrainConfig::default().steps)]
    pub(crate) steps: usize,
    /// Images per batch.
    #[arg(long, default_value_t = TrainConfig::default().batch)]
    pub(crate) batch: usize,
    /// Image side (a multiple of 4).
    #[arg(long, default_value_t = TrainConfig::default().size)]
    pub(crate) size: usize,
    /// Channels of the first stage (doubled at the second; a multiple of 4).
    #[arg(long, default_value_t = TrainConfig::default().width)]
    pub(crate) width: usize,
    /// Learning rate of AdamW.
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    pub(crate) lr: f32,
    /// Standard deviation of the noise added to the images.
    #[arg(long, default_value_t = TrainConfig::default().noise)]
    pub(crate) noise: f32,
    /// Seed of the weights and the images.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Print the loss every this many steps.
    #[arg(long, default_value_t = 20)]
    pub(crate) log_every: usize,
    /// Where to write the loss curve (SVG).
    #[arg(long, default_value = "target/unet_denoise_loss.svg")]
    pub(crate) svg: PathBuf,
    /// Where to write held-out images noisy, denoised and clean (SVG).
    #[arg(long, default_value = "target/unet_denoise_samples.svg")]
    pub(crate) samples_svg: PathBuf,
}

impl Args {
    /// Checks the flags.
    pub(crate) fn validate(&self) -> Result<()> {
        common::check_threads(self.threads)?;
        common::check_at_least_one(&[
            ("--steps", self.steps),
            ("--batch", self.batch),
            ("--log-every", self.log_every),
        ])?;
        self.config().validate()
    }

    /// The training configuration the flags give.
    pub(crate) fn config(&self) -> TrainConfig {
        TrainConfig {
            steps: self.steps,
            batch: self.batch,
            size: self.size,
            width: self.width,
            lr: self.lr,
            noise: self.noise,
            seed: self.seed,
        }
    }
}

/// What a run trains.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrainConfig {
    pub(crate) steps: usize,
    pub(crate) batch: usize,
    pub(crate) size: usize,
    pub(crate) width: usize,
    pub(crate) lr: f32,
    pub(crate) noise: f32,
    pub(crate) seed: u64,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            steps: 300,
            batch: 16,
            size: 24,
            width: 16,
            lr: 3e-3,
            noise: 0.3,
            seed: 0,
        }
    }
}

impl TrainConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |what, reason: String| Err(fucina::Error::InvalidArgument { what, reason });
        if self.size < 4 || !self.size.is_multiple_of(4) {
            return bad(
                "--size",
                format!("must be a multiple of 4, at least 4 (got {})", self.size),
            );
        }
        if self.width < 4 || !self.width.is_multiple_of(4) {
            return bad(
                "--width",
                format!("must be a multiple of 4, at least 4 (got {})", self.width),
            );
        }
        if !(self.noise.is_finite() && self.noise >= 0.0) {
            return bad(
                "--noise",
                format!("must be finite and >= 0 (got {})", self.noise),
            );
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("--lr", format!("must be finite and > 0 (got {})", self.lr));
        }
        Ok(())
    }
}

/// `n` clean images `[n, 1, size, size]` of one to three shapes (axis-aligned
/// rectangles and discs of intensity 0.3 to 1 on a zero background, the
/// brighter one on top), drawn from `seed`.
pub(crate) fn clean_images(n: usize, size: usize, seed: u64) -> Vec<f32> {
    let mut out = vec![0.0f32; n * size * size];
    let mut k = 0u64;
    let mut draw = |lo: f32, hi: f32| {
        let u = (rng::at(seed, k) >> 40) as f32 / (1u64 << 24) as f32;
        k += 1;
        lo + (hi - lo) * u
    };
    let s = size as f32;
    for img in out.chunks_exact_mut(size * size) {
        let shapes = 1 + (draw(0.0, 3.0) as usize).min(2);
        for _ in 0..shapes {
            let (cx, cy) = (draw(0.15, 0.85) * s, draw(0.15, 0.85) * s);
            let (rx, ry) = (draw(0.1, 0.3) * s, draw(0.1, 0.3) * s);
            let value = draw(0.3, 1.0);
            let disc = draw(0.0, 1.0) < 0.5;
            for (i, p) in img.iter_mut().enumerate() {
                let (x, y) = ((i % size) as f32 + 0.5, (i / size) as f32 + 0.5);
                let (dx, dy) = ((x - cx) / rx, (y - cy) / ry);
                let inside = if disc {
                    dx * dx + dy * dy <= 1.0
                } else {
                    dx.abs() <= 1.0 && dy.abs() <= 1.0
                };
                if inside {
                    *p = p.max(value);
                }
            }
        }
    }
    out
}

/// A batch: `(noisy, clean)`, both `[n, 1, size, size]`; the images and the
/// noise are drawn from `seed`.
pub(crate) fn batch(
    ctx: &ExecContext,
    n: usize,
    size: usize,
    noise: f32,
    seed: u64,
) -> Result<(Tensor, Tensor)> {
    let shape = [n, 1, size, size];
    let clean = Tensor::from_slice(ctx, &shape, &clean_images(n, size, sub_seed(seed, 0)))?;
    let noisy = clean.add(ctx, &Tensor::randn(ctx, &shape, noise, sub_seed(seed, 1))?)?;
    Ok((noisy, clean))
}

/// A 3x3 convolution (zero padding 1, or none after a reflection pad), a
/// group norm and a ReLU: one stage of the U-Net.
#[derive(fucina::nn::Module)]
pub(crate) struct Stage {
    conv: Conv2d,
    norm: GroupNorm,
}

impl Stage {
    fn new(ctx: &ExecContext, inp: usize, out: usize, padding: usize, seed: u64) -> Result<Stage> {
        let opts = Conv2dOptions {
            padding: [padding, padding],
            ..Conv2dOptions::default()
        };
        Ok(Stage {
            conv: Conv2d::new(ctx, inp, out, [3, 3], opts, seed)?,
            norm: GroupNorm::new(ctx, 4, out)?,
        })
    }

    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let h = self.conv.forward(ctx, x)?;
        Ok(self.norm.forward(ctx, &h)?.relu(ctx)?)
    }
}

/// The U-Net: two encoder stages with max pooling, a bottleneck, a decoder
/// stage up by a transposed convolution and one up by bilinear upsampling
/// then a reflection-padded convolution, each joined with its encoder's skip
/// connection, and a 1x1 convolution predicting the noise (the output is the
/// input less the predicted noise).
#[derive(fucina::nn::Module)]
pub(crate) struct UNet {
    enc1: Stage,
    enc2: Stage,
    mid: Stage,
    up2: ConvTranspose2d,
    dec2: Stage,
    up1: Stage,
    dec1: Stage,
    head: Conv2d,
    #[module(skip)]
    pool: MaxPool2d,
    #[module(skip)]
    upsample: Upsample,
    #[module(skip)]
    pad: ReflectionPad2d,
}

impl UNet {
    pub(crate) fn new(ctx: &ExecContext, width: usize, seed: u64) -> Result<UNet> {
        let (c, c2) = (width, 2 * width);
        let s = |k| sub_seed(seed, k);
        let up = ConvTranspose2dOptions {
            stride: [2, 2],
            ..ConvTranspose2dOptions::default()
        };
        Ok(UNet {
            enc1: Stage::new(ctx, 1, c, 1, s(0))?,
            enc2: Stage::new(ctx, c, c2, 1, s(1))?,
            mid: Stage::new(ctx, c2, c2, 1, s(2))?,
            up2: ConvTranspose2d::new(ctx, c2, c2, [2, 2], up, s(3))?,
            dec2: Stage::new(ctx, 2 * c2, c2, 1, s(4))?,
            up1: Stage::new(ctx, c2, c, 0, s(5))?,
            dec1: Stage::new(ctx, 2 * c, c, 1, s(6))?,
            head: Conv2d::new(ctx, c, 1, [1, 1], Conv2dOptions::default(), s(7))?,
            pool: MaxPool2d::new([2, 2])?,
            upsample: Upsample::scale(
                2.0,
                InterpolateMode::Bilinear {
                    align_corners: false,
                },
            )?,
            pad: ReflectionPad2d::uniform(1),
        })
    }

    /// The denoised images for `noisy` (`[N, 1, H, W]`, `H` and `W`
    /// multiples of 4).
    pub(crate) fn forward(&self, ctx: &ExecContext, noisy: &Tensor) -> Result<Tensor> {
        let e1 = self.enc1.forward(ctx, noisy)?; // [N, c, H, W]
        let e2 = self.enc2.forward(ctx, &self.pool.forward(ctx, &e1)?)?; // [N, 2c, H/2, W/2]
        let m = self.mid.forward(ctx, &self.pool.forward(ctx, &e2)?)?; // [N, 2c, H/4, W/4]
        let u2 = self.up2.forward(ctx, &m)?; // [N, 2c, H/2, W/2]
        let d2 = self
            .dec2
            .forward(ctx, &Tensor::concat(ctx, &[&u2, &e2], 1)?)?;
        let u1 = self.upsample.forward(ctx, &d2)?; // [N, 2c, H, W]
        let u1 = self.up1.forward(ctx, &self.pad.forward(ctx, &u1)?)?; // [N, c, H, W]
        let d1 = self
            .dec1
            .forward(ctx, &Tensor::concat(ctx, &[&u1, &e1], 1)?)?;
        let predicted_noise = self.head.forward(ctx, &d1)?;
        Ok(noisy.sub(ctx, &predicted_noise)?)
    }
}

/// The losses of a run, and the held-out error before and after denoising.
pub(crate) struct Report {
    pub(crate) losses: Vec<f32>,
    /// Mean squared error of the noisy held-out images.
    pub(crate) noisy_mse: f32,
    /// Mean squared error of the denoised held-out images.
    pub(crate) denoised_mse: f32,
}

/// The seed of the held-out batch (no training batch uses it).
const HELD_OUT: u64 = u64::MAX;

/// Trains `model` for `cfg.steps` steps of AdamW on fresh batches, calling
/// `log(step, loss)` after each, and measures the held-out error.
pub(crate) fn train(
    ctx: &ExecContext,
    model: &UNet,
    cfg: &TrainConfig,
    mut log: impl FnMut(usize, f32),
) -> Result<Report> {
    cfg.validate()?;
    let adam = AdamWConfig {
        lr: cfg.lr,
        weight_decay: 0.0,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(model.parameters(), adam)?;
    let mut losses = Vec::with_capacity(cfg.steps);
    for step in 0..cfg.steps {
        let (noisy, clean) = batch(
            ctx,
            cfg.batch,
            cfg.size,
            cfg.noise,
            sub_seed(cfg.seed, 100 + step as u64),
        )?;
        let loss = model.forward(ctx, &noisy)?.mse_loss(ctx, &clean)?;
        let value = loss.item()?;
        loss.backward(ctx)?;
        opt.step(ctx)?;
        opt.zero_grad();
        losses.push(value);
        log(step, value);
    }
    let (noisy, denoised, clean) = held_out(ctx, model, cfg, cfg.batch)?;
    Ok(Report {
        losses,
        noisy_mse: noisy.mse_loss(ctx, &clean)?.item()?,
        denoised_mse: denoised.mse_loss(ctx, &clean)?.item()?,
    })
}

/// `count` held-out images: `(noisy, denoised, clean)`, without a graph.
fn held_out(
    ctx: &ExecContext,
    model: &UNet,
    cfg: &TrainConfig,
    count: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let seed = sub_seed(cfg.seed, HELD_OUT);
    let (noisy, clean) = batch(ctx, count, cfg.size, cfg.noise, seed)?;
    let _guard = no_grad();
    let denoised = model.forward(ctx, &noisy)?;
    Ok((noisy, denoised, clean))
}

/// The loss curve as an SVG.
pub(crate) fn loss_svg(losses: &[f32]) -> String {
    train::loss_svg(
        "U-Net denoiser: training loss (MSE)",
        losses,
        losses.len().max(1),
        0,
    )
}

/// Held-out images in three rows (noisy, denoised, clean), `count` columns,
/// as an SVG of grey squares (values clamped to 0..1).
pub(crate) fn samples_svg(
    ctx: &ExecContext,
    model: &UNet,
    cfg: &TrainConfig,
    count: usize,
) -> Result<String> {
    let (noisy, denoised, clean) = held_out(ctx, model, cfg, count)?;
    let (cell, gap, label) = (6.0f32, 12.0f32, 90.0f32);
    let side = cfg.size as f32 * cell;
    let (w, h) = (
        label + count as f32 * (side + gap),
        3.0 * (side + gap) + gap,
    );
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"13\">"
    );
    let _ = writeln!(s, "<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>");
    let px = cfg.size * cfg.size;
    for (row, (name, t)) in [
        ("noisy", &noisy),
        ("denoised", &denoised),
        ("clean", &clean),
    ]
    .into_iter()
    .enumerate()
    {
        let y0 = gap + row as f32 * (side + gap);
        let _ = writeln!(s, "<text x=\"8\" y=\"{}\">{name}</text>", y0 + side / 2.0);
        let v = t.to_vec();
        for i in 0..count {
            let x0 = label + i as f32 * (side + gap);
            for (j, &p) in v[i * px..(i + 1) * px].iter().enumerate() {
                let g = (p.clamp(0.0, 1.0) * 255.0).round() as u8;
                let (x, y) = ((j % cfg.size) as f32 * cell, (j / cfg.size) as f32 * cell);
                let _ = writeln!(
                    s,
                    "<rect x=\"{}\" y=\"{}\" width=\"{cell}\" height=\"{cell}\" fill=\"rgb({g},{g},{g})\"/>",
                    x0 + x,
                    y0 + y
                );
            }
        }
    }
    s.push_str("</svg>\n");
    Ok(s)
}
