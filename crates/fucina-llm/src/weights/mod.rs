//! Tensors of a model, kept in their file format (f32, f16, bf16).
//!
//! [`WeightStore::open`] memory-maps a model directory's safetensors files:
//! `model.safetensors`, or else the shards that `model.safetensors.index.json`
//! lists in its `weight_map` (tensor name to file name). Nothing is copied or
//! converted: a [`Weight`] is a view of its bytes in the mapping, in the dtype
//! the file stores (`F32`, `F16` or `BF16`), so a bf16 model takes bf16 bytes
//! of memory, paged in from the file as the kernels read them.
//!
//! Every file is checked whole before any tensor is handed out, in a fixed
//! order (the header's entries sorted by their data offsets, the shards by
//! name), so a file with several faults always reports the same one:
//!
//! - the 8-byte header length fits the file and the format's limit (100 MB), and
//!   the header is a JSON object of well-formed entries with distinct names
//!   ([`LlmError::BadFile`]);
//! - every tensor's dtype is `F32`, `F16` or `BF16`; its data offsets hold
//!   exactly its shape's bytes, start where the previous tensor's data ends (no
//!   overlap, no gap) and end inside the file; no bytes follow the last tensor
//!   ([`LlmError::BadTensorInFile`], naming the file and the tensor);
//! - for a sharded model, every file the index names exists and holds the
//!   tensors the index assigns to it ([`LlmError::BadTensorInFile`], naming the
//!   shard and the tensor). Tensors a shard holds beyond those the index lists
//!   are checked but not exposed.
//!
//! The files must not be modified or truncated while the store (or any
//! [`Weight`] cloned from it) lives: their bytes are read in place.
//!
//! The store's parts: [`Weight`] (one tensor and its kernel dispatch,
//! `weight.rs`), the safetensors reader and its checks (`safetensors.rs`),
//! and the load-dtype policy of [`WeightStore::convert`] (`convert.rs`).

mod convert;
mod safetensors;
mod weight;

pub use convert::{LoadDtype, k_fallback};
pub use weight::Weight;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use fucina::exec::{TensorFormat, WeightMatrix};

use crate::error::LlmError;
use crate::format_report::{FormatChoice, FormatReport, TensorFormatEntry};

use safetensors::{Index, MappedFile};

/// The single-file weights of a model directory.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded model directory (`weight_map`: tensor name to file).
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// A model's tensors by name (Hugging Face names: `model.layers.0.self_attn.q_proj.weight`).
#[derive(Clone, Debug, Default)]
pub struct WeightStore {
    tensors: BTreeMap<String, Weight>,
    /// The mapped files and their sizes in bytes, sorted by path.
    files: Vec<(PathBuf, u64)>,
    /// Why [`convert`](WeightStore::convert) gave each matrix its format
    /// (empty for a store that was not converted: every tensor is the file's).
    choices: BTreeMap<String, FormatChoice>,
}

impl WeightStore {
    /// Memory-maps the safetensors files of the model directory `dir`:
    /// `model.safetensors` when it exists, else the shards
    /// `model.safetensors.index.json` lists (see the [module docs](self) for
    /// what is checked).
    ///
    /// # Errors
    /// [`LlmError::BadFile`] if `dir` holds neither file, or for a file whose
    /// framing or header is malformed (naming the file); [`LlmError::Io`] if
    /// the single file or the index cannot be read;
    /// [`LlmError::BadTensorInFile`] naming the file and the tensor for an
    /// unsupported dtype, data offsets that disagree with the shape, overlap
    /// another tensor, leave a gap or run past the end of the file (truncated),
    /// a shard the index lists that cannot be opened, or a tensor the index
    /// lists that its shard lacks.
    pub fn open(dir: impl AsRef<Path>) -> Result<WeightStore, LlmError> {
        let dir = dir.as_ref();
        let single = dir.join(SINGLE_FILE);
        if single.exists() {
            let file = MappedFile::open(&single, None)?;
            return Ok(WeightStore {
                files: vec![(single, file.map.len() as u64)],
                tensors: file.into_weights(),
                choices: BTreeMap::new(),
            });
        }
        let index = dir.join(INDEX_FILE);
        if index.exists() {
            return WeightStore::open_sharded(dir, &index);
        }
        Err(LlmError::BadFile {
            path: dir.to_path_buf(),
            reason: format!("the directory holds neither {SINGLE_FILE} nor {INDEX_FILE}"),
        })
    }

    fn open_sharded(dir: &Path, index: &Path) -> Result<WeightStore, LlmError> {
        let text = crate::files::read_regular(index)?;
        let parsed: Index = serde_json::from_slice(&text).map_err(|e| LlmError::BadFile {
            path: index.to_path_buf(),
            reason: format!("not a valid index (a JSON object with a `weight_map`): {e}"),
        })?;
        let bad = |name: &str, reason: String| LlmError::BadTensorInFile {
            path: index.to_path_buf(),
            name: name.to_string(),
            reason,
        };
        // Shard file name -> the tensors the index assigns to it (sorted).
        let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut seen = HashSet::new();
        for (name, value) in parsed.weight_map.0 {
            let Some(file) = value.as_str() else {
                return Err(bad(
                    &name,
                    format!("`weight_map` gives {value}, expected a file name"),
                ));
            };
            if !seen.insert(name.clone()) {
                return Err(bad(&name, "listed twice in `weight_map`".to_string()));
            }
            let plain = {
                let mut c = Path::new(file).components();
                matches!(
                    (c.next(), c.next()),
                    (Some(std::path::Component::Normal(_)), None)
                )
            };
            if !plain {
                return Err(bad(
                    &name,
                    format!("shard `{file}` is not a file name inside the model directory"),
                ));
            }
            shards.entry(file.to_string()).or_default().push(name);
        }
        let mut tensors = BTreeMap::new();
        let mut files = Vec::with_capacity(shards.len());
        for (file, mut names) in shards {
            names.sort_unstable();
            let path = dir.join(&file);
            let mapped = MappedFile::open(&path, Some(&names[0]))?;
            files.push((path.clone(), mapped.map.len() as u64));
            let mut weights = mapped.into_weights();
            for name in names {
                let Some(w) = weights.remove(&name) else {
                    return Err(LlmError::BadTensorInFile {
                        path,
                        name,
                        reason: format!("{INDEX_FILE} assigns it to this file, which lacks it"),
                    });
                };
                tensors.insert(name, w);
            }
        }
        Ok(WeightStore {
            tensors,
            files,
            choices: BTreeMap::new(),
        })
    }

    /// A store over tensors already in memory.
    pub fn from_tensors(tensors: HashMap<String, Weight>) -> WeightStore {
        WeightStore {
            tensors: tensors.into_iter().collect(),
            files: Vec::new(),
            choices: BTreeMap::new(),
        }
    }

    /// [`Weight::repack`] of every block-quantized matrix of the store
    /// ([`open_model`](crate::open_model) and [`Model::load_as`](crate::Model::load_as)
    /// call it): the decode kernels then read the repacked strips. Returns how
    /// many were repacked.
    ///
    /// A Q4_K token embedding table (`model.embed_tokens.weight`) beside an
    /// output projection of its own (`lm_head.weight`) stays in place: it is
    /// only read a row at a time, which reads in place page in only the rows
    /// used, where a copy would hold the whole table in memory.
    ///
    /// # Errors
    /// Out of memory (the weights repacked so far keep their copies).
    pub fn repack_quantized(&mut self, ctx: &fucina::ExecContext) -> Result<usize, LlmError> {
        let own_head = self.tensors.contains_key("lm_head.weight");
        let mut n = 0;
        for (name, w) in self.tensors.iter_mut() {
            let rows_only = own_head
                && name == "model.embed_tokens.weight"
                && w.quant_format() == Some(fucina::exec::QuantFormat::Q4_K);
            if !rows_only {
                n += usize::from(w.repack(ctx)?);
            }
        }
        Ok(n)
    }

    /// The tensor `name`, or an error naming it.
    pub fn get(&self, name: &str) -> Result<&Weight, LlmError> {
        self.tensors.get(name).ok_or_else(|| LlmError::BadTensor {
            name: name.to_string(),
            reason: "missing from the model files".to_string(),
        })
    }

    /// The tensor `name` as a `[rows, cols]` matrix (see [`Weight::matrix`]),
    /// or an error naming it (missing, or not of rank 2).
    pub fn matrix(&self, name: &str) -> Result<WeightMatrix<'_>, LlmError> {
        self.get(name)?.matrix().map_err(|e| match e {
            LlmError::BadTensor { reason, .. } => LlmError::BadTensor {
                name: name.to_string(),
                reason,
            },
            other => other,
        })
    }

    /// Whether the store holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The tensors with their names, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Weight)> {
        self.tensors.iter().map(|(n, w)| (n.as_str(), w))
    }

    /// The memory-mapped files (sorted by path) and their sizes in bytes; none
    /// for a store built in memory.
    pub fn files(&self) -> impl Iterator<Item = (&Path, u64)> {
        self.files.iter().map(|(p, n)| (p.as_path(), *n))
    }

    /// The total size of the memory-mapped files in bytes (0 for a store built
    /// in memory): what the weights can add to the resident memory.
    pub fn file_bytes(&self) -> u64 {
        self.files.iter().map(|(_, n)| n).sum()
    }

    /// The total size of the tensors' bytes (in their file formats).
    pub fn tensor_bytes(&self) -> usize {
        self.tensors.values().map(|w| w.bytes().len()).sum()
    }

    /// Checks that every value of every tensor is finite, as llama.cpp's
    /// `--check-tensors` does (`generate --check-tensors`): the loaders do not
    /// read the tensors' bytes, so a block whose f16 scale is NaN or infinite,
    /// or a float tensor holding one, loads, and the outputs it reaches are
    /// not finite (see [`arch::gguf`](crate::arch::gguf)). This reads and
    /// widens every tensor once (dequantizing the block formats), a pass over
    /// the whole model.
    ///
    /// # Errors
    /// [`LlmError::BadTensor`] naming the first tensor (in name order) holding
    /// a NaN or infinite value, with the row, the block (for a block format)
    /// and the value.
    pub fn check_finite(&self) -> Result<(), LlmError> {
        for (name, w) in &self.tensors {
            let bad = |reason: String| LlmError::BadTensor {
                name: name.clone(),
                reason,
            };
            let &[rows, cols] = w.shape() else {
                if let Some((i, v)) = w
                    .to_f32_vec()
                    .iter()
                    .enumerate()
                    .find(|(_, v)| !v.is_finite())
                {
                    return Err(bad(format!("element {i} is {v}")));
                }
                continue;
            };
            let mut row = vec![0.0f32; cols];
            for r in 0..rows {
                w.row_to_f32(r, &mut row)?;
                let Some((c, v)) = row.iter().enumerate().find(|(_, v)| !v.is_finite()) else {
                    continue;
                };
                return Err(bad(match w.quant_format() {
                    Some(q) => {
                        let e = q.block_elements();
                        format!(
                            "row {r}, column {c} is {v}: block {} of the row ({} values of {}) \
                             has a scale or min that is not finite",
                            c / e,
                            e,
                            TensorFormat::from(q),
                        )
                    }
                    None => format!("row {r}, column {c} is {v}"),
                }));
            }
        }
        Ok(())
    }

    /// What every tensor is stored as, and why: for a store read from files
    /// as they are (a GGUF file's mix of types), every tensor is
    /// [`FormatChoice::File`]; for one made by [`convert`](WeightStore::convert),
    /// each matrix says whether it took the asked format, the output
    /// projection's, or a fallback ([`conversion_target`](crate::format_report::conversion_target)).
    pub fn format_report(&self) -> FormatReport {
        FormatReport::new(
            self.tensors
                .iter()
                .map(|(name, w)| TensorFormatEntry {
                    name: name.clone(),
                    shape: w.shape().to_vec(),
                    format: w.tensor_format(),
                    choice: self
                        .choices
                        .get(name)
                        .copied()
                        .unwrap_or(FormatChoice::File),
                })
                .collect(),
        )
    }
}
