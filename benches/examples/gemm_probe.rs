//! A quick GEMM probe for tuning (not a criterion benchmark): times fucina's
//! matmul and the `gemm` crate at the shapes given on the command line (default
//! `1024`), taking turns phase by phase ([`PHASES`]), and prints each median as GFLOP/s, as a
//! fraction of the FMA peak measured in the same process, and as a ratio to the
//! `gemm` crate.
//!
//! `PROBE_THREADS=1` (or `2`) limits it to one thread count; `PROBE_PEER=0`
//! skips the `gemm` crate (for profiling fucina alone); `PROBE_MIN=1` reports the
//! fastest call instead of the median; `PROBE_CACHED=1` makes fucina's right-hand
//! side a `RhsLifetime::StableProcess` weight (packed once, then cached).
//!
//! `cargo run --release -p fucina-benches --example gemm_probe -- 512 1024 64x784x256`

use std::hint::black_box;
use std::time::Instant;

use fucina_benches::{peak, rand_vec};
use fucina_exec::storage::Buffer;
use fucina_exec::{ExecContext, MatmulOptions, RawTensor, RhsLifetime};

#[path = "../peer/gemm.rs"]
mod gemm_peer;
use gemm_peer::gemm_crate;

fn parse(s: &str) -> (usize, usize, usize) {
    let v: Vec<usize> = s
        .split('x')
        .map(|x| x.parse().expect("a shape: N or MxKxN"))
        .collect();
    match v[..] {
        [n] => (n, n, n),
        [m, k, n] => (m, k, n),
        _ => panic!("a shape: N or MxKxN"),
    }
}

/// Each side runs this many phases of `rounds` calls, the two sides taking turns
/// phase by phase (each phase on caches warm for its own buffers, as a
/// benchmark of one library alone would be), so that drifting load on a shared
/// machine hits both alike.
const PHASES: usize = 3;

/// The median of the call times, or their minimum with `PROBE_MIN=1` (noise on a
/// shared machine only ever adds time, so the minimum is the steadier figure for
/// comparing two builds; the median is what a user sees).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if std::env::var("PROBE_MIN").is_ok_and(|v| v == "1") {
        return v[0];
    }
    v[v.len() / 2]
}

fn main() {
    let mut shapes: Vec<String> = std::env::args().skip(1).collect();
    if shapes.is_empty() {
        shapes.push("1024".into());
    }
    let threads_list: Vec<usize> = match std::env::var("PROBE_THREADS") {
        Ok(t) => vec![t.parse().expect("PROBE_THREADS: a thread count")],
        Err(_) => vec![1, 2],
    };
    for s in &shapes {
        let (m, k, n) = parse(s);
        let av = rand_vec(1, m * k);
        let bv = rand_vec(2, k * n);
        let flops = 2.0 * (m * n * k) as f64;
        let rounds = ((3e9 / flops) as usize).clamp(5, 200);
        for &threads in &threads_list {
            let ctx = ExecContext::with_threads(threads);
            let a = ctx.from_slice(&[m, k], &av).unwrap();
            let b = ctx.from_slice(&[k, n], &bv).unwrap();
            let mut cv = vec![0.0f32; m * n];
            let par = if threads == 1 {
                gemm::Parallelism::None
            } else {
                gemm::Parallelism::Rayon(threads)
            };
            let skip_peer = std::env::var("PROBE_PEER").is_ok_and(|v| v == "0");
            let mut peer = || {
                if skip_peer {
                    return;
                }
                gemm_crate(m, k, n, &av, &bv, &mut cv, par);
            };
            // `PROBE_CACHED=1`: the right-hand side is a `StableProcess` weight, so
            // its packed panels are cached after the first call (the GEMM without
            // the packing of B).
            let cached = std::env::var("PROBE_CACHED").is_ok_and(|v| v == "1");
            let b_stable = RawTensor::from_buffer(
                Buffer::from_arc(std::sync::Arc::from(bv.as_slice())),
                &[k, n],
            )
            .unwrap();
            let stable = MatmulOptions {
                rhs_lifetime: RhsLifetime::StableProcess,
            };
            let ours = || {
                let c = if cached {
                    ctx.matmul_with(&a, &b_stable, stable)
                } else {
                    ctx.matmul(&a, &b)
                };
                drop(black_box(c.unwrap()))
            };
            ours();
            peer();
            let (mut t_ours, mut t_peer) = (Vec::new(), Vec::new());
            for _ in 0..PHASES {
                for _ in 0..rounds {
                    let t = Instant::now();
                    ours();
                    t_ours.push(t.elapsed().as_secs_f64());
                }
                for _ in 0..rounds {
                    let t = Instant::now();
                    peer();
                    t_peer.push(t.elapsed().as_secs_f64());
                }
            }
            let (to, tp) = (median(t_ours), median(t_peer));
            let pk = peak(threads).best();
            eprintln!(
                "{s} t{threads}: fucina {:.1} GFLOP/s ({:.3} of peak {pk:.1}), gemm {:.1} ({:.3}), fucina/gemm {:.3}",
                flops / to / 1e9,
                flops / to / 1e9 / pk,
                flops / tp / 1e9,
                flops / tp / 1e9 / pk,
                tp / to
            );
            drop((a, b));
        }
    }
}
