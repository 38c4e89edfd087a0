//! # fucina-autograd (placeholder)
//!
//! **This crate is a placeholder: nothing is implemented yet.** It will hold the
//! autograd layer of fucina (see `ARCHITECTURE.md`): the differentiable `Tensor`
//! (a `RawTensor` plus optional gradient state), refcounted graph nodes numbered
//! in creation order, an iterative `backward` (no recursion), exec-scope
//! adoption of op results, `no_grad`, custom ops and a finite-difference
//! `gradcheck`.
//!
//! It is a layer over `fucina-exec` and depends on nothing else of the workspace.
#![forbid(unsafe_code)]

#[doc(hidden)]
pub use fucina_exec as exec;
