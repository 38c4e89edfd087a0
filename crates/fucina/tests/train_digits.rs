//! The `train_digits` job: the default run reaches 95% test accuracy, runs are
//! bit-identical for a seed and for every thread count, a run saved to a
//! checkpoint file and resumed continues bit-identically, and bad input (a
//! missing or corrupt data file, an unknown flag, a checkpoint that does not
//! belong to the run) is an error.

#[allow(dead_code)]
#[path = "../examples/train_digits/job.rs"]
mod job;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::Parser;
use fucina::nn::StateDict;
use fucina::{Error, ExecContext};
use job::{Args, Digits, TrainConfig, TrainReport};

fn digits() -> Digits {
    job::load_digits(Path::new(job::default_data_path())).unwrap()
}

fn run(threads: usize, cfg: &TrainConfig) -> TrainReport {
    let data = digits();
    let (train, test) = job::split(&data, cfg.seed).unwrap();
    let ctx = ExecContext::with_threads(threads);
    job::train_from(&ctx, &train, &test, cfg, None, None, &mut |_| {})
        .unwrap()
        .0
}

#[test]
fn the_shipped_data_set_loads_and_splits() {
    let d = digits();
    assert_eq!(d.len(), 1797);
    assert_eq!(d.x.len(), 1797 * 64);
    assert!(d.x.iter().all(|v| (0.0..=1.0).contains(v)));
    assert_eq!(d.y[..3], [0, 1, 2]);
    let (train, test) = job::split(&d, 5).unwrap();
    assert_eq!((train.len(), test.len()), (1437, 360));
    assert_eq!(job::split(&d, 5).unwrap(), (train.clone(), test.clone()));
    assert_ne!(job::split(&d, 6).unwrap().1, test);
    // Every image lands in exactly one part.
    let mut labels: Vec<i64> = train.y.iter().chain(&test.y).copied().collect();
    let mut all = d.y.clone();
    labels.sort();
    all.sort();
    assert_eq!(labels, all);
    // Bad indices and splits are errors naming them.
    let e = d.subset(&[0, 1797]).unwrap_err().to_string();
    assert!(
        e.contains("index 1797 is out of range for 1797 images"),
        "{e}"
    );
    assert!(d.subset(&[-1]).is_err());
    assert_eq!(d.subset(&[2, 0]).unwrap().y, [d.y[2], d.y[0]]);
    let e = d.split(5, 1797).unwrap_err().to_string();
    assert!(e.contains("1797 test images leave none of 1797"), "{e}");
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
    let svg = job::loss_svg(&report.losses, 45, 0);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 1);
    assert!(svg.contains(">0</text>") && svg.contains(">20</text>"));
    // A resumed run's curve is labelled from its first epoch.
    let resumed = job::loss_svg(&report.losses[10 * 45..], 45, 10);
    assert!(
        resumed.contains(">10</text>") && resumed.contains(">20</text>"),
        "{resumed}"
    );
    assert!(!resumed.contains(">0</text>"));
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
    // No images at all: an error of the library's reader itself.
    for (name, text) in [("empty", ""), ("blank", "\n  \n\n")] {
        let p = write_gz(name, text);
        let e = fucina::data::load_digits(&p).unwrap_err();
        assert!(matches!(e, Error::Data { .. }), "{e}");
        assert!(e.to_string().contains("holds no images"), "{e}");
        let _ = std::fs::remove_file(p);
    }
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
    let a = parse(&[
        "--save",
        "a.safetensors",
        "--resume",
        "b.safetensors",
        "--stop-after",
        "3",
    ])
    .unwrap();
    a.validate().unwrap();
    assert_eq!(a.save.as_deref(), Some(Path::new("a.safetensors")));
    assert_eq!(a.resume.as_deref(), Some(Path::new("b.safetensors")));
    assert_eq!(a.stop_after, Some(3));
    assert!(parse(&["--save"]).is_err(), "--save needs a path");
    for bad in [
        &["--stop-after", "0"][..],
        &["--epochs", "3", "--stop-after", "4"],
    ] {
        let e = parse(bad).unwrap().validate().unwrap_err();
        assert!(e.to_string().contains("--stop-after"), "{e}");
    }
    assert!(parse(&["--threads", "0"]).unwrap().validate().is_err());
    // The defaults decided at run time: every core, an SVG under the current
    // directory.
    let a = parse(&[]).unwrap();
    assert_eq!(a.threads, ExecContext::new().threads());
    assert_eq!(a.svg, Path::new("target/train_digits_loss.svg"));
    assert!(parse(&["--epochs", "0"]).unwrap().validate().is_err());
}

#[test]
fn a_resumed_run_continues_bit_identically() {
    let cfg = TrainConfig {
        epochs: 4,
        ..TrainConfig::default()
    };
    let data = digits();
    let (train, test) = job::split(&data, cfg.seed).unwrap();
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
        params: StateDict::from_entries(copy(&snap.params)).unwrap(),
        optimizer: StateDict::from_entries(copy(&snap.optimizer)).unwrap(),
    };
    let (second, end2) = job::train_from(
        &ctx,
        &train,
        &test,
        &cfg,
        Some(restored.clone()),
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
    let n = bad.params.len();
    bad.params = StateDict::from_entries(bad.params[..n - 1].to_vec()).unwrap();
    assert!(job::train_from(&ctx, &train, &test, &cfg, Some(bad), None, &mut |_| {}).is_err());
    let mut late = restored;
    late.epoch = 9;
    assert!(job::train_from(&ctx, &train, &test, &cfg, Some(late), None, &mut |_| {}).is_err());
}

/// A fresh directory under the system's temporary directory (removed on drop).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("fucina-ckpt-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The flags of a run (`train_digits` followed by `flags`).
fn args<S: AsRef<str>>(flags: &[S]) -> Args {
    let a = Args::try_parse_from(
        std::iter::once("train_digits").chain(flags.iter().map(AsRef::as_ref)),
    )
    .unwrap();
    a.validate().unwrap();
    a
}

/// What `main` does with the flags: load the resume point, train, save. Returns
/// the report and the bits of the final parameters and optimizer state (the
/// tensors themselves die with the run's context).
fn run_flags<S: AsRef<str>>(data: &Digits, flags: &[S]) -> fucina::Result<(TrainReport, Bits)> {
    let a = args(flags);
    let (train, test) = job::split(data, a.seed).unwrap();
    let ctx = ExecContext::with_threads(a.threads);
    let resume = job::resume_point(&ctx, &a, train.len())?;
    let (report, end) = job::run_job(&ctx, &a, &train, &test, resume, &mut |_| {})?;
    Ok((report, param_bits(&end)))
}

/// The bits of every tensor of a snapshot, by name.
type Bits = Vec<(String, Vec<u32>)>;

fn loss_bits(r: &TrainReport) -> Vec<u32> {
    r.losses.iter().map(|l| l.to_bits()).collect()
}

fn param_bits(s: &job::Snapshot) -> Bits {
    s.params
        .iter()
        .chain(&s.optimizer)
        .map(|(n, t)| (n.clone(), t.to_vec().iter().map(|v| v.to_bits()).collect()))
        .collect()
}

#[test]
fn a_run_saved_to_a_file_and_resumed_is_bit_identical() {
    let data = digits();
    let dir = TempDir::new("resume");
    let (mid, end_a, end_b) = (
        dir.path("mid.safetensors"),
        dir.path("a.st"),
        dir.path("b.st"),
    );
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    let common = ["--epochs", "4", "--hidden", "32", "--seed", "3"];
    let with = |extra: &[&str]| -> Vec<String> {
        common.iter().chain(extra).map(|f| f.to_string()).collect()
    };

    // The uninterrupted run, saved at the end.
    let whole_flags = with(&["--save", &s(&end_a)]);
    let (whole, whole_end) = run_flags(&data, &whole_flags).unwrap();
    // Stopped after epoch 2 and saved; then resumed from the file (two threads:
    // the thread count is not part of the run's identity).
    let first_flags = with(&["--stop-after", "2", "--save", &s(&mid)]);
    let (first, _) = run_flags(&data, &first_flags).unwrap();
    let second_flags = with(&["--resume", &s(&mid), "--save", &s(&end_b), "--threads", "2"]);
    let (second, resumed_end) = run_flags(&data, &second_flags).unwrap();

    assert_eq!(first.losses.len(), 2 * 45);
    assert_eq!(second.losses.len(), 2 * 45);
    let mut joined = loss_bits(&first);
    joined.extend(loss_bits(&second));
    assert_eq!(joined, loss_bits(&whole), "losses of the resumed run");
    assert_eq!(resumed_end, whole_end, "final parameters");
    assert_eq!(second.test_accuracy, whole.test_accuracy);
    // Equal states give byte-identical checkpoint files.
    assert_eq!(
        std::fs::read(&end_a).unwrap(),
        std::fs::read(&end_b).unwrap()
    );

    // The checkpoint holds what the job promises, under stable names.
    let ctx = ExecContext::new();
    let (tensors, meta) = fucina::checkpoint::read(&ctx, &mid).unwrap();
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.contains(&"model.fc1.weight") && names.contains(&"optim.exp_avg_sq.3"),
        "{names:?}"
    );
    assert_eq!(names.len(), 4 + 9);
    assert_eq!(meta.get("epoch"), Some("2"));
    assert_eq!(meta.get("hidden"), Some("32"));
    assert_eq!(meta.get("format"), Some(job::CHECKPOINT_FORMAT));

    // A finished run resumed trains nothing more and ends where it was.
    let (none, same) = run_flags(&data, &with(&["--resume", &s(&end_a)])).unwrap();
    assert!(none.losses.is_empty());
    assert_eq!(same, whole_end);
    // --stop-after must lie after the checkpoint.
    let e = run_flags(&data, &with(&["--resume", &s(&mid), "--stop-after", "2"])).unwrap_err();
    assert!(e.to_string().contains("--stop-after 2 is not later"), "{e}");
}

/// The `--resume` error for `flags`, as a string.
fn resume_error(data: &Digits, flags: &[&str]) -> Error {
    match run_flags(data, flags) {
        Ok(_) => panic!("resuming with {flags:?} should fail"),
        Err(e) => e,
    }
}

#[test]
fn a_checkpoint_of_another_configuration_is_refused() {
    let data = digits();
    let dir = TempDir::new("config");
    let ck = dir.path("w32.safetensors");
    let ck_s = ck.to_str().unwrap();
    run_flags(
        &data,
        &[
            "--epochs",
            "2",
            "--stop-after",
            "1",
            "--hidden",
            "32",
            "--save",
            ck_s,
        ],
    )
    .unwrap();
    // A wrong model width, and every other configuration flag.
    for (flags, want) in [
        (
            &["--epochs", "2", "--hidden", "64"][..],
            "--hidden 32, this run has --hidden 64",
        ),
        (
            &["--epochs", "3", "--hidden", "32"],
            "--epochs 2, this run has --epochs 3",
        ),
        (
            &["--epochs", "2", "--hidden", "32", "--seed", "1"],
            "--seed 0, this run has --seed 1",
        ),
        (
            &["--epochs", "2", "--hidden", "32", "--lr", "0.02"],
            "--lr 0.01, this run has --lr 0.02",
        ),
        (
            &["--epochs", "2", "--hidden", "32", "--batch", "16"],
            "--batch 32, this run has --batch 16",
        ),
    ] {
        let mut f = flags.to_vec();
        f.extend(["--resume", ck_s]);
        let e = resume_error(&data, &f);
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    what: "--resume",
                    ..
                }
            ),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains(want) && msg.contains(ck_s), "{msg}");
    }
    let ctx = ExecContext::new();
    let (tensors, meta) = fucina::checkpoint::read(&ctx, &ck).unwrap();
    let meta: Vec<(&str, &str)> = meta.iter().collect();
    let resave = |name: &str, tensors: &[(String, fucina::Tensor)], meta: &[(&str, &str)]| {
        let path = dir.path(name);
        let refs: Vec<(&str, &fucina::Tensor)> =
            tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        fucina::checkpoint::save(&path, &refs, meta).unwrap();
        path.to_str().unwrap().to_string()
    };
    let resume = |path: &str| {
        resume_error(
            &data,
            &["--epochs", "2", "--hidden", "32", "--resume", path],
        )
        .to_string()
    };
    // The metadata says width 32 but a tensor has another shape.
    let mut wrong = tensors.clone();
    let i = wrong
        .iter()
        .position(|(n, _)| n == "model.fc1.bias")
        .unwrap();
    wrong[i].1 = fucina::Tensor::zeros(&ctx, &[31]).unwrap();
    let e = resume(&resave("shape.st", &wrong, &meta));
    assert!(
        e.contains("does not match the model 64-32-10") && e.contains("fc1.bias"),
        "{e}"
    );
    // A missing parameter, a missing optimizer entry, an unexpected tensor.
    let without = |name: &str| -> Vec<(String, fucina::Tensor)> {
        tensors.iter().filter(|(n, _)| n != name).cloned().collect()
    };
    let e = resume(&resave("noparam.st", &without("model.fc2.weight"), &meta));
    assert!(e.contains("missing parameter \"fc2.weight\""), "{e}");
    let e = resume(&resave("nomoment.st", &without("optim.exp_avg.1"), &meta));
    assert!(
        e.contains("optimizer state") && e.contains("exp_avg.1"),
        "{e}"
    );
    let e = resume(&resave("nostate.st", &without("optim.step"), &meta));
    assert!(e.contains("step"), "{e}");
    let mut extra = tensors.clone();
    extra.push((
        "stray".to_string(),
        fucina::Tensor::zeros(&ctx, &[1]).unwrap(),
    ));
    let e = resume(&resave("extra.st", &extra, &meta));
    assert!(e.contains("unexpected tensor `stray`"), "{e}");
    // An optimizer state without its moments: no step count to match the epoch.
    let params_only: Vec<_> = tensors
        .iter()
        .filter(|(n, _)| n.starts_with("model."))
        .cloned()
        .collect();
    let e = resume(&resave("paramsonly.st", &params_only, &meta));
    assert!(
        e.contains("taken 0 steps, but epoch 1 ends at step 45"),
        "{e}"
    );
    // Metadata: another format, an epoch past the run.
    let other: Vec<(&str, &str)> = meta
        .iter()
        .map(|&(k, v)| if k == "format" { (k, "other") } else { (k, v) })
        .collect();
    let e = resume(&resave("format.st", &tensors, &other));
    assert!(e.contains("not a train_digits checkpoint"), "{e}");
    let late: Vec<(&str, &str)> = meta
        .iter()
        .map(|&(k, v)| if k == "epoch" { (k, "7") } else { (k, v) })
        .collect();
    let e = resume(&resave("late.st", &tensors, &late));
    assert!(e.contains("`epoch` metadata"), "{e}");
}

#[test]
fn a_corrupt_or_missing_checkpoint_file_is_an_error() {
    let data = digits();
    let dir = TempDir::new("corrupt");
    let ck = dir.path("ck.safetensors");
    let ck_s = ck.to_str().unwrap();
    let flags = ["--epochs", "2", "--hidden", "16"];
    let with = |extra: &[&str]| -> Vec<String> {
        flags.iter().chain(extra).map(|f| f.to_string()).collect()
    };
    let run = |v: Vec<String>| run_flags(&data, &v);
    run(with(&["--stop-after", "1", "--save", ck_s])).unwrap();
    let good = std::fs::read(&ck).unwrap();
    let checkpoint_error = |bytes: &[u8], name: &str| -> String {
        let p = dir.path(name);
        std::fs::write(&p, bytes).unwrap();
        match run(with(&["--resume", p.to_str().unwrap()])) {
            Err(e @ Error::Checkpoint(_)) => e.to_string(),
            other => panic!(
                "{name}: expected a checkpoint error, got {:?}",
                other.map(|_| ())
            ),
        }
    };
    // Truncated in the data, in the header, in the length prefix; garbage.
    let e = checkpoint_error(&good[..good.len() - 3], "cut-data.st");
    assert!(e.contains("not a valid safetensors checkpoint"), "{e}");
    checkpoint_error(&good[..40], "cut-header.st");
    checkpoint_error(&good[..5], "cut-prefix.st");
    checkpoint_error(b"definitely not a checkpoint", "garbage.st");
    // A flipped byte in the header's JSON.
    let mut flipped = good.clone();
    flipped[9] = b'#';
    checkpoint_error(&flipped, "flipped.st");
    // A missing file names the path.
    let missing = dir.path("nope.safetensors");
    let e = match run(with(&["--resume", missing.to_str().unwrap()])) {
        Err(e @ Error::Checkpoint(_)) => e.to_string(),
        other => panic!("expected a checkpoint error, got {:?}", other.map(|_| ())),
    };
    assert!(e.contains("nope.safetensors"), "{e}");
    // The intact file still resumes.
    let (report, _) = run(with(&["--resume", ck_s])).unwrap();
    assert_eq!(report.losses.len(), 45);
    // Saving into a directory that does not exist is an error too.
    let bad_dir = dir.path("no/such/dir/ck.st");
    let e = run(with(&["--save", bad_dir.to_str().unwrap()]))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
}
