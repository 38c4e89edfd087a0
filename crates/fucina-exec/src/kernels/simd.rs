//! Run-time selection of the vector instruction set the kernels are compiled for.
//!
//! The crate is built for the baseline target (SSE2 on x86_64), so a plain loop
//! uses 4-wide vectors. Each hot loop is instead written once, as an
//! `#[inline(always)]` generic body, and the [`vectorized!`] macro instantiates it
//! three times: inside a function compiled with AVX-512 (F, BW, DQ, VL), inside one
//! compiled with AVX2 + FMA, and as the plain baseline body. The level is detected
//! once per process (`is_x86_feature_detected!`, cached in a static) and each call
//! takes the matching arm. On aarch64 NEON is part of the baseline, so the portable
//! arm is already a NEON loop.
//!
//! # Same bits at every level
//! The bodies use only IEEE operations that round the same way at every vector
//! width (add, sub, mul, div, sqrt, compares, selects, integer bit tricks), never a
//! fused multiply-add (Rust never contracts `a * b + c` on its own), and every sum
//! keeps the fixed lane layout of [`super::reduce`] ([`super::reduce::LANES`]
//! accumulators whatever the register width). A result is therefore bitwise the same at every level, which
//! `tests/simd.rs` checks op by op with [`force_simd_level`]. One exception: a NaN
//! result is a NaN at every level, but its sign and payload may differ (when both
//! operands of an instruction are NaN, x86 passes on one of them, and which one
//! depends on the operand order the compiler chose for that vector width).
//!
//! # The GEMM
//! [`SimdLevel`] is the crate's one vector-level enum: the GEMM
//! ([`super::gemm`]) picks its micro-kernel type from the same level, so
//! `FUCINA_SIMD` and [`force_simd_level`] lower it too. Its kernels do use fused
//! multiply-adds, on purpose and at every level (the portable kernel through
//! `f32::mul_add`), so its results are also bitwise the same at every level.
//!
//! # Kernel families
//! The families written with intrinsics (the quantized dots, the weight
//! products, the AMX rule) each name their instruction-set kernels with the
//! [`CpuFeatures`] they use, and pick one per call through `choose`: the first
//! whose features the current level enables, else the portable kernel. The
//! CPU is asked once ([`CpuFeatures::detected`]); no family calls
//! `is_x86_feature_detected!` itself.

use std::sync::atomic::{AtomicU8, Ordering};

/// A vector instruction-set level the kernels can run at (see
/// [`simd_level`](crate::simd_level)): a named set of CPU features
/// ([`SimdLevel::features`]), not a rank. A level runs where the CPU has its
/// features ([`SimdLevel::is_supported`]); the process starts at the first
/// supported level of [`SimdLevel::PREFERENCE`]. Levels are deliberately not
/// ordered, so that a level of another architecture (NEON, SVE) can join
/// without meaning "more than AVX2".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimdLevel {
    /// The baseline target of the build (SSE2 on x86_64, NEON on aarch64).
    Portable,
    /// x86_64 AVX2 and FMA (256-bit vectors).
    Avx2,
    /// x86_64 AVX-512 F, BW, DQ and VL (512-bit vectors).
    Avx512,
}

impl SimdLevel {
    /// Every level (the portable one first).
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Portable, SimdLevel::Avx2, SimdLevel::Avx512];

    /// The levels in the order the process prefers them: it runs at the first
    /// one the CPU supports (the portable level is supported everywhere).
    pub const PREFERENCE: [SimdLevel; 3] =
        [SimdLevel::Avx512, SimdLevel::Avx2, SimdLevel::Portable];

    /// The CPU features the level's kernels need.
    pub const fn features(self) -> CpuFeatures {
        match self {
            SimdLevel::Portable => CpuFeatures::NONE,
            SimdLevel::Avx2 => CpuFeatures::LEVEL_AVX2,
            SimdLevel::Avx512 => CpuFeatures::LEVEL_AVX512,
        }
    }

    /// The features beyond [`features`](SimdLevel::features) that kernels
    /// may use at this level when the CPU has them (F16C at the AVX2 level;
    /// VNNI and every other detected feature at the AVX-512 level).
    const fn companions(self) -> CpuFeatures {
        match self {
            SimdLevel::Portable => CpuFeatures::NONE,
            SimdLevel::Avx2 => CpuFeatures::F16C,
            SimdLevel::Avx512 => CpuFeatures(u32::MAX),
        }
    }

    /// Whether this CPU has every feature of the level.
    pub fn is_supported(self) -> bool {
        CpuFeatures::detected().has(self.features())
    }

    /// The levels this CPU supports, in [`SimdLevel::ALL`]'s order: what a
    /// test that compares the levels' results runs.
    pub fn available() -> impl Iterator<Item = SimdLevel> {
        SimdLevel::ALL.into_iter().filter(|l| l.is_supported())
    }

    /// The level's name as the `FUCINA_SIMD` environment variable spells it.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Portable => "portable",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    fn from_u8(v: u8) -> SimdLevel {
        match v {
            2 => SimdLevel::Avx512,
            1 => SimdLevel::Avx2,
            _ => SimdLevel::Portable,
        }
    }
}

/// Not yet detected.
const UNSET: u8 = u8::MAX;

/// The level every kernel call uses (`UNSET` until the first call).
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

/// A set of CPU features the kernels use: the one place the process asks the
/// CPU what it has ([`CpuFeatures::detected`], cached), and what each kernel
/// family asks before it picks its path ([`CpuFeatures::enabled`]: the
/// detected set cut to the current [`SimdLevel`]). A set, not an order: a
/// family needs some features (VNNI with AVX-512, F16C with AVX2) and runs
/// where the enabled set holds them, whatever else is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CpuFeatures(u32);

impl CpuFeatures {
    /// None.
    pub const NONE: CpuFeatures = CpuFeatures(0);
    /// x86_64 AVX2.
    pub const AVX2: CpuFeatures = CpuFeatures(1);
    /// x86_64 FMA3.
    pub const FMA: CpuFeatures = CpuFeatures(1 << 1);
    /// x86_64 F16C (f16 ↔ f32 conversions).
    pub const F16C: CpuFeatures = CpuFeatures(1 << 2);
    /// x86_64 AVX-512 F.
    pub const AVX512F: CpuFeatures = CpuFeatures(1 << 3);
    /// x86_64 AVX-512 BW.
    pub const AVX512BW: CpuFeatures = CpuFeatures(1 << 4);
    /// x86_64 AVX-512 DQ.
    pub const AVX512DQ: CpuFeatures = CpuFeatures(1 << 5);
    /// x86_64 AVX-512 VL.
    pub const AVX512VL: CpuFeatures = CpuFeatures(1 << 6);
    /// x86_64 AVX-512 VNNI (`vpdpbusd`).
    pub const AVX512VNNI: CpuFeatures = CpuFeatures(1 << 7);
    /// x86_64 AVX512_BF16 (`vdpbf16ps`).
    pub const AVX512BF16: CpuFeatures = CpuFeatures(1 << 8);

    /// The features of the [`SimdLevel::Avx2`] level: AVX2 and FMA.
    pub const LEVEL_AVX2: CpuFeatures = CpuFeatures::AVX2.with(CpuFeatures::FMA);
    /// The features of the [`SimdLevel::Avx512`] level: AVX-512 F/BW/DQ/VL
    /// and the AVX2 level's.
    pub const LEVEL_AVX512: CpuFeatures = CpuFeatures::LEVEL_AVX2
        .with(CpuFeatures::AVX512F)
        .with(CpuFeatures::AVX512BW)
        .with(CpuFeatures::AVX512DQ)
        .with(CpuFeatures::AVX512VL);

    /// The union of `self` and `other`.
    pub const fn with(self, other: CpuFeatures) -> CpuFeatures {
        CpuFeatures(self.0 | other.0)
    }

    /// Whether `self` holds every feature of `other`.
    pub const fn has(self, other: CpuFeatures) -> bool {
        self.0 & other.0 == other.0
    }

    /// The features of this CPU (detected once per process).
    pub fn detected() -> CpuFeatures {
        static DETECTED: std::sync::OnceLock<CpuFeatures> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(detect_features)
    }

    /// The detected features the kernels may use at the current
    /// [`simd_level`] (`FUCINA_SIMD`, [`force_simd_level`]): at the portable
    /// level none, at the AVX2 level none of the AVX-512 ones.
    pub fn enabled() -> CpuFeatures {
        let l = level();
        CpuFeatures(CpuFeatures::detected().0 & (l.features().0 | l.companions().0))
    }
}

/// The kernel a family runs now: the first of `kernels` (the family's
/// instruction-set kernels in the order it prefers them, each with the CPU
/// features its code uses) whose features [`CpuFeatures::enabled`] holds, else
/// `portable`. Every kernel family picks its path through this one rule, so
/// `FUCINA_SIMD` and [`force_simd_level`](crate::force_simd_level) move all of
/// them together.
pub(crate) fn choose<K: Copy>(kernels: &[(K, CpuFeatures)], portable: K) -> K {
    let enabled = CpuFeatures::enabled();
    kernels
        .iter()
        .find(|(_, needs)| enabled.has(*needs))
        .map_or(portable, |&(k, _)| k)
}

/// Asks the CPU (the only `is_x86_feature_detected!` calls of the kernels'
/// dispatch).
fn detect_features() -> CpuFeatures {
    #[allow(unused_mut)]
    let mut f = CpuFeatures::NONE;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        for (yes, feature) in [
            (has!("avx2"), CpuFeatures::AVX2),
            (has!("fma"), CpuFeatures::FMA),
            (has!("f16c"), CpuFeatures::F16C),
            (has!("avx512f"), CpuFeatures::AVX512F),
            (has!("avx512bw"), CpuFeatures::AVX512BW),
            (has!("avx512dq"), CpuFeatures::AVX512DQ),
            (has!("avx512vl"), CpuFeatures::AVX512VL),
            (has!("avx512vnni"), CpuFeatures::AVX512VNNI),
            (has!("avx512bf16"), CpuFeatures::AVX512BF16),
        ] {
            if yes {
                f = f.with(feature);
            }
        }
    }
    f
}

/// The first level of [`SimdLevel::PREFERENCE`] this CPU supports.
pub(crate) fn detected() -> SimdLevel {
    SimdLevel::PREFERENCE
        .into_iter()
        .find(|l| l.is_supported())
        .unwrap_or(SimdLevel::Portable)
}

/// The detected level, or the one `FUCINA_SIMD` (`portable`, `avx2`,
/// `avx512`) names when the CPU supports it.
#[cold]
fn init() -> SimdLevel {
    let best = detected();
    let wanted = std::env::var("FUCINA_SIMD").ok().and_then(|v| {
        SimdLevel::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(v.trim()))
    });
    let level = match wanted {
        Some(l) if l.is_supported() => l,
        _ => best,
    };
    // A race with another first call or with `force` stores a supported level
    // either way.
    let _ = LEVEL.compare_exchange(UNSET, level as u8, Ordering::Relaxed, Ordering::Relaxed);
    SimdLevel::from_u8(LEVEL.load(Ordering::Relaxed))
}

/// The level kernel calls use now.
#[inline(always)]
pub(crate) fn level() -> SimdLevel {
    match LEVEL.load(Ordering::Relaxed) {
        UNSET => init(),
        v => SimdLevel::from_u8(v),
    }
}

/// Makes every later kernel call use `level`, if the CPU supports it; returns
/// whether it did (an unsupported level changes nothing).
pub(crate) fn force(level: SimdLevel) -> bool {
    if !level.is_supported() {
        return false;
    }
    LEVEL.store(level as u8, Ordering::Relaxed);
    true
}

/// The vector level the kernels run at now: the preferred one the CPU supports
/// (detected once per process), or another supported one the `FUCINA_SIMD`
/// environment variable names (`portable`, `avx2` or `avx512`, read on the
/// first kernel call) or [`force_simd_level`] sets. Results are bitwise the
/// same at every level.
///
/// ```
/// use fucina_exec::{ExecContext, SimdLevel, detected_simd_level, simd_level};
///
/// assert!(simd_level().is_supported());
/// assert!(SimdLevel::ALL.contains(&simd_level()));
/// let ctx = ExecContext::new();
/// let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
/// let y = ctx.softmax(&x, 1)?; // AVX-512 loops here when the CPU has them
/// assert_eq!(y.shape(), [2, 3]);
/// # Ok::<(), fucina_exec::ExecError>(())
/// ```
#[inline]
pub fn simd_level() -> SimdLevel {
    level()
}

/// The vector level the process starts at: the first of
/// [`SimdLevel::PREFERENCE`] this CPU supports.
pub fn detected_simd_level() -> SimdLevel {
    detected()
}

/// Makes every later kernel call of the process use `level`, when the CPU
/// supports it (returns `false` and changes nothing otherwise): what
/// [`simd_level`] reports from then on. Meant for tests and benchmarks that
/// compare the levels' results (which are bitwise the same); a level change
/// while ops run on other threads is safe but those ops may mix levels.
///
/// ```
/// use fucina_exec::{SimdLevel, force_simd_level, simd_level};
///
/// let before = simd_level();
/// assert!(force_simd_level(SimdLevel::Portable)); // every CPU has it
/// assert_eq!(simd_level(), SimdLevel::Portable);
/// assert!(force_simd_level(before));
/// ```
pub fn force_simd_level(level: SimdLevel) -> bool {
    force(level)
}

/// Runs `f` inside a function compiled for AVX-512; `f`'s body (an
/// `#[inline(always)]` closure, as the crate's `vectorized!` macro makes, called only here) is
/// inlined and vectorized for that target. Public so that the crates above
/// compile their own hot loops at the process's [`simd_level`] the same way.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/DQ/VL, AVX2 and FMA ([`simd_level`]
/// returned [`SimdLevel::Avx512`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub unsafe fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Runs `f` inside a function compiled for AVX2 + FMA (see [`with_avx512`]).
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`simd_level`] returned
/// [`SimdLevel::Avx2`] or higher).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// The mask of the first `n` lanes of a 16-lane register (`n <= 16`), as the
/// AVX-512 kernels' masked loads and stores of a row's last piece take it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn first_lanes(n: usize) -> u16 {
    debug_assert!(n <= 16, "first_lanes: {n} > 16");
    (((1u32 << n) - 1) & 0xFFFF) as u16
}

/// Evaluates `$body` (an expression whose loops are `#[inline(always)]`
/// kernels) compiled for the process's [`simd_level`]: the body is
/// instantiated once per level, each in its own `#[inline(always)]` closure,
/// which is inlined into the target-feature wrapper ([`with_avx512`],
/// [`with_avx2`]) and vectorized there. The crates above use it for their own
/// hot loops.
///
/// ```
/// #[inline(always)]
/// fn sum(x: &[f32]) -> f32 {
///     x.iter().sum()
/// }
/// let x = [1.0f32, 2.0, 3.0];
/// assert_eq!(fucina_exec::vectorized!(sum(&x)), 6.0);
/// ```
#[macro_export]
macro_rules! vectorized {
    ($body:expr) => {{
        match $crate::simd_level() {
            #[cfg(target_arch = "x86_64")]
            $crate::SimdLevel::Avx512 => {
                // SAFETY: `simd_level` returns Avx512 only when the CPU has
                // every feature `with_avx512` enables.
                unsafe {
                    $crate::with_avx512(
                        #[inline(always)]
                        || $body,
                    )
                }
            }
            #[cfg(target_arch = "x86_64")]
            $crate::SimdLevel::Avx2 => {
                // SAFETY: `simd_level` returns Avx2 only when the CPU has AVX2
                // and FMA.
                unsafe {
                    $crate::with_avx2(
                        #[inline(always)]
                        || $body,
                    )
                }
            }
            _ => $body,
        }
    }};
}
pub(crate) use crate::vectorized;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_feature_sets_and_named() {
        for l in SimdLevel::ALL {
            assert_eq!(SimdLevel::from_u8(l as u8), l);
            assert!(SimdLevel::PREFERENCE.contains(&l));
            // A supported level's features are all detected, and the kernels
            // see no feature of another level beyond its companions.
            assert_eq!(l.is_supported(), CpuFeatures::detected().has(l.features()));
        }
        assert!(SimdLevel::Portable.is_supported());
        assert!(SimdLevel::Avx512.features().has(SimdLevel::Avx2.features()));
        assert!(!SimdLevel::Avx2.features().has(CpuFeatures::AVX512F));
        assert!(detected().is_supported());
        assert_eq!(
            SimdLevel::available().collect::<Vec<_>>(),
            SimdLevel::ALL
                .into_iter()
                .filter(|l| l.is_supported())
                .collect::<Vec<_>>()
        );
        assert_eq!(SimdLevel::Avx512.name(), "avx512");
    }

    #[test]
    fn choose_takes_the_first_kernel_whose_features_are_enabled() {
        // A feature no CPU reports (no detection sets bit 31).
        let never = CpuFeatures(1 << 31);
        assert_eq!(choose::<u8>(&[], 0), 0);
        assert_eq!(choose(&[(1, never), (2, CpuFeatures::NONE)], 0), 2);
        assert_eq!(
            choose(&[(1, CpuFeatures::NONE), (2, CpuFeatures::NONE)], 0),
            1
        );
        assert_eq!(choose(&[(1, never)], 0), 0);
        let enabled = CpuFeatures::enabled();
        for l in [SimdLevel::Avx512, SimdLevel::Avx2] {
            let picked = choose(&[(1, l.features())], 0);
            assert_eq!(picked == 1, enabled.has(l.features()), "{l:?}");
        }
        // The current level's own features are always enabled.
        assert_eq!(choose(&[(1, level().features())], 0), 1);
    }
}
