//! `fucina::diag`: `CountingAllocator` installed as this binary's global
//! allocator pins a warm training step at zero heap allocations on the
//! calling thread, and `memory_stats` deltas show the steady state (and show a
//! step that is not one).

use fucina::diag::{AllocCounts, CountingAllocator, MemoryStatsExt};
use fucina::nn::{Linear, Module};
use fucina::optim::{AdamW, AdamWConfig};
use fucina::{ExecContext, Tensor, memory_stats};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator::new();

struct Job {
    ctx: ExecContext,
    fc1: Linear,
    fc2: Linear,
    opt: AdamW,
    x: Tensor,
    labels: fucina::RawTensor<i64>,
}

fn job() -> Job {
    let ctx = ExecContext::with_threads(1);
    let fc1 = Linear::new(&ctx, 16, 32, 1).unwrap();
    let fc2 = Linear::new(&ctx, 32, 4, 2).unwrap();
    let mut params = fc1.parameters();
    params.extend(fc2.parameters());
    let opt = AdamW::new(params, AdamWConfig::default()).unwrap();
    let x = Tensor::from_slice(&ctx, &[8, 16], &[0.25; 128]).unwrap();
    let labels = ctx
        .from_slice_typed::<i64>(&[8], &[0, 1, 2, 3, 0, 1, 2, 3])
        .unwrap();
    Job {
        ctx,
        fc1,
        fc2,
        opt,
        x,
        labels,
    }
}

fn step(j: &mut Job) -> fucina::Result<f32> {
    let ctx = &j.ctx;
    let scope = ctx.open_exec_scope();
    let h = j.fc1.forward(ctx, &j.x)?.relu(ctx)?;
    let loss = j.fc2.forward(ctx, &h)?.cross_entropy(ctx, &j.labels)?;
    loss.backward(ctx)?;
    let value = loss.item()?;
    drop((h, loss));
    ctx.close_exec_scope(scope);
    j.opt.step(ctx)?;
    j.opt.zero_grad();
    Ok(value)
}

#[test]
fn a_warm_step_allocates_nothing_and_its_memory_delta_is_steady() {
    let mut j = job();
    for _ in 0..3 {
        step(&mut j).unwrap();
    }
    for _ in 0..5 {
        let before = memory_stats(&j.ctx);
        let (loss, allocations) = CountingAllocator::count_thread(|| step(&mut j));
        loss.unwrap();
        assert_eq!(allocations, 0, "a warm step allocated on the heap");
        let delta = j.ctx.memory_stats() - before;
        assert!(delta.is_steady(), "{delta}");
        assert_eq!(delta.shared.misses, 0);
        // The step did go through the pool.
        assert!(delta.local.hits + delta.shared.hits > 0, "{delta}");
    }
    // The process-wide counts include the warm-up.
    let counts = ALLOC.counts();
    assert!(counts.allocations > 0 && counts.bytes_allocated > 0);
    // `after - before` is the interval: one 4 KiB vector between two snapshots
    // shows as at least one allocation of at least 4 KiB (other threads of the
    // test process may add to it, never take from it).
    let before = ALLOC.counts();
    let v = std::hint::black_box(vec![1u8; 4096]);
    let d = ALLOC.counts() - before;
    drop(v);
    assert!(d.allocations >= 1 && d.bytes_allocated >= 4096, "{d:?}");
    assert_ne!(d, AllocCounts::default());
}

#[test]
fn the_counters_see_allocations_and_deltas_see_a_growing_working_set() {
    let (v, n) = CountingAllocator::count_thread(|| vec![1u8; 1000]);
    assert_eq!(n, 1);
    drop(v);
    let before = ALLOC.counts();
    let v: Vec<u64> = Vec::with_capacity(100);
    let d = ALLOC.counts() - before;
    assert!(d.allocations >= 1 && d.bytes_allocated >= 800, "{d:?}");
    drop(v);

    // A step that keeps a new tensor alive is not steady, and the delta says why.
    let ctx = ExecContext::with_threads(1);
    let before = memory_stats(&ctx);
    let kept = Tensor::zeros(&ctx, &[1024]).unwrap();
    let delta = memory_stats(&ctx) - before;
    assert!(!delta.is_steady());
    assert_eq!(delta.outstanding_buffers, 1, "{delta}");
    assert_eq!(delta.shared.misses, 1, "{delta}");
    drop(kept);
    let after = memory_stats(&ctx) - before;
    assert_eq!(after.outstanding_buffers, 0, "{after}");
    assert!(after.local_cached_bytes > 0, "{after}");
    assert!(!after.to_string().is_empty());
}
