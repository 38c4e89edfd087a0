//! Deterministic test data without a dependency: xorshift64* (shared by the
//! test binaries that `#[path]`-include this file).

/// A xorshift64* stream seeded with `seed` (0 is replaced by 1).
pub(crate) fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.max(1);
    move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
