//! # fucina
//!
//! An eager CPU tensor runtime with autograd, built for speed close to the
//! hardware limit, bitwise determinism and predictable memory behaviour.
//!
//! This facade re-exports the layers below it. The tensor, autograd, `nn`,
//! optimizer and checkpoint APIs are **not implemented yet** (the `exec` and
//! `autograd` layers are placeholders); what works today is the substrate:
//!
//! | module | crate | what it holds |
//! | --- | --- | --- |
//! | [`rng`] | `fucina-rng` | the deterministic splitmix64 checkpoint RNG |
//! | [`fpenv`] | `fucina-fpenv` | IEEE floating-point environment control |
//! | [`storage`] | `fucina-storage` | aligned, counted, refcounted, pooled memory |
//! | [`thread`] | `fucina-thread` | the fork-join worker team |
//! | [`exec`] | `fucina-exec` | execution context and kernels (placeholder) |
//! | [`autograd`] | `fucina-autograd` | differentiable tensors (placeholder) |
#![forbid(unsafe_code)]

pub mod checkpoint;

pub use fucina_autograd as autograd;
pub use fucina_exec as exec;
pub use fucina_fpenv as fpenv;
pub use fucina_rng as rng;
pub use fucina_storage as storage;
pub use fucina_thread as thread;
