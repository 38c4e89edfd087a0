//! [`ShardedSampler`]: which samples each microbatch of each step holds, and
//! which microbatches are this rank's.

use std::ops::Range;

use crate::error::{DistError, Result};
use crate::reduce::shard_range;

/// Splits a data set of `len` samples into epochs of global batches of
/// `global_batch` samples, each cut into `microbatches` microbatches of
/// `global_batch / microbatches` samples; rank `r` of `n` owns the microbatches
/// [`shard_range`]`(microbatches, r, n)` of every global batch.
///
/// The sample order of epoch `e` is a permutation of `0 .. len` drawn from
/// `(seed, e)` alone (`fucina_rng::randperm_fill`), so every rank, and a
/// single-process run, sees the same microbatch contents. The last
/// `len % global_batch` samples of an epoch's order are dropped.
///
/// ```
/// use fucina_dist::ShardedSampler;
///
/// let s = ShardedSampler::new(100, 32, 4, 7, 1, 2)?;
/// assert_eq!(s.steps_per_epoch(), 3);
/// assert_eq!(s.my_microbatches(), 2..4);
/// let order = s.epoch_order(0);
/// assert_eq!(s.microbatch(&order, 0, 2).len(), 8);
/// # Ok::<(), fucina_dist::DistError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardedSampler {
    len: usize,
    global_batch: usize,
    microbatches: usize,
    seed: u64,
    rank: usize,
    size: usize,
}

impl ShardedSampler {
    /// A sampler for rank `rank` of `size`.
    ///
    /// # Errors
    /// [`DistError::Config`] if `microbatches` is 0 or does not divide
    /// `global_batch`, if `global_batch` is 0 or larger than `len`, or if
    /// `rank >= size`.
    pub fn new(
        len: usize,
        global_batch: usize,
        microbatches: usize,
        seed: u64,
        rank: usize,
        size: usize,
    ) -> Result<ShardedSampler> {
        let bad = |m: String| Err(DistError::Config(m));
        if microbatches == 0 || global_batch == 0 || !global_batch.is_multiple_of(microbatches) {
            return bad(format!(
                "the global batch ({global_batch}) must be a positive multiple of the \
                 microbatch count ({microbatches})"
            ));
        }
        if global_batch > len {
            return bad(format!(
                "the global batch ({global_batch}) is larger than the data set ({len} samples)"
            ));
        }
        if rank >= size {
            return bad(format!("rank {rank} is not below the rank count {size}"));
        }
        Ok(ShardedSampler {
            len,
            global_batch,
            microbatches,
            seed,
            rank,
            size,
        })
    }

    /// The number of samples of the data set.
    pub fn samples(&self) -> usize {
        self.len
    }

    /// Samples per global batch (per step).
    pub fn global_batch(&self) -> usize {
        self.global_batch
    }

    /// The seed the epochs' sample orders are drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks the microbatches are shared among.
    pub fn ranks(&self) -> usize {
        self.size
    }

    /// Global batches per epoch (`len / global_batch`).
    pub fn steps_per_epoch(&self) -> usize {
        self.len / self.global_batch
    }

    /// Samples per microbatch.
    pub fn microbatch_size(&self) -> usize {
        self.global_batch / self.microbatches
    }

    /// Microbatches per global batch.
    pub fn microbatches(&self) -> usize {
        self.microbatches
    }

    /// This rank's microbatches of every global batch.
    pub fn my_microbatches(&self) -> Range<usize> {
        shard_range(self.microbatches, self.rank, self.size)
    }

    /// The sample order of epoch `epoch` (the same on every rank).
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut perm = vec![0i64; self.len];
        fucina::rng::randperm_fill(fucina::rng::at(self.seed, epoch), &mut perm);
        perm.into_iter()
            .map(|i| usize::try_from(i).expect("randperm yields indices"))
            .collect()
    }

    /// The sample indices of microbatch `m` of step `step` in an epoch's
    /// `order`.
    ///
    /// # Panics
    /// If `step >= steps_per_epoch()`, `m >= microbatches()`, or `order` is not
    /// an [`epoch_order`](ShardedSampler::epoch_order) of this sampler (contract
    /// violations).
    pub fn microbatch<'o>(&self, order: &'o [usize], step: usize, m: usize) -> &'o [usize] {
        assert!(
            step < self.steps_per_epoch() && m < self.microbatches && order.len() == self.len,
            "ShardedSampler::microbatch: step {step} or microbatch {m} out of range"
        );
        let mb = self.microbatch_size();
        let at = step * self.global_batch + m * mb;
        &order[at..at + mb]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_sees_the_same_microbatches() {
        let a = ShardedSampler::new(1797, 128, 8, 42, 0, 1).unwrap();
        let b = ShardedSampler::new(1797, 128, 8, 42, 3, 4).unwrap();
        for e in 0..2 {
            let (oa, ob) = (a.epoch_order(e), b.epoch_order(e));
            assert_eq!(oa, ob);
            let mut seen: Vec<usize> = oa.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..1797).collect::<Vec<_>>());
            assert_eq!(a.microbatch(&oa, 13, 7), b.microbatch(&ob, 13, 7));
        }
        assert_ne!(a.epoch_order(0), a.epoch_order(1), "epochs reshuffle");
        let c = ShardedSampler::new(1797, 128, 8, 43, 0, 1).unwrap();
        assert_ne!(a.epoch_order(0), c.epoch_order(0), "the seed matters");
        assert_eq!(b.my_microbatches(), 6..8);
        assert_eq!(a.steps_per_epoch(), 14);
    }

    #[test]
    fn bad_configurations_are_errors() {
        for (len, gb, m, r, n) in [
            (10, 8, 3, 0, 1),
            (10, 0, 1, 0, 1),
            (4, 8, 2, 0, 1),
            (10, 8, 2, 2, 2),
        ] {
            let e = ShardedSampler::new(len, gb, m, 0, r, n).unwrap_err();
            assert!(matches!(e, DistError::Config(_)), "{e}");
        }
    }
}
