//! The per-sequence KV cache: the keys and values of every layer for the
//! positions a sequence has seen, preallocated for its maximum length.
//!
//! A [`KvCache`] is made by [`Model::new_cache`](crate::model::Model::new_cache)
//! for one model shape and one sequence. It holds, per layer and key/value head,
//! `capacity` rows of `head_dim` f32 keys (after RoPE) and values, taken once at
//! creation from the [`ExecContext`]'s buffer pool: 64-byte aligned, counted by
//! the pool, and given back to it when the cache drops (the next cache of the
//! same size reuses the memory without a new allocation). Appending a position
//! never allocates. [`Model::prefill`] and [`Model::decode`] append to it;
//! [`KvCache::clear`] makes it reusable for a new sequence.
//!
//! [`Model::prefill`]: crate::model::Model::prefill
//! [`Model::decode`]: crate::model::Model::decode

use fucina::ExecContext;
use fucina::storage::Buffer;

use crate::error::LlmError;

/// Positions per tile of the key layout (see [`KvCache`]).
pub(crate) const KEY_TILE: usize = 16;

/// The keys and values of one sequence, for every layer, preallocated for
/// [`capacity`](KvCache::capacity) positions in two buffers of the context's
/// pool.
///
/// Layout: values `[layer, kv_head, position, head_dim]`; keys
/// `[layer, kv_head, position / 16, head_dim, position % 16]`, tiles of 16
/// positions transposed, so that the attention scores of 16 consecutive
/// positions are computed side by side in vector registers from one
/// contiguous tile.
///
/// The memory of a new cache holds zeros (fresh from the system) or what a
/// previous user of the pool left there (recycled); positions past
/// [`len`](KvCache::len) are never read into a result.
///
/// `clone()` is cheap: the clone shares the two buffers until either cache is
/// next written by [`Model::prefill`](crate::model::Model::prefill) or
/// [`Model::decode`](crate::model::Model::decode), which then first copies
/// them into buffers from the same pool (copy-on-write).
#[derive(Clone)]
pub struct KvCache {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    len: usize,
    /// Elements of `keys` (and of `values`) in use: the pool's size class may
    /// give more.
    n: usize,
    keys: Buffer<f32>,
    values: Buffer<f32>,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("layers", &self.layers)
            .field("kv_heads", &self.kv_heads)
            .field("head_dim", &self.head_dim)
            .field("capacity", &self.capacity)
            .field("len", &self.len)
            .finish()
    }
}

impl KvCache {
    /// A cache of `capacity` positions for a model of `layers` layers and
    /// `kv_heads` key/value heads of `head_dim` elements, its two buffers taken
    /// from `ctx`'s pool now.
    pub(crate) fn new(
        ctx: &ExecContext,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<KvCache, LlmError> {
        let invalid = |reason: String| LlmError::InvalidRequest {
            op: "Model::new_cache",
            reason,
        };
        if capacity == 0 {
            return Err(invalid("max_len is 0".to_string()));
        }
        let n = layers
            .checked_mul(kv_heads)
            .and_then(|n| n.checked_mul(head_dim))
            .and_then(|n| n.checked_mul(capacity.checked_next_multiple_of(KEY_TILE)?))
            .filter(|n| n.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| invalid(format!("{capacity} positions overflow the address space")))?;
        if n == 0 {
            return Err(invalid("the model has no key/value elements".to_string()));
        }
        let acquire = || {
            ctx.pool().acquire(n).map_err(|e| {
                invalid(format!(
                    "the context's pool cannot provide {} bytes for {capacity} positions: {e}",
                    n * 4
                ))
            })
        };
        let keys = acquire()?;
        let values = acquire()?;
        Ok(KvCache {
            layers,
            kv_heads,
            head_dim,
            capacity,
            len: 0,
            n,
            keys,
            values,
        })
    }

    /// Makes the two buffers this cache's alone (copying them into buffers
    /// from their pool when a clone shares them), before a call writes to it.
    /// Changes no value.
    pub(crate) fn make_writable(&mut self, op: &'static str) -> Result<(), LlmError> {
        for buf in [&mut self.keys, &mut self.values] {
            Buffer::make_mut(buf).map_err(|e| LlmError::InvalidRequest {
                op,
                reason: format!("cannot copy a shared KV cache (copy-on-write): {e}"),
            })?;
        }
        Ok(())
    }

    /// Positions stored (the position the next token takes).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is stored yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the cache holds (keys and values of every layer for its whole
    /// capacity, f32).
    /// The pool rounds each of the two buffers up to its size class (a
    /// multiple of 4 KiB), which this does not count.
    pub fn bytes(&self) -> usize {
        4 * 2 * self.n
    }

    /// The most positions the cache holds (its `max_len` at creation).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions that can still be appended.
    pub fn remaining(&self) -> usize {
        self.capacity - self.len
    }

    /// Forgets every stored position, keeping the memory: the cache starts a new
    /// sequence.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Forgets the positions from `len` on and keeps the first `len`: the
    /// sequence continues from that point (a chat whose new prompt shares only
    /// a prefix with what the cache holds). A `len` at or past
    /// [`len`](KvCache::len) changes nothing. What a later prefill or decode
    /// computes is what it would compute after a prefill of the kept tokens.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// `(layers, kv_heads, head_dim)`: the model shape the cache was made for.
    pub(crate) fn shape(&self) -> (usize, usize, usize) {
        (self.layers, self.kv_heads, self.head_dim)
    }

    /// Sets the stored length (after a prefill or decode wrote its positions).
    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }

    /// Positions rounded up to whole key tiles.
    #[inline]
    fn slots(&self) -> usize {
        self.capacity.next_multiple_of(KEY_TILE)
    }

    /// Offset of `(layer, head)`'s block (`slots * head_dim` elements).
    #[inline]
    fn block(&self, layer: usize, head: usize) -> usize {
        (layer * self.kv_heads + head) * self.slots() * self.head_dim
    }

    /// Stores the key `k` and value `v` (`head_dim` each) of `(layer, head)`
    /// at position `pos`.
    ///
    /// # Panics
    /// When the buffers are shared with a clone: the caller first calls
    /// [`KvCache::make_writable`].
    #[inline]
    pub(crate) fn store(&mut self, layer: usize, head: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (at, d) = (self.block(layer, head), self.head_dim);
        let tile = at + pos / KEY_TILE * d * KEY_TILE + pos % KEY_TILE;
        const SHARED: &str = "KvCache::store: the buffers are shared (make_writable first)";
        let keys = self.keys.get_mut().expect(SHARED);
        for (i, &ki) in k.iter().enumerate() {
            keys[tile + i * KEY_TILE] = ki;
        }
        let values = self.values.get_mut().expect(SHARED);
        values[at + pos * d..at + (pos + 1) * d].copy_from_slice(v);
    }

    /// The keys of `(layer, head)` in tiles of [`KEY_TILE`] positions, each
    /// tile transposed: element `i` of position `j`'s key is at
    /// `(j / KEY_TILE) · head_dim · KEY_TILE + i · KEY_TILE + j % KEY_TILE`.
    #[inline]
    pub(crate) fn keys_tiled(&self, layer: usize, head: usize) -> &[f32] {
        let at = self.block(layer, head);
        &self.keys[at..at + self.slots() * self.head_dim]
    }

    /// The values of `(layer, head)` for `positions`: `[positions.len(), head_dim]`.
    #[inline]
    pub(crate) fn values(
        &self,
        layer: usize,
        head: usize,
        positions: std::ops::Range<usize>,
    ) -> &[f32] {
        let (at, d) = (self.block(layer, head), self.head_dim);
        &self.values[at + positions.start * d..at + positions.end * d]
    }
}
