//! Bit-for-bit reproduction of the reference implementation's outputs
//! (`tests/data/rng-goldens-seed42.json`, as published with the reference).

use fucina_rng::*;
use serde_json::Value;

fn goldens() -> Value {
    serde_json::from_str(include_str!("data/rng-goldens-seed42.json")).expect("golden file parses")
}

fn cases<'a>(g: &'a Value, name: &str) -> &'a [Value] {
    let list = g["functions"][name]
        .as_array()
        .unwrap_or_else(|| panic!("no golden cases for {name}"));
    assert!(!list.is_empty(), "no golden cases for {name}");
    list
}

fn hex_u64(v: &Value) -> u64 {
    let s = v.as_str().expect("hex string");
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex u64")
}

fn u64_obj(v: &Value) -> u64 {
    let h = hex_u64(&v["hex"]);
    let d: u64 = v["dec"]
        .as_str()
        .expect("dec string")
        .parse()
        .expect("dec u64");
    assert_eq!(h, d, "golden file inconsistent: {v}");
    h
}

fn dec_u64(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().expect("decimal"),
        _ => v.as_u64().expect("integer"),
    }
}

fn dec_i64(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().expect("decimal"),
        _ => v.as_i64().expect("integer"),
    }
}

fn seed(case: &Value) -> u64 {
    let s = hex_u64(&case["seed"]);
    assert_eq!(s, dec_u64(&case["seed_dec"]));
    s
}

fn len(case: &Value) -> usize {
    dec_u64(&case["n"]) as usize
}

/// An f32 parameter: the `<name>_bits` pattern when present (authoritative),
/// checked against the decimal value.
fn f32_param(case: &Value, name: &str) -> f32 {
    let value = case[name]
        .as_f64()
        .unwrap_or_else(|| panic!("param {name}")) as f32;
    match case.get(format!("{name}_bits")) {
        Some(bits) => {
            let b = f32::from_bits(hex_u64(bits) as u32);
            assert_eq!(b, value, "golden {name} bits vs value");
            b
        }
        None => value,
    }
}

/// Expected f32 bit patterns of a case's `out`.
fn expected_bits(case: &Value) -> Vec<u32> {
    case["out"]
        .as_array()
        .expect("out")
        .iter()
        .map(|o| {
            let bits = hex_u64(&o["bits"]) as u32;
            let value = o["value"].as_f64().expect("value") as f32;
            assert_eq!(f32::from_bits(bits), value, "golden bits vs decimal");
            bits
        })
        .collect()
}

fn expected_i64(case: &Value) -> Vec<i64> {
    case["out"]
        .as_array()
        .expect("out")
        .iter()
        .map(dec_i64)
        .collect()
}

#[track_caller]
fn assert_bits(name: &str, got: &[f32], want: &[u32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            *w,
            "{name}[{i}]: got {g:e} ({:#010x}), want {:e} ({w:#010x})",
            g.to_bits(),
            f32::from_bits(*w)
        );
    }
}

#[test]
fn splitmix64_sequence() {
    let g = goldens();
    for case in cases(&g, "splitmix64") {
        let mut state = seed(case);
        let outputs = case["outputs"].as_array().unwrap();
        assert_eq!(outputs.len() as u64, dec_u64(&case["count"]));
        for (i, want) in outputs.iter().enumerate() {
            assert_eq!(splitmix64(&mut state), u64_obj(want), "output {i}");
        }
        assert_eq!(state, u64_obj(&case["state_after"]));
    }
}

#[test]
fn at_values() {
    let g = goldens();
    for case in cases(&g, "at") {
        let i = dec_u64(&case["i"]);
        assert_eq!(
            at(seed(case), i),
            u64_obj(&case["value"]),
            "at({:#x}, {i})",
            seed(case)
        );
    }
}

/// Runs every golden case of the f32 function `name` (its reference name):
/// `fill(case, out)` fills a zeroed buffer of the case's length, whose bits
/// must equal the case's `out`.
#[track_caller]
fn check_f32_cases(name: &str, fill: impl Fn(&Value, &mut [f32])) {
    let g = goldens();
    for case in cases(&g, name) {
        let mut out = vec![0.0f32; len(case)];
        fill(case, &mut out);
        assert_bits(name, &out, &expected_bits(case));
    }
}

#[test]
fn gaussian_fill_golden() {
    check_f32_cases("gaussianFill", |c, out| {
        gaussian_fill(seed(c), out, f32_param(c, "scale"));
    });
}

#[test]
fn gaussian_fill_at_golden() {
    check_f32_cases("gaussianFillAt", |c, out| {
        gaussian_fill_at(seed(c), dec_u64(&c["first"]), out, f32_param(c, "scale"));
    });
}

#[test]
fn gaussian_fill_at_fast_golden() {
    check_f32_cases("gaussianFillAtFast", |c, out| {
        gaussian_fill_at_fast(seed(c), dec_u64(&c["first"]), out, f32_param(c, "scale"));
    });
}

#[test]
fn uniform_fill_golden() {
    check_f32_cases("uniformFill", |c, out| {
        uniform_fill(seed(c), out, f32_param(c, "lo"), f32_param(c, "hi"));
    });
}

#[test]
fn kaiming_uniform_fill_golden() {
    check_f32_cases("kaimingUniformFill", |c, out| {
        kaiming_uniform_fill(seed(c), out, dec_u64(&c["fan_in"]) as usize);
    });
}

#[test]
fn normal_fill_golden() {
    check_f32_cases("normalFill", |c, out| {
        normal_fill(seed(c), out, f32_param(c, "mean"), f32_param(c, "std"));
    });
}

#[test]
fn gumbel_fill_golden() {
    check_f32_cases("gumbelFill", |c, out| gumbel_fill(seed(c), out));
}

#[test]
fn randint_fill_golden() {
    let g = goldens();
    for case in cases(&g, "randintFill") {
        let mut out = vec![0i64; len(case)];
        randint_fill(
            seed(case),
            &mut out,
            dec_i64(&case["low"]),
            dec_i64(&case["high"]),
        );
        assert_eq!(out, expected_i64(case));
    }
}

#[test]
fn randperm_fill_golden() {
    let g = goldens();
    for case in cases(&g, "randpermFill") {
        let mut out = vec![-7i64; len(case)];
        randperm_fill(seed(case), &mut out);
        assert_eq!(out, expected_i64(case));
    }
}

#[test]
fn every_golden_function_is_covered() {
    let g = goldens();
    let names: Vec<&str> = g["functions"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let covered = [
        "splitmix64",
        "at",
        "gaussianFill",
        "gaussianFillAt",
        "gaussianFillAtFast",
        "uniformFill",
        "kaimingUniformFill",
        "normalFill",
        "gumbelFill",
        "randintFill",
        "randpermFill",
    ];
    for n in &names {
        assert!(covered.contains(n), "golden function {n} has no test");
    }
}
