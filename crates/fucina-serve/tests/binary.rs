//! The `fucina-serve` binary: it prints its address and a ready line, answers,
//! and exits cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

#[cfg(unix)]
#[test]
fn the_binary_serves_and_stops_cleanly_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fucina-serve"))
        .args(["--model"])
        .arg(support::fixture())
        .args(["--port", "0", "--max-batch", "4", "--prefix-cache-mib", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr: SocketAddr = first
        .strip_prefix("fucina-serve: listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .parse()
        .unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "fucina-serve: ready");
    let r = support::request(
        addr,
        "POST",
        "/v1/completions",
        br#"{"prompt": "hi", "max_tokens": 4, "temperature": 0}"#,
    );
    assert_eq!(r.status, 200);
    // The same 40-token prompt twice: the second copies its first two blocks
    // from the prefix cache, and answers the same.
    let ids: Vec<String> = (0..40).map(|i| (3 + i * 7 % 300).to_string()).collect();
    let body = format!(
        r#"{{"prompt": [{}], "max_tokens": 6, "temperature": 0, "logprobs": 2}}"#,
        ids.join(",")
    );
    let answer = |r: support::Reply| {
        let v = r.json();
        (
            v["choices"][0]["text"].clone(),
            v["choices"][0]["logprobs"].clone(),
        )
    };
    let cold = answer(support::request(
        addr,
        "POST",
        "/v1/completions",
        body.as_bytes(),
    ));
    let warm = answer(support::request(
        addr,
        "POST",
        "/v1/completions",
        body.as_bytes(),
    ));
    assert_eq!(cold, warm);
    let m = support::request(addr, "GET", "/metrics", b"");
    let text = String::from_utf8(m.body).unwrap();
    for line in [
        "fucina_prefix_cache_hits_total 1",
        "fucina_prefix_cache_hit_tokens_total 32",
        "fucina_prefix_cache_budget_bytes 1048576",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}: {text}");
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no exit 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
