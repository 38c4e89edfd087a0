//! Adapters as PEFT writes them: a directory with `adapter_model.safetensors`
//! (f32 tensors named `base_model.model.model.layers.{i}.{module}.lora_A.weight`
//! and `.lora_B.weight`, `A` `[r, in]`, `B` `[out, r]`) and
//! `adapter_config.json` (`peft_type: "LORA"`, `task_type: "CAUSAL_LM"`, `r`,
//! `lora_alpha`, `lora_dropout`, `target_modules`, ...), which
//! `peft.PeftModel.from_pretrained` loads; and adapters merged into a model
//! ([`merge_adapter`]) and a model written as a Hugging Face directory
//! ([`write_model_dir`]).

use std::path::Path;

use fucina::ExecContext;
use serde_json::json;

use super::decoder::TrainableDecoder;
use super::error::{FinetuneError, invalid};
use super::lora::{LoraConfig, Target};

/// The weights file of an adapter directory.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// The configuration file of an adapter directory.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

/// The `adapter_config.json` of `lora` over the base model `base` (PEFT's
/// `base_model_name_or_path`).
pub fn adapter_config_json(lora: &LoraConfig, base: &str) -> String {
    let targets: Vec<&str> = lora.targets.iter().map(|t| t.name()).collect();
    let v = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.r,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": null,
    });
    serde_json::to_string_pretty(&v).expect("a JSON value serializes")
}

/// Writes the adapters of `model` to directory `dir` (created if absent) as
/// PEFT does; `base` is recorded as the base model's name or path.
///
/// # Errors
/// [`FinetuneError::Io`] when the directory or a file cannot be written; a
/// checkpoint error.
pub fn save_adapter(
    model: &TrainableDecoder,
    dir: impl AsRef<Path>,
    base: &str,
) -> Result<(), FinetuneError> {
    let dir = dir.as_ref();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FinetuneError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let named = model.named_parameters();
    let tensors: Vec<(String, fucina::Tensor)> =
        named.iter().map(|(n, p)| (n.clone(), p.tensor())).collect();
    let refs: Vec<(&str, &fucina::Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    fucina::checkpoint::save(dir.join(ADAPTER_WEIGHTS), &refs, &[("format", "pt")])?;
    let cfg = dir.join(ADAPTER_CONFIG);
    std::fs::write(&cfg, adapter_config_json(model.lora_config(), base)).map_err(io(&cfg))?;
    Ok(())
}

/// Reads `adapter_config.json` of `dir` into a [`LoraConfig`] (seed 0).
///
/// # Errors
/// [`FinetuneError::Io`]; [`FinetuneError::Invalid`] for a file that is not
/// a LoRA configuration this crate applies (rsLoRA, DoRA, per-module ranks,
/// an unknown target).
pub fn read_adapter_config(dir: impl AsRef<Path>) -> Result<LoraConfig, FinetuneError> {
    const OP: &str = "read_adapter_config";
    let path = dir.as_ref().join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).map_err(|source| FinetuneError::Io {
        path: path.clone(),
        source,
    })?;
    let bad = |reason: String| invalid(OP, format!("{}: {reason}", path.display()));
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    if v["peft_type"].as_str() != Some("LORA") {
        return Err(bad(format!("peft_type {} is not \"LORA\"", v["peft_type"])));
    }
    for flag in ["use_rslora", "use_dora"] {
        if v[flag].as_bool() == Some(true) {
            return Err(bad(format!("{flag} is not supported")));
        }
    }
    for map in ["rank_pattern", "alpha_pattern"] {
        if v[map].as_object().is_some_and(|m| !m.is_empty()) {
            return Err(bad(format!("{map} is not supported")));
        }
    }
    let r = v["r"]
        .as_u64()
        .ok_or_else(|| bad(format!("r {} is not a count", v["r"])))? as usize;
    let alpha = v["lora_alpha"]
        .as_f64()
        .ok_or_else(|| bad(format!("lora_alpha {} is not a number", v["lora_alpha"])))?
        as f32;
    let dropout = v["lora_dropout"].as_f64().unwrap_or(0.0) as f32;
    let targets = match &v["target_modules"] {
        serde_json::Value::Array(a) => {
            let mut t = Vec::new();
            for name in a {
                let name = name.as_str().unwrap_or_default();
                t.push(
                    Target::from_name(name)
                        .ok_or_else(|| bad(format!("unknown target module `{name}`")))?,
                );
            }
            t.sort();
            t.dedup();
            t
        }
        other => return Err(bad(format!("target_modules {other} is not a list"))),
    };
    let cfg = LoraConfig {
        r,
        alpha,
        dropout,
        targets,
        seed: 0,
    };
    cfg.check()?;
    Ok(cfg)
}

/// Loads the adapter weights of `dir` into `model`'s adapters: every adapter
/// of the model must be in the file with its shape, and the file must hold
/// no other tensor. Nothing changes on an error.
///
/// # Errors
/// [`FinetuneError::Invalid`] naming a missing, extra or misshapen tensor;
/// checkpoint errors.
pub fn load_adapter_weights(
    ctx: &ExecContext,
    model: &TrainableDecoder,
    dir: impl AsRef<Path>,
) -> Result<(), FinetuneError> {
    const OP: &str = "load_adapter_weights";
    let path = dir.as_ref().join(ADAPTER_WEIGHTS);
    let (tensors, _) = fucina::checkpoint::read(ctx, &path)?;
    let named = model.named_parameters();
    if let Some((extra, _)) = tensors
        .iter()
        .find(|(n, _)| !named.iter().any(|(m, _)| m == n))
    {
        return Err(invalid(
            OP,
            format!(
                "{}: tensor {extra} is not an adapter of the model",
                path.display()
            ),
        ));
    }
    let mut values = Vec::with_capacity(named.len());
    for (name, p) in &named {
        let (_, t) = tensors
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| invalid(OP, format!("{}: tensor {name} is missing", path.display())))?;
        if t.shape() != p.shape().as_slice() {
            return Err(invalid(
                OP,
                format!(
                    "{}: tensor {name} has shape {:?}, the model's adapter {:?}",
                    path.display(),
                    t.shape(),
                    p.shape().as_slice()
                ),
            ));
        }
        values.push(t.to_vec());
    }
    for ((_, p), v) in named.iter().zip(values) {
        p.copy_from_slice(&v)?;
    }
    Ok(())
}

/// `store` with the adapters of directory `dir` merged into their base
/// matrices: each targeted `[out, in]` matrix becomes `W + (alpha / r) · B ·
/// A`, computed and kept in f32 (a merged matrix is f32 whatever the base's
/// format; the others are shared with `store`). The adapter directory is
/// PEFT's (written by [`save_adapter`] or by PEFT).
///
/// # Errors
/// [`FinetuneError::Invalid`] naming a tensor of the file that is not an
/// adapter of a matrix of `store`, an adapter without its pair, or shapes
/// that do not fit; the errors of [`read_adapter_config`]; checkpoint errors.
pub fn merge_adapter(
    ctx: &ExecContext,
    store: &crate::weights::WeightStore,
    dir: impl AsRef<Path>,
) -> Result<crate::weights::WeightStore, FinetuneError> {
    const OP: &str = "merge_adapter";
    let dir = dir.as_ref();
    let cfg = read_adapter_config(dir)?;
    let path = dir.join(ADAPTER_WEIGHTS);
    let (tensors, _) = fucina::checkpoint::read(ctx, &path)?;
    let bad = |reason: String| invalid(OP, format!("{}: {reason}", path.display()));
    let mut merged: std::collections::HashMap<String, crate::weights::Weight> = store
        .iter()
        .map(|(n, w)| (n.to_string(), w.clone()))
        .collect();
    for (name, a) in &tensors {
        let Some(prefix) = name.strip_suffix(".lora_A.weight") else {
            if name.ends_with(".lora_B.weight") {
                continue; // taken with its A
            }
            return Err(bad(format!("tensor {name} is not a LoRA matrix")));
        };
        let b_name = format!("{prefix}.lora_B.weight");
        let (_, b) = tensors
            .iter()
            .find(|(n, _)| *n == b_name)
            .ok_or_else(|| bad(format!("{name} has no {b_name}")))?;
        let base_name = format!(
            "{}.weight",
            prefix.strip_prefix("base_model.model.").unwrap_or(prefix)
        );
        let base = store
            .get(&base_name)
            .map_err(|_| bad(format!("{name}: the model has no matrix {base_name}")))?;
        let (a_s, b_s, w_s) = (a.shape(), b.shape(), base.shape());
        if a_s.len() != 2
            || b_s.len() != 2
            || w_s.len() != 2
            || a_s[0] != b_s[1]
            || b_s[0] != w_s[0]
            || a_s[1] != w_s[1]
        {
            return Err(bad(format!(
                "{prefix}: A {a_s:?} and B {b_s:?} do not fit the matrix {w_s:?}"
            )));
        }
        if base.quant_format().is_some() {
            return Err(bad(format!(
                "{base_name} is block-quantized: merge into the file's own weights"
            )));
        }
        let delta = ctx.matmul(b.raw(), a.raw())?;
        let s = cfg.scaling();
        let mut w = base.to_f32_vec();
        for (x, d) in w.iter_mut().zip(delta.data()?) {
            *x += s * d;
        }
        let w = crate::weights::Weight::from_f32(fucina::exec::WeightFormat::F32, w_s, &w)?;
        merged.insert(base_name, w);
    }
    Ok(crate::weights::WeightStore::from_tensors(merged))
}

/// Writes the model of `store` as a Hugging Face directory `out` (created if
/// absent): `model.safetensors` with every tensor in f32, and the files of
/// the model directory `src` that describe it (`config.json` with its dtype
/// set to `float32`, `generation_config.json`, the tokenizer's files), so that
/// transformers' `from_pretrained` and [`Model::load`](crate::Model::load)
/// load it. Every tensor is widened in memory at once (four bytes per
/// weight).
///
/// # Errors
/// [`FinetuneError::Io`] naming a file that cannot be read or written;
/// [`FinetuneError::Invalid`] for a `config.json` that is not a JSON object;
/// checkpoint errors.
pub fn write_model_dir(
    ctx: &ExecContext,
    store: &crate::weights::WeightStore,
    src: impl AsRef<Path>,
    out: impl AsRef<Path>,
) -> Result<(), FinetuneError> {
    let (src, out) = (src.as_ref(), out.as_ref());
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FinetuneError::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let cfg_path = src.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(io(&cfg_path))?;
    let mut cfg: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| invalid("write_model_dir", format!("{}: {e}", cfg_path.display())))?;
    let Some(obj) = cfg.as_object_mut() else {
        return Err(invalid(
            "write_model_dir",
            format!("{}: not a JSON object", cfg_path.display()),
        ));
    };
    for key in ["torch_dtype", "dtype"] {
        if obj.contains_key(key) {
            obj.insert(key.to_string(), json!("float32"));
        }
    }
    let dst = out.join("config.json");
    std::fs::write(&dst, serde_json::to_string_pretty(&cfg).expect("JSON")).map_err(io(&dst))?;
    for f in [
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
    ] {
        let from = src.join(f);
        if from.exists() {
            std::fs::copy(&from, out.join(f)).map_err(io(&from))?;
        }
    }
    let mut tensors = Vec::with_capacity(store.len());
    for (name, w) in store.iter() {
        tensors.push((
            name.to_string(),
            fucina::Tensor::from_slice(ctx, w.shape(), &w.to_f32_vec())?,
        ));
    }
    let refs: Vec<(&str, &fucina::Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    fucina::checkpoint::save(out.join("model.safetensors"), &refs, &[("format", "pt")])?;
    Ok(())
}
