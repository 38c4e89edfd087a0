//! Choosing the next token from a row of logits: greedy, or a seeded draw after
//! repetition penalty, temperature, top-k and top-p.
//!
//! The processing follows Hugging Face `transformers` (`generate`), in its order:
//!
//! 1. **Repetition penalty** `r` (1 = off): every token that occurs in the
//!    history (the prompt and what was generated so far) has its logit `l`
//!    replaced by `l / r` when `l > 0` and `l * r` otherwise; a token occurring
//!    several times is penalized once.
//! 2. **Greedy** (`temperature == 0`): the token with the largest logit, the
//!    lowest id among equal ones. Top-k and top-p do not change the argmax and
//!    are not applied.
//! 3. **Temperature** `t`: the logits are divided by `t` (after subtracting
//!    their maximum, which changes none of the steps below and keeps a tiny `t`
//!    from overflowing).
//! 4. **Top-k** `k` (0 = off): tokens whose logit is below the `k`-th largest
//!    are removed (tokens equal to it are kept, as in `transformers`).
//! 5. **Top-p** `p` (1 = off): with the remaining tokens ranked by logit (larger
//!    first, lower id first among equal ones) and `q` their softmax
//!    probabilities, a token is kept when the probability mass ranked strictly
//!    above it is below `p`: the smallest prefix whose mass reaches `p`, and
//!    always at least the first token.
//! 6. **The draw**: the weights `exp(l)` of the kept tokens (`l` the shifted,
//!    scaled logits, so the largest weight is 1), in id order,
//!    go to [`categorical`](fucina::rng::categorical)`(seed, step, weights)`,
//!    where `step` counts the sampler's calls (0 for the first). `exp` is the
//!    runtime's own (`fucina::exec::math::exp`), a
//!    fixed sequence of IEEE operations (no libm call) and the sums are f64 in a
//!    fixed order, so the same seed, parameters and logits give the same token on
//!    every machine, thread count and vector level.
//!
//! A [`Sampler`] owns scratch sized by the vocabulary (allocated by
//! [`Sampler::with_vocab`] or on the first call), so [`Sampler::sample`]
//! allocates nothing after that.
//!
//! ```
//! use fucina_llm::sample::{Sampler, SamplingParams};
//!
//! let logits = [0.5f32, 2.0, -1.0, 2.0];
//! // Greedy: the largest logit, the lower id among equal ones.
//! let mut greedy = Sampler::new(SamplingParams::default())?;
//! assert_eq!(greedy.sample(&logits, &[])?, 1);
//! // A repetition penalty of 3 turns 2.0 into 0.667 for token 1 (in the history).
//! let params = SamplingParams { repetition_penalty: 3.0, ..SamplingParams::default() };
//! assert_eq!(Sampler::new(params)?.sample(&logits, &[1])?, 3);
//! // Seeded draws: the same seed, the same tokens.
//! let params = SamplingParams { temperature: 0.8, top_k: 3, seed: 7, ..SamplingParams::default() };
//! let mut a = Sampler::with_vocab(params.clone(), logits.len())?;
//! let mut b = Sampler::new(params)?;
//! for _ in 0..8 {
//!     let t = a.sample(&logits, &[])?;
//!     assert_ne!(t, 2); // removed by top-k
//!     assert_eq!(b.sample(&logits, &[])?, t);
//! }
//! # Ok::<(), fucina_llm::LlmError>(())
//! ```

use fucina::exec::math::exp;

use crate::LlmError;

/// How [`Sampler`] chooses tokens. [`Default`] is greedy decoding with nothing
/// else enabled.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits before the draw; 0 chooses greedily (the argmax).
    /// Must be finite and `>= 0`.
    pub temperature: f32,
    /// Keeps the `top_k` largest logits (and any equal to the smallest of them);
    /// 0 turns it off.
    pub top_k: usize,
    /// Nucleus sampling: keeps the most probable tokens until their mass reaches
    /// `top_p`. Must be in `(0, 1]`; 1 turns it off.
    pub top_p: f32,
    /// Penalty for tokens already in the history (divides positive logits,
    /// multiplies negative ones). Must be finite and `> 0`; 1 turns it off.
    /// The penalized score saturates at `±f32::MAX`, so a finite logit stays
    /// finite whatever the penalty (and a `-inf` one stays `-inf`).
    pub repetition_penalty: f32,
    /// Seed of the draws (unused by greedy decoding).
    pub seed: u64,
    /// Tokens that end a sequence (see [`Sampler::is_stop`]).
    pub stop_tokens: Vec<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 0,
            stop_tokens: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Checks the parameters' ranges (see each field).
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] naming the parameter and its value: a
    /// negative, infinite or NaN temperature, a top-p outside `(0, 1]` or NaN, a
    /// repetition penalty that is not finite and positive.
    pub fn validate(&self) -> Result<(), LlmError> {
        let bad = |reason: String| {
            Err(LlmError::InvalidRequest {
                op: "sampling",
                reason,
            })
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!(
                "temperature must be finite and >= 0 (0 = greedy), got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!(
                "top_p must be in (0, 1] (1 = off), got {}",
                self.top_p
            ));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(format!(
                "repetition_penalty must be finite and > 0 (1 = off), got {}",
                self.repetition_penalty
            ));
        }
        Ok(())
    }

    /// Whether the parameters choose greedily (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Chooses tokens from logits under [`SamplingParams`] (see the [module
/// documentation](self) for the exact rule). One sampler per sequence: its
/// draw counter is that sequence's step.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    step: u64,
    /// The processed logits.
    scores: Vec<f32>,
    /// The draw weights (also the selection buffer of top-k).
    weights: Vec<f32>,
    /// Token ids ranked for top-p.
    order: Vec<u32>,
}

impl Sampler {
    /// A sampler with `params`; its scratch is allocated on the first
    /// [`sample`](Sampler::sample) call (see [`with_vocab`](Sampler::with_vocab)).
    ///
    /// # Errors
    /// As [`SamplingParams::validate`].
    pub fn new(params: SamplingParams) -> Result<Sampler, LlmError> {
        params.validate()?;
        Ok(Sampler {
            params,
            step: 0,
            scores: Vec::new(),
            weights: Vec::new(),
            order: Vec::new(),
        })
    }

    /// A sampler whose scratch is allocated now for a vocabulary of `vocab`
    /// tokens, so no [`sample`](Sampler::sample) call on logits of that length
    /// allocates.
    ///
    /// # Errors
    /// As [`SamplingParams::validate`]; [`LlmError::InvalidRequest`] when
    /// `vocab` is above `u32::MAX` (token ids are `u32`) or the scratch cannot
    /// be allocated.
    pub fn with_vocab(params: SamplingParams, vocab: usize) -> Result<Sampler, LlmError> {
        let mut s = Sampler::new(params)?;
        if vocab > u32::MAX as usize {
            return Err(LlmError::InvalidRequest {
                op: "Sampler::with_vocab",
                reason: format!("{vocab} tokens: more than u32 token ids"),
            });
        }
        s.reserve(vocab)
            .map_err(|reason| LlmError::InvalidRequest {
                op: "Sampler::with_vocab",
                reason,
            })?;
        Ok(s)
    }

    /// Sizes the scratch for `vocab` tokens, or says why it cannot be
    /// allocated (nothing changes then).
    fn reserve(&mut self, vocab: usize) -> Result<(), String> {
        if self.scores.len() != vocab {
            let fail = |e| format!("cannot allocate the scratch for {vocab} tokens: {e}");
            let more = vocab.saturating_sub(self.scores.len());
            self.scores.try_reserve_exact(more).map_err(fail)?;
            self.weights.try_reserve_exact(more).map_err(fail)?;
            self.order.try_reserve_exact(more).map_err(fail)?;
            self.scores.resize(vocab, 0.0);
            self.weights.resize(vocab, 0.0);
            self.order.resize(vocab, 0);
        }
        Ok(())
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// How many tokens the sampler has chosen: the stream index of its next draw.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Sets the stream index of the next draw (e.g. to resume a sequence: a
    /// sampler with the same seed at the same step draws the same tokens).
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Whether `token` is one of the stop tokens (the sequence ends after it).
    pub fn is_stop(&self, token: u32) -> bool {
        self.params.stop_tokens.contains(&token)
    }

    /// Chooses the next token from `logits` (one per vocabulary entry), given
    /// the `history` of the sequence (prompt and generated tokens, for the
    /// repetition penalty), and advances the step. Allocates nothing once the
    /// scratch is sized for `logits.len()`.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] (nothing changes, the step included) when
    /// `logits` is empty, holds a NaN or `+inf`, or has no finite value, or when
    /// a history id is not below `logits.len()`.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, LlmError> {
        let vocab = logits.len();
        let bad = |reason: String| {
            Err(LlmError::InvalidRequest {
                op: "sample",
                reason,
            })
        };
        if vocab == 0 {
            return bad("no logits were given".to_string());
        }
        if vocab > u32::MAX as usize {
            return bad(format!("{vocab} logits: more than u32 token ids"));
        }
        let mut any_finite = false;
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() || l == f32::INFINITY {
                return bad(format!("logit {i} is {l}; logits must be finite or -inf"));
            }
            any_finite |= l.is_finite();
        }
        if !any_finite {
            return bad("every logit is -inf".to_string());
        }
        if let Some(&t) = history.iter().find(|&&t| t as usize >= vocab) {
            return bad(format!(
                "history token {t} is not below the vocabulary size {vocab}"
            ));
        }
        if let Err(reason) = self.reserve(vocab) {
            return bad(reason);
        }
        let p = &self.params;
        let scores = &mut self.scores;
        scores.copy_from_slice(logits);
        // 1. Repetition penalty, computed from the original logit so a repeated
        // token is penalized once. The penalized score saturates at ±f32::MAX:
        // a finite logit stays finite however large or small the penalty (an
        // infinite score would make the softmax's inf - inf a NaN, and greedy
        // decoding could pick a masked -inf token), and a -inf logit stays -inf.
        if p.repetition_penalty != 1.0 {
            let r = p.repetition_penalty;
            for &t in history {
                let l = logits[t as usize];
                scores[t as usize] = if l > 0.0 {
                    (l / r).min(f32::MAX)
                } else if l.is_finite() {
                    (l * r).max(f32::MIN)
                } else {
                    l
                };
            }
        }
        let token = if p.is_greedy() {
            argmax(scores)
        } else {
            // 3. Temperature, on logits shifted by their maximum (the softmax,
            // top-k and top-p do not change under a shift, and no logit can
            // overflow to +inf however small the temperature): the largest
            // becomes 0 and its weight exp(0) = 1.
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let t = p.temperature;
            for s in scores.iter_mut() {
                *s = (*s - max) / t;
            }
            // 4. Top-k.
            if p.top_k > 0 && p.top_k < vocab {
                let w = &mut self.weights;
                w.copy_from_slice(scores);
                let (_, kth, _) = w.select_nth_unstable_by(p.top_k - 1, |a, b| b.total_cmp(a));
                let kth = *kth;
                for s in scores.iter_mut() {
                    if *s < kth {
                        *s = f32::NEG_INFINITY;
                    }
                }
            }
            let weights = &mut self.weights;
            for (w, &s) in weights.iter_mut().zip(scores.iter()) {
                *w = if s == f32::NEG_INFINITY { 0.0 } else { exp(s) };
            }
            // 5. Top-p.
            if p.top_p < 1.0 {
                let order = &mut self.order;
                let mut n = 0;
                let mut total = 0.0f64;
                for (i, &w) in weights.iter().enumerate() {
                    if w > 0.0 {
                        order[n] = i as u32;
                        n += 1;
                        total += f64::from(w);
                    }
                }
                let limit = f64::from(p.top_p) * total;
                // The ranking: larger logit first, lower id first among equal
                // ones (a total order, so the kept set is well defined).
                let rank = |a: &u32, b: &u32| {
                    scores[*b as usize]
                        .total_cmp(&scores[*a as usize])
                        .then(a.cmp(b))
                };
                // Keep a token while the mass ranked above it is below the limit
                // (the first token always: nothing is above it). The nucleus is
                // usually small: rank the best TOP_P_HEAD tokens first (a
                // selection, linear time) and sort the rest only if the limit is
                // not reached among them. Either way the kept set is the one a
                // full sort gives.
                const TOP_P_HEAD: usize = 256;
                let ranked = &mut order[..n];
                let head = TOP_P_HEAD.min(n);
                if head < n {
                    ranked.select_nth_unstable_by(head - 1, rank);
                }
                ranked[..head].sort_unstable_by(rank);
                let mut above = 0.0f64;
                let mut cut = None;
                for (r, &t) in ranked[..head].iter().enumerate() {
                    if above >= limit {
                        cut = Some(r);
                        break;
                    }
                    above += f64::from(weights[t as usize]);
                }
                if cut.is_none() && head < n {
                    ranked[head..].sort_unstable_by(rank);
                    for (r, &t) in ranked.iter().enumerate().skip(head) {
                        if above >= limit {
                            cut = Some(r);
                            break;
                        }
                        above += f64::from(weights[t as usize]);
                    }
                }
                for &t in &ranked[cut.unwrap_or(n)..] {
                    weights[t as usize] = 0.0;
                }
            }
            // 6. The draw. The weights are finite, non-negative and the
            // largest is 1, so the draw cannot fail.
            fucina::rng::categorical(p.seed, self.step, weights).map_err(|e| {
                LlmError::InvalidRequest {
                    op: "sample",
                    reason: e.to_string(),
                }
            })? as u32
        };
        self.step += 1;
        Ok(token)
    }
}

/// The index of the largest value, the lowest among equal ones (no NaN).
fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}
