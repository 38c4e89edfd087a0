//! The block formats Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS
//! (llama.cpp's layouts): each
//! element of arbitrary blocks decoded by hand from the layout against
//! `dequantize`, quantize round-trip bounds, bad input, and `quant_matmul`
//! against a scalar reference of the documented order (bit for bit, every
//! vector level, 1-4 threads, batch sizes 1..=9, extreme codes and
//! activations; the reference computes each activation row alone, so a row
//! does not depend on the rest of the batch) and, for the formats with vector
//! kernels, against the f64 product within a derived bound.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes
#![allow(clippy::needless_range_loop)] // element indices name layout positions

use fucina_exec::{
    ExecContext, ExecError, QuantFormat, QuantMatrix, SimdLevel, TensorFormat, detected_simd_level,
    force_simd_level,
};
use fucina_storage::half::f16;

#[path = "support/q8k.rs"]
mod q8k;

const FORMATS: [QuantFormat; 8] = [
    QuantFormat::Q4_1,
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Q2_K,
    QuantFormat::Q3_K,
    QuantFormat::Q5_K,
    QuantFormat::IQ4_NL,
    QuantFormat::IQ4_XS,
];

/// llama.cpp's `kvalues_iq4nl`.
const KV: [i32; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Deterministic pseudo-random values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let u = (fucina_exec::rng::at(seed, i) >> 40) as f32 / (1u64 << 24) as f32;
            scale * (2.0 * u - 1.0)
        })
        .collect()
}

fn f16_val(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Arbitrary blocks: random bytes, with every f16 field set to a normal value
/// of moderate size (either sign).
fn random_blocks(format: QuantFormat, n: usize, seed: u64) -> Vec<u8> {
    let bb = format.block_bytes();
    let mut b: Vec<u8> = (0..(n * bb) as u64)
        .map(|i| (fucina_exec::rng::at(seed, i) >> 33) as u8)
        .collect();
    let f16_fields: &[usize] = match format {
        QuantFormat::Q5_0 | QuantFormat::IQ4_NL | QuantFormat::IQ4_XS => &[0],
        QuantFormat::Q2_K => &[80, 82],
        QuantFormat::Q3_K => &[108],
        _ => &[0, 2],
    };
    for (k, blk) in b.chunks_mut(bb).enumerate() {
        for (f, &o) in f16_fields.iter().enumerate() {
            let v = ((k * 7 + f * 3) % 11) as f32 / 64.0 + 0.01;
            let v = if (k + f) % 3 == 0 { -v } else { v };
            blk[o..o + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
        }
    }
    b
}

// ------------------------------------------------------ the layouts, by hand

/// The 6-bit scale and min of sub-block `j` from a K header's 12 bytes.
fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q3_K's 6-bit scale code of group `g` (llama.cpp's unpacking of the 12
/// scale bytes into 16 codes).
fn q3k_ls(blk: &[u8], g: usize) -> i32 {
    let sb = &blk[96..108];
    let word = |i: usize| u32::from_le_bytes([sb[i], sb[i + 1], sb[i + 2], sb[i + 3]]);
    let (a0, a1, a2) = (word(0), word(4), word(8));
    let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let r = [
        (a0 & k2) | ((a2 & k1) << 4),
        (a1 & k2) | (((a2 >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((a2 >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((a2 >> 6) & k1) << 4),
    ];
    ((r[g / 4] >> (8 * (g % 4))) & 0xff) as i32
}

/// IQ4_XS's 6-bit scale code of sub-block `j`: a nibble of scales_l, two bits
/// of scales_h.
fn iq4xs_ls(blk: &[u8], j: usize) -> i32 {
    let h = u16::from_le_bytes([blk[2], blk[3]]);
    i32::from((blk[4 + j / 2] >> (4 * (j % 2))) & 15) | (i32::from((h >> (2 * j)) & 3) << 4)
}

/// `(weight scale, weight offset, integer value)` of element `e` of a block:
/// the weight is `scale · value + offset` (offset `−dmin · mn` for Q5_K).
fn parts(format: QuantFormat, blk: &[u8], e: usize) -> (f32, f32, i32) {
    match format {
        QuantFormat::Q4_1 => {
            let byte = blk[4 + e % 16];
            let n = if e < 16 { byte & 15 } else { byte >> 4 };
            (f16_val(blk), f16_val(&blk[2..]), i32::from(n))
        }
        QuantFormat::Q5_0 | QuantFormat::Q5_1 => {
            let o = if format == QuantFormat::Q5_0 { 2 } else { 4 };
            let qh = u32::from_le_bytes([blk[o], blk[o + 1], blk[o + 2], blk[o + 3]]);
            let byte = blk[o + 4 + e % 16];
            let lo = if e < 16 { byte & 15 } else { byte >> 4 };
            let q = i32::from(lo) | (((qh >> e) & 1) as i32) << 4;
            if format == QuantFormat::Q5_0 {
                (f16_val(blk), 0.0, q - 16)
            } else {
                (f16_val(blk), f16_val(&blk[2..]), q)
            }
        }
        QuantFormat::Q2_K => {
            // scales[e / 16]: low nibble the scale, high the min; the 2-bit
            // code of run j of half h in bits 2j of byte 16 + 32 h + l
            let (h, w) = (e / 128, e % 128);
            let q = (blk[16 + 32 * h + w % 32] >> (2 * (w / 32))) & 3;
            let sm = blk[e / 16];
            let d = f16_val(&blk[80..]) * f32::from(sm & 15);
            let m = f16_val(&blk[82..]) * f32::from(sm >> 4);
            (d, -m, i32::from(q))
        }
        QuantFormat::Q3_K => {
            let (h, w) = (e / 128, e % 128);
            let (j, l) = (w / 32, w % 32);
            let low = i32::from((blk[32 + 32 * h + l] >> (2 * j)) & 3);
            let high = (blk[l] >> (4 * h + j)) & 1;
            let q = if high == 1 { low } else { low - 4 };
            (
                f16_val(&blk[108..]) * (q3k_ls(blk, e / 16) - 32) as f32,
                0.0,
                q,
            )
        }
        QuantFormat::IQ4_NL => {
            let byte = blk[2 + e % 16];
            let n = if e < 16 { byte & 15 } else { byte >> 4 };
            (f16_val(blk), 0.0, KV[usize::from(n)])
        }
        QuantFormat::IQ4_XS => {
            // sub-block j's 16 bytes at 8 + 16 j; its 6-bit scale from
            // scales_l (a nibble per sub-block) and scales_h (2 bits each)
            let (j, k) = (e / 32, e % 32);
            let byte = blk[8 + 16 * j + k % 16];
            let n = if k < 16 { byte & 15 } else { byte >> 4 };
            (
                f16_val(blk) * (iq4xs_ls(blk, j) - 32) as f32,
                0.0,
                KV[usize::from(n)],
            )
        }
        _ => {
            // Q5_K: sub-block j, element k; nibbles as Q4_K's at 48.., the
            // fifth bit is bit j of qh[k] at 16..
            let (j, k) = (e / 32, e % 32);
            let (sc, mn) = k_scale_min(&blk[4..16], j);
            let byte = blk[48 + 32 * (j / 2) + k];
            let lo = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
            let q = i32::from(lo) | (i32::from((blk[16 + k] >> j) & 1) << 4);
            let d = f16_val(blk) * f32::from(sc);
            let m = f16_val(&blk[2..]) * f32::from(mn);
            (d, -m, q)
        }
    }
}

#[test]
fn arbitrary_blocks_dequantize_as_the_layout_says() {
    let ctx = ExecContext::new();
    for format in FORMATS {
        let (rows, cols) = (3, 512);
        let bytes = random_blocks(format, rows * cols / format.block_elements(), 5);
        let w = QuantMatrix::new(format, rows, cols, &bytes).unwrap();
        let mut out = vec![0.0f32; rows * cols];
        ctx.dequantize(&w, &mut out).unwrap();
        let bb = format.block_bytes();
        let be = format.block_elements();
        for (i, &o) in out.iter().enumerate() {
            let blk = &bytes[i / be * bb..][..bb];
            let (s, off, q) = parts(format, blk, i % be);
            // Q5_0 and the IQ4 formats are a product alone (a zero value
            // keeps the sign of `d`); the others add their offset
            let want = if matches!(
                format,
                QuantFormat::Q5_0 | QuantFormat::Q3_K | QuantFormat::IQ4_NL | QuantFormat::IQ4_XS
            ) {
                s * q as f32
            } else {
                s * q as f32 + off
            };
            assert_eq!(o.to_bits(), want.to_bits(), "{} element {i}", format.name());
        }
    }
}

#[test]
fn the_table_knows_the_formats_by_ggml_code() {
    for (format, code) in [
        (QuantFormat::Q4_1, 3),
        (QuantFormat::Q5_0, 6),
        (QuantFormat::Q5_1, 7),
        (QuantFormat::Q5_K, 13),
        (QuantFormat::Q2_K, 10),
        (QuantFormat::Q3_K, 11),
        (QuantFormat::IQ4_NL, 20),
        (QuantFormat::IQ4_XS, 23),
    ] {
        let t = TensorFormat::from_ggml_code(code).unwrap();
        assert_eq!(t.quant(), Some(format));
        assert_eq!(t.block(), (format.block_elements(), format.block_bytes()));
    }
    assert_eq!(QuantFormat::Q4_1.block_bytes(), 20);
    assert_eq!(QuantFormat::Q5_0.block_bytes(), 22);
    assert_eq!(QuantFormat::Q5_1.block_bytes(), 24);
    assert_eq!(QuantFormat::Q5_K.block_bytes(), 176);
    assert_eq!(QuantFormat::Q2_K.block_bytes(), 84);
    assert_eq!(QuantFormat::Q3_K.block_bytes(), 110);
    assert_eq!(QuantFormat::IQ4_NL.block_bytes(), 18);
    assert_eq!(QuantFormat::IQ4_XS.block_bytes(), 136);
}

/// Each value comes back within the format's step: for the blocks of 32 half
/// a step plus the f16 rounding of the scale and min; for Q5_K the bound of
/// its coded 6-bit scales and mins.
#[test]
fn round_trip_errors_are_within_the_format_bounds() {
    let ctx = ExecContext::new();
    for format in FORMATS {
        let (rows, cols) = (4, 1024);
        let w: Vec<f32> = values(rows * cols, 3, 1.0)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1.0 + (i / 256) as f32) + 0.3)
            .collect();
        let q = ctx.quantize(format, rows, cols, &w).unwrap();
        let mut back = vec![0.0; rows * cols];
        ctx.dequantize(&q.matrix(), &mut back).unwrap();
        let be = format.block_elements();
        for (b, (xs, ys)) in w.chunks(be).zip(back.chunks(be)).enumerate() {
            let amax_b = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let bound = match format {
                QuantFormat::Q2_K => {
                    // half a step of 3 per group, the 4-bit coding of the
                    // scale (half a code of d = max step / 15, 3 codes) and
                    // of the min: bounded by a whole step and a min code
                    let (mut step, mut min) = (0.0f32, 0.0f32);
                    for s in xs.chunks(16) {
                        let lo = s.iter().fold(0.0f32, |a, &v| a.min(v));
                        let hi = s.iter().fold(lo, |a, &v| a.max(v));
                        step = step.max((hi - lo) / 3.0);
                        min = min.max(-lo);
                    }
                    step + min / 15.0
                }
                QuantFormat::Q3_K => {
                    // a value opposite the group's largest is clipped by a
                    // step (codes −4..=3); the 6-bit scale is off by up to
                    // half a code of the largest group scale, times 4
                    1.1 * amax_b / 4.0 + amax_b / 512.0
                }
                QuantFormat::IQ4_NL | QuantFormat::IQ4_XS => {
                    // d = amax / 127 takes the largest magnitude to the
                    // table's −127 exactly; the other end of the table is 113,
                    // so a value opposite it is clipped by up to 14 steps
                    // (more than half the widest gap, 23). IQ4_XS: each
                    // sub-block's scale is coded in 6 bits against the largest,
                    // off by up to half a code, amax / 64 at the table's end.
                    let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    let coded = if format == QuantFormat::IQ4_XS {
                        1.02 * 14.0 * amax / 127.0 + amax / 64.0
                    } else {
                        14.0 * amax / 127.0
                    };
                    coded + amax / 512.0
                }
                QuantFormat::Q5_K => {
                    let (mut step, mut min) = (0.0f32, 0.0f32);
                    for s in xs.chunks(32) {
                        let lo = s.iter().fold(0.0f32, |a, &v| a.min(v));
                        let hi = s.iter().fold(lo, |a, &v| a.max(v));
                        step = step.max((hi - lo) / 31.0);
                        min = min.max(-lo);
                    }
                    step + min / 63.0
                }
                _ => {
                    let lo = xs.iter().fold(f32::MAX, |a, &v| a.min(v));
                    let hi = xs.iter().fold(f32::MIN, |a, &v| a.max(v));
                    let amax = lo.abs().max(hi.abs());
                    let step = match format {
                        QuantFormat::Q4_1 => (hi - lo) / 15.0,
                        QuantFormat::Q5_1 => (hi - lo) / 31.0,
                        _ => amax / 16.0,
                    };
                    // half a step (Q5_0: a whole one, as its codes run from
                    // −16 to 15 steps and a value opposite the largest one is
                    // clipped), plus the f16 rounding of d (up to 31 steps
                    // away) and of the min
                    let half = if format == QuantFormat::Q5_0 {
                        1.0
                    } else {
                        0.5
                    };
                    half * step + 32.0 * step / 2048.0 + amax / 2048.0
                }
            };
            for (k, (&x, &y)) in xs.iter().zip(ys).enumerate() {
                assert!(
                    (x - y).abs() <= bound * 1.0001,
                    "{} block {b} elem {k}: {x} -> {y} (bound {bound})",
                    format.name()
                );
            }
        }
    }
}

/// Column counts that are not whole blocks, byte lengths that are not the
/// matrix's, and the documented handling of a NaN scale (the products that
/// read that block are NaN; nothing panics).
#[test]
fn bad_input_is_an_error_and_a_nan_scale_gives_nan() {
    let ctx = ExecContext::new();
    for format in FORMATS {
        let be = format.block_elements();
        let e = ctx
            .quantize(format, 1, be + 16, &vec![0.0; be + 16])
            .unwrap_err();
        assert!(
            matches!(e, ExecError::InvalidArgument { op: "quantize", .. }),
            "{e}"
        );
        let bytes = vec![0u8; format.block_bytes() * 2];
        let e = QuantMatrix::new(format, 1, be, &bytes).unwrap_err();
        assert!(matches!(e, ExecError::InvalidDataLength { .. }), "{e}");
        let e = QuantMatrix::new(format, 2, be, &bytes[..bytes.len() - 1]).unwrap_err();
        assert!(matches!(e, ExecError::InvalidDataLength { .. }), "{e}");
        // a NaN scale in row 0's block: row 0's outputs NaN, row 1's finite
        let mut bytes = random_blocks(format, 2, 9);
        // the f16 super-block scale `d` (at the block's end for Q2_K, Q3_K)
        let d_at = match format {
            QuantFormat::Q2_K => 80,
            QuantFormat::Q3_K => 108,
            _ => 0,
        };
        bytes[d_at..d_at + 2].copy_from_slice(&f16::NAN.to_bits().to_le_bytes());
        let w = QuantMatrix::new(format, 2, be, &bytes).unwrap();
        let x = values(be, 4, 1.0);
        let mut out = vec![0.0; 2];
        ctx.quant_matmul(&x, 1, &w, &mut out).unwrap();
        assert!(
            out[0].is_nan() && out[1].is_finite(),
            "{} {out:?}",
            format.name()
        );
        let mut back = vec![0.0; 2 * be];
        ctx.dequantize(&w, &mut back).unwrap();
        assert!(back[..be].iter().all(|v| v.is_nan()));
    }
}

// ------------------------------------------------------------- the product

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

/// The documented order. Blocks of 32: eight lanes of four,
/// `acc[l] = fma(d · dx, p[l], acc[l])` (`p` the exact integer sum of value ×
/// x̂), then for Q4_1/Q5_1 `acc[0] = fma(m · dx, Σ x̂, acc[0])`; the lanes fold
/// in halves (Q5_K takes the super-block order of `support/q8k.rs`); IQ4_XS
/// and Q3_K the same sixteen lanes without a min term (the lane scale that of
/// its group); Q2_K the sixteen lanes, then each group of 16's min term on
/// lane `g`.
fn ref_dot(w: &QuantMatrix<'_>, r: usize, xq: &[i8], xs: &[f32]) -> f32 {
    let f = w.format();
    let (bb, be) = (f.block_bytes(), f.block_elements());
    let row = &w.bytes()[r * w.row_bytes()..(r + 1) * w.row_bytes()];
    let mut acc = [0.0f32; 16];
    for (bi, blk) in row.chunks(bb).enumerate() {
        for j in 0..be / 32 {
            let b = bi * be / 32 + j;
            let half = if be == 256 { 8 * (j % 2) } else { 0 };
            for l in 0..8 {
                let (mut p, mut ws) = (0i32, 0.0f32);
                for k in 4 * l..4 * l + 4 {
                    let (s, _, q) = parts(f, blk, 32 * j + k);
                    p += q * i32::from(xq[32 * b + k]);
                    ws = s;
                }
                acc[half + l] = (ws * xs[b]).mul_add(p as f32, acc[half + l]);
            }
            let sum: i32 = xq[32 * b..32 * b + 32].iter().map(|&v| i32::from(v)).sum();
            if matches!(f, QuantFormat::Q4_1 | QuantFormat::Q5_1) {
                acc[0] = (f16_val(&blk[2..]) * xs[b]).mul_add(sum as f32, acc[0]);
            }
        }
        if f == QuantFormat::Q2_K {
            // each group of 16's min term on lane g, groups in order
            for g in 0..16 {
                let b = 8 * bi + g / 2;
                let (_, off, _) = parts(f, blk, 16 * g);
                let t = -off * xs[b];
                let sum: i32 = xq[256 * bi + 16 * g..256 * bi + 16 * g + 16]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum();
                acc[g] = (-t).mul_add(sum as f32, acc[g]);
            }
        }
    }
    let first = if be == 256 { 8 } else { 4 };
    let mut h = first;
    while h >= 1 {
        for l in 0..h {
            acc[l] += acc[l + h];
        }
        h /= 2;
    }
    acc[0]
}

/// The integer parts `(sc, mn, q)` of element `e` of a K format's
/// super-block (its product takes the super-block activations of
/// `support/q8k.rs`): the integer scale of its group, its integer min (0
/// without one), its signed value.
fn k_int_parts(format: QuantFormat, blk: &[u8], e: usize) -> (i32, i32, i32) {
    match format {
        QuantFormat::Q2_K => {
            let (h, w) = (e / 128, e % 128);
            let q = (blk[16 + 32 * h + w % 32] >> (2 * (w / 32))) & 3;
            let sm = blk[e / 16];
            (i32::from(sm & 15), i32::from(sm >> 4), i32::from(q))
        }
        QuantFormat::Q3_K => (q3k_ls(blk, e / 16) - 32, 0, parts(format, blk, e).2),
        QuantFormat::IQ4_XS => (iq4xs_ls(blk, e / 32) - 32, 0, parts(format, blk, e).2),
        _ => {
            let (j, k) = (e / 32, e % 32);
            let (sc, mn) = k_scale_min(&blk[4..16], j);
            let byte = blk[48 + 32 * (j / 2) + k];
            let lo = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
            let q = i32::from(lo) | (i32::from((blk[16 + k] >> j) & 1) << 4);
            (i32::from(sc), i32::from(mn), q)
        }
    }
}

/// A K format's `d` and, with a min, `dmin`.
fn head(format: QuantFormat, blk: &[u8]) -> (f32, Option<f32>) {
    match format {
        QuantFormat::Q2_K => (f16_val(&blk[80..]), Some(f16_val(&blk[82..]))),
        QuantFormat::Q3_K => (f16_val(&blk[108..]), None),
        QuantFormat::IQ4_XS => (f16_val(blk), None),
        _ => (f16_val(blk), Some(f16_val(&blk[2..]))),
    }
}

/// The formats whose products take the super-block activations.
fn takes_q8k(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::Q2_K | QuantFormat::Q3_K | QuantFormat::Q5_K | QuantFormat::IQ4_XS
    )
}

/// A K format's reference: the documented super-block order
/// (`support/q8k.rs`).
fn ref_matmul_q8k(x: &[f32], m: usize, w: &QuantMatrix<'_>) -> Vec<f32> {
    let f = w.format();
    let bb = f.block_bytes();
    let mut out = vec![0.0; m * w.rows()];
    for i in 0..m {
        let (xq, xd) = q8k::q8k_acts(&x[i * w.cols()..(i + 1) * w.cols()]);
        for j in 0..w.rows() {
            let row = &w.bytes()[j * w.row_bytes()..(j + 1) * w.row_bytes()];
            let blk = |b: usize| &row[b * bb..(b + 1) * bb];
            out[i * w.rows() + j] = q8k::q8k_dot(
                &xq,
                &xd,
                |b| head(f, blk(b)),
                |b, e| k_int_parts(f, blk(b), e),
            );
        }
    }
    out
}

fn ref_matmul(x: &[f32], m: usize, w: &QuantMatrix<'_>) -> Vec<f32> {
    if takes_q8k(w.format()) {
        return ref_matmul_q8k(x, m, w);
    }
    let mut out = vec![0.0; m * w.rows()];
    for i in 0..m {
        let (xq, xs) = ref_quantize_acts(&x[i * w.cols()..(i + 1) * w.cols()]);
        for j in 0..w.rows() {
            out[i * w.rows() + j] = ref_dot(w, j, &xq, &xs);
        }
    }
    out
}

/// Batch sizes 1..=9: every split of a batch into the vector kernels' tiles of
/// up to four activation rows (4 + 4 + 1, 4 + 3, …).
const MS: [usize; 9] = [1, 2, 3, 4, 5, 6, 7, 8, 9];

/// Quantized and arbitrary blocks, every vector level this CPU has, 1-4
/// threads (odd row counts, so the threads' parts mix tiles of four weight
/// rows and single rows), batch sizes 1..=9: the reference's bits.
#[test]
fn every_path_matches_the_reference_bit_for_bit() {
    let best = detected_simd_level();
    for format in FORMATS {
        for (si, &(rows, cols)) in [(13usize, 256usize), (5, 768)].iter().enumerate() {
            let w: Vec<f32> = values(rows * cols, 11 + si as u64, 0.5)
                .iter()
                .map(|v| v + 0.2)
                .collect();
            let quantized = ExecContext::new().quantize(format, rows, cols, &w).unwrap();
            let arbitrary = random_blocks(format, rows * cols / format.block_elements(), 21);
            for bytes in [quantized.bytes(), &arbitrary[..]] {
                let wm = QuantMatrix::new(format, rows, cols, bytes).unwrap();
                let x = values(9 * cols, 99 + si as u64, 2.0);
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
}

/// The formats with vector kernels on the super-block activations
/// (`kernels::quant_k::q8k`).
const K_VECTOR: [QuantFormat; 4] = [
    QuantFormat::Q5_K,
    QuantFormat::IQ4_XS,
    QuantFormat::Q3_K,
    QuantFormat::Q2_K,
];

/// The K formats in prefill-sized calls (`m ≥ 8`: at the AVX-512 VNNI level
/// the GEMM over tiles of 16 weight rows, at AVX2 from `m = 16` (Q2_K and
/// Q3_K with their offset or min, IQ4_XS with its values read signed);
/// `m = 7` the tile below the switch; a partial last tile, chunks of
/// super-blocks), quantized and arbitrary blocks: the reference's bits at
/// every level and thread count.
#[test]
fn k_gemm_sized_calls_match_the_reference_bit_for_bit() {
    for format in K_VECTOR {
        gemm_sized_calls_match(format);
    }
}

fn gemm_sized_calls_match(format: QuantFormat) {
    let best = detected_simd_level();
    let (rows, cols, m) = (37usize, 1536usize, 29usize);
    let w: Vec<f32> = values(rows * cols, 41, 0.5)
        .iter()
        .map(|v| v + 0.2)
        .collect();
    let quantized = ExecContext::new().quantize(format, rows, cols, &w).unwrap();
    let arbitrary = random_blocks(format, rows * cols / 256, 43);
    let x = values(m * cols, 45, 2.0);
    for bytes in [quantized.bytes(), &arbitrary[..]] {
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

/// Weight bytes at the ends of the ranges (every byte 0x00: the most negative
/// value of each format, IQ4_XS's −127; every byte 0xff: the largest codes,
/// scales and mins) under normal f16 scales of either sign, with activations at
/// the ends of theirs (blocks of ±127, alternating signs, a zero block, a single
/// huge value): the reference's bits at every level, where the 16-bit pair sums
/// of `vpmaddubsw` are closest to saturating (16 activation rows: the GEMMs
/// of both levels).
#[test]
fn extreme_codes_and_activations_match_the_reference() {
    let best = detected_simd_level();
    let (rows, cols) = (6, 512);
    // rows 4..8 are rows 0..4 negated (8 rows: the GEMM at AVX-512 VNNI),
    // rows 8..16 rows 0..8 again (16: the GEMM at AVX2)
    let mut x = vec![0.0f32; 16 * cols];
    for (k, v) in x.iter_mut().enumerate() {
        let sign = if k / cols % 8 >= 4 { -1.0 } else { 1.0 };
        *v = sign
            * match (k / cols % 4, k % cols) {
                (0, _) => -1.0,
                (1, c) if c < 32 => 0.0,
                (1, 40) => 1e30,
                (1, c) => {
                    if c % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    }
                }
                (2, c) => {
                    if c % 64 < 32 {
                        1.0
                    } else {
                        -1.0
                    }
                }
                _ => 1.0,
            };
    }
    for format in K_VECTOR {
        let bb = format.block_bytes();
        let mut bytes = vec![0u8; rows * cols / format.block_elements() * bb];
        let d_at: &[usize] = match format {
            QuantFormat::Q2_K => &[80, 82],
            QuantFormat::Q3_K => &[108],
            QuantFormat::IQ4_XS => &[0],
            _ => &[0, 2],
        };
        for (b, blk) in bytes.chunks_mut(bb).enumerate() {
            // rows 0, 1 all 0x00; rows 2, 3 all 0xff; rows 4, 5 mixed
            let fill = match (b * format.block_elements() / cols) / 2 {
                0 => 0x00,
                1 => 0xff,
                _ => {
                    if b % 2 == 0 {
                        0x0f
                    } else {
                        0xf0
                    }
                }
            };
            blk.fill(fill);
            for (f, &o) in d_at.iter().enumerate() {
                let v = if (b + f) % 3 == 0 { -0.75 } else { 0.5 };
                blk[o..o + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        let w = QuantMatrix::new(format, rows, cols, &bytes).unwrap();
        let want = ref_matmul(&x, 16, &w);
        for level in SimdLevel::available() {
            assert!(force_simd_level(level));
            for (threads, m) in [(1, 4), (2, 4), (1, 8), (2, 8), (1, 16), (2, 16)] {
                let mut out = vec![0.0; m * rows];
                ExecContext::with_threads(threads)
                    .quant_matmul(&x[..m * cols], m, &w, &mut out)
                    .unwrap();
                assert_eq!(
                    bits(&out),
                    bits(&want[..m * rows]),
                    "{} {} threads={threads} m={m}",
                    format.name(),
                    level.name()
                );
            }
        }
        assert!(force_simd_level(best));
    }
}

/// Against the f64 product of the format's exact weight values
/// `ŵ = scale · q + offset` and the f32 activations, at every vector level:
/// `|y − Σ x ŵ| ≤ Σ |ŵ| |x − x̂| + (nb + 24) · 2^−22 · Σ |x̂| (|scale · q| + |offset|)`
/// (the activations' int8 rounding, plus the f32 rounding of the fixed order:
/// per sub-block and lane a rounded scale product and a fused multiply-add,
/// per super-block up to two more per lane for a min term, and the fold; the
/// magnitudes are the scale and min parts', which a min term can make larger
/// than `|ŵ|`).
#[test]
fn accuracy_against_the_f64_product_is_within_the_bound() {
    let best = detected_simd_level();
    let ctx = ExecContext::with_threads(2);
    let (rows, cols, m) = (24, 2048, 3);
    let w: Vec<f32> = values(rows * cols, 21, 0.1)
        .iter()
        .map(|v| v + 0.03)
        .collect();
    let x = values(m * cols, 22, 1.0);
    for format in K_VECTOR {
        let q = ctx.quantize(format, rows, cols, &w).unwrap();
        let wm = q.matrix();
        let (bb, be) = (format.block_bytes(), format.block_elements());
        for level in SimdLevel::available() {
            assert!(force_simd_level(level));
            let mut out = vec![0.0; m * rows];
            ctx.quant_matmul(&x, m, &wm, &mut out).unwrap();
            let mut worst = 0.0f64;
            for i in 0..m {
                let xi = &x[i * cols..(i + 1) * cols];
                // the K formats' activations come in blocks of 256 (one scale
                // each)
                let (xq, xs, xb) = if takes_q8k(format) {
                    let (q, d) = q8k::q8k_acts(xi);
                    (q, d, 256)
                } else {
                    let (q, s) = ref_quantize_acts(xi);
                    (q, s, 32)
                };
                for j in 0..rows {
                    let row = &wm.bytes()[j * wm.row_bytes()..(j + 1) * wm.row_bytes()];
                    let (mut exact, mut bound, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                    for k in 0..cols {
                        let (s, off, qv) = parts(format, &row[k / be * bb..][..bb], k % be);
                        let (sq, off) = (f64::from(s) * f64::from(qv), f64::from(off));
                        let what = sq + off;
                        let xhat = f64::from(xq[k]) * f64::from(xs[k / xb]);
                        exact += f64::from(xi[k]) * what;
                        bound += what.abs() * (f64::from(xi[k]) - xhat).abs();
                        mag += xhat.abs() * (sq.abs() + off.abs());
                    }
                    bound += (cols / 32 + 24) as f64 * 2f64.powi(-22) * mag;
                    let err = (f64::from(out[i * rows + j]) - exact).abs();
                    assert!(
                        err <= bound,
                        "{} {} ({i},{j}): error {err} above bound {bound}",
                        format.name(),
                        level.name()
                    );
                    worst = worst.max(err / mag.max(1e-30));
                }
            }
            assert!(worst > 0.0, "the activations' rounding changes something");
        }
        assert!(force_simd_level(best));
    }
}

/// A prefill-sized call (more activation rows than the kernels take in one
/// cache-sized chunk: 97 rows of 1024 columns) gives each row the bits of the
/// same row computed alone, for every format, at every level.
#[test]
fn a_prefill_sized_call_gives_each_row_its_own_bits() {
    let best = detected_simd_level();
    let (rows, cols, m) = (9usize, 1024usize, 97usize);
    for format in FORMATS {
        let w = values(rows * cols, 5, 0.5);
        let q = ExecContext::new().quantize(format, rows, cols, &w).unwrap();
        let wm = q.matrix();
        let x = values(m * cols, 6, 2.0);
        for level in SimdLevel::available() {
            assert!(force_simd_level(level));
            let ctx = ExecContext::with_threads(2);
            let mut all = vec![f32::NAN; m * rows];
            ctx.quant_matmul(&x, m, &wm, &mut all).unwrap();
            for i in 0..m {
                let mut one = vec![f32::NAN; rows];
                ctx.quant_matmul(&x[i * cols..(i + 1) * cols], 1, &wm, &mut one)
                    .unwrap();
                assert_eq!(
                    bits(&all[i * rows..(i + 1) * rows]),
                    bits(&one),
                    "{} row {i} level={}",
                    format.name(),
                    level.name()
                );
            }
        }
        assert!(force_simd_level(best));
    }
}
