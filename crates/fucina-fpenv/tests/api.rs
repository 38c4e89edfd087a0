//! Architecture-neutral behaviour of the public API: value types, the flag
//! functions, `Guard` and `Probe`. Runs on every target; where the target is
//! unsupported it checks the "cannot observe" answers instead.

use std::panic;

use fucina_fpenv::{
    DEFAULT_ENVIRONMENT, Environment, Exceptions, FpEnvError, Guard, Probe, RoundingMode,
    UnderflowMode,
};

const ALL_ENVIRONMENTS: [Environment; 8] = {
    let r = [
        RoundingMode::NearestEven,
        RoundingMode::TowardZero,
        RoundingMode::Upward,
        RoundingMode::Downward,
    ];
    let mut out = [DEFAULT_ENVIRONMENT; 8];
    let mut i = 0;
    while i < 8 {
        out[i] = Environment {
            rounding: r[i % 4],
            underflow: if i < 4 {
                UnderflowMode::Gradual
            } else {
                UnderflowMode::FlushToZero
            },
        };
        i += 1;
    }
    out
};

/// The six single-flag sets, in field order.
fn singles() -> [Exceptions; 6] {
    let none = Exceptions::NONE;
    [
        Exceptions {
            invalid: true,
            ..none
        },
        Exceptions {
            division_by_zero: true,
            ..none
        },
        Exceptions {
            overflow: true,
            ..none
        },
        Exceptions {
            underflow: true,
            ..none
        },
        Exceptions {
            inexact: true,
            ..none
        },
        Exceptions {
            denormal: true,
            ..none
        },
    ]
}

#[test]
fn default_environment_is_nearest_even_gradual() {
    assert_eq!(DEFAULT_ENVIRONMENT.rounding, RoundingMode::NearestEven);
    assert_eq!(DEFAULT_ENVIRONMENT.underflow, UnderflowMode::Gradual);
    assert_eq!(Environment::default(), DEFAULT_ENVIRONMENT);
    let defaults = ALL_ENVIRONMENTS.iter().filter(|e| e.is_default()).count();
    assert_eq!(defaults, 1);
    assert!(DEFAULT_ENVIRONMENT.is_default());
}

#[test]
fn exceptions_predicates_and_union() {
    assert_eq!(Exceptions::default(), Exceptions::NONE);
    assert!(!Exceptions::NONE.any());
    assert!(!Exceptions::NONE.any_significant());
    assert!(Exceptions::ALL.any_significant());
    for (i, single) in singles().into_iter().enumerate() {
        assert!(single.any());
        // Only `inexact` (index 4) is insignificant.
        assert_eq!(single.any_significant(), i != 4, "{single}");
        assert_eq!(single.union_with(Exceptions::NONE), single);
        assert_eq!(single.union_with(Exceptions::ALL), Exceptions::ALL);
    }
    let all = singles()
        .into_iter()
        .fold(Exceptions::NONE, Exceptions::union_with);
    assert_eq!(all, Exceptions::ALL);
    let a = Exceptions {
        overflow: true,
        inexact: true,
        ..Exceptions::NONE
    };
    let b = Exceptions {
        invalid: true,
        inexact: true,
        ..Exceptions::NONE
    };
    assert_eq!(
        a.union_with(b),
        Exceptions {
            invalid: true,
            overflow: true,
            inexact: true,
            ..Exceptions::NONE
        }
    );
}

#[test]
fn exceptions_display() {
    assert_eq!(Exceptions::NONE.to_string(), "none");
    let names: Vec<String> = singles().iter().map(ToString::to_string).collect();
    assert_eq!(
        names,
        [
            "invalid",
            "division_by_zero",
            "overflow",
            "underflow",
            "inexact",
            "denormal"
        ]
    );
    let e = Exceptions {
        inexact: true,
        overflow: true,
        ..Exceptions::NONE
    };
    assert_eq!(e.to_string(), "overflow|inexact");
    assert_eq!(
        Exceptions::ALL.to_string(),
        "invalid|division_by_zero|overflow|underflow|inexact|denormal"
    );
}

#[test]
fn environment_display_and_error_message() {
    let env = Environment {
        rounding: RoundingMode::TowardZero,
        underflow: UnderflowMode::FlushToZero,
    };
    assert_eq!(
        env.to_string(),
        "rounding toward_zero, underflow flush_to_zero"
    );
    let err = FpEnvError::NonDefaultFloatEnvironment { found: env };
    let msg = err.to_string();
    assert!(
        msg.contains("found rounding toward_zero, underflow flush_to_zero"),
        "{msg}"
    );
    assert!(
        msg.contains("expected rounding nearest_even, underflow gradual"),
        "{msg}"
    );
}

#[test]
fn trap_error_message_names_the_traps_and_the_environment() {
    let err = FpEnvError::ExceptionTrapsEnabled {
        traps: Exceptions {
            invalid: true,
            division_by_zero: true,
            ..Exceptions::NONE
        },
        found: DEFAULT_ENVIRONMENT,
    };
    let msg = err.to_string();
    assert!(
        msg.contains("exception traps enabled on this thread: invalid|division_by_zero"),
        "{msg}"
    );
    assert!(msg.contains("expected every exception masked"), "{msg}");
    assert!(
        msg.contains("found: rounding nearest_even, underflow gradual"),
        "{msg}"
    );
}

#[test]
fn traps_start_masked_and_guard_snapshots_them() {
    let guard = Guard::begin();
    if fucina_fpenv::SUPPORTED {
        assert_eq!(fucina_fpenv::enabled_traps(), Some(Exceptions::NONE));
        assert_eq!(guard.saved_traps(), Some(Exceptions::NONE));
    } else {
        assert_eq!(fucina_fpenv::enabled_traps(), None);
        assert_eq!(guard.saved_traps(), None);
    }
}

#[test]
fn getters_agree_and_start_default() {
    let _env = Guard::begin();
    assert_eq!(fucina_fpenv::get().is_some(), fucina_fpenv::SUPPORTED);
    assert_eq!(
        fucina_fpenv::rounding_mode(),
        fucina_fpenv::get().map(|e| e.rounding)
    );
    assert_eq!(
        fucina_fpenv::underflow_mode(),
        fucina_fpenv::get().map(|e| e.underflow)
    );
    // Test threads are spawned by the harness from a default main thread.
    fucina_fpenv::assert_default().unwrap();
}

#[test]
fn set_round_trips_every_environment_and_assert_default_reports_it() {
    let _env = Guard::begin();
    for env in ALL_ENVIRONMENTS {
        let mut guard = Guard::begin();
        // SAFETY: only reads of the control register run before
        // `guard.restore()` reinstates the default.
        unsafe { fucina_fpenv::set(env) };
        let seen = fucina_fpenv::get();
        let checked = fucina_fpenv::assert_default();
        guard.restore();
        if fucina_fpenv::SUPPORTED {
            assert_eq!(seen, Some(env));
            if env.is_default() {
                assert_eq!(checked, Ok(()));
            } else {
                assert_eq!(
                    checked,
                    Err(FpEnvError::NonDefaultFloatEnvironment { found: env })
                );
            }
        } else {
            assert_eq!(seen, None);
            assert_eq!(checked, Ok(()));
        }
        fucina_fpenv::assert_default().unwrap();
    }
}

#[test]
fn reset_to_default_repairs() {
    let _env = Guard::begin();
    // SAFETY: nothing but register reads runs before `reset_to_default`.
    unsafe {
        fucina_fpenv::set(Environment {
            rounding: RoundingMode::Downward,
            underflow: UnderflowMode::FlushToZero,
        })
    };
    let before = fucina_fpenv::assert_default();
    fucina_fpenv::reset_to_default();
    assert_eq!(before.is_err(), fucina_fpenv::SUPPORTED);
    fucina_fpenv::assert_default().unwrap();
}

#[test]
fn raise_replaces_and_clear_clears_only_the_flags() {
    let _env = Guard::begin();
    for single in singles() {
        fucina_fpenv::raise_exceptions(Exceptions::ALL);
        fucina_fpenv::raise_exceptions(single);
        let after_raise = fucina_fpenv::test_exceptions();
        fucina_fpenv::clear_exceptions();
        let after_clear = fucina_fpenv::test_exceptions();
        if fucina_fpenv::SUPPORTED {
            assert_eq!(after_raise, single, "raise must replace, not add");
        } else {
            assert_eq!(after_raise, Exceptions::NONE);
        }
        assert_eq!(after_clear, Exceptions::NONE);
    }
    // Flag writes leave the control state alone, and control writes leave the
    // flags alone.
    let env = Environment {
        rounding: RoundingMode::Upward,
        underflow: UnderflowMode::FlushToZero,
    };
    let mut guard = Guard::begin();
    // SAFETY: only register reads and writes run before `guard.restore()`.
    unsafe { fucina_fpenv::set(env) };
    fucina_fpenv::raise_exceptions(Exceptions::ALL);
    fucina_fpenv::clear_exceptions();
    let env_after_flags = fucina_fpenv::get();
    fucina_fpenv::raise_exceptions(Exceptions {
        overflow: true,
        ..Exceptions::NONE
    });
    guard.restore();
    let flags_after_restore = fucina_fpenv::test_exceptions();
    fucina_fpenv::clear_exceptions();
    if fucina_fpenv::SUPPORTED {
        assert_eq!(env_after_flags, Some(env));
        assert_eq!(
            flags_after_restore,
            Exceptions {
                overflow: true,
                ..Exceptions::NONE
            }
        );
    }
}

#[test]
fn guard_restore_is_idempotent_and_drop_restores_again() {
    let _env = Guard::begin();
    let tz = Environment {
        rounding: RoundingMode::TowardZero,
        underflow: UnderflowMode::Gradual,
    };
    let mut observed = Vec::new();
    {
        let mut guard = Guard::begin();
        assert_eq!(guard.saved(), fucina_fpenv::get());
        // SAFETY: only register reads and writes run until the guard's drop.
        unsafe { fucina_fpenv::set(tz) };
        guard.restore();
        guard.restore();
        observed.push(fucina_fpenv::get());
        // SAFETY: as above.
        unsafe { fucina_fpenv::set(tz) };
        observed.push(fucina_fpenv::get());
        // The drop restores once more.
    }
    observed.push(fucina_fpenv::get());
    if fucina_fpenv::SUPPORTED {
        let d = Some(DEFAULT_ENVIRONMENT);
        assert_eq!(observed, [d, Some(tz), d]);
    } else {
        assert_eq!(observed, [None, None, None]);
    }
}

#[test]
fn nested_guards_restore_their_own_snapshots() {
    let _env = Guard::begin();
    let up = Environment {
        rounding: RoundingMode::Upward,
        underflow: UnderflowMode::Gradual,
    };
    let down_ftz = Environment {
        rounding: RoundingMode::Downward,
        underflow: UnderflowMode::FlushToZero,
    };
    let mut outer = Guard::begin();
    // SAFETY: only register reads and writes run before `outer.restore()`.
    unsafe { fucina_fpenv::set(up) };
    let mut inner = Guard::begin();
    // SAFETY: as above.
    unsafe { fucina_fpenv::set(down_ftz) };
    let in_inner = fucina_fpenv::get();
    let inner_saved = inner.saved();
    inner.restore();
    let after_inner = fucina_fpenv::get();
    outer.restore();
    let after_outer = fucina_fpenv::get();
    if fucina_fpenv::SUPPORTED {
        assert_eq!(in_inner, Some(down_ftz));
        assert_eq!(inner_saved, Some(up));
        assert_eq!(after_inner, Some(up));
        assert_eq!(after_outer, Some(DEFAULT_ENVIRONMENT));
    }
}

/// The hazard `set`'s safety section describes: a guard begun while a
/// non-default environment is installed re-installs it on drop, even after a
/// `reset_to_default` inside the guard's scope. So the obligation of the `set`
/// call lasts until such a guard is gone and the default is back after it.
#[test]
fn a_guard_begun_off_default_reinstalls_that_state_after_a_reset() {
    let _env = Guard::begin();
    let ftz = Environment {
        rounding: RoundingMode::NearestEven,
        underflow: UnderflowMode::FlushToZero,
    };
    // SAFETY: only register reads and writes (no floating-point code) run
    // until the final `reset_to_default`.
    unsafe { fucina_fpenv::set(ftz) };
    let guard = Guard::begin();
    fucina_fpenv::reset_to_default();
    let inside = fucina_fpenv::get();
    drop(guard);
    let after_drop = fucina_fpenv::get();
    fucina_fpenv::reset_to_default();
    if fucina_fpenv::SUPPORTED {
        assert_eq!(inside, Some(DEFAULT_ENVIRONMENT));
        assert_eq!(after_drop, Some(ftz));
        assert_eq!(fucina_fpenv::get(), Some(DEFAULT_ENVIRONMENT));
    } else {
        assert_eq!([inside, after_drop], [None, None]);
    }
}

#[test]
fn guard_restores_when_the_guarded_code_panics() {
    let _env = Guard::begin();
    let result = panic::catch_unwind(|| {
        let _guard = Guard::begin();
        // SAFETY: the closure runs no floating-point code: it panics with a
        // static message, and the guard restores during unwinding.
        unsafe {
            fucina_fpenv::set(Environment {
                rounding: RoundingMode::Upward,
                underflow: UnderflowMode::FlushToZero,
            })
        };
        if fucina_fpenv::get().is_some_and(|e| !e.is_default()) || !fucina_fpenv::SUPPORTED {
            panic!("intentional panic inside a Guard (expected by this test)");
        }
    });
    assert!(result.is_err(), "the closure must have panicked");
    fucina_fpenv::assert_default().unwrap();
}

#[test]
fn probe_reports_its_region_and_keeps_the_outer_history() {
    let _env = Guard::begin();
    let overflow = Exceptions {
        overflow: true,
        ..Exceptions::NONE
    };
    let invalid = Exceptions {
        invalid: true,
        ..Exceptions::NONE
    };
    let underflow = Exceptions {
        underflow: true,
        ..Exceptions::NONE
    };

    fucina_fpenv::raise_exceptions(underflow); // history before any probe
    let outer = Probe::begin();
    let outer_start = outer.sample();
    fucina_fpenv::raise_exceptions(overflow); // raised in the outer region
    let inner = Probe::begin();
    let inner_start = inner.sample();
    fucina_fpenv::raise_exceptions(fucina_fpenv::test_exceptions().union_with(invalid));
    let inner_raised = inner.end();
    let outer_mid = outer.sample();
    let outer_raised = outer.end();
    let thread_after = fucina_fpenv::test_exceptions();
    fucina_fpenv::clear_exceptions();

    if fucina_fpenv::SUPPORTED {
        assert_eq!(outer_start, Exceptions::NONE, "begin clears");
        assert_eq!(inner_start, Exceptions::NONE, "begin clears");
        assert_eq!(
            inner_raised, invalid,
            "the inner probe sees only its region"
        );
        assert_eq!(outer_mid, overflow.union_with(invalid));
        assert_eq!(
            outer_raised,
            overflow.union_with(invalid),
            "outer keeps its history"
        );
        assert_eq!(
            thread_after,
            underflow.union_with(overflow).union_with(invalid)
        );
    } else {
        for e in [
            outer_start,
            inner_start,
            inner_raised,
            outer_mid,
            outer_raised,
            thread_after,
        ] {
            assert_eq!(e, Exceptions::NONE);
        }
    }
}

#[test]
fn probe_dropped_without_end_merges_back() {
    let _env = Guard::begin();
    let before = Exceptions {
        denormal: true,
        ..Exceptions::NONE
    };
    let inside = Exceptions {
        division_by_zero: true,
        ..Exceptions::NONE
    };
    fucina_fpenv::raise_exceptions(before);
    {
        let probe = Probe::begin();
        fucina_fpenv::raise_exceptions(inside);
        assert_eq!(
            probe.sample(),
            if fucina_fpenv::SUPPORTED {
                inside
            } else {
                Exceptions::NONE
            }
        );
        // dropped here without `end`
    }
    let after = fucina_fpenv::test_exceptions();
    fucina_fpenv::clear_exceptions();
    if fucina_fpenv::SUPPORTED {
        assert_eq!(after, before.union_with(inside));
    }
}

#[test]
fn probe_survives_a_panic_in_its_region() {
    let _env = Guard::begin();
    let before = Exceptions {
        inexact: true,
        ..Exceptions::NONE
    };
    fucina_fpenv::raise_exceptions(before);
    let outer = Probe::begin();
    let result = panic::catch_unwind(|| {
        let _inner = Probe::begin();
        fucina_fpenv::raise_exceptions(Exceptions {
            overflow: true,
            ..Exceptions::NONE
        });
        panic!("intentional panic inside a Probe (expected by this test)");
    });
    assert!(result.is_err());
    let outer_raised = outer.end();
    let after = fucina_fpenv::test_exceptions();
    fucina_fpenv::clear_exceptions();
    if fucina_fpenv::SUPPORTED {
        assert_eq!(
            outer_raised,
            Exceptions {
                overflow: true,
                ..Exceptions::NONE
            }
        );
        assert_eq!(
            after,
            Exceptions {
                overflow: true,
                inexact: true,
                ..Exceptions::NONE
            }
        );
    }
}
