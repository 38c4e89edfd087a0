//! The per-context cache of packed right-hand sides (a runtime service the
//! context owns and clears at teardown; `matmul_with` and `linear_with` with
//! [`RhsLifetime::StableProcess`](crate::RhsLifetime::StableProcess) fill it).

use fucina_storage::Buffer;

use crate::tensor::RawTensor;
use crate::tensor::layout::Layout;

/// At most this many packed right-hand sides are cached per context.
const CACHE_MAX_ENTRIES: usize = 64;
/// At most this many bytes of packed panels are cached per context (an entry larger
/// than this alone is used for its call and not kept).
const CACHE_MAX_BYTES: usize = 256 << 20;

/// One cached packed right-hand side.
struct RhsEntry {
    /// A handle to the storage the panels were packed from: it keeps that storage
    /// alive, so its address cannot be reused by another allocation while the entry
    /// exists, and a hit is `Buffer::ptr_eq` plus an equal layout.
    source: Buffer<f32>,
    /// The layout (shape, strides, offset) of the view that was packed.
    layout: Layout,
    /// The packed panels.
    packed: Buffer<f32>,
    /// Floats of `packed` in use.
    len: usize,
    /// Logical time of the last hit (least recently used is evicted first).
    last_use: u64,
}

/// Prepared (packed) right-hand sides of `StableProcess` matmuls, per context.
///
/// Bounded to [`CACHE_MAX_ENTRIES`] entries and [`CACHE_MAX_BYTES`] bytes of packed
/// data; inserting past either bound evicts the least recently used entries. Cleared
/// at context teardown and by [`ExecContext::clear_rhs_cache`].
#[derive(Default)]
pub(crate) struct RhsCache {
    entries: Vec<RhsEntry>,
    bytes: usize,
    clock: u64,
}

impl RhsCache {
    /// Drops every entry.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// The number of cached entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The packed panels of `rhs` (with `len` floats), if cached; marks the hit.
    pub(crate) fn get(&mut self, rhs: &RawTensor, len: usize) -> Option<Buffer<f32>> {
        self.clock += 1;
        let now = self.clock;
        let e = self.entries.iter_mut().find(|e| {
            Buffer::ptr_eq(&e.source, rhs.buffer()) && e.layout == *rhs.layout() && e.len == len
        })?;
        e.last_use = now;
        Some(e.packed.clone())
    }

    /// Keeps `packed` for `rhs`, evicting least recently used entries past the bounds.
    pub(crate) fn insert(&mut self, rhs: &RawTensor, packed: Buffer<f32>, len: usize) {
        let bytes = len * size_of::<f32>();
        if bytes > CACHE_MAX_BYTES {
            return;
        }
        while !self.entries.is_empty()
            && (self.entries.len() >= CACHE_MAX_ENTRIES || self.bytes + bytes > CACHE_MAX_BYTES)
        {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].last_use)
                .unwrap_or(0);
            let e = self.entries.swap_remove(oldest);
            self.bytes -= e.len * size_of::<f32>();
        }
        self.clock += 1;
        self.bytes += bytes;
        self.entries.push(RhsEntry {
            source: rhs.buffer().clone(),
            layout: *rhs.layout(),
            packed,
            len,
            last_use: self.clock,
        });
    }
}
