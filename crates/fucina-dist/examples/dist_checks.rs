//! Multi-rank checks of `fucina-dist` that need `mpirun` (run by the crate's
//! `tests/mpi.rs`; each mode prints `ok <what>` lines on rank 0):
//!
//! ```text
//! mpirun -np 2 target/debug/examples/dist_checks api       # record/all_reduce = step = local; checkpoints
//! mpirun -np 2 target/debug/examples/dist_checks mismatch  # rank 1's model differs: Err on every rank
//! mpirun -np 2 target/debug/examples/dist_checks fail      # rank 1 fails a microbatch: the job aborts
//! mpirun -np 4 target/debug/examples/dist_checks reductions # Tree = Allgather = local; bytes; refusals
//! ```
// The autograd error carries inline shapes (no heap on the error path).

use std::process::ExitCode;

use fucina::autograd::Tensor;
use fucina::exec::ExecContext;
use fucina::nn::{Linear, Module};
use fucina::optim::AdamW;
use fucina_dist::{
    DataParallel, DataParallelOptions, DistError, LocalDataParallel, Reduction, ShardedSampler,
    TrainPosition, World, params_hash, shard_range, tree_allows,
};

/// A small model whose gradients depend on the microbatch index: parameters
/// `[w (5x7), b (5)]`, microbatch `m`'s loss `mean((x_m · wᵀ + b)²)` with `x_m`
/// drawn from `m`.
fn params(ctx: &ExecContext, seed: u64) -> Vec<Tensor> {
    vec![
        Tensor::randn(ctx, &[5, 7], 1.0, seed)
            .unwrap()
            .into_variable(),
        Tensor::randn(ctx, &[5], 1.0, seed + 1)
            .unwrap()
            .into_variable(),
    ]
}

fn microbatch(ctx: &ExecContext, p: &[Tensor], m: usize) -> fucina::autograd::Result<f32> {
    let x = Tensor::randn(ctx, &[3, 7], 1.0, 1000 + m as u64)?;
    let y = x.linear(ctx, &p[0], Some(&p[1]))?;
    let loss = y.mul(ctx, &y)?.mean_all(ctx)?;
    loss.backward(ctx)?;
    loss.item()
}

fn grads(ctx: &ExecContext, p: &[Tensor]) -> Vec<Tensor> {
    p.iter()
        .map(|t| t.grad(ctx).unwrap().expect("a gradient"))
        .collect()
}

fn ensure(world: &World, what: &str, ok: bool) {
    if !ok {
        world.abort(&format!("check failed: {what}"));
    }
    if world.is_root() {
        println!("ok {what}");
    }
}

fn api(world: &World) {
    let ctx = ExecContext::with_threads(1);
    let m = 7; // uneven over 2 and 4 ranks
    // The single-process reference.
    let mut local = LocalDataParallel::new(params(&ctx, 5), m).unwrap();
    let lout = local.step(&ctx, microbatch).unwrap();
    let want = params_hash(&grads(&ctx, local.params()));

    for (overlap, bucket_bytes) in [(true, 1 << 20), (false, 1 << 20), (true, 12), (false, 4)] {
        let opts = DataParallelOptions {
            microbatches: m,
            bucket_bytes,
            overlap,
            ..Default::default()
        };
        let mut dp = DataParallel::new(world, params(&ctx, 5), opts).unwrap();
        let out = world.abort_on_error(dp.step(&ctx, microbatch));
        ensure(
            world,
            &format!("step (overlap {overlap}, {} buckets) = local", dp.buckets()),
            params_hash(&grads(&ctx, dp.params())) == want && out.value == lout.value,
        );
    }

    // The parameter handle of fucina::nn: a layer's own parameters, different
    // on every rank before `new` (which makes them rank 0's, in the layer).
    let fc = fucina::nn::Linear::new(&ctx, 7, 5, 100 + world.rank() as u64).unwrap();
    let root = fucina::nn::Linear::new(&ctx, 7, 5, 100).unwrap();
    let as_tensors = |p: &[fucina::nn::Parameter]| [p[0].tensor(), p[1].tensor()];
    let nn_microbatch = |ctx: &ExecContext, p: &[fucina::nn::Parameter], m: usize| {
        microbatch(ctx, &as_tensors(p), m)
    };
    let mut nn_local = LocalDataParallel::new(fucina::nn::Module::parameters(&root), m).unwrap();
    let nn_lout = nn_local.step(&ctx, nn_microbatch).unwrap();
    let nn_want = params_hash(&grads(&ctx, &as_tensors(nn_local.params())));
    let opts = DataParallelOptions {
        microbatches: m,
        ..Default::default()
    };
    let mut dp = DataParallel::new(world, fucina::nn::Module::parameters(&fc), opts).unwrap();
    let broadcast = fc.weight.to_vec() == root.weight.to_vec();
    let out = world.abort_on_error(dp.step(&ctx, nn_microbatch));
    ensure(
        world,
        "nn::Parameter handles: broadcast reaches the layer, step = local",
        broadcast
            && params_hash(&grads(&ctx, &as_tensors(dp.params()))) == nn_want
            && out.value == nn_lout.value,
    );

    // record_microbatch + all_reduce_gradients.
    let mut dp = DataParallel::new(
        world,
        params(&ctx, 5),
        DataParallelOptions {
            microbatches: m,
            ..Default::default()
        },
    )
    .unwrap();
    let mine = dp.my_microbatches();
    if let Some(last) = mine.clone().last() {
        let e = dp.record_microbatch(last + 1, 0.0).unwrap_err();
        ensure(
            world,
            "out-of-order record is an error",
            matches!(e, DistError::MicrobatchOrder { .. }),
        );
    } else {
        ensure(world, "out-of-order record is an error", true);
    }
    if !mine.is_empty() {
        let e = dp.all_reduce_gradients(&ctx).unwrap_err();
        ensure(
            world,
            "missing microbatches are an error",
            matches!(e, DistError::MissingMicrobatches { .. }),
        );
    } else {
        ensure(world, "missing microbatches are an error", true);
    }
    for mb in mine {
        for p in dp.params() {
            p.zero_grad();
        }
        let v = world.abort_on_error(microbatch(&ctx, dp.params(), mb));
        world.abort_on_error(dp.record_microbatch(mb, v));
    }
    let out = world.abort_on_error(dp.all_reduce_gradients(&ctx));
    ensure(
        world,
        "record_microbatch + all_reduce_gradients = local",
        params_hash(&grads(&ctx, dp.params())) == want && out.value == lout.value,
    );

    checkpoints(world, &ctx);
}

/// A `Linear` from `seed` after one AdamW step (so the optimizer has moments
/// and a step count).
fn trained(ctx: &ExecContext, seed: u64) -> (Linear, AdamW) {
    let model = Linear::new(ctx, 7, 5, seed).unwrap();
    let mut opt = AdamW::new(model.parameters(), 0.1).unwrap();
    let x = Tensor::randn(ctx, &[3, 7], 1.0, 5).unwrap();
    model
        .forward(ctx, &x)
        .unwrap()
        .mean_all(ctx)
        .unwrap()
        .backward(ctx)
        .unwrap();
    opt.step(ctx).unwrap();
    (model, opt)
}

/// Rank-0 checkpoints behind a barrier, loaded on every rank from rank 0's
/// bytes; failures are errors on every rank.
fn checkpoints(world: &World, ctx: &ExecContext) {
    let bits = |m: &Linear| -> Vec<u32> {
        m.parameters()
            .iter()
            .flat_map(|p| p.tensor().to_vec())
            .map(f32::to_bits)
            .collect()
    };
    let sampler = ShardedSampler::new(64, 16, 4, 3, world.rank(), world.size()).unwrap();
    let path = std::env::temp_dir().join(format!(
        "fucina-dist-checks-{}-{}.safetensors",
        world.size(),
        std::process::id()
    ));
    // Every rank has its own values; rank 0's are the ones written.
    let (mine, opt) = trained(ctx, 40 + world.rank() as u64);
    let at = TrainPosition { epoch: 2, step: 1 };
    let saved =
        fucina_dist::save_checkpoint_rank0(world, &path, &mine, Some(&opt), &sampler, at, &[]);
    world.abort_on_error(saved);
    let fresh = Linear::new(ctx, 7, 5, 90 + world.rank() as u64).unwrap();
    let mut fresh_opt = AdamW::new(fresh.parameters(), 0.1).unwrap();
    let r = world.abort_on_error(fucina_dist::load_checkpoint_rank0(
        world,
        ctx,
        &path,
        &fresh,
        Some(&mut fresh_opt),
        &sampler,
    ));
    let (rank0, _) = trained(ctx, 40);
    ensure(
        world,
        "rank-0 checkpoint loads on every rank, with the optimizer state and position",
        bits(&fresh) == bits(&rank0)
            && fresh_opt.step_count() == 1
            && r.position == at
            && r.saved_ranks == world.size(),
    );
    world.barrier();
    if world.is_root() {
        let _ = std::fs::remove_file(&path);
    }
    // Rank 0 cannot write, cannot read: every rank gets the error, nothing changes.
    let bad = std::path::Path::new("/nonexistent-dir/run.safetensors");
    let e = fucina_dist::save_checkpoint_rank0(world, bad, &mine, Some(&opt), &sampler, at, &[]);
    let before = bits(&fresh);
    let l = fucina_dist::load_checkpoint_rank0(world, ctx, bad, &fresh, None, &sampler);
    ensure(
        world,
        "failed rank-0 checkpoint save and load are errors on every rank",
        matches!(e, Err(DistError::Checkpoint { .. }))
            && matches!(l, Err(DistError::Checkpoint { .. }))
            && bits(&fresh) == before,
    );
}

/// Both reductions (and `Auto`) against the one-process run, for microbatch
/// counts that split evenly and unevenly, with large and tiny buckets, overlap
/// on and off, two steps each; what each rank reports receiving; the tree's
/// refusal of a rank count it cannot split; ranks that disagree on the
/// reduction.
fn reductions(world: &World) {
    let ctx = ExecContext::with_threads(1);
    let n = world.size();
    for m in [8usize, 7, 6] {
        let mut local = LocalDataParallel::new(params(&ctx, 5), m).unwrap();
        let lout = local.step(&ctx, microbatch).unwrap();
        let want = params_hash(&grads(&ctx, local.params()));
        let mut line = format!("bytes m {m} ranks {n}");
        for reduction in [Reduction::Tree, Reduction::Allgather, Reduction::Auto] {
            for (overlap, bucket_bytes) in [(true, 1 << 20), (false, 12)] {
                let opts = DataParallelOptions {
                    microbatches: m,
                    bucket_bytes,
                    overlap,
                    reduction,
                };
                let made = DataParallel::new(world, params(&ctx, 5), opts);
                if reduction == Reduction::Tree && !tree_allows(m, n) {
                    let refused = matches!(
                        &made,
                        Err(DistError::TreeRankCount { ranks, microbatches })
                            if *ranks == n && *microbatches == m
                    );
                    ensure(
                        world,
                        &format!("m {m}: Tree refuses {n} ranks ({bucket_bytes} bucket bytes)"),
                        refused,
                    );
                    continue;
                }
                let mut dp = world.abort_on_error(made);
                let expect = match reduction {
                    Reduction::Auto if tree_allows(m, n) => Reduction::Tree,
                    Reduction::Auto => Reduction::Allgather,
                    r => r,
                };
                let mut same = dp.reduction() == expect;
                let mut bytes = 0;
                for _ in 0..2 {
                    let out = world.abort_on_error(dp.step(&ctx, microbatch));
                    same &= params_hash(&grads(&ctx, dp.params())) == want
                        && out.value.to_bits() == lout.value.to_bits();
                    bytes = out.bytes_received;
                }
                let own = shard_range(m, world.rank(), n).len();
                let width = 5 * 7 + 5 + 1;
                let counted = bytes == dp.bytes_received_per_step()
                    && match dp.reduction() {
                        Reduction::Allgather => bytes == ((m - own) * width * 4) as u64,
                        // Large buckets: within 1.25x of a ring all-reduce.
                        _ if bucket_bytes > 1000 && n > 1 => {
                            bytes as f64 <= 1.25 * dp.ring_bytes_per_step() as f64
                        }
                        _ => n > 1 || bytes == 0,
                    };
                ensure(
                    world,
                    &format!(
                        "m {m}: {reduction:?} ({:?}, overlap {overlap}, {} buckets) = local, \
                         bytes counted",
                        dp.reduction(),
                        dp.buckets()
                    ),
                    same && counted,
                );
                if bucket_bytes > 1000 && reduction != Reduction::Auto {
                    line.push_str(&format!(" {:?} {bytes}", dp.reduction()));
                    if reduction == Reduction::Allgather {
                        line.push_str(&format!(" ring {}", dp.ring_bytes_per_step()));
                    }
                }
            }
        }
        if world.is_root() {
            println!("{line}");
        }
    }
    // Ranks that disagree on the reduction: an error on every rank, no hang.
    if n > 1 {
        let reduction = if world.rank() == n - 1 {
            Reduction::Allgather
        } else {
            Reduction::Tree
        };
        let opts = DataParallelOptions {
            microbatches: 8,
            reduction,
            ..Default::default()
        };
        let e = DataParallel::new(world, params(&ctx, 5), opts).map(|_| ());
        ensure(
            world,
            "ranks disagreeing on the reduction: ShapeMismatch on every rank",
            matches!(&e, Err(DistError::ShapeMismatch(msg)) if msg.contains("reduction")),
        );
    }
    ensure(world, "reductions done", true);
}

fn mismatch(world: &World) -> ExitCode {
    let ctx = ExecContext::with_threads(1);
    let cols = if world.rank() == 1 { 6 } else { 7 };
    let p = vec![
        Tensor::randn(&ctx, &[5, cols], 1.0, 1)
            .unwrap()
            .into_variable(),
    ];
    match DataParallel::new(world, p, DataParallelOptions::default()) {
        Ok(_) => {
            println!("rank {}: no error", world.rank());
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("rank {}: error: {e}", world.rank());
            // Every rank got the error: leave together, so that mpirun does not
            // kill a rank for another's non-zero exit before it printed.
            world.barrier();
            ExitCode::from(3)
        }
    }
}

fn fail(world: &World) {
    let ctx = ExecContext::with_threads(1);
    let mut dp = DataParallel::new(world, params(&ctx, 5), DataParallelOptions::default()).unwrap();
    let rank = world.rank();
    let _ = dp.step(&ctx, |ctx, p, mb| {
        if rank == 1 {
            // A bad label: cross-entropy's index check fails on this rank only.
            let labels = ctx.from_slice_typed::<i64>(&[1], &[99])?;
            let logits = Tensor::zeros(ctx, &[1, 10])?;
            return logits.cross_entropy(ctx, &labels)?.item();
        }
        microbatch(ctx, p, mb)
    });
    println!("rank {rank}: step returned");
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let world = World::init().expect("MPI initializes once");
    match mode.as_str() {
        "api" => api(&world),
        "mismatch" => return mismatch(&world),
        "fail" => fail(&world),
        "reductions" => reductions(&world),
        other => {
            eprintln!("dist_checks: unknown mode `{other}` (api, mismatch, fail, reductions)");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
