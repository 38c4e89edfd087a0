//! The deterministic range chunking of `parallel_for` (rml's `NumChunks` rule).
//!
//! Chunk boundaries are a pure function of `(begin, end, grain, threads)`; they
//! never depend on scheduling, timing or which participant runs a chunk.

use std::iter::FusedIterator;
use std::ops::Range;

/// Splits `[begin, end)` into the chunks `parallel_for` runs on a team of
/// `threads` participants.
///
/// With `n = end - begin`:
/// - `n == 0` (including `begin >= end`): no chunks;
/// - `threads <= 1` (no workers, or a caller already inside a parallel region):
///   one chunk, `[begin, end)`;
/// - otherwise `num_chunks = clamp(n / grain, 1, 4 * threads)`,
///   `chunk_size = ceil(n / num_chunks)`, and the iterator yields
///   `ceil(n / chunk_size)` chunks; chunk `i` is
///   `[begin + i * chunk_size, min(begin + (i + 1) * chunk_size, end))`.
///   Only the last chunk can be short, and every other chunk has at least
///   `grain` elements.
///
/// A `grain` of 0 is treated as 1.
///
/// ```
/// use fucina_thread::chunk_ranges;
///
/// let chunks: Vec<_> = chunk_ranges(0, 1000, 10, 4).collect();
/// assert_eq!(chunks.len(), 16);
/// assert!(chunks[..15].iter().all(|c| c.len() == 63));
/// assert_eq!(chunks[15], 945..1000);
///
/// let chunks = chunk_ranges(0, 100, 1, 4);
/// assert_eq!(chunks.len(), 15);
/// assert_eq!(chunks.last(), Some(98..100));
/// ```
pub fn chunk_ranges(begin: usize, end: usize, grain: usize, threads: usize) -> ChunkRanges {
    let n = end.saturating_sub(begin);
    if n == 0 {
        return ChunkRanges {
            begin,
            end: begin,
            chunk_size: 1,
            front: 0,
            back: 0,
        };
    }
    let num_chunks = if threads <= 1 {
        1
    } else {
        (n / grain.max(1)).clamp(1, threads.saturating_mul(4))
    };
    let chunk_size = n.div_ceil(num_chunks);
    let count = n.div_ceil(chunk_size);
    ChunkRanges {
        begin,
        end,
        chunk_size,
        front: 0,
        back: count,
    }
}

/// The chunks of [`chunk_ranges`]: an exact-size, double-ended iterator with
/// random access through [`ChunkRanges::get`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkRanges {
    begin: usize,
    end: usize,
    chunk_size: usize,
    front: usize,
    back: usize,
}

impl ChunkRanges {
    /// The size of every chunk but the last.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Chunk `i` of the full split (independent of iteration progress), or
    /// `None` when `i` is past the last chunk.
    pub fn get(&self, i: usize) -> Option<Range<usize>> {
        let lo = self.begin.checked_add(i.checked_mul(self.chunk_size)?)?;
        (lo < self.end).then(|| lo..lo.saturating_add(self.chunk_size).min(self.end))
    }
}

impl Iterator for ChunkRanges {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        if self.front == self.back {
            return None;
        }
        let r = self.get(self.front);
        self.front += 1;
        r
    }

    fn last(mut self) -> Option<Range<usize>> {
        self.next_back()
    }

    fn nth(&mut self, n: usize) -> Option<Range<usize>> {
        self.front = self.front.saturating_add(n).min(self.back);
        self.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for ChunkRanges {
    fn next_back(&mut self) -> Option<Range<usize>> {
        if self.front == self.back {
            return None;
        }
        self.back -= 1;
        self.get(self.back)
    }
}

impl ExactSizeIterator for ChunkRanges {}
impl FusedIterator for ChunkRanges {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example_1000_by_10_on_4() {
        let c: Vec<_> = chunk_ranges(0, 1000, 10, 4).collect();
        assert_eq!(c.len(), 16);
        for (i, r) in c[..15].iter().enumerate() {
            assert_eq!(*r, i * 63..(i + 1) * 63);
        }
        assert_eq!(c[15], 945..1000);
    }

    #[test]
    fn spec_example_100_by_1_on_4() {
        let c: Vec<_> = chunk_ranges(0, 100, 1, 4).collect();
        assert_eq!(c.len(), 15);
        assert_eq!(c[0], 0..7);
        assert_eq!(c[14], 98..100);
    }

    #[test]
    fn single_chunk_without_workers() {
        assert_eq!(chunk_ranges(5, 105, 1, 1).collect::<Vec<_>>(), vec![5..105]);
        assert_eq!(chunk_ranges(5, 105, 1, 0).collect::<Vec<_>>(), vec![5..105]);
    }

    #[test]
    fn empty_and_reversed_ranges_have_no_chunks() {
        assert_eq!(chunk_ranges(7, 7, 1, 4).len(), 0);
        assert_eq!(chunk_ranges(9, 3, 1, 4).len(), 0);
        assert_eq!(chunk_ranges(9, 3, 1, 4).next(), None);
    }

    #[test]
    fn grain_zero_is_grain_one() {
        assert_eq!(chunk_ranges(0, 100, 0, 4), chunk_ranges(0, 100, 1, 4));
    }

    #[test]
    fn grain_larger_than_range_is_one_chunk() {
        assert_eq!(
            chunk_ranges(10, 20, 100, 8).collect::<Vec<_>>(),
            vec![10..20]
        );
    }

    #[test]
    fn huge_thread_count_and_range_do_not_overflow() {
        let c = chunk_ranges(usize::MAX - 10, usize::MAX, 1, usize::MAX);
        assert_eq!(c.len(), 10);
        assert_eq!(c.clone().next_back(), Some(usize::MAX - 1..usize::MAX));
    }

    #[test]
    fn exhaustive_small_cover_and_rule() {
        for begin in [0usize, 3] {
            for n in 0..70 {
                for grain in 0..9 {
                    for threads in 0..6 {
                        let c = chunk_ranges(begin, begin + n, grain, threads);
                        let v: Vec<_> = c.clone().collect();
                        assert_eq!(v.len(), c.len());
                        let back: Vec<_> = c.clone().rev().collect();
                        assert!(back.iter().rev().eq(v.iter()));
                        // Contiguous cover of [begin, begin + n).
                        let mut at = begin;
                        for r in &v {
                            assert_eq!(r.start, at);
                            assert!(r.end > r.start);
                            at = r.end;
                        }
                        assert_eq!(at, begin + n);
                        if n == 0 {
                            continue;
                        }
                        if threads <= 1 {
                            assert_eq!(v.len(), 1);
                            continue;
                        }
                        let g = grain.max(1);
                        assert!(v.len() <= 4 * threads);
                        if v.len() > 1 {
                            // Every chunk but the last is full and has >= grain elements.
                            let size = v[0].len();
                            assert!(v[..v.len() - 1].iter().all(|r| r.len() == size));
                            assert!(size >= g);
                        }
                    }
                }
            }
        }
    }
}
