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
    // Infallible by construction (installing the default is always possible
    // where the environment is observable); deliberately no assertion here: a
    // panic in a worker before its startup latch would hang the team's start.
    fucina_fpenv::reset_to_default();
}
