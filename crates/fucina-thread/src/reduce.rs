//! [`Team::parallel_reduce`]: a reduction whose bits do not depend on the team.

use std::ops::Range;

use crate::team::{Team, in_parallel_region};

impl Team {
    /// Reduces `[begin, end)` in fixed-size blocks: `map` turns each block
    /// `[begin + k * block, min(begin + (k + 1) * block, end))` into a partial
    /// result, the blocks run across the team, and the partials are combined
    /// on the caller strictly in block order, starting from `identity`:
    /// `combine(..combine(combine(identity, p0), p1).., p_last)`.
    ///
    /// The blocks depend only on `(begin, end, block)` and the combination order
    /// is fixed, so the result is the same, bit for bit, for every team size
    /// and every schedule (a floating-point sum included, whose value depends
    /// on the order of its additions): one participant, four, or a busy team
    /// that runs the blocks serially give identical bits. Contrast
    /// [`parallel_for`](Team::parallel_for), whose chunks (and so any
    /// per-chunk partial) follow the team size.
    ///
    /// An empty range returns `identity` without calling `map`. A `block` of 0
    /// is treated as 1. The partials are kept in one vector of
    /// `ceil((end - begin) / block)` entries (the call's only allocation), so
    /// choose blocks of a few thousand elements, not single ones.
    ///
    /// Every range is exact up to `usize::MAX`: the block ends are computed
    /// without overflow, so a range ending at `usize::MAX` loses no element.
    ///
    /// # Panics
    /// If `map` panics, the other blocks still run and the first panic is
    /// resumed on the caller, as in [`parallel_chunks`](Team::parallel_chunks);
    /// a panic of `combine` runs on the caller. If the vector of partials
    /// cannot be allocated (a huge range in tiny blocks), with a message
    /// naming the range and the block, not an abort.
    ///
    /// ```
    /// use fucina_thread::{Team, TeamOptions};
    ///
    /// let data: Vec<f32> = (0..10_000).map(|i| (i as f32).sin()).collect();
    /// let sum = |team: &Team| {
    ///     team.parallel_reduce(0, data.len(), 512, 0.0f32, |r| data[r].iter().sum(), |a, b| a + b)
    /// };
    /// let one = Team::new(TeamOptions { max_workers: 0 })?;
    /// let four = Team::new(TeamOptions { max_workers: 3 })?;
    /// assert_eq!(sum(&one).to_bits(), sum(&four).to_bits());
    /// # Ok::<(), fucina_thread::ThreadError>(())
    /// ```
    pub fn parallel_reduce<T, M, C>(
        &self,
        begin: usize,
        end: usize,
        block: usize,
        identity: T,
        map: M,
        combine: C,
    ) -> T
    where
        T: Send,
        M: Fn(Range<usize>) -> T + Sync,
        C: FnMut(T, T) -> T,
    {
        if begin >= end {
            return identity;
        }
        let block = block.max(1);
        let len = end - begin;
        let blocks = len.div_ceil(block);
        // `k < blocks`, so `k * block < len` and `lo < end`: neither overflows,
        // and the block's end is `lo` plus what is left, at most `block`
        // (`lo + block` itself may pass `usize::MAX` near the top).
        let range_of = |k: usize| {
            let lo = begin + k * block;
            lo..lo + block.min(end - lo)
        };
        let mut partials: Vec<Option<T>> = Vec::new();
        if partials.try_reserve_exact(blocks).is_err() {
            panic!(
                "parallel_reduce: cannot allocate the {blocks} partials of [{begin}, {end}) \
                 in blocks of {block} (choose larger blocks)"
            );
        }
        partials.resize_with(blocks, || None);
        if blocks == 1 || in_parallel_region() {
            for (k, p) in partials.iter_mut().enumerate() {
                *p = Some(map(range_of(k)));
            }
        } else {
            // The team's own chunking of the block indices decides only who
            // computes which partial, never what a partial covers.
            self.parallel_for_slices(&mut partials, 1, |ks, out| {
                for (k, p) in ks.zip(out) {
                    *p = Some(map(range_of(k)));
                }
            });
        }
        partials
            .into_iter()
            .map(|p| p.expect("parallel_reduce: every block's partial is computed"))
            .fold(identity, combine)
    }
}
