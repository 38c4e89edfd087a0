//! [`ExecContext`]: the pool, the lazily created team and one-shot worker, the
//! float-environment record and the exec-scope stack of one runtime instance.

use std::any::Any;
use std::cell::{Cell, OnceCell, RefCell};
use std::marker::PhantomData;

use fucina_fpenv::Environment;
use fucina_storage::{BufferPool, LocalPool};
use fucina_thread::{OneShotWorker, Team, TeamOptions, ThreadError};

use crate::error::ExecError;
use crate::rhs_cache::RhsCache;
use crate::scope_stack::ScopeStack;

/// The most participants a context's team may have (the caller plus 63 workers):
/// `fucina-thread`'s ceiling, re-exported so that both crates size their
/// per-participant arrays from one constant.
pub use fucina_thread::MAX_THREADS;

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
    scopes: RefCell<ScopeStack>,
    fp_env: Option<Environment>,
    rhs_cache: RefCell<RhsCache>,
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

    /// The exec-scope stack (the scope operations are in `scope.rs`).
    pub(crate) fn scopes(&self) -> &RefCell<ScopeStack> {
        &self.scopes
    }

    /// The cache of packed right-hand sides (filled by the matmul ops).
    pub(crate) fn rhs_cache(&self) -> &RefCell<RhsCache> {
        &self.rhs_cache
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
