//! [`Element`]: the storage types a [`RawTensor`](crate::RawTensor) can hold.

use fucina_storage::Scalar;
use fucina_storage::half::{bf16, f16};

/// A storage element type of a tensor: a [`Scalar`] of `fucina-storage` with its
/// "one" and its conversions to and from `f32` (used by `ones_typed`, `cast` and
/// `cast_to_f32`).
///
/// Conversions follow Rust's `as` for integers (from `f32`: truncation toward zero,
/// saturating, NaN to 0), IEEE round-to-nearest-even for `f16`/`bf16`, and
/// `x != 0.0` for `bool` (`true` is 1.0).
pub trait Element: Scalar {
    /// The value 1 (`true` for `bool`).
    const ONE: Self;
    /// Converts to `f32`.
    fn to_f32(self) -> f32;
    /// Converts from `f32` (see the trait docs for the rounding rules).
    fn from_f32(v: f32) -> Self;
}

macro_rules! int_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const ONE: Self = 1;
            #[inline]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline]
            fn from_f32(v: f32) -> Self {
                v as $t
            }
        }
    )*};
}

int_element!(u8, u16, i8, i16, i32, i64);

impl Element for f32 {
    const ONE: Self = 1.0;
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Element for f64 {
    const ONE: Self = 1.0;
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        f64::from(v)
    }
}

impl Element for f16 {
    const ONE: Self = f16::ONE;
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Element for bf16 {
    const ONE: Self = bf16::ONE;
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Element for bool {
    const ONE: Self = true;
    #[inline]
    fn to_f32(self) -> f32 {
        if self { 1.0 } else { 0.0 }
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        v != 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(i64::from_f32(-2.7), -2);
        assert_eq!(u8::from_f32(300.0), 255);
        assert_eq!(i32::from_f32(f32::NAN), 0);
        assert_eq!(<f16 as Element>::from_f32(1.5).to_f32(), 1.5);
        assert_eq!(<bf16 as Element>::ONE.to_bits(), 0x3F80);
        assert!(bool::from_f32(-0.5));
        assert!(!bool::from_f32(0.0));
        assert_eq!(true.to_f32(), 1.0);
    }
}
