//! A real CPU quota sizes the default team, end to end: the test creates a
//! cgroup with a one-CPU bandwidth limit (cgroup v2 `cpu.max` when the host
//! has the v2 `cpu` controller at `/sys/fs/cgroup`, else a cgroup v1 `cpu`
//! group), re-runs itself in a child process that moves itself into it, and
//! the child checks the probe, the CPU count, `TeamOptions::default()` and
//! the started team.
//!
//! Creating a cgroup needs privileges (root, a writable cgroup file system).
//! Where that is refused the test says so on stderr and passes, unless
//! `FUCINA_REQUIRE_CGROUP_TEST=1` is set, which makes the refusal a failure
//! (set it where the machine is known to allow it). The parsing and the walk
//! over the levels are tested everywhere on fake trees (`knobs/cgroup.rs`).
//! The manual check on a systemd host with cgroup v2 (as root):
//! `systemd-run --scope -p CPUQuota=100% <a program>` must see
//! `cpu_thread_count(MAX_THREADS) == 1` and a default team of one participant
//! (this test itself needs no systemd: on such a host it makes a v2 group).

use fucina_thread::knobs::{self, MAX_THREADS};
use fucina_thread::{Team, TeamOptions};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "FUCINA_CGROUP_TEST_CHILD";
const REQUIRE_ENV: &str = "FUCINA_REQUIRE_CGROUP_TEST";
const TEST_NAME: &str = "a_one_cpu_quota_sizes_the_default_team";

/// A cgroup with a one-CPU quota, removed on drop.
struct QuotaCgroup {
    dir: PathBuf,
}

impl QuotaCgroup {
    fn create() -> Result<Self, String> {
        let name = format!("fucina-quota-{}", std::process::id());
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"));
        let (dir, file, text) = if v2 {
            (
                PathBuf::from("/sys/fs/cgroup").join(&name),
                "cpu.max",
                "100000 100000",
            )
        } else {
            (
                PathBuf::from("/sys/fs/cgroup/cpu").join(&name),
                "cpu.cfs_quota_us",
                "100000",
            )
        };
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = QuotaCgroup { dir };
        if !v2 {
            std::fs::write(cg.dir.join("cpu.cfs_period_us"), "100000")
                .map_err(|e| format!("period: {e}"))?;
        }
        std::fs::write(cg.dir.join(file), text).map_err(|e| format!("{file}: {e}"))?;
        Ok(cg)
    }
}

impl Drop for QuotaCgroup {
    fn drop(&mut self) {
        // The child has exited, so the group is empty.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// In the child: move into the group, then check every step of the sizing.
fn child(dir: &str) {
    std::fs::write(
        PathBuf::from(dir).join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .expect("move into the quota cgroup");
    assert_eq!(
        knobs::cgroup_cpu_budget(),
        Some(1),
        "the probe sees the quota"
    );
    assert_eq!(
        knobs::schedulable_cpu_count(),
        Some(1),
        "min(physical, budget)"
    );
    assert_eq!(knobs::cpu_thread_count(MAX_THREADS), 1);
    assert_eq!(TeamOptions::default().max_workers, 0);
    let team = Team::new(TeamOptions::default()).unwrap();
    assert_eq!(team.participants(), 1);
    // Even an explicit ceiling cannot exceed the budget.
    let team = Team::new(TeamOptions { max_workers: 8 }).unwrap();
    assert_eq!(
        team.participants(),
        2,
        "max(cpus - 1, 1) workers + the caller"
    );
}

#[test]
fn a_one_cpu_quota_sizes_the_default_team() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        return child(&dir);
    }
    let cg = match QuotaCgroup::create() {
        Ok(cg) => cg,
        Err(why) => {
            assert!(
                std::env::var(REQUIRE_ENV).as_deref() != Ok("1"),
                "{REQUIRE_ENV}=1 but no quota cgroup could be made: {why}"
            );
            eprintln!("skipped: cannot create a quota cgroup here ({why})");
            return;
        }
    };
    let mut run = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &cg.dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("re-run the test binary");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = run.kill();
            panic!("the child did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = run.wait_with_output().unwrap();
    assert!(
        status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop(cg);
}
