//! Random op sequences with autograd: the bytes are a program of leaf
//! variables and ops (elementwise, reductions, matmul, views, softmax, norms,
//! losses, indexing, ... with shapes and arguments often wrong on purpose),
//! then a backward. Asserts no panic (an `Err` is fine), a usable context and
//! graph after every `Err`, finite gradients where the forward is finite and
//! every op has bounded derivatives, and the same bits on a re-run.
//!
//! The generator and checks live in
//! `crates/fucina-autograd/tests/support/fuzz_graph.rs`, shared with the test
//! `crates/fucina-autograd/tests/fuzz_graphs.rs` that runs them over fixed
//! seeds on every `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/fucina-autograd/tests/support/fuzz_graph.rs"]
mod fuzz_graph;

fuzz_target!(|data: &[u8]| {
    let _ = fuzz_graph::check(data);
});
