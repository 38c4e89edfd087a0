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
//! [`KvCache::export_block`] and [`KvCache::import_block`] copy the keys and
//! values of [`KV_BLOCK`] positions out of one cache and append them to
//! another of the same model: a server's prefix cache reuses a shared prompt
//! prefix that way. A position's keys and values depend only on the tokens up
//! to it (and on [`Model::kv_variant`](crate::model::Model::kv_variant)), not
//! on how the prompt was split into prefill calls or the batch it was decoded
//! in, so an imported block holds the bits a prefill of its tokens would
//! write.
//!
//! [`Model::prefill`]: crate::model::Model::prefill
//! [`Model::decode`]: crate::model::Model::decode

use fucina::ExecContext;
use fucina::storage::Buffer;

use crate::error::LlmError;

/// Positions per tile of the key layout (see [`KvCache`]).
pub(crate) const KEY_TILE: usize = 16;

/// Positions per block of [`KvCache::export_block`] and
/// [`KvCache::import_block`] (one tile of the key layout).
pub const KV_BLOCK: usize = KEY_TILE;

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

    /// f32 elements of one block of [`KV_BLOCK`] positions, keys and values
    /// of every layer: `2 · layers · kv_heads · head_dim · KV_BLOCK`.
    pub fn block_elems(&self) -> usize {
        2 * self.layers * self.kv_heads * self.head_dim * KV_BLOCK
    }

    /// Copies the keys and values of positions
    /// `block · KV_BLOCK .. (block + 1) · KV_BLOCK` into `out`
    /// ([`block_elems`](KvCache::block_elems) values, in an order that only
    /// [`import_block`](KvCache::import_block) reads).
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when the block's positions are not all
    /// stored (past [`len`](KvCache::len)) or `out` has the wrong length.
    pub fn export_block(&self, block: usize, out: &mut [f32]) -> Result<(), LlmError> {
        let invalid = |reason: String| LlmError::InvalidRequest {
            op: "KvCache::export_block",
            reason,
        };
        if block
            .checked_add(1)
            .and_then(|b| b.checked_mul(KV_BLOCK))
            .is_none_or(|end| end > self.len)
        {
            return Err(invalid(format!(
                "block {block} is not stored: the cache holds {} positions",
                self.len
            )));
        }
        if out.len() != self.block_elems() {
            return Err(invalid(format!(
                "out has {} elements, a block has {}",
                out.len(),
                self.block_elems()
            )));
        }
        let piece = self.head_dim * KV_BLOCK;
        let mut parts = out.chunks_exact_mut(piece);
        for l in 0..self.layers {
            for g in 0..self.kv_heads {
                let at = self.block(l, g) + block * piece;
                parts
                    .next()
                    .expect("sized")
                    .copy_from_slice(&self.keys[at..at + piece]);
                parts
                    .next()
                    .expect("sized")
                    .copy_from_slice(&self.values[at..at + piece]);
            }
        }
        Ok(())
    }

    /// Appends the [`KV_BLOCK`] positions of `data` (what
    /// [`export_block`](KvCache::export_block) wrote from a cache of the same
    /// model and [`kv_variant`](crate::model::Model::kv_variant)) at
    /// positions `len() .. len() + KV_BLOCK`. What a later prefill or decode
    /// computes is what it computes after a prefill of the block's tokens.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when [`len`](KvCache::len) is not a
    /// multiple of [`KV_BLOCK`], the cache has no room for the block, `data`
    /// has the wrong length, or the cache's buffers are shared with a clone
    /// and the pool cannot provide their copy; nothing is changed then.
    pub fn import_block(&mut self, data: &[f32]) -> Result<(), LlmError> {
        const OP: &str = "KvCache::import_block";
        let invalid = |reason: String| LlmError::InvalidRequest { op: OP, reason };
        if !self.len.is_multiple_of(KV_BLOCK) {
            return Err(invalid(format!(
                "the cache holds {} positions, not a whole number of {KV_BLOCK}-position blocks",
                self.len
            )));
        }
        if self.remaining() < KV_BLOCK {
            return Err(invalid(format!(
                "no room for {KV_BLOCK} positions: {} of {} are stored",
                self.len, self.capacity
            )));
        }
        if data.len() != self.block_elems() {
            return Err(invalid(format!(
                "data has {} elements, a block has {}",
                data.len(),
                self.block_elems()
            )));
        }
        self.make_writable(OP)?;
        let piece = self.head_dim * KV_BLOCK;
        let block = self.len / KV_BLOCK;
        let mut parts = data.chunks_exact(piece);
        const SHARED: &str = "KvCache::import_block: made writable above";
        for l in 0..self.layers {
            for g in 0..self.kv_heads {
                let at = self.block(l, g) + block * piece;
                let keys = self.keys.get_mut().expect(SHARED);
                keys[at..at + piece].copy_from_slice(parts.next().expect("sized"));
                let values = self.values.get_mut().expect(SHARED);
                values[at..at + piece].copy_from_slice(parts.next().expect("sized"));
            }
        }
        self.len += KV_BLOCK;
        Ok(())
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
