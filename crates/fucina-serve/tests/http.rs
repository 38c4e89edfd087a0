//! The HTTP API through a real client on loopback: answers, streams, errors,
//! disconnects, overload.

mod support;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use fucina_llm::fucina::ExecContext;
use fucina_llm::{Sampler, SamplingParams, open_model};
use fucina_serve::engine::EngineOptions;
use support::{Server, fixture, send};

fn options() -> EngineOptions {
    EngineOptions {
        max_batch: 4,
        max_queue: 16,
        ..EngineOptions::default()
    }
}

/// The greedy ids of `prompt` computed with fucina-llm directly.
fn greedy_direct(prompt: &str, max_tokens: usize) -> (Vec<u32>, String) {
    let ctx = ExecContext::with_threads(1);
    let opened = open_model(fixture(), &ctx, None).unwrap();
    let tok = opened.tokenizer.as_ref().unwrap();
    let model = &opened.model;
    let ids = tok.encode(prompt, true).unwrap();
    let vocab = model.config().vocab_size;
    let mut cache = model.new_cache(&ctx, ids.len() + max_tokens).unwrap();
    let mut logits = vec![0.0; vocab];
    model
        .prefill(&ctx, &mut cache, &ids, None, &mut logits)
        .unwrap();
    let params = SamplingParams {
        stop_tokens: opened.stop_tokens.clone(),
        ..SamplingParams::default()
    };
    let mut sampler = Sampler::with_vocab(params, vocab).unwrap();
    let mut history = ids.clone();
    let mut out = Vec::new();
    loop {
        let t = sampler.sample(&logits, &history).unwrap();
        out.push(t);
        history.push(t);
        if sampler.is_stop(t) || out.len() == max_tokens {
            break;
        }
        model
            .decode(&ctx, &mut [&mut cache], &[t], &mut logits)
            .unwrap();
    }
    let text_ids: Vec<u32> = out
        .iter()
        .copied()
        .filter(|&t| !sampler.is_stop(t))
        .collect();
    let text = tok.decode(&text_ids, true).unwrap();
    (out, text)
}

#[test]
fn a_completion_is_what_the_model_generates_and_the_stream_says_the_same() {
    let server = Server::start(options(), 1 << 20);
    let (ids, text) = greedy_direct("hello world", 12);
    let r = server.post(
        "/v1/completions",
        r#"{"prompt": "hello world", "max_tokens": 12, "temperature": 0, "logprobs": 2}"#,
    );
    assert_eq!(r.status, 200);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["text"], text.as_str());
    assert_eq!(v["usage"]["completion_tokens"], ids.len());
    assert_eq!(v["object"], "text_completion");
    let lp = &choice["logprobs"];
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), ids.len());
    for top in lp["top_logprobs"].as_array().unwrap() {
        assert!(top.as_object().unwrap().len() <= 2);
    }
    let finish = if ids.len() == 12 { "length" } else { "stop" };
    assert_eq!(choice["finish_reason"], finish);

    // Streamed: the deltas add up to the same text, then [DONE].
    let s = server.post(
        "/v1/completions",
        r#"{"prompt": "hello world", "max_tokens": 12, "temperature": 0, "stream": true,
            "stream_options": {"include_usage": true}}"#,
    );
    assert_eq!(s.status, 200);
    assert!(
        s.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = s.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut streamed = String::new();
    for e in &events[..events.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        streamed.push_str(v["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(streamed, text);
    let last: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], finish);
    assert_eq!(last["usage"]["completion_tokens"], ids.len());

    // Token ids as the prompt, a model list, health.
    let r = server.post(
        "/v1/completions",
        r#"{"prompt": [0, 5, 9], "max_tokens": 2, "temperature": 0}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["prompt_tokens"], 3);
    assert_eq!(server.get("/v1/models").json()["data"][0]["id"], "fixture");
    assert_eq!(server.get("/health").json()["status"], "ok");
    server.wait_idle();
}

#[test]
fn bad_requests_get_openai_errors_naming_the_field() {
    let server = Server::start(options(), 4096);
    let long_prompt: Vec<u32> = vec![5; 300];
    let long = format!(r#"{{"prompt": {long_prompt:?}}}"#);
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/completions", "{not json".into(), 400, None),
        ("/v1/completions", "[1, 2]".into(), 400, None),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": "9"}"#.into(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": 0}"#.into(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "model": "gpt-9"}"#.into(),
            404,
            Some("model"),
        ),
        ("/v1/completions", long, 400, Some("prompt")),
        (
            "/v1/completions",
            r#"{"prompt": [999999]}"#.into(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "stop": ["a","b","c","d","e"]}"#.into(),
            400,
            Some("stop"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "temperature": -1}"#.into(),
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": 3}"#.into(),
            400,
            Some("messages"),
        ),
        ("/v1/nothing", "{}".into(), 404, None),
    ];
    for (path, body, status, param) in cases {
        let r = server.post(path, &body);
        assert_eq!(r.status, status, "{path} {body:.60}");
        let e = &r.json()["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body:.60}"
        );
        assert_eq!(e["param"].as_str(), param, "{body:.60}");
    }
    // A body over the limit: 413 without reading it.
    let big = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(5000));
    let r = server.post("/v1/completions", &big);
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    // The model's name is accepted; a huge max_tokens stops at the context.
    let r = server.post(
        "/v1/completions",
        r#"{"model": "fixture", "prompt": "hi", "max_tokens": 1000000000, "temperature": 0}"#,
    );
    assert_eq!(r.status, 200);
    let v = r.json();
    let used = v["usage"]["total_tokens"].as_u64().unwrap();
    assert!(used <= 256, "{used} positions in a context of 256");
    let m = server.get("/metrics");
    let text = String::from_utf8(m.body).unwrap();
    assert!(
        text.contains("fucina_requests_total{status=\"413\"} 1"),
        "{text}"
    );
    server.wait_idle();
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_sequence() {
    let server = Server::start(options(), 1 << 20);
    let mut stream = TcpStream::connect(server.addr).unwrap();
    let body =
        r#"{"prompt": "hello", "max_tokens": 240, "temperature": 0.9, "seed": 3, "stream": true}"#;
    send(&mut stream, "POST", "/v1/completions", body.as_bytes());
    let mut buf = [0u8; 256];
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let n = stream.read(&mut buf).unwrap();
    assert!(n > 0);
    drop(stream);
    // No stuck sequence, no cache left behind (whether the engine saw the
    // disconnect mid-generation or the sequence had already ended).
    server.wait_idle();
    // The server still answers.
    let r = server.post("/v1/completions", r#"{"prompt": "hi", "max_tokens": 2}"#);
    assert_eq!(r.status, 200);
}

#[test]
fn overload_gets_429_with_retry_after_and_the_server_returns_to_idle() {
    let server = Server::start(
        EngineOptions {
            max_batch: 2,
            max_queue: 8,
            ..EngineOptions::default()
        },
        1 << 20,
    );
    let addr = server.addr;
    let clients: Vec<_> = (0..64)
        .map(|i| {
            std::thread::spawn(move || {
                let body = format!(
                    r#"{{"prompt": "client {i}", "max_tokens": 24, "temperature": 0.7, "seed": {i}}}"#
                );
                support::request(addr, "POST", "/v1/completions", body.as_bytes())
            })
        })
        .collect();
    let replies: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let busy: Vec<_> = replies.iter().filter(|r| r.status == 429).collect();
    assert_eq!(ok + busy.len(), 64, "only 200 and 429 answers");
    assert!(ok >= 2, "{ok} answered");
    assert!(
        !busy.is_empty(),
        "64 clients against a queue of 8 and a batch of 2"
    );
    for r in busy {
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    }
    server.wait_idle();
}

#[test]
fn a_chat_turn_runs_through_the_models_template_and_streams_deltas() {
    let dir = support::chat_fixture("chat");
    let server = Server::start_for(dir.clone(), options(), 1 << 20);
    // The prompt the template renders, as ids: the chat answer is the
    // completion of exactly these ids.
    // from_file reads the tokenizer_config.json beside tokenizer.json.
    let tok = fucina_llm::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let messages = [
        fucina_llm::chat::ChatMessage::system("be brief"),
        fucina_llm::chat::ChatMessage::user("hello"),
    ];
    let text = tok.apply_chat_template(&messages, true).unwrap();
    let ids = tok.encode(&text, false).unwrap();
    let body = r#"{"messages": [{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "hello"}], "max_tokens": 10, "temperature": 0}"#;
    let r = server.post("/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    let message = &v["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    let plain = server.post(
        "/v1/completions",
        &format!(r#"{{"prompt": {ids:?}, "max_tokens": 10, "temperature": 0}}"#),
    );
    assert_eq!(message["content"], plain.json()["choices"][0]["text"]);

    // Streamed: the role first, then content deltas that add up to the same.
    let s = server.post(
        "/v1/chat/completions",
        &body.replace("\"temperature\": 0", "\"temperature\": 0, \"stream\": true"),
    );
    let events = s.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, message["content"].as_str().unwrap());

    // A model without a chat template: 400 naming `messages`.
    let bare = Server::start(options(), 1 << 20);
    let r = bare.post("/v1/chat/completions", body);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "messages");
    server.wait_idle();
    let _ = std::fs::remove_dir_all(dir);
}
