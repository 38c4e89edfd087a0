//! A reader of GGUF files (the single-file model format of llama.cpp): the
//! header, the metadata key/value pairs and the tensor directory, over a
//! memory-mapped file, with every length and offset checked against the file
//! before it is used.
//!
//! The layout, all little-endian:
//!
//! ```text
//! magic "GGUF" | version u32 (2 or 3) | tensor count u64 | metadata count u64
//! metadata: key (string) | value type u32 | value
//! tensors:  name (string) | rank u32 | dims u64 × rank (innermost first) | type u32 | offset u64
//! padding to `general.alignment` (default 32) | tensor data (offsets relative to here)
//! string = length u64 | UTF-8 bytes; array = element type u32 | length u64 | elements
//! ```
//!
//! A tensor's dims run innermost first: a PyTorch `[out, in]` matrix is stored
//! with dims `[in, out]`. [`GgufTensorInfo::shape`] gives the PyTorch order.
//!
//! Nothing is trusted: counts and lengths are bounded by the bytes left in the
//! file before anything is allocated for them, so a corrupt or hostile file is
//! an [`LlmError`] naming what was wrong, never a panic or an allocation of the
//! size it claims.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fucina::exec::TensorFormat;

use crate::error::LlmError;

/// The magic number at the start of every GGUF file (`"GGUF"`).
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// The alignment of the tensor data when `general.alignment` is absent.
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;

/// Nested arrays deeper than this are rejected (GGUF writers produce depth 1).
const MAX_ARRAY_DEPTH: usize = 4;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `FLOAT32`.
    F32(f32),
    /// `BOOL`.
    Bool(bool),
    /// `STRING`.
    String(String),
    /// `ARRAY` (elements of one type).
    Array(Vec<GgufValue>),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT64`.
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array, if it is one.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// The element type of a GGUF tensor: ggml's type code, read as
/// [`TensorFormat`]'s table
/// ([`FORMATS`](fucina::exec::FORMATS)) reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(u32);

impl GgmlType {
    /// The type of ggml's code `code`.
    pub fn from_code(code: u32) -> GgmlType {
        GgmlType(code)
    }

    /// ggml's code of the type.
    pub fn code(self) -> u32 {
        self.0
    }

    /// The format of the type, `None` for a type this reader does not
    /// support.
    pub fn format(self) -> Option<TensorFormat> {
        TensorFormat::from_ggml_code(self.0)
    }

    /// `(elements per block, bytes per block)`, or `None` for a type this reader
    /// does not support.
    pub fn block(self) -> Option<(u64, u64)> {
        let (e, b) = self.format()?.block();
        Some((e as u64, b as u64))
    }

    /// The type's name as ggml spells it, lower-case (`"q8_0"`), also for the
    /// types this reader does not support (`"iq2_xs"`); `"type <code>"` for a
    /// code ggml does not define.
    pub fn name(self) -> String {
        match self.format() {
            Some(f) => f.name().into(),
            None => match OTHER_GGML_NAMES.iter().find(|(code, _)| *code == self.0) {
                Some((_, name)) => (*name).into(),
                None => format!("type {}", self.0),
            },
        }
    }
}

impl From<TensorFormat> for GgmlType {
    fn from(f: TensorFormat) -> GgmlType {
        GgmlType(f.ggml_code())
    }
}

/// ggml's names of the type codes this reader does not support, so that an
/// error names what a file holds (`q4_1`, not `type 3`).
const OTHER_GGML_NAMES: [(u32, &str); 16] = [
    (9, "q8_1"),
    (15, "q8_k"),
    (16, "iq2_xxs"),
    (17, "iq2_xs"),
    (18, "iq3_xxs"),
    (19, "iq1_s"),
    (21, "iq3_s"),
    (22, "iq2_s"),
    (24, "i8"),
    (25, "i16"),
    (26, "i32"),
    (27, "i64"),
    (28, "f64"),
    (29, "iq1_m"),
    (34, "tq1_0"),
    (35, "tq2_0"),
];

impl GgmlType {
    /// Whether ggml defines the type's code (a type this reader supports, or
    /// one of [`name`](GgmlType::name)'s other ggml types).
    pub fn is_defined_by_ggml(self) -> bool {
        self.format().is_some() || OTHER_GGML_NAMES.iter().any(|(code, _)| *code == self.0)
    }

    /// The type as an error message names it: `type q8_1 (ggml type 9)`, or
    /// `ggml type 99, which ggml does not define,`.
    pub(crate) fn describe(self) -> String {
        match self.is_defined_by_ggml() {
            true => format!("type {} (ggml type {})", self.name(), self.0),
            false => format!("ggml type {}, which ggml does not define,", self.0),
        }
    }

    /// "f32, f16, ..." (the supported types) for error messages.
    pub(crate) fn supported_list() -> String {
        TensorFormat::name_list()
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// The dims as stored, innermost first.
    pub dims: Vec<u64>,
    /// The element type.
    pub ggml_type: GgmlType,
    /// The data's offset relative to the start of the tensor data.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// The shape in PyTorch's order (outermost first): the dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// The number of elements.
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A GGUF file: its metadata and tensor directory, over a memory map.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    /// Absolute offset of the tensor data in the file.
    data_start: u64,
    /// Byte length of each tensor (index-aligned with `tensors`), or `None` for an
    /// unsupported type.
    lengths: Vec<Option<u64>>,
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, LlmError> {
        let path = path.as_ref();
        let file = crate::files::open_regular(path)?;
        // SAFETY: the mapping is read-only and the crate never writes through it;
        // like every memory-mapped reader, it relies on the file not being truncated
        // or rewritten by another process while mapped (documented in docs/LLM.md).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, Arc::new(map))
    }

    /// Parses a GGUF image held by `map` (`path` names it in errors).
    pub fn parse(path: &Path, map: Arc<memmap2::Mmap>) -> Result<GgufFile, LlmError> {
        let parsed = parse_bytes(&map[..]).map_err(|reason| LlmError::BadFile {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            data_start: parsed.data_start,
            lengths: parsed.lengths,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The metadata value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The size of the file in bytes.
    pub fn file_bytes(&self) -> usize {
        self.map.len()
    }

    /// The mapping and the absolute byte range of the tensor `name`'s data (for
    /// zero-copy weights); errors as [`tensor`](Self::tensor).
    pub(crate) fn tensor_range(
        &self,
        name: &str,
    ) -> Result<(&GgufTensorInfo, Arc<memmap2::Mmap>, std::ops::Range<usize>), LlmError> {
        let (info, data) = self.tensor(name)?;
        let start = data.as_ptr() as usize - self.map.as_ptr() as usize;
        Ok((info, Arc::clone(&self.map), start..start + data.len()))
    }

    /// The directory entry and the data bytes of the tensor `name`: an error names
    /// the tensor when it is absent or of a type this reader does not support.
    pub fn tensor(&self, name: &str) -> Result<(&GgufTensorInfo, &[u8]), LlmError> {
        let (i, info) = self
            .tensors
            .iter()
            .enumerate()
            .find(|(_, t)| t.name == name)
            .ok_or_else(|| LlmError::BadTensor {
                name: name.to_string(),
                reason: format!("missing from {}", self.path.display()),
            })?;
        let len = self.lengths[i].ok_or_else(|| LlmError::BadTensor {
            name: name.to_string(),
            reason: format!(
                "unsupported GGUF tensor {} in {} (supported: {})",
                info.ggml_type.describe(),
                self.path.display(),
                GgmlType::supported_list()
            ),
        })?;
        // Checked in `parse_bytes`: the range lies inside the file.
        let start = (self.data_start + info.offset) as usize;
        Ok((info, &self.map[start..start + len as usize]))
    }
}

/// The parsed header of a GGUF image.
struct Parsed {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    data_start: u64,
    lengths: Vec<Option<u64>>,
}

/// A cursor over the bytes of the image; every read is bounds-checked.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if n > self.left() {
            return Err(format!(
                "truncated: {what} needs {n} bytes at offset {}, the file has {} left",
                self.pos,
                self.left()
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items of at least `min_item_bytes` each, bounded by the bytes
    /// left (so a hostile count cannot make us allocate).
    fn count(&mut self, min_item_bytes: usize, what: &str) -> Result<usize, String> {
        let n = self.u64(what)?;
        let max = (self.left() / min_item_bytes.max(1)) as u64;
        if n > max {
            return Err(format!(
                "{what} = {n} at offset {} cannot fit in the {} bytes left",
                self.pos - 8,
                self.left()
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let n = self.count(1, what)?;
        let at = self.pos;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| format!("{what} at offset {at} is not UTF-8"))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue, String> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(key)?[0]),
            1 => GgufValue::I8(self.array::<1>(key)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("metadata {key}: boolean byte {b} is not 0 or 1")),
            },
            8 => GgufValue::String(self.string(key)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "metadata {key}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    ));
                }
                let elem = self.u32(key)?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8..=12 => 8,
                    t => return Err(format!("metadata {key}: unknown array element type {t}")),
                };
                let n = self.count(min, key)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            t => return Err(format!("metadata {key}: unknown value type {t}")),
        })
    }
}

/// Parses and checks a whole GGUF image; the error says what was wrong.
fn parse_bytes(bytes: &[u8]) -> Result<Parsed, String> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic = c.array::<4>("the magic number")?;
    if magic != GGUF_MAGIC {
        return Err(format!(
            "not a GGUF file: magic {magic:02x?}, expected \"GGUF\""
        ));
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "GGUF version {version} is not supported (2 and 3 are)"
        ));
    }
    // A tensor entry takes at least 8 (name) + 4 (rank) + 4 (type) + 8 (offset)
    // bytes; a metadata pair at least 8 (key) + 4 (type) + 1.
    let n_tensors = c.count(24, "the tensor count")?;
    let n_meta = c.count(13, "the metadata count")?;
    let mut metadata = BTreeMap::new();
    for _ in 0..n_meta {
        let key = c.string("a metadata key")?;
        let ty = c.u32(&key)?;
        let value = c.value(ty, &key, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(format!("metadata key {key} appears twice"));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => GGUF_DEFAULT_ALIGNMENT,
        Some(GgufValue::U32(a)) if *a > 0 && a.is_power_of_two() => u64::from(*a),
        Some(v) => {
            return Err(format!(
                "general.alignment = {v:?} is not a power-of-two u32"
            ));
        }
    };
    let mut tensors = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name = c.string("a tensor name")?;
        let rank = c.u32(&name)?;
        if rank == 0 || rank > 4 {
            return Err(format!(
                "tensor {name}: rank {rank} (GGUF tensors have 1 to 4 dims)"
            ));
        }
        let mut dims = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            let d = c.u64(&name)?;
            if d == 0 {
                return Err(format!("tensor {name}: a dimension is zero"));
            }
            dims.push(d);
        }
        let ggml_type = GgmlType::from_code(c.u32(&name)?);
        let offset = c.u64(&name)?;
        if offset % alignment != 0 {
            return Err(format!(
                "tensor {name}: data offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        tensors.push(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        });
    }
    let end = c.pos as u64;
    let data_start = end.div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    let mut lengths = Vec::with_capacity(tensors.len());
    let mut seen = std::collections::HashSet::new();
    for t in &tensors {
        if !seen.insert(t.name.as_str()) {
            return Err(format!("tensor {} appears twice", t.name));
        }
        let numel = t
            .dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("tensor {}: dims {:?} overflow", t.name, t.dims))?;
        let Some((per_block, block_bytes)) = t.ggml_type.block() else {
            lengths.push(None);
            continue;
        };
        if t.dims[0] % per_block != 0 {
            return Err(format!(
                "tensor {}: {} innermost elements are not a multiple of the {}-element blocks of {}",
                t.name,
                t.dims[0],
                per_block,
                t.ggml_type.name()
            ));
        }
        let len = (numel / per_block)
            .checked_mul(block_bytes)
            .ok_or_else(|| format!("tensor {}: byte length overflows", t.name))?;
        let fits = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(len))
            .is_some_and(|e| e <= file_len);
        if !fits {
            return Err(format!(
                "tensor {}: data [{}, +{len}) past the end of the file ({} bytes of tensor data)",
                t.name,
                t.offset,
                file_len.saturating_sub(data_start)
            ));
        }
        lengths.push(Some(len));
    }
    Ok(Parsed {
        version,
        metadata,
        tensors,
        data_start,
        lengths,
    })
}

/// Parses a GGUF image from bytes in memory and returns its metadata and tensor
/// directory (the checks of [`GgufFile::open`]; for tests and fuzzing).
pub fn parse_header(
    bytes: &[u8],
) -> Result<(BTreeMap<String, GgufValue>, Vec<GgufTensorInfo>), String> {
    let p = parse_bytes(bytes)?;
    Ok((p.metadata, p.tensors))
}
