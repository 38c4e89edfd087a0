//! The floating-point environment of the threads this crate starts.
//!
//! On Linux a new thread inherits its creator's floating-point control
//! register (MXCSR / FPCR: rounding mode and flush-to-zero; see
//! `docs/FPENV.md`, which pins this in a test). A team worker is spawned by
//! whichever thread happened to make the first parallel call, so without a
//! reset its numerics would depend on what that thread had set at that moment.
//! Every thread this crate starts (team workers, the one-shot helper, task-pool
//! threads) therefore installs the default IEEE environment (round to
//! nearest-even, gradual underflow) before it runs any task.

/// Puts the calling (freshly started) thread in the default floating-point
/// environment. A no-op on targets where `fucina-fpenv` cannot observe it.
pub(crate) fn enter_default_environment() {
    fucina_fpenv::reset_to_default();
    debug_assert!(
        fucina_fpenv::assert_default().is_ok(),
        "fucina-thread: a worker thread could not install the default float environment"
    );
}
