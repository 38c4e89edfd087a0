//! `fucina::sample::multinomial`: exact draws against `fucina_rng::categorical`,
//! the distribution, and the errors naming the row.

#[path = "../../fucina-exec/tests/child_process/mod.rs"]
#[macro_use]
mod child_process;

use fucina::sample::multinomial;
use fucina::{Error, ExecContext, Tensor};

#[test]
fn draws_are_categorical_of_each_row_at_index_row_times_n_plus_j() {
    let ctx = ExecContext::new();
    let rows: [[f32; 4]; 3] = [
        [0.1, 0.0, 0.6, 0.3],
        [1.0, 1.0, 1.0, 1.0],
        [0.0, 0.0, 0.0, 2.5],
    ];
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let probs = Tensor::from_slice(&ctx, &[3, 4], &flat).unwrap();
    let n = 5;
    let seed = 0x5eed;
    let got = multinomial(&ctx, &probs, n, seed).unwrap();
    assert_eq!(got.shape(), [3, n]);
    let got = got.to_vec();
    for (b, row) in rows.iter().enumerate() {
        for j in 0..n {
            let want = fucina::rng::categorical(seed, (b * n + j) as u64, row).unwrap();
            assert_eq!(got[b * n + j], want as i64, "row {b} draw {j}");
        }
    }
    assert_eq!(&got[2 * n..], [3; 5]);
    // Same seed, same draws; another seed, other draws.
    assert_eq!(multinomial(&ctx, &probs, n, seed).unwrap().to_vec(), got);
    assert_ne!(
        multinomial(&ctx, &probs, n, seed + 1).unwrap().to_vec(),
        got
    );
}

#[test]
fn one_dimensional_probs_give_n_draws() {
    let ctx = ExecContext::new();
    let probs = Tensor::from_slice(&ctx, &[3], &[0.0, 2.0, 0.0]).unwrap();
    let got = multinomial(&ctx, &probs, 4, 1).unwrap();
    assert_eq!(got.shape(), [4]);
    assert_eq!(got.to_vec(), [1, 1, 1, 1]);
}

#[test]
fn frequencies_follow_the_weights_and_zero_weights_are_never_drawn() {
    let ctx = ExecContext::new();
    // Unnormalized weights: 1 : 0 : 3 : 6.
    let probs =
        Tensor::from_slice(&ctx, &[2, 4], &[1.0, 0.0, 3.0, 6.0, 6.0, 3.0, 0.0, 1.0]).unwrap();
    let n = 20_000;
    let got = multinomial(&ctx, &probs, n, 9).unwrap().to_vec();
    let freq = |row: usize, k: i64| {
        got[row * n..(row + 1) * n]
            .iter()
            .filter(|&&v| v == k)
            .count() as f64
            / n as f64
    };
    for (row, want) in [(0, [0.1, 0.0, 0.3, 0.6]), (1, [0.6, 0.3, 0.0, 0.1])] {
        for (k, &p) in want.iter().enumerate() {
            let f = freq(row, k as i64);
            if p == 0.0 {
                assert_eq!(f, 0.0, "row {row}: zero weight {k} drawn");
            } else {
                // ~6 standard deviations at n = 20,000.
                assert!((f - p).abs() < 0.021, "row {row} category {k}: {f} vs {p}");
            }
        }
    }
}

fn invalid_reason(r: fucina::Result<fucina::RawTensor<i64>>) -> String {
    match r {
        Err(Error::InvalidArgument { what, reason }) => {
            assert_eq!(what, "multinomial");
            reason
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn bad_rows_are_errors_naming_the_row() {
    let ctx = ExecContext::new();
    let p = |v: &[f32]| Tensor::from_slice(&ctx, &[3, 2], v).unwrap();
    let r = invalid_reason(multinomial(
        &ctx,
        &p(&[1.0, 0.0, 0.5, -0.5, 1.0, 1.0]),
        2,
        0,
    ));
    assert!(r.contains("row 1") && r.contains("weight 1 is -0.5"), "{r}");
    let r = invalid_reason(multinomial(
        &ctx,
        &p(&[1.0, 0.0, 1.0, 1.0, f32::NAN, 1.0]),
        2,
        0,
    ));
    assert!(r.contains("row 2") && r.contains("NaN"), "{r}");
    let r = invalid_reason(multinomial(&ctx, &p(&[0.0, 0.0, 1.0, 1.0, 1.0, 1.0]), 2, 0));
    assert!(
        r.contains("row 0") && r.contains("every weight is zero"),
        "{r}"
    );
    let r = invalid_reason(multinomial(
        &ctx,
        &p(&[1.0, f32::INFINITY, 1.0, 1.0, 1.0, 1.0]),
        2,
        0,
    ));
    assert!(r.contains("row 0") && r.contains("inf"), "{r}");
}

#[test]
fn bad_shapes_and_counts_are_errors() {
    let ctx = ExecContext::new();
    let cube = Tensor::from_slice(&ctx, &[1, 2, 2], &[1.0; 4]).unwrap();
    let r = invalid_reason(multinomial(&ctx, &cube, 1, 0));
    assert!(r.contains("[1, 2, 2]"), "{r}");
    let ok = Tensor::from_slice(&ctx, &[2, 2], &[1.0; 4]).unwrap();
    let r = invalid_reason(multinomial(&ctx, &ok, 0, 0));
    assert!(r.contains("at least 1"), "{r}");
    // (A zero-sized `probs` cannot be made: the exec layer refuses zero dimensions.)
}

/// `n` draws per row whose result cannot be allocated (16 rows of 2^42 draws:
/// 2^49 bytes, more than any user address space) or whose count overflows are
/// an `Err`, not an abort. Run in a child process with a timeout: before the
/// fix the draws went into a `Vec` whose allocation failure aborted.
#[test]
fn too_many_draws_are_an_error_not_an_abort() {
    in_child!("too_many_draws_are_an_error_not_an_abort");
    let ctx = ExecContext::new();
    let probs = Tensor::from_slice(&ctx, &[16, 2], &[1.0; 32]).unwrap();
    match multinomial(&ctx, &probs, 1 << 42, 7) {
        Err(e) if matches!(e.as_exec(), Some(fucina::ExecError::OutOfMemory { .. })) => {}
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    match multinomial(&ctx, &probs, usize::MAX / 2, 7) {
        Err(e) if matches!(e.as_exec(), Some(fucina::ExecError::Overflow { .. })) => {}
        other => panic!("expected Overflow, got {other:?}"),
    }
    // The context is unharmed.
    assert_eq!(multinomial(&ctx, &probs, 3, 7).unwrap().shape(), [16, 3]);
}
