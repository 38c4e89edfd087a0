//! The fixed summation tree over a step's microbatches, and which rank counts
//! can reduce it without changing a bit.
//!
//! The sum of the `M` microbatch partials of a step is always taken in one
//! shape: the binary tree whose node `q` at depth `d` covers the microbatches
//! `floor(M·q / 2^d) .. floor(M·(q + 1) / 2^d)` — the root covers `0 .. M`, and
//! a node of two or more microbatches splits at `floor(M·(2q + 1) / 2^(d+1))`
//! into its two children (both non-empty), down to single microbatches. A
//! node's value is `left + right`, elementwise. The tree depends on `M` alone,
//! never on the rank count, and its nodes at depth `d` are exactly the
//! microbatch slices [`shard_range`](crate::shard_range)`(M, r, 2^d)` of
//! `2^d` ranks. So every way of computing it — [`LocalDataParallel`](crate::LocalDataParallel) in one
//! process, the allgather path, or the reduce-scatter path with each of `2^d`
//! ranks summing its own subtree — gives the same bits. (For `M` a power of two
//! it is the plain balanced tree: `((p0 + p1) + (p2 + p3)) + ...`.)
//!
//! The tree is run *in place* over `M` slots (one partial each): a node over
//! `lo .. hi` leaves its value in slot `lo`. `tree_ops` lists the additions
//! `slot[dst] += slot[src]` in the order that does that (post-order), so a
//! caller runs them over whatever layout its slots have. The tree's code is
//! `fucina::optim`'s (`tree_sum_ops`, `run_tree_sum`), which `fucina-llm`'s
//! fine-tuning follows too.

#[cfg(test)]
use std::ops::Range;

#[cfg(test)]
use crate::reduce::shard_range;

// The tree itself lives in the facade (`fucina::optim`), where `fucina-llm`'s
// fine-tuning accumulates its microbatches in the same order.
#[cfg(test)]
use fucina::optim::tree_node_start as bound;
pub(crate) use fucina::optim::{
    run_tree_sum as run_ops, tree_mean_from_sum as divide_into, tree_sum_ops as tree_ops,
};

/// Whether `ranks` ranks can reduce a step of `microbatches` microbatches with
/// [`Reduction::Tree`](crate::Reduction::Tree): every rank's microbatches
/// ([`shard_range`](crate::shard_range)) must be one node of the fixed tree,
/// and the rank sums must meet in the same tree above them. That holds exactly
/// when `ranks` is a power of two no larger than `microbatches` (1, 2, 4, 8,
/// ... up to `M`): the tree's nodes at depth `d` are `shard_range(M, r, 2^d)`
/// for every `M`, and above them it is the balanced tree over the ranks.
///
/// ```
/// use fucina_dist::tree_allows;
/// assert!(tree_allows(8, 4));
/// assert!(tree_allows(6, 4)); // uneven: ranks own 1, 2, 1, 2 microbatches
/// assert!(!tree_allows(8, 3)); // not a power of two
/// assert!(!tree_allows(4, 8)); // more ranks than microbatches
/// ```
pub fn tree_allows(microbatches: usize, ranks: usize) -> bool {
    ranks.is_power_of_two() && ranks <= microbatches
}

/// The fixed-tree mean of `count` partials of `w` floats stored one after the
/// other in `parts` (summed in place: `parts` is clobbered), into `out`.
pub(crate) fn tree_mean_contiguous(
    out: &mut [f32],
    parts: &mut [f32],
    w: usize,
    ops: &[(usize, usize)],
) {
    let count = parts.len() / w;
    run_ops(parts, w, ops, |i| i * w);
    divide_into(out, &parts[..w], count);
}

/// `true` when the rank slices of `shard_range(microbatches, r, ranks)` are
/// nodes of the tree at one depth (the property [`tree_allows`] relies on),
/// checked by building the tree's nodes. Used by the tests.
#[cfg(test)]
fn shards_are_tree_nodes(microbatches: usize, ranks: usize) -> bool {
    // Walks the tree as `tree_ops` does (a node splits into two children
    // while it holds two or more microbatches) and collects the nodes at the
    // depth of `ranks` (a leaf above that depth cannot be a rank's slice).
    fn nodes(m: usize, d: u32, q: usize, want: u32, out: &mut Vec<Range<usize>>) {
        let range = bound(m, d, q)..bound(m, d, q + 1);
        if d == want {
            out.push(range);
        } else if range.len() >= 2 {
            nodes(m, d + 1, 2 * q, want, out);
            nodes(m, d + 1, 2 * q + 1, want, out);
        }
    }
    if !ranks.is_power_of_two() {
        return false;
    }
    let mut at_depth = Vec::new();
    nodes(microbatches, 0, 0, ranks.trailing_zeros(), &mut at_depth);
    if at_depth.len() != ranks {
        return false;
    }
    at_depth
        .iter()
        .enumerate()
        .all(|(r, n)| *n == shard_range(microbatches, r, ranks))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tree's sum of scalars, written as the recursion it stands for:
    /// node `q` at depth `d` over `floor(M q / 2^d) .. floor(M (q+1) / 2^d)`.
    fn tree_sum(v: &[f32], d: u32, q: usize) -> f32 {
        let m = v.len() as f64;
        let at = |d: u32, q: usize| (m * q as f64 / f64::from(1u32 << d)).floor() as usize;
        let (lo, hi) = (at(d, q), at(d, q + 1));
        if hi - lo == 1 {
            return v[lo];
        }
        tree_sum(v, d + 1, 2 * q) + tree_sum(v, d + 1, 2 * q + 1)
    }

    #[test]
    fn ops_compute_the_recursive_tree() {
        // Values whose sum depends on the grouping.
        let vals: Vec<f32> = (0..37)
            .map(|i| if i % 3 == 0 { 1e8 } else { 1.0 + i as f32 * 0.37 } * if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        for m in 1..vals.len() {
            let mut ops = Vec::new();
            tree_ops(m, 0, 0, 0, &mut ops);
            assert_eq!(ops.len(), m - 1, "m = {m}: one addition per inner node");
            let mut buf = vals[..m].to_vec();
            run_ops(&mut buf, 1, &ops, |i| i);
            assert_eq!(
                buf[0].to_bits(),
                tree_sum(&vals[..m], 0, 0).to_bits(),
                "m = {m}"
            );
        }
    }

    #[test]
    fn the_tree_differs_from_the_sequential_sum() {
        // (1e8 + 1) + (-1e8 + 1) = 0 in the tree; ((1e8 + 1) - 1e8) + 1 = 1 in order.
        let vals = [1e8f32, 1.0, -1e8, 1.0];
        let mut ops = Vec::new();
        tree_ops(4, 0, 0, 0, &mut ops);
        assert_eq!(ops, [(0, 1), (2, 3), (0, 2)]);
        let mut buf = vals.to_vec();
        run_ops(&mut buf, 1, &ops, |i| i);
        let sequential = vals.iter().fold(0.0f32, |a, &v| a + v);
        assert_ne!(buf[0].to_bits(), sequential.to_bits());
    }

    #[test]
    fn rank_subtrees_then_rank_tree_equal_the_whole_tree() {
        // Each rank sums its shard in place, then the rank roots are summed in
        // the tree over ranks: the same bits as the tree over all microbatches.
        let w = 3;
        for m in 1..=40usize {
            let parts: Vec<f32> = (0..m * w)
                .map(|i| ((i * 7919 % 113) as f32 - 56.0) * if i % 5 == 0 { 1e7 } else { 0.3 })
                .collect();
            let mut all = Vec::new();
            tree_ops(m, 0, 0, 0, &mut all);
            let mut want = parts.clone();
            run_ops(&mut want, w, &all, |i| i * w);
            for ranks in 1..=m.min(32) {
                assert_eq!(
                    tree_allows(m, ranks),
                    shards_are_tree_nodes(m, ranks),
                    "m={m} ranks={ranks}"
                );
                if !tree_allows(m, ranks) {
                    continue;
                }
                let mut roots = vec![0.0f32; ranks * w];
                for r in 0..ranks {
                    let s = shard_range(m, r, ranks);
                    let mut mine = parts[s.start * w..s.end * w].to_vec();
                    let mut ops = Vec::new();
                    tree_ops(m, ranks.trailing_zeros(), r, s.start, &mut ops);
                    run_ops(&mut mine, w, &ops, |i| i * w);
                    roots[r * w..(r + 1) * w].copy_from_slice(&mine[..w]);
                }
                let mut top = Vec::new();
                tree_ops(ranks, 0, 0, 0, &mut top);
                run_ops(&mut roots, w, &top, |i| i * w);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&roots[..w]), bits(&want[..w]), "m={m} ranks={ranks}");
            }
        }
    }

    #[test]
    fn shard_boundaries_are_tree_nodes_for_every_power_of_two() {
        for m in 1..=1000 {
            let mut ranks = 1;
            while ranks <= m {
                assert!(shards_are_tree_nodes(m, ranks), "m={m} ranks={ranks}");
                ranks *= 2;
            }
        }
        assert!(!shards_are_tree_nodes(8, 3));
    }

    #[test]
    fn ops_in_any_slot_order() {
        // Slots stored in reverse order: the same sum.
        let vals = [3.5f32, -1e9, 2.25, 1e9, 7.0];
        let mut ops = Vec::new();
        tree_ops(5, 0, 0, 0, &mut ops);
        let mut fwd = vals.to_vec();
        run_ops(&mut fwd, 1, &ops, |i| i);
        let mut rev: Vec<f32> = vals.iter().rev().copied().collect();
        run_ops(&mut rev, 1, &ops, |i| 4 - i);
        assert_eq!(fwd[0].to_bits(), rev[4].to_bits());
    }
}
