//! Teams created and dropped in a loop leak no threads (counted through
//! `/proc/self/task`, so this test has its own binary).

use fucina_thread::{Team, TeamOptions};
use std::sync::atomic::{AtomicUsize, Ordering};

fn thread_count() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/task").ok()?.count())
}

#[test]
fn teams_created_and_dropped_in_a_loop_leak_no_threads() {
    let before = thread_count();
    let iterations = if cfg!(miri) { 5 } else { 300 };
    let hits = AtomicUsize::new(0);
    for i in 0..iterations {
        let team = Team::new(TeamOptions {
            max_workers: 1 + i % 3,
        })
        .unwrap();
        if i % 4 != 3 {
            // Three of four teams start their workers; the fourth never does.
            team.parallel_chunks(&[1usize, 2, 3], |&v| {
                hits.fetch_add(v, Ordering::Relaxed);
            });
        }
        if i % 5 == 0 {
            // Let the workers park before the drop, to cover waking a parked team.
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    let started = (0..iterations).filter(|i| i % 4 != 3).count();
    assert_eq!(hits.load(Ordering::Relaxed), started * 6);
    if let (Some(b), Some(a)) = (before, thread_count()) {
        assert_eq!(a, b, "threads before {b}, after {a}");
    }
}
