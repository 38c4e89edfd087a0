//! The load-dtype policy: [`WeightStore::convert`] and the per-tensor fallbacks
//! of llama.cpp's `llama-quantize`.

use std::collections::BTreeMap;

use fucina::exec::{QuantFormat, Storage, TensorFormat};

use crate::error::LlmError;
use crate::format_report::conversion_target;

use super::weight::encode_f32;
use super::{Weight, WeightStore};

/// Rows of a matrix [`WeightStore::convert`] widens at a time (4 MiB of f32).
const CONVERT_BLOCK_ELEMENTS: usize = 1 << 20;

/// The format [`WeightStore::convert`] turns a model's matrices into
/// (`generate --dtype`): any [`TensorFormat`]
/// (parsed from its lower-case name, case-insensitive: `"q4_k".parse()`).
///
/// The float formats round each value once (to nearest-even for f16 and
/// bf16); Q8_0 and Q4_0 are llama.cpp's blocks of 32, made by
/// [`ExecContext::quantize`](fucina::ExecContext::quantize) (its reference
/// quantizer, so the bytes are those `llama-quantize` writes for the same f32
/// values); the K formats are llama.cpp's super-block formats, made by
/// `quantize`'s simpler K rules (their bytes differ from `llama-quantize`'s).
pub type LoadDtype = TensorFormat;

/// The block format llama.cpp's `llama-quantize` takes for a tensor whose rows
/// are not whole super-blocks of a K format (a format of blocks of 32: Q4_K →
/// Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K, Q3_K and IQ4_XS → IQ4_NL); the
/// format itself for the others. [`conversion_target`] applies it.
pub fn k_fallback(q: QuantFormat) -> QuantFormat {
    match q {
        QuantFormat::Q4_K => QuantFormat::Q5_0,
        QuantFormat::Q5_K => QuantFormat::Q5_1,
        QuantFormat::Q6_K => QuantFormat::Q8_0,
        QuantFormat::Q2_K | QuantFormat::Q3_K | QuantFormat::IQ4_XS => QuantFormat::IQ4_NL,
        other => other,
    }
}

impl WeightStore {
    /// A copy of the store with every matrix (rank-2 tensor) stored as `dtype`,
    /// for running a model at another precision than its file's
    /// (`generate --dtype`). `self` is left as it is.
    ///
    /// What changes follows llama.cpp's `llama-quantize`:
    ///
    /// - every rank-2 tensor — the q/k/v/o and gate/up/down projections, the
    ///   embedding table and `lm_head.weight` — becomes `dtype`; tensors of
    ///   other ranks (the norms, the biases) are kept as they are (the decoder
    ///   widens them to f32 when it builds, whatever their format);
    /// - for every block format but Q8_0 and Q6_K the output projection keeps
    ///   more bits: the super-block formats store it as Q6_K, as llama.cpp's
    ///   presets do; the formats of blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1,
    ///   IQ4_NL) as Q8_0 (llama.cpp takes Q6_K; Q8_0 is repacked by
    ///   `open_model` and read at the packed kernel's speed, where a Q6_K
    ///   matrix is read in place). The output projection is `lm_head.weight`,
    ///   or the embedding table when `tie_word_embeddings` (llama.cpp's rule
    ///   for models that share the two); `Q4_K_M` and `Q5_K_M` also give Q6_K
    ///   to some of the v and down projections, which this conversion does
    ///   not;
    /// - the K formats need whole super-blocks of 256 along the columns; a
    ///   matrix whose column count is not a multiple of 256 falls back per
    ///   tensor, as llama.cpp's does ([`k_fallback`]): Q4_K to Q5_0, Q5_K to
    ///   Q5_1, Q6_K to Q8_0, Q2_K, Q3_K and IQ4_XS to IQ4_NL (the output
    ///   projection's Q6_K too: to Q8_0). [`conversion_target`] is this rule
    ///   for one matrix; what each tensor became, and why, is the converted
    ///   store's [`format_report`](WeightStore::format_report);
    /// - a tensor already in its target format is kept as it is (still mapped,
    ///   no copy); any other is widened to f32 (a quantized one dequantized) and
    ///   converted, so the result owns its bytes in memory. Re-quantizing an
    ///   already quantized tensor (a Q8_0 file to Q4_0) loses more than
    ///   quantizing the original would.
    ///
    /// The quantized bytes are [`ExecContext::quantize`](fucina::ExecContext::quantize)
    /// of the tensor's f32 values: the same for any thread count of `ctx`.
    ///
    /// # Errors
    /// [`LlmError::BadTensor`] naming the tensor and its shape when a matrix to
    /// be quantized has a column count (its input features, the dimension the
    /// blocks run along) that is not a multiple of 32 (for the K formats too:
    /// their fallbacks need whole blocks of 32): llama.cpp refuses such a
    /// tensor too ("Unsupported tensor size").
    /// Nothing is returned half-converted.
    pub fn convert(
        &self,
        ctx: &fucina::ExecContext,
        dtype: LoadDtype,
        tie_word_embeddings: bool,
    ) -> Result<WeightStore, LlmError> {
        let output = if tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let mut tensors = BTreeMap::new();
        let mut choices = BTreeMap::new();
        for (name, w) in &self.tensors {
            let &[rows, cols] = w.shape() else {
                tensors.insert(name.clone(), w.clone());
                continue;
            };
            let (target, choice) = conversion_target(dtype, cols, name == output);
            choices.insert(name.clone(), choice);
            let target = target.storage();
            if w.storage() == target {
                tensors.insert(name.clone(), w.clone());
                continue;
            }
            let bad = |reason: String| LlmError::BadTensor {
                name: name.clone(),
                reason: format!("shape [{rows}, {cols}]: {reason}"),
            };
            if let Storage::Quant(q) = target
                && !cols.is_multiple_of(q.block_elements())
            {
                return Err(bad(format!(
                    "{cols} columns are not a multiple of the {}-element blocks of {q:?} \
                     (llama.cpp refuses such a tensor too)",
                    q.block_elements(),
                )));
            }
            // A block of rows at a time through one f32 buffer, so a large
            // matrix is never widened whole (every format works per row, so the
            // bytes do not depend on the block size).
            let row_bytes = match target {
                Storage::Float(f) => cols * f.size_bytes(),
                Storage::Quant(q) => cols / q.block_elements() * q.block_bytes(),
            };
            let total = rows
                .checked_mul(row_bytes)
                .ok_or_else(|| bad("the converted size overflows usize".to_string()))?;
            let mut bytes = Vec::new();
            bytes
                .try_reserve_exact(total)
                .map_err(|_| bad(format!("{total} bytes cannot be allocated")))?;
            let block_rows = (CONVERT_BLOCK_ELEMENTS / cols.max(1)).clamp(1, rows.max(1));
            let mut buf = vec![0.0f32; block_rows * cols];
            for r0 in (0..rows).step_by(block_rows) {
                let n = block_rows.min(rows - r0);
                let buf = &mut buf[..n * cols];
                for (i, row) in buf.chunks_exact_mut(cols.max(1)).enumerate() {
                    w.row_to_f32(r0 + i, row)?;
                }
                match target {
                    Storage::Float(f) => {
                        let start = bytes.len();
                        bytes.resize(start + n * row_bytes, 0);
                        encode_f32(f, buf, &mut bytes[start..]);
                    }
                    Storage::Quant(q) => bytes.extend_from_slice(
                        ctx.quantize(q, n, cols, buf)
                            .map_err(|e| bad(e.to_string()))?
                            .bytes(),
                    ),
                }
            }
            let converted = match target {
                Storage::Float(f) => Weight::from_bytes(name, f, w.shape(), bytes)?,
                Storage::Quant(q) => Weight::quantized(name, q, w.shape(), bytes)?,
            };
            tensors.insert(name.clone(), converted);
        }
        Ok(WeightStore {
            tensors,
            files: self.files.clone(),
            choices,
        })
    }
}
