//! Holding a team busy (`#[path]`-included by the test binaries that need it).

use fucina_thread::Team;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Spins until `flag` is set (acquire), failing the test after 30 s.
fn wait_for(flag: &AtomicBool) {
    let t0 = Instant::now();
    while !flag.load(Ordering::Acquire) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "test handshake timed out"
        );
        thread::yield_now();
    }
}

/// Sets its flag (release) when dropped, so the holder is released even when the
/// body panics.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `body` on a second thread while a first thread holds a dispatch on `team`
/// open (its task 0 waits), so every call `body` makes on `team` finds it busy and
/// takes the serial fallback. The holder is released when `body` returns or panics;
/// a panic of `body` propagates.
pub(crate) fn while_team_busy(team: &Team, body: impl FnOnce() + Send) {
    team.warm_up().unwrap();
    let inside = AtomicBool::new(false);
    let done = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            team.parallel_chunks(&[0, 1], |&i| {
                if i == 0 {
                    inside.store(true, Ordering::Release);
                    wait_for(&done);
                }
            });
        });
        s.spawn(|| {
            let _release = SetOnDrop(&done);
            wait_for(&inside);
            body();
        });
    });
}
