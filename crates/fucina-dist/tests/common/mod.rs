//! Helpers of the multi-rank tests: find `mpirun` (or skip, or fail when
//! `FUCINA_REQUIRE_MPI` is set), run the crate's examples under it with a time
//! limit, and pick the result lines of a training run.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The variable that turns a missing `mpirun` from a skip into a failure.
pub(crate) const REQUIRE_VAR: &str = "FUCINA_REQUIRE_MPI";

/// Whether `mpirun` runs; prints why the test is skipped when it does not.
///
/// # Panics
/// When it does not and [`REQUIRE_VAR`] is set (to anything but `0`).
pub(crate) fn have_mpirun() -> bool {
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

/// An example of this crate, built by `cargo test` beside the test binaries
/// (`target/<profile>/examples/<name>`).
pub(crate) fn example(name: &str) -> PathBuf {
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
pub(crate) fn run(mut cmd: Command, limit: Duration) -> Output {
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

/// A temporary directory of this test process, named by `tag`.
pub(crate) fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fucina-dist-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("a temporary directory");
    d
}

/// `mpirun -np {np} {exe} {args}` as a command (oversubscribed, ranks yield
/// while they wait), with the session directory under `session`: Open MPI 4.1
/// fails at start-up ("mkdir ... File exists") when two jobs create the
/// shared one at the same time.
pub(crate) fn mpirun_command(np: usize, exe: &Path, args: &[&str], session: &Path) -> Command {
    mpirun_mca_command(np, &[], exe, args, session)
}

/// [`mpirun_command`] with MPI options (`mca`) before the executable.
pub(crate) fn mpirun_mca_command(
    np: usize,
    mca: &[&str],
    exe: &Path,
    args: &[&str],
    session: &Path,
) -> Command {
    std::fs::create_dir_all(session).expect("a session directory");
    let mut cmd = Command::new("mpirun");
    cmd.env("TMPDIR", session)
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .args(mca)
        .arg(exe)
        .args(args)
        // Several ranks per core: yield while waiting instead of spinning.
        .env("OMPI_MCA_mpi_yield_when_idle", "1");
    cmd
}

/// Runs `mpirun -np {np} {exe} {args}` to its end (at most 60 s).
pub(crate) fn mpirun(np: usize, exe: &Path, args: &[&str]) -> Output {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run_id = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let session = temp_dir(&format!("mpirun-{run_id}"));
    let out = run(
        mpirun_command(np, exe, args, &session),
        Duration::from_secs(60),
    );
    let _ = std::fs::remove_dir_all(&session);
    out
}

/// The `epoch ...` and `params ...` lines of a training run (it must succeed
/// and end with a `params` line).
pub(crate) fn result_lines(out: &Output, what: &str) -> Vec<String> {
    lines_starting(out, what, &["epoch ", "params "], "params ")
}

/// The stdout lines of a run that start with one of `prefixes` (it must
/// succeed, and its last such line start with `last`).
pub(crate) fn lines_starting(
    out: &Output,
    what: &str,
    prefixes: &[&str],
    last: &str,
) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = stdout
        .lines()
        .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
        .map(str::to_string)
        .collect();
    assert!(
        lines.last().is_some_and(|l| l.starts_with(last)),
        "{what}: no {last:?} line in\n{stdout}"
    );
    lines
}
