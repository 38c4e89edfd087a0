//! The vector kernels of the super-block ("K") formats Q4_K and Q6_K (their
//! layouts and block coding are in `quant_block::q4_k` and
//! `quant_block::q6_k`): integer dot products with activations quantized to
//! int8 blocks of 32 (see `quant_dot`), read in place.
//!
//! # The order of a dot product (the same bits on every path)
//! An activation block of 32 (scale `dx`, int8 values) meets one sub-block of
//! 32 weights. Its eight lanes of four give exact integer sums
//! `p[l] = Σ q · x` (Q4_K: the nibbles `0..=15`; Q6_K: `q − 32`). With the
//! f32 weight scale of the lane (`d · sc[j]` for Q4_K, `d · scales[i]` for the
//! lane's 16-weight group for Q6_K: both exact products) and
//! `s = (weight scale) · dx` (one rounding), sixteen lane accumulators take
//! `acc[8 · (j mod 2) + l] = fma(s, p[l], acc[8 · (j mod 2) + l])`: the even
//! sub-blocks `j` in lanes 0..8, the odd ones in lanes 8..16 (so that a 512-bit
//! vector holds a pair of sub-blocks), sub-block after sub-block in increasing
//! order. Q4_K then closes each super-block with its min term, lane `l < 8`
//! taking sub-block `l`'s: `acc[l] = fma(−t, S, acc[l])` with
//! `t = (dmin · mn[l]) · dx` and `S = Σ x` over that activation block (exact).
//! At the end `acc[l] += acc[l + 8]` for `l < 8`, and the eight lanes fold in
//! halves as in `quant_dot`. Every path (portable, AVX2
//! `vpmaddubsw`/`vpmaddwd`, AVX-512 VNNI `vpdpbusd`) performs exactly these
//! IEEE operations in this order.

use std::ops::Range;

use super::quant_block::q4_k::{Q4K_BYTES, q4k_scales_u64};
use super::quant_block::q6_k::Q6K_BYTES;
use super::quant_dot::{self, Acts, LANES, QK};

/// Weights per super-block.
pub(crate) const QK_K: usize = 256;
/// Sub-blocks of 32 per super-block.
const SUB: usize = QK_K / QK;

/// Quantizes the `m` activation rows of `x` for a K-format product: as
/// `quant_dot::quantize_row` (blocks of 32, f32 scale), with the format's
/// `offset` (its `BlockFormat::ACT_OFFSET`), plus `sums[i * nb + b] = Σ x̂` over each block (exact, for
/// Q4_K's min term).
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantize_acts(
    x: &[f32],
    m: usize,
    cols: usize,
    offset: i32,
    xq: &mut [i8],
    xs: &mut [f32],
    xb: &mut [i32],
    sums: &mut [f32],
) {
    let nb = cols / QK;
    for i in 0..m {
        let q = &mut xq[i * cols..(i + 1) * cols];
        quant_dot::quantize_row(
            &x[i * cols..(i + 1) * cols],
            offset,
            q,
            &mut xs[i * nb..(i + 1) * nb],
            &mut xb[i * nb * LANES..(i + 1) * nb * LANES],
        );
        for (s, qb) in sums[i * nb..(i + 1) * nb]
            .iter_mut()
            .zip(q.chunks_exact(QK))
        {
            *s = qb.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
        }
    }
}

/// Computes the outputs of weight rows `rows` for all `m` activation rows
/// with the vector kernels of the current level, for Q6_K (`Q6`) or Q4_K
/// weights, as [`BlockFormat::rows`](super::quant_block::BlockFormat::rows)
/// does; `false` (nothing written) at the portable level. `acts` and `sums`
/// come from [`quantize_acts`] with the format's offset.
///
/// The operands must pass `quant_block::quant_rows`'s bounds checks (its
/// callers' contract).
#[allow(clippy::too_many_arguments)]
pub(crate) fn simd_rows<const Q6: bool>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) -> bool {
    match quant_dot::path() {
        #[cfg(target_arch = "x86_64")]
        quant_dot::Path::Vnni => {
            // SAFETY: `path` returns Vnni only when the CPU has every feature
            // `x86::rows_vnni` enables; `quant_block::quant_rows` checked the
            // bounds contract.
            unsafe { x86::rows_vnni::<Q6>(w, row_bytes, rows, acts, sums, m, out_t) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        quant_dot::Path::Avx2 => {
            // SAFETY: `path` returns Avx2 only when the CPU has AVX2, FMA and
            // F16C; `quant_block::quant_rows` checked the bounds contract.
            unsafe { x86::rows_avx2::<Q6>(w, row_bytes, rows, acts, sums, m, out_t) };
            true
        }
        _ => false,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The x86-64 kernels: tiles of `R` weight rows × `M` activation rows; each
    //! sub-block's weights are unpacked once for the `M` rows and each
    //! activation block loaded once for the `R` rows, in the fixed order of the
    //! module docs. AVX2 keeps the even and odd sub-blocks' lanes in two 8-lane
    //! accumulators per output; AVX-512 keeps them in the two halves of one
    //! 16-lane accumulator and takes a pair of sub-blocks per instruction.

    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Acts, LANES, Q4K_BYTES, Q6K_BYTES, QK, QK_K, SUB, q4k_scales_u64};

    /// Weight rows per tile.
    const R_TILE: usize = 4;
    /// How far ahead of the super-block being read the weights are prefetched.
    const PREFETCH_BYTES: usize = 768;

    /// Runs `$tile::<Q6, R, M>` over `rows` × `0..m` in tiles, writing `out_t`
    /// as `super::quant_rows` does.
    macro_rules! drive {
        ($tile:ident, $mt:expr, $q6:ident, $w:ident, $row_bytes:ident, $rows:ident, $acts:ident, $sums:ident, $m:ident, $out_t:ident) => {{
            let start = $rows.start;
            let mut j = $rows.start;
            while j < $rows.end {
                let r = if $rows.end - j >= R_TILE { R_TILE } else { 1 };
                let mut i = 0;
                while i < $m {
                    let mm = ($m - i).min($mt);
                    macro_rules! run {
                        ($r:literal, $mm:literal) => {{
                            let res = $tile::<$q6, $r, $mm>($w, $row_bytes, j, $acts, $sums, i);
                            for (rr, row) in res.iter().enumerate() {
                                let o = (j - start + rr) * $m + i;
                                $out_t[o..o + $mm].copy_from_slice(row);
                            }
                        }};
                    }
                    match (r, mm) {
                        (R_TILE, 1) => run!(4, 1),
                        (R_TILE, 2) => run!(4, 2),
                        (R_TILE, 3) => run!(4, 3),
                        (R_TILE, _) => run!(4, 4),
                        (_, 1) => run!(1, 1),
                        (_, 2) => run!(1, 2),
                        (_, 3) => run!(1, 3),
                        (_, _) => run!(1, 4),
                    }
                    i += mm;
                }
                j += r;
            }
        }};
    }

    /// The AVX2 kernel over `rows` (see `super::quant_rows`).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; the slices must satisfy
    /// `quant_rows`'s asserted bounds.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2<const Q6: bool>(
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &Acts<'_>,
        sums: &[f32],
        m: usize,
        out_t: &mut [f32],
    ) {
        // One activation row per tile: 2 · 4 accumulators fit the 16 registers.
        drive!(tile_avx2, 1, Q6, w, row_bytes, rows, acts, sums, m, out_t)
    }

    /// The AVX-512 VNNI kernel over `rows` (see `super::quant_rows`).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the slices
    /// must satisfy `quant_rows`'s asserted bounds.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows_vnni<const Q6: bool>(
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &Acts<'_>,
        sums: &[f32],
        m: usize,
        out_t: &mut [f32],
    ) {
        drive!(tile_vnni, 4, Q6, w, row_bytes, rows, acts, sums, m, out_t)
    }

    /// Checks a tile's reads against the slices (once per tile).
    #[inline(always)]
    fn check_tile<const Q6: bool, const R: usize, const M: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) {
        let nb = acts.cols / QK;
        assert!((j0 + R) * row_bytes <= w.len(), "quant_k tile: weight rows");
        assert!(
            (i0 + M) * acts.cols <= acts.q.len(),
            "quant_k tile: activations"
        );
        assert!((i0 + M) * nb <= acts.scale.len(), "quant_k tile: scales");
        assert!(
            (i0 + M) * nb * LANES <= acts.bias.len(),
            "quant_k tile: biases"
        );
        // Q6_K has no min term: its tiles never read the sums
        if !Q6 {
            assert!((i0 + M) * nb <= sums.len(), "quant_k tile: sums");
        }
    }

    /// The eight lanes folded in halves (l + 4, l + 2, l + 1).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn fold(v: __m256) -> f32 {
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps::<0b01>(q, q)))
    }

    /// The two f16 values at `p` (`d`, `dmin` of a Q4_K super-block; the
    /// second is meaningless for Q6_K), widened.
    ///
    /// # Safety
    /// `p` must be valid for reading four bytes.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
        // SAFETY: four readable bytes (the caller's contract).
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
            p.cast::<i32>().read_unaligned()
        }));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// The eight bytes of `v` widened to eight f32.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn u8x8_to_f32(v: u64) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)))
    }

    /// Outputs of weight rows `j0..j0 + R` × activation rows `i0..i0 + M` with
    /// `vpmaddubsw` + `vpmaddwd` (pair sums at most `2 · 63 · 127`, never
    /// saturating), the even and odd sub-blocks in two accumulators.
    // The tile's parallel arrays (accumulators, activations, weights) are
    // indexed by row numbers.
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tile_avx2<const Q6: bool, const R: usize, const M: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; M]; R] {
        check_tile::<Q6, R, M>(w, row_bytes, j0, acts, sums, i0);
        let nb = acts.cols / QK;
        let nsb = acts.cols / QK_K;
        let bb = if Q6 { Q6K_BYTES } else { Q4K_BYTES };
        let low4 = _mm256_set1_epi8(0x0f);
        let hi2 = _mm256_set1_epi8(0x30);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[[_mm256_setzero_ps(); 2]; M]; R];
        for sb in 0..nsb {
            // Per weight row: the exact f32 scales d · sc of the super-block
            // (Q4_K: sub-block j in lane j; Q6_K: group g in lane g % 8 of
            // vector g / 8), and for Q4_K the mins dmin · mn.
            let mut ds = [[_mm256_setzero_ps(); 2]; R];
            let mut dm = [_mm256_setzero_ps(); R];
            let mut blks = [std::ptr::null::<u8>(); R];
            for r in 0..R {
                // SAFETY: check_tile: row j0 + r is inside `w`, and super-block
                // sb of it spans bb bytes from `blk`.
                let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + sb * bb) };
                blks[r] = blk;
                // A prefetch never faults; the addresses are computed with
                // wrapping arithmetic, never dereferenced.
                for l in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH_BYTES + 64 * l).cast());
                }
                if Q6 {
                    // SAFETY: bytes 192..210 of the super-block.
                    let (d, sc) = unsafe {
                        (
                            f16_pair(blk.add(206)).1,
                            _mm_loadu_si128(blk.add(192).cast()),
                        )
                    };
                    let dv = _mm256_set1_ps(d);
                    ds[r][0] = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
                    ds[r][1] = _mm256_mul_ps(
                        dv,
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc))),
                    );
                } else {
                    // SAFETY: bytes 0..16 of the super-block.
                    let (head, (d, dmin)) =
                        unsafe { (std::slice::from_raw_parts(blk, 16), f16_pair(blk)) };
                    let (sc, mn) = q4k_scales_u64(&head[4..16]);
                    ds[r][0] = _mm256_mul_ps(_mm256_set1_ps(d), u8x8_to_f32(sc));
                    dm[r] = _mm256_mul_ps(_mm256_set1_ps(dmin), u8x8_to_f32(mn));
                }
            }
            for j in 0..SUB {
                let b = sb * SUB + j;
                let mut xv = [_mm256_setzero_si256(); M];
                let mut xb = [_mm256_setzero_si256(); M];
                let mut dx = [_mm256_setzero_ps(); M];
                for i in 0..M {
                    let row = i0 + i;
                    // SAFETY: check_tile: row < i0 + M, so the 32 values at
                    // row * cols + 32 b and the 8 biases at (row * nb + b) * 8
                    // are in bounds.
                    unsafe {
                        xv[i] = _mm256_loadu_si256(
                            acts.q.as_ptr().add(row * acts.cols + b * QK).cast(),
                        );
                        if Q6 {
                            xb[i] = _mm256_loadu_si256(
                                acts.bias.as_ptr().add((row * nb + b) * LANES).cast(),
                            );
                        }
                    }
                    dx[i] = _mm256_set1_ps(acts.scale[row * nb + b]);
                }
                for r in 0..R {
                    let blk = blks[r];
                    let (wv, wsc) = if Q6 {
                        let (half, g) = (j / 4, j % 4);
                        // SAFETY: ql bytes 64 half + 32 (g % 2) .. +32 and qh
                        // bytes 128 + 32 half .. +32 are inside the super-block.
                        let (ql, qh) = unsafe {
                            (
                                _mm256_loadu_si256(blk.add(64 * half + 32 * (g % 2)).cast()),
                                _mm256_loadu_si256(blk.add(128 + 32 * half).cast()),
                            )
                        };
                        let lo = if g < 2 {
                            _mm256_and_si256(ql, low4)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql), low4)
                        };
                        // bits 2g, 2g + 1 of each qh byte to bits 4, 5
                        let hi = match g {
                            0 => _mm256_slli_epi16::<4>(qh),
                            1 => _mm256_slli_epi16::<2>(qh),
                            2 => qh,
                            _ => _mm256_srli_epi16::<2>(qh),
                        };
                        let wv = _mm256_or_si256(lo, _mm256_and_si256(hi, hi2));
                        // lanes 0..4: group 2j, lanes 4..8: group 2j + 1
                        let k = (2 * j % 8) as i32;
                        let idx = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
                        (wv, _mm256_permutevar8x32_ps(ds[r][j / 4], idx))
                    } else {
                        // SAFETY: value bytes 16 + 32 (j / 2) .. +32 are inside
                        // the super-block.
                        let v = unsafe { _mm256_loadu_si256(blk.add(16 + 32 * (j / 2)).cast()) };
                        let wv = if j.is_multiple_of(2) {
                            _mm256_and_si256(v, low4)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4)
                        };
                        (
                            wv,
                            _mm256_permutevar8x32_ps(ds[r][0], _mm256_set1_epi32(j as i32)),
                        )
                    };
                    for i in 0..M {
                        let pairs = _mm256_maddubs_epi16(wv, xv[i]);
                        let p = _mm256_madd_epi16(pairs, ones);
                        let p = if Q6 { _mm256_add_epi32(p, xb[i]) } else { p };
                        let s = _mm256_mul_ps(wsc, dx[i]);
                        let a = &mut acc[r][i][j % 2];
                        *a = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), *a);
                    }
                }
            }
            if !Q6 {
                // The min term: lane l of the even accumulator takes sub-block l's.
                for i in 0..M {
                    let o = (i0 + i) * nb + sb * SUB;
                    // SAFETY: check_tile: the 8 scales and sums of super-block
                    // sb of row i0 + i are in bounds.
                    let (dxv, sv) = unsafe {
                        (
                            _mm256_loadu_ps(acts.scale.as_ptr().add(o)),
                            _mm256_loadu_ps(sums.as_ptr().add(o)),
                        )
                    };
                    for r in 0..R {
                        let t = _mm256_mul_ps(dm[r], dxv);
                        acc[r][i][0] = _mm256_fnmadd_ps(t, sv, acc[r][i][0]);
                    }
                }
            }
        }
        let mut out = [[0.0f32; M]; R];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (o, a) in o.iter_mut().zip(a) {
                *o = fold(_mm256_add_ps(a[0], a[1]));
            }
        }
        out
    }

    /// Outputs of weight rows `j0..j0 + R` × activation rows `i0..i0 + M` with
    /// 512-bit `vpdpbusd`: a pair of sub-blocks (`2c`, `2c + 1`) per
    /// instruction, the even one in lanes 0..8 and the odd one in lanes 8..16,
    /// each lane's sum starting from its bias (zero for Q4_K).
    // As in tile_avx2.
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn tile_vnni<const Q6: bool, const R: usize, const M: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; M]; R] {
        check_tile::<Q6, R, M>(w, row_bytes, j0, acts, sums, i0);
        let nb = acts.cols / QK;
        let nsb = acts.cols / QK_K;
        let bb = if Q6 { Q6K_BYTES } else { Q4K_BYTES };
        let low4 = _mm512_set1_epi8(0x0f);
        let hi2 = _mm512_set1_epi8(0x30);
        // the upper 256 bits of a Q4_K pair are the high nibbles
        let nib_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
        // Q6_K high bits to bits 4, 5: groups 0, 1 (<< 4, << 2), groups 2, 3
        // (as they are, >> 2)
        let q6_shl = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
        let q6_shr = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
        let pair_dx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let mut acc = [[_mm512_setzero_ps(); M]; R];
        for sb in 0..nsb {
            // Per weight row: the exact f32 scales d · sc (Q4_K: sub-block j in
            // lane j; Q6_K: group g in lane g), and for Q4_K the mins dmin · mn.
            let mut ds = [_mm512_setzero_ps(); R];
            let mut dm = [_mm512_setzero_ps(); R];
            let mut blks = [std::ptr::null::<u8>(); R];
            for r in 0..R {
                // SAFETY: check_tile: row j0 + r is inside `w`, and super-block
                // sb of it spans bb bytes from `blk`.
                let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + sb * bb) };
                blks[r] = blk;
                // A prefetch never faults; the addresses are computed with
                // wrapping arithmetic, never dereferenced.
                for l in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH_BYTES + 64 * l).cast());
                }
                if Q6 {
                    // SAFETY: bytes 192..210 of the super-block.
                    let (d, sc) = unsafe {
                        (
                            f16_pair(blk.add(206)).1,
                            _mm_loadu_si128(blk.add(192).cast()),
                        )
                    };
                    ds[r] = _mm512_mul_ps(
                        _mm512_set1_ps(d),
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)),
                    );
                } else {
                    // SAFETY: bytes 0..16 of the super-block.
                    let (head, (d, dmin)) =
                        unsafe { (std::slice::from_raw_parts(blk, 16), f16_pair(blk)) };
                    let (sc, mn) = q4k_scales_u64(&head[4..16]);
                    ds[r] =
                        _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_set1_ps(d), u8x8_to_f32(sc)));
                    dm[r] = _mm512_zextps256_ps512(_mm256_mul_ps(
                        _mm256_set1_ps(dmin),
                        u8x8_to_f32(mn),
                    ));
                }
            }
            for c in 0..SUB / 2 {
                let b = sb * SUB + 2 * c;
                let mut xv = [_mm512_setzero_si512(); M];
                let mut xb = [_mm512_setzero_si512(); M];
                let mut dx = [_mm512_setzero_ps(); M];
                for i in 0..M {
                    let row = i0 + i;
                    // SAFETY: check_tile: row < i0 + M, so the 64 values at
                    // row * cols + 32 b, the 16 biases at (row * nb + b) * 8 and
                    // the two scales at row * nb + b are in bounds (b + 1 < nb).
                    unsafe {
                        xv[i] = _mm512_loadu_si512(
                            acts.q.as_ptr().add(row * acts.cols + b * QK).cast(),
                        );
                        if Q6 {
                            xb[i] = _mm512_loadu_si512(
                                acts.bias.as_ptr().add((row * nb + b) * LANES).cast(),
                            );
                        }
                        let two = _mm_castpd_ps(_mm_load_sd(
                            acts.scale.as_ptr().add(row * nb + b).cast(),
                        ));
                        dx[i] = _mm512_permutexvar_ps(pair_dx, _mm512_castps128_ps512(two));
                    }
                }
                for r in 0..R {
                    let blk = blks[r];
                    let (wv, wsc) = if Q6 {
                        let (half, p) = (c / 2, c % 2);
                        // SAFETY: ql bytes 64 half .. +64 and qh bytes
                        // 128 + 32 half .. +32 are inside the super-block.
                        let (ql, qh) = unsafe {
                            (
                                _mm512_loadu_si512(blk.add(64 * half).cast()),
                                _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                    blk.add(128 + 32 * half).cast(),
                                )),
                            )
                        };
                        let (lo, hi) = if p == 0 {
                            (_mm512_and_si512(ql, low4), _mm512_sllv_epi64(qh, q6_shl))
                        } else {
                            (
                                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4),
                                _mm512_srlv_epi64(qh, q6_shr),
                            )
                        };
                        let wv = _mm512_or_si512(lo, _mm512_and_si512(hi, hi2));
                        // lanes 4k..4k + 4: group 4c + k
                        let g = 4 * c as i32;
                        let idx = _mm512_setr_epi32(
                            g,
                            g,
                            g,
                            g,
                            g + 1,
                            g + 1,
                            g + 1,
                            g + 1,
                            g + 2,
                            g + 2,
                            g + 2,
                            g + 2,
                            g + 3,
                            g + 3,
                            g + 3,
                            g + 3,
                        );
                        (wv, _mm512_permutexvar_ps(idx, ds[r]))
                    } else {
                        // SAFETY: value bytes 16 + 32 c .. +32 are inside the
                        // super-block.
                        let v = unsafe { _mm256_loadu_si256(blk.add(16 + 32 * c).cast()) };
                        let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v), v);
                        let wv = _mm512_and_si512(_mm512_srlv_epi64(both, nib_shift), low4);
                        let k = 2 * c as i32;
                        let idx = _mm512_setr_epi32(
                            k,
                            k,
                            k,
                            k,
                            k,
                            k,
                            k,
                            k,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                        );
                        (wv, _mm512_permutexvar_ps(idx, ds[r]))
                    };
                    for i in 0..M {
                        let p = _mm512_dpbusd_epi32(xb[i], wv, xv[i]);
                        let s = _mm512_mul_ps(wsc, dx[i]);
                        acc[r][i] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[r][i]);
                    }
                }
            }
            if !Q6 {
                // The min term: lane l < 8 takes sub-block l's.
                for i in 0..M {
                    let o = (i0 + i) * nb + sb * SUB;
                    // SAFETY: check_tile: the 8 scales and sums of super-block
                    // sb of row i0 + i are in bounds.
                    let (dxv, sv) = unsafe {
                        (
                            _mm512_zextps256_ps512(_mm256_loadu_ps(acts.scale.as_ptr().add(o))),
                            _mm512_zextps256_ps512(_mm256_loadu_ps(sums.as_ptr().add(o))),
                        )
                    };
                    for r in 0..R {
                        let t = _mm512_mul_ps(dm[r], dxv);
                        acc[r][i] = _mm512_mask3_fnmadd_ps(t, sv, acc[r][i], 0x00ff);
                    }
                }
            }
        }
        let mut out = [[0.0f32; M]; R];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (o, &a) in o.iter_mut().zip(a) {
                let lo = _mm512_castps512_ps256(a);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
                *o = fold(_mm256_add_ps(lo, hi));
            }
        }
        out
    }
}
