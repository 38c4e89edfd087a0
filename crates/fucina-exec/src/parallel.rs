//! The deterministic parallel split every op goes through: `par_rows` and
//! `par_rows_with_scratch` run a closure over the rows of an output in the chunks
//! of `fucina_thread::chunk_ranges` on the context's team (a pure function of the
//! row count and the team size, so the result never depends on scheduling).

use std::ops::Range;
use std::sync::Mutex;

use fucina_storage::ScratchLease;
use fucina_thread::{ChunkRanges, Team, chunk_ranges};

use crate::context::{ExecContext, MAX_THREADS, PARALLEL_THRESHOLD};
use crate::error::ExecError;

/// `chunk_ranges` yields at most four chunks per participant.
const MAX_CHUNKS: usize = 4 * MAX_THREADS;

impl ExecContext {
    /// Runs `f(rows, out_rows)` over the rows of `out` (rows of `row_len` elements),
    /// split into the deterministic chunks of `fucina_thread::chunk_ranges` for this
    /// context's team size, in parallel when `rows * work_per_row` reaches
    /// [`PARALLEL_THRESHOLD`]. `f` receives a range of row indices and exactly the
    /// matching rows of `out`; every row is written by exactly one call, so the
    /// result never depends on the chunking.
    pub(crate) fn par_rows<T, F>(&self, out: &mut [T], row_len: usize, work_per_row: usize, f: F)
    where
        T: Send,
        F: Fn(Range<usize>, &mut [T]) + Sync,
    {
        let row_len = row_len.max(1);
        let rows = out.len() / row_len;
        let Some((team, chunks)) = self.row_chunks(rows, work_per_row) else {
            f(0..rows, out);
            return;
        };
        let (mut pieces, n) = split_rows(out, row_len, chunks);
        team.parallel_chunks_mut(&mut pieces[..n], |(r, rows_out)| f(r.clone(), rows_out));
    }

    /// [`par_rows`](Self::par_rows) over two outputs split by the same rows
    /// (`a` and `b` hold `la` and `lb` items per row): `f(rows, a_rows,
    /// b_rows)`.
    pub(crate) fn par_rows2<A, B, F>(
        &self,
        a: (&mut [A], usize),
        b: (&mut [B], usize),
        work_per_row: usize,
        f: F,
    ) where
        A: Send,
        B: Send,
        F: Fn(Range<usize>, &mut [A], &mut [B]) + Sync,
    {
        let mut none: [u8; 0] = [];
        self.par_rows3(a, b, (&mut none[..], 0), work_per_row, |r, a, b, _| {
            f(r, a, b)
        });
    }

    /// [`par_rows`](Self::par_rows) over three outputs split by the same rows
    /// (`a`, `b` and `c` hold `la`, `lb` and `lc` items per row):
    /// `f(rows, a_rows, b_rows, c_rows)`.
    #[allow(clippy::too_many_arguments)] // three outputs and their row lengths
    pub(crate) fn par_rows3<A, B, C, F>(
        &self,
        (a, la): (&mut [A], usize),
        (b, lb): (&mut [B], usize),
        (c, lc): (&mut [C], usize),
        work_per_row: usize,
        f: F,
    ) where
        A: Send,
        B: Send,
        C: Send,
        F: Fn(Range<usize>, &mut [A], &mut [B], &mut [C]) + Sync,
    {
        let rows = a.len() / la.max(1);
        let Some((team, chunks)) = self.row_chunks(rows, work_per_row) else {
            f(0..rows, a, b, c);
            return;
        };
        let (pa, n) = split_rows(a, la, chunks.clone());
        let (pb, _) = split_rows(b, lb, chunks.clone());
        let (pc, _) = split_rows(c, lc, chunks);
        let mut it = pa.into_iter().zip(pb).zip(pc);
        let mut pieces: [_; MAX_CHUNKS] = std::array::from_fn(|_| {
            let (((r, a), (_, b)), (_, c)) = it.next().expect("MAX_CHUNKS pieces");
            (r, a, b, c)
        });
        team.parallel_chunks_mut(&mut pieces[..n], |(r, a, b, c)| f(r.clone(), a, b, c));
    }

    /// The team and the chunks a [`par_rows`](Self::par_rows) call over `rows`
    /// rows of `work_per_row` each runs on, or `None` when it runs serially on the
    /// caller (one participant, one row, too little work, or a call from inside a
    /// parallel region).
    fn row_chunks(&self, rows: usize, work_per_row: usize) -> Option<(&Team, ChunkRanges)> {
        let work = rows.saturating_mul(work_per_row.max(1));
        if self.threads() <= 1
            || rows <= 1
            || work < PARALLEL_THRESHOLD
            || fucina_thread::in_parallel_region()
        {
            return None;
        }
        let team = self.team()?;
        let grain = (PARALLEL_THRESHOLD / work_per_row.max(1)).max(1);
        Some((team, chunk_ranges(0, rows, grain, self.threads())))
    }

    /// [`par_rows`](Self::par_rows) with a scratch lease of `scratch_len` items of
    /// `S` for every chunk, reused for all of the chunk's rows:
    /// `f(rows, out_rows, scratch)`.
    ///
    /// Every lease of a call is taken from the context's pool on the calling
    /// thread before the team runs and goes back there after it: one per
    /// participant that can run a chunk (`min(participants, chunks)`), handed to
    /// the chunks by participant index (or by chunk index when there are no more
    /// chunks than participants), so no two concurrent chunks share one. The pool
    /// therefore sees the same acquires and releases, on the same thread, however
    /// the chunks are scheduled (all on the caller, some on each worker, or the
    /// serial fallback of a busy team): once a warm-up has sized it, a call never
    /// misses, whichever participant ran which chunk during the warm-up.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] (through [`ExecError::storage`], naming `op`)
    /// if a lease cannot be had; then `out` may be partly unwritten, so the
    /// caller discards it.
    pub(crate) fn par_rows_with_scratch<T, S, F>(
        &self,
        op: &'static str,
        out: &mut [T],
        row_len: usize,
        work_per_row: usize,
        scratch_len: usize,
        f: F,
    ) -> Result<(), ExecError>
    where
        T: Send,
        S: bytemuck::Pod + Send,
        F: Fn(Range<usize>, &mut [T], &mut [S]) + Sync,
    {
        let lease = || {
            self.pool()
                .acquire_scratch::<S>(scratch_len)
                .map_err(|e| ExecError::storage(op, e))
        };
        let row_len = row_len.max(1);
        let rows = out.len() / row_len;
        let Some((team, chunks)) = self.row_chunks(rows, work_per_row) else {
            f(0..rows, out, &mut lease()?);
            return Ok(());
        };
        let participants = team.participants().min(MAX_THREADS);
        let by_participant = chunks.len() > participants;
        // Chunk `i` starts at row `i * chunk_size` (only the last one is short).
        let chunk_size = chunks.chunk_size().max(1);
        let mut leases: [Mutex<Option<ScratchLease<S>>>; MAX_THREADS] =
            std::array::from_fn(|_| Mutex::new(None));
        for slot in &mut leases[..chunks.len().min(participants)] {
            *slot.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(lease()?);
        }
        let (mut pieces, n) = split_rows(out, row_len, chunks);
        // A lease taken on a worker: only if a slot were missing or in use, which
        // the assignment above rules out; kept so that a broken assumption costs
        // an allocation, never a wrong result.
        let shared = self.pool().pool();
        let failed = Mutex::new(None);
        team.parallel_chunks_mut(&mut pieces[..n], |(r, rows_out)| {
            // A serial fallback (busy team) runs every chunk on the caller.
            let slot = match by_participant {
                true => fucina_thread::current_participant().unwrap_or(0),
                false => r.start / chunk_size,
            };
            if let Some(mut guard) = leases.get(slot).and_then(|m| m.try_lock().ok())
                && let Some(scratch) = guard.as_mut()
            {
                return f(r.clone(), rows_out, scratch);
            }
            match shared.acquire_scratch::<S>(scratch_len) {
                Ok(mut scratch) => f(r.clone(), rows_out, &mut scratch),
                Err(e) => {
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            }
        });
        // The leases go back here, on the calling thread (its local tier), last
        // slot first: the pool's lists are last-in first-out, so the next call
        // hands every slot the slab it had, still in the cache of the core that
        // used it.
        for slot in leases.iter_mut().rev() {
            drop(slot.get_mut().unwrap_or_else(|p| p.into_inner()).take());
        }
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(ExecError::storage(op, e)),
            None => Ok(()),
        }
    }
}

/// One chunk of a parallel [`ExecContext::par_rows`] call: its rows and the
/// matching items of the output.
type RowPiece<'a, T> = (Range<usize>, &'a mut [T]);

/// Splits `out` (rows of `row_len` items) into the disjoint pieces of `chunks`, on
/// the stack (at most [`MAX_CHUNKS`]: no allocation); returns them and their count.
fn split_rows<T>(
    out: &mut [T],
    row_len: usize,
    chunks: ChunkRanges,
) -> ([RowPiece<'_, T>; MAX_CHUNKS], usize) {
    let mut pieces: [RowPiece<'_, T>; MAX_CHUNKS] = std::array::from_fn(|_| (0..0, &mut [][..]));
    let mut rest = out;
    let mut n = 0;
    for r in chunks {
        let (head, tail) = rest.split_at_mut((r.end - r.start) * row_len);
        pieces[n] = (r, head);
        rest = tail;
        n += 1;
    }
    (pieces, n)
}

/// Walks the rows `rows` of a [`par_rows`](ExecContext::par_rows) chunk, whose
/// items `out` holds (`row_len` per row), in runs of consecutive rows with the
/// same `row / period` (e.g. the rows of one batch or one outer position):
/// `f(row / period, run, run_items)` for each run, in order. A `period` of
/// `usize::MAX` makes the whole chunk one run.
pub(crate) fn for_each_run<T>(
    rows: Range<usize>,
    period: usize,
    row_len: usize,
    out: &mut [T],
    mut f: impl FnMut(usize, Range<usize>, &mut [T]),
) {
    let period = period.max(1);
    let (mut r, mut rest) = (rows.start, out);
    while r < rows.end {
        let outer = r / period;
        let end = (outer + 1).saturating_mul(period).min(rows.end);
        let (head, tail) = rest.split_at_mut((end - r) * row_len);
        f(outer, r..end, head);
        (r, rest) = (end, tail);
    }
}

#[cfg(test)]
mod tests {
    use super::for_each_run;

    /// The runs `(outer, rows)` `for_each_run` hands out for `rows` and
    /// `period` (two items per row), checking each run's items.
    fn runs(rows: std::ops::Range<usize>, period: usize) -> Vec<(usize, std::ops::Range<usize>)> {
        let mut out: Vec<usize> = (rows.start * 2..rows.end * 2).collect();
        let mut seen = Vec::new();
        for_each_run(rows, period, 2, &mut out, |o, run, items| {
            let want: Vec<usize> = (run.start * 2..run.end * 2).collect();
            assert_eq!(items, &want[..], "items of run {run:?}");
            seen.push((o, run));
        });
        seen
    }

    #[test]
    fn runs_split_at_multiples_of_the_period() {
        assert_eq!(
            runs(5..17, 4),
            [(1, 5..8), (2, 8..12), (3, 12..16), (4, 16..17)]
        );
        assert_eq!(runs(8..12, 4), [(2, 8..12)]);
        assert_eq!(runs(3..3, 4), []);
        assert_eq!(runs(3..9, usize::MAX), [(0, 3..9)]);
        assert_eq!(runs(2..5, 1), [(2, 2..3), (3, 3..4), (4, 4..5)]);
    }
}
