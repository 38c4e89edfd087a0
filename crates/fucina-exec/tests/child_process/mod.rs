//! Runs one test of the current test binary in a child process with a
//! timeout, so that a case which once aborted (an allocation failure) or hung (a
//! FIFO opened for reading) fails its test instead of killing or stalling the
//! whole test binary. Shared by the test binaries of several crates (the others
//! include this file with `#[path]`).

#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the child processes.
const CHILD: &str = "FUCINA_TEST_CHILD";

/// Whether this process is a child started by [`run_in_child`].
pub(crate) fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Runs the test `name` of this binary alone in a child process and asserts
/// that it passes within a minute (an abort, a panic or a hang fails the
/// caller, with the child's output) and that it ran (a misspelt name would run
/// no test). Returns what the child wrote to stderr.
pub(crate) fn run_in_child(name: &str) -> String {
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child test process");
    // Read both pipes while waiting, so a child that writes much never blocks.
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let stdout = std::thread::spawn(move || read_all(out.as_mut()));
    let stderr = std::thread::spawn(move || read_all(err.as_mut()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name}: the child process hung (killed after 60 s)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(
        status.success() && stdout.contains("1 passed"),
        "{name}: the child process failed or ran no test ({status}):\n{stdout}\n{stderr}"
    );
    stderr
}

fn read_all(pipe: Option<&mut impl std::io::Read>) -> String {
    let mut text = String::new();
    if let Some(p) = pipe {
        let _ = p.read_to_string(&mut text);
    }
    text
}

/// The body of a test that must run in a child process: in the parent, starts
/// the child running test `$name` and returns; in the child, goes on. (Declare
/// the module with `#[macro_use]`.)
#[allow(unused_macros)] // not every including test binary uses it
macro_rules! in_child {
    ($name:literal) => {
        if !crate::child_process::is_child() {
            crate::child_process::run_in_child($name);
            return;
        }
    };
}
