//! The `train_fashion` job: its flags, the error naming the `apt-get` command
//! when the data set is absent, and — where Fashion-MNIST is installed — one
//! short epoch on a slice that learns, gives the same bits on 1 and 2 threads,
//! and resumes from a checkpoint bit-identically.
//!
//! Without the data set the training tests print a message and pass, unless
//! `FUCINA_REQUIRE_FASHION=1` (set by `.ci/run` where it installed or found the
//! package), which makes its absence a failure.

#[allow(dead_code)]
#[path = "../examples/train_fashion/job.rs"]
mod job;

use std::path::{Path, PathBuf};

use clap::Parser;
use fucina::data::ImageSet;
use fucina::{Error, ExecContext};
use job::{Args, TrainConfig};

/// The slice of Fashion-MNIST the tests train on, or `None` (with a message)
/// when the data set is not installed and not required.
fn data(limit: usize, test_limit: usize) -> Option<(ImageSet, ImageSet)> {
    let dir = Path::new(fucina::data::FASHION_MNIST_DIR);
    if !dir.join(fucina::data::MNIST_FILES[0]).is_file() {
        assert!(
            std::env::var_os("FUCINA_REQUIRE_FASHION").is_none_or(|v| v != "1"),
            "FUCINA_REQUIRE_FASHION=1 but Fashion-MNIST is not in {}",
            dir.display()
        );
        eprintln!(
            "skipped: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
        );
        return None;
    }
    Some(job::load_data(dir, limit, test_limit).unwrap())
}

/// A small configuration that trains fast in a debug build.
fn small() -> TrainConfig {
    TrainConfig {
        epochs: 1,
        batch: 64,
        conv1: 8,
        conv2: 16,
        hidden: 32,
        lr: 3e-3,
        limit: 640,
        ..TrainConfig::default()
    }
}

#[test]
fn flags_have_the_documented_defaults_and_are_checked() {
    let a = Args::try_parse_from(["train_fashion"]).unwrap();
    assert_eq!(
        (
            a.threads, a.epochs, a.batch, a.conv1, a.conv2, a.hidden, a.limit
        ),
        (ExecContext::new().threads(), 5, 64, 32, 64, 128, 0)
    );
    assert_eq!(a.svg, PathBuf::from("target/train_fashion.svg"));
    assert_eq!(a.data, PathBuf::from("/usr/share/datasets/fashion-mnist"));
    a.validate().unwrap();
    assert!(Args::try_parse_from(["train_fashion", "--bogus"]).is_err());
    for bad in [
        &["train_fashion", "--threads", "0"][..],
        &["train_fashion", "--conv1", "0"],
        &["train_fashion", "--epochs", "2", "--stop-after", "3"],
    ] {
        let a = Args::try_parse_from(bad).unwrap();
        assert!(
            matches!(a.validate(), Err(Error::InvalidArgument { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn a_missing_data_set_names_the_apt_get_command() {
    let dir = std::env::temp_dir().join(format!("fucina-no-fashion-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    match job::load_data(&dir, 0, 0) {
        Err(Error::Data { path, reason }) => {
            assert!(path.ends_with("train-images-idx3-ubyte.gz"), "{path}");
            assert!(
                reason.contains("apt-get install dataset-fashion-mnist"),
                "{reason}"
            );
            assert!(reason.contains("--data DIR"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn one_short_epoch_learns_and_is_thread_count_invariant() {
    let Some((train, test)) = data(small().limit, 500) else {
        return;
    };
    assert_eq!((train.len(), test.len(), train.rows), (640, 500, 28));
    let cfg = small();
    let run = |threads: usize| {
        let ctx = ExecContext::with_threads(threads);
        job::train_from(&ctx, &train, &test, &cfg, None, None, &mut |_| {})
            .unwrap()
            .0
    };
    let r1 = run(1);
    assert_eq!(r1.losses.len(), 10);
    assert_eq!(r1.accuracies.len(), 1);
    let (first, last) = (r1.losses[0], *r1.losses.last().unwrap());
    assert!(first > 1.8 && last < first * 0.75, "loss {first} -> {last}");
    assert!(r1.test_accuracy() > 0.45, "accuracy {}", r1.test_accuracy());
    let r2 = run(2);
    let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(b(&r1.losses), b(&r2.losses));
    assert_eq!(b(&r1.accuracies), b(&r2.accuracies));
    let svg = job::curves_svg(&r1.losses, &r1.accuracies, 10, 0);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 2);
}

#[test]
fn a_resumed_run_continues_bit_identically() {
    let cfg = TrainConfig {
        epochs: 2,
        limit: 192,
        ..small()
    };
    let Some((train, test)) = data(cfg.limit, 200) else {
        return;
    };
    let ctx = ExecContext::new();
    let (full, _) = job::train_from(&ctx, &train, &test, &cfg, None, None, &mut |_| {}).unwrap();
    assert_eq!(full.losses.len(), 6);
    let path =
        std::env::temp_dir().join(format!("fucina-fashion-{}.safetensors", std::process::id()));
    let (head, snap) =
        job::train_from(&ctx, &train, &test, &cfg, None, Some(1), &mut |_| {}).unwrap();
    assert_eq!(snap.epoch, 1);
    job::save_checkpoint(&ctx, &path, &cfg, [28, 28], &snap).unwrap();
    let back = job::load_checkpoint(&ctx, &path, &cfg, [28, 28], 3).unwrap();
    assert!(back.model.names().any(|n| n == "bn1.running_mean"));
    let (tail, _) =
        job::train_from(&ctx, &train, &test, &cfg, Some(back), None, &mut |_| {}).unwrap();
    let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut joined = head.losses.clone();
    joined.extend(&tail.losses);
    assert_eq!(b(&joined), b(&full.losses));
    assert_eq!(b(&tail.accuracies), b(&full.accuracies[1..]));
    // A checkpoint of another configuration is refused, naming the flag.
    let other = TrainConfig { conv2: 8, ..cfg };
    let e = job::load_checkpoint(&ctx, &path, &other, [28, 28], 3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--conv2 16") && e.contains("--conv2 8"), "{e}");
    std::fs::remove_file(&path).ok();
}
