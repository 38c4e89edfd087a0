//! fucina-thread: the spin-then-park fork-join team (work in progress in this change).
//!
//! Module map (kept in sync with `ARCHITECTURE.md`):
//! - `team/`: the persistent fork-join [`Team`] and its dispatch protocol
//!   (`team/README.md`), chained dispatch;
//! - `chunking`: the deterministic range chunking;
//! - `knobs/`: thread-count knobs, environment parsing, CPU detection, spin budgets;
//! - `one_shot`: [`OneShotWorker`];
//! - `tasks`: general async tasks over `rayon-core`;
//! - `profile`: the `FUCINA_POOL_PROFILE` trace line;
//! - `sync`: the std/loom shim every atomic, lock and park goes through.

mod error;
pub mod knobs;

pub use error::ThreadError;
pub use knobs::{
    MAX_THREADS, SpinBudgets, cgroup_cpu_budget, cpu_thread_count, env_flag, env_positive_usize,
    env_spin_budget, performance_cpu_count, physical_cpu_count, schedulable_cpu_count,
    set_max_threads, spin_budgets,
};
