//! The smallest loss whose gradient a test can predict: `sum(w * w)`, whose
//! backward adds `2 w` to `w`'s gradient. The autograd and facade tests (and
//! the optimizer unit tests) include this file with `#[path]` (it is no test
//! target of its own).
#![allow(dead_code, unreachable_pub)]

use fucina_autograd::Tensor;
use fucina_autograd::exec::ExecContext;

/// Runs backward over `sum(w * w)` (a fresh graph each call), panicking on any
/// error.
pub fn backward_sum_of_squares(ctx: &ExecContext, w: &Tensor) {
    w.mul(ctx, w)
        .unwrap()
        .sum_all(ctx)
        .unwrap()
        .backward(ctx)
        .unwrap();
}
