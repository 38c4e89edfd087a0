//! Packed, cache-blocked single-precision GEMM: `C[m, n] (+)= A[m, k] · B[k, n]`.
//!
//! # Files, by role
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the [`MicroKernel`] trait, the [`Tile`] a kernel call works on, and these docs |
//! | `params.rs` | the blocking constants ([`NR`], `KC`, `MC`, `NC`), the blocking sized from the detected caches (`Blocking`, `CacheSizes`) and the cuts into depth blocks and row tiles |
//! | `pack.rs` | the right-hand-side packers ([`pack_b_panel`], [`pack_b_rows`]) and the left-hand block packer |
//! | `driver.rs` | the operands ([`LhsRows`], [`Rhs`], [`GemmArgs`]), the loop nest ([`gemm`]; [`gemm_ldc_packed_lhs`] into a column block of a wider `C` with the left-hand side packed once by [`pack_lhs`]) and the choice of kernel by vector level |
//! | `avx512.rs`, `avx2.rs`, `portable.rs` | one micro-kernel type each |
//!
//! A micro-kernel type exists per instruction set: `Avx512` (`12 x 32` tiles,
//! accumulated in registers straight from and into `C`), `Avx2` (`6 x 32`, as two
//! `6 x 16` halves in 15 of the 16 YMM registers, straight from and into `C` for
//! full tiles) and `Portable` (`4 x 32`, `f32::mul_add`, any CPU). The
//! instruction-set types have a private field and one constructor
//! ([`MicroKernel::detect`]) that asks the CPU: a value of `Avx512` is a proof that the CPU has avx512f,
//! and the `SAFETY` comments of the calls into `target_feature` code rely on
//! that proof, not on where the value came from. The driver is generic over the
//! kernel ([`MicroKernel::MR`] sets the row tiles and the packed panel height);
//! [`gemm`] picks the kernel of [`GemmArgs::level`], the crate's one vector-level
//! enum ([`SimdLevel`]), so `FUCINA_SIMD` and `force_simd_level` choose the
//! GEMM's kernel as they choose every other kernel's loops.
//!
//! # Structure of a product
//! - The right-hand side is packed once per call (or once per process, through the
//!   context's right-hand-side cache) into column panels of [`NR`] columns: panel
//!   `p` holds `B[0..k, p*NR..p*NR+NR]` k-major (`NR` consecutive floats per k),
//!   zero-padded past `n`. [`pack_b_panel`] reads `B` through arbitrary strides, so a
//!   transposed view packs without being materialized; [`pack_b_rows`] packs a
//!   row-major run of panels reading each source row front to back. With the
//!   AVX-512 kernel a row-major right-hand side of whole panels is instead read in
//!   place ([`Rhs::Rows`], [`direct_rhs_ok`]): the loop below streams it from L2
//!   either way, so the copy buys nothing but conflict-free cache sets (kept for
//!   row strides that are multiples of 4 KiB).
//! - The left-hand side is packed per `MC x KC` block into row panels, one per
//!   row tile of the kernel's height, again through arbitrary strides (one offset
//!   per row); row-major panels of 4, 8 or 12 rows (AVX-512 kernel) and of 6
//!   rows (AVX2 kernel) are packed with in-register transposes.
//! - [`gemm`] loops `MC` row blocks, `KC` depth blocks (packing the row
//!   block at that depth once) and `NC` column blocks (the kernel's
//!   [`MicroKernel::blocking`]: these constants for the AVX-512 and portable
//!   kernels; for the AVX2 kernel, sizes derived from the L1d and L2 sizes the
//!   CPU reports, so Zen's 512 KiB and 1 MiB L2 and Intel's 1.25–2 MiB each get
//!   their own); inside a column block,
//!   row-tile-major: each packed left-hand micro-panel (`12 x KC`, 24 KiB, with
//!   the AVX-512 kernel) is reused while the block's right-hand-side panels
//!   stream past it from L2, one register-blocked micro-kernel call per tile
//!   (with the AVX-512 and AVX2 kernels, the next tile's `C` rows prefetched during the
//!   call).
//!
//! # Numerics and determinism
//! Every output element is one fused multiply-add chain over `k` in increasing
//! order, started from `+0.0` (or from the value already in `C` when the caller
//! asks to accumulate, e.g. a bias): `c = fma(a[i,0], b[0,j], c)`, then `k = 1`,
//! and so on. Depth blocks continue the chain (the accumulator tile is reloaded from
//! `C`), so the result does not depend on `KC`, `MC`, `NC`, the micro-tile shape,
//! the kernel, the row chunking of a parallel run or the number of other
//! rows: it equals the plain scalar loop `c = c.mul_add(a, b)`, bit for bit, with
//! every kernel. The portable kernel uses `f32::mul_add`, which is exactly
//! rounded everywhere (a library call on CPUs without FMA: slow, but identical).
//! (Identical for finite values under the default float environment; NaN payloads
//! and flush-to-zero modes are not part of the promise.)

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod driver;
mod pack;
mod params;
mod portable;

pub(crate) use driver::{
    GemmArgs, LhsRows, Rhs, direct_rhs_ok, gemm, gemm_ldc, gemm_ldc_packed_lhs, pack_lhs,
    packed_lhs_len,
};
pub(crate) use pack::{a_scratch_len, pack_b_panel, pack_b_rows, packed_b_len};
pub(crate) use params::NR;

use crate::kernels::simd::SimdLevel;
use params::{Blocking, MR_MAX, StackTile};

/// A register-blocked micro-kernel: computes one `rows x ncols` tile of `C`
/// (`rows <= MR`, `ncols <= NR`) from a packed left-hand micro-panel and `kc`
/// rows of a right-hand-side panel, as the fused multiply-add chain of the
/// module docs. One implementing type per instruction set; a value of an
/// instruction-set type proves the CPU has that set (see the module docs).
pub(crate) trait MicroKernel: Copy {
    /// Rows of a micro-tile: the height of a packed left-hand micro-panel and
    /// of a row tile (at most 12, the widest left-hand packer).
    const MR: usize;
    /// Columns of a micro-tile: the width of a packed right-hand-side panel
    /// (every kernel uses [`NR`], the packed layout).
    const NR: usize;
    /// The vector level whose kernel this is.
    const LEVEL: SimdLevel;
    /// Whether the kernel reads a row-major right-hand side in place
    /// ([`Rhs::Rows`], any row stride `ldb >= NR`); otherwise `ldb == NR`
    /// (packed panels) always.
    const READS_RHS_IN_PLACE: bool = false;
    /// Whether the driver should prefetch the next tile's `C` rows before each
    /// call (kernels that read and write `C` in place).
    const PREFETCHES_C: bool = false;

    /// The kernel, when the CPU has its instructions (asked of the CPU on every
    /// call, a cached feature test). For an instruction-set kernel this is the
    /// only way to make a value, so a value proves the CPU has the set.
    fn detect() -> Option<Self>;

    /// The kernel of vector level `level`: `Some` when `level` is
    /// [`Self::LEVEL`] and the CPU has the instructions.
    #[inline]
    fn for_level(level: SimdLevel) -> Option<Self> {
        if level == Self::LEVEL {
            Self::detect()
        } else {
            None
        }
    }

    /// Packs one left-hand micro-panel of `rows.len()` (1..=`MR`) row-major rows:
    /// `panel[kk * R + i] = src[rows[i] + p0 + kk]` for `kk < kc`, `R =
    /// rows.len()`. Pure data movement; the portable packer unless the kernel
    /// has a faster one.
    #[inline]
    fn pack_a_panel(self, panel: &mut [f32], src: &[f32], rows: &[usize], p0: usize, kc: usize) {
        pack::pack_a_panel_rows(panel, src, rows, p0, kc);
    }

    /// The blocking of the driver's loop nest for this kernel (fixed for the
    /// life of the process); the constants unless the kernel sizes its blocks
    /// from the caches.
    #[inline]
    fn blocking(self) -> Blocking {
        Blocking::FIXED
    }

    /// Runs the kernel on one tile.
    fn tile(self, tile: Tile<'_>);
}

/// One micro-kernel call: `C_tile (+)= A_panel · B_panel` over depth `kc`.
pub(crate) struct Tile<'a> {
    /// Rows of the tile, `1..=MR`.
    pub(crate) rows: usize,
    /// Depth of the call.
    pub(crate) kc: usize,
    /// The packed left-hand micro-panel: `a[kk * rows + i]`, `kc * rows` floats.
    pub(crate) a: &'a [f32],
    /// The right-hand side: row `kk` is `b[kk * ldb..][..NR]`.
    pub(crate) b: &'a [f32],
    /// Row stride of `b` (`NR` for a packed panel).
    pub(crate) ldb: usize,
    /// The tile's `C`, from its top-left element: row `i` is `c[i * ldc..][..ncols]`
    /// (`(rows - 1) * ldc + ncols` floats).
    pub(crate) c: &'a mut [f32],
    /// Row stride of `C`.
    pub(crate) ldc: usize,
    /// Columns of the tile, `1..=NR` (the packed panel is zero past them).
    pub(crate) ncols: usize,
    /// Start the chains from `+0.0` (the first depth block of a product that
    /// does not accumulate) instead of from the values in `C`.
    pub(crate) first: bool,
}

impl Tile<'_> {
    /// Runs `micro(rows, a, b, tile)` on a stack copy of the tile's `C` rows
    /// (zeros when `first`) and copies the result back: for kernels whose loads
    /// and stores need whole `NR`-float rows. `micro` reads `b` as packed panel
    /// rows of `NR` floats.
    #[inline(always)]
    fn through_stack(self, micro: impl FnOnce(usize, &[f32], &[f32], &mut StackTile)) {
        assert!(
            self.rows <= MR_MAX && self.ldb == NR,
            "a stack-tile kernel takes packed panels and at most {MR_MAX} rows"
        );
        let mut tile: StackTile = [[0.0; NR]; MR_MAX];
        if !self.first {
            for (r, t) in tile[..self.rows].iter_mut().enumerate() {
                t[..self.ncols].copy_from_slice(&self.c[r * self.ldc..][..self.ncols]);
            }
        }
        micro(self.rows, self.a, self.b, &mut tile);
        for (r, t) in tile[..self.rows].iter().enumerate() {
            self.c[r * self.ldc..][..self.ncols].copy_from_slice(&t[..self.ncols]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether two results hold the same bits.
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// Every vector level this CPU can run.
    fn supported_levels() -> Vec<SimdLevel> {
        SimdLevel::available().collect()
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    /// Row-major `A (m x k)` times `B` given through `(rs, cs)` strides, by every
    /// path, against the scalar fma chain.
    fn check(m: usize, k: usize, n: usize, b_transposed: bool) {
        let mut s = 7 + (m * 31 + k * 17 + n) as u64;
        let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| lcg(&mut s)).collect();
        let (rs, cs) = if b_transposed { (1, k) } else { (n, 1) };
        let mut want = vec![0.0f32; m * n];
        let mut want_acc = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f32;
                for kk in 0..k {
                    acc = a[i * k + kk].mul_add(b[kk * rs + j * cs], acc);
                }
                want[i * n + j] = acc;
                let mut acc = 1.5f32;
                for kk in 0..k {
                    acc = a[i * k + kk].mul_add(b[kk * rs + j * cs], acc);
                }
                want_acc[i * n + j] = acc;
            }
        }
        let np = n.div_ceil(NR);
        let mut packed = vec![0.0f32; packed_b_len(k, n).unwrap()];
        for (p, d) in packed.chunks_exact_mut(k * NR).enumerate() {
            pack_b_panel(d, &b, p * NR * cs, rs, cs, k, NR.min(n - p * NR));
        }
        assert_eq!(packed.len(), np * k * NR);
        let mut scratch = vec![0.0f32; a_scratch_len(m)];
        let lhs = LhsRows {
            data: &a,
            row_off: |i| i * k,
            cs: 1,
        };
        for level in supported_levels() {
            let mut c = vec![f32::NAN; m * n];
            let args = GemmArgs {
                level,
                lhs: &lhs,
                m,
                k,
                n,
                rhs: Rhs::Packed(&packed),
                accumulate: false,
            };
            gemm(&args, &mut c, &mut scratch);
            let same = same_bits(&c, &want);
            assert!(
                same,
                "{level:?} m={m} k={k} n={n} differs from the fma chain"
            );
            // The right-hand side read in place (row-major, whole panels only).
            if !b_transposed && driver::direct_rhs_supported(level, n) {
                let mut c = vec![f32::NAN; m * n];
                let rhs = Rhs::Rows {
                    data: &b,
                    off: 0,
                    rs: n,
                };
                gemm(&GemmArgs { rhs, ..args }, &mut c, &mut scratch);
                let same = same_bits(&c, &want);
                assert!(
                    same,
                    "{level:?} in place m={m} k={k} n={n} differs from the fma chain"
                );
            }
            // The left-hand side read transposed (column-major: consecutive
            // rows, column stride `m`), as a convolution's `W_gᵀ` is.
            let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
            let lhs_t = LhsRows {
                data: &at,
                row_off: |i| i,
                cs: m,
            };
            let mut c = vec![f32::NAN; m * n];
            let args_t = GemmArgs {
                level,
                lhs: &lhs_t,
                m,
                k,
                n,
                rhs: Rhs::Packed(&packed),
                accumulate: false,
            };
            gemm(&args_t, &mut c, &mut scratch);
            let same = same_bits(&c, &want);
            assert!(
                same,
                "{level:?} transposed lhs m={m} k={k} n={n} differs from the fma chain"
            );
            // Accumulating onto `C` continues the chain from the values there.
            let mut c = vec![1.5f32; m * n];
            let acc = GemmArgs {
                level,
                lhs: &lhs,
                m,
                k,
                n,
                rhs: Rhs::Packed(&packed),
                accumulate: true,
            };
            gemm(&acc, &mut c, &mut scratch);
            let same = same_bits(&c, &want_acc);
            assert!(
                same,
                "{level:?} accumulate m={m} k={k} n={n} differs from the fma chain"
            );
        }
    }

    #[test]
    fn every_path_equals_the_scalar_fma_chain_bitwise() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 5, 7),
            (9, 300, 33),
            (17, 257, 65),
            (130, 520, 40),
            (8, 1, 1030),
            (50, 700, 64),
            (13, 1100, 96),
            (64, 3, 32),
            (270, 600, 544),
            (4, 40, 64),
        ] {
            check(m, k, n, false);
            check(m, k, n, true);
        }
    }

    /// `gemm_ldc` into a column block of a wider `C` gives `gemm`'s bits there
    /// and leaves the other columns alone, at every level.
    #[test]
    fn gemm_ldc_writes_only_its_column_block_with_gemms_bits() {
        for &(m, k, n, ldc, j0) in &[
            (5, 7, 9, 20, 3),
            (30, 600, 70, 100, 30),
            (13, 33, 32, 32, 0),
        ] {
            let mut s = 11 + (m * k + n) as u64;
            let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            let b: Vec<f32> = (0..k * n).map(|_| lcg(&mut s)).collect();
            let mut packed = vec![0.0f32; packed_b_len(k, n).unwrap()];
            pack_b_rows(&mut packed, &b, 0, n, k, n);
            let lhs = LhsRows {
                data: &a,
                row_off: |i| i * k,
                cs: 1,
            };
            let mut scratch = vec![0.0f32; a_scratch_len(m)];
            for level in supported_levels() {
                let args = GemmArgs {
                    level,
                    lhs: &lhs,
                    m,
                    k,
                    n,
                    rhs: Rhs::Packed(&packed),
                    accumulate: false,
                };
                let mut want = vec![0.0f32; m * n];
                gemm(&args, &mut want, &mut scratch);
                let mut wide = vec![7.0f32; m * ldc];
                gemm_ldc(&args, &mut wide[j0..], ldc, &mut scratch);
                for i in 0..m {
                    for j in 0..ldc {
                        let got = wide[i * ldc + j];
                        if (j0..j0 + n).contains(&j) {
                            assert_eq!(got.to_bits(), want[i * n + j - j0].to_bits(), "{level:?}");
                        } else {
                            assert_eq!(got, 7.0, "{level:?}: column {j} outside the block");
                        }
                    }
                }
            }
        }
    }

    /// A left-hand side packed once by `pack_lhs` (row-major and column-major,
    /// several row and depth blocks) gives `gemm_ldc`'s bits, at every level.
    #[test]
    fn prepacked_lhs_gives_gemm_ldcs_bits() {
        for &(m, k, n, ldc, transposed) in &[
            (5, 7, 9, 20, false),
            (300, 600, 70, 100, false),
            (288, 64, 96, 96, true),
            (13, 1100, 32, 40, true),
        ] {
            let mut s = 5 + (m * k + n) as u64;
            let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            let b: Vec<f32> = (0..k * n).map(|_| lcg(&mut s)).collect();
            let mut packed = vec![0.0f32; packed_b_len(k, n).unwrap()];
            pack_b_rows(&mut packed, &b, 0, n, k, n);
            let lhs = LhsRows {
                data: &a,
                row_off: |i| if transposed { i } else { i * k },
                cs: if transposed { m } else { 1 },
            };
            let mut scratch = vec![0.0f32; a_scratch_len(m)];
            let mut pre = vec![f32::NAN; packed_lhs_len(m, k)];
            for level in supported_levels() {
                let args = GemmArgs {
                    level,
                    lhs: &lhs,
                    m,
                    k,
                    n,
                    rhs: Rhs::Packed(&packed),
                    accumulate: false,
                };
                let mut want = vec![7.0f32; m * ldc];
                gemm_ldc(&args, &mut want, ldc, &mut scratch);
                pack_lhs(level, &lhs, m, k, &mut pre);
                let mut got = vec![7.0f32; m * ldc];
                gemm_ldc_packed_lhs(&args, &pre, &mut got, ldc);
                let same = same_bits(&got, &want);
                assert!(same, "{level:?} m={m} k={k} n={n} transposed={transposed}");
            }
        }
    }

    #[test]
    fn kernels_have_their_tile_shapes_and_levels() {
        assert_eq!((portable::Portable::MR, portable::Portable::NR), (4, NR));
        assert_eq!(portable::Portable::LEVEL, SimdLevel::Portable);
        assert!(portable::Portable::detect().is_some());
        let flags = |rhs: bool, pf: bool| (rhs, pf);
        assert_eq!(
            flags(
                portable::Portable::READS_RHS_IN_PLACE,
                portable::Portable::PREFETCHES_C
            ),
            (false, false)
        );
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!((avx2::Avx2::MR, avx2::Avx2::NR), (6, NR));
            assert_eq!(avx2::Avx2::LEVEL, SimdLevel::Avx2);
            assert_eq!(
                flags(avx2::Avx2::READS_RHS_IN_PLACE, avx2::Avx2::PREFETCHES_C),
                (false, true)
            );
            assert_eq!((avx512::Avx512::MR, avx512::Avx512::NR), (12, NR));
            assert_eq!(avx512::Avx512::LEVEL, SimdLevel::Avx512);
            assert_eq!(
                flags(
                    avx512::Avx512::READS_RHS_IN_PLACE,
                    avx512::Avx512::PREFETCHES_C
                ),
                (true, true)
            );
        }
    }

    /// An instruction-set kernel value exists exactly when the CPU has the
    /// instructions, and the kernel of a level only for that level.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_kernel_value_exists_only_on_a_cpu_with_its_instructions() {
        use std::arch::is_x86_feature_detected as has;
        assert_eq!(avx512::Avx512::detect().is_some(), has!("avx512f"));
        assert_eq!(avx2::Avx2::detect().is_some(), has!("avx2") && has!("fma"));
        for level in SimdLevel::ALL {
            let supported = level.is_supported();
            assert_eq!(
                avx512::Avx512::for_level(level).is_some(),
                level == SimdLevel::Avx512 && supported,
                "{level:?}"
            );
            assert_eq!(
                avx2::Avx2::for_level(level).is_some(),
                level == SimdLevel::Avx2 && supported,
                "{level:?}"
            );
            // Only the AVX-512 kernel reads a right-hand side in place.
            assert_eq!(
                direct_rhs_ok(level, 64, 256, 300),
                level == SimdLevel::Avx512 && supported,
                "{level:?}"
            );
        }
    }

    /// The in-place right-hand side is refused (a panic naming the contract, not
    /// a wrong read) by a kernel that cannot read it.
    #[test]
    #[should_panic(expected = "an in-place right-hand side needs the AVX-512 kernel")]
    fn an_in_place_rhs_on_the_portable_kernel_panics() {
        let (m, k, n) = (2, 3, NR);
        let a = vec![1.0f32; m * k];
        let b = vec![1.0f32; k * n];
        let lhs = LhsRows {
            data: &a,
            row_off: |i| i * k,
            cs: 1,
        };
        let args = GemmArgs {
            level: SimdLevel::Portable,
            lhs: &lhs,
            m,
            k,
            n,
            rhs: Rhs::Rows {
                data: &b,
                off: 0,
                rs: n,
            },
            accumulate: false,
        };
        let mut c = vec![0.0f32; m * n];
        gemm(&args, &mut c, &mut vec![0.0; a_scratch_len(m)]);
    }
}
