//! # fucina-exec (placeholder)
//!
//! **This crate is a placeholder: nothing is implemented yet.** It reserves the
//! name and the place in the crate graph. It will hold the execution layer of
//! fucina (see `ARCHITECTURE.md`):
//!
//! - `ExecContext` / `Runtime`: the per-context buffer pool, the lazily created
//!   worker team, the float-environment record and the exec-scope stack;
//! - `RawTensor`: a buffer plus an inline shape/strides header (max rank 8),
//!   layouts and views as refcounted aliases;
//! - the kernels (elementwise, reductions, softmax, norms, matmul, indexing,
//!   losses, dropout) with portable and per-architecture SIMD paths.
//!
//! It sits on `fucina-storage`, `fucina-thread`, `fucina-rng` and `fucina-fpenv`
//! and on nothing above them.
#![forbid(unsafe_code)]

/// Re-exported lower layers, so the dependency edges are real even while this
/// crate is a placeholder.
#[doc(hidden)]
pub mod deps {
    pub use fucina_fpenv as fpenv;
    pub use fucina_rng as rng;
    pub use fucina_storage as storage;
    pub use fucina_thread as thread;
}
