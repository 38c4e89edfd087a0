//! The six sticky exception flags.

use core::fmt;

/// A set of IEEE exception flags, as accrued ("sticky") in the status
/// register: once an operation raises one, it stays raised until cleared.
///
/// The five IEEE 754 exceptions plus `denormal`, which is not an IEEE
/// exception: both supported architectures expose a subnormal-operand flag
/// (x86_64 DE, aarch64 IDC) and it is informative when auditing, e.g.,
/// quantization block scales. Note that aarch64 raises IDC only while
/// flush-to-zero is on (a subnormal input was flushed), x86_64 raises DE
/// whenever an operand is subnormal (and DAZ is off).
///
/// The field order is the order of [`fmt::Display`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Exceptions {
    /// Invalid operation (0/0, inf - inf, sqrt(-1), a signalling NaN, ...).
    pub invalid: bool,
    /// Division of a finite non-zero number by zero.
    pub division_by_zero: bool,
    /// A rounded result too large for the format.
    pub overflow: bool,
    /// A tiny (subnormal or zero) result that was also inexact.
    pub underflow: bool,
    /// A rounded result that differs from the exact one. Ordinary arithmetic
    /// raises this constantly.
    pub inexact: bool,
    /// An operation consumed a subnormal operand (see the type docs).
    pub denormal: bool,
}

impl Exceptions {
    /// No flag set (the same as `Exceptions::default()`).
    pub const NONE: Exceptions = Exceptions {
        invalid: false,
        division_by_zero: false,
        overflow: false,
        underflow: false,
        inexact: false,
        denormal: false,
    };

    /// Every flag set.
    pub const ALL: Exceptions = Exceptions {
        invalid: true,
        division_by_zero: true,
        overflow: true,
        underflow: true,
        inexact: true,
        denormal: true,
    };

    /// True if any flag is set.
    pub const fn any(self) -> bool {
        self.inexact || self.any_significant()
    }

    /// True if any flag other than `inexact` is set: the "worth looking at"
    /// predicate, since ordinary arithmetic raises `inexact` all the time.
    pub const fn any_significant(self) -> bool {
        self.invalid || self.division_by_zero || self.overflow || self.underflow || self.denormal
    }

    /// The per-flag OR of `self` and `other`.
    #[must_use]
    pub const fn union_with(self, other: Exceptions) -> Exceptions {
        Exceptions {
            invalid: self.invalid || other.invalid,
            division_by_zero: self.division_by_zero || other.division_by_zero,
            overflow: self.overflow || other.overflow,
            underflow: self.underflow || other.underflow,
            inexact: self.inexact || other.inexact,
            denormal: self.denormal || other.denormal,
        }
    }

    /// The flags in field order.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    const fn flags(self) -> [bool; 6] {
        [
            self.invalid,
            self.division_by_zero,
            self.overflow,
            self.underflow,
            self.inexact,
            self.denormal,
        ]
    }

    /// Decodes a status register given each flag's bit, in field order.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) fn from_register(value: u64, bits: &[u64; 6]) -> Exceptions {
        let set = |i: usize| value & bits[i] != 0;
        Exceptions {
            invalid: set(0),
            division_by_zero: set(1),
            overflow: set(2),
            underflow: set(3),
            inexact: set(4),
            denormal: set(5),
        }
    }

    /// The status-register bits of the set flags, given each flag's bit in
    /// field order.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) fn to_register(self, bits: &[u64; 6]) -> u64 {
        self.flags()
            .iter()
            .zip(bits)
            .filter(|(set, _)| **set)
            .fold(0, |acc, (_, bit)| acc | bit)
    }

    /// The flags paired with their names, in field order.
    const fn named(self) -> [(bool, &'static str); 6] {
        [
            (self.invalid, "invalid"),
            (self.division_by_zero, "division_by_zero"),
            (self.overflow, "overflow"),
            (self.underflow, "underflow"),
            (self.inexact, "inexact"),
            (self.denormal, "denormal"),
        ]
    }
}

impl fmt::Display for Exceptions {
    /// `none` when no flag is set, otherwise the names of the set flags in
    /// field order joined by `|`, e.g. `overflow|inexact`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.any() {
            return f.write_str("none");
        }
        let mut first = true;
        for (set, name) in self.named() {
            if set {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}
