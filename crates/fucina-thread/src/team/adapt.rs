//! Adaptive parallelism under contention (team/README.md, "Adaptive
//! parallelism"): when workers stop showing up for dispatches (descheduled by
//! competing processes, throttled by a CPU quota), the dispatcher runs small
//! jobs alone for a while instead of publishing them, then probes again.
//!
//! Only *who* runs a task changes, never the tasks: the chunk boundaries are
//! fixed by the caller before the team sees the job, and a job run alone runs
//! exactly the tasks of a dispatch no worker entered, so results stay bitwise
//! identical. The state is the dispatcher's own (touched only by the holder of
//! the team's `active` flag), so it needs no atomics.

use std::time::{Duration, Instant};

/// Consecutive late dispatches (a worker never entered, or the join had to
/// sleep on one that did) after which small jobs run alone.
pub(crate) const LATE_STREAK: u32 = 4;
/// The first alone window; each failed probe doubles it, up to
/// [`ALONE_WINDOW_MAX`]; a probe that every worker entered in time ends the
/// mode.
pub(crate) const ALONE_WINDOW_MIN: Duration = Duration::from_millis(1);
/// The longest alone window.
pub(crate) const ALONE_WINDOW_MAX: Duration = Duration::from_millis(16);
/// A job is *small* when it has fewer tasks than this many per participant
/// (`chunk_ranges` caps a range at 4 chunks per participant, so a full-size
/// `parallel_for` is never small): larger jobs are always dispatched, and
/// serve as probes.
pub(crate) const SMALL_TASKS_PER_PARTICIPANT: usize = 4;

/// The dispatcher-side state of the adaptive mode.
#[derive(Debug)]
pub(crate) struct Adapt {
    /// Whether the mode may engage (`Team::set_adaptive`; off under loom,
    /// whose models must not depend on the clock).
    pub(crate) enabled: bool,
    /// Late dispatches in a row (outside the mode).
    streak: u32,
    /// While in the mode: when the current window ends (then the next
    /// dispatched job is a probe).
    until: Option<Instant>,
    /// The length of the next window.
    window: Duration,
    /// Whether the job being dispatched now is a probe (the window ended).
    probe: bool,
    /// Jobs run alone so far (a diagnostic).
    pub(crate) alone_runs: u64,
    /// Times the mode engaged so far (a diagnostic).
    pub(crate) engaged: u64,
}

impl Default for Adapt {
    fn default() -> Self {
        Adapt {
            enabled: !cfg!(loom),
            streak: 0,
            until: None,
            window: ALONE_WINDOW_MIN,
            probe: false,
            alone_runs: 0,
            engaged: 0,
        }
    }
}

impl Adapt {
    /// Whether a job of `count` tasks on `participants` runs alone now.
    #[inline(always)]
    pub(crate) fn run_alone(&mut self, count: usize, participants: usize) -> bool {
        let Some(until) = self.until else {
            return false;
        };
        self.run_alone_slow(until, count, participants)
    }

    #[cold]
    #[inline(never)]
    fn run_alone_slow(&mut self, until: Instant, count: usize, participants: usize) -> bool {
        if !self.enabled {
            self.leave();
            return false;
        }
        let small = count < participants.saturating_mul(SMALL_TASKS_PER_PARTICIPANT);
        self.probe = Instant::now() >= until;
        if small && !self.probe {
            self.alone_runs += 1;
            true
        } else {
            false
        }
    }

    /// Whether the dispatch being published is a probe: the mode is engaged
    /// and its window has ended (a large job dispatched inside the window is
    /// not one).
    #[inline(always)]
    pub(crate) fn probing(&self) -> bool {
        self.probe
    }

    /// Records the outcome of a dispatch that was published: `late` when a
    /// worker never entered it or the join slept on one that did.
    #[inline(always)]
    pub(crate) fn record(&mut self, late: bool) {
        if self.until.is_none() && !late {
            self.streak = 0;
            return;
        }
        self.record_slow(late);
    }

    #[cold]
    #[inline(never)]
    fn record_slow(&mut self, late: bool) {
        if !self.enabled {
            self.leave();
            return;
        }
        match (self.until.is_some(), late) {
            // A probe (or a large job) that every worker entered in time:
            // workers are back.
            (true, false) => self.leave(),
            // A failed probe: a longer window.
            (true, true) => {
                self.window = (self.window * 2).min(ALONE_WINDOW_MAX);
                self.until = Some(Instant::now() + self.window);
                self.probe = false;
            }
            (false, _) => {
                self.streak += 1;
                if self.streak >= LATE_STREAK {
                    self.streak = 0;
                    self.engaged += 1;
                    self.until = Some(Instant::now() + self.window);
                }
            }
        }
    }

    /// Leaves the mode (or stays out of it), with the shortest next window.
    fn leave(&mut self) {
        self.streak = 0;
        self.probe = false;
        self.until = None;
        self.window = ALONE_WINDOW_MIN;
    }

    /// Whether the mode is engaged (a window is open or a probe is due).
    #[cfg(test)]
    pub(crate) fn engaged_now(&self) -> bool {
        self.until.is_some()
    }
}
