//! The engine: one scheduler thread that owns the model, its worker team and
//! the KV cache of every running sequence, and advances them all together.
//!
//! Each turn of its loop:
//! 1. takes the requests that arrived (a bounded waiting queue: [`Engine::submit`]
//!    refuses a request when it is full);
//! 2. admits waiting requests, oldest first, while the running batch has room
//!    (`max_batch`) and their caches fit the KV budget (bytes, not a count);
//! 3. drops the sequences whose client went away (their receiver was dropped);
//! 4. prefills one chunk of the oldest sequence still reading its prompt (so a
//!    long prompt never stalls the streams already running), first copying
//!    from the [prefix cache](crate::prefix) the blocks of its prompt that an
//!    earlier request computed;
//! 5. runs one batched decode step for every sequence that has a token to feed.
//!
//! **The promise**: a sequence's tokens and logprobs do not depend on the other
//! sequences of the batch, on when they arrived, nor on how its prompt was
//! chunked, nor on a prefix cache hit: [`Model::decode`] gives each sequence
//! the same logit bits whatever the batch, prefill chunks give the same bits as
//! one prefill, a position's keys and values are the same bits however they
//! were computed (so blocks copied from the prefix cache are those a prefill
//! would write), and each
//! sequence samples with its own seeded [`Sampler`] (whose draws depend only
//! on its seed, its step and its logits).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use fucina_llm::fucina::ExecContext;
use fucina_llm::{
    KV_BLOCK, KvCache, LlmError, Model, OpenedModel, PREFILL_CHUNK, PromptChunk, Sampler,
    SamplingParams, Tokenizer,
};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::metrics::Metrics;
use crate::prefix::PrefixCache;
use crate::text::{Advance, Detokenizer, TextStream};

/// How the engine schedules: batch size, queue length, context length, KV
/// memory.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Worker threads of the model's team.
    pub threads: usize,
    /// The most sequences decoded together.
    pub max_batch: usize,
    /// The most requests waiting for a place in the batch; past it,
    /// [`Engine::submit`] refuses ([`SubmitError::QueueFull`]).
    pub max_queue: usize,
    /// The most positions (prompt and generated tokens) of one sequence; at
    /// most the model's `max_position_embeddings` (0 takes that).
    pub ctx_len: usize,
    /// The bytes all running sequences' KV caches may take together (`None`:
    /// `max_batch` caches of `ctx_len` positions). A request waits until its
    /// cache fits.
    pub kv_budget_bytes: Option<usize>,
    /// Prompt tokens prefilled per turn of the loop, between decode steps.
    pub prefill_chunk: usize,
    /// The bytes of the [prefix cache](crate::prefix) (blocks of prompt
    /// prefixes' keys and values kept for later requests), besides the KV
    /// budget; 0 turns it off.
    pub prefix_cache_bytes: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: 1,
            max_batch: 16,
            max_queue: 64,
            ctx_len: 0,
            kv_budget_bytes: None,
            prefill_chunk: fucina_llm::PREFILL_CHUNK,
            prefix_cache_bytes: 0,
        }
    }
}

/// One generation request, tokenized.
#[derive(Clone, Debug)]
pub struct GenRequest {
    /// The prompt's ids (at least one).
    pub prompt: Vec<u32>,
    /// The most tokens to generate (at least 1); generation also ends when the
    /// sequence reaches the context length.
    pub max_tokens: usize,
    /// How tokens are chosen (its `stop_tokens` are replaced by the model's).
    pub sampling: SamplingParams,
    /// Strings that end the sequence (not included in the text).
    pub stop: Vec<String>,
    /// Log-probabilities of each chosen token and of this many most likely
    /// alternatives, when given.
    pub logprobs: Option<usize>,
    /// Token ids that end the sequence besides the model's end-of-sequence
    /// ids (a chat template's end-of-turn tokens).
    pub stop_tokens: Vec<u32>,
}

/// A token the sequence produced, with its log-probabilities when asked.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenInfo {
    /// The token's id.
    pub id: u32,
    /// Its text (the tokenizer's decoding of the id alone) when
    /// log-probabilities were asked, else empty.
    pub text: String,
    /// `log p(id)` under the model's distribution (the softmax of the raw
    /// logits, before sampling's penalties and temperature).
    pub logprob: Option<f32>,
    /// The most likely tokens with their log-probabilities, most likely first
    /// (lower id first among equal ones).
    pub top: Vec<(u32, String, f32)>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or a stop string.
    Stop,
    /// `max_tokens`, or the context length.
    Length,
}

impl FinishReason {
    /// OpenAI's name of the reason (`"stop"`, `"length"`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What a request's receiver gets, in order: text deltas, then one `Done` (or
/// one `Failed`).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New text (possibly empty: tokens whose text is held back) and the tokens
    /// produced since the previous event.
    Text {
        /// The text delta.
        text: String,
        /// The tokens chosen since the previous event.
        tokens: Vec<TokenInfo>,
    },
    /// The sequence ended.
    Done {
        /// Why.
        reason: FinishReason,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens (a stop token included).
        completion_tokens: usize,
    },
    /// The sequence failed (an error of the model's kernels).
    Failed(String),
}

/// Why [`Engine::submit`] refused a request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    /// The waiting queue is full; try again later.
    #[error("the server is busy: {0} requests are waiting")]
    QueueFull(usize),
    /// The prompt leaves no room for a generated token in the context.
    #[error("the prompt has {prompt} tokens; the context holds {ctx_len} (prompt and generated)")]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// The context length.
        ctx_len: usize,
    },
    /// The request is invalid (an empty prompt, a token id past the vocabulary,
    /// `max_tokens` of 0, bad sampling parameters).
    #[error("{0}")]
    Invalid(String),
    /// The engine is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// What the server layer reads of the model.
#[derive(Debug)]
pub struct ModelInfo {
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The context length sequences get.
    pub ctx_len: usize,
    /// The vocabulary size.
    pub vocab: usize,
    /// The model's end-of-sequence ids.
    pub stop_tokens: Vec<u32>,
    /// The chat template's end-of-turn ids (empty without a template).
    pub end_of_turn: Vec<u32>,
}

struct Shared {
    waiting: AtomicUsize,
    draining: AtomicBool,
    metrics: Arc<Metrics>,
}

/// A handle to the scheduler thread. Dropping it (or [`Engine::shutdown`])
/// lets the running and waiting sequences finish, then stops the thread.
pub struct Engine {
    commands: Option<mpsc::Sender<Submitted>>,
    shared: Arc<Shared>,
    info: Arc<ModelInfo>,
    max_queue: usize,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("max_queue", &self.max_queue)
            .field("ctx_len", &self.info.ctx_len)
            .finish_non_exhaustive()
    }
}

struct Submitted {
    req: GenRequest,
    events: UnboundedSender<Event>,
    arrived: Instant,
}

impl Engine {
    /// Starts the scheduler thread: it builds the worker team
    /// (`options.threads`), calls `load` with it and serves the model `load`
    /// returns (which must hold a tokenizer).
    ///
    /// # Errors
    /// What `load` returns; [`LlmError::InvalidRequest`] for a model without a
    /// tokenizer, options out of range (`max_batch` or `prefill_chunk` of 0, a
    /// `ctx_len` past the model's `max_position_embeddings`), or a KV budget
    /// smaller than one sequence of `ctx_len` positions.
    pub fn start(
        options: EngineOptions,
        metrics: Arc<Metrics>,
        load: impl FnOnce(&ExecContext) -> Result<OpenedModel, LlmError> + Send + 'static,
    ) -> Result<Engine, LlmError> {
        let invalid = |reason: String| LlmError::InvalidRequest {
            op: "fucina-serve",
            reason,
        };
        if options.max_batch == 0 || options.prefill_chunk == 0 || options.threads == 0 {
            return Err(invalid(
                "threads, max_batch and prefill_chunk must be at least 1".into(),
            ));
        }
        let (ready_tx, ready_rx) = mpsc::channel();
        let (cmd_tx, cmd_rx) = mpsc::channel::<Submitted>();
        let shared = Arc::new(Shared {
            waiting: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            metrics,
        });
        let thread_shared = Arc::clone(&shared);
        let max_queue = options.max_queue;
        let thread = std::thread::Builder::new()
            .name("fucina-serve engine".into())
            .spawn(move || {
                let ctx = ExecContext::with_threads(options.threads);
                let setup = load(&ctx).and_then(|opened| Scheduler::new(ctx, opened, &options));
                match setup {
                    Ok((scheduler, info)) => {
                        let info = Arc::new(info);
                        if ready_tx.send(Ok(Arc::clone(&info))).is_ok() {
                            scheduler.run(cmd_rx, &thread_shared, &info);
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| invalid(format!("cannot start the engine thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(info)) => Ok(Engine {
                commands: Some(cmd_tx),
                shared,
                info,
                max_queue,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(invalid("the engine thread panicked while loading".into())),
        }
    }

    /// The model's tokenizer, context length and vocabulary.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The metrics the engine updates.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// Queues `req`; its events arrive on the returned receiver. Dropping the
    /// receiver cancels the sequence (at the next turn of the loop).
    ///
    /// # Errors
    /// [`SubmitError`]: a full queue, a prompt that leaves no room in the
    /// context, an invalid request, a shutting-down engine. Nothing is queued
    /// then.
    pub fn submit(&self, mut req: GenRequest) -> Result<UnboundedReceiver<Event>, SubmitError> {
        let info = &self.info;
        if req.prompt.is_empty() {
            return Err(SubmitError::Invalid("the prompt is empty".into()));
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= info.vocab) {
            return Err(SubmitError::Invalid(format!(
                "token id {bad} is past the vocabulary ({} tokens)",
                info.vocab
            )));
        }
        if req.max_tokens == 0 {
            return Err(SubmitError::Invalid("max_tokens must be at least 1".into()));
        }
        if req.prompt.len() >= info.ctx_len {
            return Err(SubmitError::PromptTooLong {
                prompt: req.prompt.len(),
                ctx_len: info.ctx_len,
            });
        }
        let mut stops = info.stop_tokens.clone();
        stops.extend(req.stop_tokens.iter().copied());
        stops.sort_unstable();
        stops.dedup();
        req.sampling.stop_tokens = stops;
        req.sampling
            .validate()
            .map_err(|e| SubmitError::Invalid(e.to_string()))?;
        if self.shared.draining.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        let waiting = &self.shared.waiting;
        let mut n = waiting.load(Ordering::Relaxed);
        loop {
            if n >= self.max_queue {
                return Err(SubmitError::QueueFull(n));
            }
            match waiting.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => n = now,
            }
        }
        self.shared.metrics.set_waiting(n + 1);
        let (tx, rx) = unbounded_channel();
        let sent = self.commands.as_ref().is_some_and(|c| {
            c.send(Submitted {
                req,
                events: tx,
                arrived: Instant::now(),
            })
            .is_ok()
        });
        if !sent {
            waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(rx)
    }

    /// Refuses new requests from now on, lets the running and waiting ones
    /// finish, and waits for the scheduler thread to end.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// Whether [`begin_shutdown`](Engine::begin_shutdown) was called.
    pub fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::Acquire)
    }

    /// Refuses new requests from now on ([`SubmitError::ShuttingDown`]); the
    /// running and waiting ones go on.
    pub fn begin_shutdown(&self) {
        self.shared.draining.store(true, Ordering::Release);
    }

    fn stop(&mut self) {
        self.begin_shutdown();
        self.commands = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running sequence.
struct Seq {
    events: UnboundedSender<Event>,
    req: GenRequest,
    cache: KvCache,
    /// Prompt tokens prefilled so far.
    prefilled: usize,
    /// The prompt and the generated ids (the repetition penalty's history).
    history: Vec<u32>,
    sampler: Sampler,
    /// The token to feed to the next decode step.
    next: Option<u32>,
    /// The generated ids' text (stop token excluded), decoded incrementally.
    decoded: Detokenizer,
    text: TextStream,
    pending: Vec<TokenInfo>,
    finished: bool,
    arrived: Instant,
    first_token: bool,
    cache_bytes: usize,
    /// Whether blocks of the prompt came from the prefix cache.
    prefix_hit: bool,
}

struct Scheduler {
    ctx: ExecContext,
    model: Model,
    tokenizer: Tokenizer,
    ctx_len: usize,
    max_batch: usize,
    prefill_chunk: usize,
    budget: usize,
    bytes_per_position: usize,
    used: usize,
    logits: Vec<f32>,
    last_logits: Vec<f32>,
    prefix: Option<PrefixCache>,
}

impl Scheduler {
    fn new(
        ctx: ExecContext,
        opened: OpenedModel,
        options: &EngineOptions,
    ) -> Result<(Scheduler, ModelInfo), LlmError> {
        let invalid = |reason: String| LlmError::InvalidRequest {
            op: "fucina-serve",
            reason,
        };
        let OpenedModel {
            model,
            tokenizer,
            stop_tokens,
        } = opened;
        let tokenizer =
            tokenizer.ok_or_else(|| invalid("the model has no tokenizer to serve text".into()))?;
        let config = model.config();
        let max_pos = config.max_position_embeddings;
        let ctx_len = match options.ctx_len {
            0 => max_pos,
            n if n > max_pos => {
                return Err(invalid(format!(
                    "ctx_len {n} exceeds the model's max_position_embeddings {max_pos}"
                )));
            }
            n => n,
        };
        // The bytes of one position of a cache (the cache's own accounting).
        let probe = model.new_cache(&ctx, KV_BLOCK)?;
        let bytes_per_position = probe.bytes() / KV_BLOCK;
        let prefix = (options.prefix_cache_bytes > 0)
            .then(|| PrefixCache::new(options.prefix_cache_bytes, probe.block_elems()));
        drop(probe);
        let one = ctx_len.next_multiple_of(16) * bytes_per_position;
        let budget = match options.kv_budget_bytes {
            Some(b) if b < one => {
                return Err(invalid(format!(
                    "the KV budget of {b} bytes holds no sequence of ctx_len {ctx_len} \
                     ({one} bytes)"
                )));
            }
            Some(b) => b,
            None => one.saturating_mul(options.max_batch),
        };
        let vocab = config.vocab_size;
        let info = ModelInfo {
            end_of_turn: tokenizer.end_of_turn_ids(),
            tokenizer: tokenizer.clone(),
            ctx_len,
            vocab,
            stop_tokens,
        };
        Ok((
            Scheduler {
                ctx,
                model,
                tokenizer,
                ctx_len,
                max_batch: options.max_batch,
                prefill_chunk: options.prefill_chunk,
                budget,
                bytes_per_position,
                used: 0,
                logits: Vec::new(),
                last_logits: vec![0.0; vocab],
                prefix,
            },
            info,
        ))
    }

    fn run(mut self, commands: mpsc::Receiver<Submitted>, shared: &Shared, info: &ModelInfo) {
        let metrics = &shared.metrics;
        metrics.set_budget(self.budget);
        if let Some(prefix) = &self.prefix {
            metrics.set_prefix_budget(prefix.budget());
        }
        let mut waiting: VecDeque<Submitted> = VecDeque::new();
        let mut running: Vec<Seq> = Vec::new();
        let mut open = true;
        loop {
            if running.is_empty() && waiting.is_empty() {
                if !open {
                    break;
                }
                match commands.recv() {
                    Ok(s) => waiting.push_back(s),
                    Err(_) => break,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(s) => waiting.push_back(s),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            // Admission, oldest first, while the batch and the budget have room.
            while running.len() < self.max_batch {
                let Some(front) = waiting.front() else { break };
                let positions = (front.req.prompt.len() + front.req.max_tokens).min(self.ctx_len);
                let bytes = positions.next_multiple_of(16) * self.bytes_per_position;
                if self.used + bytes > self.budget {
                    break;
                }
                let s = waiting.pop_front().expect("front exists");
                shared.waiting.fetch_sub(1, Ordering::AcqRel);
                if s.events.is_closed() {
                    metrics.cancelled();
                    continue;
                }
                match self.admit(s, positions, info) {
                    Ok(seq) => {
                        self.used += seq.cache_bytes;
                        running.push(seq);
                    }
                    Err((events, e)) => {
                        let _ = events.send(Event::Failed(e.to_string()));
                        metrics.failed();
                    }
                }
            }
            // Clients that went away free their sequences now.
            for seq in running.iter_mut() {
                if seq.events.is_closed() {
                    seq.finished = true;
                    metrics.cancelled();
                }
            }
            self.retire(&mut running);
            metrics.set_waiting(shared.waiting.load(Ordering::Acquire));
            metrics.set_running(running.len(), self.used);
            if running.is_empty() {
                continue;
            }
            self.step(&mut running, metrics);
            self.retire(&mut running);
            metrics.set_running(running.len(), self.used);
        }
        metrics.set_running(0, 0);
    }

    fn admit(
        &mut self,
        s: Submitted,
        positions: usize,
        info: &ModelInfo,
    ) -> Result<Seq, (UnboundedSender<Event>, LlmError)> {
        let cache = match self.model.new_cache(&self.ctx, positions) {
            Ok(c) => c,
            Err(e) => return Err((s.events, e)),
        };
        let sampler = match Sampler::with_vocab(s.req.sampling.clone(), info.vocab) {
            Ok(x) => x,
            Err(e) => return Err((s.events, e)),
        };
        let cache_bytes = cache.bytes();
        let mut history = Vec::with_capacity(positions);
        history.extend_from_slice(&s.req.prompt);
        Ok(Seq {
            text: TextStream::new(s.req.stop.clone()),
            events: s.events,
            cache,
            prefilled: 0,
            history,
            sampler,
            next: None,
            decoded: Detokenizer::default(),
            pending: Vec::new(),
            finished: false,
            arrived: s.arrived,
            first_token: true,
            cache_bytes,
            prefix_hit: false,
            req: s.req,
        })
    }

    /// Drops the finished sequences (their caches go back to the pool).
    fn retire(&mut self, running: &mut Vec<Seq>) {
        let mut used = self.used;
        running.retain(|s| {
            if s.finished {
                used -= s.cache_bytes;
            }
            !s.finished
        });
        self.used = used;
    }

    /// One turn's model work: a prompt chunk of the oldest sequence still
    /// reading its prompt and a decode step for every sequence with a token
    /// to feed, in one pass ([`Model::step`]) when both are pending, else
    /// whichever is (a sequence whose prompt ends here then decodes at once).
    fn step(&mut self, running: &mut [Seq], metrics: &Metrics) {
        let reading = running
            .iter()
            .position(|s| !s.finished && s.prefilled < s.req.prompt.len());
        let decoding = running.iter().any(|s| !s.finished && s.next.is_some());
        match reading {
            Some(i) if decoding => self.mixed_step(running, i, metrics),
            _ => {
                self.prefill_step(running, metrics);
                self.decode_step(running, metrics);
            }
        }
    }

    /// Copies into `seq`'s cache the blocks of the prefix cache that continue
    /// its prompt; false when that failed (the sequence failed then).
    fn import_prefix(&mut self, seq: &mut Seq, metrics: &Metrics) -> bool {
        let Some(prefix) = self.prefix.as_mut() else {
            return true;
        };
        let variant = self.model.kv_variant(seq.cache.capacity());
        // The last prompt token is always prefilled: its logits choose the
        // first generated token.
        let limit = seq.req.prompt.len() - 1;
        match prefix.import(variant, &seq.req.prompt, limit, &mut seq.cache) {
            Ok(0) => {}
            Ok(n) => {
                metrics.prefix_hit(n, !seq.prefix_hit);
                seq.prefix_hit = true;
                seq.prefilled += n;
            }
            Err(e) => {
                fail(seq, &e, metrics);
                return false;
            }
        }
        true
    }

    /// Records that `seq`'s prompt is prefilled up to `end` (the prefix cache
    /// takes its new whole blocks).
    fn prefilled(&mut self, seq: &mut Seq, end: usize, metrics: &Metrics) {
        metrics.prompt_tokens(end - seq.prefilled);
        seq.prefilled = end;
        if let Some(prefix) = self.prefix.as_mut() {
            let variant = self.model.kv_variant(seq.cache.capacity());
            // An export error would only leave the block out of the cache.
            let _ = prefix.insert(variant, &seq.req.prompt[..end], &seq.cache);
            metrics.set_prefix_cache(prefix.bytes());
        }
    }

    /// One prompt chunk of the oldest sequence still reading its prompt.
    fn prefill_step(&mut self, running: &mut [Seq], metrics: &Metrics) {
        let Some(seq) = running
            .iter_mut()
            .find(|s| !s.finished && s.prefilled < s.req.prompt.len())
        else {
            return;
        };
        if !self.import_prefix(seq, metrics) {
            return;
        }
        let end = (seq.prefilled + self.prefill_chunk).min(seq.req.prompt.len());
        let chunk = &seq.req.prompt[seq.prefilled..end];
        let r = self.model.prefill(
            &self.ctx,
            &mut seq.cache,
            chunk,
            None,
            &mut self.last_logits,
        );
        if let Err(e) = r {
            fail(seq, &e, metrics);
            return;
        }
        self.prefilled(seq, end, metrics);
        if end == seq.req.prompt.len() {
            let logits = std::mem::take(&mut self.last_logits);
            self.choose(seq, &logits, metrics);
            self.last_logits = logits;
        }
    }

    /// A prompt chunk of `running[reader]` (at most [`PREFILL_CHUNK`] tokens)
    /// and a decode step of every sequence with a token to feed, in one pass.
    /// When the pass fails, the separate steps run instead (so that an error
    /// fails only the sequences it concerns).
    fn mixed_step(&mut self, running: &mut [Seq], reader: usize, metrics: &Metrics) {
        let vocab = self.last_logits.len();
        let (before, rest) = running.split_at_mut(reader);
        let (seq, after) = rest.split_first_mut().expect("reader is in running");
        if !self.import_prefix(seq, metrics) {
            return self.decode_step(running, metrics);
        }
        let prompt_len = seq.req.prompt.len();
        let end = (seq.prefilled + self.prefill_chunk.min(PREFILL_CHUNK)).min(prompt_len);
        let mut members: Vec<&mut Seq> = before
            .iter_mut()
            .chain(after.iter_mut())
            .filter(|s| !s.finished && s.next.is_some())
            .collect();
        let tokens: Vec<u32> = members.iter().map(|s| s.next.expect("filtered")).collect();
        self.logits.resize(members.len() * vocab, 0.0);
        let mut caches: Vec<&mut KvCache> = members.iter_mut().map(|s| &mut s.cache).collect();
        let chunk = PromptChunk {
            cache: &mut seq.cache,
            tokens: &seq.req.prompt[seq.prefilled..end],
            last_logits: (end == prompt_len).then_some(&mut self.last_logits[..]),
        };
        let r = self.model.step(
            &self.ctx,
            Some(chunk),
            &mut caches,
            &tokens,
            &mut self.logits,
        );
        drop(caches);
        if r.is_err() {
            drop(members);
            self.prefill_step(running, metrics);
            return self.decode_step(running, metrics);
        }
        metrics.decode_step();
        metrics.mixed_step();
        self.prefilled(seq, end, metrics);
        let logits = std::mem::take(&mut self.logits);
        for (member, row) in members.into_iter().zip(logits.chunks_exact(vocab)) {
            self.choose(member, row, metrics);
        }
        self.logits = logits;
        if end == prompt_len {
            let logits = std::mem::take(&mut self.last_logits);
            self.choose(seq, &logits, metrics);
            self.last_logits = logits;
        }
    }

    /// One decode step for every sequence with a token to feed.
    fn decode_step(&mut self, running: &mut [Seq], metrics: &Metrics) {
        let vocab = self.last_logits.len();
        let mut members: Vec<&mut Seq> = running
            .iter_mut()
            .filter(|s| !s.finished && s.next.is_some())
            .collect();
        if members.is_empty() {
            return;
        }
        let tokens: Vec<u32> = members.iter().map(|s| s.next.expect("filtered")).collect();
        self.logits.resize(members.len() * vocab, 0.0);
        let mut caches: Vec<&mut KvCache> = members.iter_mut().map(|s| &mut s.cache).collect();
        let r = self
            .model
            .decode(&self.ctx, &mut caches, &tokens, &mut self.logits);
        drop(caches);
        if let Err(e) = r {
            for seq in members {
                fail(seq, &e, metrics);
            }
            return;
        }
        metrics.decode_step();
        let logits = std::mem::take(&mut self.logits);
        for (seq, row) in members.into_iter().zip(logits.chunks_exact(vocab)) {
            self.choose(seq, row, metrics);
        }
        self.logits = logits;
    }

    /// Samples the sequence's next token from `logits` and sends what it adds.
    fn choose(&mut self, seq: &mut Seq, logits: &[f32], metrics: &Metrics) {
        let id = match seq.sampler.sample(logits, &seq.history) {
            Ok(id) => id,
            Err(e) => return fail(seq, &e, metrics),
        };
        if seq.first_token {
            seq.first_token = false;
            metrics.first_token(seq.arrived.elapsed());
        }
        metrics.generated_token();
        seq.history.push(id);
        let generated = seq.history.len() - seq.req.prompt.len();
        let info = self.token_info(id, logits, seq.req.logprobs);
        seq.pending.push(info);
        let stop_token = seq.sampler.is_stop(id);
        // A sequence holds at most ctx_len tokens, the last one included.
        let length = generated >= seq.req.max_tokens
            || seq.history.len() >= self.ctx_len
            || seq.cache.remaining() == 0;
        let mut reason = if stop_token {
            Some(FinishReason::Stop)
        } else if length {
            Some(FinishReason::Length)
        } else {
            None
        };
        let last = reason.is_some();
        let full = match seq
            .decoded
            .push(&self.tokenizer, (!stop_token).then_some(id), last)
        {
            Ok(t) => t,
            Err(e) => return fail(seq, &e, metrics),
        };
        let text = match seq.text.advance(full, last) {
            Advance::More(t) => t,
            Advance::Stopped(t) => {
                reason = Some(FinishReason::Stop);
                t
            }
        };
        if !text.is_empty() || reason.is_some() {
            let tokens = std::mem::take(&mut seq.pending);
            if seq.events.send(Event::Text { text, tokens }).is_err() {
                seq.finished = true;
                metrics.cancelled();
                return;
            }
        }
        match reason {
            Some(reason) => {
                let _ = seq.events.send(Event::Done {
                    reason,
                    prompt_tokens: seq.req.prompt.len(),
                    completion_tokens: generated,
                });
                seq.finished = true;
                metrics.completed();
            }
            None => seq.next = Some(id),
        }
    }

    /// The chosen token and, when asked, its text, its log-probability and
    /// the `top` most likely alternatives: the log-softmax of the raw logits,
    /// its sum in f64 in id order (the same bits for the same logits).
    fn token_info(&self, id: u32, logits: &[f32], top: Option<usize>) -> TokenInfo {
        let text = |t: u32| self.tokenizer.decode(&[t], false).unwrap_or_default();
        let Some(n) = top else {
            return TokenInfo {
                id,
                text: String::new(),
                logprob: None,
                top: Vec::new(),
            };
        };
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        let log_z = max + sum.ln();
        let lp = |t: u32| (logits[t as usize] as f64 - log_z) as f32;
        let mut best: Vec<u32> = Vec::with_capacity(n + 1);
        for (t, &l) in logits.iter().enumerate() {
            let t = t as u32;
            let pos = best.partition_point(|&b| logits[b as usize] >= l);
            if pos < n {
                best.insert(pos, t);
                best.truncate(n);
            }
        }
        TokenInfo {
            id,
            text: text(id),
            logprob: Some(lp(id)),
            top: best.into_iter().map(|t| (t, text(t), lp(t))).collect(),
        }
    }
}

fn fail(seq: &mut Seq, e: &LlmError, metrics: &Metrics) {
    let _ = seq.events.send(Event::Failed(e.to_string()));
    seq.finished = true;
    metrics.failed();
}
