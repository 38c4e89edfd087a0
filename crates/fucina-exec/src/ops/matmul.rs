//! `matmul`, `linear` and the right-hand-side lifetime of reference §6.7.
//! PLACEHOLDER: only the option types exist yet; the kernels are being written.

/// How long the bytes of a matmul right-hand side stay unchanged (reference §6.7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RhsLifetime {
    /// Ordinary storage: no prepared form is kept beyond this call.
    #[default]
    Transient,
    /// The caller promises the storage's bytes never change while it lives (a
    /// weight); a prepared form (packed panels) may be cached and reused.
    StableProcess,
}

impl RhsLifetime {
    /// True for [`RhsLifetime::StableProcess`].
    pub fn is_cacheable(self) -> bool {
        matches!(self, RhsLifetime::StableProcess)
    }
}

/// Options of [`ExecContext::matmul_with`](crate::ExecContext).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulOptions {
    /// The right-hand side's lifetime.
    pub rhs_lifetime: RhsLifetime,
}

/// Prepared right-hand sides of `StableProcess` matmuls.
#[derive(Default)]
pub(crate) struct RhsCache {}

impl RhsCache {
    pub(crate) fn clear(&mut self) {}
}
