//! The fixed summation tree over a step's microbatches: the one order in
//! which the partial gradients of `M` microbatches are added, whoever adds
//! them (one process accumulating its microbatches, or `fucina-dist`'s ranks
//! each summing a subtree), so every way of computing a step gives the same
//! bits.
//!
//! Node `q` at depth `d` covers the microbatches
//! `floor(M·q / 2^d) .. floor(M·(q + 1) / 2^d)`: the root covers `0 .. M`, and
//! a node of two or more microbatches splits at `floor(M·(2q + 1) / 2^(d+1))`
//! into its two children (both non-empty), down to single microbatches. A
//! node's value is `left + right`, elementwise. For `M` a power of two it is
//! the balanced tree `((p0 + p1) + (p2 + p3)) + ...`.
//!
//! The tree runs *in place* over `M` slots (one partial each): a node over
//! `lo .. hi` leaves its value in slot `lo`. [`tree_sum_ops`] lists the
//! additions `slot[dst] += slot[src]` in the order that does that
//! (post-order), [`run_tree_sum`] runs them over any layout of the slots.
//!
//! ```
//! use fucina::optim::{run_tree_sum, tree_sum_ops};
//!
//! let mut ops = Vec::new();
//! tree_sum_ops(4, 0, 0, 0, &mut ops);
//! assert_eq!(ops, [(0, 1), (2, 3), (0, 2)]);
//! // (1e8 + 1) + (-1e8 + 1) = 0 in the tree; the sequential sum gives 1.
//! let mut slots = [1e8f32, 1.0, -1e8, 1.0];
//! run_tree_sum(&mut slots, 1, &ops, |i| i);
//! assert_eq!(slots[0], 0.0);
//! ```

/// The first microbatch of node `q` at depth `d` of the tree over `total`:
/// `floor(total·q / 2^d)`.
pub fn tree_node_start(total: usize, depth: u32, q: usize) -> usize {
    ((total as u128 * q as u128) >> depth) as usize
}

/// The additions `slot[dst] += slot[src]` that sum the subtree of node `index`
/// at depth `depth` of the tree over `total` microbatches, leaving the sum in
/// the node's first slot, appended to `out` as `(dst − base, src − base)`
/// pairs (post-order: both children before their parent). `tree_sum_ops(M, 0,
/// 0, 0, ..)` is the whole tree (`M − 1` additions).
pub fn tree_sum_ops(
    total: usize,
    depth: u32,
    index: usize,
    base: usize,
    out: &mut Vec<(usize, usize)>,
) {
    let (lo, hi) = (
        tree_node_start(total, depth, index),
        tree_node_start(total, depth, index + 1),
    );
    if hi - lo < 2 {
        return;
    }
    tree_sum_ops(total, depth + 1, 2 * index, base, out);
    tree_sum_ops(total, depth + 1, 2 * index + 1, base, out);
    out.push((
        lo - base,
        tree_node_start(total, depth + 1, 2 * index + 1) - base,
    ));
}

/// Runs `ops` (from [`tree_sum_ops`]) over slots of `len` floats each, slot
/// `i` at `buf[at(i) .. at(i) + len]`: `slot[dst][j] += slot[src][j]`.
///
/// # Panics
/// If two slots an addition names overlap or lie outside `buf` (a contract of
/// the caller).
pub fn run_tree_sum(
    buf: &mut [f32],
    len: usize,
    ops: &[(usize, usize)],
    at: impl Fn(usize) -> usize,
) {
    for &(dst, src) in ops {
        let (d, s) = (at(dst), at(src));
        assert!(
            d + len <= s || s + len <= d,
            "run_tree_sum: slots {dst} and {src} overlap"
        );
        if d < s {
            let (head, tail) = buf.split_at_mut(s);
            add_into(&mut head[d..d + len], &tail[..len]);
        } else {
            let (head, tail) = buf.split_at_mut(d);
            add_into(&mut tail[..len], &head[s..s + len]);
        }
    }
}

/// `dst[j] += src[j]`.
fn add_into(dst: &mut [f32], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

/// `out[j] = sum[j] / count` (the division in f32): a step's mean from the
/// tree's sum.
pub fn tree_mean_from_sum(out: &mut [f32], sum: &[f32], count: usize) {
    let n = count as f32;
    for (o, &s) in out.iter_mut().zip(sum) {
        *o = s / n;
    }
}
