//! Packed, cache-blocked single-precision GEMM: `C[m, n] (+)= A[m, k] · B[k, n]`.
//!
//! # Structure
//! - The right-hand side is packed once per call (or once per process, through the
//!   context's right-hand-side cache) into column panels of [`NR`] columns: panel
//!   `p` holds `B[0..k, p*NR..p*NR+NR]` k-major (`NR` consecutive floats per k),
//!   zero-padded past `n`. [`pack_b_panel`] reads `B` through arbitrary strides, so a
//!   transposed view packs without being materialized; [`pack_b_rows`] packs a
//!   row-major run of panels reading each source row front to back. On the
//!   AVX-512 path a row-major right-hand side of whole panels is instead read in
//!   place ([`Rhs::Rows`], [`direct_rhs_ok`]): the loop below streams it from L2
//!   either way, so the copy buys nothing but conflict-free cache sets (kept for
//!   row strides that are multiples of 4 KiB).
//! - The left-hand side is packed per `MC x KC` block into row panels, one per
//!   row tile ([`row_tiles`]), again through arbitrary strides (one offset per
//!   row).
//! - [`gemm_rows`] loops `MC` row blocks, `KC` depth blocks (packing the row
//!   block at that depth once) and `NC` column blocks; inside a column block,
//!   row-tile-major: each packed left-hand micro-panel (`12 x KC`, 24 KiB) is
//!   reused while the block's right-hand-side panels stream past it from L2,
//!   one register-blocked `12 x 32` micro-kernel call per tile (the next tile's
//!   `C` rows prefetched during the call).
//!
//! # Numerics and determinism
//! Every output element is one fused multiply-add chain over `k` in increasing
//! order, started from `+0.0` (or from the value already in `C` when the caller
//! asks to accumulate, e.g. a bias): `c = fma(a[i,0], b[0,j], c)`, then `k = 1`,
//! and so on. Depth blocks continue the chain (the accumulator tile is reloaded from
//! `C`), so the result does not depend on `KC`, `MC`, `NC`, the micro-tile shape,
//! the instruction set, the row chunking of a parallel run or the number of other
//! rows: it equals the plain scalar loop `c = c.mul_add(a, b)`, bit for bit, on
//! every path ([`Isa`]). The portable path uses `f32::mul_add`, which is exactly
//! rounded everywhere (a library call on CPUs without FMA: slow, but identical).
//! (Identical for finite values under the default float environment; NaN payloads
//! and flush-to-zero modes are not part of the promise.)

use super::prefetch;
use super::simd::{self, SimdLevel};

/// Columns of a packed right-hand-side panel (and of a micro-tile).
pub(crate) const NR: usize = 32;
/// Largest depth of a packed block (the `k` extent of one micro-kernel call).
///
/// The left-hand micro-panel a tile keeps in L1 while the right-hand-side panels
/// stream past it is `12 x KC` floats: 12 x 512 x 4 B = 24 KiB, half of a 48 KiB
/// L1 (the rest holds the streaming right-hand-side lines and the `C` tile). A
/// long depth means few passes over `C` (each depth block after the first reads
/// and writes every `C` tile once more). A depth `k` is cut into
/// `ceil(k / KC)` blocks of (almost) equal depth ([`depth_blocks`]) so no short
/// tail block pays the tile's load and store of `C` for a few steps. Blocking
/// never changes the result (the chain continues through `C`).
///
/// Measured on a 2-vCPU AVX-512 Xeon (48 KiB L1, 2 MiB L2): `KC = 512,
/// NC = 512` ran the 1024³ product about 5% faster than `192 x 1024`, and the
/// row-tile-major order (this one) about 10% faster than the panel-major one
/// (each right-hand-side panel kept in L1 for a block's row tiles); see
/// `docs/BENCHMARKS.md`.
pub(crate) const KC: usize = 512;
/// Rows of a packed left-hand-side block: the rows packed at a time, once per
/// depth block, and reused by every column block of [`NC`] columns (so a wide
/// product packs each left-hand element once, not once per column block). The
/// packed block is `MC x KC x 4 B = 512 KiB`, in L2 beside the right-hand-side
/// block; its `12 x KC` micro-panels go to L1 one at a time.
pub(crate) const MC: usize = 256;
/// Columns of one column block (a multiple of [`NR`]): the right-hand-side block
/// the row tiles sweep, `KC x NC x 4 B = 1 MiB`, stays in a 2 MiB L2 while every
/// row tile of the product streams it.
pub(crate) const NC: usize = 512;

/// The depth blocks of a product with depth `k`: `ceil(k / KC)` consecutive ranges
/// of equal depth (the first `k % blocks` one longer). Depends on `k` only.
fn depth_blocks(k: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let blocks = k.div_ceil(KC).max(1);
    let (base, extra) = (k / blocks, k % blocks);
    (0..blocks).map(move |b| {
        let start = b * base + b.min(extra);
        start..start + base + usize::from(b < extra)
    })
}

/// The largest micro-tile height of the paths that go through a stack tile
/// (the portable and AVX2 paths; the AVX-512 path reads and writes `C` directly).
const MR_MAX: usize = 8;
/// Micro-tile height of the AVX-512 path.
#[cfg(target_arch = "x86_64")]
const MR_AVX512: usize = 12;

/// The micro-kernel code path, chosen once per process from the CPU's features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Portable code (`f32::mul_add`), any CPU.
    Generic,
    /// x86-64 AVX2 + FMA (tile 3 x 32).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64 AVX-512F (+ FMA) (tile 12 x 32, accumulated in registers straight
    /// from and into `C`).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The path of the process-wide vector level ([`simd::level`]): the level's
    /// CPU detection, `FUCINA_SIMD` and `force_simd_level` choose the GEMM's
    /// micro-kernel as they choose every other kernel's loops (every path gives
    /// the same bits).
    pub(crate) fn detect() -> Isa {
        Isa::of(simd::level())
    }

    /// The micro-kernel of a vector level.
    fn of(level: SimdLevel) -> Isa {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => Isa::Avx512,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => Isa::Avx2,
            _ => Isa::Generic,
        }
    }

    /// Every path this CPU can run (for tests that compare them).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        let best = simd::detected();
        SimdLevel::ALL
            .into_iter()
            .filter(|&l| l <= best)
            .map(Isa::of)
            .collect()
    }

    /// Micro-tile height (rows of a packed left-hand-side panel).
    pub(crate) fn mr(self) -> usize {
        match self {
            Isa::Generic => 4,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => 3,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => MR_AVX512,
        }
    }
}

/// Floats of the packed form of a `k x n` right-hand side (`None` on overflow).
pub(crate) fn packed_b_len(k: usize, n: usize) -> Option<usize> {
    n.div_ceil(NR).checked_mul(k)?.checked_mul(NR)
}

/// Floats of the left-hand-side packing scratch [`gemm_rows`] needs for products
/// of at most `rows` rows: one packed block of `min(rows, MC)` rows (a
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
    } else if rs == 1 && ncols == NR && gather_ok(src.len(), off, cs, k) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `gather_ok` returned true only after `Isa::detect()` found
        // avx512f (and checked the bounds the function asserts).
        unsafe {
            x86::pack_cols_avx512(dst, src, off, cs, k)
        };
    } else if rs == 1 {
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

/// Whether [`pack_b_panel`] may use the AVX-512 gather packer for a full
/// column-major panel at `off` with column stride `cs` and depth `k`.
fn gather_ok(src_len: usize, off: usize, cs: usize, k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        Isa::detect() == Isa::Avx512
            && cs.checked_mul(31).is_some_and(|x| {
                x <= i32::MAX as usize && off.saturating_add(x).saturating_add(k) <= src_len
            })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (src_len, off, cs, k);
        false
    }
}

/// Packs an `mc x kc` left-hand-side block into row panels, one per row tile of
/// [`row_tiles`]: the panel of the tile starting at row `q0` with `rows` rows
/// starts at `q0 * kc` and holds `dst[q0 * kc + kk * rows + i] =
/// src[row_offs[q0 + i] + (p0 + kk) * cs]`.
fn pack_a(
    isa: Isa,
    dst: &mut [f32],
    src: &[f32],
    row_offs: &[usize],
    p0: usize,
    cs: usize,
    kc: usize,
) {
    for (q0, pm) in row_tiles(row_offs.len(), isa.mr()) {
        let rows = &row_offs[q0..q0 + pm];
        let panel = &mut dst[q0 * kc..][..pm * kc];
        #[cfg(target_arch = "x86_64")]
        if cs == 1 && isa == Isa::Avx512 && pm.is_multiple_of(4) {
            macro_rules! avx512 {
                ($($r:literal)*) => {
                    match pm {
                        $($r => {
                            let r: [&[f32]; $r] =
                                std::array::from_fn(|i| &src[rows[i] + p0..][..kc]);
                            // SAFETY: `Isa::Avx512` comes from a vector level at or
                            // below the detected one, and the AVX-512 level is
                            // detected only with avx512f.
                            unsafe { x86::pack_a_avx512::<$r>(panel, &r, kc) };
                        })*
                        _ => unreachable!("row tile of {pm} rows"),
                    }
                };
            }
            avx512!(4 8 12);
            continue;
        }
        if cs == 1 {
            macro_rules! rows {
                ($($r:literal)*) => {
                    match pm {
                        $($r => pack_a_rows::<$r>(panel, src, rows, p0, kc),)*
                        _ => unreachable!("row tile of {pm} rows"),
                    }
                };
            }
            rows!(1 2 3 4 5 6 7 8 9 10 11 12);
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

/// The row tiles of a block of `mc` rows for tile height `mr`: `mc.div_ceil(mr)`
/// tiles `(first row, rows)`, all `mr` rows high except the last two, which
/// share the remainder evenly, e.g. 16 rows are two tiles of 8 rather than
/// 12 + 4 (a short tile does the loads of a full one for a fraction of its
/// multiply-adds). Depends on `mc` and `mr` only, and a row's arithmetic never
/// depends on its tile.
fn row_tiles(mc: usize, mr: usize) -> impl Iterator<Item = (usize, usize)> {
    let mr = mr.max(1);
    let tiles = mc.div_ceil(mr);
    let full = if mc.is_multiple_of(mr) {
        tiles
    } else {
        tiles.saturating_sub(2)
    };
    // Rows of the (one or two) tiles after the full ones.
    let rest = mc - full * mr;
    let hi = if tiles - full == 2 {
        rest.div_ceil(2)
    } else {
        rest
    };
    (0..tiles).map(move |t| match t.cmp(&full) {
        std::cmp::Ordering::Less => (t * mr, mr),
        std::cmp::Ordering::Equal => (full * mr, hi),
        std::cmp::Ordering::Greater => (full * mr + hi, rest - hi),
    })
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

/// The portable `R x NR` micro-kernel body:
/// `tile[i][j] = fma(a[kk*R+i], b[kk*NR+j], tile[i][j])` for `kk` in increasing order.
#[inline(always)]
fn micro_body<const R: usize>(a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR_MAX]) {
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

/// Dispatches on the tile height `rows` (1..=`MR_MAX`) to a monomorphized body.
#[inline(always)]
fn micro_rows(rows: usize, a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR_MAX]) {
    match rows {
        1 => micro_body::<1>(a, b, tile),
        2 => micro_body::<2>(a, b, tile),
        3 => micro_body::<3>(a, b, tile),
        4 => micro_body::<4>(a, b, tile),
        5 => micro_body::<5>(a, b, tile),
        6 => micro_body::<6>(a, b, tile),
        7 => micro_body::<7>(a, b, tile),
        8 => micro_body::<8>(a, b, tile),
        _ => unreachable!("micro-tile height {rows} is not in 1..=8"),
    }
}

/// Explicit AVX2 / AVX-512 micro-kernels. They compute exactly what
/// `micro_body` computes (`_mm*_fmadd_ps` is the same fused, once-rounded
/// `a * b + c` as `f32::mul_add`), with a fixed register layout: the portable body
/// is left to the auto-vectorizer, which for some tile heights picks gathers.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR_AVX512, MR_MAX, NR};

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

    /// Runs [`kernel_avx512`] for a tile of `rows` (1..=[`MR_AVX512`]) rows:
    /// `a` holds `kc * rows` packed floats; right-hand-side row `kk` is
    /// `b[kk * ldb..][..32]`; `c` starts at the tile's top-left element of a
    /// row-major `C` with row stride `ldc`.
    ///
    /// # Safety
    /// avx512f is available.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_direct_avx512(
        rows: usize,
        kc: usize,
        a: &[f32],
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        ncols: usize,
        first: bool,
    ) {
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

    /// The `R x 32` tile with four 8-lane accumulators per row.
    #[target_feature(enable = "avx2,fma")]
    fn tile_avx2<const R: usize>(a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR_MAX]) {
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

    /// Packs one full panel (32 columns) of a column-major right-hand side
    /// (`rs == 1`): for each `kk`, two 16-lane gathers read
    /// `src[off + j * cs + kk]` for `j < 32` and one 32-float row of `dst` is
    /// stored. Pure data movement: the packed floats are those of the scalar path.
    ///
    /// The caller checks `off + 31 * cs + k <= src.len()`, `31 * cs <= i32::MAX`
    /// and `dst.len() == k * NR`.
    #[target_feature(enable = "avx512f")]
    pub(super) fn pack_cols_avx512(dst: &mut [f32], src: &[f32], off: usize, cs: usize, k: usize) {
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

    /// [`super::pack_a_rows`] for an AVX-512 tile of `R` row-major rows, `R` a
    /// multiple of 4: `panel[kk * R + i] = r[i][kk]` for `kk < kc`. Each block of 16 columns
    /// is transposed in registers: the rows in groups of 4 go through a 4 x 4
    /// transpose inside every 128-bit lane (`unpack` of singles, then of
    /// doubles), and lane `l` of result `t` is the 4 floats of group `g` at
    /// column `4l + t` of the block, stored where that column's `R` floats go.
    ///
    /// Panics unless `R % 4 == 0`, `panel` holds `kc * R` floats and every row `kc` floats.
    #[target_feature(enable = "avx512f")]
    pub(super) fn pack_a_avx512<const R: usize>(panel: &mut [f32], r: &[&[f32]; R], kc: usize) {
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

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn micro_avx2(rows: usize, a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR_MAX]) {
        match rows {
            1 => tile_avx2::<1>(a, b, tile),
            2 => tile_avx2::<2>(a, b, tile),
            3 => tile_avx2::<3>(a, b, tile),
            _ => unreachable!("AVX2 micro-tile height {rows} is not in 1..=3"),
        }
    }
}

fn micro_generic(rows: usize, a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR_MAX]) {
    micro_rows(rows, a, b, tile);
}

/// Runs the micro-kernel of `isa` on one tile: `a` is `kc * rows` packed floats,
/// `b` is `kc * NR` packed floats.
#[inline]
fn micro(isa: Isa, rows: usize, a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR_MAX]) {
    match isa {
        Isa::Generic => micro_generic(rows, a, b, tile),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unreachable!("the AVX-512 path does not use a stack tile"),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` comes from a vector level at or below the detected
        // one (`Isa::of`, `simd::force`), and the AVX2 level is detected only
        // with avx2 and fma.
        Isa::Avx2 => unsafe { x86::micro_avx2(rows, a, b, tile) },
    }
}

/// The left-hand side of [`gemm_rows`]: row `i` of `A` starts at `row_off(i)` in
/// `data`, and its column `kk` is at `row_off(i) + kk * cs`.
pub(crate) struct LhsRows<'a, F: Fn(usize) -> usize> {
    /// The storage.
    pub(crate) data: &'a [f32],
    /// Start of row `i` in `data`.
    pub(crate) row_off: F,
    /// Column stride.
    pub(crate) cs: usize,
}

/// The right-hand side `B` (`k x n`) of [`gemm_rows`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rhs<'a> {
    /// Packed panels (from [`pack_b_panel`] / [`pack_b_rows`]): `n.div_ceil(NR)`
    /// panels of `k * NR` floats.
    Packed(&'a [f32]),
    /// A row-major matrix read in place (AVX-512 path only, `n` a multiple of
    /// [`NR`]): element `(kk, j)` at `data[off + kk * rs + j]`, `rs >= n`. The
    /// row-tile-major loop streams the right-hand side from L2 either way, so
    /// reading it where it lies saves the packing copy (see [`direct_rhs_ok`]).
    Rows {
        /// The storage.
        data: &'a [f32],
        /// Offset of `(0, 0)`.
        off: usize,
        /// Row stride.
        rs: usize,
    },
}

impl<'a> Rhs<'a> {
    /// The columns from `j0` (a multiple of [`NR`]) on, of depth `k`.
    pub(crate) fn cols_from(self, j0: usize, k: usize) -> Rhs<'a> {
        debug_assert_eq!(j0 % NR, 0);
        match self {
            Rhs::Packed(p) => Rhs::Packed(&p[j0 / NR * k * NR..]),
            Rhs::Rows { data, off, rs } => Rhs::Rows {
                data,
                off: off + j0,
                rs,
            },
        }
    }

    /// Depth rows `p0..p0 + kc` of panel `p`: the slice and its row stride.
    fn panel(self, p: usize, k: usize, p0: usize, kc: usize) -> (&'a [f32], usize) {
        match self {
            Rhs::Packed(b) => (&b[p * k * NR + p0 * NR..][..kc * NR], NR),
            Rhs::Rows { .. } if kc == 0 => (&[], NR),
            Rhs::Rows { data, off, rs } => {
                (&data[off + p0 * rs + p * NR..][..(kc - 1) * rs + NR], rs)
            }
        }
    }
}

/// Whether [`gemm_rows`] should read a row-major right-hand side with row stride
/// `rs` and `n` columns in place ([`Rhs::Rows`]) for a product of `rows` output
/// rows (over all batches) on path `isa`: the AVX-512 path, whole panels
/// (`n % NR == 0`), few rows (at most [`DIRECT_RHS_MAX_ROWS`], where the packing
/// copy is a large share of the work), and a row stride that is not a multiple
/// of 1024 floats (4 KiB), for which every row of a panel would fall into the
/// same few cache sets.
pub(crate) fn direct_rhs_ok(isa: Isa, rows: usize, n: usize, rs: usize) -> bool {
    direct_rhs_supported(isa, n)
        && rows <= DIRECT_RHS_MAX_ROWS
        && rs >= n
        && !rs.is_multiple_of(1024)
}

/// Most output rows for which the right-hand side is read in place. Measured on
/// the 2-vCPU AVX-512 machine (`benches/examples/gemm_probe.rs`, 1 thread): in
/// place against packed, `[64, 784] x [784, 256]` ran 20% faster (the packing
/// copy is 1/64 of the work there) and 256³ about 4% faster, while 1008³ and
/// 1040³ ran about 10% slower (the packed panels stream from L2 more cleanly
/// than rows `rs` apart).
pub(crate) const DIRECT_RHS_MAX_ROWS: usize = 256;

/// Whether path `isa` can read an `n`-column right-hand side in place at all.
fn direct_rhs_supported(isa: Isa, n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        return n.is_multiple_of(NR) && n > 0;
    }
    let _ = (isa, n);
    false
}

/// `C = A · B` (or `C += A · B` when `accumulate`) for `m` rows of `A` (`m x k`,
/// read through `lhs`) and a right-hand side `rhs` (packed panels, or a row-major
/// matrix in place on the AVX-512 path). `c` is `m x n` row-major (exactly
/// `m * n` floats). `a_scratch` holds at least [`a_scratch_len`]`(m)` floats.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_rows<F: Fn(usize) -> usize>(
    isa: Isa,
    lhs: &LhsRows<'_, F>,
    m: usize,
    k: usize,
    n: usize,
    rhs: Rhs<'_>,
    c: &mut [f32],
    accumulate: bool,
    a_scratch: &mut [f32],
) {
    debug_assert_eq!(c.len(), m * n);
    debug_assert!(a_scratch.len() >= a_scratch_len(m));
    let mr = isa.mr();
    let n_panels = n.div_ceil(NR);
    if let Rhs::Rows { rs, .. } = rhs {
        assert!(
            direct_rhs_supported(isa, n) && rs >= n,
            "gemm_rows: an in-place right-hand side needs the AVX-512 path and whole panels"
        );
    }
    let mut row_offs = [0usize; MC];
    let mut tiles = [(0usize, 0usize); MC];
    let mut tile = [[0.0f32; NR]; MR_MAX];
    for i0 in (0..m).step_by(MC) {
        let mc = MC.min(m - i0);
        for (i, o) in row_offs[..mc].iter_mut().enumerate() {
            *o = (lhs.row_off)(i0 + i);
        }
        let mut nq = 0;
        for (slot, t) in tiles.iter_mut().zip(row_tiles(mc, mr)) {
            *slot = t;
            nq += 1;
        }
        let tiles = &tiles[..nq];
        for depth in depth_blocks(k) {
            let (p0, kc) = (depth.start, depth.len());
            let first = p0 == 0 && !accumulate;
            // The block's rows at this depth are packed once and reused by every
            // column block (each element still takes the depth blocks in
            // increasing order: the depth loop is outside the column loop).
            pack_a(isa, a_scratch, lhs.data, &row_offs[..mc], p0, lhs.cs, kc);
            for jc in (0..n_panels).step_by(NC / NR) {
                let jp_end = (jc + NC / NR).min(n_panels);
                // Tiles of this column block, row-tile-major: each left-hand
                // micro-panel (`rows x kc`) stays in L1 while the block's
                // right-hand-side panels stream past it from L2.
                let npn = jp_end - jc;
                let tile_at = |t: usize| (tiles[t / npn], jc + t % npn);
                let n_tiles = nq * npn;
                for t in 0..n_tiles {
                    let ((q0, rows), p) = tile_at(t);
                    let (b, ldb) = rhs.panel(p, k, p0, kc);
                    let j0 = p * NR;
                    let ncols = NR.min(n - j0);
                    let a = &a_scratch[q0 * kc..][..rows * kc];
                    #[cfg(target_arch = "x86_64")]
                    if isa == Isa::Avx512 {
                        // Start fetching the next tile's C rows now, so its loads
                        // do not wait on L3 / memory.
                        if t + 1 < n_tiles {
                            let ((nq0, nrows), np) = tile_at(t + 1);
                            let next = &c[(i0 + nq0) * n + np * NR..];
                            for row in next.chunks(n).take(nrows) {
                                prefetch::l1(&row[..NR.min(row.len())]);
                            }
                        }
                        let c0 = (i0 + q0) * n + j0;
                        let ct = &mut c[c0..c0 + (rows - 1) * n + ncols];
                        // SAFETY: `Isa::Avx512` comes from a vector level at or
                        // below the detected one, and the AVX-512 level is
                        // detected only with avx512f.
                        unsafe {
                            x86::tile_direct_avx512(rows, kc, a, b, ldb, ct, n, ncols, first)
                        };
                        continue;
                    }
                    for (r, t) in tile[..rows].iter_mut().enumerate() {
                        if first {
                            *t = [0.0; NR];
                        } else {
                            let src = &c[(i0 + q0 + r) * n + j0..][..ncols];
                            t[..ncols].copy_from_slice(src);
                        }
                    }
                    micro(isa, rows, a, b, &mut tile);
                    for (r, t) in tile[..rows].iter().enumerate() {
                        c[(i0 + q0 + r) * n + j0..][..ncols].copy_from_slice(&t[..ncols]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f32;
                for kk in 0..k {
                    acc = a[i * k + kk].mul_add(b[kk * rs + j * cs], acc);
                }
                want[i * n + j] = acc;
            }
        }
        let np = n.div_ceil(NR);
        let mut packed = vec![0.0f32; packed_b_len(k, n).unwrap()];
        for (p, d) in packed.chunks_exact_mut(k * NR).enumerate() {
            pack_b_panel(d, &b, p * NR * cs, rs, cs, k, NR.min(n - p * NR));
        }
        assert_eq!(packed.len(), np * k * NR);
        let mut scratch = vec![0.0f32; a_scratch_len(m)];
        for isa in Isa::available() {
            let mut c = vec![f32::NAN; m * n];
            let lhs = LhsRows {
                data: &a,
                row_off: |i| i * k,
                cs: 1,
            };
            gemm_rows(
                isa,
                &lhs,
                m,
                k,
                n,
                Rhs::Packed(&packed),
                &mut c,
                false,
                &mut scratch,
            );
            let same = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{isa:?} m={m} k={k} n={n} differs from the fma chain");
            // The right-hand side read in place (row-major, whole panels only).
            if !b_transposed && direct_rhs_supported(isa, n) {
                let mut c = vec![f32::NAN; m * n];
                let rhs = Rhs::Rows {
                    data: &b,
                    off: 0,
                    rs: n,
                };
                gemm_rows(isa, &lhs, m, k, n, rhs, &mut c, false, &mut scratch);
                let same = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{isa:?} in place m={m} k={k} n={n} differs from the fma chain"
                );
            }
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
}
