//! Storage dtypes and the sealed mapping from Rust scalar types to them.

use std::fmt;

/// A storage dtype: what one element of a buffer is.
///
/// The variants follow the reference enum order (`bool, u8, u16, i8, i16, i32, i64,
/// f16, bf16, f32, f64, f8_e4m3, f8_e5m2`), and [`DType::tag`] is that position, so a
/// serialized tag stays stable. The enum is `#[non_exhaustive]`: block-quantized dtypes
/// (`q4_0` ... `nvfp4`, tags 13 and up) are a later addition. For them one element is
/// one *block* of [`DType::block_elems`] logical values and [`DType::size_of`] bytes;
/// the largest block is 292 bytes (`q8_k`), below the pool's 4096-byte slab quantum,
/// which is what keeps "slab bytes = a multiple of 4096" exact for every dtype.
///
/// The two 8-bit float formats are raw bytes: they have no Rust scalar type and are
/// stored in `Buffer<u8>`; the dtype tag carried beside the buffer says how to read them.
///
/// ```
/// use fucina_storage::DType;
///
/// assert_eq!(DType::BF16.size_of(), 2);
/// assert_eq!(DType::F32.name(), "f32");
/// assert_eq!(DType::from_tag(DType::I64.tag()), Some(DType::I64));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
#[repr(u8)]
pub enum DType {
    /// `bool`, one byte (0 or 1).
    Bool = 0,
    /// `u8`.
    U8 = 1,
    /// `u16`.
    U16 = 2,
    /// `i8`.
    I8 = 3,
    /// `i16`.
    I16 = 4,
    /// `i32`.
    I32 = 5,
    /// `i64`.
    I64 = 6,
    /// IEEE binary16 (`half::f16`).
    F16 = 7,
    /// bfloat16 (`half::bf16`).
    BF16 = 8,
    /// IEEE binary32 (`f32`), the default dtype.
    F32 = 9,
    /// IEEE binary64 (`f64`).
    F64 = 10,
    /// OCP FP8 E4M3FN as a raw byte (NaN, no infinities).
    F8E4M3 = 11,
    /// OCP FP8 E5M2 as a raw byte (has infinities).
    F8E5M2 = 12,
}

impl DType {
    /// Every dtype, in tag order.
    pub const ALL: [DType; 13] = [
        DType::Bool,
        DType::U8,
        DType::U16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Bytes per storage element (per block for block-quantized dtypes).
    pub const fn size_of(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Logical values per storage element: 1 for every scalar dtype (block-quantized
    /// dtypes will return their block size).
    pub const fn block_elems(self) -> usize {
        1
    }

    /// Whether the dtype is block-quantized (none are yet).
    pub const fn is_block_quantized(self) -> bool {
        false
    }

    /// Whether the dtype holds floating-point values (including the raw-byte FP8s).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3 | DType::F8E5M2
        )
    }

    /// The lower-case reference name (`"f32"`, `"bf16"`, `"f8_e4m3"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F8E4M3 => "f8_e4m3",
            DType::F8E5M2 => "f8_e5m2",
        }
    }

    /// The stable tag: the position in the reference enum order.
    pub const fn tag(self) -> u8 {
        self as u8
    }

    /// The dtype with this tag, if any.
    pub fn from_tag(tag: u8) -> Option<DType> {
        DType::ALL.get(usize::from(tag)).copied()
    }

    /// The dtype with this reference name, if any.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the element type of a storage dtype: `bool`, `u8`, `u16`, `i8`,
/// `i16`, `i32`, `i64`, `half::f16`, `half::bf16`, `f32`, `f64`.
///
/// Sealed: [`crate::Buffer`] relies on `DTYPE` being truthful (for example, the pool
/// routes exactly the `f32` type to its f32 arm).
///
/// ```
/// use fucina_storage::{DType, Scalar};
///
/// assert_eq!(<half::bf16 as Scalar>::DTYPE, DType::BF16);
/// assert_eq!(<i64 as Scalar>::DTYPE.size_of(), std::mem::size_of::<i64>());
/// ```
pub trait Scalar: sealed::Sealed + Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The dtype whose element this type is.
    const DTYPE: DType;
    /// The value whose bytes are all zero (`false` for `bool`).
    const ZERO: Self;
    /// Whether every bit pattern of `size_of::<Self>()` bytes is a valid value (false
    /// only for `bool`; recycled pool memory of such a type is zeroed before use).
    #[doc(hidden)]
    const ANY_BIT_PATTERN: bool;
}

macro_rules! scalar {
    ($($t:ty => $d:ident, $zero:expr, $any:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Scalar for $t {
            const DTYPE: DType = DType::$d;
            const ZERO: Self = $zero;
            const ANY_BIT_PATTERN: bool = $any;
        }
        const _: () = assert!(DType::$d.size_of() == std::mem::size_of::<$t>());
        const _: () = assert!(std::mem::align_of::<$t>() <= crate::ALIGNMENT);
    )*};
}

scalar! {
    bool => Bool, false, false;
    u8 => U8, 0, true;
    u16 => U16, 0, true;
    i8 => I8, 0, true;
    i16 => I16, 0, true;
    i32 => I32, 0, true;
    i64 => I64, 0, true;
    half::f16 => F16, half::f16::ZERO, true;
    half::bf16 => BF16, half::bf16::ZERO, true;
    f32 => F32, 0.0, true;
    f64 => F64, 0.0, true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_follow_reference_order() {
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        assert_eq!(
            names,
            [
                "bool", "u8", "u16", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64",
                "f8_e4m3", "f8_e5m2"
            ]
        );
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(usize::from(d.tag()), i);
            assert_eq!(DType::from_tag(d.tag()), Some(*d));
            assert_eq!(DType::from_name(d.name()), Some(*d));
            assert_eq!(d.to_string(), d.name());
            assert_eq!(d.block_elems(), 1);
            assert!(!d.is_block_quantized());
        }
        assert_eq!(DType::from_tag(13), None);
        assert_eq!(DType::from_name("q8_k"), None);
    }

    #[test]
    fn sizes_match_rust_types() {
        fn check<T: Scalar>() {
            assert_eq!(T::DTYPE.size_of(), std::mem::size_of::<T>(), "{}", T::DTYPE);
            // ZERO really is all-zero bytes.
            let z = T::ZERO;
            // SAFETY: reading the bytes of a plain scalar value.
            let bytes = unsafe {
                std::slice::from_raw_parts((&raw const z).cast::<u8>(), std::mem::size_of::<T>())
            };
            assert!(bytes.iter().all(|&b| b == 0));
        }
        check::<bool>();
        check::<u8>();
        check::<u16>();
        check::<i8>();
        check::<i16>();
        check::<i32>();
        check::<i64>();
        check::<half::f16>();
        check::<half::bf16>();
        check::<f32>();
        check::<f64>();
        assert_eq!(DType::F8E4M3.size_of(), 1);
        assert!(DType::F8E5M2.is_float() && !DType::I32.is_float());
    }
}
