//! The portable micro-kernel: plain Rust over `f32::mul_add`, left to the
//! auto-vectorizer, for any CPU (on x86-64 without AVX2 + FMA, or when the vector
//! level is lowered to `portable`). `f32::mul_add` is exactly rounded everywhere
//! (a library call on CPUs without FMA: slow, but the same bits).

use super::params::{MR_MAX, NR, StackTile};
use super::{MicroKernel, Tile};
use crate::kernels::simd::SimdLevel;

/// The portable kernel: `4 x 32` tiles through a stack tile. Needs no CPU
/// feature, so anyone may make one ([`Portable::new`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Portable {
    _private: (),
}

impl Portable {
    /// The portable kernel (runs on every CPU).
    pub(crate) fn new() -> Portable {
        Portable { _private: () }
    }
}

impl MicroKernel for Portable {
    const MR: usize = 4;
    const NR: usize = NR;
    const LEVEL: SimdLevel = SimdLevel::Portable;

    /// The portable kernel, on every CPU.
    #[inline]
    fn detect() -> Option<Portable> {
        Some(Portable::new())
    }

    #[inline]
    fn tile(self, tile: Tile<'_>) {
        tile.through_stack(micro_rows);
    }
}

const _: () = assert!(Portable::MR <= MR_MAX);

/// The portable `R x NR` micro-kernel body:
/// `tile[i][j] = fma(a[kk*R+i], b[kk*NR+j], tile[i][j])` for `kk` in increasing order.
#[inline(always)]
fn micro_body<const R: usize>(a: &[f32], b: &[f32], tile: &mut StackTile) {
    let mut acc = [[0.0f32; NR]; R];
    for (dst, src) in acc.iter_mut().zip(tile.iter()) {
        *dst = *src;
    }
    for (av, bv) in a.chunks_exact(R).zip(b.chunks_exact(NR)) {
        for (row, &ai) in acc.iter_mut().zip(av) {
            for (c, &bj) in row.iter_mut().zip(bv) {
                *c = ai.mul_add(bj, *c);
            }
        }
    }
    for (dst, src) in tile.iter_mut().zip(acc.iter()) {
        *dst = *src;
    }
}

/// Dispatches on the tile height `rows` (1..=[`Portable::MR`]) to a
/// monomorphized body.
fn micro_rows(rows: usize, a: &[f32], b: &[f32], tile: &mut StackTile) {
    match rows {
        1 => micro_body::<1>(a, b, tile),
        2 => micro_body::<2>(a, b, tile),
        3 => micro_body::<3>(a, b, tile),
        4 => micro_body::<4>(a, b, tile),
        _ => unreachable!("portable micro-tile height {rows} is not in 1..=4"),
    }
}
