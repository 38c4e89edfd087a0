//! loom model of the chained Treiber stack (team/README.md, "chained").
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p fucina-thread --release --test loom_chained`
//!
//! One worker and the caller run a 3-task graph: seed 0 enqueues 1 and 2 after
//! writing their inputs. loom checks that every task runs once, that the
//! inputs are visible to the popping participant (release push / acquire pop),
//! and that the caller's final reads do not race the tasks.
#![cfg(loom)]

use fucina_thread::{Chain, Team, TeamOptions};

mod loom_support;
use loom_support::Cell;

use loom::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn chained_stack_hands_each_task_out_once_with_its_inputs() {
    loom::model(|| {
        let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
        let inputs = [Cell::new(0usize), Cell::new(0usize), Cell::new(0usize)];
        let runs = AtomicUsize::new(0);
        let mut tasks = [0usize, 1, 2];
        let ran = team.parallel_chained(&mut tasks, 1, |t: &mut usize, chain: &Chain| {
            runs.fetch_add(1, Ordering::Relaxed);
            let i = *t;
            if i == 0 {
                for (j, input) in inputs.iter().enumerate().skip(1) {
                    // Task j is not enqueued yet: this is its input's only writer.
                    input.set(10 + j);
                    chain.enqueue(j);
                }
            } else {
                // Written before the enqueue that made this task runnable.
                let v = inputs[i].get();
                assert_eq!(v, 10 + i);
            }
            *t = 100 + i;
        });
        assert!(ran);
        assert_eq!(runs.load(Ordering::Relaxed), 3);
        assert_eq!(tasks, [100, 101, 102]);
    });
}
