//! Times one mixture-of-experts decode layer's expert products at the
//! `qwen3-moe-1.3b-a0.2b-shape` bench shape (64 bf16 experts of 384 × 1024,
//! 8 chosen per token, one activation row): each chosen expert's gate, up
//! and down product as its own `weight_matmul` call (24 fork-joins) against
//! two `grouped_matmul` calls (gate + up, then down), alternated step by step
//! so that both see the same machine load; prints the median and minimum step
//! time of each and the bytes read per step over the time (a quick probe,
//! not a benchmark).
//!
//! `cargo run --release -p fucina-exec --example moe_probe -- THREADS [STEPS]`

use std::time::Instant;

use fucina_exec::{ExecContext, GroupedProduct, GroupedWeight, WeightFormat, WeightMatrix};

mod common;
use common::bf16_bytes;

const EXPERTS: usize = 64;
const TOP_K: usize = 8;
const HIDDEN: usize = 1024;
const INTER: usize = 384;

struct Expert {
    gate: Vec<u8>,
    up: Vec<u8>,
    down: Vec<u8>,
}

fn matrix(bytes: &[u8], rows: usize, cols: usize) -> WeightMatrix<'_> {
    WeightMatrix::new(WeightFormat::BF16, rows, cols, bytes).expect("a bf16 matrix")
}

/// The chosen experts' products one call each.
fn per_expert(ctx: &ExecContext, experts: &[Expert], chosen: &[usize], x: &[f32], out: &mut Bufs) {
    for (i, &e) in chosen.iter().enumerate() {
        let ex = &experts[e];
        let g = &mut out.gate[i * INTER..(i + 1) * INTER];
        ctx.weight_matmul(x, 1, &matrix(&ex.gate, INTER, HIDDEN), g)
            .unwrap();
        let u = &mut out.up[i * INTER..(i + 1) * INTER];
        ctx.weight_matmul(x, 1, &matrix(&ex.up, INTER, HIDDEN), u)
            .unwrap();
    }
    for (i, &e) in chosen.iter().enumerate() {
        let ex = &experts[e];
        let y = &mut out.y[i * HIDDEN..(i + 1) * HIDDEN];
        let g = &out.gate[i * INTER..(i + 1) * INTER];
        ctx.weight_matmul(g, 1, &matrix(&ex.down, HIDDEN, INTER), y)
            .unwrap();
    }
}

/// The chosen experts' products in two grouped calls.
fn grouped(ctx: &ExecContext, experts: &[Expert], chosen: &[usize], x: &[f32], out: &mut Bufs) {
    let mut p = Vec::with_capacity(2 * TOP_K);
    for ((&e, g), u) in chosen
        .iter()
        .zip(out.gate.chunks_exact_mut(INTER))
        .zip(out.up.chunks_exact_mut(INTER))
    {
        let ex = &experts[e];
        let w = |b| GroupedWeight::Float(matrix(b, INTER, HIDDEN));
        p.push(GroupedProduct {
            weight: w(&ex.gate),
            x,
            m: 1,
            out: g,
        });
        p.push(GroupedProduct {
            weight: w(&ex.up),
            x,
            m: 1,
            out: u,
        });
    }
    ctx.grouped_matmul(&mut p).unwrap();
    drop(p);
    let mut p = Vec::with_capacity(TOP_K);
    for ((&e, g), y) in chosen
        .iter()
        .zip(out.gate.chunks_exact(INTER))
        .zip(out.y.chunks_exact_mut(HIDDEN))
    {
        let w = GroupedWeight::Float(matrix(&experts[e].down, HIDDEN, INTER));
        p.push(GroupedProduct {
            weight: w,
            x: g,
            m: 1,
            out: y,
        });
    }
    ctx.grouped_matmul(&mut p).unwrap();
}

struct Bufs {
    gate: Vec<f32>,
    up: Vec<f32>,
    y: Vec<f32>,
}

fn stats(mut t: Vec<f64>) -> (f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[0])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let steps: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(300);
    let ctx = ExecContext::with_threads(threads);
    let experts: Vec<Expert> = (0..EXPERTS as u64)
        .map(|e| Expert {
            gate: bf16_bytes(INTER * HIDDEN, 3 * e + 1),
            up: bf16_bytes(INTER * HIDDEN, 3 * e + 2),
            down: bf16_bytes(HIDDEN * INTER, 3 * e + 3),
        })
        .collect();
    let x: Vec<f32> = (0..HIDDEN)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut a = Bufs {
        gate: vec![0.0; TOP_K * INTER],
        up: vec![0.0; TOP_K * INTER],
        y: vec![0.0; TOP_K * HIDDEN],
    };
    let mut b = Bufs {
        gate: vec![0.0; TOP_K * INTER],
        up: vec![0.0; TOP_K * INTER],
        y: vec![0.0; TOP_K * HIDDEN],
    };
    // Once on the same experts: the same bits.
    let all: Vec<usize> = (0..TOP_K).collect();
    per_expert(&ctx, &experts, &all, &x, &mut a);
    grouped(&ctx, &experts, &all, &x, &mut b);
    assert!(
        a.y.iter()
            .zip(&b.y)
            .all(|(p, q)| p.to_bits() == q.to_bits()),
        "the grouped calls must give the per-expert bits"
    );
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    let mut s = 0x1234_5678u64;
    let mut draw = || {
        // 8 distinct experts, increasing, a different set every call (so
        // that neither path finds the other's weights in the cache).
        let mut chosen = Vec::with_capacity(TOP_K);
        while chosen.len() < TOP_K {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let e = (s % EXPERTS as u64) as usize;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        chosen.sort_unstable();
        chosen
    };
    for step in 0..steps + 10 {
        let (ca, cb) = (draw(), draw());
        let mut time_a = || {
            let t = Instant::now();
            per_expert(&ctx, &experts, &ca, &x, &mut a);
            t.elapsed().as_secs_f64()
        };
        let mut time_b = || {
            let t = Instant::now();
            grouped(&ctx, &experts, &cb, &x, &mut b);
            t.elapsed().as_secs_f64()
        };
        // Alternate which runs first.
        let (da, db) = match step % 2 {
            0 => {
                let da = time_a();
                (da, time_b())
            }
            _ => {
                let db = time_b();
                (time_a(), db)
            }
        };
        if step >= 10 {
            ta.push(da);
            tb.push(db);
        }
    }
    let bytes = (TOP_K * 3 * INTER * HIDDEN * 2) as f64;
    let (ma, na) = stats(ta);
    let (mb, nb) = stats(tb);
    println!(
        "threads {threads}, {steps} steps, {:.1} MB of weights per step",
        bytes / 1e6
    );
    for (what, m, n) in [("per-expert calls", ma, na), ("grouped calls", mb, nb)] {
        println!(
            "{what:>16}: median {:.1} us ({:.1} GB/s), min {:.1} us ({:.1} GB/s)",
            m * 1e6,
            bytes / m / 1e9,
            n * 1e6,
            bytes / n / 1e9
        );
    }
}
