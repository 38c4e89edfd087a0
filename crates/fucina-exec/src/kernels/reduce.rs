//! Reduction kernels over slices: sums, extrema, arg-extrema and column sums.
//!
//! Every long sum has a grouping that depends only on the number of elements
//! reduced, never on threads or on how many other rows share the call:
//!
//! - a *block* of at most [`BLOCK`] elements is summed in [`LANES`] interleaved
//!   accumulators (lane `j` takes elements `j, j + LANES, ...`), combined in a fixed
//!   halving tree, then the `len % LANES` tail is added in order;
//! - up to [`SUPER`] elements, blocks are combined pairwise (the split falls on the
//!   block boundary nearest the middle: `ceil(len / BLOCK) / 2` blocks on the left);
//! - above [`SUPER`] elements, super-chunks of [`SUPER`] elements are summed as above
//!   and combined pairwise the same way (so a full reduction can compute its
//!   super-chunks in parallel and get the serial bits, see [`pairwise`]).
//!
//! Column sums (a reduction along an axis that is not the last one) accumulate
//! each column sequentially inside blocks of [`ROW_BLOCK`] rows and add the block
//! partials in row order ([`col_sum_with`]).

/// Interleaved accumulators of a block sum: four AVX-512, eight AVX2 or sixteen
/// SSE/NEON registers, enough independent add chains to hide the add latency at
/// every vector level (the layout, and so the result, is the same at all of them).
pub(crate) const LANES: usize = 64;
/// Elements per block: the unit of the pairwise combination.
pub(crate) const BLOCK: usize = 1024;
/// Rows per block of the column sums.
pub(crate) const ROW_BLOCK: usize = 256;
/// Elements per super-chunk: the unit a full reduction parallelizes over.
pub(crate) const SUPER: usize = 1 << 16;
/// Columns per tile of the column kernels (stack accumulators).
pub(crate) const TILE: usize = 64;

/// The fixed combination tree of `N` lane accumulators (`N` a power of two):
/// halving, lane `j` plus lane `j + width / 2`, until one is left. Every
/// fixed-order sum of the runtime ends with it (reductions, the weight and
/// quantized products); `fucina_exec::math::fold_lanes` gives it to the crates
/// above.
#[inline(always)]
pub fn fold_lanes<const N: usize>(a: [f32; N]) -> f32 {
    let mut v = a;
    let mut w = N;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            v[j] += v[j + w];
        }
    }
    v[0]
}

/// [`fold_lanes`] of this module's lane count.
#[inline(always)]
fn combine_lanes(a: &[f32; LANES]) -> f32 {
    fold_lanes(*a)
}

#[inline(always)]
fn block_sum_map(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    let mut s = combine_lanes(&acc);
    for &v in rem {
        s += f(v);
    }
    s
}

#[inline(always)]
fn block_sum_map2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (xa, xb) in ca.zip(cb) {
        for ((s, &u), &v) in acc.iter_mut().zip(xa).zip(xb) {
            *s += f(u, v);
        }
    }
    let mut s = combine_lanes(&acc);
    for (&u, &v) in ra.iter().zip(rb) {
        s += f(u, v);
    }
    s
}

// The block loops below are written out once per sum kind (not through a shared
// closure): each block kernel then has a single call site and is inlined, so it
// compiles at the vector level of the caller's `vectorized!` arm.

/// Stack room for the block partials of up to [`SUPER`] elements.
const MAX_BLOCKS: usize = SUPER / BLOCK;

/// `sum(f(x[i]))` in the fixed order of the module docs: up to [`SUPER`]
/// elements, the block sums go to a stack array and are combined by [`pairwise`]
/// (the same tree as splitting at `ceil(len / BLOCK) / 2` blocks, recursively);
/// above, super-chunks are summed that way and combined pairwise.
#[inline(always)]
pub(crate) fn sum_map(x: &[f32], f: impl Fn(f32) -> f32 + Copy) -> f32 {
    if x.len() > SUPER {
        return sum_map_super(x, f);
    }
    let mut partials = [0.0f32; MAX_BLOCKS];
    let mut n = 0;
    for c in x.chunks(BLOCK) {
        partials[n] = block_sum_map(c, f);
        n += 1;
    }
    pairwise(&partials[..n])
}

/// [`sum_map`] above [`SUPER`] elements (recursive, so not inlined: each
/// super-chunk goes through the level dispatch).
fn sum_map_super(x: &[f32], f: impl Fn(f32) -> f32 + Copy) -> f32 {
    if x.len() <= SUPER {
        return super::simd::vectorized!(sum_map(x, f));
    }
    let h = x.len().div_ceil(SUPER) / 2 * SUPER;
    sum_map_super(&x[..h], f) + sum_map_super(&x[h..], f)
}

/// `sum(f(a[i], b[i]))` over two equally long slices, in the order of
/// [`sum_map`].
#[inline(always)]
pub(crate) fn sum_map2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Copy) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let b = &b[..a.len()];
    if a.len() > SUPER {
        return sum_map2_super(a, b, f);
    }
    let mut partials = [0.0f32; MAX_BLOCKS];
    let mut n = 0;
    for (ca, cb) in a.chunks(BLOCK).zip(b.chunks(BLOCK)) {
        partials[n] = block_sum_map2(ca, cb, f);
        n += 1;
    }
    pairwise(&partials[..n])
}

/// `(sum_map(a, |v| v), sum_map2(a, b, f))` in one pass over `a` (the same
/// bits as the two calls: each sum keeps its own lanes, blocks and tree).
#[inline(always)]
pub(crate) fn sum_and_sum_map2(
    a: &[f32],
    b: &[f32],
    f: impl Fn(f32, f32) -> f32 + Copy,
) -> (f32, f32) {
    debug_assert_eq!(a.len(), b.len());
    let b = &b[..a.len()];
    if a.len() > SUPER {
        return (sum_map(a, |v| v), sum_map2(a, b, f));
    }
    let (mut p0, mut p1) = ([0.0f32; MAX_BLOCKS], [0.0f32; MAX_BLOCKS]);
    let mut n = 0;
    for (ca, cb) in a.chunks(BLOCK).zip(b.chunks(BLOCK)) {
        let (mut s0, mut s1) = ([0.0f32; LANES], [0.0f32; LANES]);
        let xa = ca.chunks_exact(LANES);
        let xb = cb.chunks_exact(LANES);
        let (ra, rb) = (xa.remainder(), xb.remainder());
        for (xa, xb) in xa.zip(xb) {
            for (((t0, t1), &u), &v) in s0.iter_mut().zip(s1.iter_mut()).zip(xa).zip(xb) {
                *t0 += u;
                *t1 += f(u, v);
            }
        }
        let (mut t0, mut t1) = (combine_lanes(&s0), combine_lanes(&s1));
        for (&u, &v) in ra.iter().zip(rb) {
            t0 += u;
            t1 += f(u, v);
        }
        p0[n] = t0;
        p1[n] = t1;
        n += 1;
    }
    (pairwise(&p0[..n]), pairwise(&p1[..n]))
}

fn sum_map2_super(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Copy) -> f32 {
    if a.len() <= SUPER {
        return super::simd::vectorized!(sum_map2(a, b, f));
    }
    let h = a.len().div_ceil(SUPER) / 2 * SUPER;
    sum_map2_super(&a[..h], &b[..h], f) + sum_map2_super(&a[h..], &b[h..], f)
}

/// Writes `out[i] = f(x[i])` and returns `sum(out)` (bitwise [`sum`] of the
/// written `out`), in one pass.
#[inline(always)]
pub(crate) fn map_store_sum(x: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32 + Copy) -> f32 {
    debug_assert_eq!(x.len(), out.len());
    let x = &x[..out.len()];
    if x.len() > SUPER {
        return map_store_sum_super(x, out, f);
    }
    let mut partials = [0.0f32; MAX_BLOCKS];
    let mut n = 0;
    for (c, o) in x.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
        partials[n] = block_store_sum(c, o, f);
        n += 1;
    }
    pairwise(&partials[..n])
}

fn map_store_sum_super(x: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32 + Copy) -> f32 {
    if x.len() <= SUPER {
        return super::simd::vectorized!(map_store_sum(x, out, f));
    }
    let h = x.len().div_ceil(SUPER) / 2 * SUPER;
    let (lo, hi) = out.split_at_mut(h);
    map_store_sum_super(&x[..h], lo, f) + map_store_sum_super(&x[h..], hi, f)
}

#[inline(always)]
fn block_store_sum(x: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let cx = x.chunks_exact(LANES);
    let rx = cx.remainder();
    let mut co = out.chunks_exact_mut(LANES);
    for (c, o) in cx.zip(&mut co) {
        for ((a, d), &v) in acc.iter_mut().zip(o.iter_mut()).zip(c) {
            let y = f(v);
            *d = y;
            *a += y;
        }
    }
    let mut s = combine_lanes(&acc);
    for (d, &v) in co.into_remainder().iter_mut().zip(rx) {
        let y = f(v);
        *d = y;
        s += y;
    }
    s
}

/// The sum of `x` (see the module docs for the order).
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    sum_map(x, |v| v)
}

/// Combines the sums of consecutive super-chunks of [`SUPER`] elements exactly as
/// [`sum_map`] combines them, so that `pairwise(&[sum(c) for c in x.chunks(SUPER)])`
/// is bitwise `sum(x)`.
pub(crate) fn pairwise(partials: &[f32]) -> f32 {
    match partials.len() {
        0 => 0.0,
        1 => partials[0],
        n => {
            let h = n / 2;
            pairwise(&partials[..h]) + pairwise(&partials[h..])
        }
    }
}

/// Folds `x` with `pick(acc, v)` (a NaN-ignoring max or min: one SIMD instruction)
/// in [`LANES`] accumulators while tracking NaNs on the side; NaN if any element is
/// NaN (PyTorch's propagation), `init` for an empty slice.
#[inline(always)]
fn extremum(x: &[f32], init: f32, pick: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; LANES];
    // NaN flags as u32 lanes (the width of the f32 lanes, so both vectorize alike).
    let mut nan = [0u32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for ((a, n), &v) in acc.iter_mut().zip(nan.iter_mut()).zip(c) {
            *a = pick(*a, v);
            *n |= u32::from(v.is_nan());
        }
    }
    let mut m = init;
    let mut any_nan = nan.iter().fold(0, |a, &n| a | n) != 0;
    for &a in &acc {
        m = pick(m, a);
    }
    for &v in rem {
        m = pick(m, v);
        any_nan |= v.is_nan();
    }
    if any_nan { f32::NAN } else { m }
}

/// The largest element, NaN elements skipped (`-inf` for an empty or all-NaN
/// slice): the max of the softmax family, whose sums turn a NaN row into NaN
/// anyway (`exp(NaN - m)` is NaN), so they need no NaN tracking here.
///
/// Same lane layout as [`sum`] ([`LANES`] lanes, kept as four groups of 16 so the
/// inner loop unrolls fully and the accumulators stay in registers), lanes combined
/// in a fixed halving tree, the tail folded in order: the result (including the
/// sign of a zero max) depends only on `x`.
#[inline(always)]
pub(crate) fn max_skip_nan(x: &[f32]) -> f32 {
    const G: usize = LANES / 4;
    #[inline(always)]
    fn pick(a: f32, v: f32) -> f32 {
        if v > a { v } else { a }
    }
    let mut acc = [[f32::NEG_INFINITY; G]; 4];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for (g, cg) in acc.iter_mut().zip(c.chunks_exact(G)) {
            let mut t = *g;
            for (a, &v) in t.iter_mut().zip(cg) {
                *a = pick(*a, v);
            }
            *g = t;
        }
    }
    let mut v = [0.0f32; LANES];
    for (d, g) in v.chunks_exact_mut(G).zip(&acc) {
        d.copy_from_slice(g);
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            v[j] = pick(v[j], v[j + w]);
        }
    }
    let mut m = v[0];
    for &e in rem {
        m = pick(m, e);
    }
    m
}

/// The largest element; NaN if any element is NaN; `-inf` for an empty slice.
#[inline(always)]
pub(crate) fn max(x: &[f32]) -> f32 {
    extremum(x, f32::NEG_INFINITY, |a, v| if v > a { v } else { a })
}

/// The smallest element; NaN if any element is NaN; `+inf` for an empty slice.
#[inline(always)]
pub(crate) fn min(x: &[f32]) -> f32 {
    extremum(x, f32::INFINITY, |a, v| if v < a { v } else { a })
}

/// Index of the first largest element, NaN counting as larger than everything
/// (the first NaN wins), as PyTorch's `argmax`. `x` is not empty.
pub(crate) fn argmax(x: &[f32]) -> usize {
    arg_by(x, |v, best| v > best)
}

/// Index of the first smallest element (the first NaN wins).
pub(crate) fn argmin(x: &[f32]) -> usize {
    arg_by(x, |v, best| v < best)
}

#[inline(always)]
fn arg_by(x: &[f32], better: impl Fn(f32, f32) -> bool) -> usize {
    let mut best = x[0];
    let mut at = 0;
    if best.is_nan() {
        return 0;
    }
    for (i, &v) in x.iter().enumerate().skip(1) {
        if v.is_nan() {
            return i;
        }
        if better(v, best) {
            best = v;
            at = i;
        }
    }
    at
}

/// Column sums: `out[j] = sum over k in 0..n of row_k[j]`, where `add_row(k, acc)`
/// adds row `k`'s contribution to `acc` (`acc.len() == out.len() <= TILE`).
///
/// Order: inside each block of [`ROW_BLOCK`] rows, each column accumulates
/// sequentially from zero; block partials are added to the running total in row
/// order. The order depends only on `n`.
#[inline(always)]
pub(crate) fn col_sum_with(n: usize, out: &mut [f32], mut add_row: impl FnMut(usize, &mut [f32])) {
    let w = out.len();
    assert!(w <= TILE, "col_sum_with: a tile has at most {TILE} columns");
    let mut total = [0.0f32; TILE];
    let mut acc = [0.0f32; TILE];
    let mut start = 0;
    while start < n {
        let end = (start + ROW_BLOCK).min(n);
        let a = &mut acc[..w];
        a.fill(0.0);
        for k in start..end {
            add_row(k, a);
        }
        if start == 0 {
            total[..w].copy_from_slice(a);
        } else {
            for (t, &v) in total[..w].iter_mut().zip(a.iter()) {
                *t += v;
            }
        }
        start = end;
    }
    out.copy_from_slice(&total[..w]);
}

/// Column sums of the `[n, inner]` slab `x`, columns `i0..i0 + out.len()`.
#[inline(always)]
pub(crate) fn col_sum(x: &[f32], inner: usize, i0: usize, out: &mut [f32]) {
    let w = out.len();
    let n = x.len() / inner;
    col_sum_with(n, out, |k, acc| {
        for (a, &v) in acc.iter_mut().zip(&x[k * inner + i0..][..w]) {
            *a += v;
        }
    });
}

/// Calls `f(row, col0, out_tile)` over `out`, the flat elements `range` of an
/// `[outer, inner]` output, split into tiles of at most [`TILE`] columns that never
/// cross a row.
#[inline(always)]
pub(crate) fn for_each_col_tile(
    range: std::ops::Range<usize>,
    inner: usize,
    out: &mut [f32],
    mut f: impl FnMut(usize, usize, &mut [f32]),
) {
    let mut e = range.start;
    let mut off = 0;
    while e < range.end {
        let (o, i) = (e / inner, e % inner);
        let w = (inner - i).min(range.end - e).min(TILE);
        f(o, i, &mut out[off..off + w]);
        e += w;
        off += w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_matches_f64_and_pairwise_super_chunks() {
        let n = 3 * SUPER + 1234;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1001) as f32 * 0.001 - 0.5)
            .collect();
        let exact: f64 = x.iter().map(|&v| f64::from(v)).sum();
        let s = sum(&x);
        assert!((f64::from(s) - exact).abs() < 1e-3 * (1.0 + exact.abs()));
        let partials: Vec<f32> = x.chunks(SUPER).map(sum).collect();
        assert_eq!(pairwise(&partials).to_bits(), s.to_bits());
    }

    /// The pairwise definition of the module docs, written as the recursion.
    fn recursive_sum(x: &[f32]) -> f32 {
        if x.len() <= BLOCK {
            return block_sum_map(x, |v| v);
        }
        let unit = if x.len() > SUPER { SUPER } else { BLOCK };
        let h = x.len().div_ceil(unit) / 2 * unit;
        recursive_sum(&x[..h]) + recursive_sum(&x[h..])
    }

    #[test]
    fn fixed_sum_is_the_recursive_pairwise_sum() {
        let x: Vec<f32> = (0..3 * SUPER + 777)
            .map(|i| ((i * 7919) % 1001) as f32 * 0.013 - 6.5)
            .collect();
        for len in [
            1,
            15,
            17,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            5 * BLOCK + 3,
            SUPER - 1,
            SUPER,
            SUPER + 1,
            2 * SUPER + BLOCK + 9,
            x.len(),
        ] {
            let x = &x[..len];
            let s = sum(x);
            assert_eq!(s.to_bits(), recursive_sum(x).to_bits(), "len {len}");
            let mut out = vec![0.0; len];
            let t = map_store_sum(x, &mut out, |v| v * 0.5 + 1.0);
            let mapped: Vec<f32> = x.iter().map(|&v| v * 0.5 + 1.0).collect();
            assert_eq!(out, mapped, "len {len}");
            assert_eq!(t.to_bits(), sum(&mapped).to_bits(), "len {len}");
            assert_eq!(t.to_bits(), sum_map(x, |v| v * 0.5 + 1.0).to_bits());
        }
    }

    #[test]
    fn max_skip_nan_is_the_max_of_the_non_nan_elements() {
        for len in [0, 1, 15, 63, 64, 65, 130, 1029] {
            let mut x: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 1001) as f32 * 0.013 - 6.5)
                .collect();
            let naive = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max_skip_nan(&x), naive, "len {len}");
            if len > 0 {
                // The max in the tail, then NaNs in the body and the tail.
                x[len - 1] = 100.0;
                assert_eq!(max_skip_nan(&x), 100.0, "len {len}");
                x[0] = f32::NAN;
                x[len / 2] = f32::NAN;
                let want = if len > 1 { 100.0 } else { f32::NEG_INFINITY };
                assert_eq!(max_skip_nan(&x), want, "len {len}");
            }
        }
        assert_eq!(max_skip_nan(&[f32::NAN; 70]), f32::NEG_INFINITY);
    }

    #[test]
    fn extrema_propagate_nan_and_arg_takes_first() {
        let mut x = vec![1.0f32, 3.0, 3.0, -2.0, 0.5, 3.0, -2.0, 1.0, 2.0, 0.0];
        assert_eq!(max(&x), 3.0);
        assert_eq!(min(&x), -2.0);
        assert_eq!(argmax(&x), 1);
        assert_eq!(argmin(&x), 3);
        x[9] = f32::NAN;
        assert!(max(&x).is_nan() && min(&x).is_nan());
        assert_eq!(argmax(&x), 9);
        assert_eq!(argmin(&x), 9);
    }
}
