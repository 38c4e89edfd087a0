//! The spin-budget policy (how long a waiting thread spins before it parks):
//! a pure function of the
//! `FUCINA_SPIN_BUDGET` override, the team size and the schedulable cores.

/// Default worker spin budget (spin-hint iterations before parking).
pub const DEFAULT_WORKER_SPIN: u32 = 32_768;
/// Default dispatcher join spin bound (iterations before the 1 ms timed waits).
pub const DEFAULT_JOIN_SPIN: u32 = 1 << 20;
/// Join spin bound on an oversubscribed team, and after the first timed wait.
pub const OVERSUBSCRIBED_JOIN_SPIN: u32 = 4096;

/// The spin budgets of one team, fixed at team creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpinBudgets {
    /// Spin-hint iterations a worker spends before parking.
    pub worker_spin: u32,
    /// Iterations the dispatcher spins in the join before its first timed wait.
    pub join_spin: u32,
}

/// The spin-budget policy, a pure function of its inputs.
///
/// - The team is *oversubscribed* when `schedulable_cores` is known and
///   `team_size` (workers + the caller) exceeds it; equal is not
///   oversubscribed, unknown never is.
/// - Worker spin: `env_override` when present and representable as `u32`
///   (0 is valid: park at once; an in-range override beats the guard);
///   otherwise 0 when oversubscribed, else [`DEFAULT_WORKER_SPIN`]. An
///   override too large for `u32` counts as absent, so a typo cannot
///   re-enable spinning on an oversubscribed team.
/// - Join spin: [`OVERSUBSCRIBED_JOIN_SPIN`] when oversubscribed, else
///   [`DEFAULT_JOIN_SPIN`]; the override never affects it.
///
/// ```
/// use fucina_thread::knobs::{spin_budgets, SpinBudgets};
/// assert_eq!(spin_budgets(None, 11, Some(10)), SpinBudgets { worker_spin: 0, join_spin: 4096 });
/// assert_eq!(spin_budgets(Some(512), 11, Some(10)).worker_spin, 512);
/// ```
pub fn spin_budgets(
    env_override: Option<usize>,
    team_size: usize,
    schedulable_cores: Option<usize>,
) -> SpinBudgets {
    let oversubscribed = schedulable_cores.is_some_and(|c| team_size > c);
    let guarded = if oversubscribed {
        0
    } else {
        DEFAULT_WORKER_SPIN
    };
    let worker_spin = env_override
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or(guarded);
    let join_spin = if oversubscribed {
        OVERSUBSCRIBED_JOIN_SPIN
    } else {
        DEFAULT_JOIN_SPIN
    };
    SpinBudgets {
        worker_spin,
        join_spin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(worker_spin: u32, join_spin: u32) -> SpinBudgets {
        SpinBudgets {
            worker_spin,
            join_spin,
        }
    }

    #[test]
    fn reference_values() {
        const M: u32 = 1 << 20;
        assert_eq!(spin_budgets(None, 8, Some(10)), b(32_768, M));
        assert_eq!(spin_budgets(None, 10, Some(10)), b(32_768, M));
        assert_eq!(spin_budgets(None, 11, Some(10)), b(0, 4096));
        assert_eq!(spin_budgets(None, 64, None), b(32_768, M));
        assert_eq!(spin_budgets(Some(512), 11, Some(10)), b(512, 4096));
        assert_eq!(spin_budgets(Some(0), 8, Some(10)), b(0, M));
        assert_eq!(spin_budgets(Some(1 << 40), 8, Some(10)).worker_spin, 32_768);
        assert_eq!(spin_budgets(Some(1 << 40), 11, Some(10)).worker_spin, 0);
    }

    #[test]
    fn u32_boundary_of_the_override() {
        let max = u32::MAX as usize;
        assert_eq!(spin_budgets(Some(max), 11, Some(10)).worker_spin, u32::MAX);
        assert_eq!(spin_budgets(Some(max + 1), 11, Some(10)).worker_spin, 0);
        assert_eq!(spin_budgets(Some(max + 1), 11, Some(10)).join_spin, 4096);
        // A 1-core host: the minimum team of two is oversubscribed.
        assert_eq!(spin_budgets(None, 2, Some(1)), b(0, 4096));
    }
}
