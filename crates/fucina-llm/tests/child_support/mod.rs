//! Runs one test of the current test binary in a child process with a
//! timeout, so that a case which once aborted (an allocation failure) or hung (a
//! FIFO opened for reading) fails its test instead of killing or stalling the
//! whole test binary.

#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the child processes.
const CHILD: &str = "FUCINA_LLM_TEST_CHILD";

/// Whether this process is a child started by [`run_in_child`].
pub(crate) fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Runs the test `name` of this binary alone in a child process and asserts
/// that it passes within a minute: an abort, a panic or a hang fails the
/// caller, with the child's stderr.
pub(crate) fn run_in_child(name: &str) {
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child test process");
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
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    assert!(
        status.success(),
        "{name}: the child process failed ({status}):\n{stderr}"
    );
}

/// The body of a test that must run in a child process: in the parent, starts
/// the child running test `$name` and returns; in the child, goes on. (Declare
/// the module with `#[macro_use]`.)
macro_rules! in_child {
    ($name:literal) => {
        if !crate::child_support::is_child() {
            crate::child_support::run_in_child($name);
            return;
        }
    };
}
