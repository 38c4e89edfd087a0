//! Row gathers and the deterministic row scatter-add of the indexing ops.
//!
//! Plain functions over slices: the gather ops validate every index
//! before calling them, so an index here is always in range.

/// Copies row `idx[r]` of `src` (rows of `row_len` elements) into row `r` of `dst`,
/// for every row of `dst` (`dst.len() == idx.len() * row_len`).
#[inline]
pub(crate) fn gather_rows<T: Copy>(dst: &mut [T], src: &[T], row_len: usize, idx: &[i64]) {
    debug_assert_eq!(dst.len(), idx.len() * row_len);
    for (d, &i) in dst.chunks_exact_mut(row_len).zip(idx) {
        let start = i as usize * row_len;
        d.copy_from_slice(&src[start..start + row_len]);
    }
}

/// `dst = sum over j in rows (in the given order) of src row j` (rows of
/// `dst.len()` elements), starting from zero. The fixed order makes the bits of
/// every destination row independent of how the destination rows are split.
/// Inlined so that the ops can run it at the dispatched vector level.
#[inline(always)]
pub(crate) fn sum_rows_into(dst: &mut [f32], src: &[f32], rows: &[usize]) {
    let row_len = dst.len();
    dst.fill(0.0);
    for &j in rows {
        let s = &src[j * row_len..(j + 1) * row_len];
        for (d, &v) in dst.iter_mut().zip(s) {
            *d += v;
        }
    }
}

/// The inverse of an index list as a stable counting sort. `offs.len()` is the
/// index bound plus one and `order.len() == idx.len()`. On return, for every index
/// value `t`, `order[start..offs[t]]` with `start = if t == 0 { 0 } else { offs[t - 1] }`
/// lists in increasing order every position `j` with `idx[j] == t`.
pub(crate) fn invert_indices(idx: &[i64], offs: &mut [usize], order: &mut [usize]) {
    debug_assert_eq!(order.len(), idx.len());
    offs.fill(0);
    // Counts, shifted by one slot.
    for &i in idx {
        offs[i as usize + 1] += 1;
    }
    // Prefix sums: offs[t] = the first slot of index t.
    for t in 1..offs.len() {
        offs[t] += offs[t - 1];
    }
    // Placement in increasing j; afterwards offs[t] = one past the last slot of t.
    for (j, &i) in idx.iter().enumerate() {
        let t = i as usize;
        order[offs[t]] = j;
        offs[t] += 1;
    }
}

/// The positions with index value `t`, after [`invert_indices`].
#[inline]
pub(crate) fn positions_of<'a>(offs: &[usize], order: &'a [usize], t: usize) -> &'a [usize] {
    let start = if t == 0 { 0 } else { offs[t - 1] };
    &order[start..offs[t]]
}
