//! The formats a model file's tensors come in: [`TensorFormat`] and its one
//! table (ggml type code, lower-case name, display name, and what the runtime
//! keeps it as: a float [`WeightFormat`] or a block [`QuantFormat`]), and
//! [`QuantFormat`], whose variants are the block formats of
//! `kernels::quant_block` (one type per format; `with_block_format!` is the one
//! place that maps a variant to its type).
//!
//! Adding a block format is one file in `kernels/quant_block/`, a
//! [`QuantFormat`] and a [`TensorFormat`] variant, a row of [`FORMATS`] and an
//! arm of `with_block_format!`.

use std::fmt;

use crate::error::ExecError;
use crate::tensor::layout::Dims;
use crate::weight_format::WeightFormat;

/// Runs `$body` with `$F` the `kernels::quant_block` type of the
/// [`QuantFormat`] `$format` (a `BlockFormat`).
macro_rules! with_block_format {
    ($format:expr, $F:ident => $body:expr) => {{
        use $crate::kernels::quant_block as qb;
        match $format {
            $crate::ops::quant_format::QuantFormat::Q8_0 => {
                type $F = qb::Q8_0;
                $body
            }
            $crate::ops::quant_format::QuantFormat::Q4_0 => {
                type $F = qb::Q4_0;
                $body
            }
            $crate::ops::quant_format::QuantFormat::Q4_1 => {
                type $F = qb::Q4_1;
                $body
            }
            $crate::ops::quant_format::QuantFormat::Q5_0 => {
                type $F = qb::Q5_0;
                $body
            }
            $crate::ops::quant_format::QuantFormat::Q5_1 => {
                type $F = qb::Q5_1;
                $body
            }
            $crate::ops::quant_format::QuantFormat::Q2_K => {
                type $F = qb::Q2_K;
                $body
            }
            $crate::ops::quant_format::QuantFormat::Q3_K => {
                type $F = qb::Q3_K;
                $body
            }
            $crate::ops::quant_format::QuantFormat::Q4_K => {
                type $F = qb::Q4_K;
                $body
            }
            $crate::ops::quant_format::QuantFormat::Q5_K => {
                type $F = qb::Q5_K;
                $body
            }
            $crate::ops::quant_format::QuantFormat::Q6_K => {
                type $F = qb::Q6_K;
                $body
            }
            $crate::ops::quant_format::QuantFormat::IQ4_NL => {
                type $F = qb::IQ4_NL;
                $body
            }
            $crate::ops::quant_format::QuantFormat::IQ4_XS => {
                type $F = qb::IQ4_XS;
                $body
            }
        }
    }};
}
pub(crate) use with_block_format;

/// A block-quantized weight format (llama.cpp's layouts; see
/// `docs/QUANTIZATION.md`). The variants are spelled as llama.cpp spells its
/// types.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// 32 int8 values and an f16 scale per block (34 bytes).
    Q8_0,
    /// 32 4-bit values and an f16 scale per block (18 bytes).
    Q4_0,
    /// 32 4-bit values, an f16 scale and an f16 min per block (20 bytes).
    Q4_1,
    /// 32 5-bit values and an f16 scale per block (22 bytes).
    Q5_0,
    /// 32 5-bit values, an f16 scale and an f16 min per block (24 bytes).
    Q5_1,
    /// Super-blocks of 256: 2-bit values with a 4-bit scale and a 4-bit min
    /// per 16, under an f16 scale and an f16 min scale (84 bytes, 2.625 bits
    /// per weight).
    Q2_K,
    /// Super-blocks of 256: 3-bit values with a 6-bit scale per 16 under an
    /// f16 scale (110 bytes, 3.4375 bits per weight).
    Q3_K,
    /// Super-blocks of 256: eight sub-blocks of 32 4-bit values, each with a
    /// 6-bit scale and a 6-bit min, under an f16 scale and an f16 min scale
    /// (144 bytes, 4.5 bits per weight).
    Q4_K,
    /// Super-blocks of 256: Q4_K's scales and mins over 5-bit values (176
    /// bytes, 5.5 bits per weight).
    Q5_K,
    /// Super-blocks of 256: 6-bit values, an int8 scale per 16 values, an f16
    /// scale (210 bytes, 6.5625 bits per weight).
    Q6_K,
    /// 32 4-bit indices into a fixed non-linear table and an f16 scale per
    /// block (18 bytes, 4.5 bits per weight).
    IQ4_NL,
    /// Super-blocks of 256: IQ4_NL's indices with a 6-bit scale per sub-block
    /// of 32 under an f16 scale (136 bytes, 4.25 bits per weight).
    IQ4_XS,
}

impl QuantFormat {
    /// Every format, in declaration order.
    pub const ALL: [QuantFormat; 12] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q2_K,
        QuantFormat::Q3_K,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
        QuantFormat::IQ4_NL,
        QuantFormat::IQ4_XS,
    ];

    /// Elements per block: 32 for the legacy formats (Q8_0, Q4_0, Q4_1, Q5_0,
    /// Q5_1) and IQ4_NL, 256 (a super-block) for the K formats and IQ4_XS. A matrix's column count
    /// must be a multiple of it.
    pub const fn block_elements(self) -> usize {
        use crate::kernels::quant_block::BlockFormat;
        with_block_format!(self, F => F::ELEMS)
    }

    /// Bytes per block: 34 for Q8_0, 18 for Q4_0 and IQ4_NL, 20 for Q4_1, 22
    /// for Q5_0, 24 for Q5_1, 84 for Q2_K, 110 for Q3_K, 144 for Q4_K, 176
    /// for Q5_K, 210 for Q6_K, 136 for IQ4_XS.
    pub const fn block_bytes(self) -> usize {
        use crate::kernels::quant_block::BlockFormat;
        with_block_format!(self, F => F::BYTES)
    }

    /// The format's name as llama.cpp spells it, lower-case (`"q8_0"`,
    /// `"q4_k"`).
    pub fn name(self) -> &'static str {
        TensorFormat::from(self).name()
    }

    /// Whether [`ExecContext::repack_quant`](crate::ExecContext::repack_quant)
    /// accepts the format: the blocks of 32 (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1,
    /// IQ4_NL) are repacked, the super-block formats are read in place only.
    pub const fn repackable(self) -> bool {
        matches!(
            self,
            QuantFormat::Q8_0
                | QuantFormat::Q4_0
                | QuantFormat::Q5_0
                | QuantFormat::Q4_1
                | QuantFormat::Q5_1
                | QuantFormat::IQ4_NL
        )
    }

    /// Whether [`ExecContext::repack_quant`](crate::ExecContext::repack_quant)
    /// accepts a matrix of the format with `rows` rows: every
    /// [`repackable`](Self::repackable) format (the blocks of 32), and Q4_K
    /// when `rows` is a multiple of 8 (its strips of eight rows, see
    /// [`PackedQuantMatrix`](crate::PackedQuantMatrix)); the others are read
    /// in place only.
    pub const fn repackable_rows(self, rows: usize) -> bool {
        self.repackable() || (matches!(self, QuantFormat::Q4_K) && rows.is_multiple_of(8))
    }

    /// The offset of the activations' lane biases the format's kernels need
    /// (`BlockFormat::ACT_OFFSET`).
    pub(crate) fn act_offset(self) -> i32 {
        use crate::kernels::quant_block::BlockFormat;
        with_block_format!(self, F => F::ACT_OFFSET)
    }

    /// Whether the format's dot product needs the activation block sums
    /// (`BlockFormat::NEEDS_SUMS`).
    pub(crate) fn needs_sums(self) -> bool {
        use crate::kernels::quant_block::BlockFormat;
        with_block_format!(self, F => F::NEEDS_SUMS)
    }

    /// The bytes of a `[rows, cols]` matrix in this format.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `cols` is not a multiple of
    /// [`block_elements`](Self::block_elements), [`ExecError::Overflow`] if the
    /// size does not fit in `usize`.
    pub fn matrix_bytes(
        self,
        op: &'static str,
        rows: usize,
        cols: usize,
    ) -> Result<usize, ExecError> {
        if !cols.is_multiple_of(self.block_elements()) {
            return Err(ExecError::InvalidArgument {
                op,
                reason: if self.block_elements() == 32 {
                    "the column count of a quantized matrix must be a multiple of 32 (the block size)"
                } else {
                    "the column count of a super-block (k) quantized matrix must be a multiple of 256 (the super-block size)"
                },
            });
        }
        (cols / self.block_elements())
            .checked_mul(self.block_bytes())
            .and_then(|b| b.checked_mul(rows))
            .ok_or(ExecError::Overflow {
                op,
                shape: Dims::new(&[rows, cols]),
            })
    }
}

/// The element format of a model file's tensor: a float format or a block
/// format, each with its ggml type code and its names ([`FORMATS`]). The
/// variants are spelled as llama.cpp spells its types.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorFormat {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// [`QuantFormat::Q8_0`] (8.5 bits per weight).
    Q8_0,
    /// [`QuantFormat::Q4_0`] (4.5 bits per weight).
    Q4_0,
    /// [`QuantFormat::Q4_1`] (5 bits per weight).
    Q4_1,
    /// [`QuantFormat::Q5_0`] (5.5 bits per weight).
    Q5_0,
    /// [`QuantFormat::Q5_1`] (6 bits per weight).
    Q5_1,
    /// [`QuantFormat::Q2_K`] (2.625 bits per weight).
    Q2_K,
    /// [`QuantFormat::Q3_K`] (3.4375 bits per weight).
    Q3_K,
    /// [`QuantFormat::Q4_K`] (4.5 bits per weight).
    Q4_K,
    /// [`QuantFormat::Q5_K`] (5.5 bits per weight).
    Q5_K,
    /// [`QuantFormat::Q6_K`] (6.5625 bits per weight).
    Q6_K,
    /// [`QuantFormat::IQ4_NL`] (4.5 bits per weight).
    IQ4_NL,
    /// [`QuantFormat::IQ4_XS`] (4.25 bits per weight).
    IQ4_XS,
}

/// How the runtime keeps a tensor of a [`TensorFormat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    /// As a float matrix ([`WeightFormat`]).
    Float(WeightFormat),
    /// As blocks ([`QuantFormat`]).
    Quant(QuantFormat),
}

/// One row of [`FORMATS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatRow {
    /// The format.
    pub format: TensorFormat,
    /// ggml's type code (a GGUF tensor's type field).
    pub ggml_code: u32,
    /// The lower-case name (`"q4_k"`): ggml's name, `--dtype`'s spelling.
    pub name: &'static str,
    /// The name to show (`"Q4_K"`), as llama.cpp's tools print it.
    pub display: &'static str,
    /// How the runtime keeps a tensor of this format.
    pub storage: Storage,
}

/// Every format: the one table of ggml codes and names.
pub const FORMATS: [FormatRow; 15] = {
    use QuantFormat as Q;
    use TensorFormat as T;
    use WeightFormat as W;
    const fn row(
        format: TensorFormat,
        ggml_code: u32,
        name: &'static str,
        display: &'static str,
        storage: Storage,
    ) -> FormatRow {
        FormatRow {
            format,
            ggml_code,
            name,
            display,
            storage,
        }
    }
    [
        row(T::F32, 0, "f32", "F32", Storage::Float(W::F32)),
        row(T::F16, 1, "f16", "F16", Storage::Float(W::F16)),
        row(T::BF16, 30, "bf16", "BF16", Storage::Float(W::BF16)),
        row(T::Q8_0, 8, "q8_0", "Q8_0", Storage::Quant(Q::Q8_0)),
        row(T::Q4_0, 2, "q4_0", "Q4_0", Storage::Quant(Q::Q4_0)),
        row(T::Q4_1, 3, "q4_1", "Q4_1", Storage::Quant(Q::Q4_1)),
        row(T::Q5_0, 6, "q5_0", "Q5_0", Storage::Quant(Q::Q5_0)),
        row(T::Q5_1, 7, "q5_1", "Q5_1", Storage::Quant(Q::Q5_1)),
        row(T::Q2_K, 10, "q2_k", "Q2_K", Storage::Quant(Q::Q2_K)),
        row(T::Q3_K, 11, "q3_k", "Q3_K", Storage::Quant(Q::Q3_K)),
        row(T::Q4_K, 12, "q4_k", "Q4_K", Storage::Quant(Q::Q4_K)),
        row(T::Q5_K, 13, "q5_k", "Q5_K", Storage::Quant(Q::Q5_K)),
        row(T::Q6_K, 14, "q6_k", "Q6_K", Storage::Quant(Q::Q6_K)),
        row(T::IQ4_NL, 20, "iq4_nl", "IQ4_NL", Storage::Quant(Q::IQ4_NL)),
        row(T::IQ4_XS, 23, "iq4_xs", "IQ4_XS", Storage::Quant(Q::IQ4_XS)),
    ]
};

impl TensorFormat {
    /// Every format, in the order of [`FORMATS`].
    pub const ALL: [TensorFormat; FORMATS.len()] = {
        let mut all = [TensorFormat::F32; FORMATS.len()];
        let mut i = 0;
        while i < FORMATS.len() {
            all[i] = FORMATS[i].format;
            i += 1;
        }
        all
    };

    /// The format's row of [`FORMATS`].
    pub fn row(self) -> &'static FormatRow {
        FORMATS
            .iter()
            .find(|r| r.format == self)
            .expect("every TensorFormat has a row in FORMATS")
    }

    /// The lower-case name (`"f32"`, `"q4_k"`).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The name to show (`"F32"`, `"Q4_K"`).
    pub fn display_name(self) -> &'static str {
        self.row().display
    }

    /// ggml's type code.
    pub fn ggml_code(self) -> u32 {
        self.row().ggml_code
    }

    /// The format of ggml's type code `code`, `None` for a type this runtime
    /// does not read.
    pub fn from_ggml_code(code: u32) -> Option<TensorFormat> {
        FORMATS
            .iter()
            .find(|r| r.ggml_code == code)
            .map(|r| r.format)
    }

    /// The format named `name` ([`name`](Self::name) or
    /// [`display_name`](Self::display_name), case-insensitive).
    pub fn from_name(name: &str) -> Option<TensorFormat> {
        FORMATS
            .iter()
            .find(|r| r.name.eq_ignore_ascii_case(name))
            .map(|r| r.format)
    }

    /// How the runtime keeps a tensor of this format.
    pub fn storage(self) -> Storage {
        self.row().storage
    }

    /// The block format, for a quantized format.
    pub fn quant(self) -> Option<QuantFormat> {
        match self.storage() {
            Storage::Quant(q) => Some(q),
            Storage::Float(_) => None,
        }
    }

    /// The float format, for a float format.
    pub fn float(self) -> Option<WeightFormat> {
        match self.storage() {
            Storage::Float(f) => Some(f),
            Storage::Quant(_) => None,
        }
    }

    /// `(elements per block, bytes per block)`: `(1, element size)` for a
    /// float format.
    pub fn block(self) -> (usize, usize) {
        match self.storage() {
            Storage::Float(f) => (1, f.size_bytes()),
            Storage::Quant(q) => (q.block_elements(), q.block_bytes()),
        }
    }

    /// The bytes of a row of `cols` elements; `None` if `cols` is not a whole
    /// number of blocks or the size overflows.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        let (e, b) = self.block();
        if !cols.is_multiple_of(e) {
            return None;
        }
        (cols / e).checked_mul(b)
    }

    /// "f32, f16, bf16, ..." (every name, for messages).
    pub fn name_list() -> String {
        FORMATS.map(|r| r.name).join(", ")
    }
}

impl From<QuantFormat> for TensorFormat {
    fn from(q: QuantFormat) -> TensorFormat {
        FORMATS
            .iter()
            .find(|r| r.storage == Storage::Quant(q))
            .expect("every QuantFormat has a row in FORMATS")
            .format
    }
}

impl From<WeightFormat> for TensorFormat {
    fn from(f: WeightFormat) -> TensorFormat {
        FORMATS
            .iter()
            .find(|r| r.storage == Storage::Float(f))
            .expect("every WeightFormat has a row in FORMATS")
            .format
    }
}

impl fmt::Display for TensorFormat {
    /// The lower-case [`name`](TensorFormat::name).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing a [`TensorFormat`] from a name it does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownFormatName(pub String);

impl fmt::Display for UnknownFormatName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown format {:?} ({} are known)",
            self.0,
            TensorFormat::name_list()
        )
    }
}

impl std::error::Error for UnknownFormatName {}

impl std::str::FromStr for TensorFormat {
    type Err = UnknownFormatName;

    /// Parses a [`name`](TensorFormat::name) (case-insensitive).
    fn from_str(s: &str) -> Result<TensorFormat, UnknownFormatName> {
        TensorFormat::from_name(s).ok_or_else(|| UnknownFormatName(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_one_to_one() {
        for (i, a) in FORMATS.iter().enumerate() {
            for b in &FORMATS[i + 1..] {
                assert_ne!(a.format, b.format);
                assert_ne!(a.ggml_code, b.ggml_code);
                assert_ne!(a.name, b.name);
                assert_ne!(a.storage, b.storage);
            }
            assert!(a.display.eq_ignore_ascii_case(a.name));
            assert_eq!(TensorFormat::from_ggml_code(a.ggml_code), Some(a.format));
            assert_eq!(a.format.name().parse::<TensorFormat>(), Ok(a.format));
        }
        for q in QuantFormat::ALL {
            assert_eq!(TensorFormat::from(q).quant(), Some(q));
        }
    }
}
