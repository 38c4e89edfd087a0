//! The one-row attention of the decoder (and its two- and four-row forms):
//! a query row against the cached keys (stored transposed, in tiles of
//! [`BLOCK`] positions) and values, `softmax(scale · q·K)·V` in one fixed
//! order per output element (see [`attend_row`]). The loops are written once
//! as generic bodies and compiled for the process's vector level (inside
//! `with_avx512` / `with_avx2`); the AVX-512 arm keeps its accumulators in
//! registers (`avx512.rs`). Every level gives the same bits.

#[cfg(target_arch = "x86_64")]
use fucina::exec::{with_avx2, with_avx512};

use super::kernels::{exp, softcap, sum_lanes};

#[cfg(target_arch = "x86_64")]
mod avx512;

/// Positions whose scores (and output elements whose weighted sums) are
/// accumulated side by side, in vector registers: one key tile of the cache.
const BLOCK: usize = crate::cache::KEY_TILE;

/// Key tiles (and blocks of output elements) accumulated at once: independent
/// chains of additions, so that the loops are not bound by the latency of one.
const TILES: usize = 2;

/// `acc + x · row` for the `BLOCK` columns of `row`, each a fused
/// multiply-add (by value, so the accumulators stay in registers).
#[inline(always)]
fn axpy_block(mut acc: [f32; BLOCK], x: f32, row: &[f32; BLOCK]) -> [f32; BLOCK] {
    for c in 0..BLOCK {
        acc[c] = x.mul_add(row[c], acc[c]);
    }
    acc
}

/// Row `i` (of `BLOCK` elements) of `m`.
#[inline(always)]
fn block_row(m: &[f32], i: usize) -> &[f32; BLOCK] {
    m[i * BLOCK..(i + 1) * BLOCK]
        .try_into()
        .expect("a full block")
}

/// The scaled scores of the `G` key tiles starting at tile `tile0` of `keys`
/// (tiled layout), into `scores` (`G · BLOCK` of them): each `Σ_i q[i] · k[i]`
/// in increasing `i`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // by-value accumulators, kept in registers
fn score_tiles<const G: usize>(
    q: &[f32],
    keys: &[f32],
    tile0: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let d = q.len();
    let tiles: [&[f32]; G] =
        std::array::from_fn(|g| &keys[(tile0 + g) * d * BLOCK..(tile0 + g + 1) * d * BLOCK]);
    let mut acc = [[0.0f32; BLOCK]; G];
    for (i, &qi) in q.iter().enumerate() {
        for g in 0..G {
            acc[g] = axpy_block(acc[g], qi, block_row(tiles[g], i));
        }
    }
    for (s, a) in scores.iter_mut().zip(acc.iter().flatten()) {
        *s = a * scale;
    }
}

/// Output elements `first .. first + G · BLOCK` of `Σ_j p[j] · v_j` (values
/// `[p.len(), d]`), each in increasing `j`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // by-value accumulators, kept in registers
fn weigh_blocks<const G: usize>(
    p: &[f32],
    values: &[f32],
    d: usize,
    first: usize,
    out: &mut [f32],
) {
    let mut acc = [[0.0f32; BLOCK]; G];
    for (&pj, v) in p.iter().zip(values.chunks_exact(d)) {
        let v = &v[first..first + G * BLOCK];
        for g in 0..G {
            acc[g] = axpy_block(acc[g], pj, block_row(v, g));
        }
    }
    for (o, a) in out[first..first + G * BLOCK]
        .iter_mut()
        .zip(acc.iter().flatten())
    {
        *o = *a;
    }
}

/// [`score_tiles`], through [`avx512::score_tiles`] when `AVX512`.
#[inline(always)]
fn tiles_of_scores<const G: usize, const AVX512: bool>(
    q: &[f32],
    keys: &[f32],
    tile0: usize,
    scale: f32,
    scores: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX512 {
        // SAFETY: `AVX512` is set only inside `with_avx512` (the CPU has
        // AVX-512 F).
        return unsafe { avx512::score_tiles::<G>(q, keys, tile0, scale, scores) };
    }
    score_tiles::<G>(q, keys, tile0, scale, scores)
}

/// [`weigh_blocks`], through [`avx512::weigh_blocks`] when `AVX512`.
#[inline(always)]
fn blocks_of_weighted_sums<const G: usize, const AVX512: bool>(
    p: &[f32],
    values: &[f32],
    d: usize,
    first: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX512 {
        // SAFETY: as in `tiles_of_scores`.
        return unsafe { avx512::weigh_blocks::<G>(p, values, d, first, out) };
    }
    weigh_blocks::<G>(p, values, d, first, out)
}

/// One query row `q` of one head attending to the `n = values.len() / q.len()`
/// cached positions `lo..lo + n`: `out = Σ_j softmax(scale · q·k_j)_j · v_j`.
///
/// `keys_t` holds the head's keys in the cache's tiled layout (tiles of
/// [`BLOCK`] positions, each `[head_dim, BLOCK]`, whole: every tile that
/// `lo..lo + n` touches). Each score is
/// `Σ_d q[d] · k_j[d]` in increasing `d`, one fused multiply-add per term (the positions of a tile are computed
/// side by side, each its own sum), then scaled; the
/// softmax's maximum and sum run in increasing `j`, and so does each output
/// element's weighted sum of the values. `scores[..n]` is scratch.
///
/// Runs at the process's vector level: its vectors only hold independent
/// sums side by side (never parts of one sum), each term a fused multiply-add
/// at every level, so every level gives the same bits. The wider levels take more key tiles
/// (and output blocks) at once, which changes only which sums run side by
/// side.
pub(crate) fn attend_row(
    q: &[f32],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    row_at_level(q, keys_t, lo, values, scale, None, scores, out);
}

/// [`attend_row`] with soft-capped scores: each scaled score `s` becomes
/// `cap · tanh(s / cap)` before the softmax ([`softcap`]); the rest as
/// [`attend_row`], at the same vector levels and with the same bits on each
/// (the scores' and sums' fused multiply-adds are exactly rounded: at the
/// baseline level they are library calls, so the AVX2 and AVX-512 levels run
/// the body compiled for their instructions).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_row_capped(
    q: &[f32],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    scale: f32,
    cap: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    row_at_level(q, keys_t, lo, values, scale, Some(cap), scores, out);
}

/// [`attend_row`] (`cap` `None`) or [`attend_row_capped`] at the process's
/// vector level.
#[allow(clippy::too_many_arguments)]
fn row_at_level(
    q: &[f32],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    scale: f32,
    cap: Option<f32>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    use fucina::exec::SimdLevel;
    match fucina::exec::simd_level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `simd_level` returns Avx512 only when the CPU has every
        // feature `with_avx512` enables.
        SimdLevel::Avx512 => unsafe {
            with_avx512(
                #[inline(always)]
                || row_body::<4, true>(q, keys_t, lo, values, scale, cap, scores, out),
            )
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `simd_level` returns Avx2 only when the CPU has AVX2 and FMA.
        SimdLevel::Avx2 => unsafe {
            with_avx2(
                #[inline(always)]
                || row_body::<4, false>(q, keys_t, lo, values, scale, cap, scores, out),
            )
        },
        _ => row_body::<TILES, false>(q, keys_t, lo, values, scale, cap, scores, out),
    }
}

/// One row's attention, `T` key tiles (and output blocks) at a time, the
/// scaled scores soft-capped first when `cap` is given; `AVX512`: the tiles
/// through the AVX-512 kernels of [`avx512`] (the same operations on
/// 16-lane registers; only inside [`with_avx512`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn row_body<const T: usize, const AVX512: bool>(
    q: &[f32],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    scale: f32,
    cap: Option<f32>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let d = q.len();
    let n = values.len() / d;
    let scores = &mut scores[..n];
    scores_range::<T, AVX512>(q, keys_t, lo, lo..lo + n, scale, scores);
    if let Some(cap) = cap {
        softcap(scores, cap);
    }
    softmax_in_place(scores);
    weighted_sums::<T, AVX512>(scores, values, d, out);
}

/// [`attend_row`]'s body, `T` key tiles (and output blocks) at a time;
/// `AVX512`: the tiles through the AVX-512 kernels of [`avx512`] (the same
/// operations on 16-lane registers; only inside [`with_avx512`]).
#[inline(always)]
fn attend_row_body<const T: usize, const AVX512: bool>(
    q: &[f32],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    row_body::<T, AVX512>(q, keys_t, lo, values, scale, None, scores, out);
}

/// The scaled scores `scores[j - lo]` of the positions `range` (which starts
/// at `lo` or at a tile boundary): the whole key tiles in groups of `T`, then
/// single tiles; a tile only partly inside the range (at either end) is
/// scored whole and only its positions inside kept. Each score is the same
/// sum `Σ_i q[i] · k_j[i]` in increasing `i` however the tiles are grouped.
/// `keys_t` must hold every tile the range touches (the cache's keys are
/// whole tiles).
#[inline(always)]
fn scores_range<const T: usize, const AVX512: bool>(
    q: &[f32],
    keys_t: &[f32],
    lo: usize,
    range: std::ops::Range<usize>,
    scale: f32,
    scores: &mut [f32],
) {
    let end = range.end;
    if range.start >= end {
        return;
    }
    let first = range.start.next_multiple_of(BLOCK).min(end);
    let last = end / BLOCK * BLOCK;
    let mut part = [0.0f32; BLOCK];
    if range.start < first {
        tiles_of_scores::<1, AVX512>(q, keys_t, range.start / BLOCK, scale, &mut part);
        for j in range.start..first {
            scores[j - lo] = part[j % BLOCK];
        }
    }
    let mut start = first;
    while start + T * BLOCK <= last {
        let out = &mut scores[start - lo..start - lo + T * BLOCK];
        tiles_of_scores::<T, AVX512>(q, keys_t, start / BLOCK, scale, out);
        start += T * BLOCK;
    }
    while start < last {
        let out = &mut scores[start - lo..start - lo + BLOCK];
        tiles_of_scores::<1, AVX512>(q, keys_t, start / BLOCK, scale, out);
        start += BLOCK;
    }
    let tail = last.max(first);
    if tail < end {
        tiles_of_scores::<1, AVX512>(q, keys_t, tail / BLOCK, scale, &mut part);
        for j in tail..end {
            scores[j - lo] = part[j % BLOCK];
        }
    }
}

/// Softmax of `scores` in place: the maximum and the exponentials' sum (in the
/// fixed lane order of `sum_lanes`) in increasing position.
#[inline(always)]
fn softmax_in_place(scores: &mut [f32]) {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for s in scores.iter_mut() {
        *s = exp(*s - max);
    }
    let sum = sum_lanes(scores);
    for s in scores.iter_mut() {
        *s /= sum;
    }
}

/// `out = Σ_j p[j] · v_j` (values `[p.len(), d]`): groups of `T` blocks of
/// output elements, then single blocks, then the rest one by one (each
/// element's sum in increasing `j` either way).
#[inline(always)]
fn weighted_sums<const T: usize, const AVX512: bool>(
    p: &[f32],
    values: &[f32],
    d: usize,
    out: &mut [f32],
) {
    let mut first = 0;
    while first + T * BLOCK <= d {
        blocks_of_weighted_sums::<T, AVX512>(p, values, d, first, out);
        first += T * BLOCK;
    }
    while first + BLOCK <= d {
        blocks_of_weighted_sums::<1, AVX512>(p, values, d, first, out);
        first += BLOCK;
    }
    weighted_rest(p, values, d, first, out);
}

/// Output elements `first..d` of `Σ_j p[j] · v_j`, one by one.
#[inline(always)]
fn weighted_rest(p: &[f32], values: &[f32], d: usize, first: usize, out: &mut [f32]) {
    for (c, o) in out.iter_mut().enumerate().take(d).skip(first) {
        let mut a = 0.0f32;
        for (&pj, v) in p.iter().zip(values.chunks_exact(d)) {
            a = pj.mul_add(v[c], a);
        }
        *o = a;
    }
}

/// Two query rows of one head and sequence, both attending from `lo`: row
/// `a` to the first `na` of the `nb = values.len() / qa.len()` positions,
/// row `b` to all of them (`na <= nb`). Each row's scores, probabilities and
/// outputs are the same bits as [`attend_row`]'s; the two share the loads of
/// the keys and values, and at the AVX-512 level their independent sums run
/// side by side (twice the chains of additions of one row). `scores[..2 nb]`
/// is scratch.
#[allow(clippy::too_many_arguments)] // two rows' queries, outputs and lengths
pub(crate) fn attend_two_rows(
    qa: &[f32],
    qb: &[f32],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    na: usize,
    scale: f32,
    scores: &mut [f32],
    out_a: &mut [f32],
    out_b: &mut [f32],
) {
    use fucina::exec::SimdLevel;
    match fucina::exec::simd_level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `simd_level` returns Avx512 only when the CPU has every
        // feature `with_avx512` enables.
        SimdLevel::Avx512 => unsafe {
            with_avx512(
                #[inline(always)]
                || {
                    attend_two_rows_body::<4, true>(
                        qa, qb, keys_t, lo, values, na, scale, scores, out_a, out_b,
                    )
                },
            )
        },
        _ => {
            let d = qa.len();
            let nb = values.len() / d;
            let (sa, sb) = scores.split_at_mut(nb);
            attend_row(qa, keys_t, lo, &values[..na * d], scale, sa, out_a);
            attend_row(qb, keys_t, lo, values, scale, sb, out_b);
        }
    }
}

/// [`attend_two_rows`]'s AVX-512 body (see [`attend_row_body`]).
#[allow(clippy::too_many_arguments)] // as attend_two_rows
#[inline(always)]
fn attend_two_rows_body<const T: usize, const AVX512: bool>(
    qa: &[f32],
    qb: &[f32],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    na: usize,
    scale: f32,
    scores: &mut [f32],
    out_a: &mut [f32],
    out_b: &mut [f32],
) {
    let d = qa.len();
    let nb = values.len() / d;
    assert!(na <= nb && qb.len() == d, "attend_two_rows: row lengths");
    let (sa, sb) = scores.split_at_mut(nb);
    let (sa, sb) = (&mut sa[..na], &mut sb[..nb]);
    // The whole key tiles both rows attend to are scored together; the
    // positions around them row by row.
    let first = lo.next_multiple_of(BLOCK);
    let last = (lo + na) / BLOCK * BLOCK;
    if first >= last {
        attend_row_body::<T, AVX512>(qa, keys_t, lo, &values[..na * d], scale, sa, out_a);
        attend_row_body::<T, AVX512>(qb, keys_t, lo, values, scale, sb, out_b);
        return;
    }
    scores_range::<T, AVX512>(qa, keys_t, lo, lo..first, scale, sa);
    scores_range::<T, AVX512>(qb, keys_t, lo, lo..first, scale, sb);
    let mut start = first;
    while start + T * BLOCK <= last {
        let span = start - lo..start - lo + T * BLOCK;
        let (oa, ob) = (&mut sa[span.clone()], &mut sb[span]);
        two_tiles_of_scores::<T, AVX512>(qa, qb, keys_t, start / BLOCK, scale, oa, ob);
        start += T * BLOCK;
    }
    while start < last {
        let span = start - lo..start - lo + BLOCK;
        let (oa, ob) = (&mut sa[span.clone()], &mut sb[span]);
        two_tiles_of_scores::<1, AVX512>(qa, qb, keys_t, start / BLOCK, scale, oa, ob);
        start += BLOCK;
    }
    scores_range::<T, AVX512>(qa, keys_t, lo, last..lo + na, scale, sa);
    scores_range::<T, AVX512>(qb, keys_t, lo, last..lo + nb, scale, sb);
    softmax_in_place(sa);
    softmax_in_place(sb);
    let mut first = 0;
    while first + T * BLOCK <= d {
        two_blocks_of_weighted_sums::<T, AVX512>(sa, sb, values, d, first, out_a, out_b);
        first += T * BLOCK;
    }
    while first + BLOCK <= d {
        two_blocks_of_weighted_sums::<1, AVX512>(sa, sb, values, d, first, out_a, out_b);
        first += BLOCK;
    }
    weighted_rest(sa, values, d, first, out_a);
    weighted_rest(sb, values, d, first, out_b);
}

/// Four query rows of one head and sequence, all attending from `lo`: row
/// `r` to the first `n[r]` of the `n[3] = values.len() / d` positions
/// (`n` non-decreasing). Each row's scores, probabilities and outputs are
/// the same bits as [`attend_row`]'s; at the AVX-512 level the four share
/// the loads of the keys and values and their independent sums run side by
/// side (other levels run two pairs of [`attend_two_rows`]).
/// `scores[..4 · n[3]]` is scratch.
#[allow(clippy::too_many_arguments)] // four rows' queries, outputs and lengths
pub(crate) fn attend_four_rows(
    q: [&[f32]; 4],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    n: [usize; 4],
    scale: f32,
    scores: &mut [f32],
    out: [&mut [f32]; 4],
) {
    use fucina::exec::SimdLevel;
    let d = q[0].len();
    assert!(
        n[0] <= n[1] && n[1] <= n[2] && n[2] <= n[3] && values.len() == n[3] * d,
        "attend_four_rows: row lengths"
    );
    match fucina::exec::simd_level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `simd_level` returns Avx512 only when the CPU has every
        // feature `with_avx512` enables.
        SimdLevel::Avx512 => unsafe {
            with_avx512(
                #[inline(always)]
                || attend_four_rows_avx512(q, keys_t, lo, values, n, scale, scores, out),
            )
        },
        _ => {
            let [o0, o1, o2, o3] = out;
            let (s01, s23) = scores.split_at_mut(2 * n[3]);
            let v01 = &values[..n[1] * d];
            attend_two_rows(q[0], q[1], keys_t, lo, v01, n[0], scale, s01, o0, o1);
            let v23 = &values[..n[3] * d];
            attend_two_rows(q[2], q[3], keys_t, lo, v23, n[2], scale, s23, o2, o3);
        }
    }
}

/// [`attend_four_rows`]'s AVX-512 body (see [`attend_two_rows_body`]).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)] // as attend_four_rows
#[inline(always)]
fn attend_four_rows_avx512(
    q: [&[f32]; 4],
    keys_t: &[f32],
    lo: usize,
    values: &[f32],
    n: [usize; 4],
    scale: f32,
    scores: &mut [f32],
    out: [&mut [f32]; 4],
) {
    const T: usize = 4;
    let d = q[0].len();
    let nmax = n[3];
    let (s0, rest) = scores[..4 * nmax].split_at_mut(nmax);
    let (s1, rest) = rest.split_at_mut(nmax);
    let (s2, s3) = rest.split_at_mut(nmax);
    let mut s = [
        &mut s0[..n[0]],
        &mut s1[..n[1]],
        &mut s2[..n[2]],
        &mut s3[..n[3]],
    ];
    let mut out = out;
    let first = lo.next_multiple_of(BLOCK);
    let last = (lo + n[0]) / BLOCK * BLOCK;
    if first >= last {
        for r in 0..4 {
            let v = &values[..n[r] * d];
            attend_row_body::<T, true>(q[r], keys_t, lo, v, scale, s[r], out[r]);
        }
        return;
    }
    // The whole key tiles all four rows attend to, together; the positions
    // around them row by row.
    for r in 0..4 {
        scores_range::<T, true>(q[r], keys_t, lo, lo..first, scale, s[r]);
    }
    let mut start = first;
    while start < last {
        let g = if start + T * BLOCK <= last { T } else { 1 };
        let span = start - lo..start - lo + g * BLOCK;
        let [a, b, c, e] = &mut s;
        let o = [
            &mut a[span.clone()],
            &mut b[span.clone()],
            &mut c[span.clone()],
            &mut e[span],
        ];
        // SAFETY: inside `with_avx512` (the CPU has AVX-512 F).
        unsafe {
            match g {
                T => avx512::score_tiles4::<T>(q, keys_t, start / BLOCK, scale, o),
                _ => avx512::score_tiles4::<1>(q, keys_t, start / BLOCK, scale, o),
            }
        }
        start += g * BLOCK;
    }
    for r in 0..4 {
        scores_range::<T, true>(q[r], keys_t, lo, last..lo + n[r], scale, s[r]);
        softmax_in_place(s[r]);
    }
    let mut first = 0;
    while first + BLOCK <= d {
        let g = if first + T * BLOCK <= d { T } else { 1 };
        let p = [&*s[0], &*s[1], &*s[2], &*s[3]];
        let [a, b, c, e] = &mut out;
        let o = [&mut **a, &mut **b, &mut **c, &mut **e];
        // SAFETY: inside `with_avx512`.
        unsafe {
            match g {
                T => avx512::weigh_blocks4::<T>(p, values, d, first, o),
                _ => avx512::weigh_blocks4::<1>(p, values, d, first, o),
            }
        }
        first += g * BLOCK;
    }
    for r in 0..4 {
        weighted_rest(s[r], values, d, first, out[r]);
    }
}

/// [`tiles_of_scores`] of two query rows over the same tiles.
#[inline(always)]
fn two_tiles_of_scores<const G: usize, const AVX512: bool>(
    qa: &[f32],
    qb: &[f32],
    keys: &[f32],
    tile0: usize,
    scale: f32,
    out_a: &mut [f32],
    out_b: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX512 {
        // SAFETY: `AVX512` is set only inside `with_avx512`.
        return unsafe { avx512::score_tiles2::<G>(qa, qb, keys, tile0, scale, out_a, out_b) };
    }
    tiles_of_scores::<G, AVX512>(qa, keys, tile0, scale, out_a);
    tiles_of_scores::<G, AVX512>(qb, keys, tile0, scale, out_b);
}

/// [`blocks_of_weighted_sums`] of two rows of probabilities (`pa` a prefix
/// of the positions of `pb`).
#[inline(always)]
fn two_blocks_of_weighted_sums<const G: usize, const AVX512: bool>(
    pa: &[f32],
    pb: &[f32],
    values: &[f32],
    d: usize,
    first: usize,
    out_a: &mut [f32],
    out_b: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX512 {
        // SAFETY: `AVX512` is set only inside `with_avx512`.
        return unsafe { avx512::weigh_blocks2::<G>(pa, pb, values, d, first, out_a, out_b) };
    }
    blocks_of_weighted_sums::<G, AVX512>(pa, values, d, first, out_a);
    blocks_of_weighted_sums::<G, AVX512>(pb, values, d, first, out_b);
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use crate::model::kernels::tests::has_avx512;
    use crate::model::kernels::tests::noise;

    /// The attention of one row against a direct f64 evaluation, across block
    /// boundaries of positions and of output elements.
    #[test]
    fn attend_row_matches_f64() {
        for (d, n, lo) in [
            (8usize, 5usize, 0usize),
            (16, 16, 3),
            (24, 37, 2),
            (40, 1, 0),
            (64, 50, 10),
            (8, 40, 16),
            (8, 7, 17),
        ] {
            let cap = (lo + n + 3).next_multiple_of(BLOCK);
            let q: Vec<f32> = (0..d).map(|i| ((i * 7 % 11) as f32 - 5.0) / 7.0).collect();
            // Key element i of position j: k(j, i); stored tiled.
            let k = |j: usize, i: usize| ((j * 31 + i * 13) % 17) as f32 / 9.0 - 0.9;
            let mut kt = vec![0.0f32; d * cap];
            for j in 0..cap {
                for i in 0..d {
                    kt[j / BLOCK * d * BLOCK + i * BLOCK + j % BLOCK] = k(j, i);
                }
            }
            let v: Vec<f32> = (0..n * d)
                .map(|i| ((i * 5 % 23) as f32 - 11.0) / 10.0)
                .collect();
            let mut scores = vec![0.0f32; n];
            let mut out = vec![0.0f32; d];
            attend_row(&q, &kt, lo, &v, 0.3, &mut scores, &mut out);
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    (0..d)
                        .map(|i| q[i] as f64 * k(lo + j, i) as f64)
                        .sum::<f64>()
                        * 0.3
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for c in 0..d {
                let want: f64 = (0..n)
                    .map(|j| (s[j] - m).exp() / z * v[j * d + c] as f64)
                    .sum();
                assert!((out[c] as f64 - want).abs() < 1e-5, "d {d} n {n} c {c}");
            }
        }
    }

    /// Every compiled variant of the attention gives the bits
    /// of the portable body: whole tiles in groups of 1, 2 and 4, partial
    /// tiles at both ends, output blocks and a ragged rest.
    #[test]
    fn attention_is_the_same_bits_at_every_level() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (d, n, lo) in [
            (64usize, 200usize, 0usize),
            (64, 131, 5),
            (80, 77, 16),
            (32, 64, 0),
            (48, 3, 1),
            (64, 1, 0),
            (72, 150, 33),
        ] {
            let cap = (lo + n).next_multiple_of(BLOCK);
            let q = noise(d, 1);
            let kt = noise(d * cap, 2);
            let v = noise(n * d, 3);
            let run = |f: &dyn Fn(&mut [f32], &mut [f32])| {
                let (mut sc, mut out) = (vec![0.0f32; n], vec![0.0f32; d]);
                f(&mut sc, &mut out);
                bits(&out)
            };
            let want = run(&|sc, out| attend_row_body::<1, false>(&q, &kt, lo, &v, 0.125, sc, out));
            let portable =
                run(&|sc, out| attend_row_body::<TILES, false>(&q, &kt, lo, &v, 0.125, sc, out));
            assert_eq!(portable, want, "d {d} n {n} lo {lo}: portable");
            let four = run(&|sc, out| attend_row_body::<4, false>(&q, &kt, lo, &v, 0.125, sc, out));
            assert_eq!(four, want, "d {d} n {n} lo {lo}: four tiles");
            let dispatched = run(&|sc, out| attend_row(&q, &kt, lo, &v, 0.125, sc, out));
            assert_eq!(dispatched, want, "d {d} n {n} lo {lo}: dispatched");
            #[cfg(target_arch = "x86_64")]
            {
                if has_avx512() {
                    // SAFETY: the features were detected above.
                    let wide = run(&|sc, out| unsafe {
                        with_avx512(|| attend_row_body::<4, true>(&q, &kt, lo, &v, 0.125, sc, out))
                    });
                    assert_eq!(wide, want, "d {d} n {n} lo {lo}: AVX-512");
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the features were detected above.
                    let avx2 = run(&|sc, out| unsafe {
                        with_avx2(|| attend_row_body::<4, false>(&q, &kt, lo, &v, 0.125, sc, out))
                    });
                    assert_eq!(avx2, want, "d {d} n {n} lo {lo}: AVX2");
                }
            }
        }
        // Two rows at once: each row the bits of `attend_row` alone.
        for (d, na, nb, lo) in [
            (64usize, 200usize, 201usize, 0usize),
            (64, 131, 132, 5),
            (64, 64, 64, 0),
            (80, 77, 95, 16),
            (32, 3, 4, 1),
            (64, 17, 18, 0),
            (64, 16, 17, 0),
            (72, 150, 151, 33),
            (48, 1, 1, 0),
        ] {
            let cap = (lo + nb).next_multiple_of(BLOCK);
            let (qa, qb) = (noise(d, 6), noise(d, 7));
            let kt = noise(d * cap, 8);
            let v = noise(nb * d, 9);
            let single = |q: &[f32], n: usize| {
                let (mut sc, mut out) = (vec![0.0f32; n], vec![0.0f32; d]);
                attend_row_body::<1, false>(q, &kt, lo, &v[..n * d], 0.125, &mut sc, &mut out);
                bits(&out)
            };
            let (want_a, want_b) = (single(&qa, na), single(&qb, nb));
            let mut sc = vec![0.0f32; 2 * nb];
            let (mut oa, mut ob) = (vec![0.0f32; d], vec![0.0f32; d]);
            attend_two_rows(&qa, &qb, &kt, lo, &v, na, 0.125, &mut sc, &mut oa, &mut ob);
            assert_eq!(
                (bits(&oa), bits(&ob)),
                (want_a.clone(), want_b.clone()),
                "two rows d {d} na {na} nb {nb} lo {lo}"
            );
            #[cfg(target_arch = "x86_64")]
            if has_avx512() {
                let (mut oa, mut ob) = (vec![0.0f32; d], vec![0.0f32; d]);
                // SAFETY: the features were detected.
                unsafe {
                    with_avx512(|| {
                        attend_two_rows_body::<4, true>(
                            &qa, &qb, &kt, lo, &v, na, 0.125, &mut sc, &mut oa, &mut ob,
                        )
                    })
                };
                assert_eq!(
                    (bits(&oa), bits(&ob)),
                    (want_a, want_b),
                    "two rows AVX-512 d {d} na {na} nb {nb} lo {lo}"
                );
            }
        }
        // Four rows at once: each row the bits of `attend_row` alone, at the
        // dispatched level and at the AVX-512 one.
        for (d, n, lo) in [
            (64usize, [200usize, 201, 202, 203], 0usize),
            (64, [131, 132, 133, 134], 5),
            (64, [64, 64, 65, 80], 0),
            (80, [77, 80, 95, 96], 16),
            (32, [3, 4, 5, 6], 1),
            (64, [16, 17, 18, 19], 0),
            (72, [150, 151, 152, 153], 33),
            (48, [1, 1, 1, 2], 0),
            (16, [40, 41, 42, 43], 3),
        ] {
            let cap = (lo + n[3]).next_multiple_of(BLOCK);
            let q: Vec<Vec<f32>> = (0..4).map(|r| noise(d, 20 + r)).collect();
            let kt = noise(d * cap, 30);
            let v = noise(n[3] * d, 31);
            let want: Vec<Vec<u32>> = (0..4)
                .map(|r| {
                    let (mut sc, mut out) = (vec![0.0f32; n[r]], vec![0.0f32; d]);
                    let vr = &v[..n[r] * d];
                    attend_row_body::<1, false>(&q[r], &kt, lo, vr, 0.125, &mut sc, &mut out);
                    bits(&out)
                })
                .collect();
            let qs: [&[f32]; 4] = std::array::from_fn(|r| &q[r][..]);
            let four = |avx512: bool| {
                let mut o = vec![vec![0.0f32; d]; 4];
                let mut sc = vec![0.0f32; 4 * n[3]];
                let [o0, o1, o2, o3] = &mut o[..] else {
                    unreachable!()
                };
                let outs = [&mut o0[..], &mut o1[..], &mut o2[..], &mut o3[..]];
                match avx512 {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: called only where the features were detected.
                    true => unsafe {
                        with_avx512(|| {
                            attend_four_rows_avx512(qs, &kt, lo, &v, n, 0.125, &mut sc, outs)
                        })
                    },
                    _ => attend_four_rows(qs, &kt, lo, &v, n, 0.125, &mut sc, outs),
                }
                o.iter().map(|r| bits(r)).collect::<Vec<_>>()
            };
            assert_eq!(four(false), want, "four rows d {d} n {n:?} lo {lo}");
            #[cfg(target_arch = "x86_64")]
            if has_avx512() {
                assert_eq!(four(true), want, "four rows AVX-512 d {d} n {n:?} lo {lo}");
            }
        }
    }
}
