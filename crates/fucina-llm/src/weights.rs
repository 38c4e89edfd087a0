//! Tensors of a model, kept in their file format (f32, f16, bf16).
//!
//! PLACEHOLDER: [`Weight`] and the in-memory [`WeightStore`] are fixed (the model is
//! written against them); memory-mapped safetensors loading is being written.

use std::collections::HashMap;
use std::sync::Arc;

use fucina::exec::{WeightFormat, WeightMatrix};

use crate::error::LlmError;

/// Where a weight's bytes live.
#[derive(Clone, Debug)]
enum WeightBytes {
    /// A range of a memory-mapped file.
    #[allow(dead_code)] // PLACEHOLDER: built by the safetensors loader being written.
    Mapped {
        /// The mapping (shared by every tensor of the file).
        map: Arc<memmap2::Mmap>,
        /// The tensor's bytes within it.
        range: std::ops::Range<usize>,
    },
    /// Bytes owned in memory (tests, converted tensors).
    Owned(Arc<[u8]>),
}

/// One tensor of a model in its file format.
#[derive(Clone, Debug)]
pub struct Weight {
    format: WeightFormat,
    shape: Vec<usize>,
    bytes: WeightBytes,
}

impl Weight {
    /// A weight owning `bytes` (little-endian elements of `format`), checked against
    /// `shape`.
    pub fn from_bytes(
        name: &str,
        format: WeightFormat,
        shape: &[usize],
        bytes: Vec<u8>,
    ) -> Result<Weight, LlmError> {
        let expected = shape.iter().product::<usize>() * format.size_bytes();
        if bytes.len() != expected {
            return Err(LlmError::BadTensor {
                name: name.to_string(),
                reason: format!(
                    "{} bytes for shape {shape:?} of {}, expected {expected}",
                    bytes.len(),
                    format.name()
                ),
            });
        }
        Ok(Weight {
            format,
            shape: shape.to_vec(),
            bytes: WeightBytes::Owned(bytes.into()),
        })
    }

    /// An f32 weight of `shape` holding `values`, stored as `format` (values are
    /// rounded to nearest-even for f16 and bf16).
    pub fn from_f32(format: WeightFormat, shape: &[usize], values: &[f32]) -> Weight {
        assert_eq!(
            shape.iter().product::<usize>(),
            values.len(),
            "Weight::from_f32: length"
        );
        let mut bytes = Vec::with_capacity(values.len() * format.size_bytes());
        for &v in values {
            match format {
                WeightFormat::F32 => bytes.extend_from_slice(&v.to_le_bytes()),
                WeightFormat::F16 => {
                    bytes.extend_from_slice(&fucina::storage::half::f16::from_f32(v).to_le_bytes())
                }
                WeightFormat::BF16 => {
                    bytes.extend_from_slice(&fucina::storage::half::bf16::from_f32(v).to_le_bytes())
                }
            }
        }
        Weight {
            format,
            shape: shape.to_vec(),
            bytes: WeightBytes::Owned(bytes.into()),
        }
    }

    /// A weight over `range` of a memory-mapped file.
    #[allow(dead_code)] // PLACEHOLDER: used by the safetensors loader being written.
    pub(crate) fn mapped(
        format: WeightFormat,
        shape: Vec<usize>,
        map: Arc<memmap2::Mmap>,
        range: std::ops::Range<usize>,
    ) -> Weight {
        Weight {
            format,
            shape,
            bytes: WeightBytes::Mapped { map, range },
        }
    }

    /// The element format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            WeightBytes::Mapped { map, range } => &map[range.clone()],
            WeightBytes::Owned(b) => b,
        }
    }

    /// The weight as a `[rows, cols]` matrix (a rank-2 tensor), for
    /// [`ExecContext::weight_matmul`](fucina::ExecContext::weight_matmul).
    pub fn matrix(&self) -> Result<WeightMatrix<'_>, LlmError> {
        let &[rows, cols] = self.shape.as_slice() else {
            return Err(LlmError::BadTensor {
                name: String::new(),
                reason: format!("rank {} where a matrix was expected", self.shape.len()),
            });
        };
        Ok(WeightMatrix::new(self.format, rows, cols, self.bytes())?)
    }

    /// The elements widened to f32 (exact).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let b = self.bytes();
        (0..self.shape.iter().product::<usize>())
            .map(|i| self.format.element(b, i))
            .collect()
    }
}

/// A model's tensors by name (Hugging Face names: `model.layers.0.self_attn.q_proj.weight`).
#[derive(Clone, Debug, Default)]
pub struct WeightStore {
    tensors: HashMap<String, Weight>,
}

impl WeightStore {
    /// Memory-maps the safetensors files of the model directory `dir`
    /// (`model.safetensors`, or the shards `model.safetensors.index.json` lists).
    ///
    /// PLACEHOLDER: returns an error until the loader lands.
    pub fn open(dir: impl AsRef<std::path::Path>) -> Result<WeightStore, LlmError> {
        Err(LlmError::BadFile {
            path: dir.as_ref().to_path_buf(),
            reason: "safetensors loading is not written yet (placeholder)".to_string(),
        })
    }

    /// A store over tensors already in memory.
    pub fn from_tensors(tensors: HashMap<String, Weight>) -> WeightStore {
        WeightStore { tensors }
    }

    /// The tensor `name`, or an error naming it.
    pub fn get(&self, name: &str) -> Result<&Weight, LlmError> {
        self.tensors.get(name).ok_or_else(|| LlmError::BadTensor {
            name: name.to_string(),
            reason: "missing from the model files".to_string(),
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
}
