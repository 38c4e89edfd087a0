//! The crate's own sine, cosine and power, made of IEEE basic operations only
//! (`+`, `-`, `*`, `/`, exact conversions and integer arithmetic; no C library
//! call, no fused multiply-add), so the RoPE tables are the same bits on every
//! platform. A C library's `sin`, `cos` or `pow` may differ in the last bit
//! between glibc, musl, macOS and Windows; these functions cannot.
//!
//! Each function returns the **f32** the model uses, the correctly rounded f32
//! of the exact value unless that value lies within 2^-70 (relative) of the
//! midpoint between two f32 (about 2^-45 of an f32 ulp): the value is known in
//! double-double arithmetic (an unevaluated sum `hi + lo` of two f64, about
//! 106 bits) with a relative error below 2^-70 and rounded once to f32 (taking
//! `lo` into account when `hi` falls exactly between two f32). The tests
//! compare tens of millions of RoPE angles and random angles with the standard
//! library (glibc, rounded from f64) and find the same f32 every time, and the
//! double-double results with 400-bit references.
//!
//! # `cos_sin(x)` for an f32 `x`
//!
//! **Reduction.** `x = q · π/2 + r` with `|r| ≤ π/4`, computed exactly in
//! integer arithmetic for every finite f32 (Payne–Hanek): `x = M · 2^E` with a
//! 24-bit integer `M`; the bits of `2/π` whose products with `x` are multiples
//! of 4 are skipped, and the next 128 bits `W` (from [`TWO_OVER_PI`], 256 bits
//! of `2/π`) are multiplied by `M` in 128-bit integers. The product's bits above
//! the binary point give `q mod 4`, the 126 bits below it the fraction of a
//! quarter turn, both exact; the bits of `2/π` past the window contribute less
//! than `M · 2^-126 < 2^-102` quarter turns. The fraction (rounded to the
//! nearest quarter turn, so in `[-1/2, 1/2)`) is turned into a double-double
//! (truncated to 106 bits) and multiplied by `π/2` in double-double. So `r` is
//! within `2^-101` (absolute) of `x - q·π/2`. The smallest `|x - q·π/2|` over
//! all f32 `x` with `|x| > π/4` is `2^-29.2` (at `x = 16367173·2^72`; an
//! exhaustive search over every f32 with this reduction, about 20 s), so the
//! relative error of `r` is below `2^-71` for every f32. Below `π/4`, `r = x`
//! exactly.
//!
//! **Polynomials.** `sin r = r · S(r²)` and `cos r = C(r²)` with the Taylor
//! series `S(z) = Σ_{n≤10} (-z)^n/(2n+1)!` and `C(z) = Σ_{n≤11} (-z)^n/(2n)!`;
//! on `|r| ≤ π/4` (`z ≤ 0.62`) the first omitted terms are below `2^-82`
//! relative.
//!
//! **A fast path, checked.** The polynomials are first evaluated in f64 (`sin
//! r ≈ rh + (rh·z·S' + rl·(1 - z/2))`, `cos r ≈ 1 - (z/2 - (z²·C' - rh·rl))`
//! for `r = rh + rl`, `z = rh²`): each rounding is at most `2^-53` of a term
//! no larger than the result, a few of them, so the error is below about
//! `2^-51.5`; the tests measure at most `2^-52.5` against the double-double
//! path over a million arguments. Taking `2^-50` (more than twice that) as the bound:
//! when the whole interval `v · (1 ± 2^-50)` rounds to one f32, that f32 is
//! the answer. Otherwise (about one value in 2^24; 5 of the 25 million RoPE
//! angles of the tests) the polynomials are evaluated again in double-double:
//! `z` and the five leading Horner steps with double-double coefficients, the
//! terms of degree 10 and up (at most `2^-24` of the result) in f64, whose
//! rounding adds less than `2^-75`. The quadrant then picks `±sin r` or
//! `±cos r`. About 70 ns per angle (the glibc f64 pair: 10–30 ns).
//!
//! # `pow_f32(base, e)` for `base > 0`
//!
//! `exp(e · ln base)`, all in double-double: `ln` from `base = m · 2^k`
//! (`m ∈ [√½, √2)`) as `k·ln 2 + 2·atanh((m-1)/(m+1))` (21 terms of the atanh
//! series, `|(m-1)/(m+1)| ≤ 0.172`), `exp` from `y = j·ln 2 + r` (`|r| ≤
//! 0.35`) as `2^j · Σ_{n≤27} r^n/n!`. The relative error stays near `2^-95`
//! for the bases and exponents of RoPE (`|e · ln base| < 64`). Used at load
//! only.

/// Bits 1..=256 of `2/π` (bit `i` weighs `2^-i`), most significant first.
const TWO_OVER_PI: [u64; 4] = [
    0xa2f9_836e_4e44_1529,
    0xfc27_57d1_f534_ddc0,
    0xdb62_9599_3c43_9041,
    0xfe51_63ab_debb_c561,
];

/// `π/2` as a double-double.
const PIO2: Dd = Dd::new(std::f64::consts::FRAC_PI_2, 6.123233995736766e-17);

/// `ln 2` as a double-double.
const LN2: Dd = Dd::new(std::f64::consts::LN_2, 2.3190468138462996e-17);

/// `(-1)^n / (2n+1)!` for `n = 1..=4` as double-doubles (the leading 1 is exact).
const SIN_DD: [Dd; 4] = [
    Dd::new(-0.16666666666666666, -9.25185853854297e-18),
    Dd::new(0.008333333333333333, 1.1564823173178714e-19),
    Dd::new(-0.0001984126984126984, -1.7209558293420705e-22),
    Dd::new(2.7557319223985893e-06, -1.858393274046472e-22),
];

/// `(-1)^n / (2n+1)!` for `n = 5..=10` (the f64 tail of `S`).
const SIN_TAIL: [f64; 6] = [
    -2.505210838544172e-08,
    1.6059043836821613e-10,
    -7.647163731819816e-13,
    2.8114572543455206e-15,
    -8.22063524662433e-18,
    1.9572941063391263e-20,
];

/// `(-1)^n / (2n)!` for `n = 1..=4` as double-doubles (the leading 1 is exact).
const COS_DD: [Dd; 4] = [
    Dd::new(-0.5, 0.0),
    Dd::new(0.041666666666666664, 2.3129646346357427e-18),
    Dd::new(-0.001388888888888889, 5.300543954373577e-20),
    Dd::new(2.48015873015873e-05, 2.1511947866775882e-23),
];

/// `(-1)^n / (2n)!` for `n = 5..=11` (the f64 tail of `C`).
const COS_TAIL: [f64; 7] = [
    -2.755731922398589e-07,
    2.08767569878681e-09,
    -1.1470745597729725e-11,
    4.779477332387385e-14,
    -1.5619206968586225e-16,
    4.110317623312165e-19,
    -8.896791392450574e-22,
];

/// A double-double: the unevaluated sum `hi + lo` with `|lo| ≤ ulp(hi) / 2`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Dd {
    hi: f64,
    lo: f64,
}

impl Dd {
    const fn new(hi: f64, lo: f64) -> Dd {
        Dd { hi, lo }
    }

    fn neg(self) -> Dd {
        Dd::new(-self.hi, -self.lo)
    }

    /// Exact scaling by `2^k` (no overflow or underflow for the callers' `k`).
    fn scale2(self, k: i32) -> Dd {
        let p = pow2(k);
        Dd::new(self.hi * p, self.lo * p)
    }
}

/// `2^k` for `-1022 ≤ k ≤ 1023`.
fn pow2(k: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&k));
    f64::from_bits(((1023 + k) as u64) << 52)
}

/// `a + b = s + e` exactly.
#[inline(always)]
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// `a + b = s + e` exactly, when `|a| ≥ |b|` (or `a` is 0).
#[inline(always)]
fn fast_two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    (s, b - (s - a))
}

/// Veltkamp's split: `a = hi + lo` with 26 and 27 significant bits.
#[inline(always)]
fn split(a: f64) -> (f64, f64) {
    let t = 134_217_729.0 * a; // 2^27 + 1
    let hi = t - (t - a);
    (hi, a - hi)
}

/// `a · b = p + e` exactly (Dekker; no fused multiply-add needed).
#[inline(always)]
fn two_prod(a: f64, b: f64) -> (f64, f64) {
    let p = a * b;
    let (ah, al) = split(a);
    let (bh, bl) = split(b);
    (p, ((ah * bh - p) + ah * bl + al * bh) + al * bl)
}

#[inline(always)]
fn add(x: Dd, y: Dd) -> Dd {
    let (s, e) = two_sum(x.hi, y.hi);
    let (t, f) = two_sum(x.lo, y.lo);
    let (s, e) = fast_two_sum(s, e + t);
    let (hi, lo) = fast_two_sum(s, e + f);
    Dd::new(hi, lo)
}

#[inline(always)]
fn mul(x: Dd, y: Dd) -> Dd {
    let (p, e) = two_prod(x.hi, y.hi);
    let (hi, lo) = fast_two_sum(p, e + (x.hi * y.lo + x.lo * y.hi));
    Dd::new(hi, lo)
}

#[inline(always)]
fn mul_f(x: Dd, b: f64) -> Dd {
    let (p, e) = two_prod(x.hi, b);
    let (hi, lo) = fast_two_sum(p, e + x.lo * b);
    Dd::new(hi, lo)
}

fn div(x: Dd, y: Dd) -> Dd {
    let q1 = x.hi / y.hi;
    let r = add(x, mul_f(y, q1).neg());
    let q2 = r.hi / y.hi;
    let r = add(r, mul_f(y, q2).neg());
    let q3 = r.hi / y.hi;
    let (hi, lo) = fast_two_sum(q1, q2);
    add(Dd::new(hi, lo), Dd::new(q3, 0.0))
}

/// The f32 nearest to `x.hi + x.lo` (ties to even).
///
/// `hi as f32` is that f32 unless `hi` lies exactly halfway between two f32
/// (every such midpoint is an f64, and `hi` is the f64 nearest to `hi + lo`,
/// so `hi + lo` can only be on the other side of a midpoint that `hi` equals):
/// then the sign of `lo` decides.
fn round_f32(x: Dd) -> f32 {
    let a = x.hi as f32;
    if x.lo == 0.0 || !a.is_finite() || a as f64 == x.hi {
        return a;
    }
    // The f32 on the other side of `hi`.
    let toward_hi = if (a as f64) < x.hi {
        a.next_up()
    } else {
        a.next_down()
    };
    let mid = (a as f64 + toward_hi as f64) / 2.0; // exact: 25 significant bits
    if x.hi != mid {
        return a;
    }
    // `hi` is the midpoint: `hi + lo` is on the side of `lo`.
    if (x.lo > 0.0) == (toward_hi > a) {
        toward_hi
    } else {
        a
    }
}

/// `x - q·π/2` for an f32 `x` with `|x| > π/4`: `(q mod 4, r)` with `r` in
/// `[-π/4, π/4]` as a double-double (see the module docs for the error).
fn reduce(x: f32) -> (u32, Dd) {
    let bits = x.abs().to_bits();
    let m = (bits & 0x7f_ffff) | 0x80_0000; // |x| > π/4 is normal
    let e = (bits >> 23) as i32 - 150; // |x| = m · 2^e, e in [-24, 104]
    // The window starts at bit s = e - 1 of 2/π; earlier bits give multiples
    // of 4 quarter turns. Table bit i sits at padded index i + 63 (a zero word
    // covers i ≤ 0).
    let p = (e - 1 + 63) as usize;
    let word = |j: usize| if j == 0 { 0u64 } else { TWO_OVER_PI[j - 1] };
    let (j, o) = (p / 64, p % 64);
    let (w0, w1, w2) = (word(j), word(j + 1), word(j + 2));
    let (hi, lo) = if o == 0 {
        (w0, w1)
    } else {
        ((w0 << o) | (w1 >> (64 - o)), (w1 << o) | (w2 >> (64 - o)))
    };
    // The kept terms sum to m · W · 2^-126: the low 128 bits `l` of the
    // 152-bit product m · W hold the integer part mod 4 (bits 126, 127) and a
    // 126-bit fraction; the bits above give multiples of 4.
    let l = (m as u128 * hi as u128)
        .wrapping_shl(64)
        .wrapping_add(m as u128 * lo as u128);
    // Round to the nearest quarter turn: a fraction of 1/2 or more goes to q + 1.
    let q = ((l >> 126) as u32).wrapping_add((l >> 125) as u32 & 1);
    let f = (l << 2) as i128; // in [-2^127, 2^127): quarter turns · 2^128
    let a = f.unsigned_abs();
    let u = if a == 0 {
        Dd::new(0.0, 0.0)
    } else {
        // The leading 106 bits of |f| as a double-double (truncated), · 2^-128.
        let n = a.leading_zeros() as i32;
        let t = a << n;
        let h = (t >> 75) as u64; // 53 bits
        let l = ((t >> 22) as u64) & ((1u64 << 53) - 1); // the next 53
        let (h, l) = (h as f64 * pow2(-53 - n), l as f64 * pow2(-106 - n));
        let (h, l) = fast_two_sum(h, l);
        let u = Dd::new(h, l);
        if f < 0 { u.neg() } else { u }
    };
    let r = mul(u, PIO2);
    // -|x| = (-q)·π/2 - r.
    match x < 0.0 {
        true => (q.wrapping_neg() & 3, r.neg()),
        false => (q & 3, r),
    }
}

/// `(cos r, sin r)` for `|r| ≤ π/4` (see the module docs).
fn cos_sin_reduced(r: Dd) -> (Dd, Dd) {
    let z = mul(r, r);
    let zh = z.hi;
    let mut ts = 0.0;
    for &c in SIN_TAIL.iter().rev() {
        ts = c + zh * ts;
    }
    let mut tc = 0.0;
    for &c in COS_TAIL.iter().rev() {
        tc = c + zh * tc;
    }
    let mut s = Dd::new(ts, 0.0);
    for &c in SIN_DD.iter().rev() {
        s = add(c, mul(z, s));
    }
    s = add(Dd::new(1.0, 0.0), mul(z, s));
    let mut c = Dd::new(tc, 0.0);
    for &k in COS_DD.iter().rev() {
        c = add(k, mul(z, c));
    }
    c = add(Dd::new(1.0, 0.0), mul(z, c));
    (c, mul(r, s))
}

/// The relative error bound of [`cos_sin_f64`], with a margin of more than 2
/// over its analysis.
const FAST_EPS: f64 = 1.0 / (1u64 << 50) as f64;

/// `(cos r, sin r)` for `|r| ≤ π/4` in f64 arithmetic, each within
/// [`FAST_EPS`] (relative) of the exact value (see the module docs).
fn cos_sin_f64(r: Dd) -> (f64, f64) {
    let (rh, rl) = (r.hi, r.lo);
    let z = rh * rh;
    let mut ps = 0.0;
    for &c in SIN_TAIL.iter().rev() {
        ps = c + z * ps;
    }
    for c in SIN_DD.iter().rev() {
        ps = c.hi + z * ps;
    }
    let mut pc = 0.0;
    for &c in COS_TAIL.iter().rev() {
        pc = c + z * pc;
    }
    for c in COS_DD[1..].iter().rev() {
        pc = c.hi + z * pc;
    }
    // sin(rh + rl) = sin rh + rl·cos rh; cos(rh + rl) = cos rh - rl·sin rh
    // (the rl² terms are below 2^-106).
    let sin = rh + (rh * z * ps + rl * (1.0 - 0.5 * z));
    let cos = 1.0 - (0.5 * z - (z * z * pc - rh * rl));
    (cos, sin)
}

/// `v` rounded to f32 when every value within `FAST_EPS · |v|` of it rounds
/// to the same f32.
fn round_f32_if_clear(v: f64) -> Option<f32> {
    let d = v.abs() * FAST_EPS;
    let (a, b) = ((v - d) as f32, (v + d) as f32);
    (a == b).then_some(a)
}

/// `(cos x, sin x)` of an f32 `x`, each the correctly rounded f32 (see the
/// module docs for the error bound); NaN for an infinite or NaN `x`.
pub(crate) fn cos_sin(x: f32) -> (f32, f32) {
    if !x.is_finite() {
        return (f32::NAN, f32::NAN);
    }
    if x == 0.0 {
        return (1.0, x); // sin(±0) = ±0
    }
    let (q, r) = if x.abs() <= std::f32::consts::FRAC_PI_4 {
        (0, Dd::new(x as f64, 0.0))
    } else {
        reduce(x)
    };
    let quadrant = |c: f64, s: f64| match q {
        0 => (c, s),
        1 => (-s, c),
        2 => (-c, -s),
        _ => (s, -c),
    };
    let (c, s) = cos_sin_f64(r);
    let (c, s) = quadrant(c, s);
    if let (Some(c), Some(s)) = (round_f32_if_clear(c), round_f32_if_clear(s)) {
        return (c, s);
    }
    let (c, s) = cos_sin_dd(q, r);
    (round_f32(c), round_f32(s))
}

/// `(cos x, sin x)` in double-double from the quadrant `q` and the reduced
/// argument `r` of `x`.
fn cos_sin_dd(q: u32, r: Dd) -> (Dd, Dd) {
    let (c, s) = cos_sin_reduced(r);
    match q {
        0 => (c, s),
        1 => (s.neg(), c),
        2 => (c.neg(), s.neg()),
        _ => (s, c.neg()),
    }
}

/// `ln b` for a positive normal `b`, as a double-double.
fn ln(b: f64) -> Dd {
    let bits = b.to_bits();
    let mut k = ((bits >> 52) & 0x7ff) as i32 - 1023;
    let mut m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52)); // [1, 2)
    if m > std::f64::consts::SQRT_2 {
        m /= 2.0; // exact
        k += 1;
    }
    // m - 1 is exact (Sterbenz); m + 1 needs a second word.
    let (dh, dl) = two_sum(m, 1.0);
    let s = div(Dd::new(m - 1.0, 0.0), Dd::new(dh, dl));
    let w = mul(s, s);
    let mut acc = Dd::new(0.0, 0.0);
    for n in (0..=20).rev() {
        let c = div(Dd::new(1.0, 0.0), Dd::new((2 * n + 1) as f64, 0.0));
        acc = add(c, mul(w, acc));
    }
    let ln_m = mul_f(mul(s, acc), 2.0);
    add(mul_f(LN2, k as f64), ln_m)
}

/// `e^y` for `|y| < 700`, as a double-double.
fn exp(y: Dd) -> Dd {
    let t = y.hi / LN2.hi;
    let j = (t + if t < 0.0 { -0.5 } else { 0.5 }) as i32; // nearest, or next to it
    let r = add(y, mul_f(LN2, j as f64).neg());
    let mut acc = Dd::new(1.0, 0.0);
    for n in (1..=27).rev() {
        acc = add(Dd::new(1.0, 0.0), div(mul(acc, r), Dd::new(n as f64, 0.0)));
    }
    acc.scale2(j)
}

/// `base^e` rounded to f32 (see the module docs), for a positive finite
/// `base` and `|e · ln base| < 64`; NaN for another `base`.
pub(crate) fn pow_f32(base: f64, e: f64) -> f32 {
    if !(base >= f64::MIN_POSITIVE && base.is_finite() && e.is_finite()) {
        return f32::NAN;
    }
    if e == 0.0 || base == 1.0 {
        return 1.0;
    }
    round_f32(exp(mul_f(ln(base), e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a debug build (the CI's `cargo test`) the sweeps take every
    /// `STRIDE`-th input; a release build takes every input.
    const STRIDE: usize = if cfg!(debug_assertions) { 8 } else { 1 };

    /// An input, our `(cos, sin)` and the standard library's.
    type Mismatch = (f32, (f32, f32), (f32, f32));

    /// A `(hi, lo)` double-double.
    type Pair = (f64, f64);

    /// The f32 cosine and sine of the standard library (the C library's f64
    /// functions, rounded to f32). glibc's are accurate enough that their f32
    /// is the correctly rounded one on every input tested here; a less
    /// accurate C library could make these comparisons fail where `cos_sin`
    /// is right (the references of
    /// `the_double_double_path_matches_a_high_precision_reference` decide).
    fn std_cos_sin(x: f32) -> (f32, f32) {
        let x = x as f64;
        (x.cos() as f32, x.sin() as f32)
    }

    /// Compares `cos_sin` with the standard library on `xs`, over two threads;
    /// returns the count and the mismatches (input, ours, std's).
    fn compare(xs: &[f32]) -> Vec<Mismatch> {
        let half = xs.len() / 2;
        let run = |xs: &[f32]| {
            xs.iter()
                .filter_map(|&x| {
                    let (ours, theirs) = (cos_sin(x), std_cos_sin(x));
                    let same = ours.0.to_bits() == theirs.0.to_bits()
                        && ours.1.to_bits() == theirs.1.to_bits();
                    (!same).then_some((x, ours, theirs))
                })
                .collect::<Vec<_>>()
        };
        std::thread::scope(|sc| {
            let a = sc.spawn(|| run(&xs[..half]));
            let mut b = run(&xs[half..]);
            let mut a = a.join().unwrap();
            a.append(&mut b);
            a
        })
    }

    #[test]
    fn rope_angles_match_the_correctly_rounded_f32() {
        let mut checked = 0usize;
        for head_dim in [64, 128] {
            for theta in [10_000.0f32, 500_000.0] {
                let inv = super::super::kernels::inv_freq(
                    head_dim,
                    theta,
                    &crate::config::RopeScaling::None,
                );
                let xs: Vec<f32> = (0..1usize << 17)
                    .step_by(STRIDE)
                    .flat_map(|pos| inv.iter().map(move |&f| pos as f32 * f))
                    .collect();
                checked += xs.len();
                let bad = compare(&xs);
                assert!(
                    bad.is_empty(),
                    "hd {head_dim} theta {theta}: {} mismatches: {:?}",
                    bad.len(),
                    &bad[..bad.len().min(8)]
                );
            }
        }
        assert!(checked >= (24 << 20) / STRIDE, "{checked}");
    }

    #[test]
    fn random_angles_match_the_correctly_rounded_f32() {
        // Uniform in magnitude up to 2^21, and uniform over the bit patterns of
        // [2^-30, 2^21) (every binade equally), both signs.
        let n = (8 << 20) / STRIDE;
        let mut state = 0x243f_6a88_85a3_08d3u64;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let lo = (2.0f32.powi(-30)).to_bits();
        let hi = (2.0f32.powi(21)).to_bits();
        let xs: Vec<f32> = (0..n)
            .map(|i| {
                let r = next();
                let x = if i % 2 == 0 {
                    (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0f32.powi(21)
                } else {
                    f32::from_bits(lo + (r % (hi - lo) as u64) as u32)
                };
                if r & 1 == 1 { -x } else { x }
            })
            .collect();
        let bad = compare(&xs);
        assert!(
            bad.is_empty(),
            "{} mismatches: {:?}",
            bad.len(),
            &bad[..bad.len().min(8)]
        );
    }

    #[test]
    fn huge_and_special_angles_match() {
        // Every binade up to f32::MAX (these use the last words of 2/π), and
        // the f32 closest to multiples of π/2.
        let mut xs: Vec<f32> = Vec::new();
        for e in 0..=254u32 {
            for m in [
                0u32, 1, 0x2a_aaaa, 0x55_5555, 0x7f_ffff, 0x12_3457, 0x6d_b6db,
            ] {
                xs.push(f32::from_bits(e << 23 | m));
                xs.push(-f32::from_bits(e << 23 | m));
            }
        }
        xs.extend([
            f32::from_bits(1),
            f32::MIN_POSITIVE,
            std::f32::consts::FRAC_PI_4,
            std::f32::consts::FRAC_PI_4.next_up(),
            std::f32::consts::FRAC_PI_2,
            std::f32::consts::PI,
            16_367_173.0 * 2.0f32.powi(72),
            13_176_795.0 * 2.0f32.powi(-22),
        ]);
        for k in 1..2000 {
            let x = (k as f64 * std::f64::consts::FRAC_PI_2) as f32;
            xs.extend([x.next_down(), x, x.next_up()]);
        }
        let bad = compare(&xs);
        assert!(
            bad.is_empty(),
            "{} mismatches: {:?}",
            bad.len(),
            &bad[..bad.len().min(8)]
        );
        assert_eq!(cos_sin(0.0), (1.0, 0.0));
        assert_eq!(cos_sin(-0.0).1.to_bits(), (-0.0f32).to_bits());
        assert!(cos_sin(f32::INFINITY).0.is_nan() && cos_sin(f32::NAN).1.is_nan());
    }

    #[test]
    fn powers_match_the_correctly_rounded_f32() {
        // The RoPE exponents 2i/head_dim (rounded to f32, as inv_freq forms
        // them) of many head sizes, for many bases.
        let mut bad = Vec::new();
        let mut n = 0;
        let bases = [
            10_000.0f32,
            500_000.0,
            1_000_000.0,
            5_000_000.0,
            100_000.0,
            1e7,
            2.0,
            3.0,
            0.5,
            1e-3,
            1e9,
        ];
        let step = if cfg!(debug_assertions) { 3 } else { 1 };
        for &b in &bases {
            for hd in (2..=512).step_by(2 * step) {
                for i in 0..hd / 2 {
                    let e = (2 * i) as f32 / hd as f32;
                    n += 1;
                    let ours = pow_f32(b as f64, e as f64);
                    let theirs = (b as f64).powf(e as f64) as f32;
                    if ours.to_bits() != theirs.to_bits() {
                        bad.push((b, e, ours, theirs));
                    }
                }
            }
        }
        // The attention scale head_dim^-0.5.
        for hd in 1..=4096 {
            n += 1;
            let ours = pow_f32(hd as f64, -0.5);
            let theirs = (hd as f64).powf(-0.5) as f32;
            if ours.to_bits() != theirs.to_bits() {
                bad.push((hd as f32, -0.5, ours, theirs));
            }
        }
        assert!(
            bad.is_empty(),
            "{} of {n}: {:?}",
            bad.len(),
            &bad[..bad.len().min(8)]
        );
        assert!(pow_f32(-1.0, 0.5).is_nan() && pow_f32(0.0, 0.5).is_nan());
        assert_eq!(pow_f32(7.0, 0.0), 1.0);
    }

    #[test]
    fn the_f64_path_stays_within_its_bound_of_the_double_double_one() {
        // Reduced arguments of RoPE-like and random angles: the f64 evaluation
        // against the double-double one, relative to the value.
        let n = (1 << 20) / STRIDE;
        let mut worst = 0.0f64;
        let mut fallbacks = 0;
        for i in 0..n {
            let x = (i as f32 * 0.618_034 + 0.5) * if i % 3 == 0 { 1.0 } else { 97.0 };
            let r = if x.abs() <= std::f32::consts::FRAC_PI_4 {
                Dd::new(x as f64, 0.0)
            } else {
                reduce(x).1
            };
            let (c, s) = cos_sin_f64(r);
            let (cd, sd) = cos_sin_reduced(r);
            for (v, d) in [(c, cd), (s, sd)] {
                let exact = d.hi + d.lo;
                worst = worst.max(((v - d.hi) - d.lo).abs() / exact.abs());
                fallbacks += round_f32_if_clear(v).is_none() as usize;
            }
        }
        assert!(
            worst < FAST_EPS / 2.0,
            "worst relative error 2^{}",
            worst.log2()
        );
        assert!(fallbacks < 4, "{fallbacks} fallbacks");
    }

    /// `(x bits, cos x, sin x)` to 106 bits, from a 400-bit evaluation
    /// (mpmath): the three inputs of the RoPE sweeps whose f64 path could not
    /// decide the rounding (45.888397, 82372.4375, 949433.69), the f32 closest
    /// to a multiple of π/2 (16367173·2^72), and others.
    const REFERENCE: [(u32, Pair, Pair); 12] = [
        (
            0x42378db8,
            (-0.32905600965023024, 2.0130656743453856e-17),
            (0.9443104058057751, -4.709164212620198e-18),
        ),
        (
            0x47a0e238,
            (0.9925821721553798, -3.4549110636698285e-17),
            (-0.12157562057957194, 2.120638702407787e-18),
        ),
        (
            0x4967cb9b,
            (0.9189888760381747, 4.0110140556892066e-17),
            (0.39428345859050734, -1.0256782483763994e-17),
        ),
        (
            0x6f79be45,
            (-1.6147697982476211e-09, -7.234752153225392e-26),
            (1.0, -1.3037407506663317e-18),
        ),
        (
            0x3f800000,
            (0.5403023058681398, -4.760954612604417e-17),
            (0.8414709848078965, 1.776845092935536e-18),
        ),
        (
            0xc0400000,
            (-0.9899924966004454, -4.2060261566099734e-17),
            (-0.1411200080598672, -8.577269787017502e-18),
        ),
        (
            0x40490fdb,
            (-0.9999999999999962, 4.661294806430265e-17),
            (-8.742278000372475e-08, 1.3539896193238843e-25),
        ),
        (
            0x49742400,
            (0.9367521275331447, 4.637088260214747e-17),
            (-0.34999350217129294, -1.5952848809323968e-17),
        ),
        (
            0xc7f12065,
            (0.05173494911858269, -3.3168040210541698e-18),
            (0.9986608508596387, 2.734200135813105e-17),
        ),
        (
            0x71c00000,
            (-0.018675384985910634, 9.686117078961283e-19),
            (-0.9998255997900974, 3.640617060048854e-17),
        ),
        (
            0x3f490fdb,
            (0.7071067657322372, 2.7042011115279986e-17),
            (0.7071067966408575, -1.7390423328469496e-17),
        ),
        (
            0x37d1b717,
            (0.9999999996875, 4.1661469800585764e-17),
            (2.4999999365842714e-05, -9.423412739663794e-22),
        ),
    ];

    #[test]
    fn the_double_double_path_matches_a_high_precision_reference() {
        for (b, c, s) in REFERENCE {
            let x = f32::from_bits(b);
            let (q, r) = if x.abs() <= std::f32::consts::FRAC_PI_4 {
                (0, Dd::new(x as f64, 0.0))
            } else {
                reduce(x)
            };
            let got = cos_sin_dd(q, r);
            for (v, (hi, lo)) in [(got.0, c), (got.1, s)] {
                let err = ((v.hi - hi) + (v.lo - lo)).abs() / hi.abs();
                assert!(
                    err < 2f64.powi(-70),
                    "x = {x}: relative error 2^{}",
                    err.log2()
                );
            }
            let want = (round_f32(Dd::new(c.0, c.1)), round_f32(Dd::new(s.0, s.1)));
            assert_eq!(cos_sin(x), want, "x = {x}");
        }
    }

    #[test]
    fn powers_match_a_high_precision_reference() {
        // (base, exponent, base^exponent to 106 bits from a 400-bit mpmath
        // evaluation); the exponents are f32 values, as inv_freq forms them.
        let reference = [
            (10000.0, 0.96875, 7498.942093324558, -2.7060729048372103e-14),
            (
                500000.0,
                0.984375,
                407308.61692827236,
                -4.6934365660885485e-12,
            ),
            (1000000.0, 0.5, 1000.0, 0.0),
            (
                10000.0,
                0.2083333283662796,
                6.812920378900383,
                2.995593946034919e-16,
            ),
            (128.0, -0.5, 0.08838834764831845, -6.042058320908071e-18),
            (
                5000000.0,
                0.3541666567325592,
                235.80434864712768,
                1.0625119469999723e-15,
            ),
            (
                3.0,
                0.3333333432674408,
                1.4422495860477345,
                7.237197685937506e-17,
            ),
        ];
        for (b, e, hi, lo) in reference {
            let v = exp(mul_f(ln(b), e));
            let err = ((v.hi - hi) + (v.lo - lo)).abs() / hi;
            assert!(
                err < 2f64.powi(-90),
                "{b}^{e}: relative error 2^{}",
                err.log2()
            );
            assert_eq!(pow_f32(b, e), round_f32(Dd::new(hi, lo)), "{b}^{e}");
        }
    }

    #[test]
    fn double_double_rounding_to_f32_breaks_ties_with_the_low_word() {
        let a = 1.0f32;
        let mid = (a as f64 + a.next_up() as f64) / 2.0;
        assert_eq!(round_f32(Dd::new(mid, 0.0)), a); // tie to even
        assert_eq!(round_f32(Dd::new(mid, 1e-30)), a.next_up());
        assert_eq!(round_f32(Dd::new(mid, -1e-30)), a);
        let b = 1.0f32.next_up(); // odd
        let mid = (b as f64 + b.next_up() as f64) / 2.0;
        assert_eq!(round_f32(Dd::new(mid, 0.0)), b.next_up());
        assert_eq!(round_f32(Dd::new(mid, -1e-30)), b);
        assert_eq!(round_f32(Dd::new(-mid, 1e-30)), -b);
    }
}
