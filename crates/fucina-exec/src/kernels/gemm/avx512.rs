//! The x86-64 AVX-512 micro-kernel: `12 x 32` tiles accumulated in registers
//! straight from and into `C` (no stack tile), with the AVX-512 packers of the
//! left-hand side (an in-register 4 x 4 transpose) and of a column-major
//! right-hand side (gathers). `_mm512_fmadd_ps` is the same fused, once-rounded
//! `a * b + c` as `f32::mul_add`, so the kernel computes what the portable one
//! computes; the packers move the same floats as the portable packers.

use std::arch::x86_64::*;

use super::params::NR;
use super::{MicroKernel, Tile};
use crate::kernels::simd::SimdLevel;

/// The AVX-512 kernel. A value is a proof that the CPU has avx512f (every
/// instruction of this module): the only constructor, [`MicroKernel::detect`], asks
/// the CPU, and the private field keeps every other module from making one. The
/// `SAFETY` comments of the calls into this module's `target_feature` functions
/// rely on that proof.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512 {
    _proof: (),
}

impl Avx512 {
    /// Packs one full panel (32 columns) of a column-major right-hand side with
    /// gathers (see [`pack_cols_avx512`]); panics unless `off + 31 * cs + k <=
    /// src.len()`, `31 * cs <= i32::MAX` and `dst.len() == k * NR`.
    pub(super) fn pack_cols(self, dst: &mut [f32], src: &[f32], off: usize, cs: usize, k: usize) {
        // SAFETY: `self` is an `Avx512`, which exists only when the CPU has
        // avx512f (`MicroKernel::detect`), the feature `pack_cols_avx512` enables; it
        // checks its own bounds.
        unsafe { pack_cols_avx512(dst, src, off, cs, k) }
    }
}

impl Avx512 {
    /// Packs one panel of `ncols <= 16` columns of a column-major right-hand
    /// side: one masked 16-lane gather per row, the upper 16 floats zero (see
    /// `pack_cols_half_avx512`).
    #[inline]
    pub(super) fn pack_cols_half(
        self,
        dst: &mut [f32],
        src: &[f32],
        off: usize,
        cs: usize,
        k: usize,
        ncols: usize,
    ) {
        // SAFETY: `self` is an `Avx512`, which exists only when the CPU has
        // avx512f (`MicroKernel::detect`), the feature `pack_cols_half_avx512`
        // enables; it checks its own bounds.
        unsafe { pack_cols_half_avx512(dst, src, off, cs, k, ncols) }
    }
}

impl MicroKernel for Avx512 {
    const MR: usize = MR_AVX512;
    const NR: usize = NR;
    const LEVEL: SimdLevel = SimdLevel::Avx512;

    /// The kernel, when the CPU has avx512f.
    #[inline]
    fn detect() -> Option<Avx512> {
        use crate::kernels::simd::CpuFeatures;
        CpuFeatures::detected()
            .has(CpuFeatures::AVX512F)
            .then_some(Avx512 { _proof: () })
    }
    const READS_RHS_IN_PLACE: bool = true;
    const PREFETCHES_C: bool = true;

    #[inline]
    fn pack_a_panel(self, panel: &mut [f32], src: &[f32], rows: &[usize], p0: usize, kc: usize) {
        macro_rules! avx512 {
            ($($r:literal)*) => {
                match rows.len() {
                    $($r => {
                        let r: [&[f32]; $r] =
                            std::array::from_fn(|i| &src[rows[i] + p0..][..kc]);
                        // SAFETY: `self` is an `Avx512`, which exists only when the
                        // CPU has avx512f (`MicroKernel::detect`), the feature
                        // `pack_a_avx512` enables; it checks its own bounds.
                        unsafe { pack_a_avx512::<$r>(panel, &r, kc) };
                    })*
                    _ => super::pack::pack_a_panel_rows(panel, src, rows, p0, kc),
                }
            };
        }
        avx512!(4 8 12);
    }

    #[inline]
    fn tile(self, t: Tile<'_>) {
        // SAFETY: `self` is an `Avx512`, which exists only when the CPU has
        // avx512f (`MicroKernel::detect`), the feature `tile_direct_avx512` needs; it
        // checks the tile's bounds itself.
        unsafe { tile_direct_avx512(t) };
    }
}

/// Micro-tile height of the AVX-512 kernel: 24 accumulators, two right-hand-side
/// vectors and a broadcast fit the 32 registers.
const MR_AVX512: usize = 12;

/// The AVX-512 `R x 32` micro-kernel, reading and writing `C` in place: 2R
/// accumulators (`R <= 14` keeps them, two `B` vectors and a broadcast in the 32
/// registers), started from zero (`first`) or from `C`, then for `kk` in
/// increasing order `acc[i][j] = fma(a[kk * R + i], b[kk * 32 + j], acc[i][j])`,
/// stored back to the first `ncols` columns of each of the `R` rows.
///
/// The left-hand side is a packed panel (`a[kk * R + i]`); the right-hand
/// side's row `kk` is the 32 floats at `b + kk * ldb` (a packed panel has
/// `ldb == 32`; a row-major matrix read in place, its row stride).
///
/// # Safety
/// avx512f is available; `a` is valid for `kc * R` reads, `b + kk * ldb` for
/// 32 reads for every `kk < kc`, and `c + i * ldc + j` for reads and writes for
/// `i < R`, `j < ncols`, `1 <= ncols <= 32`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_avx512<const R: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    ncols: usize,
    first: bool,
) {
    let full: u32 = if ncols >= 32 {
        u32::MAX
    } else {
        (1u32 << ncols) - 1
    };
    let (m0, m1) = (full as u16, (full >> 16) as u16);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    if !first {
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: row i < R of the tile; the masks enable only columns
            // j < ncols, which the caller guarantees readable (masked-off lanes
            // are not accessed).
            unsafe {
                let row = c.add(i * ldc);
                acc[0] = _mm512_maskz_loadu_ps(m0, row);
                acc[1] = _mm512_maskz_loadu_ps(m1, row.add(16));
            }
        }
    }
    let (mut ap, mut bp) = (a, b);
    for _ in 0..kc {
        // SAFETY: fewer than kc steps were taken, so `bp` points at 32 readable
        // floats and `ap` at R readable floats (the caller's bounds); the
        // prefetches only hint the cache (no access, computed with
        // `wrapping_add`).
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(ldb * PF_B).cast());
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(ldb * PF_B + 16).cast());
            _mm_prefetch::<_MM_HINT_T0>(ap.wrapping_add(R * PF_A).cast());
            let b0 = _mm512_loadu_ps(bp);
            let b1 = _mm512_loadu_ps(bp.add(16));
            for (i, acc) in acc.iter_mut().enumerate() {
                let ai = _mm512_set1_ps(*ap.add(i));
                acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(ai, b1, acc[1]);
            }
            ap = ap.add(R);
            bp = bp.wrapping_add(ldb);
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        // SAFETY: as for the loads above: only columns j < ncols of row i < R.
        unsafe {
            let row = c.add(i * ldc);
            _mm512_mask_storeu_ps(row, m0, acc[0]);
            _mm512_mask_storeu_ps(row.add(16), m1, acc[1]);
        }
    }
}

/// Software prefetch distances of the AVX-512 kernel, in `k` steps: the packed
/// right-hand-side panel (two cache lines per step) and the packed left-hand
/// panel are requested this far ahead of their loads.
const PF_B: usize = 16;
const PF_A: usize = 32;

/// Runs [`kernel_avx512`] for a tile of `t.rows` (1..=[`MR_AVX512`]) rows:
/// `t.a` holds `t.kc * t.rows` packed floats; right-hand-side row `kk` is
/// `t.b[kk * t.ldb..][..32]`; `t.c` starts at the tile's top-left element of a
/// row-major `C` with row stride `t.ldc`. Panics unless the slices hold those
/// floats.
///
/// # Safety
/// avx512f is available (the caller holds an [`Avx512`]).
#[target_feature(enable = "avx512f")]
unsafe fn tile_direct_avx512(t: Tile<'_>) {
    let Tile {
        rows,
        kc,
        a,
        b,
        ldb,
        c,
        ldc,
        ncols,
        first,
    } = t;
    assert!((1..=MR_AVX512).contains(&rows) && (1..=NR).contains(&ncols));
    assert!(a.len() >= kc * rows && ldb >= NR);
    assert!(kc == 0 || b.len() >= (kc - 1) * ldb + NR);
    assert!(c.len() >= (rows - 1) * ldc + ncols);
    let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    macro_rules! go {
        ($($r:literal)*) => {
            match rows {
                // SAFETY: avx512f is available (the caller's contract); the
                // asserts above give exactly the bounds `kernel_avx512` needs
                // for R = rows.
                $($r => unsafe { kernel_avx512::<$r>(kc, ap, bp, ldb, cp, ldc, ncols, first) },)*
                _ => unreachable!("AVX-512 micro-tile height {rows}"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12);
}

/// Packs one full panel (32 columns) of a column-major right-hand side
/// (`rs == 1`): for each `kk`, two 16-lane gathers read
/// `src[off + j * cs + kk]` for `j < 32` and one 32-float row of `dst` is
/// stored. Pure data movement: the packed floats are those of the scalar path.
///
/// The caller checks `off + 31 * cs + k <= src.len()`, `31 * cs <= i32::MAX`
/// and `dst.len() == k * NR`.
#[target_feature(enable = "avx512f")]
fn pack_cols_avx512(dst: &mut [f32], src: &[f32], off: usize, cs: usize, k: usize) {
    assert!(off + 31 * cs + k <= src.len() && 31 * cs <= i32::MAX as usize);
    assert_eq!(dst.len(), k * NR);
    let mut lanes = [0i32; 16];
    for (j, l) in lanes.iter_mut().enumerate() {
        *l = (j * cs) as i32;
    }
    // SAFETY: `lanes` is 16 i32 = 64 bytes, the size of the unaligned load.
    let idx = unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) };
    for (kk, d) in dst.chunks_exact_mut(NR).enumerate() {
        // SAFETY: lane j of the first gather reads src[off + kk + j * cs] and of
        // the second src[off + kk + (16 + j) * cs]; the largest index,
        // off + 31 * cs + kk < off + 31 * cs + k, is in bounds (asserted
        // above), and the i32 offsets do not overflow (31 * cs <= i32::MAX).
        // The stores write d[0..16] and d[16..32] of the 32-float row `d`.
        unsafe {
            let base = src.as_ptr().add(off + kk);
            let v0 = _mm512_i32gather_ps::<4>(idx, base);
            let v1 = _mm512_i32gather_ps::<4>(idx, base.add(16 * cs));
            _mm512_storeu_ps(d.as_mut_ptr(), v0);
            _mm512_storeu_ps(d.as_mut_ptr().add(16), v1);
        }
    }
}

/// Packs one panel of `ncols` (1..=16) columns of a column-major right-hand
/// side (`rs == 1`): for each `kk`, one gather of the lanes `j < ncols` reads
/// `src[off + j * cs + kk]` (the other lanes zero) and one 32-float row of
/// `dst` is stored, its upper 16 floats zero. Pure data movement, as the
/// scalar path.
///
/// Panics unless `1 <= ncols <= 16`, `off + (ncols - 1) * cs + k <= src.len()`,
/// `(ncols - 1) * cs <= i32::MAX` and `dst.len() == k * NR`.
#[target_feature(enable = "avx512f")]
fn pack_cols_half_avx512(
    dst: &mut [f32],
    src: &[f32],
    off: usize,
    cs: usize,
    k: usize,
    ncols: usize,
) {
    assert!((1..=16).contains(&ncols));
    assert!(off + (ncols - 1) * cs + k <= src.len() && (ncols - 1) * cs <= i32::MAX as usize);
    assert_eq!(dst.len(), k * NR);
    let mut lanes = [0i32; 16];
    for (j, l) in lanes.iter_mut().enumerate().take(ncols) {
        *l = (j * cs) as i32;
    }
    let mask: __mmask16 = if ncols == 16 { !0 } else { (1 << ncols) - 1 };
    // SAFETY: `lanes` is 16 i32 = 64 bytes, the size of the unaligned load.
    let idx = unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) };
    let zero = _mm512_setzero_ps();
    for (kk, d) in dst.chunks_exact_mut(NR).enumerate() {
        // SAFETY: the enabled lanes j < ncols read src[off + kk + j * cs], at
        // most off + (ncols - 1) * cs + kk < off + (ncols - 1) * cs + k <=
        // src.len() (asserted), with i32 offsets that do not overflow; masked
        // lanes are not read. The stores write d[0..16] and d[16..32] of the
        // 32-float row `d`.
        unsafe {
            let base = src.as_ptr().add(off + kk);
            let v = _mm512_mask_i32gather_ps::<4>(zero, mask, idx, base);
            _mm512_storeu_ps(d.as_mut_ptr(), v);
            _mm512_storeu_ps(d.as_mut_ptr().add(16), zero);
        }
    }
}

/// What the portable left-hand packer does, for an AVX-512 tile of `R` row-major
/// rows, `R` a multiple of 4: `panel[kk * R + i] = r[i][kk]` for `kk < kc`. Each block of 16 columns
/// is transposed in registers: the rows in groups of 4 go through a 4 x 4
/// transpose inside every 128-bit lane (`unpack` of singles, then of
/// doubles), and lane `l` of result `t` is the 4 floats of group `g` at
/// column `4l + t` of the block, stored where that column's `R` floats go.
///
/// Panics unless `R % 4 == 0`, `panel` holds `kc * R` floats and every row `kc` floats.
#[target_feature(enable = "avx512f")]
fn pack_a_avx512<const R: usize>(panel: &mut [f32], r: &[&[f32]; R], kc: usize) {
    assert!(R.is_multiple_of(4));
    assert_eq!(panel.len(), kc * R);
    assert!(r.iter().all(|row| row.len() >= kc));
    let full = kc / 16 * 16;
    let out = panel.as_mut_ptr();
    for c0 in (0..full).step_by(16) {
        for g in 0..R / 4 {
            // SAFETY: c0 + 16 <= full <= kc <= r[i].len() (asserted), so each
            // load reads 16 floats inside row 4g + i. Every store writes 4
            // floats at `(c0 + 4l + t) * R + 4g`, whose last index is below
            // `(c0 + 15) * R + R <= kc * R = panel.len()` (asserted).
            unsafe {
                let x0 = _mm512_loadu_ps(r[4 * g].as_ptr().add(c0));
                let x1 = _mm512_loadu_ps(r[4 * g + 1].as_ptr().add(c0));
                let x2 = _mm512_loadu_ps(r[4 * g + 2].as_ptr().add(c0));
                let x3 = _mm512_loadu_ps(r[4 * g + 3].as_ptr().add(c0));
                // Per lane: t0 = a0 b0 a1 b1, t1 = a2 b2 a3 b3, t2 = c0 d0 c1 d1,
                // t3 = c2 d2 c3 d3.
                let t0 = _mm512_castps_pd(_mm512_unpacklo_ps(x0, x1));
                let t1 = _mm512_castps_pd(_mm512_unpackhi_ps(x0, x1));
                let t2 = _mm512_castps_pd(_mm512_unpacklo_ps(x2, x3));
                let t3 = _mm512_castps_pd(_mm512_unpackhi_ps(x2, x3));
                // o[t] per lane = a_t b_t c_t d_t.
                let o = [
                    _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2)),
                    _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2)),
                    _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3)),
                    _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3)),
                ];
                for (t, &v) in o.iter().enumerate() {
                    let at = |l: usize| out.add((c0 + 4 * l + t) * R + 4 * g);
                    _mm_storeu_ps(at(0), _mm512_castps512_ps128(v));
                    _mm_storeu_ps(at(1), _mm512_extractf32x4_ps::<1>(v));
                    _mm_storeu_ps(at(2), _mm512_extractf32x4_ps::<2>(v));
                    _mm_storeu_ps(at(3), _mm512_extractf32x4_ps::<3>(v));
                }
            }
        }
    }
    for (kk, d) in (full..kc).zip(panel[full * R..].chunks_exact_mut(R)) {
        for (x, row) in d.iter_mut().zip(r) {
            *x = row[kk];
        }
    }
}
