//! The prefix cache: the keys and values of prompt prefixes that earlier
//! requests prefilled (a shared system prompt), kept in blocks of
//! [`KV_BLOCK`] positions so that a later request with the same prefix copies
//! them into its own cache instead of computing them again.
//!
//! A block is identified by its tokens and by the block before it: its key is
//! a hash chained from the previous block's key, the cache's
//! [`Model::kv_variant`](fucina_llm::Model::kv_variant) and the block's token
//! ids; a lookup then compares the ids and the parent, so a hash collision is
//! only a miss. Blocks form a tree (a block's parent is the block before it);
//! a block's reference count is the number of cached blocks that extend it, so
//! only leaves are evicted, the least recently used first, when a new block
//! would pass the memory budget. A chain is therefore always whole from the
//! first block.
//!
//! Reuse gives the same bits: a position's keys and values depend only on the
//! tokens up to it and the cache's variant, not on the prefill chunks or the
//! batch that computed them (see [`fucina_llm::KvCache::export_block`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use fucina_llm::{KV_BLOCK, KvCache, LlmError};

/// One cached block.
#[derive(Debug)]
struct Block {
    key: u64,
    parent: Option<usize>,
    variant: u32,
    tokens: [u32; KV_BLOCK],
    data: Vec<f32>,
    /// Cached blocks whose parent this is.
    children: usize,
    last_used: u64,
}

/// Blocks of prompt prefixes' keys and values, under a memory budget.
#[derive(Debug)]
pub struct PrefixCache {
    budget: usize,
    block_bytes: usize,
    /// The blocks; a `None` slot is free.
    slots: Vec<Option<Block>>,
    free: Vec<usize>,
    by_key: HashMap<u64, usize>,
    clock: u64,
    hasher: std::hash::RandomState,
}

impl PrefixCache {
    /// An empty cache of at most `budget` bytes of blocks of `block_elems`
    /// f32 values ([`KvCache::block_elems`] of the model's caches).
    pub fn new(budget: usize, block_elems: usize) -> PrefixCache {
        PrefixCache {
            budget,
            block_bytes: 4 * block_elems,
            slots: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            clock: 0,
            hasher: std::hash::RandomState::new(),
        }
    }

    /// The most bytes of blocks the cache holds.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes of the blocks held.
    pub fn bytes(&self) -> usize {
        self.blocks() * self.block_bytes
    }

    /// The blocks held.
    pub fn blocks(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The key of the block of `tokens` after the block keyed `parent`.
    fn key(&self, parent: Option<u64>, variant: u32, tokens: &[u32]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u64(parent.unwrap_or(u64::MAX));
        h.write_u32(variant);
        for &t in tokens {
            h.write_u32(t);
        }
        h.finish()
    }

    /// The cached block that holds `tokens` after the block `parent`.
    fn find(&self, parent: Option<usize>, variant: u32, tokens: &[u32]) -> Option<usize> {
        let parent_key = parent.map(|p| self.get(p).key);
        let key = self.key(parent_key, variant, tokens);
        let &id = self.by_key.get(&key)?;
        let b = self.get(id);
        (b.parent == parent && b.variant == variant && b.tokens[..] == *tokens).then_some(id)
    }

    fn get(&self, id: usize) -> &Block {
        self.slots[id].as_ref().expect("a live block id")
    }

    /// Copies into `cache` the cached blocks that continue it: the blocks of
    /// `tokens` (the sequence's prompt) from position `cache.len()` on, as far
    /// as the cache holds them and at most up to position `limit`. `cache` must
    /// hold the first `cache.len()` tokens of `tokens`, and `cache.len()` must
    /// be a multiple of [`KV_BLOCK`] (else nothing is copied). Returns the
    /// positions copied.
    ///
    /// # Errors
    /// What [`KvCache::import_block`] returns (the cache keeps the blocks
    /// copied before the error).
    pub fn import(
        &mut self,
        variant: u32,
        tokens: &[u32],
        limit: usize,
        cache: &mut KvCache,
    ) -> Result<usize, LlmError> {
        let start = cache.len();
        let end = limit.min(tokens.len()) / KV_BLOCK;
        if !start.is_multiple_of(KV_BLOCK) || start / KV_BLOCK >= end {
            return Ok(0);
        }
        let mut chain = Vec::new();
        let mut parent = None;
        for b in 0..end {
            match self.find(parent, variant, &tokens[b * KV_BLOCK..(b + 1) * KV_BLOCK]) {
                Some(id) => {
                    chain.push(id);
                    parent = Some(id);
                }
                None => break,
            }
        }
        self.clock += 1;
        for &id in &chain {
            self.slots[id].as_mut().expect("live").last_used = self.clock;
        }
        let mut copied = 0;
        for &id in chain.iter().skip(start / KV_BLOCK) {
            cache.import_block(&self.get(id).data)?;
            copied += KV_BLOCK;
        }
        Ok(copied)
    }

    /// Adds the blocks of `tokens` that `cache` holds (its first
    /// `cache.len()` positions are those of `tokens`) and that are not cached
    /// yet, evicting the least recently used leaves while a new block would
    /// pass the budget. Stops at the first block that does not fit. Returns
    /// the blocks added.
    ///
    /// # Errors
    /// What [`KvCache::export_block`] returns.
    pub fn insert(
        &mut self,
        variant: u32,
        tokens: &[u32],
        cache: &KvCache,
    ) -> Result<usize, LlmError> {
        let whole = cache.len().min(tokens.len()) / KV_BLOCK;
        self.clock += 1;
        let mut parent: Option<usize> = None;
        let mut added = 0;
        for b in 0..whole {
            let block_tokens = &tokens[b * KV_BLOCK..(b + 1) * KV_BLOCK];
            if let Some(id) = self.find(parent, variant, block_tokens) {
                self.slots[id].as_mut().expect("live").last_used = self.clock;
                parent = Some(id);
                continue;
            }
            let parent_key = parent.map(|p| self.get(p).key);
            let key = self.key(parent_key, variant, block_tokens);
            if self.by_key.contains_key(&key) {
                // A collision with another chain's block: not cached.
                break;
            }
            let Some(mut data) = self.make_room(parent) else {
                break;
            };
            data.resize(self.block_bytes / 4, 0.0);
            cache.export_block(b, &mut data)?;
            let block = Block {
                key,
                parent,
                variant,
                tokens: block_tokens.try_into().expect("a whole block"),
                data,
                children: 0,
                last_used: self.clock,
            };
            let id = match self.free.pop() {
                Some(id) => {
                    self.slots[id] = Some(block);
                    id
                }
                None => {
                    self.slots.push(Some(block));
                    self.slots.len() - 1
                }
            };
            self.by_key.insert(key, id);
            if let Some(p) = parent {
                self.slots[p].as_mut().expect("live").children += 1;
            }
            parent = Some(id);
            added += 1;
        }
        Ok(added)
    }

    /// Evicts least recently used leaves (never `keep`, the block a new one
    /// extends) until one more block fits the budget; returns an evicted
    /// block's buffer to reuse (or a new one), or `None` when the block
    /// cannot fit.
    fn make_room(&mut self, keep: Option<usize>) -> Option<Vec<f32>> {
        let mut reuse = None;
        while self.bytes() + self.block_bytes > self.budget {
            let victim = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.as_ref().map(|b| (i, b)))
                .filter(|&(i, b)| b.children == 0 && Some(i) != keep)
                .min_by_key(|&(_, b)| b.last_used)
                .map(|(i, _)| i)?;
            let b = self.slots[victim].take().expect("live");
            self.free.push(victim);
            self.by_key.remove(&b.key);
            if let Some(p) = b.parent {
                self.slots[p]
                    .as_mut()
                    .expect("a parent outlives its children")
                    .children -= 1;
            }
            reuse = Some(b.data);
        }
        Some(reuse.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fucina_llm::fucina::ExecContext;

    fn model_and_ctx() -> (fucina_llm::Model, ExecContext) {
        let ctx = ExecContext::with_threads(1);
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fucina-llm/tests/fixtures/llama_f32");
        let opened = fucina_llm::open_model(&path, &ctx, None).expect("the fixture loads");
        (opened.model, ctx)
    }

    fn prefilled(model: &fucina_llm::Model, ctx: &ExecContext, tokens: &[u32]) -> KvCache {
        let mut cache = model.new_cache(ctx, tokens.len() + 4).unwrap();
        let mut last = vec![0.0; model.config().vocab_size];
        model
            .prefill(ctx, &mut cache, tokens, None, &mut last)
            .unwrap();
        cache
    }

    #[test]
    fn blocks_are_shared_by_prefix_counted_and_evicted_lru_leaves_first() {
        let (model, ctx) = model_and_ctx();
        let elems = model.new_cache(&ctx, 16).unwrap().block_elems();
        let a: Vec<u32> = (0..3 * KV_BLOCK as u32 + 5).map(|i| 3 + i % 50).collect();
        let mut b = a.clone();
        b[2 * KV_BLOCK] += 1; // shares the first two blocks with `a`
        // Room for four blocks.
        let mut pc = PrefixCache::new(4 * 4 * elems, elems);
        assert_eq!(pc.insert(0, &a, &prefilled(&model, &ctx, &a)).unwrap(), 3);
        assert_eq!(pc.insert(0, &a, &prefilled(&model, &ctx, &a)).unwrap(), 0);
        assert_eq!(pc.blocks(), 3);
        // `b` adds one block: four.
        assert_eq!(pc.insert(0, &b, &prefilled(&model, &ctx, &b)).unwrap(), 1);
        assert_eq!((pc.blocks(), pc.bytes()), (4, 4 * 4 * elems));
        // A lookup of `b` copies its three blocks, up to the limit only, and
        // makes them the most recently used.
        let mut cache = model.new_cache(&ctx, 64).unwrap();
        assert_eq!(pc.import(0, &b, 2 * KV_BLOCK + 3, &mut cache).unwrap(), 32);
        assert_eq!(pc.import(0, &b, b.len(), &mut cache).unwrap(), 16);
        assert_eq!(pc.import(0, &b, b.len(), &mut cache).unwrap(), 0);
        let want = prefilled(&model, &ctx, &b);
        for blk in 0..3 {
            let (mut x, mut y) = (vec![0.0; elems], vec![0.0; elems]);
            cache.export_block(blk, &mut x).unwrap();
            want.export_block(blk, &mut y).unwrap();
            assert!(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()));
        }
        // Another variant shares nothing.
        let mut other = model.new_cache(&ctx, 64).unwrap();
        assert_eq!(pc.import(1, &b, b.len(), &mut other).unwrap(), 0);
        // A new chain evicts `a`'s third block (the least recently used leaf),
        // never a block that others extend.
        let c: Vec<u32> = (0..KV_BLOCK as u32).map(|i| 60 + i).collect();
        assert_eq!(pc.insert(0, &c, &prefilled(&model, &ctx, &c)).unwrap(), 1);
        assert_eq!(pc.blocks(), 4);
        let mut fresh = model.new_cache(&ctx, 64).unwrap();
        assert_eq!(pc.import(0, &a, a.len(), &mut fresh).unwrap(), 32);
        // A cache of no block's size holds nothing.
        let mut none = PrefixCache::new(4 * elems - 1, elems);
        assert_eq!(none.insert(0, &a, &prefilled(&model, &ctx, &a)).unwrap(), 0);
        assert_eq!(none.blocks(), 0);
    }
}
