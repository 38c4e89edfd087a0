//! The safetensors reader: a file's framing, header and data offsets checked
//! whole (see the [module docs](super)), then mapped.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use fucina::exec::WeightFormat;
use fucina::safetensors_header::{self, Dtype, HeaderError, LEN_PREFIX, ObjectEntries};

use crate::error::LlmError;

use super::{INDEX_FILE, Weight};

/// `model.safetensors.index.json` (other keys, such as `metadata`, are ignored).
#[derive(Deserialize)]
pub(super) struct Index {
    pub(super) weight_map: ObjectEntries<Value>,
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
            // (Refused before mapping: an empty file cannot be mapped.)
            return Err(LlmError::BadFile {
                path: path.to_path_buf(),
                reason: HeaderError::TooShort { len: len as usize }.to_string(),
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
/// (the file at `path`) with the shared validator
/// ([`fucina::safetensors_header::parse`], accepting F32, F16 and BF16), and
/// returns every tensor with its absolute byte range. A fault of a tensor is
/// [`LlmError::BadTensorInFile`] naming it, one of the file as a whole
/// [`LlmError::BadFile`].
fn check_file(path: &Path, bytes: &[u8]) -> Result<CheckedTensors, LlmError> {
    const READ: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];
    let header = safetensors_header::parse(bytes, &READ).map_err(|e| match e.tensor() {
        Some(name) => LlmError::BadTensorInFile {
            path: path.to_path_buf(),
            name: name.to_string(),
            reason: e.to_string(),
        },
        None => LlmError::BadFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    })?;
    let start = header.data_start;
    Ok(header
        .tensors
        .into_iter()
        .map(|t| {
            let format = match t.dtype {
                Dtype::F16 => WeightFormat::F16,
                Dtype::BF16 => WeightFormat::BF16,
                _ => WeightFormat::F32,
            };
            let range = start + t.range.start..start + t.range.end;
            (t.name, format, t.shape, range)
        })
        .collect())
}
