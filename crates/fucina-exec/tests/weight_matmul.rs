//! `ExecContext::weight_matmul`: the bits of the fixed 16-lane order (an
//! independent scalar oracle here) for every weight format, batch size, width,
//! thread count and vector level; batch invariance; bad input; NaN and infinity;
//! no heap allocation at steady state. The vector level is a process-wide
//! setting, so one test walks the levels (other tests of this binary may run at
//! any level meanwhile: every level gives the same bits).

#![allow(clippy::result_large_err)] // ExecError holds inline shapes

mod support;

use std::sync::atomic::Ordering;

use fucina_exec::{
    ExecContext, ExecError, SimdLevel, WeightFormat, WeightMatrix, detected_simd_level,
    force_simd_level, simd_level,
};
use fucina_storage::half::{bf16, f16};
use support::values;

#[path = "../../fucina-thread/tests/support/counting.rs"]
mod counting;
use counting::{ALLOCATIONS, Counting, in_own_process};

#[global_allocator]
static GLOBAL: Counting = Counting;

const FORMATS: [WeightFormat; 3] = [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16];

/// `v` in `format`'s little-endian bytes (rounded to nearest).
fn encode(format: WeightFormat, v: &[f32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(v.len() * format.size_bytes());
    for &x in v {
        match format {
            WeightFormat::F32 => b.extend_from_slice(&x.to_le_bytes()),
            WeightFormat::F16 => b.extend_from_slice(&f16::from_f32(x).to_bits().to_le_bytes()),
            WeightFormat::BF16 => b.extend_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes()),
        }
    }
    b
}

/// Element `i` of `bytes` decoded by hand (independent of the crate's decoder).
fn decode(format: WeightFormat, bytes: &[u8], i: usize) -> f32 {
    match format {
        WeightFormat::F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()),
        WeightFormat::F16 => {
            f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
        }
        WeightFormat::BF16 => {
            f32::from_bits(u32::from(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])) << 16)
        }
    }
}

/// The documented order, written out plainly: lane `k % 16` takes term `k`
/// with a fused multiply-add (`0 · 0` past the end, up to a multiple of 16),
/// then the lanes fold `l + 8`, `+ 4`, `+ 2`, `+ 1`.
fn oracle(x: &[f32], m: usize, w: &WeightMatrix<'_>) -> Vec<f32> {
    let (rows, cols) = (w.rows, w.cols);
    let mut out = vec![0.0; m * rows];
    for i in 0..m {
        for j in 0..rows {
            let mut acc = [0.0f32; 16];
            for k in 0..cols.div_ceil(16) * 16 {
                let (xk, wk) = if k < cols {
                    (x[i * cols + k], decode(w.format, w.bytes, j * cols + k))
                } else {
                    (0.0, 0.0)
                };
                acc[k % 16] = xk.mul_add(wk, acc[k % 16]);
            }
            for width in [8, 4, 2, 1] {
                for l in 0..width {
                    acc[l] += acc[l + width];
                }
            }
            out[i * rows + j] = acc[0];
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The levels this CPU runs, lowest first.
fn levels() -> Vec<SimdLevel> {
    SimdLevel::available().collect()
}

/// One case: weights `[rows, cols]` (stored one byte past an aligned start, so
/// rows are unaligned) and `x` `[m, cols]`, from seeds.
struct Case {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    m: usize,
    raw: Vec<u8>,
    x: Vec<f32>,
}

impl Case {
    fn new(format: WeightFormat, rows: usize, cols: usize, m: usize) -> Case {
        let seed = (rows * 1_000_003 + cols * 1009 + m) as u64;
        let mut raw = vec![0u8];
        raw.extend(encode(format, &values(rows * cols, seed)));
        let x = values(m * cols, seed + 1);
        Case {
            format,
            rows,
            cols,
            m,
            raw,
            x,
        }
    }

    fn w(&self) -> WeightMatrix<'_> {
        WeightMatrix::new(self.format, self.rows, self.cols, &self.raw[1..]).unwrap()
    }

    fn run(&self, ctx: &ExecContext) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.m * self.rows];
        ctx.weight_matmul(&self.x, self.m, &self.w(), &mut out)
            .unwrap();
        out
    }
}

#[test]
fn bits_equal_the_oracle_for_every_format_size_thread_count_and_level() {
    let ms = [1, 2, 3, 7, 8, 17, 64];
    let widths = [1, 15, 16, 17, 31, 64, 100, 576, 1536];
    // Small grids: every m and width, odd and even row counts, one thread.
    let mut cases: Vec<(Case, Vec<usize>)> = Vec::new();
    for format in FORMATS {
        for &m in &ms {
            for &cols in &widths {
                for rows in [1, 6, 9] {
                    cases.push((Case::new(format, rows, cols, m), vec![1]));
                }
            }
        }
        // Enough rows to split over the team (odd counts: uneven chunks).
        for (rows, cols, m) in [
            (261, 576, 1),
            (261, 100, 3),
            (130, 576, 8),
            (67, 1536, 17),
            (33, 576, 64),
            (1031, 64, 1),
            (1031, 17, 2),
        ] {
            cases.push((Case::new(format, rows, cols, m), vec![1, 2, 3, 4]));
        }
    }
    let wants: Vec<Vec<u32>> = cases
        .iter()
        .map(|(c, _)| bits(&oracle(&c.x, c.m, &c.w())))
        .collect();
    let ctxs: Vec<ExecContext> = (1..=4).map(ExecContext::with_threads).collect();
    let levels = levels();
    eprintln!("levels compared: {levels:?}");
    for &level in &levels {
        assert!(force_simd_level(level));
        assert_eq!(simd_level(), level);
        for ((case, threads), want) in cases.iter().zip(&wants) {
            for &t in threads {
                let got = bits(&case.run(&ctxs[t - 1]));
                assert!(
                    &got == want,
                    "{:?} rows {} cols {} m {} threads {t} level {level:?}",
                    case.format,
                    case.rows,
                    case.cols,
                    case.m
                );
            }
        }
    }
    assert!(force_simd_level(detected_simd_level()));
}

#[test]
fn a_row_gives_the_same_bits_alone_and_in_a_batch() {
    let ctx = ExecContext::with_threads(2);
    for format in FORMATS {
        let case = Case::new(format, 301, 100, 17);
        let all = case.run(&ctx);
        for i in 0..case.m {
            let xi = &case.x[i * case.cols..(i + 1) * case.cols];
            let mut alone = vec![0.0; case.rows];
            ctx.weight_matmul(xi, 1, &case.w(), &mut alone).unwrap();
            assert_eq!(
                bits(&alone),
                bits(&all[i * case.rows..(i + 1) * case.rows]),
                "{format:?} row {i}"
            );
            // And inside a batch of different companions (rows i..=i+1 of a
            // shifted batch).
            if i + 1 < case.m {
                let mut two = vec![0.0; 2 * case.rows];
                let x2 = &case.x[i * case.cols..(i + 2) * case.cols];
                ctx.weight_matmul(x2, 2, &case.w(), &mut two).unwrap();
                assert_eq!(bits(&two[..case.rows]), bits(&alone), "{format:?} pair {i}");
            }
        }
    }
}

#[test]
fn bad_input_is_an_error_naming_the_op_and_writes_nothing() {
    let ctx = ExecContext::new();
    let raw = encode(WeightFormat::BF16, &values(12, 3));
    let w = WeightMatrix::new(WeightFormat::BF16, 3, 4, &raw).unwrap();
    let x = values(8, 4);
    let check = |r: Result<(), ExecError>, what: &str| {
        let e = r.expect_err(what);
        assert!(e.to_string().starts_with("weight_matmul"), "{what}: {e}");
    };
    let mut out = vec![7.0f32; 6];
    check(ctx.weight_matmul(&x[..7], 2, &w, &mut out), "short x");
    check(ctx.weight_matmul(&x, 1, &w, &mut out[..3]), "x for m = 2");
    check(ctx.weight_matmul(&x, 2, &w, &mut out[..5]), "short out");
    let mut long = vec![7.0f32; 7];
    check(ctx.weight_matmul(&x, 2, &w, &mut long), "long out");
    // A matrix built field by field with the wrong byte count.
    let bad = WeightMatrix {
        bytes: &raw[..raw.len() - 1],
        ..w
    };
    check(ctx.weight_matmul(&x, 2, &bad, &mut out), "short bytes");
    let bad = WeightMatrix {
        format: WeightFormat::F32,
        ..w
    };
    check(
        ctx.weight_matmul(&x, 2, &bad, &mut out),
        "bytes of the wrong format",
    );
    let huge = WeightMatrix {
        rows: usize::MAX / 2,
        ..w
    };
    check(
        ctx.weight_matmul(&x, 2, &huge, &mut out),
        "overflowing size",
    );
    check(
        ctx.weight_matmul(&x, usize::MAX / 2, &w, &mut out),
        "overflowing m",
    );
    assert!(
        out.iter().chain(&long).all(|&v| v == 7.0),
        "nothing written"
    );
    for (format, len) in [(WeightFormat::BF16, 23), (WeightFormat::F32, 24)] {
        let e = WeightMatrix::new(format, 3, 4, &raw[..len]).unwrap_err();
        assert!(e.to_string().starts_with("weight_matmul"), "{e}");
    }
}

#[test]
fn empty_shapes() {
    let ctx = ExecContext::new();
    // No input features: every output is the empty sum, +0.
    let w = WeightMatrix::new(WeightFormat::F16, 5, 0, &[]).unwrap();
    let mut out = vec![7.0f32; 10];
    ctx.weight_matmul(&[], 2, &w, &mut out).unwrap();
    assert!(out.iter().all(|v| v.to_bits() == 0));
    // No rows of x, no output features.
    let raw = encode(WeightFormat::F32, &[1.0; 6]);
    let w = WeightMatrix::new(WeightFormat::F32, 2, 3, &raw).unwrap();
    ctx.weight_matmul(&[], 0, &w, &mut []).unwrap();
    let w = WeightMatrix::new(WeightFormat::F32, 0, 3, &[]).unwrap();
    ctx.weight_matmul(&[1.0; 6], 2, &w, &mut []).unwrap();
}

#[test]
fn nan_and_infinity_propagate() {
    let ctx = ExecContext::with_threads(2);
    let (rows, cols) = (8, 37);
    for format in FORMATS {
        for level in levels() {
            assert!(force_simd_level(level));
            let mut wv = values(rows * cols, 9);
            wv[cols + 5] = f32::NAN; // row 1
            wv[2 * cols + 36] = f32::INFINITY; // row 2 (in the partial step)
            wv[3 * cols + 3] = f32::INFINITY; // row 3, against x = 0
            wv[4 * cols + 20] = f32::NEG_INFINITY; // row 4
            wv[4 * cols + 21] = f32::INFINITY; // ... and +inf: NaN
            let raw = encode(format, &wv);
            let w = WeightMatrix::new(format, rows, cols, &raw).unwrap();
            let mut x = values(2 * cols, 10);
            x[3] = 0.0;
            x[cols + 3] = 0.0;
            x[36] = 1.0;
            x[20] = 1.0;
            x[21] = 1.0;
            x[cols + 7] = f32::NAN; // all of row 1 of x
            let mut out = vec![0.0; 2 * rows];
            ctx.weight_matmul(&x, 2, &w, &mut out).unwrap();
            let want = oracle(&x, 2, &w);
            let tag = format!("{format:?} {level:?}");
            assert!(out[1].is_nan(), "{tag}: NaN weight");
            assert_eq!(out[2], f32::INFINITY, "{tag}: inf weight");
            assert!(out[3].is_nan(), "{tag}: inf * 0");
            assert!(out[4].is_nan(), "{tag}: inf - inf");
            assert!(out[rows..].iter().all(|v| v.is_nan()), "{tag}: NaN input");
            // Finite outputs keep the oracle's bits; NaN stays NaN.
            for (g, w) in out.iter().zip(&want) {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{tag}"
                );
            }
        }
    }
    assert!(force_simd_level(detected_simd_level()));
}

/// The `0 · 0` terms of the partial step are part of the order: a lane that
/// holds `-0` (products underflowing to `-0`) becomes `+0` when padded. With
/// every product `-1e-30 · 1e-30` (rounds to `-0`), 16 columns (no padding)
/// sum to `-0` and 17 columns (lanes 1–15 padded) to `+0`, at every level.
#[test]
fn padding_terms_turn_a_negative_zero_lane_positive() {
    let ctx = ExecContext::with_threads(2);
    for format in FORMATS {
        if format == WeightFormat::F16 {
            continue; // 1e-30 is not an f16 value
        }
        for level in levels() {
            assert!(force_simd_level(level));
            for (cols, want) in [(16, -0.0f32), (17, 0.0), (32, -0.0), (33, 0.0)] {
                let raw = encode(format, &vec![1e-30; 3 * cols]);
                let w = WeightMatrix::new(format, 3, cols, &raw).unwrap();
                let x = vec![-1e-30f32; 2 * cols];
                let mut out = vec![7.0; 6];
                ctx.weight_matmul(&x, 2, &w, &mut out).unwrap();
                let tag = format!("{format:?} {level:?} cols {cols}");
                assert_eq!(bits(&out), bits(&oracle(&x, 2, &w)), "{tag}");
                assert!(
                    out.iter().all(|v| v.to_bits() == want.to_bits()),
                    "{tag}: {out:?}"
                );
            }
        }
    }
    assert!(force_simd_level(detected_simd_level()));
}

#[test]
fn row_to_f32_decodes_every_format() {
    for format in FORMATS {
        let v = values(3 * 41, 12);
        let raw = encode(format, &v);
        let w = WeightMatrix::new(format, 3, 41, &raw).unwrap();
        let mut row = vec![0.0; 41];
        w.row_to_f32(2, &mut row);
        for (k, r) in row.iter().enumerate() {
            assert_eq!(r.to_bits(), decode(format, &raw, 2 * 41 + k).to_bits());
        }
    }
}

/// Steady-state calls allocate nothing, for `m = 1` (the output written in
/// place) and `m > 1` (a pooled transpose buffer), serial and on a team.
#[test]
fn steady_state_calls_allocate_nothing() {
    in_own_process("steady_state_calls_allocate_nothing", || {
        for threads in [1, 2] {
            let ctx = ExecContext::with_threads(threads);
            let cases = [
                Case::new(WeightFormat::BF16, 515, 576, 1),
                Case::new(WeightFormat::F32, 300, 100, 8),
                Case::new(WeightFormat::F16, 64, 576, 64),
            ];
            let mut outs: Vec<Vec<f32>> = cases.iter().map(|c| vec![0.0; c.m * c.rows]).collect();
            let ws: Vec<WeightMatrix<'_>> = cases.iter().map(Case::w).collect();
            for _ in 0..2 {
                for ((c, w), o) in cases.iter().zip(&ws).zip(&mut outs) {
                    ctx.weight_matmul(&c.x, c.m, w, o).unwrap();
                }
            }
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            for _ in 0..5 {
                for ((c, w), o) in cases.iter().zip(&ws).zip(&mut outs) {
                    ctx.weight_matmul(&c.x, c.m, w, o).unwrap();
                }
            }
            let after = ALLOCATIONS.load(Ordering::Relaxed);
            assert_eq!(after - before, 0, "allocations ({threads} threads)");
        }
    });
}

#[test]
fn the_counter_counts() {
    counting::check_the_counter();
}
