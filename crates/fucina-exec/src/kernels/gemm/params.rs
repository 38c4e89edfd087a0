//! The blocking parameters of the GEMM and the two pure functions that cut a
//! product into blocks and tiles. None of them changes a result: every output
//! element is the same fused multiply-add chain whatever the blocking (see the
//! module docs of [`super`]).

/// Columns of a packed right-hand-side panel (and of a micro-tile of every
/// kernel: [`super::MicroKernel::NR`]).
pub(crate) const NR: usize = 32;

/// Largest depth of a packed block (the `k` extent of one micro-kernel call).
///
/// The left-hand micro-panel a tile keeps in L1 while the right-hand-side panels
/// stream past it is `12 x KC` floats: 12 x 512 x 4 B = 24 KiB, half of a 48 KiB
/// L1 (the rest holds the streaming right-hand-side lines and the `C` tile). A
/// long depth means few passes over `C` (each depth block after the first reads
/// and writes every `C` tile once more). A depth `k` is cut into
/// `ceil(k / KC)` blocks of (almost) equal depth ([`depth_blocks`]) so no short
/// tail block pays the tile's load and store of `C` for a few steps. Blocking
/// never changes the result (the chain continues through `C`).
///
/// Measured on a 2-vCPU AVX-512 Xeon (48 KiB L1, 2 MiB L2): `KC = 512,
/// NC = 512` ran the 1024³ product about 5% faster than `192 x 1024`, and the
/// row-tile-major order (this one) about 10% faster than the panel-major one
/// (each right-hand-side panel kept in L1 for a block's row tiles); see
/// `docs/BENCHMARKS-JOURNAL.md`.
pub(crate) const KC: usize = 512;

/// Rows of a packed left-hand-side block: the rows packed at a time, once per
/// depth block, and reused by every column block of [`NC`] columns (so a wide
/// product packs each left-hand element once, not once per column block). The
/// packed block is `MC x KC x 4 B = 512 KiB`, in L2 beside the right-hand-side
/// block; its `MR x KC` micro-panels go to L1 one at a time.
pub(crate) const MC: usize = 256;

/// Columns of one column block (a multiple of [`NR`]): the right-hand-side block
/// the row tiles sweep, `KC x NC x 4 B = 1 MiB`, stays in a 2 MiB L2 while every
/// row tile of the product streams it.
pub(crate) const NC: usize = 512;

/// The largest micro-tile height of the kernels that go through a stack tile
/// (the portable and AVX2 kernels; the AVX-512 kernel reads and writes `C`
/// directly).
pub(super) const MR_MAX: usize = 8;

/// A stack tile: the `C` rows of one micro-tile, copied in before the
/// micro-kernel runs and out after it.
pub(super) type StackTile = [[f32; NR]; MR_MAX];

/// The depth blocks of a product with depth `k`: `ceil(k / KC)` consecutive ranges
/// of equal depth (the first `k % blocks` one longer). Depends on `k` only.
pub(super) fn depth_blocks(k: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let blocks = k.div_ceil(KC).max(1);
    let (base, extra) = (k / blocks, k % blocks);
    (0..blocks).map(move |b| {
        let start = b * base + b.min(extra);
        start..start + base + usize::from(b < extra)
    })
}

/// The row tiles of a block of `mc` rows for tile height `mr`: `mc.div_ceil(mr)`
/// tiles `(first row, rows)`, all `mr` rows high except the last two, which
/// share the remainder evenly, e.g. 16 rows are two tiles of 8 rather than
/// 12 + 4 (a short tile does the loads of a full one for a fraction of its
/// multiply-adds). Depends on `mc` and `mr` only, and a row's arithmetic never
/// depends on its tile.
pub(super) fn row_tiles(mc: usize, mr: usize) -> impl Iterator<Item = (usize, usize)> {
    let mr = mr.max(1);
    let tiles = mc.div_ceil(mr);
    let full = if mc.is_multiple_of(mr) {
        tiles
    } else {
        tiles.saturating_sub(2)
    };
    // Rows of the (one or two) tiles after the full ones.
    let rest = mc - full * mr;
    let hi = if tiles - full == 2 {
        rest.div_ceil(2)
    } else {
        rest
    };
    (0..tiles).map(move |t| match t.cmp(&full) {
        std::cmp::Ordering::Less => (t * mr, mr),
        std::cmp::Ordering::Equal => (full * mr, hi),
        std::cmp::Ordering::Greater => (full * mr + hi, rest - hi),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_blocks_cover_the_depth_in_order_with_near_equal_lengths() {
        for k in [0, 1, 5, KC - 1, KC, KC + 1, 2 * KC + 7, 5000] {
            let blocks: Vec<_> = depth_blocks(k).collect();
            assert_eq!(blocks.len(), k.div_ceil(KC).max(1), "k={k}");
            let mut next = 0;
            for b in &blocks {
                assert_eq!(b.start, next, "k={k}: blocks are consecutive");
                assert!(b.len() <= KC, "k={k}: a block is at most KC deep");
                next = b.end;
            }
            assert_eq!(next, k, "k={k}: blocks cover the depth");
            let (lo, hi) = (
                blocks.iter().map(|b| b.len()).min().unwrap(),
                blocks.iter().map(|b| b.len()).max().unwrap(),
            );
            assert!(hi - lo <= 1, "k={k}: lengths differ by at most one");
        }
    }

    #[test]
    fn row_tiles_cover_the_block_and_split_the_rest_evenly() {
        for mr in [3, 4, 12] {
            for mc in 1..=MC {
                let tiles: Vec<_> = row_tiles(mc, mr).collect();
                assert_eq!(tiles.len(), mc.div_ceil(mr), "mc={mc} mr={mr}");
                let mut next = 0;
                for &(q0, rows) in &tiles {
                    assert_eq!(q0, next, "mc={mc} mr={mr}: tiles are consecutive");
                    assert!((1..=mr).contains(&rows), "mc={mc} mr={mr}: {rows} rows");
                    next = q0 + rows;
                }
                assert_eq!(next, mc, "mc={mc} mr={mr}: tiles cover the block");
                if let [.., (_, a), (_, b)] = tiles[..] {
                    assert!(a >= b && a - b <= 1, "mc={mc} mr={mr}: last two {a}, {b}");
                }
            }
        }
        assert_eq!(row_tiles(16, 12).collect::<Vec<_>>(), [(0, 8), (8, 8)]);
    }
}
