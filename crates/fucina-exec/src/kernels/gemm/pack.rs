//! The packers: the right-hand side into column panels of [`NR`] columns (once
//! per call, or once per process through the context's right-hand-side cache) and
//! the left-hand side into row panels of one micro-tile each (per `MC x KC`
//! block). Packing is pure data movement: every packer, vectorized or not, writes
//! the same floats.

use super::MicroKernel;
#[cfg(target_arch = "x86_64")]
use super::avx512::Avx512;
use super::params::{KC, MC, NR, row_tiles};
#[cfg(target_arch = "x86_64")]
use crate::kernels::simd;

/// Floats of the packed form of a `k x n` right-hand side (`None` on overflow).
pub(crate) fn packed_b_len(k: usize, n: usize) -> Option<usize> {
    n.div_ceil(NR).checked_mul(k)?.checked_mul(NR)
}

/// Floats of the left-hand-side packing scratch [`super::gemm`] needs for
/// products of at most `rows` rows: one packed block of `min(rows, MC)` rows (a
/// batch-1 product needs `KC` floats, not the `MC x KC` of a large one).
pub(crate) fn a_scratch_len(rows: usize) -> usize {
    rows.clamp(1, MC) * KC
}

/// Packs one right-hand-side panel: `dst[kk * NR + j] = src[off + kk * rs + j * cs]`
/// for `kk < k`, `j < ncols`, and `0.0` for `ncols <= j < NR`.
///
/// `dst` holds exactly `k * NR` floats; `1 <= ncols <= NR`.
pub(crate) fn pack_b_panel(
    dst: &mut [f32],
    src: &[f32],
    off: usize,
    rs: usize,
    cs: usize,
    k: usize,
    ncols: usize,
) {
    debug_assert_eq!(dst.len(), k * NR);
    debug_assert!((1..=NR).contains(&ncols));
    if cs == 1 {
        // Row-major rows: one panel of the row-by-row packer.
        pack_b_rows(dst, src, off, rs, k, ncols);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if rs == 1 && ncols == NR && gather_fits(src.len(), off, cs, k) {
        // The gather packer runs at the AVX-512 level only (`FUCINA_SIMD` and
        // `force_simd_level` lower it like every other vectorized loop).
        if let Some(kernel) = Avx512::for_level(simd::level()) {
            kernel.pack_cols(dst, src, off, cs, k);
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if rs == 1 && ncols <= NR / 2 && gather_fits_lanes(src.len(), off, cs, k, ncols) {
        // Half a panel or less (a weight gradient split over output
        // channels): one masked gather per row, the upper half zero.
        if let Some(kernel) = Avx512::for_level(simd::level()) {
            kernel.pack_cols_half(dst, src, off, cs, k, ncols);
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if rs == 1
        && ncols >= 8
        && k >= 8
        && off + (ncols - 1) * cs + k <= src.len()
        && simd::CpuFeatures::enabled().has(simd::CpuFeatures::AVX2)
    {
        // Column-major at a level with AVX2 but no gather packer above (the
        // AVX2 level): 8 x 8 blocks transposed in registers.
        // SAFETY: AVX2 is enabled (checked above); every column read,
        // `off + j * cs + kk` for `j < ncols`, `kk < k`, is below
        // `off + (ncols - 1) * cs + k <= src.len()` (checked above), and every
        // write `kk * NR + j` is below `k * NR = dst.len()`.
        unsafe { pack_cols_transpose_avx2(dst, src, off, cs, k, ncols) };
        return;
    }
    if rs == 1 {
        // Column-major (a transposed view): each column is a contiguous run of k.
        // Transpose in blocks of KB rows so the destination rows being scattered
        // into (KB * NR floats) stay in L1 while every column is read.
        const KB: usize = 16;
        for (kb, dblk) in dst.chunks_mut(KB * NR).enumerate() {
            let k0 = kb * KB;
            for j in 0..ncols {
                let col = &src[off + j * cs + k0..][..dblk.len() / NR];
                for (d, &v) in dblk.chunks_exact_mut(NR).zip(col) {
                    d[j] = v;
                }
            }
        }
        if ncols < NR {
            for d in dst.chunks_exact_mut(NR) {
                d[ncols..].fill(0.0);
            }
        }
    } else {
        for (kk, d) in dst.chunks_exact_mut(NR).enumerate() {
            let base = off + kk * rs;
            for (j, x) in d.iter_mut().enumerate() {
                *x = if j < ncols { src[base + j * cs] } else { 0.0 };
            }
        }
    }
}

/// The column-major case of [`pack_b_panel`] (`rs == 1`) with AVX2: blocks of 8
/// columns by 8 rows of `k` loaded as 8 vectors (one per column), transposed
/// in registers and stored as 8 destination rows; the rows past the last
/// whole block of 8 and the columns past the last whole group of 8 are copied
/// one by one, the columns `ncols..NR` zeroed. The same floats as the scalar
/// transpose.
///
/// # Safety
/// The CPU must support AVX2; `dst.len() == k * NR`, `8 <= ncols <= NR`,
/// `k >= 8` and `off + (ncols - 1) * cs + k <= src.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pack_cols_transpose_avx2(
    dst: &mut [f32],
    src: &[f32],
    off: usize,
    cs: usize,
    k: usize,
    ncols: usize,
) {
    use std::arch::x86_64::*;
    debug_assert_eq!(dst.len(), k * NR);
    debug_assert!(off + (ncols - 1) * cs + k <= src.len());
    let (j8, k8) = (ncols / 8 * 8, k / 8 * 8);
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    for j0 in (0..j8).step_by(8) {
        for k0 in (0..k8).step_by(8) {
            // SAFETY: column `j0 + i < ncols`, elements `k0..k0 + 8 <= k`: in
            // bounds by the contract; the stores are rows `k0 + r < k`,
            // columns `j0..j0 + 8 <= NR` of `dst`.
            unsafe {
                let r: [__m256; 8] =
                    std::array::from_fn(|i| _mm256_loadu_ps(s.add(off + (j0 + i) * cs + k0)));
                let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                let rows = [
                    _mm256_permute2f128_ps::<0x20>(u0, u4),
                    _mm256_permute2f128_ps::<0x20>(u1, u5),
                    _mm256_permute2f128_ps::<0x20>(u2, u6),
                    _mm256_permute2f128_ps::<0x20>(u3, u7),
                    _mm256_permute2f128_ps::<0x31>(u0, u4),
                    _mm256_permute2f128_ps::<0x31>(u1, u5),
                    _mm256_permute2f128_ps::<0x31>(u2, u6),
                    _mm256_permute2f128_ps::<0x31>(u3, u7),
                ];
                for (kk, row) in rows.into_iter().enumerate() {
                    _mm256_storeu_ps(d.add((k0 + kk) * NR + j0), row);
                }
            }
        }
        for kk in k8..k {
            for j in j0..j0 + 8 {
                dst[kk * NR + j] = src[off + j * cs + kk];
            }
        }
    }
    for j in j8..ncols {
        for kk in 0..k {
            dst[kk * NR + j] = src[off + j * cs + kk];
        }
    }
    if ncols < NR {
        for row in dst.chunks_exact_mut(NR) {
            row[ncols..].fill(0.0);
        }
    }
}

/// Packs the consecutive panels of a row-major run of `ncols` columns (column
/// stride 1): `dst` holds `ncols.div_ceil(NR)` panels of `k * NR` floats, and
/// panel `q` is what [`pack_b_panel`] makes of columns `q * NR..` of
/// `src[off + kk * rs + j]`. Walks `k` in blocks of 16 rows and, per block, every
/// panel: each source row is read front to back (whole cache lines, in order),
/// instead of one 128-byte piece per row per panel, `rs` apart, which the hardware
/// prefetchers do not follow.
pub(crate) fn pack_b_rows(
    dst: &mut [f32],
    src: &[f32],
    off: usize,
    rs: usize,
    k: usize,
    ncols: usize,
) {
    const KB: usize = 16;
    let np = ncols.div_ceil(NR);
    debug_assert_eq!(dst.len(), np * k * NR);
    for k0 in (0..k).step_by(KB) {
        let kb = KB.min(k - k0);
        for (p, panel) in dst.chunks_exact_mut(k * NR).enumerate() {
            let w = NR.min(ncols - p * NR);
            let rows = panel[k0 * NR..][..kb * NR].chunks_exact_mut(NR);
            for (kk, d) in (k0..).zip(rows) {
                let s = &src[off + kk * rs + p * NR..][..w];
                if let (Ok(d), Ok(s)) = (
                    <&mut [f32; NR]>::try_from(&mut *d),
                    <&[f32; NR]>::try_from(s),
                ) {
                    *d = *s;
                } else {
                    d[..w].copy_from_slice(s);
                    d[w..].fill(0.0);
                }
            }
        }
    }
}

/// Whether a full column-major panel at `off` with column stride `cs` and depth
/// `k` lies inside `src_len` floats with 32-bit gather offsets (the bounds the
/// AVX-512 gather packer asserts).
#[cfg(target_arch = "x86_64")]
fn gather_fits(src_len: usize, off: usize, cs: usize, k: usize) -> bool {
    cs.checked_mul(31).is_some_and(|x| {
        x <= i32::MAX as usize && off.saturating_add(x).saturating_add(k) <= src_len
    })
}

/// [`gather_fits`] for a panel of `ncols` (at least 1) columns.
#[cfg(target_arch = "x86_64")]
fn gather_fits_lanes(src_len: usize, off: usize, cs: usize, k: usize, ncols: usize) -> bool {
    ncols >= 1
        && cs.checked_mul(ncols - 1).is_some_and(|x| {
            x <= i32::MAX as usize && off.saturating_add(x).saturating_add(k) <= src_len
        })
}

/// Packs an `mc x kc` left-hand-side block into row panels, one per row tile of
/// [`row_tiles`] for `kernel`'s tile height: the panel of the tile starting at
/// row `q0` with `rows` rows starts at `q0 * kc` and holds `dst[q0 * kc + kk *
/// rows + i] = src[row_offs[q0 + i] + (p0 + kk) * cs]`.
pub(super) fn pack_a<K: MicroKernel>(
    kernel: K,
    dst: &mut [f32],
    src: &[f32],
    row_offs: &[usize],
    p0: usize,
    cs: usize,
    kc: usize,
) {
    for (q0, pm) in row_tiles(row_offs.len(), K::MR) {
        let rows = &row_offs[q0..q0 + pm];
        let panel = &mut dst[q0 * kc..][..pm * kc];
        if cs == 1 {
            kernel.pack_a_panel(panel, src, rows, p0, kc);
        } else if rows.windows(2).all(|w| w[1] == w[0] + 1) {
            // Consecutive rows of a column-major block (a transposed matrix,
            // e.g. a convolution's `W_gᵀ`): each panel row is `pm` contiguous
            // floats, copied at a fixed length.
            pack_a_consecutive(panel, src, rows[0] + p0 * cs, cs, pm);
        } else {
            for (kk, d) in panel.chunks_exact_mut(pm).enumerate() {
                let col = (p0 + kk) * cs;
                for (x, &ro) in d.iter_mut().zip(rows) {
                    *x = src[ro + col];
                }
            }
        }
    }
}

/// `panel[kk * pm + i] = src[off + kk * cs + i]` for `i < pm` (1..=12): the
/// panel of `pm` consecutive rows of a column-major block, one fixed-length
/// copy per depth step.
fn pack_a_consecutive(panel: &mut [f32], src: &[f32], off: usize, cs: usize, pm: usize) {
    fn go<const R: usize>(panel: &mut [f32], src: &[f32], off: usize, cs: usize) {
        for (kk, d) in panel.chunks_exact_mut(R).enumerate() {
            let d: &mut [f32; R] = d.try_into().expect("chunks of R");
            *d = src[off + kk * cs..][..R].try_into().expect("R floats");
        }
    }
    macro_rules! rows {
        ($($r:literal)*) => {
            match pm {
                $($r => go::<$r>(panel, src, off, cs),)*
                pm => unreachable!("row tile of {pm} rows"),
            }
        };
    }
    rows!(1 2 3 4 5 6 7 8 9 10 11 12);
}

/// The portable packer of one panel of `rows.len()` (1..=12) row-major rows
/// (`cs == 1`): `panel[kk * R + i] = src[rows[i] + p0 + kk]`.
pub(super) fn pack_a_panel_rows(
    panel: &mut [f32],
    src: &[f32],
    rows: &[usize],
    p0: usize,
    kc: usize,
) {
    macro_rules! rows {
        ($($r:literal)*) => {
            match rows.len() {
                $($r => pack_a_rows::<$r>(panel, src, rows, p0, kc),)*
                pm => unreachable!("row tile of {pm} rows"),
            }
        };
    }
    rows!(1 2 3 4 5 6 7 8 9 10 11 12);
}

/// One full panel of `R` row-major rows (`cs == 1`): `panel[kk * R + i] =
/// src[rows[i] + p0 + kk]`, written in order, reading the `R` rows in blocks of
/// [`A_BLOCK`] columns (the `R` rows' blocks are copied to a stack block first, so
/// the inner loops have constant bounds and no bounds checks).
#[inline(always)]
fn pack_a_rows<const R: usize>(
    panel: &mut [f32],
    src: &[f32],
    rows: &[usize],
    p0: usize,
    kc: usize,
) {
    let r: [&[f32]; R] = std::array::from_fn(|i| &src[rows[i] + p0..][..kc]);
    let full = kc / A_BLOCK * A_BLOCK;
    let (head, tail) = panel.split_at_mut(full * R);
    for (b, d) in head.chunks_exact_mut(A_BLOCK * R).enumerate() {
        let blk: [[f32; A_BLOCK]; R] = std::array::from_fn(|i| {
            r[i][b * A_BLOCK..][..A_BLOCK]
                .try_into()
                .expect("A_BLOCK floats")
        });
        for (t, d) in d.chunks_exact_mut(R).enumerate() {
            let d: &mut [f32; R] = d.try_into().expect("chunks of R");
            for (x, row) in d.iter_mut().zip(&blk) {
                *x = row[t];
            }
        }
    }
    for (t, d) in tail.chunks_exact_mut(R).enumerate() {
        for (x, row) in d.iter_mut().zip(&r) {
            *x = row[full + t];
        }
    }
}

/// Columns of a left-hand-side row read at once by [`pack_a_rows`].
const A_BLOCK: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::simd::{SimdLevel, force, level};

    /// `pack_b_panel` against its definition, for column-major, row-major and
    /// strided operands, every column count and depths around the blocks of
    /// 8, at every vector level (the packers differ by level; the floats may
    /// not).
    #[test]
    fn every_packer_writes_the_definitions_floats() {
        let before = level();
        for lvl in SimdLevel::available() {
            assert!(force(lvl));
            for (k, ncols) in [
                (1, 1),
                (7, 9),
                (8, 8),
                (9, 31),
                (16, 32),
                (37, 17),
                (64, 32),
                (13, 8),
            ] {
                for (rs, cs, pad) in [(1, k + 3, 5), (ncols + 2, 1, 0), (3 * ncols, 2, 1)] {
                    let off = 2;
                    let len = off + (k - 1) * rs + (ncols - 1) * cs + 1 + pad;
                    let src: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 7.0).collect();
                    let mut got = vec![f32::NAN; k * NR];
                    pack_b_panel(&mut got, &src, off, rs, cs, k, ncols);
                    for kk in 0..k {
                        for j in 0..NR {
                            let want = if j < ncols {
                                src[off + kk * rs + j * cs]
                            } else {
                                0.0
                            };
                            assert_eq!(
                                got[kk * NR + j].to_bits(),
                                want.to_bits(),
                                "{lvl:?} k {k} ncols {ncols} rs {rs} cs {cs}: row {kk} col {j}"
                            );
                        }
                    }
                }
            }
        }
        assert!(force(before));
    }
}
