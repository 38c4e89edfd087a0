//! The activations of the quantized products (int8 blocks of 32) and the
//! vector kernels of the block-of-32 formats Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 and
//! IQ4_NL (llama.cpp's layouts, read in place; their block coding and portable
//! dot are in `quant_block`, and the formats with a min add its term to lane 0
//! after each block, as their `dot_block` does).
//!
//! # The activations
//! Each activation row is cut into blocks of 32 and quantized once per call
//! ([`quantize_row`]): `d = amax / 127` (an f32, not rounded to f16),
//! `q = round(x / d)` (half away from zero, clamped to `-127..=127`). For every
//! lane of four elements the kernels also get `-offset · Σ q` over the lane
//! (`offset` the weight format's `BlockFormat::ACT_OFFSET`: 128 for Q8_0, 8 for Q4_0), so that an unsigned × signed
//! byte product (`vpdpbusd`, `vpmaddubsw`) gives the signed sum.
//!
//! # The order (the same bits on every path)
//! For one output, block `b` of the weight row (scale `dw`, f16 widened to f32)
//! and of the activation row (scale `dx`) gives eight exact integer lane sums
//! `p[l] = Σ_{k = 4l..4l+3} w[k] · x[k]` (|p| < 2^17, exact in f32) and the f32
//! product `s = dw · dx`. Eight f32 lane accumulators take
//! `acc[l] = fma(s, p[l], acc[l])` for `b` in increasing order; then the lanes
//! fold in halves (`l + 4` into `l`, then `l + 2`, then `l + 1`). Every path
//! (portable scalar, AVX2 `vpmaddubsw`/`vpmaddwd`, AVX-512 VNNI `vpdpbusd`)
//! computes exactly these operations, so a result is the same bits on every path,
//! for every split of the rows among threads and for every batch size.

use std::ops::Range;

use super::quant_block::BlockFormat;

/// Elements per block.
pub(crate) const QK: usize = 32;
/// Lane accumulators of the fixed order (four elements per lane).
pub(crate) const LANES: usize = 8;

/// The activations of one call after [`quantize_row`]: row `i`'s block `b` is
/// `q[i * cols + 32 b..][..32]`, its scale `scale[i * nb + b]`, its lane biases
/// `bias[(i * nb + b) * 8..][..8]` (`nb = cols / 32`).
#[derive(Clone, Copy)]
pub(crate) struct Acts<'a> {
    /// Quantized values, `[m, cols]`.
    pub q: &'a [i8],
    /// Block scales, `[m, nb]`.
    pub scale: &'a [f32],
    /// Lane biases `-offset · Σ q` over each lane, `[m, nb, 8]`.
    pub bias: &'a [i32],
    /// Elements per row (a multiple of 32).
    pub cols: usize,
}

/// Quantizes one activation row `x` (a multiple of 32 long) into `q`, `scale` and
/// `bias` (see [`Acts`]). A block holding a non-finite value gets a NaN scale,
/// so every output of the row is NaN.
///
/// Runs at the current vector level; every step is exact or one IEEE rounding
/// (the product `x · (1 / d)`), and the rounding to an integer is done exactly
/// (truncate, then compare the exact remainder with ±0.5: ties away from zero,
/// as `f32::round`), so every level gives the same values.
pub(crate) fn quantize_row(
    x: &[f32],
    offset: i32,
    q: &mut [i8],
    scale: &mut [f32],
    bias: &mut [i32],
) {
    super::simd::vectorized!(quantize_row_body(x, offset, q, scale, bias))
}

#[inline(always)]
fn quantize_row_body(x: &[f32], offset: i32, q: &mut [i8], scale: &mut [f32], bias: &mut [i32]) {
    let blocks = x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(scale.iter_mut())
        .zip(bias.chunks_exact_mut(LANES));
    for (((xb, qb), sc), bl) in blocks {
        let xb: &[f32; QK] = xb.try_into().expect("a block of 32");
        // The largest magnitude, in eight lanes (max is exact and
        // associative over non-NaN values; a NaN or infinity is flagged).
        let mut lanes = [0.0f32; LANES];
        let mut bad = 0u32;
        for c in xb.chunks_exact(LANES) {
            for (m, &v) in lanes.iter_mut().zip(c) {
                bad |= u32::from(v.to_bits() & 0x7f80_0000 == 0x7f80_0000);
                let a = v.abs();
                *m = if a > *m { a } else { *m };
            }
        }
        let amax = lanes.iter().fold(0.0f32, |m, &a| if a > m { a } else { m });
        let (d, id) = if bad != 0 {
            (f32::NAN, 0.0)
        } else {
            let d = amax / 127.0;
            (d, if d != 0.0 { 1.0 / d } else { 0.0 })
        };
        *sc = d;
        let mut qi = [0i32; QK];
        for (o, &v) in qi.iter_mut().zip(xb) {
            // |y| <= 127 (plus rounding) for a finite block; the clamp also
            // maps the NaN of a non-finite one to a number
            // (not `clamp`, which passes a NaN through)
            #[allow(clippy::manual_clamp)]
            let y = (v * id).max(-128.0).min(128.0);
            // SAFETY: y is finite and within ±128, so it fits an i32.
            let t = unsafe { y.to_int_unchecked::<i32>() };
            let r = y - t as f32;
            let t = t + i32::from(r >= 0.5) - i32::from(r <= -0.5);
            *o = t.clamp(-127, 127);
        }
        for (o, &v) in qb.iter_mut().zip(&qi) {
            *o = v as i8;
        }
        for (l, b) in bl.iter_mut().enumerate() {
            *b = -offset * (qi[4 * l] + qi[4 * l + 1] + qi[4 * l + 2] + qi[4 * l + 3]);
        }
    }
}

/// An IEEE binary16 bit pattern widened to f32 (exact).
#[inline]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    fucina_storage::half::f16::from_bits(bits).to_f32()
}

/// Which kernel a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2 `vpmaddubsw` + `vpmaddwd` (needs AVX2, FMA, F16C).
    Avx2,
    /// AVX-512 VNNI `vpdpbusd` on 256-bit vectors (needs AVX-512 F/BW/VL/VNNI, FMA, F16C).
    Vnni,
}

/// The path for the features the current vector level enables
/// ([`super::simd::CpuFeatures::enabled`]): VNNI where AVX-512 F/BW/VL/VNNI,
/// AVX2, FMA and F16C are all enabled, AVX2 where AVX2, FMA and F16C are,
/// portable otherwise.
pub(crate) fn path() -> Path {
    use super::simd::CpuFeatures as F;
    let avx2 = F::AVX2.with(F::FMA).with(F::F16C);
    let vnni = avx2
        .with(F::AVX512F)
        .with(F::AVX512BW)
        .with(F::AVX512VL)
        .with(F::AVX512VNNI);
    super::simd::choose(&[(Path::Vnni, vnni), (Path::Avx2, avx2)], Path::Portable)
}

/// Where a block-of-32 format's fields sit, for the vector kernels (its
/// bytes, activation offset and min are its `BlockFormat` constants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Offset of the values (Q8_0's bytes or the nibbles).
    pub values: usize,
    /// Offset of the 32 high bits (the Q5 formats).
    pub high: Option<usize>,
    /// Whether the values are signed bytes (Q8_0, the table values of
    /// IQ4_NL), else unsigned codes with the activations' lane bias.
    pub signed: bool,
    /// Whether the nibbles index the non-linear table (IQ4_NL).
    pub table: bool,
}

impl Shape {
    /// Whether the values are 16 bytes of nibbles (every format but Q8_0).
    pub(crate) const fn nibbles(self) -> bool {
        !self.signed || self.table
    }
}

/// A block-of-32 format the vector kernels of this module and the strip
/// layout (`quant_packed`) take: an f16 scale first, then (for Q4_1, Q5_1,
/// `NEEDS_SUMS`) an f16 min, and the fields its [`Shape`] places.
pub(crate) trait Block32: BlockFormat {
    /// Where its fields sit.
    const SHAPE: Shape;
}

/// Computes the outputs of weight rows `rows` for all `m` activation rows
/// with the vector kernels of the current level, for the block-of-32 format
/// `F`: `out_t[(j - rows.start) * m + i] = dot(w row j,
/// activation row i)` in the format's fixed order (its `dot_block`); `false`
/// (nothing written) at the portable level. `sums` are the activation block
/// sums (read only by the formats with a min).
///
/// The operands must pass `quant_block::quant_rows`'s bounds checks (its
/// callers' contract).
pub(crate) fn simd_rows<F: Block32>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) -> bool {
    match path() {
        #[cfg(target_arch = "x86_64")]
        Path::Vnni => {
            // SAFETY: `path` returns Vnni only when the CPU has every feature
            // `x86::rows_vnni` enables; `quant_block::quant_rows` checked the
            // bounds contract.
            unsafe { x86::rows_vnni::<F>(w, row_bytes, rows, acts, sums, m, out_t) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => {
            // SAFETY: `path` returns Avx2 only when the CPU has AVX2, FMA and
            // F16C; `quant_block::quant_rows` checked the bounds contract.
            unsafe { x86::rows_avx2::<F>(w, row_bytes, rows, acts, sums, m, out_t) };
            true
        }
        _ => {
            let _ = (w, row_bytes, rows, acts, sums, m, out_t);
            false
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    //! The x86-64 kernels: tiles of `R` weight rows × `M` activation rows, each
    //! weight block loaded (and unpacked) once for the `M` rows, each
    //! activation block once for the `R` rows; one 8-lane f32 accumulator per
    //! output, in the fixed order of the module documentation (plus, for the
    //! formats with a min, the min term on lane 0 after each block, as their
    //! `dot_block`).

    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Acts, Block32, LANES, QK};
    use crate::kernels::quant_block::iq4_nl::KVALUES;

    /// Weight rows per tile.
    pub(crate) const R_TILE: usize = 4;

    /// Runs `$tile::<$k, R, M>` over `rows` × `0..m` in tiles of up to `$mt`
    /// activation rows and [`R_TILE`] weight rows (single rows at the end),
    /// writing `out_t[(j - rows.start) * m + i]`: weight rows outermost, so a
    /// tile's weight rows stay in cache across the activation rows, and the
    /// activation rows of a prefill-sized call in chunks of [`act_chunk`] that
    /// stay in L2 while the range's weight rows pass over them. `$k` is the
    /// format type parameter of `$tile` (a [`Block32`] here, a `KVector` in
    /// `quant_k`): the driver of every in-place quantized tile.
    macro_rules! drive {
        ($tile:ident, $mt:expr, $k:ident, $w:ident, $row_bytes:ident, $rows:ident, $acts:ident, $sums:ident, $m:ident, $out_t:ident) => {{
            use $crate::kernels::quant_dot::x86::{R_TILE, act_chunk};
            let start = $rows.start;
            let chunk = act_chunk($acts.cols);
            let mut c0 = 0;
            while c0 < $m {
                let c1 = ($m - c0).min(chunk) + c0;
                let mut j = $rows.start;
                while j < $rows.end {
                    let r = if $rows.end - j >= R_TILE { R_TILE } else { 1 };
                    let mut i = c0;
                    while i < c1 {
                        let mm = (c1 - i).min($mt);
                        macro_rules! run {
                            ($r:literal, $mm:literal) => {{
                                let res = $tile::<$k, $r, $mm>($w, $row_bytes, j, $acts, $sums, i);
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
                c0 = c1;
            }
        }};
    }
    pub(crate) use drive;

    /// The AVX2 kernel over `rows` (see [`super::simd_rows`]).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; the slices must satisfy
    /// `quant_rows`'s asserted bounds.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2<F: Block32>(
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &Acts<'_>,
        sums: &[f32],
        m: usize,
        out_t: &mut [f32],
    ) {
        // Two activation rows per tile: 8 accumulators, the weights, the
        // activations and temporaries fit the 16 registers.
        drive!(tile_avx2, 2, F, w, row_bytes, rows, acts, sums, m, out_t)
    }

    /// The AVX-512 VNNI kernel over `rows` (see [`super::simd_rows`]).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the slices must
    /// satisfy `quant_rows`'s asserted bounds.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows_vnni<F: Block32>(
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &Acts<'_>,
        sums: &[f32],
        m: usize,
        out_t: &mut [f32],
    ) {
        drive!(tile_vnni, 4, F, w, row_bytes, rows, acts, sums, m, out_t)
    }

    /// [`tile_vnni`] for an even `M`: the pairs of activation rows on 512-bit
    /// vectors (its [`tile_vnni_pairs`]); an odd `M` on 256-bit ones.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn tile_vnni<F: Block32, const R: usize, const M: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; M]; R] {
        let mut out = [[0.0f32; M]; R];
        match M {
            4 => {
                let t = tile_vnni_pairs::<F, R, 2>(w, row_bytes, j0, acts, sums, i0);
                for (o, t) in out.iter_mut().zip(&t) {
                    o.copy_from_slice(&t[..M]);
                }
            }
            2 => {
                let t = tile_vnni_pairs::<F, R, 1>(w, row_bytes, j0, acts, sums, i0);
                for (o, t) in out.iter_mut().zip(&t) {
                    o.copy_from_slice(&t[..M]);
                }
            }
            _ => out = tile_vnni_256::<F, R, M>(w, row_bytes, j0, acts, sums, i0),
        }
        out
    }

    /// How far ahead of the block being read the weights are prefetched.
    const PREFETCH_BYTES: usize = 640;

    /// Activation rows per chunk of a prefill-sized call: about 192 KiB of
    /// their values, lane biases and scales (`2.125 · cols` bytes a row), so
    /// that a chunk stays in L2 while the range's weight rows pass over it; a
    /// multiple of 4 (the widest tile), at least 4.
    pub(crate) fn act_chunk(cols: usize) -> usize {
        let per_row = cols * 2 + cols / 8;
        ((192 << 10) / per_row.max(1)).max(4) / 4 * 4
    }

    /// A hint to bring the weight line [`PREFETCH_BYTES`] past `blk` into L1
    /// (the rows are read in streams; the hint keeps several misses in flight).
    /// With it, a hint to bring the same place `ahead` bytes on (the next
    /// tile's row) into L2: a tile's rows are short streams that the hardware
    /// prefetcher does not run ahead of.
    #[inline(always)]
    fn prefetch(blk: *const u8, ahead: usize) {
        // SAFETY: a prefetch never faults and reads nothing observable; the
        // addresses are computed with wrapping arithmetic, never dereferenced.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH_BYTES).cast());
            _mm_prefetch::<_MM_HINT_T1>(blk.wrapping_add(ahead).cast());
        }
    }

    /// The block's f16 scale and (lane 1) the f16 that follows it (the min
    /// of the formats with one), widened to f32.
    ///
    /// # Safety
    /// `p` must be valid for reading eight bytes (a block is at least 18).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn scale_min_at(p: *const u8) -> (f32, f32) {
        // SAFETY: the caller guarantees eight readable bytes; lanes 2 and 3
        // (the block's next bytes) are unused.
        let v = _mm_cvtph_ps(unsafe { _mm_loadl_epi64(p.cast()) });
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// A block's 32 weight values in element order as bytes: Q8_0 values as
    /// they are (signed); nibbles unpacked (low nibbles = elements 0..15, high
    /// nibbles = 16..31), with the fifth bits of the Q5 formats (unsigned
    /// `0..=31`), or looked up in IQ4_NL's table (signed).
    ///
    /// # Safety
    /// `blk` must be valid for reading one block of format `K`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn block_values<F: Block32>(blk: *const u8) -> __m256i {
        let sh = F::SHAPE;
        if sh.signed && !sh.table {
            // SAFETY: 32 readable value bytes (the caller's contract).
            return unsafe { _mm256_loadu_si256(blk.add(sh.values).cast()) };
        }
        // SAFETY: 16 readable nibble bytes (the caller's contract).
        let raw =
            _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(blk.add(sh.values).cast()) });
        // the upper copy shifted by 4 within each 32-bit lane: after the
        // mask, byte k of it holds byte k's high nibble
        let both = _mm256_srlv_epi32(raw, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        let nib = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
        if sh.table {
            let mut t = [0u8; 16];
            for (t, &v) in t.iter_mut().zip(&KVALUES) {
                *t = v as u8;
            }
            // SAFETY: `t` is 16 bytes.
            let table = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.as_ptr().cast()) });
            return _mm256_shuffle_epi8(table, nib);
        }
        match sh.high {
            Some(off) => {
                // SAFETY: the four bytes of high bits are inside the block.
                let qh = unsafe { blk.add(off).cast::<u32>().read_unaligned() };
                _mm256_or_si256(nib, high_bits(qh))
            }
            None => nib,
        }
    }

    /// Byte `k` = 16 where bit `k` of `qh` is set, else 0 (the Q5 formats'
    /// fifth bits, ready to be or-ed into their nibbles).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn high_bits(qh: u32) -> __m256i {
        let v = _mm256_set1_epi32(qh as i32);
        // byte k takes byte k / 8 of qh
        let spread = _mm256_shuffle_epi8(
            v,
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    /// The eight lanes folded in halves (l + 4, l + 2, l + 1), as in the
    /// portable order.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn fold(v: __m256) -> f32 {
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps::<0b01>(q, q)))
    }

    /// Checks a tile's reads against the slices (once per tile, not per block).
    #[inline(always)]
    fn check_tile<F: Block32, const R: usize, const M: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) {
        let nb = acts.cols / QK;
        assert!(row_bytes == nb * F::BYTES, "quant tile: row bytes");
        assert!((j0 + R) * row_bytes <= w.len(), "quant tile: weight rows");
        assert!(
            (i0 + M) * acts.cols <= acts.q.len(),
            "quant tile: activations"
        );
        assert!((i0 + M) * nb <= acts.scale.len(), "quant tile: scales");
        assert!(
            (i0 + M) * nb * LANES <= acts.bias.len(),
            "quant tile: biases"
        );
        if F::NEEDS_SUMS {
            assert!((i0 + M) * nb <= sums.len(), "quant tile: sums");
        }
    }

    /// One activation block for the tile's `M` rows: the values, the lane
    /// biases (when `bias`), the scales and (for a min) the block sums.
    struct ActBlock<const M: usize> {
        values: [__m256i; M],
        bias: [__m256i; M],
        scale: [f32; M],
        sum: [f32; M],
    }

    /// Loads block `b` of activation rows `i0..i0 + M`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn act_block<F: Block32, const M: usize>(
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
        b: usize,
        bias: bool,
    ) -> ActBlock<M> {
        let nb = acts.cols / QK;
        let mut a = ActBlock {
            values: [_mm256_setzero_si256(); M],
            bias: [_mm256_setzero_si256(); M],
            scale: [0.0; M],
            sum: [0.0; M],
        };
        for i in 0..M {
            let row = i0 + i;
            // SAFETY: check_tile: row < i0 + M, so the 32 values at
            // row * cols + 32 b and the 8 biases at (row * nb + b) * 8 are in bounds.
            unsafe {
                a.values[i] =
                    _mm256_loadu_si256(acts.q.as_ptr().add(row * acts.cols + b * QK).cast());
                if bias {
                    a.bias[i] =
                        _mm256_loadu_si256(acts.bias.as_ptr().add((row * nb + b) * LANES).cast());
                }
            }
            a.scale[i] = acts.scale[row * nb + b];
            if F::NEEDS_SUMS {
                a.sum[i] = sums[row * nb + b];
            }
        }
        a
    }

    /// `acc = fma(dw · dx, p, acc)`, then for a format with a min its term on
    /// lane 0: `acc[0] = fma(mw · dx, S, acc[0])`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn accumulate<F: Block32>(
        acc: __m256,
        p: __m256i,
        dw: f32,
        mw: f32,
        dx: f32,
        sum: f32,
    ) -> __m256 {
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(p), acc);
        if F::NEEDS_SUMS {
            let t = _mm256_fmadd_ps(_mm256_set1_ps(mw * dx), _mm256_set1_ps(sum), acc);
            _mm256_blend_ps::<0b1>(acc, t)
        } else {
            acc
        }
    }

    /// The tile's outputs: each accumulator folded.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn fold_tile<const R: usize, const M: usize>(acc: &[[__m256; M]; R]) -> [[f32; M]; R] {
        let mut out = [[0.0f32; M]; R];
        for (o, a) in out.iter_mut().zip(acc) {
            for (o, &a) in o.iter_mut().zip(a) {
                *o = fold(a);
            }
        }
        out
    }

    /// Outputs of weight rows `j0..j0 + R` × activation rows `i0..i0 + M`
    /// with `vpmaddubsw` + `vpmaddwd`: signed values (Q8_0, IQ4_NL) through
    /// the sign trick (`|w| · (x · sign w)`, at most 128 · 127 per product so
    /// the 16-bit pair sums never saturate), unsigned codes (at most 31)
    /// directly plus the lane bias where the format has an offset.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    // `i` indexes the accumulators and the activation block alike
    #[allow(clippy::needless_range_loop)]
    fn tile_avx2<F: Block32, const R: usize, const M: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; M]; R] {
        check_tile::<F, R, M>(w, row_bytes, j0, acts, sums, i0);
        let sh = F::SHAPE;
        let nb = acts.cols / QK;
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); M]; R];
        for b in 0..nb {
            let x = act_block::<F, M>(acts, sums, i0, b, !sh.signed && F::ACT_OFFSET != 0);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                // SAFETY: check_tile: row j0 + r is inside `w`; block b of it
                // spans `F::BYTES` bytes from `blk`.
                let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + b * F::BYTES) };
                // SAFETY: as above (a whole block is readable).
                let ((dw, mw), wv) = unsafe { (scale_min_at(blk), block_values::<F>(blk)) };
                prefetch(blk, R * row_bytes);
                let aw = if sh.signed {
                    _mm256_sign_epi8(wv, wv)
                } else {
                    wv
                };
                for i in 0..M {
                    let p = if sh.signed {
                        let pairs = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x.values[i], wv));
                        _mm256_madd_epi16(pairs, ones)
                    } else {
                        let pairs = _mm256_maddubs_epi16(wv, x.values[i]);
                        let p = _mm256_madd_epi16(pairs, ones);
                        if F::ACT_OFFSET != 0 {
                            _mm256_add_epi32(p, x.bias[i])
                        } else {
                            p
                        }
                    };
                    acc_r[i] = accumulate::<F>(acc_r[i], p, dw, mw, x.scale[i], x.sum[i]);
                }
            }
        }
        fold_tile(&acc)
    }

    /// [`tile_avx2`] with `vpdpbusd` on 256-bit vectors: the lane bias (`-offset · Σ x` per lane)
    /// is the accumulator's start, and the unsigned operand is the code or
    /// the signed value `+ 128` (`^ 0x80`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    // `i` indexes the accumulators and the activation block alike
    #[allow(clippy::needless_range_loop)]
    fn tile_vnni_256<F: Block32, const R: usize, const M: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; M]; R] {
        check_tile::<F, R, M>(w, row_bytes, j0, acts, sums, i0);
        let sh = F::SHAPE;
        let nb = acts.cols / QK;
        let flip = _mm256_set1_epi8(-128);
        let mut acc = [[_mm256_setzero_ps(); M]; R];
        for b in 0..nb {
            let x = act_block::<F, M>(acts, sums, i0, b, F::ACT_OFFSET != 0);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                // SAFETY: as in tile_avx2.
                let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + b * F::BYTES) };
                // SAFETY: as in tile_avx2.
                let ((dw, mw), wv) = unsafe { (scale_min_at(blk), block_values::<F>(blk)) };
                prefetch(blk, R * row_bytes);
                let wu = if sh.signed {
                    _mm256_xor_si256(wv, flip)
                } else {
                    wv
                };
                for i in 0..M {
                    let p = _mm256_dpbusd_epi32(x.bias[i], wu, x.values[i]);
                    acc_r[i] = accumulate::<F>(acc_r[i], p, dw, mw, x.scale[i], x.sum[i]);
                }
            }
        }
        fold_tile(&acc)
    }

    /// The `2 P` activation rows from `i0` as `P` pairs on 512-bit vectors:
    /// [`tile_vnni_256`]'s operations, two outputs' eight lanes per vector
    /// (the lower half row `i0 + 2 p`, the upper `i0 + 2 p + 1`), so that one
    /// `vpdpbusd`, conversion, scale product and multiply-add serve two
    /// outputs; the scale products `dw · dx` are the same IEEE products,
    /// taken lane by lane. Returns `[[f32; 4]; R]` with the first `2 P` of
    /// each row used.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn tile_vnni_pairs<F: Block32, const R: usize, const P: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; 4]; R] {
        // 2 P rows from i0 (P is 1 or 2)
        if P == 2 {
            check_tile::<F, R, 4>(w, row_bytes, j0, acts, sums, i0);
        } else {
            check_tile::<F, R, 2>(w, row_bytes, j0, acts, sums, i0);
        }
        let sh = F::SHAPE;
        let nb = acts.cols / QK;
        let flip = _mm256_set1_epi8(-128);
        let join = |a: __m256i, b: __m256i| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
        let halves =
            |a: f32, b: f32| _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b));
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        for b in 0..nb {
            let mut xv = [_mm512_setzero_si512(); P];
            let mut xb = [_mm512_setzero_si512(); P];
            let mut dx = [_mm512_setzero_ps(); P];
            let mut sum = [_mm512_setzero_ps(); P];
            for p in 0..P {
                let x = act_block::<F, 2>(acts, sums, i0 + 2 * p, b, F::ACT_OFFSET != 0);
                xv[p] = join(x.values[0], x.values[1]);
                xb[p] = join(x.bias[0], x.bias[1]);
                dx[p] = halves(x.scale[0], x.scale[1]);
                sum[p] = halves(x.sum[0], x.sum[1]);
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                // SAFETY: as in tile_avx2.
                let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + b * F::BYTES) };
                // SAFETY: as in tile_avx2.
                let ((dw, mw), wv) = unsafe { (scale_min_at(blk), block_values::<F>(blk)) };
                prefetch(blk, R * row_bytes);
                let wu = if sh.signed {
                    _mm256_xor_si256(wv, flip)
                } else {
                    wv
                };
                let wu = _mm512_broadcast_i64x4(wu);
                let (dw, mw) = (_mm512_set1_ps(dw), _mm512_set1_ps(mw));
                for (a, ((xv, xb), (dx, sum))) in acc_r
                    .iter_mut()
                    .zip(xv.iter().zip(&xb).zip(dx.iter().zip(&sum)))
                {
                    let p = _mm512_dpbusd_epi32(*xb, wu, *xv);
                    let s = _mm512_mul_ps(dw, *dx);
                    let t = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), *a);
                    *a = if F::NEEDS_SUMS {
                        // each half's lane 0: acc[0] = fma(mw · dx, S, acc[0])
                        let u = _mm512_fmadd_ps(_mm512_mul_ps(mw, *dx), *sum, t);
                        _mm512_mask_blend_ps(0x0101, t, u)
                    } else {
                        t
                    };
                }
            }
        }
        let mut out = [[0.0f32; 4]; R];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (p, &a) in a.iter().enumerate() {
                o[2 * p] = fold(_mm512_castps512_ps256(a));
                o[2 * p + 1] = fold(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                    _mm512_castps_pd(a),
                )));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::simd::{self, SimdLevel};

    /// The exact integer rounding equals `f32::round` (ties away from zero),
    /// at every level, on ties, near-ties and the ends of the range.
    #[test]
    fn activation_rounding_is_round_half_away_from_zero() {
        // amax 127 makes d = 1 and 1 / d = 1: q = round(x) directly
        let mut x = [
            127.0,
            -127.0,
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            0.499_999_97,
            -0.499_999_97,
            126.5,
            -126.5,
            3.0,
            0.0,
            -0.0,
            1e-30,
            63.5,
            -63.5,
            2.499_999_8,
            7.5,
            -7.5,
            100.5,
            0.75,
            -0.25,
            5.5,
            -5.5,
            9.499_999,
            11.5,
            -11.5,
            13.5,
            -13.5,
            15.5,
        ];
        let best = simd::detected();
        for level in SimdLevel::available() {
            simd::force(level);
            for sign in [1.0f32, -1.0] {
                for v in &mut x {
                    *v *= sign;
                }
                let (mut q, mut s, mut b) = ([0i8; 32], [0.0f32; 1], [0i32; 8]);
                quantize_row(&x, 128, &mut q, &mut s, &mut b);
                assert_eq!(s[0], 1.0);
                for (k, (&qv, &xv)) in q.iter().zip(&x).enumerate() {
                    assert_eq!(f32::from(qv), xv.round(), "elem {k} = {xv} at {level:?}");
                }
                for l in 0..8 {
                    let sum: i32 = q[4 * l..4 * l + 4].iter().map(|&v| i32::from(v)).sum();
                    assert_eq!(b[l], -128 * sum);
                }
            }
        }
        simd::force(best);
    }
}
