//! A reduction written with `parallel_for` gives identical bits across runs at
//! a fixed thread count: chunk boundaries depend only on (range, grain,
//! threads), and each chunk's partial lands in its own slot, combined in order.

use fucina_thread::{Team, TeamOptions, chunk_ranges};
use std::sync::Mutex;

#[path = "support/data.rs"]
mod data_support;
use data_support::data;

fn reduce(team: &Team, xs: &[f32], grain: usize) -> f32 {
    let chunks = chunk_ranges(0, xs.len(), grain, team.participants());
    let partials: Vec<Mutex<f32>> = (0..chunks.len().max(1)).map(|_| Mutex::new(0.0)).collect();
    let size = chunks.chunk_size();
    team.parallel_for(0, xs.len(), grain, |r| {
        let s: f32 = xs[r.clone()].iter().sum();
        *partials[r.start / size].lock().unwrap() = s;
    });
    partials.iter().map(|p| *p.lock().unwrap()).sum()
}

#[test]
fn a_parallel_for_reduction_is_bitwise_stable_across_100_runs() {
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    let xs = data(100_003);
    let first = reduce(&team, &xs, 1000);
    // The value does not depend on scheduling: recompute serially with the
    // same chunk boundaries.
    let serial: f32 = chunk_ranges(0, xs.len(), 1000, team.participants())
        .map(|r| xs[r].iter().sum::<f32>())
        .sum();
    assert_eq!(first.to_bits(), serial.to_bits());
    for run in 0..100 {
        assert_eq!(
            reduce(&team, &xs, 1000).to_bits(),
            first.to_bits(),
            "run {run}"
        );
    }
    // And it is a real reduction (the order matters for this data).
    let naive: f32 = xs.iter().sum();
    assert!((naive - first).abs() <= 1e-2 * naive.abs().max(1.0));
}
