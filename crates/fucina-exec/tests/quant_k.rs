//! The super-block formats Q4_K and Q6_K (llama.cpp's layouts): hand-built
//! blocks against hand-computed values, quantize round-trip bounds, bad input,
//! `quant_matmul` against a scalar reference of the documented order (bit for
//! bit, every vector level, 1-4 threads, several batch sizes, arbitrary block
//! bytes), the accuracy against the f64 product of the dequantized weights, and
//! zero allocations at steady state.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes
#![allow(clippy::needless_range_loop)] // element indices name layout positions

use std::sync::atomic::Ordering;

use fucina_exec::{
    ExecContext, ExecError, QuantFormat, QuantMatrix, QuantizedWeights, SimdLevel,
    detected_simd_level, force_simd_level,
};
use fucina_storage::half::f16;

#[path = "../../fucina-thread/tests/support/counting.rs"]
mod counting;
#[path = "support/q8k.rs"]
mod q8k;
use counting::{ALLOCATIONS, Counting, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

const K_FORMATS: [QuantFormat; 2] = [QuantFormat::Q4_K, QuantFormat::Q6_K];

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

fn f16_val(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

// ------------------------------------------------------ the layouts, by hand

/// A Q4_K super-block from its parts: `q[j][k]` is element `k` of sub-block `j`
/// (a nibble), `sc`/`mn` the 6-bit scales and mins.
fn q4k_block(d: f32, dmin: f32, sc: [u8; 8], mn: [u8; 8], q: &[[u8; 32]; 8]) -> Vec<u8> {
    let mut b = vec![0u8; 144];
    b[0..2].copy_from_slice(&f16_bytes(d));
    b[2..4].copy_from_slice(&f16_bytes(dmin));
    // bytes 4..8: sc[0..4] in the low six bits, the top two bits of sc[4..8];
    // bytes 8..12: mn[0..4], the top two bits of mn[4..8];
    // bytes 12..16: low nibble = low four bits of sc[4..8], high nibble mn's.
    for j in 0..4 {
        b[4 + j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        b[8 + j] = mn[j] | ((mn[j + 4] >> 4) << 6);
        b[12 + j] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
    }
    // 32-byte group c: sub-block 2c in the low nibbles, 2c + 1 in the high.
    for c in 0..4 {
        for k in 0..32 {
            b[16 + 32 * c + k] = q[2 * c][k] | (q[2 * c + 1][k] << 4);
        }
    }
    b
}

/// The (scale, min, nibble) of element `e` of a Q4_K super-block.
fn q4k_parts(b: &[u8], e: usize) -> (u8, u8, u8) {
    let (j, k) = (e / 32, e % 32);
    let s = &b[4..16];
    let (sc, mn) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    };
    let byte = b[16 + 32 * (j / 2) + k];
    (sc, mn, if j % 2 == 0 { byte & 15 } else { byte >> 4 })
}

/// A Q6_K super-block from 256 unsigned 6-bit codes and 16 int8 scales.
fn q6k_block(d: f32, scales: [i8; 16], q: &[u8; 256]) -> Vec<u8> {
    let mut b = vec![0u8; 210];
    for half in 0..2 {
        for l in 0..32 {
            let e = |g: usize| q[128 * half + 32 * g + l];
            b[64 * half + l] = (e(0) & 15) | ((e(2) & 15) << 4);
            b[64 * half + 32 + l] = (e(1) & 15) | ((e(3) & 15) << 4);
            b[128 + 32 * half + l] =
                (e(0) >> 4) | ((e(1) >> 4) << 2) | ((e(2) >> 4) << 4) | ((e(3) >> 4) << 6);
        }
    }
    for (i, &s) in scales.iter().enumerate() {
        b[192 + i] = s as u8;
    }
    b[208..210].copy_from_slice(&f16_bytes(d));
    b
}

/// The (scale, code) of element `e` of a Q6_K super-block.
fn q6k_parts(b: &[u8], e: usize) -> (i8, u8) {
    let (half, w) = (e / 128, e % 128);
    let (g, l) = (w / 32, w % 32);
    let ql = b[64 * half + 32 * (g & 1) + l];
    let lo = if g < 2 { ql & 15 } else { ql >> 4 };
    let hi = (b[128 + 32 * half + l] >> (2 * g)) & 3;
    (b[192 + e / 16] as i8, lo | (hi << 4))
}

#[test]
fn q4_k_hand_built_block_dequantizes_to_hand_values() {
    // scales and mins above 15 in sub-blocks 4..8 exercise the split bits
    let sc = [1u8, 2, 3, 63, 17, 33, 48, 5];
    let mn = [0u8, 1, 2, 3, 40, 50, 61, 7];
    let mut q = [[0u8; 32]; 8];
    for (j, qj) in q.iter_mut().enumerate() {
        for (k, v) in qj.iter_mut().enumerate() {
            *v = ((k + 3 * j) % 16) as u8;
        }
    }
    let blk = q4k_block(0.5, 0.25, sc, mn, &q);
    let ctx = ExecContext::new();
    let w = QuantMatrix::new(QuantFormat::Q4_K, 1, 256, &blk).unwrap();
    let mut out = vec![0.0; 256];
    ctx.dequantize(&w, &mut out).unwrap();
    for e in 0..256 {
        let (j, k) = (e / 32, e % 32);
        let want = 0.5 * f32::from(sc[j]) * f32::from(q[j][k]) - 0.25 * f32::from(mn[j]);
        assert_eq!(out[e], want, "element {e}");
    }
    // by hand: sub-block 3, element 0: q = 9, 0.5·63·9 − 0.25·3 = 282.75
    assert_eq!(out[96], 282.75);
    // sub-block 6, element 1: q = (1 + 18) % 16 = 3, 0.5·48·3 − 0.25·61 = 56.75
    assert_eq!(out[6 * 32 + 1], 56.75);
    // sub-block 5, element 31: q = (31 + 15) % 16 = 14, 0.5·33·14 − 0.25·50 = 218.5
    assert_eq!(out[5 * 32 + 31], 218.5);
    // the packed scale bytes, by hand: byte 4 = sc[0] | (sc[4] >> 4) << 6 = 1 | 64
    assert_eq!(blk[4], 65);
    // byte 12 = (sc[4] & 15) | (mn[4] & 15) << 4 = 1 | 8 << 4
    assert_eq!(blk[12], 0x81);
    // row reads agree
    let mut row = vec![0.0; 256];
    w.dequantize_row(0, &mut row).unwrap();
    assert_eq!(bits(&row), bits(&out));
}

#[test]
fn q6_k_hand_built_block_dequantizes_to_hand_values() {
    let scales = [
        1i8, -2, 3, -128, 127, 0, 5, -7, 9, 11, -13, 64, -64, 2, 1, -1,
    ];
    let mut q = [0u8; 256];
    for (e, v) in q.iter_mut().enumerate() {
        *v = ((e * 7 + e / 64) % 64) as u8;
    }
    let blk = q6k_block(0.25, scales, &q);
    let w = QuantMatrix::new(QuantFormat::Q6_K, 1, 256, &blk).unwrap();
    let mut out = vec![0.0; 256];
    w.dequantize_row(0, &mut out).unwrap();
    for e in 0..256 {
        let want = 0.25 * f32::from(scales[e / 16]) * (f32::from(q[e]) - 32.0);
        assert_eq!(out[e], want, "element {e}");
        assert_eq!(q6k_parts(&blk, e), (scales[e / 16], q[e]), "element {e}");
    }
    // by hand: element 50 (group 3, scale -128): q = 350 % 64 = 30, 0.25·-128·(30 − 32) = 64
    assert_eq!(out[50], 64.0);
    // element 200 (group 12, scale -64): q = (1400 + 3) % 64 = 59, 0.25·-64·27 = -432
    assert_eq!(out[200], -432.0);
    // element 0: q = 0, scale 1: 0.25·1·-32 = -8
    assert_eq!(out[0], -8.0);
}

// ------------------------------------------------------------ round trips

#[test]
fn round_trip_errors_are_within_the_format_bounds() {
    let ctx = ExecContext::with_threads(2);
    let (rows, cols) = (9, 1024);
    // offset values (mins matter), a zero super-block, a super-block whose
    // sub-blocks differ in range by 1000x
    let mut w: Vec<f32> = values(rows * cols, 7, 3.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v + if (i / 256) % 3 == 1 { 2.0 } else { 0.0 })
        .collect();
    w[256..512].fill(0.0);
    for (i, v) in w[512..768].iter_mut().enumerate() {
        *v *= if i < 32 { 1.0 } else { 1e-3 };
    }
    for format in K_FORMATS {
        let q = ctx.quantize(format, rows, cols, &w).unwrap();
        assert_eq!(q.bytes().len(), rows * cols / 256 * format.block_bytes());
        let mut back = vec![0.0; rows * cols];
        ctx.dequantize(&q.matrix(), &mut back).unwrap();
        for (sbi, ((xb, yb), blk)) in w
            .chunks(256)
            .zip(back.chunks(256))
            .zip(q.bytes().chunks(format.block_bytes()))
            .enumerate()
        {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for (e, (&x, &y)) in xb.iter().zip(yb).enumerate() {
                // interior: half a step; at the ends of a group's range: the
                // 6- or 8-bit coding of its scale (and min) also counts
                let bound = match format {
                    QuantFormat::Q4_K => {
                        let (d, dmin) = (f16_val(&blk[0..]), f16_val(&blk[2..]));
                        let (sc, _, _) = q4k_parts(blk, e);
                        0.5 * d * f32::from(sc) + 0.5 * dmin + 7.5 * d
                    }
                    _ => {
                        let d = f16_val(&blk[208..]);
                        let (sc, _) = q6k_parts(blk, e);
                        (d * f32::from(sc)).abs() + 32.0 * d.abs()
                    }
                } + 1e-6 * amax;
                assert!(
                    (x - y).abs() <= bound,
                    "{} super-block {sbi} elem {e}: {x} -> {y} (bound {bound})",
                    format.name()
                );
            }
            if xb.iter().all(|&v| v == 0.0) {
                assert!(yb.iter().all(|&v| v == 0.0), "zeros stay zeros");
            }
        }
        // the relative RMS error is that of a 4- or 6-bit code
        let (mut se, mut sx) = (0.0f64, 0.0f64);
        for (x, y) in w.iter().zip(&back) {
            se += f64::from(x - y).powi(2);
            sx += f64::from(*x).powi(2);
        }
        let rel = (se / sx).sqrt();
        let limit = if format == QuantFormat::Q4_K {
            0.08
        } else {
            0.02
        };
        assert!(rel < limit, "{}: relative RMS error {rel}", format.name());
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
    for format in K_FORMATS {
        assert_eq!(format.block_elements(), 256);
        assert!(!format.repackable());
        let bb = format.block_bytes();
        // 128 columns: a multiple of 32 but not of 256
        let e = ctx.quantize(format, 2, 128, &[0.0; 256]).unwrap_err();
        assert!(
            matches!(e, ExecError::InvalidArgument { op: "quantize", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("256"), "{e}");
        assert!(matches!(
            ctx.quantize(format, 1, 256, &[0.0; 255]),
            Err(ExecError::InvalidDataLength {
                op: "quantize",
                expected: 256,
                got: 255,
                ..
            })
        ));
        let bytes = vec![0u8; 2 * bb];
        assert!(matches!(
            QuantMatrix::new(format, 2, 128, &bytes),
            Err(ExecError::InvalidArgument {
                op: "QuantMatrix::new",
                ..
            })
        ));
        let (want, got) = (2 * bb, 2 * bb - 1);
        assert!(matches!(
            QuantMatrix::new(format, 2, 256, &bytes[..got]),
            Err(ExecError::InvalidDataLength {
                op: "QuantMatrix::new",
                expected,
                got: g,
                ..
            }) if expected == want && g == got
        ));
        assert!(matches!(
            QuantMatrix::new(format, usize::MAX, 256, &bytes),
            Err(ExecError::Overflow { .. })
        ));
        assert!(QuantizedWeights::from_bytes(format, 3, 256, bytes.clone()).is_err());
        let w = QuantMatrix::new(format, 2, 256, &bytes).unwrap();
        let mut out = [7.0f32; 4];
        assert!(matches!(
            ctx.quant_matmul(&[0.0; 511], 2, &w, &mut out),
            Err(ExecError::InvalidDataLength {
                op: "quant_matmul",
                expected: 512,
                ..
            })
        ));
        assert!(matches!(
            ctx.quant_matmul(&[0.0; 512], 2, &w, &mut out[..3]),
            Err(ExecError::InvalidDataLength {
                op: "quant_matmul",
                ..
            })
        ));
        assert_eq!(out, [7.0; 4], "nothing written on error");
        assert!(matches!(
            w.dequantize_row(2, &mut [0.0; 256]),
            Err(ExecError::IndexOutOfBounds { .. })
        ));
        assert!(matches!(
            w.dequantize_row(0, &mut [0.0; 255]),
            Err(ExecError::InvalidDataLength { .. })
        ));
        assert!(matches!(
            ctx.dequantize(&w, &mut [0.0; 511]),
            Err(ExecError::InvalidDataLength {
                op: "dequantize",
                ..
            })
        ));
        assert!(matches!(
            ctx.repack_quant(&w),
            Err(ExecError::InvalidArgument {
                op: "repack_quant",
                ..
            })
        ));
    }
}

// ------------------------------------------------------------- the product

/// The documented order (`support/q8k.rs`) with Q4_K's parts (scale, min,
/// nibble per sub-block of 32) or Q6_K's (scale per group of 16, code − 32).
fn ref_dot(w: &QuantMatrix<'_>, r: usize, xq: &[i8], xd: &[f32]) -> f32 {
    let bb = w.format().block_bytes();
    let row = &w.bytes()[r * w.row_bytes()..(r + 1) * w.row_bytes()];
    let blk = |b: usize| &row[b * bb..(b + 1) * bb];
    match w.format() {
        QuantFormat::Q4_K => q8k::q8k_dot(
            xq,
            xd,
            |b| (f16_val(&blk(b)[0..]), Some(f16_val(&blk(b)[2..]))),
            |b, e| {
                let (sc, mn, q) = q4k_parts(blk(b), e);
                (i32::from(sc), i32::from(mn), i32::from(q))
            },
        ),
        _ => q8k::q8k_dot(
            xq,
            xd,
            |b| (f16_val(&blk(b)[208..]), None),
            |b, e| {
                let (sc, q) = q6k_parts(blk(b), e);
                (i32::from(sc), 0, i32::from(q) - 32)
            },
        ),
    }
}

fn ref_matmul(x: &[f32], m: usize, w: &QuantMatrix<'_>) -> Vec<f32> {
    let mut out = vec![0.0; m * w.rows()];
    for i in 0..m {
        let (xq, xd) = q8k::q8k_acts(&x[i * w.cols()..(i + 1) * w.cols()]);
        for j in 0..w.rows() {
            out[i * w.rows() + j] = ref_dot(w, j, &xq, &xd);
        }
    }
    out
}

const MS: [usize; 6] = [1, 2, 3, 5, 8, 17];

/// Every vector level this CPU has, 1-4 threads, batch sizes
/// {1, 2, 3, 5, 8, 17}, odd row counts: the reference's bits. The reference
/// computes each activation row alone, so this also shows that a row does not
/// depend on the rest of the batch.
#[test]
fn every_path_matches_the_reference_bit_for_bit() {
    let best = detected_simd_level();
    let shapes = [(13usize, 256usize), (4, 512), (1, 768), (6, 1024)];
    for format in K_FORMATS {
        for (si, &(rows, cols)) in shapes.iter().enumerate() {
            let w = values(rows * cols, 11 + si as u64, 0.5);
            let w: Vec<f32> = w.iter().map(|v| v + 0.2).collect(); // nonzero mins
            let q = ExecContext::new().quantize(format, rows, cols, &w).unwrap();
            let wm = q.matrix();
            let x = values(17 * cols, 99 + si as u64, 2.0);
            let want: Vec<Vec<f32>> = MS
                .iter()
                .map(|&m| ref_matmul(&x[..m * cols], m, &wm))
                .collect();
            for level in SimdLevel::available() {
                assert!(force_simd_level(level));
                for threads in 1..=4 {
                    let ctx = ExecContext::with_threads(threads);
                    for (mi, &m) in MS.iter().enumerate() {
                        let mut out = vec![f32::NAN; m * rows];
                        ctx.quant_matmul(&x[..m * cols], m, &wm, &mut out).unwrap();
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

/// Weights with arbitrary bytes (any nibble, code, 6-bit scale and min, int8
/// scales of -128, negative super-block scales) and activations at the edges
/// (a zero block, a single huge value, a block of -127): the reference's bits
/// on every path.
#[test]
fn arbitrary_block_bytes_match_the_reference() {
    let best = detected_simd_level();
    let (rows, cols) = (9, 512);
    for format in K_FORMATS {
        let bb = format.block_bytes();
        let n = rows * cols / 256 * bb;
        let mut bytes: Vec<u8> = (0..n as u64)
            .map(|i| (fucina_exec::rng::at(5, i) >> 56) as u8)
            .collect();
        for (b, blk) in bytes.chunks_mut(bb).enumerate() {
            let v = values(2, 1000 + b as u64, 2.0);
            match format {
                QuantFormat::Q4_K => {
                    blk[0..2].copy_from_slice(&f16_bytes(v[0]));
                    blk[2..4].copy_from_slice(&f16_bytes(v[1]));
                }
                _ => {
                    blk[208..210].copy_from_slice(&f16_bytes(v[0]));
                    if b % 3 == 0 {
                        blk[192..208].fill(0x80); // -128 everywhere
                    }
                }
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
            for threads in [1, 3] {
                let mut out = vec![0.0; 3 * rows];
                ExecContext::with_threads(threads)
                    .quant_matmul(&x, 3, &w, &mut out)
                    .unwrap();
                assert_eq!(
                    bits(&out),
                    bits(&want),
                    "{} {} threads={threads}",
                    format.name(),
                    level.name()
                );
            }
        }
        assert!(force_simd_level(best));
    }
}

/// Prefill-sized calls (the GEMMs over tiles of 16 weight rows: from
/// `m` = 8 at AVX-512 VNNI, 16 at AVX2; `m` = 7, 8, 9 below or at the
/// switches); 37 rows make a partial last tile, 6 super-blocks a chunk of
/// four and one of two at AVX-512, three of two at AVX2; on quantized and
/// arbitrary blocks (any code, scale and min, int8 scales of −128, negative
/// super-block scales), with a zero, a huge and a −127 activation block: the
/// reference's bits at every level, thread count and batch size.
#[test]
fn gemm_sized_calls_match_the_reference_bit_for_bit() {
    let best = detected_simd_level();
    let (rows, cols, m) = (37usize, 1536usize, 43usize);
    for format in K_FORMATS {
        let w: Vec<f32> = values(rows * cols, 31, 0.5)
            .iter()
            .map(|v| v + 0.2)
            .collect();
        let q = ExecContext::new().quantize(format, rows, cols, &w).unwrap();
        let bb = format.block_bytes();
        let mut arbitrary: Vec<u8> = (0..(rows * cols / 256 * bb) as u64)
            .map(|i| (fucina_exec::rng::at(7, i) >> 56) as u8)
            .collect();
        for (b, blk) in arbitrary.chunks_mut(bb).enumerate() {
            let v = values(2, 2000 + b as u64, 2.0);
            match format {
                QuantFormat::Q4_K => {
                    blk[0..2].copy_from_slice(&f16_bytes(v[0]));
                    blk[2..4].copy_from_slice(&f16_bytes(v[1]));
                }
                _ => {
                    blk[208..210].copy_from_slice(&f16_bytes(v[0]));
                    if b % 3 == 0 {
                        blk[192..208].fill(0x80);
                    }
                }
            }
        }
        let mut x = values(m * cols, 77, 2.0);
        x[3 * cols..3 * cols + 256].fill(0.0);
        x[5 * cols + 7] = 1e30;
        x[9 * cols + 256..9 * cols + 512].fill(-127.0);
        for bytes in [q.bytes(), &arbitrary[..]] {
            let wm = QuantMatrix::new(format, rows, cols, bytes).unwrap();
            let want = ref_matmul(&x, m, &wm);
            for level in SimdLevel::available() {
                assert!(force_simd_level(level));
                for threads in 1..=3 {
                    let ctx = ExecContext::with_threads(threads);
                    for mm in [7, 8, 9, 16, m] {
                        let mut out = vec![f32::NAN; mm * rows];
                        ctx.quant_matmul(&x[..mm * cols], mm, &wm, &mut out)
                            .unwrap();
                        assert_eq!(
                            bits(&out),
                            bits(&want[..mm * rows]),
                            "{} m={mm} level={} threads={threads}",
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

/// Weight row counts that leave a tile of 16 with 1, 9 or 15 rows (and a
/// single row), an odd number of super-blocks (a partial chunk at every
/// level), `m` around the GEMM switches (8 at AVX-512 VNNI, 16 at AVX2):
/// the reference's bits at every level.
#[test]
fn odd_tiles_around_the_gemm_switch_match_the_reference() {
    let best = detected_simd_level();
    let cols = 768;
    for format in K_FORMATS {
        for rows in [1usize, 9, 15, 33] {
            let w: Vec<f32> = values(rows * cols, 51 + rows as u64, 0.5)
                .iter()
                .map(|v| v + 0.2)
                .collect();
            let q = ExecContext::new().quantize(format, rows, cols, &w).unwrap();
            let wm = q.matrix();
            let x = values(17 * cols, 53, 2.0);
            let want = ref_matmul(&x, 17, &wm);
            for level in SimdLevel::available() {
                assert!(force_simd_level(level));
                let ctx = ExecContext::with_threads(2);
                for m in (6..=12).chain(15..=17) {
                    let mut out = vec![f32::NAN; m * rows];
                    ctx.quant_matmul(&x[..m * cols], m, &wm, &mut out).unwrap();
                    assert_eq!(
                        bits(&out),
                        bits(&want[..m * rows]),
                        "{} rows={rows} m={m} level={}",
                        format.name(),
                        level.name()
                    );
                }
            }
            assert!(force_simd_level(best));
        }
    }
}

#[test]
fn non_finite_activations_give_nan_rows_only() {
    let ctx = ExecContext::new();
    for format in K_FORMATS {
        let q = ctx.quantize(format, 4, 256, &values(1024, 4, 1.0)).unwrap();
        let mut x = values(512, 5, 1.0);
        x[40] = f32::INFINITY;
        let mut out = vec![0.0; 8];
        ctx.quant_matmul(&x, 2, &q.matrix(), &mut out).unwrap();
        assert!(out[..4].iter().all(|v| v.is_nan()), "{out:?}");
        assert!(out[4..].iter().all(|v| v.is_finite()), "{out:?}");
    }
}

/// `|y − Σ x̂ ŵ| ≤ Σ |ŵ| |x − x̂| + ε` against the f64 product of the
/// dequantized weights `ŵ` and the f32 activations: the activations' int8
/// rounding (per block of 256) plus the f32 rounding of the fixed order (each
/// super-block adds a rounded scale product, a rounded integer and a fused
/// multiply-add, Q4_K's min term three more), `ε = (nb + 8) · 2^−22 · Σ |x̂ ŵ|`
/// with `nb = cols / 32` (generously).
#[test]
fn accuracy_against_the_dequantized_product_is_within_the_bound() {
    let ctx = ExecContext::with_threads(2);
    let (rows, cols, m) = (32, 2048, 3);
    let w: Vec<f32> = values(rows * cols, 21, 0.1)
        .iter()
        .map(|v| v + 0.03)
        .collect();
    let x = values(m * cols, 22, 1.0);
    for format in K_FORMATS {
        let q = ctx.quantize(format, rows, cols, &w).unwrap();
        let mut wq = vec![0.0; rows * cols];
        ctx.dequantize(&q.matrix(), &mut wq).unwrap();
        let mut out = vec![0.0; m * rows];
        ctx.quant_matmul(&x, m, &q.matrix(), &mut out).unwrap();
        let mut worst = 0.0f64;
        for i in 0..m {
            let xi = &x[i * cols..(i + 1) * cols];
            let (xq, xd) = q8k::q8k_acts(xi);
            for j in 0..rows {
                let wqj = &wq[j * cols..(j + 1) * cols];
                let (mut exact, mut bound, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                for k in 0..cols {
                    let xhat = f64::from(xq[k]) * f64::from(xd[k / 256]);
                    exact += f64::from(xi[k]) * f64::from(wqj[k]);
                    bound += f64::from(wqj[k]).abs() * (f64::from(xi[k]) - xhat).abs();
                    mag += (xhat * f64::from(wqj[k])).abs();
                }
                bound += (cols / 32 + 8) as f64 * 2f64.powi(-22) * mag;
                let err = (f64::from(out[i * rows + j]) - exact).abs();
                assert!(
                    err <= bound,
                    "{} ({i},{j}): error {err} above bound {bound}",
                    format.name()
                );
                worst = worst.max(err / mag.max(1e-30));
            }
        }
        assert!(worst > 0.0, "the activations' rounding changes something");
    }
}

// ------------------------------------------------------------- allocations

fn steady_state_allocates_nothing() {
    counting::check_the_counter();
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        for format in K_FORMATS {
            let (rows, cols) = (67, 512);
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
            }
        }
    }
}

#[test]
fn quant_matmul_k_allocates_nothing_at_steady_state() {
    in_own_process(
        "quant_matmul_k_allocates_nothing_at_steady_state",
        steady_state_allocates_nothing,
    );
}
