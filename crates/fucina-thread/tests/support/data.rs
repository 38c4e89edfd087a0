//! Reduction test data (shared by the test binaries that `#[path]`-include
//! this file): values spanning several magnitudes, so that the summation order
//! shows in the bits.

/// `n` values from a fixed xorshift stream, scaled over seven decades.
pub(crate) fn data(n: usize) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Values spanning several magnitudes, so summation order matters.
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10f32.powi((s % 7) as i32 - 3)
        })
        .collect()
}
