//! matmul, linear, their backward kernels and the right-hand-side cache, against
//! naive references.

mod support;

use std::sync::Arc;

use fucina_exec::storage::Buffer;
use fucina_exec::{ExecContext, ExecError, MatmulOptions, RawTensor, RhsLifetime};
use proptest::prelude::*;
use support::numel;

const STABLE: MatmulOptions = MatmulOptions {
    rhs_lifetime: RhsLifetime::StableProcess,
};

/// `n` values uniform in `[-1, 1)` from the seed.
fn rand_vec(seed: u64, n: usize) -> Vec<f32> {
    support::uniform(seed, n, -1.0, 1.0)
}

/// A tensor with logical row-major values `vals` of `shape`, laid out as asked:
/// `narrowed` stores it inside a wider last axis (then narrows), `transposed`
/// stores the last two axes swapped (then transposes back as a view).
fn make(
    ctx: &ExecContext,
    shape: &[usize],
    vals: &[f32],
    transposed: bool,
    narrowed: bool,
) -> RawTensor {
    let r = shape.len();
    let transposed = transposed && r >= 2;
    let mut phys = shape.to_vec();
    let mut pvals = vals.to_vec();
    if transposed {
        phys.swap(r - 2, r - 1);
        let (rows, cols) = (shape[r - 2], shape[r - 1]);
        let batches = numel(shape) / (rows * cols);
        for bi in 0..batches {
            for i in 0..rows {
                for j in 0..cols {
                    pvals[bi * rows * cols + j * rows + i] = vals[bi * rows * cols + i * cols + j];
                }
            }
        }
    }
    let t = if narrowed {
        let last = phys[r - 1];
        let mut wide = phys.clone();
        wide[r - 1] = last + 3;
        let mut wvals = vec![f32::NAN; numel(&wide)];
        for (row, src) in wvals
            .chunks_exact_mut(last + 3)
            .zip(pvals.chunks_exact(last))
        {
            row[1..=last].copy_from_slice(src);
        }
        ctx.from_slice(&wide, &wvals)
            .unwrap()
            .narrow(r - 1, 1, last)
            .unwrap()
    } else {
        ctx.from_slice(&phys, &pvals).unwrap()
    };
    let t = if transposed {
        t.transpose(r - 2, r - 1).unwrap()
    } else {
        t
    };
    assert_eq!(t.shape(), shape);
    assert_eq!(t.to_vec(), vals.to_vec(), "make");
    t
}

/// Numpy matmul of logical row-major operands: `(f64 result, f32 fma-chain
/// result, abs-sum bound, shape)`.
fn naive(
    a: &[f32],
    ash: &[usize],
    b: &[f32],
    bsh: &[usize],
) -> (Vec<f64>, Vec<f32>, Vec<f64>, Vec<usize>) {
    let a2: Vec<usize> = if ash.len() == 1 {
        vec![1, ash[0]]
    } else {
        ash.to_vec()
    };
    let b2: Vec<usize> = if bsh.len() == 1 {
        vec![bsh[0], 1]
    } else {
        bsh.to_vec()
    };
    let (ar, br) = (a2.len(), b2.len());
    let (m, k, n) = (a2[ar - 2], a2[ar - 1], b2[br - 1]);
    assert_eq!(k, b2[br - 2]);
    let (ab, bb) = (&a2[..ar - 2], &b2[..br - 2]);
    let bl = ab.len().max(bb.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= bl {
            s[i + s.len() - bl]
        } else {
            1
        }
    };
    let batch: Vec<usize> = (0..bl).map(|i| dim(ab, i).max(dim(bb, i))).collect();
    let nbatch = numel(&batch);
    // Index of out batch `bi` into an operand's own batch dims.
    let sub = |s: &[usize], mut bi: usize| {
        let mut idx = 0;
        let mut mul = 1;
        for i in (0..bl).rev() {
            let o = bi % batch[i];
            bi /= batch[i];
            if i + s.len() >= bl {
                let d = s[i + s.len() - bl];
                idx += if d == 1 { 0 } else { o } * mul;
                mul *= d;
            }
        }
        idx
    };
    let mut r64 = vec![0.0f64; nbatch * m * n];
    let mut r32 = vec![0.0f32; nbatch * m * n];
    let mut bound = vec![0.0f64; nbatch * m * n];
    for bi in 0..nbatch {
        let (ia, ib) = (sub(ab, bi), sub(bb, bi));
        for i in 0..m {
            for j in 0..n {
                let (mut s64, mut s32, mut sabs) = (0.0f64, 0.0f32, 0.0f64);
                for kk in 0..k {
                    let x = a[ia * m * k + i * k + kk];
                    let y = b[ib * k * n + kk * n + j];
                    s64 += f64::from(x) * f64::from(y);
                    s32 = x.mul_add(y, s32);
                    sabs += (f64::from(x) * f64::from(y)).abs();
                }
                let o = bi * m * n + i * n + j;
                (r64[o], r32[o], bound[o]) = (s64, s32, sabs);
            }
        }
    }
    let mut shape = batch;
    if ash.len() > 1 {
        shape.push(m);
    }
    if bsh.len() > 1 {
        shape.push(n);
    }
    if shape.is_empty() {
        shape.push(1);
    }
    (r64, r32, bound, shape)
}

fn assert_close(got: &[f32], want: &[f64], bound: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &b)) in got.iter().zip(want).zip(bound).enumerate() {
        let tol = 1e-5 * b + 1e-6;
        assert!(
            (f64::from(g) - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w} (tol {tol})"
        );
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Checks `ctx.matmul` on the given shapes and layouts against both references.
fn check_matmul(ash: &[usize], bsh: &[usize], layouts: [(bool, bool); 2], seed: u64) {
    let ctx = ExecContext::with_threads(2);
    let av = rand_vec(seed, numel(ash));
    let bv = rand_vec(seed + 1, numel(bsh));
    let a = make(&ctx, ash, &av, layouts[0].0, layouts[0].1);
    let b = make(&ctx, bsh, &bv, layouts[1].0, layouts[1].1);
    let (r64, r32, bound, shape) = naive(&av, ash, &bv, bsh);
    let c = ctx.matmul(&a, &b).unwrap();
    assert_eq!(c.shape(), shape.as_slice(), "{ash:?} x {bsh:?}");
    let got = c.to_vec();
    assert_close(
        &got,
        &r64,
        &bound,
        &format!("{ash:?} x {bsh:?} {layouts:?}"),
    );
    assert_eq!(
        bits(&got),
        bits(&r32),
        "not the fma chain: {ash:?} x {bsh:?}"
    );
}

fn batch_strategy() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    // Broadcastable batch dims: each position is equal, or 1 on one side, and the
    // two sides may have different ranks.
    prop::collection::vec((1usize..4, 0u8..3), 0..3).prop_flat_map(|dims| {
        let a: Vec<usize> = dims
            .iter()
            .map(|&(d, w)| if w == 1 { 1 } else { d })
            .collect();
        let b: Vec<usize> = dims
            .iter()
            .map(|&(d, w)| if w == 2 { 1 } else { d })
            .collect();
        (0..=a.len(), 0..=b.len()).prop_map(move |(da, db)| (a[da..].to_vec(), b[db..].to_vec()))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn matmul_matches_naive(
        m in 1usize..40,
        k in 1usize..70,
        n in 1usize..70,
        (ab, bb) in batch_strategy(),
        layouts in any::<[(bool, bool); 2]>(),
        seed in any::<u64>(),
    ) {
        let mut ash = ab.clone();
        ash.extend([m, k]);
        let mut bsh = bb.clone();
        bsh.extend([k, n]);
        check_matmul(&ash, &bsh, layouts, seed);
    }

    #[test]
    fn linear_matches_naive(
        lead in prop::collection::vec(1usize..5, 0..3),
        inf in 1usize..60,
        outf in 1usize..70,
        bias in any::<bool>(),
        x_t in any::<bool>(),
        w_narrow in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let ctx = ExecContext::with_threads(3);
        let mut xsh = lead.clone();
        xsh.push(inf);
        let xv = rand_vec(seed, numel(&xsh));
        let wv = rand_vec(seed + 1, outf * inf);
        let bv = rand_vec(seed + 2, outf);
        let x = make(&ctx, &xsh, &xv, x_t, false);
        let w = make(&ctx, &[outf, inf], &wv, false, w_narrow);
        let b = ctx.from_slice(&[outf], &bv).unwrap();
        let y = ctx.linear(&x, &w, bias.then_some(&b)).unwrap();
        let mut ysh = lead.clone();
        ysh.push(outf);
        prop_assert_eq!(y.shape(), ysh.as_slice());
        let rows = numel(&lead);
        let got = y.to_vec();
        for r in 0..rows {
            for o in 0..outf {
                let (mut s64, mut s32, mut sabs) =
                    (if bias { f64::from(bv[o]) } else { 0.0 }, if bias { bv[o] } else { 0.0 }, 0.0);
                for i in 0..inf {
                    let (p, q) = (xv[r * inf + i], wv[o * inf + i]);
                    s64 += f64::from(p) * f64::from(q);
                    s32 = p.mul_add(q, s32);
                    sabs += (f64::from(p) * f64::from(q)).abs();
                }
                let g = got[r * outf + o];
                prop_assert!((f64::from(g) - s64).abs() <= 1e-5 * sabs + 1e-5, "{} vs {}", g, s64);
                prop_assert_eq!(g.to_bits(), s32.to_bits());
            }
        }
    }
}

#[test]
fn edge_shapes_one_dimensional_and_large_k() {
    let ff = [(false, false); 2];
    for (ash, bsh) in [
        (vec![1, 1], vec![1, 1]),
        (vec![1, 7], vec![7, 1]),
        (vec![5], vec![5]),
        (vec![5], vec![5, 3]),
        (vec![4, 5], vec![5]),
        (vec![2, 3, 5], vec![5]),
        (vec![5], vec![2, 5, 3]),
        (vec![3, 1200], vec![1200, 33]),
        (vec![2, 1, 9, 4], vec![3, 4, 6]),
        (vec![17, 1031], vec![1031, 65]),
        // Whole 32-column panels: the AVX-512 path reads a row-major right-hand
        // side in place (also narrowed: row stride above n; and batched).
        (vec![40, 300], vec![300, 64]),
        (vec![13, 700], vec![700, 96]),
        (vec![3, 50, 64], vec![3, 64, 96]),
        (vec![2, 1, 30, 20], vec![3, 20, 32]),
    ] {
        check_matmul(&ash, &bsh, ff, 11);
        check_matmul(&ash, &bsh, [(true, true), (true, false)], 12);
        check_matmul(&ash, &bsh, [(false, false), (false, true)], 13);
    }
    // Mixed large shape with a transposed right-hand side.
    check_matmul(&[130, 257], &[257, 70], [(false, true), (true, false)], 3);
}

#[test]
fn stride_zero_broadcast_operand_views() {
    let ctx = ExecContext::with_threads(2);
    let av = rand_vec(5, 4 * 6);
    let bv = rand_vec(6, 6 * 5);
    // a [1, 4, 6] broadcast to [3, 4, 6] (stride 0 on the batch axis)
    let a = ctx
        .from_slice(&[1, 4, 6], &av)
        .unwrap()
        .broadcast_to(&[3, 4, 6])
        .unwrap();
    // b: a row broadcast along k: [1, 5] -> [6, 5]
    let brow = ctx.from_slice(&[1, 5], &bv[..5]).unwrap();
    let b = brow.broadcast_to(&[6, 5]).unwrap();
    let c = ctx.matmul(&a, &b).unwrap();
    let bfull: Vec<f32> = (0..6).flat_map(|_| bv[..5].to_vec()).collect();
    let afull: Vec<f32> = (0..3).flat_map(|_| av.clone()).collect();
    let (r64, r32, bound, shape) = naive(&afull, &[3, 4, 6], &bfull, &[6, 5]);
    assert_eq!(c.shape(), shape.as_slice());
    assert_close(&c.to_vec(), &r64, &bound, "broadcast views");
    assert_eq!(bits(&c.to_vec()), bits(&r32));
}

#[test]
fn errors_name_the_problem() {
    let ctx = ExecContext::new();
    let a = ctx.zeros(&[2, 3]).unwrap();
    let b = ctx.zeros(&[4, 5]).unwrap();
    match ctx.matmul(&a, &b) {
        Err(ExecError::ShapeMismatch { op, lhs, rhs, .. }) => {
            assert_eq!(
                (op, lhs.as_slice(), rhs.as_slice()),
                ("matmul", &[2, 3][..], &[4, 5][..])
            );
        }
        other => panic!("{other:?}"),
    }
    let a3 = ctx.zeros(&[2, 2, 3]).unwrap();
    let b3 = ctx.zeros(&[3, 3, 4]).unwrap();
    let e = ctx.matmul(&a3, &b3).unwrap_err();
    assert!(
        matches!(e, ExecError::ShapeMismatch { op: "matmul", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("batch"), "{e}");
    assert!(
        e.to_string().contains("[2, 2, 3]") && e.to_string().contains("[3, 3, 4]"),
        "{e}"
    );
    let v = ctx.zeros(&[4]).unwrap();
    assert!(matches!(
        ctx.matmul(&v, &a),
        Err(ExecError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ctx.matmul(&a, &v),
        Err(ExecError::ShapeMismatch { .. })
    ));
    // linear
    let x = ctx.zeros(&[2, 3]).unwrap();
    let w = ctx.zeros(&[4, 3]).unwrap();
    let w3 = ctx.zeros(&[1, 4, 3]).unwrap();
    let bias_bad = ctx.zeros(&[3]).unwrap();
    assert!(matches!(
        ctx.linear(&x, &w3, None),
        Err(ExecError::InvalidShape { op: "linear", .. })
    ));
    assert!(matches!(
        ctx.linear(&x, &w.transpose(0, 1).unwrap(), None),
        Err(ExecError::ShapeMismatch { op: "linear", .. })
    ));
    assert!(matches!(
        ctx.linear(&x, &w, Some(&bias_bad)),
        Err(ExecError::ShapeMismatch { op: "linear", .. })
    ));
    // backward
    let g_bad = ctx.zeros(&[2, 5]).unwrap();
    let bb = ctx.zeros(&[3, 5]).unwrap();
    assert!(matches!(
        ctx.matmul_backward(&a, &bb, &ctx.zeros(&[3, 5]).unwrap()),
        Err(ExecError::ShapeMismatch {
            op: "matmul_backward",
            ..
        })
    ));
    assert!(ctx.matmul_backward(&a, &bb, &g_bad).is_ok());
    assert!(matches!(
        ctx.linear_backward(&x, &w, &g_bad),
        Err(ExecError::ShapeMismatch {
            op: "linear_backward",
            ..
        })
    ));
    // pooled storage cannot be marked StableProcess
    assert!(matches!(
        ctx.matmul_with(&a, &ctx.zeros(&[3, 5]).unwrap(), STABLE),
        Err(ExecError::UnstableRhs { op: "matmul" })
    ));
    assert!(matches!(
        ctx.linear_with(&x, &w, None, STABLE),
        Err(ExecError::UnstableRhs { op: "linear" })
    ));
    assert_eq!(ctx.rhs_cache_len(), 0);
}

#[test]
fn thread_count_determinism() {
    let (m, k, n) = (200, 300, 500);
    let av = rand_vec(1, m * k);
    let bv = rand_vec(2, k * n);
    let mut first: Option<(Vec<u32>, Vec<u32>, Vec<u32>)> = None;
    for threads in 1..=4 {
        let ctx = ExecContext::with_threads(threads);
        let a = ctx.from_slice(&[m, k], &av).unwrap();
        let b = ctx.from_slice(&[k, n], &bv).unwrap();
        let bt = make(&ctx, &[k, n], &bv, true, false);
        let c = bits(&ctx.matmul(&a, &b).unwrap().to_vec());
        let ct = bits(&ctx.matmul(&a, &bt).unwrap().to_vec());
        assert_eq!(c, ct, "layout changed the result");
        let w = ctx.from_slice(&[n, k], &bv).unwrap();
        let y = bits(&ctx.linear(&a, &w, None).unwrap().to_vec());
        match &first {
            None => first = Some((c, ct, y)),
            Some(f) => {
                assert_eq!(f.0, c, "threads {threads}");
                assert_eq!(f.1, ct, "threads {threads}");
                assert_eq!(f.2, y, "threads {threads}");
            }
        }
    }
}

#[test]
fn batch_invariance() {
    let ctx = ExecContext::with_threads(4);
    let (rows, inf, outf) = (64, 300, 200);
    let xv = rand_vec(3, rows * inf);
    let wv = rand_vec(4, outf * inf);
    let bv = rand_vec(5, outf);
    let x = ctx.from_slice(&[rows, inf], &xv).unwrap();
    let w = ctx.from_slice(&[outf, inf], &wv).unwrap();
    let b = ctx.from_slice(&[outf], &bv).unwrap();
    let wt = ctx.from_slice(&[inf, outf], &wv).unwrap();
    let full = ctx.linear(&x, &w, Some(&b)).unwrap().to_vec();
    let full_mm = ctx.matmul(&x, &wt).unwrap().to_vec();
    for i in [0, 1, 17, 63] {
        let xi = x.narrow(0, i, 1).unwrap();
        let yi = ctx.linear(&xi, &w, Some(&b)).unwrap().to_vec();
        assert_eq!(bits(&yi), bits(&full[i * outf..][..outf]), "linear row {i}");
        let ci = ctx.matmul(&xi, &wt).unwrap().to_vec();
        assert_eq!(
            bits(&ci),
            bits(&full_mm[i * outf..][..outf]),
            "matmul row {i}"
        );
        // 1-D row
        let x1 = ctx.from_slice(&[inf], &xv[i * inf..][..inf]).unwrap();
        let y1 = ctx.linear(&x1, &w, Some(&b)).unwrap().to_vec();
        assert_eq!(
            bits(&y1),
            bits(&full[i * outf..][..outf]),
            "1-D linear row {i}"
        );
    }
    // A batch of 8 matrices vs each alone.
    let a8v = rand_vec(6, 8 * 40 * 300);
    let a8 = ctx.from_slice(&[8, 40, 300], &a8v).unwrap();
    let c8 = ctx.matmul(&a8, &wt).unwrap().to_vec();
    for bi in [0, 5] {
        let ai = a8.narrow(0, bi, 1).unwrap();
        let ci = ctx.matmul(&ai, &wt).unwrap().to_vec();
        assert_eq!(
            bits(&ci),
            bits(&c8[bi * 40 * outf..][..40 * outf]),
            "batch {bi}"
        );
    }
}

/// The batch invariance of [`batch_invariance`] with depths (the summed axis)
/// above the GEMM's depth block of 512 and not a multiple of it, so that a
/// batch-1 path that walked the depth blocks in another order (or fused them
/// differently) would change the bits. Covers `linear`, `matmul` with a
/// contiguous, a transposed-view right-hand side and a transposed-view
/// left-hand side, a batch of matrices, and the input gradients of
/// `linear_backward` and `matmul_backward` (whose depth is the output width).
#[test]
fn batch_invariance_across_depth_blocks() {
    let ctx = ExecContext::with_threads(4);
    let (rows, outf) = (24, 40);
    for k in [513, 1100] {
        let xv = rand_vec(11 + k as u64, rows * k);
        let wv = rand_vec(12 + k as u64, outf * k);
        let bv = rand_vec(13, outf);
        let x = ctx.from_slice(&[rows, k], &xv).unwrap();
        let w = ctx.from_slice(&[outf, k], &wv).unwrap();
        let b = ctx.from_slice(&[outf], &bv).unwrap();
        let wt = ctx.from_slice(&[k, outf], &wv).unwrap();
        let w_t = w.transpose(0, 1).unwrap(); // [k, outf], a view
        // `x` again, stored transposed and viewed back as [rows, k].
        let mut xtv = vec![0.0; rows * k];
        for r in 0..rows {
            for j in 0..k {
                xtv[j * rows + r] = xv[r * k + j];
            }
        }
        let x_t = ctx
            .from_slice(&[k, rows], &xtv)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        let full_lin = ctx.linear(&x, &w, Some(&b)).unwrap().to_vec();
        let full_mm = ctx.matmul(&x, &wt).unwrap().to_vec();
        let full_mm_tv = ctx.matmul(&x, &w_t).unwrap().to_vec();
        let full_mm_tl = ctx.matmul(&x_t, &wt).unwrap().to_vec();
        assert_eq!(bits(&full_mm_tl), bits(&full_mm), "k={k}: a transposed lhs");
        for i in [0, 1, 17, rows - 1] {
            let row = |v: &[f32]| bits(&v[i * outf..][..outf]);
            let xi = x.narrow(0, i, 1).unwrap();
            let lin = ctx.linear(&xi, &w, Some(&b)).unwrap().to_vec();
            assert_eq!(bits(&lin), row(&full_lin), "k={k}: linear row {i}");
            let x1 = ctx.from_slice(&[k], &xv[i * k..][..k]).unwrap();
            let lin1 = ctx.linear(&x1, &w, Some(&b)).unwrap().to_vec();
            assert_eq!(bits(&lin1), row(&full_lin), "k={k}: 1-D linear row {i}");
            let mm = ctx.matmul(&xi, &wt).unwrap().to_vec();
            assert_eq!(bits(&mm), row(&full_mm), "k={k}: matmul row {i}");
            let mm = ctx.matmul(&xi, &w_t).unwrap().to_vec();
            assert_eq!(bits(&mm), row(&full_mm_tv), "k={k}: matmul x w^T row {i}");
            let xti = x_t.narrow(0, i, 1).unwrap();
            let mm = ctx.matmul(&xti, &wt).unwrap().to_vec();
            assert_eq!(
                bits(&mm),
                row(&full_mm_tl),
                "k={k}: matmul x^T-view row {i}"
            );
        }
        // A batch of matrices against each alone.
        let a3v = rand_vec(14, 4 * 5 * k);
        let a3 = ctx.from_slice(&[4, 5, k], &a3v).unwrap();
        let c3 = ctx.matmul(&a3, &wt).unwrap().to_vec();
        for bi in [0, 3] {
            let ci = ctx
                .matmul(&a3.narrow(0, bi, 1).unwrap(), &wt)
                .unwrap()
                .to_vec();
            assert_eq!(
                bits(&ci),
                bits(&c3[bi * 5 * outf..][..5 * outf]),
                "k={k}: batch {bi}"
            );
        }
        // Input gradients: depth = the output width, here `k`.
        let inf = 40;
        let wk = ctx.from_slice(&[k, inf], &wv[..k * inf]).unwrap();
        let xk = ctx.from_slice(&[rows, inf], &xv[..rows * inf]).unwrap();
        let g = ctx.from_slice(&[rows, k], &rand_vec(15, rows * k)).unwrap();
        let (gx, _, _) = ctx.linear_backward(&xk, &wk, &g).unwrap();
        let gx = gx.to_vec();
        let bk = ctx.from_slice(&[inf, k], &wv[..k * inf]).unwrap();
        let (ga, _) = ctx.matmul_backward(&xk, &bk, &g).unwrap();
        let ga = ga.to_vec();
        for i in [0, 1, 17, rows - 1] {
            let (xi, gi) = (xk.narrow(0, i, 1).unwrap(), g.narrow(0, i, 1).unwrap());
            let (gxi, _, _) = ctx.linear_backward(&xi, &wk, &gi).unwrap();
            assert_eq!(
                bits(&gxi.to_vec()),
                bits(&gx[i * inf..][..inf]),
                "k={k}: linear_backward grad_x row {i}"
            );
            let (gai, _) = ctx.matmul_backward(&xi, &bk, &gi).unwrap();
            assert_eq!(
                bits(&gai.to_vec()),
                bits(&ga[i * inf..][..inf]),
                "k={k}: matmul_backward grad_a row {i}"
            );
        }
    }
}

/// Naive gradients of `L = sum(grad * matmul(a, b))`: `L` is linear in `a` (and in
/// `b`), so `dL/da[i]` is `L` evaluated with `a` = the unit vector `e_i`.
fn naive_backward(
    av: &[f32],
    ash: &[usize],
    bv: &[f32],
    bsh: &[usize],
    gv: &[f32],
) -> (Vec<f64>, Vec<f64>) {
    // L is linear in a (resp. b): its gradient is L evaluated on unit vectors.
    let loss = |a: &[f32], b: &[f32]| -> f64 {
        let (c, _, _, _) = naive(a, ash, b, bsh);
        c.iter().zip(gv).map(|(&c, &g)| c * f64::from(g)).sum()
    };
    let mut ga = vec![0.0; av.len()];
    for (i, g) in ga.iter_mut().enumerate() {
        let mut e = vec![0.0f32; av.len()];
        e[i] = 1.0;
        *g = loss(&e, bv);
    }
    let mut gb = vec![0.0; bv.len()];
    for (i, g) in gb.iter_mut().enumerate() {
        let mut e = vec![0.0f32; bv.len()];
        e[i] = 1.0;
        *g = loss(av, &e);
    }
    (ga, gb)
}

#[test]
fn matmul_backward_matches_naive() {
    let ctx = ExecContext::with_threads(2);
    for (ash, bsh) in [
        (vec![3, 4], vec![4, 5]),
        (vec![2, 1, 3, 4], vec![3, 4, 2]),
        (vec![3, 4], vec![2, 4, 5]),
        (vec![4], vec![4, 5]),
        (vec![2, 3, 4], vec![4]),
        (vec![4], vec![4]),
    ] {
        let av = rand_vec(8, numel(&ash));
        let bv = rand_vec(9, numel(&bsh));
        let (_, _, _, csh) = naive(&av, &ash, &bv, &bsh);
        let gv = rand_vec(10, numel(&csh));
        let a = make(&ctx, &ash, &av, true, false);
        let b = make(&ctx, &bsh, &bv, true, true);
        let g = make(&ctx, &csh, &gv, true, false);
        let (ga, gb) = ctx.matmul_backward(&a, &b, &g).unwrap();
        assert_eq!(ga.shape(), ash.as_slice());
        assert_eq!(gb.shape(), bsh.as_slice());
        let (wa, wb) = naive_backward(&av, &ash, &bv, &bsh, &gv);
        let tol = vec![10.0; wa.len().max(wb.len())];
        assert_close(
            &ga.to_vec(),
            &wa,
            &tol[..wa.len()],
            &format!("grad_a {ash:?}x{bsh:?}"),
        );
        assert_close(
            &gb.to_vec(),
            &wb,
            &tol[..wb.len()],
            &format!("grad_b {ash:?}x{bsh:?}"),
        );
    }
}

#[test]
fn matmul_backward_finite_differences() {
    let ctx = ExecContext::with_threads(1);
    let (ash, bsh) = ([2, 3, 4], [4, 3]);
    let av: Vec<f32> = rand_vec(20, 24);
    let bv: Vec<f32> = rand_vec(21, 12);
    let gv: Vec<f32> = rand_vec(22, 18);
    let loss = |av: &[f32], bv: &[f32]| -> f64 {
        let a = ctx.from_slice(&ash, av).unwrap();
        let b = ctx.from_slice(&bsh, bv).unwrap();
        let c = ctx.matmul(&a, &b).unwrap().to_vec();
        c.iter()
            .zip(&gv)
            .map(|(&c, &g)| f64::from(c) * f64::from(g))
            .sum()
    };
    let a = ctx.from_slice(&ash, &av).unwrap();
    let b = ctx.from_slice(&bsh, &bv).unwrap();
    let g = ctx.from_slice(&[2, 3, 3], &gv).unwrap();
    let (ga, gb) = ctx.matmul_backward(&a, &b, &g).unwrap();
    let h = 1e-2f32;
    for (i, &gi) in ga.to_vec().iter().enumerate() {
        let (mut p, mut q) = (av.clone(), av.clone());
        p[i] += h;
        q[i] -= h;
        let fd = (loss(&p, &bv) - loss(&q, &bv)) / (2.0 * f64::from(h));
        assert!(
            (fd - f64::from(gi)).abs() < 1e-3,
            "grad_a[{i}]: {gi} vs {fd}"
        );
    }
    for (i, &gi) in gb.to_vec().iter().enumerate() {
        let (mut p, mut q) = (bv.clone(), bv.clone());
        p[i] += h;
        q[i] -= h;
        let fd = (loss(&av, &p) - loss(&av, &q)) / (2.0 * f64::from(h));
        assert!(
            (fd - f64::from(gi)).abs() < 1e-3,
            "grad_b[{i}]: {gi} vs {fd}"
        );
    }
}

#[test]
fn linear_backward_matches_naive() {
    for threads in [1, 3] {
        let ctx = ExecContext::with_threads(threads);
        for lead in [vec![], vec![5], vec![2, 3], vec![70]] {
            let (inf, outf) = (6, 4);
            let mut xsh = lead.clone();
            xsh.push(inf);
            let mut gsh = lead.clone();
            gsh.push(outf);
            let rows = numel(&lead);
            let xv = rand_vec(30, rows * inf);
            let wv = rand_vec(31, outf * inf);
            let gv = rand_vec(32, rows * outf);
            let x = make(&ctx, &xsh, &xv, true, false);
            let w = make(&ctx, &[outf, inf], &wv, false, true);
            let g = make(&ctx, &gsh, &gv, true, false);
            let (gx, gw, gb) = ctx.linear_backward(&x, &w, &g).unwrap();
            assert_eq!(gx.shape(), xsh.as_slice());
            assert_eq!(gw.shape(), [outf, inf]);
            assert_eq!(gb.shape(), [outf]);
            let (gx, gw, gb) = (gx.to_vec(), gw.to_vec(), gb.to_vec());
            for r in 0..rows {
                for i in 0..inf {
                    let want: f64 = (0..outf)
                        .map(|o| f64::from(gv[r * outf + o]) * f64::from(wv[o * inf + i]))
                        .sum();
                    assert!((f64::from(gx[r * inf + i]) - want).abs() < 1e-5, "grad_x");
                }
            }
            for o in 0..outf {
                for i in 0..inf {
                    let want: f64 = (0..rows)
                        .map(|r| f64::from(gv[r * outf + o]) * f64::from(xv[r * inf + i]))
                        .sum();
                    assert!((f64::from(gw[o * inf + i]) - want).abs() < 1e-4, "grad_w");
                }
                let want: f64 = (0..rows).map(|r| f64::from(gv[r * outf + o])).sum();
                assert!((f64::from(gb[o]) - want).abs() < 1e-4, "grad_bias");
            }
        }
    }
}

#[test]
fn backward_is_thread_count_deterministic() {
    let (rows, inf, outf) = (300, 70, 90);
    let xv = rand_vec(40, rows * inf);
    let wv = rand_vec(41, outf * inf);
    let gv = rand_vec(42, rows * outf);
    let mut first = None;
    for threads in 1..=4 {
        let ctx = ExecContext::with_threads(threads);
        let x = ctx.from_slice(&[rows, inf], &xv).unwrap();
        let w = ctx.from_slice(&[outf, inf], &wv).unwrap();
        let g = ctx.from_slice(&[rows, outf], &gv).unwrap();
        let (gx, gw, gb) = ctx.linear_backward(&x, &w, &g).unwrap();
        let (ga, gbb) = ctx
            .matmul_backward(&x, &w.transpose(0, 1).unwrap(), &g)
            .unwrap();
        let all = [gx, gw, gb, ga, gbb].map(|t| bits(&t.to_vec()));
        match &first {
            None => first = Some(all),
            Some(f) => assert_eq!(f, &all, "threads {threads}"),
        }
    }
}

#[test]
fn rhs_cache_hits_reuse_the_packed_panels() {
    let ctx = ExecContext::with_threads(2);
    let (inf, outf) = (50, 40);
    let x = ctx.from_slice(&[3, inf], &rand_vec(50, 3 * inf)).unwrap();
    let wv = rand_vec(51, outf * inf);
    let w = ctx.from_vec(&[outf, inf], wv.clone()).unwrap();
    let plain = ctx.linear(&x, &w, None).unwrap().to_vec();
    assert_eq!(ctx.rhs_cache_len(), 0);
    let y1 = ctx.linear_with(&x, &w, None, STABLE).unwrap().to_vec();
    assert_eq!(ctx.rhs_cache_len(), 1);
    let y2 = ctx.linear_with(&x, &w, None, STABLE).unwrap().to_vec();
    assert_eq!(ctx.rhs_cache_len(), 1, "a hit must not add an entry");
    assert_eq!(bits(&y1), bits(&plain));
    assert_eq!(bits(&y2), bits(&plain));
    // The same storage under another layout (w itself as a matmul rhs) is another
    // entry with its own result.
    let xt = ctx.from_slice(&[2, outf], &rand_vec(52, 2 * outf)).unwrap();
    let c_plain = ctx.matmul(&xt, &w).unwrap().to_vec();
    let c_stable = ctx.matmul_with(&xt, &w, STABLE).unwrap().to_vec();
    assert_eq!(bits(&c_plain), bits(&c_stable));
    assert_eq!(ctx.rhs_cache_len(), 2);
    // A square weight: its matmul and linear packings have the same size, and
    // must still be told apart by layout.
    let sq = rand_vec(53, inf * inf);
    let wsq = ctx.from_vec(&[inf, inf], sq).unwrap();
    let x50 = ctx.from_slice(&[2, inf], &rand_vec(54, 2 * inf)).unwrap();
    let mm = ctx.matmul_with(&x50, &wsq, STABLE).unwrap().to_vec();
    let lin = ctx.linear_with(&x50, &wsq, None, STABLE).unwrap().to_vec();
    assert_eq!(bits(&mm), bits(&ctx.matmul(&x50, &wsq).unwrap().to_vec()));
    assert_eq!(
        bits(&lin),
        bits(&ctx.linear(&x50, &wsq, None).unwrap().to_vec())
    );
    assert_eq!(ctx.rhs_cache_len(), 4);
    // Other zero-copy storage is accepted.
    let shared: Arc<[f32]> = wv.clone().into();
    let ws = ctx.from_shared(&[outf, inf], shared.clone()).unwrap();
    let wb = RawTensor::from_buffer(Buffer::from_arc(shared), &[outf, inf]).unwrap();
    assert_eq!(
        bits(&ctx.linear_with(&x, &ws, None, STABLE).unwrap().to_vec()),
        bits(&plain)
    );
    assert_eq!(
        bits(&ctx.linear_with(&x, &wb, None, STABLE).unwrap().to_vec()),
        bits(&plain)
    );
    ctx.clear_rhs_cache();
    assert_eq!(ctx.rhs_cache_len(), 0);
}

#[test]
fn rhs_cache_never_serves_new_storage() {
    let ctx = ExecContext::with_threads(1);
    let (inf, outf) = (20, 10);
    let x = ctx.from_slice(&[2, inf], &rand_vec(60, 2 * inf)).unwrap();
    for round in 0..6u64 {
        // New storage each round (the allocator may hand out the same address once
        // the previous weight's storage is gone), with different values.
        let wv = rand_vec(61 + round, outf * inf);
        let w = ctx.from_vec(&[outf, inf], wv.clone()).unwrap();
        let want = ctx
            .linear(&x, &ctx.from_slice(&[outf, inf], &wv).unwrap(), None)
            .unwrap()
            .to_vec();
        let got = ctx.linear_with(&x, &w, None, STABLE).unwrap().to_vec();
        assert_eq!(bits(&got), bits(&want), "round {round}");
        drop(w);
        if round % 2 == 1 {
            // Dropping the cache releases the old storage for real.
            ctx.clear_rhs_cache();
        }
    }
}

#[test]
fn steady_state_calls_take_no_new_blocks() {
    // Pool misses and plain buffers are aligned-block allocations; at steady state a
    // matmul (output, packing scratch) and a cached linear take everything from the
    // pool or the cache. The counters are process-wide, so other tests running in
    // this process may allocate meanwhile: one clean window out of ten suffices.
    let ctx = ExecContext::with_threads(2);
    let a = ctx.from_slice(&[70, 300], &rand_vec(70, 70 * 300)).unwrap();
    let b = ctx.from_slice(&[300, 90], &rand_vec(71, 300 * 90)).unwrap();
    let w = ctx.from_vec(&[90, 300], rand_vec(72, 90 * 300)).unwrap();
    let run = || {
        drop(ctx.matmul(&a, &b).unwrap());
        drop(ctx.linear_with(&a, &w, None, STABLE).unwrap());
        drop(ctx.linear(&a, &w, None).unwrap());
    };
    run();
    let clean = (0..10).any(|_| {
        let before = fucina_exec::storage::allocation_stats().allocations;
        run();
        fucina_exec::storage::allocation_stats().allocations == before
    });
    assert!(clean, "every steady-state window allocated new blocks");
    // A refused StableProcess call allocates nothing either.
    let pooled = ctx.zeros(&[90, 300]).unwrap();
    let outstanding = ctx.outstanding_buffers();
    assert!(ctx.linear_with(&a, &pooled, None, STABLE).is_err());
    assert_eq!(ctx.outstanding_buffers(), outstanding);
}

#[test]
fn single_row_column_split_is_deterministic_and_batch_invariant() {
    // One output row with k * n above the parallel gate: the columns are split.
    let (inf, outf) = (1100, 1000);
    let xv = rand_vec(80, 3 * inf);
    let wv = rand_vec(81, outf * inf);
    let bv = rand_vec(82, outf);
    let mut first: Option<Vec<u32>> = None;
    for threads in 1..=4 {
        let ctx = ExecContext::with_threads(threads);
        let x = ctx.from_slice(&[3, inf], &xv).unwrap();
        let w = ctx.from_slice(&[outf, inf], &wv).unwrap();
        let b = ctx.from_slice(&[outf], &bv).unwrap();
        let batch = ctx.linear(&x, &w, Some(&b)).unwrap().to_vec();
        let x1 = x.narrow(0, 1, 1).unwrap();
        let one = ctx.linear(&x1, &w, Some(&b)).unwrap().to_vec();
        assert_eq!(
            bits(&one),
            bits(&batch[outf..2 * outf]),
            "threads {threads}"
        );
        // matmul of a 1-D vector by a transposed view, same chain.
        let v = ctx.from_slice(&[inf], &xv[inf..2 * inf]).unwrap();
        let mv = ctx
            .matmul(&v, &w.transpose(0, 1).unwrap())
            .unwrap()
            .to_vec();
        let nob = ctx.linear(&x1, &w, None).unwrap().to_vec();
        assert_eq!(bits(&mv), bits(&nob));
        match &first {
            None => first = Some(bits(&one)),
            Some(f) => assert_eq!(f, &bits(&one), "threads {threads}"),
        }
    }
    // Against the f64 reference.
    let f = first.unwrap();
    for o in [0, 31, 32, 999] {
        let want: f64 = f64::from(bv[o])
            + (0..inf)
                .map(|i| f64::from(xv[inf + i]) * f64::from(wv[o * inf + i]))
                .sum::<f64>();
        assert!(
            (f64::from(f32::from_bits(f[o])) - want).abs() < 1e-3,
            "column {o}"
        );
    }
}

#[test]
fn training_shape_is_thread_count_deterministic_and_batch_invariant() {
    // The MLP training shape: [64, 784] x [784, 256] (k = 784 is cut into
    // equal depth blocks), t1 == t2 == t3 bitwise, and row 0 of the 64-row
    // product equals the 1-row product.
    let (m, k, n) = (64, 784, 256);
    let av = rand_vec(93, m * k);
    let bv = rand_vec(94, k * n);
    let mut first: Option<Vec<u32>> = None;
    for threads in 1..=3 {
        let ctx = ExecContext::with_threads(threads);
        let a = ctx.from_slice(&[m, k], &av).unwrap();
        let b = ctx.from_slice(&[k, n], &bv).unwrap();
        let c = bits(&ctx.matmul(&a, &b).unwrap().to_vec());
        let a0 = a.narrow(0, 0, 1).unwrap();
        let c0 = bits(&ctx.matmul(&a0, &b).unwrap().to_vec());
        assert_eq!(c0, c[..n], "threads {threads}: row 0 alone");
        let a5 = a.narrow(0, 37, 5).unwrap();
        let c5 = bits(&ctx.matmul(&a5, &b).unwrap().to_vec());
        assert_eq!(c5, c[37 * n..42 * n], "threads {threads}: rows 37..42");
        match &first {
            None => first = Some(c),
            Some(f) => assert_eq!(f, &c, "threads {threads}"),
        }
    }
    // Against the plain f32 fma chain.
    let f = first.unwrap();
    for (i, j) in [(0, 0), (13, 200), (63, 255)] {
        let mut acc = 0.0f32;
        for kk in 0..k {
            acc = av[i * k + kk].mul_add(bv[kk * n + j], acc);
        }
        assert_eq!(f[i * n + j], acc.to_bits(), "({i}, {j})");
    }
}

/// The gradient of an operand broadcast over batch dims is the full batched
/// product summed down with `sum_to`, bit for bit, for every team size: one
/// summation order for every broadcast gradient of the runtime (blocks of 256
/// batch entries, then the block sums in order). Before `matmul_backward` used
/// `sum_to`, it summed the batch entries one by one, which differs in the last
/// bits once there are more than 256 of them (the 300 here).
#[test]
fn broadcast_batch_gradients_are_sum_to_of_the_batched_product() {
    let (batch, m, k, n) = (300, 2, 3, 4);
    let av = rand_vec(50, m * k);
    let bv = rand_vec(51, batch * k * n);
    let gv = rand_vec(52, batch * m * n);
    let av2 = rand_vec(53, batch * m * k);
    let bv2 = rand_vec(54, k * n);
    for threads in [1, 2, 3] {
        let ctx = ExecContext::with_threads(threads);
        // `a` broadcast over the batch of `b`.
        let a = ctx.from_slice(&[m, k], &av).unwrap();
        let b = ctx.from_slice(&[batch, k, n], &bv).unwrap();
        let g = ctx.from_slice(&[batch, m, n], &gv).unwrap();
        let (ga, _) = ctx.matmul_backward(&a, &b, &g).unwrap();
        let full = ctx.matmul(&g, &b.transpose(1, 2).unwrap()).unwrap();
        let want = ctx.sum_to(&full, &[m, k]).unwrap();
        assert_eq!(
            bits(&ga.to_vec()),
            bits(&want.to_vec()),
            "grad_a, threads {threads}"
        );
        // `b` broadcast over the batch of `a`.
        let a2 = ctx.from_slice(&[batch, m, k], &av2).unwrap();
        let b2 = ctx.from_slice(&[k, n], &bv2).unwrap();
        let (_, gb) = ctx.matmul_backward(&a2, &b2, &g).unwrap();
        let full = ctx.matmul(&a2.transpose(1, 2).unwrap(), &g).unwrap();
        let want = ctx.sum_to(&full, &[k, n]).unwrap();
        assert_eq!(
            bits(&gb.to_vec()),
            bits(&want.to_vec()),
            "grad_b, threads {threads}"
        );
    }
}
