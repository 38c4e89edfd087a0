//! The safetensors reader: a file's framing, header and data offsets checked
//! whole (see the [module docs](super)), then mapped.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use fucina::exec::WeightFormat;

use crate::error::LlmError;

use super::{INDEX_FILE, Weight};

/// Bytes of the little-endian header-length prefix of a safetensors file.
const LEN_PREFIX: usize = 8;
/// The largest header accepted (the limit of the reference reader).
const MAX_HEADER_BYTES: u64 = 100_000_000;
/// The reserved header key of the string metadata map.
const METADATA_KEY: &str = "__metadata__";

/// `model.safetensors.index.json` (other keys, such as `metadata`, are ignored).
#[derive(Deserialize)]
pub(super) struct Index {
    pub(super) weight_map: Entries,
}

/// A JSON object's entries in file order, repeated keys kept (a JSON map would
/// keep only the last of them).
pub(super) struct Entries(pub(super) Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Entries;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    out.push((key, map.next_value::<Value>()?));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// One header entry of a safetensors file.
#[derive(Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// A checked, memory-mapped safetensors file.
pub(super) struct MappedFile {
    pub(super) map: Arc<memmap2::Mmap>,
    /// Name, format, shape and absolute byte range in the mapping.
    tensors: CheckedTensors,
}

impl MappedFile {
    /// Maps and checks the file at `path`. `listed`: for a shard, a tensor the
    /// index assigns to it, named if the file cannot be opened.
    pub(super) fn open(path: &Path, listed: Option<&str>) -> Result<MappedFile, LlmError> {
        let io = |source: std::io::Error| match listed {
            Some(name) => LlmError::BadTensorInFile {
                path: path.to_path_buf(),
                name: name.to_string(),
                reason: format!(
                    "{INDEX_FILE} assigns it to this file, which cannot be opened: {source}"
                ),
            },
            None => LlmError::Io {
                path: path.to_path_buf(),
                source,
            },
        };
        let file = crate::files::open_regular(path).map_err(|e| match (listed, e) {
            (Some(_), LlmError::Io { source, .. }) => io(source),
            (Some(name), LlmError::BadFile { reason, .. }) => LlmError::BadTensorInFile {
                path: path.to_path_buf(),
                name: name.to_string(),
                reason: format!("{INDEX_FILE} assigns it to this file, which is {reason}"),
            },
            (_, e) => e,
        })?;
        let len = file.metadata().map_err(io)?.len();
        if len < LEN_PREFIX as u64 {
            return Err(LlmError::BadFile {
                path: path.to_path_buf(),
                reason: format!(
                    "{len} bytes: too short for a safetensors file (an 8-byte header length comes first)"
                ),
            });
        }
        // SAFETY: the mapping is read-only and private to this store; the
        // documented precondition of `WeightStore::open` is that the files are
        // not modified or truncated while it lives (what every memory-mapping
        // model loader requires). Mapping is what keeps a bf16 model at its file
        // size in memory, with no copy and no conversion.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let tensors = check_file(path, &map)?;
        Ok(MappedFile {
            map: Arc::new(map),
            tensors,
        })
    }

    pub(super) fn into_weights(self) -> BTreeMap<String, Weight> {
        self.tensors
            .into_iter()
            .map(|(name, format, shape, range)| {
                let w = Weight::mapped(format, shape, Arc::clone(&self.map), range);
                (name, w)
            })
            .collect()
    }
}

type CheckedTensors = Vec<(String, WeightFormat, Vec<usize>, std::ops::Range<usize>)>;

/// Checks the framing, header and data offsets of the safetensors bytes `bytes`
/// (the file at `path`), and returns every tensor with its absolute byte range.
fn check_file(path: &Path, bytes: &[u8]) -> Result<CheckedTensors, LlmError> {
    let file_err = |reason: String| LlmError::BadFile {
        path: path.to_path_buf(),
        reason,
    };
    let tensor_err = |name: &str, reason: String| LlmError::BadTensorInFile {
        path: path.to_path_buf(),
        name: name.to_string(),
        reason,
    };
    let prefix: [u8; LEN_PREFIX] = bytes[..LEN_PREFIX].try_into().expect("checked length");
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER_BYTES {
        return Err(file_err(format!(
            "header length {n} is above the format's limit of {MAX_HEADER_BYTES} bytes (not a safetensors file?)"
        )));
    }
    let n = n as usize;
    let Some(header) = bytes.get(LEN_PREFIX..LEN_PREFIX + n) else {
        return Err(file_err(format!(
            "header length {n} runs past the end of the file ({} bytes): truncated, or not a safetensors file",
            bytes.len()
        )));
    };
    let Entries(entries) = serde_json::from_slice(header)
        .map_err(|e| file_err(format!("the header is not a valid JSON object: {e}")))?;
    let data_start = LEN_PREFIX + n;
    let data_len = bytes.len() - data_start;

    let mut seen = HashSet::with_capacity(entries.len());
    let mut metadata_seen = false;
    let mut infos = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if name == METADATA_KEY {
            if metadata_seen {
                return Err(file_err(format!("the header holds `{METADATA_KEY}` twice")));
            }
            metadata_seen = true;
            if !(value.is_null()
                || value
                    .as_object()
                    .is_some_and(|m| m.values().all(Value::is_string)))
            {
                return Err(file_err(format!(
                    "`{METADATA_KEY}` is {value}, expected an object of strings"
                )));
            }
            continue;
        }
        if name.is_empty() {
            return Err(tensor_err(
                &name,
                "the header holds an empty tensor name".to_string(),
            ));
        }
        if !seen.insert(name.clone()) {
            return Err(tensor_err(&name, "appears twice in the header".to_string()));
        }
        let info: RawInfo = serde_json::from_value(value).map_err(|e| {
            tensor_err(
                &name,
                format!("malformed header entry (expected dtype, shape, data_offsets): {e}"),
            )
        })?;
        infos.push((name, info));
    }
    // A fixed order, so that the same faults always give the same error.
    infos.sort_by(|(a, x), (b, y)| (x.data_offsets, a).cmp(&(y.data_offsets, b)));

    let mut out = Vec::with_capacity(infos.len());
    let mut end_so_far = 0u64;
    let mut previous: Option<String> = None;
    for (name, info) in infos {
        let format = match info.dtype.as_str() {
            "F32" => WeightFormat::F32,
            "F16" => WeightFormat::F16,
            "BF16" => WeightFormat::BF16,
            other => {
                return Err(tensor_err(
                    &name,
                    format!("dtype {other} is not supported (F32, F16 and BF16 are)"),
                ));
            }
        };
        let (s, e) = info.data_offsets;
        let size = info
            .shape
            .iter()
            .try_fold(format.size_bytes() as u64, |acc, &d| acc.checked_mul(d));
        let Some(size) = size else {
            return Err(tensor_err(
                &name,
                format!("shape {:?} has more bytes than a u64 counts", info.shape),
            ));
        };
        if e < s || e - s != size {
            return Err(tensor_err(
                &name,
                format!(
                    "data_offsets [{s}, {e}] do not hold its shape {:?} of {} ({size} bytes)",
                    info.shape, info.dtype
                ),
            ));
        }
        let after = match &previous {
            Some(p) => format!("tensor `{p}`"),
            None => "the start of the data section".to_string(),
        };
        if s < end_so_far {
            return Err(tensor_err(
                &name,
                format!(
                    "data_offsets [{s}, {e}] overlap the data of {after}, which ends at {end_so_far}"
                ),
            ));
        }
        if s > end_so_far {
            return Err(tensor_err(
                &name,
                format!(
                    "data_offsets [{s}, {e}] leave a gap after {after}, which ends at {end_so_far} (the format has no gaps)"
                ),
            ));
        }
        if e > data_len as u64 {
            return Err(tensor_err(
                &name,
                format!(
                    "data_offsets [{s}, {e}] run past the end of the file, whose data section holds {data_len} bytes (truncated?)"
                ),
            ));
        }
        let Ok(shape) = info.shape.iter().map(|&d| usize::try_from(d)).collect() else {
            return Err(tensor_err(
                &name,
                format!("shape {:?} does not fit in usize", info.shape),
            ));
        };
        // `s <= e <= data_len`, so both offsets fit in usize.
        out.push((
            name.clone(),
            format,
            shape,
            data_start + s as usize..data_start + e as usize,
        ));
        end_so_far = e;
        previous = Some(name);
    }
    if end_so_far != data_len as u64 {
        return Err(file_err(format!(
            "{} bytes follow the last tensor's data (the header's tensors take {end_so_far} of the {data_len} bytes of data)",
            data_len as u64 - end_so_far
        )));
    }
    Ok(out)
}
