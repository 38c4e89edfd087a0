//! Observations on x86_64 hardware: every rounding mode and flush-to-zero
//! seen on a real SSE operation, every exception flag raised by a real
//! operation, and the documented MXCSR bit layout.
//!
//! Rust code never computes under a changed mode here (that is undefined
//! behaviour, see the crate docs). Each observation:
//! 1. installs the environment with `fucina_fpenv::set` under a `Guard`,
//!    reads the raw MXCSR it produced, and restores at once (only register
//!    reads run in between);
//! 2. runs the operation inside ONE `asm!` block that saves MXCSR, loads the
//!    value from step 1, executes the SSE instruction and reloads the saved
//!    MXCSR.
//!
//! Exception flags are raised by SSE instructions in `asm!` under the default
//! environment, so the compiler can neither fold nor move them.
#![cfg(target_arch = "x86_64")]

use std::arch::asm;

use fucina_fpenv::{
    DEFAULT_ENVIRONMENT, Environment, Exceptions, FpEnvError, Guard, Probe, RoundingMode,
    UnderflowMode,
};

const DAZ: u32 = 1 << 6;
const FTZ: u32 = 1 << 15;
const RC: u32 = 0b11 << 13;
const MASKS: u32 = 0b11_1111 << 7;
/// The divide-by-zero mask (ZM): clear = division by zero traps.
const ZM: u32 = 1 << 9;
/// The invalid-operation mask (IM).
const IM: u32 = 1 << 7;

fn mxcsr() -> u32 {
    let mut value = 0u32;
    // SAFETY: stmxcsr writes four bytes to a live local u32.
    unsafe { asm!("stmxcsr [{p}]", p = in(reg) &raw mut value, options(nostack, preserves_flags)) };
    value
}

/// Writes MXCSR. Only used under a `Guard`, with values derived from the
/// register's own, and no floating-point code before the guard restores.
///
/// # Safety
///
/// As `fucina_fpenv::set`.
unsafe fn load_mxcsr(value: u32) {
    // SAFETY: reads four bytes from a live local; the caller upholds the
    // float-semantics contract.
    unsafe {
        asm!("ldmxcsr [{p}]", p = in(reg) &raw const value, options(nostack, readonly, preserves_flags))
    };
}

/// The raw MXCSR that `fucina_fpenv::set(env)` produces on this thread.
fn mxcsr_for(env: Environment) -> u32 {
    let mut guard = Guard::begin();
    // SAFETY: only a register read runs before `guard.restore()`.
    unsafe { fucina_fpenv::set(env) };
    let value = mxcsr();
    guard.restore();
    value
}

/// `$insn` (operands `{a}` (in/out) and `{b}`) executed with MXCSR = `$csr`,
/// all inside one asm block that restores the caller's MXCSR.
macro_rules! under {
    ($insn:literal, $csr:expr, $a:expr, $b:expr) => {{
        let csr: u32 = $csr;
        let mut saved = 0u32;
        let mut a: f32 = $a;
        let b: f32 = $b;
        // SAFETY: the instruction runs between `ldmxcsr` of `csr` (a value
        // produced by the register itself) and `ldmxcsr` of the saved value,
        // so no compiler-generated code runs under the changed mode. The two
        // pointers are to live locals.
        unsafe {
            asm!(
                "stmxcsr [{saved}]",
                "ldmxcsr [{csr}]",
                $insn,
                "ldmxcsr [{saved}]",
                saved = in(reg) &raw mut saved,
                csr = in(reg) &raw const csr,
                a = inout(xmm_reg) a,
                b = in(xmm_reg) b,
                options(nostack, preserves_flags),
            )
        };
        a
    }};
}

/// `$insn` under the current (default) environment, in asm so the compiler
/// cannot fold or move it.
macro_rules! op {
    ($insn:literal, $a:expr, $b:expr) => {{
        let mut a: f32 = $a;
        let b: f32 = $b;
        // SAFETY: one SSE arithmetic instruction on xmm registers.
        unsafe { asm!($insn, a = inout(xmm_reg) a, b = in(xmm_reg) b, options(nomem, nostack, preserves_flags)) };
        a
    }};
}

fn env(rounding: RoundingMode) -> Environment {
    Environment {
        rounding,
        underflow: UnderflowMode::Gradual,
    }
}

const ONE: f32 = 1.0;
const TWO_M24: u32 = 0x3380_0000; // 2^-24: half an ulp of 1.0
const ONE_P_ULP: u32 = 0x3F80_0001; // 1 + 2^-23 (odd significand)

fn div_bits(mode: RoundingMode, a: f32, b: f32) -> u32 {
    under!("divss {a}, {b}", mxcsr_for(env(mode)), a, b).to_bits()
}

fn add_bits(mode: RoundingMode, a: f32, b: f32) -> u32 {
    under!("addss {a}, {b}", mxcsr_for(env(mode)), a, b).to_bits()
}

#[test]
fn one_third_rounds_per_mode() {
    let _env = Guard::begin();
    // 1/3 = 1.0101...b x 2^-2: truncated significand 0x3EAAAAAA, remainder
    // 2/3 ulp, so nearest rounds up.
    use RoundingMode::*;
    let cases = [
        (NearestEven, 0x3EAA_AAAB, 0xBEAA_AAAB),
        (Upward, 0x3EAA_AAAB, 0xBEAA_AAAA),
        (Downward, 0x3EAA_AAAA, 0xBEAA_AAAB),
        (TowardZero, 0x3EAA_AAAA, 0xBEAA_AAAA),
    ];
    for (mode, pos, neg) in cases {
        assert_eq!(div_bits(mode, 1.0, 3.0), pos, "1/3 under {mode}");
        assert_eq!(div_bits(mode, -1.0, 3.0), neg, "-1/3 under {mode}");
    }
    fucina_fpenv::assert_default().unwrap();
}

#[test]
fn ties_round_per_mode() {
    let _env = Guard::begin();
    use RoundingMode::*;
    let half_ulp = f32::from_bits(TWO_M24);
    let odd = f32::from_bits(ONE_P_ULP);
    // (mode, 1 + 2^-24, (1 + 2^-23) + 2^-24, -1 - 2^-24)
    let cases = [
        // ties to even: 1.0 stays (even), 1+ulp goes up to 1+2ulp (even).
        (NearestEven, 0x3F80_0000, 0x3F80_0002, 0xBF80_0000),
        (Upward, 0x3F80_0001, 0x3F80_0002, 0xBF80_0000),
        (Downward, 0x3F80_0000, 0x3F80_0001, 0xBF80_0001),
        (TowardZero, 0x3F80_0000, 0x3F80_0001, 0xBF80_0000),
    ];
    for (mode, a, b, c) in cases {
        assert_eq!(add_bits(mode, ONE, half_ulp), a, "1 + 2^-24 under {mode}");
        assert_eq!(
            add_bits(mode, odd, half_ulp),
            b,
            "(1 + 2^-23) + 2^-24 under {mode}"
        );
        assert_eq!(
            add_bits(mode, -ONE, -half_ulp),
            c,
            "-1 - 2^-24 under {mode}"
        );
    }
    fucina_fpenv::assert_default().unwrap();
}

#[test]
fn flush_to_zero_flushes_subnormal_results_and_inputs() {
    let _env = Guard::begin();
    let min_normal = f32::MIN_POSITIVE; // 2^-126
    let sub = f32::from_bits(0x0040_0000); // 2^-127, subnormal
    let gradual = mxcsr_for(DEFAULT_ENVIRONMENT);
    let flush = mxcsr_for(Environment {
        rounding: RoundingMode::NearestEven,
        underflow: UnderflowMode::FlushToZero,
    });
    // A subnormal product: FTZ replaces it by zero.
    assert_eq!(
        under!("mulss {a}, {b}", gradual, min_normal, 0.5).to_bits(),
        0x0040_0000
    );
    assert_eq!(
        under!("mulss {a}, {b}", flush, min_normal, 0.5).to_bits(),
        0
    );
    // A subnormal operand: DAZ reads it as zero.
    assert_eq!(
        under!("mulss {a}, {b}", gradual, sub, 2.0).to_bits(),
        0x0080_0000
    );
    assert_eq!(under!("mulss {a}, {b}", flush, sub, 2.0).to_bits(), 0);
    fucina_fpenv::assert_default().unwrap();
}

#[test]
fn mxcsr_layout_matches_reference_4_3() {
    let _env = Guard::begin();
    let base = mxcsr();
    assert_eq!(
        base & (RC | FTZ | DAZ),
        0,
        "a test thread starts in the default"
    );
    use RoundingMode::*;
    for (mode, rc) in [
        (NearestEven, 0b00),
        (Downward, 0b01),
        (Upward, 0b10),
        (TowardZero, 0b11),
    ] {
        let m = mxcsr_for(env(mode));
        assert_eq!((m & RC) >> 13, rc, "{mode}");
        assert_eq!(m & !RC, base & !RC, "only RC changes for {mode}");
    }
    let m = mxcsr_for(Environment {
        rounding: NearestEven,
        underflow: UnderflowMode::FlushToZero,
    });
    assert_eq!(m & (FTZ | DAZ), FTZ | DAZ, "flush-to-zero sets FTZ and DAZ");
    assert_eq!(m & MASKS, base & MASKS, "exception masks untouched");

    // Flag bits: IE 0, DE 1, ZE 2, OE 3, UE 4, PE 5.
    let none = Exceptions::NONE;
    let bits = [
        (
            Exceptions {
                invalid: true,
                ..none
            },
            1 << 0,
        ),
        (
            Exceptions {
                denormal: true,
                ..none
            },
            1 << 1,
        ),
        (
            Exceptions {
                division_by_zero: true,
                ..none
            },
            1 << 2,
        ),
        (
            Exceptions {
                overflow: true,
                ..none
            },
            1 << 3,
        ),
        (
            Exceptions {
                underflow: true,
                ..none
            },
            1 << 4,
        ),
        (
            Exceptions {
                inexact: true,
                ..none
            },
            1 << 5,
        ),
    ];
    for (flag, bit) in bits {
        fucina_fpenv::raise_exceptions(flag);
        let m = mxcsr();
        fucina_fpenv::clear_exceptions();
        assert_eq!(m & 0x3F, bit, "{flag}");
        assert_eq!(
            m & !0x3F,
            base & !0x3F,
            "{flag}: nothing but the flag changes"
        );
    }
}

#[test]
fn reading_reports_flush_for_ftz_or_daz_and_guard_restores_raw_bits() {
    let _env = Guard::begin();
    let base = mxcsr();
    let flush = Some(UnderflowMode::FlushToZero);
    for raw in [FTZ, DAZ] {
        let mut guard = Guard::begin();
        // SAFETY: only register reads and writes run before `guard.restore()`.
        unsafe { load_mxcsr(base | raw) };
        let seen = fucina_fpenv::underflow_mode();
        // A guard begun here must give back exactly this raw state, not FTZ|DAZ.
        let mut inner = Guard::begin();
        fucina_fpenv::reset_to_default();
        let reset = mxcsr();
        inner.restore();
        let restored = mxcsr();
        guard.restore();
        assert_eq!(seen, flush, "raw bit {raw:#x}");
        assert_eq!(reset & (FTZ | DAZ), 0);
        assert_eq!(restored, base | raw);
    }
    assert_eq!(mxcsr(), base);
}

#[test]
fn every_exception_flag_is_raised_by_a_real_operation() {
    let _env = Guard::begin();
    let none = Exceptions::NONE;
    let sub = f32::from_bits(0x0040_0000); // 2^-127, subnormal
    let probe_of = |f: &dyn Fn() -> f32| {
        let probe = Probe::begin();
        std::hint::black_box(f());
        probe.end()
    };
    let cases: [(&str, Exceptions, &dyn Fn() -> f32); 7] = [
        (
            "0/0",
            Exceptions {
                invalid: true,
                ..none
            },
            &|| op!("divss {a}, {b}", 0.0, 0.0),
        ),
        (
            "sqrt(-1)",
            Exceptions {
                invalid: true,
                ..none
            },
            &|| op!("sqrtss {a}, {b}", 0.0, -1.0),
        ),
        (
            "1/0",
            Exceptions {
                division_by_zero: true,
                ..none
            },
            &|| op!("divss {a}, {b}", 1.0, 0.0),
        ),
        (
            "3e38 * 3e38",
            Exceptions {
                overflow: true,
                inexact: true,
                ..none
            },
            &|| op!("mulss {a}, {b}", 3.0e38, 3.0e38),
        ),
        (
            "1e-30 * 1e-10",
            Exceptions {
                underflow: true,
                inexact: true,
                ..none
            },
            &|| op!("mulss {a}, {b}", 1.0e-30, 1.0e-10),
        ),
        (
            "1/3",
            Exceptions {
                inexact: true,
                ..none
            },
            &|| op!("divss {a}, {b}", 1.0, 3.0),
        ),
        (
            "2^-127 * 1",
            Exceptions {
                denormal: true,
                ..none
            },
            &|| op!("mulss {a}, {b}", sub, 1.0),
        ),
    ];
    for (what, expected, f) in cases {
        assert_eq!(probe_of(f), expected, "{what}");
    }
    // A subnormal result that is exact raises no underflow (masked underflow
    // needs tiny AND inexact).
    assert_eq!(
        probe_of(&|| op!("mulss {a}, {b}", f32::MIN_POSITIVE, 0.5)),
        none
    );
    // And the flags accumulate: a probe around all of them sees the union.
    let probe = Probe::begin();
    std::hint::black_box(op!("divss {a}, {b}", 0.0, 0.0));
    std::hint::black_box(op!("divss {a}, {b}", 1.0, 0.0));
    std::hint::black_box(op!("mulss {a}, {b}", 3.0e38, 3.0e38));
    std::hint::black_box(op!("mulss {a}, {b}", 1.0e-30, 1.0e-10));
    std::hint::black_box(op!("mulss {a}, {b}", sub, 1.0));
    assert_eq!(probe.end(), Exceptions::ALL);
    fucina_fpenv::clear_exceptions();
}

#[test]
fn unmasked_exception_fails_assert_default_and_reset_masks_it_again() {
    let _env = Guard::begin();
    let base = mxcsr();
    assert_eq!(
        base & MASKS,
        MASKS,
        "a test thread starts with every exception masked"
    );
    assert_eq!(fucina_fpenv::enabled_traps(), Some(Exceptions::NONE));
    fucina_fpenv::assert_default().unwrap();

    let mut guard = Guard::begin();
    // Foreign code unmasks divide-by-zero and invalid. SAFETY: until
    // `reset_to_default` below only register reads and integer/bool work
    // run on this thread (no floating-point operation that could trap).
    unsafe { load_mxcsr(base & !(ZM | IM)) };
    let traps = fucina_fpenv::enabled_traps();
    let checked = fucina_fpenv::assert_default();
    fucina_fpenv::reset_to_default();
    let after_reset = mxcsr();
    let checked_after_reset = fucina_fpenv::assert_default();

    // A guard begun while traps are enabled restores them (the masks are
    // part of its snapshot), even after a reset inside its scope.
    // SAFETY: as above, until `guard.restore()`.
    unsafe { load_mxcsr(base & !ZM) };
    let mut inner = Guard::begin();
    fucina_fpenv::reset_to_default();
    inner.restore();
    let restored_by_inner = mxcsr();
    let inner_saw = inner.saved_traps();
    drop(inner);
    guard.restore();
    let restored_by_outer = mxcsr();

    let enabled = Exceptions {
        invalid: true,
        division_by_zero: true,
        ..Exceptions::NONE
    };
    assert_eq!(traps, Some(enabled));
    assert_eq!(
        checked,
        Err(FpEnvError::ExceptionTrapsEnabled {
            traps: enabled,
            found: DEFAULT_ENVIRONMENT,
        })
    );
    assert_eq!(
        after_reset & MASKS,
        MASKS,
        "reset_to_default masks every exception"
    );
    assert_eq!(after_reset, base, "and changes nothing else");
    assert_eq!(checked_after_reset, Ok(()));
    assert_eq!(restored_by_inner, base & !ZM);
    assert_eq!(
        inner_saw,
        Some(Exceptions {
            division_by_zero: true,
            ..Exceptions::NONE
        })
    );
    assert_eq!(restored_by_outer, base);
    fucina_fpenv::assert_default().unwrap();
}

#[test]
fn traps_are_reported_before_a_non_default_mode_and_set_leaves_masks_alone() {
    let _env = Guard::begin();
    let base = mxcsr();
    let mut guard = Guard::begin();
    let tz = Environment {
        rounding: RoundingMode::TowardZero,
        underflow: UnderflowMode::FlushToZero,
    };
    // SAFETY: only register reads and integer/bool work run before
    // `guard.restore()`.
    unsafe {
        load_mxcsr(base & !ZM);
        fucina_fpenv::set(tz);
    }
    let masks_after_set = mxcsr() & MASKS;
    let checked = fucina_fpenv::assert_default();
    guard.restore();
    assert_eq!(masks_after_set, MASKS & !ZM, "set never touches the masks");
    assert_eq!(
        checked,
        Err(FpEnvError::ExceptionTrapsEnabled {
            traps: Exceptions {
                division_by_zero: true,
                ..Exceptions::NONE
            },
            found: tz,
        })
    );
    assert_eq!(mxcsr(), base);
}
