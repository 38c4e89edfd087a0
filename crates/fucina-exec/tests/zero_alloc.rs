//! After one warm-up pass, a no-grad forward of a fixed-shape 3-layer MLP performs
//! zero heap allocations and zero pool misses, and `topk`/`argsort` allocate
//! nothing (their per-chunk key buffers are pooled scratch). Its own test binary:
//! the counting global allocator sees every thread of the process but the test
//! harness's first one (nextest runs each test in its own process).

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

use std::sync::atomic::Ordering;

use fucina_exec::{ExecContext, ExecError, RawTensor};

#[path = "../../fucina-thread/tests/support/counting.rs"]
mod counting;
use counting::{ALLOCATIONS, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The tests of this binary take turns: under plain `cargo test` they would run on
/// parallel threads of one process and count each other's allocations.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Mlp {
    w: [RawTensor; 3],
    b: [RawTensor; 3],
    gamma: RawTensor,
    beta: RawTensor,
}

fn forward(ctx: &ExecContext, m: &Mlp, x: &RawTensor) -> Result<RawTensor, ExecError> {
    let h = ctx.linear(x, &m.w[0], Some(&m.b[0]))?;
    let h = ctx.gelu(&h)?;
    let h = ctx.layer_norm(&h, &m.gamma, &m.beta, 1e-5)?;
    let h = ctx.linear(&h, &m.w[1], Some(&m.b[1]))?;
    let h = ctx.gelu(&h)?;
    let h = ctx.linear(&h, &m.w[2], Some(&m.b[2]))?;
    ctx.softmax(&h, 1)
}

fn params(ctx: &ExecContext) -> Mlp {
    let t = |shape: &[usize], s: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * s)
            .collect();
        ctx.from_slice(shape, &v).unwrap()
    };
    Mlp {
        w: [t(&[256, 784], 0.1), t(&[256, 256], 0.1), t(&[10, 256], 0.1)],
        b: [t(&[256], 0.01), t(&[256], 0.01), t(&[10], 0.01)],
        gamma: ctx.ones(&[256]).unwrap(),
        beta: ctx.zeros(&[256]).unwrap(),
    }
}

fn check(threads: usize) {
    let ctx = ExecContext::with_threads(threads);
    let m = params(&ctx);
    let x = ctx.full(&[64, 784], 0.25).unwrap();
    // warm-up: fills the pool, starts the team, sizes every cache
    let y0 = forward(&ctx, &m, &x).unwrap().to_vec();
    let y1 = forward(&ctx, &m, &x).unwrap();
    drop(y1);
    let misses = ctx.pool().stats().misses;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..5 {
        let y = forward(&ctx, &m, &x).unwrap();
        assert_eq!(y.shape(), [64, 10]);
        drop(y);
    }
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(
        after - before,
        0,
        "heap allocations in 5 steady-state forwards ({threads} threads)"
    );
    assert_eq!(
        ctx.pool().stats().misses,
        misses,
        "pool misses at steady state"
    );
    let y = forward(&ctx, &m, &x).unwrap();
    assert_eq!(y.to_vec(), y0);
}

#[test]
fn a_steady_state_forward_allocates_nothing() {
    let _turn = serial();
    check(1);
    check(2);
}

#[test]
fn topk_and_argsort_allocate_nothing_at_steady_state() {
    let _turn = serial();
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let n = 64 * 2048;
        let v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1009) as f32).collect();
        // Lines along the last axis and along the first (the transposed path),
        // enough work to be split into parallel chunks.
        let x = ctx.from_slice(&[64, 2048], &v).unwrap();
        let run = || {
            drop(ctx.topk(&x, 7, 1, true).unwrap());
            drop(ctx.argsort(&x, 1, false).unwrap());
            drop(ctx.topk(&x, 3, 0, false).unwrap());
        };
        run();
        run();
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..3 {
            run();
        }
        let after = ALLOCATIONS.load(Ordering::Relaxed);
        assert_eq!(after - before, 0, "heap allocations at {threads} thread(s)");
        drop(x);
        ctx.close().unwrap();
    }
}

/// The counter is not vacuous: it sees the test's thread and other threads.
#[test]
fn the_counter_sees_the_test_thread_and_other_threads() {
    let _turn = serial();
    counting::check_the_counter();
}
