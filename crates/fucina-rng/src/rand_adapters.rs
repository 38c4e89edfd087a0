//! `rand_core` trait implementations for [`SplitMix64`] (optional features
//! `rand_core` for rand_core 0.10 and `rand_core_09` for rand_core 0.9).
//!
//! In both, `seed_from_u64(seed)` uses `seed` as the splitmix64 state as-is
//! (overriding the trait's default, which would hash it), so the generator's
//! `next_u64` sequence is exactly [`at(seed, 0)`](crate::at), `at(seed, 1)`, ...
//! `from_seed` reads the 8-byte seed as a little-endian `u64` state.
//! `next_u32` is the high half of the next `u64`; `fill_bytes` writes
//! successive outputs little-endian, discarding the unused bytes of the last word.

#[cfg(any(feature = "rand_core", feature = "rand_core_09"))]
use crate::SplitMix64;

#[cfg(feature = "rand_core")]
mod v010 {
    use super::SplitMix64;
    use rand_core::{Infallible, SeedableRng, TryRng};

    impl TryRng for SplitMix64 {
        type Error = Infallible;

        #[inline]
        fn try_next_u32(&mut self) -> Result<u32, Infallible> {
            Ok(SplitMix64::next_u32(self))
        }

        #[inline]
        fn try_next_u64(&mut self) -> Result<u64, Infallible> {
            Ok(SplitMix64::next_u64(self))
        }

        #[inline]
        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
            SplitMix64::fill_bytes(self, dst);
            Ok(())
        }
    }

    impl SeedableRng for SplitMix64 {
        type Seed = [u8; 8];

        #[inline]
        fn from_seed(seed: [u8; 8]) -> Self {
            SplitMix64::new(u64::from_le_bytes(seed))
        }

        #[inline]
        fn seed_from_u64(state: u64) -> Self {
            SplitMix64::new(state)
        }
    }
}

#[cfg(feature = "rand_core_09")]
mod v09 {
    use super::SplitMix64;
    use rand_core_09::{RngCore, SeedableRng};

    impl RngCore for SplitMix64 {
        #[inline]
        fn next_u32(&mut self) -> u32 {
            SplitMix64::next_u32(self)
        }

        #[inline]
        fn next_u64(&mut self) -> u64 {
            SplitMix64::next_u64(self)
        }

        #[inline]
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            SplitMix64::fill_bytes(self, dst);
        }
    }

    impl SeedableRng for SplitMix64 {
        type Seed = [u8; 8];

        #[inline]
        fn from_seed(seed: [u8; 8]) -> Self {
            SplitMix64::new(u64::from_le_bytes(seed))
        }

        #[inline]
        fn seed_from_u64(state: u64) -> Self {
            SplitMix64::new(state)
        }
    }
}
