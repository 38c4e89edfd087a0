//! The x86-64 AVX2 + FMA micro-kernel: `6 x 32` tiles, each run as two `6 x 16`
//! halves over the same packed left-hand panel. A half keeps its 12 accumulators
//! (6 rows x two 8-lane vectors), its two right-hand-side vectors and one
//! broadcast in 15 of the 16 YMM registers, so nothing spills; per depth step it
//! issues 12 fused multiply-adds against 2 vector loads and 6 broadcasts. Full
//! tiles (32 columns) read and write `C` in place; a narrower tile goes through
//! a stack tile. `_mm256_fmadd_ps` is the same fused, once-rounded `a * b + c`
//! as `f32::mul_add`, so it computes what the portable kernel computes.
//!
//! Its blocking ([`Blocking::detected_avx2`]) comes from the cache sizes the CPU
//! reports, not from constants. Its full `6`-row left-hand panels are packed by
//! [`pack_a6_avx2`] (8 x 8 transposes in registers), the same floats as the
//! portable packer.

use std::arch::x86_64::*;

use super::params::{Blocking, MR_MAX, NR};
use super::{MicroKernel, Tile};
use crate::kernels::simd::SimdLevel;

/// The AVX2 + FMA kernel. A value is a proof that the CPU has AVX2 and FMA: the
/// only constructor, `detect` (of [`MicroKernel`]), asks the CPU, and the private field keeps
/// every other module from making one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2 {
    _proof: (),
}

/// Micro-tile height of the AVX2 kernel: 12 accumulators, two right-hand-side
/// vectors and a broadcast fit the 16 registers.
const MR_AVX2: usize = 6;

/// Columns of one half of a tile: two 8-lane vectors.
const HALF: usize = NR / 2;

impl MicroKernel for Avx2 {
    const MR: usize = MR_AVX2;
    const NR: usize = NR;
    const LEVEL: SimdLevel = SimdLevel::Avx2;
    const PREFETCHES_C: bool = true;

    /// The kernel, when the CPU has AVX2 and FMA.
    #[inline]
    fn detect() -> Option<Avx2> {
        use crate::kernels::simd::CpuFeatures;
        CpuFeatures::detected()
            .has(CpuFeatures::LEVEL_AVX2)
            .then_some(Avx2 { _proof: () })
    }

    #[inline]
    fn blocking(self) -> Blocking {
        Blocking::detected_avx2()
    }

    /// Full `6`-row panels through [`pack_a6_avx2`] (8 x 8 in-register
    /// transposes); other heights through the portable packer. The same floats.
    #[inline]
    fn pack_a_panel(self, panel: &mut [f32], src: &[f32], rows: &[usize], p0: usize, kc: usize) {
        if let [r0, r1, r2, r3, r4, r5] = *rows {
            let r = [r0, r1, r2, r3, r4, r5].map(|o| &src[o + p0..][..kc]);
            // SAFETY: `self` is an `Avx2`, which exists only when the CPU has
            // avx2 and fma (`MicroKernel::detect`), the features `pack_a6_avx2`
            // enables; it checks its own bounds.
            unsafe { pack_a6_avx2(panel, &r) };
        } else {
            super::pack::pack_a_panel_rows(panel, src, rows, p0, kc);
        }
    }

    #[inline]
    fn tile(self, t: Tile<'_>) {
        if t.ncols == NR && t.ldb == NR {
            // SAFETY: `self` is an `Avx2`, which exists only when the CPU has
            // avx2 and fma (`MicroKernel::detect`), the features
            // `tile_direct_avx2` needs; it checks the tile's bounds itself.
            unsafe { tile_direct_avx2(t.rows, t.kc, t.a, t.b, t.c, t.ldc, t.first) };
        } else {
            t.through_stack(|rows, a, b, tile| {
                let kc = a.len() / rows;
                // SAFETY: as above; the stack tile holds `rows <= MR_MAX` rows
                // of NR floats, NR apart, and starts from the tile's `C` (or
                // zeros), so the kernel continues the chains from it.
                unsafe { tile_direct_avx2(rows, kc, a, b, tile.as_flattened_mut(), NR, false) };
            });
        }
    }
}

const _: () = assert!(Avx2::MR <= MR_MAX && NR == 2 * HALF);

/// Runs [`kernel_avx2`] on both halves of a `rows x 32` tile (`rows` in
/// 1..=[`MR_AVX2`]): `a` holds `kc * rows` packed floats, right-hand-side row
/// `kk` is `b[kk * NR..][..NR]`, and `c` starts at the tile's top-left element
/// of a row-major `C` with row stride `ldc`, all 32 columns of every row
/// written. Panics unless the slices hold those floats.
///
/// # Safety
/// avx2 and fma are available (the caller holds an [`Avx2`]).
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_direct_avx2(
    rows: usize,
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    first: bool,
) {
    assert!((1..=MR_AVX2).contains(&rows));
    assert!(a.len() >= kc * rows && b.len() >= kc * NR);
    assert!(c.len() >= (rows - 1) * ldc + NR);
    let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    macro_rules! go {
        ($($r:literal)*) => {
            match rows {
                $($r => {
                    for h in 0..2 {
                        // SAFETY: avx2 and fma are available (the caller's
                        // contract); the asserts above give the bounds
                        // `kernel_avx2` needs for R = rows, with `b` and `c`
                        // moved to the half's first column (h * 16 + 16 <= NR).
                        unsafe {
                            kernel_avx2::<$r>(kc, ap, bp.add(h * HALF), cp.add(h * HALF), ldc, first)
                        }
                    }
                },)*
                _ => unreachable!("AVX2 micro-tile height {rows}"),
            }
        };
    }
    go!(1 2 3 4 5 6);
}

/// Packs one `6`-row left-hand micro-panel: `panel[kk * 6 + i] = rows[i][kk]`
/// for `kk < kc`, `kc = rows[0].len()`, as the portable packer does. Blocks of
/// 8 depth steps are loaded as 6 row vectors (two zero rows beside them),
/// transposed in registers, and each transposed column's 8 floats stored at
/// `kk * 6`: its two trailing floats land on the next column's first two,
/// which the next store (or the scalar tail) overwrites, except after the
/// panel's last column, whose store is masked to 6 floats. The depth steps
/// past the last whole block of 8 are copied one by one. Panics unless every
/// row holds `kc` floats and `panel` at least `6 * kc`.
///
/// # Safety
/// avx2 is available (the caller holds an [`Avx2`]).
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_a6_avx2(panel: &mut [f32], rows: &[&[f32]; 6]) {
    let kc = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == kc) && panel.len() >= 6 * kc);
    let k8 = kc / 8 * 8;
    let d = panel.as_mut_ptr();
    // The store of the panel's last column keeps its first 6 lanes only.
    let six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    for k0 in (0..k8).step_by(8) {
        // SAFETY: `k0 + 8 <= kc`, so each row holds the 8 floats read; the
        // stores write floats `(k0 + j) * 6 .. (k0 + j) * 6 + 8`, below
        // `6 * kc <= panel.len()` for every column but the panel's last, whose
        // masked store writes 6 floats ending at `6 * kc`.
        unsafe {
            let v: [__m256; 6] = std::array::from_fn(|i| _mm256_loadu_ps(rows[i].as_ptr().add(k0)));
            let z = _mm256_setzero_ps();
            let t0 = _mm256_unpacklo_ps(v[0], v[1]);
            let t1 = _mm256_unpackhi_ps(v[0], v[1]);
            let t2 = _mm256_unpacklo_ps(v[2], v[3]);
            let t3 = _mm256_unpackhi_ps(v[2], v[3]);
            let t4 = _mm256_unpacklo_ps(v[4], v[5]);
            let t5 = _mm256_unpackhi_ps(v[4], v[5]);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, z);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, z);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, z);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, z);
            // Column j of the block: rows 0..6 of depth step k0 + j, two zeros.
            let cols = [
                _mm256_permute2f128_ps::<0x20>(s0, s4),
                _mm256_permute2f128_ps::<0x20>(s1, s5),
                _mm256_permute2f128_ps::<0x20>(s2, s6),
                _mm256_permute2f128_ps::<0x20>(s3, s7),
                _mm256_permute2f128_ps::<0x31>(s0, s4),
                _mm256_permute2f128_ps::<0x31>(s1, s5),
                _mm256_permute2f128_ps::<0x31>(s2, s6),
                _mm256_permute2f128_ps::<0x31>(s3, s7),
            ];
            for (j, c) in cols.into_iter().enumerate() {
                let at = d.add((k0 + j) * 6);
                if k0 + j + 1 == kc {
                    _mm256_maskstore_ps(at, six, c);
                } else {
                    _mm256_storeu_ps(at, c);
                }
            }
        }
    }
    for kk in k8..kc {
        for (i, r) in rows.iter().enumerate() {
            panel[kk * 6 + i] = r[kk];
        }
    }
}

/// Software prefetch distance of the AVX2 kernel, in depth steps: the half-row
/// of the packed right-hand-side panel (one cache line) is requested this far
/// ahead of its load.
const PF_B: usize = 16;

/// The AVX2 `R x 16` micro-kernel on one half of a tile, reading and writing `C`
/// in place: 2R accumulators, started from zero (`first`) or from `C`, then for
/// `kk` in increasing order `acc[i][j] = fma(a[kk * R + i], b[kk * NR + j],
/// acc[i][j])`, stored back to the 16 columns of each of the `R` rows.
///
/// # Safety
/// avx2 and fma are available; `a` is valid for `kc * R` reads, `b + kk * NR`
/// for 16 reads for every `kk < kc`, and `c + i * ldc + j` for reads and writes
/// for `i < R`, `j < 16`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn kernel_avx2<const R: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    first: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    if !first {
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: row i < R, columns 0..16 of the half (the caller's bounds).
            unsafe {
                let row = c.add(i * ldc);
                acc[0] = _mm256_loadu_ps(row);
                acc[1] = _mm256_loadu_ps(row.add(8));
            }
        }
    }
    let (mut ap, mut bp) = (a, b);
    for _ in 0..kc {
        // SAFETY: fewer than kc steps were taken, so `bp` points at 16 readable
        // floats and `ap` at R readable floats (the caller's bounds); the
        // prefetch only hints the cache (no access, computed with
        // `wrapping_add`).
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(NR * PF_B).cast());
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (i, acc) in acc.iter_mut().enumerate() {
                let ai = _mm256_broadcast_ss(&*ap.add(i));
                acc[0] = _mm256_fmadd_ps(ai, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(ai, b1, acc[1]);
            }
            ap = ap.add(R);
            bp = bp.wrapping_add(NR);
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        // SAFETY: as for the loads above.
        unsafe {
            let row = c.add(i * ldc);
            _mm256_storeu_ps(row, acc[0]);
            _mm256_storeu_ps(row.add(8), acc[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 `6`-row packer writes the portable packer's floats (every depth
    /// around the blocks of 8, rows at scattered offsets) and nothing past the
    /// panel.
    #[test]
    fn the_six_row_packer_writes_the_portable_packers_floats() {
        let Some(kernel) = Avx2::detect() else {
            return;
        };
        let src: Vec<f32> = (0..4000).map(|i| i as f32 * 0.25 - 300.0).collect();
        let rows = [0, 517, 61, 1200, 2333, 3001];
        for kc in 1..=41 {
            for p0 in [0, 3] {
                let mut want = vec![f32::NAN; 6 * kc + 4];
                super::super::pack::pack_a_panel_rows(&mut want[..6 * kc], &src, &rows, p0, kc);
                let mut got = vec![f32::NAN; 6 * kc + 4];
                kernel.pack_a_panel(&mut got[..6 * kc], &src, &rows, p0, kc);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "kc {kc} p0 {p0}");
                assert!(
                    got[6 * kc..].iter().all(|x| x.is_nan()),
                    "kc {kc}: past the panel"
                );
            }
        }
    }
}
