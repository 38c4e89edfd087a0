//! The documented contract-violation panics.

use fucina_rng::{kaiming_uniform_fill, randint_fill};

#[test]
#[should_panic(expected = "randint_fill: requires low < high (got low = 5, high = 5)")]
fn randint_fill_empty_interval_panics() {
    randint_fill(1, &mut [0i64; 4], 5, 5);
}

#[test]
#[should_panic(expected = "randint_fill: requires low < high (got low = 3, high = -3)")]
fn randint_fill_reversed_interval_panics() {
    randint_fill(1, &mut [0i64; 4], 3, -3);
}

#[test]
#[should_panic(expected = "randint_fill: requires low < high")]
fn randint_fill_panics_even_for_empty_output() {
    randint_fill(1, &mut [], 0, 0);
}

#[test]
#[should_panic(expected = "kaiming_uniform_fill: fan_in must be at least 1 (got 0)")]
fn kaiming_zero_fan_in_panics() {
    kaiming_uniform_fill(1, &mut [0.0f32; 4], 0);
}

#[test]
fn panicking_fills_leave_output_untouched() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let mut out = [7i64; 4];
    assert!(catch_unwind(AssertUnwindSafe(|| randint_fill(1, &mut out, 1, 0))).is_err());
    assert_eq!(out, [7; 4]);
    let mut w = [0.5f32; 3];
    assert!(catch_unwind(AssertUnwindSafe(|| kaiming_uniform_fill(1, &mut w, 0))).is_err());
    assert_eq!(w, [0.5; 3]);
}
