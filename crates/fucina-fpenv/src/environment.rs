//! The portable description of the control state: rounding and underflow.

use core::fmt;

/// How results that are not exactly representable are rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RoundingMode {
    /// Round to nearest, ties to even: the IEEE 754 default.
    #[default]
    NearestEven,
    /// Round toward zero (truncate).
    TowardZero,
    /// Round toward +infinity.
    Upward,
    /// Round toward -infinity.
    Downward,
}

impl RoundingMode {
    /// The snake_case name used in messages (`"nearest_even"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            RoundingMode::NearestEven => "nearest_even",
            RoundingMode::TowardZero => "toward_zero",
            RoundingMode::Upward => "upward",
            RoundingMode::Downward => "downward",
        }
    }
}

impl fmt::Display for RoundingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What happens to results (and, on x86_64, inputs) too small to be normal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum UnderflowMode {
    /// IEEE 754 gradual underflow: subnormals are produced and consumed as
    /// they are. The default.
    #[default]
    Gradual,
    /// Subnormal results are replaced by zero (x86_64: FTZ and DAZ, so
    /// subnormal inputs are read as zero too; aarch64: FZ, which flushes both
    /// inputs and outputs).
    FlushToZero,
}

impl UnderflowMode {
    /// The snake_case name used in messages (`"gradual"`, `"flush_to_zero"`).
    pub const fn name(self) -> &'static str {
        match self {
            UnderflowMode::Gradual => "gradual",
            UnderflowMode::FlushToZero => "flush_to_zero",
        }
    }
}

impl fmt::Display for UnderflowMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The control half of a thread's floating-point environment.
///
/// The exception masks (which exceptions trap) are reported separately, by
/// [`enabled_traps`](crate::enabled_traps): the default environment masks
/// every exception, as Rust assumes, and
/// [`assert_default`](crate::assert_default) checks both halves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Environment {
    /// The rounding mode.
    pub rounding: RoundingMode,
    /// The underflow (flush-to-zero) mode.
    pub underflow: UnderflowMode,
}

/// The environment every numeric contract of fucina is stated under, and the
/// one the Rust compiler assumes: round to nearest-even, gradual underflow.
pub const DEFAULT_ENVIRONMENT: Environment = Environment {
    rounding: RoundingMode::NearestEven,
    underflow: UnderflowMode::Gradual,
};

impl Environment {
    /// True for [`DEFAULT_ENVIRONMENT`] (both fields at their default).
    pub const fn is_default(self) -> bool {
        matches!(
            self,
            Environment {
                rounding: RoundingMode::NearestEven,
                underflow: UnderflowMode::Gradual,
            }
        )
    }
}

impl fmt::Display for Environment {
    /// `rounding <mode>, underflow <mode>`, e.g.
    /// `rounding nearest_even, underflow gradual`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rounding {}, underflow {}",
            self.rounding, self.underflow
        )
    }
}
