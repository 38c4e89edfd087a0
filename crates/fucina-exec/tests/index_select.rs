//! Structural, indexing and selection ops against straightforward references:
//! random shapes (proptest), non-contiguous operands, size-1 axes, duplicate
//! indices, every error case, thread-count determinism and batch invariance.

// `ExecError` is as large as a tensor (inline shapes); the library allows this too.
#![allow(clippy::result_large_err)]

use fucina_exec::{Element, ExecContext, ExecError, PARALLEL_THRESHOLD, RawTensor};
use proptest::prelude::*;

// ---------------------------------------------------------------- helpers

/// splitmix64: deterministic test data from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Values in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    /// Values with many ties, some NaNs and signed zeros (for the orderings).
    fn tie_vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| match self.below(12) {
                0 => f32::NAN,
                1 => -0.0,
                2 => 0.0,
                3 => f32::INFINITY,
                4 => f32::NEG_INFINITY,
                _ => self.below(5) as f32 - 2.0,
            })
            .collect()
    }
    fn indices(&mut self, n: usize, bound: usize) -> Vec<i64> {
        (0..n).map(|_| self.below(bound) as i64).collect()
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for ax in (0..shape.len()).rev() {
        idx[ax] = i % shape[ax];
        i /= shape[ax];
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// A tensor with logical shape `shape` and row-major values `vals`, laid out as
/// `variant`: 0 contiguous, 1 a transposed view (last two axes), 2 a narrowed view
/// of the last axis (strided), 3 a contiguous view at a non-zero offset.
fn make<T: Element>(ctx: &ExecContext, shape: &[usize], vals: &[T], variant: u8) -> RawTensor<T> {
    let r = shape.len();
    match variant {
        1 if r >= 2 => {
            let mut st = shape.to_vec();
            st.swap(r - 2, r - 1);
            let storage: Vec<T> = (0..vals.len())
                .map(|i| {
                    let mut idx = unravel(i, &st);
                    idx.swap(r - 2, r - 1);
                    vals[ravel(&idx, shape)]
                })
                .collect();
            let t = ctx.from_slice_typed(&st, &storage).unwrap();
            let v = t.transpose(r - 2, r - 1).unwrap();
            assert!(!v.is_contiguous() || shape[r - 2] == 1 || shape[r - 1] == 1);
            v
        }
        1 | 2 => {
            let mut st = shape.to_vec();
            st[r - 1] += 2;
            let storage: Vec<T> = (0..numel(&st))
                .map(|i| {
                    let mut idx = unravel(i, &st);
                    if idx[r - 1] == 0 || idx[r - 1] == st[r - 1] - 1 {
                        vals[0]
                    } else {
                        idx[r - 1] -= 1;
                        vals[ravel(&idx, shape)]
                    }
                })
                .collect();
            let t = ctx.from_slice_typed(&st, &storage).unwrap();
            t.narrow(r - 1, 1, shape[r - 1]).unwrap()
        }
        3 => {
            let mut st = shape.to_vec();
            st[0] += 1;
            let mut storage = vals[..numel(shape) / shape[0]].to_vec();
            storage.extend_from_slice(vals);
            let t = ctx.from_slice_typed(&st, &storage).unwrap();
            t.narrow(0, 1, shape[0]).unwrap()
        }
        _ => ctx.from_slice_typed(shape, vals).unwrap(),
    }
}

/// Runs a call that must fail and checks that it touched the pool neither to
/// keep nor to return a buffer (the cache is emptied first, so even a buffer
/// acquired and dropped again would show). Returns the error as an `Err`.
fn err_clean<R>(
    ctx: &ExecContext,
    f: impl FnOnce() -> Result<R, ExecError>,
) -> Result<(), ExecError> {
    ctx.pool().trim();
    let before = ctx.outstanding_buffers();
    let Err(e) = f() else {
        panic!("expected an error");
    };
    assert_eq!(ctx.outstanding_buffers(), before, "{e}: a buffer was kept");
    assert_eq!(ctx.pool().cached_bytes(), 0, "{e}: a buffer was acquired");
    Err(e)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn shape_strategy(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1..=max_dim, 1..=max_rank)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------- references

fn concat_ref(parts: &[(Vec<usize>, Vec<f32>)], axis: usize) -> (Vec<usize>, Vec<f32>) {
    let mut shape = parts[0].0.clone();
    shape[axis] = parts.iter().map(|p| p.0[axis]).sum();
    let out = (0..numel(&shape))
        .map(|i| {
            let mut idx = unravel(i, &shape);
            let mut p = 0;
            while idx[axis] >= parts[p].0[axis] {
                idx[axis] -= parts[p].0[axis];
                p += 1;
            }
            parts[p].1[ravel(&idx, &parts[p].0)]
        })
        .collect();
    (shape, out)
}

fn index_select_ref(shape: &[usize], x: &[f32], axis: usize, idx: &[i64]) -> Vec<f32> {
    let mut out_shape = shape.to_vec();
    out_shape[axis] = idx.len();
    (0..numel(&out_shape))
        .map(|i| {
            let mut c = unravel(i, &out_shape);
            c[axis] = idx[c[axis]] as usize;
            x[ravel(&c, shape)]
        })
        .collect()
}

fn gather_ref(shape: &[usize], x: &[f32], axis: usize, ishape: &[usize], idx: &[i64]) -> Vec<f32> {
    (0..numel(ishape))
        .map(|i| {
            let mut c = unravel(i, ishape);
            c[axis] = idx[i] as usize;
            x[ravel(&c, shape)]
        })
        .collect()
}

/// A serial scatter-add over the gradient in row-major order (the documented
/// accumulation order), in f32.
fn index_select_backward_ref(
    src_shape: &[usize],
    axis: usize,
    idx: &[i64],
    grad: &[f32],
) -> Vec<f32> {
    let mut gshape = src_shape.to_vec();
    gshape[axis] = idx.len();
    let mut out = vec![0.0f32; numel(src_shape)];
    for (i, &g) in grad.iter().enumerate() {
        let mut c = unravel(i, &gshape);
        c[axis] = idx[c[axis]] as usize;
        out[ravel(&c, src_shape)] += g;
    }
    out
}

fn gather_backward_ref(
    src_shape: &[usize],
    axis: usize,
    ishape: &[usize],
    idx: &[i64],
    grad: &[f32],
) -> Vec<f32> {
    let mut out = vec![0.0f32; numel(src_shape)];
    for (i, &g) in grad.iter().enumerate() {
        let mut c = unravel(i, ishape);
        c[axis] = idx[i] as usize;
        out[ravel(&c, src_shape)] += g;
    }
    out
}

/// `a < b` in the documented total order (NaN above everything, -0 == +0), as an
/// `Ordering`.
fn cmp_values(a: f32, b: f32) -> std::cmp::Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Greater,
        (false, true) => std::cmp::Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap(),
    }
}

/// The positions of every line along `axis`, stably sorted, first `k` kept, in an
/// output of `shape` with `k` on `axis`.
fn order_ref(shape: &[usize], x: &[f32], axis: usize, k: usize, descending: bool) -> Vec<i64> {
    let n = shape[axis];
    let mut out_shape = shape.to_vec();
    out_shape[axis] = k;
    let mut out = vec![0i64; numel(&out_shape)];
    for line in 0..numel(shape) / n {
        let mut lshape = shape.to_vec();
        lshape.remove(axis);
        let base = unravel(line, &lshape);
        let at = |t: usize| {
            let mut c = base.clone();
            c.insert(axis, t);
            c
        };
        let mut pos: Vec<usize> = (0..n).collect();
        // `sort_by` is stable: ties keep increasing positions.
        pos.sort_by(|&a, &b| {
            let o = cmp_values(x[ravel(&at(a), shape)], x[ravel(&at(b), shape)]);
            if descending { o.reverse() } else { o }
        });
        for (j, &p) in pos[..k].iter().enumerate() {
            out[ravel(&at(j), &out_shape)] = p as i64;
        }
    }
    out
}

// ---------------------------------------------------------------- concat / stack / split

proptest! {
    #![proptest_config(config())]

    #[test]
    fn concat_matches_reference(
        shape in shape_strategy(4, 5),
        axis_pick in 0usize..8,
        sizes in prop::collection::vec(1usize..5, 1..4),
        variants in prop::collection::vec(0u8..4, 4),
        seed in any::<u64>(),
    ) {
        let ctx = ExecContext::new();
        let mut rng = Rng(seed);
        let axis = axis_pick % shape.len();
        let parts: Vec<(Vec<usize>, Vec<f32>)> = sizes
            .iter()
            .map(|&s| {
                let mut sh = shape.clone();
                sh[axis] = s;
                let v = rng.vec(numel(&sh));
                (sh, v)
            })
            .collect();
        let tensors: Vec<RawTensor> = parts
            .iter()
            .zip(&variants)
            .map(|((sh, v), &var)| make(&ctx, sh, v, var))
            .collect();
        let refs: Vec<&RawTensor> = tensors.iter().collect();
        let got = ctx.concat(&refs, axis).unwrap();
        let (rshape, rvals) = concat_ref(&parts, axis);
        prop_assert_eq!(got.shape(), &rshape[..]);
        prop_assert!(got.is_contiguous());
        prop_assert_eq!(bits(&got.to_vec()), bits(&rvals));

        // The backward: split gives back the parts.
        let back = ctx.split(&got, axis, &sizes).unwrap();
        for (b, (sh, v)) in back.iter().zip(&parts) {
            prop_assert_eq!(b.shape(), &sh[..]);
            prop_assert_eq!(bits(&b.to_vec()), bits(v));
        }
    }

    #[test]
    fn stack_matches_reference(
        shape in shape_strategy(4, 5),
        axis_pick in 0usize..8,
        count in 1usize..4,
        variants in prop::collection::vec(0u8..4, 4),
        seed in any::<u64>(),
    ) {
        let ctx = ExecContext::new();
        let mut rng = Rng(seed);
        let axis = axis_pick % (shape.len() + 1);
        let parts: Vec<Vec<f32>> = (0..count).map(|_| rng.vec(numel(&shape))).collect();
        let tensors: Vec<RawTensor> = parts
            .iter()
            .zip(&variants)
            .map(|(v, &var)| make(&ctx, &shape, v, var))
            .collect();
        let refs: Vec<&RawTensor> = tensors.iter().collect();
        let got = ctx.stack(&refs, axis).unwrap();
        // Stack = concat of the parts with a size-1 axis inserted.
        let mut ushape = shape.clone();
        ushape.insert(axis, 1);
        let uparts: Vec<(Vec<usize>, Vec<f32>)> =
            parts.iter().map(|v| (ushape.clone(), v.clone())).collect();
        let (rshape, rvals) = concat_ref(&uparts, axis);
        prop_assert_eq!(got.shape(), &rshape[..]);
        prop_assert_eq!(bits(&got.to_vec()), bits(&rvals));
        // Each part comes back as a narrowed, squeezed view (when the rank allows).
        for (i, v) in parts.iter().enumerate() {
            let back = got.narrow(axis, i, 1).unwrap().squeeze(axis).unwrap();
            prop_assert_eq!(bits(&back.to_vec()), bits(v));
        }
    }
}

#[test]
fn concat_and_stack_handle_typed_and_broadcast_parts() {
    let ctx = ExecContext::new();
    // A broadcast (stride-0) part and an i64 concat.
    let row = ctx.from_slice(&[1, 3], &[1., 2., 3.]).unwrap();
    let b = row.broadcast_to(&[2, 3]).unwrap();
    let x = ctx.from_slice(&[1, 3], &[7., 8., 9.]).unwrap();
    let c = ctx.concat(&[&b, &x], 0).unwrap();
    assert_eq!(c.to_vec(), [1., 2., 3., 1., 2., 3., 7., 8., 9.]);
    let i = ctx.from_slice_typed::<i64>(&[2], &[4, 5]).unwrap();
    let j = ctx.from_slice_typed::<i64>(&[1], &[6]).unwrap();
    assert_eq!(ctx.concat(&[&i, &j], 0).unwrap().to_vec(), [4, 5, 6]);
    let s = ctx.stack(&[&i, &i], 1).unwrap();
    assert_eq!(s.shape(), [2, 2]);
    assert_eq!(s.to_vec(), [4, 4, 5, 5]);
    // Stacking rank-7 tensors gives rank 8.
    let r7 = ctx.from_slice(&[1, 1, 1, 1, 1, 1, 2], &[1., 2.]).unwrap();
    let s = ctx.stack(&[&r7, &r7], 7).unwrap();
    assert_eq!(s.shape(), [1, 1, 1, 1, 1, 1, 2, 2]);
    assert_eq!(s.to_vec(), [1., 1., 2., 2.]);
}

#[test]
fn joins_of_many_parts() {
    // More parts than are described on the stack, strided ones among them.
    let ctx = ExecContext::new();
    let mut rng = Rng(3);
    let parts: Vec<(Vec<usize>, Vec<f32>)> = (0..40)
        .map(|i| {
            let sh = vec![3, 1 + i % 4, 2];
            let v = rng.vec(numel(&sh));
            (sh, v)
        })
        .collect();
    let tensors: Vec<RawTensor> = parts
        .iter()
        .enumerate()
        .map(|(i, (sh, v))| make(&ctx, sh, v, (i % 4) as u8))
        .collect();
    let refs: Vec<&RawTensor> = tensors.iter().collect();
    let got = ctx.concat(&refs, 1).unwrap();
    let (rshape, rvals) = concat_ref(&parts, 1);
    assert_eq!(got.shape(), &rshape[..]);
    assert_eq!(bits(&got.to_vec()), bits(&rvals));
    let same: Vec<&RawTensor> = tensors.iter().step_by(4).collect(); // all [3, 1, 2]
    let s = ctx.stack(&same, 3).unwrap();
    assert_eq!(s.shape(), [3, 1, 2, 10]);
    let uparts: Vec<(Vec<usize>, Vec<f32>)> = parts
        .iter()
        .step_by(4)
        .map(|(_, v)| (vec![3, 1, 2, 1], v.clone()))
        .collect();
    assert_eq!(bits(&s.to_vec()), bits(&concat_ref(&uparts, 3).1));
}

#[test]
fn concat_stack_split_errors() {
    let ctx = ExecContext::new();
    let a = ctx.zeros(&[2, 3]).unwrap();
    let b = ctx.zeros(&[2, 4]).unwrap();
    let c = ctx.zeros(&[2, 3, 1]).unwrap();
    let none: [&RawTensor; 0] = [];
    assert!(matches!(
        err_clean(&ctx, || ctx.concat(&none, 0)),
        Err(ExecError::InvalidArgument { op: "concat", .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.stack(&none, 0)),
        Err(ExecError::InvalidArgument { op: "stack", .. })
    ));
    // Off-axis size mismatch, rank mismatch, bad axis.
    assert!(matches!(
        err_clean(&ctx, || ctx.concat(&[&a, &b], 0)),
        Err(ExecError::ShapeMismatch { op: "concat", .. })
    ));
    assert!(ctx.concat(&[&a, &b], 1).is_ok());
    assert!(matches!(
        err_clean(&ctx, || ctx.concat(&[&a, &c], 1)),
        Err(ExecError::ShapeMismatch { op: "concat", .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.concat(&[&a, &a], 2)),
        Err(ExecError::InvalidAxis {
            op: "concat",
            axis: 2,
            rank: 2
        })
    ));
    // Stack: any shape difference, axis > rank, rank 8 inputs.
    assert!(matches!(
        err_clean(&ctx, || ctx.stack(&[&a, &b], 0)),
        Err(ExecError::ShapeMismatch { op: "stack", .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.stack(&[&a, &c], 0)),
        Err(ExecError::ShapeMismatch { op: "stack", .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.stack(&[&a, &a], 3)),
        Err(ExecError::InvalidAxis { op: "stack", .. })
    ));
    let r8 = ctx.zeros(&[1; 8]).unwrap();
    assert!(matches!(
        err_clean(&ctx, || ctx.stack(&[&r8], 0)),
        Err(ExecError::InvalidShape { op: "stack", .. })
    ));
    // Split: bad axis, empty sizes, a zero, wrong sum.
    assert!(matches!(
        err_clean(&ctx, || ctx.split(&a, 2, &[1])),
        Err(ExecError::InvalidAxis { op: "split", .. })
    ));
    for sizes in [&[][..], &[0, 3], &[1, 1], &[2, 2], &[usize::MAX, 4]] {
        assert!(
            matches!(
                err_clean(&ctx, || ctx.split(&a, 1, sizes)),
                Err(ExecError::InvalidArgument { op: "split", .. })
            ),
            "{sizes:?}"
        );
    }
    // Nothing was allocated by the failures.
    drop((a, b, c, r8));
    assert_eq!(ctx.outstanding_buffers(), 0);
}

// ---------------------------------------------------------------- index_select / embedding / gather

proptest! {
    #![proptest_config(config())]

    #[test]
    fn index_select_and_backward_match_reference(
        shape in shape_strategy(4, 5),
        axis_pick in 0usize..8,
        m in 1usize..9,
        xvar in 0u8..4,
        ivar in 0u8..3,
        gvar in 0u8..4,
        seed in any::<u64>(),
    ) {
        let ctx = ExecContext::new();
        let mut rng = Rng(seed);
        let axis = axis_pick % shape.len();
        let x = rng.vec(numel(&shape));
        // Few distinct indices: duplicates are the rule.
        let idx = rng.indices(m, shape[axis]);
        let xt = make(&ctx, &shape, &x, xvar);
        let it = make(&ctx, &[m], &idx, ivar);
        let got = ctx.index_select(&xt, axis, &it).unwrap();
        let mut oshape = shape.clone();
        oshape[axis] = m;
        prop_assert_eq!(got.shape(), &oshape[..]);
        prop_assert_eq!(bits(&got.to_vec()), bits(&index_select_ref(&shape, &x, axis, &idx)));

        let g = rng.vec(numel(&oshape));
        let gt = make(&ctx, &oshape, &g, gvar);
        let back = ctx.index_select_backward(&gt, axis, &it, &shape).unwrap();
        prop_assert_eq!(back.shape(), &shape[..]);
        prop_assert_eq!(
            bits(&back.to_vec()),
            bits(&index_select_backward_ref(&shape, axis, &idx, &g))
        );
    }

    #[test]
    fn embedding_and_backward_match_reference(
        ids_shape in shape_strategy(3, 5),
        vocab in 1usize..9,
        dim in 1usize..7,
        wvar in 0u8..4,
        ivar in 0u8..4,
        gvar in 0u8..4,
        seed in any::<u64>(),
    ) {
        let ctx = ExecContext::new();
        let mut rng = Rng(seed);
        let w = rng.vec(vocab * dim);
        let ids = rng.indices(numel(&ids_shape), vocab);
        let wt = make(&ctx, &[vocab, dim], &w, wvar);
        let it = make(&ctx, &ids_shape, &ids, ivar);
        let got = ctx.embedding(&wt, &it).unwrap();
        let mut oshape = ids_shape.clone();
        oshape.push(dim);
        prop_assert_eq!(got.shape(), &oshape[..]);
        prop_assert_eq!(bits(&got.to_vec()), bits(&index_select_ref(&[vocab, dim], &w, 0, &ids)));

        let g = rng.vec(numel(&oshape));
        let gt = make(&ctx, &oshape, &g, gvar);
        let back = ctx.embedding_backward(&gt, &it, vocab).unwrap();
        prop_assert_eq!(back.shape(), &[vocab, dim][..]);
        prop_assert_eq!(
            bits(&back.to_vec()),
            bits(&index_select_backward_ref(&[vocab, dim], 0, &ids, &g))
        );
    }

    #[test]
    fn gather_and_backward_match_reference(
        shape in shape_strategy(4, 5),
        axis_pick in 0usize..8,
        shrink in prop::collection::vec(0usize..3, 4),
        m in 1usize..7,
        xvar in 0u8..4,
        ivar in 0u8..4,
        gvar in 0u8..4,
        seed in any::<u64>(),
    ) {
        let ctx = ExecContext::new();
        let mut rng = Rng(seed);
        let axis = axis_pick % shape.len();
        // The index: any size on the axis, no larger elsewhere.
        let ishape: Vec<usize> = shape
            .iter()
            .enumerate()
            .map(|(d, &s)| if d == axis { m } else { (s - shrink[d].min(s - 1)).max(1) })
            .collect();
        let x = rng.vec(numel(&shape));
        let idx = rng.indices(numel(&ishape), shape[axis]);
        let xt = make(&ctx, &shape, &x, xvar);
        let it = make(&ctx, &ishape, &idx, ivar);
        let got = ctx.gather(&xt, axis, &it).unwrap();
        prop_assert_eq!(got.shape(), &ishape[..]);
        prop_assert_eq!(bits(&got.to_vec()), bits(&gather_ref(&shape, &x, axis, &ishape, &idx)));

        let g = rng.vec(numel(&ishape));
        let gt = make(&ctx, &ishape, &g, gvar);
        let back = ctx.gather_backward(&gt, axis, &it, &shape).unwrap();
        prop_assert_eq!(back.shape(), &shape[..]);
        prop_assert_eq!(
            bits(&back.to_vec()),
            bits(&gather_backward_ref(&shape, axis, &ishape, &idx, &g))
        );
    }
}

#[test]
fn backward_accumulates_duplicates_in_index_order() {
    let ctx = ExecContext::new();
    // 1 + 1e8 - 1e8 in f32 depends on the order: index order gives (1 + 1e8) - 1e8 = 0,
    // the reverse order (-1e8 + 1e8) + 1 = 1.
    let ids = ctx.from_slice_typed::<i64>(&[3], &[0, 0, 0]).unwrap();
    let g = ctx.from_slice(&[3, 1], &[1.0, 1e8, -1e8]).unwrap();
    let e = ctx.embedding_backward(&g, &ids, 1).unwrap();
    assert_eq!(e.to_vec(), [(1.0f32 + 1e8) - 1e8]);
    let s = ctx.index_select_backward(&g, 0, &ids, &[1, 1]).unwrap();
    assert_eq!(s.to_vec(), [(1.0f32 + 1e8) - 1e8]);
    let gi = ctx.from_slice_typed::<i64>(&[3, 1], &[0, 0, 0]).unwrap();
    let b = ctx.gather_backward(&g, 0, &gi, &[1, 1]).unwrap();
    assert_eq!(b.to_vec(), [(1.0f32 + 1e8) - 1e8]);
    // The same through the column split of a single-row source (gather along axis 0
    // of a [1, 2] source) and through the row split (axis 1 of a [2, 1] source).
    let g2 = ctx
        .from_slice(&[3, 2], &[1.0, 1.0, 1e8, 1e8, -1e8, -1e8])
        .unwrap();
    let gi2 = ctx.zeros_typed::<i64>(&[3, 2]).unwrap();
    let b2 = ctx.gather_backward(&g2, 0, &gi2, &[1, 2]).unwrap();
    assert_eq!(b2.to_vec(), [(1.0f32 + 1e8) - 1e8; 2]);
    let g3 = g2.transpose(0, 1).unwrap();
    let gi3 = ctx.zeros_typed::<i64>(&[2, 3]).unwrap();
    let b3 = ctx.gather_backward(&g3, 1, &gi3, &[2, 1]).unwrap();
    assert_eq!(b3.to_vec(), [(1.0f32 + 1e8) - 1e8; 2]);
    drop((g2, gi2, b2, g3, gi3, b3));
    // Rows no index points at are zero, even in a recycled (dirty) buffer.
    drop((e, s, b));
    let dirty = ctx.full(&[4, 1], f32::NAN).unwrap();
    drop(dirty);
    let e = ctx.embedding_backward(&g, &ids, 4).unwrap();
    assert_eq!(e.to_vec()[1..], [0.0, 0.0, 0.0]);
}

#[test]
fn index_errors_name_the_index_and_the_bound() {
    let ctx = ExecContext::new();
    let x = ctx.zeros(&[3, 4]).unwrap();
    let idx = |v: &[i64]| ctx.from_slice_typed::<i64>(&[v.len()], v).unwrap();

    // index_select
    let bad = idx(&[0, 4, -1]);
    assert_eq!(
        err_clean(&ctx, || ctx.index_select(&x, 1, &bad)).unwrap_err(),
        ExecError::IndexOutOfBounds {
            op: "index_select",
            index: 4,
            bound: 4
        }
    );
    let neg = idx(&[1, -1]);
    assert_eq!(
        err_clean(&ctx, || ctx.index_select(&x, 0, &neg)).unwrap_err(),
        ExecError::IndexOutOfBounds {
            op: "index_select",
            index: -1,
            bound: 3
        }
    );
    assert!(matches!(
        err_clean(&ctx, || ctx.index_select(&x, 2, &neg)),
        Err(ExecError::InvalidAxis { .. })
    ));
    let two_d = ctx.zeros_typed::<i64>(&[1, 2]).unwrap();
    assert!(matches!(
        err_clean(&ctx, || ctx.index_select(&x, 0, &two_d)),
        Err(ExecError::InvalidShape {
            op: "index_select",
            ..
        })
    ));
    // A strided (transposed) index tensor is checked through its strides.
    let t = ctx
        .from_slice_typed::<i64>(&[2, 2], &[0, 1, 2, 9])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    assert_eq!(
        err_clean(&ctx, || ctx.embedding(&x, &t)).unwrap_err(),
        ExecError::IndexOutOfBounds {
            op: "embedding",
            index: 9,
            bound: 3
        }
    );

    // embedding
    let big = idx(&[3]);
    assert_eq!(
        err_clean(&ctx, || ctx.embedding(&x, &big)).unwrap_err(),
        ExecError::IndexOutOfBounds {
            op: "embedding",
            index: 3,
            bound: 3
        }
    );
    let w3 = ctx.zeros(&[3, 4, 1]).unwrap();
    let ok = idx(&[0]);
    assert!(matches!(
        err_clean(&ctx, || ctx.embedding(&w3, &ok)),
        Err(ExecError::InvalidShape {
            op: "embedding",
            ..
        })
    ));
    let ids8 = ctx.zeros_typed::<i64>(&[1; 8]).unwrap();
    assert!(matches!(
        err_clean(&ctx, || ctx.embedding(&x, &ids8)),
        Err(ExecError::InvalidShape {
            op: "embedding",
            ..
        })
    ));

    // gather
    let gi = ctx.from_slice_typed::<i64>(&[3, 1], &[0, 4, 0]).unwrap();
    assert_eq!(
        err_clean(&ctx, || ctx.gather(&x, 1, &gi)).unwrap_err(),
        ExecError::IndexOutOfBounds {
            op: "gather",
            index: 4,
            bound: 4
        }
    );
    let wide = ctx.zeros_typed::<i64>(&[4, 1]).unwrap(); // 4 > 3 off the axis
    assert!(matches!(
        err_clean(&ctx, || ctx.gather(&x, 1, &wide)),
        Err(ExecError::ShapeMismatch { op: "gather", .. })
    ));
    let rank1 = idx(&[0]);
    assert!(matches!(
        err_clean(&ctx, || ctx.gather(&x, 1, &rank1)),
        Err(ExecError::ShapeMismatch { op: "gather", .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.gather(&x, 2, &gi)),
        Err(ExecError::InvalidAxis { op: "gather", .. })
    ));
    drop((bad, neg, two_d, t, big, w3, ok, ids8, gi, wide, rank1, x));
    assert_eq!(ctx.outstanding_buffers(), 0);
}

#[test]
fn backward_errors() {
    let ctx = ExecContext::new();
    let i = ctx.from_slice_typed::<i64>(&[2], &[0, 2]).unwrap();
    let g = ctx.zeros(&[2, 4]).unwrap();
    // index_select_backward
    let f = |grad: &RawTensor, axis, idx: &RawTensor<i64>, shape: &[usize]| {
        ctx.index_select_backward(grad, axis, idx, shape)
    };
    assert!(f(&g, 0, &i, &[3, 4]).is_ok());
    assert!(matches!(
        err_clean(&ctx, || f(&g, 0, &i, &[2, 4])),
        Err(ExecError::IndexOutOfBounds {
            index: 2,
            bound: 2,
            ..
        })
    ));
    assert!(matches!(
        err_clean(&ctx, || f(&g, 0, &i, &[3, 5])),
        Err(ExecError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || f(&g, 1, &i, &[3, 4])),
        Err(ExecError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || f(&g, 2, &i, &[3, 4])),
        Err(ExecError::InvalidAxis { .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || f(&g, 0, &i, &[3, 0])),
        Err(ExecError::InvalidShape { .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || f(&g, 0, &i, &[])),
        Err(ExecError::InvalidShape { .. })
    ));
    let i2 = ctx.zeros_typed::<i64>(&[2, 1]).unwrap();
    assert!(matches!(
        err_clean(&ctx, || f(&g, 0, &i2, &[3, 4])),
        Err(ExecError::InvalidShape { .. })
    ));

    // embedding_backward
    assert!(ctx.embedding_backward(&g, &i, 3).is_ok());
    assert!(matches!(
        err_clean(&ctx, || ctx.embedding_backward(&g, &i, 2)),
        Err(ExecError::IndexOutOfBounds {
            op: "embedding_backward",
            index: 2,
            bound: 2
        })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.embedding_backward(&g, &i, 0)),
        Err(ExecError::InvalidShape { .. })
    ));
    let g3 = ctx.zeros(&[3, 4]).unwrap();
    assert!(matches!(
        err_clean(&ctx, || ctx.embedding_backward(&g3, &i, 3)),
        Err(ExecError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.embedding_backward(&g, &i2, 3)),
        Err(ExecError::ShapeMismatch { .. })
    ));
    let ids8 = ctx.zeros_typed::<i64>(&[1; 8]).unwrap();
    assert!(matches!(
        err_clean(&ctx, || ctx.embedding_backward(&g, &ids8, 3)),
        Err(ExecError::InvalidShape { .. })
    ));

    // gather_backward
    let gi = ctx.from_slice_typed::<i64>(&[2, 1], &[3, 0]).unwrap();
    let gg = ctx.zeros(&[2, 1]).unwrap();
    assert!(ctx.gather_backward(&gg, 1, &gi, &[2, 4]).is_ok());
    assert!(ctx.gather_backward(&gg, 1, &gi, &[3, 4]).is_ok());
    assert!(matches!(
        err_clean(&ctx, || ctx.gather_backward(&gg, 1, &gi, &[2, 3])),
        Err(ExecError::IndexOutOfBounds {
            index: 3,
            bound: 3,
            ..
        })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.gather_backward(&gg, 1, &gi, &[1, 4])),
        Err(ExecError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.gather_backward(&g, 1, &gi, &[2, 4])),
        Err(ExecError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.gather_backward(&gg, 2, &gi, &[2, 4])),
        Err(ExecError::InvalidAxis { .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.gather_backward(&gg, 0, &gi, &[2, 4, 1])),
        Err(ExecError::ShapeMismatch { .. })
    ));
}

// ---------------------------------------------------------------- topk / argsort

proptest! {
    #![proptest_config(config())]

    #[test]
    fn topk_and_argsort_match_reference(
        shape in shape_strategy(4, 6),
        axis_pick in 0usize..8,
        k_pick in 0usize..100,
        largest in any::<bool>(),
        var in 0u8..4,
        seed in any::<u64>(),
    ) {
        let ctx = ExecContext::new();
        let mut rng = Rng(seed);
        let axis = axis_pick % shape.len();
        let n = shape[axis];
        let k = 1 + k_pick % n;
        let x = rng.tie_vec(numel(&shape));
        let xt = make(&ctx, &shape, &x, var);

        let (v, i) = ctx.topk(&xt, k, axis, largest).unwrap();
        let ri = order_ref(&shape, &x, axis, k, largest);
        prop_assert_eq!(i.to_vec(), ri.clone());
        let mut oshape = shape.clone();
        oshape[axis] = k;
        prop_assert_eq!(v.shape(), &oshape[..]);
        prop_assert!(v.is_contiguous() && i.is_contiguous());
        prop_assert_eq!(bits(&v.to_vec()), bits(&gather_ref(&shape, &x, axis, &oshape, &ri)));

        let s = ctx.argsort(&xt, axis, largest).unwrap();
        prop_assert_eq!(s.shape(), &shape[..]);
        prop_assert_eq!(s.to_vec(), order_ref(&shape, &x, axis, n, largest));
    }
}

#[test]
fn ordering_along_a_leading_axis_of_a_larger_tensor() {
    // Lines and line counts beyond one transposition tile, split over chunks.
    let ctx = ExecContext::with_threads(3);
    let mut rng = Rng(17);
    let shape = [2, 70, 1000];
    let x = rng.tie_vec(numel(&shape));
    let t = make(&ctx, &shape, &x, 1);
    let s = ctx.argsort(&t, 1, false).unwrap();
    assert_eq!(s.to_vec(), order_ref(&shape, &x, 1, 70, false));
    let (v, i) = ctx.topk(&t, 40, 1, true).unwrap();
    let ri = order_ref(&shape, &x, 1, 40, true);
    assert_eq!(i.to_vec(), ri);
    assert_eq!(
        bits(&v.to_vec()),
        bits(&gather_ref(&shape, &x, 1, &[2, 40, 1000], &ri))
    );
}

#[test]
fn topk_nan_and_signed_zero_rules() {
    let ctx = ExecContext::new();
    let x = ctx
        .from_slice(&[6], &[0.0, f32::NAN, -0.0, 1.0, f32::NAN, -1.0])
        .unwrap();
    let (v, i) = ctx.topk(&x, 3, 0, true).unwrap();
    assert_eq!(i.to_vec(), [1, 4, 3]);
    assert!(v.to_vec()[0].is_nan() && v.to_vec()[1].is_nan());
    let (v, i) = ctx.topk(&x, 5, 0, false).unwrap();
    // -0.0 == +0.0: position order; NaNs last.
    assert_eq!(i.to_vec(), [5, 0, 2, 3, 1]);
    assert_eq!(bits(&v.to_vec()[..3]), bits(&[-1.0, 0.0, -0.0]));
    assert_eq!(
        ctx.argsort(&x, 0, true).unwrap().to_vec(),
        [1, 4, 3, 0, 2, 5]
    );
}

#[test]
fn topk_argsort_errors() {
    let ctx = ExecContext::new();
    let x = ctx.zeros(&[2, 3]).unwrap();
    for k in [0, 4] {
        assert!(matches!(
            err_clean(&ctx, || ctx.topk(&x, k, 1, true)),
            Err(ExecError::InvalidArgument { op: "topk", .. })
        ));
    }
    assert!(ctx.topk(&x, 2, 0, true).is_ok());
    assert!(matches!(
        err_clean(&ctx, || ctx.topk(&x, 3, 0, true)),
        Err(ExecError::InvalidArgument { op: "topk", .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.topk(&x, 1, 2, true)),
        Err(ExecError::InvalidAxis { op: "topk", .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.argsort(&x, 2, false)),
        Err(ExecError::InvalidAxis { op: "argsort", .. })
    ));
    // A line longer than 2^32 (a zero-stride view: no memory) is refused before
    // anything is allocated.
    let one = ctx.scalar(1.0).unwrap();
    let huge = one.broadcast_to(&[(1 << 32) + 1]).unwrap();
    let before = ctx.outstanding_buffers();
    assert!(matches!(
        err_clean(&ctx, || ctx.argsort(&huge, 0, false)),
        Err(ExecError::InvalidShape { op: "argsort", .. })
    ));
    assert!(matches!(
        err_clean(&ctx, || ctx.topk(&huge, 1, 0, false)),
        Err(ExecError::InvalidShape { op: "topk", .. })
    ));
    assert_eq!(ctx.outstanding_buffers(), before);
}

// ---------------------------------------------------------------- determinism

/// Runs `f` on contexts of 1 to 4 threads and checks that every result is the
/// same bits as the single-thread one.
fn same_for_all_team_sizes<R: PartialEq + std::fmt::Debug>(f: impl Fn(&ExecContext) -> R) {
    let base = f(&ExecContext::with_threads(1));
    for t in 2..=4 {
        let ctx = ExecContext::with_threads(t);
        assert_eq!(f(&ctx), base, "team size {t}");
    }
}

#[test]
fn every_op_is_bitwise_identical_for_team_sizes_1_to_4() {
    // At least 2^17 elements: the shapes below ([256, 512], ...) take that many.
    let big = (4 * PARALLEL_THRESHOLD).max(1 << 17);
    let mut rng = Rng(7);
    let x = rng.vec(big);
    let y = rng.vec(big / 2);
    let ties = rng.tie_vec(big);
    // Many duplicates: 4096 ids over a vocabulary of 5.
    let ids = rng.indices(4096, 5);
    let g_emb = rng.vec(4096 * 64);
    let cols = rng.indices(256 * 64, 256);

    same_for_all_team_sizes(|ctx| {
        let a = make(ctx, &[256, 512], &x, 1); // transposed view
        let b = make(ctx, &[256, 256], &y, 2); // narrowed view
        let c = ctx.concat(&[&a, &b], 1).unwrap();
        let c0 = ctx.concat(&[&a.transpose(0, 1).unwrap(), &b], 0).unwrap();
        let s = ctx.stack(&[&b, &b, &b], 2).unwrap();
        let s0 = ctx.stack(&[&b, &b], 0).unwrap();
        let out = (
            bits(&c.to_vec()),
            bits(&c0.to_vec()),
            bits(&s.to_vec()),
            bits(&s0.to_vec()),
        );
        drop((a, b, c, c0, s, s0));
        out
    });

    same_for_all_team_sizes(|ctx| {
        let w = ctx.from_slice(&[512, 256], &x).unwrap();
        let id = ctx.from_slice_typed::<i64>(&[4096], &ids).unwrap();
        let e = ctx.embedding(&w, &id).unwrap();
        let sel = ctx
            .index_select(&w, 1, &id.narrow(0, 0, 256).unwrap())
            .unwrap();
        let g = ctx.from_slice(&[4096, 64], &g_emb).unwrap();
        let gw = ctx.embedding_backward(&g, &id, 5).unwrap();
        let gs = ctx
            .index_select_backward(&g.transpose(0, 1).unwrap(), 1, &id, &[64, 7])
            .unwrap();
        let gi = ctx.from_slice_typed::<i64>(&[256, 64], &cols).unwrap();
        let ga = ctx.gather(&w.narrow(0, 0, 256).unwrap(), 1, &gi).unwrap();
        let gb = ctx.gather_backward(&ga, 1, &gi, &[256, 256]).unwrap();
        let gi0 = gi.transpose(0, 1).unwrap().narrow(0, 0, 64).unwrap();
        let gb0 = ctx.gather_backward(&ga.transpose(0, 1).unwrap(), 0, &gi0, &[256, 256]);
        let out = (
            bits(&e.to_vec()),
            bits(&sel.to_vec()),
            bits(&gw.to_vec()),
            bits(&gs.to_vec()),
            bits(&ga.to_vec()),
            bits(&gb.to_vec()),
            bits(&gb0.unwrap().to_vec()),
        );
        drop((w, id, e, sel, g, gw, gs, gi, ga, gb, gi0));
        out
    });

    same_for_all_team_sizes(|ctx| {
        let t = ctx.from_slice(&[128, 1024], &ties).unwrap();
        let (v, i) = ctx.topk(&t, 17, 1, true).unwrap();
        let (v0, i0) = ctx.topk(&t, 5, 0, false).unwrap();
        let s = ctx.argsort(&t, 1, false).unwrap();
        let s0 = ctx.argsort(&t, 0, true).unwrap();
        let out = (
            bits(&v.to_vec()),
            i.to_vec(),
            bits(&v0.to_vec()),
            i0.to_vec(),
            s.to_vec(),
            s0.to_vec(),
        );
        drop((t, v, i, v0, i0, s, s0));
        out
    });
}

#[test]
fn selection_is_batch_invariant() {
    let ctx = ExecContext::with_threads(4);
    let mut rng = Rng(11);
    let x = rng.tie_vec(64 * 1024);
    let batch = ctx.from_slice(&[64, 1024], &x).unwrap();
    let (bv, bi) = ctx.topk(&batch, 9, 1, true).unwrap();
    let bs = ctx.argsort(&batch, 1, true).unwrap();
    for row in [0, 37, 63] {
        let one = ctx
            .from_slice(&[1, 1024], &x[row * 1024..(row + 1) * 1024])
            .unwrap();
        let (v, i) = ctx.topk(&one, 9, 1, true).unwrap();
        assert_eq!(
            bits(&v.to_vec()),
            bits(&bv.to_vec()[row * 9..(row + 1) * 9])
        );
        assert_eq!(i.to_vec(), bi.to_vec()[row * 9..(row + 1) * 9]);
        let s = ctx.argsort(&one, 1, true).unwrap();
        assert_eq!(s.to_vec(), bs.to_vec()[row * 1024..(row + 1) * 1024]);
    }
}

#[test]
fn embedding_backward_is_batch_invariant_per_row() {
    // The weight-gradient row of an id depends only on the rows that carry that id,
    // in order: appending rows with other ids leaves it unchanged.
    let ctx = ExecContext::with_threads(4);
    let mut rng = Rng(5);
    let g = rng.vec(3000 * 16);
    let mut ids = rng.indices(3000, 4);
    ids[..1000].iter_mut().for_each(|i| *i = (*i % 2) + 2); // ids 2, 3 only
    let small_ids = ctx.from_slice_typed::<i64>(&[1000], &ids[..1000]).unwrap();
    let small_g = ctx.from_slice(&[1000, 16], &g[..16000]).unwrap();
    let small = ctx.embedding_backward(&small_g, &small_ids, 6).unwrap();
    // The full batch: the remaining rows use ids 0, 1 only.
    ids[1000..].iter_mut().for_each(|i| *i %= 2);
    let all_ids = ctx.from_slice_typed::<i64>(&[3000], &ids).unwrap();
    let all_g = ctx.from_slice(&[3000, 16], &g).unwrap();
    let all = ctx.embedding_backward(&all_g, &all_ids, 6).unwrap();
    assert_eq!(bits(&small.to_vec()[32..64]), bits(&all.to_vec()[32..64]));
}
