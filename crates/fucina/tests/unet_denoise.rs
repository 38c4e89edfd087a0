//! The `unet_denoise` example's job: a short seeded run's loss falls and the
//! denoised held-out images are closer to the clean ones than the noisy
//! ones; the losses are bit-identical for 1 and 2 threads; the U-Net's
//! parameter names; bad flags are errors; the figures are SVG.

#[allow(dead_code)]
#[path = "../examples/unet_denoise/job.rs"]
mod job;

use clap::Parser;
use fucina::nn::Module;
use fucina::{Error, ExecContext};
use job::{Args, TrainConfig, UNet};

fn tiny(steps: usize) -> TrainConfig {
    TrainConfig {
        steps,
        batch: 8,
        size: 8,
        width: 4,
        lr: 1e-2,
        noise: 0.3,
        seed: 3,
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_short_run_learns_and_is_bit_identical_across_threads() {
    let cfg = tiny(40);
    let run = |threads: usize| {
        let ctx = ExecContext::with_threads(threads);
        let model = UNet::new(&ctx, cfg.width, cfg.seed).unwrap();
        let mut logged = 0;
        let report = job::train(&ctx, &model, &cfg, |_, _| logged += 1).unwrap();
        assert_eq!(logged, cfg.steps);
        (report, model)
    };
    let (one, model) = run(1);
    let (two, _) = run(2);
    assert_eq!(bits(&one.losses), bits(&two.losses), "1 vs 2 threads");
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    let (first, last) = (mean(&one.losses[..5]), mean(&one.losses[35..]));
    assert!(last < 0.7 * first, "the loss falls: {first} -> {last}");
    assert!(
        one.denoised_mse < one.noisy_mse,
        "denoised {} vs noisy {}",
        one.denoised_mse,
        one.noisy_mse
    );
    // The figures.
    let ctx = ExecContext::with_threads(1);
    let loss = job::loss_svg(&one.losses);
    assert!(loss.starts_with("<svg") && loss.trim_end().ends_with("</svg>"));
    let samples = job::samples_svg(&ctx, &model, &cfg, 3).unwrap();
    assert!(samples.starts_with("<svg") && samples.trim_end().ends_with("</svg>"));
    assert_eq!(samples.matches("<rect x=").count(), 3 * 3 * 8 * 8);
}

#[test]
fn the_unet_has_the_layers_of_a_pytorch_unet() {
    let ctx = ExecContext::new();
    let model = UNet::new(&ctx, 4, 1).unwrap();
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for want in [
        "enc1.conv.weight",
        "enc1.norm.weight",
        "up2.weight",
        "up2.bias",
        "dec2.conv.weight",
        "up1.conv.weight",
        "head.bias",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    // Images whose side is not a multiple of 4 do not fit the skips.
    let (noisy, _) = job::batch(&ctx, 2, 6, 0.1, 0).unwrap();
    assert!(model.forward(&ctx, &noisy).is_err());
}

#[test]
fn bad_flags_are_errors() {
    for flags in [
        &["--size", "10"][..],
        &["--width", "6"],
        &["--steps", "0"],
        &["--threads", "0"],
        &["--noise=-1"],
        &["--lr", "0"],
    ] {
        let args =
            Args::try_parse_from(std::iter::once("unet_denoise").chain(flags.iter().copied()))
                .unwrap();
        assert!(
            matches!(args.validate(), Err(Error::InvalidArgument { .. })),
            "{flags:?}"
        );
    }
    assert!(Args::try_parse_from(["unet_denoise", "--no-such-flag"]).is_err());
    let args = Args::try_parse_from(["unet_denoise"]).unwrap();
    args.validate().unwrap();
}
