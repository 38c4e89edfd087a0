//! [`DataParallel`]: a model's parameters replicated over the ranks, with a
//! gradient exchange whose result does not depend on the number of ranks.

use std::ops::Range;
use std::time::Instant;

use fucina::autograd::Tensor;
use fucina::exec::ExecContext;
use mpi::datatype::{Partition, PartitionMut};
use mpi::request::{Request, Scope};
use mpi::traits::*;

use crate::error::{DistError, Result};
use crate::reduce::{DistParam, ParamSet, StepOutput, bucket_ranges, owner, shard_range};
use crate::tree::{divide_into, run_ops, tree_allows, tree_ops};
use crate::world::World;

/// How a [`DataParallel`] step combines the ranks' partial gradients. Every
/// choice sums the `M` microbatch partials in the same fixed binary tree over
/// microbatch indices (see [`tree_allows`]), so they give the same bits; they
/// differ in what travels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// [`Tree`](Reduction::Tree) where the rank count allows it
    /// ([`tree_allows`]), [`Allgather`](Reduction::Allgather) otherwise. The
    /// default.
    #[default]
    Auto,
    /// Each rank sums its own microbatches' subtree locally; the gradient is
    /// cut into one slice per rank (per bucket), the subtree sums are
    /// reduce-scattered (rank `s` receives slice `s` of every rank's subtree
    /// sum and adds them in the tree's order), and the reduced slices are
    /// allgathered. Each rank receives about `2 (N − 1) / N` times the
    /// gradient's bytes, what a ring all-reduce receives. Needs a power-of-two
    /// rank count no larger than the microbatch count; [`DataParallel::new`]
    /// refuses other counts with [`DistError::TreeRankCount`]. The exchange
    /// starts after the rank's last microbatch
    /// ([`overlap`](DataParallelOptions::overlap) has no effect).
    Tree,
    /// Every rank receives every microbatch's partial (one `MPI_Iallgatherv`
    /// per bucket and round, overlapping the next microbatch's computation)
    /// and sums all of them in the tree. Any rank count, including more ranks
    /// than microbatches; each rank receives `(M − own) ×` the partial's bytes,
    /// `M / 2` times a ring all-reduce's volume.
    Allgather,
}

impl std::str::FromStr for Reduction {
    type Err = String;

    /// `auto`, `tree` or `allgather` (the examples' `--reduction` values).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Reduction::Auto),
            "tree" => Ok(Reduction::Tree),
            "allgather" => Ok(Reduction::Allgather),
            v => Err(format!("`{v}` is not auto, tree or allgather")),
        }
    }
}

/// How a [`DataParallel`] splits and exchanges a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataParallelOptions {
    /// Microbatches per global batch: a fixed count, independent of the number
    /// of ranks (rank `r` of `n` computes [`shard_range`]`(microbatches, r, n)`).
    /// The result of a step is bitwise the same for every rank count that
    /// splits the same microbatches. Default 8.
    pub microbatches: usize,
    /// The largest exchange message, in bytes of one microbatch's partial
    /// gradient (the flat gradient is cut into buckets of at most this many
    /// bytes, exchanged last bucket first). Default 1 MiB.
    pub bucket_bytes: usize,
    /// In [`step`](DataParallel::step), start exchanging a microbatch's partial
    /// as soon as its backward is done, while the next microbatch computes
    /// (`false`: exchange everything after the last microbatch). Default `true`.
    /// Only [`Reduction::Allgather`] can overlap.
    pub overlap: bool,
    /// How the partials are combined across ranks. Default
    /// [`Reduction::Auto`].
    pub reduction: Reduction,
}

impl Default for DataParallelOptions {
    fn default() -> Self {
        DataParallelOptions {
            microbatches: 8,
            bucket_bytes: 1 << 20,
            overlap: true,
            reduction: Reduction::Auto,
        }
    }
}

/// A model's parameters (variables), the same on every rank, and the
/// deterministic exchange of their gradients.
///
/// Every global batch is cut into [`microbatches`](DataParallelOptions::microbatches)
/// fixed microbatches; each rank computes the gradient of its own contiguous
/// slice of them, one microbatch at a time (a *partial*: the gradient of that
/// microbatch's mean loss, plus a scalar such as the loss). The partials are
/// summed in one fixed binary tree over microbatch indices and divided by the
/// count; the [`Reduction`] decides where the tree's additions run (each rank
/// its own subtree, then a reduce-scatter and an allgather of slices; or every
/// rank all of it, after an allgather of every partial). The tree sees the
/// same values in the same shape whatever the rank count, so the gradients (and
/// so the whole training run) have the same bits for 1, 2, 4, ... ranks, for
/// either reduction, and for
/// [`LocalDataParallel`](crate::LocalDataParallel) in one process.
///
/// Two ways to drive a step:
/// - [`step`](DataParallel::step) with a closure that runs microbatch `m`'s
///   forward and backward (with [`Reduction::Allgather`], the exchange of a
///   microbatch overlaps the next microbatch's computation when
///   [`overlap`](DataParallelOptions::overlap) is on);
/// - [`record_microbatch`](DataParallel::record_microbatch) after each local
///   backward, then [`all_reduce_gradients`](DataParallel::all_reduce_gradients).
///
/// Either way, the parameters' gradients are then the global mean, for any
/// optimizer step.
///
/// The parameters are variable [`Tensor`]s or `fucina::nn::Parameter`s (any
/// [`DistParam`]). With a `fucina::nn` model's own handles
/// (`model.parameters()`), rank 0's values reach the model's layers, and a
/// `fucina::optim` optimizer built over the same handles steps on the
/// exchanged gradients:
///
/// ```no_run
/// use fucina::nn::{Linear, Module};
/// use fucina::optim::Sgd;
/// use fucina::{ExecContext, Tensor};
/// use fucina_dist::{DataParallel, DataParallelOptions, World};
///
/// let world = World::init()?;
/// let ctx = ExecContext::new();
/// let fc = Linear::new(&ctx, 4, 1, 7)?;
/// let mut opt = Sgd::new(fc.parameters(), 0.1)?;
/// let opts = DataParallelOptions { microbatches: 4, ..Default::default() };
/// let mut dp = DataParallel::new(&world, fc.parameters(), opts)?;
/// let x = Tensor::from_slice(&ctx, &[4, 4], &[0.5; 16])?;
/// dp.step(&ctx, |ctx, _, m| {
///     let y = fc.forward(ctx, &x)?.scale(ctx, (m + 1) as f32)?;
///     let loss = y.mean_all(ctx)?;
///     loss.backward(ctx)?;
///     loss.item()
/// })?;
/// opt.step(&ctx)?; // the same update on every rank, seen by `fc`
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DataParallel<'w, P = Tensor> {
    world: &'w World,
    set: ParamSet<P>,
    opts: DataParallelOptions,
    /// This rank's microbatches.
    mine: Range<usize>,
    /// `Tree` or `Allgather` (`Auto` resolved).
    reduction: Reduction,
    /// `max` over ranks of their microbatch count: the exchange rounds.
    rounds: usize,
    buckets: Vec<Range<usize>>,
    /// Allgather: per `(round, bucket)`, per rank: element counts and
    /// displacements.
    counts: Vec<Vec<i32>>,
    displs: Vec<Vec<i32>>,
    /// Allgather: per microbatch `m`, `(owner rank, round)`.
    placement: Vec<(usize, usize)>,
    /// Allgather: the tree's additions over all microbatches.
    all_ops: Vec<(usize, usize)>,
    /// Tree: the additions of this rank's subtree (slots `0 .. own`).
    local_ops: Vec<(usize, usize)>,
    /// Tree: the additions of the tree over the ranks' subtree sums.
    top_ops: Vec<(usize, usize)>,
    /// Tree: per bucket, per rank, the length and start (within the bucket) of
    /// the rank's slice.
    slice_counts: Vec<Vec<i32>>,
    slice_displs: Vec<Vec<i32>>,
    /// Tree: per bucket, `size` times this rank's slice length, and `r ×` it.
    mine_counts: Vec<Vec<i32>>,
    mine_displs: Vec<Vec<i32>>,
    /// `rounds × width`: this rank's partials.
    send: Vec<f32>,
    /// Allgather: `rounds × size × width`, every rank's partials, round-major,
    /// then by bucket, then by rank. Tree: per bucket, `size ×` this rank's
    /// slice, by source rank (at least one element, so that no pointer MPI sees
    /// dangles).
    recv: Vec<f32>,
    mean: Vec<f32>,
    /// Elements received from other ranks per step: the counts posted to MPI.
    recv_elems: usize,
    recorded: usize,
    recorded_s: f64,
}

impl std::fmt::Debug for DataParallel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("world", self.world)
            .field("opts", &self.opts)
            .field("reduction", &self.reduction)
            .field("mine", &self.mine)
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

impl<'w, P: DistParam> DataParallel<'w, P> {
    /// Wraps `params` (variables or `fucina::nn::Parameter`s) on every rank: checks that all ranks pass the
    /// same parameter count and shapes and the same options, then overwrites
    /// every rank's parameter values with rank 0's.
    ///
    /// Collective: every rank calls it, and every rank gets the same `Ok` or the
    /// same kind of `Err` (nobody is left waiting).
    ///
    /// # Errors
    /// [`DistError::Config`] for zero microbatches or bucket bytes, or a
    /// parameter that is not a variable (on any rank: every rank reports it);
    /// [`DistError::ShapeMismatch`] naming the ranks, parameters, shapes or
    /// options that differ from rank 0's; [`DistError::TreeRankCount`] for
    /// [`Reduction::Tree`] with a rank count it cannot use (see
    /// [`tree_allows`]). On an error no parameter was changed.
    pub fn new(
        world: &'w World,
        params: Vec<P>,
        opts: DataParallelOptions,
    ) -> Result<DataParallel<'w, P>> {
        // Local problems first, but agreed on collectively so that no rank is
        // left in the shape check's broadcast.
        let local = if opts.microbatches == 0 {
            Err(DistError::Config("microbatches must be at least 1".into()))
        } else if opts.bucket_bytes < 4 {
            Err(DistError::Config(
                "bucket_bytes must hold at least one f32 (4 bytes)".into(),
            ))
        } else {
            ParamSet::new(params).and_then(|set| {
                // MPI counts and displacements are `int`: one bucket from every
                // rank must fit.
                let bucket = (opts.bucket_bytes / 4).min(set.width());
                if bucket.saturating_mul(world.size()) > i32::MAX as usize {
                    Err(DistError::Config(format!(
                        "bucket_bytes {} × {} ranks exceeds MPI's int counts: use smaller buckets",
                        opts.bucket_bytes,
                        world.size()
                    )))
                } else {
                    Ok(set)
                }
            })
        };
        let bad: Vec<usize> = world
            .all_gather_u64(u64::from(local.is_err()))
            .iter()
            .enumerate()
            .filter_map(|(r, &b)| (b != 0).then_some(r))
            .collect();
        let set = match local {
            Err(e) => return Err(e),
            Ok(_) if !bad.is_empty() => {
                return Err(DistError::Config(format!(
                    "rank(s) {bad:?} refused their parameters or options (see their error)"
                )));
            }
            Ok(set) => set,
        };
        check_same_model(world, &set, &opts)?;
        // Every rank has the same microbatch count and reduction now, and the
        // same size: every rank decides alike.
        let (n, m) = (world.size(), opts.microbatches);
        let reduction = match opts.reduction {
            Reduction::Tree if !tree_allows(m, n) => {
                return Err(DistError::TreeRankCount {
                    ranks: n,
                    microbatches: m,
                });
            }
            Reduction::Auto if tree_allows(m, n) => Reduction::Tree,
            Reduction::Auto => Reduction::Allgather,
            r => r,
        };
        let mut set = set;
        broadcast_params(world, &mut set)?;
        Ok(Self::layout(world, set, opts, reduction))
    }

    fn layout(
        world: &'w World,
        set: ParamSet<P>,
        opts: DataParallelOptions,
        reduction: Reduction,
    ) -> DataParallel<'w, P> {
        let (n, m, w, me) = (world.size(), opts.microbatches, set.width(), world.rank());
        let shards: Vec<Range<usize>> = (0..n).map(|r| shard_range(m, r, n)).collect();
        let mine = shards[me].clone();
        let rounds = shards.iter().map(|s| s.len()).max().unwrap_or(0);
        let buckets = bucket_ranges(w, opts.bucket_bytes / 4);
        let mut dp = DataParallel {
            world,
            mine: mine.clone(),
            set,
            opts,
            reduction,
            rounds,
            buckets,
            counts: Vec::new(),
            displs: Vec::new(),
            placement: Vec::new(),
            all_ops: Vec::new(),
            local_ops: Vec::new(),
            top_ops: Vec::new(),
            slice_counts: Vec::new(),
            slice_displs: Vec::new(),
            mine_counts: Vec::new(),
            mine_displs: Vec::new(),
            send: vec![0.0; rounds * w],
            recv: Vec::new(),
            mean: vec![0.0; w],
            recv_elems: 0,
            recorded: 0,
            recorded_s: 0.0,
        };
        let others = |counts: &[i32]| -> usize {
            counts
                .iter()
                .enumerate()
                .filter(|&(r, _)| r != me)
                .map(|(_, &c)| c as usize)
                .sum()
        };
        match reduction {
            Reduction::Tree => {
                // This rank's node: index `me` at depth log2(n).
                tree_ops(m, n.trailing_zeros(), me, mine.start, &mut dp.local_ops);
                tree_ops(n, 0, 0, 0, &mut dp.top_ops);
                let mut recv_len = 0;
                for b in &dp.buckets {
                    let slices: Vec<Range<usize>> =
                        (0..n).map(|r| shard_range(b.len(), r, n)).collect();
                    let own = slices[me].len();
                    dp.slice_counts
                        .push(slices.iter().map(|s| to_i32(s.len())).collect());
                    dp.slice_displs
                        .push(slices.iter().map(|s| to_i32(s.start)).collect());
                    dp.mine_counts.push(vec![to_i32(own); n]);
                    dp.mine_displs
                        .push((0..n).map(|r| to_i32(r * own)).collect());
                    recv_len += n * own;
                }
                // Received: slice `me` of every other rank's subtree sum, then
                // every other rank's reduced slice.
                dp.recv_elems = dp.mine_counts.iter().map(|c| others(c)).sum::<usize>()
                    + dp.slice_counts.iter().map(|c| others(c)).sum::<usize>();
                dp.recv = vec![0.0; recv_len.max(1)];
            }
            _ => {
                tree_ops(m, 0, 0, 0, &mut dp.all_ops);
                for i in 0..rounds {
                    for b in &dp.buckets {
                        let len = b.len();
                        dp.counts.push(
                            shards
                                .iter()
                                .map(|s| if i < s.len() { to_i32(len) } else { 0 })
                                .collect(),
                        );
                        dp.displs.push((0..n).map(|r| to_i32(r * len)).collect());
                    }
                }
                dp.recv_elems = dp.counts.iter().map(|c| others(c)).sum();
                dp.placement = (0..m)
                    .map(|mb| {
                        let r = owner(m, n, mb);
                        (r, mb - shards[r].start)
                    })
                    .collect();
                dp.recv = vec![0.0; rounds * n * w];
            }
        }
        dp
    }

    /// This rank's microbatches of every step (see [`shard_range`]).
    pub fn my_microbatches(&self) -> Range<usize> {
        self.mine.clone()
    }

    /// The options.
    pub fn options(&self) -> DataParallelOptions {
        self.opts
    }

    /// The world.
    pub fn world(&self) -> &'w World {
        self.world
    }

    /// The parameters.
    pub fn params(&self) -> &[P] {
        &self.set.params
    }

    /// The parameters, for an optimizer step.
    pub fn params_mut(&mut self) -> &mut [P] {
        &mut self.set.params
    }

    /// The parameters back.
    pub fn into_params(self) -> Vec<P> {
        self.set.params
    }

    /// The number of exchange buckets per microbatch partial.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The reduction the steps use ([`Reduction::Auto`] resolved to `Tree` or
    /// `Allgather`).
    pub fn reduction(&self) -> Reduction {
        self.reduction
    }

    /// Bytes this rank receives from other ranks per step: the sum of the
    /// element counts it posts to MPI for other ranks' data, times 4.
    ///
    /// - [`Reduction::Allgather`]: `(microbatches − own) × (parameters + 1) × 4`.
    /// - [`Reduction::Tree`]: per bucket of `L` elements, with this rank's slice
    ///   of `l ≈ L / N` elements, `(N − 1) × l` (the other ranks' subtree sums'
    ///   slice) plus `L − l` (the other ranks' reduced slices): about
    ///   `2 (N − 1) / N × (parameters + 1) × 4`, what a ring all-reduce
    ///   receives ([`ring_bytes_per_step`](DataParallel::ring_bytes_per_step)).
    pub fn bytes_received_per_step(&self) -> u64 {
        (self.recv_elems * 4) as u64
    }

    /// What each rank would receive per step in a ring all-reduce of the same
    /// gradient (`parameters × 4` bytes) over the same ranks:
    /// `2 (N − 1) / N × parameters × 4` (rounded down), the least any
    /// all-reduce can move. The yardstick for
    /// [`bytes_received_per_step`](DataParallel::bytes_received_per_step).
    pub fn ring_bytes_per_step(&self) -> u64 {
        let n = self.world.size() as u128;
        (2 * (n - 1) * self.set.numel() as u128 * 4 / n) as u64
    }

    /// One step: `f(ctx, params, m)` runs the forward and backward of each of this
    /// rank's microbatches `m` (in increasing order; the gradients are released
    /// before each call) and returns a scalar (its loss); afterwards every parameter's gradient on every rank is the mean
    /// of all microbatches' gradients, summed in the fixed tree, and the
    /// output's `value` is the same mean of the scalars.
    ///
    /// `f` may return any error that converts into a [`DistError`]: the
    /// autograd layer's (`fucina::autograd::Result`), the facade's
    /// (`fucina::Result`, so the closure can call `fucina::nn` layers with
    /// `?`), or a `DistError` itself. A closure whose only error-typed
    /// expression is `Ok(..)` names its type: `Ok::<_, fucina::Error>(loss)`.
    ///
    /// Collective: every rank calls it once per step.
    ///
    /// # Errors
    /// With one rank, the first error of `f` or of setting the gradients. With
    /// more, an error of `f` is one rank's alone: it [aborts](World::abort) the
    /// job with the error on stderr rather than leave the others waiting.
    pub fn step<F, E>(&mut self, ctx: &ExecContext, mut f: F) -> Result<StepOutput>
    where
        F: FnMut(&ExecContext, &[P], usize) -> std::result::Result<f32, E>,
        E: Into<DistError>,
    {
        if self.recorded != 0 {
            return Err(DistError::MicrobatchOrder {
                got: self.mine.start,
                expected: self.mine.clone().nth(self.recorded),
                owned: self.mine.clone(),
            });
        }
        if !self.opts.overlap {
            for m in self.mine.clone() {
                let t = Instant::now();
                self.set.zero_grads();
                let value = match f(ctx, &self.set.params, m) {
                    Ok(v) => v,
                    Err(e) => return self.fail(m, e.into()),
                };
                // (record_microbatch adds the copy's time itself)
                self.recorded_s += t.elapsed().as_secs_f64();
                self.record_microbatch(m, value)?;
            }
            return self.all_reduce_gradients(ctx);
        }
        let mut ff = |ctx: &ExecContext, p: &[P], m: usize| f(ctx, p, m).map_err(Into::into);
        match self.reduction {
            Reduction::Tree => self.exchange_tree(ctx, Some(&mut ff)),
            _ => self.exchange(ctx, Some(&mut ff)),
        }
    }

    /// Takes the gradients the parameters hold now as microbatch `m`'s partial,
    /// with `value` (its loss) as its scalar, and releases them. Call it after
    /// the backward of each of this rank's microbatches, in increasing order,
    /// then [`all_reduce_gradients`](DataParallel::all_reduce_gradients).
    /// Release the gradients (`zero_grad`) before the first microbatch's
    /// backward: after a step they hold the mean until released.
    ///
    /// # Errors
    /// [`DistError::MicrobatchOrder`] if `m` is not the next microbatch of this
    /// rank.
    pub fn record_microbatch(&mut self, m: usize, value: f32) -> Result<()> {
        let expected = self.mine.clone().nth(self.recorded);
        if expected != Some(m) {
            return Err(DistError::MicrobatchOrder {
                got: m,
                expected,
                owned: self.mine.clone(),
            });
        }
        let t = Instant::now();
        let w = self.set.width();
        let i = self.recorded;
        self.set
            .take_grads(value, &mut self.send[i * w..(i + 1) * w])?;
        self.recorded += 1;
        self.recorded_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Exchanges the recorded partials of every rank (last bucket first) and
    /// sets every parameter's gradient to the fixed-tree mean over all
    /// microbatches. Collective.
    ///
    /// # Errors
    /// [`DistError::MissingMicrobatches`] if some of this rank's microbatches
    /// were not recorded (a programming error of this rank alone: with more than
    /// one rank, [`abort_on_error`](World::abort_on_error) it).
    pub fn all_reduce_gradients(&mut self, ctx: &ExecContext) -> Result<StepOutput> {
        if self.recorded != self.mine.len() {
            return Err(DistError::MissingMicrobatches {
                recorded: self.recorded,
                owned: self.mine.len(),
            });
        }
        let none = None::<&mut dyn FnMut(&ExecContext, &[P], usize) -> Result<f32>>;
        let out = match self.reduction {
            Reduction::Tree => self.exchange_tree(ctx, none),
            _ => self.exchange(ctx, none),
        };
        self.recorded = 0;
        out.map(|mut o| {
            o.compute_s += std::mem::take(&mut self.recorded_s);
            o
        })
    }

    /// An error of this rank alone during a step: returned with one rank,
    /// otherwise the job is aborted.
    fn fail<T>(&mut self, m: usize, e: DistError) -> Result<T> {
        self.recorded = 0;
        if self.world.size() > 1 {
            self.world.abort(&format!("microbatch {m} failed: {e}"));
        }
        Err(e)
    }

    /// The exchange rounds: round `i` carries every rank's `i`-th microbatch.
    /// With `compute`, this rank's `i`-th microbatch is computed just before its
    /// round is posted (so the exchange of round `i` runs while round `i + 1`
    /// computes); without, the partials were recorded already.
    fn exchange<F>(&mut self, ctx: &ExecContext, mut compute: Option<&mut F>) -> Result<StepOutput>
    where
        F: FnMut(&ExecContext, &[P], usize) -> Result<f32> + ?Sized,
    {
        let (n, w, nb) = (self.world.size(), self.set.width(), self.buckets.len());
        let comm = self.world.comm();
        let mine = self.mine.clone();
        let set = &self.set;
        let mut compute_s = 0.0;
        let mut exchange_s = 0.0;
        let mut failed: Option<(usize, DistError)> = None;
        {
            let mut sends = self.send.chunks_mut(w);
            // One receive partition per (round, bucket), posted last bucket first.
            let mut parts = Vec::with_capacity(self.rounds * nb);
            for (i, block) in self.recv.chunks_mut(n * w).enumerate() {
                let mut rest = block;
                let first = parts.len();
                for (b, range) in self.buckets.iter().enumerate() {
                    let (head, tail) = rest.split_at_mut(n * range.len());
                    rest = tail;
                    parts.push(PartitionMut::new(
                        head,
                        &self.counts[i * nb + b][..],
                        &self.displs[i * nb + b][..],
                    ));
                }
                parts[first..].reverse();
            }
            let mut parts = parts.iter_mut();
            mpi::request::scope(|scope| {
                let mut pending: Vec<Request<'_, _, _>> = Vec::new();
                for i in 0..self.rounds {
                    let send = sends.next().expect("one send chunk per round");
                    let own = i < mine.len();
                    if let (true, Some(f)) = (own, compute.as_deref_mut()) {
                        let t = Instant::now();
                        progress(&mut pending);
                        exchange_s += t.elapsed().as_secs_f64();
                        let t = Instant::now();
                        let m = mine.start + i;
                        set.zero_grads();
                        let r = f(ctx, &set.params, m).and_then(|v| set.take_grads(v, send));
                        compute_s += t.elapsed().as_secs_f64();
                        if let Err(e) = r {
                            failed = Some((m, e));
                            break;
                        }
                    }
                    let t = Instant::now();
                    let send: &[f32] = send;
                    for range in self.buckets.iter().rev() {
                        let part = parts.next().expect("one partition per bucket");
                        let chunk = if own {
                            &send[range.clone()]
                        } else {
                            &send[..0]
                        };
                        pending.push(post(comm, scope, chunk, part));
                    }
                    exchange_s += t.elapsed().as_secs_f64();
                }
                let t = Instant::now();
                for r in pending {
                    r.wait();
                }
                exchange_s += t.elapsed().as_secs_f64();
            });
        }
        if let Some((m, e)) = failed {
            return self.fail(m, e);
        }
        let t = Instant::now();
        let m = self.opts.microbatches;
        debug_assert_eq!(self.placement.len(), m);
        for range in &self.buckets {
            let len = range.len();
            let placement = &self.placement;
            // Microbatch `mb`'s piece of this bucket in the receive buffer.
            let at = |mb: usize| {
                let (r, i) = placement[mb];
                i * n * w + n * range.start + r * len
            };
            // The whole tree, in place over the received partials.
            run_ops(&mut self.recv, len, &self.all_ops, at);
            let root = at(0);
            divide_into(
                &mut self.mean[range.clone()],
                &self.recv[root..root + len],
                m,
            );
        }
        self.set.set_grads(ctx, &self.mean[..w - 1])?;
        let bytes_received = self.bytes_received_per_step();
        Ok(StepOutput {
            value: self.mean[w - 1],
            compute_s,
            exchange_s,
            reduce_s: t.elapsed().as_secs_f64(),
            bytes_received,
        })
    }

    /// The tree reduction: this rank's microbatches (computed here with
    /// `compute`, or recorded already), their subtree summed in place, the
    /// subtree sums reduce-scattered by slice (one `MPI_Ialltoallv` per
    /// bucket), each rank's slice summed in the tree over ranks and divided by
    /// the microbatch count, and the slices allgathered (one
    /// `MPI_Iallgatherv` per bucket) into the mean.
    fn exchange_tree<F>(&mut self, ctx: &ExecContext, compute: Option<&mut F>) -> Result<StepOutput>
    where
        F: FnMut(&ExecContext, &[P], usize) -> Result<f32> + ?Sized,
    {
        let (n, w) = (self.world.size(), self.set.width());
        let own = self.mine.len();
        let mut compute_s = 0.0;
        if let Some(f) = compute {
            for (i, m) in self.mine.clone().enumerate() {
                let t = Instant::now();
                self.set.zero_grads();
                let send = &mut self.send[i * w..(i + 1) * w];
                let r = f(ctx, &self.set.params, m).and_then(|v| self.set.take_grads(v, send));
                compute_s += t.elapsed().as_secs_f64();
                if let Err(e) = r {
                    return self.fail(m, e);
                }
            }
        }
        let t = Instant::now();
        // This rank's subtree, in place: its sum in slot 0.
        run_ops(&mut self.send[..own * w], w, &self.local_ops, |i| i * w);
        let mut reduce_s = t.elapsed().as_secs_f64();

        // Reduce-scatter, part 1: slice `s` of every rank's subtree sum to
        // rank `s`.
        let t = Instant::now();
        let comm = self.world.comm();
        if n == 1 {
            // One rank: its slice is everything (bucket by bucket, in order).
            self.recv[..w].copy_from_slice(&self.send[..w]);
        } else {
            let root = &self.send[..w];
            let sends: Vec<_> = self
                .buckets
                .iter()
                .enumerate()
                .map(|(b, range)| {
                    Partition::new(
                        &root[range.clone()],
                        &self.slice_counts[b][..],
                        &self.slice_displs[b][..],
                    )
                })
                .collect();
            let mut recvs = Vec::with_capacity(self.buckets.len());
            let mut rest = &mut self.recv[..];
            for b in 0..self.buckets.len() {
                let (head, tail) = rest.split_at_mut(n * self.mine_counts[b][0] as usize);
                rest = tail;
                recvs.push(PartitionMut::new(
                    head,
                    &self.mine_counts[b][..],
                    &self.mine_displs[b][..],
                ));
            }
            mpi::request::scope(|scope| {
                let pending: Vec<_> = sends
                    .iter()
                    .zip(recvs.iter_mut())
                    .map(|(send, recv)| comm.immediate_all_to_all_varcount_into(scope, send, recv))
                    .collect();
                for r in pending {
                    r.wait_without_status();
                }
            });
        }
        let mut exchange_s = t.elapsed().as_secs_f64();

        // Part 2: this rank's slice of every subtree sum, summed in the tree
        // over ranks (the top of the fixed tree), divided in place.
        let t = Instant::now();
        let m = self.opts.microbatches as f32;
        let mut at = 0;
        for counts in &self.mine_counts {
            let len = counts[0] as usize;
            let block = &mut self.recv[at..at + n * len];
            run_ops(block, len, &self.top_ops, |r| r * len);
            for v in &mut block[..len] {
                *v /= m;
            }
            at += n * len;
        }
        reduce_s += t.elapsed().as_secs_f64();

        // Allgather of the reduced slices into the mean.
        let t = Instant::now();
        if n == 1 {
            self.mean.copy_from_slice(&self.recv[..w]);
        } else {
            let mut sends = Vec::with_capacity(self.buckets.len());
            let mut at = 0;
            for counts in &self.mine_counts {
                let len = counts[0] as usize;
                sends.push(&self.recv[at..at + len]);
                at += n * len;
            }
            let mut recvs = Vec::with_capacity(self.buckets.len());
            let mut rest = &mut self.mean[..];
            for (b, range) in self.buckets.iter().enumerate() {
                let (head, tail) = rest.split_at_mut(range.len());
                rest = tail;
                recvs.push(PartitionMut::new(
                    head,
                    &self.slice_counts[b][..],
                    &self.slice_displs[b][..],
                ));
            }
            mpi::request::scope(|scope| {
                let pending: Vec<_> = sends
                    .iter()
                    .zip(recvs.iter_mut())
                    .map(|(&send, recv)| comm.immediate_all_gather_varcount_into(scope, send, recv))
                    .collect();
                for r in pending {
                    r.wait_without_status();
                }
            });
        }
        exchange_s += t.elapsed().as_secs_f64();

        let t = Instant::now();
        self.set.set_grads(ctx, &self.mean[..w - 1])?;
        reduce_s += t.elapsed().as_secs_f64();
        Ok(StepOutput {
            value: self.mean[w - 1],
            compute_s,
            exchange_s,
            reduce_s,
            bytes_received: self.bytes_received_per_step(),
        })
    }
}

/// One bucket's receive buffer with its per-rank counts and displacements.
type Part<'a> = PartitionMut<'a, [f32], &'a [i32], &'a [i32]>;

/// Posts one bucket's allgather.
fn post<'a, Sc: Scope<'a>>(
    comm: &mpi::topology::SimpleCommunicator,
    scope: Sc,
    send: &'a [f32],
    part: &'a mut PartitionMut<'_, [f32], &[i32], &[i32]>,
) -> Request<'a, Part<'a>, Sc> {
    comm.immediate_all_gather_varcount_into(scope, send, part)
}

/// Lets MPI progress the pending exchanges (Open MPI moves non-blocking
/// collectives forward only inside MPI calls): tests each once.
fn progress<'a, D: ?Sized, Sc: Scope<'a>>(pending: &mut Vec<Request<'a, D, Sc>>) {
    let mut still = Vec::with_capacity(pending.len());
    for r in pending.drain(..) {
        if let Err(r) = r.test() {
            still.push(r);
        }
    }
    *pending = still;
}

fn to_i32(v: usize) -> i32 {
    i32::try_from(v).expect("an MPI count fits in i32 (bucket_bytes bounds it)")
}

/// Checks that every rank has rank 0's microbatch count and parameter shapes.
fn check_same_model<P: DistParam>(
    world: &World,
    set: &ParamSet<P>,
    opts: &DataParallelOptions,
) -> Result<()> {
    let describe = |set: &ParamSet<P>| -> Vec<u8> {
        let mut d = format!("microbatches {}", opts.microbatches);
        for p in &set.params {
            d.push_str(&format!(";{:?}", p.variable().shape()));
        }
        // The options that shape the exchange, after the shapes (a rank with
        // other buckets or another reduction would post other collectives).
        d.push_str(&format!(
            " (reduction {:?}, bucket_bytes {})",
            opts.reduction, opts.bucket_bytes
        ));
        d.into_bytes()
    };
    let mine = describe(set);
    let mut root = mine.clone();
    world.broadcast_bytes(&mut root);
    let ok = root == mine;
    let bad: Vec<usize> = world
        .all_gather_u64(u64::from(!ok))
        .iter()
        .enumerate()
        .filter_map(|(r, &b)| (b != 0).then_some(r))
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    let show = |d: &[u8]| String::from_utf8_lossy(d).replace(';', ", parameters ");
    let mut msg = format!(
        "rank(s) {bad:?} differ from rank 0, which has {}",
        show(&root)
    );
    if !ok {
        msg.push_str(&format!(
            "; this rank ({}) has {}",
            world.rank(),
            show(&mine)
        ));
    }
    Err(DistError::ShapeMismatch(msg))
}

/// Overwrites every rank's parameter values with rank 0's.
fn broadcast_params<P: DistParam>(world: &World, set: &mut ParamSet<P>) -> Result<()> {
    let root = world.comm().process_at_rank(0);
    for p in &mut set.params {
        let mut values = p.variable().to_vec();
        root.broadcast_into(&mut values[..]);
        // A `Tensor` is written copy-on-write (a handle the caller kept keeps
        // its old values; the parameters are the ones `DataParallel` holds); a
        // `Parameter` through its shared handle (the model sees the values).
        p.overwrite(&values)?;
    }
    Ok(())
}
