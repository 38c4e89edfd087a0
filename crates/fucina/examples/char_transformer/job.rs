//! The `char_transformer` job as functions (the example's `main` and the tests
//! call them): the command line, the text loader and vocabulary, the model, the
//! seeded batches, the training loop and the seeded sampler.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "../common/mod.rs"]
mod common;

use clap::Parser;
use fucina::exec::QuantFormat;
use fucina::nn::{Block, Embedding, LayerNorm, Linear, Module, Parameter, prefixed, sub_seed};
use fucina::optim::{AdamW, AdamWConfig, WarmupCosine, clip_grad_norm};
use fucina::{Error, ExecContext, RawTensor, Result, Tensor, no_grad};

/// Trains a 2-layer character-level transformer on Pride and Prejudice and
/// samples text from it.
///
/// Trains on windows of the shipped text (Jane Austen, public domain) with
/// AdamW (warmup + cosine schedule, gradient clipping), prints the loss every
/// --log-every steps with the throughput in characters per second, then the
/// held-out loss and a seeded sample of --sample-chars characters continuing
/// --prompt. The same --seed gives the same losses and sample, bit for bit,
/// for every --threads.
#[derive(Debug, Parser)]
#[command(name = "char_transformer", version)]
pub(crate) struct Args {
    /// Optimizer steps (each on `--batch` windows of `--context` characters).
    #[arg(long, default_value_t = TrainConfig::default().steps)]
    pub(crate) steps: usize,
    /// Seed of the weights, the batches and the sampler.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Worker threads of the execution context. The default is what
    /// ExecContext::new() picks: one per physical core this process may run
    /// on (lowered by a cgroup CPU quota and by FUCINA_MAX_THREADS), at most
    /// 64. The results are bitwise identical for every count.
    #[arg(long, default_value_t = common::default_threads())]
    pub(crate) threads: usize,
    /// The training text (gzip-compressed).
    #[arg(long, default_value = default_data_path())]
    pub(crate) data: PathBuf,
    /// Peak learning rate of AdamW (after a linear warmup; a cosine decay to a
    /// tenth of it follows).
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    pub(crate) lr: f32,
    /// Report the loss every this many steps.
    #[arg(long, default_value_t = 50)]
    pub(crate) log_every: usize,
    /// Characters to sample after training.
    #[arg(long, default_value_t = 200)]
    pub(crate) sample_chars: usize,
    /// Sampling temperature (0: greedy, always the most likely character).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub(crate) temperature: f32,
    /// The text the sample continues.
    #[arg(long, default_value = "Elizabeth")]
    pub(crate) prompt: String,
    /// After training, also report the held-out loss with every linear weight
    /// rounded through Q8_0 and through Q4_0 (llama.cpp's block formats;
    /// activations stay f32), and its increase over the f32 loss.
    #[arg(long)]
    pub(crate) eval_quantized: bool,
}

/// The text shipped in the repository.
pub(crate) fn default_data_path() -> &'static str {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/text/pride_and_prejudice.txt.gz"
    )
}

impl Args {
    /// Checks what the flags cannot express in their types.
    pub(crate) fn validate(&self) -> Result<()> {
        common::check_threads(self.threads)?;
        common::check_at_least_one(&[("--steps", self.steps), ("--log-every", self.log_every)])?;
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(Error::InvalidArgument {
                what: "--lr",
                reason: format!("must be finite and > 0 (got {})", self.lr),
            });
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::InvalidArgument {
                what: "--temperature",
                reason: format!("must be finite and >= 0 (got {})", self.temperature),
            });
        }
        if self.prompt.is_empty() {
            return Err(Error::InvalidArgument {
                what: "--prompt",
                reason: "must not be empty".into(),
            });
        }
        Ok(())
    }

    /// The training configuration of these flags.
    pub(crate) fn config(&self) -> TrainConfig {
        TrainConfig {
            steps: self.steps,
            seed: self.seed,
            lr: self.lr,
            ..TrainConfig::default()
        }
    }
}

/// A text as character ids over its own vocabulary (the distinct bytes of the
/// text, sorted).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Corpus {
    /// The distinct bytes, sorted: id `i` is byte `vocab[i]`.
    pub(crate) vocab: Vec<u8>,
    /// The text as ids.
    pub(crate) ids: Vec<i64>,
}

impl Corpus {
    /// The corpus of `text`.
    pub(crate) fn new(text: &[u8]) -> Corpus {
        let mut seen = [false; 256];
        for &b in text {
            seen[b as usize] = true;
        }
        let vocab: Vec<u8> = (0..=255u8).filter(|&b| seen[b as usize]).collect();
        let mut id_of = [0i64; 256];
        for (i, &b) in vocab.iter().enumerate() {
            id_of[b as usize] = i as i64;
        }
        Corpus {
            ids: text.iter().map(|&b| id_of[b as usize]).collect(),
            vocab,
        }
    }

    /// The ids of `text`; a byte outside the vocabulary is an error.
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<i64>> {
        text.bytes()
            .map(|b| {
                self.vocab
                    .binary_search(&b)
                    .map(|i| i as i64)
                    .map_err(|_| Error::InvalidArgument {
                        what: "--prompt",
                        reason: format!(
                            "the character {:?} does not occur in the training text",
                            char::from(b)
                        ),
                    })
            })
            .collect()
    }

    /// The text of `ids` (bytes that are not UTF-8 are replaced).
    pub(crate) fn decode(&self, ids: &[i64]) -> String {
        let bytes: Vec<u8> = ids.iter().map(|&i| self.vocab[i as usize]).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Reads a gzip-compressed text ([`fucina::data::read_gzip`]). A missing,
/// unreadable or non-gzip file, or a text shorter than `min_len` bytes, is an
/// [`Error::Data`] naming the file.
pub(crate) fn load_text(path: &Path, min_len: usize) -> Result<Vec<u8>> {
    let text = fucina::data::read_gzip(path)?;
    if text.len() < min_len {
        return Err(Error::Data {
            path: path.display().to_string(),
            reason: format!("{} bytes of text; need at least {min_len}", text.len()),
        });
    }
    Ok(text)
}

/// The model and training hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TrainConfig {
    /// Width of the residual stream.
    pub(crate) d_model: usize,
    /// Attention heads per block.
    pub(crate) heads: usize,
    /// Transformer blocks.
    pub(crate) layers: usize,
    /// Characters per training window (and the longest context of the sampler).
    pub(crate) context: usize,
    /// Windows per batch.
    pub(crate) batch: usize,
    /// Optimizer steps.
    pub(crate) steps: usize,
    /// Peak learning rate of AdamW (after the warmup).
    pub(crate) lr: f32,
    /// Steps of linear warmup (the cosine decay to `lr / 10` follows).
    pub(crate) warmup: usize,
    /// AdamW's decoupled weight decay.
    pub(crate) weight_decay: f32,
    /// The global gradient-norm limit.
    pub(crate) clip: f32,
    /// Seed of the weights and the batches.
    pub(crate) seed: u64,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            d_model: 64,
            heads: 4,
            layers: 2,
            context: 64,
            batch: 16,
            steps: 600,
            lr: 1e-2,
            warmup: 50,
            weight_decay: 0.01,
            clip: 1.0,
            seed: 0,
        }
    }
}

/// A decoder-only transformer over characters: token and learned position
/// embeddings, pre-norm [`Block`]s (causal attention), a final [`LayerNorm`] and
/// a [`Linear`] head to the vocabulary.
#[derive(Debug)]
pub(crate) struct CharModel {
    pub(crate) tok_emb: Embedding,
    pub(crate) pos_emb: Embedding,
    pub(crate) blocks: Vec<Block>,
    pub(crate) ln_f: LayerNorm,
    pub(crate) head: Linear,
    context: usize,
}

impl CharModel {
    /// The model of `cfg` over `vocab` characters, weights from `cfg.seed`.
    pub(crate) fn new(ctx: &ExecContext, vocab: usize, cfg: &TrainConfig) -> Result<CharModel> {
        let d = cfg.d_model;
        let seed = cfg.seed;
        let blocks = (0..cfg.layers)
            .map(|i| Block::new(ctx, d, cfg.heads, 0.0, sub_seed(seed, 10 + i as u64)))
            .collect::<Result<Vec<_>>>()?;
        let model = CharModel {
            tok_emb: Embedding::new(ctx, vocab, d, sub_seed(seed, 1))?,
            pos_emb: Embedding::new(ctx, cfg.context, d, sub_seed(seed, 2))?,
            blocks,
            ln_f: LayerNorm::new(ctx, d, 1e-5)?,
            head: Linear::new(ctx, d, vocab, sub_seed(seed, 3))?,
            context: cfg.context,
        };
        // The embeddings start small (std 0.1 rather than N(0, 1)'s 1), as GPT-style
        // models do, so that the blocks' residual branches matter from the start.
        for emb in [&model.tok_emb, &model.pos_emb] {
            emb.weight
                .update_(|w| w.iter_mut().for_each(|v| *v *= 0.1))?;
        }
        Ok(model)
    }

    /// The logits `[batch, time, vocab]` of `ids` `[batch, time]` (`time` at most
    /// the context).
    pub(crate) fn forward(&self, ctx: &ExecContext, ids: &RawTensor<i64>) -> Result<Tensor> {
        let shape = ids.shape();
        if shape.len() != 2 || shape[1] == 0 || shape[1] > self.context {
            return Err(Error::ShapeMismatch {
                layer: format!("CharModel(context = {})", self.context),
                got: shape.to_vec(),
                reason: format!("expected [batch, time] with 1 <= time <= {}", self.context),
            });
        }
        let t = shape[1];
        let positions: Vec<i64> = (0..t as i64).collect();
        let pos = ctx.from_slice_typed::<i64>(&[t], &positions)?;
        let mut x = self
            .tok_emb
            .forward(ctx, ids)?
            .add(ctx, &self.pos_emb.forward(ctx, &pos)?)?;
        for block in &self.blocks {
            x = block.forward(ctx, &x)?;
        }
        self.head.forward(ctx, &self.ln_f.forward(ctx, &x)?)
    }
}

impl Module for CharModel {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let named = |prefix: &str, m: &dyn Module| prefixed(prefix, m.named_parameters());
        let mut v = named("tok_emb", &self.tok_emb);
        v.extend(named("pos_emb", &self.pos_emb));
        for (i, b) in self.blocks.iter().enumerate() {
            v.extend(named(&format!("blocks.{i}"), b));
        }
        v.extend(named("ln_f", &self.ln_f));
        v.extend(named("head", &self.head));
        v
    }
}

/// Fills `x` and `y` (`batch * context` ids each) with the windows of `ids` that
/// batch `k` of stream `seed` starts at: `y` is `x` shifted by one character.
pub(crate) fn batch(
    ids: &[i64],
    context: usize,
    seed: u64,
    k: u64,
    starts: &mut [i64],
    x: &mut Vec<i64>,
    y: &mut Vec<i64>,
) {
    let high = (ids.len() - context) as i64;
    fucina::rng::randint_fill(sub_seed(seed, k), starts, 0, high);
    x.clear();
    y.clear();
    for &s in starts.iter() {
        let s = s as usize;
        x.extend_from_slice(&ids[s..s + context]);
        y.extend_from_slice(&ids[s + 1..s + context + 1]);
    }
}

/// One step's progress, for the log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Progress {
    /// Steps done (1-based).
    pub(crate) step: usize,
    /// Steps of the run.
    pub(crate) steps: usize,
    /// The step's training loss.
    pub(crate) loss: f32,
    /// The step's learning rate.
    pub(crate) lr: f32,
    /// Characters trained on so far.
    pub(crate) tokens: usize,
    /// Wall time since training started.
    pub(crate) elapsed: Duration,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub(crate) struct TrainReport {
    /// The loss of every step.
    pub(crate) losses: Vec<f32>,
    /// The mean loss over held-out batches of the last tenth of the text.
    pub(crate) val_loss: f32,
    /// Characters trained on (steps x batch x context).
    pub(crate) tokens: usize,
    /// Wall time of the training steps.
    pub(crate) train_time: Duration,
    /// Parameter elements of the model.
    pub(crate) parameters: usize,
}

/// Held-out batches evaluated at the end of training.
pub(crate) const VAL_BATCHES: u64 = 8;

/// Trains a [`CharModel`] of `cfg` on the first 90% of `corpus` (AdamW,
/// warmup + cosine schedule, gradient clipping; batches drawn from the seed) and
/// evaluates it on the rest. Returns the report and the model. `on_step` runs
/// after every step.
pub(crate) fn train(
    ctx: &ExecContext,
    corpus: &Corpus,
    cfg: &TrainConfig,
    on_step: &mut dyn FnMut(&Progress),
) -> Result<(TrainReport, CharModel)> {
    let split = corpus.ids.len() * 9 / 10;
    let (train_ids, val_ids) = corpus.ids.split_at(split);
    if val_ids.len() <= cfg.context {
        return Err(Error::InvalidArgument {
            what: "char_transformer",
            reason: format!(
                "a text of {} characters is too short for windows of {} (the held-out tenth must be longer than one window)",
                corpus.ids.len(),
                cfg.context
            ),
        });
    }
    let model = CharModel::new(ctx, corpus.vocab.len(), cfg)?;
    let params = model.parameters();
    let mut opt = AdamW::new(
        params.clone(),
        AdamWConfig {
            lr: cfg.lr,
            betas: (0.9, 0.99),
            weight_decay: cfg.weight_decay,
            ..AdamWConfig::default()
        },
    )?;
    let schedule = WarmupCosine::new(
        cfg.lr,
        cfg.lr / 10.0,
        cfg.warmup.min(cfg.steps) as u64,
        cfg.steps as u64,
    )?;
    let (b, t, vocab) = (cfg.batch, cfg.context, corpus.vocab.len());
    let mut starts = vec![0i64; b];
    let (mut xb, mut yb) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
    let mut losses = Vec::with_capacity(cfg.steps);
    let batch_seed = sub_seed(cfg.seed, 4);
    let start = Instant::now();
    for step in 0..cfg.steps {
        batch(
            train_ids,
            t,
            batch_seed,
            step as u64,
            &mut starts,
            &mut xb,
            &mut yb,
        );
        let x = ctx.from_slice_typed::<i64>(&[b, t], &xb)?;
        let y = ctx.from_slice_typed::<i64>(&[b * t], &yb)?;
        let loss = ctx.exec_scope(|ctx| -> Result<f32> {
            let logits = model.forward(ctx, &x)?.reshape(ctx, &[b * t, vocab])?;
            let loss = logits.cross_entropy(ctx, &y)?;
            loss.backward(ctx)?;
            Ok(loss.item()?)
        })?;
        clip_grad_norm(ctx, &params, cfg.clip)?;
        let lr = schedule.lr(step as u64);
        opt.set_lr(lr)?;
        opt.step(ctx)?;
        opt.zero_grad();
        losses.push(loss);
        on_step(&Progress {
            step: step + 1,
            steps: cfg.steps,
            loss,
            lr,
            tokens: (step + 1) * b * t,
            elapsed: start.elapsed(),
        });
    }
    let train_time = start.elapsed();
    let val_loss = held_out_loss(ctx, &model, corpus, cfg)?;
    let report = TrainReport {
        losses,
        val_loss,
        tokens: cfg.steps * b * t,
        train_time,
        parameters: model.num_parameters(),
    };
    Ok((report, model))
}

/// The mean loss of `model` over [`VAL_BATCHES`] held-out batches (windows of
/// the last tenth of `corpus`, drawn from `cfg.seed`), without gradients.
///
/// # Errors
/// A corpus whose last tenth is not longer than one window; out of memory.
pub(crate) fn held_out_loss(
    ctx: &ExecContext,
    model: &CharModel,
    corpus: &Corpus,
    cfg: &TrainConfig,
) -> Result<f32> {
    let val_ids = &corpus.ids[corpus.ids.len() * 9 / 10..];
    if val_ids.len() <= cfg.context {
        return Err(Error::InvalidArgument {
            what: "char_transformer",
            reason: format!(
                "a held-out text of {} characters is too short for windows of {}",
                val_ids.len(),
                cfg.context
            ),
        });
    }
    let (b, t, vocab) = (cfg.batch, cfg.context, corpus.vocab.len());
    let mut starts = vec![0i64; b];
    let (mut xb, mut yb) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
    let _guard = no_grad();
    let val_seed = sub_seed(cfg.seed, 5);
    let mut sum = 0.0f64;
    for k in 0..VAL_BATCHES {
        batch(val_ids, t, val_seed, k, &mut starts, &mut xb, &mut yb);
        let x = ctx.from_slice_typed::<i64>(&[b, t], &xb)?;
        let y = ctx.from_slice_typed::<i64>(&[b * t], &yb)?;
        let loss = ctx.exec_scope(|ctx| -> Result<f32> {
            let logits = model.forward(ctx, &x)?.reshape(ctx, &[b * t, vocab])?;
            Ok(logits.cross_entropy(ctx, &y)?.item()?)
        })?;
        sum += f64::from(loss);
    }
    Ok((sum / VAL_BATCHES as f64) as f32)
}

/// The held-out loss ([`held_out_loss`]) with every linear weight of `model`
/// (the attention's `qkv` and `proj`, the MLP's `fc` and `proj`, the head: the
/// 2-D parameters other than the embeddings) rounded through `format`: each
/// `[out, in]` weight is quantized row by row (blocks of 32 along `in`, as a
/// quantized model stores it) by `ExecContext::quantize` and dequantized back.
/// The activations stay f32. The weights are restored before returning (also
/// on an error).
///
/// # Errors
/// As [`held_out_loss`]; an `in` dimension that is not a multiple of 32 (the
/// block size) is an error naming the weight.
pub(crate) fn quantized_held_out_loss(
    ctx: &ExecContext,
    model: &CharModel,
    corpus: &Corpus,
    cfg: &TrainConfig,
    format: QuantFormat,
) -> Result<f32> {
    let weights: Vec<(String, Parameter)> = model
        .named_parameters()
        .into_iter()
        .filter(|(name, p)| !name.contains("_emb.") && p.shape().len() == 2)
        .collect();
    let originals: Vec<Vec<f32>> = weights.iter().map(|(_, p)| p.to_vec()).collect();
    let restore = || -> Result<()> {
        for ((_, p), orig) in weights.iter().zip(&originals) {
            p.update_(|w| w.copy_from_slice(orig))?;
        }
        Ok(())
    };
    let rounded = (|| -> Result<f32> {
        for ((name, p), orig) in weights.iter().zip(&originals) {
            let (rows, cols) = (p.shape()[0], p.shape()[1]);
            let q = ctx
                .quantize(format, rows, cols, orig)
                .map_err(|e| Error::InvalidArgument {
                    what: "char_transformer --eval-quantized",
                    reason: format!("weight {name} [{rows}, {cols}]: {e}"),
                })?;
            let mut back = vec![0.0f32; rows * cols];
            ctx.dequantize(&q.matrix(), &mut back)?;
            p.update_(|w| w.copy_from_slice(&back))?;
        }
        held_out_loss(ctx, model, corpus, cfg)
    })();
    restore()?;
    rounded
}

/// Continues `prompt` (ids) by `n` characters: each drawn from the model's
/// distribution over the last `context` characters, `softmax(logits /
/// temperature)`, by [`fucina::sample::multinomial`] with seed
/// `sub_seed(seed, i)` for character `i`, or the most likely one when
/// `temperature` is 0. Returns the new ids only.
pub(crate) fn sample(
    ctx: &ExecContext,
    model: &CharModel,
    prompt: &[i64],
    n: usize,
    temperature: f32,
    seed: u64,
) -> Result<Vec<i64>> {
    if prompt.is_empty() {
        return Err(Error::InvalidArgument {
            what: "sample",
            reason: "the prompt must not be empty".into(),
        });
    }
    let _guard = no_grad();
    let vocab = model.head.out_features();
    let mut ids = prompt.to_vec();
    for i in 0..n {
        let window = &ids[ids.len().saturating_sub(model.context)..];
        let w = window.len();
        let x = ctx.from_slice_typed::<i64>(&[1, w], window)?;
        let next = ctx.exec_scope(|ctx| -> Result<i64> {
            let logits = model.forward(ctx, &x)?.narrow(ctx, 1, w - 1, 1)?.to_vec();
            if temperature == 0.0 {
                return Ok(argmax(&logits) as i64);
            }
            let probs = Tensor::from_slice(ctx, &[1, vocab], &logits)?
                .scale(ctx, 1.0 / temperature)?
                .softmax(ctx, 1)?;
            let draw = fucina::sample::multinomial(ctx, &probs, 1, sub_seed(seed, i as u64))?;
            Ok(draw.to_vec()[0])
        })?;
        ids.push(next);
    }
    Ok(ids.split_off(prompt.len()))
}

/// The index of the largest value (the first one on ties).
fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}
