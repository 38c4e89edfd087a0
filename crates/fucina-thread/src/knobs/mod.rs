//! Thread-count knobs, environment parsing, CPU detection and spin budgets
//! (reference §3.4, §3.10–3.12).
//!
//! PLACEHOLDER BODIES: the signatures below are the agreed interface; the
//! bodies are simplified stand-ins until the real detection lands in this change.

/// Compile-time ceiling on team participants (workers + the caller).
pub const MAX_THREADS: usize = 64;
/// Default worker spin budget (spin-hint iterations before parking).
pub const DEFAULT_WORKER_SPIN: u32 = 32_768;
/// Default dispatcher join spin bound (iterations before the 1 ms timed waits).
pub const DEFAULT_JOIN_SPIN: u32 = 1 << 20;
/// Join spin bound on an oversubscribed team, and after the first timed wait.
pub const OVERSUBSCRIBED_JOIN_SPIN: u32 = 4096;

/// The spin budgets of one team, fixed at team creation (reference §3.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpinBudgets {
    /// Spin-hint iterations a worker spends before parking.
    pub worker_spin: u32,
    /// Iterations the dispatcher spins in the join before its first timed wait.
    pub join_spin: u32,
}

/// The spin-budget policy of reference §3.4, a pure function.
pub fn spin_budgets(
    env_override: Option<usize>,
    team_size: usize,
    schedulable_cores: Option<usize>,
) -> SpinBudgets {
    let oversubscribed = schedulable_cores.is_some_and(|c| team_size > c);
    let guarded = if oversubscribed { 0 } else { DEFAULT_WORKER_SPIN };
    let worker_spin = env_override
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or(guarded);
    let join_spin = if oversubscribed { OVERSUBSCRIBED_JOIN_SPIN } else { DEFAULT_JOIN_SPIN };
    SpinBudgets { worker_spin, join_spin }
}

/// Overrides the detected CPU count (`n == 0` is ignored).
pub fn set_max_threads(_n: usize) {}

/// `max(1, min(detected or set count, max_threads))`.
pub fn cpu_thread_count(max_threads: usize) -> usize {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    n.min(max_threads).max(1)
}

/// Physical cores in the affinity mask, `None` when unknown.
pub fn physical_cpu_count() -> Option<usize> {
    None
}

/// Performance cores (Apple Silicon), `None` elsewhere.
pub fn performance_cpu_count() -> Option<usize> {
    None
}

/// The cgroup CPU quota in whole CPUs, `None` when unlimited or unknown.
pub fn cgroup_cpu_budget() -> Option<usize> {
    None
}

/// `min(physical, cgroup)` of what is known, `None` when neither is.
pub fn schedulable_cpu_count() -> Option<usize> {
    None
}

/// A positive integer environment knob; unset, invalid or 0 is `None`.
pub fn env_positive_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.parse().ok().filter(|&v| v > 0)
}

/// `FUCINA_SPIN_BUDGET`; 0 is a valid value.
pub fn env_spin_budget() -> Option<usize> {
    std::env::var("FUCINA_SPIN_BUDGET").ok()?.parse().ok()
}

/// A flag: set, non-empty, and not starting with '0'.
pub fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && !v.starts_with('0'))
}
