//! The portable emulation of the rule (every level; vectorized by
//! `vectorized!` at AVX2 and AVX-512).

use super::{KB, NT, PackedB, TILE, add, add_finite, finite, no_flush_possible, step, step_finite};

/// How [`portable_row`] computes a row against a panel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Any values: the scalar rule with the NaN rules spelled out.
    Exact,
    /// Finite values: the branch-free f64 steps.
    Finite,
    /// Finite values that cannot produce a result below `2^-126` (see the
    /// module docs), on a level with fused multiply-add instructions: plain
    /// `f32::mul_add`.
    Fused,
}

/// Portable emulation of one row `a` (`kblocks · 32` widened values) against
/// panel tiles `bt` (`kblocks` tiles): 16 outputs into `out`.
#[inline(always)]
fn portable_row(a: &[f32], bt: &[u16], kblocks: usize, mode: Mode, out: &mut [f32]) {
    let mut c = [0.0f32; NT];
    for kb in 0..kblocks {
        let (mut e, mut o) = ([0.0f32; NT], [0.0f32; NT]);
        let ak = &a[kb * KB..(kb + 1) * KB];
        let t = &bt[kb * TILE..(kb + 1) * TILE];
        for p in 0..KB / 2 {
            let (xe, xo) = (ak[2 * p], ak[2 * p + 1]);
            // A tile row as 16 words: the even element in the low half (so
            // `w << 16` is its f32), the odd one in the high half.
            let tw: &[u32] = bytemuck::cast_slice(&t[p * 32..(p + 1) * 32]);
            let tw: &[u32; NT] = tw.try_into().expect("a tile row");
            let even = |q: usize| f32::from_bits(tw[q] << 16);
            let odd = |q: usize| f32::from_bits(tw[q] & 0xffff_0000);
            match mode {
                Mode::Fused => {
                    for q in 0..NT {
                        e[q] = xe.mul_add(even(q), e[q]);
                        o[q] = xo.mul_add(odd(q), o[q]);
                    }
                }
                Mode::Finite => {
                    for q in 0..NT {
                        e[q] = step_finite(e[q], xe, even(q));
                        o[q] = step_finite(o[q], xo, odd(q));
                    }
                }
                Mode::Exact => {
                    for q in 0..NT {
                        e[q] = step(e[q], xe, even(q));
                        o[q] = step(o[q], xo, odd(q));
                    }
                }
            }
        }
        for q in 0..NT {
            c[q] = if mode == Mode::Exact {
                add(c[q], add(e[q], o[q]))
            } else {
                add_finite(c[q], add_finite(e[q], o[q]))
            };
        }
    }
    out[..NT].copy_from_slice(&c);
}

/// The portable emulation over whole panel pairs.
#[inline(always)]
pub(super) fn portable_panels(
    a: &[f32],
    spans: &[u16],
    b: &PackedB,
    m: usize,
    m_pad: usize,
    pairs: std::ops::Range<usize>,
    t: &mut [f32],
) {
    let kb = b.kblocks;
    let ka = kb * KB;
    let data = b.data();
    for (pi, tp) in pairs.zip(t.chunks_exact_mut(2 * m_pad * NT)) {
        for (h, tj) in tp.chunks_exact_mut(m_pad * NT).enumerate() {
            let j = 2 * pi + h;
            portable_rows(a, spans, data, b.spans[j], j, kb, 0..m, ka, tj);
        }
    }
}

/// Rows `rows` of the portable emulation against panel `j` (outputs at row
/// `i` of `tj`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn portable_rows(
    a: &[f32],
    spans: &[u16],
    data: &[u16],
    span_b: u16,
    j: usize,
    kb: usize,
    rows: std::ops::Range<usize>,
    ka: usize,
    tj: &mut [f32],
) {
    let bt = &data[j * kb * TILE..(j + 1) * kb * TILE];
    // Fused multiply-adds only where they are instructions (at the portable
    // level `mul_add` is a library call, slower than the f64 steps).
    let fma =
        crate::kernels::simd::CpuFeatures::enabled().has(crate::kernels::simd::CpuFeatures::FMA);
    for i in rows {
        let mode = if fma && no_flush_possible(spans[i], span_b) {
            Mode::Fused
        } else if finite(spans[i], span_b) {
            Mode::Finite
        } else {
            Mode::Exact
        };
        portable_row(
            &a[i * ka..(i + 1) * ka],
            bt,
            kb,
            mode,
            &mut tj[i * NT..(i + 1) * NT],
        );
    }
}
