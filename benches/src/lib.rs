//! Home of the criterion benchmarks that span several fucina crates and of the
//! peer comparisons (see `benches/README.md`).
//!
//! Each crate keeps the benchmarks of its own hot paths in its own `benches/`
//! folder; this package holds only the ones that need more than one crate.
//! It has none yet: the first ones arrive with the execution layer.
#![forbid(unsafe_code)]
