//! Trains a small U-Net denoiser on synthetic images (rectangles and discs
//! with Gaussian noise), the layers a PyTorch U-Net is ported with:
//!
//! ```sh
//! cargo run --release -p fucina --example unet_denoise
//! ```
//!
//! Prints the loss every `--log-every` steps and the held-out error of the
//! noisy and the denoised images, and writes the loss curve (`--svg`) and
//! held-out images noisy, denoised and clean (`--samples-svg`). The same
//! `--seed` gives the same losses, bit for bit, for every `--threads`.
//! `--help` lists the flags.

mod job;

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use fucina::ExecContext;
use fucina::nn::Module;

use job::{Args, UNet};

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
    let cfg = args.config();
    let ctx = ExecContext::with_threads(args.threads);
    let model = UNet::new(&ctx, cfg.width, cfg.seed)?;
    let params: usize = model.parameters().iter().map(|p| p.numel()).sum();
    println!(
        "U-Net: width {} and {}, {params} parameters; images {}x{}, noise {}; batch {}, {} steps, AdamW lr {}, {} thread(s), seed {}",
        cfg.width,
        2 * cfg.width,
        cfg.size,
        cfg.size,
        cfg.noise,
        cfg.batch,
        cfg.steps,
        cfg.lr,
        ctx.threads(),
        cfg.seed
    );
    let start = Instant::now();
    let report = job::train(&ctx, &model, &cfg, |step, loss| {
        if (step + 1) % args.log_every == 0 || step + 1 == cfg.steps {
            println!(
                "step {:>5}  loss {loss:.5}  ({:.1} s)",
                step + 1,
                start.elapsed().as_secs_f32()
            );
        }
    })?;
    println!(
        "held-out mean squared error: noisy {:.5}, denoised {:.5}",
        report.noisy_mse, report.denoised_mse
    );
    job::write_file(&args.svg, &job::loss_svg(&report.losses))?;
    job::write_file(&args.samples_svg, &job::samples_svg(&ctx, &model, &cfg, 6)?)?;
    println!(
        "wrote {} and {}",
        args.svg.display(),
        args.samples_svg.display()
    );
    Ok(())
}
