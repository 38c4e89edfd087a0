//! Sort keys and line sorts of `topk` and `argsort`.
//!
//! An f32 maps to a `u32` key whose unsigned order is the numeric order, with
//! `-0.0` equal to `+0.0` and every NaN above `+inf`. A line element becomes the
//! `u64` `key << 32 | position`: distinct positions make every `u64` distinct, so
//! the sorted order is unique (equal values by increasing position), whatever the
//! sort algorithm.

/// The order-preserving `u32` key of `v` (see the module docs).
#[inline]
pub(crate) fn sort_key(v: f32) -> u32 {
    if v.is_nan() {
        return u32::MAX;
    }
    // `+ 0.0` turns -0.0 into +0.0 (round to nearest) and changes nothing else.
    let b = (v + 0.0).to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Fills `keys` with the packed keys of `line` (ascending order), or of the
/// descending order (keys complemented, positions kept) when `descending`.
#[inline]
pub(crate) fn line_keys(keys: &mut [u64], line: impl Iterator<Item = f32>, descending: bool) {
    let flip = if descending { u32::MAX } else { 0 };
    for (pos, (k, v)) in keys.iter_mut().zip(line).enumerate() {
        *k = (u64::from(sort_key(v) ^ flip) << 32) | pos as u64;
    }
}

/// Sorts the `k` smallest packed keys of `keys` into `keys[..k]` (`1 <= k <=
/// keys.len()`): a selection, then a sort of the selected prefix.
pub(crate) fn smallest_k(keys: &mut [u64], k: usize) {
    debug_assert!(k >= 1 && k <= keys.len());
    if k < keys.len() {
        keys.select_nth_unstable(k - 1);
    }
    keys[..k].sort_unstable();
}

/// The position packed into a key.
#[inline]
pub(crate) fn key_position(key: u64) -> i64 {
    (key & 0xFFFF_FFFF) as i64
}
