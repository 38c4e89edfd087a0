//! x86_64: the SSE control/status register MXCSR.
//!
//! Read with `stmxcsr` and written with `ldmxcsr` through inline `asm!` (the
//! `_mm_getcsr`/`_mm_setcsr` intrinsics are deprecated for exactly the reason
//! this crate documents: ordinary Rust float code must not run under a
//! changed mode). The x87 control word is never touched: Rust's f32/f64
//! arithmetic on x86_64 is SSE.
//!
//! | MXCSR bit | meaning |
//! |---|---|
//! | 0 IE | invalid operation flag |
//! | 1 DE | denormal operand flag |
//! | 2 ZE | divide-by-zero flag |
//! | 3 OE | overflow flag |
//! | 4 UE | underflow flag |
//! | 5 PE | precision (inexact) flag |
//! | 6 DAZ | denormals are zero (inputs) |
//! | 7 IM, 8 DM, 9 ZM, 10 OM, 11 UM, 12 PM | exception masks: 1 = masked (no trap) |
//! | 13-14 RC | 00 nearest-even, 01 down, 10 up, 11 toward zero |
//! | 15 FTZ | flush to zero (outputs) |
//!
//! Reading reports flush-to-zero when FTZ **or** DAZ is set (either one
//! changes results); setting flush-to-zero sets both, gradual clears both.
//!
//! The default environment has all six masks set (MXCSR 0x1F80 at reset).
//! A cleared mask makes the next SSE instruction that raises that exception
//! deliver SIGFPE; [`Backend::read_traps`] reports the cleared ones, and
//! only `reset_to_default` (all masked) and a guard's restore write them.

use core::arch::asm;

use crate::backend::Backend;
use crate::{Environment, Exceptions, RoundingMode, UnderflowMode};

const IE: u32 = 1 << 0;
const DE: u32 = 1 << 1;
const ZE: u32 = 1 << 2;
const OE: u32 = 1 << 3;
const UE: u32 = 1 << 4;
const PE: u32 = 1 << 5;
const DAZ: u32 = 1 << 6;
const RC_SHIFT: u32 = 13;
const RC_MASK: u32 = 0b11 << RC_SHIFT;
const FTZ: u32 = 1 << 15;
const IM: u32 = 1 << 7;
const DM: u32 = 1 << 8;
const ZM: u32 = 1 << 9;
const OM: u32 = 1 << 10;
const UM: u32 = 1 << 11;
const PM: u32 = 1 << 12;

/// The six sticky flag bits.
const FLAG_BITS: u32 = IE | DE | ZE | OE | UE | PE;
/// Each flag's bit, in the field order of [`Exceptions`].
const FLAG_MAP: [u64; 6] = [
    IE as u64, ZE as u64, OE as u64, UE as u64, PE as u64, DE as u64,
];
/// The six exception-mask bits (set = masked).
const MASK_BITS: u32 = IM | DM | ZM | OM | UM | PM;
/// Each mask bit, in the field order of [`Exceptions`].
const MASK_MAP: [u64; 6] = [
    IM as u64, ZM as u64, OM as u64, UM as u64, PM as u64, DM as u64,
];
/// The bits that decide rounding and underflow.
const CONTROL_BITS: u32 = RC_MASK | FTZ | DAZ;

/// MXCSR_MASK to assume when `fxsave` reports 0 (Intel SDM vol. 1, 11.6.6):
/// everything but DAZ.
const DEFAULT_MXCSR_MASK: u32 = 0xFFBF;

/// Reads MXCSR.
#[inline]
fn read_mxcsr() -> u32 {
    let mut value: u32 = 0;
    // SAFETY: `stmxcsr` stores the 32-bit MXCSR into the four bytes at the
    // address, which is a live, aligned, writable local `u32`. SSE (and so
    // `stmxcsr`) is part of the x86_64 baseline. It changes no register and
    // no flag.
    unsafe {
        asm!(
            "stmxcsr [{ptr}]",
            ptr = in(reg) &raw mut value,
            options(nostack, preserves_flags),
        );
    }
    value
}

/// Writes MXCSR.
///
/// # Safety
///
/// * `value` must not set a bit outside MXCSR_MASK (that raises #GP); it is
///   enough that every bit outside [`FLAG_BITS`] and [`CONTROL_BITS`] was
///   read from the register and that control bits come from
///   [`mxcsr_mask`]-filtered or previously read values.
/// * If the control bits differ from the default environment, the caller
///   upholds the contract of [`crate::set`].
#[inline]
unsafe fn write_mxcsr(value: u32) {
    // SAFETY: `ldmxcsr` loads four bytes from the address of a live local
    // `u32` (read-only access). The value's validity and the float-semantics
    // contract are the caller's obligations (see above). It does not touch
    // RFLAGS.
    unsafe {
        asm!(
            "ldmxcsr [{ptr}]",
            ptr = in(reg) &raw const value,
            options(nostack, readonly, preserves_flags),
        );
    }
}

/// The 512-byte, 16-byte-aligned area `fxsave` writes.
#[repr(C, align(16))]
struct FxsaveArea([u8; 512]);

/// The MXCSR bits this CPU accepts (MXCSR_MASK from `fxsave`), so DAZ is
/// only ever written where the CPU implements it (a few early x86_64 parts
/// did not, and `ldmxcsr` would fault). Not cached: nothing here is on a hot
/// path.
fn mxcsr_mask() -> u32 {
    let mut area = FxsaveArea([0; 512]);
    // SAFETY: `fxsave` writes exactly 512 bytes to a 16-byte-aligned address;
    // `area` is a live local of that size and alignment. FXSR is part of the
    // x86_64 baseline. It reads the x87/SSE state and changes none of it.
    unsafe {
        asm!(
            "fxsave [{ptr}]",
            ptr = in(reg) area.0.as_mut_ptr(),
            options(nostack, preserves_flags),
        );
    }
    let a = &area.0;
    let mask = u32::from_le_bytes([a[28], a[29], a[30], a[31]]);
    if mask == 0 { DEFAULT_MXCSR_MASK } else { mask }
}

fn encode_rounding(mode: RoundingMode) -> u32 {
    let rc = match mode {
        RoundingMode::NearestEven => 0b00,
        RoundingMode::Downward => 0b01,
        RoundingMode::Upward => 0b10,
        RoundingMode::TowardZero => 0b11,
    };
    rc << RC_SHIFT
}

fn decode_rounding(mxcsr: u32) -> RoundingMode {
    match (mxcsr & RC_MASK) >> RC_SHIFT {
        0b00 => RoundingMode::NearestEven,
        0b01 => RoundingMode::Downward,
        0b10 => RoundingMode::Upward,
        _ => RoundingMode::TowardZero,
    }
}

/// The MXCSR backend.
pub(crate) struct Imp;

impl Backend for Imp {
    const SUPPORTED: bool = true;

    /// MXCSR masked to RC, FTZ and DAZ.
    type Control = u32;

    fn read_control() -> Option<u32> {
        Some(read_mxcsr() & CONTROL_BITS)
    }

    unsafe fn write_control(control: u32) {
        let current = read_mxcsr();
        let value = (current & !CONTROL_BITS) | (control & CONTROL_BITS);
        if value != current {
            // SAFETY: the control bits come from `read_control` on this
            // register or from `encode` (RC and FTZ exist on every x86_64 CPU,
            // DAZ is filtered through MXCSR_MASK), so the CPU accepts them;
            // every other bit is the register's own. The float-semantics
            // contract is forwarded to our caller.
            unsafe { write_mxcsr(value) }
        }
    }

    fn decode(control: u32) -> Environment {
        Environment {
            rounding: decode_rounding(control),
            underflow: if control & (FTZ | DAZ) != 0 {
                UnderflowMode::FlushToZero
            } else {
                UnderflowMode::Gradual
            },
        }
    }

    fn encode(env: Environment) -> Option<u32> {
        let mut control = encode_rounding(env.rounding);
        if env.underflow == UnderflowMode::FlushToZero {
            // DAZ only where the CPU implements it; FTZ is always there.
            control |= (FTZ | DAZ) & mxcsr_mask();
        }
        Some(control)
    }

    fn read_exceptions() -> Exceptions {
        Exceptions::from_register(read_mxcsr().into(), &FLAG_MAP)
    }

    fn write_exceptions(flags: Exceptions) {
        // Only bits of FLAG_MAP, all below bit 6: the cast is lossless.
        let bits = flags.to_register(&FLAG_MAP) as u32;
        let current = read_mxcsr();
        let value = (current & !FLAG_BITS) | bits;
        if value != current {
            // SAFETY: only the six sticky flag bits change (they exist on every
            // x86_64 CPU); the control bits are the register's own, so the
            // rounding/underflow state the compiler sees is unchanged. Writing
            // a flag does not itself raise a SIMD floating-point exception
            // (SSE has no x87-style pending exceptions), even where foreign
            // code unmasked one; the masks are left as they are.
            unsafe { write_mxcsr(value) }
        }
    }

    fn read_traps() -> Option<Exceptions> {
        // A trap is enabled where its mask bit is clear.
        Some(Exceptions::from_register(
            (!read_mxcsr() & MASK_BITS).into(),
            &MASK_MAP,
        ))
    }

    unsafe fn write_traps(traps: Exceptions) {
        // Only bits of MASK_MAP, all below bit 13: the cast is lossless.
        let unmasked = traps.to_register(&MASK_MAP) as u32;
        let current = read_mxcsr();
        let value = (current & !MASK_BITS) | (MASK_BITS & !unmasked);
        if value != current {
            // SAFETY: only the six mask bits change (they exist on every
            // x86_64 CPU); every other bit is the register's own. Clearing a
            // mask while its flag is already set raises nothing by itself
            // (SSE has no pending exceptions: only a later instruction that
            // raises the exception traps). The float-semantics contract for
            // enabling traps is forwarded to our caller.
            unsafe { write_mxcsr(value) }
        }
    }
}
