//! Rounding f32 values to the nearest bf16 ([`ExecContext::round_bf16`],
//! [`round_to_bf16`]): the inputs of the autograd layer's bf16 autocast
//! products.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::tensor::RawTensor;

/// `x` rounded to the nearest bf16 value, ties to even, returned as the f32
/// that value is (its low 16 bits zero). A NaN stays a NaN (its upper half
/// with the quiet bit set), an infinity stays itself, a finite value past the
/// largest bf16 becomes an infinity of its sign, and subnormals round like
/// every other value (they are not flushed).
///
/// ```
/// use fucina_exec::round_to_bf16;
///
/// assert_eq!(round_to_bf16(1.0 + 2f32.powi(-8)), 1.0); // a tie: to even
/// assert_eq!(round_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
/// assert_eq!(round_to_bf16(-0.0).to_bits(), (-0.0f32).to_bits());
/// ```
#[inline(always)]
pub fn round_to_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    if x.is_nan() {
        return f32::from_bits((b | 0x0040_0000) & 0xffff_0000);
    }
    f32::from_bits(b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
}

impl ExecContext {
    /// Every element of `x` rounded to the nearest bf16 value
    /// ([`round_to_bf16`]), as a fresh contiguous f32 tensor of `x`'s shape.
    /// The same bits at every vector level and thread count (integer
    /// arithmetic on the bit patterns).
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_vec(&[2], vec![1.0 + 2f32.powi(-7), 3.0])?;
    /// assert_eq!(ctx.round_bf16(&x)?.to_vec(), [1.0 + 2f32.powi(-7), 3.0]);
    /// let x = ctx.from_vec(&[1], vec![1.0 + 2f32.powi(-9)])?;
    /// assert_eq!(ctx.round_bf16(&x)?.to_vec(), [1.0]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn round_bf16(&self, x: &RawTensor) -> Result<RawTensor, ExecError> {
        self.map1("round_bf16", x, 1, round_to_bf16)
    }
}
