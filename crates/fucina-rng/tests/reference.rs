//! Ports of the ten checks of the reference implementation's `rng_tests.zig`
//! (spec `reference-behaviors.md` section 6), numbered as there.

use fucina_rng::*;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn mean(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64
}

/// 1. The counter form equals the sequential stream.
#[test]
fn check01_counter_form_equals_sequential_stream() {
    for seed in [0u64, 1, 42, 0x0123_4567_89AB_CDEF, u64::MAX] {
        let mut state = seed;
        for i in 0..1000 {
            assert_eq!(splitmix64(&mut state), at(seed, i), "seed {seed:#x}, i {i}");
        }
        let mut rng = SplitMix64::new(seed);
        for i in 0..1000 {
            assert_eq!(rng.next_u64(), at(seed, i));
        }
    }
}

/// 2. uniform_fill: deterministic, in range, right mean, seed-sensitive.
#[test]
fn check02_uniform_fill_range_mean_determinism() {
    let (lo, hi) = (-0.25f32, 0.75f32);
    let mut a = vec![0.0f32; 4096];
    let mut b = vec![0.0f32; 4096];
    uniform_fill(1234, &mut a, lo, hi);
    uniform_fill(1234, &mut b, lo, hi);
    assert_eq!(bits(&a), bits(&b));
    assert!(a.iter().all(|v| *v >= lo && *v < hi));
    assert!((mean(&a) - 0.25).abs() < 0.02, "mean {}", mean(&a));
    uniform_fill(1235, &mut b, lo, hi);
    assert_ne!(bits(&a), bits(&b));
}

/// 3. The half-open bound at the rounding boundary.
#[test]
fn check03_half_open_bound_at_rounding_boundary() {
    const SEED: u64 = 0x3162_8AF6_7B21_31AB;
    let mut state = SEED;
    assert_eq!(splitmix64(&mut state), u64::MAX);
    for (lo, hi) in [(-0.25f32, 0.75f32), (0.0, 1.0), (-1.0, 1.0)] {
        let mut v = [0.0f32; 1];
        uniform_fill(SEED, &mut v, lo, hi);
        assert!(v[0] >= lo && v[0] < hi, "[{lo}, {hi}) gave {}", v[0]);
        // The largest f32 below hi, computed independently of the crate.
        let below = f32::from_bits(hi.to_bits() - 1);
        assert!(below < hi);
        assert_eq!(v[0].to_bits(), below.to_bits(), "[{lo}, {hi})");
        // The same element inside a longer (vectorized) fill.
        let mut long = [0.0f32; 37];
        uniform_fill(SEED, &mut long, lo, hi);
        assert_eq!(long[0].to_bits(), below.to_bits());
    }
}

/// 4. kaiming_uniform_fill: bound, spread, equality with uniform_fill.
#[test]
fn check04_kaiming_uniform() {
    let mut k = vec![0.0f32; 8192];
    kaiming_uniform_fill(77, &mut k, 64);
    let bound = 0.125f32;
    assert!(k.iter().all(|v| *v >= -bound && *v < bound));
    let max = k.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(max > 0.9 * bound, "max |v| = {max}");
    let mut u = vec![0.0f32; 8192];
    uniform_fill(77, &mut u, -bound, bound);
    assert_eq!(bits(&k), bits(&u));
}

/// 5. gaussian_fill_at against gaussian_fill: full, windows, chunks.
#[test]
fn check05_gaussian_fill_at_windows_and_chunks() {
    for seed in [0u64, 42, 0xE5E5_E5E5_E5E5_E5E5] {
        let mut full = vec![0.0f32; 257];
        gaussian_fill(seed, &mut full, 1.5);
        let mut at_full = vec![0.0f32; 257];
        gaussian_fill_at(seed, 0, &mut at_full, 1.5);
        assert_eq!(bits(&full), bits(&at_full), "seed {seed:#x}");
        for (start, n) in [
            (0usize, 1usize),
            (1, 1),
            (1, 2),
            (3, 5),
            (2, 254),
            (255, 2),
            (256, 1),
            (7, 250),
        ] {
            let mut w = vec![0.0f32; n];
            gaussian_fill_at(seed, start as u64, &mut w, 1.5);
            assert_eq!(
                bits(&w),
                bits(&full[start..start + n]),
                "seed {seed:#x} window ({start}, {n})"
            );
        }
        let mut chunked = vec![0.0f32; 257];
        let mut start = 0;
        for n in [3usize, 64, 1, 100, 89] {
            gaussian_fill_at(seed, start as u64, &mut chunked[start..start + n], 1.5);
            start += n;
        }
        assert_eq!(start, 257);
        assert_eq!(bits(&chunked), bits(&full), "seed {seed:#x} chunked");
    }
}

/// 6. gaussian_fill_at_fast: chunking, window, closeness to the exact mapping, moments.
#[test]
fn check06_gaussian_fill_at_fast() {
    for seed in [1u64, 42, 0xDEAD_BEEF_CAFE_F00D] {
        let mut full = vec![0.0f32; 1027];
        gaussian_fill_at_fast(seed, 0, &mut full, 2.0);
        let mut chunked = vec![0.0f32; 1027];
        let mut start = 0;
        for n in [1usize, 7, 16, 3, 500, 499, 1] {
            gaussian_fill_at_fast(seed, start as u64, &mut chunked[start..start + n], 2.0);
            start += n;
        }
        assert_eq!(start, 1027);
        assert_eq!(bits(&chunked), bits(&full), "seed {seed:#x} chunked");
        let mut w = vec![0.0f32; 33];
        gaussian_fill_at_fast(seed, 11, &mut w, 2.0);
        assert_eq!(bits(&w), bits(&full[11..44]));
        let mut exact = vec![0.0f32; 1027];
        gaussian_fill(seed, &mut exact, 2.0);
        for (i, (f, e)) in full.iter().zip(&exact).enumerate() {
            assert!(
                (f - e).abs() <= 1e-5 * e.abs().max(1.0),
                "seed {seed:#x} [{i}]: fast {f} vs exact {e}"
            );
        }
    }
    let mut draws = vec![0.0f32; 65536];
    gaussian_fill_at_fast(9, 0, &mut draws, 1.0);
    let m = mean(&draws);
    let var = draws
        .iter()
        .map(|&x| (f64::from(x) - m).powi(2))
        .sum::<f64>()
        / draws.len() as f64;
    assert!(m.abs() < 0.02, "mean {m}");
    assert!((var - 1.0).abs() < 0.02, "variance {var}");
}

/// 7. normal_fill is gaussian_fill plus explicit moments.
#[test]
fn check07_normal_fill_moments() {
    let mut z = vec![0.0f32; 301];
    gaussian_fill(5, &mut z, 1.0);
    let mut n = vec![0.0f32; 301];
    normal_fill(5, &mut n, 2.0, 0.5);
    for (i, (n, z)) in n.iter().zip(&z).enumerate() {
        assert_eq!(n.to_bits(), (2.0 + 0.5 * z).to_bits(), "[{i}]");
    }
    normal_fill(5, &mut n, 0.0, 1.0);
    assert_eq!(bits(&n), bits(&z));
}

/// 8. gumbel_fill: deterministic, finite, right mean, the documented formula.
#[test]
fn check08_gumbel_fill() {
    let mut a = vec![0.0f32; 4096];
    let mut b = vec![1.0f32; 4096];
    gumbel_fill(123, &mut a);
    gumbel_fill(123, &mut b);
    assert_eq!(bits(&a), bits(&b));
    assert!(a.iter().all(|v| v.is_finite()));
    assert!((mean(&a) - 0.5772).abs() < 0.08, "mean {}", mean(&a));
    // The formula, written independently (with the platform's ln: the f32
    // results agree unless a libm differs in the last f64 bit right at an f32
    // rounding boundary, which these 4096 values do not hit).
    let mut state = 123u64;
    for (i, v) in a.iter().enumerate() {
        let x = splitmix64(&mut state);
        let u = ((x >> 11) as f64 + 0.5) * 2f64.powi(-53);
        let want = (-(-u.ln()).ln()) as f32;
        assert_eq!(v.to_bits(), want.to_bits(), "[{i}]");
    }
}

/// 9. randint_fill: range, coverage, full span, the narrowest span.
#[test]
fn check09_randint_fill() {
    let mut a = vec![0i64; 4096];
    let mut b = vec![0i64; 4096];
    randint_fill(99, &mut a, -3, 5);
    randint_fill(99, &mut b, -3, 5);
    assert_eq!(a, b);
    assert!(a.iter().all(|v| (-3..5).contains(v)));
    for want in -3..5 {
        assert!(a.contains(&want), "value {want} never drawn");
    }
    let mut full = vec![0i64; 4096];
    randint_fill(99, &mut full, i64::MIN, i64::MAX);
    assert!(full.iter().any(|v| *v < 0) && full.iter().any(|v| *v > 0));
    let mut narrow = vec![0i64; 64];
    randint_fill(99, &mut narrow, i64::MAX - 1, i64::MAX);
    assert!(narrow.iter().all(|v| *v == i64::MAX - 1));
}

/// 10. randperm_fill: deterministic true permutation, seed-sensitive, length 1.
#[test]
fn check10_randperm_fill() {
    let mut a = vec![0i64; 257];
    let mut b = vec![5i64; 257];
    randperm_fill(31, &mut a);
    randperm_fill(31, &mut b);
    assert_eq!(a, b);
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..257).collect::<Vec<i64>>());
    assert_ne!(a, sorted, "the identity is not a plausible shuffle of 257");
    randperm_fill(32, &mut b);
    assert_ne!(a, b);
    let mut one = [1234i64];
    randperm_fill(31, &mut one);
    assert_eq!(one, [0]);
    let mut none: [i64; 0] = [];
    randperm_fill(31, &mut none);
}
