//! The `generate` example's tests (`cargo test -p fucina-llm --example
//! generate`): its command line, and runs on the tiny fixture model with a chat
//! template added beside its tokenizer.

use std::path::{Path, PathBuf};

use clap::Parser;
use fucina_llm::fucina::ExecContext;
use fucina_llm::sample::SamplingParams;
use fucina_llm::{Tokenizer, open_model};

use super::{Args, batch, check_args, run, stop_reason};

fn parse(args: &[&str]) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("generate").chain(args.iter().copied()))
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_f32")
}

/// A copy of the fixture model with a `tokenizer_config.json` whose template
/// is ChatML-like over the fixture's special tokens (`<|bos|>` opens a turn,
/// the eos token `<|eos|>` ends it).
fn chat_model(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fucina-generate-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture()).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let template = "{% for m in messages %}{{ bos_token + m.role + '\\n' + m.content + eos_token + '\\n' }}{% endfor %}\
                    {% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}";
    let config = serde_json::json!({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

fn run_to_string(args: &[&str], stdin: &str) -> Result<String, String> {
    let mut out = Vec::new();
    run(
        parse(args).map_err(|e| e.to_string())?,
        &mut stdin.as_bytes(),
        &mut out,
    )?;
    Ok(String::from_utf8(out).unwrap())
}

#[test]
fn the_command_line() {
    // The flags that were there before parse as before.
    let a = parse(&[
        "--model",
        "m",
        "--prompt",
        "a;b",
        "--max-new-tokens",
        "4",
        "--seed",
        "3",
    ])
    .unwrap();
    assert_eq!(
        (a.prompt.as_deref(), a.max_new_tokens, a.seed),
        (Some("a;b"), 4, 3)
    );
    assert!(
        parse(&[
            "--model",
            "m",
            "--prompt-ids",
            "1,2;3",
            "--logits-out",
            "x.npy"
        ])
        .is_ok()
    );
    // Exactly one input: --prompt, --prompt-ids, --prompt-file or --chat.
    assert!(parse(&["--model", "m"]).is_err());
    for two in [
        ["--prompt", "--prompt-ids"],
        ["--prompt", "--chat"],
        ["--prompt-file", "--chat"],
        ["--prompt-ids", "--prompt-file"],
    ] {
        assert!(
            parse(&["--model", "m", two[0], "1", two[1], "2"]).is_err(),
            "{two:?}"
        );
    }
    let a = parse(&["--model", "m", "--prompt-file", "p.txt", "--show-special"]).unwrap();
    assert_eq!(a.prompt_file.as_deref(), Some(Path::new("p.txt")));
    assert!(a.show_special);
    let a = parse(&[
        "--model",
        "m",
        "--chat",
        "Hi",
        "--system",
        "Be brief.",
        "--context",
        "512",
    ])
    .unwrap();
    assert_eq!(
        (a.chat.as_deref(), a.system.as_deref(), a.context),
        (Some("Hi"), Some("Be brief."), Some(512))
    );
    assert_eq!(
        parse(&["--model", "m", "--chat", "-"])
            .unwrap()
            .chat
            .as_deref(),
        Some("-")
    );
    // --system and --context need --chat; --chat has no --logits-out.
    for extra in [["--system", "s"], ["--context", "9"]] {
        let a = parse(&["--model", "m", "--prompt", "x", extra[0], extra[1]]).unwrap();
        assert_eq!(
            check_args(&a).unwrap_err(),
            format!("{} needs --chat", extra[0])
        );
    }
    assert!(check_args(&parse(&["--model", "m", "--chat", "x", "--system", "s"]).unwrap()).is_ok());
    assert!(parse(&["--model", "m", "--chat", "x", "--logits-out", "l.npy"]).is_err());
}

#[test]
fn a_prompt_file_is_one_prompt_and_show_special_prints_special_tokens() {
    let dir = chat_model("file");
    let file = dir.join("prompt.txt");
    std::fs::write(&file, "The quick; brown fox").unwrap();
    let model = dir.to_str().unwrap();
    let out = run_to_string(
        &[
            "--model",
            model,
            "--prompt-file",
            file.to_str().unwrap(),
            "--max-new-tokens",
            "2",
        ],
        "",
    )
    .unwrap();
    assert!(out.starts_with("text[0]: The quick; brown fox"), "{out}");
    assert!(out.contains("ids[0]: ") && !out.contains("ids[1]"), "{out}");
    // The same text through --prompt is two prompts.
    let out = run_to_string(
        &[
            "--model",
            model,
            "--prompt",
            "The quick; brown fox",
            "--max-new-tokens",
            "2",
        ],
        "",
    )
    .unwrap();
    assert!(out.contains("ids[1]: "), "{out}");
    // The fixture tokenizer adds <|bos|>: printed only with --show-special.
    let plain = run_to_string(
        &[
            "--model",
            model,
            "--prompt",
            "The quick",
            "--max-new-tokens",
            "1",
        ],
        "",
    )
    .unwrap();
    let special = run_to_string(
        &[
            "--model",
            model,
            "--prompt",
            "The quick",
            "--max-new-tokens",
            "1",
            "--show-special",
        ],
        "",
    )
    .unwrap();
    assert!(plain.starts_with("text[0]: The quick"), "{plain}");
    assert!(
        special.starts_with("text[0]: <|bos|>The quick"),
        "{special}"
    );
    let missing = run_to_string(
        &["--model", model, "--prompt-file", "/nonexistent/prompt.txt"],
        "",
    )
    .unwrap_err();
    assert!(missing.contains("/nonexistent/prompt.txt"), "{missing}");
}

#[test]
fn one_chat_turn_and_a_conversation_from_stdin() {
    let dir = chat_model("chat");
    let model = dir.to_str().unwrap();
    let out = run_to_string(
        &[
            "--model",
            model,
            "--chat",
            "Hi",
            "--system",
            "Be brief.",
            "--max-new-tokens",
            "5",
        ],
        "",
    )
    .unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("assistant: "), "{out}");
    assert!(lines.iter().any(|l| l.starts_with("ids: ")), "{out}");
    let stop = lines
        .iter()
        .find(|l| l.starts_with("stop: "))
        .expect("a stop line");
    assert!(
        stop.contains("--max-new-tokens 5 reached") || stop.contains("end-of-turn token 1"),
        "{stop}"
    );
    // The prompt is the template's rendering, encoded without extra specials.
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let text = "<|bos|>system\nBe brief.<|eos|>\n<|bos|>user\nHi<|eos|>\n<|bos|>assistant\n";
    let n = tok.encode(text, false).unwrap().len();
    assert!(
        out.contains(&format!(
            "prompt: {n} tokens (0 reused from the cache, {n} prefilled"
        )),
        "{out}"
    );

    // Two turns from stdin (a blank line is skipped): two replies, the second
    // prompt longer than the first.
    let out = run_to_string(
        &["--model", model, "--chat", "-", "--max-new-tokens", "4"],
        "Hello\n\nAnd again?\n",
    )
    .unwrap();
    assert_eq!(out.matches("assistant: ").count(), 2, "{out}");
    assert_eq!(out.matches("\nstop: ").count(), 2, "{out}");
    let sizes: Vec<usize> = out
        .lines()
        .filter_map(|l| l.strip_prefix("prompt: ")?.split(' ').next()?.parse().ok())
        .collect();
    assert!(sizes.len() == 2 && sizes[1] > sizes[0], "{out}");
    assert!(
        run_to_string(&["--model", model, "--chat", "-"], "")
            .unwrap()
            .contains("no turn")
    );

    // A model without a chat template: an error saying so.
    let e = run_to_string(
        &["--model", fixture().to_str().unwrap(), "--chat", "Hi"],
        "",
    )
    .unwrap_err();
    assert!(e.contains("no chat template"), "{e}");
}

#[test]
fn a_chat_session_reuses_its_cache_with_the_same_ids() {
    let ctx = ExecContext::with_threads(1);
    let opened = open_model(chat_model("session"), &ctx, None).unwrap();
    let params = SamplingParams {
        seed: 5,
        temperature: 0.8,
        ..SamplingParams::default()
    };
    let mut s = batch::ChatSession::new(&opened.model, &ctx, 64, params.clone()).unwrap();
    let first: Vec<u32> = (10..20).collect();
    let t1 = s.turn(&ctx, &first, 6, &mut |_| {}).unwrap();
    assert_eq!((t1.reused, t1.prefilled, t1.ids.len()), (0, 10, 6));
    // The next prompt extends what the cache holds: only the new tokens are
    // prefilled, and the reply is what a fresh session (turn seed 5 + 1) gives.
    let mut second = s.cached().to_vec();
    second.extend([30, 31, 32]);
    let t2 = s.turn(&ctx, &second, 6, &mut |_| {}).unwrap();
    assert_eq!((t2.reused, t2.prefilled), (second.len() - 3, 3));
    let fresh_params = SamplingParams {
        seed: 6,
        ..params.clone()
    };
    let mut fresh = batch::ChatSession::new(&opened.model, &ctx, 64, fresh_params).unwrap();
    let f = fresh.turn(&ctx, &second, 6, &mut |_| {}).unwrap();
    assert_eq!((f.reused, f.prefilled), (0, second.len()));
    assert_eq!(t2.ids, f.ids);
    // A prompt that departs from the cache keeps the common prefix (here the
    // whole prompt but its last token, whose logits are needed), with the ids
    // a fresh session gives.
    let t3 = s.turn(&ctx, &first, 4, &mut |_| {}).unwrap();
    assert_eq!((t3.reused, t3.prefilled), (9, 1));
    let mut fresh = batch::ChatSession::new(
        &opened.model,
        &ctx,
        64,
        SamplingParams {
            seed: 7,
            ..params.clone()
        },
    )
    .unwrap();
    assert_eq!(
        fresh.turn(&ctx, &first, 4, &mut |_| {}).unwrap().ids,
        t3.ids
    );
    let mut branch = first[..5].to_vec();
    branch.extend([40, 41]);
    let t4 = s.turn(&ctx, &branch, 2, &mut |_| {}).unwrap();
    assert_eq!((t4.reused, t4.prefilled), (5, 2));
    // Too long for the cache: an error, and the next turn starts over.
    let long: Vec<u32> = vec![7; 60];
    let e = s
        .turn(&ctx, &long, 10, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("--context"), "{e}");
    assert!(s.cached().is_empty());
    // A stop token ends the reply, and is its last id.
    let stop_at = t1.ids[0];
    let mut p = params.clone();
    p.stop_tokens = vec![stop_at];
    let mut s = batch::ChatSession::new(&opened.model, &ctx, 64, p).unwrap();
    let t = s.turn(&ctx, &first, 6, &mut |_| {}).unwrap();
    assert_eq!(
        (t.ids.as_slice(), t.stop),
        (&[stop_at][..], batch::Stop::StopToken(stop_at))
    );
}

#[test]
fn stop_reasons_name_end_of_turn_tokens() {
    let dir = chat_model("stop");
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    assert_eq!(
        stop_reason(batch::Stop::StopToken(1), Some(&tok), 8),
        "end-of-turn token 1 \"<|eos|>\""
    );
    let plain = Tokenizer::from_file(fixture().join("tokenizer.json")).unwrap();
    assert_eq!(
        stop_reason(batch::Stop::StopToken(1), Some(&plain), 8),
        "end-of-sequence token 1 \"<|eos|>\""
    );
    assert_eq!(
        stop_reason(batch::Stop::MaxTokens, None, 8),
        "--max-new-tokens 8 reached"
    );
}

/// `--lora DIR` generates with the adapters merged: the first prompt's logits
/// are those of the trainable decoder with the adapters, and differ from the
/// base's; `--lora` with a GGUF file is refused.
#[test]
fn lora_adapters_apply_at_load() {
    use fucina_llm::finetune::{LoraConfig, Target, TrainableDecoder, peft};
    let ctx = ExecContext::new();
    let tmp = std::env::temp_dir().join(format!("fucina-generate-lora-{}", std::process::id()));
    let lora = LoraConfig {
        targets: Target::ALL.to_vec(),
        ..LoraConfig::default()
    };
    let model = TrainableDecoder::load(&ctx, fixture(), &lora).unwrap();
    for (_, p) in model.named_parameters() {
        let v: Vec<f32> = (0..p.numel())
            .map(|i| 0.1 * (i as f32 * 0.3).sin())
            .collect();
        p.copy_from_slice(&v).unwrap();
    }
    let adapter = tmp.join("adapter");
    peft::save_adapter(&model, &adapter, "llama_f32").unwrap();
    let ids = [0u32, 299, 223, 83, 87];
    let want = model.logits(&ctx, &ids, 1, ids.len()).unwrap().to_vec();
    let dir = fixture();
    let logits_of = |extra: &[&str]| {
        let out = tmp.join("logits.npy");
        let mut args = vec![
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "0,299,223,83,87",
            "--max-new-tokens",
            "1",
            "--logits-out",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        run_to_string(&args, "").unwrap();
        super::npy::read_npy_f32(&out).unwrap().1
    };
    let with = logits_of(&["--lora", adapter.to_str().unwrap()]);
    let base = logits_of(&[]);
    let diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    assert!(diff(&with, &want) <= 5e-5, "{}", diff(&with, &want));
    assert!(diff(&base, &want) > 1e-2);
    let e = run_to_string(
        &[
            "--model",
            "m.gguf",
            "--prompt-ids",
            "1",
            "--lora",
            adapter.to_str().unwrap(),
        ],
        "",
    )
    .unwrap_err();
    assert!(e.contains("model directory") || e.contains("m.gguf"), "{e}");
    std::fs::remove_dir_all(&tmp).unwrap();
}
