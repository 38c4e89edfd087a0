//! Chat templates against transformers: every template stored under
//! tests/chat_fixtures/ (NAME.jinja, with where it came from in NAME.json:
//! twelve real models' templates, and one synthetic template of the Jinja
//! features templates use) renders each stored conversation to exactly the
//! text transformers' `apply_chat_template(tokenize=False)` rendered
//! (scripts/make_chat_fixtures.py, with strftime_now's clock fixed), and fails
//! where it raised, with its message.

use std::fs;
use std::path::{Path, PathBuf};

use std::io::Write;

use fucina_llm::chat::{ChatMessage, ChatOptions, ChatTemplate};
use fucina_llm::gguf::GgufFile;
use fucina_llm::{LlmError, Tokenizer};
use serde_json::Value;

mod gguf_support;
mod gguf_vocab;
use gguf_vocab::{T_ARRAY, T_STRING, T_U32, gpt2_metadata, metadata_only, str_array, str_value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/chat_fixtures")
}

/// The names of the stored templates.
fn names() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(fixtures())
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "jinja")
                .then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    names
}

fn load(name: &str) -> (ChatTemplate, Value) {
    let dir = fixtures();
    let source = fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
    let meta: Value =
        serde_json::from_str(&fs::read_to_string(dir.join(format!("{name}.json"))).unwrap())
            .unwrap();
    let special = |k: &str| meta["special_tokens"][k].as_str().map(str::to_string);
    let t = ChatTemplate::new(name, source)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .with_special_tokens(special("bos_token"), special("eos_token"));
    (t, meta)
}

/// The case's messages as `ChatMessage`s when they hold only a role and a text.
fn plain_messages(messages: &Value) -> Option<Vec<ChatMessage>> {
    messages
        .as_array()?
        .iter()
        .map(|m| {
            let o = m.as_object()?;
            (o.len() == 2).then_some(())?;
            Some(ChatMessage::new(
                o.get("role")?.as_str()?,
                o.get("content")?.as_str()?,
            ))
        })
        .collect()
}

#[test]
fn every_stored_template_renders_as_transformers_does() {
    let names = names();
    assert!(names.len() >= 10, "templates found: {names:?}");
    let mut checked = 0;
    for name in &names {
        let (t, meta) = load(name);
        for case in meta["cases"].as_array().unwrap() {
            let label = format!("{name}/{}", case["label"].as_str().unwrap());
            let messages_json = case["messages_json"].as_str().unwrap();
            let add_gen = case["add_generation_prompt"].as_bool().unwrap();
            let options = ChatOptions {
                tools_json: case["tools_json"].as_str().map(str::to_string),
                variables_json: case["variables_json"].as_str().map(str::to_string),
                now_unix: case["now_unix"].as_i64(),
            };
            let got = t.apply_json(messages_json, add_gen, &options);
            // The plain-message entry point renders the same where it applies.
            let messages: Value = serde_json::from_str(messages_json).unwrap();
            if let Some(plain) = plain_messages(&messages) {
                let again = t.apply_with(&plain, add_gen, &options);
                assert_eq!(
                    format!("{got:?}"),
                    format!("{again:?}"),
                    "{label}: apply_with and apply_json differ"
                );
            }
            match (case.get("expected"), case.get("error")) {
                (Some(want), None) => {
                    let got = got.unwrap_or_else(|e| panic!("{label}: {e}"));
                    assert_eq!(got, want.as_str().unwrap(), "{label}");
                }
                (None, Some(msg)) => {
                    let err = got.expect_err(&label).to_string();
                    let msg = msg.as_str().unwrap();
                    assert!(err.contains(msg), "{label}: {err:?} lacks {msg:?}");
                    assert!(
                        err.contains(name),
                        "{label}: {err:?} does not name the template"
                    );
                }
                _ => panic!("{label}: a case has one of expected and error"),
            }
            checked += 1;
        }
    }
    assert!(checked >= 100, "{checked} cases");
}

#[test]
fn end_of_turn_markers_of_the_real_templates() {
    let want: &[(&str, &[&str])] = &[
        ("gemma2_it", &["<end_of_turn>"]),
        ("gemma3_it", &["<end_of_turn>"]),
        ("llama3_1_instruct", &["<|eot_id|>", "<|eom_id|>"]),
        ("llama3_2_instruct", &["<|eot_id|>"]),
        ("mistral_7b_instruct_v0_1", &["</s>"]),
        ("phi3_5_mini_instruct", &["<|end|>", "<|endoftext|>"]),
        ("qwen2_5_instruct", &["<|im_end|>"]),
        ("qwen3", &["<|im_end|>"]),
        ("smollm2_instruct", &["<|im_end|>"]),
        ("smollm3", &["<|im_end|>"]),
        ("tinyllama_chat", &["</s>"]),
    ];
    for (name, markers) in want {
        let (t, _) = load(name);
        assert_eq!(t.end_of_turn_markers(), *markers, "{name}");
    }
}

#[test]
fn errors_name_the_template_and_the_message() {
    let parse =
        ChatTemplate::new("broken.jinja", "{% for m in messages %}{{ m.content }}").unwrap_err();
    let text = parse.to_string();
    assert!(
        text.contains("broken.jinja") && text.contains("does not parse"),
        "{text}"
    );

    let raises =
        ChatTemplate::new("strict", "{{ raise_exception('no system role, please') }}").unwrap();
    let text = raises
        .apply(&[ChatMessage::user("hi")], true)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("strict") && text.contains("no system role, please"),
        "{text}"
    );

    let t = ChatTemplate::new("t", "{{ messages | length }}").unwrap();
    for (json, what) in [
        ("{", "not valid JSON"),
        ("{}", "not a JSON array"),
        ("[1]", "not a JSON array of objects"),
    ] {
        let e = t
            .apply_json(json, false, &ChatOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "{json}: {e}");
    }
    let bad_tools = ChatOptions {
        tools_json: Some("{}".into()),
        ..ChatOptions::default()
    };
    let e = t
        .apply(&[], false)
        .map(|_| ())
        .and(t.apply_with(&[], false, &bad_tools).map(|_| ()));
    assert!(matches!(e, Err(LlmError::InvalidRequest { .. })), "{e:?}");
}

#[test]
fn jinja_features_templates_use() {
    let render = |src: &str, vars: &str| {
        ChatTemplate::new("t", src)
            .unwrap()
            .apply_with(
                &[ChatMessage::system("S"), ChatMessage::user(" a b ")],
                true,
                &ChatOptions {
                    tools_json: None,
                    variables_json: Some(vars.to_string()),
                    now_unix: None,
                },
            )
            .unwrap()
    };
    // trim_blocks and lstrip_blocks, as transformers sets them.
    assert_eq!(render("  {% if true %}\nx\n  {% endif %}\ny", "{}"), "x\ny");
    // Loop controls, Python string methods, namespaces, negative slices.
    assert_eq!(
        render(
            "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.content.strip().split(' ')[-1] }}{% break %}{% endfor %}",
            "{}"
        ),
        "b"
    );
    assert_eq!(
        render(
            "{{ 'x'.upper() ~ messages[::-1][0].role ~ ' a'.lstrip() }}",
            "{}"
        ),
        "Xusera"
    );
    assert_eq!(
        render(
            "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
            "{}"
        ),
        "2"
    );
    // tojson as Python's json.dumps: key order kept, non-ASCII kept, indent.
    assert_eq!(
        render(
            "{{ v | tojson }}",
            r#"{"v": {"z": 1, "a": [1.0, 1e-05, "é\"<"], "n": null}}"#
        ),
        r#"{"z": 1, "a": [1.0, 1e-05, "é\"<"], "n": null}"#
    );
    assert_eq!(
        render(
            "{{ v | tojson(indent=2) }}",
            r#"{"v": {"b": [1], "a": {}}}"#
        ),
        "{\n  \"b\": [\n    1\n  ],\n  \"a\": {}\n}"
    );
    assert_eq!(
        render(
            "{{ v | tojson(sort_keys=true, separators=(',', ':')) }}",
            r#"{"v": {"b": 1, "a": 2}}"#
        ),
        r#"{"a":2,"b":1}"#
    );
    assert_eq!(
        render("{{ v | tojson(ensure_ascii=true) }}", r#"{"v": "é🎉"}"#),
        r#""\u00e9\ud83c\udf89""#
    );
    // Dict methods and key order.
    assert_eq!(
        render(
            "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.get('q', 'none') }}",
            r#"{"d": {"y": 1, "x": 2}}"#
        ),
        "y=1;x=2;none"
    );
    // strftime_now gives a date; undefined variables print nothing.
    let date = render("{{ strftime_now('%Y') }}{{ nothing }}", "{}");
    assert!(date.len() == 4 && date.starts_with("20"), "{date}");
    // Extra variables override the special tokens, as keyword arguments do.
    let t = ChatTemplate::new("t", "{{ bos_token }}|{{ eos_token }}")
        .unwrap()
        .with_special_tokens(Some("<s>".into()), Some("</s>".into()));
    assert_eq!(t.apply(&[], false).unwrap(), "<s>|</s>");
    let opts = ChatOptions {
        tools_json: None,
        variables_json: Some(r#"{"eos_token": "E"}"#.into()),
        now_unix: None,
    };
    assert_eq!(t.apply_with(&[], false, &opts).unwrap(), "<s>|E");
}

/// A directory with the llama fixture's tokenizer.json and the given extra files.
fn tokenizer_dir(tag: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fucina-chat-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_f32/tokenizer.json");
    fs::copy(src, dir.join("tokenizer.json")).unwrap();
    for (name, text) in files {
        fs::write(dir.join(name), text).unwrap();
    }
    dir
}

#[test]
fn tokenizer_reads_tokenizer_config_templates() {
    let source = fs::read_to_string(fixtures().join("tinyllama_chat.jinja")).unwrap();
    let config = serde_json::json!({"bos_token": {"content": "<|bos|>"}, "eos_token": "<|eos|>", "chat_template": source});
    let dir = tokenizer_dir("config", &[("tokenizer_config.json", &config.to_string())]);
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let t = tok.chat_template().expect("a default template");
    assert_eq!(
        (t.bos_token(), t.eos_token()),
        (Some("<|bos|>"), Some("<|eos|>"))
    );
    let text = tok
        .apply_chat_template(&[ChatMessage::user("Hi")], true)
        .unwrap();
    assert_eq!(text, "<|user|>\nHi<|eos|>\n<|assistant|>\n");
    // The eos token ends TinyLlama's turns; it is the fixture vocabulary's id 1.
    assert_eq!(tok.end_of_turn_ids(), vec![1]);

    // A list of named templates; chat_template.jinja overrides the default.
    let config = serde_json::json!({"eos_token": "</s>", "chat_template": [
        {"name": "default", "template": "D{{ eos_token }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"}]});
    let dir = tokenizer_dir("named", &[("tokenizer_config.json", &config.to_string())]);
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    assert_eq!(
        tok.chat_template_names().collect::<Vec<_>>(),
        ["default", "tool_use"]
    );
    assert_eq!(tok.apply_chat_template(&[], false).unwrap(), "D</s>");
    let opts = ChatOptions {
        tools_json: Some("[{}, {}]".into()),
        variables_json: None,
        now_unix: None,
    };
    assert_eq!(
        tok.chat_template_named("tool_use")
            .unwrap()
            .apply_with(&[], false, &opts)
            .unwrap(),
        "T2"
    );
    // With tools, the tool_use template is chosen, as transformers chooses it.
    assert_eq!(
        tok.apply_chat_template_with(&[], false, &opts).unwrap(),
        "T2"
    );
    assert_eq!(
        tok.apply_chat_template_with(&[], false, &ChatOptions::default())
            .unwrap(),
        "D</s>"
    );
    fs::write(dir.join("chat_template.jinja"), "J{{ eos_token }}").unwrap();
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    assert_eq!(tok.apply_chat_template(&[], false).unwrap(), "J</s>");

    // No template: an error saying so. Bad configs: errors naming the file.
    let dir = tokenizer_dir("none", &[]);
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    assert!(tok.chat_template().is_none() && tok.end_of_turn_ids().is_empty());
    let e = tok
        .apply_chat_template(&[ChatMessage::user("x")], true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no chat template"), "{e}");
    for (config, what) in [
        (r#"{"chat_template": 3}"#, "chat_template"),
        (r#"{"chat_template": [{"name": "x"}]}"#, "chat_template[0]"),
        (r#"{"eos_token": 1}"#, "eos_token"),
        (r#"{"chat_template": "{% if %}"}"#, "does not parse"),
        ("[", "not valid JSON"),
    ] {
        let dir = tokenizer_dir("bad", &[("tokenizer_config.json", config)]);
        let e = Tokenizer::from_file(dir.join("tokenizer.json"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tokenizer_config.json") && e.contains(what),
            "{config}: {e}"
        );
    }
}

#[test]
fn a_gguf_tokenizer_carries_its_chat_templates() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_f32");
    let source = fs::read_to_string(fixtures().join("tinyllama_chat.jinja")).unwrap();
    let write = |extra: Vec<(String, u32, Vec<u8>)>, tag: &str| {
        let mut meta = gpt2_metadata(&fixture);
        meta.retain(|(k, _, _)| {
            !k.starts_with("tokenizer.ggml.eos") && !k.starts_with("tokenizer.ggml.bos")
        });
        meta.push((
            "tokenizer.ggml.bos_token_id".into(),
            T_U32,
            0u32.to_le_bytes().to_vec(),
        ));
        meta.push((
            "tokenizer.ggml.eos_token_id".into(),
            T_U32,
            1u32.to_le_bytes().to_vec(),
        ));
        meta.extend(extra);
        let dir =
            std::env::temp_dir().join(format!("fucina-chat-gguf-{}-{tag}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tok.gguf");
        fs::File::create(&p)
            .unwrap()
            .write_all(&metadata_only(&meta))
            .unwrap();
        GgufFile::open(&p).unwrap()
    };
    let file = write(
        vec![
            (
                "tokenizer.chat_template".into(),
                T_STRING,
                str_value(&source),
            ),
            (
                "tokenizer.chat_templates".into(),
                T_ARRAY,
                str_array(&["tool_use".to_string()]),
            ),
            (
                "tokenizer.chat_template.tool_use".into(),
                T_STRING,
                str_value("{{ bos_token }}T"),
            ),
        ],
        "ok",
    );
    let tok = Tokenizer::from_gguf(&file).unwrap();
    // The bos and eos ids' spellings are the template's bos_token and eos_token.
    let text = tok
        .apply_chat_template(&[ChatMessage::user("Hi")], true)
        .unwrap();
    assert_eq!(text, "<|user|>\nHi<|eos|>\n<|assistant|>\n");
    assert_eq!(tok.end_of_turn_ids(), vec![1]);
    assert_eq!(
        tok.chat_template_named("tool_use")
            .unwrap()
            .apply(&[], false)
            .unwrap(),
        "<|bos|>T"
    );

    // Without the key: no template. A template that does not parse, or a key
    // of the wrong type: an error naming the file and the key.
    assert!(
        Tokenizer::from_gguf(&write(vec![], "none"))
            .unwrap()
            .chat_template()
            .is_none()
    );
    for (extra, what) in [
        (
            vec![(
                "tokenizer.chat_template".into(),
                T_STRING,
                str_value("{% for %}"),
            )],
            "tokenizer.chat_template",
        ),
        (
            vec![(
                "tokenizer.chat_template".into(),
                T_U32,
                7u32.to_le_bytes().to_vec(),
            )],
            "tokenizer.chat_template",
        ),
        (
            vec![("tokenizer.chat_templates".into(), T_STRING, str_value("x"))],
            "tokenizer.chat_templates",
        ),
    ] {
        let file = write(extra, "bad");
        let e = Tokenizer::from_gguf(&file).unwrap_err().to_string();
        assert!(e.contains("tok.gguf") && e.contains(what), "{e}");
    }
}
