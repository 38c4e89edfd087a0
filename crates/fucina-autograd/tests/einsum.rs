//! `einsum`: each common two-operand contraction (and the one-operand forms)
//! against hand-written loops, its gradients by finite differences, the same
//! bits for 1 and 2 threads, and the errors of bad specs.

mod support;

use fucina_autograd::exec::ExecContext;
use fucina_autograd::{AutogradError, Tensor, einsum};
use support::{check, values};

/// A loop reference: `out[o] = Σ a[ia] · b[ib]` over every assignment of the
/// letters, for the spec's letters with the given sizes.
fn reference(spec: &str, a: (&[usize], &[f32]), b: Option<(&[usize], &[f32])>) -> Vec<f64> {
    let (lhs, out) = spec.split_once("->").expect("the tests spell the output");
    let terms: Vec<&[u8]> = lhs.split(',').map(str::as_bytes).collect();
    let mut letters: Vec<u8> = terms.concat();
    letters.sort_unstable();
    letters.dedup();
    let size = |c: u8| {
        let (t, shape) = if let Some(p) = terms[0].iter().position(|&d| d == c) {
            (p, a.0)
        } else {
            let p = terms[1].iter().position(|&d| d == c).unwrap();
            (p, b.unwrap().0)
        };
        shape[t]
    };
    let sizes: Vec<usize> = letters.iter().map(|&c| size(c)).collect();
    let out = out.as_bytes();
    let out_numel: usize = out.iter().map(|&c| size(c)).product();
    let mut res = vec![0f64; out_numel];
    let mut idx = vec![0usize; letters.len()];
    let offset = |term: &[u8], shape: &[usize], idx: &[usize]| {
        term.iter().zip(shape).fold(0, |o, (&c, &n)| {
            o * n + idx[letters.iter().position(|&d| d == c).unwrap()]
        })
    };
    loop {
        let mut v = f64::from(a.1[offset(terms[0], a.0, &idx)]);
        if let Some((shape, data)) = b {
            v *= f64::from(data[offset(terms[1], shape, &idx)]);
        }
        let osh: Vec<usize> = out.iter().map(|&c| size(c)).collect();
        res[offset(out, &osh, &idx)] += v;
        // Next assignment.
        let mut i = letters.len();
        loop {
            if i == 0 {
                return res;
            }
            i -= 1;
            idx[i] += 1;
            if idx[i] < sizes[i] {
                break;
            }
            idx[i] = 0;
        }
    }
}

/// A spec, the two operands' shapes and the output's.
type Case = (
    &'static str,
    &'static [usize],
    &'static [usize],
    &'static [usize],
);

const CASES: &[Case] = &[
    ("ij,jk->ik", &[3, 5], &[5, 4], &[3, 4]),
    ("bij,bjk->bik", &[2, 3, 5], &[2, 5, 4], &[2, 3, 4]),
    (
        "bhqd,bhkd->bhqk",
        &[2, 3, 4, 5],
        &[2, 3, 6, 5],
        &[2, 3, 4, 6],
    ),
    ("ij,j->i", &[4, 7], &[7], &[4]),
    ("i,i->", &[9], &[9], &[1]),
    ("bi,bj->bij", &[3, 4], &[3, 5], &[3, 4, 5]),
    ("ij,kj->ik", &[3, 5], &[4, 5], &[3, 4]),
    ("ji,jk->ki", &[5, 3], &[5, 4], &[4, 3]),
    ("bij,jk->bik", &[2, 3, 5], &[5, 4], &[2, 3, 4]),
    ("ijk,jl->li", &[3, 4, 2], &[4, 5], &[5, 3]),
    ("ij,ij->", &[3, 4], &[3, 4], &[1]),
    ("ij,ij->ij", &[3, 4], &[3, 4], &[3, 4]),
];

fn operands(ctx: &ExecContext, sa: &[usize], sb: &[usize]) -> (Tensor, Tensor) {
    let na: usize = sa.iter().product();
    let nb: usize = sb.iter().product();
    (
        Tensor::variable_from_slice(ctx, sa, &values(na, 1, -1.0, 1.0)).unwrap(),
        Tensor::variable_from_slice(ctx, sb, &values(nb, 2, -1.0, 1.0)).unwrap(),
    )
}

#[test]
fn two_operand_contractions_match_loops() {
    let ctx = ExecContext::new();
    for &(spec, sa, sb, so) in CASES {
        let (a, b) = operands(&ctx, sa, sb);
        let y = einsum(&ctx, spec, &[&a, &b]).unwrap();
        assert_eq!(y.shape(), so, "{spec}");
        let want = reference(spec, (sa, &a.to_vec()), Some((sb, &b.to_vec())));
        for (i, (&g, &w)) in y.to_vec().iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{spec}[{i}]: {g} vs {w}"
            );
        }
    }
}

#[test]
fn one_operand_forms_match_loops() {
    let ctx = ExecContext::new();
    let x = Tensor::variable_from_slice(&ctx, &[3, 4, 2], &values(24, 3, -1.0, 1.0)).unwrap();
    for (spec, so) in [
        ("ijk->kji", &[2, 4, 3][..]),
        ("ijk->ik", &[3, 2]),
        ("ijk->", &[1]),
        ("ijk->j", &[4]),
        ("ijk->ijk", &[3, 4, 2]),
    ] {
        let y = einsum(&ctx, spec, &[&x]).unwrap();
        assert_eq!(y.shape(), so, "{spec}");
        let want = reference(spec, (&[3, 4, 2], &x.to_vec()), None);
        for (&g, &w) in y.to_vec().iter().zip(&want) {
            assert!(
                (f64::from(g) - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{spec}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn implicit_output_is_the_letters_used_once_in_order() {
    let ctx = ExecContext::new();
    let (a, b) = operands(&ctx, &[3, 5], &[5, 4]);
    let bits = |t: Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(einsum(&ctx, "ij,jk", &[&a, &b]).unwrap()),
        bits(einsum(&ctx, "ij,jk->ik", &[&a, &b]).unwrap())
    );
    // "ji" names the axes j, i: the implicit output "ij" is the transpose.
    assert_eq!(
        bits(einsum(&ctx, "ji", &[&a]).unwrap()),
        bits(a.permute(&ctx, &[1, 0]).unwrap())
    );
    // "ba,ca": a is summed, output "bc".
    let (x, y) = operands(&ctx, &[3, 5], &[4, 5]);
    assert_eq!(
        bits(einsum(&ctx, "ba,ca", &[&x, &y]).unwrap()),
        bits(einsum(&ctx, "ba,ca->bc", &[&x, &y]).unwrap())
    );
    assert_eq!(
        bits(einsum(&ctx, " i j , j k -> i k ", &[&a, &b]).unwrap()),
        bits(einsum(&ctx, "ij,jk->ik", &[&a, &b]).unwrap())
    );
}

#[test]
fn matmul_forms_are_the_matmul_bits() {
    let ctx = ExecContext::new();
    let (a, b) = operands(&ctx, &[2, 7, 33], &[2, 33, 9]);
    let y = einsum(&ctx, "bij,bjk->bik", &[&a, &b]).unwrap();
    let m = a.matmul(&ctx, &b).unwrap();
    let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&y), bits(&m));
}

#[test]
fn gradients_pass_gradcheck() {
    let ctx = ExecContext::new();
    for &(spec, sa, sb, _) in CASES {
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let inputs = [
            ctx.from_slice(sa, &values(na, 4, -1.0, 1.0)).unwrap(),
            ctx.from_slice(sb, &values(nb, 5, -1.0, 1.0)).unwrap(),
        ];
        check(
            &ctx,
            spec,
            |ctx, t| einsum(ctx, spec, &[&t[0], &t[1]]),
            &inputs,
        );
    }
    let x = ctx
        .from_slice(&[3, 4, 2], &values(24, 6, -1.0, 1.0))
        .unwrap();
    for spec in ["ijk->kji", "ijk->ik", "ijk->"] {
        check(
            &ctx,
            spec,
            |ctx, t| einsum(ctx, spec, &[&t[0]]),
            std::slice::from_ref(&x),
        );
    }
}

/// The output and both gradients of every case, as bits.
fn all_bits(ctx: &ExecContext) -> Vec<u32> {
    let mut out = Vec::new();
    for &(spec, sa, sb, _) in CASES {
        // Large enough that the GEMM splits the work.
        let scale = |s: &[usize]| s.iter().map(|&n| n * 8).collect::<Vec<_>>();
        let (sa, sb) = (scale(sa), scale(sb));
        let (a, b) = operands(ctx, &sa, &sb);
        let y = einsum(ctx, spec, &[&a, &b]).unwrap();
        y.sum_all(ctx).unwrap().backward(ctx).unwrap();
        for t in [
            y,
            a.grad(ctx).unwrap().unwrap(),
            b.grad(ctx).unwrap().unwrap(),
        ] {
            out.extend(t.to_vec().iter().map(|v| v.to_bits()));
        }
    }
    out
}

#[test]
fn same_bits_for_one_and_two_threads() {
    let one = all_bits(&ExecContext::with_threads(1));
    assert_eq!(one, all_bits(&ExecContext::with_threads(2)));
}

fn reason(r: Result<Tensor, AutogradError>) -> String {
    match r {
        Err(AutogradError::Einsum { reason, .. }) => reason.into(),
        Err(e) => panic!("not an einsum error: {e}"),
        Ok(t) => panic!("accepted, shape {:?}", t.shape()),
    }
}

#[test]
fn bad_specs_are_errors_naming_the_problem() {
    let ctx = ExecContext::new();
    let (a, b) = operands(&ctx, &[3, 5], &[5, 4]);
    let (c, _) = operands(&ctx, &[4, 4], &[1]);
    let r = |spec: &str, ops: &[&Tensor]| reason(einsum(&ctx, spec, ops));
    assert_eq!(
        r("ij,jk->ii", &[&a, &b]),
        "letter 'i' appears twice in the output"
    );
    assert_eq!(
        r("ij,jk->iz", &[&a, &b]),
        "output letter 'z' is not in any input"
    );
    assert_eq!(
        r("ij,kj->ik", &[&a, &b]),
        "letter 'j' has size 5 in operand 0 and 4 in operand 1"
    );
    assert_eq!(
        r("ij,jk,kl->il", &[&a, &b, &b]),
        "3 operands: einsum takes one or two"
    );
    assert_eq!(
        r("ij,jk->ik", &[&a]),
        "the spec names 2 operand(s), 1 given"
    );
    assert_eq!(
        r("ijk,jk->ik", &[&a, &b]),
        "operand 0 has 2 axes, its term \"ijk\" names 3"
    );
    assert_eq!(
        r("ii->i", &[&c]),
        "letter 'i' appears twice in operand 0 (diagonals are not supported)"
    );
    assert_eq!(
        r("...j,jk->k", &[&a, &b]),
        "an ellipsis (...) is not supported"
    );
    assert_eq!(
        r("i1,jk->ik", &[&a, &b]),
        "'1' in operand 0 is not an ASCII letter"
    );
    assert_eq!(r("ij,jk->ik->i", &[&a, &b]), "more than one \"->\"");
    let e = einsum(&ctx, "ij,jk->ii", &[&a, &b]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "einsum \"ij,jk->ii\": letter 'i' appears twice in the output"
    );
}
