//! Multi-rank tests: the crate's examples run under `mpirun` with 1, 2 and 4
//! ranks (oversubscribed on small machines). Skipped, saying so, when `mpirun`
//! is not on the PATH, unless `FUCINA_REQUIRE_MPI` is set (to anything but
//! `0`): then a missing `mpirun` fails them. `.ci/run` sets it where it has
//! Open MPI (installed or found), so CI cannot pass by silently skipping them.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{
    REQUIRE_VAR, example, have_mpirun, mpirun, mpirun_mca_command, result_lines, run, temp_dir,
};

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
    // The default reduction is the tree at 1, 2 and 4 ranks; the allgather
    // path (and 3 ranks, which only it can use) gives the same lines.
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
                (2, &["--reduction", "allgather"]),
                (4, &["--reduction", "allgather", "--bucket-bytes", "4096"]),
                (3, &["--reduction", "allgather"]),
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
            &[
                (4, &["--reduction", "tree"]),
                (2, &["--bucket-bytes", "1000"]),
                (4, &["--reduction", "allgather"]),
            ],
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

/// `dist_checks reductions` at `np` ranks: its output (it must succeed and
/// finish its checks).
fn reductions(np: usize) -> String {
    let out = mpirun(np, &example("dist_checks"), &["reductions"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("ok reductions done"),
        "-np {np} reductions failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn tree_and_allgather_match_the_one_process_run_and_the_tree_moves_ring_volume() {
    if !have_mpirun() {
        return;
    }
    for np in [1, 2, 4] {
        let stdout = reductions(np);
        // Tree, Allgather and Auto for 8, 7 and 6 microbatches, two bucket
        // sizes each: every one the same bits as the one-process run.
        let ok = stdout.lines().filter(|l| l.starts_with("ok m ")).count();
        assert_eq!(ok, 18, "-np {np}:\n{stdout}");
        for line in stdout.lines().filter(|l| l.starts_with("bytes ")) {
            // bytes m M ranks N Tree T Allgather A ring R
            let f: Vec<&str> = line.split(' ').collect();
            let num = |key: &str| -> u64 {
                let i = f.iter().position(|&w| w == key).expect(key);
                f[i + 1].parse().expect("a count")
            };
            let (tree, gather, ring) = (num("Tree"), num("Allgather"), num("ring"));
            if np == 1 {
                assert_eq!((tree, gather, ring), (0, 0, 0), "{line}");
            } else {
                assert!(tree as f64 <= 1.25 * ring as f64, "{line}");
                assert!(gather > 2 * tree, "{line}");
            }
        }
    }
}

#[test]
fn the_tree_refuses_a_rank_count_it_cannot_split() {
    if !have_mpirun() {
        return;
    }
    let stdout = reductions(3);
    for m in [8, 7, 6] {
        assert!(
            stdout.contains(&format!("ok m {m}: Tree refuses 3 ranks")),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("ok m {m}: Allgather (Allgather,"))
                && stdout.contains(&format!("ok m {m}: Auto (Allgather,")),
            "{stdout}"
        );
    }
    // The error says what to do.
    let out = mpirun(
        3,
        &example("reduce_sim"),
        &[
            "--params",
            "100",
            "--microbatches",
            "8",
            "--reduction",
            "tree",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("refused: Reduction::Tree cannot split 8 microbatches over 3 ranks")
            && stdout.contains("Reduction::Allgather"),
        "{stdout}"
    );
}

/// Bytes each rank received (by Open MPI's `monitoring` PML) in a run of
/// `reduce_sim` with `args` at `np` ranks.
fn measured(np: usize, args: &[&str], dir: &std::path::Path) -> (Vec<u64>, String) {
    std::fs::create_dir_all(dir).expect("a directory");
    let prefix = dir.join("prof");
    let prefix = prefix.to_str().expect("a UTF-8 path");
    let mut all: Vec<&str> = vec![
        "--mca",
        "pml_monitoring_enable",
        "1",
        "--mca",
        "pml_monitoring_enable_output",
        "3",
        "--mca",
        "pml_monitoring_filename",
        prefix,
    ];
    all.extend_from_slice(args);
    // (mpirun takes the --mca options before the executable: see mpirun_mca)
    let out = mpirun_mca(np, &example("reduce_sim"), &all[..9], &all[9..]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains(" bits ok "),
        "reduce_sim -np {np} {args:?}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut recv = vec![0u64; np];
    for r in 0..np {
        let file = dir.join(format!("prof.{r}.prof"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (Open MPI's monitoring PML wrote no report)",
                file.display()
            )
        });
        // E <from> <to> <n> bytes ...: point-to-point bytes sent.
        for line in text.lines().filter(|l| l.starts_with("E\t")) {
            let f: Vec<&str> = line.split('\t').collect();
            let to: usize = f[2].parse().expect("a rank");
            let bytes: u64 = f[3]
                .split(' ')
                .next()
                .and_then(|b| b.parse().ok())
                .expect("a byte count");
            recv[to] += bytes;
        }
    }
    (recv, stdout)
}

/// [`mpirun`] with MPI options before the executable.
fn mpirun_mca(np: usize, exe: &Path, mca: &[&str], args: &[&str]) -> Output {
    let session = temp_dir("mca");
    let out = run(
        mpirun_mca_command(np, mca, exe, args, &session),
        Duration::from_secs(60),
    );
    let _ = std::fs::remove_dir_all(&session);
    out
}

#[test]
fn tree_traffic_measured_by_open_mpi_is_within_a_quarter_of_a_ring() {
    if !have_mpirun() {
        return;
    }
    let base = std::env::temp_dir().join(format!("fucina-dist-monitor-{}", std::process::id()));
    for np in [2, 4] {
        for reduction in ["tree", "allgather"] {
            // The setup's traffic (broadcast, shape checks) cancels in the
            // difference between 3 steps and 1.
            let run = |steps: &str| {
                let dir = base.join(format!("{np}-{reduction}-{steps}"));
                let args = [
                    "--params",
                    "6000",
                    "--microbatches",
                    "8",
                    "--reduction",
                    reduction,
                    "--steps",
                    steps,
                ];
                measured(np, &args, &dir)
            };
            let (one, _) = run("1");
            let (three, stdout) = run("3");
            let field = |line: &str, key: &str| -> u64 {
                let f: Vec<&str> = line.split(' ').collect();
                let i = f.iter().position(|&w| w == key).expect(key);
                f[i + 1].parse().expect("a count")
            };
            let sim = stdout
                .lines()
                .find(|l| l.starts_with("sim "))
                .expect("sim line");
            let ring = field(sim, "ring");
            assert_eq!(ring, 2 * (np as u64 - 1) * 6000 * 4 / np as u64, "{sim}");
            for r in 0..np {
                let per_step = (three[r] - one[r]) / 2;
                let line = stdout
                    .lines()
                    .find(|l| l.starts_with(&format!("rank {r} ")))
                    .expect("a rank line");
                assert_eq!(
                    per_step,
                    field(line, "bytes_per_step"),
                    "-np {np} {reduction} rank {r}: measured against reported"
                );
                if reduction == "tree" {
                    assert!(
                        per_step as f64 <= 1.25 * ring as f64,
                        "-np {np} rank {r}: {per_step} bytes per step against a ring's {ring}"
                    );
                } else {
                    assert!(per_step >= 4 * ring / 2, "-np {np} rank {r}: {per_step}");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&base);
}
