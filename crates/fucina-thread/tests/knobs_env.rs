//! Tests that change process-global state (the thread-count cache and
//! environment variables). They live in their own test binary and run as one
//! sequential `#[test]`; precedence checks that need a fresh cache re-run this
//! binary as a child process (`child_probe`).

use std::process::Command;

use fucina_thread::knobs::{MAX_THREADS_ENV, POOL_PROFILE_ENV, SPIN_BUDGET_ENV};
use fucina_thread::{
    cgroup_cpu_budget, cpu_thread_count, env_flag, env_positive_usize, env_spin_budget,
    performance_cpu_count, physical_cpu_count, set_max_threads,
};

/// Set in the child's environment; the child test only runs when it is.
const CHILD_MARKER: &str = "FUCINA_THREAD_TEST_CHILD";

fn set(name: &str, value: &str) {
    // SAFETY: `sequential` is the only test of this binary that writes the
    // environment; the other test (`child_probe`) only reads it through
    // `std::env`, which serializes with `set_var` under std's env lock, and no
    // code in this process reads it through libc directly.
    unsafe { std::env::set_var(name, value) }
}

fn unset(name: &str) {
    // SAFETY: as in `set`.
    unsafe { std::env::remove_var(name) }
}

/// What detection must give without any `FUCINA_MAX_THREADS`.
fn detected() -> usize {
    let mut n = std::thread::available_parallelism().map_or(1, |n| n.get());
    for k in [
        physical_cpu_count(),
        performance_cpu_count(),
        cgroup_cpu_budget(),
    ]
    .into_iter()
    .flatten()
    {
        n = n.min(k.max(1));
    }
    n
}

/// Runs `child_probe` in a fresh process with `FUCINA_MAX_THREADS` set to
/// `value` (or unset) and returns the `cpu_thread_count(1024)` it reports.
fn child_count(value: Option<&str>) -> usize {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_probe", "--nocapture", "--test-threads=1"])
        .env(CHILD_MARKER, "1");
    match value {
        Some(v) => cmd.env(MAX_THREADS_ENV, v),
        None => cmd.env_remove(MAX_THREADS_ENV),
    };
    let out = cmd.output().expect("spawn child test process");
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // libtest may print "test child_probe ... " on the same line.
    let (_, rest) = stdout.split_once("CHILD_COUNT=").expect("child output");
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("child count")
}

#[test]
fn child_probe() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    println!("CHILD_COUNT={}", cpu_thread_count(1024));
}

#[test]
fn sequential() {
    // --- FUCINA_MAX_THREADS only lowers detection (fresh processes). ---
    let d = detected();
    assert_eq!(child_count(None), d);
    assert_eq!(child_count(Some("1")), 1);
    assert_eq!(
        child_count(Some("1000")),
        d,
        "the variable never raises the count"
    );
    assert_eq!(child_count(Some("0")), d, "0 means no override");
    assert_eq!(child_count(Some("abc")), d, "invalid means no override");
    assert_eq!(child_count(Some("-1")), d);
    assert_eq!(child_count(Some("+1")), 1, "Zig parser quirk: leading '+'");

    // --- In this process: read once, on the first cpu_thread_count. ---
    set(MAX_THREADS_ENV, "1");
    assert_eq!(cpu_thread_count(64), 1);
    set(MAX_THREADS_ENV, "3");
    assert_eq!(
        cpu_thread_count(64),
        1,
        "cached: later env changes are not seen"
    );
    unset(MAX_THREADS_ENV);

    // --- set_max_threads wins, may exceed detection, 0 is ignored. ---
    set_max_threads(5);
    assert_eq!(cpu_thread_count(64), 5);
    assert_eq!(cpu_thread_count(3), 3);
    assert_eq!(cpu_thread_count(0), 1);
    set_max_threads(0);
    assert_eq!(cpu_thread_count(64), 5, "n == 0 is ignored");
    set_max_threads(2);
    assert_eq!(cpu_thread_count(64), 2, "every call overwrites");

    // --- env_positive_usize. ---
    let name = "FUCINA_THREAD_TEST_POSITIVE";
    unset(name);
    assert_eq!(env_positive_usize(name), None);
    for (value, expected) in [
        ("6", Some(6)),
        ("+6", Some(6)),
        ("1_2", Some(12)),
        ("0008", Some(8)),
        ("0", None),
        ("-0", None),
        ("-4", None),
        ("6\n", None),
        ("", None),
        ("123456789012345678901", None),
    ] {
        set(name, value);
        assert_eq!(env_positive_usize(name), expected, "{value:?}");
    }
    unset(name);

    // --- env_spin_budget (FUCINA_SPIN_BUDGET). ---
    unset(SPIN_BUDGET_ENV);
    assert_eq!(env_spin_budget(), None);
    for (value, expected) in [
        ("0", Some(0)),
        ("512", Some(512)),
        ("", None),
        ("-0", None),
        ("-1", None),
        ("x", None),
    ] {
        set(SPIN_BUDGET_ENV, value);
        assert_eq!(env_spin_budget(), expected, "{value:?}");
    }
    unset(SPIN_BUDGET_ENV);

    // --- env_flag (FUCINA_POOL_PROFILE). ---
    unset(POOL_PROFILE_ENV);
    assert!(!env_flag(POOL_PROFILE_ENV));
    for (value, expected) in [
        ("1", true),
        ("yes", true),
        ("0", false),
        ("", false),
        ("01", false),
    ] {
        set(POOL_PROFILE_ENV, value);
        assert_eq!(env_flag(POOL_PROFILE_ENV), expected, "{value:?}");
    }
    unset(POOL_PROFILE_ENV);

    // --- Non-UTF-8 values are judged by the byte grammar. ---
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let raw = std::ffi::OsStr::from_bytes(b"\xff1");
        // SAFETY: as in `set`.
        unsafe { std::env::set_var(POOL_PROFILE_ENV, raw) };
        assert!(env_flag(POOL_PROFILE_ENV));
        // SAFETY: as in `set`.
        unsafe { std::env::set_var(name, raw) };
        assert_eq!(env_positive_usize(name), None);
        unset(POOL_PROFILE_ENV);
        unset(name);
    }
}
