//! Runs the `train_fashion` CNN's training step (batch 64) in a loop and prints
//! per-step times: a target for `perf record` and a quick A/B timer.
//!
//! `cargo run --release -p fucina --example fashion_step_loop -- [threads] [steps]`
//! (defaults 1 and 200: a timing harness, so one thread unless asked).

use std::time::Instant;

use fucina::nn::Forward;
use fucina::{ExecContext, Tensor};

#[allow(dead_code)]
#[path = "train_fashion/job.rs"]
mod job;

const BATCH: usize = 64;

/// The positional argument `name` (`default` when absent): a whole number from
/// 1 to `max`; exits with a message otherwise.
fn arg(value: Option<String>, name: &str, default: usize, max: usize) -> usize {
    let Some(v) = value else { return default };
    match v.parse() {
        Ok(n) if (1..=max).contains(&n) => n,
        _ => {
            let range = if max == usize::MAX {
                "at least 1".to_string()
            } else {
                format!("in 1..={max}")
            };
            eprintln!(
                "error: {name} must be a whole number {range} (got {v:?})\n\
                 usage: fashion_step_loop [threads] [steps]"
            );
            std::process::exit(2);
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let threads = arg(args.next(), "threads", 1, fucina::exec::MAX_THREADS);
    let steps = arg(args.next(), "steps", 200, usize::MAX);
    let ctx = ExecContext::with_threads(threads);
    let x = Tensor::uniform(&ctx, &[BATCH, 1, 28, 28], -1.0, 2.0, 7).unwrap();
    let labels: Vec<i64> = (0..BATCH as i64).map(|i| i * 7 % 10).collect();
    let y = ctx.from_slice_typed::<i64>(&[BATCH], &labels).unwrap();
    // The example's own model and optimizer, at its default configuration.
    let (net, mut opt) =
        job::model_and_optimizer(&ctx, &job::TrainConfig::default(), 28, 28).unwrap();
    let mut times = Vec::with_capacity(steps);
    let mut last = 0.0;
    for _ in 0..steps {
        let t = Instant::now();
        last = ctx.exec_scope(|ctx| {
            let loss = net
                .forward(ctx, &x)
                .unwrap()
                .cross_entropy(ctx, &y)
                .unwrap();
            loss.backward(ctx).unwrap();
            loss.item().unwrap()
        });
        opt.step(&ctx).unwrap();
        opt.zero_grad();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let warm = times.len() / 10;
    let mut t = times[warm..].to_vec();
    t.sort_by(f64::total_cmp);
    let q = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize];
    println!(
        "threads {threads} steps {steps}: median {:.2} ms (q1 {:.2}, q3 {:.2}, min {:.2}) last loss {last}",
        q(0.5),
        q(0.25),
        q(0.75),
        t[0]
    );
}
