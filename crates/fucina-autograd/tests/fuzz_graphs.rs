//! The `autograd_graphs` fuzz target's generator over a fixed set of inputs,
//! so that every test run exercises it without cargo-fuzz: the committed seeds
//! of `fuzz/seeds/autograd_graphs/`, then pseudo-random programs from fixed
//! seeds (see `support/fuzz_graph.rs` for what is generated and checked).

#[path = "support/fuzz_graph.rs"]
mod fuzz_graph;

/// Pseudo-random programs run by [`random_programs_from_fixed_seeds`]: a few
/// seconds in a debug build.
const PROGRAMS: u64 = 1000;

/// The bytes of program `seed`: 16 to 271 bytes of the project's RNG stream.
fn program(seed: u64) -> Vec<u8> {
    let rng = |i: u64| fucina_autograd::exec::rng::at(seed, i);
    let len = 16 + (rng(0) % 256) as usize;
    (0..len as u64).map(|i| (rng(i + 1) >> 56) as u8).collect()
}

#[test]
fn the_committed_fuzz_seeds() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/autograd_graphs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seeds in {}", dir.display());
    for f in files {
        let data = std::fs::read(&f).unwrap();
        eprintln!("seed {}", f.display());
        let _ = fuzz_graph::check(&data);
    }
}

#[test]
fn random_programs_from_fixed_seeds() {
    let (mut ok, mut err, mut backward, mut finite) = (0, 0, 0, 0);
    for seed in 0..PROGRAMS {
        let data = program(seed);
        // Named on failure: replay with `program(seed)`.
        let t = match std::panic::catch_unwind(|| fuzz_graph::check(&data)) {
            Ok(t) => t,
            Err(p) => {
                eprintln!("program {seed} failed: {data:?}");
                std::panic::resume_unwind(p);
            }
        };
        for o in &t.ops {
            match o {
                fuzz_graph::Outcome::Ok(..) => ok += 1,
                fuzz_graph::Outcome::Err(_) => err += 1,
            }
        }
        backward += usize::from(t.backward.is_none() && t.grads.iter().any(Option::is_some));
        finite += usize::from(t.finite_checked);
    }
    eprintln!("{ok} ops Ok, {err} Err; {backward} backward passes; {finite} finite checks");
    // The programs are not vacuous: they build graphs, reject bad ops and
    // backpropagate, and the finite-gradient check applies to many of them.
    let all = ok + err;
    assert!(ok * 4 > all && err * 10 > all, "{ok} ops Ok, {err} Err");
    assert!(
        backward * 2 > PROGRAMS as usize,
        "{backward} backward passes"
    );
    assert!(
        finite * 10 > PROGRAMS as usize,
        "{finite} finite-gradient checks"
    );
}
