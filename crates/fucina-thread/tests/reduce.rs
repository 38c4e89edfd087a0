//! `Team::parallel_reduce` gives the same bits for 1, 2, 3 and 4 participants
//! (this binary raises the CPU count to 4 so the teams really have that many
//! participants, even on a smaller machine), while the chunk-per-participant
//! reduction of `chunk_ranges(.., team.participants())` does not.

use fucina_thread::{Team, TeamOptions, chunk_ranges, set_max_threads};

#[path = "support/data.rs"]
mod data_support;
use data_support::data;

fn teams() -> Vec<Team> {
    set_max_threads(4);
    (0..4)
        .map(|w| {
            let t = Team::new(TeamOptions { max_workers: w }).unwrap();
            assert_eq!(t.participants(), w + 1);
            t
        })
        .collect()
}

fn sum(team: &Team, xs: &[f32], block: usize) -> f32 {
    team.parallel_reduce(
        0,
        xs.len(),
        block,
        0.0f32,
        |r| xs[r].iter().sum(),
        |a, b| a + b,
    )
}

#[test]
fn reduction_bits_do_not_depend_on_the_team_size() {
    let teams = teams();
    for (n, block) in [(100_003, 512), (10_000, 1000), (4096, 4096), (5, 2), (1, 0)] {
        let xs = data(n);
        // The definition: blocks summed serially, combined left to right.
        let expected = (0..n.div_ceil(block.max(1)))
            .map(|k| {
                let lo = k * block.max(1);
                xs[lo..(lo + block.max(1)).min(n)].iter().sum::<f32>()
            })
            .fold(0.0f32, |a, b| a + b);
        for team in &teams {
            for _ in 0..3 {
                let got = sum(team, &xs, block);
                assert_eq!(
                    got.to_bits(),
                    expected.to_bits(),
                    "n {n} block {block} participants {}",
                    team.participants()
                );
            }
        }
    }
}

#[test]
fn the_per_participant_chunking_is_what_changes_the_bits() {
    // The reduction the front page used to show: one partial per chunk of
    // `chunk_ranges(0, n, 512, participants)`. Its bits follow the team size,
    // which is why `parallel_reduce` exists.
    let teams = teams();
    let xs = data(100_003);
    let by_chunks = |team: &Team| -> f32 {
        chunk_ranges(0, xs.len(), 512, team.participants())
            .map(|r| xs[r].iter().sum::<f32>())
            .sum()
    };
    let bits: Vec<u32> = teams.iter().map(|t| by_chunks(t).to_bits()).collect();
    assert!(bits.iter().any(|&b| b != bits[0]), "{bits:x?}");
    let reduced: Vec<u32> = teams.iter().map(|t| sum(t, &xs, 512).to_bits()).collect();
    assert!(reduced.iter().all(|&b| b == reduced[0]), "{reduced:x?}");
}

#[test]
fn an_empty_range_is_the_identity_and_combine_sees_block_order() {
    let teams = teams();
    for team in &teams {
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let r = team.parallel_reduce(
            7,
            7,
            4,
            42u64,
            |_| {
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                0
            },
            |a, b| a + b,
        );
        assert_eq!(r, 42);
        assert_eq!(calls.into_inner(), 0);
        // Non-commutative combine: the block starts, in order.
        let order = team.parallel_reduce(
            10,
            45,
            5,
            Vec::new(),
            |r| vec![r.start],
            |mut a, b| {
                a.extend(b);
                a
            },
        );
        assert_eq!(order, [10, 15, 20, 25, 30, 35, 40]);
    }
}

#[test]
fn a_panicking_block_reaches_the_caller_and_the_team_stays_usable() {
    let teams = teams();
    let team = &teams[3];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        team.parallel_reduce(
            0,
            100,
            10,
            0usize,
            |r| {
                assert!(r.start != 50, "block 5 fails");
                r.len()
            },
            |a, b| a + b,
        )
    }));
    assert!(r.is_err());
    assert_eq!(
        team.parallel_reduce(0, 100, 10, 0usize, |r| r.len(), |a, b| a + b),
        100
    );
}

#[test]
fn ranges_near_usize_max_are_covered_exactly() {
    const MAX: usize = usize::MAX;
    let blocks = |team: &Team, begin, end, block| {
        team.parallel_reduce(
            begin,
            end,
            block,
            Vec::new(),
            |r| vec![(r.start, r.end)],
            |mut a, b| {
                a.extend(b);
                a
            },
        )
    };
    for team in &teams() {
        // The last block used to end at `(lo + block).min(end)`, which
        // overflowed (wrapped in release, dropping the last element).
        assert_eq!(
            blocks(team, MAX - 10, MAX, 3),
            [
                (MAX - 10, MAX - 7),
                (MAX - 7, MAX - 4),
                (MAX - 4, MAX - 1),
                (MAX - 1, MAX)
            ]
        );
        assert_eq!(blocks(team, MAX - 1, MAX, MAX), [(MAX - 1, MAX)]);
        assert_eq!(blocks(team, 5, MAX, MAX), [(5, MAX)]);
        assert_eq!(blocks(team, 0, 10, MAX - 1), [(0, 10)]);
        assert_eq!(
            team.parallel_reduce(MAX - 1000, MAX, 7, 0usize, |r| r.len(), |a, b| a + b),
            1000
        );
    }
}
