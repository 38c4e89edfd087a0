//! Packed, cache-blocked single-precision GEMM: `C[m, n] (+)= A[m, k] · B[k, n]`.
//!
//! # Structure
//! - The right-hand side is packed once per call (or once per process, through the
//!   context's right-hand-side cache) into column panels of [`NR`] columns: panel
//!   `p` holds `B[0..k, p*NR..p*NR+NR]` k-major (`NR` consecutive floats per k),
//!   zero-padded past `n`. [`pack_b_panel`] reads `B` through arbitrary strides, so a
//!   transposed view packs without being materialized.
//! - The left-hand side is packed per `MC x KC` block into row panels of `mr` rows
//!   ([`pack_a`]), again through arbitrary strides (one offset per row).
//! - [`gemm_rows`] loops `NC` column blocks, `KC` depth blocks and `MC` row blocks
//!   and calls a register-blocked micro-kernel on `mr x NR` tiles.
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

/// Columns of a packed right-hand-side panel (and of a micro-tile).
pub(crate) const NR: usize = 32;
/// Largest depth of a packed block (the `k` extent of one micro-kernel call).
///
/// The packed right-hand-side micro-panel the micro-kernel re-reads for every tile
/// of a left-hand-side block is `KC x NR` floats: 192 x 32 x 4 B = 24 KiB, half of
/// a 48 KiB L1 (the other half holds the streamed left-hand-side micro-panel,
/// `12 x 192 x 4 B = 9 KiB`, and the `C` tile). A depth `k` is cut into
/// `ceil(k / KC)` blocks of (almost) equal depth ([`depth_blocks`]) so no short
/// tail block pays the tile's load and store of `C` for a few steps. Blocking
/// never changes the result (the chain continues through `C`).
pub(crate) const KC: usize = 192;
/// Rows of a packed left-hand-side block (a multiple of every [`Isa::mr`]:
/// 48 = 12 x 4 = 8 x 6 = 3 x 16 = 4 x 12). The packed block
/// (`MC x KC x 4 B = 36 KiB`) and the `MC x NC` block of `C` it updates
/// (192 KiB) stay small next to the right-hand-side block, so the three fit in
/// L2 with room to spare (also in a 1 MiB L2). Each right-hand-side panel is
/// used by 4 tiles per trip from L2 to L1: 24 KiB for 4 x 12 x 32 x 192 FMAs,
/// well within L2 bandwidth. (168 rows measured slightly worse in thread CPU
/// time on a shared 2-vCPU machine; see `docs/BENCHMARKS.md`.)
pub(crate) const MC: usize = 48;
/// Columns of one column block (a multiple of [`NR`]): the right-hand-side block
/// the row blocks sweep, `KC x NC x 4 B = 768 KiB`, plus the `MC x NC` block of
/// `C` (192 KiB) and the packed left-hand side (36 KiB) take about half of a
/// 2 MiB L2.
pub(crate) const NC: usize = 1024;

/// The depth blocks of a product with depth `k`: `ceil(k / KC)` consecutive ranges
/// of equal depth (the first `k % blocks` one longer). Depends on `k` only.
pub(crate) fn depth_blocks(k: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
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
    /// The best path this CPU supports (detected once, then cached).
    pub(crate) fn detect() -> Isa {
        static CHOSEN: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    return Isa::Avx512;
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    return Isa::Avx2;
                }
            }
            Isa::Generic
        })
    }

    /// Every path this CPU can run (for tests that compare them).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Generic];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                v.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("fma")
            {
                v.push(Isa::Avx512);
            }
        }
        v
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

/// Floats of the left-hand-side packing scratch [`gemm_rows`] needs.
pub(crate) const A_SCRATCH_LEN: usize = MC * KC;

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
        // Row-major rows: copy runs of `ncols` floats.
        for (kk, d) in dst.chunks_exact_mut(NR).enumerate() {
            let s = &src[off + kk * rs..][..ncols];
            d[..ncols].copy_from_slice(s);
            d[ncols..].fill(0.0);
        }
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

/// Packs an `mc x kc` left-hand-side block into row panels of `mr` rows (the last
/// one may be shorter: `mc % mr` rows): panel `q` starts at `q * mr * kc` and holds
/// `dst[.. + kk * rows + i] = src[row_offs[q * mr + i] + (p0 + kk) * cs]`.
fn pack_a(
    dst: &mut [f32],
    src: &[f32],
    row_offs: &[usize],
    p0: usize,
    cs: usize,
    kc: usize,
    mr: usize,
) {
    for (q, rows) in row_offs.chunks(mr).enumerate() {
        let pm = rows.len();
        let panel = &mut dst[q * mr * kc..][..pm * kc];
        if cs == 1 {
            for (i, &ro) in rows.iter().enumerate() {
                let s = &src[ro + p0..][..kc];
                for (d, &v) in panel.chunks_exact_mut(pm).zip(s) {
                    d[i] = v;
                }
            }
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
    /// # Safety
    /// avx512f is available; `a` is valid for `kc * R` reads, `b` for `kc * 32`
    /// reads, and `c + i * ldc + j` for reads and writes for `i < R`, `j < ncols`,
    /// `1 <= ncols <= 32`.
    #[target_feature(enable = "avx512f")]
    unsafe fn kernel_avx512<const R: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
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
            // floats and `ap` at R readable floats (the caller's bounds).
            unsafe {
                let b0 = _mm512_loadu_ps(bp);
                let b1 = _mm512_loadu_ps(bp.add(16));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_ps(*ap.add(i));
                    acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(ai, b1, acc[1]);
                }
                ap = ap.add(R);
                bp = bp.add(32);
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

    /// Runs [`kernel_avx512`] for a tile of `rows` (1..=[`MR_AVX512`]) rows:
    /// `a` holds `kc * rows` packed floats, `b` `kc * 32`, and `c` starts at the
    /// tile's top-left element of a row-major `C` with row stride `ldc`.
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
        c: &mut [f32],
        ldc: usize,
        ncols: usize,
        first: bool,
    ) {
        assert!((1..=MR_AVX512).contains(&rows) && (1..=NR).contains(&ncols));
        assert!(a.len() >= kc * rows && b.len() >= kc * NR);
        assert!(c.len() >= (rows - 1) * ldc + ncols);
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        macro_rules! go {
            ($($r:literal)*) => {
                match rows {
                    // SAFETY: avx512f is available (the caller's contract); the
                    // asserts above give exactly the bounds `kernel_avx512` needs
                    // for R = rows.
                    $($r => unsafe { kernel_avx512::<$r>(kc, ap, bp, cp, ldc, ncols, first) },)*
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
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!`
        // confirmed avx2 and fma.
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

/// `C = A · B` (or `C += A · B` when `accumulate`) for `m` rows of `A` (`m x k`,
/// read through `lhs`) and a packed right-hand side (`packed_b`, from
/// [`pack_b_panel`], `n.div_ceil(NR)` panels of `k * NR` floats). `c` is `m x n`
/// row-major (exactly `m * n` floats). `a_scratch` holds at least
/// [`A_SCRATCH_LEN`] floats.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_rows<F: Fn(usize) -> usize>(
    isa: Isa,
    lhs: &LhsRows<'_, F>,
    m: usize,
    k: usize,
    n: usize,
    packed_b: &[f32],
    c: &mut [f32],
    accumulate: bool,
    a_scratch: &mut [f32],
) {
    debug_assert_eq!(c.len(), m * n);
    debug_assert!(a_scratch.len() >= A_SCRATCH_LEN);
    let mr = isa.mr();
    let n_panels = n.div_ceil(NR);
    debug_assert!(packed_b.len() >= n_panels * k * NR);
    let mut row_offs = [0usize; MC];
    let mut tile = [[0.0f32; NR]; MR_MAX];
    for jc in (0..n_panels).step_by(NC / NR) {
        let jp_end = (jc + NC / NR).min(n_panels);
        for depth in depth_blocks(k) {
            let (p0, kc) = (depth.start, depth.len());
            let first = p0 == 0 && !accumulate;
            for i0 in (0..m).step_by(MC) {
                let mc = MC.min(m - i0);
                for (i, o) in row_offs[..mc].iter_mut().enumerate() {
                    *o = (lhs.row_off)(i0 + i);
                }
                pack_a(a_scratch, lhs.data, &row_offs[..mc], p0, lhs.cs, kc, mr);
                for p in jc..jp_end {
                    let b = &packed_b[p * k * NR + p0 * NR..][..kc * NR];
                    let j0 = p * NR;
                    let ncols = NR.min(n - j0);
                    for q0 in (0..mc).step_by(mr) {
                        let rows = mr.min(mc - q0);
                        let a = &a_scratch[q0 * kc..][..rows * kc];
                        #[cfg(target_arch = "x86_64")]
                        if isa == Isa::Avx512 {
                            let c0 = (i0 + q0) * n + j0;
                            let ct = &mut c[c0..c0 + (rows - 1) * n + ncols];
                            // SAFETY: `Isa::Avx512` is only produced after
                            // `is_x86_feature_detected!` confirmed avx512f.
                            unsafe { x86::tile_direct_avx512(rows, kc, a, b, ct, n, ncols, first) };
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
        let mut scratch = vec![0.0f32; A_SCRATCH_LEN];
        for isa in Isa::available() {
            let mut c = vec![f32::NAN; m * n];
            let lhs = LhsRows {
                data: &a,
                row_off: |i| i * k,
                cs: 1,
            };
            gemm_rows(isa, &lhs, m, k, n, &packed, &mut c, false, &mut scratch);
            let same = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{isa:?} m={m} k={k} n={n} differs from the fma chain");
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
        ] {
            check(m, k, n, false);
            check(m, k, n, true);
        }
    }
}
