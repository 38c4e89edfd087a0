//! Multi-rank tests: the crate's examples run under `mpirun` with 1, 2 and 4
//! ranks (oversubscribed on small machines). Skipped, saying so, when `mpirun`
//! is not on the PATH, unless `FUCINA_REQUIRE_MPI` is set (to anything but
//! `0`): then a missing `mpirun` fails them. `.ci/run` sets it where it has
//! Open MPI (installed or found), so CI cannot pass by silently skipping them.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The variable that turns a missing `mpirun` from a skip into a failure.
const REQUIRE_VAR: &str = "FUCINA_REQUIRE_MPI";

/// Whether `mpirun` runs; prints why the test is skipped when it does not.
///
/// # Panics
/// When it does not and [`REQUIRE_VAR`] is set (to anything but `0`).
fn have_mpirun() -> bool {
    let ok = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let required = std::env::var_os(REQUIRE_VAR).is_some_and(|v| !v.is_empty() && v != "0");
    if !ok && required {
        panic!(
            "{REQUIRE_VAR} is set but mpirun does not run (not on the PATH?): the multi-rank \
             tests must run here (install openmpi-bin and libopenmpi-dev, or unset {REQUIRE_VAR})"
        );
    }
    if !ok {
        eprintln!("SKIPPED: mpirun is not on the PATH (install openmpi-bin and libopenmpi-dev)");
    }
    ok
}

/// The variable under which [`a_missing_mpirun_fails_when_mpi_is_required`]
/// re-runs this binary (its child runs one MPI test, without `mpirun`).
const CHILD_VAR: &str = "FUCINA_MPI_TEST_CHILD";

/// One MPI test of this binary, run in a child process whose `PATH` holds no
/// `mpirun`, with [`REQUIRE_VAR`] set to `require` (or unset): its output.
fn run_without_mpirun(require: Option<&str>) -> Output {
    let empty = std::env::temp_dir().join(format!("fucina-no-mpirun-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("an empty directory");
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.args([
        "api_paths_agree_with_the_local_reference",
        "--exact",
        "--nocapture",
    ])
    .env("PATH", &empty)
    .env(CHILD_VAR, "1")
    .env_remove(REQUIRE_VAR);
    if let Some(v) = require {
        cmd.env(REQUIRE_VAR, v);
    }
    let out = run(cmd, Duration::from_secs(60));
    let _ = std::fs::remove_dir(&empty);
    out
}

#[test]
fn a_missing_mpirun_fails_when_mpi_is_required() {
    if std::env::var_os(CHILD_VAR).is_some() {
        return;
    }
    let text = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    for require in ["1", "yes"] {
        let out = run_without_mpirun(Some(require));
        assert!(
            !out.status.success(),
            "{REQUIRE_VAR}={require}, no mpirun: the MPI test passed\n{}",
            text(&out)
        );
        assert!(
            text(&out).contains("FUCINA_REQUIRE_MPI is set but mpirun does not run"),
            "{}",
            text(&out)
        );
    }
    // Not required: a skip, said out loud, and a pass.
    for require in [None, Some("0"), Some("")] {
        let out = run_without_mpirun(require);
        assert!(out.status.success(), "{require:?}: {}", text(&out));
        assert!(text(&out).contains("SKIPPED: mpirun"), "{}", text(&out));
        assert!(text(&out).contains("1 passed"), "{}", text(&out));
    }
}

/// An example of this crate, built by `cargo test` beside the test binaries
/// (`target/<profile>/examples/<name>`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p fucina-dist --examples`",
        path.display()
    );
    path
}

/// Runs `cmd`, killing it after `limit` (a hang is a failure).
fn run(mut cmd: Command, limit: Duration) -> Output {
    let shown = format!("{cmd:?}");
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{shown}: {e}"));
    let id = child.id();
    let start = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    while !waiter.is_finished() {
        if start.elapsed() > limit {
            let _ = Command::new("kill").arg("-9").arg(id.to_string()).status();
            panic!("{shown} did not finish within {limit:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    waiter.join().expect("waiter").expect("wait")
}

fn mpirun(np: usize, exe: &PathBuf, args: &[&str]) -> Output {
    // A session directory of its own: Open MPI 4.1 fails at start-up ("mkdir
    // ... File exists") when two jobs create the shared one at the same time.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run_id = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = std::env::temp_dir().join(format!(
        "fucina-dist-mpirun-{}-{run_id}",
        std::process::id()
    ));
    std::fs::create_dir_all(&tmp).expect("a temporary directory");
    let mut cmd = Command::new("mpirun");
    cmd.env("TMPDIR", &tmp);
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .arg(exe)
        .args(args)
        // Several ranks per core: yield while waiting instead of spinning.
        .env("OMPI_MCA_mpi_yield_when_idle", "1");
    let out = run(cmd, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&tmp);
    out
}

/// The `epoch ...` and `params ...` lines of a training run (it must succeed).
fn result_lines(out: &Output, what: &str) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with("epoch ") || l.starts_with("params "))
        .map(str::to_string)
        .collect();
    assert!(
        lines.last().is_some_and(|l| l.starts_with("params ")),
        "{what}: no params line in\n{stdout}"
    );
    lines
}

/// Shared arguments, then `(ranks, extra arguments)` per run.
type Config<'a> = (&'a [&'a str], &'a [(usize, &'a [&'a str])]);

#[test]
fn training_is_bit_identical_for_1_2_4_ranks_and_one_process() {
    if !have_mpirun() {
        return;
    }
    let exe = example("train_digits_dist");
    // Two configurations: 8 microbatches (even over 1, 2, 4 ranks), and 6
    // (uneven over 4: 1, 2, 1, 2), small buckets and no overlap at 2 ranks.
    let configs: [Config; 2] = [
        (
            &[
                "--epochs",
                "2",
                "--steps",
                "4",
                "--seed",
                "3",
                "--threads",
                "1",
            ],
            &[
                (1, &[]),
                (2, &[]),
                (4, &[]),
                (2, &["--no-overlap", "--bucket-bytes", "4096"]),
            ],
        ),
        (
            &[
                "--epochs",
                "2",
                "--steps",
                "3",
                "--seed",
                "11",
                "--threads",
                "1",
                "--batch",
                "96",
                "--microbatches",
                "6",
                "--hidden",
                "24",
            ],
            &[(4, &[]), (2, &["--bucket-bytes", "1000"])],
        ),
    ];
    for (base, runs) in configs {
        let mut local = Command::new(&exe);
        local.arg("--local").args(base);
        let want = result_lines(&run(local, Duration::from_secs(60)), "--local");
        assert_eq!(want.len(), 3, "{want:?}");
        for (np, extra) in runs {
            let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
            let got = result_lines(&mpirun(*np, &exe, &args), &format!("-np {np} {args:?}"));
            assert_eq!(
                got, want,
                "mpirun -np {np} {args:?} differs from the one-process run"
            );
        }
    }
}

#[test]
fn api_paths_agree_with_the_local_reference() {
    if !have_mpirun() {
        return;
    }
    let exe = example("dist_checks");
    for np in [1, 2, 4] {
        let out = mpirun(np, &exe, &["api"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "-np {np} api failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with("ok ")).count(),
            10,
            "{stdout}"
        );
    }
}

#[test]
fn mismatched_shapes_are_reported_on_every_rank() {
    if !have_mpirun() {
        return;
    }
    let out = mpirun(2, &example("dist_checks"), &["mismatch"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    for rank in 0..2 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("rank {rank}: error:")))
            .unwrap_or_else(|| panic!("rank {rank} reported no error:\n{stdout}"));
        assert!(line.contains("rank(s) [1] differ from rank 0"), "{line}");
        assert!(line.contains("[5, 7]"), "{line}");
    }
    assert!(
        stdout.contains("this rank (1) has microbatches 8, parameters [5, 6]"),
        "{stdout}"
    );
}

#[test]
fn an_error_on_one_rank_aborts_the_job() {
    if !have_mpirun() {
        return;
    }
    let out = mpirun(2, &example("dist_checks"), &["fail"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("rank 1 of 2: microbatch 4 failed: cross_entropy"),
        "{stderr}"
    );
    // (mpirun's own MPI_ABORT notice is not asserted: Open MPI 4.1 sometimes
    // loses it when several jobs run at once.)
    assert!(
        !stdout.contains("step returned"),
        "a rank went on: {stdout}"
    );
}
