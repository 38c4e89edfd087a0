//! Block-quantized weights (Q8_0, Q4_0 in llama.cpp's layouts) and
//! `quant_matmul`: hand-computed blocks, round-trip bounds, the fast paths
//! against a scalar reference of the documented order (bit for bit, every vector
//! level, 1-4 threads, several batch sizes), batch invariance, bad input, the
//! accuracy bound against the f32 product, zero allocations at steady state, and
//! the repacked (`PackedQuantMatrix`) path against the in-place one, bit for bit.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes

use std::sync::atomic::Ordering;

use fucina_exec::{
    ExecContext, ExecError, MatmulOptions, PackedQuantMatrix, QuantFormat, QuantMatrix,
    QuantizedWeights, RhsLifetime, SimdLevel, detected_simd_level, force_simd_level,
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

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

// ---------------------------------------------------------------- formats

#[test]
fn q8_0_blocks_match_hand_computed_bytes() {
    let ctx = ExecContext::new();
    // Block 0: amax 127 -> d = 1, q = round(x) with ties away from zero.
    let mut b0 = [0.0f32; 32];
    b0[..8].copy_from_slice(&[127.0, -127.0, 0.5, -0.5, 1.49, 2.5, -2.5, 0.0]);
    // Block 1: amax 63.5 -> d = 0.5, q = round(2x).
    let mut b1 = [0.0f32; 32];
    b1[..5].copy_from_slice(&[63.5, -10.25, 0.2, -0.26, 31.0]);
    // Block 2: all zero -> d = 0, q = 0.
    let b2 = [0.0f32; 32];
    let x: Vec<f32> = [b0, b1, b2].concat();
    let q = ctx.quantize(QuantFormat::Q8_0, 1, 96, &x).unwrap();
    let mut want = [0u8; 3 * 34];
    want[0..2].copy_from_slice(&[0x00, 0x3c]); // f16 1.0
    for (k, v) in [127i8, -127, 1, -1, 1, 3, -3, 0].iter().enumerate() {
        want[2 + k] = *v as u8;
    }
    want[34..36].copy_from_slice(&[0x00, 0x38]); // f16 0.5
    for (k, v) in [127i8, -21, 0, -1, 62].iter().enumerate() {
        want[36 + k] = *v as u8;
    }
    assert_eq!(q.bytes(), &want[..]);
    let mut back = vec![0.0; 96];
    ctx.dequantize(&q.matrix(), &mut back).unwrap();
    assert_eq!(&back[..8], &[127.0, -127.0, 1.0, -1.0, 1.0, 3.0, -3.0, 0.0]);
    assert_eq!(&back[32..37], &[63.5, -10.5, 0.0, -0.5, 31.0]);
    assert!(back[64..].iter().all(|&v| v == 0.0));
}

#[test]
fn q4_0_blocks_match_hand_computed_bytes() {
    let ctx = ExecContext::new();
    // Block 0: the value of largest magnitude is -8 -> d = -8 / -8 = 1,
    // n = min(15, trunc(x + 8.5)).
    let mut b0 = [0.0f32; 32];
    b0[..6].copy_from_slice(&[-8.0, 7.0, 7.4, 0.0, -0.6, -3.2]);
    b0[16..19].copy_from_slice(&[2.5, -7.9, 1.0]);
    // Block 1: largest magnitude +8 -> d = -1, n = min(15, trunc(-x + 8.5)):
    // 8 -> 0 (value 8), -8 -> 16 clamped to 15 (value -7).
    let mut b1 = [0.0f32; 32];
    b1[0] = 8.0;
    b1[1] = -8.0;
    b1[17] = 3.0;
    let x: Vec<f32> = [b0, b1].concat();
    let q = ctx.quantize(QuantFormat::Q4_0, 1, 64, &x).unwrap();
    // nibbles of block 0: elements 0..16 then 16..32 (zeros -> 8)
    let mut n0 = [8u8; 32];
    n0[..6].copy_from_slice(&[0, 15, 15, 8, 7, 5]);
    n0[16..19].copy_from_slice(&[11, 0, 9]);
    let mut n1 = [8u8; 32];
    n1[0] = 0;
    n1[1] = 15;
    n1[17] = 5;
    let mut want = Vec::new();
    for (scale, n) in [([0x00u8, 0x3c], n0), ([0x00, 0xbc], n1)] {
        want.extend_from_slice(&scale);
        want.extend((0..16).map(|k| n[k] | (n[k + 16] << 4)));
    }
    assert_eq!(q.bytes(), &want[..]);
    // spot-check the packing by hand: byte 0 of block 0 = 0 | 11 << 4
    assert_eq!(q.bytes()[2], 0xb0);
    let mut back = vec![0.0; 64];
    q.matrix().dequantize_row(0, &mut back).unwrap();
    assert_eq!(&back[..6], &[-8.0, 7.0, 7.0, 0.0, -1.0, -3.0]);
    assert_eq!(&back[16..19], &[3.0, -8.0, 1.0]);
    assert_eq!(&back[32..34], &[8.0, -7.0]);
    assert_eq!(back[49], 3.0);
}

#[test]
fn round_trip_errors_are_within_the_format_bounds() {
    let ctx = ExecContext::with_threads(2);
    let (rows, cols) = (37, 256);
    let w = values(rows * cols, 7, 3.0);
    for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
        let q = ctx.quantize(format, rows, cols, &w).unwrap();
        assert_eq!(q.bytes().len(), rows * cols / 32 * format.block_bytes());
        let mut back = vec![0.0; rows * cols];
        ctx.dequantize(&q.matrix(), &mut back).unwrap();
        for (b, (wb, bb)) in w.chunks(32).zip(back.chunks(32)).enumerate() {
            let amax = wb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            // f32 scale d, stored as f16 sd: |w - q sd| <= |w - q d| + |q| |d - sd|
            let (d, qmax, step) = match format {
                QuantFormat::Q8_0 => (amax / 127.0, 127.0, 0.5),
                // the clamp at n = 15 costs a full step on the -max side
                QuantFormat::Q4_0 => (amax / 8.0, 8.0, 1.0),
                // tests/quant_k.rs and quant_formats.rs cover the others
                _ => unreachable!("q8_0 and q4_0 only"),
            };
            let sd = f16::from_f32(d).to_f32();
            let bound = step * d + qmax * (d - sd).abs() + 1e-6 * amax;
            for (k, (x, y)) in wb.iter().zip(bb).enumerate() {
                assert!(
                    (x - y).abs() <= bound,
                    "{} block {b} elem {k}: {x} -> {y} (bound {bound})",
                    format.name()
                );
            }
        }
        // identical whatever the thread count
        let q1 = ExecContext::with_threads(1)
            .quantize(format, rows, cols, &w)
            .unwrap();
        assert_eq!(q1, q);
    }
}

#[test]
fn bad_shapes_and_lengths_are_errors() {
    let ctx = ExecContext::new();
    assert!(matches!(
        ctx.quantize(QuantFormat::Q8_0, 2, 48, &[0.0; 96]),
        Err(ExecError::InvalidArgument { op: "quantize", .. })
    ));
    assert!(matches!(
        ctx.quantize(QuantFormat::Q4_0, 2, 32, &[0.0; 63]),
        Err(ExecError::InvalidDataLength {
            op: "quantize",
            expected: 64,
            got: 63,
            ..
        })
    ));
    let bytes = vec![0u8; 2 * 34];
    assert!(matches!(
        QuantMatrix::new(QuantFormat::Q8_0, 2, 33, &bytes),
        Err(ExecError::InvalidArgument { .. })
    ));
    assert!(matches!(
        QuantMatrix::new(QuantFormat::Q8_0, 2, 32, &bytes[..67]),
        Err(ExecError::InvalidDataLength {
            expected: 68,
            got: 67,
            ..
        })
    ));
    assert!(matches!(
        QuantMatrix::new(QuantFormat::Q4_0, 2, 32, &bytes),
        Err(ExecError::InvalidDataLength {
            expected: 36,
            got: 68,
            ..
        })
    ));
    assert!(matches!(
        QuantMatrix::new(QuantFormat::Q4_0, usize::MAX, 64, &bytes),
        Err(ExecError::Overflow { .. })
    ));
    assert!(QuantizedWeights::from_bytes(QuantFormat::Q8_0, 3, 32, bytes.clone()).is_err());
    let w = QuantMatrix::new(QuantFormat::Q8_0, 2, 32, &bytes).unwrap();
    let mut out = [7.0f32; 4];
    assert!(matches!(
        ctx.quant_matmul(&[0.0; 63], 2, &w, &mut out),
        Err(ExecError::InvalidDataLength {
            op: "quant_matmul",
            expected: 64,
            got: 63,
            ..
        })
    ));
    assert!(matches!(
        ctx.quant_matmul(&[0.0; 64], 2, &w, &mut out[..3]),
        Err(ExecError::InvalidDataLength {
            op: "quant_matmul",
            expected: 4,
            got: 3,
            ..
        })
    ));
    assert_eq!(out, [7.0; 4], "nothing written on error");
    assert!(matches!(
        w.dequantize_row(2, &mut [0.0; 32]),
        Err(ExecError::IndexOutOfBounds { .. })
    ));
    assert!(matches!(
        ctx.dequantize(&w, &mut [0.0; 63]),
        Err(ExecError::InvalidDataLength { .. })
    ));
}

// ---------------------------------------------------------------- the product

/// The activation quantization the docs define: per block of 32,
/// `d = amax / 127` (f32), `q = clamp(round(x / d))` with `x · (1 / d)`.
fn ref_quantize_acts(x: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::new();
    let mut s = Vec::new();
    for b in x.chunks(32) {
        let amax = b.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        q.extend(
            b.iter()
                .map(|&v| (v * id).round().clamp(-127.0, 127.0) as i8),
        );
        s.push(d);
    }
    (q, s)
}

/// Weight value `k` of a block as a signed integer.
fn weight_int(format: QuantFormat, blk: &[u8], k: usize) -> i32 {
    match format {
        QuantFormat::Q8_0 => i32::from(blk[2 + k] as i8),
        QuantFormat::Q4_0 => {
            let byte = blk[2 + k % 16];
            i32::from(if k < 16 { byte & 15 } else { byte >> 4 }) - 8
        }
        // tests/quant_k.rs and quant_formats.rs cover the others
        _ => unreachable!("q8_0 and q4_0 only"),
    }
}

/// The documented order: eight lanes of four elements, blocks in increasing
/// order, `acc[l] = fma(dw · dx, p[l], acc[l])`, lanes folded in halves.
fn ref_dot(w: &QuantMatrix<'_>, j: usize, xq: &[i8], xs: &[f32]) -> f32 {
    let bb = w.format().block_bytes();
    let row = &w.bytes()[j * w.row_bytes()..(j + 1) * w.row_bytes()];
    let mut acc = [0.0f32; 8];
    for (b, blk) in row.chunks(bb).enumerate() {
        let dw = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
        let s = dw * xs[b];
        for (l, a) in acc.iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4)
                .map(|k| weight_int(w.format(), blk, k) * i32::from(xq[32 * b + k]))
                .sum();
            *a = s.mul_add(p as f32, *a);
        }
    }
    for h in [4, 2, 1] {
        for l in 0..h {
            acc[l] += acc[l + h];
        }
    }
    acc[0]
}

fn ref_matmul(x: &[f32], m: usize, w: &QuantMatrix<'_>) -> Vec<f32> {
    let mut out = vec![0.0; m * w.rows()];
    for i in 0..m {
        let (xq, xs) = ref_quantize_acts(&x[i * w.cols()..(i + 1) * w.cols()]);
        for j in 0..w.rows() {
            out[i * w.rows() + j] = ref_dot(w, j, &xq, &xs);
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every vector level this CPU has, every thread count 1-4, batch sizes
/// {1, 2, 3, 8, 17, 64}, odd row counts: the same bits as the reference.
#[test]
fn every_path_matches_the_reference_bit_for_bit() {
    let best = detected_simd_level();
    let shapes = [(37usize, 256usize), (5, 96), (1, 32), (130, 64)];
    for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
        for (si, &(rows, cols)) in shapes.iter().enumerate() {
            let ctx = ExecContext::new();
            let q = ctx
                .quantize(
                    format,
                    rows,
                    cols,
                    &values(rows * cols, 11 + si as u64, 0.5),
                )
                .unwrap();
            let w = q.matrix();
            let x = values(64 * cols, 99 + si as u64, 2.0);
            let want: Vec<Vec<f32>> = [1usize, 2, 3, 8, 17, 64]
                .iter()
                .map(|&m| ref_matmul(&x[..m * cols], m, &w))
                .collect();
            for level in SimdLevel::available() {
                assert!(force_simd_level(level));
                for threads in 1..=4 {
                    let ctx = ExecContext::with_threads(threads);
                    for (mi, &m) in [1usize, 2, 3, 8, 17, 64].iter().enumerate() {
                        let mut out = vec![f32::NAN; m * rows];
                        ctx.quant_matmul(&x[..m * cols], m, &w, &mut out).unwrap();
                        assert_eq!(
                            bits(&out),
                            bits(&want[mi]),
                            "{} {rows}x{cols} m={m} level={} threads={threads}",
                            format.name(),
                            level.name()
                        );
                    }
                }
            }
            assert!(force_simd_level(best));
        }
    }
}

/// Weights with every byte pattern a file may hold (Q8_0 -128, any nibble,
/// negative and tiny scales) and activations at the edges (zero blocks, a
/// single large value): still the reference's bits on every path.
#[test]
fn arbitrary_block_bytes_match_the_reference() {
    let best = detected_simd_level();
    let (rows, cols) = (9, 128);
    for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
        let n = rows * cols / 32 * format.block_bytes();
        let mut bytes: Vec<u8> = (0..n as u64)
            .map(|i| (fucina_exec::rng::at(5, i) >> 56) as u8)
            .collect();
        // finite scales in [-2, 2): overwrite each block's f16
        for (b, blk) in bytes.chunks_mut(format.block_bytes()).enumerate() {
            let v = values(1, 1000 + b as u64, 2.0)[0];
            blk[..2].copy_from_slice(&f16_bytes(v));
            if b % 5 == 0 && format == QuantFormat::Q8_0 {
                blk[2..].fill(0x80); // -128 everywhere
            }
        }
        let w = QuantMatrix::new(format, rows, cols, &bytes).unwrap();
        let mut x = values(3 * cols, 3, 1.0);
        x[..32].fill(0.0);
        x[cols + 5] = 1e30;
        x[2 * cols..2 * cols + 32].fill(-127.0);
        let want = ref_matmul(&x, 3, &w);
        for level in SimdLevel::available() {
            assert!(force_simd_level(level));
            let mut out = vec![0.0; 3 * rows];
            ExecContext::new()
                .quant_matmul(&x, 3, &w, &mut out)
                .unwrap();
            assert_eq!(
                bits(&out),
                bits(&want),
                "{} {}",
                format.name(),
                level.name()
            );
        }
        assert!(force_simd_level(best));
    }
}

#[test]
fn a_row_does_not_depend_on_the_rest_of_the_batch() {
    let ctx = ExecContext::with_threads(3);
    let (rows, cols) = (77, 192);
    for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
        let q = ctx
            .quantize(format, rows, cols, &values(rows * cols, 1, 1.0))
            .unwrap();
        let x = values(17 * cols, 2, 1.0);
        let mut all = vec![0.0; 17 * rows];
        ctx.quant_matmul(&x, 17, &q.matrix(), &mut all).unwrap();
        for i in 0..17 {
            let mut one = vec![0.0; rows];
            ctx.quant_matmul(&x[i * cols..(i + 1) * cols], 1, &q.matrix(), &mut one)
                .unwrap();
            assert_eq!(bits(&one), bits(&all[i * rows..(i + 1) * rows]), "row {i}");
        }
    }
}

#[test]
fn non_finite_activations_give_nan_rows_only() {
    let ctx = ExecContext::new();
    let q = ctx
        .quantize(QuantFormat::Q8_0, 4, 64, &values(256, 4, 1.0))
        .unwrap();
    let mut x = values(128, 5, 1.0);
    x[40] = f32::INFINITY;
    let mut out = vec![0.0; 8];
    ctx.quant_matmul(&x, 2, &q.matrix(), &mut out).unwrap();
    assert!(out[..4].iter().all(|v| v.is_nan()), "{out:?}");
    assert!(out[4..].iter().all(|v| v.is_finite()), "{out:?}");
}

/// `|y - Σ x w| <= Σ_k (|x_k| |w_k - ŵ_k| + |ŵ_k| |x_k - x̂_k|) + ε`, with ŵ
/// the dequantized weights, x̂ the quantized activations and ε the f32
/// rounding of the fixed order: every block adds one rounded product of scales
/// and one fused multiply-add per lane (relative `2^-24` each, `nb / 8` of them
/// per lane plus three folds), so `ε = (nb + 4) · 2^-23 · Σ |x̂_k ŵ_k|`
/// (generously).
#[test]
fn accuracy_against_the_f32_product_is_within_the_derived_bound() {
    let ctx = ExecContext::with_threads(2);
    let (rows, cols, m) = (64, 1024, 4);
    let w = values(rows * cols, 21, 0.1);
    let x = values(m * cols, 22, 1.0);
    for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
        let q = ctx.quantize(format, rows, cols, &w).unwrap();
        let mut wq = vec![0.0; rows * cols];
        ctx.dequantize(&q.matrix(), &mut wq).unwrap();
        let mut out = vec![0.0; m * rows];
        ctx.quant_matmul(&x, m, &q.matrix(), &mut out).unwrap();
        let mut worst = 0.0f64;
        for i in 0..m {
            let xi = &x[i * cols..(i + 1) * cols];
            let (xq, xs) = ref_quantize_acts(xi);
            for j in 0..rows {
                let (wj, wqj) = (&w[j * cols..(j + 1) * cols], &wq[j * cols..(j + 1) * cols]);
                let (mut exact, mut bound, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                for k in 0..cols {
                    let xhat = f64::from(xq[k]) * f64::from(xs[k / 32]);
                    exact += f64::from(xi[k]) * f64::from(wj[k]);
                    bound += f64::from(xi[k]).abs() * f64::from(wj[k] - wqj[k]).abs()
                        + f64::from(wqj[k]).abs() * (f64::from(xi[k]) - xhat).abs();
                    mag += (xhat * f64::from(wqj[k])).abs();
                }
                bound += (cols / 32 + 4) as f64 * 2f64.powi(-23) * mag;
                let err = (f64::from(out[i * rows + j]) - exact).abs();
                assert!(
                    err <= bound,
                    "{} ({i},{j}): error {err} above bound {bound}",
                    format.name()
                );
                worst = worst.max(err);
            }
        }
        assert!(worst > 0.0, "quantization changes something");
    }
}

#[test]
fn empty_and_zero_sized_products() {
    let ctx = ExecContext::new();
    let w = QuantMatrix::new(QuantFormat::Q4_0, 0, 64, &[]).unwrap();
    ctx.quant_matmul(&[0.0; 128], 2, &w, &mut []).unwrap();
    let w = QuantMatrix::new(QuantFormat::Q8_0, 3, 0, &[]).unwrap();
    let mut out = [1.0; 6];
    ctx.quant_matmul(&[], 2, &w, &mut out).unwrap();
    assert_eq!(out, [0.0; 6]);
}

#[test]
fn quantized_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<QuantMatrix<'static>>();
    check::<QuantizedWeights>();
    check::<PackedQuantMatrix>();
}

// ---------------------------------------------------------------- repacked

/// The bits of `v` with every NaN as the canonical quiet NaN.
fn bits_nan_as_one(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|x| {
            if x.is_nan() {
                f32::NAN.to_bits()
            } else {
                x.to_bits()
            }
        })
        .collect()
}

/// The formats `repack_quant` takes.
const REPACKABLE: [QuantFormat; 6] = [
    QuantFormat::Q8_0,
    QuantFormat::Q4_0,
    QuantFormat::Q5_0,
    QuantFormat::Q4_1,
    QuantFormat::Q5_1,
    QuantFormat::IQ4_NL,
];

/// The repacked matrix gives the in-place kernel's bits (and the reference's)
/// on every vector level, for 1-4 threads and batches that exercise every
/// tile size, with row counts that leave a partial strip of eight.
#[test]
fn packed_matches_in_place_bit_for_bit() {
    let best = detected_simd_level();
    let shapes = [(37usize, 256usize), (5, 96), (1, 32), (130, 64), (16, 1024)];
    let ms = [1usize, 2, 3, 4, 5, 8, 17];
    for format in REPACKABLE {
        for (si, &(rows, cols)) in shapes.iter().enumerate() {
            let ctx = ExecContext::new();
            let q = ctx
                .quantize(
                    format,
                    rows,
                    cols,
                    &values(rows * cols, 31 + si as u64, 0.5),
                )
                .unwrap();
            let w = q.matrix();
            let x = values(17 * cols, 77 + si as u64, 2.0);
            let want: Option<Vec<Vec<f32>>> = [QuantFormat::Q8_0, QuantFormat::Q4_0]
                .contains(&format)
                .then(|| {
                    ms.iter()
                        .map(|&m| ref_matmul(&x[..m * cols], m, &w))
                        .collect()
                });
            for level in SimdLevel::available() {
                assert!(force_simd_level(level));
                for threads in 1..=4 {
                    let ctx = ExecContext::with_threads(threads);
                    let packed = ctx.repack_quant(&w).unwrap();
                    assert_eq!(
                        (packed.format(), packed.rows(), packed.cols()),
                        (format, rows, cols)
                    );
                    for (mi, &m) in ms.iter().enumerate() {
                        let (mut a, mut b) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
                        ctx.quant_matmul(&x[..m * cols], m, &w, &mut a).unwrap();
                        ctx.quant_matmul_packed(&x[..m * cols], m, &packed, &mut b)
                            .unwrap();
                        let what = format!(
                            "{} {rows}x{cols} m={m} level={} threads={threads}",
                            format.name(),
                            level.name()
                        );
                        assert_eq!(bits(&b), bits(&a), "packed vs in place: {what}");
                        // (the reference here knows Q8_0 and Q4_0; the other
                        // formats' in-place bits are checked against theirs in
                        // tests/quant_formats.rs)
                        if let Some(want) = &want {
                            assert_eq!(bits(&b), bits(&want[mi]), "packed vs reference: {what}");
                        }
                    }
                }
            }
            assert!(force_simd_level(best));
        }
    }
}

/// Prefill-sized calls (the AVX-512 VNNI level's GEMM from 32 rows): the
/// in-place kernel's bits on every level, for 1-3 threads, around the switch
/// and at odd row counts (a last tile of one strip, partial strips), on
/// quantized data and on arbitrary block bytes with edge activations (zero
/// blocks, a huge value, a block of -127, a non-finite row).
#[test]
fn packed_gemm_sized_calls_match_in_place_bit_for_bit() {
    let best = detected_simd_level();
    let shapes = [(37usize, 256usize), (9, 96), (130, 64)];
    let ms = [31usize, 32, 33, 50, 97];
    for format in REPACKABLE {
        for (si, &(rows, cols)) in shapes.iter().enumerate() {
            let ctx = ExecContext::new();
            let q = ctx
                .quantize(
                    format,
                    rows,
                    cols,
                    &values(rows * cols, 41 + si as u64, 0.5),
                )
                .unwrap();
            // the same shape from arbitrary bytes (any code, negative scales)
            let n = rows * cols / 32 * format.block_bytes();
            let mut bytes: Vec<u8> = (0..n as u64)
                .map(|i| (fucina_exec::rng::at(9 + si as u64, i) >> 56) as u8)
                .collect();
            for (b, blk) in bytes.chunks_mut(format.block_bytes()).enumerate() {
                blk[..2].copy_from_slice(&f16_bytes(values(1, 3000 + b as u64, 2.0)[0]));
                if matches!(format, QuantFormat::Q4_1 | QuantFormat::Q5_1) {
                    blk[2..4].copy_from_slice(&f16_bytes(values(1, 5000 + b as u64, 2.0)[0]));
                }
            }
            let arbitrary = QuantMatrix::new(format, rows, cols, &bytes).unwrap();
            let mut x = values(97 * cols, 87 + si as u64, 2.0);
            x[..32].fill(0.0);
            x[cols + 5] = 1e30;
            x[2 * cols..2 * cols + 32].fill(-127.0);
            x[40 * cols + 3] = f32::NAN;
            for w in [q.matrix(), arbitrary] {
                for level in SimdLevel::available() {
                    assert!(force_simd_level(level));
                    for threads in 1..=3 {
                        let ctx = ExecContext::with_threads(threads);
                        let packed = ctx.repack_quant(&w).unwrap();
                        for &m in &ms {
                            let (mut a, mut b) =
                                (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
                            ctx.quant_matmul(&x[..m * cols], m, &w, &mut a).unwrap();
                            ctx.quant_matmul_packed(&x[..m * cols], m, &packed, &mut b)
                                .unwrap();
                            assert_eq!(
                                bits_nan_as_one(&b),
                                bits_nan_as_one(&a),
                                "packed vs in place: {} {rows}x{cols} m={m} level={} threads={threads}",
                                format.name(),
                                level.name()
                            );
                        }
                    }
                }
                assert!(force_simd_level(best));
            }
        }
    }
}

/// Arbitrary block bytes (Q8_0 -128, every nibble, negative scales) and edge
/// activations (zero blocks, a huge value, a non-finite row) through the
/// repacked layout: the reference's bits on every level.
#[test]
fn packed_arbitrary_block_bytes_match_the_reference() {
    let best = detected_simd_level();
    let (rows, cols) = (11, 128);
    for format in REPACKABLE {
        let n = rows * cols / 32 * format.block_bytes();
        let mut bytes: Vec<u8> = (0..n as u64)
            .map(|i| (fucina_exec::rng::at(6, i) >> 56) as u8)
            .collect();
        for (b, blk) in bytes.chunks_mut(format.block_bytes()).enumerate() {
            let v = values(1, 2000 + b as u64, 2.0)[0];
            blk[..2].copy_from_slice(&f16_bytes(v));
            if b % 5 == 0 && format == QuantFormat::Q8_0 {
                blk[2..].fill(0x80);
            }
        }
        let w = QuantMatrix::new(format, rows, cols, &bytes).unwrap();
        let mut x = values(4 * cols, 4, 1.0);
        x[..32].fill(0.0);
        x[cols + 5] = 1e30;
        x[2 * cols..2 * cols + 32].fill(-127.0);
        x[3 * cols + 70] = f32::NAN;
        let reference = [QuantFormat::Q8_0, QuantFormat::Q4_0].contains(&format);
        let want = if reference {
            ref_matmul(&x, 4, &w)
        } else {
            Vec::new()
        };
        for level in SimdLevel::available() {
            assert!(force_simd_level(level));
            let ctx = ExecContext::new();
            let packed = ctx.repack_quant(&w).unwrap();
            let (mut out, mut in_place) = (vec![0.0; 4 * rows], vec![0.0; 4 * rows]);
            ctx.quant_matmul_packed(&x, 4, &packed, &mut out).unwrap();
            ctx.quant_matmul(&x, 4, &w, &mut in_place).unwrap();
            let what = format!("{} {}", format.name(), level.name());
            // the reference covers the finite rows; the NaN row is all NaN
            if reference {
                assert_eq!(bits(&out[..3 * rows]), bits(&want[..3 * rows]), "{what}");
            }
            // a NaN is a NaN on both paths; its payload is not promised (when
            // two NaNs meet, x86 passes on the one the compiler's operand order
            // names: a NaN weight scale's or the NaN activation scale's)
            assert_eq!(bits_nan_as_one(&out), bits_nan_as_one(&in_place), "{what}");
            assert!(out[3 * rows..].iter().all(|v| v.is_nan()), "{what}");
        }
        assert!(force_simd_level(best));
    }
}

/// A row read back from the repacked copy is the original row's values, bit
/// for bit (every row of full and partial strips); bad indices and lengths are
/// errors.
#[test]
fn packed_rows_dequantize_like_the_original() {
    let ctx = ExecContext::new();
    let (rows, cols) = (19, 96);
    for format in REPACKABLE {
        let q = ctx
            .quantize(format, rows, cols, &values(rows * cols, 12, 3.0))
            .unwrap();
        let p = ctx.repack_quant(&q.matrix()).unwrap();
        for r in 0..rows {
            let (mut a, mut b) = (vec![0.0; cols], vec![f32::NAN; cols]);
            q.matrix().dequantize_row(r, &mut a).unwrap();
            p.dequantize_row(r, &mut b).unwrap();
            assert_eq!(bits(&a), bits(&b), "{} row {r}", format.name());
        }
        let mut out = vec![0.0; cols];
        assert!(matches!(
            p.dequantize_row(rows, &mut out),
            Err(ExecError::IndexOutOfBounds {
                op: "PackedQuantMatrix::dequantize_row",
                ..
            })
        ));
        assert!(matches!(
            p.dequantize_row(0, &mut out[1..]),
            Err(ExecError::InvalidDataLength {
                op: "PackedQuantMatrix::dequantize_row",
                ..
            })
        ));
    }
}

#[test]
fn packed_bad_lengths_and_empty_products() {
    let ctx = ExecContext::new();
    let q = ctx
        .quantize(QuantFormat::Q4_0, 9, 64, &values(9 * 64, 1, 1.0))
        .unwrap();
    let p = ctx.repack_quant(&q.matrix()).unwrap();
    // two strips of eight rows: 64-byte aligned scales (2 blocks x 16 bytes,
    // padded to 64) and 2 x 128 value bytes each
    assert_eq!(p.size_bytes(), 2 * (64 + 2 * 128));
    let mut out = vec![7.0; 9];
    assert!(matches!(
        ctx.quant_matmul_packed(&[0.0; 63], 1, &p, &mut out),
        Err(ExecError::InvalidDataLength {
            op: "quant_matmul_packed",
            expected: 64,
            got: 63,
            ..
        })
    ));
    assert!(matches!(
        ctx.quant_matmul_packed(&[0.0; 64], 1, &p, &mut out[..8]),
        Err(ExecError::InvalidDataLength {
            op: "quant_matmul_packed",
            ..
        })
    ));
    assert_eq!(out, [7.0; 9], "unchanged on an error");
    let w = QuantMatrix::new(QuantFormat::Q8_0, 0, 64, &[]).unwrap();
    let p = ctx.repack_quant(&w).unwrap();
    assert_eq!(p.size_bytes(), 0);
    ctx.quant_matmul_packed(&[0.0; 128], 2, &p, &mut [])
        .unwrap();
    let w = QuantMatrix::new(QuantFormat::Q8_0, 3, 0, &[]).unwrap();
    let p = ctx.repack_quant(&w).unwrap();
    let mut out = [1.0; 6];
    ctx.quant_matmul_packed(&[], 2, &p, &mut out).unwrap();
    assert_eq!(out, [0.0; 6]);
}

/// Quantized weights never enter the context's right-hand-side cache: the
/// in-place product keeps nothing (a `Transient` weight), the repacked copy
/// is owned by its `PackedQuantMatrix`; and the rule that pooled storage
/// cannot be marked `StableProcess` still holds for the float products.
#[test]
fn nothing_is_cached_and_pooled_storage_is_never_stable() {
    let ctx = ExecContext::new();
    let q = ctx
        .quantize(QuantFormat::Q8_0, 8, 64, &values(8 * 64, 1, 1.0))
        .unwrap();
    let p = ctx.repack_quant(&q.matrix()).unwrap();
    let x = values(64, 2, 1.0);
    let mut out = vec![0.0; 8];
    ctx.quant_matmul(&x, 1, &q.matrix(), &mut out).unwrap();
    ctx.quant_matmul_packed(&x, 1, &p, &mut out).unwrap();
    assert_eq!(ctx.rhs_cache_len(), 0);
    let stable = MatmulOptions {
        rhs_lifetime: RhsLifetime::StableProcess,
    };
    let a = ctx.from_vec(&[1, 8], values(8, 3, 1.0)).unwrap();
    let pooled = ctx.zeros(&[8, 8]).unwrap();
    assert!(matches!(
        ctx.matmul_with(&a, &pooled, stable),
        Err(ExecError::UnstableRhs { op: "matmul" })
    ));
    assert_eq!(ctx.rhs_cache_len(), 0);
}

// ---------------------------------------------------------------- allocations

fn steady_state_allocates_nothing() {
    counting::check_the_counter();
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
            let (rows, cols) = (257, 512);
            let q = ctx
                .quantize(format, rows, cols, &values(rows * cols, 8, 1.0))
                .unwrap();
            let w = q.matrix();
            for m in [1usize, 8] {
                let x = values(m * cols, 9, 1.0);
                let mut out = vec![0.0; m * rows];
                ctx.quant_matmul(&x, m, &w, &mut out).unwrap();
                ctx.quant_matmul(&x, m, &w, &mut out).unwrap();
                let misses = ctx.pool().stats().misses;
                let before = ALLOCATIONS.load(Ordering::SeqCst);
                for _ in 0..5 {
                    ctx.quant_matmul(&x, m, &w, &mut out).unwrap();
                }
                let allocs = ALLOCATIONS.load(Ordering::SeqCst) - before;
                assert_eq!(
                    allocs,
                    0,
                    "heap allocations in 5 quant_matmul calls ({} m={m}, {threads} threads)",
                    format.name()
                );
                assert_eq!(ctx.pool().stats().misses, misses, "pool misses");
                let packed = ctx.repack_quant(&w).unwrap();
                ctx.quant_matmul_packed(&x, m, &packed, &mut out).unwrap();
                ctx.quant_matmul_packed(&x, m, &packed, &mut out).unwrap();
                let misses = ctx.pool().stats().misses;
                let before = ALLOCATIONS.load(Ordering::SeqCst);
                for _ in 0..5 {
                    ctx.quant_matmul_packed(&x, m, &packed, &mut out).unwrap();
                }
                let allocs = ALLOCATIONS.load(Ordering::SeqCst) - before;
                assert_eq!(
                    allocs,
                    0,
                    "heap allocations in 5 quant_matmul_packed calls ({} m={m}, {threads} threads)",
                    format.name()
                );
                assert_eq!(ctx.pool().stats().misses, misses, "pool misses (packed)");
            }
        }
    }
}

fn gemm_steady_state_allocates_nothing() {
    counting::check_the_counter();
    for threads in [1, 2, 3] {
        let ctx = ExecContext::with_threads(threads);
        for format in [QuantFormat::Q8_0, QuantFormat::Q5_1] {
            let (rows, cols) = (257, 512);
            let q = ctx
                .quantize(format, rows, cols, &values(rows * cols, 8, 1.0))
                .unwrap();
            let packed = ctx.repack_quant(&q.matrix()).unwrap();
            let m = 64;
            let x = values(m * cols, 9, 1.0);
            let mut out = vec![0.0; m * rows];
            ctx.quant_matmul_packed(&x, m, &packed, &mut out).unwrap();
            ctx.quant_matmul_packed(&x, m, &packed, &mut out).unwrap();
            let misses = ctx.pool().stats().misses;
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            for _ in 0..5 {
                ctx.quant_matmul_packed(&x, m, &packed, &mut out).unwrap();
            }
            let allocs = ALLOCATIONS.load(Ordering::SeqCst) - before;
            assert_eq!(
                allocs,
                0,
                "heap allocations in 5 prefill-sized quant_matmul_packed calls ({} m={m}, {threads} threads)",
                format.name()
            );
            assert_eq!(ctx.pool().stats().misses, misses, "pool misses (GEMM)");
        }
    }
}

#[test]
fn prefill_sized_packed_products_allocate_nothing_at_steady_state() {
    in_own_process(
        "prefill_sized_packed_products_allocate_nothing_at_steady_state",
        gemm_steady_state_allocates_nothing,
    );
}

#[test]
fn quant_matmul_allocates_nothing_at_steady_state() {
    in_own_process(
        "quant_matmul_allocates_nothing_at_steady_state",
        steady_state_allocates_nothing,
    );
}
