//! Runtime choice of the vector implementation.

#[cfg(target_arch = "x86_64")]
use crate::x86;

/// Proof that the running CPU supports a vector path: only this module can
/// construct it (its field is private here), and it does so only after the
/// runtime detection of that path's features. The callers' `unsafe` calls
/// of the `#[target_feature]` bodies rely on it, so a vector [`Path`] cannot
/// be fabricated elsewhere in the crate.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Detected(());

/// The implementations of a vectorized fill; all give identical bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Portable scalar code, one element (or pair) at a time.
    Scalar,
    /// x86_64 AVX2: 4-lane u64 mixing (emulated 64-bit multiply), 8-lane f32.
    #[cfg(target_arch = "x86_64")]
    Avx2(Detected),
    /// x86_64 AVX-512 F/DQ/VL: 8-lane u64 mixing (`vpmullq`), 8-lane f32.
    #[cfg(target_arch = "x86_64")]
    Avx512(Detected),
}

impl Path {
    /// The fastest path the running CPU supports.
    #[inline]
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_avx512() {
                return Path::Avx512(Detected(()));
            }
            if x86::has_avx2() {
                return Path::Avx2(Detected(()));
            }
        }
        Path::Scalar
    }

    /// Every path the running CPU supports (for tests and benchmarks).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Self> {
        let mut v = vec![Path::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_avx2() {
                v.push(Path::Avx2(Detected(())));
            }
            if x86::has_avx512() {
                v.push(Path::Avx512(Detected(())));
            }
        }
        v
    }
}
