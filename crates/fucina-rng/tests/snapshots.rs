//! insta snapshots pinning cases beyond the seed-42 goldens (other seeds,
//! lengths and windows), so no change can move a bit unnoticed. The
//! snapshots list f32 bit patterns (authoritative) with the decimal value.

use fucina_rng::*;
use std::fmt::Write;

fn dump_f32(v: &[f32]) -> String {
    let mut s = String::new();
    for (i, x) in v.iter().enumerate() {
        writeln!(s, "{i:4} {:#010x} {x:e}", x.to_bits()).unwrap();
    }
    s
}

fn dump_u64(v: impl IntoIterator<Item = u64>) -> String {
    v.into_iter().map(|x| format!("{x:#018x}\n")).collect()
}

fn dump_i64(v: &[i64]) -> String {
    v.iter().map(|x| format!("{x}\n")).collect()
}

#[test]
fn stream_other_seeds() {
    let mut s = String::new();
    for seed in [0u64, 1, u64::MAX, 0x0123_4567_89AB_CDEF] {
        writeln!(s, "seed {seed:#x}").unwrap();
        s += &dump_u64((0..6).map(|i| at(seed, i)));
        writeln!(s, "at(seed, 2^63) {:#018x}", at(seed, 1 << 63)).unwrap();
        writeln!(s, "at(seed, u64::MAX) {:#018x}", at(seed, u64::MAX)).unwrap();
    }
    insta::assert_snapshot!(s);
}

#[test]
fn gaussian_fill_seed_7_len_19_scale_1() {
    let mut v = [0.0f32; 19];
    gaussian_fill(7, &mut v, 1.0);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn gaussian_fill_at_seed_max_window_1001_plus_9() {
    let mut v = [0.0f32; 9];
    gaussian_fill_at(u64::MAX, 1001, &mut v, -0.5);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn gaussian_fill_at_huge_first() {
    let mut v = [0.0f32; 5];
    gaussian_fill_at(3, u64::MAX - 2, &mut v, 1.0);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn gaussian_fill_at_fast_seed_0_len_40_scale_1() {
    // 40 values: two 16-wide vector steps and a scalar tail.
    let mut v = [0.0f32; 40];
    gaussian_fill_at_fast(0, 0, &mut v, 1.0);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn gaussian_fill_at_fast_seed_deadbeef_window_12345_plus_21() {
    let mut v = [0.0f32; 21];
    gaussian_fill_at_fast(0xDEAD_BEEF, 12_345, &mut v, 0.02);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn uniform_fill_seed_1_len_19_unit() {
    let mut v = [0.0f32; 19];
    uniform_fill(1, &mut v, 0.0, 1.0);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn uniform_fill_seed_9_len_11_negative_range() {
    let mut v = [0.0f32; 11];
    uniform_fill(9, &mut v, -10.0, -9.5);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn kaiming_uniform_fill_seed_2_fan_in_3() {
    let mut v = [0.0f32; 10];
    kaiming_uniform_fill(2, &mut v, 3);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn normal_fill_seed_4_mean_minus_1_std_3() {
    let mut v = [0.0f32; 9];
    normal_fill(4, &mut v, -1.0, 3.0);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn gumbel_fill_seed_0() {
    let mut v = [0.0f32; 12];
    gumbel_fill(0, &mut v);
    insta::assert_snapshot!(dump_f32(&v));
}

#[test]
fn randint_fill_seed_5_dice_and_wide() {
    let mut v = [0i64; 12];
    randint_fill(5, &mut v, 1, 7);
    let mut s = dump_i64(&v);
    randint_fill(5, &mut v, -1_000_000_000_000, 1_000_000_000_000);
    s += "--\n";
    s += &dump_i64(&v);
    insta::assert_snapshot!(s);
}

#[test]
fn randperm_fill_seed_0_len_20() {
    let mut v = [0i64; 20];
    randperm_fill(0, &mut v);
    insta::assert_snapshot!(dump_i64(&v));
}
