//! [`DataLoader`]: seeded shuffling per epoch, mini-batches gathered into
//! pooled tensors, the next batch prefetched on the context's one-shot worker.

use fucina_autograd::Tensor;
use fucina_exec::{ExecContext, RawTensor};

use crate::{Error, Result};

/// The most dimensions a sample may have (a batch adds one; tensors have at
/// most 8).
pub const MAX_SAMPLE_RANK: usize = 7;

/// One mini-batch: `x` of shape `[b, sample_shape...]`, `y` of shape `[b]`,
/// both in pooled storage (dropping them returns it to the context's pool).
#[derive(Debug)]
pub struct Batch {
    /// The samples, a constant tensor `[b, sample_shape...]`.
    pub x: Tensor,
    /// The labels, `[b]`.
    pub y: RawTensor<i64>,
    /// The position of this batch in its epoch (0, 1, ...).
    pub index: usize,
}

impl Batch {
    /// The number of samples (`b`; the last batch of an epoch may be short).
    pub fn len(&self) -> usize {
        self.y.numel()
    }

    /// Whether the batch is empty (never, for a batch a loader hands out).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Mini-batches over samples held in memory (`x`: `len * sample_len` values,
/// `y`: one label per sample), in a seeded order per epoch.
///
/// - **Order.** Without [`shuffle`](DataLoader::shuffle) the samples come in
///   their stored order. With `shuffle(seed)`, the order of epoch `e` is the
///   permutation [`fucina::rng::randperm_fill`](crate::rng::randperm_fill)
///   draws from [`sub_seed(seed, e)`](crate::nn::sub_seed): a pure function of
///   `(seed, e)`, the same on every machine, thread count and run, so a run
///   resumed at epoch `e` sees the batches an uninterrupted one would.
/// - **Batches.** `batch_size` samples each; the last batch of an epoch holds
///   the remainder (a ragged batch), or is dropped with
///   [`drop_last(true)`](DataLoader::drop_last).
/// - **Memory.** Each batch is gathered into tensors taken from the context's
///   pool; once the batches of the previous step are dropped, a step takes
///   recycled buffers and performs no heap allocation.
/// - **Prefetch.** While the callback of batch `k` runs on the calling thread,
///   batch `k + 1` is gathered on the context's
///   [one-shot worker](ExecContext::one_shot_worker) (turn it off with
///   [`prefetch(false)`](DataLoader::prefetch)). The batches and their order
///   are the same either way. A callback that itself uses the one-shot worker
///   finds it busy and runs that work serially.
///
/// ```
/// use fucina::data::DataLoader;
/// use fucina::ExecContext;
///
/// let ctx = ExecContext::new();
/// let x: Vec<f32> = (0..10).map(|i| i as f32).collect(); // 5 samples of [2]
/// let y: Vec<i64> = (0..5).collect();
/// let mut loader = DataLoader::new(&x, &y, &[2], 2)?.shuffle(7);
/// let mut seen = Vec::new();
/// loader.for_each_batch(&ctx, 0, |b| {
///     assert_eq!(b.x.shape()[1..], [2]);
///     seen.extend(b.y.to_vec());
///     Ok(())
/// })?;
/// seen.sort();
/// assert_eq!(seen, [0, 1, 2, 3, 4]); // 3 batches: 2, 2 and a ragged 1
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug)]
pub struct DataLoader<'a> {
    x: &'a [f32],
    y: &'a [i64],
    sample: [usize; MAX_SAMPLE_RANK],
    rank: usize,
    sample_len: usize,
    batch: usize,
    drop_last: bool,
    seed: Option<u64>,
    prefetch: bool,
    order: Vec<i64>,
}

impl<'a> DataLoader<'a> {
    /// A loader over `y.len()` samples of shape `sample_shape` (`x` holds
    /// their values, one sample after the other), `batch_size` per batch, in
    /// stored order, ragged last batch kept, prefetch on.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (`DataLoader::new`) for a zero batch size, no
    /// samples, a sample shape that is empty, has a zero dimension or more than
    /// [`MAX_SAMPLE_RANK`] dimensions, or an `x` whose length is not
    /// `y.len()` times the sample size.
    pub fn new(
        x: &'a [f32],
        y: &'a [i64],
        sample_shape: &[usize],
        batch_size: usize,
    ) -> Result<DataLoader<'a>> {
        let bad = |reason: String| Error::invalid("DataLoader::new", reason);
        if batch_size == 0 {
            return Err(bad("batch_size must be at least 1 (got 0)".into()));
        }
        if y.is_empty() {
            return Err(bad("no samples (y is empty)".into()));
        }
        let rank = sample_shape.len();
        if rank == 0 || rank > MAX_SAMPLE_RANK || sample_shape.contains(&0) {
            return Err(bad(format!(
                "sample shape {sample_shape:?} must have 1..={MAX_SAMPLE_RANK} dimensions, none of them 0"
            )));
        }
        let sample_len = sample_shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(format!("sample shape {sample_shape:?} overflows")))?;
        if Some(x.len()) != y.len().checked_mul(sample_len) {
            return Err(bad(format!(
                "x has {} values; {} samples of shape {sample_shape:?} need {}",
                x.len(),
                y.len(),
                y.len().saturating_mul(sample_len)
            )));
        }
        if let Some(&l) = y.iter().find(|&&l| l < 0) {
            return Err(bad(format!("label {l} is negative")));
        }
        let mut sample = [0; MAX_SAMPLE_RANK];
        sample[..rank].copy_from_slice(sample_shape);
        Ok(DataLoader {
            x,
            y,
            sample,
            rank,
            sample_len,
            batch: batch_size,
            drop_last: false,
            seed: None,
            prefetch: true,
            order: (0..y.len() as i64).collect(),
        })
    }

    /// Shuffles every epoch with `seed` (see the type's docs for the order).
    pub fn shuffle(mut self, seed: u64) -> DataLoader<'a> {
        self.seed = Some(seed);
        self
    }

    /// Drops the last batch of an epoch when it is short (`true`), or keeps it
    /// (`false`, the default).
    pub fn drop_last(mut self, drop: bool) -> DataLoader<'a> {
        self.drop_last = drop;
        self
    }

    /// Gathers the next batch on the one-shot worker while the callback runs
    /// (`true`, the default), or on the calling thread between callbacks.
    pub fn prefetch(mut self, on: bool) -> DataLoader<'a> {
        self.prefetch = on;
        self
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether there are no samples (never: [`new`](DataLoader::new) refuses
    /// that).
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// The batch size.
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// The shape of one sample.
    pub fn sample_shape(&self) -> &[usize] {
        &self.sample[..self.rank]
    }

    /// Batches per epoch: `len / batch_size` rounded up, or down with
    /// [`drop_last(true)`](DataLoader::drop_last) (possibly 0 then).
    pub fn batches_per_epoch(&self) -> usize {
        if self.drop_last {
            self.len() / self.batch
        } else {
            self.len().div_ceil(self.batch)
        }
    }

    /// The sample order of `epoch` (indices into the samples; allocation-free
    /// after construction).
    pub fn epoch_order(&mut self, epoch: u64) -> &[i64] {
        match self.seed {
            Some(seed) => {
                fucina_rng::randperm_fill(crate::nn::sub_seed(seed, epoch), &mut self.order)
            }
            None => {
                for (i, v) in self.order.iter_mut().enumerate() {
                    *v = i as i64;
                }
            }
        }
        &self.order
    }

    /// Runs `f` on every batch of `epoch`, in order. Each batch is `f`'s to
    /// keep or drop; dropping it before the next call lets the step reuse its
    /// buffers.
    ///
    /// # Errors
    /// The first error of `f` (the remaining batches are not visited); out of
    /// memory from the pool.
    pub fn for_each_batch<F>(&mut self, ctx: &ExecContext, epoch: u64, mut f: F) -> Result<()>
    where
        F: FnMut(Batch) -> Result<()>,
    {
        let nb = self.batches_per_epoch();
        if nb == 0 {
            return Ok(());
        }
        self.epoch_order(epoch);
        let (x, y, s) = (self.x, self.y, self.sample_len);
        let prefetch = self.prefetch && ctx.one_shot_worker().start().is_ok();
        let mut shape = [0usize; MAX_SAMPLE_RANK + 1];
        shape[1..=self.rank].copy_from_slice(self.sample_shape());
        let rank = self.rank + 1;
        let range = |k: usize| k * self.batch..((k + 1) * self.batch).min(self.order.len());
        let mut alloc = |b: usize| -> Result<(RawTensor, RawTensor<i64>)> {
            shape[0] = b;
            Ok((ctx.empty(&shape[..rank])?, ctx.empty_typed::<i64>(&[b])?))
        };
        let idx = &self.order[range(0)];
        let (mut cx, mut cy) = alloc(idx.len())?;
        gather(x, y, s, idx, cx.data_mut()?, cy.data_mut()?);
        for k in 0..nb {
            let cur = Batch {
                x: Tensor::constant(cx),
                y: cy,
                index: k,
            };
            if k + 1 == nb {
                return f(cur);
            }
            let idx = &self.order[range(k + 1)];
            let (mut nx, mut ny) = alloc(idx.len())?;
            let (xo, yo) = (nx.data_mut()?, ny.data_mut()?);
            if prefetch {
                ctx.one_shot_worker()
                    .join(|| gather(x, y, s, idx, xo, yo), || f(cur))?
                    .1?;
            } else {
                f(cur)?;
                gather(x, y, s, idx, xo, yo);
            }
            (cx, cy) = (nx, ny);
        }
        Ok(())
    }
}

/// Copies the samples at `idx` into `xo` and their labels into `yo`.
fn gather(x: &[f32], y: &[i64], s: usize, idx: &[i64], xo: &mut [f32], yo: &mut [i64]) {
    for ((&i, xs), yv) in idx.iter().zip(xo.chunks_exact_mut(s)).zip(yo.iter_mut()) {
        let i = i as usize;
        xs.copy_from_slice(&x[i * s..(i + 1) * s]);
        *yv = y[i];
    }
}
