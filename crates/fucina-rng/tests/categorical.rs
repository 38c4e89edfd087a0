//! The categorical sampler: its distribution (a chi-square test on fixed seeds),
//! determinism, its mapping, and the weight vectors it refuses.

use fucina_rng::{CategoricalError, at, categorical, categorical_fill};

/// Pearson's chi-square statistic of `counts` against `probs * n`.
fn chi_square(counts: &[u64], probs: &[f64], n: u64) -> f64 {
    counts
        .iter()
        .zip(probs)
        .filter(|(_, p)| **p > 0.0)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

#[test]
fn draws_follow_the_weights() {
    // Unnormalized weights, a zero among them.
    let weights = [2.0f32, 0.0, 1.0, 4.0, 0.5, 2.5];
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    let probs: Vec<f64> = weights.iter().map(|&w| f64::from(w) / total).collect();
    let n = 200_000u64;
    for seed in [1u64, 42, 0xDEAD_BEEF] {
        let mut draws = vec![0usize; n as usize];
        categorical_fill(seed, 0, &weights, &mut draws).unwrap();
        let mut counts = [0u64; 6];
        for &k in &draws {
            counts[k] += 1;
        }
        assert_eq!(counts[1], 0, "a zero weight is never drawn");
        // 4 degrees of freedom (5 positive categories): the 99.9% quantile is
        // 18.47. A biased sampler (say one category off by 1%) exceeds it.
        let x2 = chi_square(&counts, &probs, n);
        assert!(
            x2 < 18.47,
            "seed {seed}: chi-square {x2}, counts {counts:?}"
        );
    }
}

#[test]
fn a_biased_draw_would_fail_the_test() {
    // The test's power: the counts of a distribution 2% off on one category
    // (shifted to another) exceed the threshold at this sample size.
    let probs = [0.2, 0.0, 0.1, 0.4, 0.05, 0.25];
    let n = 200_000u64;
    let counts: Vec<u64> = [0.22, 0.0, 0.1, 0.38, 0.05, 0.25]
        .iter()
        .map(|p: &f64| (p * n as f64) as u64)
        .collect();
    assert!(chi_square(&counts, &probs, n) > 18.47);
}

#[test]
fn the_mapping_is_the_inverse_cdf_at_the_counter_uniform() {
    let weights = [0.25f32, 0.25, 0.5];
    for i in 0..1000u64 {
        let u = (at(9, i) >> 11) as f64 / (1u64 << 53) as f64;
        let expected = if u < 0.25 {
            0
        } else if u < 0.5 {
            1
        } else {
            2
        };
        assert_eq!(categorical(9, i, &weights).unwrap(), expected, "draw {i}");
    }
}

#[test]
fn draws_are_deterministic_and_windows_compose() {
    let weights: Vec<f32> = (0..50).map(|k| (k % 7) as f32 * 0.3).collect();
    let mut whole = [0usize; 300];
    categorical_fill(5, 0, &weights, &mut whole).unwrap();
    let mut again = [0usize; 300];
    categorical_fill(5, 0, &weights, &mut again).unwrap();
    assert_eq!(whole, again);
    let mut parts = [0usize; 300];
    categorical_fill(5, 0, &weights, &mut parts[..100]).unwrap();
    categorical_fill(5, 100, &weights, &mut parts[100..]).unwrap();
    assert_eq!(whole, parts);
    for (i, &k) in whole.iter().enumerate() {
        assert_eq!(categorical(5, i as u64, &weights).unwrap(), k);
    }
    // Another seed gives another sequence.
    let mut other = [0usize; 300];
    categorical_fill(6, 0, &weights, &mut other).unwrap();
    assert_ne!(whole, other);
}

#[test]
fn a_single_positive_weight_is_always_drawn() {
    let weights = [0.0f32, 0.0, 1e-30, 0.0];
    for i in 0..1000 {
        assert_eq!(categorical(3, i, &weights).unwrap(), 2);
    }
    assert_eq!(categorical(3, 0, &[7.0]).unwrap(), 0);
    // Huge weights do not overflow the f64 total.
    assert!(categorical(3, 0, &[f32::MAX; 4]).unwrap() < 4);
}

#[test]
fn weights_that_are_not_a_distribution_are_errors() {
    assert_eq!(categorical(1, 0, &[]), Err(CategoricalError::Empty));
    assert_eq!(
        categorical(1, 0, &[0.0, 0.0, 0.0]),
        Err(CategoricalError::ZeroTotal)
    );
    assert_eq!(
        categorical(1, 0, &[0.5, -0.1]),
        Err(CategoricalError::InvalidWeight {
            index: 1,
            value: -0.1
        })
    );
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let err = categorical(1, 0, &[0.5, 0.2, bad]).unwrap_err();
        assert!(
            matches!(err, CategoricalError::InvalidWeight { index: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("weight 2"), "{err}");
    }
    // Nothing is written when the weights are refused.
    let mut out = [99usize; 8];
    assert!(categorical_fill(1, 0, &[1.0, f32::NAN], &mut out).is_err());
    assert_eq!(out, [99; 8]);
    assert_eq!(
        categorical_fill(1, 0, &[0.0], &mut out),
        Err(CategoricalError::ZeroTotal)
    );
    assert_eq!(out, [99; 8]);
}
