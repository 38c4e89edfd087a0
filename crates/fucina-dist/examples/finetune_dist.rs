//! LoRA fine-tuning of a pretrained model (`fucina-llm`'s fine-tuning) over
//! MPI ranks, with the same loss and adapter bits for any rank count as one
//! process:
//!
//! ```text
//! cargo build --release -p fucina-dist --features finetune --example finetune_dist
//! mpirun -np 4 target/release/examples/finetune_dist --model DIR --data FILE.jsonl \
//!     --grad-accum 4 --batch 2 --out adapters
//! target/release/examples/finetune_dist --local --model DIR --data FILE.jsonl \
//!     --grad-accum 4 --batch 2 --out adapters   # one process, no MPI
//! ```
//!
//! Every optimizer step has `--grad-accum` micro-batches of `--batch` rows
//! (the step's fixed micro-batch count, whatever the rank count); rank `r` of
//! `N` computes the forward and backward of its contiguous share of them
//! (`fucina_dist::shard_range`), and `fucina_dist::DataParallel` sums the
//! partial gradients in the fixed tree over micro-batch indices that
//! `fucina-llm`'s `TreeAccumulator` sums them in within one process. So the
//! gradients, the AdamW updates and the losses have the same bits for
//! `--local`, `-np 1`, `-np 2` and `-np 4` (the tree reduce-scatter needs a
//! power-of-two rank count no larger than `--grad-accum`; other counts use
//! the allgather exchange, with the same bits). Every rank reads and
//! tokenizes the whole data set and builds the same epochs; rank 0's adapters
//! are broadcast at the start (every rank makes the same ones from the seed
//! anyway).
//!
//! Rank 0 prints `step {n} loss {x}` per optimizer step and `eval loss {x}`
//! per epoch, as `fucina-llm`'s `finetune` example does, then `adapter
//! {fnv1a:016x}` (FNV-1a over the bits of every adapter value: the run's
//! fingerprint), and writes the adapters as PEFT does to `--out` when given.
//! The flags are a subset of `finetune`'s with its defaults.
//!
//! The example lives in `fucina-dist`, behind its `finetune` feature (an
//! optional dependency on `fucina-llm`), rather than in `fucina-llm`:
//! `fucina-llm` builds without MPI, and a feature turning MPI on there would
//! be turned on by the workspace's `--all-features` builds, which must pass
//! on machines without MPI.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use fucina::nn::Parameter;
use fucina::{ExecContext, Tensor};
use fucina_dist::{DataParallel, DataParallelOptions, World};
use fucina_llm::Tokenizer;
use fucina_llm::finetune::accumulate::MicroBatchFn;
use fucina_llm::finetune::trainer::Event;
use fucina_llm::finetune::{
    Accumulator, FinetuneError, LoraConfig, Target, TrainOptions, TrainableDecoder, Trainer, peft,
    read_jsonl, split_eval,
};

/// Fine-tune LoRA adapters data-parallel over MPI ranks.
#[derive(Parser, Debug)]
#[command(name = "finetune_dist")]
struct Args {
    /// Model directory (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// JSONL training data.
    #[arg(long)]
    data: PathBuf,
    /// Adapter rank.
    #[arg(long, default_value_t = 8)]
    lora_r: usize,
    /// Adapter alpha.
    #[arg(long, default_value_t = 16.0)]
    lora_alpha: f32,
    /// Dropout on the adapters' input.
    #[arg(long, default_value_t = 0.0)]
    lora_dropout: f32,
    /// Target projections, comma-separated, or `all`.
    #[arg(long, default_value = "q_proj,v_proj")]
    target: String,
    /// Tokens per example.
    #[arg(long, default_value_t = 256)]
    seq_len: usize,
    /// Rows per micro-batch.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Micro-batches per optimizer step (split over the ranks).
    #[arg(long, default_value_t = 4)]
    grad_accum: usize,
    /// Pack several examples into each row of `--seq-len` tokens.
    #[arg(long)]
    pack: bool,
    /// Passes over the training examples.
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 2e-4)]
    lr: f32,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// Clip the gradients' global norm to this (0: no clipping).
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f32,
    /// Fraction of the examples held out for the evaluation loss.
    #[arg(long, default_value_t = 0.1)]
    eval_fraction: f32,
    /// Seed of the adapters, the shuffles and the dropout.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Directory rank 0 writes the adapters to.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Worker threads per rank.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// One process without MPI (`fucina-llm`'s `Trainer::fit`): the
    /// reference the ranks match.
    #[arg(long)]
    local: bool,
}

/// [`DataParallel`] as the trainer's [`Accumulator`].
struct MpiAccumulator<'w> {
    dp: DataParallel<'w, Parameter>,
}

impl Accumulator for MpiAccumulator<'_> {
    fn accumulate(
        &mut self,
        ctx: &ExecContext,
        _params: &[Parameter],
        microbatches: usize,
        run: &mut MicroBatchFn<'_>,
    ) -> Result<f32, FinetuneError> {
        let fixed = self.dp.options().microbatches;
        if microbatches != fixed {
            return Err(FinetuneError::Invalid {
                op: "MpiAccumulator",
                reason: format!("a step of {microbatches} micro-batches, made for {fixed}"),
            });
        }
        let out = self
            .dp
            .step(ctx, |ctx, _, m| {
                run(ctx, m).map_err(|e| fucina_dist::DistError::Config(e.to_string()))
            })
            .map_err(|e| FinetuneError::Invalid {
                op: "DataParallel::step",
                reason: e.to_string(),
            })?;
        Ok(out.value)
    }
}

/// The loaded job: the trainer and its splits.
fn setup(
    ctx: &ExecContext,
    args: &Args,
) -> Result<
    (
        Trainer,
        Vec<fucina_llm::finetune::Example>,
        Vec<fucina_llm::finetune::Example>,
    ),
    FinetuneError,
> {
    let lora = LoraConfig {
        r: args.lora_r,
        alpha: args.lora_alpha,
        dropout: args.lora_dropout,
        targets: Target::parse_list(&args.target)?,
        seed: args.seed,
    };
    let model = TrainableDecoder::load(ctx, &args.model, &lora)?;
    let tok = Tokenizer::from_file(args.model.join("tokenizer.json"))?;
    let eos = model.config().eos_token_ids.first().copied();
    let examples = read_jsonl(&args.data, &tok, eos, args.seq_len)?;
    let (train, eval) = split_eval(examples, args.eval_fraction, args.seed);
    if train.is_empty() || args.batch == 0 || args.grad_accum == 0 {
        return Err(FinetuneError::Invalid {
            op: "finetune_dist",
            reason: "no training example, or a --batch or --grad-accum of 0".to_string(),
        });
    }
    let opts = TrainOptions {
        pack: args.pack.then_some(args.seq_len),
        grad_accum: args.grad_accum,
        lr: args.lr,
        warmup_steps: args.warmup,
        max_grad_norm: (args.max_grad_norm > 0.0).then_some(args.max_grad_norm),
        batch: args.batch,
        epochs: args.epochs,
        seed: args.seed,
        ..TrainOptions::default()
    };
    let steps = opts.total_steps_for(&train);
    Ok((Trainer::new(model, opts, steps)?, train, eval))
}

/// Trains with `acc` (`None`: in this process), printing on `root`.
fn train(ctx: &ExecContext, args: &Args, world: Option<&World>) -> Result<(), FinetuneError> {
    let root = world.is_none_or(World::is_root);
    let (mut trainer, train, eval) = setup(ctx, args)?;
    let print = |trainer: &Trainer, e: Event| -> Result<(), FinetuneError> {
        match e {
            Event::Step { step, loss, .. } if root => println!("step {step} loss {loss}"),
            Event::Epoch {
                eval_loss: Some(l), ..
            } if root => println!("eval loss {l}"),
            _ => {}
        }
        let _ = trainer;
        Ok(())
    };
    match world {
        None => trainer.fit(ctx, &train, &eval, print)?,
        Some(world) => {
            let opts = DataParallelOptions {
                microbatches: args.grad_accum,
                ..DataParallelOptions::default()
            };
            let dp = DataParallel::new(world, trainer.model().parameters(), opts).map_err(|e| {
                FinetuneError::Invalid {
                    op: "DataParallel::new",
                    reason: e.to_string(),
                }
            })?;
            let mut acc = MpiAccumulator { dp };
            trainer.fit_with(ctx, &train, &eval, &mut acc, print)?;
        }
    }
    if root {
        let values: Vec<Tensor> = trainer
            .model()
            .parameters()
            .iter()
            .map(Parameter::tensor)
            .collect();
        println!("adapter {:016x}", fucina_dist::params_hash(&values));
        if let Some(out) = &args.out {
            peft::save_adapter(trainer.model(), out, &args.model.to_string_lossy())?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let ctx = ExecContext::with_threads(args.threads.max(1));
    if args.local {
        return match train(&ctx, &args, None) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    world.abort_on_error(train(&ctx, &args, Some(&world)));
    ExitCode::SUCCESS
}
