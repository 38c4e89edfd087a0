//! Thread-count knobs, environment parsing, CPU detection and spin budgets.
//!
//! # The thread count and its precedence
//!
//! [`cpu_thread_count(max)`](cpu_thread_count) is `max(1, min(count, max))`,
//! where `count` is one process-global cached value, decided by the first of:
//!
//! 1. [`set_max_threads(n)`](set_max_threads) with `n >= 1`: stored verbatim
//!    (detection and the environment are bypassed; it may exceed the detected
//!    count, up to the `max` the caller passes, e.g. [`MAX_THREADS`]). It
//!    overwrites the cache whenever called, but teams already created keep
//!    their size: call it once at startup, before any parallel work.
//! 2. Otherwise, on the first `cpu_thread_count` call, detection:
//!    the logical CPUs the OS reports (`std::thread::available_parallelism`,
//!    1 on error), lowered to the physical cores ([`physical_cpu_count`]), to
//!    the performance cores on Apple Silicon ([`performance_cpu_count`]), to
//!    the cgroup CPU quota ([`cgroup_cpu_budget`]), and finally to
//!    `FUCINA_MAX_THREADS` when it is a positive integer
//!    ([`env_positive_usize`]) — the variable only ever *lowers* the count.
//!    The result is cached; later changes to the variable are not seen.
//!
//! # Caching
//!
//! [`physical_cpu_count`], [`performance_cpu_count`] and [`cgroup_cpu_budget`]
//! each probe the system once per process and cache the answer in an atomic
//! (first caller wins, including its affinity mask); [`schedulable_cpu_count`]
//! combines the cached values. The `env_*` readers are not cached: teams read
//! `FUCINA_SPIN_BUDGET` once at creation.
//!
//! These caches are process-global plain `std` atomics, not routed through
//! the crate's loom shim: they are write-once values outside every modelled
//! protocol.
//!
//! # Environment variables
//!
//! | Variable | Value | Meaning |
//! |---|---|---|
//! | `FUCINA_MAX_THREADS` | a positive integer | lowers the detected count; 0/invalid = no override |
//! | `FUCINA_SPIN_BUDGET` | a non-negative integer | worker spin budget; `0` is valid (park at once) |
//! | `FUCINA_POOL_PROFILE` | a flag (`1`, `true`, ...) | one trace line per dispatch |
//!
//! The integer parsers (crate-private) accept exactly what the Zig library's
//! integer parser accepts: an optional sign, `_` between digits, leading zeros,
//! and nothing else.
//!
//! ```
//! use fucina_thread::knobs::{cpu_thread_count, MAX_THREADS};
//! let n = cpu_thread_count(MAX_THREADS);
//! assert!((1..=MAX_THREADS).contains(&n));
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};

mod budget;
mod cgroup;
mod cpus;
mod env;

pub use budget::{
    DEFAULT_JOIN_SPIN, DEFAULT_WORKER_SPIN, OVERSUBSCRIBED_JOIN_SPIN, SpinBudgets, spin_budgets,
};
pub use cgroup::{cgroup_cpu_budget_at, cgroup_v1_cpu_path, cgroup_v2_levels, cgroup_v2_path};
#[allow(unused_imports)] // some are used only by the unit tests below
pub(crate) use cgroup::{cpu_budget_from_quota, parse_cfs_quota, parse_cpu_max};
pub use cpus::count_physical_cores;
#[allow(unused_imports)]
pub(crate) use cpus::parse_cpu_list;
pub use env::{env_flag, env_positive_usize, env_spin_budget};
#[allow(unused_imports)]
pub(crate) use env::{parse_flag, parse_positive_usize, parse_spin_budget, parse_zig_usize};

/// Compile-time ceiling on team participants (workers + the caller).
pub const MAX_THREADS: usize = 64;

/// Name of the variable that lowers the detected thread count.
pub const MAX_THREADS_ENV: &str = "FUCINA_MAX_THREADS";
/// Name of the variable that overrides the worker spin budget.
pub const SPIN_BUDGET_ENV: &str = "FUCINA_SPIN_BUDGET";
/// Name of the flag that enables the per-dispatch profile line.
pub const POOL_PROFILE_ENV: &str = "FUCINA_POOL_PROFILE";

/// Turns a new team's adaptive serial mode off when it starts with `0`.
pub const ADAPTIVE_ENV: &str = "FUCINA_ADAPTIVE";

/// Whether a new team starts with the adaptive serial mode on: unless
/// [`ADAPTIVE_ENV`] is set and starts with `0` (read at every `Team::new`).
pub fn adaptive_from_env() -> bool {
    std::env::var_os(ADAPTIVE_ENV).is_none_or(|v| !v.to_string_lossy().starts_with('0'))
}

/// Sentinel of the probe caches: probed, answer unknown.
const UNKNOWN: usize = usize::MAX;

/// A probe-once cache: 0 = not probed yet, [`UNKNOWN`] = probed and unknown,
/// anything else = the answer.
struct ProbeCache(AtomicUsize);

impl ProbeCache {
    const fn new() -> Self {
        Self(AtomicUsize::new(0))
    }

    fn decode(v: usize) -> Option<usize> {
        (v != UNKNOWN).then_some(v)
    }

    /// The cached answer, running `probe` on the first call. Concurrent first
    /// callers may all probe; the first to store wins and all see its value.
    fn get_or_probe(&self, probe: impl FnOnce() -> Option<usize>) -> Option<usize> {
        let cached = self.0.load(Ordering::Acquire);
        if cached != 0 {
            return Self::decode(cached);
        }
        let encoded = probe()
            .filter(|&v| v != 0 && v != UNKNOWN)
            .unwrap_or(UNKNOWN);
        match self
            .0
            .compare_exchange(0, encoded, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Self::decode(encoded),
            Err(winner) => Self::decode(winner),
        }
    }
}

static PHYSICAL: ProbeCache = ProbeCache::new();
static PERFORMANCE: ProbeCache = ProbeCache::new();
static CGROUP: ProbeCache = ProbeCache::new();
/// The process-global CPU count: 0 = not computed yet.
static CPU_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Overrides the CPU count behind [`cpu_thread_count`] (like llama.cpp's
/// `-t`); `n == 0` is ignored.
///
/// The value replaces detection and `FUCINA_MAX_THREADS` entirely and may
/// exceed the detected count (deliberate oversubscription; such a team gets
/// the spin guard of [`spin_budgets`]). Every call overwrites the cache, but
/// teams already created keep their size: call it once at startup.
pub fn set_max_threads(n: usize) {
    if n > 0 {
        CPU_COUNT.store(n, Ordering::Release);
    }
}

/// `max(1, min(count, max_threads))`, where `count` is the
/// [`set_max_threads`] value or else the detected, process-cached count (see
/// the [module docs](self) for the detection and its precedence).
pub fn cpu_thread_count(max_threads: usize) -> usize {
    let mut count = CPU_COUNT.load(Ordering::Acquire);
    if count == 0 {
        let detected = detect_cpu_count();
        // A concurrent `set_max_threads` (or another first caller) wins.
        count = match CPU_COUNT.compare_exchange(0, detected, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => detected,
            Err(current) => current,
        };
    }
    count.min(max_threads).max(1)
}

/// The uncached detection: the CPUs the process may use
/// (`available_parallelism`, step 1), lowered by the physical-core,
/// performance-core and cgroup counts when known (steps 2-4) and by
/// `FUCINA_MAX_THREADS` (step 5); at least 1.
fn detect_cpu_count() -> usize {
    let mut count = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Steps 2-4: physical, performance and cgroup counts, when known.
    let known = [
        physical_cpu_count(),
        performance_cpu_count(),
        cgroup_cpu_budget(),
    ];
    for k in known.into_iter().flatten() {
        count = count.min(k.max(1));
    }
    if let Some(cap) = env_positive_usize(MAX_THREADS_ENV) {
        count = count.min(cap);
    }
    count.max(1)
}

/// Physical cores the process may run on, `None` when unknown.
///
/// Linux: the calling thread's affinity mask, deduplicated through each
/// CPU's sysfs `topology/thread_siblings_list` (a core counts once, via its
/// lowest schedulable hardware thread; see [`count_physical_cores`]); any
/// read or parse failure is unknown. macOS: `sysctl hw.physicalcpu`.
/// Elsewhere: `None`. Probed once per process (first caller's mask wins).
pub fn physical_cpu_count() -> Option<usize> {
    PHYSICAL.get_or_probe(cpus::probe_physical)
}

/// Performance cores on Apple Silicon (`sysctl hw.perflevel0.physicalcpu`),
/// `None` on every other target or on error. Probed once per process.
pub fn performance_cpu_count() -> Option<usize> {
    PERFORMANCE.get_or_probe(cpus::probe_performance)
}

/// The cgroup CPU-bandwidth quota in whole CPUs, `None` when unlimited or
/// unknown (and on non-Linux targets).
///
/// cgroup v2: the process's path from the `0::` line of `/proc/self/cgroup`;
/// `/sys/fs/cgroup<level>/cpu.max` for that path and every ancestor
/// ([`cgroup_v2_levels`]), the tightest limit wins.
/// Without a v2 limit, cgroup v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`
/// under `/sys/fs/cgroup/cpu` for the `cpu`
/// controller's path ([`cgroup_v1_cpu_path`]), every ancestor and the mount
/// root, the tightest limit wins ([`cgroup_cpu_budget_at`]). Budgets are
/// floored, never below 1. Probed once per
/// process.
pub fn cgroup_cpu_budget() -> Option<usize> {
    CGROUP.get_or_probe(cgroup::probe)
}

/// The tightest known CPU budget: `min(physical, cgroup)` when both are
/// known, whichever is known otherwise, `None` when neither is. This is the
/// oversubscription reference of [`spin_budgets`].
pub fn schedulable_cpu_count() -> Option<usize> {
    match (physical_cpu_count(), cgroup_cpu_budget()) {
        (Some(p), Some(c)) => Some(p.min(c)),
        (p, c) => p.or(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parsers_accept_what_the_knobs_grammar_accepts() {
        // The environment variables' grammar.
        assert_eq!(parse_positive_usize("+6"), Some(6));
        assert_eq!(parse_positive_usize("1_2"), Some(12));
        assert_eq!(parse_positive_usize("6\n"), None);
        assert_eq!(parse_positive_usize("0008"), Some(8));
        assert_eq!(parse_positive_usize("123456789012345678901"), None);
        assert_eq!(parse_positive_usize("-0"), None);
        assert_eq!(parse_positive_usize("-4"), None);
        assert_eq!(parse_zig_usize("-0"), Some(0));
        assert_eq!(parse_spin_budget("0"), Some(0));
        assert_eq!(parse_spin_budget("-0"), None);
        assert_eq!(parse_spin_budget(""), None);
        assert!(parse_flag("1") && !parse_flag("0") && !parse_flag(""));
        // CPU lists and cgroup files.
        assert_eq!(parse_cpu_list("0-1,8-9\n"), Some(vec![0..=1, 8..=9]));
        for bad in ["a", "1-", "-3", "1-a", "3-1", "0 1"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
        // (every cpu.max example is unit-tested in cgroup.rs)
        assert_eq!(parse_cpu_max("150000 100000"), Some(1));
        assert_eq!(parse_cpu_max("max 100000"), None);
        assert_eq!(parse_cfs_quota("-1", "100000"), None);
        assert_eq!(cpu_budget_from_quota(150_000, 100_000), Some(1));
    }

    #[test]
    fn probe_cache_first_answer_wins() {
        let cache = ProbeCache::new();
        assert_eq!(cache.get_or_probe(|| Some(3)), Some(3));
        assert_eq!(cache.get_or_probe(|| Some(5)), Some(3));
        let unknown = ProbeCache::new();
        assert_eq!(unknown.get_or_probe(|| None), None);
        assert_eq!(unknown.get_or_probe(|| Some(5)), None);
        // A zero answer is "unknown", never re-probed as "not probed".
        let zero = ProbeCache::new();
        assert_eq!(zero.get_or_probe(|| Some(0)), None);
        assert_eq!(zero.get_or_probe(|| Some(5)), None);
    }
}
