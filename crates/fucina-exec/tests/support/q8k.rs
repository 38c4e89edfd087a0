//! The reference of the K formats' product with super-block activations
//! (Q4_K, Q5_K, Q6_K; `docs/QUANTIZATION.md`): llama.cpp's Q8_K activation
//! quantization and the documented order, written out plainly.
#![allow(dead_code, unreachable_pub)]

/// Per block of 256: `max` the first value of largest magnitude,
/// `is = −127 / max`, `q = round(is · x)` (ties to even, clamped to ±127),
/// `d = 1 / is`; a zero block `d = 0`, a non-finite one `d = NaN` (q = 0).
pub fn q8k_acts(x: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let (mut q, mut d) = (Vec::new(), Vec::new());
    for b in x.chunks(256) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in b {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if b.iter().any(|v| !v.is_finite()) || amax == 0.0 {
            q.extend(std::iter::repeat_n(0i8, b.len()));
            d.push(if amax == 0.0 && b.iter().all(|v| v.is_finite()) {
                0.0
            } else {
                f32::NAN
            });
            continue;
        }
        let is = -127.0 / max;
        q.extend(
            b.iter()
                .map(|&v| (is * v).round_ties_even().clamp(-127.0, 127.0) as i8),
        );
        d.push(1.0 / is);
    }
    (q, d)
}

/// One output: for each super-block `b` in order, the exact integers
/// `I = Σ_e sc(e) · q(e) · x(e)` and `N = Σ_e mn(e) · x(e)` (`part(b, e)` is
/// element `e`'s `(sc, mn, q)`, `q` signed), then `acc = fma(d · dx, I, acc)`
/// and, where `head(b)` gives a `dmin`, `acc = fma(−(dmin · dx), N, acc)`.
pub fn q8k_dot(
    xq: &[i8],
    xd: &[f32],
    head: impl Fn(usize) -> (f32, Option<f32>),
    part: impl Fn(usize, usize) -> (i32, i32, i32),
) -> f32 {
    let mut acc = 0.0f32;
    for (b, &dx) in xd.iter().enumerate() {
        let (mut i, mut n) = (0i64, 0i64);
        for e in 0..256 {
            let (sc, mn, q) = part(b, e);
            let x = i64::from(xq[256 * b + e]);
            i += i64::from(sc) * i64::from(q) * x;
            n += i64::from(mn) * x;
        }
        let (d, dmin) = head(b);
        acc = (d * dx).mul_add(i32::try_from(i).unwrap() as f32, acc);
        if let Some(dmin) = dmin {
            acc = (-(dmin * dx)).mul_add(i32::try_from(n).unwrap() as f32, acc);
        }
    }
    acc
}
