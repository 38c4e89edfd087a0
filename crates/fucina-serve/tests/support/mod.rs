//! A server on loopback for the tests, and a small blocking HTTP/1.1 client
//! (requests with `Connection: close`, chunked responses decoded).
#![allow(dead_code)] // not every test binary uses every helper

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fucina_serve::engine::{Engine, EngineOptions};
use fucina_serve::metrics::Metrics;
use fucina_serve::server::{AppState, serve};
use serde_json::Value;

/// The tiny Llama fixture of fucina-llm (tokenizer included).
pub(crate) fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fucina-llm/tests/fixtures/llama_f32")
}

/// A copy of the fixture with a ChatML-like chat template over its special
/// tokens (`<|bos|>` opens a turn, `<|eos|>` ends it), in a fresh temporary
/// directory named by `tag`.
pub(crate) fn chat_fixture(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fucina-serve-{tag}-{}", std::process::id()));
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

/// An engine over the fixture.
pub(crate) fn engine(options: EngineOptions) -> Engine {
    engine_for(fixture(), options)
}

/// An engine over the model at `path`.
pub(crate) fn engine_for(path: PathBuf, options: EngineOptions) -> Engine {
    Engine::start(options, Arc::new(Metrics::default()), move |ctx| {
        fucina_llm::open_model(&path, ctx, None)
    })
    .expect("the fixture loads")
}

/// A running server: its address and state; dropping it shuts it down.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    pub(crate) state: AppState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub(crate) fn start(options: EngineOptions, max_body: usize) -> Server {
        Server::start_for(fixture(), options, max_body)
    }

    pub(crate) fn start_for(path: PathBuf, options: EngineOptions, max_body: usize) -> Server {
        let state = AppState::new(engine_for(path, options), "fixture".into(), max_body);
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let served = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                serve(listener, served, async {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
            });
        });
        Server {
            addr: addr_rx.recv().unwrap(),
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub(crate) fn post(&self, path: &str, body: &str) -> Reply {
        request(self.addr, "POST", path, body.as_bytes())
    }

    pub(crate) fn get(&self, path: &str) -> Reply {
        request(self.addr, "GET", path, b"")
    }

    /// Waits (at most 20 s) until no sequence runs or waits.
    pub(crate) fn wait_idle(&self) {
        let m = self.state.metrics();
        let t = Instant::now();
        while m.running() != 0 || m.waiting() != 0 || m.cache_bytes() != 0 {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the server never returned to idle"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A response: status, headers (lower-case names) and the decoded body.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent-event body.
    pub(crate) fn events(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

/// Writes a request head and body on `stream`.
pub(crate) fn send(stream: &mut TcpStream, method: &str, path: &str, body: &[u8]) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
}

pub(crate) fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    send(&mut stream, method, path, body);
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    parse(&raw)
}

fn parse(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size =
            usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..start + size]);
        b = &b[start + size + 2..];
    }
}
