//! The differentiable op surface: each op runs the exec layer's forward kernel,
//! then records a VJP built from the exec layer's backward kernels.

pub(crate) mod attention;
pub(crate) mod batch_norm;
pub(crate) mod conv;
pub(crate) mod conv_transpose;
pub(crate) mod einsum;
pub(crate) mod elementwise;
pub(crate) mod group_norm;
pub(crate) mod index;
pub(crate) mod matmul;
pub(crate) mod nn;
pub(crate) mod pool;
pub(crate) mod recurrent;
pub(crate) mod reduce;
pub(crate) mod resize;
pub(crate) mod scan;
pub(crate) mod view;

use fucina_exec::{ExecContext, RawTensor};

use crate::error::Result;

/// Reduces a gradient of a broadcast shape back to an operand's `shape` (summing
/// over the broadcast axes), or returns it as is when the shapes are equal.
pub(crate) fn sum_to(ctx: &ExecContext, g: &RawTensor, shape: &[usize]) -> Result<RawTensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    Ok(ctx.sum_to(g, shape)?)
}
