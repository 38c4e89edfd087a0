//! The driver: the operands ([`LhsRows`], [`Rhs`], [`GemmArgs`]), the loop nest
//! over blocks and tiles ([`gemm`]), and the choice of the micro-kernel from the
//! vector level.

#[cfg(target_arch = "x86_64")]
use super::avx2::Avx2;
#[cfg(target_arch = "x86_64")]
use super::avx512::Avx512;
use super::pack::{a_scratch_len, pack_a};
use super::params::{MC, NR, depth_blocks, row_tiles};
use super::portable::Portable;
use super::{MicroKernel, Tile};
use crate::kernels::prefetch;
use crate::kernels::simd::SimdLevel;

/// The left-hand side of [`gemm`]: row `i` of `A` starts at `row_off(i)` in
/// `data`, and its column `kk` is at `row_off(i) + kk * cs`.
pub(crate) struct LhsRows<'a, F: Fn(usize) -> usize> {
    /// The storage.
    pub(crate) data: &'a [f32],
    /// Start of row `i` in `data`.
    pub(crate) row_off: F,
    /// Column stride.
    pub(crate) cs: usize,
}

/// The right-hand side `B` (`k x n`) of [`gemm`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rhs<'a> {
    /// Packed panels (from [`super::pack_b_panel`] / [`super::pack_b_rows`]):
    /// `n.div_ceil(NR)` panels of `k * NR` floats.
    Packed(&'a [f32]),
    /// A row-major matrix read in place (AVX-512 kernel only, `n` a multiple of
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

/// One product for [`gemm`]: `C = A · B`, or `C += A · B` when `accumulate`, for
/// `m` rows of `A` (`m x k`, read through `lhs`) and a `k x n` right-hand side.
pub(crate) struct GemmArgs<'a, F: Fn(usize) -> usize> {
    /// The vector level whose micro-kernel runs the product (every level gives
    /// the same bits).
    pub(crate) level: SimdLevel,
    /// The left-hand side.
    pub(crate) lhs: &'a LhsRows<'a, F>,
    /// Rows of `A` and of `C`.
    pub(crate) m: usize,
    /// The depth: columns of `A`, rows of `B`.
    pub(crate) k: usize,
    /// Columns of `B` and of `C`.
    pub(crate) n: usize,
    /// The right-hand side: packed panels, or a row-major matrix read in place
    /// (only where [`direct_rhs_ok`] said so for this level).
    pub(crate) rhs: Rhs<'a>,
    /// Add to the values already in `C` (e.g. a bias) instead of overwriting them.
    pub(crate) accumulate: bool,
}

/// Computes the product `args` describes into `c` (`m x n` row-major, exactly
/// `m * n` floats), packing the left-hand side into `a_scratch` (at least
/// [`a_scratch_len`]`(m)` floats), with the micro-kernel of `args.level`.
///
/// A level above the CPU's (which [`crate::kernels::simd::level`] never returns)
/// runs the portable kernel, with the same bits. Panics when `args.rhs` is read
/// in place on a level whose kernel cannot ([`direct_rhs_ok`] was not asked).
pub(crate) fn gemm<F: Fn(usize) -> usize>(
    args: &GemmArgs<'_, F>,
    c: &mut [f32],
    a_scratch: &mut [f32],
) {
    dispatch(args, c, args.n, LhsBuf::Scratch(a_scratch))
}

/// [`gemm`] into a `C` whose rows are `ldc >= n` floats apart (a column block of
/// a wider row-major matrix): row `i` of the product is `c[i * ldc..][..n]`, and
/// `c` holds at least `(m - 1) * ldc + n` floats. The floats between the rows'
/// `n` columns are neither read nor written. Same bits as [`gemm`]. (The
/// convolutions use [`gemm_ldc_packed_lhs`]; the fused attention writes each
/// head's columns of its outputs with this one.)
pub(crate) fn gemm_ldc<F: Fn(usize) -> usize>(
    args: &GemmArgs<'_, F>,
    c: &mut [f32],
    ldc: usize,
    a_scratch: &mut [f32],
) {
    assert!(
        ldc >= args.n && (args.m == 0 || c.len() >= (args.m - 1) * ldc + args.n),
        "gemm_ldc: the C rows must be at least n floats apart and fit in c"
    );
    dispatch(args, c, ldc, LhsBuf::Scratch(a_scratch))
}

/// Floats [`pack_lhs`] writes for an `m x k` left-hand side.
pub(crate) fn packed_lhs_len(m: usize, k: usize) -> usize {
    m * k
}

/// Packs the whole `m x k` left-hand side `lhs` into `dst` (at least
/// [`packed_lhs_len`]`(m, k)` floats) the way [`gemm`] packs it block by block
/// for the micro-kernel of `level`, so that [`gemm_ldc_packed_lhs`] can reuse it
/// for many right-hand sides (e.g. one convolution weight for every sample). The
/// block of rows `i0..i0 + mc` at depth `p0..p0 + kc` starts at `i0 * k + p0 *
/// mc`.
pub(crate) fn pack_lhs<F: Fn(usize) -> usize>(
    level: SimdLevel,
    lhs: &LhsRows<'_, F>,
    m: usize,
    k: usize,
    dst: &mut [f32],
) {
    fn go<K: MicroKernel, F: Fn(usize) -> usize>(
        kernel: K,
        lhs: &LhsRows<'_, F>,
        m: usize,
        k: usize,
        dst: &mut [f32],
    ) {
        let blk = kernel.blocking();
        let mut row_offs = [0usize; MC];
        for i0 in (0..m).step_by(blk.mc) {
            let mc = blk.mc.min(m - i0);
            for (i, o) in row_offs[..mc].iter_mut().enumerate() {
                *o = (lhs.row_off)(i0 + i);
            }
            for depth in depth_blocks(k, blk.kc) {
                let (p0, kc) = (depth.start, depth.len());
                let block = &mut dst[i0 * k + p0 * mc..][..mc * kc];
                pack_a(kernel, block, lhs.data, &row_offs[..mc], p0, lhs.cs, kc);
            }
        }
    }
    assert!(
        dst.len() >= packed_lhs_len(m, k),
        "pack_lhs: the destination must hold m * k floats"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(kernel) = Avx512::for_level(level) {
            return go(kernel, lhs, m, k, dst);
        }
        if let Some(kernel) = Avx2::for_level(level) {
            return go(kernel, lhs, m, k, dst);
        }
    }
    go(Portable::new(), lhs, m, k, dst)
}

/// `gemm_ldc` with the left-hand side already packed by [`pack_lhs`] (for
/// the same level, `m` and `k`) into `packed`; `args.lhs` is not read. Same bits
/// as `gemm_ldc` (and [`gemm`] where `ldc == n`).
pub(crate) fn gemm_ldc_packed_lhs<F: Fn(usize) -> usize>(
    args: &GemmArgs<'_, F>,
    packed: &[f32],
    c: &mut [f32],
    ldc: usize,
) {
    assert!(
        ldc >= args.n && (args.m == 0 || c.len() >= (args.m - 1) * ldc + args.n),
        "gemm_ldc_packed_lhs: the C rows must be at least n floats apart and fit in c"
    );
    assert!(
        packed.len() >= packed_lhs_len(args.m, args.k),
        "gemm_ldc_packed_lhs: the packed left-hand side must hold m * k floats"
    );
    dispatch(args, c, ldc, LhsBuf::Packed(packed))
}

/// Where [`run`] takes the packed left-hand side from.
enum LhsBuf<'s> {
    /// Packed block by block into this scratch.
    Scratch(&'s mut [f32]),
    /// Packed beforehand by [`pack_lhs`].
    Packed(&'s [f32]),
}

/// [`gemm`], `gemm_ldc` and [`gemm_ldc_packed_lhs`]: runs [`run`] with the micro-kernel of
/// `args.level` (the portable one for a level above the CPU's).
fn dispatch<F: Fn(usize) -> usize>(
    args: &GemmArgs<'_, F>,
    c: &mut [f32],
    ldc: usize,
    a_buf: LhsBuf<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(kernel) = Avx512::for_level(args.level) {
            return run(kernel, args, c, a_buf, ldc);
        }
        if let Some(kernel) = Avx2::for_level(args.level) {
            return run(kernel, args, c, a_buf, ldc);
        }
    }
    run(Portable::new(), args, c, a_buf, ldc)
}

/// Whether [`gemm`] should read a row-major right-hand side with row stride `rs`
/// and `n` columns in place ([`Rhs::Rows`]) for a product of `rows` output rows
/// (over all batches) at vector level `level`: a kernel that can
/// ([`MicroKernel::READS_RHS_IN_PLACE`], the AVX-512 one), whole panels (`n % NR
/// == 0`), few rows (at most [`DIRECT_RHS_MAX_ROWS`], where the packing copy is
/// a large share of the work), and a row stride that is not a multiple of 1024
/// floats (4 KiB), for which every row of a panel would fall into the same few
/// cache sets.
pub(crate) fn direct_rhs_ok(level: SimdLevel, rows: usize, n: usize, rs: usize) -> bool {
    direct_rhs_supported(level, n)
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

/// Whether the kernel [`gemm`] picks for `level` can read an `n`-column
/// right-hand side in place at all.
pub(super) fn direct_rhs_supported(level: SimdLevel, n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if Avx512::for_level(level).is_some() {
        return Avx512::READS_RHS_IN_PLACE && n.is_multiple_of(NR) && n > 0;
    }
    let _ = (level, n);
    false
}

/// The loop nest of [`gemm`] for one kernel: `MC` row blocks, `KC` depth blocks
/// (packing the row block at that depth once) and `NC` column blocks; inside a
/// column block, row-tile-major, one `K::MR x NR` micro-kernel call per tile.
/// Row `i` of `C` starts at `c[i * ldc]`.
fn run<K: MicroKernel, F: Fn(usize) -> usize>(
    kernel: K,
    args: &GemmArgs<'_, F>,
    c: &mut [f32],
    mut a_buf: LhsBuf<'_>,
    ldc: usize,
) {
    const {
        assert!(K::NR == NR && K::MR >= 1 && K::MR <= 12 && K::MR <= MC);
    }
    let (lhs, m, k, n, rhs) = (args.lhs, args.m, args.k, args.n, args.rhs);
    debug_assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    if let LhsBuf::Scratch(s) = &a_buf {
        debug_assert!(s.len() >= a_scratch_len(m));
    }
    let n_panels = n.div_ceil(NR);
    if let Rhs::Rows { rs, .. } = rhs {
        assert!(
            K::READS_RHS_IN_PLACE && n.is_multiple_of(NR) && n > 0 && rs >= n,
            "gemm: an in-place right-hand side needs the AVX-512 kernel and whole panels"
        );
    }
    let blk = kernel.blocking();
    debug_assert!(blk.mc <= MC && blk.nc.is_multiple_of(NR) && blk.nc > 0);
    let mut row_offs = [0usize; MC];
    let mut tiles = [(0usize, 0usize); MC];
    for i0 in (0..m).step_by(blk.mc) {
        let mc = blk.mc.min(m - i0);
        for (i, o) in row_offs[..mc].iter_mut().enumerate() {
            *o = (lhs.row_off)(i0 + i);
        }
        let mut nq = 0;
        for (slot, t) in tiles.iter_mut().zip(row_tiles(mc, K::MR)) {
            *slot = t;
            nq += 1;
        }
        let tiles = &tiles[..nq];
        for depth in depth_blocks(k, blk.kc) {
            let (p0, kc) = (depth.start, depth.len());
            let first = p0 == 0 && !args.accumulate;
            // The block's rows at this depth are packed once and reused by every
            // column block (each element still takes the depth blocks in
            // increasing order: the depth loop is outside the column loop).
            let a_block: &[f32] = match &mut a_buf {
                LhsBuf::Scratch(s) => {
                    pack_a(kernel, s, lhs.data, &row_offs[..mc], p0, lhs.cs, kc);
                    s
                }
                LhsBuf::Packed(p) => &p[i0 * k + p0 * mc..][..mc * kc],
            };
            for jc in (0..n_panels).step_by(blk.nc / NR) {
                let jp_end = (jc + blk.nc / NR).min(n_panels);
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
                    let a = &a_block[q0 * kc..][..rows * kc];
                    if K::PREFETCHES_C && t + 1 < n_tiles {
                        // Start fetching the next tile's C rows now, so its loads
                        // do not wait on L3 / memory.
                        let ((nq0, nrows), np) = tile_at(t + 1);
                        let next = &c[(i0 + nq0) * ldc + np * NR..];
                        for row in next.chunks(ldc).take(nrows) {
                            prefetch::l1(&row[..NR.min(row.len())]);
                        }
                    }
                    let c0 = (i0 + q0) * ldc + j0;
                    kernel.tile(Tile {
                        rows,
                        kc,
                        a,
                        b,
                        ldb,
                        c: &mut c[c0..c0 + (rows - 1) * ldc + ncols],
                        ldc,
                        ncols,
                        first,
                    });
                }
            }
        }
    }
}
