//! The rule on AMX tiles (`TDPBF16PS`), the hardware itself.

use super::{MT, NT, TILE};
use std::arch::asm;

/// Depth blocks per chunk (see `panel_pairs`).
const KC: usize = 8;
/// Bytes of activation tiles per row block (see `panel_pairs`).
const RB_BYTES: usize = 1 << 20;

/// The 64-byte tile configuration (palette 1): `tmm0-7` all 16 rows × 64
/// bytes.
#[repr(C, align(64))]
struct TileCfg {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Panel pairs `pairs` for every row group pair: C tiles `tmm0-3` =
/// (g, j), (g, j+1), (g+1, j), (g+1, j+1), A tiles `tmm4-5`, B tiles
/// `tmm6-7`, one `TDPBF16PS` per tile pair and depth block.
///
/// # Safety
/// AMX must be usable by this process ([`super::amx_on`]).
pub(super) unsafe fn panel_pairs(
    a: &[u16],
    b: &super::PackedB,
    m_pad: usize,
    pairs: std::ops::Range<usize>,
    t: &mut [f32],
) {
    let kb = b.kblocks;
    let groups = m_pad / MT;
    assert!(groups.is_multiple_of(2) && a.len() >= groups * kb * TILE);
    assert!(pairs.end * 2 <= b.panels && t.len() >= pairs.len() * 2 * m_pad * NT);
    assert!((a.as_ptr() as usize).is_multiple_of(64) && (t.as_ptr() as usize).is_multiple_of(64));
    let cfg = tile_config();
    let data = b.data();
    let stride = 64usize;
    let step = kb * TILE * 2; // bytes from tile (g, kb) to (g + 1, kb)
    // SAFETY: the configuration is a valid palette-1 layout; every tile
    // access below reads or writes 16 rows of 64 bytes inside the asserted
    // buffers (A tiles of groups g, g+1; B tiles of panels j, j+1; C rows
    // g·16 .. g·16 + 32 of panels j, j+1 in `t`).
    unsafe {
        asm!("ldtilecfg [{cfg}]", cfg = in(reg) &raw const cfg, options(nostack));
        // Row blocks of `rb` group pairs whose activations (about 1 MiB)
        // stay in L2 while every panel pair of the call runs over them;
        // per panel pair, depth chunks of KC blocks: the pair's weights
        // for the chunk (16 KiB) stay in L1 while the block's group pairs
        // run over them. C goes through `t` between chunks (the pair's C
        // for the block stays in L1/L2) as the f32 it is in the tile:
        // the same bits.
        let rb = (RB_BYTES / (2 * kb * TILE * 2)).max(1);
        let mut g0 = 0;
        while g0 < groups / 2 {
            let g1 = (g0 + rb).min(groups / 2);
            for (pi, tp) in pairs.clone().zip(t.chunks_exact_mut(2 * m_pad * NT)) {
                let mut k0 = 0;
                while k0 < kb {
                    let kn = KC.min(kb - k0);
                    let bj = data.as_ptr().add((2 * pi * kb + k0) * TILE);
                    // The next chunk: the pair's next depth chunk, else
                    // the first of the next pair, else the first pair's
                    // first chunk of the next row block (a hint only: the
                    // prefetches may run past `data`).
                    let nb = if k0 + kn < kb {
                        bj.wrapping_add(kn * TILE)
                    } else if pi + 1 < pairs.end {
                        data.as_ptr().wrapping_add(2 * (pi + 1) * kb * TILE)
                    } else {
                        data.as_ptr().wrapping_add(2 * pairs.start * kb * TILE)
                    };
                    // Lines per panel each group pair prefetches, and
                    // per block (at least one).
                    let per_gp = (KC * 16).div_ceil(g1 - g0);
                    let pl = per_gp.div_ceil(kn).max(1);
                    for gg in g0..g1 {
                        let ag = a.as_ptr().add((2 * gg * kb + k0) * TILE);
                        let c0 = tp.as_mut_ptr().add(2 * gg * MT * NT);
                        let c1 = c0.add(m_pad * NT);
                        let (c2, c3) = (c0.add(MT * NT), c1.add(MT * NT));
                        load_c(k0 == 0, [c0, c1, c2, c3], stride);
                        let q = nb.wrapping_byte_add((gg - g0) * per_gp * 64);
                        block_products(ag, bj, step, q, pl, kn, stride);
                        store_c([c0, c1, c2, c3], stride);
                    }
                    k0 += kn;
                }
            }
            g0 = g1;
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// Palette 1 with tiles 0-7 of 16 rows of 64 bytes (the C, A and B tiles
/// of [`panel_pairs`]).
fn tile_config() -> TileCfg {
    let mut cfg = TileCfg {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    for i in 0..8 {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    cfg
}

/// Starts the four C tiles of a group pair and panel pair: zeroed for the
/// first depth chunk (`first`), else loaded from the f32 rows at `c` (the
/// sums of the chunks before, as the tiles held them).
///
/// # Safety
/// [`panel_pairs`]' configuration is loaded, and each `c[i]` points to 16
/// rows of `stride` bytes that may be read.
#[inline(always)]
unsafe fn load_c(first: bool, c: [*mut f32; 4], stride: usize) {
    let [c0, c1, c2, c3] = c;
    // SAFETY: the caller's contract: a loaded configuration and readable
    // C rows.
    unsafe {
        if first {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        } else {
            asm!(
                "tileloadd tmm0, [{c0} + {s}*1]",
                "tileloadd tmm1, [{c1} + {s}*1]",
                "tileloadd tmm2, [{c2} + {s}*1]",
                "tileloadd tmm3, [{c3} + {s}*1]",
                c0 = in(reg) c0,
                c1 = in(reg) c1,
                c2 = in(reg) c2,
                c3 = in(reg) c3,
                s = in(reg) stride,
                options(nostack)
            );
        }
    }
}

/// One depth chunk of `kn` blocks: A tiles from `ag` (and the next group,
/// `step` bytes on), B tiles from `bj` (and the next panel), the four
/// products per block into `tmm0-3`, with the prefetches of the next
/// block's activations and of `pl` lines from `q` of the next chunk's
/// weights (hints only).
///
/// # Safety
/// [`panel_pairs`]' configuration is loaded; the `kn` blocks of A tiles at
/// `ag` and `ag + step` and of B tiles at `bj` and `bj + step` (16 rows of
/// `stride` bytes each, 1024 bytes apart) may be read; `kn` and `pl` are
/// at least 1.
#[inline(always)]
unsafe fn block_products(
    ag: *const u16,
    bj: *const u16,
    step: usize,
    q: *const u16,
    pl: usize,
    kn: usize,
    stride: usize,
) {
    // SAFETY: the caller's contract: a loaded configuration, readable A
    // and B tiles, non-zero counts (prefetches never fault).
    unsafe {
        // Tile registers are not renamed: a tile load
        // waits for the products that read the register
        // before, so its latency is not hidden. Each
        // block prefetches the next block's activation
        // tiles into L1 (they come from L2), and `pl`
        // lines of the next chunk's weights of both
        // panels into L2 (they come from memory or L3;
        // the chunk's group pairs share that out).
        asm!(
            "2:",
            "prefetcht0 [{pa} + 1024]",
            "prefetcht0 [{pa1} + 1024]",
            "prefetcht0 [{pa} + 1088]",
            "prefetcht0 [{pa1} + 1088]",
            "prefetcht0 [{pa} + 1152]",
            "prefetcht0 [{pa1} + 1152]",
            "prefetcht0 [{pa} + 1216]",
            "prefetcht0 [{pa1} + 1216]",
            "prefetcht0 [{pa} + 1280]",
            "prefetcht0 [{pa1} + 1280]",
            "prefetcht0 [{pa} + 1344]",
            "prefetcht0 [{pa1} + 1344]",
            "prefetcht0 [{pa} + 1408]",
            "prefetcht0 [{pa1} + 1408]",
            "prefetcht0 [{pa} + 1472]",
            "prefetcht0 [{pa1} + 1472]",
            "prefetcht0 [{pa} + 1536]",
            "prefetcht0 [{pa1} + 1536]",
            "prefetcht0 [{pa} + 1600]",
            "prefetcht0 [{pa1} + 1600]",
            "prefetcht0 [{pa} + 1664]",
            "prefetcht0 [{pa1} + 1664]",
            "prefetcht0 [{pa} + 1728]",
            "prefetcht0 [{pa1} + 1728]",
            "prefetcht0 [{pa} + 1792]",
            "prefetcht0 [{pa1} + 1792]",
            "prefetcht0 [{pa} + 1856]",
            "prefetcht0 [{pa1} + 1856]",
            "prefetcht0 [{pa} + 1920]",
            "prefetcht0 [{pa1} + 1920]",
            "prefetcht0 [{pa} + 1984]",
            "prefetcht0 [{pa1} + 1984]",
            "mov {c}, {pl}",
            "3:",
            "prefetcht1 [{q}]",
            "prefetcht1 [{q} + {st}]",
            "add {q}, 64",
            "dec {c}",
            "jnz 3b",
            "tileloadd tmm4, [{pa} + {s}*1]",
            "tileloadd tmm6, [{pb} + {s}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{pb1} + {s}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{pa1} + {s}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {pa}, 1024",
            "add {pb}, 1024",
            "add {pa1}, 1024",
            "add {pb1}, 1024",
            "dec {n}",
            "jnz 2b",
            pa = inout(reg) ag => _,
            pb = inout(reg) bj => _,
            pa1 = inout(reg) ag.byte_add(step) => _,
            pb1 = inout(reg) bj.byte_add(step) => _,
            q = inout(reg) q => _,
            st = in(reg) step,
            pl = in(reg) pl,
            c = out(reg) _,
            n = inout(reg) kn => _,
            s = in(reg) stride,
            options(nostack)
        );
    }
}

/// Stores the four C tiles to the f32 rows at `c`.
///
/// # Safety
/// [`panel_pairs`]' configuration is loaded, and each `c[i]` points to 16
/// rows of `stride` bytes that may be written.
#[inline(always)]
unsafe fn store_c(c: [*mut f32; 4], stride: usize) {
    let [c0, c1, c2, c3] = c;
    // SAFETY: the caller's contract: a loaded configuration and writable
    // C rows.
    unsafe {
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            c0 = in(reg) c0,
            c1 = in(reg) c1,
            c2 = in(reg) c2,
            c3 = in(reg) c3,
            s = in(reg) stride,
            options(nostack)
        );
    }
}
