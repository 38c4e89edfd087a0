//! The `FUCINA_POOL_PROFILE=1` trace line: one line per dispatch, for
//! seeing how work is split and how long each participant waits.
//!
//! When the flag is set at team creation (and the team has workers), every
//! barrier dispatch (chunks or chained; not serial fallbacks, not single-task
//! calls) prints one line to stderr:
//!
//! ```text
//! [pool-trace] dispatch=<D> mode=<chunks|chained> jobs=<tasks> participants=<workers+1> chunk=<claim chunk, 1 for chained> span_ns=<end-start> w0=claim+<ns>,complete+<ns>,tasks:<n> w1=...
//! ```
//!
//! Each participant writes only its own [`TraceSlot`] (relaxed stores, no
//! read-modify-write), the dispatcher zeroes the slots before publishing a
//! dispatch and reads them after its acquire join, so no trace atomics are
//! contended. Offsets are nanoseconds from the dispatch start on the monotonic
//! clock. A participant that ran zero tasks is still reported: its completion
//! offset is the barrier-tail evidence that tells late wake-up from slow tasks.

use crate::sync::{AtomicU64, Ordering};
use std::fmt::Write as _;
use std::time::Instant;

/// The dispatch mode printed in the trace line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `parallel_chunks` / `parallel_for`.
    Chunks,
    /// `parallel_chained`.
    Chained,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Chunks => "chunks",
            Mode::Chained => "chained",
        }
    }
}

/// One participant's trace record, written only by that participant.
#[derive(Debug)]
pub(crate) struct TraceSlot {
    claim_ns: AtomicU64,
    complete_ns: AtomicU64,
    tasks: AtomicU64,
}

impl TraceSlot {
    pub(crate) fn new() -> Self {
        Self {
            claim_ns: AtomicU64::new(0),
            complete_ns: AtomicU64::new(0),
            tasks: AtomicU64::new(0),
        }
    }

    /// Zeroes the slot (dispatcher, before publishing the dispatch).
    pub(crate) fn reset(&self) {
        self.claim_ns.store(0, Ordering::Relaxed);
        self.complete_ns.store(0, Ordering::Relaxed);
        self.tasks.store(0, Ordering::Relaxed);
    }

    /// Reads the slot (dispatcher, after the acquire join).
    pub(crate) fn snapshot(&self) -> SlotRecord {
        SlotRecord {
            claim_ns: self.claim_ns.load(Ordering::Relaxed),
            complete_ns: self.complete_ns.load(Ordering::Relaxed),
            tasks: self.tasks.load(Ordering::Relaxed),
        }
    }
}

/// A participant's view of tracing for one dispatch: its slot and the start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tracer<'a> {
    pub(crate) slot: &'a TraceSlot,
    pub(crate) start: Instant,
}

impl Tracer<'_> {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
    /// Records the first claim attempt.
    pub(crate) fn claimed(&self) {
        self.slot.claim_ns.store(self.now_ns(), Ordering::Relaxed);
    }
    /// Records the end of the participant's work and its task count.
    pub(crate) fn completed(&self, tasks: u64) {
        self.slot
            .complete_ns
            .store(self.now_ns(), Ordering::Relaxed);
        self.slot.tasks.store(tasks, Ordering::Relaxed);
    }
    /// Adds `tasks` more tasks run after the participant's share (the
    /// dispatcher running the static tasks of absent workers) and moves its
    /// completion offset to now. Only the slot's owner writes it.
    pub(crate) fn completed_more(&self, tasks: u64) {
        let before = self.slot.tasks.load(Ordering::Relaxed);
        self.completed(before.saturating_add(tasks));
    }
}

/// A snapshot of one [`TraceSlot`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SlotRecord {
    pub(crate) claim_ns: u64,
    pub(crate) complete_ns: u64,
    pub(crate) tasks: u64,
}

/// The header fields of one trace line.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LineHeader {
    pub(crate) dispatch: u32,
    pub(crate) mode: Mode,
    pub(crate) jobs: usize,
    pub(crate) participants: usize,
    pub(crate) chunk: usize,
    pub(crate) span_ns: u64,
}

/// Formats one trace line (without the trailing newline).
pub(crate) fn format_line(h: &LineHeader, slots: impl IntoIterator<Item = SlotRecord>) -> String {
    let mut s = String::with_capacity(128);
    // Writing to a String cannot fail.
    let _ = write!(
        s,
        "[pool-trace] dispatch={} mode={} jobs={} participants={} chunk={} span_ns={}",
        h.dispatch,
        h.mode.name(),
        h.jobs,
        h.participants,
        h.chunk,
        h.span_ns
    );
    for (i, r) in slots.into_iter().enumerate() {
        let _ = write!(
            s,
            " w{i}=claim+{},complete+{},tasks:{}",
            r.claim_ns, r.complete_ns, r.tasks
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_format_is_exact() {
        let h = LineHeader {
            dispatch: 7,
            mode: Mode::Chunks,
            jobs: 16,
            participants: 2,
            chunk: 1,
            span_ns: 12345,
        };
        let slots = [
            SlotRecord {
                claim_ns: 10,
                complete_ns: 12000,
                tasks: 9,
            },
            SlotRecord {
                claim_ns: 250,
                complete_ns: 12100,
                tasks: 7,
            },
        ];
        assert_eq!(
            format_line(&h, slots),
            "[pool-trace] dispatch=7 mode=chunks jobs=16 participants=2 chunk=1 span_ns=12345 \
             w0=claim+10,complete+12000,tasks:9 w1=claim+250,complete+12100,tasks:7"
        );
    }

    #[test]
    fn chained_line_reports_zero_task_participants() {
        let h = LineHeader {
            dispatch: u32::MAX,
            mode: Mode::Chained,
            jobs: 3,
            participants: 3,
            chunk: 1,
            span_ns: 0,
        };
        let slots = [
            SlotRecord {
                claim_ns: 0,
                complete_ns: 5,
                tasks: 3,
            },
            SlotRecord::default(),
            SlotRecord {
                claim_ns: 1,
                complete_ns: 2,
                tasks: 0,
            },
        ];
        assert_eq!(
            format_line(&h, slots),
            "[pool-trace] dispatch=4294967295 mode=chained jobs=3 participants=3 chunk=1 span_ns=0 \
             w0=claim+0,complete+5,tasks:3 w1=claim+0,complete+0,tasks:0 w2=claim+1,complete+2,tasks:0"
        );
    }
}
