//! The data movement of convolution: the geometry of one convolution, the walk
//! that maps a run of output positions to input positions for one kernel tap
//! (im2col and its adjoint col2im), the packer that writes image columns straight
//! into the GEMM's right-hand-side panels, and the direct depthwise kernels.
//!
//! A convolution's "column matrix" `B` (`K x OH*OW`, `K = Cg * KH * KW`) has the
//! row `kk = (c * KH + r) * KW + s` (input channel `c` of the group, kernel tap
//! `(r, s)`) and the column `j = oh * OW + ow`: `B[kk, j] = x[c, oh * sh + r * dh -
//! ph, ow * sw + s * dw - pw]`, zero outside the image. Nothing here does
//! arithmetic except col2im's sums (in a fixed order) and the depthwise kernels.

#[cfg(target_arch = "x86_64")]
use crate::kernels::depthwise_avx512;
use crate::kernels::gemm::{self, NR};
#[cfg(target_arch = "x86_64")]
use crate::kernels::simd::{self, SimdLevel};

/// The validated geometry of one convolution over `NCHW` (a 1-D convolution is
/// the 2-D one with `H = KH = 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConvGeom {
    /// Batch.
    pub(crate) n: usize,
    /// Input channels.
    pub(crate) c_in: usize,
    /// Input height and width.
    pub(crate) h: usize,
    /// Input width.
    pub(crate) w: usize,
    /// Output channels.
    pub(crate) c_out: usize,
    /// Kernel height.
    pub(crate) kh: usize,
    /// Kernel width.
    pub(crate) kw: usize,
    /// Groups.
    pub(crate) groups: usize,
    /// Stride `[h, w]`.
    pub(crate) stride: [usize; 2],
    /// Zero padding `[h, w]`.
    pub(crate) pad: [usize; 2],
    /// Dilation `[h, w]`.
    pub(crate) dil: [usize; 2],
    /// Output height.
    pub(crate) oh: usize,
    /// Output width.
    pub(crate) ow: usize,
}

impl ConvGeom {
    /// Input channels per group.
    pub(crate) fn cg(&self) -> usize {
        self.c_in / self.groups
    }
    /// Output channels per group.
    pub(crate) fn og(&self) -> usize {
        self.c_out / self.groups
    }
    /// The GEMM depth `Cg * KH * KW`.
    pub(crate) fn k(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    /// Input pixels per channel.
    pub(crate) fn hw(&self) -> usize {
        self.h * self.w
    }
    /// Output pixels per channel.
    pub(crate) fn ohw(&self) -> usize {
        self.oh * self.ow
    }
    /// A 1x1 kernel, stride 1, no padding: the column matrix is the image itself.
    pub(crate) fn is_pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == [1, 1] && self.pad == [0, 0]
    }
    /// One input and one output channel per group (`groups == in == out`).
    pub(crate) fn is_depthwise(&self) -> bool {
        self.cg() == 1 && self.og() == 1
    }
    /// Stride 1 and not pointwise: the forward runs over the zero-padded image
    /// ("wide" columns: see [`widen`]).
    pub(crate) fn is_wide(&self) -> bool {
        self.stride == [1, 1] && !self.is_pointwise()
    }
    /// Whether the GEMM paths run over a group's zero-padded planes
    /// ([`xpad_len`](Self::xpad_len)) and wide columns: stride 1, neither
    /// pointwise nor depthwise (the direct depthwise kernels read the image).
    pub(crate) fn uses_padded_planes(&self) -> bool {
        self.is_wide() && !self.is_depthwise()
    }
    /// Width of the zero-padded image.
    pub(crate) fn wp(&self) -> usize {
        self.w + 2 * self.pad[1]
    }
    /// Height of the zero-padded image.
    pub(crate) fn hp(&self) -> usize {
        self.h + 2 * self.pad[0]
    }
    /// Wide columns: every output row at the padded width, `OH * Wp`.
    pub(crate) fn wide_cols(&self) -> usize {
        self.oh * self.wp()
    }
    /// Floats of the zero-padded planes of one group, with one padded row of
    /// slack (the last taps' wide rows read up to `(KW - 1) * dw` floats past the
    /// last plane).
    pub(crate) fn xpad_len(&self) -> usize {
        self.cg() * self.hp() * self.wp() + self.wp()
    }
    /// Where row `kk = (c, r, s)` of the wide column matrix starts in the padded
    /// planes: `c * Hp * Wp + r * dh * Wp + s * dw`.
    pub(crate) fn tap_off(&self, kk: usize) -> usize {
        let taps = self.kh * self.kw;
        let (c, r, s) = (kk / taps, kk % taps / self.kw, kk % self.kw);
        c * self.hp() * self.wp() + r * self.dil[0] * self.wp() + s * self.dil[1]
    }
    /// Columns of one block of the column matrix: the packed block (`K x cols`)
    /// stays within about 1 MiB, in L2 while the GEMM streams it. A function of
    /// `K` only (never of the batch or the team), so blocking cannot change a sum.
    pub(crate) fn col_block(&self) -> usize {
        ((256 * 1024 / self.k().max(1)) / NR * NR).clamp(NR, 512)
    }
}

/// Calls `f(d0, len, src)` for the consecutive runs that make up row `(r, s)` of
/// the column matrix over the columns `j0..j0 + len_total`: `d0` is the run's
/// offset from `j0`, and `src` is `Some(i)` when element `t` of the run is the
/// image element `i + t * sw` (`i` indexes one channel's `H x W` plane), `None`
/// for padding.
#[inline]
fn walk(
    g: &ConvGeom,
    r: usize,
    s: usize,
    j0: usize,
    len_total: usize,
    mut f: impl FnMut(usize, usize, Option<usize>),
) {
    let [sh, sw] = g.stride;
    let [ph, pw] = g.pad;
    let [dh, dw] = g.dil;
    // Valid output columns of this tap: 0 <= ow * sw + s * dw - pw < w.
    let off = (s * dw) as isize - pw as isize;
    let std::ops::Range { start: lo, end: hi } = valid(off, sw, g.w, g.ow);
    let mut j = j0;
    let end = j0 + len_total;
    while j < end {
        let oh = j / g.ow;
        let ow_a = j - oh * g.ow;
        let len = (g.ow - ow_a).min(end - j);
        let d0 = j - j0;
        let ih = (oh * sh + r * dh) as isize - ph as isize;
        if ih < 0 || ih >= g.h as isize {
            f(d0, len, None);
        } else {
            let a = lo.clamp(ow_a, ow_a + len);
            let b = hi.clamp(a, ow_a + len);
            if a > ow_a {
                f(d0, a - ow_a, None);
            }
            if b > a {
                let i = ih as usize * g.w + (a as isize * sw as isize + off) as usize;
                f(d0 + a - ow_a, b - a, Some(i));
            }
            if ow_a + len > b {
                f(d0 + b - ow_a, ow_a + len - b, None);
            }
        }
        j += len;
    }
}

/// Writes row `(r, s)` of the column matrix of one channel plane `img`
/// (`H x W`) over the columns `j0..j0 + dst.len()` into `dst`.
#[inline]
pub(crate) fn im2col_row(
    g: &ConvGeom,
    img: &[f32],
    r: usize,
    s: usize,
    j0: usize,
    dst: &mut [f32],
) {
    let sw = g.stride[1];
    walk(g, r, s, j0, dst.len(), |d0, len, src| {
        let d = &mut dst[d0..d0 + len];
        match src {
            None => d.fill(0.0),
            Some(i) if sw == 1 => d.copy_from_slice(&img[i..i + len]),
            Some(i) => {
                for (t, x) in d.iter_mut().enumerate() {
                    *x = img[i + t * sw];
                }
            }
        }
    });
}

/// The adjoint of [`im2col_row`]: adds `src` (row `(r, s)` of a column-matrix
/// gradient over the columns `j0..j0 + src.len()`) into the image positions it was
/// read from, in increasing column order; padding positions are dropped.
#[inline]
pub(crate) fn col2im_row(
    g: &ConvGeom,
    img: &mut [f32],
    r: usize,
    s: usize,
    j0: usize,
    src: &[f32],
) {
    let sw = g.stride[1];
    walk(g, r, s, j0, src.len(), |d0, len, at| {
        if let Some(i) = at {
            let v = &src[d0..d0 + len];
            if sw == 1 {
                for (x, &y) in img[i..i + len].iter_mut().zip(v) {
                    *x += y;
                }
            } else {
                for (t, &y) in v.iter().enumerate() {
                    img[i + t * sw] += y;
                }
            }
        }
    });
}

/// Packs the column matrix of one group of one sample (`xg`: its `Cg` channel
/// planes, contiguous) over the columns `j0..j0 + cols` into GEMM right-hand-side
/// panels: panel `p` (`K * NR` floats from `p * K * NR`) holds `B[kk, j0 + p * NR
/// + t]` at `kk * NR + t`, zero for columns past `cols`.
pub(crate) fn pack_cols(g: &ConvGeom, xg: &[f32], j0: usize, cols: usize, dst: &mut [f32]) {
    let k = g.k();
    let hw = g.hw();
    let panels = cols.div_ceil(NR);
    debug_assert!(dst.len() >= panels * k * NR);
    for c in 0..g.cg() {
        let img = &xg[c * hw..][..hw];
        for r in 0..g.kh {
            for s in 0..g.kw {
                let kk = (c * g.kh + r) * g.kw + s;
                for p in 0..panels {
                    let w = NR.min(cols - p * NR);
                    let d = &mut dst[p * k * NR + kk * NR..][..NR];
                    im2col_row(g, img, r, s, j0 + p * NR, &mut d[..w]);
                    d[w..].fill(0.0);
                }
            }
        }
    }
}

/// Copies the `Cg` planes of one group (`xg`) into zero-padded planes of `Hp x
/// Wp` (`xpad`, [`ConvGeom::xpad_len`] floats; the slack is zeroed too).
pub(crate) fn pad_image(g: &ConvGeom, xg: &[f32], xpad: &mut [f32]) {
    let (hw, wp, hp) = (g.hw(), g.wp(), g.hp());
    let [ph, pw] = g.pad;
    xpad.fill(0.0);
    for c in 0..g.cg() {
        let img = &xg[c * hw..][..hw];
        let dst = &mut xpad[c * hp * wp..][..hp * wp];
        for (ih, row) in img.chunks_exact(g.w).enumerate() {
            dst[(ih + ph) * wp + pw..][..g.w].copy_from_slice(row);
        }
    }
}

/// Packs the (valid) columns `j0..j0 + cols` of the column matrix of a stride-1
/// convolution into GEMM panels (as [`pack_cols`]), reading the zero-padded
/// planes: column `j = oh * OW + ow` of row `kk` is `xpad[`[`ConvGeom::tap_off`]`(kk)
/// + oh * Wp + ow]`, so a panel row is one copy per output row it touches (the
/// runs are found once per panel, the same for every `kk`).
pub(crate) fn pack_valid(g: &ConvGeom, xpad: &[f32], j0: usize, cols: usize, dst: &mut [f32]) {
    let (k, wp, ow) = (g.k(), g.wp(), g.ow);
    // (offset in the panel row, offset in the padded plane, length) per run.
    let mut runs = [(0usize, 0usize, 0usize); NR];
    for p in 0..cols.div_ceil(NR) {
        let w = NR.min(cols - p * NR);
        let (mut nrun, mut t) = (0, 0);
        while t < w {
            let j = j0 + p * NR + t;
            let (oh, c) = (j / ow, j % ow);
            let len = (ow - c).min(w - t);
            runs[nrun] = (t, oh * wp + c, len);
            nrun += 1;
            t += len;
        }
        let runs = &runs[..nrun];
        let panel = &mut dst[p * k * NR..][..k * NR];
        #[cfg(target_arch = "x86_64")]
        if simd::level() == SimdLevel::Avx512 {
            // SAFETY: `level` returns Avx512 only when the CPU has avx512f (and
            // the rest of the AVX-512 set), the feature `pack_runs_avx512`
            // enables; it checks its own bounds.
            unsafe { pack_runs_avx512(g, xpad, runs, panel) };
            continue;
        }
        for (kk, d) in panel.chunks_exact_mut(NR).enumerate() {
            let src = &xpad[g.tap_off(kk)..];
            for &(t, off, len) in runs {
                d[t..t + len].copy_from_slice(&src[off..off + len]);
            }
            d[w..].fill(0.0);
        }
    }
}

/// [`pack_valid`]'s panel from its runs with AVX-512 masked loads: row `kk` of
/// `panel` (`K x NR`) gets, for each run `(t, off, len)`, the `len` floats at
/// `xpad[tap_off(kk) + off..]` in columns `t..t + len`, and zeros past the last
/// run. Each of the row's two 16-float halves is the merge of one masked load
/// per run that overlaps it (the offsets and masks found once per panel), in
/// place of one `copy_from_slice` call per run and row.
///
/// Panics unless the runs are consecutive from column 0, at most `NR` columns
/// in all, and every run of every row lies inside `xpad`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn pack_runs_avx512(g: &ConvGeom, xpad: &[f32], runs: &[(usize, usize, usize)], panel: &mut [f32]) {
    use std::arch::x86_64::*;
    let k = g.k();
    assert_eq!(panel.len(), k * NR);
    // Per half `h`: (mask of its lanes, offset of lane 0 from `tap_off(kk)`).
    let mut pieces = [[(0u16, 0usize); NR]; 2];
    let mut count = [0usize; 2];
    let (mut next, mut end) = (0, 0);
    for &(t, off, len) in runs {
        assert!(
            t == next && len > 0 && t + len <= NR && off >= t,
            "pack_runs_avx512: runs"
        );
        next = t + len;
        end = end.max(off + len);
        for (h, (ps, n)) in pieces.iter_mut().zip(&mut count).enumerate() {
            let (a, b) = (t.max(16 * h), (t + len).min(16 * h + 16));
            if a < b {
                let mask = ((1u32 << (b - 16 * h)) - (1u32 << (a - 16 * h))) as u16;
                // Lane `l` of the load reads `off + (16h + l - t)`; `off >= t`
                // for every run of a panel (its column `j0 + p * NR + t` maps
                // to `oh * Wp + ow >= j0 + p * NR + t`), so this is not negative.
                ps[*n] = (mask, off + 16 * h - t);
                *n += 1;
            }
        }
    }
    // Every run of the last (largest-offset) row ends inside `xpad`.
    assert!(k == 0 || g.tap_off(k - 1) + end <= xpad.len());
    let base = xpad.as_ptr();
    // `tap_off(kk)` stepped along `(c, r, s)` instead of divided out per row.
    let (hpwp, rstep, sstep) = (g.hp() * g.wp(), g.dil[0] * g.wp(), g.dil[1]);
    let (mut r, mut s, mut row0, mut tap) = (0, 0, 0, 0);
    for (kk, d) in panel.chunks_exact_mut(NR).enumerate() {
        debug_assert_eq!(tap, g.tap_off(kk));
        for (h, (ps, &n)) in pieces.iter().zip(&count).enumerate() {
            let mut v = _mm512_setzero_ps();
            for &(mask, rel) in &ps[..n] {
                // SAFETY: the lanes the mask enables read `xpad[tap + off..][..len]`
                // of one run, inside `xpad` (asserted above for the largest
                // `tap`); masked-off lanes are not accessed, and the pointer is
                // formed with `wrapping_add`.
                v = unsafe { _mm512_mask_loadu_ps(v, mask, base.wrapping_add(tap + rel)) };
            }
            // SAFETY: `d` is one row of `NR = 32` floats; this writes `d[16h..16h + 16]`.
            unsafe { _mm512_storeu_ps(d.as_mut_ptr().add(16 * h), v) };
        }
        s += 1;
        tap += sstep;
        if s == g.kw {
            (s, r) = (0, r + 1);
            tap = row0 + r * rstep;
            if r == g.kh {
                r = 0;
                row0 += hpwp;
                tap = row0;
            }
        }
    }
}

/// Packs one right-hand-side panel of the weight gradient's `dY'ᵀ` straight
/// from the output gradient: `dst[t * NR + i]` is output channel `i < nr` (rows
/// `nr` rows of `dy` from `off`, each `OH * OW`) at wide column `j0 + t`
/// (`t < cols`), i.e. `dy[off + i * OH * OW + oh * OW + ow']` for `ow' < OW`
/// and `0` for the padding columns `ow' >= OW` — what [`widen`] then
/// `pack_b_panel` would give, without the widened copy.
pub(crate) fn pack_wide_dyt(
    g: &ConvGeom,
    dy: &[f32],
    off: usize,
    j0: usize,
    cols: usize,
    nr: usize,
    dst: &mut [f32],
) {
    let (wp, ohw) = (g.wp(), g.ohw());
    let mut t = 0;
    while t < cols {
        let j = j0 + t;
        let (oh, c) = (j / wp, j % wp);
        if c < g.ow {
            let len = (g.ow - c).min(cols - t);
            let d = &mut dst[t * NR..(t + len) * NR];
            gemm::pack_b_panel(d, dy, off + oh * g.ow + c, 1, ohw, len, nr);
            t += len;
        } else {
            let len = (wp - c).min(cols - t);
            dst[t * NR..(t + len) * NR].fill(0.0);
            t += len;
        }
    }
}

/// Writes output-gradient rows (`dy`: `rows x OH * OW`) at the padded width
/// into `wide` (`rows x OH * Wp`), zero in the columns `ow' >= OW`.
pub(crate) fn widen(g: &ConvGeom, dy: &[f32], wide: &mut [f32]) {
    let (wp, ohw, wc) = (g.wp(), g.ohw(), g.wide_cols());
    wide.fill(0.0);
    for (src, dst) in dy.chunks_exact(ohw).zip(wide.chunks_exact_mut(wc)) {
        for (s, d) in src.chunks_exact(g.ow).zip(dst.chunks_exact_mut(wp)) {
            d[..g.ow].copy_from_slice(s);
        }
    }
}

/// Adds a wide column-matrix gradient block (`K x cols`, wide columns `j0..j0 +
/// cols`) into zero-padded planes `dxpad`: row `kk` is one contiguous run at
/// [`ConvGeom::tap_off`]`(kk) + j0`, rows in increasing `kk` order.
pub(crate) fn col2im_wide(g: &ConvGeom, dxpad: &mut [f32], j0: usize, cols: usize, src: &[f32]) {
    for (kk, row) in src.chunks_exact(cols).enumerate() {
        for (x, &v) in dxpad[g.tap_off(kk) + j0..][..cols].iter_mut().zip(row) {
            *x += v;
        }
    }
}

/// Copies the interior (the image) of zero-padded planes into `Cg` planes
/// `dxg` (`H x W` each).
pub(crate) fn unpad_image(g: &ConvGeom, xpad: &[f32], dxg: &mut [f32]) {
    let (hw, wp, hp) = (g.hw(), g.wp(), g.hp());
    let [ph, pw] = g.pad;
    for c in 0..g.cg() {
        let src = &xpad[c * hp * wp..][..hp * wp];
        for (ih, row) in dxg[c * hw..][..hw].chunks_exact_mut(g.w).enumerate() {
            row.copy_from_slice(&src[(ih + ph) * wp + pw..][..g.w]);
        }
    }
}

/// Writes rows `rows` (a range of `kk`) of the column matrix of one group of one
/// sample over the columns `j0..j0 + cols` row-major into `dst` (`rows.len() x
/// cols`).
pub(crate) fn im2col_rows(
    g: &ConvGeom,
    xg: &[f32],
    rows: std::ops::Range<usize>,
    j0: usize,
    cols: usize,
    dst: &mut [f32],
) {
    let (hw, taps) = (g.hw(), g.kh * g.kw);
    for (i, kk) in rows.enumerate() {
        let (c, r, s) = (kk / taps, kk % taps / g.kw, kk % g.kw);
        im2col_row(
            g,
            &xg[c * hw..][..hw],
            r,
            s,
            j0,
            &mut dst[i * cols..][..cols],
        );
    }
}

/// Adds a column-matrix gradient block (`K x cols`, row-major, columns `j0..j0 +
/// cols`) into the input-gradient planes of one group of one sample (`dxg`), row
/// `kk` after row `kk - 1`.
pub(crate) fn col2im_block(g: &ConvGeom, dxg: &mut [f32], j0: usize, cols: usize, src: &[f32]) {
    let hw = g.hw();
    for c in 0..g.cg() {
        let img = &mut dxg[c * hw..][..hw];
        for r in 0..g.kh {
            for s in 0..g.kw {
                let kk = (c * g.kh + r) * g.kw + s;
                col2im_row(g, img, r, s, j0, &src[kk * cols..][..cols]);
            }
        }
    }
}

/// The output rows and columns tap `(r, s)` reads inside the image, and the
/// input row and column of output `(0, 0)` for that tap (offsets that may be
/// negative; only used inside the ranges).
pub(crate) struct Tap {
    pub(crate) rows: std::ops::Range<usize>,
    pub(crate) cols: std::ops::Range<usize>,
    pub(crate) ih0: isize,
    pub(crate) iw0: isize,
}

/// The valid output range along one axis: `o * st + off` in `0..size` for `o`
/// in `0..out`.
fn valid(off: isize, st: usize, size: usize, out: usize) -> std::ops::Range<usize> {
    let lo = if off >= 0 {
        0
    } else {
        off.unsigned_abs().div_ceil(st)
    };
    let hi = if (size as isize) - off <= 0 {
        0
    } else {
        ((size as isize - off - 1) as usize) / st + 1
    };
    let hi = hi.min(out);
    lo.min(hi)..hi
}

impl Tap {
    /// No output reads the image through this tap (it lies wholly in the
    /// padding): the offsets may then point outside the image.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty() || self.cols.is_empty()
    }
}

pub(crate) fn tap(g: &ConvGeom, r: usize, s: usize) -> Tap {
    let ih0 = (r * g.dil[0]) as isize - g.pad[0] as isize;
    let iw0 = (s * g.dil[1]) as isize - g.pad[1] as isize;
    Tap {
        rows: valid(ih0, g.stride[0], g.h, g.oh),
        cols: valid(iw0, g.stride[1], g.w, g.ow),
        ih0,
        iw0,
    }
}

/// Direct depthwise forward of one plane: `out[oh, ow] = b + Σ_(r,s) w[r, s] *
/// x[ih, iw]` over the taps inside the image, accumulated tap after tap (row-major
/// tap order) with separate multiplies and adds (the same bits at every vector
/// width). `out` is `OH x OW`, `img` `H x W`, `wk` `KH x KW`.
#[inline(always)]
pub(crate) fn depthwise_plane(g: &ConvGeom, img: &[f32], wk: &[f32], b: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if g.stride == [1, 1] && g.kw <= depthwise_avx512::MAX_KW && simd::level() == SimdLevel::Avx512
    {
        // SAFETY: the AVX-512 level is selected only on CPUs with AVX-512 F;
        // the kernel checks its own bounds.
        unsafe { depthwise_avx512::depthwise_plane_avx512(g, img, wk, b, out) };
        return;
    }
    out.fill(b);
    let [sh, sw] = g.stride;
    for r in 0..g.kh {
        for s in 0..g.kw {
            let wv = wk[r * g.kw + s];
            let t = tap(g, r, s);
            if t.is_empty() {
                continue;
            }
            for oh in t.rows.clone() {
                let ih = (oh * sh) as isize + t.ih0;
                let xrow = &img[ih as usize * g.w..][..g.w];
                let yrow = &mut out[oh * g.ow..][..g.ow];
                let x0 = (t.cols.start * sw) as isize + t.iw0;
                let ys = &mut yrow[t.cols.clone()];
                if sw == 1 {
                    for (y, &x) in ys.iter_mut().zip(&xrow[x0 as usize..]) {
                        *y += wv * x;
                    }
                } else {
                    for (i, y) in ys.iter_mut().enumerate() {
                        *y += wv * xrow[x0 as usize + i * sw];
                    }
                }
            }
        }
    }
}

/// Direct depthwise input gradient of one plane: `dx` (`H x W`, zeroed here)
/// gets `w[r, s] * dy[oh, ow]` added at every position the forward read, tap
/// after tap, each tap in increasing output order.
#[inline(always)]
pub(crate) fn depthwise_input_grad_plane(g: &ConvGeom, dy: &[f32], wk: &[f32], dx: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if g.stride == [1, 1] && g.kw <= depthwise_avx512::MAX_KW && simd::level() == SimdLevel::Avx512
    {
        // SAFETY: as in `depthwise_plane`.
        unsafe { depthwise_avx512::depthwise_input_grad_plane_avx512(g, dy, wk, dx) };
        return;
    }
    dx.fill(0.0);
    let [sh, sw] = g.stride;
    for r in 0..g.kh {
        for s in 0..g.kw {
            let wv = wk[r * g.kw + s];
            let t = tap(g, r, s);
            if t.is_empty() {
                continue;
            }
            for oh in t.rows.clone() {
                let ih = (oh * sh) as isize + t.ih0;
                let xrow = &mut dx[ih as usize * g.w..][..g.w];
                let ys = &dy[oh * g.ow..][t.cols.clone()];
                let x0 = ((t.cols.start * sw) as isize + t.iw0) as usize;
                if sw == 1 {
                    for (x, &y) in xrow[x0..].iter_mut().zip(ys) {
                        *x += wv * y;
                    }
                } else {
                    for (i, &y) in ys.iter().enumerate() {
                        xrow[x0 + i * sw] += wv * y;
                    }
                }
            }
        }
    }
}

/// A depthwise tap's weight gradient from its per-column sums (`OW` floats,
/// zero outside the tap's columns): their sum in column order. Both the plain
/// loops and the AVX-512 kernel end with it.
#[inline(always)]
pub(crate) fn tap_sum(acc: &[f32]) -> f32 {
    let mut sum = 0.0f32;
    for &v in acc {
        sum += v;
    }
    sum
}

/// Direct depthwise weight gradient of one channel over the batch: for every tap
/// `(r, s)`, `acc[ow]` collects `dy[n, oh, ow] * x[n, ih, iw]` over `(n, oh)` in
/// increasing order (one accumulator per output column, so the loop vectorizes
/// over `ow` with a fixed order), then `dw[r, s]` is the sum of `acc` in column
/// order. `planes(n)` gives sample `n`'s input plane and output-gradient plane.
#[inline(always)]
pub(crate) fn depthwise_weight_grad<'a>(
    g: &ConvGeom,
    planes: impl Fn(usize) -> (&'a [f32], &'a [f32]),
    acc: &mut [f32],
    dw: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if g.stride == [1, 1] && simd::level() == SimdLevel::Avx512 {
        // SAFETY: as in `depthwise_plane`.
        if unsafe { depthwise_avx512::depthwise_weight_grad_avx512(g, &planes, acc, dw) } {
            return;
        }
    }
    let [sh, sw] = g.stride;
    let acc = &mut acc[..g.ow];
    for r in 0..g.kh {
        for s in 0..g.kw {
            acc.fill(0.0);
            let t = tap(g, r, s);
            if t.is_empty() {
                // A tap wholly in the padding reads only zeros.
                dw[r * g.kw + s] = 0.0;
                continue;
            }
            let x0 = ((t.cols.start * sw) as isize + t.iw0) as usize;
            let a = &mut acc[t.cols.clone()];
            for n in 0..g.n {
                let (img, dy) = planes(n);
                for oh in t.rows.clone() {
                    let ih = ((oh * sh) as isize + t.ih0) as usize;
                    let xrow = &img[ih * g.w..][..g.w];
                    let ys = &dy[oh * g.ow..][t.cols.clone()];
                    if sw == 1 {
                        for ((a, &y), &x) in a.iter_mut().zip(ys).zip(&xrow[x0..]) {
                            *a += y * x;
                        }
                    } else {
                        for (i, (a, &y)) in a.iter_mut().zip(ys).enumerate() {
                            *a += y * xrow[x0 + i * sw];
                        }
                    }
                }
            }
            dw[r * g.kw + s] = tap_sum(acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(
        h: usize,
        w: usize,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        d: [usize; 2],
    ) -> ConvGeom {
        let oh = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) / s[0] + 1;
        let ow = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) / s[1] + 1;
        ConvGeom {
            n: 1,
            c_in: 1,
            h,
            w,
            c_out: 1,
            kh: k[0],
            kw: k[1],
            groups: 1,
            stride: s,
            pad: p,
            dil: d,
            oh,
            ow,
        }
    }

    /// The stride-1 packer over the padded planes gives the panels of the
    /// general packer (the column matrix's definition), for odd widths,
    /// several channels, dilation and any window of columns, at the active
    /// vector level (`FUCINA_SIMD=portable` runs the portable copies).
    #[test]
    fn pack_valid_matches_pack_cols() {
        for (mut g, c_in) in [
            (geom(14, 14, [3, 3], [1, 1], [1, 1], [1, 1]), 3),
            (geom(28, 28, [3, 3], [1, 1], [1, 1], [1, 1]), 1),
            (geom(5, 37, [2, 3], [1, 1], [0, 2], [1, 2]), 2),
            (geom(9, 4, [3, 1], [1, 1], [2, 0], [2, 1]), 2),
            (geom(3, 17, [1, 3], [1, 1], [1, 0], [1, 1]), 1),
        ] {
            (g.c_in, g.c_out) = (c_in, 1);
            let xg: Vec<f32> = (0..c_in * g.hw()).map(|i| i as f32 * 0.25 - 3.0).collect();
            let mut xpad = vec![f32::NAN; g.xpad_len()];
            pad_image(&g, &xg, &mut xpad);
            let ohw = g.ohw();
            for (j0, cols) in [
                (0, ohw),
                (1, ohw - 1),
                (5, 1),
                (ohw / 2, ohw - ohw / 2),
                (3, 40.min(ohw - 3)),
            ] {
                let n = cols.div_ceil(NR) * g.k() * NR;
                let (mut want, mut got) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                pack_cols(&g, &xg, j0, cols, &mut want);
                pack_valid(&g, &xpad, j0, cols, &mut got);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{g:?} j0={j0} cols={cols}");
            }
        }
    }

    /// Every im2col element, written through the runs, equals the definition,
    /// for any column window.
    #[test]
    fn im2col_rows_match_the_definition() {
        for g in [
            geom(5, 7, [3, 3], [1, 1], [1, 1], [1, 1]),
            geom(6, 5, [2, 3], [2, 3], [0, 2], [1, 2]),
            geom(4, 9, [3, 2], [1, 2], [2, 3], [2, 1]),
            geom(1, 1, [1, 1], [1, 1], [0, 0], [1, 1]),
        ] {
            let img: Vec<f32> = (0..g.hw()).map(|i| i as f32 + 1.0).collect();
            for r in 0..g.kh {
                for s in 0..g.kw {
                    for j0 in 0..g.ohw() {
                        for len in 1..=g.ohw() - j0 {
                            let mut d = vec![f32::NAN; len];
                            im2col_row(&g, &img, r, s, j0, &mut d);
                            for (t, &v) in d.iter().enumerate() {
                                let j = j0 + t;
                                let (oh, ow) = (j / g.ow, j % g.ow);
                                let ih =
                                    (oh * g.stride[0] + r * g.dil[0]) as isize - g.pad[0] as isize;
                                let iw =
                                    (ow * g.stride[1] + s * g.dil[1]) as isize - g.pad[1] as isize;
                                let want =
                                    if ih < 0 || iw < 0 || ih >= g.h as isize || iw >= g.w as isize
                                    {
                                        0.0
                                    } else {
                                        img[ih as usize * g.w + iw as usize]
                                    };
                                assert_eq!(v, want, "{g:?} r={r} s={s} j={j}");
                            }
                        }
                    }
                }
            }
        }
    }
}
