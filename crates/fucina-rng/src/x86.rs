//! x86_64 vector bodies (AVX-512 F/DQ/VL and AVX2) for the fast Gaussian and
//! the uniform mappings.
//!
//! Each lane performs exactly the scalar op sequence of `fast.rs` /
//! `uniform.rs`: the same IEEE operations in the same order, rounded the same
//! way (no fused multiply-add: only `vmulps`/`vaddps`-style intrinsics are
//! used, and Rust never contracts separate operations). Vector-vs-scalar bit
//! equality is tested in `fast.rs` and `uniform.rs`.

use core::arch::x86_64::*;

use crate::fast::{COS_P, LOG_P, LOG_Q1, LOG_Q2, PIO2F, SIN_P, SQRTHF};
use crate::gaussian::TWO_POW_M53;
use crate::stream::GAMMA;

const MIX1: u64 = 0xBF58_476D_1CE4_E5B9;
const MIX2: u64 = 0x94D0_49BB_1331_11EB;

/// AVX-512 F, DQ and VL (and AVX2) are available: detected at run time with
/// the `std` feature, otherwise only when the build enables them
/// (`-C target-feature` / `-C target-cpu`).
#[inline]
pub(crate) fn has_avx512() -> bool {
    #[cfg(feature = "std")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx2")
    }
    #[cfg(not(feature = "std"))]
    {
        cfg!(all(
            target_feature = "avx512f",
            target_feature = "avx512dq",
            target_feature = "avx512vl",
            target_feature = "avx2"
        ))
    }
}

/// AVX2 is available (at run time with `std`, at compile time without).
#[inline]
pub(crate) fn has_avx2() -> bool {
    #[cfg(feature = "std")]
    {
        is_x86_feature_detected!("avx2")
    }
    #[cfg(not(feature = "std"))]
    {
        cfg!(target_feature = "avx2")
    }
}

/// `[base, base + d, base + 2d, ...]` in wrapping arithmetic.
#[inline(always)]
fn ramp<const N: usize>(base: u64, d: u64) -> [u64; N] {
    core::array::from_fn(|k| base.wrapping_add((k as u64).wrapping_mul(d)))
}

// ---------------------------------------------------------------------------
// Shared 8-lane f32 part of the fast Box–Muller (AVX2 instructions only).
// ---------------------------------------------------------------------------

/// The fast mapping's f32 math for 8 pairs: from the f32 uniforms to the 16
/// output values, interleaved (cos0, sin0, cos1, sin1, ...), as two vectors.
#[target_feature(enable = "avx2")]
#[inline]
fn box_muller8(ua: __m256, ub: __m256, scale: __m256) -> (__m256, __m256) {
    let one = _mm256_set1_ps(1.0);
    let half = _mm256_set1_ps(0.5);

    // logf(ua), Cephes scheme.
    let bits = _mm256_castps_si256(ua);
    let e = _mm256_cvtepi32_ps(_mm256_sub_epi32(
        _mm256_srli_epi32::<23>(bits),
        _mm256_set1_epi32(126),
    ));
    let m = _mm256_castsi256_ps(_mm256_or_si256(
        _mm256_and_si256(bits, _mm256_set1_epi32(0x007f_ffff)),
        _mm256_set1_epi32(0x3f00_0000),
    ));
    let small = _mm256_cmp_ps::<_CMP_LT_OQ>(m, _mm256_set1_ps(SQRTHF));
    let e = _mm256_blendv_ps(e, _mm256_sub_ps(e, one), small);
    let m = _mm256_blendv_ps(m, _mm256_add_ps(m, m), small);
    let f = _mm256_sub_ps(m, one);
    let z = _mm256_mul_ps(f, f);
    let mut p = _mm256_set1_ps(LOG_P[0]);
    for &c in &LOG_P[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(c));
    }
    let mut y = _mm256_mul_ps(_mm256_mul_ps(f, z), p);
    y = _mm256_add_ps(y, _mm256_mul_ps(e, _mm256_set1_ps(LOG_Q1)));
    y = _mm256_sub_ps(y, _mm256_mul_ps(half, z));
    y = _mm256_add_ps(f, y);
    let ln = _mm256_add_ps(y, _mm256_mul_ps(e, _mm256_set1_ps(LOG_Q2)));
    let radius = _mm256_sqrt_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0), ln));

    // sin/cos of 2 pi ub by quarter-turn reduction.
    let t4 = _mm256_mul_ps(ub, _mm256_set1_ps(4.0));
    let jf = _mm256_floor_ps(_mm256_add_ps(t4, half));
    let arg = _mm256_mul_ps(_mm256_sub_ps(t4, jf), _mm256_set1_ps(PIO2F));
    let z = _mm256_mul_ps(arg, arg);
    let horner3 = |c: [f32; 3]| {
        let h = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c[0]), z), _mm256_set1_ps(c[1]));
        _mm256_add_ps(_mm256_mul_ps(h, z), _mm256_set1_ps(c[2]))
    };
    let sp = horner3(SIN_P);
    let cp = horner3(COS_P);
    let sin_arg = _mm256_add_ps(arg, _mm256_mul_ps(_mm256_mul_ps(arg, z), sp));
    let cos_arg = _mm256_add_ps(
        _mm256_sub_ps(one, _mm256_mul_ps(half, z)),
        _mm256_mul_ps(_mm256_mul_ps(z, z), cp),
    );
    let q = _mm256_cvttps_epi32(jf);
    let one_i = _mm256_set1_epi32(1);
    let two_i = _mm256_set1_epi32(2);
    let odd = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(q, one_i), one_i));
    let s = _mm256_blendv_ps(sin_arg, cos_arg, odd);
    let c = _mm256_blendv_ps(cos_arg, sin_arg, odd);
    // Negation = flipping the sign bit: bit 1 of q (resp. q + 1) shifted to bit 31.
    let s_sign = _mm256_slli_epi32::<30>(_mm256_and_si256(q, two_i));
    let c_sign = _mm256_slli_epi32::<30>(_mm256_and_si256(_mm256_add_epi32(q, one_i), two_i));
    let s = _mm256_xor_ps(s, _mm256_castsi256_ps(s_sign));
    let c = _mm256_xor_ps(c, _mm256_castsi256_ps(c_sign));

    let cv = _mm256_mul_ps(_mm256_mul_ps(radius, c), scale);
    let sv = _mm256_mul_ps(_mm256_mul_ps(radius, s), scale);
    // unpacklo: c0 s0 c1 s1 | c4 s4 c5 s5 ; unpackhi: c2 s2 c3 s3 | c6 s6 c7 s7
    let lo = _mm256_unpacklo_ps(cv, sv);
    let hi = _mm256_unpackhi_ps(cv, sv);
    (
        _mm256_permute2f128_ps::<0x20>(lo, hi),
        _mm256_permute2f128_ps::<0x31>(lo, hi),
    )
}

/// Stores 16 interleaved values at the start of `chunk`.
#[target_feature(enable = "avx2")]
#[inline]
fn store16(chunk: &mut [f32], v: (__m256, __m256)) {
    assert!(chunk.len() >= 16);
    // SAFETY: `chunk` holds at least 16 f32 (checked above); unaligned stores.
    unsafe {
        _mm256_storeu_ps(chunk.as_mut_ptr(), v.0);
        _mm256_storeu_ps(chunk.as_mut_ptr().add(8), v.1);
    }
}

/// Stores 8 values at the start of `chunk`.
#[target_feature(enable = "avx2")]
#[inline]
fn store8(chunk: &mut [f32], v: __m256) {
    assert!(chunk.len() >= 8);
    // SAFETY: `chunk` holds at least 8 f32 (checked above); unaligned store.
    unsafe { _mm256_storeu_ps(chunk.as_mut_ptr(), v) }
}

// ---------------------------------------------------------------------------
// AVX-512 F/DQ/VL: native 64-bit multiply and u64 -> f64 conversion.
// ---------------------------------------------------------------------------

/// splitmix64's mixer on 8 lanes.
#[target_feature(enable = "avx2,avx512f,avx512dq,avx512vl")]
#[inline]
fn mix8(z: __m512i) -> __m512i {
    let z = _mm512_mullo_epi64(
        _mm512_xor_si512(z, _mm512_srli_epi64::<30>(z)),
        _mm512_set1_epi64(MIX1 as i64),
    );
    let z = _mm512_mullo_epi64(
        _mm512_xor_si512(z, _mm512_srli_epi64::<27>(z)),
        _mm512_set1_epi64(MIX2 as i64),
    );
    _mm512_xor_si512(z, _mm512_srli_epi64::<31>(z))
}

#[target_feature(enable = "avx2,avx512f,avx512dq,avx512vl")]
#[inline]
fn load8(v: [u64; 8]) -> __m512i {
    // SAFETY: `v` is 64 readable bytes; unaligned load.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// `k * 2^-53` (exact for `k <= 2^53`), rounded to f32, for 8 lanes.
#[target_feature(enable = "avx2,avx512f,avx512dq,avx512vl")]
#[inline]
fn unit_f32_8(k: __m512i) -> __m256 {
    _mm512_cvtpd_ps(_mm512_mul_pd(
        _mm512_cvtepu64_pd(k),
        _mm512_set1_pd(TWO_POW_M53),
    ))
}

/// The fast mapping's f32 math for 16 pairs on zmm registers: the same op
/// sequence as [`box_muller8`] (and the scalar code), with mask registers for
/// the selects. Returns the 32 interleaved values (cos0, sin0, ...).
#[target_feature(enable = "avx2,avx512f,avx512dq,avx512vl")]
#[inline]
fn box_muller16(ua: __m512, ub: __m512, scale: __m512) -> (__m512, __m512) {
    let one = _mm512_set1_ps(1.0);
    let half = _mm512_set1_ps(0.5);

    // logf(ua), Cephes scheme.
    let bits = _mm512_castps_si512(ua);
    let e = _mm512_cvtepi32_ps(_mm512_sub_epi32(
        _mm512_srli_epi32::<23>(bits),
        _mm512_set1_epi32(126),
    ));
    let m = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_and_si512(bits, _mm512_set1_epi32(0x007f_ffff)),
        _mm512_set1_epi32(0x3f00_0000),
    ));
    let small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(m, _mm512_set1_ps(SQRTHF));
    let e = _mm512_mask_sub_ps(e, small, e, one);
    let m = _mm512_mask_add_ps(m, small, m, m);
    let f = _mm512_sub_ps(m, one);
    let z = _mm512_mul_ps(f, f);
    let mut p = _mm512_set1_ps(LOG_P[0]);
    for &c in &LOG_P[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, f), _mm512_set1_ps(c));
    }
    let mut y = _mm512_mul_ps(_mm512_mul_ps(f, z), p);
    y = _mm512_add_ps(y, _mm512_mul_ps(e, _mm512_set1_ps(LOG_Q1)));
    y = _mm512_sub_ps(y, _mm512_mul_ps(half, z));
    y = _mm512_add_ps(f, y);
    let ln = _mm512_add_ps(y, _mm512_mul_ps(e, _mm512_set1_ps(LOG_Q2)));
    let radius = _mm512_sqrt_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0), ln));

    // sin/cos of 2 pi ub by quarter-turn reduction.
    let t4 = _mm512_mul_ps(ub, _mm512_set1_ps(4.0));
    // Round toward -inf (floor), exceptions suppressed: `vrndscaleps $9`.
    let jf = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_add_ps(
        t4, half,
    ));
    let arg = _mm512_mul_ps(_mm512_sub_ps(t4, jf), _mm512_set1_ps(PIO2F));
    let z = _mm512_mul_ps(arg, arg);
    let horner3 = |c: [f32; 3]| {
        let h = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c[0]), z), _mm512_set1_ps(c[1]));
        _mm512_add_ps(_mm512_mul_ps(h, z), _mm512_set1_ps(c[2]))
    };
    let sp = horner3(SIN_P);
    let cp = horner3(COS_P);
    let sin_arg = _mm512_add_ps(arg, _mm512_mul_ps(_mm512_mul_ps(arg, z), sp));
    let cos_arg = _mm512_add_ps(
        _mm512_sub_ps(one, _mm512_mul_ps(half, z)),
        _mm512_mul_ps(_mm512_mul_ps(z, z), cp),
    );
    let q = _mm512_cvttps_epi32(jf);
    let one_i = _mm512_set1_epi32(1);
    let two_i = _mm512_set1_epi32(2);
    let odd = _mm512_test_epi32_mask(q, one_i);
    let s = _mm512_mask_blend_ps(odd, sin_arg, cos_arg);
    let c = _mm512_mask_blend_ps(odd, cos_arg, sin_arg);
    // Negation = flipping the sign bit: bit 1 of q (resp. q + 1) shifted to bit 31.
    let s_sign = _mm512_slli_epi32::<30>(_mm512_and_si512(q, two_i));
    let c_sign = _mm512_slli_epi32::<30>(_mm512_and_si512(_mm512_add_epi32(q, one_i), two_i));
    let s = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(s), s_sign));
    let c = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(c), c_sign));

    let cv = _mm512_mul_ps(_mm512_mul_ps(radius, c), scale);
    let sv = _mm512_mul_ps(_mm512_mul_ps(radius, s), scale);
    // Interleave: out[2k] = cv[k], out[2k + 1] = sv[k] (indices >= 16 pick from sv).
    let idx0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let idx1 = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    (
        _mm512_permutex2var_ps(cv, idx0, sv),
        _mm512_permutex2var_ps(cv, idx1, sv),
    )
}

/// Two 8-lane f32 vectors as one 16-lane vector (`lo` in lanes 0..8).
#[target_feature(enable = "avx2,avx512f,avx512dq,avx512vl")]
#[inline]
fn join16(lo: __m256, hi: __m256) -> __m512 {
    _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi)
}

/// The fast Gaussian body for pairs `p0 .. p0 + out.len() / 2`: 16 pairs per
/// step on zmm registers, then at most one 8-pair step on ymm registers.
/// `out.len()` must be a multiple of 16.
///
/// # Safety
///
/// The CPU must support AVX2 and AVX-512 F, DQ and VL.
#[target_feature(enable = "avx2,avx512f,avx512dq,avx512vl")]
pub(crate) unsafe fn gaussian_fast_avx512(seed: u64, p0: u64, out: &mut [f32], scale: f32) {
    debug_assert!(out.len().is_multiple_of(16));
    // Lane k handles pair p0 + k: a = at(seed, 2(p0 + k)), i.e. the state
    // seed + (2(p0 + k) + 1) * GAMMA; b's state is one GAMMA further.
    let base = seed.wrapping_add(p0.wrapping_mul(2).wrapping_add(1).wrapping_mul(GAMMA));
    let lanes: [u64; 16] = ramp(base, GAMMA.wrapping_mul(2));
    let mut sa0 = load8(lanes[..8].try_into().expect("8 lanes"));
    let mut sa1 = load8(lanes[8..].try_into().expect("8 lanes"));
    let g = _mm512_set1_epi64(GAMMA as i64);
    let mut sb0 = _mm512_add_epi64(sa0, g);
    let mut sb1 = _mm512_add_epi64(sa1, g);
    let step = _mm512_set1_epi64(GAMMA.wrapping_mul(32) as i64);
    let one = _mm512_set1_epi64(1);
    let scale16 = _mm512_set1_ps(scale);
    let mut chunks = out.chunks_exact_mut(32);
    for chunk in &mut chunks {
        let (a0, a1, b0, b1) = (mix8(sa0), mix8(sa1), mix8(sb0), mix8(sb1));
        sa0 = _mm512_add_epi64(sa0, step);
        sa1 = _mm512_add_epi64(sa1, step);
        sb0 = _mm512_add_epi64(sb0, step);
        sb1 = _mm512_add_epi64(sb1, step);
        let ua = join16(
            unit_f32_8(_mm512_add_epi64(_mm512_srli_epi64::<11>(a0), one)),
            unit_f32_8(_mm512_add_epi64(_mm512_srli_epi64::<11>(a1), one)),
        );
        let ub = join16(
            unit_f32_8(_mm512_srli_epi64::<11>(b0)),
            unit_f32_8(_mm512_srli_epi64::<11>(b1)),
        );
        let (v0, v1) = box_muller16(ua, ub, scale16);
        assert!(chunk.len() >= 32);
        // SAFETY: `chunk` holds 32 f32 (checked above); unaligned stores.
        unsafe {
            _mm512_storeu_ps(chunk.as_mut_ptr(), v0);
            _mm512_storeu_ps(chunk.as_mut_ptr().add(16), v1);
        }
    }
    // A remaining 16 values: the next 8 pairs, whose states are `sa0`/`sb0`.
    if let Some(chunk) = chunks.into_remainder().get_mut(..16) {
        let (a, b) = (mix8(sa0), mix8(sb0));
        let ua = unit_f32_8(_mm512_add_epi64(_mm512_srli_epi64::<11>(a), one));
        let ub = unit_f32_8(_mm512_srli_epi64::<11>(b));
        store16(chunk, box_muller8(ua, ub, _mm256_set1_ps(scale)));
    }
}

/// The uniform body for elements `0 .. out.len()` (a multiple of 8).
///
/// # Safety
///
/// The CPU must support AVX2 and AVX-512 F, DQ and VL.
#[target_feature(enable = "avx2,avx512f,avx512dq,avx512vl")]
pub(crate) unsafe fn uniform_avx512(seed: u64, out: &mut [f32], lo: f32, hi: f32, clamp: f32) {
    debug_assert!(out.len().is_multiple_of(8));
    let mut s = load8(ramp(seed.wrapping_add(GAMMA), GAMMA));
    let step = _mm512_set1_epi64(GAMMA.wrapping_mul(8) as i64);
    // lo + (hi - lo) * (k * 2^-53) == lo + k * ((hi - lo) * 2^-53) bit for bit:
    // scaling by a power of two is exact here (no overflow, and the smallest
    // nonzero |hi - lo| * 2^-53 is ~2^-202, far above f64's subnormal range),
    // so both products round the same real number.
    let lo64 = _mm512_set1_pd(f64::from(lo));
    let w = _mm512_set1_pd((f64::from(hi) - f64::from(lo)) * TWO_POW_M53);
    let hi_v = _mm256_set1_ps(hi);
    let clamp_v = _mm256_set1_ps(clamp);
    // `v >= hi` as a mask register, then a masked blend: 2 uops, no vector mask.
    let eight = |x: __m512i| {
        let k = _mm512_cvtepu64_pd(_mm512_srli_epi64::<11>(mix8(x)));
        let v = _mm512_cvtpd_ps(_mm512_add_pd(lo64, _mm512_mul_pd(k, w)));
        _mm256_mask_blend_ps(_mm256_cmp_ps_mask::<_CMP_GE_OQ>(v, hi_v), v, clamp_v)
    };
    // Two independent 8-lane streams per step (elements i and i + 8).
    let mut s1 = _mm512_add_epi64(s, step);
    let step2 = _mm512_set1_epi64(GAMMA.wrapping_mul(16) as i64);
    let mut chunks = out.chunks_exact_mut(16);
    for chunk in &mut chunks {
        let (v0, v1) = (eight(s), eight(s1));
        s = _mm512_add_epi64(s, step2);
        s1 = _mm512_add_epi64(s1, step2);
        store8(chunk, v0);
        store8(&mut chunk[8..], v1);
    }
    if let Some(chunk) = chunks.into_remainder().get_mut(..8) {
        store8(chunk, eight(s));
    }
}

// ---------------------------------------------------------------------------
// AVX2: 64-bit multiply and u64 -> f64 conversion emulated.
// ---------------------------------------------------------------------------

/// Low 64 bits of `a * c` per lane, for a constant `c` given as
/// `(c, c >> 32)` broadcast.
#[target_feature(enable = "avx2")]
#[inline]
fn mullo64(a: __m256i, c: __m256i, c_hi: __m256i) -> __m256i {
    let lolo = _mm256_mul_epu32(a, c);
    let hilo = _mm256_mul_epu32(_mm256_srli_epi64::<32>(a), c);
    let lohi = _mm256_mul_epu32(a, c_hi);
    _mm256_add_epi64(lolo, _mm256_slli_epi64::<32>(_mm256_add_epi64(hilo, lohi)))
}

/// splitmix64's mixer on 4 lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn mix4(z: __m256i) -> __m256i {
    let c1 = _mm256_set1_epi64x(MIX1 as i64);
    let c1h = _mm256_set1_epi64x((MIX1 >> 32) as i64);
    let c2 = _mm256_set1_epi64x(MIX2 as i64);
    let c2h = _mm256_set1_epi64x((MIX2 >> 32) as i64);
    let z = mullo64(_mm256_xor_si256(z, _mm256_srli_epi64::<30>(z)), c1, c1h);
    let z = mullo64(_mm256_xor_si256(z, _mm256_srli_epi64::<27>(z)), c2, c2h);
    _mm256_xor_si256(z, _mm256_srli_epi64::<31>(z))
}

#[target_feature(enable = "avx2")]
#[inline]
fn load4(v: [u64; 4]) -> __m256i {
    // SAFETY: `v` is 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// Exact `k as f64` for `k <= 2^53` on 4 lanes: the high and low 32-bit
/// halves are placed in the mantissas of 2^84 and 2^52 (exact), the offsets
/// subtracted (exact), and the halves added (exact: the sum is an integer
/// below 2^54 that is representable, so the single rounding is the identity).
#[target_feature(enable = "avx2")]
#[inline]
fn u53_to_f64(k: __m256i) -> __m256d {
    const P84: u64 = 0x4530_0000_0000_0000;
    const P52: u64 = 0x4330_0000_0000_0000;
    const OFFSET: f64 = f64::from_bits(P84) + f64::from_bits(P52);
    let hi = _mm256_or_si256(_mm256_srli_epi64::<32>(k), _mm256_set1_epi64x(P84 as i64));
    let lo = _mm256_blend_epi32::<0b1010_1010>(k, _mm256_set1_epi64x(P52 as i64));
    let hi = _mm256_sub_pd(_mm256_castsi256_pd(hi), _mm256_set1_pd(OFFSET));
    _mm256_add_pd(hi, _mm256_castsi256_pd(lo))
}

/// `k * 2^-53` rounded to f32 for 2 x 4 lanes, as one 8-lane vector.
#[target_feature(enable = "avx2")]
#[inline]
fn unit_f32_2x4(k0: __m256i, k1: __m256i) -> __m256 {
    let scale = _mm256_set1_pd(TWO_POW_M53);
    let f0 = _mm256_cvtpd_ps(_mm256_mul_pd(u53_to_f64(k0), scale));
    let f1 = _mm256_cvtpd_ps(_mm256_mul_pd(u53_to_f64(k1), scale));
    _mm256_set_m128(f1, f0)
}

/// The fast Gaussian body on AVX2 (see [`gaussian_fast_avx512`]).
///
/// # Safety
///
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn gaussian_fast_avx2(seed: u64, p0: u64, out: &mut [f32], scale: f32) {
    debug_assert!(out.len().is_multiple_of(16));
    let base = seed.wrapping_add(p0.wrapping_mul(2).wrapping_add(1).wrapping_mul(GAMMA));
    let lanes: [u64; 8] = ramp(base, GAMMA.wrapping_mul(2));
    let mut sa0 = load4([lanes[0], lanes[1], lanes[2], lanes[3]]);
    let mut sa1 = load4([lanes[4], lanes[5], lanes[6], lanes[7]]);
    let g = _mm256_set1_epi64x(GAMMA as i64);
    let mut sb0 = _mm256_add_epi64(sa0, g);
    let mut sb1 = _mm256_add_epi64(sa1, g);
    let step = _mm256_set1_epi64x(GAMMA.wrapping_mul(16) as i64);
    let one = _mm256_set1_epi64x(1);
    let scale = _mm256_set1_ps(scale);
    for chunk in out.chunks_exact_mut(16) {
        let (a0, a1, b0, b1) = (mix4(sa0), mix4(sa1), mix4(sb0), mix4(sb1));
        sa0 = _mm256_add_epi64(sa0, step);
        sa1 = _mm256_add_epi64(sa1, step);
        sb0 = _mm256_add_epi64(sb0, step);
        sb1 = _mm256_add_epi64(sb1, step);
        let ua = unit_f32_2x4(
            _mm256_add_epi64(_mm256_srli_epi64::<11>(a0), one),
            _mm256_add_epi64(_mm256_srli_epi64::<11>(a1), one),
        );
        let ub = unit_f32_2x4(_mm256_srli_epi64::<11>(b0), _mm256_srli_epi64::<11>(b1));
        store16(chunk, box_muller8(ua, ub, scale));
    }
}

/// The uniform body on AVX2 (see [`uniform_avx512`]).
///
/// # Safety
///
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn uniform_avx2(seed: u64, out: &mut [f32], lo: f32, hi: f32, clamp: f32) {
    debug_assert!(out.len().is_multiple_of(8));
    let lanes: [u64; 8] = ramp(seed.wrapping_add(GAMMA), GAMMA);
    let mut s0 = load4([lanes[0], lanes[1], lanes[2], lanes[3]]);
    let mut s1 = load4([lanes[4], lanes[5], lanes[6], lanes[7]]);
    let step = _mm256_set1_epi64x(GAMMA.wrapping_mul(8) as i64);
    // See `uniform_avx512` for why the folded scale is bit-identical.
    let lo64 = _mm256_set1_pd(f64::from(lo));
    let w = _mm256_set1_pd((f64::from(hi) - f64::from(lo)) * TWO_POW_M53);
    let hi_v = _mm256_set1_ps(hi);
    let clamp_v = _mm256_set1_ps(clamp);
    for chunk in out.chunks_exact_mut(8) {
        let x0 = _mm256_srli_epi64::<11>(mix4(s0));
        let x1 = _mm256_srli_epi64::<11>(mix4(s1));
        s0 = _mm256_add_epi64(s0, step);
        s1 = _mm256_add_epi64(s1, step);
        let v0 = _mm256_cvtpd_ps(_mm256_add_pd(lo64, _mm256_mul_pd(u53_to_f64(x0), w)));
        let v1 = _mm256_cvtpd_ps(_mm256_add_pd(lo64, _mm256_mul_pd(u53_to_f64(x1), w)));
        let v = _mm256_set_m128(v1, v0);
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(v, hi_v);
        store8(chunk, _mm256_blendv_ps(v, clamp_v, up));
    }
}
