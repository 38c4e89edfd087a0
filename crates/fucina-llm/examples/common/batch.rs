//! The generation loop of the `generate` example, apart from its command line
//! so the fixture tests can run it (they include this file with `#[path]`):
//! every prompt is prefilled into its own KV cache, then all unfinished
//! sequences advance together, one batched [`Model::decode`] step per token; a
//! sequence that produces a stop token or reaches its token budget drops out of
//! the batch.
#![allow(dead_code)] // not every including target uses every field

use std::time::Instant;

use fucina_llm::LlmError;
use fucina_llm::cache::KvCache;
use fucina_llm::fucina::ExecContext;
use fucina_llm::model::Model;
use fucina_llm::sample::{Sampler, SamplingParams};

/// What [`generate`] produced.
pub(crate) struct Generation {
    /// The generated ids of each prompt (a stop token, when one ended the
    /// sequence, is its last id).
    pub(crate) ids: Vec<Vec<u32>>,
    /// The logits of every position of the first prompt, `[T, vocab]` row-major,
    /// when asked for.
    pub(crate) first_prompt_logits: Option<Vec<f32>>,
    /// Prompt tokens prefilled, and the seconds it took.
    pub(crate) prefill_tokens: usize,
    /// Seconds spent in prefill.
    pub(crate) prefill_secs: f64,
    /// Tokens produced by decode steps (the first token of each sequence comes
    /// from its prefill), and the seconds the steps took (sampling included).
    pub(crate) decode_tokens: usize,
    /// Seconds spent in decode steps.
    pub(crate) decode_secs: f64,
    /// Decode steps (batched calls).
    pub(crate) decode_steps: usize,
    /// Why each sequence ended.
    pub(crate) stops: Vec<Stop>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// It produced this stop token (one of the sampler's `stop_tokens`: the
    /// model's end-of-sequence ids), its last id.
    StopToken(u32),
    /// It produced `max_new_tokens` tokens.
    MaxTokens,
}

/// Generates up to `max_new_tokens` ids after each of `prompts` as one batch.
///
/// Sequence `i` samples with `params` and seed `params.seed + i` (wrapping), so
/// a batch of one prompt draws what that prompt draws alone, and every sequence
/// gets its own stream. With `want_logits` the first prompt's prefill keeps the
/// logits of all its positions.
pub(crate) fn generate(
    model: &Model,
    ctx: &ExecContext,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    params: &SamplingParams,
    want_logits: bool,
) -> Result<Generation, LlmError> {
    generate_streaming(
        model,
        ctx,
        prompts,
        max_new_tokens,
        params,
        want_logits,
        &mut |_, _| {},
    )
}

/// [`generate`], calling `on_token(sequence, id)` for each id as soon as it is
/// chosen (the first id of every sequence after its prefill, then one per
/// sequence and decode step).
pub(crate) fn generate_streaming(
    model: &Model,
    ctx: &ExecContext,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    params: &SamplingParams,
    want_logits: bool,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<Generation, LlmError> {
    let invalid = |reason: String| LlmError::InvalidRequest {
        op: "generate",
        reason,
    };
    if prompts.is_empty() {
        return Err(invalid("no prompt was given".to_string()));
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(invalid(format!("prompt {i} has no tokens")));
    }
    let vocab = model.config().vocab_size;
    let mut out = Generation {
        ids: vec![Vec::new(); prompts.len()],
        first_prompt_logits: None,
        prefill_tokens: 0,
        prefill_secs: 0.0,
        decode_tokens: 0,
        decode_secs: 0.0,
        decode_steps: 0,
        stops: vec![Stop::MaxTokens; prompts.len()],
    };
    if max_new_tokens == 0 {
        return Ok(out);
    }
    let mut caches: Vec<KvCache> = Vec::with_capacity(prompts.len());
    let mut samplers: Vec<Sampler> = Vec::with_capacity(prompts.len());
    let mut histories: Vec<Vec<u32>> = Vec::with_capacity(prompts.len());
    let mut live: Vec<bool> = Vec::with_capacity(prompts.len());
    let mut last = vec![0f32; vocab];
    let start = Instant::now();
    for (i, prompt) in prompts.iter().enumerate() {
        // The last generated token is never fed back, so prompt + max_new - 1
        // positions suffice.
        let mut cache = model.new_cache(ctx, prompt.len() + max_new_tokens - 1)?;
        if i == 0 && want_logits {
            let mut all = vec![0f32; prompt.len() * vocab];
            model.prefill(ctx, &mut cache, prompt, Some(&mut all), &mut last)?;
            out.first_prompt_logits = Some(all);
        } else {
            model.prefill(ctx, &mut cache, prompt, None, &mut last)?;
        }
        let seq_params = SamplingParams {
            seed: params.seed.wrapping_add(i as u64),
            ..params.clone()
        };
        let mut sampler = Sampler::with_vocab(seq_params, vocab)?;
        let mut history = Vec::with_capacity(prompt.len() + max_new_tokens);
        history.extend_from_slice(prompt);
        let t = sampler.sample(&last, &history)?;
        history.push(t);
        out.ids[i].push(t);
        on_token(i, t);
        if sampler.is_stop(t) {
            out.stops[i] = Stop::StopToken(t);
        }
        live.push(!sampler.is_stop(t) && max_new_tokens > 1);
        caches.push(cache);
        samplers.push(sampler);
        histories.push(history);
        out.prefill_tokens += prompt.len();
    }
    out.prefill_secs = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut logits = vec![0f32; prompts.len() * vocab];
    let mut tokens: Vec<u32> = Vec::with_capacity(prompts.len());
    let mut members: Vec<usize> = Vec::with_capacity(prompts.len());
    loop {
        members.clear();
        members.extend((0..prompts.len()).filter(|&i| live[i]));
        if members.is_empty() {
            break;
        }
        tokens.clear();
        tokens.extend(members.iter().map(|&i| *out.ids[i].last().unwrap()));
        let mut batch: Vec<&mut KvCache> = caches
            .iter_mut()
            .zip(&live)
            .filter(|(_, l)| **l)
            .map(|(c, _)| c)
            .collect();
        let n = members.len();
        model.decode(ctx, &mut batch, &tokens, &mut logits[..n * vocab])?;
        out.decode_steps += 1;
        for (row, &i) in members.iter().enumerate() {
            let t = samplers[i].sample(&logits[row * vocab..(row + 1) * vocab], &histories[i])?;
            histories[i].push(t);
            out.ids[i].push(t);
            out.decode_tokens += 1;
            on_token(i, t);
            if samplers[i].is_stop(t) {
                out.stops[i] = Stop::StopToken(t);
                live[i] = false;
            } else if out.ids[i].len() >= max_new_tokens {
                live[i] = false;
            }
        }
    }
    out.decode_secs = start.elapsed().as_secs_f64();
    Ok(out)
}

/// Parses `--prompt-ids`: prompts separated by `;`, ids by `,` (spaces
/// around them are ignored); an empty prompt or a bad id is an error naming it.
pub(crate) fn parse_prompt_ids(text: &str) -> Result<Vec<Vec<u32>>, String> {
    text.split(';')
        .enumerate()
        .map(|(i, p)| {
            let ids = p
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<u32>()
                        .map_err(|e| format!("prompt {i}: id {s:?}: {e}"))
                })
                .collect::<Result<Vec<u32>, String>>()?;
            if ids.is_empty() {
                return Err(format!("prompt {i} has no ids"));
            }
            Ok(ids)
        })
        .collect()
}

/// One reply of a [`ChatSession`].
#[derive(Debug)]
pub(crate) struct Turn {
    /// The generated ids (a stop token, when one ended the reply, is the last).
    pub(crate) ids: Vec<u32>,
    /// Why the reply ended.
    pub(crate) stop: Stop,
    /// Prompt tokens found in the cache from the turns before (not prefilled again).
    pub(crate) reused: usize,
    /// Prompt tokens prefilled.
    pub(crate) prefilled: usize,
    /// Seconds spent in prefill.
    pub(crate) prefill_secs: f64,
    /// Seconds spent in decode steps (sampling included).
    pub(crate) decode_secs: f64,
}

/// A conversation with one sequence whose KV cache lives from turn to turn:
/// each turn's prompt (the whole conversation rendered again, ending with the
/// new user message) is prefilled from where it stops matching the cached
/// tokens (the previous prompts and replies), so the earlier turns are not
/// computed again. Where a prompt departs from the cached tokens (a template
/// that rewrites earlier turns, such as Qwen3 dropping old reasoning, or a
/// reply whose text encodes to other ids than were generated) the cache is
/// truncated there ([`KvCache::truncate`]). The logits are the same bits
/// either way: a prefill after cached positions gives what one prefill of the
/// whole prompt gives.
pub(crate) struct ChatSession<'m> {
    model: &'m Model,
    cache: KvCache,
    /// The tokens whose positions the cache holds.
    cached: Vec<u32>,
    params: SamplingParams,
    turns: u64,
}

impl<'m> ChatSession<'m> {
    /// A session whose cache holds `capacity` positions (prompt and replies of
    /// every turn together); turn `i` (from 0) samples with seed
    /// `params.seed + i`.
    pub(crate) fn new(
        model: &'m Model,
        ctx: &ExecContext,
        capacity: usize,
        params: SamplingParams,
    ) -> Result<ChatSession<'m>, LlmError> {
        Sampler::with_vocab(params.clone(), model.config().vocab_size)?;
        Ok(ChatSession {
            model,
            cache: model.new_cache(ctx, capacity)?,
            cached: Vec::new(),
            params,
            turns: 0,
        })
    }

    /// The tokens the cache holds.
    pub(crate) fn cached(&self) -> &[u32] {
        &self.cached
    }

    /// Generates up to `max_new_tokens` ids after `prompt` (the whole
    /// conversation so far), calling `on_token` for each as it is chosen. After
    /// an error the cache starts over at the next turn.
    pub(crate) fn turn(
        &mut self,
        ctx: &ExecContext,
        prompt: &[u32],
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<Turn, LlmError> {
        let out = self.turn_inner(ctx, prompt, max_new_tokens, on_token);
        if out.is_err() {
            self.cache.clear();
            self.cached.clear();
        }
        out
    }

    fn turn_inner(
        &mut self,
        ctx: &ExecContext,
        prompt: &[u32],
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<Turn, LlmError> {
        let invalid = |reason: String| LlmError::InvalidRequest { op: "chat", reason };
        if prompt.is_empty() {
            return Err(invalid("the prompt has no tokens".to_string()));
        }
        let need = prompt.len() + max_new_tokens.saturating_sub(1);
        if need > self.cache.capacity() {
            return Err(invalid(format!(
                "the conversation ({} tokens) and --max-new-tokens {max_new_tokens} need {need} \
                 positions, more than the cache's {} (--context)",
                prompt.len(),
                self.cache.capacity()
            )));
        }
        let mut turn = Turn {
            ids: Vec::new(),
            stop: Stop::MaxTokens,
            reused: 0,
            prefilled: 0,
            prefill_secs: 0.0,
            decode_secs: 0.0,
        };
        if max_new_tokens == 0 {
            return Ok(turn);
        }
        let common = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // Keep the cached positions the prompt starts with, but at least the
        // last prompt token is prefilled (its logits choose the first id).
        let keep = common.min(prompt.len() - 1);
        self.cache.truncate(keep);
        self.cached.truncate(keep);
        turn.reused = self.cached.len();
        let fresh = &prompt[turn.reused..];
        let vocab = self.model.config().vocab_size;
        let mut last = vec![0f32; vocab];
        let start = Instant::now();
        self.model
            .prefill(ctx, &mut self.cache, fresh, None, &mut last)?;
        self.cached.extend_from_slice(fresh);
        turn.prefilled = fresh.len();
        turn.prefill_secs = start.elapsed().as_secs_f64();

        let start = Instant::now();
        let params = SamplingParams {
            seed: self.params.seed.wrapping_add(self.turns),
            ..self.params.clone()
        };
        self.turns += 1;
        let mut sampler = Sampler::with_vocab(params, vocab)?;
        let mut history = self.cached.clone();
        loop {
            let t = sampler.sample(&last, &history)?;
            turn.ids.push(t);
            history.push(t);
            on_token(t);
            if sampler.is_stop(t) {
                turn.stop = Stop::StopToken(t);
                break;
            }
            if turn.ids.len() >= max_new_tokens {
                break;
            }
            self.model
                .decode(ctx, &mut [&mut self.cache], &[t], &mut last)?;
            self.cached.push(t);
        }
        turn.decode_secs = start.elapsed().as_secs_f64();
        Ok(turn)
    }
}
