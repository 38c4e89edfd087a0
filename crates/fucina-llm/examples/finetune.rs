//! Fine-tunes LoRA adapters on a pretrained model directory and saves them as
//! PEFT does.
//!
//! ```text
//! cargo run --release -p fucina-llm --example finetune -- \
//!     --model DIR --data FILE.jsonl --lora-r 8 --lora-alpha 16 \
//!     --target q_proj,v_proj --seq-len 256 --batch 4 --epochs 1 --lr 2e-4 \
//!     --out DIR [--threads N]
//! ```
//!
//! `--model` is a Hugging Face directory (config.json, safetensors weights,
//! tokenizer.json) of a Llama, Qwen2, Mistral or Qwen3 model. `--data` is a
//! JSONL file of `{"prompt", "completion"}` records (the loss covers the
//! completion only), `{"text"}` records or `{"messages"}` conversations
//! through the tokenizer's chat template (the loss covers the last, assistant
//! message; see `fucina_llm::finetune::data`);
//! a malformed line stops the job with an error naming it. A seeded
//! `--eval-fraction` of the examples (default 0.1, at least one when there
//! are two or more) is held out.
//!
//! Output on stdout: `step {n} loss {x}` after each optimizer step and
//! `eval loss {x}` after each epoch (scripts parse these lines); then the
//! adapters are written to `--out` (`adapter_model.safetensors`,
//! `adapter_config.json`), which `peft.PeftModel.from_pretrained` loads, with
//! the optimizer's state (`trainer_state.safetensors`): `--resume DIR`
//! continues a job from such a directory (also written every `--save-every`
//! steps) with the same bits as a run that never stopped. `--grad-accum K`
//! takes an optimizer step every `K` micro-batches of `--batch` rows;
//! `--pack` packs several examples into each row of `--seq-len` tokens;
//! `--grad-checkpoint` recomputes each layer in the backward instead of
//! keeping its activations.
//! `--loss-svg PATH` draws the loss of every step as an SVG chart.
//! `--full` trains every weight of an f32 model instead of adapters and
//! writes the trained model to `--out` as a Hugging Face directory (the LoRA
//! flags, `--merge-lora`, `--resume` and `--save-every` are refused with it).
//! Progress goes to stderr: a bar (step, loss, tokens/s, ETA) when stderr is
//! a terminal, a line per step otherwise.
//! `--merge-lora DIR` also writes the model with the adapters merged into its
//! matrices (f32) as a Hugging Face directory, which transformers and
//! `generate --model DIR` load (`generate --lora` applies the adapters
//! without writing a model). The
//! same arguments give the same bits for any `--threads`. `--logits-ids 1,2,3
//! --logits-out FILE.npy` also writes the logits of those ids with the trained
//! adapters, which `scripts/peft_roundtrip.py` compares with what PEFT
//! computes from the saved files. The same job data-parallel under `mpirun`,
//! with the same bits for any rank count, is `fucina-dist`'s `finetune_dist`
//! example (docs/FINETUNE.md, "Data-parallel under MPI").

#[path = "common/npy.rs"]
mod npy;
// The loss chart of fucina's training examples (the rest of the file serves
// them only).
#[allow(dead_code)]
#[path = "../../fucina/examples/common/train.rs"]
mod train;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use fucina_llm::Tokenizer;
use fucina_llm::finetune::trainer::Event;
use fucina_llm::finetune::{
    FinetuneError, LoraConfig, Target, TrainOptions, TrainableDecoder, Trainer, peft, read_jsonl,
    split_eval,
};
use fucina_llm::fucina::ExecContext;

/// Fine-tune LoRA adapters of a Hugging Face decoder model.
#[derive(Parser, Debug)]
#[command(name = "finetune")]
struct Args {
    /// Model directory (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// JSONL training data.
    #[arg(long)]
    data: PathBuf,
    /// Full fine-tuning: every weight of an f32 model trained, no adapters;
    /// `--out` receives the trained model as a Hugging Face directory.
    #[arg(long, conflicts_with_all = [
        "lora_r", "lora_alpha", "lora_dropout", "target", "merge_lora", "resume", "save_every",
    ])]
    full: bool,
    /// Adapter rank.
    #[arg(long, default_value_t = 8)]
    lora_r: usize,
    /// Adapter alpha (the output is scaled by alpha / r).
    #[arg(long, default_value_t = 16.0)]
    lora_alpha: f32,
    /// Dropout on the adapters' input.
    #[arg(long, default_value_t = 0.0)]
    lora_dropout: f32,
    /// Target projections, comma-separated (q_proj,k_proj,v_proj,o_proj,
    /// gate_proj,up_proj,down_proj), or `all`.
    #[arg(long, default_value = "q_proj,v_proj")]
    target: String,
    /// Tokens per example (longer ones are truncated).
    #[arg(long, default_value_t = 256)]
    seq_len: usize,
    /// Examples per optimizer step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Gradient checkpointing per layer: keep only each layer's input for the
    /// backward, which runs the layer again (less memory, more compute).
    #[arg(long)]
    grad_checkpoint: bool,
    /// bf16 products for the frozen bf16 base (forward and backward, the
    /// output projection included): inputs rounded to bf16, sums with the
    /// AMX rule, as a bf16 base computes them (faster where the CPU has
    /// AVX512_BF16 or AMX; the same bits on every CPU and thread count).
    #[arg(long, conflicts_with = "full")]
    bf16_products: bool,
    /// Pack several examples into each row of `--seq-len` tokens (each
    /// attends only to itself, from position 0): fewer, fuller rows.
    #[arg(long)]
    pack: bool,
    /// Micro-batches of `--batch` rows per optimizer step (gradient
    /// accumulation).
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Write a checkpoint (the adapters and the optimizer's state) to `--out`
    /// every this many steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    save_every: u64,
    /// Resume from the checkpoint in this directory (written by a run with the
    /// same arguments): the same bits as a run that never stopped.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Passes over the training examples.
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 2e-4)]
    lr: f32,
    /// Linear warmup steps before the cosine decay.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// AdamW's decoupled weight decay.
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f32,
    /// Clip the gradients' global norm to this (0: no clipping).
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f32,
    /// Fraction of the examples held out for the evaluation loss.
    #[arg(long, default_value_t = 0.1)]
    eval_fraction: f32,
    /// Seed of the adapters' initialization, the shuffles and the dropout.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Directory the adapters are written to.
    #[arg(long)]
    out: PathBuf,
    /// Worker threads (default: the available parallelism).
    #[arg(long)]
    threads: Option<usize>,
    /// The context pool's cache cap in MiB, both tiers (default 8192): a
    /// training step's buffers come back from the pool the next step instead
    /// of being freed past the pool's own caps (1 GiB shared, 256 MiB local)
    /// and mapped, and zeroed by the kernel, again; measured on the SmolLM2
    /// shape it is faster and lowers the peak resident memory. 0 keeps the
    /// pool's caps.
    #[arg(long, default_value_t = 8192)]
    pool_cache_mib: usize,
    /// Write the training loss of every step as an SVG chart here.
    #[arg(long)]
    loss_svg: Option<PathBuf>,
    /// After training, also write the model with the adapters merged into
    /// its matrices (f32) as a Hugging Face directory here.
    #[arg(long)]
    merge_lora: Option<PathBuf>,
    /// After training, write the logits of these comma-separated token ids
    /// (`[T, vocab]`, little-endian f32 `.npy`) to `--logits-out`, computed
    /// with the adapters (for `scripts/peft_roundtrip.py`).
    #[arg(long, requires = "logits_out")]
    logits_ids: Option<String>,
    /// See `--logits-ids`.
    #[arg(long, requires = "logits_ids")]
    logits_out: Option<PathBuf>,
}

/// Where a job stands after a step: what the progress display shows.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Progress {
    step: u64,
    steps: u64,
    loss: f32,
    tokens_per_s: f64,
    eta_s: f64,
}

impl Progress {
    /// `step 3/10  loss 2.3456  812 tok/s  ETA 0:07` (a line per step when
    /// stderr is not a terminal).
    fn line(&self) -> String {
        format!(
            "step {}/{}  loss {:.4}  {:.0} tok/s  ETA {}",
            self.step,
            self.steps,
            self.loss,
            self.tokens_per_s,
            clock(self.eta_s)
        )
    }

    /// The line after a bar of `width` cells, filled in proportion to the
    /// steps done: `[#########.....] step 3/10 ...`.
    fn bar(&self, width: usize) -> String {
        let filled = match self.steps {
            0 => width,
            n => ((self.step.min(n) as u128 * width as u128) / n as u128) as usize,
        };
        format!(
            "[{}{}] {}",
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.line()
        )
    }
}

/// `h:mm:ss` or `m:ss` of a duration in seconds (`?` when unknown).
fn clock(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "?".to_string();
    }
    let s = s.round() as u64;
    match s / 3600 {
        0 => format!("{}:{:02}", s / 60, s % 60),
        h => format!("{h}:{:02}:{:02}", s / 60 % 60, s % 60),
    }
}

/// The ids of a comma-separated list.
fn parse_ids(s: &str) -> Result<Vec<u32>, FinetuneError> {
    s.split(',')
        .map(|x| {
            x.trim().parse::<u32>().map_err(|e| FinetuneError::Invalid {
                op: "finetune",
                reason: format!("--logits-ids: `{x}`: {e}"),
            })
        })
        .collect()
}

fn run(args: &Args) -> Result<(), FinetuneError> {
    let ctx = match args.threads {
        Some(n) => ExecContext::with_threads(n.max(1)),
        None => ExecContext::new(),
    };
    if args.pool_cache_mib > 0 {
        let bytes = args.pool_cache_mib.saturating_mul(1 << 20);
        ctx.pool().pool().set_max_cached_bytes(bytes);
        ctx.pool().set_max_cached_bytes(bytes);
    }
    let lora = LoraConfig {
        r: args.lora_r,
        alpha: args.lora_alpha,
        dropout: args.lora_dropout,
        targets: Target::parse_list(&args.target)?,
        seed: args.seed,
    };
    if args.seq_len < 2 {
        return Err(FinetuneError::Invalid {
            op: "finetune",
            reason: format!("--seq-len {} leaves nothing to predict", args.seq_len),
        });
    }
    let mut model = match args.full {
        true => TrainableDecoder::load_full(&ctx, &args.model)?,
        false => TrainableDecoder::load(&ctx, &args.model, &lora)?,
    };
    model.set_checkpointing(args.grad_checkpoint);
    if args.bf16_products {
        model.use_bf16_products()?;
    }
    let tok = Tokenizer::from_file(args.model.join("tokenizer.json"))?;
    let eos = model.config().eos_token_ids.first().copied();
    let examples = read_jsonl(&args.data, &tok, eos, args.seq_len)?;
    let (train, eval) = split_eval(examples, args.eval_fraction, args.seed);
    if train.is_empty() {
        return Err(FinetuneError::Invalid {
            op: "finetune",
            reason: format!("{}: no training example", args.data.display()),
        });
    }
    if args.batch == 0 || args.grad_accum == 0 {
        return Err(FinetuneError::Invalid {
            op: "finetune",
            reason: "--batch and --grad-accum must be at least 1".to_string(),
        });
    }
    let opts = TrainOptions {
        pack: args.pack.then_some(args.seq_len),
        grad_accum: args.grad_accum,
        lr: args.lr,
        warmup_steps: args.warmup,
        weight_decay: args.weight_decay,
        max_grad_norm: (args.max_grad_norm > 0.0).then_some(args.max_grad_norm),
        batch: args.batch,
        epochs: args.epochs,
        seed: args.seed,
        ..TrainOptions::default()
    };
    let steps = opts.total_steps_for(&train);
    let opts_steps_per_epoch = opts.steps_per_epoch(opts.rows(&train).len());
    eprintln!(
        "{} training and {} held-out examples, {steps} steps, {} trained values on {} threads",
        train.len(),
        eval.len(),
        model.parameters().iter().map(|p| p.numel()).sum::<usize>(),
        ctx.threads()
    );
    let mut trainer = Trainer::new(model, opts, steps)?;
    if let Some(dir) = &args.resume {
        trainer.load_checkpoint(&ctx, dir)?;
        eprintln!("resumed at step {} from {}", trainer.steps(), dir.display());
    }
    let base = args.model.to_string_lossy().into_owned();
    let start = Instant::now();
    let mut tokens = 0usize;
    let mut losses = Vec::new();
    let first_epoch = (trainer.steps() / opts_steps_per_epoch.max(1)) as usize;
    let first_step = trainer.steps();
    let bar = std::io::stderr().is_terminal();
    trainer.fit(&ctx, &train, &eval, |trainer, e| {
        match e {
            Event::Step {
                step,
                loss,
                tokens: t,
            } => {
                tokens += t;
                losses.push(loss);
                println!("step {step} loss {loss}");
                let elapsed = start.elapsed().as_secs_f64();
                let progress = Progress {
                    step,
                    steps,
                    loss,
                    tokens_per_s: tokens as f64 / elapsed,
                    eta_s: elapsed / (step - first_step) as f64 * steps.saturating_sub(step) as f64,
                };
                match bar {
                    // Redrawn in place; the stdout lines stay one per step.
                    true => {
                        eprint!("\r{}\x1b[K", progress.bar(30));
                        if step == steps {
                            eprintln!();
                        }
                        let _ = std::io::stderr().flush();
                    }
                    false => eprintln!("  {}", progress.line()),
                }
                if args.save_every > 0 && step % args.save_every == 0 {
                    trainer.save_checkpoint(&args.out, &base)?;
                }
            }
            Event::Epoch { eval_loss, .. } => {
                if let Some(l) = eval_loss {
                    println!("eval loss {l}");
                }
            }
        }
        Ok(())
    })?;
    if trainer.model().is_full() {
        let store = fucina_llm::WeightStore::open(&args.model)?;
        let trained = trainer.model().trained_store(&store)?;
        peft::write_model_dir(&ctx, &trained, &args.model, &args.out)?;
        eprintln!("trained model written to {}", args.out.display());
    } else {
        trainer.save_checkpoint(&args.out, &base)?;
        eprintln!("adapters written to {}", args.out.display());
    }
    if let Some(path) = &args.loss_svg {
        let svg = train::loss_svg(
            "finetune: training loss per step",
            &losses,
            opts_steps_per_epoch as usize,
            first_epoch,
        );
        std::fs::write(path, svg).map_err(|source| FinetuneError::Io {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(dir) = &args.merge_lora {
        let store = fucina_llm::WeightStore::open(&args.model)?;
        let merged = peft::merge_adapter(&ctx, &store, &args.out)?;
        peft::write_model_dir(&ctx, &merged, &args.model, dir)?;
        eprintln!("merged model written to {}", dir.display());
    }
    if let (Some(ids), Some(path)) = (&args.logits_ids, &args.logits_out) {
        let ids = parse_ids(ids)?;
        let _g = fucina_llm::fucina::no_grad();
        let logits = trainer.model().logits(&ctx, &ids, 1, ids.len())?.to_vec();
        let shape = [ids.len(), trainer.model().config().vocab_size];
        npy::write_npy_f32(path, &shape, &logits).map_err(|source| FinetuneError::Io {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_f32")
    }

    fn args(data: &std::path::Path, out: &std::path::Path) -> Args {
        Args::parse_from([
            "finetune",
            "--model",
            fixture().to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--lora-r",
            "4",
            "--lora-alpha",
            "8",
            "--target",
            "q_proj,v_proj,down_proj",
            "--seq-len",
            "32",
            "--batch",
            "2",
            "--epochs",
            "2",
            "--lr",
            "1e-2",
            "--out",
            out.to_str().unwrap(),
            "--threads",
            "2",
        ])
    }

    /// The progress display: the bar fills with the steps, the ETA reads as
    /// a clock, an unknown one as `?`.
    #[test]
    fn progress_shows_steps_loss_speed_and_eta() {
        let p = Progress {
            step: 3,
            steps: 10,
            loss: 2.345_67,
            tokens_per_s: 811.6,
            eta_s: 7.4,
        };
        assert_eq!(p.line(), "step 3/10  loss 2.3457  812 tok/s  ETA 0:07");
        assert_eq!(
            p.bar(10),
            "[###.......] step 3/10  loss 2.3457  812 tok/s  ETA 0:07"
        );
        let done = Progress {
            step: 10,
            eta_s: 0.0,
            ..p
        };
        assert!(done.bar(4).starts_with("[####] step 10/10"));
        assert_eq!(clock(3725.0), "1:02:05");
        assert_eq!(clock(f64::NAN), "?");
        assert_eq!(clock(f64::INFINITY), "?");
    }

    /// `--full` refuses the LoRA flags (and the adapter-only ones) by name.
    #[test]
    fn full_fine_tuning_refuses_lora_flags() {
        let base = [
            "finetune", "--model", "m", "--data", "d", "--out", "o", "--full",
        ];
        assert!(Args::try_parse_from(base).unwrap().full);
        for extra in [
            &["--lora-r", "4"][..],
            &["--lora-alpha", "8"],
            &["--lora-dropout", "0.1"],
            &["--target", "all"],
            &["--merge-lora", "x"],
            &["--resume", "x"],
            &["--save-every", "2"],
        ] {
            let argv: Vec<&str> = base.iter().chain(extra).copied().collect();
            let e = Args::try_parse_from(&argv).unwrap_err().to_string();
            assert!(
                e.contains("cannot be used with") && e.contains(extra[0]),
                "{extra:?}: {e}"
            );
        }
    }

    /// A short full fine-tune of the f32 fixture changes every kind of
    /// weight and writes a model directory that loads back with the trained
    /// values; a bf16 model is refused by name.
    #[test]
    fn a_full_fine_tune_writes_a_model_directory() {
        let tmp = std::env::temp_dir().join(format!("fucina-finetune-full-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let data = tmp.join("data.jsonl");
        let lines: String = (0..4)
            .map(|i| {
                format!(
                    "{{\"prompt\": \"Q{i}: next?\", \"completion\": \" {}\"}}\n",
                    i + 1
                )
            })
            .collect();
        std::fs::write(&data, lines).unwrap();
        let out = tmp.join("model");
        let a = Args::parse_from([
            "finetune",
            "--model",
            fixture().to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--full",
            "--seq-len",
            "24",
            "--batch",
            "2",
            "--lr",
            "1e-2",
            "--eval-fraction",
            "0",
            "--out",
            out.to_str().unwrap(),
            "--threads",
            "1",
        ]);
        run(&a).unwrap();
        let before = fucina_llm::WeightStore::open(fixture()).unwrap();
        let after = fucina_llm::WeightStore::open(&out).unwrap();
        for name in [
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.1.mlp.down_proj.weight",
            "model.layers.0.input_layernorm.weight",
            "model.norm.weight",
        ] {
            let (b, t) = (before.get(name).unwrap(), after.get(name).unwrap());
            assert_eq!(b.shape(), t.shape(), "{name}");
            assert_ne!(b.to_f32_vec(), t.to_f32_vec(), "{name} did not train");
        }
        let bf16 = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_bf16");
        let ctx = ExecContext::with_threads(1);
        let e = TrainableDecoder::load_full(&ctx, &bf16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("f32 models only"), "{e}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    /// A short job on the fixture model writes PEFT's files.
    #[test]
    fn a_job_writes_peft_adapters() {
        let tmp = std::env::temp_dir().join(format!("fucina-finetune-ex-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let data = tmp.join("data.jsonl");
        let mut lines = String::new();
        for i in 0..6 {
            lines += &format!(
                "{{\"prompt\": \"Question {i}: what comes next?\", \"completion\": \" the number {}\"}}\n",
                i + 1
            );
        }
        lines += "{\"text\": \"The quick brown fox jumps over the lazy dog.\"}\n";
        std::fs::write(&data, lines).unwrap();
        let out = tmp.join("adapter");
        let mut a = args(&data, &out);
        let svg = tmp.join("loss.svg");
        a.loss_svg = Some(svg.clone());
        run(&a).unwrap();
        let chart = std::fs::read_to_string(&svg).unwrap();
        assert!(
            chart.starts_with("<svg") && chart.contains("<polyline"),
            "{chart}"
        );
        let cfg = peft::read_adapter_config(&out).unwrap();
        assert_eq!((cfg.r, cfg.alpha), (4, 8.0));
        assert_eq!(
            cfg.targets,
            [Target::QProj, Target::VProj, Target::DownProj]
        );
        assert!(out.join(peft::ADAPTER_WEIGHTS).exists());
        // A malformed line is refused by number.
        std::fs::write(&data, "{\"text\": \"ok\"}\n{\"prompt\": \"x\"}\n").unwrap();
        let e = run(&args(&data, &out)).unwrap_err().to_string();
        assert!(e.contains("data.jsonl:2:"), "{e}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
