//! [`ExecContext`]: the pool, the lazily created team and one-shot worker, the
//! float-environment record and the exec-scope stack of one runtime instance.

use std::any::Any;
use std::cell::{Cell, OnceCell, RefCell};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Mutex;

use fucina_fpenv::Environment;
use fucina_storage::{BufferPool, LocalPool, ScratchLease};
use fucina_thread::{ChunkRanges, OneShotWorker, Team, TeamOptions, ThreadError, chunk_ranges};

use crate::error::ExecError;
use crate::scope::ScopeStack;

/// The most participants a context's team may have (the caller plus 63 workers):
/// `fucina-thread`'s ceiling, re-exported so that both crates size their
/// per-participant arrays from one constant.
pub use fucina_thread::MAX_THREADS;

/// `chunk_ranges` yields at most four chunks per participant.
const MAX_CHUNKS: usize = 4 * MAX_THREADS;

/// Below this many elements of work (output elements times the per-element cost
/// weight an op passes), an op runs serially on the caller and never starts the
/// team.
///
/// Measured, not guessed: the `threshold` bench of this crate times a plain add
/// against the same add split over a two-participant team for sizes 2^10..2^17.
/// On a quiet 2-vCPU Xeon (AVX-512) the team wins from 2^13 elements on (742 ns
/// against 1.07 µs at 8,192; 1.56 against 2.15 µs at 16,384). Each parallel chunk
/// holds at least this much work, so a cheap op splits from 2^14 elements on.
pub const PARALLEL_THRESHOLD: usize = 1 << 13;

/// The execution context: every op, every tensor allocation and every exec scope
/// goes through one.
///
/// It owns its buffer pool (a [`LocalPool`] over a [`BufferPool`]; every tensor it creates is pooled storage that
/// returns to it when the last handle drops), a worker [`Team`] created lazily on
/// the first op large enough to go parallel, a lazily created [`OneShotWorker`],
/// the exec-scope stack, and the float environment recorded at creation.
///
/// One context is driven from one thread at a time: it is `Send` (move it to
/// another thread) but not `Sync` (ops take `&self` and use interior mutability).
/// The tensors it returns are `Send + Sync` values.
///
/// ```
/// use fucina_exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let x = ctx.from_slice(&[2, 2], &[1., 2., 3., 4.])?;
/// let y = ctx.scale(&x, 2.0)?;
/// assert_eq!(y.data()?, [2., 4., 6., 8.]);
/// drop((x, y));
/// ctx.close()?; // reports pooled buffers still alive, if any
/// # Ok::<(), fucina_exec::ExecError>(())
/// ```
///
/// # Teardown
/// Dropping (or [`close`](ExecContext::close)-ing) a context stops and joins the
/// one-shot worker, then the team, releases the values of exec scopes still open
/// (newest first) and the right-hand-side cache, then drops the layer extension.
///
/// Tensors may outlive their context, in any order of declaration (a struct
/// holding a context and tensors made on it drops fine): every pooled buffer
/// keeps its pool alive, stays valid, and is freed when its last handle drops.
/// Dropping a context is silent in every build. The leak check is explicit:
/// [`close`](ExecContext::close) returns [`ExecError::LeakedBuffers`] with the
/// number of pooled buffers still alive (a diagnostic of the working set a
/// program keeps; nothing unsafe happens to them), and
/// [`outstanding_buffers`](ExecContext::outstanding_buffers) gives the count at
/// any time.
pub struct ExecContext {
    pool: LocalPool,
    threads: usize,
    team: OnceCell<Team>,
    one_shot: OnceCell<OneShotWorker>,
    pub(crate) scopes: RefCell<ScopeStack>,
    fp_env: Option<Environment>,
    pub(crate) rhs_cache: RefCell<crate::ops::matmul::RhsCache>,
    extension: OnceCell<Box<dyn Any + Send>>,
    closed: Cell<bool>,
    _not_sync: PhantomData<Cell<()>>,
}

impl Default for ExecContext {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ExecContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecContext")
            .field("threads", &self.threads)
            .field(
                "team_started",
                &self.team.get().is_some_and(Team::is_started),
            )
            .field("outstanding_buffers", &self.pool.outstanding_buffers())
            .field("scope_depth", &self.scopes.borrow().depth())
            .field("float_environment_at_init", &self.fp_env)
            .finish()
    }
}

impl ExecContext {
    /// A context whose team has one participant per schedulable core (the
    /// `fucina-thread` knobs decide; the caller is participant 0). Cannot fail,
    /// takes nothing from the pool and starts no thread.
    pub fn new() -> Self {
        let workers = TeamOptions::default().max_workers;
        Self::with_threads(workers + 1)
    }

    /// A context with a fixed team size of `threads` participants (the caller plus
    /// `threads - 1` workers); `0` is treated as `1` (every op serial) and values
    /// above [`MAX_THREADS`] as [`MAX_THREADS`].
    ///
    /// The size also fixes how ops split their work into chunks, but never their
    /// results: every op is bitwise identical for every team size.
    pub fn with_threads(threads: usize) -> Self {
        ExecContext {
            pool: BufferPool::new().local(),
            threads: threads.clamp(1, MAX_THREADS),
            team: OnceCell::new(),
            one_shot: OnceCell::new(),
            scopes: RefCell::new(ScopeStack::default()),
            fp_env: fucina_fpenv::get(),
            rhs_cache: RefCell::new(Default::default()),
            extension: OnceCell::new(),
            closed: Cell::new(false),
            _not_sync: PhantomData,
        }
    }

    /// The team size this context splits work for (participants, caller included).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The context's pool: a [`LocalPool`] (the non-shared tier, hits and releases
    /// on the driving thread take no lock and no atomic) in front of the context's
    /// own [`BufferPool`] ([`LocalPool::pool`]). Every tensor the context creates
    /// comes from here, and its storage returns here when the last handle drops
    /// (through the shared tier when that happens on another thread).
    pub fn pool(&self) -> &LocalPool {
        &self.pool
    }

    /// The worker team, created on the first call (its threads start on the first
    /// parallel dispatch).
    ///
    /// # Errors
    /// The team's creation error; the next call tries again.
    pub fn try_team(&self) -> Result<&Team, ThreadError> {
        if let Some(t) = self.team.get() {
            return Ok(t);
        }
        let team = Team::new(TeamOptions {
            max_workers: self.threads - 1,
        })?;
        Ok(self.team.get_or_init(|| team))
    }

    /// [`try_team`](ExecContext::try_team), with `None` on error.
    pub fn team(&self) -> Option<&Team> {
        self.try_team().ok()
    }

    /// The former name of [`try_team`](ExecContext::try_team).
    ///
    /// # Errors
    /// As [`try_team`](ExecContext::try_team).
    #[deprecated(note = "renamed to `try_team` (`pool()` is the buffer pool)")]
    pub fn try_work_pool(&self) -> Result<&Team, ThreadError> {
        self.try_team()
    }

    /// The former name of [`team`](ExecContext::team).
    #[deprecated(note = "renamed to `team` (`pool()` is the buffer pool)")]
    pub fn work_pool(&self) -> Option<&Team> {
        self.team()
    }

    /// The one-shot worker (for overlapping two branches, e.g. independent backward
    /// matmuls), created on the first call; its thread starts on first use.
    pub fn one_shot_worker(&self) -> &OneShotWorker {
        self.one_shot.get_or_init(OneShotWorker::new)
    }

    /// Per-context state of the layer built on this one (the autograd layer keeps
    /// its graph-node free list here), created by `init` on the first call and
    /// dropped at teardown after the open exec scopes are released. One layer,
    /// one type: the first call fixes `T`.
    ///
    /// # Panics
    /// If an earlier call stored another type (two layers sharing one context
    /// slot is a programming error).
    pub fn extension<T: Any + Send>(&self, init: impl FnOnce() -> T) -> &T {
        self.extension
            .get_or_init(|| Box::new(init()))
            .downcast_ref::<T>()
            .expect("ExecContext::extension: the slot holds another layer's type")
    }

    /// The calling thread's float environment when the context was created
    /// (`None` where the target cannot observe it).
    pub fn float_environment_at_init(&self) -> Option<Environment> {
        self.fp_env
    }

    /// Checks that the calling thread's float environment is the one recorded at
    /// creation.
    ///
    /// # Errors
    /// [`ExecError::FloatEnvironmentChanged`] with both environments.
    pub fn check_float_environment(&self) -> Result<(), ExecError> {
        match (self.fp_env, fucina_fpenv::get()) {
            (Some(at_init), Some(now)) if at_init != now => {
                Err(ExecError::FloatEnvironmentChanged { at_init, now })
            }
            _ => Ok(()),
        }
    }

    /// Pooled buffers of this context currently alive (tensors, views' storage,
    /// scratch leases).
    pub fn outstanding_buffers(&self) -> usize {
        self.pool.outstanding_buffers()
    }

    /// Tears the context down (see the type docs) and reports leaks: the
    /// explicit form of the drop, for programs that want to check that they
    /// released everything.
    ///
    /// # Errors
    /// [`ExecError::LeakedBuffers`] with the count if pooled buffers of this
    /// context are still alive. They stay valid (they keep the pool alive) and
    /// are freed when their last handle drops; the context is torn down either way.
    pub fn close(self) -> Result<(), ExecError> {
        let mut this = self;
        let leaked = this.teardown();
        this.closed.set(true);
        match leaked {
            0 => Ok(()),
            count => Err(ExecError::LeakedBuffers { count }),
        }
    }

    /// Stops the workers, releases open scopes, returns the outstanding count.
    fn teardown(&mut self) -> usize {
        drop(self.one_shot.take());
        drop(self.team.take());
        let open = self.scopes.get_mut().depth();
        for _ in 0..open {
            self.scopes.get_mut().force_close_innermost();
        }
        self.rhs_cache.get_mut().clear();
        // After the scopes: their nodes may return to a free list kept here.
        drop(self.extension.take());
        self.pool.outstanding_buffers()
    }

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

    /// The team and the chunks a [`par_rows`](Self::par_rows) call over `rows`
    /// rows of `work_per_row` each runs on, or `None` when it runs serially on the
    /// caller (one participant, one row, too little work, or a call from inside a
    /// parallel region).
    fn row_chunks(&self, rows: usize, work_per_row: usize) -> Option<(&Team, ChunkRanges)> {
        let work = rows.saturating_mul(work_per_row.max(1));
        if self.threads <= 1
            || rows <= 1
            || work < PARALLEL_THRESHOLD
            || fucina_thread::in_parallel_region()
        {
            return None;
        }
        let team = self.team()?;
        let grain = (PARALLEL_THRESHOLD / work_per_row.max(1)).max(1);
        Some((team, chunk_ranges(0, rows, grain, self.threads)))
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

impl Drop for ExecContext {
    /// Silent in every build: buffers still alive keep what they need (their
    /// pool) and are freed when they go. Use [`ExecContext::close`] to learn
    /// about them.
    fn drop(&mut self) {
        if !self.closed.get() {
            self.teardown();
        }
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
