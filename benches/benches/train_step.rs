//! One training step of a 784-256-10 MLP (batch 64, ReLU, cross-entropy,
//! backward, plain SGD), and of the `train_digits` example's 64-128-10 MLP (batch
//! 32; the example uses AdamW, both libraries use plain SGD here), in fucina (1
//! and 2 threads) and in candle (CPU), same run, same shapes and the same initial values (candle's parameters are copied
//! from fucina's `kaiming_uniform` ones; the first losses are checked equal).
//!
//! `cargo bench -p fucina-benches --bench train_step -- --warm-up-time 1 --measurement-time 3`
//!
//! candle runs its matrix products on its own thread pool (all cores unless
//! `RAYON_NUM_THREADS` says otherwise); fucina's thread count is the context's.
//!
//! With `TRAIN_STEP_CPU_TIME=<steps>` set, it first prints the process CPU time
//! per step of each variant (all threads, from `/proc/self/task/*/schedstat`),
//! a figure that time-slicing by other processes inflates much less than wall
//! time; `benches/jax/train_step.py --cpu-time` prints the same for JAX.

use std::hint::black_box;

use candle_core::{DType, Device, Var};
use candle_nn::{Linear, Module, Optimizer, SGD};
use criterion::{Criterion, criterion_group, criterion_main};
use fucina::autograd::Tensor;
use fucina::exec::{ExecContext, RawTensor};

const LR: f32 = 0.01;

/// The MLP: `batch` rows of `inp` features, one hidden layer, `out` classes.
#[derive(Clone, Copy)]
struct Mlp {
    batch: usize,
    inp: usize,
    hidden: usize,
    out: usize,
}

/// The step of the autograd issue's benchmark.
const MNIST_SHAPED: Mlp = Mlp {
    batch: 64,
    inp: 784,
    hidden: 256,
    out: 10,
};
/// The model and batch of the `train_digits` example (8x8 digits, 64-128-10,
/// batch 32), trained here with plain SGD in both libraries.
const DIGITS: Mlp = Mlp {
    batch: 32,
    inp: 64,
    hidden: 128,
    out: 10,
};

fn labels(s: Mlp) -> Vec<i64> {
    (0..s.batch as i64)
        .map(|i| (i * 7) % s.out as i64)
        .collect()
}

/// `nn.Linear`-style parameters: weights `[out, in]` U(-1/sqrt(in), 1/sqrt(in)),
/// zero biases.
fn fucina_params(ctx: &ExecContext, s: Mlp) -> [Tensor; 4] {
    [
        Tensor::kaiming_uniform(ctx, &[s.hidden, s.inp], 2).unwrap(),
        Tensor::zeros(ctx, &[s.hidden]).unwrap(),
        Tensor::kaiming_uniform(ctx, &[s.out, s.hidden], 3).unwrap(),
        Tensor::zeros(ctx, &[s.out]).unwrap(),
    ]
    .map(Tensor::into_variable)
}

/// The fucina step: forward under an exec scope, backward, SGD, zero_grad.
fn fucina_step(ctx: &ExecContext, p: &mut [Tensor; 4], x: &Tensor, l: &RawTensor<i64>) -> f32 {
    let scope = ctx.open_exec_scope();
    let h = x
        .linear(ctx, &p[0], Some(&p[1]))
        .unwrap()
        .relu(ctx)
        .unwrap();
    let logits = h.linear(ctx, &p[2], Some(&p[3])).unwrap();
    let loss = logits.cross_entropy(ctx, l).unwrap();
    loss.backward(ctx).unwrap();
    let v = loss.item().unwrap();
    drop((h, logits, loss));
    ctx.close_exec_scope(scope);
    for t in p.iter_mut() {
        t.sgd_step_(LR).unwrap();
        t.zero_grad();
    }
    v
}

struct CandleMlp {
    vars: [Var; 4],
    sgd: SGD,
    x: candle_core::Tensor,
    labels: candle_core::Tensor,
}

impl CandleMlp {
    fn new(ctx: &ExecContext, x: &Tensor, s: Mlp) -> CandleMlp {
        let dev = Device::Cpu;
        let p = fucina_params(ctx, s);
        let var = |t: &Tensor| {
            let v = candle_core::Tensor::from_vec(t.to_vec(), t.shape(), &dev).unwrap();
            Var::from_tensor(&v).unwrap()
        };
        let vars = [var(&p[0]), var(&p[1]), var(&p[2]), var(&p[3])];
        let l: Vec<u32> = labels(s).iter().map(|&v| v as u32).collect();
        CandleMlp {
            sgd: SGD::new(vars.to_vec(), f64::from(LR)).unwrap(),
            vars,
            x: candle_core::Tensor::from_vec(x.to_vec(), &[s.batch, s.inp], &dev).unwrap(),
            labels: candle_core::Tensor::from_vec(l, &[s.batch], &dev).unwrap(),
        }
    }

    /// The same step: two `candle_nn::Linear`s, ReLU, `candle_nn::loss::cross_entropy`,
    /// `SGD::backward_step` (backward plus the update).
    fn step(&mut self) -> f32 {
        let l1 = Linear::new(
            self.vars[0].as_tensor().clone(),
            Some(self.vars[1].as_tensor().clone()),
        );
        let l2 = Linear::new(
            self.vars[2].as_tensor().clone(),
            Some(self.vars[3].as_tensor().clone()),
        );
        let h = l1.forward(&self.x).unwrap().relu().unwrap();
        let logits = l2.forward(&h).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &self.labels).unwrap();
        self.sgd.backward_step(&loss).unwrap();
        loss.to_dtype(DType::F32)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }
}

/// CPU time of this process so far (all threads, nanoseconds; `None` where
/// `/proc` is unavailable).
fn process_cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Prints the mean process CPU time per call of `f` over `steps` calls.
fn cpu_time(name: &str, steps: usize, mut f: impl FnMut() -> f32) {
    for _ in 0..steps / 10 + 1 {
        black_box(f());
    }
    let (Some(t0), w0) = (process_cpu_ns(), std::time::Instant::now()) else {
        return;
    };
    for _ in 0..steps {
        black_box(f());
    }
    let wall = w0.elapsed().as_secs_f64() * 1e6 / steps as f64;
    let cpu = (process_cpu_ns().unwrap_or(t0) - t0) as f64 / 1e3 / steps as f64;
    println!("cpu time per step, {name}: {cpu:.1} us (wall {wall:.1} us; {steps} steps)");
}

fn cpu_times(steps: usize, s: Mlp) {
    let ctx = ExecContext::with_threads(1);
    let x = Tensor::randn(&ctx, &[s.batch, s.inp], 1.0, 1).unwrap();
    let mut m = CandleMlp::new(&ctx, &x, s);
    cpu_time("candle", steps, || m.step());
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let x = Tensor::randn(&ctx, &[s.batch, s.inp], 1.0, 1).unwrap();
        let l = ctx.from_slice_typed::<i64>(&[s.batch], &labels(s)).unwrap();
        let mut p = fucina_params(&ctx, s);
        cpu_time(&format!("fucina {threads} thread(s)"), steps, || {
            fucina_step(&ctx, &mut p, &x, &l)
        });
    }
}

/// One criterion group: candle, then fucina on 1 and 2 threads, same model,
/// same initial values (the first losses are checked equal).
fn group(c: &mut Criterion, name: &str, s: Mlp) {
    if let Some(steps) = std::env::var("TRAIN_STEP_CPU_TIME")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        println!("{name}:");
        cpu_times(steps, s);
    }
    let mut g = c.benchmark_group(name);
    g.throughput(criterion::Throughput::Elements(s.batch as u64));
    let first_loss;
    {
        let ctx = ExecContext::with_threads(1);
        let x = Tensor::randn(&ctx, &[s.batch, s.inp], 1.0, 1).unwrap();
        let mut m = CandleMlp::new(&ctx, &x, s);
        let l = ctx.from_slice_typed::<i64>(&[s.batch], &labels(s)).unwrap();
        let mut p = fucina_params(&ctx, s);
        first_loss = fucina_step(&ctx, &mut p, &x, &l);
        let candle_first = m.step();
        assert!(
            (first_loss - candle_first).abs() < 1e-4 * first_loss.abs().max(1.0),
            "same model, same first loss: fucina {first_loss}, candle {candle_first}"
        );
        g.bench_function("candle", |b| b.iter(|| black_box(m.step())));
        drop(p);
    }
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let x = Tensor::randn(&ctx, &[s.batch, s.inp], 1.0, 1).unwrap();
        let l = ctx.from_slice_typed::<i64>(&[s.batch], &labels(s)).unwrap();
        let mut p = fucina_params(&ctx, s);
        assert_eq!(fucina_step(&ctx, &mut p, &x, &l), first_loss);
        g.bench_function(format!("fucina_{threads}_threads"), |b| {
            b.iter(|| black_box(fucina_step(&ctx, &mut p, &x, &l)))
        });
    }
    g.finish();
}

fn train_step(c: &mut Criterion) {
    group(c, "train_step_mlp_784_256_10_b64", MNIST_SHAPED);
    group(c, "train_step_digits_mlp_64_128_10_b32", DIGITS);
}

criterion_group!(benches, train_step);
criterion_main!(benches);
