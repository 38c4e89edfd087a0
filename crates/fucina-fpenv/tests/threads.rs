//! What a new thread starts with.
//!
//! Observed on Linux x86_64 (glibc, `std::thread::spawn`): the child inherits
//! the creator's control register at the moment of creation, the rounding
//! mode, flush-to-zero and the sticky exception flags alike (the kernel
//! copies the creator's FPU state on `clone`, and glibc's thread start does
//! not reset it; C11 requires the same of `thrd_create`). This test pins that
//! observation on Linux, so a change in the platform shows up here, and
//! checks the part that holds everywhere: a thread spawned from a default
//! thread starts in the default.
//!
//! Consequence (documented in the crate docs and docs/FPENV.md): never let a
//! worker's numerics depend on what it inherited; a team worker calls
//! `fucina_fpenv::assert_default()` when it starts.

use std::thread;

use fucina_fpenv::{Environment, Exceptions, Guard, RoundingMode, UnderflowMode};

/// What a freshly spawned thread observes first, before it repairs itself.
#[derive(Debug, PartialEq)]
struct FirstSight {
    env: Option<Environment>,
    flags: Exceptions,
}

fn spawn_and_look() -> FirstSight {
    thread::spawn(|| {
        let first = FirstSight {
            env: fucina_fpenv::get(),
            flags: fucina_fpenv::test_exceptions(),
        };
        // Whatever it inherited, leave this thread clean.
        fucina_fpenv::reset_to_default();
        fucina_fpenv::clear_exceptions();
        first
    })
    .join()
    .expect("the child thread does not panic")
}

#[test]
fn a_thread_spawned_from_a_default_thread_starts_default() {
    let _env = Guard::begin();
    fucina_fpenv::clear_exceptions();
    let seen = spawn_and_look();
    assert_eq!(seen.env.is_some(), fucina_fpenv::SUPPORTED);
    assert!(seen.env.is_none_or(Environment::is_default), "{seen:?}");
}

#[test]
fn a_new_thread_inherits_its_creators_environment_on_linux() {
    let _env = Guard::begin();
    let changed = Environment {
        rounding: RoundingMode::TowardZero,
        underflow: UnderflowMode::FlushToZero,
    };
    let flags = Exceptions {
        overflow: true,
        denormal: true,
        ..Exceptions::NONE
    };

    let mut guard = Guard::begin();
    fucina_fpenv::raise_exceptions(flags);
    // SAFETY: until `guard.restore()` this thread runs only `thread::spawn`
    // and `join` (thread creation and synchronisation: no floating-point
    // arithmetic) and register reads.
    unsafe { fucina_fpenv::set(changed) };
    let seen = spawn_and_look();
    guard.restore();
    fucina_fpenv::clear_exceptions();
    fucina_fpenv::assert_default().unwrap();

    if cfg!(target_os = "linux") && fucina_fpenv::SUPPORTED {
        assert_eq!(
            seen,
            FirstSight {
                env: Some(changed),
                flags
            },
            "Linux: inherited"
        );
    }
}
