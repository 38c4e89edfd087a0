//! Intentionally empty: it exists so `Cargo.toml` can say
//! `links = "fucina_thread"`, which makes Cargo refuse to link two versions of
//! this crate into one program (as rayon-core does). The thread-count knobs
//! (`set_max_threads`, the cached CPU count) are process-global; two copies
//! would silently keep two different answers.

fn main() {}
