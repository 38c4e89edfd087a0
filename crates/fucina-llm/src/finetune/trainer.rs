//! The job: the causal-LM loss of a batch (the mean cross-entropy over its
//! predicted tokens, as transformers' `ForCausalLMLoss` with prompt labels at
//! -100), AdamW on the adapters, a warmup-cosine learning rate, gradient
//! clipping, and the evaluation loss of a held-out split.

use std::path::Path;

use fucina::optim::{AdamW, AdamWConfig, WarmupCosine, clip_grad_norm};
use fucina::{BackwardOptions, ExecContext, Tensor, no_grad};

use super::accumulate::{Accumulator, TreeAccumulator};
use super::data::{Batch, Example};
use super::decoder::TrainableDecoder;
use super::error::{FinetuneError, invalid};

/// The hyperparameters of a job.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOptions {
    /// The peak learning rate.
    pub lr: f32,
    /// The learning rate at the end of the cosine (0 by default).
    pub min_lr: f32,
    /// Steps of linear warmup.
    pub warmup_steps: u64,
    /// AdamW's decoupled weight decay (0 by default, as transformers'
    /// `Trainer`).
    pub weight_decay: f32,
    /// AdamW's betas.
    pub betas: (f32, f32),
    /// AdamW's epsilon.
    pub eps: f32,
    /// The gradients' global norm is clipped to it (`None`: no clipping;
    /// transformers' `Trainer` clips to 1).
    pub max_grad_norm: Option<f32>,
    /// Examples per micro-batch (one forward and backward).
    pub batch: usize,
    /// Pack the training examples into rows of at most this many tokens
    /// ([`pack`](super::data::pack), once, in the order given; each epoch
    /// then shuffles the rows), `batch` rows per micro-batch; `None`: one
    /// example per row.
    pub pack: Option<usize>,
    /// Micro-batches per optimizer step (gradient accumulation; 1: none).
    /// The step's gradient is that of the mean loss over every predicted
    /// token of its micro-batches, as one batch of them all would give, the
    /// micro-batches' gradients summed in a fixed tree (see
    /// [`accumulate`](super::accumulate)): the same bits on any number of
    /// MPI ranks.
    pub grad_accum: usize,
    /// Passes over the training split.
    pub epochs: usize,
    /// The seed of the shuffles and of the adapters' dropout.
    pub seed: u64,
    /// The padding id of a batch (never attended by a real token, never
    /// predicted).
    pub pad_id: u32,
}

impl TrainOptions {
    /// The rows of `train`: the examples' indices per row (packed when
    /// [`pack`](TrainOptions::pack) is set, else one example per row).
    pub fn rows(&self, train: &[Example]) -> Vec<Vec<usize>> {
        match self.pack {
            Some(len) => super::data::pack(train, len),
            None => (0..train.len()).map(|i| vec![i]).collect(),
        }
    }

    /// Optimizer steps of the whole job over `train`.
    pub fn total_steps_for(&self, train: &[Example]) -> u64 {
        self.total_steps(self.rows(train).len())
    }

    /// Micro-batches of one epoch over `n` rows (examples, when not packing).
    pub fn batches_per_epoch(&self, n: usize) -> usize {
        n.div_ceil(self.batch.max(1))
    }

    /// Optimizer steps of one epoch over `n` rows.
    pub fn steps_per_epoch(&self, n: usize) -> u64 {
        self.batches_per_epoch(n).div_ceil(self.grad_accum.max(1)) as u64
    }

    /// Optimizer steps of the whole job over `n` rows.
    pub fn total_steps(&self, n: usize) -> u64 {
        self.steps_per_epoch(n) * self.epochs as u64
    }
}

impl Default for TrainOptions {
    fn default() -> TrainOptions {
        TrainOptions {
            lr: 2e-4,
            min_lr: 0.0,
            warmup_steps: 0,
            weight_decay: 0.0,
            betas: (0.9, 0.999),
            eps: 1e-8,
            max_grad_norm: Some(1.0),
            batch: 4,
            pack: None,
            grad_accum: 1,
            epochs: 1,
            seed: 0,
            pad_id: 0,
        }
    }
}

/// The causal-LM loss of `batch`: the mean cross-entropy of its predicted
/// tokens (only those rows go through the output projection). `train` (the
/// step's seed) turns the adapters' dropout on.
///
/// # Errors
/// [`FinetuneError::Invalid`] for a batch that predicts nothing; the
/// decoder's errors.
pub fn batch_loss(
    ctx: &ExecContext,
    model: &TrainableDecoder,
    batch: &Batch,
    train: Option<u64>,
) -> Result<Tensor, FinetuneError> {
    batch_loss_for(ctx, model, batch, train, 1.0)
}

/// [`batch_loss`] for a backward that gives the loss the gradient `grad`
/// (1 for a plain backward, the factor a micro-batch's loss is scaled by):
/// [`TrainableDecoder::loss`] computes the gradient of the output
/// projection's input with the loss, a block of rows at a time, for that
/// gradient (another one costs the blocks again; the bits are the same).
///
/// # Errors
/// As [`batch_loss`].
pub fn batch_loss_for(
    ctx: &ExecContext,
    model: &TrainableDecoder,
    batch: &Batch,
    train: Option<u64>,
    grad: f32,
) -> Result<Tensor, FinetuneError> {
    if batch.positions.is_empty() {
        return Err(invalid("batch_loss", "the batch predicts no token"));
    }
    let packing = batch
        .packing
        .as_ref()
        .map(|p| (&p.positions[..], &p.segments[..]));
    let h = model.hidden_packed(ctx, &batch.ids, batch.b, batch.t, packing, train)?;
    let n = batch.positions.len();
    let rows = ctx.from_slice_typed::<i64>(&[n], &batch.positions)?;
    let labels = ctx.from_slice_typed::<i64>(&[n], &batch.labels)?;
    let h = h.index_select(ctx, 0, &rows)?;
    model.loss(ctx, &h, &labels, grad)
}

/// The backward of a step: each op releases what it saved once its VJP has
/// run, so the saved activations of a layer return to the pool before the
/// layers below it allocate their gradients.
pub(crate) const RELEASE_AS_IT_GOES: BackwardOptions = BackwardOptions {
    retain_graph: false,
    release_as_it_goes: true,
};

/// A running job: the model, its optimizer and schedule, and the step count.
#[derive(Debug)]
pub struct Trainer {
    model: TrainableDecoder,
    opt: AdamW,
    schedule: WarmupCosine,
    opts: TrainOptions,
    step: u64,
    local: TreeAccumulator,
}

impl Trainer {
    /// A job of `total_steps` optimizer steps over `model`'s adapters.
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] for a batch of 0 or a schedule the options
    /// do not make (`min_lr > lr`, more warmup steps than steps); the
    /// optimizer's refusals of its hyperparameters.
    pub fn new(
        model: TrainableDecoder,
        opts: TrainOptions,
        total_steps: u64,
    ) -> Result<Trainer, FinetuneError> {
        if opts.batch == 0 {
            return Err(invalid("Trainer::new", "a batch of 0 examples"));
        }
        let schedule = WarmupCosine::new(
            opts.lr,
            opts.min_lr,
            opts.warmup_steps.min(total_steps),
            total_steps,
        )?;
        let opt = AdamW::new(
            model.parameters(),
            AdamWConfig {
                lr: schedule.lr(0),
                betas: opts.betas,
                eps: opts.eps,
                weight_decay: opts.weight_decay,
            },
        )?;
        Ok(Trainer {
            model,
            opt,
            schedule,
            opts,
            step: 0,
            local: TreeAccumulator::new(),
        })
    }

    /// The model.
    pub fn model(&self) -> &TrainableDecoder {
        &self.model
    }

    /// The model, giving the job up.
    pub fn into_model(self) -> TrainableDecoder {
        self.model
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// One optimizer step on `batch`: [`step_accumulated`](Trainer::step_accumulated)
    /// of the one batch.
    ///
    /// # Errors
    /// As [`step_accumulated`](Trainer::step_accumulated).
    pub fn step(&mut self, ctx: &ExecContext, batch: &Batch) -> Result<f32, FinetuneError> {
        self.step_accumulated(ctx, std::slice::from_ref(batch))
    }

    /// One optimizer step over the micro-batches `batches`, in this process:
    /// [`step_accumulated_with`](Trainer::step_accumulated_with) and a
    /// [`TreeAccumulator`].
    ///
    /// # Errors
    /// As [`step_accumulated_with`](Trainer::step_accumulated_with).
    pub fn step_accumulated(
        &mut self,
        ctx: &ExecContext,
        batches: &[Batch],
    ) -> Result<f32, FinetuneError> {
        let mut local = std::mem::take(&mut self.local);
        let res = self.step_accumulated_with(ctx, batches, &mut local);
        self.local = local;
        res
    }

    /// One optimizer step over the micro-batches `batches`: a step of `M =
    /// max(grad_accum, batches.len())` micro-batches (those past `batches`,
    /// the end of an epoch, are empty: a zero gradient and value), whose
    /// micro-batch `k` runs the loss of `batches[k]` (dropout seeded by the
    /// job's seed, the step and `k`) scaled by `M` times its share of the
    /// predicted tokens, and its backward; `acc` combines the micro-batches'
    /// gradients (the fixed tree's mean over the `M`: the gradient of the
    /// mean loss over every predicted token); then clipping, the scheduled
    /// learning rate, AdamW. Returns the loss before the step (the same mean
    /// of the scaled losses: the mean over every predicted token).
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] for no micro-batch; those of
    /// [`batch_loss`], backward, `acc` and the optimizer. On an error the
    /// adapters are unchanged and their gradients cleared.
    pub fn step_accumulated_with(
        &mut self,
        ctx: &ExecContext,
        batches: &[Batch],
        acc: &mut dyn Accumulator,
    ) -> Result<f32, FinetuneError> {
        let total: usize = batches.iter().map(|b| b.positions.len()).sum();
        if batches.is_empty() || total == 0 {
            return Err(invalid(
                "Trainer::step_accumulated",
                "the micro-batches predict no token",
            ));
        }
        let count = self.opts.grad_accum.max(batches.len());
        let step_seed = fucina::rng::at(self.opts.seed ^ 0x4c6f_5241, self.step);
        let mut run = |me: &mut Trainer| -> Result<f32, FinetuneError> {
            let model = &me.model;
            let mut micro = |ctx: &ExecContext, k: usize| -> Result<f32, FinetuneError> {
                let Some(batch) = batches.get(k) else {
                    return Ok(0.0);
                };
                // No exec scope: drop-as-you-go keeps only what the backward
                // reads (a scope would hold every intermediate to the end).
                let seed = fucina::rng::at(step_seed, k as u64);
                let weight = (batch.positions.len() as f64 / total as f64 * count as f64) as f32;
                let loss = batch_loss_for(ctx, model, batch, Some(seed), weight)?;
                let value = loss.item()? * weight;
                let loss = match weight == 1.0 {
                    true => loss,
                    false => loss.scale(ctx, weight)?,
                };
                // Each op's saved tensors go back to the pool as soon as
                // its VJP has run (a failed step is not retried).
                loss.backward_with(ctx, None, RELEASE_AS_IT_GOES)?;
                Ok(value)
            };
            // The optimizer's handles: the model's adapters, listed without
            // building their names.
            let value = acc.accumulate(ctx, me.opt.parameters(), count, &mut micro)?;
            if let Some(max) = me.opts.max_grad_norm {
                clip_grad_norm(ctx, me.opt.parameters(), max)?;
            }
            me.opt.set_lr(me.schedule.lr(me.step))?;
            me.opt.step(ctx)?;
            Ok(value)
        };
        let res = run(self);
        self.opt.zero_grad();
        let value = res?;
        self.step += 1;
        Ok(value)
    }

    /// The mean loss over every predicted token of `examples` (in batches of
    /// the job's size, without dropout or gradients).
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] when `examples` predict nothing; the
    /// decoder's errors.
    pub fn eval(&self, ctx: &ExecContext, examples: &[Example]) -> Result<f32, FinetuneError> {
        let _g = no_grad();
        let (mut sum, mut count) = (0f64, 0usize);
        for chunk in examples.chunks(self.opts.batch) {
            let refs: Vec<&Example> = chunk.iter().collect();
            let Some(batch) = Batch::new(&refs, self.opts.pad_id) else {
                continue;
            };
            if batch.positions.is_empty() {
                continue;
            }
            let loss = batch_loss(ctx, &self.model, &batch, None)?.item()?;
            sum += f64::from(loss) * batch.positions.len() as f64;
            count += batch.positions.len();
        }
        if count == 0 {
            return Err(invalid("Trainer::eval", "the examples predict no token"));
        }
        Ok((sum / count as f64) as f32)
    }

    /// The order of `n` rows in epoch `epoch`: a permutation seeded by the
    /// job's seed and the epoch.
    pub fn epoch_order(&self, n: usize, epoch: usize) -> Vec<usize> {
        shuffled(n, fucina::rng::at(self.opts.seed, epoch as u64))
    }

    /// The micro-batches of one epoch of `examples`: their rows
    /// ([`TrainOptions::rows`]) in [`epoch_order`](Trainer::epoch_order),
    /// `batch` rows each (the last one may be smaller).
    pub fn epoch_batches(&self, examples: &[Example], epoch: usize) -> Vec<Batch> {
        let rows = self.opts.rows(examples);
        let order = self.epoch_order(rows.len(), epoch);
        order
            .chunks(self.opts.batch)
            .filter_map(|c| {
                let picked: Vec<Vec<&Example>> = c
                    .iter()
                    .map(|&r| rows[r].iter().map(|&i| &examples[i]).collect())
                    .collect();
                Batch::from_rows(&picked, self.opts.pad_id)
            })
            .collect()
    }
}

/// A permutation of `0..n` from `seed`.
pub(crate) fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut p = vec![0i64; n];
    fucina::rng::randperm_fill(seed, &mut p);
    p.into_iter().map(|i| i as usize).collect()
}

/// Splits `examples` into a training and a held-out split: a seeded shuffle,
/// then the first `max(1, round(n · fraction))` examples held out (none when
/// `fraction` is 0 or there are fewer than 2 examples).
pub fn split_eval(
    examples: Vec<Example>,
    fraction: f32,
    seed: u64,
) -> (Vec<Example>, Vec<Example>) {
    let n = examples.len();
    if fraction <= 0.0 || n < 2 {
        return (examples, Vec::new());
    }
    let k = ((n as f32 * fraction).round() as usize).clamp(1, n - 1);
    let order = shuffled(n, fucina::rng::at(seed, u64::MAX));
    let mut slots: Vec<Option<Example>> = examples.into_iter().map(Some).collect();
    let mut take = |i: usize| slots[i].take().expect("a permutation");
    let eval: Vec<Example> = order[..k].iter().map(|&i| take(i)).collect();
    let train: Vec<Example> = order[k..].iter().map(|&i| take(i)).collect();
    (train, eval)
}

/// What [`Trainer::fit`] reports as it goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event {
    /// An optimizer step (`step` counts from 1) and its batch's loss.
    Step {
        /// The step.
        step: u64,
        /// The loss before the step.
        loss: f32,
        /// Tokens the loss predicted.
        tokens: usize,
    },
    /// The end of an epoch (from 1) and the loss of the held-out split
    /// (`None` without one).
    Epoch {
        /// The epoch.
        epoch: usize,
        /// The held-out loss.
        eval_loss: Option<f32>,
    },
}

impl Trainer {
    /// Trains over `train` from the trainer's current step to the end of the
    /// job's epochs (each epoch shuffled by [`epoch_batches`](Trainer::epoch_batches),
    /// `grad_accum` micro-batches per step), evaluating on `eval` after each
    /// epoch when it is not empty; `on` hears every step and epoch, with the
    /// trainer (to save a checkpoint, say; an error from it stops the job). A trainer
    /// restored by [`load_checkpoint`](Trainer::load_checkpoint) resumes at
    /// the micro-batch where the saved one stopped, with the same bits as a
    /// run that never stopped.
    ///
    /// # Errors
    /// Those of [`step_accumulated`](Trainer::step_accumulated) and
    /// [`eval`](Trainer::eval).
    pub fn fit(
        &mut self,
        ctx: &ExecContext,
        train: &[Example],
        eval: &[Example],
        on: impl FnMut(&Trainer, Event) -> Result<(), FinetuneError>,
    ) -> Result<(), FinetuneError> {
        let mut local = std::mem::take(&mut self.local);
        let res = self.fit_with(ctx, train, eval, &mut local, on);
        self.local = local;
        res
    }

    /// [`fit`](Trainer::fit) with the steps' micro-batch gradients combined
    /// by `acc` ([`step_accumulated_with`](Trainer::step_accumulated_with)):
    /// over MPI ranks, say, each computing its share of every step's
    /// micro-batches.
    ///
    /// # Errors
    /// As [`fit`](Trainer::fit), and `acc`'s.
    pub fn fit_with(
        &mut self,
        ctx: &ExecContext,
        train: &[Example],
        eval: &[Example],
        acc: &mut dyn Accumulator,
        mut on: impl FnMut(&Trainer, Event) -> Result<(), FinetuneError>,
    ) -> Result<(), FinetuneError> {
        let per_epoch = self.opts.steps_per_epoch(self.opts.rows(train).len());
        if per_epoch == 0 {
            return Err(invalid("Trainer::fit", "no training example"));
        }
        let accum = self.opts.grad_accum.max(1);
        let first_epoch = (self.step / per_epoch) as usize;
        for epoch in first_epoch..self.opts.epochs {
            let batches = self.epoch_batches(train, epoch);
            let done = (self.step - epoch as u64 * per_epoch) as usize;
            for group in batches.chunks(accum).skip(done) {
                let loss = self.step_accumulated_with(ctx, group, acc)?;
                let event = Event::Step {
                    step: self.step,
                    loss,
                    tokens: group.iter().map(|b| b.positions.len()).sum(),
                };
                on(self, event)?;
            }
            let eval_loss = match eval.is_empty() {
                true => None,
                false => Some(self.eval(ctx, eval)?),
            };
            let event = Event::Epoch {
                epoch: epoch + 1,
                eval_loss,
            };
            on(self, event)?;
        }
        Ok(())
    }

    /// Saves the job's state in directory `dir` (created if absent): the
    /// adapters as PEFT writes them ([`peft::save_adapter`](super::peft::save_adapter))
    /// and `trainer_state.safetensors` (AdamW's moments and step count, with
    /// the trainer's step in the metadata). [`load_checkpoint`](Trainer::load_checkpoint)
    /// restores it.
    ///
    /// # Errors
    /// I/O and checkpoint errors; [`FinetuneError::Invalid`] for a full
    /// fine-tune (no adapters: see [`TrainableDecoder::trained_store`]).
    pub fn save_checkpoint(&self, dir: impl AsRef<Path>, base: &str) -> Result<(), FinetuneError> {
        if self.model.is_full() {
            return Err(invalid(
                "Trainer::save_checkpoint",
                "a full fine-tune has no adapters to checkpoint: write the model with \
                 TrainableDecoder::trained_store and peft::write_model_dir",
            ));
        }
        let dir = dir.as_ref();
        super::peft::save_adapter(&self.model, dir, base)?;
        let step = self.step.to_string();
        fucina::checkpoint::save_state_dict(
            dir.join(TRAINER_STATE),
            &self.opt.state_dict(),
            &[("fucina_trainer_step", &step)],
        )?;
        Ok(())
    }

    /// Restores a state saved by [`save_checkpoint`](Trainer::save_checkpoint)
    /// into this trainer (built with the same model, options and step count):
    /// the adapters, AdamW's state and the step. Nothing changes on an error.
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] for a state that does not fit (another
    /// model's adapters, a missing step); I/O and checkpoint errors.
    pub fn load_checkpoint(
        &mut self,
        ctx: &ExecContext,
        dir: impl AsRef<Path>,
    ) -> Result<(), FinetuneError> {
        const OP: &str = "Trainer::load_checkpoint";
        let dir = dir.as_ref();
        let path = dir.join(TRAINER_STATE);
        let state = fucina::checkpoint::read_state_dict(ctx, &path)?;
        let step: u64 = state
            .metadata()
            .get("fucina_trainer_step")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                invalid(
                    OP,
                    format!("{}: no `fucina_trainer_step` metadata", path.display()),
                )
            })?;
        // Checked first (the optimizer's load and the adapters' both refuse
        // a misfit before they change anything): the adapters' file against
        // the model, then the optimizer's state, then both written.
        let saved_params: Vec<Vec<f32>> =
            self.model.parameters().iter().map(|p| p.to_vec()).collect();
        super::peft::load_adapter_weights(ctx, &self.model, dir)?;
        let entries: Vec<(String, fucina::Tensor)> = state.into_entries();
        if let Err(e) = self.opt.load_state_dict(ctx, &entries) {
            for (p, v) in self.model.parameters().iter().zip(&saved_params) {
                p.copy_from_slice(v)?;
            }
            return Err(e.into());
        }
        self.step = step;
        Ok(())
    }
}

/// The optimizer state file of a checkpoint directory.
pub const TRAINER_STATE: &str = "trainer_state.safetensors";
