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
        .args(["--port", "0", "--max-batch", "4"])
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
