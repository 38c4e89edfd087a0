//! The optional `rand_core` adapters: `seed_from_u64` uses the seed as the
//! state as-is, and `next_u64` follows `at(seed, i)`. Without the features
//! (`--features rand_core,rand_core_09`) this file has no tests.

#[cfg(feature = "rand_core")]
mod rand_core_010 {
    use fucina_rng::{SplitMix64, at};
    use rand_core::{Rng, SeedableRng};

    #[test]
    fn seed_from_u64_is_the_raw_state() {
        for seed in [0u64, 42, u64::MAX] {
            let mut rng = <SplitMix64 as SeedableRng>::seed_from_u64(seed);
            for i in 0..100 {
                assert_eq!(Rng::next_u64(&mut rng), at(seed, i));
            }
        }
    }

    #[test]
    fn from_seed_is_little_endian_and_words_are_consistent() {
        let mut a = <SplitMix64 as SeedableRng>::from_seed(42u64.to_le_bytes());
        assert_eq!(Rng::next_u64(&mut a), at(42, 0));
        assert_eq!(Rng::next_u32(&mut a), (at(42, 1) >> 32) as u32);
        let mut buf = [0u8; 12];
        Rng::fill_bytes(&mut a, &mut buf);
        assert_eq!(buf[..8], at(42, 2).to_le_bytes());
        assert_eq!(buf[8..], at(42, 3).to_le_bytes()[..4]);
    }

    #[test]
    fn works_with_rand_0_10() {
        use rand::RngExt;
        let mut rng = <SplitMix64 as SeedableRng>::seed_from_u64(7);
        let x: f64 = rng.random();
        assert!((0.0..1.0).contains(&x));
        let d = rng.random_range(1..=6);
        assert!((1..=6).contains(&d));
    }
}

#[cfg(feature = "rand_core_09")]
mod rand_core_09 {
    use fucina_rng::{SplitMix64, at};
    use rand_core_09::{RngCore, SeedableRng};

    #[test]
    fn seed_from_u64_is_the_raw_state() {
        for seed in [0u64, 42, u64::MAX] {
            let mut rng = <SplitMix64 as SeedableRng>::seed_from_u64(seed);
            for i in 0..100 {
                assert_eq!(RngCore::next_u64(&mut rng), at(seed, i));
            }
        }
    }

    #[test]
    fn from_seed_is_little_endian_and_words_are_consistent() {
        let mut a = <SplitMix64 as SeedableRng>::from_seed(42u64.to_le_bytes());
        assert_eq!(RngCore::next_u64(&mut a), at(42, 0));
        assert_eq!(RngCore::next_u32(&mut a), (at(42, 1) >> 32) as u32);
        let mut buf = [0u8; 12];
        RngCore::fill_bytes(&mut a, &mut buf);
        assert_eq!(buf[..8], at(42, 2).to_le_bytes());
        assert_eq!(buf[8..], at(42, 3).to_le_bytes()[..4]);
    }
}
