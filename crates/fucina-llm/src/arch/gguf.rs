//! A GGUF file as a [`ModelConfig`] and a [`WeightStore`] under Hugging Face's
//! tensor names, so the same model code runs it, for every architecture whose
//! [`ArchSpec`] names its `general.architecture`
//! (`llama`, `qwen2`, `qwen3`, `qwen3moe`, `gemma2`, `gemma3`, `phi3`; a
//! `llama` file with `llama.expert_count` is Mixtral).
//!
//! - **Metadata → config**: under the architecture's prefix `{arch}`:
//!   `{arch}.embedding_length`, `{arch}.feed_forward_length`,
//!   `{arch}.block_count`, `{arch}.attention.head_count(_kv)`,
//!   `{arch}.attention.key_length`, `{arch}.context_length`,
//!   `{arch}.attention.layer_norm_rms_epsilon`, `{arch}.rope.freq_base`,
//!   `{arch}.rope.scaling.{type,factor}` (linear only),
//!   `tokenizer.ggml.{bos,eos}_token_id`, then the architecture's own keys
//!   (its spec's hook: Gemma's window and caps). The output projection is tied
//!   to the embedding when `output.weight` is absent.
//! - **Names**: `token_embd` → `model.embed_tokens`, `output_norm` →
//!   `model.norm`, `output` → `lm_head`, and `blk.N.{part}` →
//!   `model.layers.N.{hf}` by the spec's table (`attn_q` →
//!   `self_attn.q_proj`, `attn_norm` → `input_layernorm`, ...); a mixture of
//!   experts' stacked tensors (`ffn_gate_exps`, `[experts, out, in]`) become
//!   one mapped matrix per expert (`mlp.experts.{e}.gate_proj`).
//! - **Rotary layout**: for the architectures whose spec says so (`llama`),
//!   llama.cpp's converter reorders the rows of every head of the q and k
//!   projections so that its rotary embedding can rotate adjacent pairs; the
//!   rows are put back in Hugging Face's order here (a copy of those two
//!   projections; every other tensor stays mapped).
//! - **Types**: F32, F16 and BF16 tensors become float [`Weight`]s; matrices
//!   in the block formats ([`FORMATS`](fucina::exec::FORMATS): Q8_0, Q4_0,
//!   Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) stay in
//!   llama.cpp's blocks (read by
//!   [`ExecContext::quant_matmul`](fucina::ExecContext::quant_matmul)); any
//!   other type code (one ggml defines, such as `q8_1`, or one it does not) is
//!   an error naming the tensor and the type, and so is a quantized tensor
//!   whose rows are not whole blocks (32 weights, or 256 for the super-block
//!   formats) or whose data runs past the end of the file
//!   ([`GgufFile::open`] checks both).
//! - **Block contents are not read at load**: a block whose f16 scale (or min)
//!   is NaN or infinite loads, as in llama.cpp (which checks them only when
//!   asked, `--check-tensors`). Its values dequantize to NaN (a NaN scale) or
//!   to non-finite values (an infinite one), every other block as it would
//!   without it, and a product reading that row gives non-finite outputs in
//!   that column only; the model's logits then hold NaN where that row
//!   reaches, and [`Sampler::sample`](crate::Sampler::sample) refuses them
//!   with an error rather than choosing a token.
//!   [`WeightStore::check_finite`] reads every block and names the first
//!   tensor, row and block that is not finite.

use std::collections::HashMap;
use std::path::Path;

use fucina::exec::{Storage, TensorFormat};

use super::{ArchParams, ArchSpec, GgufMeta};
use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::error::LlmError;
use crate::gguf::{GgmlType, GgufFile, GgufValue};
use crate::weights::{Weight, WeightStore};

/// Reads the config and the weights of the GGUF file `path`.
///
/// # Errors
/// Those of [`GgufFile::open`], [`gguf_config`] and [`gguf_weights`].
pub fn load_gguf(path: impl AsRef<Path>) -> Result<(ModelConfig, WeightStore, GgufFile), LlmError> {
    let file = GgufFile::open(path)?;
    let config = gguf_config(&file)?;
    let weights = gguf_weights(&file, &config)?;
    Ok((config, weights, file))
}

fn bad(file: &GgufFile, reason: String) -> LlmError {
    LlmError::BadFile {
        path: file.path().to_path_buf(),
        reason,
    }
}

fn required_u64(file: &GgufFile, key: &str) -> Result<usize, LlmError> {
    match file.get(key) {
        None => Err(bad(file, format!("metadata {key} is missing"))),
        Some(v) => v
            .as_u64()
            .filter(|&n| n > 0)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                bad(
                    file,
                    format!("metadata {key} = {v:?} is not a positive integer"),
                )
            }),
    }
}

fn optional_u64(file: &GgufFile, key: &str) -> Result<Option<usize>, LlmError> {
    if file.get(key).is_none() {
        return Ok(None);
    }
    required_u64(file, key).map(Some)
}

fn optional_f32(file: &GgufFile, key: &str) -> Result<Option<f32>, LlmError> {
    match file.get(key) {
        None => Ok(None),
        // Checked after the rounding to f32: an f64 of 1e-300 is positive, its
        // f32 is 0.
        Some(v) => v
            .as_f64()
            .map(|x| x as f32)
            .filter(|x| x.is_finite() && *x > 0.0)
            .map(Some)
            .ok_or_else(|| {
                bad(
                    file,
                    format!("metadata {key} = {v:?} is not a positive finite f32"),
                )
            }),
    }
}

impl GgufMeta<'_> {
    /// The full key of `suffix` under the architecture's prefix.
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// `{arch}.{suffix}`, a positive integer, if present.
    pub(crate) fn u64_opt(&self, suffix: &str) -> Result<Option<usize>, LlmError> {
        optional_u64(self.file, &self.key(suffix))
    }

    /// `{arch}.{suffix}` as a sliding window, if present: a positive
    /// integer, or 0 for none (llama.cpp writes `phi3.attention.sliding_window
    /// = 0` for Phi-4 models, which have no window).
    pub(crate) fn window_opt(&self, suffix: &str) -> Result<Option<usize>, LlmError> {
        match self.file.get(&self.key(suffix)).and_then(GgufValue::as_u64) {
            Some(0) => Ok(None),
            _ => self.u64_opt(suffix),
        }
    }

    /// `{arch}.{suffix}`, a positive integer.
    fn u64(&self, suffix: &str) -> Result<usize, LlmError> {
        required_u64(self.file, &self.key(suffix))
    }

    /// `{arch}.{suffix}`, a positive finite f32, if present.
    pub(crate) fn f32_opt(&self, suffix: &str) -> Result<Option<f32>, LlmError> {
        optional_f32(self.file, &self.key(suffix))
    }
}

/// The architecture a GGUF file declares (`general.architecture`).
fn architecture(file: &GgufFile) -> Result<(&'static ArchSpec, &str), LlmError> {
    match file.get("general.architecture").map(|v| (v, v.as_str())) {
        Some((_, Some(name))) => match Architecture::from_gguf_name(name) {
            // llama.cpp writes Mixtral as `llama` with experts.
            Some(Architecture::Llama) if file.get("llama.expert_count").is_some() => {
                Ok((Architecture::Mixtral.spec(), name))
            }
            Some(a) => Ok((a.spec(), name)),
            None => Err(bad(
                file,
                format!(
                    "architecture {name:?} is not supported (supported: {})",
                    super::ARCHITECTURES
                        .iter()
                        .map(|a| a.spec().gguf_arch)
                        .filter(|&g| Architecture::from_gguf_name(g).is_some())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        },
        Some((v, None)) => Err(bad(
            file,
            format!("metadata general.architecture = {v:?} is not a string"),
        )),
        None => Err(bad(file, "metadata general.architecture is missing".into())),
    }
}

/// The [`ModelConfig`] of a GGUF file. (Every value comes from the file: the
/// lint keeps its arithmetic checked.)
///
/// # Errors
/// [`LlmError::BadFile`] naming the key for an architecture no spec names, a
/// missing required key, a value of the wrong type or range, heads that do not
/// divide the hidden size, partial rotary embeddings of an architecture whose
/// q/k rows llama.cpp reorders, a RoPE scaling other than
/// linear, or `rope_freqs.weight`; [`LlmError::BadTensor`] when
/// `token_embd.weight` is missing.
#[warn(clippy::arithmetic_side_effects)]
pub fn gguf_config(file: &GgufFile) -> Result<ModelConfig, LlmError> {
    let (spec, arch) = architecture(file)?;
    let m = GgufMeta { file, arch };
    let hidden_size = m.u64("embedding_length")?;
    let heads = m.u64("attention.head_count")?;
    let kv_heads = m.u64_opt("attention.head_count_kv")?.unwrap_or(heads);
    let key_length = m.u64_opt("attention.key_length")?;
    if (key_length.is_none() && !hidden_size.is_multiple_of(heads))
        || !heads.is_multiple_of(kv_heads)
    {
        return Err(bad(
            file,
            format!(
                "{heads} heads and {kv_heads} key/value heads do not divide hidden size {hidden_size}"
            ),
        ));
    }
    // `heads` is positive (required_u64); a 0 would be refused by the model.
    let head_dim = key_length.unwrap_or(hidden_size.checked_div(heads).unwrap_or(0));
    // A partial rotary embedding (Phi-4-mini) rotates the first
    // `rope.dimension_count` dimensions of each head; the architectures whose
    // q/k rows llama.cpp reorders (Llama) rotate them all.
    let rotary_dim = match m.u64_opt("rope.dimension_count")? {
        Some(rot) if rot != head_dim => {
            if spec.gguf_permuted_qk || rot > head_dim || !rot.is_multiple_of(2) {
                return Err(bad(
                    file,
                    format!(
                        "{arch}.rope.dimension_count = {rot}: this partial rotary embedding is not supported (head dim {head_dim})"
                    ),
                ));
            }
            Some(rot)
        }
        _ => None,
    };
    if file.tensors().iter().any(|t| t.name == "rope_freqs.weight") {
        return Err(bad(
            file,
            "rope_freqs.weight (Llama 3.1 frequency scaling stored as a tensor) is not supported"
                .into(),
        ));
    }
    let rope_scaling = match file
        .get(&m.key("rope.scaling.type"))
        .and_then(GgufValue::as_str)
    {
        None | Some("none") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear {
            factor: m
                .f32_opt("rope.scaling.factor")?
                .ok_or_else(|| bad(file, format!("{arch}.rope.scaling.factor is missing")))?,
        },
        Some(other) => {
            return Err(bad(
                file,
                format!("rope scaling type {other:?} is not supported"),
            ));
        }
    };
    let embed = file
        .tensors()
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .ok_or_else(|| LlmError::BadTensor {
            name: "token_embd.weight".into(),
            reason: format!("missing from {}", file.path().display()),
        })?;
    let vocab_size = match m.u64_opt("vocab_size")? {
        Some(v) => v,
        None => *embed.shape().first().unwrap_or(&0),
    };
    let token = |key: &str| -> Result<Option<u32>, LlmError> {
        match file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .map(Some)
                .ok_or_else(|| bad(file, format!("metadata {key} = {v:?} is not a token id"))),
        }
    };
    let eps_key = m.key("attention.layer_norm_rms_epsilon");
    let mut config = ModelConfig {
        architecture: spec.architecture,
        hidden_size,
        intermediate_size: m.u64("feed_forward_length")?,
        num_hidden_layers: m.u64("block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        vocab_size,
        max_position_embeddings: m.u64("context_length")?,
        rms_norm_eps: optional_f32(file, &eps_key)?
            .ok_or_else(|| bad(file, format!("metadata {eps_key} is missing")))?,
        rope_theta: m
            .f32_opt("rope.freq_base")?
            .unwrap_or(spec.defaults.rope_theta as f32),
        rope_scaling,
        tie_word_embeddings: !file.tensors().iter().any(|t| t.name == "output.weight"),
        qkv_bias: false,
        o_bias: false,
        sliding_window: None,
        bos_token_id: token("tokenizer.ggml.bos_token_id")?,
        eos_token_ids: token("tokenizer.ggml.eos_token_id")?.into_iter().collect(),
        params: ArchParams {
            rotary_dim,
            ..ArchParams::default()
        },
    };
    (spec.gguf_config)(&m, &mut config)?;
    Ok(config)
}

/// The format of a GGUF tensor type, or an error naming the tensor.
fn format_of(name: &str, t: GgmlType) -> Result<TensorFormat, LlmError> {
    t.format().ok_or_else(|| LlmError::BadTensor {
        name: name.to_string(),
        reason: format!(
            "its GGUF {} is not supported (supported: {})",
            t.describe(),
            GgmlType::supported_list()
        ),
    })
}

/// Hugging Face's name of the GGUF tensor `name` of an architecture of
/// `spec`, if it is one the model uses.
fn hf_name(spec: &ArchSpec, name: &str) -> Option<String> {
    let fixed = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = tail.rsplit_once('.')?;
    let (_, hf) = spec.gguf_layer_names.iter().find(|(g, _)| *g == part)?;
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// Puts the rows of every head of a q or k projection back in Hugging Face's
/// order: llama.cpp's row `h·D + 2j + i` holds Hugging Face's row
/// `h·D + i·D/2 + j` (`D` the head dim, `i ∈ {0, 1}`, `j < D/2`).
fn unpermute_rows(bytes: &[u8], rows: usize, row_bytes: usize, head_dim: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len()];
    let half = head_dim / 2;
    for r in 0..rows {
        let (h, within) = (r / head_dim, r % head_dim);
        let (j, i) = (within / 2, within % 2);
        let hf = h * head_dim + i * half + j;
        out[hf * row_bytes..(hf + 1) * row_bytes]
            .copy_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
    }
    out
}

/// The weights of a GGUF file under Hugging Face's names (the names of
/// `config`'s architecture).
///
/// # Errors
/// [`LlmError::BadTensor`] naming a tensor of an unsupported type, of bytes
/// that do not match its shape, or a q/k projection that does not hold whole
/// heads.
pub fn gguf_weights(file: &GgufFile, config: &ModelConfig) -> Result<WeightStore, LlmError> {
    let spec = config.architecture.spec();
    let mut tensors = HashMap::new();
    for info in file.tensors() {
        let Some(hf) = hf_name(spec, &info.name) else {
            continue;
        };
        let format = format_of(&info.name, info.ggml_type)?;
        let (info, map, range) = file.tensor_range(&info.name)?;
        let shape = info.shape();
        if hf.contains(".experts.*.") {
            // llama.cpp stacks a layer's experts: `[experts, out, in]`; each
            // expert's matrix is its slice, kept mapped.
            let (&[n, rows, cols], Some(rest)) = (shape.as_slice(), hf.split_once('*')) else {
                return Err(LlmError::BadTensor {
                    name: info.name.clone(),
                    reason: format!("shape {shape:?} is not [experts, rows, cols]"),
                });
            };
            let (before, after) = rest;
            let size = format
                .row_bytes(cols)
                .and_then(|r| r.checked_mul(rows))
                .ok_or_else(|| LlmError::BadTensor {
                    name: info.name.clone(),
                    reason: format!("a row of {cols} elements is not whole {format} blocks"),
                })?;
            if n.checked_mul(size) != Some(range.len()) {
                return Err(LlmError::BadTensor {
                    name: info.name.clone(),
                    reason: format!(
                        "{} bytes do not hold {n} experts of {size} bytes",
                        range.len()
                    ),
                });
            }
            for e in 0..n {
                let at = range.start + e * size..range.start + (e + 1) * size;
                let shape = vec![rows, cols];
                let w = match format.storage() {
                    Storage::Float(f) => Weight::mapped(f, shape, map.clone(), at),
                    Storage::Quant(q) => {
                        Weight::mapped_quantized(&info.name, q, shape, map.clone(), at)?
                    }
                };
                tensors.insert(format!("{before}{e}{after}"), w);
            }
            continue;
        }
        let is_q = hf.ends_with("q_proj.weight");
        let is_k = hf.ends_with("k_proj.weight");
        let weight = if spec.gguf_permuted_qk && (is_q || is_k) {
            let heads = if is_q {
                config.num_attention_heads
            } else {
                config.num_key_value_heads
            };
            let rows = shape.first().copied().unwrap_or(0);
            if shape.len() != 2
                || heads.checked_mul(config.head_dim) != Some(rows)
                || !config.head_dim.is_multiple_of(2)
            {
                return Err(LlmError::BadTensor {
                    name: info.name.clone(),
                    reason: format!(
                        "shape {shape:?} does not hold {heads} heads of {} rows",
                        config.head_dim
                    ),
                });
            }
            let row_bytes = format
                .row_bytes(shape[1])
                .ok_or_else(|| LlmError::BadTensor {
                    name: info.name.clone(),
                    reason: format!(
                        "a row of {} elements is not whole {format} blocks",
                        shape[1]
                    ),
                })?;
            let bytes = unpermute_rows(&map[range], rows, row_bytes, config.head_dim);
            match format.storage() {
                Storage::Float(f) => Weight::from_bytes(&info.name, f, &shape, bytes)?,
                Storage::Quant(q) => Weight::quantized(&info.name, q, &shape, bytes)?,
            }
        } else {
            match format.storage() {
                Storage::Float(f) => Weight::mapped(f, shape, map, range),
                Storage::Quant(q) => Weight::mapped_quantized(&info.name, q, shape, map, range)?,
            }
        };
        tensors.insert(hf, weight);
    }
    Ok(WeightStore::from_tensors(tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hugging_face() {
        let hf_name = |n: &str| hf_name(Architecture::Llama.spec(), n);
        assert_eq!(
            hf_name("blk.3.attn_q.weight").unwrap(),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight").unwrap(),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(
            hf_name("blk.11.ffn_down.weight").unwrap(),
            "model.layers.11.mlp.down_proj.weight"
        );
        assert_eq!(hf_name("output.weight").unwrap(), "lm_head.weight");
        assert_eq!(hf_name("rope_freqs.weight"), None);
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        let gemma = |n: &str| super::hf_name(Architecture::Gemma2.spec(), n);
        assert_eq!(
            gemma("blk.1.ffn_norm.weight").unwrap(),
            "model.layers.1.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            gemma("blk.1.post_ffw_norm.weight").unwrap(),
            "model.layers.1.post_feedforward_layernorm.weight"
        );
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // llama.cpp's permutation of 2 heads of dim 4 (one byte per row):
        // reshape(heads, 2, D/2) then swap the last two axes.
        let (heads, d) = (2, 4);
        let hf: Vec<u8> = (0..(heads * d) as u8).collect();
        let mut gguf = vec![0u8; hf.len()];
        for h in 0..heads {
            for i in 0..2 {
                for j in 0..d / 2 {
                    gguf[h * d + j * 2 + i] = hf[h * d + i * (d / 2) + j];
                }
            }
        }
        assert_eq!(gguf, [0, 2, 1, 3, 4, 6, 5, 7]);
        assert_eq!(unpermute_rows(&gguf, heads * d, 1, d), hf);
    }
}
