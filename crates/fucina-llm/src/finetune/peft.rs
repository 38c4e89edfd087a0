//! Adapters as PEFT writes them: a directory with `adapter_model.safetensors`
//! (f32 tensors named `base_model.model.model.layers.{i}.{module}.lora_A.weight`
//! and `.lora_B.weight`, `A` `[r, in]`, `B` `[out, r]`) and
//! `adapter_config.json` (`peft_type: "LORA"`, `task_type: "CAUSAL_LM"`, `r`,
//! `lora_alpha`, `lora_dropout`, `target_modules`, ...), which
//! `peft.PeftModel.from_pretrained` loads.

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
