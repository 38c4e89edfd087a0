//! The training step with and without the bf16 autocast scope, alternated in
//! one process: the `train_fashion` CNN (batch 64, AdamW) and a 784-256-10
//! MLP (batch 64, SGD). Each round runs `block` plain steps then `block`
//! steps inside `autocast_bf16`; the first round is a warm-up. Prints the
//! medians and quartiles of each.
//!
//! `cargo run --release -p fucina --example autocast_step -- [threads] [rounds] [block]`
//! (defaults 1, 12 and 5).

use std::time::Instant;

use fucina::nn::{Forward, Linear, Module};
use fucina::optim::Sgd;
use fucina::{ExecContext, Tensor, autocast_bf16};

#[allow(dead_code)]
#[path = "train_fashion/job.rs"]
mod job;

const BATCH: usize = 64;

fn arg(value: Option<String>, name: &str, default: usize) -> usize {
    let Some(v) = value else { return default };
    match v.parse() {
        Ok(n) if n >= 1 => n,
        _ => {
            eprintln!(
                "error: {name} must be a whole number of at least 1 (got {v:?})\n\
                 usage: autocast_step [threads] [rounds] [block]"
            );
            std::process::exit(2);
        }
    }
}

/// Runs `step(bf16)` for `rounds` rounds of `block` plain and `block` bf16
/// steps; returns the step times (ms) of each, the warm-up round left out.
fn alternate(rounds: usize, block: usize, mut step: impl FnMut(bool)) -> [Vec<f64>; 2] {
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (k, bf16) in [false, true].into_iter().enumerate() {
            for _ in 0..block {
                let t = Instant::now();
                step(bf16);
                if round > 0 {
                    times[k].push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
    }
    times
}

fn report(what: &str, threads: usize, times: [Vec<f64>; 2]) {
    let stats = |mut t: Vec<f64>| {
        t.sort_by(f64::total_cmp);
        let q = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize];
        (q(0.5), q(0.25), q(0.75))
    };
    let [plain, bf16] = times.map(stats);
    println!(
        "{what}, {threads} thread(s): f32 median {:.3} ms [{:.3}-{:.3}], autocast_bf16 median {:.3} ms [{:.3}-{:.3}], ratio {:.3}",
        plain.0,
        plain.1,
        plain.2,
        bf16.0,
        bf16.1,
        bf16.2,
        bf16.0 / plain.0
    );
}

fn cnn(ctx: &ExecContext, rounds: usize, block: usize) -> [Vec<f64>; 2] {
    let x = Tensor::uniform(ctx, &[BATCH, 1, 28, 28], -1.0, 2.0, 7).unwrap();
    let labels: Vec<i64> = (0..BATCH as i64).map(|i| i * 7 % 10).collect();
    let y = ctx.from_slice_typed::<i64>(&[BATCH], &labels).unwrap();
    let (net, mut opt) =
        job::model_and_optimizer(ctx, &job::TrainConfig::default(), 28, 28).unwrap();
    alternate(rounds, block, |bf16| {
        let _g = bf16.then(autocast_bf16);
        ctx.exec_scope(|ctx| {
            let loss = net
                .forward(ctx, &x)
                .unwrap()
                .cross_entropy(ctx, &y)
                .unwrap();
            loss.backward(ctx).unwrap();
        });
        opt.step(ctx).unwrap();
        opt.zero_grad();
    })
}

fn mlp(ctx: &ExecContext, rounds: usize, block: usize) -> [Vec<f64>; 2] {
    let x = Tensor::uniform(ctx, &[BATCH, 784], 0.0, 1.0, 1).unwrap();
    let labels: Vec<i64> = (0..BATCH as i64).map(|i| i % 10).collect();
    let y = ctx.from_slice_typed::<i64>(&[BATCH], &labels).unwrap();
    let net = [
        Linear::new(ctx, 784, 256, 1).unwrap(),
        Linear::new(ctx, 256, 10, 2).unwrap(),
    ];
    let params: Vec<_> = net.iter().flat_map(Module::parameters).collect();
    let mut sgd = Sgd::new(params, 0.01).unwrap();
    alternate(rounds, block, |bf16| {
        let _g = bf16.then(autocast_bf16);
        ctx.exec_scope(|ctx| {
            let h = net[0].forward(ctx, &x).unwrap().relu(ctx).unwrap();
            let loss = net[1]
                .forward(ctx, &h)
                .unwrap()
                .cross_entropy(ctx, &y)
                .unwrap();
            loss.backward(ctx).unwrap();
        });
        sgd.step(ctx).unwrap();
        sgd.zero_grad();
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let threads = arg(args.next(), "threads", 1).min(fucina::exec::MAX_THREADS);
    let rounds = arg(args.next(), "rounds", 12) + 1;
    let block = arg(args.next(), "block", 5);
    let ctx = ExecContext::with_threads(threads);
    report(
        "MLP 784-256-10, batch 64, SGD",
        threads,
        mlp(&ctx, rounds * 4, block),
    );
    report(
        "train_fashion CNN, batch 64, AdamW",
        threads,
        cnn(&ctx, rounds, block),
    );
}
