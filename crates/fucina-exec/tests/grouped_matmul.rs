//! `ExecContext::grouped_matmul`: every product of a grouped call gives the
//! bits of its single call (`weight_matmul`, `quant_matmul`,
//! `quant_matmul_packed`, `bf16_matmul_amx_rule`) for every weight form,
//! 1 and 2 threads and every vector level this CPU runs; bad lengths are
//! errors that write nothing. The vector level is a process-wide setting, so
//! one test walks the levels (every level gives the same bits).

#![allow(clippy::result_large_err)] // ExecError holds inline shapes

mod support;

use fucina_exec::{
    ExecContext, ExecError, GroupedProduct, GroupedScratch, GroupedWeight, PackedBf16Matrix,
    PackedQuantMatrix, QuantFormat, QuantizedWeights, SimdLevel, WeightFormat, WeightMatrix,
    detected_simd_level, force_simd_level,
};
use fucina_storage::half::{bf16, f16};
use support::values;

const QUANT: [QuantFormat; 12] = [
    QuantFormat::Q8_0,
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Q2_K,
    QuantFormat::Q3_K,
    QuantFormat::Q4_K,
    QuantFormat::Q5_K,
    QuantFormat::Q6_K,
    QuantFormat::IQ4_NL,
    QuantFormat::IQ4_XS,
];

/// `v` in `format`'s little-endian bytes.
fn encode(format: WeightFormat, v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match format {
            WeightFormat::F32 => x.to_le_bytes().to_vec(),
            WeightFormat::F16 => f16::from_f32(x).to_bits().to_le_bytes().to_vec(),
            WeightFormat::BF16 => bf16::from_f32(x).to_bits().to_le_bytes().to_vec(),
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The weights of the cases, owned.
enum Owned {
    Float(WeightFormat, usize, usize, Vec<u8>),
    Quant(QuantizedWeights),
    Packed(PackedQuantMatrix),
    Bf16(PackedBf16Matrix),
}

impl Owned {
    fn weight(&self) -> GroupedWeight<'_> {
        match self {
            Owned::Float(f, r, c, b) => {
                GroupedWeight::Float(WeightMatrix::new(*f, *r, *c, b).unwrap())
            }
            Owned::Quant(q) => GroupedWeight::Quant(q.matrix()),
            Owned::Packed(p) => GroupedWeight::Packed(p),
            Owned::Bf16(p) => GroupedWeight::Bf16AmxRule(p),
        }
    }
}

/// One product: a weight of `[rows, cols]` and `m` activation rows.
struct Case {
    w: Owned,
    rows: usize,
    cols: usize,
    m: usize,
    x: Vec<f32>,
}

/// Every weight form, single-row products (the grouped dispatch) of widths
/// that end inside a work item and inside a strip, and several-row products
/// (their single calls).
fn cases(ctx: &ExecContext) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut seed = 1u64;
    let mut case = |w: Owned, rows: usize, cols: usize, m: usize| {
        seed += 1;
        let x = values(m * cols, seed * 7919);
        cases.push(Case {
            w,
            rows,
            cols,
            m,
            x,
        });
    };
    for f in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        for (rows, cols, m) in [(384, 256, 1), (100, 70, 1), (70, 48, 3)] {
            let b = encode(f, &values(rows * cols, (rows + cols) as u64));
            case(Owned::Float(f, rows, cols, b), rows, cols, m);
        }
    }
    for q in QUANT {
        let cols = 256;
        for (rows, m) in [(72, 1), (20, 1), (24, 2)] {
            let v = values(rows * cols, (rows * 31 + q as usize) as u64);
            let w = ctx.quantize(q, rows, cols, &v).unwrap();
            if q.repackable() {
                let p = ctx.repack_quant(&w.matrix()).unwrap();
                case(Owned::Packed(p), rows, cols, m);
            }
            case(Owned::Quant(w), rows, cols, m);
        }
    }
    for m in [1, 2] {
        let (rows, cols) = (48, 64);
        let b = encode(WeightFormat::BF16, &values(rows * cols, 99));
        let w = WeightMatrix::new(WeightFormat::BF16, rows, cols, &b).unwrap();
        case(
            Owned::Bf16(PackedBf16Matrix::new(&w).unwrap()),
            rows,
            cols,
            m,
        );
    }
    cases
}

/// Each case through its single call.
fn single(ctx: &ExecContext, cases: &[Case]) -> Vec<Vec<f32>> {
    cases
        .iter()
        .map(|c| {
            let mut out = vec![f32::NAN; c.m * c.rows];
            match c.w.weight() {
                GroupedWeight::Float(w) => ctx.weight_matmul(&c.x, c.m, &w, &mut out),
                GroupedWeight::Quant(w) => ctx.quant_matmul(&c.x, c.m, &w, &mut out),
                GroupedWeight::Packed(w) => ctx.quant_matmul_packed(&c.x, c.m, w, &mut out),
                GroupedWeight::Bf16AmxRule(w) => ctx.bf16_matmul_amx_rule(&c.x, c.m, w, &mut out),
            }
            .unwrap();
            out
        })
        .collect()
}

/// All cases through one grouped call.
fn grouped(ctx: &ExecContext, cases: &[Case]) -> Result<Vec<Vec<f32>>, ExecError> {
    let mut outs: Vec<Vec<f32>> = cases.iter().map(|c| vec![f32::NAN; c.m * c.rows]).collect();
    let mut products: Vec<GroupedProduct<'_>> = cases
        .iter()
        .zip(outs.iter_mut())
        .map(|(c, out)| GroupedProduct {
            weight: c.w.weight(),
            x: &c.x,
            m: c.m,
            out,
        })
        .collect();
    ctx.grouped_matmul(&mut products)?;
    drop(products);
    Ok(outs)
}

#[test]
fn a_grouped_call_gives_the_single_calls_bits_at_every_level_and_thread_count() {
    let levels: Vec<SimdLevel> = SimdLevel::available().collect();
    eprintln!("levels compared: {levels:?}");
    let setup = ExecContext::with_threads(1);
    let cases = cases(&setup);
    let want = single(&setup, &cases);
    for &level in &levels {
        assert!(force_simd_level(level));
        for threads in [1, 2] {
            let ctx = ExecContext::with_threads(threads);
            let got = grouped(&ctx, &cases).unwrap();
            // Twice: the second call reuses the pooled scratch.
            let again = grouped(&ctx, &cases).unwrap();
            for (i, c) in cases.iter().enumerate() {
                let what = format!(
                    "case {i} ({:?} [{}, {}] m {}) level {level:?} threads {threads}",
                    c.w.weight(),
                    c.rows,
                    c.cols,
                    c.m
                );
                assert!(
                    want[i].iter().all(|v| v.is_finite()),
                    "{what}: the single call"
                );
                assert_eq!(bits(&got[i]), bits(&want[i]), "{what}");
                assert_eq!(bits(&again[i]), bits(&want[i]), "{what}, again");
                let single_here = single(&ctx, &cases[i..=i]);
                assert_eq!(bits(&single_here[0]), bits(&want[i]), "{what}: single");
            }
        }
    }
    assert!(force_simd_level(detected_simd_level()));
}

/// The cases through one run of a list from `scratch`.
fn grouped_kept(
    ctx: &ExecContext,
    scratch: &mut GroupedScratch,
    cases: &[&Case],
) -> Result<Vec<Vec<f32>>, ExecError> {
    let mut outs: Vec<Vec<f32>> = cases.iter().map(|c| vec![f32::NAN; c.m * c.rows]).collect();
    let mut list = scratch.list();
    for (c, out) in cases.iter().zip(outs.iter_mut()) {
        list.push(GroupedProduct {
            weight: c.w.weight(),
            x: &c.x,
            m: c.m,
            out,
        });
    }
    assert_eq!(list.len(), cases.len());
    list.run(ctx)?;
    drop(list);
    Ok(outs)
}

#[test]
fn a_kept_scratch_gives_the_single_calls_bits_for_lists_of_any_size() {
    let setup = ExecContext::with_threads(1);
    let mut cases = cases(&setup);
    // Products of the super-block formats several super-blocks deep, whose
    // rows end inside a work item: their activations quantized per 256.
    for (i, q) in [QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K]
        .into_iter()
        .enumerate()
    {
        let (rows, cols) = (136 + 4 * i, 768);
        let w = setup
            .quantize(q, rows, cols, &values(rows * cols, 40 + i as u64))
            .unwrap();
        let x = values(cols, 50 + i as u64);
        cases.push(Case {
            w: Owned::Quant(w),
            rows,
            cols,
            m: 1,
            x,
        });
    }
    let want = single(&setup, &cases);
    let all: Vec<&Case> = cases.iter().collect();
    let some: Vec<&Case> = cases.iter().rev().step_by(3).collect();
    let want_some: Vec<&Vec<f32>> = want.iter().rev().step_by(3).collect();
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let mut scratch = GroupedScratch::new();
        // A long list, a shorter one in another order, the long one again.
        for round in 0..3 {
            let (list, want): (&[&Case], Vec<&Vec<f32>>) = match round {
                1 => (&some, want_some.clone()),
                _ => (&all, want.iter().collect()),
            };
            let got = grouped_kept(&ctx, &mut scratch, list).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let c = list[i];
                let what = format!(
                    "round {round} product {i} ({:?} [{}, {}] m {}) threads {threads}",
                    c.w.weight(),
                    c.rows,
                    c.cols,
                    c.m
                );
                assert!(w.iter().all(|v| v.is_finite()), "{what}: the single call");
                assert_eq!(bits(g), bits(w), "{what}");
            }
        }
    }
}

/// The call on a good float product followed by `second` (whose weight,
/// activations, rows and output length are given) must fail with a length
/// error naming the op, writing neither output.
fn expect_length_error(what: &str, second: GroupedWeight<'_>, x2: &[f32], m2: usize, n2: usize) {
    let ctx = ExecContext::with_threads(2);
    let (rows, cols) = (64, 32);
    let b = encode(WeightFormat::BF16, &values(rows * cols, 5));
    let w = WeightMatrix::new(WeightFormat::BF16, rows, cols, &b).unwrap();
    let x = values(cols, 6);
    let (mut a, mut o2) = (vec![f32::NAN; rows], vec![f32::NAN; n2]);
    let err = ctx
        .grouped_matmul(&mut [
            GroupedProduct {
                weight: GroupedWeight::Float(w),
                x: &x,
                m: 1,
                out: &mut a,
            },
            GroupedProduct {
                weight: second,
                x: x2,
                m: m2,
                out: &mut o2,
            },
        ])
        .unwrap_err();
    assert!(
        matches!(
            err,
            ExecError::InvalidDataLength {
                op: "grouped_matmul",
                ..
            }
        ),
        "{what}: {err:?}"
    );
    assert!(err.to_string().contains("grouped_matmul"), "{what}: {err}");
    assert!(
        a.iter().chain(&o2).all(|v| v.is_nan()),
        "{what}: an output was written"
    );
}

#[test]
fn bad_lengths_are_errors_that_write_nothing() {
    let ctx = ExecContext::with_threads(1);
    let (rows, cols) = (64, 32);
    let b = encode(WeightFormat::BF16, &values(rows * cols, 5));
    let w = GroupedWeight::Float(WeightMatrix::new(WeightFormat::BF16, rows, cols, &b).unwrap());
    let q = ctx
        .quantize(QuantFormat::Q8_0, rows, cols, &values(rows * cols, 7))
        .unwrap();
    let qw = GroupedWeight::Quant(q.matrix());
    let x = values(cols, 6);
    expect_length_error("short x", qw, &x[1..], 1, rows);
    expect_length_error("long out", w, &x, 1, rows + 1);
    expect_length_error("m of 2 over one row", qw, &x, 2, 2 * rows);
    let short = GroupedWeight::Float(WeightMatrix {
        format: WeightFormat::BF16,
        rows,
        cols,
        bytes: &b[2..],
    });
    expect_length_error("short weight", short, &x, 1, rows);
}

#[test]
fn an_empty_list_and_empty_products_are_nothing_to_do() {
    let ctx = ExecContext::with_threads(2);
    ctx.grouped_matmul(&mut []).unwrap();
    let b = encode(WeightFormat::F32, &values(0, 1));
    let w = WeightMatrix::new(WeightFormat::F32, 0, 16, &b).unwrap();
    let x = values(16, 2);
    let mut out: [f32; 0] = [];
    ctx.grouped_matmul(&mut [GroupedProduct {
        weight: GroupedWeight::Float(w),
        x: &x,
        m: 1,
        out: &mut out,
    }])
    .unwrap();
}
