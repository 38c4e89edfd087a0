//! `ExecContext::bf16_matmul_amx_rule`: every path (AMX tiles where the CPU has
//! them, the AVX-512 emulation, the portable emulation at every vector level)
//! gives the same bits, and those are the bits of an independent scalar model
//! of the rule written here (IEEE `mul_add` plus the flush rule); shapes that
//! are not multiples of the tiles, special values (NaN, infinities, bf16
//! subnormals, sums near 2^-126, overflow), 1-4 threads, row independence,
//! hand-computed cases, an f64 reference within a tolerance, bad input and no
//! heap allocation at steady state. The vector level and the AMX switch are
//! process-wide, so the tests that change them hold one lock.

#![allow(clippy::result_large_err)]

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use fucina_exec::{
    ExecContext, ExecError, PackedBf16Matrix, SimdLevel, WeightFormat, WeightMatrix, amx_available,
    amx_rule_path, amx_rule_path_for, detected_simd_level, force_amx, force_simd_level,
    set_amx_rule_min_rows,
};

#[path = "../../fucina-thread/tests/support/counting.rs"]
mod counting;
use counting::{ALLOCATIONS, Counting, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

static LOCK: Mutex<()> = Mutex::new(());

const DEFAULT_NAN: u32 = 0xFFC0_0000;

// ------------------------------------------------------------ the oracle

/// f32 to bf16 by picking the nearer neighbour (ties to the even one), NaN
/// quiet, then subnormal bf16 to a signed zero.
fn o_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let h = if x.is_nan() {
        ((b >> 16) | 0x40) as u16
    } else {
        let lo = (b >> 16) as u16;
        let hi = lo.wrapping_add(1);
        let (vl, vh) = (
            f64::from(f32::from_bits(u32::from(lo) << 16)),
            f64::from(f32::from_bits(u32::from(hi) << 16)),
        );
        let v = f64::from(x);
        if (hi & 0x7f80) == 0x7f80 && (lo & 0x7f80) != 0x7f80 {
            // The next one up is the infinity: round to it past the midpoint
            // between the largest bf16 and 2^128.
            let mid = vl + (vl.abs() * 2f64.powi(-8)).copysign(vl);
            if v.abs() >= mid.abs() && (lo & 1 == 1 || v.abs() > mid.abs()) {
                hi
            } else {
                lo
            }
        } else if (lo & 0x7f80) == 0x7f80 {
            lo
        } else {
            let (dl, dh) = ((v - vl).abs(), (vh - v).abs());
            if dl < dh || (dl == dh && lo & 1 == 0) {
                lo
            } else {
                hi
            }
        }
    };
    if h & 0x7f80 == 0 { h & 0x8000 } else { h }
}

fn bf(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

fn quiet(x: f32) -> f32 {
    f32::from_bits(x.to_bits() | 0x0040_0000)
}

/// One step with IEEE `mul_add`, then the flush rule.
fn o_step(acc: f32, x: f32, y: f32) -> f32 {
    for v in [x, y, acc] {
        if v.is_nan() {
            return quiet(v);
        }
    }
    let r = x.mul_add(y, acc);
    if r.is_nan() {
        return f32::from_bits(DEFAULT_NAN);
    }
    let sign = f32::from_bits(r.to_bits() & 0x8000_0000);
    if r.is_subnormal() {
        return sign;
    }
    if r.abs() == f32::MIN_POSITIVE {
        // The exact sum is within 2^-150 of 2^-126: both terms are that
        // small, so the f64 sum is exact. It flushes when its unbounded
        // 24-bit rounding stays below 2^-126.
        let exact = f64::from(acc) + f64::from(x) * f64::from(y);
        if exact.abs() < f64::from(f32::MIN_POSITIVE) - 2f64.powi(-151) {
            return sign;
        }
    }
    r
}

fn o_add(x: f32, y: f32) -> f32 {
    for v in [x, y] {
        if v.is_nan() {
            return quiet(v);
        }
    }
    let r = x + y;
    if r.is_nan() {
        return f32::from_bits(DEFAULT_NAN);
    }
    if r.is_subnormal() {
        return f32::from_bits(r.to_bits() & 0x8000_0000);
    }
    r
}

/// The rule for one output: `a` the activation row (f32), `w` the weight row.
fn o_dot(a: &[f32], w: &[u16]) -> f32 {
    let mut c = 0.0f32;
    for (ab, wb) in a.chunks(32).zip(w.chunks(32)) {
        let (mut e, mut o) = (0.0f32, 0.0f32);
        for (kk, (&x, &y)) in ab.iter().zip(wb).enumerate() {
            let (x, y) = (
                bf(o_bf16(x)),
                bf(if y & 0x7f80 == 0 { y & 0x8000 } else { y }),
            );
            if kk % 2 == 0 {
                e = o_step(e, x, y);
            } else {
                o = o_step(o, x, y);
            }
        }
        c = o_add(c, o_add(e, o));
    }
    c
}

// ------------------------------------------------------------ helpers

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn normal_f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    }
}

#[derive(Clone, Copy, Debug)]
enum Class {
    /// Moderate values: exact ties and cancellations are common.
    Plain,
    /// Products near 2^-126: partial sums straddle the flush threshold.
    Boundary,
    /// bf16 subnormals, NaN (quiet and signalling), infinities, huge values.
    Special,
    /// Exponent fields 70-72: the sums of a row's and a panel's smallest
    /// exponents straddle 142, where the AVX-512 emulation switches between
    /// its plain kernel and the portable one.
    Gate,
    /// Activation exponent fields 64-67, weights 66-73 (sums 130-140, below
    /// the AVX-512 emulation's 142): products of 2^-124 to 2^-114 whose
    /// partial sums sometimes cancel to below 2^-126 and flush.
    NearGate,
}

fn gen_bf16(r: &mut Rng, c: Class) -> u16 {
    let sign = ((r.next() & 1) as u16) << 15;
    let man = (r.next() & 0x7f) as u16;
    match c {
        Class::Plain => sign | ((121 + r.below(12) as u16) << 7) | (man & 0x70),
        Class::Boundary => {
            let e = [64u16, 63, 65, 52, 51, 53, 76, 75][r.below(8) as usize];
            let m = if r.below(2) == 0 {
                man
            } else {
                [0, 0x7f, 0x40, 1][r.below(4) as usize]
            };
            sign | (e << 7) | m
        }
        Class::Gate => sign | ((70 + r.below(3) as u16) << 7) | man,
        Class::NearGate => sign | ((64 + r.below(4) as u16) << 7) | man,
        Class::Special => match r.below(24) {
            0 => sign | 0x7f80,
            1 => sign | 0x7fc0 | (man & 0x3f),
            2 => sign | 0x7f80 | (man & 0x3f).max(1),
            3 => sign | man.max(1),
            4 => sign | (250 << 7) | man,
            _ => sign | ((118 + r.below(18) as u16) << 7) | man,
        },
    }
}

/// Activations: bf16 values of the class with random low bits (so that the
/// rounding to bf16 matters), sometimes zero.
fn gen_x(r: &mut Rng, c: Class) -> f32 {
    if r.below(10) == 0 {
        return 0.0;
    }
    let h = gen_bf16(r, c);
    let v = f32::from_bits((u32::from(h) << 16) | (r.next() & 0xffff) as u32);
    if r.below(16) == 0 {
        // Exact ties of the bf16 rounding.
        f32::from_bits((u32::from(h) << 16) | 0x8000)
    } else {
        v
    }
}

struct Case {
    m: usize,
    k: usize,
    n: usize,
    x: Vec<f32>,
    w: Vec<u16>,
}

impl Case {
    fn random(seed: u64, m: usize, k: usize, n: usize, class: Class) -> Case {
        let mut r = Rng(seed);
        let x: Vec<f32> = (0..m * k).map(|_| gen_x(&mut r, class)).collect();
        let mut w: Vec<u16> = (0..n * k)
            .map(|_| match class {
                Class::NearGate => {
                    gen_bf16(&mut r, Class::Plain) & 0x807f | ((66 + r.below(8) as u16) << 7)
                }
                _ => gen_bf16(&mut r, class),
            })
            .collect();
        // Engineered cancellation: some weight pairs negate each other.
        for j in 0..n {
            if r.below(3) == 0 {
                for p in 0..k / 2 {
                    if r.below(2) == 0 {
                        w[j * k + 2 * p + 1] = w[j * k + 2 * p] ^ 0x8000;
                    }
                }
            }
        }
        Case { m, k, n, x, w }
    }
    fn bytes(&self) -> Vec<u8> {
        self.w.iter().flat_map(|h| h.to_le_bytes()).collect()
    }
    fn packed(&self) -> PackedBf16Matrix {
        let bytes = self.bytes();
        PackedBf16Matrix::new(
            &WeightMatrix::new(WeightFormat::BF16, self.n, self.k, &bytes).unwrap(),
        )
        .unwrap()
    }
    fn oracle(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.m * self.n);
        for i in 0..self.m {
            for j in 0..self.n {
                let a = &self.x[i * self.k..(i + 1) * self.k];
                let w = &self.w[j * self.k..(j + 1) * self.k];
                out.push(o_dot(a, w).to_bits());
            }
        }
        out
    }
}

/// Every (vector level, AMX on/off) this machine can run, with the path it
/// must take.
fn configs() -> Vec<(SimdLevel, bool, &'static str)> {
    let mut v = Vec::new();
    for level in SimdLevel::ALL {
        if level.is_supported() {
            let name = if level == SimdLevel::Avx512 {
                "avx512"
            } else {
                "portable"
            };
            v.push((level, false, name));
        }
    }
    if detected_simd_level() == SimdLevel::Avx512 && amx_available() {
        v.push((SimdLevel::Avx512, true, "amx"));
    }
    v
}

fn set(level: SimdLevel, amx: bool, path: &str) {
    assert!(force_simd_level(level));
    assert!(force_amx(amx));
    assert_eq!(amx_rule_path(), path, "dispatch at {level:?}, amx {amx}");
}

fn restore() {
    force_simd_level(detected_simd_level());
    force_amx(amx_available());
}

fn run(ctx: &ExecContext, c: &Case, w: &PackedBf16Matrix) -> Vec<u32> {
    let mut out = vec![f32::from_bits(0x7fbf_0000); c.m * c.n];
    ctx.bf16_matmul_amx_rule(&c.x, c.m, w, &mut out).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

fn first_diff(a: &[u32], b: &[u32], n: usize) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(p) => format!(
            "first difference at ({}, {}): {:08x} vs {:08x}",
            p / n,
            p % n,
            a[p],
            b[p]
        ),
        None => "same".into(),
    }
}

/// Every path on `c` against the oracle.
fn check_all_paths(ctx: &ExecContext, c: &Case, what: &str) {
    let want = c.oracle();
    let w = c.packed();
    for (level, amx, path) in configs() {
        set(level, amx, path);
        let got = run(ctx, c, &w);
        assert!(
            got == want,
            "{what} m={} k={} n={} path {path} ({level:?}): {}",
            c.m,
            c.k,
            c.n,
            first_diff(&got, &want, c.n)
        );
    }
    restore();
}

// ------------------------------------------------------------ tests

#[test]
fn the_machine_paths_are_the_expected_ones() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let c = configs();
    assert!(c.iter().any(|(_, _, p)| *p == "portable"));
    eprintln!(
        "paths compared here: {:?}",
        c.iter().map(|(_, _, p)| *p).collect::<Vec<_>>()
    );
    restore();
}

#[test]
fn hand_computed_cases() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = ExecContext::new();
    let p = |e: i32| 2f32.powi(e);
    let bfh = |v: f32| (v.to_bits() >> 16) as u16;
    // (x row, w row, expected bits)
    let cases: Vec<(Vec<f32>, Vec<f32>, u32)> = vec![
        // Even 2^24 - 2^24 = 0, odd 1 + 1 = 2 (left to right would give 1).
        (
            vec![p(12), 1.0, -p(12), 1.0],
            vec![p(12), 1.0, p(12), 1.0],
            2.0f32.to_bits(),
        ),
        // Block 1 gives 2^24; block 2 (k = 32, 33) gives 1 + 1 = 2 before
        // it meets C: 2^24 + 2 (two separate adds of 1 would stay at 2^24).
        (
            {
                let mut x = vec![0.0; 34];
                x[0] = p(12);
                x[32] = 1.0;
                x[33] = 1.0;
                x
            },
            {
                let mut w = vec![0.0; 34];
                w[0] = p(12);
                w[32] = 1.0;
                w[33] = 1.0;
                w
            },
            (p(24) + 2.0).to_bits(),
        ),
        // A product below 2^-126 flushes to zero (IEEE: 2^-130).
        (vec![p(-70)], vec![p(-60)], 0),
        // ... one at 2^-120 does not.
        (vec![p(-60)], vec![p(-60)], p(-120).to_bits()),
        // 2^-126 - 2^-150 flushes (IEEE would round it to 2^-126).
        (
            vec![p(-63), 0.0, p(-75), 0.0],
            vec![p(-63), 0.0, -p(-75), 0.0],
            0,
        ),
        // 2^-126 - 2^-152 rounds to 2^-126 with 24 bits and stays.
        (
            vec![p(-63), 0.0, p(-76), 0.0],
            vec![p(-63), 0.0, -p(-76), 0.0],
            p(-126).to_bits(),
        ),
        // C = 1.5·2^-126, then C - 2^-125 = -2^-127 flushes to -0; the last,
        // short block's accumulators flush to -0 too: -0 + (-0 + -0) = -0.
        // (Padding the short block with +0 · +0 would give +0.)
        (
            {
                let mut x = vec![0.0; 66];
                x[0] = 1.5 * p(-63);
                x[32] = p(-63);
                x[33] = p(-63);
                x[64] = -p(-70);
                x[65] = -p(-70);
                x
            },
            {
                let mut w = vec![0.0; 66];
                w[0] = p(-63);
                w[32] = -p(-63);
                w[33] = -p(-63);
                w[64] = p(-60);
                w[65] = p(-60);
                w
            },
            0x8000_0000,
        ),
        // inf · 0 is the x86 default NaN; a NaN activation wins over a NaN
        // weight and comes out quiet.
        (vec![f32::INFINITY, 1.0], vec![0.0, 1.0], DEFAULT_NAN),
        (
            vec![f32::from_bits(0x7f81_2345)],
            vec![f32::from_bits(0xffc1_0000)],
            0x7fc1_0000,
        ),
        // Denormals are zero: a subnormal bf16 weight (2^-133) or activation
        // (1e-39 rounds to a subnormal bf16) contributes nothing.
        (vec![p(100), 1.0], vec![f32::from_bits(0x0001_0000), 0.0], 0),
        (vec![1e-39, 0.0], vec![p(100), 0.0], 0),
        // Activation rounding: 1 + 2^-8 is a tie (to 1), 1 + 3·2^-8 rounds up.
        (
            vec![1.0 + p(-8), 1.0 + 3.0 * p(-8)],
            vec![1.0, 1.0],
            (2.0f32 + p(-6)).to_bits(),
        ),
    ];
    for (ci, (x, wv, want)) in cases.iter().enumerate() {
        let k = x.len();
        let w: Vec<u16> = wv.iter().map(|&v| bfh(v)).collect();
        let c = Case {
            m: 1,
            k,
            n: 1,
            x: x.clone(),
            w,
        };
        assert_eq!(c.oracle()[0], *want, "case {ci}: the oracle");
        check_all_paths(&ctx, &c, &format!("hand case {ci}"));
    }
}

#[test]
fn paths_agree_on_many_shapes() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = ExecContext::new();
    let mut seed = 1;
    for &m in &[1usize, 2, 9, 16, 17, 33] {
        for &k in &[1usize, 2, 3, 31, 32, 33, 64, 95, 130] {
            for &n in &[1usize, 15, 16, 17, 33, 48] {
                seed += 1;
                let c = Case::random(seed, m, k, n, Class::Plain);
                check_all_paths(&ctx, &c, "plain");
            }
        }
    }
}

#[test]
fn paths_agree_on_special_values() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = ExecContext::new();
    for (s, &(m, k, n)) in [
        (5, 64, 16),
        (17, 96, 33),
        (32, 40, 32),
        (3, 161, 20),
        (40, 32, 17),
    ]
    .iter()
    .enumerate()
    {
        for class in [
            Class::Boundary,
            Class::Special,
            Class::Gate,
            Class::NearGate,
        ] {
            for rep in 0..3 {
                let c = Case::random(1000 + 10 * s as u64 + rep, m, k, n, class);
                check_all_paths(&ctx, &c, &format!("{class:?}"));
            }
        }
    }
    // Mixed: plain rows with one boundary or special row (the AVX-512 path
    // takes its fast kernel for some row blocks and not for others).
    let mut c = Case::random(77, 24, 70, 40, Class::Plain);
    let mut r = Rng(5);
    for kk in 0..70 {
        c.x[9 * 70 + kk] = gen_x(&mut r, Class::Boundary);
        c.x[20 * 70 + kk] = gen_x(&mut r, Class::Special);
    }
    for kk in 0..70 {
        c.w[33 * 70 + kk] = gen_bf16(&mut r, Class::Boundary);
    }
    check_all_paths(&ctx, &c, "mixed");
}

/// Deep and tall: the AMX path splits 300 rows at depth 2048 into row blocks
/// (about 1 MiB of activation tiles each) and the depth into chunks.
#[test]
fn deep_and_tall_products() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = ExecContext::with_threads(2);
    let c = Case::random(555, 300, 2048, 40, Class::Plain);
    check_all_paths(&ctx, &c, "deep and tall");
}

#[test]
fn every_thread_count_gives_the_same_bits() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let c = Case::random(4242, 70, 600, 100, Class::Plain); // 19 blocks: AMX depth chunks 8 + 8 + 3
    let w = c.packed();
    let want = c.oracle();
    for (level, amx, path) in configs() {
        set(level, amx, path);
        for threads in 1..=4 {
            let ctx = ExecContext::with_threads(threads);
            let got = run(&ctx, &c, &w);
            assert!(
                got == want,
                "{path} {threads} threads: {}",
                first_diff(&got, &want, c.n)
            );
        }
    }
    restore();
}

#[test]
fn a_row_does_not_depend_on_the_other_rows() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = ExecContext::with_threads(2);
    let mut c = Case::random(99, 37, 100, 50, Class::Plain);
    // One row of special values among plain ones.
    let mut r = Rng(3);
    for kk in 0..100 {
        c.x[5 * 100 + kk] = gen_x(&mut r, Class::Special);
    }
    let w = c.packed();
    for (level, amx, path) in configs() {
        set(level, amx, path);
        let all = run(&ctx, &c, &w);
        for (lo, hi) in [(0, 1), (5, 6), (3, 20), (36, 37), (10, 37)] {
            let sub = Case {
                m: hi - lo,
                k: c.k,
                n: c.n,
                x: c.x[lo * c.k..hi * c.k].to_vec(),
                w: c.w.clone(),
            };
            let got = run(&ctx, &sub, &w);
            assert_eq!(
                got,
                all[lo * c.n..hi * c.n],
                "{path}: rows {lo}..{hi} alone"
            );
        }
    }
    restore();
}

#[test]
fn close_to_an_f64_reference() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = ExecContext::new();
    let (m, k, n) = (8, 2048, 40);
    let mut r = Rng(11);
    let x: Vec<f32> = (0..m * k).map(|_| r.normal_f32()).collect();
    let wv: Vec<f32> = (0..n * k).map(|_| r.normal_f32() * 0.05).collect();
    let w: Vec<u16> = wv.iter().map(|&v| o_bf16(v)).collect();
    let c = Case { m, k, n, x, w };
    let packed = c.packed();
    for (level, amx, path) in configs() {
        set(level, amx, path);
        let got = run(&ctx, &c, &packed);
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut abs) = (0.0f64, 0.0f64);
                for kk in 0..k {
                    let p = f64::from(bf(o_bf16(c.x[i * k + kk]))) * f64::from(bf(c.w[j * k + kk]));
                    s += p;
                    abs += p.abs();
                }
                let g = f64::from(f32::from_bits(got[i * n + j]));
                // 16 fused steps per accumulator, two adds per block and
                // k / 32 blocks, each at most 2^-24 relative to the sum of
                // magnitudes.
                let tol = (16.0 + 2.0 + (k / 32) as f64) * 2f64.powi(-24) * abs;
                assert!(
                    (g - s).abs() <= tol,
                    "{path} ({i},{j}): {g} vs {s} (tol {tol})"
                );
            }
        }
    }
    restore();
}

#[test]
fn zero_depth_gives_positive_zeros() {
    let ctx = ExecContext::new();
    let c = Case {
        m: 3,
        k: 0,
        n: 5,
        x: vec![],
        w: vec![],
    };
    let got = run(&ctx, &c, &c.packed());
    assert!(got.iter().all(|&b| b == 0));
}

#[test]
fn bad_input_is_an_error_naming_the_op() {
    let ctx = ExecContext::new();
    let c = Case::random(1, 2, 8, 3, Class::Plain);
    let w = c.packed();
    let mut out = vec![7.0f32; 6];
    let e = ctx
        .bf16_matmul_amx_rule(&c.x[..15], 2, &w, &mut out)
        .unwrap_err();
    assert!(
        matches!(
            e,
            ExecError::InvalidDataLength {
                op: "bf16_matmul_amx_rule",
                ..
            }
        ),
        "{e}"
    );
    let e = ctx
        .bf16_matmul_amx_rule(&c.x, 2, &w, &mut out[..5])
        .unwrap_err();
    assert!(
        matches!(
            e,
            ExecError::InvalidDataLength {
                op: "bf16_matmul_amx_rule",
                ..
            }
        ),
        "{e}"
    );
    let e = ctx
        .bf16_matmul_amx_rule(&c.x, usize::MAX, &w, &mut out)
        .unwrap_err();
    assert!(
        matches!(
            e,
            ExecError::Overflow {
                op: "bf16_matmul_amx_rule",
                ..
            }
        ),
        "{e}"
    );
    assert!(out.iter().all(|&v| v == 7.0), "nothing written on an error");
    let f32_bytes = vec![0u8; 3 * 8 * 4];
    let wf = WeightMatrix::new(WeightFormat::F32, 3, 8, &f32_bytes).unwrap();
    let e = PackedBf16Matrix::new(&wf).unwrap_err();
    assert!(
        matches!(
            e,
            ExecError::InvalidArgument {
                op: "PackedBf16Matrix::new",
                ..
            }
        ),
        "{e}"
    );
    let short = WeightMatrix {
        format: WeightFormat::BF16,
        rows: 3,
        cols: 8,
        bytes: &f32_bytes[..10],
    };
    let e = PackedBf16Matrix::new(&short).unwrap_err();
    assert!(
        matches!(
            e,
            ExecError::InvalidDataLength {
                op: "PackedBf16Matrix::new",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!((w.rows(), w.cols()), (3, 8));
    assert_eq!(w.size_bytes(), 2 * 1024, "two panels of one 1 KiB tile");
}

/// After a warm-up call, calls allocate nothing (pooled scratch only), on
/// every path, serial and on a team.
#[test]
fn steady_state_calls_allocate_nothing() {
    in_own_process("steady_state_calls_allocate_nothing", || {
        let c = Case::random(8, 40, 100, 50, Class::Plain);
        let w = c.packed();
        let mut out = vec![0.0f32; c.m * c.n];
        for (level, amx, path) in configs() {
            set(level, amx, path);
            for threads in [1, 2] {
                let ctx = ExecContext::with_threads(threads);
                for _ in 0..2 {
                    ctx.bf16_matmul_amx_rule(&c.x, c.m, &w, &mut out).unwrap();
                }
                let before = ALLOCATIONS.load(Ordering::Relaxed);
                for _ in 0..3 {
                    ctx.bf16_matmul_amx_rule(&c.x, c.m, &w, &mut out).unwrap();
                }
                let after = ALLOCATIONS.load(Ordering::Relaxed);
                assert_eq!(after - before, 0, "allocations ({path}, {threads} threads)");
            }
        }
    });
}

#[test]
fn the_counter_counts() {
    counting::check_the_counter();
}

/// The AMX permission is asked by the first call, after the context's worker
/// threads have started: it covers the whole process, so the workers' tile
/// products work and give the rule's bits.
#[test]
fn amx_works_on_workers_started_before_the_permission() {
    in_own_process("amx_works_on_workers_started_before_the_permission", || {
        let ctx = ExecContext::with_threads(4);
        // A parallel op first, so that the team's threads exist.
        let big = ctx.from_slice(&[1 << 20], &vec![1.0f32; 1 << 20]).unwrap();
        let _ = ctx.add(&big, &big).unwrap();
        let c = Case::random(31, 64, 300, 256, Class::Plain);
        let w = c.packed();
        let got = run(&ctx, &c, &w);
        assert_eq!(got, c.oracle(), "path {}", amx_rule_path());
        // (`FUCINA_SIMD` below avx512 or `FUCINA_AMX=off` keep it off the
        // tiles: the bits are checked all the same.)
        let overridden =
            std::env::var_os("FUCINA_SIMD").is_some() || std::env::var_os("FUCINA_AMX").is_some();
        if amx_available() && detected_simd_level() == SimdLevel::Avx512 && !overridden {
            assert_eq!(amx_rule_path(), "amx");
        }
    });
}

/// Set in the child process `fucina_amx_off_turns_the_amx_path_off` starts.
const AMX_OFF_CHILD: &str = "FUCINA_EXEC_AMX_OFF_CHILD";

/// `FUCINA_AMX=off` (read once per process) keeps the product off the AMX
/// tiles: run in a child process of this binary with the variable set, the
/// path is the AVX-512 or the portable emulation (on a CPU without AMX it
/// never is AMX, so only an AMX machine can fail this).
#[test]
fn fucina_amx_off_turns_the_amx_path_off() {
    if std::env::var_os(AMX_OFF_CHILD).is_some() {
        assert_ne!(fucina_exec::amx_rule_path(), "amx", "FUCINA_AMX=off");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("current_exe"))
        .args([
            "--exact",
            "fucina_amx_off_turns_the_amx_path_off",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(AMX_OFF_CHILD, "1")
        .env("FUCINA_AMX", "off")
        .output()
        .expect("spawn the child test process");
    assert!(
        out.status.success(),
        "the child with FUCINA_AMX=off failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ------------------------------------------------------------ small calls and blocking

/// Decode-sized calls: below the row threshold the op takes the AVX-512
/// emulation even with AMX on (its multi-panel kernel for up to 8 rows,
/// the one-panel kernel and the portable emulation for rows and panels that
/// fail the no-flush check); every `m` from 1 to 40 gives the bits of the
/// AMX path (threshold 0: every call on the tiles) and of the portable
/// emulation, on 1 and 2 threads (so that the panels of a thread's share
/// come in groups of 4, 2 and 1).
#[test]
fn few_row_calls_give_the_bits_of_the_amx_and_portable_paths() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let amx = detected_simd_level() == SimdLevel::Avx512 && amx_available();
    let threshold = set_amx_rule_min_rows(0);
    set_amx_rule_min_rows(threshold);
    assert!(
        (2..=9).contains(&threshold),
        "the default threshold {threshold}"
    );
    let mut seed = 9000;
    for &(k, n, ms) in &[
        (64usize, 48usize, &(1..=40).collect::<Vec<usize>>()),
        (576, 192, &vec![1, 2, 3, 5, 7, 8, 9, 17, 33]),
        (32, 16, &vec![1, 4, 8, 31]),
        (100, 112, &vec![1, 2, 6, 8, 16]),
    ] {
        for &m in ms.iter() {
            seed += 1;
            let mut c = Case::random(seed, m, k, n, Class::Plain);
            if m % 3 == 2 {
                // One row and 16 weight rows below the emulation's no-flush
                // gate, with products whose sums sometimes flush: the
                // panels holding those weight rows take the portable
                // emulation for this call, the others the fast kernels.
                let mut r = Rng(seed);
                for kk in 0..k {
                    c.x[(m / 2) * k + kk] = gen_x(&mut r, Class::NearGate);
                }
                for j in (n / 3)..(n / 3 + 16).min(n) {
                    for kk in 0..k {
                        c.w[j * k + kk] = gen_bf16(&mut r, Class::Plain) & 0x807f
                            | ((66 + r.below(8) as u16) << 7);
                    }
                }
            }
            let w = c.packed();
            for threads in [1, 2] {
                let ctx = ExecContext::with_threads(threads);
                assert!(force_simd_level(SimdLevel::Portable));
                let want = run(&ctx, &c, &w);
                restore();
                if detected_simd_level() == SimdLevel::Avx512 {
                    assert!(force_amx(amx));
                    let path = amx_rule_path_for(m);
                    assert_eq!(
                        path,
                        if amx && m >= threshold {
                            "amx"
                        } else {
                            "avx512"
                        },
                        "m = {m}"
                    );
                    let got = run(&ctx, &c, &w);
                    assert!(
                        got == want,
                        "{path} m={m} k={k} n={n} {threads} threads vs portable: {}",
                        first_diff(&got, &want, n)
                    );
                    if amx {
                        set_amx_rule_min_rows(0);
                        assert_eq!(amx_rule_path_for(m), "amx");
                        let tiles = run(&ctx, &c, &w);
                        set_amx_rule_min_rows(threshold);
                        assert!(
                            tiles == want,
                            "amx m={m} k={k} n={n} {threads} threads vs portable: {}",
                            first_diff(&tiles, &want, n)
                        );
                    }
                }
            }
        }
    }
    set_amx_rule_min_rows(threshold);
    restore();
}

/// The blocking of the AMX driver and of the emulations at their edges:
/// rows not a multiple of 16 or 32, 1 to 13 panels (odd counts padded to
/// even), depths of one block, two blocks and 18 (two chunks and a short
/// one), on 1 and 3 threads, every path against the scalar model.
#[test]
fn blocking_edge_cases() {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut seed = 7000;
    for &(m, k, n) in &[
        (33usize, 32usize, 16usize),
        (47, 64, 48),
        (64, 576, 192),
        (100, 576, 80),
        (31, 64, 208),
        (16, 32, 192),
        (65, 96, 16),
    ] {
        for threads in [1, 3] {
            seed += 1;
            let ctx = ExecContext::with_threads(threads);
            let c = Case::random(seed, m, k, n, Class::Plain);
            check_all_paths(&ctx, &c, &format!("blocking, {threads} threads"));
        }
    }
}

/// Decode-sized calls allocate nothing either, on the emulation's
/// multi-panel kernel and on the AMX tiles.
#[test]
fn steady_state_few_row_calls_allocate_nothing() {
    in_own_process("steady_state_few_row_calls_allocate_nothing", || {
        for m in [1, 5, 8] {
            let c = Case::random(80 + m as u64, m, 576, 192, Class::Plain);
            let w = c.packed();
            let mut out = vec![0.0f32; c.m * c.n];
            for min_rows in [usize::MAX, 0] {
                set_amx_rule_min_rows(min_rows);
                for threads in [1, 2] {
                    let ctx = ExecContext::with_threads(threads);
                    for _ in 0..2 {
                        ctx.bf16_matmul_amx_rule(&c.x, c.m, &w, &mut out).unwrap();
                    }
                    let before = ALLOCATIONS.load(Ordering::Relaxed);
                    for _ in 0..3 {
                        ctx.bf16_matmul_amx_rule(&c.x, c.m, &w, &mut out).unwrap();
                    }
                    let after = ALLOCATIONS.load(Ordering::Relaxed);
                    assert_eq!(
                        after - before,
                        0,
                        "allocations (m {m}, {} , {threads} threads)",
                        amx_rule_path_for(m)
                    );
                }
            }
        }
    });
}
