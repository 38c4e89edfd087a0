//! Shared fixtures of the panic-path tests (`#[path]`-included by the test
//! binaries that need them).

use std::time::Duration;

/// A panic payload whose `Drop` panics (armed until the test disarms it).
pub(crate) struct PanickyPayload {
    pub(crate) armed: bool,
}

impl Drop for PanickyPayload {
    fn drop(&mut self) {
        if self.armed {
            panic!("panic payload dropped");
        }
    }
}

/// Runs `f` on a fresh thread and fails the test if it does not finish in
/// `secs` (a participant that died mid-dispatch would hang the join).
pub(crate) fn within<R: Send + 'static>(secs: u64, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("the dispatch did not finish (a participant left it by unwinding?)")
}
