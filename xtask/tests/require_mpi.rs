//! `FUCINA_REQUIRE_MPI` turns a missing MPI from a skip into a failure of
//! `cargo xtask ci` (`.ci/run` sets it where it has Open MPI).

use std::process::{Command, Output};

/// `xtask ci` with `FUCINA_REQUIRE_MPI=require`, a PATH without `mpirun` or
/// `mpicc`, and no `cargo` to run (no step can do anything).
fn ci_without_mpi(require: &str) -> Output {
    let empty = std::env::temp_dir().join(format!("xtask-no-mpi-{}-{require}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("ci")
        .env("PATH", &empty)
        .env("CARGO", empty.join("no-cargo"))
        .env("FUCINA_REQUIRE_MPI", require)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&empty);
    out
}

#[test]
fn ci_fails_before_its_first_step_when_mpi_is_required_and_missing() {
    let out = ci_without_mpi("1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("FUCINA_REQUIRE_MPI is set but MPI is not usable here"),
        "{stderr}"
    );
    assert!(stderr.contains("openmpi-bin"), "{stderr}");
    assert!(!stderr.contains("==> [fmt]"), "a step ran: {stderr}");
}

#[test]
fn ci_skips_fucina_dist_when_mpi_is_missing_and_not_required() {
    let out = ci_without_mpi("0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("[mpi] SKIPPED"), "{stderr}");
    // It went on to its first step (which cannot start without cargo).
    assert!(stderr.contains("step `fmt` could not start"), "{stderr}");
}
