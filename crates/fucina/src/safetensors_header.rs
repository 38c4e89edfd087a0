//! The one validator of safetensors headers: [`parse`] checks a file's
//! framing and header whole and returns the tensors with their byte ranges,
//! or a [`HeaderError`] naming what was wrong. [`checkpoint`](crate::checkpoint)
//! reads its files through it, and so does fucina-llm's model loader.
//!
//! # What is checked
//! A safetensors file is an 8-byte little-endian header length `n`, `n` bytes
//! of JSON, then the data section. [`parse`] checks, in this order:
//! - the file holds the length prefix, `n` is at most [`MAX_HEADER_BYTES`]
//!   (the reference reader's limit) and the header lies inside the file;
//! - the header is a JSON object; `__metadata__` appears at most once and is
//!   `null` or an object of strings with no repeated key;
//! - every tensor name is non-empty and appears once, and its entry holds
//!   `dtype` (a name of [`Dtype`]), `shape` (non-negative integers) and
//!   `data_offsets` (two non-negative integers);
//! - then, the entries sorted by their data offsets and name (a fixed order:
//!   a file with several faults always reports the same one), each tensor's
//!   dtype is one the caller accepts, its byte size (shape × dtype size)
//!   counts in a `u64`, its offsets `[start, end]` hold exactly that many
//!   bytes, start where the previous tensor ended (no overlap, no gap: the
//!   format tiles the data section) and end inside the file, and its shape
//!   fits `usize`;
//! - the last tensor ends exactly at the end of the file.
//!
//! ```
//! use fucina::safetensors_header::{self, Dtype, HeaderError};
//!
//! let header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
//! let mut file = (header.len() as u64).to_le_bytes().to_vec();
//! file.extend_from_slice(header.as_bytes());
//! file.extend_from_slice(&[0; 8]);
//! let parsed = safetensors_header::parse(&file, &Dtype::ALL)?;
//! assert_eq!(parsed.tensors[0].name, "w");
//! assert_eq!(parsed.tensors[0].range, 0..8);
//! assert_eq!(parsed.data_start, 8 + header.len());
//!
//! // One byte short: the tensor's data runs past the end of the file.
//! let err = safetensors_header::parse(&file[..file.len() - 1], &Dtype::ALL).unwrap_err();
//! assert!(matches!(err, HeaderError::PastEnd { .. }));
//! assert_eq!(err.tensor(), Some("w"));
//! # Ok::<(), HeaderError>(())
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use serde_json::Value;

/// Bytes of the little-endian header-length prefix of a safetensors file.
pub const LEN_PREFIX: usize = 8;
/// The largest header accepted (the limit of the reference reader).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;
/// The reserved header key of the string metadata map.
pub const METADATA_KEY: &str = "__metadata__";

macro_rules! dtypes {
    ($($(#[$doc:meta])* $v:ident = $name:literal, $size:literal;)*) => {
        /// An element type of the safetensors format, as a header spells it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)] // the format's own spelling
        pub enum Dtype {
            $($(#[$doc])* $v,)*
        }

        impl Dtype {
            /// Every dtype of the format.
            pub const ALL: [Dtype; [$($name),*].len()] = [$(Dtype::$v),*];

            /// The name a header spells (`"BF16"`).
            pub fn name(self) -> &'static str {
                match self {
                    $(Dtype::$v => $name,)*
                }
            }

            /// The dtype a header's name spells, if any.
            pub fn from_name(name: &str) -> Option<Dtype> {
                match name {
                    $($name => Some(Dtype::$v),)*
                    _ => None,
                }
            }

            /// Bytes per element.
            pub fn size_bytes(self) -> usize {
                match self {
                    $(Dtype::$v => $size,)*
                }
            }
        }
    };
}

dtypes! {
    /// A boolean byte.
    BOOL = "BOOL", 1;
    /// Unsigned 8-bit integer.
    U8 = "U8", 1;
    /// Signed 8-bit integer.
    I8 = "I8", 1;
    /// 8-bit float, 5 exponent bits.
    F8_E5M2 = "F8_E5M2", 1;
    /// 8-bit float, 4 exponent bits.
    F8_E4M3 = "F8_E4M3", 1;
    /// Signed 16-bit integer.
    I16 = "I16", 2;
    /// Unsigned 16-bit integer.
    U16 = "U16", 2;
    /// IEEE binary16.
    F16 = "F16", 2;
    /// bfloat16.
    BF16 = "BF16", 2;
    /// Signed 32-bit integer.
    I32 = "I32", 4;
    /// Unsigned 32-bit integer.
    U32 = "U32", 4;
    /// IEEE binary32.
    F32 = "F32", 4;
    /// IEEE binary64.
    F64 = "F64", 8;
    /// Signed 64-bit integer.
    I64 = "I64", 8;
    /// Unsigned 64-bit integer.
    U64 = "U64", 8;
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor of a checked header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderTensor {
    /// Its name.
    pub name: String,
    /// Its element type (one the caller accepts).
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its bytes within the data section (add [`Header::data_start`] for the
    /// file).
    pub range: Range<usize>,
}

/// A checked safetensors header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The tensors, in the order of their data (the file's order).
    pub tensors: Vec<HeaderTensor>,
    /// The `__metadata__` map (empty when absent or `null`).
    pub metadata: BTreeMap<String, String>,
    /// Where the data section starts in the file: `8 + header length`.
    pub data_start: usize,
}

/// What [`parse`] refuses. [`tensor`](HeaderError::tensor) names the tensor
/// at fault, if one is; the message (`Display`) says what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Fewer bytes than the length prefix.
    #[error("{len} bytes: too short for a safetensors file (an 8-byte header length comes first)")]
    TooShort {
        /// The file's length.
        len: usize,
    },
    /// The header length is above [`MAX_HEADER_BYTES`].
    #[error(
        "header length {header} is above the format's limit of {MAX_HEADER_BYTES} bytes (not a safetensors file?)"
    )]
    HeaderTooLong {
        /// The header length the prefix gives.
        header: u64,
    },
    /// The header runs past the end of the file.
    #[error(
        "header length {header} runs past the end of the file ({len} bytes): truncated, or not a safetensors file"
    )]
    HeaderPastEnd {
        /// The header length the prefix gives.
        header: u64,
        /// The file's length.
        len: usize,
    },
    /// The header is not a JSON object.
    #[error("the header is not a valid JSON object: {reason}")]
    NotJson {
        /// The JSON reader's message.
        reason: String,
    },
    /// `__metadata__` appears twice.
    #[error("the header holds `{METADATA_KEY}` twice")]
    MetadataTwice,
    /// `__metadata__` is neither `null` nor an object of strings.
    #[error("`{METADATA_KEY}` is {value}, expected an object of strings")]
    BadMetadata {
        /// The value found (as JSON).
        value: String,
    },
    /// A metadata key appears twice.
    #[error("the metadata key `{key}` appears more than once")]
    DuplicateMetadataKey {
        /// The repeated key.
        key: String,
    },
    /// A tensor's name is empty.
    #[error("the header holds an empty tensor name")]
    EmptyName,
    /// A tensor's name appears twice.
    #[error("appears twice in the header")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// A tensor's entry is not `{dtype, shape, data_offsets}` of the right
    /// types.
    #[error("malformed header entry (expected dtype, shape, data_offsets): {reason}")]
    Malformed {
        /// The tensor.
        name: String,
        /// The JSON reader's message.
        reason: String,
    },
    /// A tensor's dtype is not one of the format or not one the caller
    /// accepts.
    #[error("dtype {dtype} is not supported ({accepted} are)")]
    UnsupportedDtype {
        /// The tensor.
        name: String,
        /// The dtype as the header spells it.
        dtype: String,
        /// The accepted dtypes, listed.
        accepted: String,
    },
    /// A tensor's byte size overflows a `u64`.
    #[error("shape {shape:?} has more bytes than a u64 counts")]
    ShapeOverflow {
        /// The tensor.
        name: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A tensor's offsets do not hold its shape × dtype size bytes.
    #[error(
        "data_offsets [{start}, {end}] do not hold its shape {shape:?} of {dtype} ({size} bytes)"
    )]
    SizeMismatch {
        /// The tensor.
        name: String,
        /// Its offsets.
        start: u64,
        /// Its offsets.
        end: u64,
        /// Its shape.
        shape: Vec<u64>,
        /// Its dtype.
        dtype: Dtype,
        /// The bytes its shape needs.
        size: u64,
    },
    /// A tensor's data starts inside the previous tensor's.
    #[error(
        "data_offsets [{start}, {end}] overlap the data of {}, which ends at {previous_end}",
        after(previous)
    )]
    Overlap {
        /// The tensor.
        name: String,
        /// Its offsets.
        start: u64,
        /// Its offsets.
        end: u64,
        /// The previous tensor (in data order).
        previous: Option<String>,
        /// Where the previous tensor's data ends.
        previous_end: u64,
    },
    /// A tensor's data starts after the previous tensor's end.
    #[error(
        "data_offsets [{start}, {end}] leave a gap after {}, which ends at {previous_end} (the format has no gaps)",
        after(previous)
    )]
    Gap {
        /// The tensor.
        name: String,
        /// Its offsets.
        start: u64,
        /// Its offsets.
        end: u64,
        /// The previous tensor (in data order), `None` for the first.
        previous: Option<String>,
        /// Where the previous tensor's data ends (0 for the first).
        previous_end: u64,
    },
    /// A tensor's data runs past the end of the file.
    #[error(
        "data_offsets [{start}, {end}] run past the end of the file, whose data section holds {data_len} bytes (truncated?)"
    )]
    PastEnd {
        /// The tensor.
        name: String,
        /// Its offsets.
        start: u64,
        /// Its offsets.
        end: u64,
        /// The data section's length.
        data_len: usize,
    },
    /// A tensor's shape does not fit `usize`.
    #[error("shape {shape:?} does not fit in usize")]
    ShapeTooLarge {
        /// The tensor.
        name: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// Bytes follow the last tensor's data.
    #[error("{} bytes follow the last tensor's data (the header's tensors take {used} of the {data_len} bytes of data)", data_len - used)]
    TrailingBytes {
        /// The bytes the tensors take.
        used: u64,
        /// The data section's length.
        data_len: u64,
    },
}

/// "tensor `p`", or the start of the data section.
fn after(previous: &Option<String>) -> String {
    match previous {
        Some(p) => format!("tensor `{p}`"),
        None => "the start of the data section".to_string(),
    }
}

impl HeaderError {
    /// The tensor at fault (`Some("")` for an empty name), or `None` for a
    /// fault of the file as a whole.
    pub fn tensor(&self) -> Option<&str> {
        use HeaderError as E;
        match self {
            E::EmptyName => Some(""),
            E::DuplicateName { name }
            | E::Malformed { name, .. }
            | E::UnsupportedDtype { name, .. }
            | E::ShapeOverflow { name, .. }
            | E::SizeMismatch { name, .. }
            | E::Overlap { name, .. }
            | E::Gap { name, .. }
            | E::PastEnd { name, .. }
            | E::ShapeTooLarge { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// A JSON object's entries in file order, repeated keys kept (a JSON map
/// keeps only the last of them), each value read as `V`: what a reader that
/// must refuse repeated keys deserializes (the header here; fucina-llm's
/// `model.safetensors.index.json`).
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectEntries<V>(pub Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for ObjectEntries<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Visit<V> {
            type Value = ObjectEntries<V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ObjectEntries<V>, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    out.push((key, map.next_value::<V>()?));
                }
                Ok(ObjectEntries(out))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// One value of the header object: `null`, an object's entries in file
/// order (repeated keys kept), or anything else.
enum Meta {
    Null,
    Map(Vec<(String, Value)>),
    Other(Value),
}

impl Meta {
    /// The value as JSON (an object keeps the last of a repeated key).
    fn into_value(self) -> Value {
        match self {
            Meta::Null => Value::Null,
            Meta::Map(entries) => Value::Object(entries.into_iter().collect()),
            Meta::Other(v) => v,
        }
    }
}

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Meta;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("null or a JSON object")
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<Meta, E> {
                Ok(Meta::Null)
            }

            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Meta, E> {
                Ok(Meta::Other(Value::from(v)))
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Meta, E> {
                Ok(Meta::Other(Value::from(v)))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Meta, E> {
                Ok(Meta::Other(Value::from(v)))
            }

            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Meta, E> {
                Ok(Meta::Other(Value::from(v)))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Meta, E> {
                Ok(Meta::Other(Value::from(v)))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Meta, A::Error> {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element::<Value>()? {
                    items.push(v);
                }
                Ok(Meta::Other(Value::Array(items)))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Meta, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    out.push((key, map.next_value::<Value>()?));
                }
                Ok(Meta::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A header's string metadata.
type Metadata = BTreeMap<String, String>;

/// One header entry as written.
#[derive(Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// Checks the framing and header of the safetensors bytes `bytes` (the whole
/// file; see the [module docs](self) for what is checked, in which order) and
/// returns its tensors and metadata. A tensor whose dtype is not in `accept`
/// is refused ([`HeaderError::UnsupportedDtype`]); pass [`Dtype::ALL`] to
/// accept every dtype of the format.
///
/// # Errors
/// The first fault found, as a [`HeaderError`].
pub fn parse(bytes: &[u8], accept: &[Dtype]) -> Result<Header, HeaderError> {
    let Some(prefix) = bytes.get(..LEN_PREFIX) else {
        return Err(HeaderError::TooShort { len: bytes.len() });
    };
    let n = u64::from_le_bytes(prefix.try_into().expect("8 bytes"));
    if n > MAX_HEADER_BYTES {
        return Err(HeaderError::HeaderTooLong { header: n });
    }
    let past_end = HeaderError::HeaderPastEnd {
        header: n,
        len: bytes.len(),
    };
    let n = usize::try_from(n).map_err(|_| past_end.clone())?;
    let data_start = LEN_PREFIX.checked_add(n).ok_or(past_end.clone())?;
    let header = bytes.get(LEN_PREFIX..data_start).ok_or(past_end)?;
    let ObjectEntries(entries) =
        serde_json::from_slice(header).map_err(|e| HeaderError::NotJson {
            reason: e.to_string(),
        })?;
    let data_len = bytes.len() - data_start;
    let (infos, metadata) = read_entries(entries)?;
    let tensors = check_offsets(infos, accept, data_len)?;
    Ok(Header {
        tensors,
        metadata,
        data_start,
    })
}

/// The tensor entries (in file order) and the metadata of the header's
/// entries, checked for names, repeats and form.
fn read_entries(
    entries: Vec<(String, Meta)>,
) -> Result<(Vec<(String, RawInfo)>, Metadata), HeaderError> {
    let mut seen = HashSet::with_capacity(entries.len());
    let mut metadata = None;
    let mut infos = Vec::with_capacity(entries.len());
    for (name, entry) in entries {
        if name == METADATA_KEY {
            if metadata.is_some() {
                return Err(HeaderError::MetadataTwice);
            }
            metadata = Some(read_metadata(entry)?);
            continue;
        }
        let value = entry.into_value();
        if name.is_empty() {
            return Err(HeaderError::EmptyName);
        }
        if !seen.insert(name.clone()) {
            return Err(HeaderError::DuplicateName { name });
        }
        match serde_json::from_value::<RawInfo>(value) {
            Ok(info) => infos.push((name, info)),
            Err(e) => {
                return Err(HeaderError::Malformed {
                    name,
                    reason: e.to_string(),
                });
            }
        }
    }
    Ok((infos, metadata.unwrap_or_default()))
}

/// The `__metadata__` map: `null` or an object of strings with no repeated
/// key.
fn read_metadata(meta: Meta) -> Result<BTreeMap<String, String>, HeaderError> {
    let entries = match meta {
        Meta::Null => return Ok(BTreeMap::new()),
        Meta::Other(value) => {
            return Err(HeaderError::BadMetadata {
                value: value.to_string(),
            });
        }
        Meta::Map(entries) => entries,
    };
    if entries.iter().any(|(_, v)| !v.is_string()) {
        let value: serde_json::Map<String, Value> = entries.into_iter().collect();
        return Err(HeaderError::BadMetadata {
            value: Value::Object(value).to_string(),
        });
    }
    let mut out = BTreeMap::new();
    for (k, v) in entries {
        let Value::String(v) = v else {
            unreachable!("checked: every value is a string");
        };
        if out.insert(k.clone(), v).is_some() {
            return Err(HeaderError::DuplicateMetadataKey { key: k });
        }
    }
    Ok(out)
}

/// Checks every tensor's dtype, size and offsets in data order (see the
/// [module docs](self)) against a data section of `data_len` bytes.
fn check_offsets(
    mut infos: Vec<(String, RawInfo)>,
    accept: &[Dtype],
    data_len: usize,
) -> Result<Vec<HeaderTensor>, HeaderError> {
    // A fixed order, so that the same faults always give the same error.
    infos.sort_by(|(a, x), (b, y)| (x.data_offsets, a).cmp(&(y.data_offsets, b)));
    let mut out = Vec::with_capacity(infos.len());
    let mut end_so_far = 0u64;
    let mut previous: Option<String> = None;
    for (name, info) in infos {
        let Some(dtype) = Dtype::from_name(&info.dtype).filter(|d| accept.contains(d)) else {
            let accepted: Vec<&str> = accept.iter().map(|d| d.name()).collect();
            return Err(HeaderError::UnsupportedDtype {
                name,
                dtype: info.dtype,
                accepted: accepted.join(", "),
            });
        };
        let (start, end) = info.data_offsets;
        let size = info
            .shape
            .iter()
            .try_fold(dtype.size_bytes() as u64, |acc, &d| acc.checked_mul(d));
        let Some(size) = size else {
            return Err(HeaderError::ShapeOverflow {
                name,
                shape: info.shape,
            });
        };
        if end < start || end - start != size {
            return Err(HeaderError::SizeMismatch {
                name,
                start,
                end,
                shape: info.shape,
                dtype,
                size,
            });
        }
        let (previous_end, prev) = (end_so_far, previous.take());
        if start < end_so_far {
            return Err(HeaderError::Overlap {
                name,
                start,
                end,
                previous: prev,
                previous_end,
            });
        }
        if start > end_so_far {
            return Err(HeaderError::Gap {
                name,
                start,
                end,
                previous: prev,
                previous_end,
            });
        }
        if end > data_len as u64 {
            return Err(HeaderError::PastEnd {
                name,
                start,
                end,
                data_len,
            });
        }
        let Ok(shape) = info.shape.iter().map(|&d| usize::try_from(d)).collect() else {
            return Err(HeaderError::ShapeTooLarge {
                name,
                shape: info.shape,
            });
        };
        // `start <= end <= data_len`, so both fit in usize.
        out.push(HeaderTensor {
            name: name.clone(),
            dtype,
            shape,
            range: start as usize..end as usize,
        });
        end_so_far = end;
        previous = Some(name);
    }
    if end_so_far != data_len as u64 {
        return Err(HeaderError::TrailingBytes {
            used: end_so_far,
            data_len: data_len as u64,
        });
    }
    Ok(out)
}
