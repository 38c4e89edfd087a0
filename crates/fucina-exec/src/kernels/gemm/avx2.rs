//! The x86-64 AVX2 + FMA micro-kernel: `3 x 32` tiles, four 8-lane accumulators
//! per row, through a stack tile. `_mm256_fmadd_ps` is the same fused,
//! once-rounded `a * b + c` as `f32::mul_add`, so it computes what the portable
//! kernel computes, with a fixed register layout (the portable body is left to
//! the auto-vectorizer, which for some tile heights picks gathers).

use std::arch::x86_64::*;

use super::params::{MR_MAX, NR, StackTile};
use super::{MicroKernel, Tile};
use crate::kernels::simd::SimdLevel;

/// The AVX2 + FMA kernel. A value is a proof that the CPU has AVX2 and FMA: the
/// only constructor, `detect` (of [`MicroKernel`]), asks the CPU, and the private field keeps
/// every other module from making one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2 {
    _proof: (),
}

impl MicroKernel for Avx2 {
    const MR: usize = 3;
    const NR: usize = NR;
    const LEVEL: SimdLevel = SimdLevel::Avx2;

    /// The kernel, when the CPU has AVX2 and FMA.
    #[inline]
    fn detect() -> Option<Avx2> {
        use crate::kernels::simd::CpuFeatures;
        CpuFeatures::detected()
            .has(CpuFeatures::LEVEL_AVX2)
            .then_some(Avx2 { _proof: () })
    }

    #[inline]
    fn tile(self, tile: Tile<'_>) {
        tile.through_stack(|rows, a, b, t| {
            // SAFETY: `self` is an `Avx2`, which exists only when the CPU has
            // avx2 and fma (`MicroKernel::detect`), the features `micro_avx2` enables.
            unsafe { micro_avx2(rows, a, b, t) }
        });
    }
}

const _: () = assert!(Avx2::MR <= MR_MAX);

/// Dispatches on the tile height `rows` (1..=[`Avx2::MR`]).
#[target_feature(enable = "avx2,fma")]
fn micro_avx2(rows: usize, a: &[f32], b: &[f32], tile: &mut StackTile) {
    match rows {
        1 => tile_avx2::<1>(a, b, tile),
        2 => tile_avx2::<2>(a, b, tile),
        3 => tile_avx2::<3>(a, b, tile),
        _ => unreachable!("AVX2 micro-tile height {rows} is not in 1..=3"),
    }
}

/// The `R x 32` tile with four 8-lane accumulators per row:
/// `tile[i][j] = fma(a[kk*R+i], b[kk*NR+j], tile[i][j])` for `kk` in increasing order.
#[target_feature(enable = "avx2,fma")]
fn tile_avx2<const R: usize>(a: &[f32], b: &[f32], tile: &mut StackTile) {
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    for (acc, t) in acc.iter_mut().zip(tile.iter()) {
        for (q, x) in acc.iter_mut().enumerate() {
            // SAFETY: `t` holds NR = 32 floats and q < 4: reads t[8q..8q + 8].
            *x = unsafe { _mm256_loadu_ps(t.as_ptr().add(8 * q)) };
        }
    }
    for (av, bv) in a.chunks_exact(R).zip(b.chunks_exact(NR)) {
        let mut bq = [_mm256_setzero_ps(); 4];
        for (q, x) in bq.iter_mut().enumerate() {
            // SAFETY: `bv` holds NR = 32 floats and q < 4: reads bv[8q..8q + 8].
            *x = unsafe { _mm256_loadu_ps(bv.as_ptr().add(8 * q)) };
        }
        for (acc, &ai) in acc.iter_mut().zip(av) {
            let ai = _mm256_set1_ps(ai);
            for (x, &bx) in acc.iter_mut().zip(&bq) {
                *x = _mm256_fmadd_ps(ai, bx, *x);
            }
        }
    }
    for (acc, t) in acc.iter().zip(tile.iter_mut()) {
        for (q, &x) in acc.iter().enumerate() {
            // SAFETY: `t` holds NR = 32 floats and q < 4: writes t[8q..8q + 8].
            unsafe { _mm256_storeu_ps(t.as_mut_ptr().add(8 * q), x) };
        }
    }
}
