//! bf16 products with the AMX summation rule: the kernels (AMX tiles, an
//! AVX-512 emulation and a portable emulation, the same bits) and the packed
//! layouts they read.
//!
//! # The rule
//!
//! `out[i, j] = Σ_k a[i, k] · b[j, k]`, where `a` is an f32 activation rounded
//! to bf16 and `b` a bf16 weight, is computed as Intel's `TDPBF16PS`
//! instruction computes it when a tile product walks the depth in blocks of 32:
//!
//! 1. **Inputs.** Each activation is rounded from f32 to bf16 to nearest, ties
//!    to even (a NaN stays a NaN: its upper half with the quiet bit set; a
//!    value past the largest bf16 becomes an infinity). A bf16 input whose
//!    exponent field is zero (a zero or a subnormal) counts as a zero of its
//!    sign ("denormals are zero").
//! 2. **Blocks.** The depth `K` is cut into consecutive blocks of 32 from
//!    `k = 0`; the last block may be shorter.
//! 3. **Two accumulators per block.** For each block an *even* accumulator
//!    and an *odd* one start at `+0`; pair by pair, in increasing `k`, the even
//!    one takes `a[2p] · b[2p]` and the odd one `a[2p + 1] · b[2p + 1]` (block
//!    positions), each step `acc + x · y` computed exactly and rounded once to
//!    f32 (a fused multiply-add; the bf16 product itself is never rounded).
//! 4. **Flush.** Every step's result is rounded to 24 significant bits to
//!    nearest-even *as if the exponent had no lower limit*; if that is below
//!    `2^-126` in magnitude the result is a zero of the exact result's sign.
//!    (So `2^-126 - 2^-150` flushes to zero although IEEE rounding would give
//!    `2^-126`, while `2^-126 - 2^-152` gives `2^-126`.) The adds of step 5
//!    flush the same way (their tiny results are exact, so they simply become
//!    signed zeros).
//! 5. **Combine.** `C = C + (even + odd)`, two rounded adds, `C` starting at
//!    `+0` and carried from block to block as an f32.
//! 6. **NaN.** A step whose inputs hold a NaN returns the first NaN in the
//!    order `x` (activation), `y` (weight), accumulator, made quiet; an add
//!    returns its first NaN operand (`C`, then the even sum), made quiet; an
//!    invalid operation (`∞ · 0`, `∞ - ∞`) gives the NaN `0xFFC00000`.
//!
//! A short last block behaves as if padded with products that change nothing:
//! the AMX path pads the activation with `+0` and the weight with `-0`, whose
//! product `-0` leaves every accumulator as it is (`+0` times `+0` would turn
//! a `-0` accumulator into `+0`). Each output is computed whole by one thread
//! from its own row and column, so a row's result never depends on the other
//! rows, the thread count or the path.
//!
//! # The paths
//!
//! * **AMX** (`amx_tile` + `amx_bf16`, Linux, at the AVX-512 level, unless
//!   `FUCINA_AMX=off` or [`force_amx`](crate::force_amx) turned it off): the
//!   hardware rule itself. Activations are packed to 64-byte aligned 16×32 bf16
//!   tiles, weights to 16 pairs × 16 columns tiles ([`PackedB`]); a 2×2 block of
//!   16×16 C tiles stays in `tmm0-3` over a depth chunk. Tile registers are
//!   not renamed, so a tile load's latency is not hidden by the products
//!   before it: the driver prefetches the next block's activation tiles into
//!   L1 and the next chunk's weights into L2. Calls of fewer than
//!   `AMX_MIN_ROWS` (6) rows take the AVX-512 emulation instead: its
//!   multi-panel kernel reads weights from memory at about the streaming
//!   bandwidth, the tiles (rows padded to 32) at about 0.75 of it.
//! * **AVX-512 emulation**: plain `vfmadd231ps` steps, even and odd
//!   accumulators per row, widened from the same packed weights. The float
//!   environment is never changed. Instead each (row, 16-column panel) is
//!   checked first: if both hold only finite values and the smallest nonzero
//!   exponents `ea`, `eb` (bf16 exponent fields) satisfy `ea + eb >= 142`, every
//!   product is a multiple of `2^(ea + eb - 268) >= 2^-126`, so are all partial
//!   sums, and no step result can be nonzero and below `2^-126`: IEEE
//!   arithmetic with gradual underflow then gives exactly the rule's bits
//!   (and the only NaN possible, `∞ - ∞` in an add, is `0xFFC00000` on x86).
//!   Real weights and activations always pass; a block of rows that does not
//!   goes through the portable emulation. Calls of up to 8 rows read four
//!   (or two) panels at once, depth block by depth block, as concurrent
//!   prefetched streams (one stream per panel runs at about 0.75 of the
//!   memory bandwidth on the development machine, four at about all of it).
//!   Where the CPU has AVX512_BF16 (and its `vdpbf16ps` passes a check of
//!   its order and roundings once per process), calls of more rows run
//!   `x86_avx512::dot_rows` on the rows that pass the check: `vdpbf16ps`
//!   computes per lane `acc + x₁ · y₁` then `+ x₀ · y₀`, each rounded once,
//!   so a dword of two even positions (`4q` high, `4q + 2` low: activations
//!   packed so by [`pack_pairs`], weights rearranged in registers from the
//!   tile's lines) is two consecutive steps of the even accumulator, in the
//!   rule's order; the same for the odd one. Twice the products per
//!   instruction of the fused multiply-adds, the same bits.
//! * **Portable emulation** (every level, vectorized by `vectorized!` at
//!   AVX2/AVX-512): each step in f64, `s = acc + x · y` (the product is exact,
//!   the sum rounds once to 53 bits, and double rounding to 24 bits is harmless
//!   for a sum of two 24-bit numbers since `53 >= 2 · 24 + 2`); `|s| < 2^-126 -
//!   2^-151` (the smallest value whose unbounded 24-bit rounding is `2^-126`)
//!   gives a signed zero, else `s` rounded to f32. Rows and panels that pass
//!   the AVX-512 emulation's no-flush check use plain `f32::mul_add` instead
//!   at levels where it is an instruction (AVX2). Panels or rows holding
//!   infinities or NaNs take a scalar form with the NaN rules spelled out.
//!   (Under the no-flush check every bf16 product is exact in f32, so even an
//!   unfused multiply and add would give the same bits.)
//!
//! The rule and both emulations were checked bit for bit against the hardware
//! on this project's development machine (millions of random and exhaustive
//! boundary cases, NaN payloads included); `tests/bf16_amx_rule.rs` compares
//! the paths with each other and with an independent scalar model.
//!
//! # Layout
//!
//! As every kernel family: this file holds the rule, the layouts and the
//! dispatch; `portable.rs` the emulation every CPU runs, `x86_avx512.rs` and
//! `x86_amx.rs` the instruction-set kernels, compiled only for x86-64.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Depth of one block (one `TDPBF16PS` instruction).
pub(crate) const KB: usize = 32;
/// Columns of a weight panel (one tile's width in f32 outputs).
pub(crate) const NT: usize = 16;
/// Rows of an activation tile.
pub(crate) const MT: usize = 16;
/// bf16 elements in one 1 KiB tile (16 rows of 64 bytes).
pub(crate) const TILE: usize = 512;
/// The NaN an invalid operation gives on x86.
const DEFAULT_NAN: u32 = 0xFFC0_0000;
/// `2^-126 - 2^-151`: below it (in magnitude) a step result flushes to zero.
const LIM: f64 = 1.175_494_350_822_287_5e-38 - 3.503_246_160_812_043e-46;
/// The smallest sum of the two smallest nonzero exponent fields for which the
/// AVX-512 emulation needs no flush (see the module docs).
const FAST_EXP_SUM: u16 = 142;
/// Bit of a span summary set when the values include an infinity or NaN.
const SPAN_NONFINITE: u16 = 0x8000;

/// 64 bytes, 64-byte aligned: the unit of packed storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u16; 32]);

// ---------------------------------------------------------------- conversions

/// A bf16 whose exponent field is zero becomes a zero of its sign (DAZ).
#[inline(always)]
pub(crate) fn daz16(h: u16) -> u16 {
    if h & 0x7f80 == 0 { h & 0x8000 } else { h }
}

/// f32 to bf16, nearest-even; a NaN keeps its upper half with the quiet bit
/// set; then DAZ.
#[inline(always)]
pub(crate) fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let nan = ((b >> 16) | 0x40) as u16;
    daz16(if x.is_nan() { nan } else { rounded })
}

/// bf16 bits to f32 (exact).
#[inline(always)]
pub(crate) fn bf(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Folds `h` (already DAZ) into a span summary: the smallest nonzero exponent
/// field in bits 0-8 (255 when none), [`SPAN_NONFINITE`] if non-finite.
#[inline(always)]
pub(crate) fn span_add(s: u16, h: u16) -> u16 {
    let e = (h >> 7) & 0xff;
    if e == 0xff {
        s | SPAN_NONFINITE
    } else if e != 0 && e < (s & 0x1ff) {
        (s & SPAN_NONFINITE) | e
    } else {
        s
    }
}

/// The summary of no values.
pub(crate) const SPAN_EMPTY: u16 = 0xff;

/// Whether a row with summary `sa` and a panel with `sb` are both finite.
#[inline(always)]
fn finite(sa: u16, sb: u16) -> bool {
    (sa | sb) & SPAN_NONFINITE == 0
}

/// Whether the plain IEEE kernel gives the rule's bits for this row and panel.
#[inline(always)]
fn no_flush_possible(sa: u16, sb: u16) -> bool {
    finite(sa, sb) && (sa & 0x1ff) + (sb & 0x1ff) >= FAST_EXP_SUM
}

// ---------------------------------------------------------------- packed weights

/// Weights `[n, k]` (bf16 rows) in the AMX layout: for each panel of 16 output
/// columns and each depth block of 32, one 1 KiB tile whose row `p` holds the
/// 16 columns' pairs `(b[2p], b[2p + 1])` side by side. The depth is padded
/// with `-0`, the columns past `n` (and a last panel added to make the count
/// even) hold `-0` too. Tile `(j, kb)` is at `j * kblocks + kb`.
#[derive(Clone)]
pub(crate) struct PackedB {
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kblocks: usize,
    /// Panels, an even number.
    pub(crate) panels: usize,
    /// `panels * kblocks` tiles of 16 lines each.
    pub(crate) lines: Vec<Line>,
    /// One span summary per panel.
    pub(crate) spans: Vec<u16>,
}

impl PackedB {
    /// The tiles as bf16 elements.
    pub(crate) fn data(&self) -> &[u16] {
        // SAFETY: a Line is 32 u16 with no padding (repr(C)), so the memory of
        // `lines` is `32 · len` initialized u16, borrowed as long as `self`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.lines.len() * 32) }
    }
}

/// Where [`pack_b`] puts weight `(col, kk)` (output column `col`, depth
/// `kk`) in the packed bf16 elements of a matrix of `kblocks` depth blocks:
/// tile `(col / 16, kk / 32)`, the line of the depth pair, the column's pair.
#[inline(always)]
pub(crate) fn b_index(kblocks: usize, col: usize, kk: usize) -> usize {
    let (j, c) = (col / NT, col % NT);
    let (kb, r) = (kk / KB, kk % KB);
    (j * kblocks + kb) * TILE + (r / 2) * 32 + 2 * c + (r % 2)
}

/// The number of lines [`pack_b`] needs for `[n, k]`, or `None` on overflow.
pub(crate) fn packed_b_lines(n: usize, k: usize) -> Option<usize> {
    let panels = n.div_ceil(NT).next_multiple_of(2);
    panels.checked_mul(k.div_ceil(KB))?.checked_mul(16)
}

/// Packs `w` (`n` rows of `k` little-endian bf16) into `lines` (zeroed, of
/// [`packed_b_lines`] lines) and returns the panel summaries.
pub(crate) fn pack_b(w: &[u8], n: usize, k: usize, lines: &mut [Line], spans: &mut Vec<u16>) {
    let kblocks = k.div_ceil(KB);
    let panels = n.div_ceil(NT).next_multiple_of(2);
    assert_eq!(w.len(), 2 * n * k, "pack_b: weight bytes");
    assert_eq!(lines.len(), panels * kblocks * 16, "pack_b: packed lines");
    // SAFETY: as in `PackedB::data`, mutably (the borrow is exclusive; any
    // u16 pattern is a valid Line).
    let data: &mut [u16] =
        unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), lines.len() * 32) };
    data.fill(0x8000);
    spans.clear();
    for j in 0..panels {
        let mut span = SPAN_EMPTY;
        for c in 0..NT {
            let col = j * NT + c;
            if col >= n {
                continue;
            }
            let row = &w[2 * col * k..2 * (col + 1) * k];
            for (kk, b) in row.chunks_exact(2).enumerate() {
                let h = daz16(u16::from_le_bytes([b[0], b[1]]));
                span = span_add(span, h);
                data[b_index(kblocks, col, kk)] = h;
            }
        }
        spans.push(span);
    }
}

// ---------------------------------------------------------------- activations

/// Rows of `x` (`[m, k]` f32) rounded to bf16 into AMX tiles: tile
/// `(g, kb)` (16 rows × 32) at `((g - g0) * kblocks + kb) * TILE` of `out`,
/// for the row groups `g0 ..` that `out` holds. Padding is `+0`.
#[inline(always)]
pub(crate) fn pack_a_tiles(x: &[f32], k: usize, kblocks: usize, g0: usize, out: &mut [u16]) {
    let m = x.len() / k.max(1);
    for (gi, tiles) in out.chunks_exact_mut(kblocks * TILE).enumerate() {
        for r in 0..MT {
            let i = (g0 + gi) * MT + r;
            if i >= m {
                for kb in 0..kblocks {
                    tiles[kb * TILE + r * KB..kb * TILE + (r + 1) * KB].fill(0);
                }
                continue;
            }
            let row = &x[i * k..(i + 1) * k];
            let mut chunks = row.chunks_exact(KB);
            for (kb, c) in chunks.by_ref().enumerate() {
                let o = &mut tiles[kb * TILE + r * KB..kb * TILE + (r + 1) * KB];
                for (o, &v) in o.iter_mut().zip(c) {
                    *o = to_bf16(v);
                }
            }
            let rest = chunks.remainder();
            if !rest.is_empty() {
                let kb = k / KB;
                let o = &mut tiles[kb * TILE + r * KB..kb * TILE + (r + 1) * KB];
                for (q, o) in o.iter_mut().enumerate() {
                    *o = rest.get(q).map_or(0, |&v| to_bf16(v));
                }
            }
        }
    }
}

/// Rows of `x` (`[m, k]`) rounded to bf16 and widened back to f32 (DAZ
/// applied) into `out` (`m` rows of `ka = kblocks · 32`, padded with `+0`),
/// with each row's span summary in `spans`.
#[inline(always)]
pub(crate) fn widen_a(x: &[f32], k: usize, ka: usize, out: &mut [f32], spans: &mut [u16]) {
    for ((row, o), s) in x
        .chunks_exact(k.max(1))
        .zip(out.chunks_exact_mut(ka))
        .zip(spans.iter_mut())
    {
        let mut span = SPAN_EMPTY;
        for (o, &v) in o.iter_mut().zip(row) {
            let h = to_bf16(v);
            span = span_add(span, h);
            *o = bf(h);
        }
        o[row.len()..].fill(0.0);
        *s = span;
    }
}

/// Whether a call of `m` rows on `path` runs the `vdpbf16ps` kernel (and so
/// wants its activations as [`pack_pairs`] dwords too): the AVX-512
/// emulation for calls of more than its few-rows size, where the level
/// enables AVX512_BF16 and the instruction passed the check of its order
/// and roundings (`x86_avx512::dot_matches_rule`).
pub(crate) fn wants_pairs(path: Path, m: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use super::simd::CpuFeatures as F;
        path == Path::Avx512
            && m > x86_avx512::SMALL_ROWS
            && F::enabled().has(F::LEVEL_AVX512.with(F::AVX512BF16))
            && x86_avx512::dot_matches_rule()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (path, m);
        false
    }
}

/// Widened rows (`a`: whole rows of `kblocks · 32` floats, each an exact
/// bf16 value, as [`widen_a`] writes them) as the dwords of the `vdpbf16ps`
/// kernel: for each quad of elements `4q .. 4q + 4` of a row,
/// `(hi a[4q], lo a[4q + 2])` (two steps of the even chain) then
/// `(hi a[4q + 1], lo a[4q + 3])` (two of the odd chain); `out` holds
/// `a.len() / 2` dwords.
pub(crate) fn pack_pairs(a: &[f32], out: &mut [u32]) {
    assert_eq!(out.len() * 2, a.len(), "pack_pairs: lengths");
    for (o, q) in out.chunks_exact_mut(2).zip(a.chunks_exact(4)) {
        let h = |i: usize| q[i].to_bits() >> 16;
        o[0] = (h(0) << 16) | h(2);
        o[1] = (h(1) << 16) | h(3);
    }
}

// ---------------------------------------------------------------- the scalar rule

#[inline(always)]
fn quiet(x: f32) -> f32 {
    f32::from_bits(x.to_bits() | 0x0040_0000)
}

#[inline(always)]
fn signed_zero(negative: bool) -> f32 {
    if negative { -0.0 } else { 0.0 }
}

/// One step `acc + x · y` of the rule with the NaN rules spelled out.
#[inline(always)]
pub(crate) fn step(acc: f32, x: f32, y: f32) -> f32 {
    if x.is_nan() {
        return quiet(x);
    }
    if y.is_nan() {
        return quiet(y);
    }
    if acc.is_nan() {
        return quiet(acc);
    }
    let s = f64::from(acc) + f64::from(x) * f64::from(y);
    if s.is_nan() {
        return f32::from_bits(DEFAULT_NAN);
    }
    if s.abs() < LIM {
        return signed_zero(s.is_sign_negative());
    }
    s as f32
}

/// One add of the rule (`x` wins a NaN tie) with the NaN rules spelled out.
#[inline(always)]
pub(crate) fn add(x: f32, y: f32) -> f32 {
    if x.is_nan() {
        return quiet(x);
    }
    if y.is_nan() {
        return quiet(y);
    }
    let r = x + y;
    if r.is_nan() {
        return f32::from_bits(DEFAULT_NAN);
    }
    if r.is_subnormal() {
        return signed_zero(r.is_sign_negative());
    }
    r
}

/// [`step`] for finite inputs: branch-free, so that it vectorizes (an
/// accumulator may have overflowed to an infinity, but `∞ + finite` is no NaN).
#[inline(always)]
fn step_finite(acc: f32, x: f32, y: f32) -> f32 {
    let s = f64::from(acc) + f64::from(x) * f64::from(y);
    let r = s as f32;
    let z = f32::from_bits(r.to_bits() & 0x8000_0000);
    if s.abs() < LIM { z } else { r }
}

/// [`add`] for operands without NaN (the sum may be `∞ - ∞`).
#[inline(always)]
fn add_finite(x: f32, y: f32) -> f32 {
    let r = x + y;
    let z = f32::from_bits(r.to_bits() & 0x8000_0000);
    let r = if r.is_subnormal() { z } else { r };
    if r.is_nan() {
        f32::from_bits(DEFAULT_NAN)
    } else {
        r
    }
}

// ---------------------------------------------------------------- the drivers

/// Which implementation an op call uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// AMX tiles.
    Amx,
    /// The AVX-512 emulation.
    Avx512,
    /// The portable emulation (vectorized at the current level).
    Portable,
}

/// The path of an op call of [`amx_min_rows`] rows or more starting now.
pub(crate) fn path() -> Path {
    use super::simd::{CpuFeatures, choose};
    match choose(&[(Path::Avx512, CpuFeatures::LEVEL_AVX512)], Path::Portable) {
        Path::Avx512 if amx_on() => Path::Amx,
        p => p,
    }
}

/// Calls of fewer rows than this take the AVX-512 emulation even where AMX
/// is on: at a few rows its multi-panel kernel reads weights that come from
/// memory at about the streaming bandwidth, while the AMX path (rows padded
/// to 32, tile loads whose latency a tile register cannot hide) reads them
/// at about 0.75 of it (docs/BENCHMARKS.md, "decode-sized calls"). From 6
/// rows on the tiles win a whole model's decode step on the smaller
/// matrices (SmolLM2 at batch 8: 10–14 % faster on the tiles; TinyLlama
/// 2–3 % slower), hence 6.
pub(crate) const AMX_MIN_ROWS: usize = 6;
static AMX_MIN_ROWS_NOW: AtomicUsize = AtomicUsize::new(AMX_MIN_ROWS);

/// The row threshold below which AMX calls take the AVX-512 emulation.
pub(crate) fn amx_min_rows() -> usize {
    AMX_MIN_ROWS_NOW.load(Ordering::Relaxed)
}

/// Sets [`amx_min_rows`] for later calls; returns the previous value.
pub(crate) fn set_amx_min_rows(rows: usize) -> usize {
    AMX_MIN_ROWS_NOW.swap(rows, Ordering::Relaxed)
}

/// The path of an op call of `m` rows starting now: [`path`], except that
/// calls of fewer than [`amx_min_rows`] rows take the AVX-512 emulation
/// instead of the AMX tiles (the same bits).
pub(crate) fn path_for(m: usize) -> Path {
    match path() {
        Path::Amx if m < amx_min_rows() => Path::Avx512,
        p => p,
    }
}

/// The activations of one call, in the form its path reads.
pub(crate) enum Acts<'a> {
    /// AMX tiles, `groups` (even) row groups × `kblocks`.
    Tiles(&'a [u16]),
    /// Widened rows of `kblocks · 32` floats and their span summaries, and
    /// (where [`wants_pairs`] says so, else empty) the same rows as
    /// [`pack_pairs`] dwords.
    Rows {
        a: &'a [f32],
        spans: &'a [u16],
        pairs: &'a [u32],
    },
}

/// Computes panels `2 · pairs.start ..` of the output into `t` (per panel,
/// `m_pad` rows of 16 floats; `t` holds the panel pairs of `pairs`).
pub(crate) fn panel_pairs(
    path: Path,
    acts: &Acts<'_>,
    b: &PackedB,
    m: usize,
    m_pad: usize,
    pairs: std::ops::Range<usize>,
    t: &mut [f32],
) {
    let kb = b.kblocks;
    debug_assert_eq!(t.len(), pairs.len() * 2 * m_pad * NT);
    match (path, acts) {
        #[cfg(target_arch = "x86_64")]
        (Path::Amx, Acts::Tiles(a)) => {
            // SAFETY: `path` is Amx only when the CPU and the OS let this
            // process use AMX tiles (`amx_on`); the buffers hold the tiles the
            // kernel reads (`m_pad / 16` groups of `a`, the pairs' panels of
            // `b`) and `t` the floats it writes, as the asserts check.
            unsafe { x86_amx::panel_pairs(a, b, m_pad, pairs, t) }
        }
        #[cfg(target_arch = "x86_64")]
        (Path::Avx512, Acts::Rows { a, spans, .. }) if m <= x86_avx512::SMALL_ROWS => {
            // SAFETY: `path` is Avx512 only when `level()` is, which means the
            // CPU has AVX-512 F/BW/DQ/VL.
            unsafe { x86_avx512::few_rows(a, spans, b, m, 2 * pairs.start, t) }
        }
        #[cfg(target_arch = "x86_64")]
        (
            Path::Avx512,
            Acts::Rows {
                a,
                spans,
                pairs: ap,
            },
        ) => {
            for (pi, tp) in pairs.zip(t.chunks_exact_mut(2 * m_pad * NT)) {
                for (h, tj) in tp.chunks_exact_mut(m_pad * NT).enumerate() {
                    let j = 2 * pi + h;
                    // SAFETY: `path` is Avx512 only when `level()` is, which
                    // means the CPU has AVX-512 F/BW/DQ/VL; `ap` is not empty
                    // only where `wants_pairs` found AVX512_BF16 enabled.
                    unsafe { x86_avx512::panel_with(a, ap, spans, b, j, m, kb, tj) }
                }
            }
        }
        (_, Acts::Rows { a, spans, .. }) => {
            super::simd::vectorized!(portable_panels(a, spans, b, m, m_pad, pairs.clone(), t))
        }
        _ => unreachable!("amx_rule: the activations do not match the path"),
    }
}

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86_amx;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

use portable::portable_panels;

// ---------------------------------------------------------------- AMX availability

/// `FUCINA_AMX` not read yet / AMX off / AMX on (when available).
const AMX_UNSET: u8 = 0;
const AMX_OFF: u8 = 1;
const AMX_ON: u8 = 2;
static AMX_MODE: AtomicU8 = AtomicU8::new(AMX_UNSET);

/// Whether the CPU has `amx_tile` and `amx_bf16` and the kernel let this
/// process use the tile data (asked once per process, with
/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`).
pub(crate) fn amx_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(detect_amx)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect_amx() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // Leaf 7 exists when leaf 0 says so; EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
    let max = __cpuid_count(0, 0).eax;
    if max < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments; it only changes
    // which state components this process may use.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    r == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect_amx() -> bool {
    false
}

/// Whether the AVX-512 level uses AMX now.
pub(crate) fn amx_on() -> bool {
    let mode = match AMX_MODE.load(Ordering::Relaxed) {
        AMX_UNSET => {
            let off = std::env::var("FUCINA_AMX").is_ok_and(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "off" | "0" | "false" | "no"
                )
            });
            let mode = if off { AMX_OFF } else { AMX_ON };
            let _ =
                AMX_MODE.compare_exchange(AMX_UNSET, mode, Ordering::Relaxed, Ordering::Relaxed);
            AMX_MODE.load(Ordering::Relaxed)
        }
        v => v,
    };
    mode == AMX_ON && amx_available()
}

/// Turns the AMX path on or off for later calls; `false` (and no change) when
/// asked to turn it on where it is not available.
pub(crate) fn force_amx(on: bool) -> bool {
    if on && !amx_available() {
        return false;
    }
    AMX_MODE.store(if on { AMX_ON } else { AMX_OFF }, Ordering::Relaxed);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lim_is_the_flush_threshold() {
        assert_eq!(LIM, f64::from(f32::MIN_POSITIVE) - 2f64.powi(-151));
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is a tie: to even (1.0); 1 + 3·2^-8 rounds up.
        assert_eq!(to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(to_bf16(f32::MAX), 0x7f80);
        assert_eq!(to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(to_bf16(-1e-40), 0x8000); // subnormal: DAZ
    }

    #[test]
    fn step_flushes_after_rounding() {
        let t = f32::MIN_POSITIVE;
        // x·y = 2^-126 - 2^-150 exactly: flushed (IEEE would give 2^-126).
        let (x, y) = (bf(0x3f80), 0.0);
        assert_eq!(step(t, x, y), t);
        let a = 2f32.powi(-63);
        let b = -(2f32.powi(-87)); // a·b = -2^-150
        assert_eq!(step(t, a, b).to_bits(), 0);
        assert_eq!(step(t, a, -(2f32.powi(-89))), t); // t - 2^-152 -> 2^-126
    }

    /// The `vdpbf16ps` kernel against the `vfmadd231ps` one (and both
    /// against the portable emulation), panel by panel, on values with wide
    /// exponents, cancelling signs, a short last depth block and rows that
    /// fail the no-flush check: the same bits. (`tests/bf16_amx_rule.rs`
    /// checks the op's paths against an independent oracle; on a CPU with
    /// AVX512_BF16 its AVX-512 path runs the `vdpbf16ps` kernel for calls of
    /// more than 8 rows, so this test is what keeps the other one tested.)
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_two_avx512_kernels_agree() {
        use crate::kernels::simd::CpuFeatures as F;
        if !F::detected().has(F::LEVEL_AVX512.with(F::AVX512BF16)) {
            return;
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for &(m, n, k) in &[(19usize, 40usize, 100usize), (9, 16, 64), (27, 33, 301)] {
            let mut val = |tiny: bool| {
                let r = next();
                let e = if tiny { 1 + r % 40 } else { 100 + r % 50 } as u32;
                f32::from_bits(((r >> 8) as u32 & 0x8000_0000) | (e << 23) | (r as u32 & 0x7f_0000))
            };
            // Row 3 holds tiny values: it fails the check (portable path).
            let x: Vec<f32> = (0..m * k).map(|i| val(i / k == 3 && i % 7 == 0)).collect();
            let w: Vec<u8> = (0..n * k)
                .flat_map(|_| ((val(false).to_bits() >> 16) as u16).to_le_bytes())
                .collect();
            let kblocks = k.div_ceil(KB);
            let ka = kblocks * KB;
            let mut lines = vec![Line([0; 32]); packed_b_lines(n, k).unwrap()];
            let mut bspans = Vec::new();
            pack_b(&w, n, k, &mut lines, &mut bspans);
            let b = PackedB {
                n,
                k,
                kblocks,
                panels: n.div_ceil(NT).next_multiple_of(2),
                lines,
                spans: bspans,
            };
            let mut a = vec![0.0f32; m * ka];
            let mut spans = vec![0u16; m];
            widen_a(&x, k, ka, &mut a, &mut spans);
            let mut pairs = vec![0u32; m * ka / 2];
            pack_pairs(&a, &mut pairs);
            for j in 0..b.panels {
                let (mut t0, mut t1) = (vec![0.0f32; m * NT], vec![0.0f32; m * NT]);
                // SAFETY: the CPU has AVX-512 F/BW/DQ/VL and AVX512_BF16
                // (checked above).
                unsafe {
                    x86_avx512::panel(&a, &spans, &b, j, m, kblocks, &mut t0);
                    x86_avx512::panel_with(&a, &pairs, &spans, &b, j, m, kblocks, &mut t1);
                }
                let mut both = vec![0.0f32; 2 * m * NT];
                portable_panels(&a, &spans, &b, m, m, j / 2..j / 2 + 1, &mut both);
                let t2 = &both[(j % 2) * m * NT..][..m * NT];
                let bits = |t: &[f32]| t.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&t0),
                    bits(&t1),
                    "m={m} n={n} k={k} panel {j}: fma vs dp"
                );
                assert_eq!(bits(&t0), bits(t2), "m={m} n={n} k={k} panel {j}: portable");
            }
        }
    }
}
