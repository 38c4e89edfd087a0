//! Read-only checks of the knobs against this machine (no global state is
//! changed here; see `knobs_env.rs` for the tests that set the caches/env).

use fucina_thread::knobs;
use fucina_thread::{
    MAX_THREADS, cgroup_cpu_budget, cpu_thread_count, performance_cpu_count, physical_cpu_count,
    schedulable_cpu_count, spin_budgets,
};

fn logical() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn detected_counts_are_plausible() {
    if let Some(p) = physical_cpu_count() {
        assert!(
            (1..=logical()).contains(&p),
            "physical {p}, logical {}",
            logical()
        );
    }
    if let Some(p) = performance_cpu_count() {
        assert!((1..=logical()).contains(&p));
    }
    if let Some(c) = cgroup_cpu_budget() {
        assert!(c >= 1);
    }
}

#[test]
fn schedulable_is_the_min_of_what_is_known() {
    let expected = match (physical_cpu_count(), cgroup_cpu_budget()) {
        (Some(p), Some(c)) => Some(p.min(c)),
        (p, c) => p.or(c),
    };
    assert_eq!(schedulable_cpu_count(), expected);
}

#[cfg(target_os = "linux")]
#[test]
fn linux_physical_count_is_known_when_sysfs_topology_exists() {
    if std::path::Path::new("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").exists() {
        assert!(physical_cpu_count().is_some());
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
#[test]
fn physical_count_is_unknown_elsewhere() {
    assert_eq!(physical_cpu_count(), None);
}

#[cfg(not(all(target_os = "macos", target_arch = "aarch64")))]
#[test]
fn performance_count_is_apple_silicon_only() {
    assert_eq!(performance_cpu_count(), None);
}

#[test]
fn cpu_thread_count_is_clamped() {
    let n = cpu_thread_count(MAX_THREADS);
    assert!((1..=MAX_THREADS).contains(&n));
    assert_eq!(cpu_thread_count(1), 1);
    assert_eq!(cpu_thread_count(0), 1, "never below 1");
    assert!(cpu_thread_count(2) <= 2);
    // Probed once and cached: knobs_env.rs tests the read-once behaviour.
}

#[test]
fn budget_constants_are_the_reference_values() {
    // The spin-budget policy table itself is unit-tested in src/knobs/budget.rs.
    assert_eq!(knobs::DEFAULT_WORKER_SPIN, 32_768);
    assert_eq!(knobs::DEFAULT_JOIN_SPIN, 1 << 20);
    assert_eq!(knobs::OVERSUBSCRIBED_JOIN_SPIN, 4096);
    let b = spin_budgets(Some(512), 11, Some(10));
    assert_eq!((b.worker_spin, b.join_spin), (512, 4096));
}

#[test]
fn public_knob_helpers() {
    use knobs::*;
    let mask: Vec<usize> = (0..16).collect();
    let ht = |cpu: usize| Some(format!("{},{}", cpu % 8, cpu % 8 + 8));
    assert_eq!(count_physical_cores(&mask, ht), Some(8));
    assert_eq!(cgroup_v2_path("0::/a/b\n"), Some("/a/b"));
}
