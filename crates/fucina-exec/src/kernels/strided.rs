//! The loop geometry of elementwise ops over operands of any layout.
//!
//! An N-operand elementwise op writes a contiguous output of some shape while each
//! operand is read through its own (broadcast) strides. [`Geom`] coalesces the axes
//! that are contiguous for every operand, so a contiguous or tail-broadcast operand
//! becomes one long inner segment, and walks the output in *segments*: maximal runs
//! along the innermost axis, each with one base index and one inner stride per
//! operand. Kernels then specialise on the inner strides (1 or 0 is the fast path).

use std::ops::Range;

use crate::tensor::layout::{Dims, Layout, MAX_RANK};

/// Segment geometry of an N-operand elementwise loop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geom<const N: usize> {
    /// Coalesced outer dims (the last axis, `inner`, excluded).
    outer: Dims,
    outer_strides: [Dims; N],
    inner: usize,
    inner_strides: [usize; N],
    offsets: [usize; N],
}

impl<const N: usize> Geom<N> {
    /// The geometry of `shape` read through `layouts` (each already broadcast to
    /// `shape`).
    pub(crate) fn new(shape: &[usize], layouts: [&Layout; N]) -> Geom<N> {
        // Collect axes (dropping size-1 axes, whose stride never matters), then merge
        // axis i into i+1 when it is contiguous over it for every operand.
        let mut dims = [0usize; MAX_RANK];
        let mut strides = [[0usize; MAX_RANK]; N];
        let mut r = 0;
        for (ax, &d) in shape.iter().enumerate() {
            if d == 1 {
                continue;
            }
            if r > 0 && (0..N).all(|k| strides[k][r - 1] == layouts[k].strides()[ax] * d) {
                // merge into the previous axis
                dims[r - 1] *= d;
                for (k, s) in strides.iter_mut().enumerate() {
                    s[r - 1] = layouts[k].strides()[ax];
                }
                continue;
            }
            dims[r] = d;
            for (k, s) in strides.iter_mut().enumerate() {
                s[r] = layouts[k].strides()[ax];
            }
            r += 1;
        }
        let offsets = std::array::from_fn(|k| layouts[k].offset());
        if r == 0 {
            // a single element
            return Geom {
                outer: Dims::default(),
                outer_strides: [Dims::default(); N],
                inner: 1,
                inner_strides: [0; N],
                offsets,
            };
        }
        Geom {
            outer: Dims::new(&dims[..r - 1]),
            outer_strides: std::array::from_fn(|k| Dims::new(&strides[k][..r - 1])),
            inner: dims[r - 1],
            inner_strides: std::array::from_fn(|k| strides[k][r - 1]),
            offsets,
        }
    }

    /// Length of the innermost (coalesced) axis.
    pub(crate) fn inner(&self) -> usize {
        self.inner
    }

    /// Inner strides, one per operand.
    pub(crate) fn inner_strides(&self) -> [usize; N] {
        self.inner_strides
    }

    /// Calls `f(out_pos, len, bases)` for the segments covering output elements
    /// `range` (row-major positions), in order. `bases[k]` is operand `k`'s storage
    /// index of the segment's first element; element `j` of the segment is at
    /// `bases[k] + j * inner_strides[k]`.
    pub(crate) fn for_segments(
        &self,
        range: Range<usize>,
        mut f: impl FnMut(usize, usize, [usize; N]),
    ) {
        if range.is_empty() {
            return;
        }
        let inner = self.inner;
        let outer = self.outer.as_slice();
        let rank = outer.len();
        // Unravel the starting row once.
        let row = range.start / inner;
        let mut col = range.start % inner;
        let mut idx = [0usize; MAX_RANK];
        let mut rowbase = self.offsets;
        {
            let mut rem = row;
            for ax in (0..rank).rev() {
                idx[ax] = rem % outer[ax];
                rem /= outer[ax];
                for (k, b) in rowbase.iter_mut().enumerate() {
                    *b += idx[ax] * self.outer_strides[k][ax];
                }
            }
        }
        let mut pos = range.start;
        while pos < range.end {
            let len = (inner - col).min(range.end - pos);
            let bases = std::array::from_fn(|k| rowbase[k] + col * self.inner_strides[k]);
            f(pos, len, bases);
            pos += len;
            col = 0;
            // odometer over the outer axes
            let mut ax = rank;
            while ax > 0 {
                ax -= 1;
                idx[ax] += 1;
                for (k, b) in rowbase.iter_mut().enumerate() {
                    *b += self.outer_strides[k][ax];
                }
                if idx[ax] < outer[ax] {
                    break;
                }
                for (k, b) in rowbase.iter_mut().enumerate() {
                    *b -= self.outer_strides[k][ax] * outer[ax];
                }
                idx[ax] = 0;
            }
        }
    }
}

/// `out[j] = f(a[ba + j*sa])` for a segment.
#[inline(always)]
pub(crate) fn seg1<A: Copy, O: Copy>(
    out: &mut [O],
    a: &[A],
    ba: usize,
    sa: usize,
    f: &impl Fn(A) -> O,
) {
    let n = out.len();
    match sa {
        1 => {
            for (o, &x) in out.iter_mut().zip(&a[ba..ba + n]) {
                *o = f(x);
            }
        }
        0 => {
            out.fill(f(a[ba]));
        }
        _ => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = f(a[ba + j * sa]);
            }
        }
    }
}

/// Rows and columns of the tiles of [`tiled_rows`].
pub(crate) const TILE: usize = 32;

/// `out[r * row_len + j] = f(a[bases[r] + j * sa])` for the `bases.len()` rows of
/// `out` (at most [`TILE`] of them), walked in tiles of [`TILE`] columns: for an
/// operand read across its rows with unit stride (a transposed or permuted view),
/// one tile reads `TILE` runs of consecutive elements and writes `TILE` short rows,
/// all of which stay in L1, instead of touching a new cache line per element.
#[inline(always)]
pub(crate) fn tiled_rows<A: Copy, O: Copy>(
    out: &mut [O],
    row_len: usize,
    a: &[A],
    bases: &[usize],
    sa: usize,
    f: &impl Fn(A) -> O,
) {
    debug_assert_eq!(out.len(), bases.len() * row_len);
    let mut j0 = 0;
    while j0 < row_len {
        let w = TILE.min(row_len - j0);
        for (orow, &b) in out.chunks_exact_mut(row_len).zip(bases) {
            // One range check per row of the tile, none per element.
            let src = a[b + j0 * sa..=b + (j0 + w - 1) * sa].iter().step_by(sa);
            for (o, &v) in orow[j0..j0 + w].iter_mut().zip(src) {
                *o = f(v);
            }
        }
        j0 += w;
    }
}

/// `out[j] = f(a[..], b[..])` for a segment, specialised on the inner strides.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn seg2<A: Copy, B: Copy, O>(
    out: &mut [O],
    a: &[A],
    ba: usize,
    sa: usize,
    b: &[B],
    bb: usize,
    sb: usize,
    f: &impl Fn(A, B) -> O,
) {
    let n = out.len();
    match (sa, sb) {
        (1, 1) => {
            for ((o, &x), &y) in out.iter_mut().zip(&a[ba..ba + n]).zip(&b[bb..bb + n]) {
                *o = f(x, y);
            }
        }
        (1, 0) => {
            let y = b[bb];
            for (o, &x) in out.iter_mut().zip(&a[ba..ba + n]) {
                *o = f(x, y);
            }
        }
        (0, 1) => {
            let x = a[ba];
            for (o, &y) in out.iter_mut().zip(&b[bb..bb + n]) {
                *o = f(x, y);
            }
        }
        _ => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = f(a[ba + j * sa], b[bb + j * sb]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(shape: &[usize], strides: &[usize], off: usize) -> Layout {
        Layout::from_parts(Dims::new(shape), Dims::new(strides), off)
    }

    fn collect<const N: usize>(g: &Geom<N>, range: Range<usize>) -> Vec<[usize; N]> {
        let mut v = Vec::new();
        g.for_segments(range, |_, len, bases| {
            for j in 0..len {
                v.push(std::array::from_fn(|k| bases[k] + j * g.inner_strides()[k]));
            }
        });
        v
    }

    #[test]
    fn coalesces_contiguous_and_walks_any_range() {
        let c = lay(&[2, 3, 4], &[12, 4, 1], 0);
        let t = lay(&[2, 3, 4], &[0, 1, 0], 5); // a [3,1] broadcast at offset 5
        let g = Geom::new(&[2, 3, 4], [&c, &t]);
        let all = collect(&g, 0..24);
        for (i, p) in all.iter().enumerate() {
            let (i0, i1) = (i / 12, (i / 4) % 3);
            let _ = i0;
            assert_eq!(p[0], i);
            assert_eq!(p[1], 5 + i1);
        }
        // any sub-range gives the same positions
        for s in 0..24 {
            for e in s..=24 {
                assert_eq!(collect(&g, s..e), all[s..e].to_vec());
            }
        }
        let g = Geom::new(&[2, 3, 4], [&c]);
        assert_eq!(g.inner(), 24);
    }
}
