//! A counting global allocator for the zero-allocation tests of fucina-thread,
//! fucina-exec and fucina-autograd (included with `#[path]`; each test binary
//! installs it with `#[global_allocator]`).
//!
//! The count is process-wide, so every counting test runs its body through
//! [`in_own_process`]: the test re-runs its own binary with `--exact` on
//! itself, and the child process runs that one test alone. Plain `cargo test`
//! (tests of one binary on parallel threads of one process) and nextest (one
//! process per test) then measure the same thing, and no other test's setup
//! can land inside a measurement.
//!
//! It counts the allocations of every thread except the process's first one.
//! That thread is libtest's main thread, which never runs a test but, under
//! load, may reach its first blocking channel receive (which allocates a waker
//! entry) only after a test has started measuring. Team workers and helper
//! threads are other threads, so they are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Forwards to the system allocator and counts allocations, zeroed allocations
/// and reallocations.
pub(crate) struct Counting;

/// Allocations counted so far.
pub(crate) static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations count: 0 not known yet, 1 no (the
    /// process's first thread), 2 yes.
    static KIND: Cell<u8> = const { Cell::new(0) };
}

/// Whether the calling thread's allocations are counted (never allocates).
fn counted() -> bool {
    KIND.try_with(|k| {
        if k.get() == 0 {
            #[cfg(target_os = "linux")]
            // SAFETY: `gettid` and `getpid` are plain system calls without
            // preconditions; the first thread's id is the process id.
            let first = unsafe { libc::gettid() == libc::getpid() };
            #[cfg(not(target_os = "linux"))]
            let first = false;
            k.set(if first { 1 } else { 2 });
        }
        k.get() == 2
    })
    // A thread being torn down: count it.
    .unwrap_or(true)
}

fn tally() {
    if counted() {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// The current count.
pub(crate) fn allocations() -> usize {
    ALLOCATIONS.load(Ordering::SeqCst)
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        tally();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        tally();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        tally();
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The counter is not vacuous: it sees an allocation on the calling thread and
/// on a spawned one (run by one test of each binary).
pub(crate) fn check_the_counter() {
    let before = allocations();
    drop(std::hint::black_box(vec![0u8; 64]));
    assert!(allocations() > before, "an allocation on the test's thread");
    std::thread::spawn(|| {
        let before = allocations();
        drop(std::hint::black_box(vec![0u8; 64]));
        assert!(allocations() > before, "an allocation on another thread");
    })
    .join()
    .unwrap();
}

/// The variable that tells a child process which test it runs alone.
const CHILD_VAR: &str = "FUCINA_COUNTING_TEST_CHILD";

/// How long a child may run before it is killed and the test fails.
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs `body` as the only test of a process: in the child process started
/// for `test` (the test's full name, as libtest prints it) it runs `body`;
/// anywhere else it re-runs this test binary on `test` alone and fails when
/// the child fails, hangs past a timeout, or did not run exactly one test (a
/// misspelled name must not pass silently).
pub(crate) fn in_own_process(test: &str, body: impl FnOnce()) {
    if std::env::var_os(CHILD_VAR).is_some_and(|v| v == test) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, test)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the test binary again");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let report = format!("--- child stdout ---\n{out}\n--- child stderr ---\n{err}");
    match status {
        None => panic!("`{test}` hung: killed after {CHILD_TIMEOUT:?}\n{report}"),
        Some(s) if !s.success() => panic!("`{test}` failed in its own process ({s})\n{report}"),
        Some(_) => assert!(
            out.contains("test result: ok. 1 passed"),
            "`{test}` did not run exactly one test in its own process\n{report}"
        ),
    }
}
