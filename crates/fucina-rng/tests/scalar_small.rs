//! Small runs of every fill, sized for Miri (`cargo xtask ci` runs this file
//! under `cargo +nightly miri test` when Miri is installed, where the vector
//! paths are not detected and every fill takes its portable path). Each test
//! checks a property that ties two code paths together, so it also fails
//! outside Miri if they drift apart.

use fucina_rng::*;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const SEEDS: [u64; 3] = [0, 42, u64::MAX];

/// 37 values: one whole 16-pair block of the exact fill plus a tail; the
/// windows cut through the block, start on odd elements and end mid-pair.
#[test]
fn exact_gaussian_windows_equal_the_one_shot_fill() {
    for seed in SEEDS {
        let mut whole = [0.0f32; 37];
        gaussian_fill(seed, &mut whole, 1.5);
        let mut parts = [0.0f32; 37];
        let mut start = 0;
        for len in [5usize, 16, 1, 15] {
            gaussian_fill_at(seed, start as u64, &mut parts[start..start + len], 1.5);
            start += len;
        }
        assert_eq!(start, 37);
        assert_eq!(bits(&whole), bits(&parts), "seed {seed:#x}");
        let mut normal = [0.0f32; 37];
        normal_fill(seed, &mut normal, 0.0, 1.5);
        assert_eq!(bits(&whole), bits(&normal), "seed {seed:#x}");
        assert!(whole.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn fast_gaussian_windows_equal_the_one_shot_fill() {
    for seed in SEEDS {
        let mut whole = [0.0f32; 37];
        gaussian_fill_at_fast(seed, 3, &mut whole, 0.5);
        let mut parts = [0.0f32; 37];
        gaussian_fill_at_fast(seed, 3, &mut parts[..20], 0.5);
        gaussian_fill_at_fast(seed, 23, &mut parts[20..], 0.5);
        assert_eq!(bits(&whole), bits(&parts), "seed {seed:#x}");
    }
}

#[test]
fn uniform_kaiming_and_gumbel_stay_in_range() {
    for seed in SEEDS {
        let mut u = [0.0f32; 37];
        uniform_fill(seed, &mut u, -0.25, 0.75);
        assert!(u.iter().all(|v| (-0.25..0.75).contains(v)), "{u:?}");
        let mut prefix = [0.0f32; 20];
        uniform_fill(seed, &mut prefix, -0.25, 0.75);
        assert_eq!(
            bits(&u[..20]),
            bits(&prefix),
            "uniform is a prefix-stable stream"
        );
        let mut k = [0.0f32; 37];
        kaiming_uniform_fill(seed, &mut k, 16);
        assert!(k.iter().all(|v| v.abs() < 0.25), "{k:?}");
        let mut g = [0.0f32; 37];
        gumbel_fill(seed, &mut g);
        assert!(g.iter().all(|v| v.is_finite()), "{g:?}");
    }
}

#[test]
fn integers_and_permutations() {
    for seed in SEEDS {
        let mut dice = [0i64; 37];
        randint_fill(seed, &mut dice, 1, 7);
        assert!(dice.iter().all(|d| (1..7).contains(d)), "{dice:?}");
        let mut perm = [0i64; 21];
        randperm_fill(seed, &mut perm);
        let mut seen = [false; 21];
        for &p in &perm {
            let p = usize::try_from(p).expect("non-negative");
            assert!(!seen[p], "{perm:?} repeats {p}");
            seen[p] = true;
        }
    }
}

#[test]
fn stream_forms_agree() {
    for seed in SEEDS {
        let mut state = seed;
        let mut rng = SplitMix64::new(seed);
        for i in 0..8 {
            let v = splitmix64(&mut state);
            assert_eq!(v, at(seed, i));
            assert_eq!(rng.next_u64(), v);
        }
        let mut bytes = [0u8; 13];
        SplitMix64::new(seed).fill_bytes(&mut bytes);
        let mut want = at(seed, 0).to_le_bytes().to_vec();
        want.extend_from_slice(&at(seed, 1).to_le_bytes()[..5]);
        assert_eq!(bytes.to_vec(), want);
    }
}
