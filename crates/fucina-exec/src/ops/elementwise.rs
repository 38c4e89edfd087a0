//! Elementwise ops. PLACEHOLDER: only `scale` exists yet; the family is being written.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::tensor::RawTensor;

impl ExecContext {
    /// `x * s`.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn scale(&self, x: &RawTensor, s: f32) -> Result<RawTensor, ExecError> {
        let src = self.contiguous(x)?;
        let xs = src.contiguous_slice();
        self.new_tensor("scale", x.shape(), |out| {
            self.par_rows(out, 1, 1, |rows, o| {
                for (o, &v) in o.iter_mut().zip(&xs[rows]) {
                    *o = v * s;
                }
            });
        })
    }
}
