//! Seeded fills of the random constructors, split into chunks by element index
//! (bitwise equal to the serial fill for every team size).

use fucina_exec::thread::{chunk_ranges, in_parallel_region};
use fucina_exec::{ExecContext, PARALLEL_THRESHOLD};

/// The splitmix64 increment: the counter form `at(seed, i)` of the stream is
/// `mix(seed + (i + 1) * GAMMA)`, so the stream from `seed + first * GAMMA`
/// continues the one from `seed` at element `first`.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The seed whose stream starts at element `first` of `seed`'s stream.
pub(crate) fn seed_at(seed: u64, first: u64) -> u64 {
    seed.wrapping_add(first.wrapping_mul(GAMMA))
}

/// Runs `fill(first, chunk)` over `out` in chunks (in parallel on the context's
/// team for large fills); `fill` must write element `first + j` of its mapping
/// at `chunk[j]`.
pub(crate) fn par_fill(ctx: &ExecContext, out: &mut [f32], fill: impl Fn(u64, &mut [f32]) + Sync) {
    let n = out.len();
    let team = if ctx.threads() > 1 && n >= PARALLEL_THRESHOLD && !in_parallel_region() {
        ctx.team()
    } else {
        None
    };
    let Some(team) = team else {
        fill(0, out);
        return;
    };
    let mut pieces: Vec<(u64, &mut [f32])> = Vec::new();
    let mut rest = out;
    for r in chunk_ranges(0, n, PARALLEL_THRESHOLD / 4, ctx.threads()) {
        let (head, tail) = rest.split_at_mut(r.end - r.start);
        pieces.push((r.start as u64, head));
        rest = tail;
    }
    team.parallel_chunks_mut(&mut pieces, |(first, chunk)| fill(*first, chunk));
}
