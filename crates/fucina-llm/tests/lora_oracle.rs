//! fucina's LoRA against PyTorch + PEFT (`tests/fixtures/lora_oracle/`,
//! written by `scripts/lora_oracle.py`): from the adapters PEFT saved, on the
//! same batch, the gradient of every adapter matrix after one backward, and
//! the loss over 20 AdamW steps.

use std::path::{Path, PathBuf};

use fucina_llm::finetune::data::Batch;
use fucina_llm::finetune::trainer::batch_loss;
use fucina_llm::finetune::{TrainOptions, TrainableDecoder, Trainer, peft};
use fucina_llm::fucina::{ExecContext, checkpoint, no_grad};
use serde_json::Value;

/// The bound on `max |fucina - PEFT| / max |PEFT|` of each adapter's
/// gradient, and on the relative difference of each loss.
const TOL: f64 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The batch of `batch.json` (`input_ids` `[b, t]`, `labels` with -100 on
/// what is not predicted, transformers' convention: the logits of position
/// `i - 1` predict `labels[i]`).
fn batch(dir: &Path) -> Batch {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("batch.json")).unwrap()).unwrap();
    let rows = |k: &str| -> Vec<Vec<i64>> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect()
            })
            .collect()
    };
    let (ids, labels) = (rows("input_ids"), rows("labels"));
    let (b, t) = (ids.len(), ids[0].len());
    let mut out = Batch {
        ids: ids.iter().flatten().map(|&x| x as u32).collect(),
        b,
        t,
        positions: Vec::new(),
        labels: Vec::new(),
        packing: None,
    };
    for (r, row) in labels.iter().enumerate() {
        for (i, &l) in row.iter().enumerate().skip(1) {
            if l != -100 {
                out.positions.push((r * t + i - 1) as i64);
                out.labels.push(l);
            }
        }
    }
    out
}

/// The model with PEFT's starting adapters.
fn model(ctx: &ExecContext, name: &str) -> (TrainableDecoder, PathBuf) {
    let dir = fixture("lora_oracle").join(name);
    let cfg = peft::read_adapter_config(dir.join("init")).unwrap();
    let m = TrainableDecoder::load(ctx, fixture(name), &cfg).unwrap();
    peft::load_adapter_weights(ctx, &m, dir.join("init")).unwrap();
    (m, dir)
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs())
        .fold(0.0, f64::max);
    let scale = b.iter().map(|x| f64::from(*x).abs()).fold(0.0, f64::max);
    diff / scale
}

fn gradients_match(name: &str) {
    let ctx = ExecContext::new();
    let (m, dir) = model(&ctx, name);
    let batch = batch(&dir);
    batch_loss(&ctx, &m, &batch, None)
        .unwrap()
        .backward(&ctx)
        .unwrap();
    let (want, _) = checkpoint::read(&ctx, dir.join("grads.safetensors")).unwrap();
    let named = m.named_parameters();
    assert_eq!(want.len(), named.len(), "{name}: adapter count");
    let mut worst = 0f64;
    for (n, p) in &named {
        let (_, w) = want.iter().find(|(k, _)| k == n).expect(n);
        let g = p.grad(&ctx).unwrap().expect("an adapter gets a gradient");
        assert_eq!(g.shape(), w.shape(), "{n}");
        let r = rel(&g.to_vec(), &w.to_vec());
        assert!(
            r <= TOL,
            "{name}: {n}: relative gradient difference {r:.2e}"
        );
        worst = worst.max(r);
    }
    eprintln!(
        "{name}: worst relative gradient difference {worst:.2e} over {} adapters",
        named.len()
    );
}

#[test]
fn llama_gradients_match_peft() {
    gradients_match("llama_f32");
}

#[test]
fn qwen2_gradients_match_peft() {
    gradients_match("qwen2_f32");
}

fn losses_match(name: &str) {
    let ctx = ExecContext::new();
    let (m, dir) = model(&ctx, name);
    let batch = batch(&dir);
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("losses.json")).unwrap()).unwrap();
    let want: Vec<f64> = v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let lr = v["lr"].as_f64().unwrap() as f32;
    let opts = TrainOptions {
        lr,
        min_lr: lr,
        warmup_steps: 0,
        weight_decay: 0.0,
        max_grad_norm: None,
        batch: batch.b,
        ..TrainOptions::default()
    };
    let mut trainer = Trainer::new(m, opts, want.len() as u64).unwrap();
    let mut worst = 0f64;
    for (s, &w) in want.iter().enumerate() {
        let l = f64::from(trainer.step(&ctx, &batch).unwrap());
        let r = (l - w).abs() / w.abs();
        assert!(
            r <= TOL,
            "{name}: step {s}: loss {l} against PEFT's {w} ({r:.2e})"
        );
        worst = worst.max(r);
    }
    let final_loss = {
        let _g = no_grad();
        f64::from(
            batch_loss(&ctx, trainer.model(), &batch, None)
                .unwrap()
                .item()
                .unwrap(),
        )
    };
    let w = v["final_loss"].as_f64().unwrap();
    let r = (final_loss - w).abs() / w;
    assert!(r <= TOL, "{name}: final loss {final_loss} against {w}");
    // The adapters after 20 steps, against PEFT's.
    let (want_final, _) =
        checkpoint::read(&ctx, dir.join("final").join(peft::ADAPTER_WEIGHTS)).unwrap();
    let mut worst_param = 0f64;
    for (n, p) in trainer.model().named_parameters() {
        let (_, w) = want_final
            .iter()
            .find(|(k, _)| *k == n)
            .expect("in the file");
        worst_param = worst_param.max(rel(&p.to_vec(), &w.to_vec()));
    }
    assert!(
        worst_param <= TOL,
        "{name}: adapters after 20 steps differ by {worst_param:.2e}"
    );
    eprintln!(
        "{name}: 20 AdamW steps: worst relative loss difference {:.2e} (final {r:.2e}), adapters {worst_param:.2e}",
        worst
    );
}

#[test]
fn llama_loss_curve_matches_peft() {
    losses_match("llama_f32");
}

#[test]
fn qwen2_loss_curve_matches_peft() {
    losses_match("qwen2_f32");
}
