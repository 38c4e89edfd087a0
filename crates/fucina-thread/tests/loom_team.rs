//! loom model of the dispatch / park / join handshake (team/README.md).
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p fucina-thread --release --test loom_team`
//!
//! One worker (spin budget capped to one hint under loom, so it parks almost at
//! once), two dispatches and the shutdown; a model with a dynamic claim on top
//! of the static tasks; a closure moved into the job descriptor (the
//! generation line, which also holds `done`) and dropped after the join; a
//! panicking task; two dispatching threads. loom reports a lost wake-up as a
//! deadlock, and a join that returned before a participant left its task as a
//! data race on the task's result cell (or a wrong count).
#![cfg(loom)]

use fucina_thread::{Team, TeamOptions};

mod loom_support;
use loom_support::Cell;

use loom::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn dispatch_park_join_handshake() {
    loom::model(|| {
        let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
        assert_eq!(team.participants(), 2);
        for round in 0..2usize {
            let results = [Cell::new(0usize), Cell::new(0usize)];
            let runs = AtomicUsize::new(0);
            team.parallel_chunks(&[0usize, 1], |&i| {
                runs.fetch_add(1, Ordering::Relaxed);
                results[i].set(round + 1);
            });
            // The join happened-after every participant's task: these reads do
            // not race the writes (loom checks), and see them.
            for r in &results {
                assert_eq!(r.get(), round + 1);
            }
            assert_eq!(runs.load(Ordering::Relaxed), 2);
        }
        drop(team); // shutdown wakes and joins the (possibly parked) worker
    });
}

#[test]
fn static_and_dynamic_claims_run_each_task_once_across_dispatches() {
    // 3 tasks on 2 participants: tasks 0 and 1 are the static ones, task 2 is
    // claimed by whichever participant gets there first; the worker's entry
    // (its static task) races the caller's close and the caller's steal of
    // that task. Two rounds, so the second reuses the claim counter (reset at
    // its publish) and `done` is joined against a target that was not reset.
    loom::model(|| {
        let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
        for round in 0..2usize {
            let results = [Cell::new(0usize), Cell::new(0usize), Cell::new(0usize)];
            team.parallel_chunks(&[0usize, 1, 2], |&i| {
                // Each cell written once: a second run of a task would be a
                // data race (or a wrong value) that loom reports.
                results[i].set(results[i].get() + round + 1);
            });
            for r in &results {
                assert_eq!(r.get(), round + 1);
            }
        }
    });
}

#[test]
fn a_task_panic_still_joins_every_participant() {
    loom::model(|| {
        let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
        let result = Cell::new(0usize);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            team.parallel_chunks(&[0usize, 1], |&i| {
                if i == 0 {
                    panic!("task 0");
                }
                result.set(7);
            });
        }));
        assert!(r.is_err());
        assert_eq!(result.get(), 7);
    });
}

#[test]
fn two_dispatchers_share_one_team() {
    loom::model(|| {
        let team = loom::sync::Arc::new(Team::new(TeamOptions { max_workers: 1 }).unwrap());
        let other = {
            let team = loom::sync::Arc::clone(&team);
            loom::thread::spawn(move || {
                let runs = AtomicUsize::new(0);
                team.parallel_chunks(&[0usize, 1], |_| {
                    runs.fetch_add(1, Ordering::Relaxed);
                });
                assert_eq!(runs.load(Ordering::Relaxed), 2);
            })
        };
        let results = [Cell::new(0), Cell::new(0)];
        team.parallel_chunks(&[0usize, 1], |&i| results[i].set(1));
        assert_eq!(results[0].get() + results[1].get(), 2);
        other.join().unwrap();
    });
}

/// Owns the task results; its `Drop` (run by the dispatcher once the job is
/// taken back after the join) reads every cell.
struct CheckedResults(Box<[Cell; 2]>);

impl Drop for CheckedResults {
    fn drop(&mut self) {
        // loom fails the model if a participant's write is not ordered before
        // this read (a drop before the join).
        for c in self.0.iter() {
            assert_eq!(c.get(), 1);
        }
    }
}

/// Also the late worker: in some schedules the worker reads generation 1
/// only after dispatch 1 closed its seat (the caller ran both tasks),
/// returned and dropped the closure's state; it must then touch nothing of
/// job 1 and may enter job 2 only through job 2's seat. loom reports a read
/// of the descriptor or of a task's cell not ordered after the write that
/// made it, and the `CheckedResults` drop checks every task ran exactly once.
#[test]
fn a_closure_moved_into_the_job_is_dropped_after_the_join() {
    loom::model(|| {
        let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
        for _ in 0..2 {
            // The closure owns its state (one pointer: it fits the payload,
            // so it is moved into the descriptor and run there in place).
            let results = CheckedResults(Box::new([Cell::new(0), Cell::new(0)]));
            team.parallel_chunks(&[0usize, 1], move |&i| {
                let r = &results;
                r.0[i].set(r.0[i].get() + 1);
            });
        }
    });
}
