//! Generates text with a Hugging Face model directory or a llama.cpp GGUF file.
//!
//! ```text
//! cargo run --release -p fucina-llm --example generate -- \
//!     --model crates/fucina-llm/tests/fixtures/llama_f32 --prompt "The quick brown fox" \
//!     --max-new-tokens 16
//! cargo run --release -p fucina-llm --example generate -- \
//!     --model DIR --prompt-ids "1,2,3;4,5" --temperature 0.8 --top-p 0.9 --seed 7 \
//!     --threads 4 --logits-out first_prompt_logits.npy
//! cargo run --release -p fucina-llm --example generate -- \
//!     --model model-q8_0.gguf --prompt "Once upon a time"      # tokenizer from the file
//! cargo run --release -p fucina-llm --example generate -- \
//!     --model DIR --dtype q4_0 --prompt "Once upon a time"     # quantized at load
//! ```
//!
//! `--model` is a directory (config.json, safetensors, optional tokenizer.json)
//! or a `.gguf` file of the Llama architecture, whose tokenizer comes from its
//! `tokenizer.ggml.*` metadata. `--dtype f32|f16|bf16|q8_0|q4_0|q4_k` converts the
//! matrices at load (default: the file's own formats, read in place); see
//! `fucina_llm::WeightStore::convert`. `--bf16-products` runs the projections
//! as bf16 products with the AMX rule (`fucina_llm::Model::use_bf16_products`;
//! the matrices must be bf16).
//!
//! Several prompts separated by `;` are decoded as one batch: each is prefilled
//! into its own KV cache, then the unfinished sequences advance together, one
//! batched decode step per token; a sequence ends at one of the model's
//! end-of-sequence tokens (those of `generation_config.json`, else of
//! `config.json` or the GGUF metadata) or after `--max-new-tokens` tokens. Prompt `i` samples
//! with seed `--seed + i`.
//!
//! Output: the text of each sequence (prompt and continuation) when there is a
//! tokenizer (a single prompt's text streams as it is generated; a batch's
//! texts are printed when the batch ends), one line `ids[i]: <generated ids>`
//! per prompt, one line `stop[i]: ...` per prompt saying why it ended (the
//! end-of-sequence token it produced, or `--max-new-tokens` reached), and a
//! line with the prefill and decode throughput. `--logits-out`
//! writes the logits of every position of the first prompt, `[T, vocab]`, as a
//! little-endian f32 `.npy` file.

#[path = "common/batch.rs"]
mod batch;
#[path = "common/npy.rs"]
mod npy;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use fucina_llm::fucina::ExecContext;
use fucina_llm::sample::SamplingParams;
use fucina_llm::{LlmError, LoadDtype, Tokenizer, open_model};

/// Generate text with a Hugging Face decoder model (Llama, Qwen2, Mistral) or a
/// Llama GGUF file.
#[derive(Parser, Debug)]
#[command(name = "generate")]
struct Args {
    /// Model directory (config.json, model.safetensors or a sharded index,
    /// optional tokenizer.json), or a .gguf file (Llama architecture).
    #[arg(long)]
    model: PathBuf,
    /// Convert the matrices at load: f32, f16, bf16, q8_0, q4_0 or q4_k (default: the
    /// file's own formats).
    #[arg(long)]
    dtype: Option<LoadDtype>,
    /// Run the projections as bf16 products with the AMX rule (a bf16 model,
    /// or `--dtype bf16`): activations rounded to bf16, AMX tiles where the
    /// CPU has them, the same bits everywhere.
    #[arg(long)]
    bf16_products: bool,
    /// Prompt text (needs a tokenizer); several prompts separated by ';'.
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// Prompt token ids, comma-separated; several prompts separated by ';'.
    #[arg(long)]
    prompt_ids: Option<String>,
    /// Tokens to generate per prompt (at most).
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 chooses greedily.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling: keep the most likely tokens up to this mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Threads (the results do not depend on it); default: every core.
    #[arg(long)]
    threads: Option<usize>,
    /// Write the first prompt's logits, [T, vocab], as a little-endian f32 .npy.
    #[arg(long)]
    logits_out: Option<PathBuf>,
}

fn run(args: Args) -> Result<(), String> {
    let err = |e: LlmError| e.to_string();
    let ctx = match args.threads {
        Some(0) => return Err("--threads must be at least 1".to_string()),
        Some(n) => ExecContext::with_threads(n),
        None => ExecContext::new(),
    };
    let mut opened = open_model(&args.model, &ctx, args.dtype).map_err(err)?;
    if args.bf16_products {
        opened.model.use_bf16_products().map_err(err)?;
    }
    let (model, tokenizer) = (&opened.model, &opened.tokenizer);
    let prompts = match (&args.prompt, &args.prompt_ids) {
        (Some(text), None) => {
            let tok = tokenizer.as_ref().ok_or(format!(
                "--prompt needs a tokenizer ({} has none); give --prompt-ids instead",
                args.model.display()
            ))?;
            text.split(';')
                .map(|p| tok.encode(p, true))
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?
        }
        (None, Some(ids)) => batch::parse_prompt_ids(ids)?,
        _ => return Err("give exactly one of --prompt and --prompt-ids".to_string()),
    };
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        stop_tokens: opened.stop_tokens.clone(),
        ..SamplingParams::default()
    };
    params.validate().map_err(err)?;
    // One prompt with a tokenizer: its text is printed as it is generated.
    let mut stream = match (tokenizer, prompts.len()) {
        (Some(tok), 1) => Some(TextStream::start(tok, &prompts[0]).map_err(err)?),
        _ => None,
    };
    let mut decode_error = None;
    let out = batch::generate_streaming(
        model,
        &ctx,
        &prompts,
        args.max_new_tokens,
        &params,
        args.logits_out.is_some(),
        &mut |_, id| {
            if let Some(s) = stream.as_mut()
                && let Err(e) = s.push(id)
            {
                decode_error.get_or_insert(e);
            }
        },
    )
    .map_err(err)?;
    if let Some(s) = stream {
        s.finish().map_err(err)?;
    }
    if let Some(e) = decode_error {
        return Err(err(e));
    }
    if let (Some(path), Some(logits)) = (&args.logits_out, &out.first_prompt_logits) {
        let shape = [prompts[0].len(), model.config().vocab_size];
        npy::write_npy_f32(path, &shape, logits).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let (Some(tok), true) = (tokenizer, prompts.len() > 1) {
        for (i, (prompt, ids)) in prompts.iter().zip(&out.ids).enumerate() {
            let all: Vec<u32> = prompt.iter().chain(ids).copied().collect();
            println!("text[{i}]: {}", tok.decode(&all, true).map_err(err)?);
        }
    }
    for (i, ids) in out.ids.iter().enumerate() {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("ids[{i}]: {}", ids.join(" "));
    }
    for (i, stop) in out.stops.iter().enumerate() {
        let why = match *stop {
            batch::Stop::StopToken(t) => {
                let name = tokenizer
                    .as_ref()
                    .and_then(|tok| tok.id_to_token(t))
                    .map(|s| format!(" {s:?}"))
                    .unwrap_or_default();
                format!("end-of-sequence token {t}{name}")
            }
            batch::Stop::MaxTokens => {
                format!("--max-new-tokens {} reached", args.max_new_tokens)
            }
        };
        println!("stop[{i}]: {why}");
    }
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    println!(
        "prefill: {} tokens in {:.3} s ({:.1} tokens/s); decode: {} tokens in {} steps, {:.3} s ({:.1} tokens/s); {} threads",
        out.prefill_tokens,
        out.prefill_secs,
        rate(out.prefill_tokens, out.prefill_secs),
        out.decode_tokens,
        out.decode_steps,
        out.decode_secs,
        rate(out.decode_tokens, out.decode_secs),
        ctx.threads(),
    );
    Ok(())
}

/// Prints one sequence's text as its ids arrive: the prompt's text, then each
/// new piece of the decoded text. The whole sequence is decoded again at each
/// id (a tokenizer may merge a new id with the text before it), and text is
/// held back while it ends in an incomplete UTF-8 character.
struct TextStream<'a> {
    tok: &'a Tokenizer,
    ids: Vec<u32>,
    printed: String,
}

impl<'a> TextStream<'a> {
    fn start(tok: &'a Tokenizer, prompt: &[u32]) -> Result<TextStream<'a>, LlmError> {
        let mut s = TextStream {
            tok,
            ids: prompt.to_vec(),
            printed: String::new(),
        };
        print!("text[0]: ");
        s.flush_new()?;
        Ok(s)
    }

    fn push(&mut self, id: u32) -> Result<(), LlmError> {
        self.ids.push(id);
        self.flush_new()
    }

    /// Prints what the decoded text adds to what was printed.
    fn flush_new(&mut self) -> Result<(), LlmError> {
        let text = self.tok.decode(&self.ids, true)?;
        if !text.ends_with('\u{FFFD}')
            && let Some(new) = text.strip_prefix(self.printed.as_str())
        {
            print!("{new}");
            let _ = std::io::stdout().flush();
            self.printed = text;
        }
        Ok(())
    }

    /// Ends the line; if a later id changed text already printed, the whole
    /// text is printed again on a line of its own.
    fn finish(self) -> Result<(), LlmError> {
        let text = self.tok.decode(&self.ids, true)?;
        match text.strip_prefix(self.printed.as_str()) {
            Some(rest) => println!("{rest}"),
            None => println!("\ntext[0]: {text}"),
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
