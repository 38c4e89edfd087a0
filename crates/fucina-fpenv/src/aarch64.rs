//! aarch64 (both endians): the control register FPCR and the status register
//! FPSR, through `mrs`/`msr` in inline `asm!`.
//!
//! | Register bits | meaning |
//! |---|---|
//! | FPCR 23:22 RMode | 00 nearest-even, 01 toward +inf (upward), 10 toward -inf (downward), 11 toward zero |
//! | FPCR 24 FZ | flush-to-zero for single and double precision |
//! | FPCR 0 FIZ | flush denormal *inputs* to zero (FEAT_AFP; RES0 without it) |
//! | FPCR 19 FZ16 | flush-to-zero for half precision (FEAT_FP16) |
//! | FPCR 8 IOE, 9 DZE, 10 OFE, 11 UFE, 12 IXE, 15 IDE | trap enables: 1 = trap (RAZ/WI where the CPU cannot trap) |
//! | FPSR 0 IOC | invalid operation |
//! | FPSR 1 DZC | divide by zero |
//! | FPSR 2 OFC | overflow |
//! | FPSR 3 UFC | underflow |
//! | FPSR 4 IXC | inexact |
//! | FPSR 7 IDC | input denormal (only ever set while FZ or FIZ is on: a subnormal input was flushed) |
//!
//! Reading reports flush-to-zero when FZ **or** FIZ is set (either one changes
//! results, like FTZ and DAZ on x86_64); setting flush-to-zero sets FZ and
//! (where the CPU has FEAT_FP16) FZ16, gradual clears FZ, FZ16 and FIZ
//! (writing 0 to FIZ is harmless where it is RES0). Note the middle two rounding encodings are
//! swapped relative to x86_64's MXCSR.
//!
//! The trap-enable bits are the analogue of x86_64's exception masks with the
//! opposite polarity: the default environment has all six clear. Most cores
//! do not implement trapping (the bits then read as zero and ignore writes);
//! where one does, a set bit makes the next instruction that raises that
//! exception trap (SIGFPE). [`Backend::read_traps`] reports the set ones, and
//! only `reset_to_default` (all clear) and a guard's restore write them.
//!
//! This file is compiled only for aarch64 targets; see `docs/FPENV.md` for
//! how it was (and was not) verified.

use core::arch::asm;

use crate::backend::Backend;
use crate::{Environment, Exceptions, RoundingMode, UnderflowMode};

const RMODE_SHIFT: u32 = 22;
const RMODE_MASK: u64 = 0b11 << RMODE_SHIFT;
const FZ: u64 = 1 << 24;
const FZ16: u64 = 1 << 19;
/// FEAT_AFP's flush-inputs-to-zero (reads as 0 on CPUs without FEAT_AFP).
const FIZ: u64 = 1 << 0;
/// The FPCR bits that decide rounding and underflow.
const CONTROL_BITS: u64 = RMODE_MASK | FZ | FZ16 | FIZ;

const IOE: u64 = 1 << 8;
const DZE: u64 = 1 << 9;
const OFE: u64 = 1 << 10;
const UFE: u64 = 1 << 11;
const IXE: u64 = 1 << 12;
const IDE: u64 = 1 << 15;
/// The six trap-enable bits in FPCR (set = trap).
const TRAP_BITS: u64 = IOE | DZE | OFE | UFE | IXE | IDE;
/// Each trap-enable bit, in the field order of [`Exceptions`].
const TRAP_MAP: [u64; 6] = [IOE, DZE, OFE, UFE, IXE, IDE];

const IOC: u64 = 1 << 0;
const DZC: u64 = 1 << 1;
const OFC: u64 = 1 << 2;
const UFC: u64 = 1 << 3;
const IXC: u64 = 1 << 4;
const IDC: u64 = 1 << 7;
/// The six cumulative flag bits in FPSR.
const FLAG_BITS: u64 = IOC | DZC | OFC | UFC | IXC | IDC;
/// Each flag's bit, in the field order of [`Exceptions`].
const FLAG_MAP: [u64; 6] = [IOC, DZC, OFC, UFC, IXC, IDC];

#[inline]
fn read_fpcr() -> u64 {
    let value: u64;
    // SAFETY: reading FPCR is always permitted at EL0 and has no side effect;
    // it touches no memory, no stack and not NZCV.
    unsafe {
        asm!("mrs {v}, fpcr", v = out(reg) value, options(nomem, nostack, preserves_flags));
    }
    value
}

/// Writes FPCR.
///
/// # Safety
///
/// Every bit outside [`CONTROL_BITS`] must be the register's own (read just
/// before), and if the control bits differ from the default environment the
/// caller upholds the contract of [`crate::set`].
#[inline]
unsafe fn write_fpcr(value: u64) {
    // SAFETY: writing FPCR is permitted at EL0; the value's bits and the
    // float-semantics contract are the caller's obligations (see above). It
    // touches no memory, no stack and not NZCV.
    unsafe {
        asm!("msr fpcr, {v}", v = in(reg) value, options(nomem, nostack, preserves_flags));
    }
}

#[inline]
fn read_fpsr() -> u64 {
    let value: u64;
    // SAFETY: reading FPSR is always permitted at EL0 and has no side effect;
    // it touches no memory, no stack and not NZCV.
    unsafe {
        asm!("mrs {v}, fpsr", v = out(reg) value, options(nomem, nostack, preserves_flags));
    }
    value
}

#[inline]
fn write_fpsr(value: u64) {
    // SAFETY: writing FPSR is permitted at EL0. FPSR holds only status (the
    // cumulative flags and QC), never a mode the compiler depends on, so any
    // value is sound; callers pass the register's own bits with only the flag
    // bits changed. It touches no memory, no stack and not NZCV.
    unsafe {
        asm!("msr fpsr, {v}", v = in(reg) value, options(nomem, nostack, preserves_flags));
    }
}

fn encode_rounding(mode: RoundingMode) -> u64 {
    let rmode = match mode {
        RoundingMode::NearestEven => 0b00,
        RoundingMode::Upward => 0b01,
        RoundingMode::Downward => 0b10,
        RoundingMode::TowardZero => 0b11,
    };
    rmode << RMODE_SHIFT
}

fn decode_rounding(fpcr: u64) -> RoundingMode {
    match (fpcr & RMODE_MASK) >> RMODE_SHIFT {
        0b00 => RoundingMode::NearestEven,
        0b01 => RoundingMode::Upward,
        0b10 => RoundingMode::Downward,
        _ => RoundingMode::TowardZero,
    }
}

/// The FPCR/FPSR backend.
pub(crate) struct Imp;

impl Backend for Imp {
    const SUPPORTED: bool = true;

    /// FPCR masked to RMode, FZ, FZ16 and FIZ.
    type Control = u64;

    fn read_control() -> Option<u64> {
        Some(read_fpcr() & CONTROL_BITS)
    }

    unsafe fn write_control(control: u64) {
        let current = read_fpcr();
        let value = (current & !CONTROL_BITS) | (control & CONTROL_BITS);
        if value != current {
            // SAFETY: the control bits come from `read_control` on this
            // register or from `encode` (RMode and FZ always exist, FZ16 only
            // with FEAT_FP16, FIZ only ever cleared by `encode`); every other
            // bit is the register's own. The float-semantics contract is
            // forwarded to our caller.
            unsafe { write_fpcr(value) }
        }
    }

    fn decode(control: u64) -> Environment {
        Environment {
            rounding: decode_rounding(control),
            underflow: if control & (FZ | FIZ) != 0 {
                UnderflowMode::FlushToZero
            } else {
                UnderflowMode::Gradual
            },
        }
    }

    fn encode(env: Environment) -> Option<u64> {
        // FIZ is never set here, only cleared (it is part of CONTROL_BITS).
        let mut control = encode_rounding(env.rounding);
        if env.underflow == UnderflowMode::FlushToZero {
            control |= FZ;
            // FZ16 exists only with FEAT_FP16 (it is RES0 otherwise, and a
            // reserved bit is never written as 1 here).
            if std::arch::is_aarch64_feature_detected!("fp16") {
                control |= FZ16;
            }
        }
        Some(control)
    }

    fn read_exceptions() -> Exceptions {
        Exceptions::from_register(read_fpsr(), &FLAG_MAP)
    }

    fn write_exceptions(flags: Exceptions) {
        let bits = flags.to_register(&FLAG_MAP);
        let current = read_fpsr();
        let value = (current & !FLAG_BITS) | bits;
        if value != current {
            write_fpsr(value);
        }
    }

    fn read_traps() -> Option<Exceptions> {
        Some(Exceptions::from_register(
            read_fpcr() & TRAP_BITS,
            &TRAP_MAP,
        ))
    }

    unsafe fn write_traps(traps: Exceptions) {
        let enabled = traps.to_register(&TRAP_MAP);
        let current = read_fpcr();
        let value = (current & !TRAP_BITS) | enabled;
        if value != current {
            // SAFETY: only the six trap-enable bits change, and they are
            // RAZ/WI where the CPU does not implement trapping, so any value
            // is accepted; every other bit is the register's own. Setting an
            // enable bit while its FPSR flag is set raises nothing by itself.
            // The float-semantics contract for enabling traps is forwarded
            // to our caller.
            unsafe { write_fpcr(value) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_inputs_to_zero_alone_is_reported_and_owned() {
        // FEAT_AFP's FIZ flushes subnormal inputs: not the default environment.
        assert_eq!(Imp::decode(FIZ).underflow, UnderflowMode::FlushToZero);
        assert!(!Imp::decode(FIZ).is_default());
        // Owned, so `set`/`reset_to_default` clear it and a guard restores it.
        assert_eq!(FIZ & CONTROL_BITS, FIZ);
        assert!(Imp::decode(0).is_default());
    }

    #[test]
    fn trap_enable_bits_are_disjoint_from_control_bits() {
        assert_eq!(TRAP_BITS & CONTROL_BITS, 0);
        assert_eq!(
            Exceptions::from_register(DZE, &TRAP_MAP),
            Exceptions {
                division_by_zero: true,
                ..Exceptions::NONE
            }
        );
        assert_eq!(Exceptions::ALL.to_register(&TRAP_MAP), TRAP_BITS);
    }
}
