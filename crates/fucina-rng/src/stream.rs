//! The splitmix64 stream: the sequential step, its O(1) counter form, and the
//! [`SplitMix64`] generator type.

/// The splitmix64 increment ("golden gamma"), added to the state before each mix.
pub(crate) const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output mixer (a bijection on `u64`).
#[inline(always)]
pub(crate) const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One sequential splitmix64 step: adds the increment to `state`, then returns
/// the mixed new state.
///
/// Starting from `state = seed`, the `i`-th call (counting from 0) returns
/// exactly [`at(seed, i)`](at).
///
/// ```
/// let mut state = 42u64;
/// let first = fucina_rng::splitmix64(&mut state);
/// assert_eq!(first, 0xbdd7_3226_2feb_6e95);
/// assert_eq!(first, fucina_rng::at(42, 0));
/// ```
#[inline]
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GAMMA);
    mix(*state)
}

/// The `i`-th output of the splitmix64 stream started with `state = seed`,
/// computed in O(1): `mix(seed + (i + 1) * GAMMA)` in wrapping `u64` arithmetic.
///
/// Every output is a pure function of `(seed, i)`, which is what makes every
/// fill in this crate chunking-invariant.
///
/// ```
/// let mut state = 7u64;
/// for i in 0..4 {
///     assert_eq!(fucina_rng::splitmix64(&mut state), fucina_rng::at(7, i));
/// }
/// ```
#[inline]
#[must_use]
pub const fn at(seed: u64, i: u64) -> u64 {
    mix(seed.wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// A splitmix64 generator: a `u64` state advanced by [`splitmix64`].
///
/// `SplitMix64::new(seed)` uses `seed` as the state as-is, so its `n`-th
/// [`next_u64`](SplitMix64::next_u64) output equals [`at(seed, n)`](at).
/// With the optional features `rand_core` (0.10) and `rand_core_09` (0.9) it
/// also implements that crate's `Rng`/`RngCore` and `SeedableRng` traits.
///
/// It is a fast, statistically good, **not cryptographically secure** generator.
///
/// ```
/// use fucina_rng::{at, SplitMix64};
///
/// let mut rng = SplitMix64::new(42);
/// assert_eq!(rng.next_u64(), at(42, 0));
/// assert_eq!(rng.next_u64(), at(42, 1));
/// // The state is a checkpoint: store it, rebuild the generator later.
/// let mut resumed = SplitMix64::new(rng.state());
/// assert_eq!(resumed.next_u64(), at(42, 2));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose state is `seed` (used as-is, not hashed).
    #[inline]
    #[must_use]
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The current state. `SplitMix64::new(g.state())` continues `g`'s sequence.
    #[inline]
    #[must_use]
    pub const fn state(&self) -> u64 {
        self.state
    }

    /// The next output: one [`splitmix64`] step.
    #[inline]
    #[allow(clippy::should_implement_trait)] // not an iterator: the stream never ends
    pub fn next_u64(&mut self) -> u64 {
        splitmix64(&mut self.state)
    }

    /// The high 32 bits of the next [`next_u64`](SplitMix64::next_u64) output.
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Fills `dest` with the little-endian bytes of successive outputs; a
    /// partial final word uses its low bytes and discards the rest.
    pub fn fill_bytes(&mut self, dest: &mut [u8]) {
        let mut chunks = dest.chunks_exact_mut(8);
        for chunk in &mut chunks {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let word = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&word[..rest.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_of_known_value() {
        // First output of seed 0 is the well-known splitmix64 value.
        assert_eq!(at(0, 0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn fill_bytes_partial_word() {
        let mut a = SplitMix64::new(5);
        let mut buf = [0u8; 11];
        a.fill_bytes(&mut buf);
        let w0 = at(5, 0).to_le_bytes();
        let w1 = at(5, 1).to_le_bytes();
        assert_eq!(&buf[..8], &w0);
        assert_eq!(&buf[8..], &w1[..3]);
        assert_eq!(a.state(), 5u64.wrapping_add(GAMMA.wrapping_mul(2)));
    }
}
