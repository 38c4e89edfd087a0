//! The reference runtime's float-environment example (assert the default,
//! scope a change, probe exceptions), translated to Rust. Its last step (an
//! `ExecContext` checking its own environment) belongs to `fucina-exec`.

use std::hint::black_box;

use fucina_fpenv::{Environment, Guard, Probe, RoundingMode, UnderflowMode};

#[test]
fn assert_default_scope_a_change_probe_exceptions() -> Result<(), fucina_fpenv::FpEnvError> {
    let _env = Guard::begin();
    if !fucina_fpenv::SUPPORTED {
        return Ok(()); // nothing to observe on this target
    }

    // The contract every pinned numeric result in this library assumes.
    fucina_fpenv::assert_default()?;

    // A scoped change: the guard puts the environment back.
    {
        let mut guard = Guard::begin();
        // SAFETY: no compiler-generated floating-point code runs on this
        // thread before `guard.restore()` reinstates the default.
        unsafe {
            fucina_fpenv::set(Environment {
                rounding: RoundingMode::TowardZero,
                underflow: UnderflowMode::Gradual,
            })
        };
        let seen = fucina_fpenv::rounding_mode();
        guard.restore();
        assert_eq!(seen, Some(RoundingMode::TowardZero));
    }
    fucina_fpenv::assert_default()?;

    // Which exceptions did this region raise?
    let probe = Probe::begin();
    let huge = black_box(3.0e38_f32);
    let squared = huge * huge;
    black_box(squared);
    let raised = probe.end();
    assert!(
        raised.overflow,
        "3e38 * 3e38 must raise overflow, got {raised}"
    );
    assert!(raised.any_significant());
    fucina_fpenv::clear_exceptions();
    Ok(())
}
