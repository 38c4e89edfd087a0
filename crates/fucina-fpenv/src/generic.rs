//! Fallback for targets whose floating-point environment this crate cannot
//! reach (32-bit x86, Arm32, RISC-V, wasm, ...).
//!
//! Everything answers "cannot observe": the getters return `None`, the flag
//! reads return all-false, and every write is a no-op. It never invents an
//! answer.

use core::convert::Infallible;

use crate::backend::Backend;
use crate::{Environment, Exceptions};

/// The "cannot observe" backend.
pub(crate) struct Imp;

impl Backend for Imp {
    const SUPPORTED: bool = false;

    /// No value of this type can exist: there is nothing to snapshot.
    type Control = Infallible;

    fn read_control() -> Option<Infallible> {
        None
    }

    unsafe fn write_control(control: Infallible) {
        match control {}
    }

    fn decode(control: Infallible) -> Environment {
        match control {}
    }

    fn encode(_env: Environment) -> Option<Infallible> {
        None
    }

    fn read_exceptions() -> Exceptions {
        Exceptions::NONE
    }

    fn write_exceptions(_flags: Exceptions) {}

    fn read_traps() -> Option<Exceptions> {
        None
    }

    unsafe fn write_traps(_traps: Exceptions) {}
}
