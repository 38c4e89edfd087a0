//! The mixed step: one forward pass whose rows are one sequence's prompt chunk
//! followed by one token of each decoding sequence, so that the decode tokens
//! share the chunk's pass over the weights (chunked prefill). [`Model::decode`]
//! is the step without a chunk.

use super::{HeadTask, Model, PREFILL_CHUNK, Scratch, balanced_row_blocks, grow, invalid};
use crate::cache::KvCache;
use crate::error::LlmError;
use fucina::ExecContext;

/// One sequence's prompt chunk for [`Model::step`]: `tokens` are appended to
/// `cache` at positions `cache.len()..`.
#[derive(Debug)]
pub struct PromptChunk<'a> {
    /// The sequence's cache.
    pub cache: &'a mut KvCache,
    /// The chunk's tokens: 1 to [`PREFILL_CHUNK`].
    pub tokens: &'a [u32],
    /// Receives the logits of the chunk's last token (`[vocab]`) when given
    /// (the prompt's last chunk); otherwise no row of the chunk goes through
    /// `lm_head`.
    pub last_logits: Option<&'a mut [f32]>,
}

impl Model {
    /// Computes, in one pass over the weights, a prompt chunk of one sequence
    /// (when `prefill` is given) and one decode token per sequence: `tokens[i]`
    /// is appended to `caches[i]` at its position `caches[i].len()`, and
    /// `logits` (`[caches.len(), vocab]`, row-major) receives each decoding
    /// sequence's next-token logits; the chunk's last-row logits go to its
    /// `last_logits`. Either part may be empty, not both.
    ///
    /// Every row's logits, and the keys and values it stores, are the same bits
    /// as [`prefill`](Model::prefill) of the chunk alone and
    /// [`decode`](Model::decode) of the batch alone give, whatever the thread
    /// count and the vector level. After a warm-up call with the largest chunk,
    /// batch and caches, a call allocates nothing.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when `tokens.len() != caches.len()`, there is
    /// neither a chunk nor a sequence to decode, the chunk is empty or longer
    /// than [`PREFILL_CHUNK`], a token id is past the vocabulary, the chunk does
    /// not fit its cache or a decoding cache is full (their `max_len`, at most
    /// the model's `max_position_embeddings`), a cache was made for another
    /// model shape, `logits` or `last_logits` has the wrong length, or a
    /// cache's buffers are shared with a clone and the pool cannot provide
    /// their copy; nothing is changed then. [`LlmError::Exec`] from the
    /// projections (the caches keep their former lengths).
    pub fn step(
        &self,
        ctx: &ExecContext,
        prefill: Option<PromptChunk<'_>>,
        caches: &mut [&mut KvCache],
        tokens: &[u32],
        logits: &mut [f32],
    ) -> Result<(), LlmError> {
        self.mixed_step("Model::step", ctx, prefill, caches, tokens, logits)
    }

    /// [`step`](Model::step), its errors naming `op`.
    pub(super) fn mixed_step(
        &self,
        op: &'static str,
        ctx: &ExecContext,
        mut prefill: Option<PromptChunk<'_>>,
        caches: &mut [&mut KvCache],
        tokens: &[u32],
        logits: &mut [f32],
    ) -> Result<(), LlmError> {
        let span = self.check_step(op, prefill.as_ref(), caches, tokens, logits)?;
        if let Some(p) = prefill.as_mut() {
            p.cache.make_writable(op)?;
        }
        for cache in caches.iter_mut() {
            cache.make_writable(op)?;
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *scratch;
        let (p_rows, n_tasks) = self.plan_step(ctx, prefill.as_ref(), caches, span, s);
        let batch = caches.len();
        let rows = p_rows + batch;
        if let Some(p) = prefill.as_ref() {
            self.embed_rows(0, p.tokens, s)?;
        }
        self.embed_rows(p_rows, tokens, s)?;
        for l in 0..self.layers.len() {
            self.attention_inputs(ctx, l, rows, s)?;
            if let Some(p) = prefill.as_mut() {
                for r in 0..p_rows {
                    self.store_kv(l, s, r, p.cache);
                }
            }
            for (b, cache) in caches.iter_mut().enumerate() {
                self.store_kv(l, s, p_rows + b, cache);
            }
            let caches_ro: &[&mut KvCache] = caches;
            let chunk_ro: Option<&KvCache> = prefill.as_ref().map(|p| &*p.cache);
            // The chunk's tasks read the cache of index `batch`.
            let cache_of = |seq: usize| match seq == batch {
                true => chunk_ro.expect("a task of the prompt chunk"),
                false => &*caches_ro[seq],
            };
            self.attention(ctx, l, n_tasks, s, cache_of);
            self.attention_output_and_mlp(ctx, l, rows, s)?;
        }
        let hid = self.config.hidden_size;
        let vocab = self.config.vocab_size;
        match prefill.as_mut().and_then(|p| p.last_logits.as_deref_mut()) {
            Some(last) => {
                // The chunk's last row and the decode rows are consecutive:
                // one product over the head.
                let n = batch + 1;
                grow(&mut s.logits, n * vocab);
                let Scratch {
                    x, xn, logits: out, ..
                } = s;
                self.logits(
                    ctx,
                    &x[(p_rows - 1) * hid..rows * hid],
                    &mut xn[..n * hid],
                    &mut out[..n * vocab],
                )?;
                last.copy_from_slice(&out[..vocab]);
                logits.copy_from_slice(&out[vocab..n * vocab]);
            }
            None if batch > 0 => {
                self.logits(
                    ctx,
                    &s.x[p_rows * hid..rows * hid],
                    &mut s.xn[..batch * hid],
                    logits,
                )?;
            }
            None => {}
        }
        if let Some(p) = prefill {
            let n = p.cache.len() + p_rows;
            p.cache.set_len(n);
        }
        for cache in caches.iter_mut() {
            let n = cache.len() + 1;
            cache.set_len(n);
        }
        Ok(())
    }

    /// Checks the arguments of a step; returns the largest capacity of its
    /// caches (the attention scores' span).
    fn check_step(
        &self,
        op: &'static str,
        prefill: Option<&PromptChunk<'_>>,
        caches: &[&mut KvCache],
        tokens: &[u32],
        logits: &[f32],
    ) -> Result<usize, LlmError> {
        let vocab = self.config.vocab_size;
        let batch = caches.len();
        if tokens.len() != batch {
            return Err(invalid(
                op,
                format!("{} tokens for {batch} caches", tokens.len()),
            ));
        }
        if batch == 0 && prefill.is_none() {
            return Err(invalid(op, "no sequences to decode".to_string()));
        }
        if logits.len() != batch * vocab {
            return Err(invalid(
                op,
                format!(
                    "logits has {} elements, expected {batch} sequences x {vocab}",
                    logits.len()
                ),
            ));
        }
        let mut span = 0;
        if let Some(p) = prefill {
            let n = p.tokens.len();
            if n == 0 || n > PREFILL_CHUNK {
                return Err(invalid(
                    op,
                    format!("the prompt chunk has {n} tokens, expected 1 to {PREFILL_CHUNK}"),
                ));
            }
            self.check_cache(op, p.cache)?;
            for &t in p.tokens {
                self.check_token(op, t)?;
            }
            if n > p.cache.remaining() {
                return Err(invalid(
                    op,
                    format!(
                        "the prompt chunk's {n} tokens after {} cached positions exceed the \
                         cache's max_len {} (the model's max_position_embeddings is {})",
                        p.cache.len(),
                        p.cache.capacity(),
                        self.config.max_position_embeddings
                    ),
                ));
            }
            if let Some(last) = p.last_logits.as_deref()
                && last.len() != vocab
            {
                return Err(invalid(
                    op,
                    format!("last_logits has {} elements, expected {vocab}", last.len()),
                ));
            }
            span = p.cache.capacity();
        }
        for (i, (cache, &t)) in caches.iter().zip(tokens).enumerate() {
            self.check_cache(op, cache)?;
            self.check_token(op, t)?;
            if cache.remaining() == 0 {
                return Err(invalid(
                    op,
                    format!(
                        "sequence {i}: the cache is full ({} positions; the model's \
                         max_position_embeddings is {})",
                        cache.capacity(),
                        self.config.max_position_embeddings
                    ),
                ));
            }
            // Scores for the caches' whole capacity: the next steps never grow them.
            span = span.max(cache.capacity());
        }
        Ok(span)
    }

    /// Sizes the workspace for a step and sets each row's position and RoPE
    /// variant and the attention tasks: the chunk's rows first (each head's rows
    /// in pieces of about equal work, so that a team has at least eight tasks
    /// per participant; they read the cache of index `caches.len()`), then one
    /// row and one task per head for each decoding sequence. Returns the
    /// chunk's rows and the number of tasks.
    fn plan_step(
        &self,
        ctx: &ExecContext,
        prefill: Option<&PromptChunk<'_>>,
        caches: &[&mut KvCache],
        span: usize,
        s: &mut Scratch,
    ) -> (usize, usize) {
        let heads = self.config.num_attention_heads;
        let batch = caches.len();
        let p_rows = prefill.map_or(0, |p| p.tokens.len());
        let blocks = (8 * ctx.threads()).div_ceil(heads).clamp(1, p_rows.max(1));
        // The longest piece is the first of a chunk that starts the cache.
        let longest = balanced_row_blocks(0, p_rows, blocks)
            .map(|r| r.len())
            .max()
            .unwrap_or(0)
            .max(p_rows.div_ceil(blocks))
            .max(1);
        let chunk_tasks = if p_rows > 0 { heads * blocks } else { 0 };
        s.ensure(
            &self.config,
            p_rows + batch,
            chunk_tasks + batch * heads,
            longest,
            span,
        );
        let mut n_tasks = 0;
        if let Some(p) = prefill {
            let first = p.cache.len();
            for (r, pos) in s.positions[..p_rows].iter_mut().enumerate() {
                *pos = first + r;
            }
            s.long_context[..p_rows].fill(self.long_context(p.cache));
            for h in 0..heads {
                for piece in balanced_row_blocks(first, p_rows, blocks) {
                    let t: &mut HeadTask = &mut s.tasks[n_tasks];
                    (t.seq, t.head, t.rows) = (batch, h, piece);
                    n_tasks += 1;
                }
            }
        }
        for (b, cache) in caches.iter().enumerate() {
            s.positions[p_rows + b] = cache.len();
            s.long_context[p_rows + b] = self.long_context(cache);
            for h in 0..heads {
                let t = &mut s.tasks[n_tasks];
                (t.seq, t.head, t.rows) = (b, h, p_rows + b..p_rows + b + 1);
                n_tasks += 1;
            }
        }
        (p_rows, n_tasks)
    }
}
