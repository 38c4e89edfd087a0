//! Elementwise, row-wise and a small MLP forward: fucina against plain loops and
//! candle-core, every baseline in the same run.
//!
//! `cargo bench -p fucina-benches --bench ops -- --warm-up-time 1 --measurement-time 3`
//!
//! - `add/1M/<id>`: `a + b` of two `[1 << 20]` tensors: `fucina_t1`, `fucina_t2`
//!   (`ExecContext::add` with a 1- and 2-thread context), `loop_t1` (a plain
//!   single-thread `for` loop into a preallocated `Vec`), `candle`.
//! - `rowwise/<op>/<id>` on `[512, 1024]`: `softmax` (last axis) and `layer_norm`
//!   (last axis, gamma and beta) with `fucina_t1`/`fucina_t2`, against `copy`: a
//!   `copy_from_slice` of the same 2 MiB (the memory-traffic floor of an op that
//!   reads and writes each element once).
//! - `mlp/batch64/<id>`: a 3-layer MLP forward, `784-256-256-10` with ReLU after
//!   the first two layers, batch 64: fucina (`linear` + `relu`, t1 and t2)
//!   against candle-core (`matmul` by the transposed weight, `broadcast_add`,
//!   `relu`).
//!
//! Throughput is in elements (output elements, or flops of the three products for
//! the MLP).

use std::hint::black_box;

use candle_core::{Device, Tensor};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fucina_exec::ExecContext;

use fucina_benches::rand_vec;

fn add(c: &mut Criterion) {
    let n = 1usize << 20;
    let (av, bv) = (rand_vec(1, n), rand_vec(2, n));
    let mut g = c.benchmark_group("add/1M");
    g.throughput(Throughput::Elements(n as u64));
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let a = ctx.from_slice(&[n], &av).unwrap();
        let b = ctx.from_slice(&[n], &bv).unwrap();
        g.bench_function(format!("fucina_t{threads}"), |bch| {
            bch.iter(|| black_box(ctx.add(black_box(&a), black_box(&b)).unwrap()));
        });
        drop((a, b));
    }
    let mut out = vec![0.0f32; n];
    g.bench_function("loop_t1", |bch| {
        bch.iter(|| {
            for ((o, &x), &y) in out.iter_mut().zip(black_box(&av)).zip(black_box(&bv)) {
                *o = x + y;
            }
            black_box(&mut out);
        });
    });
    let ca = Tensor::from_vec(av.clone(), n, &Device::Cpu).unwrap();
    let cb = Tensor::from_vec(bv.clone(), n, &Device::Cpu).unwrap();
    g.bench_function("candle", |bch| {
        bch.iter(|| black_box((black_box(&ca) + black_box(&cb)).unwrap()));
    });
    g.finish();
}

fn rowwise(c: &mut Criterion) {
    let (rows, cols) = (512usize, 1024usize);
    let xv = rand_vec(3, rows * cols);
    let mut g = c.benchmark_group("rowwise");
    g.throughput(Throughput::Elements((rows * cols) as u64));
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let x = ctx.from_slice(&[rows, cols], &xv).unwrap();
        let gamma = ctx.from_slice(&[cols], &rand_vec(4, cols)).unwrap();
        let beta = ctx.from_slice(&[cols], &rand_vec(5, cols)).unwrap();
        g.bench_function(
            BenchmarkId::new("softmax", format!("fucina_t{threads}")),
            |bch| bch.iter(|| black_box(ctx.softmax(black_box(&x), 1).unwrap())),
        );
        g.bench_function(
            BenchmarkId::new("layer_norm", format!("fucina_t{threads}")),
            |bch| {
                bch.iter(|| black_box(ctx.layer_norm(black_box(&x), &gamma, &beta, 1e-5).unwrap()));
            },
        );
        drop((x, gamma, beta));
    }
    let mut out = vec![0.0f32; rows * cols];
    g.bench_function(BenchmarkId::new("copy", "t1"), |bch| {
        bch.iter(|| {
            out.copy_from_slice(black_box(&xv));
            black_box(&mut out);
        });
    });
    g.finish();
}

/// Layer sizes of the MLP.
const DIMS: [usize; 4] = [784, 256, 256, 10];

fn mlp(c: &mut Criterion) {
    let batch = 64usize;
    let xv = rand_vec(6, batch * DIMS[0]);
    let params: Vec<(Vec<f32>, Vec<f32>)> = (0..3)
        .map(|l| {
            (
                rand_vec(10 + l as u64, DIMS[l + 1] * DIMS[l]),
                rand_vec(20 + l as u64, DIMS[l + 1]),
            )
        })
        .collect();
    let flops: usize = (0..3).map(|l| 2 * batch * DIMS[l] * DIMS[l + 1]).sum();
    let mut g = c.benchmark_group("mlp/batch64");
    g.throughput(Throughput::Elements(flops as u64));
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let x = ctx.from_slice(&[batch, DIMS[0]], &xv).unwrap();
        let layers: Vec<_> = params
            .iter()
            .enumerate()
            .map(|(l, (w, b))| {
                (
                    ctx.from_slice(&[DIMS[l + 1], DIMS[l]], w).unwrap(),
                    ctx.from_slice(&[DIMS[l + 1]], b).unwrap(),
                )
            })
            .collect();
        g.bench_function(format!("fucina_t{threads}"), |bch| {
            bch.iter(|| {
                let mut h = ctx
                    .linear(black_box(&x), &layers[0].0, Some(&layers[0].1))
                    .unwrap();
                h = ctx.relu(&h).unwrap();
                h = ctx.linear(&h, &layers[1].0, Some(&layers[1].1)).unwrap();
                h = ctx.relu(&h).unwrap();
                black_box(ctx.linear(&h, &layers[2].0, Some(&layers[2].1)).unwrap())
            });
        });
        drop((x, layers));
    }
    let dev = Device::Cpu;
    let x = Tensor::from_vec(xv.clone(), (batch, DIMS[0]), &dev).unwrap();
    let layers: Vec<(Tensor, Tensor)> = params
        .iter()
        .enumerate()
        .map(|(l, (w, b))| {
            (
                Tensor::from_vec(w.clone(), (DIMS[l + 1], DIMS[l]), &dev).unwrap(),
                Tensor::from_vec(b.clone(), DIMS[l + 1], &dev).unwrap(),
            )
        })
        .collect();
    let lin = |h: &Tensor, (w, b): &(Tensor, Tensor)| -> Tensor {
        h.matmul(&w.t().unwrap()).unwrap().broadcast_add(b).unwrap()
    };
    g.bench_function("candle", |bch| {
        bch.iter(|| {
            let h = lin(black_box(&x), &layers[0]).relu().unwrap();
            let h = lin(&h, &layers[1]).relu().unwrap();
            black_box(lin(&h, &layers[2]))
        });
    });
    g.finish();
}

criterion_group!(benches, add, rowwise, mlp);
criterion_main!(benches);
