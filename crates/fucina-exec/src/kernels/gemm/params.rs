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

/// The blocking of one kernel's loop nest: depth blocks of at most `kc`, row
/// blocks of at most `mc` rows and column blocks of `nc` columns. Always
/// `1 <= kc <= KC`, `1 <= mc <= MC` (the scratch [`super::a_scratch_len`] sizes
/// for) and `nc` a positive multiple of [`NR`]. A kernel's blocking is fixed for
/// the life of the process, so [`super::pack_lhs`] and the driver agree on the
/// packed layout. It never changes a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocking {
    /// Largest depth of a block.
    pub(crate) kc: usize,
    /// Largest rows of a packed left-hand block.
    pub(crate) mc: usize,
    /// Columns of a column block.
    pub(crate) nc: usize,
}

impl Blocking {
    /// The constants [`KC`], [`MC`], [`NC`] (the AVX-512 and portable kernels).
    pub(crate) const FIXED: Blocking = Blocking {
        kc: KC,
        mc: MC,
        nc: NC,
    };

    /// The blocking of a kernel with `mr`-row tiles on a core with `caches`:
    /// the left-hand micro-panel (`mr x kc`, kept in L1 while a column block's
    /// right-hand-side panels stream past it) takes at most half of L1d and
    /// `kc` at most [`KC`]; the right-hand-side block (`kc x nc`, which every
    /// row tile streams from L2) at most half of L2; and `mc` is [`MC`]. On
    /// AMD Zen 3 (32 KiB, 512 KiB) a `6`-row kernel gets `kc = 512, nc = 128`;
    /// on Zen 4 (1 MiB L2) `nc = 256`; on a 2 MiB L2 `nc = 512`.
    ///
    /// `mc` is not rounded down to a multiple of `mr`: the matmul op hands the
    /// GEMM chunks of 256 rows (its row grain), and a 252-row block left each
    /// such chunk a 4-row block that streamed the whole right-hand side from
    /// L3 once more for 4 rows of work at two-thirds of the tile height; a
    /// 256-row block ends instead in two 5-row tiles ([`row_tiles`]).
    pub(crate) fn for_caches(mr: usize, caches: CacheSizes) -> Blocking {
        let mr = mr.clamp(1, MC);
        let f = std::mem::size_of::<f32>();
        let kc = (caches.l1d / 2 / (mr * f)).clamp(64, KC) / 8 * 8;
        let nc = (caches.l2 / 2 / (kc * f) / NR * NR).clamp(2 * NR, 4096);
        Blocking { kc, mc: MC, nc }
    }

    /// The AVX2 kernel's blocking for this CPU's caches ([`CacheSizes::detected`]),
    /// computed once.
    pub(crate) fn detected_avx2() -> Blocking {
        static B: std::sync::OnceLock<Blocking> = std::sync::OnceLock::new();
        *B.get_or_init(|| Blocking::for_caches(6, CacheSizes::detected()))
    }
}

/// The data-cache sizes of one core, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheSizes {
    /// Level-1 data cache.
    pub(crate) l1d: usize,
    /// Level-2 cache (unified).
    pub(crate) l2: usize,
}

impl CacheSizes {
    /// What [`CacheSizes::detected`] assumes where the CPU does not say: the
    /// smallest of current x86 cores (32 KiB L1d, 512 KiB L2, as on AMD Zen 2 and 3).
    pub(crate) const FALLBACK: CacheSizes = CacheSizes {
        l1d: 32 << 10,
        l2: 512 << 10,
    };

    /// The sizes the CPU reports through CPUID (the deterministic cache
    /// parameters, leaf 4 on Intel, 0x8000001D on AMD), computed once;
    /// [`CacheSizes::FALLBACK`] for a size it does not report or reports
    /// implausibly (under 4 KiB or over 64 MiB).
    pub(crate) fn detected() -> CacheSizes {
        static C: std::sync::OnceLock<CacheSizes> = std::sync::OnceLock::new();
        *C.get_or_init(|| {
            let (l1d, l2) = cpuid_caches();
            let ok = |x: Option<usize>, d: usize| {
                x.filter(|&x| (4 << 10..=64 << 20).contains(&x))
                    .unwrap_or(d)
            };
            CacheSizes {
                l1d: ok(l1d, Self::FALLBACK.l1d),
                l2: ok(l2, Self::FALLBACK.l2),
            }
        })
    }
}

/// The L1d and L2 sizes from the deterministic cache parameters of CPUID
/// (leaf 4, else leaf 0x8000001D): each sub-leaf describes one cache until a
/// sub-leaf of type 0; size = ways x partitions x line x sets.
#[cfg(target_arch = "x86_64")]
fn cpuid_caches() -> (Option<usize>, Option<usize>) {
    use std::arch::x86_64::__cpuid_count;
    let max_basic = __cpuid_count(0, 0).eax;
    let max_ext = __cpuid_count(0x8000_0000, 0).eax;
    let mut leaves = Vec::new();
    if max_basic >= 4 {
        leaves.push(4);
    }
    if max_ext >= 0x8000_001D {
        leaves.push(0x8000_001D);
    }
    for leaf in leaves {
        let (mut l1d, mut l2) = (None, None);
        for sub in 0..16 {
            let r = __cpuid_count(leaf, sub);
            let kind = r.eax & 0x1f;
            if kind == 0 {
                break;
            }
            let level = (r.eax >> 5) & 7;
            let size = ((r.ebx >> 22) as usize + 1)
                * (((r.ebx >> 12) & 0x3ff) as usize + 1)
                * ((r.ebx & 0xfff) as usize + 1)
                * (r.ecx as usize + 1);
            // Type 1 is a data cache, 3 a unified one.
            match (level, kind) {
                (1, 1) => l1d = Some(size),
                (2, 1 | 3) => l2 = Some(size),
                _ => {}
            }
        }
        if l1d.is_some() || l2.is_some() {
            return (l1d, l2);
        }
    }
    (None, None)
}

/// Other architectures: no cache description read (the fallback sizes).
#[cfg(not(target_arch = "x86_64"))]
fn cpuid_caches() -> (Option<usize>, Option<usize>) {
    (None, None)
}

/// The largest micro-tile height of the kernels that go through a stack tile
/// (the portable and AVX2 kernels; the AVX-512 kernel reads and writes `C`
/// directly).
pub(super) const MR_MAX: usize = 8;

/// A stack tile: the `C` rows of one micro-tile, copied in before the
/// micro-kernel runs and out after it.
pub(super) type StackTile = [[f32; NR]; MR_MAX];

/// The depth blocks of a product with depth `k` for blocks at most `kc` deep
/// (`kc >= 1`): `ceil(k / kc)` consecutive ranges of equal depth (the first `k %
/// blocks` one longer). Depends on `k` and `kc` only.
pub(super) fn depth_blocks(k: usize, kc: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let blocks = k.div_ceil(kc.max(1)).max(1);
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
            let blocks: Vec<_> = depth_blocks(k, KC).collect();
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
    fn blockings_fit_the_scratch_and_the_caches() {
        for (l1d, l2) in [
            (32, 512),
            (48, 2048),
            (32, 1024),
            (48, 1280),
            (16, 256),
            (4, 4),
        ] {
            let caches = CacheSizes {
                l1d: l1d << 10,
                l2: l2 << 10,
            };
            for mr in [1, 3, 4, 6, 12] {
                let b = Blocking::for_caches(mr, caches);
                assert!(
                    (1..=KC).contains(&b.kc) && (1..=MC).contains(&b.mc),
                    "{b:?}"
                );
                assert!(b.nc >= NR && b.nc.is_multiple_of(NR), "{b:?}");
                assert_eq!(b.mc, MC, "{b:?}");
            }
        }
        let zen3 = Blocking::for_caches(6, CacheSizes::FALLBACK);
        assert_eq!((zen3.kc, zen3.mc, zen3.nc), (512, MC, 128));
        let spr = CacheSizes {
            l1d: 48 << 10,
            l2: 2 << 20,
        };
        assert_eq!(Blocking::for_caches(6, spr).nc, 512);
        let d = CacheSizes::detected();
        assert!(d.l1d >= 4 << 10 && d.l2 >= 4 << 10, "{d:?}");
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
