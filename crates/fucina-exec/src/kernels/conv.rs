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

use crate::kernels::gemm::NR;

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
    let lo = if off >= 0 {
        0
    } else {
        (off.unsigned_abs()).div_ceil(sw)
    };
    let hi = if (g.w as isize) - off <= 0 {
        0
    } else {
        ((g.w as isize - off - 1) as usize) / sw + 1
    };
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

/// Writes the column matrix of one group of one sample over the columns `j0..j0
/// + cols` row-major into `dst` (`K x cols`).
pub(crate) fn im2col_block(g: &ConvGeom, xg: &[f32], j0: usize, cols: usize, dst: &mut [f32]) {
    let hw = g.hw();
    for c in 0..g.cg() {
        let img = &xg[c * hw..][..hw];
        for r in 0..g.kh {
            for s in 0..g.kw {
                let kk = (c * g.kh + r) * g.kw + s;
                im2col_row(g, img, r, s, j0, &mut dst[kk * cols..][..cols]);
            }
        }
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

/// Direct depthwise forward of one plane: `out[oh, ow] = b + Σ_(r,s) w[r, s] *
/// x[ih, iw]` over the taps inside the image, accumulated tap after tap (row-major
/// tap order) with separate multiplies and adds (the same bits at every vector
/// width). `out` is `OH x OW`, `img` `H x W`, `wk` `KH x KW`.
#[inline(always)]
pub(crate) fn depthwise_plane(g: &ConvGeom, img: &[f32], wk: &[f32], b: f32, out: &mut [f32]) {
    out.fill(b);
    let ow = g.ow;
    for r in 0..g.kh {
        for s in 0..g.kw {
            let wv = wk[r * g.kw + s];
            for oh in 0..g.oh {
                let row = &mut out[oh * ow..][..ow];
                walk(g, r, s, oh * ow, ow, |d0, len, src| {
                    if let Some(i) = src {
                        let o = &mut row[d0..d0 + len];
                        if g.stride[1] == 1 {
                            for (y, &x) in o.iter_mut().zip(&img[i..i + len]) {
                                *y += wv * x;
                            }
                        } else {
                            for (t, y) in o.iter_mut().enumerate() {
                                *y += wv * img[i + t * g.stride[1]];
                            }
                        }
                    }
                });
            }
        }
    }
}

/// Direct depthwise input gradient of one plane: `dx` (`H x W`, zeroed here)
/// gets `w[r, s] * dy[oh, ow]` added at every position the forward read, tap
/// after tap, each tap in increasing output order.
#[inline(always)]
pub(crate) fn depthwise_input_grad_plane(g: &ConvGeom, dy: &[f32], wk: &[f32], dx: &mut [f32]) {
    dx.fill(0.0);
    let ow = g.ow;
    for r in 0..g.kh {
        for s in 0..g.kw {
            let wv = wk[r * g.kw + s];
            for oh in 0..g.oh {
                let row = &dy[oh * ow..][..ow];
                walk(g, r, s, oh * ow, ow, |d0, len, at| {
                    if let Some(i) = at {
                        let v = &row[d0..d0 + len];
                        if g.stride[1] == 1 {
                            for (x, &y) in dx[i..i + len].iter_mut().zip(v) {
                                *x += wv * y;
                            }
                        } else {
                            for (t, &y) in v.iter().enumerate() {
                                dx[i + t * g.stride[1]] += wv * y;
                            }
                        }
                    }
                });
            }
        }
    }
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
    let ow = g.ow;
    let acc = &mut acc[..ow];
    for r in 0..g.kh {
        for s in 0..g.kw {
            acc.fill(0.0);
            for n in 0..g.n {
                let (img, dy) = planes(n);
                for oh in 0..g.oh {
                    let row = &dy[oh * ow..][..ow];
                    walk(g, r, s, oh * ow, ow, |d0, len, at| {
                        if let Some(i) = at {
                            let a = &mut acc[d0..d0 + len];
                            let v = &row[d0..d0 + len];
                            if g.stride[1] == 1 {
                                for ((a, &y), &x) in a.iter_mut().zip(v).zip(&img[i..i + len]) {
                                    *a += y * x;
                                }
                            } else {
                                for (t, (a, &y)) in a.iter_mut().zip(v).enumerate() {
                                    *a += y * img[i + t * g.stride[1]];
                                }
                            }
                        }
                    });
                }
            }
            let mut sum = 0.0f32;
            for &a in acc.iter() {
                sum += a;
            }
            dw[r * g.kw + s] = sum;
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
