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
    panel_with(a, &[], spans, b, j, m, kb, tj)
}

/// [`panel`], with the rows also as [`pack_pairs`](super::pack_pairs)
/// dwords in `pairs` (`m · ka / 2` of them), or `pairs` empty: blocks of rows
/// that pass the no-flush check then run [`dot_rows`] (`vdpbf16ps`; the CPU
/// has AVX512_BF16 when `pairs` is not empty) instead of [`streams`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(super) fn panel_with(
    a: &[f32],
    pairs: &[u32],
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
            let o = &mut tj[i * NT..(i + r) * NT];
            if pairs.is_empty() {
                streams_m::<1>(r, &a[i * ka..(i + r) * ka], ka, bt, kb, o);
            } else {
                let ap = &pairs[i * ka / 2..(i + r) * ka / 2];
                // SAFETY: `pairs` is not empty only where the CPU has
                // AVX512_BF16 (the caller's contract).
                unsafe { dot_rows_m(r, ap, ka, bt, kb, o) };
            }
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

/// [`dot_rows`] for `r <= 8` rows.
///
/// # Safety
/// The CPU has AVX-512 F/BW/DQ/VL and AVX512_BF16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")]
unsafe fn dot_rows_m(r: usize, ap: &[u32], ka: usize, bt: &[u16], kb: usize, tj: &mut [f32]) {
    match r {
        8 => dot_rows::<8>(ap, ka, bt, kb, tj),
        7 => dot_rows::<7>(ap, ka, bt, kb, tj),
        6 => dot_rows::<6>(ap, ka, bt, kb, tj),
        5 => dot_rows::<5>(ap, ka, bt, kb, tj),
        4 => dot_rows::<4>(ap, ka, bt, kb, tj),
        3 => dot_rows::<3>(ap, ka, bt, kb, tj),
        2 => dot_rows::<2>(ap, ka, bt, kb, tj),
        _ => dot_rows::<1>(ap, ka, bt, kb, tj),
    }
}

/// `R` rows against one panel (`bt`: its `kb` tiles) with `vdpbf16ps`,
/// which computes, per f32 lane, `acc + x₁ · y₁` and then `+ x₀ · y₀`, each
/// step one fused multiply-add (rounded once) with bf16 inputs: two
/// consecutive steps of one accumulator chain of the rule when a dword holds
/// two elements of the same parity. So per depth block and quad `q` of
/// pairs, the even chain takes a dword `(hi a[4q], lo a[4q + 2])` (from
/// [`pack_pairs`](super::pack_pairs)) against the weight dword
/// `(hi b[4q], lo b[4q + 2])` built in registers from the tile's lines `2q`
/// and `2q + 1` (a shift and a word blend), the odd chain the same with
/// `4q + 1`, `4q + 3`; then `C = C + (even + odd)` as in [`streams`]. The
/// steps, their order and their operands are the rule's, so are the bits
/// where the caller has checked that no step can produce a nonzero result
/// below `2^-126` (the instruction's input DAZ and output FTZ then change
/// nothing: the packed values are already DAZ).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")]
fn dot_rows<const R: usize>(ap: &[u32], ka: usize, bt: &[u16], kb: usize, out: &mut [f32]) {
    let kp = ka / 2;
    assert!(ap.len() >= R * kp && ka >= kb * KB && bt.len() >= kb * TILE);
    assert!(out.len() >= R * NT);
    let mut c = [_mm512_setzero_ps(); R];
    let app = ap.as_ptr();
    let bp = bt.as_ptr();
    // Word blends: the even words (low halves) from the second operand.
    const LO: __mmask32 = 0x5555_5555;
    for k in 0..kb {
        let tile = k * TILE;
        let mut e = [_mm512_setzero_ps(); R];
        let mut o = [_mm512_setzero_ps(); R];
        for q in 0..KB / 4 {
            // A hint only: the address may lie past `bt` (it is never
            // dereferenced).
            let ahead = bp.wrapping_add(tile + q * 64 + PF_TILES * TILE);
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(32).cast());
            // SAFETY: tile `k` lines `2q`, `2q + 1` (128 bytes) lie inside
            // `bt`, and row `r`'s dwords `k·16 + 2q (+1)` inside `ap`
            // (asserted).
            unsafe {
                let l0 = _mm512_loadu_si512(bp.add(tile + q * 64).cast());
                let l1 = _mm512_loadu_si512(bp.add(tile + q * 64 + 32).cast());
                // (hi b[4q], lo b[4q + 2]) and (hi b[4q + 1], lo b[4q + 3]).
                let be = _mm512_mask_blend_epi16(LO, _mm512_slli_epi32::<16>(l0), l1);
                let bo = _mm512_mask_blend_epi16(LO, l0, _mm512_srli_epi32::<16>(l1));
                let be: __m512bh = std::mem::transmute::<__m512i, __m512bh>(be);
                let bo: __m512bh = std::mem::transmute::<__m512i, __m512bh>(bo);
                for r in 0..R {
                    let x = app.add(r * kp + k * (KB / 2) + 2 * q);
                    let xe: __m512bh =
                        std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*x as i32));
                    let xo: __m512bh = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        *x.add(1) as i32,
                    ));
                    e[r] = _mm512_dpbf16_ps(e[r], xe, be);
                    o[r] = _mm512_dpbf16_ps(o[r], xo, bo);
                }
            }
        }
        for r in 0..R {
            c[r] = _mm512_add_ps(c[r], _mm512_add_ps(e[r], o[r]));
        }
    }
    for (r, cr) in c.iter().enumerate() {
        // SAFETY: row `r`'s 16 floats lie inside `out` (asserted).
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(r * NT), *cr) };
    }
}

/// Whether this CPU's `vdpbf16ps` computes what [`dot_rows`] relies on:
/// per lane `acc + x₁ · y₁`, rounded, then `+ x₀ · y₀`, rounded (the order
/// and the two roundings of Intel's definition of the instruction). Asked
/// once per process, on cases where another order or a single rounding
/// gives other bits; where it does not hold, calls keep the
/// `vfmadd231ps` kernel.
pub(super) fn dot_matches_rule() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let has = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16");
        // SAFETY: the probe runs only where the CPU has the features it uses.
        has && unsafe { dot_probe() }
    })
}

/// The cases of [`dot_matches_rule`]: `acc = 1` against product pairs
/// `(2^-24, 2^-24)` (two roundings give `1`, one rounding `1 + 2^-23`),
/// `(2^-24, 1.5 · 2^-24)` and `(1.5 · 2^-24, 2^-24)` (the order shows:
/// `1 + 2^-23` one way, `1 + 2^-22` the other), and lanes of ordinary
/// values against two plain fused multiply-adds.
///
/// # Safety
/// The CPU has AVX-512 F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_probe() -> bool {
    // bf16 bits: 2^-12, 1.5 · 2^-12.
    const T: u16 = 0x3980;
    const T15: u16 = 0x39c0;
    let mut x = [0u32; 16];
    let mut y = [0u32; 16];
    let mut acc = [1.0f32; 16];
    // (slot 1, slot 0) products as (x₁ · y₁, x₀ · y₀).
    let pairs = [(T, T), (T, T15), (T15, T)];
    for (l, &(a1, a0)) in pairs.iter().enumerate() {
        x[l] = (u32::from(a1) << 16) | u32::from(a0);
        y[l] = (u32::from(T) << 16) | u32::from(T);
    }
    // Ordinary values with cancelling signs in the other lanes.
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut h = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let e = 110 + (s >> 40) % 30;
        ((s & 0x8000) | (e << 7) | ((s >> 20) & 0x7f)) as u16
    };
    let lanes = x.iter_mut().zip(y.iter_mut()).zip(acc.iter_mut());
    for ((xl, yl), al) in lanes.skip(pairs.len()) {
        *xl = (u32::from(h()) << 16) | u32::from(h());
        *yl = (u32::from(h()) << 16) | u32::from(h());
        *al = super::bf(h()) * 3.0;
    }
    let bf = |w: u32, hi: bool| super::bf(if hi { (w >> 16) as u16 } else { w as u16 });
    // SAFETY: the caller guarantees the features; the arrays hold 16 lanes.
    let got = unsafe {
        let xv: __m512bh =
            std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(x.as_ptr().cast()));
        let yv: __m512bh =
            std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(y.as_ptr().cast()));
        let r = _mm512_dpbf16_ps(_mm512_loadu_ps(acc.as_ptr()), xv, yv);
        let mut o = [0.0f32; 16];
        _mm512_storeu_ps(o.as_mut_ptr(), r);
        o
    };
    (0..16).all(|l| {
        let want = bf(x[l], false).mul_add(
            bf(y[l], false),
            bf(x[l], true).mul_add(bf(y[l], true), acc[l]),
        );
        got[l].to_bits() == want.to_bits()
    })
}
