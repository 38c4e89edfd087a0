//! After one warm-up pass, a no-grad forward of a fixed-shape 3-layer MLP performs
//! zero heap allocations and zero pool misses, whichever participant of the team
//! ran which chunk during the warm-up, and `topk`/`argsort` allocate nothing
//! (their per-chunk key buffers are pooled scratch). The counting global
//! allocator sees every thread of the process but the test harness's first one,
//! so each test runs alone in a process of its own (`counting::in_own_process`).

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use fucina_exec::{ExecContext, ExecError, RawTensor};
use fucina_thread::Team;

#[path = "../../fucina-thread/tests/support/counting.rs"]
mod counting;
use counting::{ALLOCATIONS, Counting, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

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
    in_own_process("a_steady_state_forward_allocates_nothing", || {
        check(1);
        check(2);
    });
}

/// Runs `f` while `team` is held by a dispatch from another thread whose tasks
/// wait: every dispatch `f` makes on the team finds it busy and runs all of its
/// chunks on the calling thread. The helper thread is started (and allocates)
/// before `f` runs and is released after it returns.
fn with_team_busy<R>(team: &Team, f: impl FnOnce() -> R) -> R {
    let (entered, release) = (AtomicUsize::new(0), AtomicBool::new(false));
    std::thread::scope(|s| {
        s.spawn(|| {
            team.parallel_chunks(&[0usize, 1], |_| {
                entered.fetch_add(1, Ordering::AcqRel);
                while !release.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        });
        while entered.load(Ordering::Acquire) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        let r = f();
        release.store(true, Ordering::Release);
        r
    })
}

/// Two warm-up forwards on a 2-thread context with the team busy (`busy_first`:
/// every chunk on the caller) or free (the worker runs its chunks), then ten
/// forwards with the other schedule: no heap allocation, no pool miss.
fn forced_schedules(busy_first: bool) {
    let ctx = ExecContext::with_threads(2);
    let team = ctx.team().expect("a team");
    let m = params(&ctx);
    let x = ctx.full(&[64, 784], 0.25).unwrap();
    // Heap allocations, local and shared-tier pool misses of one forward.
    let pass = |busy: bool| {
        let measured = || {
            let (local, shared) = (ctx.pool().stats(), ctx.pool().pool().stats());
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            drop(forward(&ctx, &m, &x).unwrap());
            let allocs = ALLOCATIONS.load(Ordering::SeqCst) - before;
            let local = ctx.pool().stats().misses - local.misses;
            (
                allocs,
                local,
                ctx.pool().pool().stats().misses - shared.misses,
            )
        };
        if busy {
            with_team_busy(team, measured)
        } else {
            measured()
        }
    };
    pass(busy_first);
    pass(busy_first);
    let mut total = (0, 0, 0);
    for _ in 0..10 {
        let (a, l, s) = pass(!busy_first);
        total = (total.0 + a, total.1 + l, total.2 + s);
    }
    assert!(team.is_started(), "the team ran the forwards");
    assert_eq!(
        total,
        (0, 0, 0),
        "(heap allocations, local misses, shared misses) in 10 forwards after a warm-up \
         with the team {}",
        if busy_first { "busy" } else { "free" }
    );
}

#[test]
fn steady_state_does_not_depend_on_the_warm_up_schedule() {
    in_own_process(
        "steady_state_does_not_depend_on_the_warm_up_schedule",
        || {
            forced_schedules(true);
            forced_schedules(false);
        },
    );
}

#[test]
fn topk_and_argsort_allocate_nothing_at_steady_state() {
    in_own_process("topk_and_argsort_allocate_nothing_at_steady_state", || {
        topk_and_argsort()
    });
}

fn topk_and_argsort() {
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
    in_own_process(
        "the_counter_sees_the_test_thread_and_other_threads",
        counting::check_the_counter,
    );
}
