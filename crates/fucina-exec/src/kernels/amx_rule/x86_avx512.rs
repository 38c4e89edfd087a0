//! The AVX-512 emulation of the rule: plain `vfmadd231ps` steps on blocks
//! that pass the no-flush check (see the module docs of `amx_rule`).

use super::portable::portable_rows;
use super::{KB, NT, TILE, no_flush_possible};
use std::arch::x86_64::*;

/// Rows per register block.
const MR: usize = 8;

/// Panel `j` for every row: blocks of up to 8 rows that pass the no-flush
/// check run [`streams`] (one panel), the others the portable emulation.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(super) fn panel(
    a: &[f32],
    spans: &[u16],
    b: &super::PackedB,
    j: usize,
    m: usize,
    kb: usize,
    tj: &mut [f32],
) {
    let ka = kb * KB;
    let data = b.data();
    let bt = &data[j * kb * TILE..(j + 1) * kb * TILE];
    let sb = b.spans[j];
    let mut i = 0;
    while i < m {
        let r = MR.min(m - i);
        let fast = (i..i + r).all(|ii| no_flush_possible(spans[ii], sb));
        if !fast {
            portable_rows(a, spans, data, sb, j, kb, i..i + r, ka, tj);
        } else {
            let a = &a[i * ka..(i + r) * ka];
            let o = &mut tj[i * NT..(i + r) * NT];
            streams_m::<1>(r, a, ka, bt, kb, o);
        }
        i += r;
    }
}

/// Calls of at most this many rows take [`few_rows`] (the AMX row
/// threshold `AMX_MIN_ROWS` is one more).
pub(super) const SMALL_ROWS: usize = 8;

/// Panels read at once by [`few_rows`] (concurrent streams of weights).
const SP: usize = 4;

/// Tiles ahead of the tile row being read that [`streams`] prefetches in
/// each panel's stream.
const PF_TILES: usize = 2;

/// All `m <= SMALL_ROWS` rows against panels `j0 ..` (as many as `t`
/// holds, `m` rows of 16 floats each): groups of [`SP`] panels, else of
/// two, whose rows all pass the no-flush check run [`streams`]; a panel
/// in neither runs [`panel`] (which sends the rows that fail the check
/// to the portable emulation).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(super) fn few_rows(
    a: &[f32],
    spans: &[u16],
    b: &super::PackedB,
    m: usize,
    j0: usize,
    t: &mut [f32],
) {
    let kb = b.kblocks;
    let ka = kb * KB;
    let per = m * NT;
    let np = t.len() / per;
    let data = b.data();
    let fast = |j: usize| (0..m).all(|i| no_flush_possible(spans[i], b.spans[j]));
    let mut q = 0;
    while q < np {
        let g = [SP, 2]
            .into_iter()
            .find(|&g| np - q >= g && (q..q + g).all(|d| fast(j0 + d)))
            .unwrap_or(1);
        let tj = &mut t[q * per..(q + g) * per];
        let j = j0 + q;
        let bt = &data[j * kb * TILE..(j + g) * kb * TILE];
        match g {
            SP => streams_m::<SP>(m, a, ka, bt, kb, tj),
            2 => streams_m::<2>(m, a, ka, bt, kb, tj),
            _ => panel(a, spans, b, j, m, kb, tj),
        }
        q += g;
    }
}

/// [`streams`] for `m` rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn streams_m<const P: usize>(
    m: usize,
    a: &[f32],
    ka: usize,
    bt: &[u16],
    kb: usize,
    tj: &mut [f32],
) {
    match m {
        8 => streams::<8, P>(a, ka, bt, kb, tj),
        7 => streams::<7, P>(a, ka, bt, kb, tj),
        6 => streams::<6, P>(a, ka, bt, kb, tj),
        5 => streams::<5, P>(a, ka, bt, kb, tj),
        4 => streams::<4, P>(a, ka, bt, kb, tj),
        3 => streams::<3, P>(a, ka, bt, kb, tj),
        2 => streams::<2, P>(a, ka, bt, kb, tj),
        _ => streams::<1, P>(a, ka, bt, kb, tj),
    }
}

/// `R` rows against `P` consecutive panels (`bt`: their `P · kb` tiles),
/// the panels' tiles read depth block by depth block as `P` concurrent
/// streams, each prefetched [`PF_TILES`] tiles ahead: per panel and depth
/// block an even and an odd accumulator per row from `+0` (plain IEEE
/// fused multiply-adds), then `C = C + (even + odd)`, `C` per row and
/// panel in registers. Outputs `out[(q · R + r) · 16 ..]` for panel `q`,
/// row `r`. The caller has checked that no step can produce a nonzero
/// result below `2^-126`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn streams<const R: usize, const P: usize>(
    a: &[f32],
    ka: usize,
    bt: &[u16],
    kb: usize,
    out: &mut [f32],
) {
    assert!(a.len() >= R * ka && ka >= kb * KB && bt.len() >= P * kb * TILE);
    assert!(out.len() >= P * R * NT);
    let hi = _mm512_set1_epi32(0xffff_0000u32 as i32);
    let mut c = [[_mm512_setzero_ps(); R]; P];
    let ap = a.as_ptr();
    let bp = bt.as_ptr();
    for k in 0..kb {
        // Near the end of the panels the prefetches run on into the same
        // panels of the next group (`P · kb` tiles on), which the next
        // call reads.
        let skip = if (k + PF_TILES) < kb {
            0
        } else {
            (P - 1) * kb * TILE
        };
        for (q, cq) in c.iter_mut().enumerate() {
            let tile = (q * kb + k) * TILE;
            let mut e = [_mm512_setzero_ps(); R];
            let mut o = [_mm512_setzero_ps(); R];
            for p in 0..KB / 2 {
                // A hint only: the address may lie past `bt` (it is
                // never dereferenced).
                let ahead = bp.wrapping_add(tile + p * 32 + PF_TILES * TILE + skip);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                // SAFETY: tile `(q, k)` row `p` (64 bytes) lies inside
                // `bt`, and row `r`'s elements `k·32 + 2p (+1)` inside `a`
                // (asserted).
                unsafe {
                    let raw = _mm512_loadu_si512(bp.add(tile + p * 32).cast());
                    let be = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(raw));
                    let bo = _mm512_castsi512_ps(_mm512_and_si512(raw, hi));
                    for r in 0..R {
                        let x = ap.add(r * ka + k * KB + 2 * p);
                        e[r] = _mm512_fmadd_ps(_mm512_set1_ps(*x), be, e[r]);
                        o[r] = _mm512_fmadd_ps(_mm512_set1_ps(*x.add(1)), bo, o[r]);
                    }
                }
            }
            for r in 0..R {
                cq[r] = _mm512_add_ps(cq[r], _mm512_add_ps(e[r], o[r]));
            }
        }
    }
    for (q, cq) in c.iter().enumerate() {
        for (r, cr) in cq.iter().enumerate() {
            // SAFETY: panel `q` row `r`'s 16 floats lie inside `out`
            // (asserted).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add((q * R + r) * NT), *cr) };
        }
    }
}
