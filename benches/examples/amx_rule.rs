//! bf16 products with the AMX summation rule at prefill shapes (not a criterion
//! benchmark): `ExecContext::bf16_matmul_amx_rule` on AMX tiles and on its
//! AVX-512 emulation, the f32-activation bf16 `weight_matmul` on the same
//! weights, and the AVX-512 f32 FMA peak, all in one process, on 1 and 2
//! threads. Prints the median GFLOP/s (`2 m k n` per call) with the min-max
//! spread of `PROBE_REPS` calls (default 7) after one warm-up call.
//!
//! `PROBE_THREADS=1` (or `2`) runs one thread count only; `PROBE_AMX_ONLY=1`
//! times only the AMX path (for profiling); `PROBE_SHAPES=0,4` picks shapes by
//! index. Under `FUCINA_SIMD=avx2` (or `portable`) both rule columns time the
//! portable emulation.
//!
//! `cargo run --release -p fucina-benches --example amx_rule`

use std::time::Instant;

use fucina_benches::{FmaWidth, fma_peak, rand_vec};
use fucina_exec::{
    ExecContext, PackedBf16Matrix, WeightFormat, WeightMatrix, amx_available, amx_rule_path,
    force_amx,
};

/// Median, min and max GFLOP/s of `reps` timed calls after a warm-up.
fn time(reps: usize, flops: f64, mut f: impl FnMut()) -> (f64, f64, f64) {
    f();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            flops / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let reps: usize = std::env::var("PROBE_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let cpu = fucina_benches::cpu_model();
    println!(
        "CPU: {cpu}; AMX available: {}; path before any switch: {}",
        amx_available(),
        amx_rule_path()
    );
    let shapes = [
        ("TinyLlama q/o", 128, 2048, 2048),
        ("TinyLlama up/gate", 128, 2048, 5632),
        ("TinyLlama q/o", 512, 2048, 2048),
        ("TinyLlama up/gate", 512, 2048, 5632),
        ("SmolLM2 up/gate", 128, 576, 1536),
        ("SmolLM2 up/gate", 512, 576, 1536),
    ];
    let only: Option<usize> = std::env::var("PROBE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok());
    let amx_only = std::env::var("PROBE_AMX_ONLY").is_ok_and(|v| v == "1");
    for threads in [1usize, 2] {
        if only.is_some_and(|t| t != threads) {
            continue;
        }
        let peak = fma_peak(FmaWidth::Avx512, threads, 3_000_000, 5).unwrap_or(0.0);
        println!("\n{threads} thread(s): AVX-512 f32 FMA peak {peak:.1} GFLOP/s");
        println!(
            "{:20} {:>16} | {:>26} | {:>26} | {:>26} | amx/emu amx/wm amx/peak",
            "shape", "m x k x n", "AMX", "AVX-512 emulation", "weight_matmul bf16"
        );
        let ctx = ExecContext::with_threads(threads);
        let picked: Option<Vec<usize>> = std::env::var("PROBE_SHAPES")
            .ok()
            .map(|v| v.split(',').filter_map(|i| i.trim().parse().ok()).collect());
        for (si, &(name, m, k, n)) in shapes.iter().enumerate() {
            if picked.as_ref().is_some_and(|p| !p.contains(&si)) {
                continue;
            }
            let x = rand_vec(1, m * k);
            let wf = rand_vec(2, n * k);
            let bytes: Vec<u8> = wf
                .iter()
                .flat_map(|v| (((v * 0.05).to_bits() >> 16) as u16).to_le_bytes())
                .collect();
            let w = WeightMatrix::new(WeightFormat::BF16, n, k, &bytes).expect("weights");
            let t0 = Instant::now();
            let packed = PackedBf16Matrix::new(&w).expect("pack");
            let pack_ms = t0.elapsed().as_secs_f64() * 1e3;
            let flops = 2.0 * (m * k * n) as f64;
            let mut out = vec![0.0f32; m * n];
            let mut run_rule = |amx: bool| {
                if !force_amx(amx) {
                    return None;
                }
                let path = amx_rule_path();
                let r = time(reps, flops, || {
                    ctx.bf16_matmul_amx_rule(&x, m, &packed, &mut out)
                        .expect("amx rule");
                });
                Some((r, path))
            };
            let amx = run_rule(true);
            if amx_only {
                println!("{name:20} {m}x{k}x{n}: AMX {:?}", amx.map(|r| r.0));
                continue;
            }
            let emu = run_rule(false);
            force_amx(amx_available());
            let mut out2 = vec![0.0f32; m * n];
            let wm = time(reps, flops, || {
                ctx.weight_matmul(&x, m, &w, &mut out2)
                    .expect("weight_matmul");
            });
            let fmt = |r: Option<((f64, f64, f64), &str)>| match r {
                Some(((med, lo, hi), path)) => format!("{med:7.1} ({lo:.0}-{hi:.0}) [{path}]"),
                None => "n/a".into(),
            };
            let amx_med = amx.map(|r| r.0.0).unwrap_or(f64::NAN);
            let emu_med = emu.map(|r| r.0.0).unwrap_or(f64::NAN);
            println!(
                "{name:20} {:>16} | {:>26} | {:>26} | {:>26} | {:6.1}x {:6.1}x {:6.2}x   (pack {pack_ms:.1} ms)",
                format!("{m}x{k}x{n}"),
                fmt(amx),
                fmt(emu),
                format!("{:7.1} ({:.0}-{:.0})", wm.0, wm.1, wm.2),
                amx_med / emu_med,
                amx_med / wm.0,
                amx_med / peak,
            );
        }
    }
}
