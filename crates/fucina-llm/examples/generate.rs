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
//! cargo run --release -p fucina-llm --example generate -- \
//!     --model DIR --chat "Name three colors." --system "Be brief."  # through the chat template
//! cargo run --release -p fucina-llm --example generate -- \
//!     --model DIR --chat -                                      # a conversation: one turn per stdin line
//! ```
//!
//! `--model` is a directory (config.json, safetensors, optional tokenizer.json,
//! tokenizer_config.json and generation_config.json) or a `.gguf` file (any
//! architecture `fucina_llm::arch` names), whose tokenizer and chat template
//! come from its metadata. `--lora DIR` applies LoRA adapters saved as PEFT
//! saves them (the `finetune` example's `--out`), merged into the matrices of
//! a model directory at load (before `--dtype`). `--dtype` (`f32`, `f16`, `bf16` or a block format
//! such as `q8_0`, `q4_0`, `q4_k`, `q5_k`) converts the matrices at load (default: the file's own formats, read in place); see
//! `fucina_llm::WeightStore::convert`. At load it prints to stderr what the
//! tensors are stored as: the count per format, and the matrices that fell
//! back to a format of blocks of 32 because their rows are not whole
//! super-blocks (`fucina_llm::FormatReport`); `--verbose` lists every tensor.
//! `--check-tensors` first checks that every value in the model's files is
//! finite (`fucina_llm::WeightStore::check_finite`, an error naming the tensor,
//! row and block otherwise), as llama.cpp's `--check-tensors` does.
//! `--bf16-products` runs the projections
//! as bf16 products with the AMX rule (`fucina_llm::Model::use_bf16_products`;
//! the matrices must be bf16).
//!
//! Several prompts separated by `;` are decoded as one batch: each is prefilled
//! into its own KV cache, then the unfinished sequences advance together, one
//! batched decode step per token; a sequence ends at one of the model's
//! end-of-sequence tokens (those of `generation_config.json`, else of
//! `config.json` or the GGUF metadata) or after `--max-new-tokens` tokens. Prompt `i` samples
//! with seed `--seed + i`. `--prompt-file PATH` reads one prompt, the file's
//! text as it is (`;` included).
//!
//! Output: the text of each sequence (prompt and continuation) when there is a
//! tokenizer (a single prompt's text streams as it is generated; a batch's
//! texts are printed when the batch ends), one line `ids[i]: <generated ids>`
//! per prompt, one line `stop[i]: ...` per prompt saying why it ended (the
//! end-of-sequence token it produced, or `--max-new-tokens` reached), and a
//! line with the prefill and decode throughput. `--logits-out`
//! writes the logits of every position of the first prompt, `[T, vocab]`, as a
//! little-endian f32 `.npy` file. The text leaves special tokens out unless
//! `--show-special` is given.
//!
//! `--chat TEXT` renders one user turn (after `--system TEXT`, when given)
//! through the model's chat template (`fucina_llm::Tokenizer::apply_chat_template`,
//! with the generation prompt) and generates the assistant's reply, which also
//! ends at the template's end-of-turn tokens (`<|im_end|>`, `<|eot_id|>`,
//! `<end_of_turn>`, `<|end|>`, or the eos token where the template ends turns
//! with it). `--chat -` reads the user's turns from stdin, one per line, and
//! keeps the conversation and its KV cache (`--context` positions) between
//! turns: each turn prefills only what the cache does not hold yet. Each reply
//! prints as `assistant: ...` while it is generated, then its ids, why it
//! stopped, and the tokens reused from the cache, prefilled and decoded.

#[path = "common/batch.rs"]
mod batch;
#[path = "common/npy.rs"]
mod npy;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{ArgGroup, Parser};
use fucina_llm::chat::ChatMessage;
use fucina_llm::finetune::FinetuneError;
use fucina_llm::finetune::peft::merge_adapter;
use fucina_llm::fucina::ExecContext;
use fucina_llm::model::Model;
use fucina_llm::sample::SamplingParams;
use fucina_llm::{LlmError, LoadDtype, ModelConfig, Tokenizer, WeightStore, open_model};

/// Generate text with a Hugging Face decoder model (any architecture of
/// `fucina_llm::arch`) or a GGUF file.
#[derive(Parser, Debug)]
#[command(name = "generate")]
#[command(group(ArgGroup::new("input").required(true).args(["prompt", "prompt_ids", "prompt_file", "chat"])))]
struct Args {
    /// Model directory (config.json, model.safetensors or a sharded index,
    /// optional tokenizer.json), or a .gguf file (Llama architecture).
    #[arg(long)]
    model: PathBuf,
    /// Convert the matrices at load: f32, f16, bf16 or a block format (q8_0,
    /// q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs;
    /// default: the file's own formats).
    #[arg(long)]
    dtype: Option<LoadDtype>,
    /// Print every tensor's format at load (name, shape, format, why), not
    /// only the count per format and the fallbacks.
    #[arg(long)]
    verbose: bool,
    /// Check that every value of the model's files is finite before loading
    /// (a NaN or infinite block scale is otherwise loaded, and the logits it
    /// reaches are NaN): one pass over the whole model.
    #[arg(long)]
    check_tensors: bool,
    /// Apply the LoRA adapters of this directory (PEFT's
    /// `adapter_model.safetensors` and `adapter_config.json`, as the
    /// `finetune` example writes them), merged into the matrices at load.
    #[arg(long)]
    lora: Option<PathBuf>,
    /// Run the projections as bf16 products with the AMX rule (a bf16 model,
    /// or `--dtype bf16`): activations rounded to bf16, AMX tiles where the
    /// CPU has them, the same bits everywhere.
    #[arg(long)]
    bf16_products: bool,
    /// Prompt text (needs a tokenizer); several prompts separated by ';'.
    #[arg(long)]
    prompt: Option<String>,
    /// Prompt token ids, comma-separated; several prompts separated by ';'.
    #[arg(long)]
    prompt_ids: Option<String>,
    /// Read one prompt from this file (its text as it is, ';' included).
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// One user turn through the model's chat template; '-' reads turns from
    /// stdin, one per line, keeping the conversation and its cache.
    #[arg(long, conflicts_with = "logits_out")]
    chat: Option<String>,
    /// A system message before the first user turn (with --chat).
    #[arg(long)]
    system: Option<String>,
    /// Positions of the KV cache a --chat - conversation keeps (default: the
    /// model's max_position_embeddings, at most 4096).
    #[arg(long)]
    context: Option<usize>,
    /// Print special tokens (role markers, end-of-turn tokens) in the text
    /// instead of leaving them out.
    #[arg(long)]
    show_special: bool,
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

fn err(e: LlmError) -> String {
    e.to_string()
}

/// The rules between flags that clap's attributes do not state.
fn check_args(args: &Args) -> Result<(), String> {
    if args.chat.is_none() {
        for (flag, given) in [
            ("--system", args.system.is_some()),
            ("--context", args.context.is_some()),
        ] {
            if given {
                return Err(format!("{flag} needs --chat"));
            }
        }
    }
    Ok(())
}

/// The model directory of `args` with the adapters of `lora` merged into its
/// matrices (`fucina_llm::finetune::peft::merge_adapter`), converted to
/// `--dtype` after the merge when given.
fn with_lora(args: &Args, lora: &Path, ctx: &ExecContext) -> Result<Model, FinetuneError> {
    if !args.model.is_dir() {
        return Err(FinetuneError::Invalid {
            op: "generate",
            reason: "--lora needs a model directory (not a GGUF file)".to_string(),
        });
    }
    let config = ModelConfig::from_file(args.model.join("config.json"))?;
    let merged = merge_adapter(ctx, &WeightStore::open(&args.model)?, lora)?;
    let mut merged = match args.dtype {
        Some(d) => merged.convert(ctx, d, config.tie_word_embeddings)?,
        None => merged,
    };
    merged.repack_quantized(ctx)?;
    Ok(Model::from_parts(config, merged)?)
}

fn run(args: Args, input: &mut dyn BufRead, out: &mut dyn Write) -> Result<(), String> {
    check_args(&args)?;
    let ctx = match args.threads {
        Some(0) => return Err("--threads must be at least 1".to_string()),
        Some(n) => ExecContext::with_threads(n),
        None => ExecContext::new(),
    };
    if args.check_tensors {
        check_tensors(&args.model).map_err(err)?;
    }
    let mut opened = open_model(&args.model, &ctx, args.dtype).map_err(err)?;
    if let Some(lora) = &args.lora {
        opened.model = with_lora(&args, lora, &ctx).map_err(|e| e.to_string())?;
    }
    // What each tensor became, on stderr (stdout holds the generated text).
    eprintln!("{}", opened.model.formats());
    if args.verbose {
        eprint!("{}", opened.model.formats().listing());
    }
    if args.bf16_products {
        opened.model.use_bf16_products().map_err(err)?;
    }
    let mut params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        stop_tokens: opened.stop_tokens.clone(),
        ..SamplingParams::default()
    };
    params.validate().map_err(err)?;
    let (model, tokenizer) = (&opened.model, opened.tokenizer.as_ref());
    if let Some(chat) = &args.chat {
        let tok = tokenizer.ok_or(format!(
            "--chat needs a tokenizer with a chat template ({} has none)",
            args.model.display()
        ))?;
        // The reply also ends at the template's end-of-turn tokens.
        for id in tok.end_of_turn_ids() {
            if !params.stop_tokens.contains(&id) {
                params.stop_tokens.push(id);
            }
        }
        return run_chat(&args, chat, model, tok, &ctx, params, input, out);
    }
    let need_tok = |flag: &str| {
        tokenizer.ok_or(format!(
            "{flag} needs a tokenizer ({} has none); give --prompt-ids instead",
            args.model.display()
        ))
    };
    let prompts = match (&args.prompt, &args.prompt_ids, &args.prompt_file) {
        (Some(text), None, None) => {
            let tok = need_tok("--prompt")?;
            text.split(';')
                .map(|p| tok.encode(p, true))
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?
        }
        (None, Some(ids), None) => batch::parse_prompt_ids(ids)?,
        (None, None, Some(path)) => {
            let tok = need_tok("--prompt-file")?;
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            vec![tok.encode(&text, true).map_err(err)?]
        }
        _ => {
            return Err(
                "give exactly one of --prompt, --prompt-ids, --prompt-file and --chat".to_string(),
            );
        }
    };
    run_batch(&args, model, tokenizer, &ctx, &params, &prompts, out)
}

/// `WeightStore::check_finite` of the tensors of the file or directory
/// `model`, as they are stored.
fn check_tensors(model: &std::path::Path) -> Result<(), LlmError> {
    let is_gguf = !model.is_dir()
        && model
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let store = match is_gguf {
        true => fucina_llm::arch::gguf::load_gguf(model)?.1,
        false => fucina_llm::WeightStore::open(model)?,
    };
    store.check_finite()
}

/// Decodes `prompts` as one batch and prints the texts, ids, stops and
/// throughput.
fn run_batch(
    args: &Args,
    model: &Model,
    tokenizer: Option<&Tokenizer>,
    ctx: &ExecContext,
    params: &SamplingParams,
    prompts: &[Vec<u32>],
    out: &mut dyn Write,
) -> Result<(), String> {
    let io = |e: std::io::Error| format!("writing the output: {e}");
    let skip_special = !args.show_special;
    // One prompt with a tokenizer: its text is printed as it is generated.
    let mut stream = match (tokenizer, prompts.len()) {
        (Some(tok), 1) => {
            Some(TextStream::start(tok, "text[0]: ", &prompts[0], skip_special, out).map_err(err)?)
        }
        _ => None,
    };
    let mut decode_error = None;
    let res = batch::generate_streaming(
        model,
        ctx,
        prompts,
        args.max_new_tokens,
        params,
        args.logits_out.is_some(),
        &mut |_, id| {
            if let Some(s) = stream.as_mut()
                && let Err(e) = s.push(id)
            {
                decode_error.get_or_insert(e);
            }
        },
    );
    let stream_out = stream.map(TextStream::finish);
    let res = res.map_err(err)?;
    if let Some(r) = stream_out {
        r.map_err(err)?;
    }
    if let Some(e) = decode_error {
        return Err(err(e));
    }
    if let (Some(path), Some(logits)) = (&args.logits_out, &res.first_prompt_logits) {
        let shape = [prompts[0].len(), model.config().vocab_size];
        npy::write_npy_f32(path, &shape, logits).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let (Some(tok), true) = (tokenizer, prompts.len() > 1) {
        for (i, (prompt, ids)) in prompts.iter().zip(&res.ids).enumerate() {
            let all: Vec<u32> = prompt.iter().chain(ids).copied().collect();
            writeln!(
                out,
                "text[{i}]: {}",
                tok.decode(&all, skip_special).map_err(err)?
            )
            .map_err(io)?;
        }
    }
    for (i, ids) in res.ids.iter().enumerate() {
        writeln!(out, "ids[{i}]: {}", join_ids(ids)).map_err(io)?;
    }
    for (i, stop) in res.stops.iter().enumerate() {
        writeln!(
            out,
            "stop[{i}]: {}",
            stop_reason(*stop, tokenizer, args.max_new_tokens)
        )
        .map_err(io)?;
    }
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    writeln!(
        out,
        "prefill: {} tokens in {:.3} s ({:.1} tokens/s); decode: {} tokens in {} steps, {:.3} s ({:.1} tokens/s); {} threads",
        res.prefill_tokens,
        res.prefill_secs,
        rate(res.prefill_tokens, res.prefill_secs),
        res.decode_tokens,
        res.decode_steps,
        res.decode_secs,
        rate(res.decode_tokens, res.decode_secs),
        ctx.threads(),
    )
    .map_err(io)
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

/// Why a sequence stopped, in words: the end-of-turn token (one the chat
/// template ends turns with) or end-of-sequence token it produced, or the
/// token budget.
fn stop_reason(stop: batch::Stop, tokenizer: Option<&Tokenizer>, max_new_tokens: usize) -> String {
    match stop {
        batch::Stop::StopToken(t) => {
            let name = tokenizer
                .and_then(|tok| tok.id_to_token(t))
                .map(|s| format!(" {s:?}"))
                .unwrap_or_default();
            let end_of_turn = tokenizer.is_some_and(|tok| tok.end_of_turn_ids().contains(&t));
            let kind = if end_of_turn {
                "end-of-turn"
            } else {
                "end-of-sequence"
            };
            format!("{kind} token {t}{name}")
        }
        batch::Stop::MaxTokens => format!("--max-new-tokens {max_new_tokens} reached"),
    }
}

/// `--chat`: one turn, or (`-`) a conversation read from `input`, one user
/// turn per line, with the KV cache kept between turns.
#[allow(clippy::too_many_arguments)]
fn run_chat(
    args: &Args,
    chat: &str,
    model: &Model,
    tok: &Tokenizer,
    ctx: &ExecContext,
    params: SamplingParams,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<(), String> {
    let io = |e: std::io::Error| format!("writing the output: {e}");
    let mut messages: Vec<ChatMessage> = args.system.iter().map(ChatMessage::system).collect();
    let interactive = chat == "-";
    let max_pos = model.config().max_position_embeddings;
    let capacity = match (interactive, args.context) {
        (_, Some(0)) => return Err("--context must be at least 1".to_string()),
        (_, Some(n)) => n,
        (true, None) => max_pos.min(4096),
        // One turn: the prompt and the reply, once the prompt's length is known.
        (false, None) => 0,
    };
    let mut session: Option<batch::ChatSession> = None;
    let mut line = String::new();
    let mut turns = 0;
    loop {
        let user = if interactive {
            line.clear();
            if input
                .read_line(&mut line)
                .map_err(|e| format!("reading stdin: {e}"))?
                == 0
            {
                break;
            }
            let text = line.trim_end_matches(['\n', '\r']);
            if text.trim().is_empty() {
                continue;
            }
            text.to_string()
        } else if turns == 0 {
            chat.to_string()
        } else {
            break;
        };
        messages.push(ChatMessage::user(user));
        let text = tok.apply_chat_template(&messages, true).map_err(err)?;
        // The template writes the special tokens itself (transformers encodes
        // its text with add_special_tokens=False).
        let prompt = tok.encode(&text, false).map_err(err)?;
        if session.is_none() {
            let cap = if capacity == 0 {
                (prompt.len() + args.max_new_tokens).min(max_pos)
            } else {
                capacity
            };
            session = Some(batch::ChatSession::new(model, ctx, cap, params.clone()).map_err(err)?);
        }
        let s = session.as_mut().expect("made above");
        let reply = chat_turn(args, tok, ctx, s, &prompt, out)?;
        messages.push(ChatMessage::assistant(reply));
        turns += 1;
    }
    if turns == 0 {
        writeln!(out, "no turn was read from stdin").map_err(io)?;
    }
    Ok(())
}

/// One reply: streamed as `assistant: ...`, then its ids, why it stopped and
/// the token counts. Returns the reply's text without special tokens (what the
/// next turn's rendering holds as the assistant's message).
fn chat_turn(
    args: &Args,
    tok: &Tokenizer,
    ctx: &ExecContext,
    session: &mut batch::ChatSession,
    prompt: &[u32],
    out: &mut dyn Write,
) -> Result<String, String> {
    let io = |e: std::io::Error| format!("writing the output: {e}");
    let mut stream =
        TextStream::start(tok, "assistant: ", &[], !args.show_special, out).map_err(err)?;
    let mut decode_error = None;
    let turn = session.turn(ctx, prompt, args.max_new_tokens, &mut |id| {
        if let Err(e) = stream.push(id) {
            decode_error.get_or_insert(e);
        }
    });
    stream.finish().map_err(err)?;
    let turn = turn.map_err(err)?;
    if let Some(e) = decode_error {
        return Err(err(e));
    }
    writeln!(out, "ids: {}", join_ids(&turn.ids)).map_err(io)?;
    writeln!(
        out,
        "stop: {}",
        stop_reason(turn.stop, Some(tok), args.max_new_tokens)
    )
    .map_err(io)?;
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let decoded = turn.ids.len().saturating_sub(1);
    writeln!(
        out,
        "prompt: {} tokens ({} reused from the cache, {} prefilled in {:.3} s, {:.1} tokens/s); reply: {} tokens ({decoded} decoded in {:.3} s, {:.1} tokens/s)",
        prompt.len(),
        turn.reused,
        turn.prefilled,
        turn.prefill_secs,
        rate(turn.prefilled, turn.prefill_secs),
        turn.ids.len(),
        turn.decode_secs,
        rate(decoded, turn.decode_secs),
    )
    .map_err(io)?;
    let body: &[u32] = match turn.stop {
        batch::Stop::StopToken(_) => &turn.ids[..turn.ids.len() - 1],
        batch::Stop::MaxTokens => &turn.ids,
    };
    tok.decode(body, true).map_err(err)
}

/// Prints one sequence's text as its ids arrive: a label, the prompt's text,
/// then each new piece of the decoded text, flushed. The whole sequence is decoded again
/// at each id (a tokenizer may merge a new id with the text before it), and
/// text is held back while it ends in an incomplete UTF-8 character.
struct TextStream<'a, 'o> {
    tok: &'a Tokenizer,
    label: &'static str,
    ids: Vec<u32>,
    printed: String,
    skip_special: bool,
    out: &'o mut dyn Write,
}

impl<'a, 'o> TextStream<'a, 'o> {
    fn start(
        tok: &'a Tokenizer,
        label: &'static str,
        prompt: &[u32],
        skip_special: bool,
        out: &'o mut dyn Write,
    ) -> Result<TextStream<'a, 'o>, LlmError> {
        let _ = write!(out, "{label}");
        let mut s = TextStream {
            tok,
            label,
            ids: prompt.to_vec(),
            printed: String::new(),
            skip_special,
            out,
        };
        s.flush_new()?;
        Ok(s)
    }

    fn push(&mut self, id: u32) -> Result<(), LlmError> {
        self.ids.push(id);
        self.flush_new()
    }

    /// Prints what the decoded text adds to what was printed.
    fn flush_new(&mut self) -> Result<(), LlmError> {
        let text = self.tok.decode(&self.ids, self.skip_special)?;
        if !text.ends_with('\u{FFFD}')
            && let Some(new) = text.strip_prefix(self.printed.as_str())
        {
            let _ = write!(self.out, "{new}");
            let _ = self.out.flush();
            self.printed = text;
        }
        Ok(())
    }

    /// Ends the line; if a later id changed text already printed, the whole
    /// text is printed again on a line of its own.
    fn finish(self) -> Result<(), LlmError> {
        let text = self.tok.decode(&self.ids, self.skip_special)?;
        let _ = match text.strip_prefix(self.printed.as_str()) {
            Some(rest) => writeln!(self.out, "{rest}"),
            None => writeln!(self.out, "\n{}{text}", self.label),
        };
        let _ = self.out.flush();
        Ok(())
    }
}

fn main() -> ExitCode {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    match run(Args::parse(), &mut stdin.lock(), &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[path = "common/generate_tests.rs"]
mod tests;
