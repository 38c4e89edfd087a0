//! Times `quant_matmul_packed` of the repacked blocks-of-32 formats (Q8_0,
//! Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) at prefill sizes on the TinyLlama-1.1B
//! shapes (2048 × 2048, 5632 × 2048, 2048 × 5632; `m` activation rows), and
//! prints the median and minimum milliseconds per call and the integer
//! multiply-adds per second of the median (a quick probe, not a benchmark).
//! The level is `FUCINA_SIMD`'s.
//!
//! `cargo run --release -p fucina-exec --example q32_probe -- THREADS [REPS] [M] [FORMAT,...]`

use std::time::Instant;

use fucina_exec::{ExecContext, QuantFormat};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// The process's CPU time (user + system, all threads) in seconds, from
/// `/proc/self/stat` (clock ticks of 10 ms; 0 where it cannot be read): on a
/// shared machine the work done, where the wall time also counts waiting.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // the fields after the command name (in parentheses)
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).map_or(2, |s| s.parse().expect("THREADS"));
    let reps: usize = args.get(2).map_or(5, |s| s.parse().expect("REPS"));
    let m: usize = args.get(3).map_or(512, |s| s.parse().expect("M"));
    let formats: Vec<QuantFormat> = args.get(4).map_or(
        vec![
            QuantFormat::Q8_0,
            QuantFormat::Q4_0,
            QuantFormat::Q5_0,
            QuantFormat::Q4_1,
            QuantFormat::IQ4_NL,
        ],
        |s| {
            s.split(',')
                .map(|f| match f {
                    "q8_0" => QuantFormat::Q8_0,
                    "q4_0" => QuantFormat::Q4_0,
                    "q4_1" => QuantFormat::Q4_1,
                    "q5_0" => QuantFormat::Q5_0,
                    "q5_1" => QuantFormat::Q5_1,
                    "iq4_nl" => QuantFormat::IQ4_NL,
                    _ => panic!("unknown format {f}"),
                })
                .collect()
        },
    );
    let ctx = ExecContext::with_threads(threads);
    for &(rows, cols) in &[(2048usize, 2048usize), (5632, 2048), (2048, 5632)] {
        let w = values(rows * cols, 1);
        let x = values(m * cols, 2);
        let mut out = vec![0.0f32; m * rows];
        for &format in &formats {
            let q = ctx.quantize(format, rows, cols, &w).expect("quantize");
            let p = ctx.repack_quant(&q.matrix()).expect("repack");
            let mut t = Vec::with_capacity(reps);
            ctx.quant_matmul_packed(&x, m, &p, &mut out)
                .expect("product");
            let cpu0 = cpu_seconds();
            for _ in 0..reps {
                let s = Instant::now();
                ctx.quant_matmul_packed(&x, m, &p, &mut out)
                    .expect("product");
                t.push(s.elapsed().as_secs_f64());
            }
            let cpu = (cpu_seconds() - cpu0) / reps as f64;
            t.sort_by(f64::total_cmp);
            let med = t[t.len() / 2];
            let macs = (m * rows * cols) as f64;
            println!(
                "{format:?} {rows}x{cols} m={m}: median {:.2} ms, min {:.2} ms, {:.1} GMAC/s; CPU {:.1} ms per call, {:.1} GMAC per CPU second",
                med * 1e3,
                t[0] * 1e3,
                macs / med * 1e-9,
                cpu * 1e3,
                macs / cpu * 1e-9
            );
        }
    }
}
