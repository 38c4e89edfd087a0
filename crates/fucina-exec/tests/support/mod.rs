//! Shared helpers of the exec integration tests: views of every layout class and a
//! naive broadcasting reference.
#![allow(dead_code, unreachable_pub)]

use fucina_exec::{ExecContext, RawTensor};

/// Deterministic pseudo-random values in [-2, 2).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let u = (fucina_exec::rng::at(seed, i) >> 40) as f32 / (1u64 << 24) as f32;
            4.0 * u - 2.0
        })
        .collect()
}

/// The four ways an operand of `shape` can reach an op: contiguous, transposed
/// (stored as the transpose and viewed back), narrowed out of a wider tensor, and
/// broadcast from a size-1 leading axis. All hold the same logical values.
pub fn layouts(ctx: &ExecContext, shape: &[usize], seed: u64) -> Vec<RawTensor> {
    let n: usize = shape.iter().product();
    let vals = values(n, seed);
    let mut out = vec![ctx.from_slice(shape, &vals).unwrap()];
    let r = shape.len();
    if r >= 2 {
        // store the transpose of the last two axes, view it back
        let mut tshape = shape.to_vec();
        tshape.swap(r - 2, r - 1);
        let t = ctx
            .from_slice(shape, &vals)
            .unwrap()
            .transpose(r - 2, r - 1)
            .unwrap();
        let stored = ctx.materialize(&t).unwrap();
        assert_eq!(stored.shape(), &tshape[..]);
        out.push(stored.transpose(r - 2, r - 1).unwrap());
    }
    // narrowed out of a tensor one wider on the last axis
    let mut wide = shape.to_vec();
    wide[r - 1] += 1;
    let wn: usize = wide.iter().product();
    let mut wv = vec![99.0; wn];
    for (i, v) in vals.iter().enumerate() {
        let row = i / shape[r - 1];
        let col = i % shape[r - 1];
        wv[row * wide[r - 1] + col + 1] = *v;
    }
    out.push(
        ctx.from_slice(&wide, &wv)
            .unwrap()
            .narrow(r - 1, 1, shape[r - 1])
            .unwrap(),
    );
    out
}

/// Row-major multi-index of `i` in `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for ax in (0..shape.len()).rev() {
        idx[ax] = i % shape[ax];
        i /= shape[ax];
    }
    idx
}

/// Logical index into `shape` of the element broadcast to `out_idx`.
pub fn bcast_index(out_idx: &[usize], shape: &[usize]) -> usize {
    let lead = out_idx.len() - shape.len();
    let mut k = 0;
    for (ax, &d) in shape.iter().enumerate() {
        let i = if d == 1 { 0 } else { out_idx[lead + ax] };
        k = k * d + i;
    }
    k
}

/// Naive numpy-broadcast binary op on logical values.
pub fn naive_binary(
    a: &[f32],
    ashape: &[usize],
    b: &[f32],
    bshape: &[usize],
    f: impl Fn(f32, f32) -> f32,
) -> (Vec<usize>, Vec<f32>) {
    let shape = fucina_exec::broadcast_shapes("test", ashape, bshape)
        .unwrap()
        .to_vec();
    let n: usize = shape.iter().product();
    let out = (0..n)
        .map(|i| {
            let idx = unravel(i, &shape);
            f(a[bcast_index(&idx, ashape)], b[bcast_index(&idx, bshape)])
        })
        .collect();
    (shape, out)
}

/// A tensor's bit patterns with every NaN made the canonical one (NaN
/// payloads are not part of the determinism promise), for bitwise comparisons.
pub fn nan_bits(t: &RawTensor) -> Vec<u32> {
    t.to_vec()
        .iter()
        .map(|v| {
            if v.is_nan() {
                f32::NAN.to_bits()
            } else {
                v.to_bits()
            }
        })
        .collect()
}

/// Bit patterns, for bitwise comparisons.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `n` values of `fucina_rng::uniform_fill(seed, _, lo, hi)`.
pub fn uniform(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut v = vec![0.0; n];
    fucina_exec::rng::uniform_fill(seed, &mut v, lo, hi);
    v
}

/// The element count of `shape`.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A non-contiguous view holding `data` with `shape`: every other element of a
/// storage twice as long (strides doubled, offset 1).
pub fn strided(ctx: &ExecContext, shape: &[usize], data: &[f32]) -> RawTensor {
    let mut storage = vec![f32::NAN; 2 * data.len() + 1];
    for (i, &v) in data.iter().enumerate() {
        storage[2 * i + 1] = v;
    }
    let t = ctx.from_slice(&[storage.len()], &storage).unwrap();
    let mut strides = vec![2; shape.len()];
    for i in (0..shape.len() - 1).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let v = t.view_with_strides(shape, &strides, 1).unwrap();
    assert!(!v.is_contiguous() || v.numel() == 1);
    assert_eq!(v.to_vec(), data);
    v
}

/// Asserts `got` equals `want` within a relative tolerance (NaN matches NaN).
pub fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = f64::from(g);
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "{what}[{i}]: got {g}, want {w}");
    }
}

/// Central differences in f64 of `f` at `x`, dotted with the output weights `w`.
pub fn fd_grad(x: &[f64], w: &[f64], f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let mut p = x.to_vec();
            p[i] += h;
            let up: f64 = f(&p).iter().zip(w).map(|(a, b)| a * b).sum();
            p[i] -= 2.0 * h;
            let down: f64 = f(&p).iter().zip(w).map(|(a, b)| a * b).sum();
            (up - down) / (2.0 * h)
        })
        .collect()
}
