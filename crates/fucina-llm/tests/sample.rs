//! The sampler: greedy ties, each processing step against hand-computed cases,
//! seeded determinism, draw frequencies against the softmax, parameter and logit
//! errors, and no allocation per call.

use fucina::diag::CountingAllocator;
use fucina_llm::LlmError;
use fucina_llm::sample::{Sampler, SamplingParams};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator::new();

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: 1234,
        ..SamplingParams::default()
    }
}

/// Draw counts of `n` samples of `logits` (history empty).
fn counts(p: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
    let mut s = Sampler::with_vocab(p, logits.len()).unwrap();
    let mut c = vec![0; logits.len()];
    for _ in 0..n {
        c[s.sample(logits, &[]).unwrap() as usize] += 1;
    }
    c
}

/// Asserts the draw frequencies are within 5 standard deviations of `probs`.
fn assert_frequencies(c: &[usize], probs: &[f64]) {
    let n: usize = c.iter().sum();
    for (k, (&ck, &pk)) in c.iter().zip(probs).enumerate() {
        let f = ck as f64 / n as f64;
        let sd = (pk * (1.0 - pk) / n as f64).sqrt();
        assert!(
            (f - pk).abs() <= 5.0 * sd + 1e-12,
            "token {k}: frequency {f:.4}, probability {pk:.4} (sd {sd:.4}); counts {c:?}"
        );
    }
}

fn softmax(l: &[f64]) -> Vec<f64> {
    let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = l.iter().map(|&x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

#[test]
fn greedy_takes_the_largest_and_the_lowest_id_among_ties() {
    let mut s = Sampler::new(SamplingParams::default()).unwrap();
    assert_eq!(s.sample(&[0.0, 3.0, 1.0, 3.0, 3.0], &[]).unwrap(), 1);
    assert_eq!(s.sample(&[5.0, 5.0], &[]).unwrap(), 0);
    assert_eq!(s.sample(&[f32::NEG_INFINITY, -7.0, -7.0], &[]).unwrap(), 1);
    assert_eq!(s.sample(&[-1.0, -0.5, -2.0], &[]).unwrap(), 1);
    // Top-k and top-p do not change the greedy choice.
    let p = SamplingParams {
        top_k: 1,
        top_p: 0.1,
        ..SamplingParams::default()
    };
    assert_eq!(
        Sampler::new(p)
            .unwrap()
            .sample(&[1.0, 2.0, 2.0], &[])
            .unwrap(),
        1
    );
    assert_eq!(s.step(), 4);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits_once() {
    let p = |r: f32| SamplingParams {
        repetition_penalty: r,
        ..SamplingParams::default()
    };
    // [2, -1, 0.5, 1.8] with tokens 0 and 1 seen, r = 2: [1, -2, 0.5, 1.8].
    let logits = [2.0, -1.0, 0.5, 1.8];
    let mut s = Sampler::new(p(2.0)).unwrap();
    assert_eq!(s.sample(&logits, &[0, 1, 0]).unwrap(), 3);
    assert_eq!(s.sample(&logits, &[]).unwrap(), 0);
    // A token seen twice is penalized once: 2 / 2 = 1 > 0.9 (not 2 / 4 = 0.5).
    assert_eq!(s.sample(&[2.0, 0.9], &[0, 0, 0]).unwrap(), 0);
    assert_eq!(s.sample(&[2.0, 1.1], &[0, 0]).unwrap(), 1);
    // Negative logits are multiplied: -1 * 2 = -2 < -1.5; a penalty below 1
    // favours repeats: -1 * 0.5 = -0.5 > -0.7.
    assert_eq!(s.sample(&[-1.0, -1.5], &[0]).unwrap(), 1);
    let mut favour = Sampler::new(p(0.5)).unwrap();
    assert_eq!(favour.sample(&[-1.0, -0.7], &[0]).unwrap(), 0);
    // Zero is "not positive": multiplied, stays 0.
    assert_eq!(s.sample(&[0.0, -0.1], &[0]).unwrap(), 0);
    // The penalty also applies to sampling: token 0's probability drops from
    // softmax([2, 0]) to softmax([1, 0]).
    let sp = SamplingParams {
        temperature: 1.0,
        repetition_penalty: 2.0,
        seed: 9,
        ..SamplingParams::default()
    };
    let mut s = Sampler::with_vocab(sp, 2).unwrap();
    let mut c = [0usize; 2];
    for _ in 0..20_000 {
        c[s.sample(&[2.0, 0.0], &[0]).unwrap() as usize] += 1;
    }
    assert_frequencies(&c, &softmax(&[1.0, 0.0]));
}

/// A penalty that would push a penalized score past the f32 range saturates it
/// at ±f32::MAX: sampling cannot meet inf - inf, and greedy decoding never
/// picks a token whose logit was -inf over the one finite logit.
#[test]
fn extreme_repetition_penalties_saturate_instead_of_overflowing() {
    let penalized = |r: f32, temperature: f32| SamplingParams {
        repetition_penalty: r,
        temperature,
        seed: 7,
        ..SamplingParams::default()
    };
    // 1e10 / 1e-30 overflows to +inf unsaturated.
    let logits = [1e10f32, 5.0, 4.0];
    for temperature in [0.0, 1.0, 1e-3] {
        let mut s = Sampler::new(penalized(1e-30, temperature)).unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&logits, &[0]).unwrap(), 0, "T = {temperature}");
        }
    }
    // -1e30 · 1e30 overflows to -inf unsaturated, tying with the masked tokens.
    let logits = [f32::NEG_INFINITY, -1e30, f32::NEG_INFINITY];
    for temperature in [0.0, 1.0] {
        let mut s = Sampler::new(penalized(1e30, temperature)).unwrap();
        assert_eq!(s.sample(&logits, &[1]).unwrap(), 1, "T = {temperature}");
        // A -inf logit in the history stays -inf (never unmasked).
        assert_eq!(
            s.sample(&logits, &[0, 1, 2]).unwrap(),
            1,
            "T = {temperature}"
        );
    }
}

#[test]
fn temperature_scales_the_softmax() {
    let logits = [0.0f32, 1.0, 2.0, -1.0, 0.5];
    let l64: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
    for t in [1.0f32, 0.5, 2.0] {
        let c = counts(params(t), &logits, 40_000);
        let scaled: Vec<f64> = l64.iter().map(|x| x / f64::from(t)).collect();
        assert_frequencies(&c, &softmax(&scaled));
    }
    // A tiny temperature is (almost) greedy, and does not overflow.
    let c = counts(params(1e-30), &[1.0, 3.0, 2.0, 3.0e30], 200);
    assert_eq!(c, [0, 0, 0, 200]);
    let c = counts(params(1e-6), &[1.0, 3.0, 2.0], 200);
    assert_eq!(c, [0, 200, 0]);
}

#[test]
fn top_k_keeps_the_k_largest_and_ties_with_the_kth() {
    let p = |k| SamplingParams {
        top_k: k,
        ..params(1.0)
    };
    // k = 2 of [1, 3, 2, 0]: tokens 1 and 2, in the ratio e : 1.
    let c = counts(p(2), &[1.0, 3.0, 2.0, 0.0], 20_000);
    assert_eq!((c[0], c[3]), (0, 0));
    assert_frequencies(
        &c,
        &[0.0, softmax(&[3.0, 2.0])[0], softmax(&[3.0, 2.0])[1], 0.0],
    );
    // k = 2 of [3, 2, 2, 0]: the tie with the 2nd largest is kept (three tokens).
    let c = counts(p(2), &[3.0, 2.0, 2.0, 0.0], 20_000);
    let three = softmax(&[3.0, 2.0, 2.0]);
    assert_frequencies(&c, &[three[0], three[1], three[2], 0.0]);
    // k = 1 is greedy; k >= vocab is off.
    assert_eq!(counts(p(1), &[1.0, 3.0, 2.0], 100), [0, 100, 0]);
    let c = counts(p(7), &[1.0, 3.0, 2.0], 20_000);
    assert_frequencies(&c, &softmax(&[1.0, 3.0, 2.0]));
}

#[test]
fn top_p_keeps_the_smallest_prefix_reaching_p() {
    let probs = [0.5f64, 0.3, 0.15, 0.05];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let p = |top_p| SamplingParams {
        top_p,
        ..params(1.0)
    };
    // Mass ranked above each token: 0, 0.5, 0.8, 0.95.
    assert_eq!(counts(p(0.4), &logits, 300), [300, 0, 0, 0]);
    let c = counts(p(0.79), &logits, 20_000);
    assert_frequencies(&c, &[0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]);
    let c = counts(p(0.81), &logits, 20_000);
    assert_frequencies(&c, &[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]);
    let c = counts(p(1.0), &logits, 20_000);
    assert_frequencies(&c, &probs);
    // The ranking does not depend on the ids' order.
    let rev: Vec<f32> = logits.iter().rev().copied().collect();
    let c = counts(p(0.79), &rev, 20_000);
    assert_frequencies(&c, &[0.0, 0.0, 0.3 / 0.8, 0.5 / 0.8]);
}

#[test]
fn warpers_apply_in_transformers_order() {
    // Temperature before top-p: [2, 1, 0] / 0.5 = [4, 2, 0] has probabilities
    // [0.867, 0.117, 0.016], so top-p 0.8 keeps token 0 alone (top-p first would
    // keep tokens 0 and 1: [0.665, 0.245, 0.090]).
    let p = SamplingParams {
        top_p: 0.8,
        ..params(0.5)
    };
    assert_eq!(counts(p, &[2.0, 1.0, 0.0], 500), [500, 0, 0]);
    // Top-k before top-p: top-k 2 of [0, 0.1, 5] leaves [0.1, 5]; their
    // probabilities [0.0074, 0.9926] and top-p 0.5 keeps token 2 alone.
    let p = SamplingParams {
        top_k: 2,
        top_p: 0.5,
        ..params(1.0)
    };
    assert_eq!(counts(p, &[0.0, 0.1, 5.0], 500), [0, 0, 500]);
    // Top-p after top-k renormalizes over the survivors: top-k 3 of
    // [ln .4, ln .3, ln .2, ln .1] leaves [.4, .3, .2]/.9 = [.444, .333, .222];
    // top-p 0.7 keeps the first two (mass above the third: 0.778 >= 0.7).
    let logits: Vec<f32> = [0.4f64, 0.3, 0.2, 0.1]
        .iter()
        .map(|p| p.ln() as f32)
        .collect();
    let p = SamplingParams {
        top_k: 3,
        top_p: 0.7,
        ..params(1.0)
    };
    let c = counts(p, &logits, 20_000);
    assert_frequencies(&c, &[0.4 / 0.7, 0.3 / 0.7, 0.0, 0.0]);
}

#[test]
fn the_same_seed_gives_the_same_tokens() {
    let logits: Vec<f32> = (0..97).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let p = |seed| SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        repetition_penalty: 1.3,
        seed,
        stop_tokens: vec![],
    };
    let run = |seed| {
        let mut s = Sampler::new(p(seed)).unwrap();
        let mut history = vec![3u32, 5];
        for _ in 0..64 {
            let t = s.sample(&logits, &history).unwrap();
            history.push(t);
        }
        history
    };
    let a = run(42);
    assert_eq!(a, run(42));
    assert_ne!(a, run(43));
    // Each draw is a pure function of (seed, step): resuming at step 10
    // continues the sequence.
    let mut s = Sampler::new(p(42)).unwrap();
    s.set_step(10);
    let mut history = a[..12].to_vec();
    for _ in 10..64 {
        let t = s.sample(&logits, &history).unwrap();
        history.push(t);
    }
    assert_eq!(history, a);
    // A sampler per sequence: other samplers' calls do not disturb it.
    let mut s1 = Sampler::new(p(42)).unwrap();
    let mut s2 = Sampler::new(p(7)).unwrap();
    let mut h1 = vec![3u32, 5];
    for _ in 0..64 {
        s2.sample(&logits, &[]).unwrap();
        let t = s1.sample(&logits, &h1).unwrap();
        h1.push(t);
    }
    assert_eq!(h1, a);
}

#[test]
fn draws_follow_the_documented_mapping() {
    // Without top-k/top-p the draw is categorical(seed, step, exp(l - max)) over
    // the ids in order. With logits whose exp is exact (0 and -inf) the weights
    // are known exactly: [1, 0, 1, 1].
    let logits = [0.0f32, f32::NEG_INFINITY, 0.0, 0.0];
    let mut s = Sampler::new(params(1.0)).unwrap();
    for step in 0..32 {
        let want = fucina::rng::categorical(1234, step, &[1.0, 0.0, 1.0, 1.0]).unwrap();
        assert_eq!(
            s.sample(&logits, &[]).unwrap() as usize,
            want,
            "step {step}"
        );
    }
}

#[test]
fn draws_match_the_softmax_frequencies() {
    // 64 tokens with logits spread over [-3, 3]; the frequencies of 100 000 draws
    // are within 5 standard deviations of the softmax (a sampler that ignored the
    // logits or mis-indexed them fails this).
    let logits: Vec<f32> = (0..64)
        .map(|i| ((i * 29) % 64) as f32 / 64.0 * 6.0 - 3.0)
        .collect();
    let l64: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
    let c = counts(params(1.0), &logits, 100_000);
    assert_frequencies(&c, &softmax(&l64));
}

#[test]
fn stop_tokens() {
    let p = SamplingParams {
        stop_tokens: vec![2, 7],
        ..SamplingParams::default()
    };
    let s = Sampler::new(p).unwrap();
    assert!(s.is_stop(2) && s.is_stop(7));
    assert!(!s.is_stop(0) && !s.is_stop(3));
    assert!(!Sampler::new(SamplingParams::default()).unwrap().is_stop(0));
}

fn invalid(p: SamplingParams, what: &str) {
    match Sampler::new(p.clone()) {
        Err(LlmError::InvalidRequest { reason, .. }) => {
            assert!(reason.contains(what), "{reason:?} should name {what}")
        }
        other => panic!("{p:?}: expected an error naming {what}, got {other:?}"),
    }
}

#[test]
fn bad_parameters_are_errors() {
    for t in [-0.1f32, f32::NAN, f32::INFINITY, -0.0 - 1.0] {
        invalid(params(t), "temperature");
    }
    for top_p in [0.0f32, -0.5, 1.01, f32::NAN, f32::INFINITY] {
        invalid(
            SamplingParams {
                top_p,
                ..params(1.0)
            },
            "top_p",
        );
    }
    for r in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        invalid(
            SamplingParams {
                repetition_penalty: r,
                ..params(1.0)
            },
            "repetition_penalty",
        );
    }
    assert!(
        Sampler::new(SamplingParams {
            top_p: 1.0,
            ..params(0.0)
        })
        .is_ok()
    );
}

#[test]
fn bad_logits_and_history_are_errors_and_change_nothing() {
    for p in [params(0.0), params(1.0)] {
        let mut s = Sampler::new(p).unwrap();
        let mut bad = |logits: &[f32], history: &[u32], what: &str| match s.sample(logits, history)
        {
            Err(LlmError::InvalidRequest { reason, .. }) => {
                assert!(reason.contains(what), "{reason:?} should say {what}")
            }
            other => panic!("expected an error saying {what}, got {other:?}"),
        };
        bad(&[], &[], "no logits");
        bad(&[0.0, f32::NAN], &[], "logit 1 is NaN");
        bad(&[f32::INFINITY, 0.0], &[], "logit 0 is inf");
        bad(&[f32::NEG_INFINITY; 3], &[], "-inf");
        bad(&[0.0, 1.0], &[0, 2], "history token 2");
        assert_eq!(s.step(), 0);
    }
}

#[test]
fn sampling_allocates_nothing_once_sized() {
    let vocab = 4096;
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
        .collect();
    let history: Vec<u32> = (0..300).map(|i| (i * 13) % vocab as u32).collect();
    for p in [
        params(0.0),
        params(0.7),
        SamplingParams {
            top_k: 50,
            top_p: 0.9,
            repetition_penalty: 1.2,
            ..params(0.7)
        },
        SamplingParams {
            top_p: 0.5,
            ..params(1.3)
        },
    ] {
        let mut s = Sampler::with_vocab(p.clone(), vocab).unwrap();
        let (_, n) = CountingAllocator::count_thread(|| {
            for _ in 0..20 {
                std::hint::black_box(s.sample(&logits, &history).unwrap());
            }
        });
        assert_eq!(n, 0, "{p:?}: {n} allocations in 20 sample calls");
        // Sized by the first call when not given the vocabulary.
        let mut s = Sampler::new(p.clone()).unwrap();
        s.sample(&logits, &history).unwrap();
        let (_, n) = CountingAllocator::count_thread(|| s.sample(&logits, &history).unwrap());
        assert_eq!(n, 0, "{p:?}: allocations after the first call");
    }
}

#[test]
fn top_p_with_a_nucleus_of_hundreds_of_tokens() {
    // 1000 tokens of slowly decreasing logits, the ids shuffled: the nucleus of
    // p = 0.5 holds several hundred tokens (more than the sampler ranks by
    // selection before sorting the rest).
    let vocab = 1000usize;
    let rank_of: Vec<usize> = (0..vocab).map(|i| (i * 337) % vocab).collect(); // a permutation
    let logits: Vec<f32> = rank_of.iter().map(|&r| -(r as f32) * 0.001).collect();
    let w: Vec<f64> = (0..vocab).map(|r| (-(r as f64) * 0.001).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut above = 0.0;
    let mut cut = vocab;
    for (r, wr) in w.iter().enumerate() {
        if above >= 0.5 * total {
            cut = r;
            break;
        }
        above += wr;
    }
    assert!((300..700).contains(&cut), "cut {cut}");
    let p = SamplingParams {
        top_p: 0.5,
        ..params(1.0)
    };
    let c = counts(p, &logits, 8_000);
    let drawn_ranks: Vec<usize> = (0..vocab)
        .filter(|&i| c[i] > 0)
        .map(|i| rank_of[i])
        .collect();
    let max_rank = *drawn_ranks.iter().max().unwrap();
    assert!(
        max_rank < cut,
        "rank {max_rank} drawn, the nucleus ends at {cut}"
    );
    assert!(
        max_rank + 3 >= cut,
        "the nucleus's tail is drawn too (max rank {max_rank} of {cut})"
    );
    assert!(
        drawn_ranks.len() + 5 >= cut,
        "{} of {cut} kept tokens drawn",
        drawn_ranks.len()
    );
}
