//! Q4_K repacked in strips of eight rows (`PackedQuantMatrix` of a Q4_K
//! matrix whose row count is a multiple of eight) and its kernels: the same
//! exact integers `I`, `N` and the same float part as `q8k` (its module
//! order), over a copy of the weights laid out so that one 512-bit load
//! feeds eight rows.
//!
//! # The layout
//! The rows are taken in strips of [`G`] = 8; strip `s` holds rows
//! `8 s .. 8 s + 8` in exactly the bytes the eight rows take in llama.cpp's
//! layout (`8 · row_bytes`), so a repacked matrix is as large as the
//! original and strip `s` sits where its rows were. A strip is its `nb`
//! super-blocks in order, each a *tile* of [`TILE_BYTES`] = 1152 bytes (18
//! cache lines; the tiles are 64-byte aligned when the strip is):
//! - bytes `0..16`: the eight rows' f16 `d`; `16..32`: their `dmin`;
//! - `32..64`, `64..96`, `96..128`: the eight rows' scale bytes `0..4`,
//!   `4..8` and `8..12` (llama.cpp's 12 bytes of 6-bit scales and mins,
//!   unchanged, cut in three words, word `r` of each the row `r`'s);
//! - `128..1152`: the codes, 16 vectors of 64 bytes: vector `4 c + q`
//!   (`c` in `0..4`, `q` in `0..4`) holds, row after row, the eight bytes
//!   `32 c + 8 q .. + 8` of each row's 128 code bytes (low nibbles: elements
//!   `64 c + 8 q ..` of sub-block `2 c`; high nibbles: of sub-block `2 c + 1`).
//!
//! So a 64-byte load holds eight codes of sub-blocks `2 c` and `2 c + 1` of
//! all eight rows (eight activations, broadcast, meet all of them); the
//! scales and mins of eight rows decode together with byte operations
//! (`sc[j] = q[j] & 63`, `mn[j] = q[j + 4] & 63` for `j < 4`; for `j ≥ 4`
//! `sc[j] = (q[j + 4] & 15) | (q[j − 4] >> 6) << 4` and
//! `mn[j] = (q[j + 4] >> 4) | (q[j] >> 6) << 4`, each a byte-wise step over
//! the three words); the eight `d` and `dmin` convert in one instruction each.
//!
//! # The same bits
//! Each output's `I` and `N` of a super-block are exact integers (the same
//! whatever order they are summed in), and its accumulator takes
//! `acc = fma(d · dx, I, acc)`, `acc = fma(−(dmin · dx), N, acc)` block after
//! block, as `q8k`'s order says: the same bits as `quant_matmul` on the
//! original blocks, on every path, for every split of the strips among
//! threads and every batch. The portable path and the GEMM of many activation
//! rows read the original blocks back out of the tiles ([`block_of`]) and run
//! `q8k`'s code.

use std::ops::Range;

use super::QK_K;
use super::q8k::{GROUPS, KActs, Q8kDot};
use crate::kernels::quant_block::{BlockFormat, Q4_K};
use crate::kernels::quant_dot::{self, Path};

/// Rows per strip.
pub(crate) const G: usize = 8;

/// Bytes of one Q4_K super-block of one row.
const BLOCK: usize = 144;

/// Bytes of a tile: one super-block of the eight rows of a strip.
pub(crate) const TILE_BYTES: usize = G * BLOCK;

/// Where the codes start in a tile.
const CODES: usize = 128;

/// Writes strip `s` of `src` (rows of `row_bytes`, llama.cpp's Q4_K blocks)
/// into `dst` (`8 · row_bytes` bytes) in the strip layout.
///
/// # Panics
/// If `src` has fewer than `8 s + 8` rows or `dst` is not one strip long
/// (caller bugs).
pub(crate) fn repack_strip(src: &[u8], row_bytes: usize, s: usize, dst: &mut [u8]) {
    assert_eq!(dst.len(), G * row_bytes, "q4k repack: strip bytes");
    let rows = &src[s * G * row_bytes..(s + 1) * G * row_bytes];
    for (b, tile) in dst.chunks_exact_mut(TILE_BYTES).enumerate() {
        for r in 0..G {
            let blk = &rows[r * row_bytes + b * BLOCK..][..BLOCK];
            tile[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
            tile[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&blk[2..4]);
            for w in 0..3 {
                tile[32 + 32 * w + 4 * r..][..4].copy_from_slice(&blk[4 + 4 * w..][..4]);
            }
            for v in 0..16 {
                tile[CODES + 64 * v + 8 * r..][..8].copy_from_slice(&blk[16 + 8 * v..][..8]);
            }
        }
    }
}

/// Copies super-block `b` of row `r` (`r < 8`) of `strip` back into
/// llama.cpp's block `blk`: the inverse of [`repack_strip`].
#[inline]
pub(crate) fn block_of(strip: &[u8], r: usize, b: usize, blk: &mut [u8; BLOCK]) {
    let tile = &strip[b * TILE_BYTES..(b + 1) * TILE_BYTES];
    blk[0..2].copy_from_slice(&tile[2 * r..2 * r + 2]);
    blk[2..4].copy_from_slice(&tile[16 + 2 * r..16 + 2 * r + 2]);
    for w in 0..3 {
        blk[4 + 4 * w..][..4].copy_from_slice(&tile[32 + 32 * w + 4 * r..][..4]);
    }
    for v in 0..16 {
        blk[16 + 8 * v..][..8].copy_from_slice(&tile[CODES + 64 * v + 8 * r..][..8]);
    }
}

/// Checks `q8k_rows`'s bounds for the strips holding `rows` (whole strips)
/// of the repacked `w`.
fn check_rows(
    w: &[u8],
    row_bytes: usize,
    rows: &Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_t: &[f32],
) {
    let nb = acts.cols / QK_K;
    assert!(acts.cols.is_multiple_of(QK_K), "q4k packed: columns");
    assert_eq!(row_bytes, nb * Q4_K::BYTES, "q4k packed: row bytes");
    assert!(
        rows.start.is_multiple_of(G) && rows.end.is_multiple_of(G),
        "q4k packed: whole strips"
    );
    assert!(rows.end * row_bytes <= w.len(), "q4k packed: weight rows");
    assert!(acts.q.len() >= m * acts.cols, "q4k packed: activations");
    assert!(acts.d.len() >= m * nb, "q4k packed: scales");
    assert!(acts.bsums.len() >= m * nb * GROUPS, "q4k packed: sums");
    assert!(out_t.len() >= rows.len() * m, "q4k packed: output");
}

/// The outputs of weight rows `rows` (whole strips) of the repacked matrix
/// `w` for all `m` activation rows: `out_t[(j - rows.start) * m + i]`, as
/// `q8k::q8k_rows` writes them for the original blocks (the same bits).
///
/// # Panics
/// If `rows` does not start and end on a strip, or a slice is too short
/// (caller bugs).
pub(crate) fn packed_rows(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_t: &mut [f32],
) {
    check_rows(w, row_bytes, &rows, acts, m, out_t);
    match quant_dot::path() {
        #[cfg(target_arch = "x86_64")]
        Path::Vnni => {
            // SAFETY: `path` returns Vnni only when the CPU has every feature
            // the tiles enable; the bounds were checked above.
            unsafe { x86::rows_vnni(w, row_bytes, rows, acts, m, out_t) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => {
            // SAFETY: `path` returns Avx2 only when the CPU has AVX2, FMA and
            // F16C; the bounds were checked above.
            unsafe { x86::rows_avx2(w, row_bytes, rows, acts, m, out_t) }
        }
        _ => crate::kernels::simd::vectorized!(portable_rows(w, row_bytes, rows, acts, m, out_t)),
    }
}

/// The portable product: each block read back out of its tile, then
/// `q8k`'s integers and float part in its order.
#[inline(always)]
fn portable_rows(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_t: &mut [f32],
) {
    let nb = acts.cols / QK_K;
    let start = rows.start;
    let mut blk = [0u8; BLOCK];
    for j in rows {
        let s = j / G;
        let strip = &w[s * G * row_bytes..(s + 1) * G * row_bytes];
        let out = &mut out_t[(j - start) * m..(j - start + 1) * m];
        out.fill(0.0);
        for b in 0..nb {
            block_of(strip, j % G, b, &mut blk);
            let (d, dmin) = Q4_K::scales(&blk);
            for (i, acc) in out.iter_mut().enumerate() {
                let xq = &acts.q[i * acts.cols + b * QK_K..][..QK_K];
                let bs = &acts.bsums[(i * nb + b) * GROUPS..][..GROUPS];
                let (ii, n) = Q4_K::int_dot(&blk, xq, bs);
                let dx = acts.d[i * nb + b];
                *acc = (d * dx).mul_add(ii as f32, *acc);
                *acc = (-(dmin * dx)).mul_add(n as f32, *acc);
            }
        }
    }
}

/// The GEMM of many activation rows over tiles of 16 weight rows (two
/// strips; the last may be one), as `q8k::gemm_tiles` for the original
/// blocks (the same bits, the same `[tiles][m][16]` output).
///
/// # Panics
/// Where the CPU has no GEMM, or the slices are too short (caller bugs).
pub(crate) fn gemm_tiles(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    tiles: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_tiles: &mut [f32],
) {
    assert!(rows.is_multiple_of(G), "q4k packed gemm: whole strips");
    use super::q8k::{Gemm, gemm_level};
    match gemm_level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `gemm_level` gives Vnni only where the CPU has AVX-512
        // F/BW/VL/VNNI, AVX2, FMA and F16C; `drive` checks the bounds.
        Gemm::Vnni => unsafe {
            super::q8k_gemm::gemm_with::<Q4_K, x86::DirectVnni>(
                w, row_bytes, rows, tiles, acts, m, out_tiles,
            )
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `gemm_level` gives Avx2 only where the CPU has AVX2, FMA
        // and F16C; `drive` checks the bounds.
        Gemm::Avx2 => unsafe {
            super::q8k_gemm_avx2::gemm_with::<Q4_K, x86::Repacked<super::q8k_gemm_avx2::Avx2>>(
                w, row_bytes, rows, tiles, acts, m, out_tiles,
            )
        },
        _ => {
            let _ = (w, row_bytes, tiles, acts, m, out_tiles);
            panic!("q4k packed gemm: no GEMM at this level (see gemm_for)")
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;
