//! What the probes of this directory share: deterministic bf16 matrices and
//! a streaming read.

#![allow(dead_code)] // each probe uses part of it

use std::time::Instant;

/// A deterministic bf16 matrix of `n` elements (values in about ±0.05).
pub(crate) fn bf16_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
            ((v.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

/// Streaming read bandwidth in bytes/s (as the LLM bench measures it):
/// `threads` threads each sum their share of `buf`.
pub(crate) fn stream_read(buf: &[f32], threads: usize) -> f64 {
    let t0 = Instant::now();
    let chunk = buf.len().div_ceil(threads);
    let total: f32 = std::thread::scope(|s| {
        let hs: Vec<_> = buf
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let mut acc = [0.0f32; 16];
                    for c in part.chunks_exact(16) {
                        for (a, v) in acc.iter_mut().zip(c) {
                            *a += v;
                        }
                    }
                    acc.iter().sum::<f32>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let dt = t0.elapsed().as_secs_f64();
    std::hint::black_box(total);
    std::mem::size_of_val(buf) as f64 / dt
}
