//! The `train_digits` job: the default run reaches 95% test accuracy, runs are
//! bit-identical for a seed and for every thread count, and bad input (a missing
//! or corrupt data file, an unknown flag, checkpoint flags) is an error.

#[allow(dead_code)]
#[path = "../examples/train_digits/job.rs"]
mod job;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::Parser;
use fucina::{Error, ExecContext};
use job::{Args, Digits, TrainConfig, TrainReport};

fn digits() -> Digits {
    job::load_digits(Path::new(job::default_data_path())).unwrap()
}

fn run(threads: usize, cfg: &TrainConfig) -> TrainReport {
    let data = digits();
    let (train, test) = job::split(&data, cfg.seed);
    let ctx = ExecContext::with_threads(threads);
    job::train(&ctx, &train, &test, cfg, &mut |_| {}).unwrap()
}

#[test]
fn the_shipped_data_set_loads_and_splits() {
    let d = digits();
    assert_eq!(d.len(), 1797);
    assert_eq!(d.x.len(), 1797 * 64);
    assert!(d.x.iter().all(|v| (0.0..=1.0).contains(v)));
    assert_eq!(d.y[..3], [0, 1, 2]);
    let (train, test) = job::split(&d, 5);
    assert_eq!((train.len(), test.len()), (1437, 360));
    assert_eq!(job::split(&d, 5), (train.clone(), test.clone()));
    assert_ne!(job::split(&d, 6).1, test);
    // Every image lands in exactly one part.
    let mut labels: Vec<i64> = train.y.iter().chain(&test.y).copied().collect();
    let mut all = d.y.clone();
    labels.sort();
    all.sort();
    assert_eq!(labels, all);
}

#[test]
fn the_default_run_reaches_95_percent() {
    let cfg = TrainConfig::default();
    let report = run(1, &cfg);
    assert_eq!(
        report.losses.len(),
        cfg.epochs * 1437usize.div_ceil(cfg.batch)
    );
    assert!(
        report.test_accuracy >= 0.95,
        "test accuracy {}",
        report.test_accuracy
    );
    let (first, last) = (report.losses[0], *report.losses.last().unwrap());
    assert!(first > 2.0 && last < 0.2, "loss {first} -> {last}");
    // The pool serves the steady state: misses stay a handful.
    assert!(report.pool.misses < 100, "{:?}", report.pool);
    let svg = job::loss_svg(&report.losses, 45);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 1);
}

#[test]
fn same_seed_same_losses_for_every_thread_count() {
    let cfg = TrainConfig {
        epochs: 2,
        batch: 128,
        hidden: 256,
        ..TrainConfig::default()
    };
    let bits = |r: &TrainReport| r.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    let a = run(1, &cfg);
    let b = run(1, &cfg);
    let c = run(2, &cfg);
    assert_eq!(bits(&a), bits(&b), "same seed, same losses");
    assert_eq!(bits(&a), bits(&c), "one thread and two threads");
    assert_eq!(a.test_accuracy, c.test_accuracy);
    let d = run(1, &TrainConfig { seed: 1, ..cfg });
    assert_ne!(bits(&a), bits(&d), "another seed, another run");
}

fn write_gz(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "fucina-digits-{}-{name}.csv.gz",
        std::process::id()
    ));
    let mut e = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::fast(),
    );
    e.write_all(text.as_bytes()).unwrap();
    e.finish().unwrap();
    path
}

fn data_error(path: &Path) -> String {
    match job::load_digits(path) {
        Err(e @ Error::Data { .. }) => e.to_string(),
        other => panic!("expected a data error, got {other:?}"),
    }
}

#[test]
fn missing_or_corrupt_data_files_are_errors() {
    let e = data_error(Path::new("/nonexistent/digits.csv.gz"));
    assert!(
        e.contains("/nonexistent/digits.csv.gz") && e.contains("cannot open"),
        "{e}"
    );
    // Not gzip at all.
    let raw = std::env::temp_dir().join(format!("fucina-digits-{}-raw.csv.gz", std::process::id()));
    std::fs::write(&raw, "0,1,2\n").unwrap();
    assert!(data_error(&raw).contains("gzip"));
    // Truncated gzip.
    let full = std::fs::read(job::default_data_path()).unwrap();
    let cut = std::env::temp_dir().join(format!("fucina-digits-{}-cut.csv.gz", std::process::id()));
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    assert!(data_error(&cut).contains("gzip"));
    // Wrong field counts, values, labels; too few images.
    let row = |label: &str| format!("{}{label}\n", "0,".repeat(64));
    let p = write_gz("fields", "1,2,3\n");
    assert!(data_error(&p).contains("line 1: 3 fields"));
    let p = write_gz("label", &format!("{}{}", row("3"), row("12")));
    assert!(data_error(&p).contains("line 2, field 65: label 12"));
    let p = write_gz("nan", &row("x"));
    assert!(data_error(&p).contains("is not a number"));
    let p = write_gz("pixel", &format!("17,{}", &row("1")[2..]));
    assert!(data_error(&p).contains("pixel 17"));
    let p = write_gz("short", &row("1").repeat(10));
    assert!(data_error(&p).contains("10 images"));
    for f in [raw, cut] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn flags() {
    let parse =
        |a: &[&str]| Args::try_parse_from(std::iter::once("train_digits").chain(a.iter().copied()));
    assert!(parse(&["--bogus"]).is_err());
    assert!(parse(&["--epochs", "many"]).is_err());
    let a = parse(&["--threads", "2", "--epochs", "3", "--seed", "9"]).unwrap();
    assert_eq!((a.threads, a.epochs, a.seed), (2, 3, 9));
    a.validate().unwrap();
    assert_eq!(
        a.config(),
        TrainConfig {
            epochs: 3,
            seed: 9,
            ..TrainConfig::default()
        }
    );
    let e = parse(&["--save", "ck.safetensors"])
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("checkpoints"), "{e}");
    assert!(
        parse(&["--resume", "ck.safetensors"])
            .unwrap()
            .validate()
            .is_err()
    );
    assert!(parse(&["--threads", "0"]).unwrap().validate().is_err());
    assert!(parse(&["--epochs", "0"]).unwrap().validate().is_err());
}

#[test]
fn a_resumed_run_continues_bit_identically() {
    let cfg = TrainConfig {
        epochs: 4,
        ..TrainConfig::default()
    };
    let data = digits();
    let (train, test) = job::split(&data, cfg.seed);
    let ctx = ExecContext::with_threads(1);
    let bits = |l: &[f32]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let (whole, end) = job::train_from(&ctx, &train, &test, &cfg, None, None, &mut |_| {}).unwrap();
    let (first, snap) =
        job::train_from(&ctx, &train, &test, &cfg, None, Some(2), &mut |_| {}).unwrap();
    assert_eq!(snap.epoch, 2);
    // Resume from copies (what a checkpoint file would give back).
    let copy = |v: &[(String, fucina::Tensor)]| -> Vec<(String, fucina::Tensor)> {
        v.iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    fucina::Tensor::from_slice(&ctx, t.shape(), &t.to_vec()).unwrap(),
                )
            })
            .collect()
    };
    let restored = job::Snapshot {
        epoch: 2,
        params: copy(&snap.params),
        optimizer: copy(&snap.optimizer),
    };
    let (second, end2) = job::train_from(
        &ctx,
        &train,
        &test,
        &cfg,
        Some(&restored),
        None,
        &mut |_| {},
    )
    .unwrap();
    let joined: Vec<f32> = first.losses.iter().chain(&second.losses).copied().collect();
    assert_eq!(bits(&joined), bits(&whole.losses));
    assert_eq!(second.test_accuracy, whole.test_accuracy);
    for ((n, a), (m, b)) in end.params.iter().zip(&end2.params) {
        assert_eq!(n, m);
        assert_eq!(bits(&a.to_vec()), bits(&b.to_vec()), "{n}");
    }
    // A snapshot that does not fit is an error.
    let mut bad = restored.clone();
    bad.params.pop();
    assert!(job::train_from(&ctx, &train, &test, &cfg, Some(&bad), None, &mut |_| {}).is_err());
    let mut late = restored;
    late.epoch = 9;
    assert!(job::train_from(&ctx, &train, &test, &cfg, Some(&late), None, &mut |_| {}).is_err());
}
