//! Q4_K repacked in strips of eight rows (`repack_quant` of a Q4_K matrix):
//! the repacked product against the in-place one bit for bit at every vector
//! level, thread count and batch size (m = 1..=9 and the GEMM's sizes), the
//! rows read back, the grouped dispatch, the row counts that are not a
//! multiple of eight (read in place only), and zero allocations at steady
//! state.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes

use std::sync::atomic::Ordering;

use fucina_exec::{
    ExecContext, ExecError, GroupedProduct, GroupedWeight, QuantFormat, QuantMatrix, SimdLevel,
    detected_simd_level, force_simd_level,
};
use fucina_storage::half::f16;

#[path = "../../fucina-thread/tests/support/counting.rs"]
mod counting;
use counting::{ALLOCATIONS, Counting, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Deterministic pseudo-random values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let u = (fucina_exec::rng::at(seed, i) >> 40) as f32 / (1u64 << 24) as f32;
            scale * (2.0 * u - 1.0)
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Q4_K blocks of arbitrary bytes (every nibble, 6-bit scale and min), with
/// finite `d` and `dmin` of either sign.
fn arbitrary_q4k(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let nb = rows * cols / 256;
    let mut b: Vec<u8> = (0..nb * 144)
        .map(|i| (fucina_exec::rng::at(seed, i as u64) >> 56) as u8)
        .collect();
    for (k, blk) in b.chunks_exact_mut(144).enumerate() {
        let u = |i: u64| (fucina_exec::rng::at(seed ^ 0x5a5a, 2 * k as u64 + i) >> 40) as f32;
        let d = (u(0) / (1u64 << 24) as f32 - 0.5) * 0.02;
        let dmin = (u(1) / (1u64 << 24) as f32 - 0.3) * 0.01;
        blk[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        blk[2..4].copy_from_slice(&f16::from_f32(dmin).to_bits().to_le_bytes());
    }
    b
}

/// The batch sizes: every tile size, both GEMMs' thresholds, and past them.
const MS: [usize; 13] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 24];

/// The repacked matrix gives the in-place kernel's bits for every level,
/// thread count and batch (the in-place kernels are pinned to the reference
/// order by `quant_k.rs`).
#[test]
fn repacked_q4k_matches_in_place_bit_for_bit() {
    let best = detected_simd_level();
    let shapes = [
        (8usize, 256usize),
        (16, 512),
        (24, 768),
        (40, 1024),
        (72, 256),
    ];
    for (si, &(rows, cols)) in shapes.iter().enumerate() {
        let quantized;
        let bytes = if si % 2 == 0 {
            let w: Vec<f32> = values(rows * cols, 3 + si as u64, 0.5)
                .iter()
                .map(|v| v + 0.2)
                .collect();
            quantized = ExecContext::new()
                .quantize(QuantFormat::Q4_K, rows, cols, &w)
                .unwrap();
            quantized.matrix().bytes().to_vec()
        } else {
            arbitrary_q4k(rows, cols, 17 + si as u64)
        };
        let w = QuantMatrix::new(QuantFormat::Q4_K, rows, cols, &bytes).unwrap();
        let mut x = values(24 * cols, 99 + si as u64, 2.0);
        // a zero activation block and one huge value
        x[cols..cols + 256].fill(0.0);
        x[2 * cols + 5] = 1.0e6;
        let packed = ExecContext::new().repack_quant(&w).unwrap();
        assert_eq!(
            (packed.format(), packed.rows(), packed.cols()),
            (QuantFormat::Q4_K, rows, cols)
        );
        // the copy is no larger than the matrix (up to the last cache line)
        assert!(packed.size_bytes() < bytes.len() + 64);
        for level in SimdLevel::available() {
            assert!(force_simd_level(level));
            for threads in 1..=3 {
                let ctx = ExecContext::with_threads(threads);
                for &m in &MS {
                    let what = format!(
                        "{rows}x{cols} m={m} level={} threads={threads}",
                        level.name()
                    );
                    let (mut a, mut b) = (vec![f32::NAN; m * rows], vec![0.5f32; m * rows]);
                    ctx.quant_matmul(&x[..m * cols], m, &w, &mut a).unwrap();
                    ctx.quant_matmul_packed(&x[..m * cols], m, &packed, &mut b)
                        .unwrap();
                    assert_eq!(bits(&b), bits(&a), "packed vs in place: {what}");
                }
            }
        }
        assert!(force_simd_level(best));
    }
}

/// A repacked matrix's rows read back are the original's, bit for bit.
#[test]
fn repacked_q4k_rows_read_back() {
    let (rows, cols) = (16, 512);
    let bytes = arbitrary_q4k(rows, cols, 5);
    let w = QuantMatrix::new(QuantFormat::Q4_K, rows, cols, &bytes).unwrap();
    let packed = ExecContext::new().repack_quant(&w).unwrap();
    let (mut a, mut b) = (vec![0.0; cols], vec![1.0; cols]);
    for r in 0..rows {
        w.dequantize_row(r, &mut a).unwrap();
        packed.dequantize_row(r, &mut b).unwrap();
        assert_eq!(bits(&a), bits(&b), "row {r}");
    }
    assert!(matches!(
        packed.dequantize_row(rows, &mut b),
        Err(ExecError::IndexOutOfBounds { .. })
    ));
}

/// Row counts that are not a multiple of eight are read in place only.
#[test]
fn q4k_rows_not_a_multiple_of_eight_are_not_repacked() {
    let ctx = ExecContext::new();
    for rows in [1usize, 7, 12, 13, 20] {
        assert!(!QuantFormat::Q4_K.repackable_rows(rows));
        let w = ctx
            .quantize(QuantFormat::Q4_K, rows, 256, &values(rows * 256, 1, 1.0))
            .unwrap();
        let e = ctx.repack_quant(&w.matrix()).unwrap_err();
        assert!(
            matches!(
                e,
                ExecError::InvalidArgument {
                    op: "repack_quant",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("multiple of 8"), "{e}");
    }
    for rows in [8usize, 16, 32_000] {
        assert!(QuantFormat::Q4_K.repackable_rows(rows));
    }
    for q in [QuantFormat::Q5_K, QuantFormat::Q6_K, QuantFormat::Q3_K] {
        assert!(!q.repackable_rows(8), "{q:?}");
    }
}

/// The grouped dispatch reads a repacked Q4_K matrix with the single call's
/// bits.
#[test]
fn grouped_repacked_q4k_matches_its_single_call() {
    let (rows, cols) = (48, 512);
    for threads in [1, 3] {
        let ctx = ExecContext::with_threads(threads);
        let q = ctx
            .quantize(QuantFormat::Q4_K, rows, cols, &values(rows * cols, 7, 1.0))
            .unwrap();
        let p = ctx.repack_quant(&q.matrix()).unwrap();
        let (x0, x1) = (values(cols, 8, 1.0), values(cols, 9, 1.0));
        let (mut a0, mut a1) = (vec![0.0; rows], vec![0.0; rows]);
        ctx.quant_matmul(&x0, 1, &q.matrix(), &mut a0).unwrap();
        ctx.quant_matmul(&x1, 1, &q.matrix(), &mut a1).unwrap();
        let (mut b0, mut b1) = (vec![0.0; rows], vec![0.0; rows]);
        ctx.grouped_matmul(&mut [
            GroupedProduct {
                weight: GroupedWeight::Packed(&p),
                x: &x0,
                m: 1,
                out: &mut b0,
            },
            GroupedProduct {
                weight: GroupedWeight::Quant(q.matrix()),
                x: &x1,
                m: 1,
                out: &mut b1,
            },
        ])
        .unwrap();
        assert_eq!(bits(&b0), bits(&a0), "{threads} threads");
        assert_eq!(bits(&b1), bits(&a1), "{threads} threads");
    }
}

fn steady_state_allocates_nothing() {
    counting::check_the_counter();
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let (rows, cols) = (64, 512);
        let q = ctx
            .quantize(QuantFormat::Q4_K, rows, cols, &values(rows * cols, 8, 1.0))
            .unwrap();
        let p = ctx.repack_quant(&q.matrix()).unwrap();
        for m in [1usize, 3, 8, 16] {
            let x = values(m * cols, 9, 1.0);
            let mut out = vec![0.0; m * rows];
            ctx.quant_matmul_packed(&x, m, &p, &mut out).unwrap();
            ctx.quant_matmul_packed(&x, m, &p, &mut out).unwrap();
            let misses = ctx.pool().stats().misses;
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            for _ in 0..5 {
                ctx.quant_matmul_packed(&x, m, &p, &mut out).unwrap();
            }
            let allocs = ALLOCATIONS.load(Ordering::SeqCst) - before;
            assert_eq!(allocs, 0, "heap allocations (m={m}, {threads} threads)");
            assert_eq!(ctx.pool().stats().misses, misses, "pool misses");
        }
    }
}

#[test]
fn quant_matmul_packed_q4k_allocates_nothing_at_steady_state() {
    in_own_process(
        "quant_matmul_packed_q4k_allocates_nothing_at_steady_state",
        steady_state_allocates_nothing,
    );
}
