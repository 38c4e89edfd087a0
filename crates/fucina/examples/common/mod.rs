//! Flag defaults and checks every example job shares (each `job.rs` includes
//! this file with `#[path]`).

use fucina::{Error, ExecContext, Result};

/// The default of `--threads`: the team size [`ExecContext::new`] picks (one
/// participant per physical core this process may run on, lowered by a cgroup
/// CPU quota and by `FUCINA_MAX_THREADS`, at most [`fucina::exec::MAX_THREADS`]).
/// Results never depend on it.
pub(crate) fn default_threads() -> usize {
    ExecContext::new().threads()
}

/// Checks `--threads`: 1 to [`fucina::exec::MAX_THREADS`] (the context would
/// clamp anything else silently).
pub(crate) fn check_threads(threads: usize) -> Result<()> {
    if threads == 0 || threads > fucina::exec::MAX_THREADS {
        return Err(Error::InvalidArgument {
            what: "--threads",
            reason: format!(
                "must be in 1..={} (got {threads})",
                fucina::exec::MAX_THREADS
            ),
        });
    }
    Ok(())
}

/// Checks that every `(flag, value)` is at least 1.
pub(crate) fn check_at_least_one(flags: &[(&'static str, usize)]) -> Result<()> {
    for &(what, v) in flags {
        if v == 0 {
            return Err(Error::InvalidArgument {
                what,
                reason: "must be at least 1".into(),
            });
        }
    }
    Ok(())
}
