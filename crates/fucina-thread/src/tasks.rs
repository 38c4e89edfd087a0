//! General tasks (spawn many small tasks, then wait for them and help run them) on a private
//! `rayon-core` thread pool — deliberately *not* the hot fork-join team.
//!
//! `rayon-core` is not loom-modelled, so this module uses `std` directly for
//! its one-time lazy-start lock instead of the crate's `sync` shim.

use std::sync::{Mutex, OnceLock, PoisonError};

use crate::error::ThreadError;
use crate::knobs::{MAX_THREADS, cpu_thread_count};

/// A lazily built pool for many small independent tasks that may borrow
/// from the caller, with a scoped API: [`scope`](Self::scope) returns only
/// after every task spawned in it has finished.
///
/// The pool is a private `rayon_core::ThreadPool` (its own threads, separate
/// from rayon's global pool and from the crate's fork-join team), built on
/// first use with [`TaskPool::default_threads`] workers unless an explicit
/// count was given. Use it for irregular, coarse work (I/O-ish jobs,
/// independent graph branches); use the team for data-parallel kernels.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use fucina_thread::TaskPool;
///
/// let pool = TaskPool::new();
/// let hits: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
/// pool.scope(|s| {
///     for hit in &hits {
///         s.spawn(move |_| {
///             hit.fetch_add(1, Ordering::Relaxed);
///         });
///     }
/// })?;
/// assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
/// # Ok::<(), fucina_thread::ThreadError>(())
/// ```
pub struct TaskPool {
    /// Requested worker count; 0 = [`TaskPool::default_threads`] at build time.
    threads: usize,
    pool: OnceLock<rayon_core::ThreadPool>,
    /// Serializes the (fallible, retried) lazy build.
    build_lock: Mutex<()>,
}

/// The spawn handle of one [`TaskPool::scope`]: tasks spawned through it may
/// borrow anything that outlives `'scope`.
pub struct TaskScope<'a, 'scope> {
    inner: &'a rayon_core::Scope<'scope>,
}

impl<'scope> TaskScope<'_, 'scope> {
    /// Spawns `task` on the pool. It receives the scope, so it can spawn more
    /// tasks; the enclosing [`TaskPool::scope`] waits for all of them.
    pub fn spawn<F>(&self, task: F)
    where
        F: FnOnce(&TaskScope<'_, 'scope>) + Send + 'scope,
    {
        self.inner.spawn(move |s| task(&TaskScope { inner: s }));
    }
}

impl std::fmt::Debug for TaskScope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskScope").finish_non_exhaustive()
    }
}

impl TaskPool {
    /// A pool of [`TaskPool::default_threads`] workers, built on first use.
    pub const fn new() -> Self {
        Self::with_threads(0)
    }

    /// A pool of exactly `threads` workers (0 = the default), built on first use.
    pub const fn with_threads(threads: usize) -> Self {
        Self {
            threads,
            pool: OnceLock::new(),
            build_lock: Mutex::new(()),
        }
    }

    /// The default worker count: `cpu_thread_count(MAX_THREADS) - 1` (the
    /// calling thread is the remaining participant), at least 1.
    pub fn default_threads() -> usize {
        cpu_thread_count(MAX_THREADS).saturating_sub(1).max(1)
    }

    /// The worker count this pool has (once built) or will have.
    pub fn num_threads(&self) -> usize {
        match self.pool.get() {
            Some(pool) => pool.current_num_threads(),
            None if self.threads > 0 => self.threads,
            None => Self::default_threads(),
        }
    }

    /// Whether the pool's threads have been started.
    pub fn is_started(&self) -> bool {
        self.pool.get().is_some()
    }

    /// Builds the pool if it is not built yet (idempotent; a failed build is
    /// retried by the next call).
    ///
    /// # Errors
    ///
    /// [`ThreadError::Spawn`] when `rayon-core` cannot start the pool's threads.
    pub fn start(&self) -> Result<(), ThreadError> {
        self.pool().map(|_| ())
    }

    fn pool(&self) -> Result<&rayon_core::ThreadPool, ThreadError> {
        if let Some(pool) = self.pool.get() {
            return Ok(pool);
        }
        let _guard = self
            .build_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(pool) = self.pool.get() {
            return Ok(pool);
        }
        let threads = if self.threads > 0 {
            self.threads
        } else {
            Self::default_threads()
        };
        let pool = rayon_core::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("fucina-task-{i}"))
            // Tasks never depend on the spawner's float environment.
            .start_handler(|_| crate::fp::enter_default_environment())
            .build()
            .map_err(|e| ThreadError::Spawn {
                what: format!("task pool of {threads} threads"),
                source: std::io::Error::other(e),
            })?;
        Ok(self.pool.get_or_init(|| pool))
    }

    /// Runs `op` on the calling thread with a [`TaskScope`] for spawning tasks
    /// onto the pool, then waits until every spawned task (including tasks
    /// spawned by tasks) has finished, and returns `op`'s result.
    ///
    /// Tasks may borrow data that outlives the call. The calling thread does
    /// not run tasks itself; it blocks until they are done.
    ///
    /// # Errors
    ///
    /// [`ThreadError::Spawn`] when the pool had to be built and could not be;
    /// `op` has not run then.
    ///
    /// # Panics
    ///
    /// If `op` or any task panics, the panic is resumed on the caller after
    /// all tasks have finished (as `rayon_core::ThreadPool::in_place_scope`).
    pub fn scope<'scope, OP, R>(&self, op: OP) -> Result<R, ThreadError>
    where
        OP: FnOnce(&TaskScope<'_, 'scope>) -> R,
    {
        let pool = self.pool()?;
        Ok(pool.in_place_scope(|s| op(&TaskScope { inner: s })))
    }
}

impl Default for TaskPool {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for TaskPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskPool")
            .field("requested_threads", &self.threads)
            .field("started", &self.is_started())
            .finish()
    }
}
