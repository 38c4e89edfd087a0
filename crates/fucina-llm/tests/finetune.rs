//! The trainable decoder of `fucina_llm::finetune` on the fixture models:
//! its logits against the inference decoder's, the adapters (fresh ones leave
//! the logits unchanged, only they receive gradients), a few training steps
//! that lower the loss, the PEFT files and the data errors. (The same bits
//! for every thread count and vector level: `finetune_invariance.rs`.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fucina_llm::finetune::data::{Batch, Example};
use fucina_llm::finetune::trainer::{Event, batch_loss};
use fucina_llm::finetune::{
    FinetuneError, LoraConfig, Target, TrainOptions, TrainableDecoder, Trainer, peft, read_jsonl,
};
use fucina_llm::fucina::ExecContext;
use fucina_llm::fucina::exec::WeightFormat;
use fucina_llm::model::Model;
use fucina_llm::{LoadDtype, Weight, WeightStore};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn prompt(name: &str) -> Vec<u32> {
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(name).join("reference.json")).unwrap(),
    )
    .unwrap();
    r["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn all_targets(r: usize) -> LoraConfig {
    LoraConfig {
        r,
        alpha: 2.0 * r as f32,
        dropout: 0.0,
        targets: Target::ALL.to_vec(),
        seed: 7,
    }
}

/// The tolerance on logits against the inference decoder: the same weights
/// and tables, sums in other orders (f32 logits of magnitude up to ~14).
const LOGIT_TOL: f32 = 5e-5;

/// The trainable decoder's logits equal the inference decoder's within
/// [`LOGIT_TOL`] on every architecture it builds, with fresh adapters
/// (`B = 0`) on all seven projections.
#[test]
fn logits_match_the_inference_decoder() {
    let ctx = ExecContext::new();
    for name in [
        "llama_f32",
        "llama_bf16",
        "llama_f16",
        "llama3_rope_f32",
        "llama_linear_f32",
        "qwen2_f32",
        "mistral_f32",
        "qwen3_f32",
    ] {
        let dir = fixture(name);
        let ids = prompt(name);
        let all = inference_logits(&ctx, &Model::load(&dir).unwrap(), &ids);
        let train = TrainableDecoder::load(&ctx, &dir, &all_targets(4)).unwrap();
        let got = train.logits(&ctx, &ids, 1, ids.len()).unwrap().to_vec();
        let diff = max_diff(&got, &all);
        assert!(diff <= LOGIT_TOL, "{name}: max |logit diff| {diff}");
        eprintln!("{name}: max |trainable - inference logit| {diff:.2e}");
    }
}

/// Two rows of a batch give the logits each gives alone (right padding is
/// never attended by a real token).
#[test]
fn a_padded_batch_row_equals_the_row_alone() {
    let ctx = ExecContext::new();
    let dir = fixture("llama_f32");
    let ids = prompt("llama_f32");
    let train = TrainableDecoder::load(&ctx, &dir, &all_targets(4)).unwrap();
    let short = &ids[..7];
    let v = train.config().vocab_size;
    let t = ids.len();
    let mut both = ids.clone();
    both.extend(short);
    both.extend(std::iter::repeat_n(0, t - short.len()));
    let batched = train.logits(&ctx, &both, 2, t).unwrap().to_vec();
    let alone = train.logits(&ctx, short, 1, short.len()).unwrap().to_vec();
    let row1 = &batched[t * v..(t + short.len()) * v];
    let diff = row1
        .iter()
        .zip(&alone)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff <= 1e-5, "{diff}");
}

/// The architectures the trainable decoder does not build are refused by
/// name.
#[test]
fn unsupported_architectures_are_refused() {
    let ctx = ExecContext::new();
    for name in ["gemma2_f32", "phi3_f32", "qwen3_moe_f32"] {
        let e = TrainableDecoder::load(&ctx, fixture(name), &all_targets(2)).unwrap_err();
        assert!(
            matches!(e, FinetuneError::Invalid { .. }) && e.to_string().contains("not supported"),
            "{name}: {e}"
        );
    }
}

/// Six examples of 9 to 14 tokens from the cycled `ids`, prompts of 0 to 2.
fn examples(ids: &[u32]) -> Vec<Example> {
    let ids: Vec<u32> = ids.iter().copied().cycle().take(40).collect();
    (0..6)
        .map(|k| Example {
            ids: ids[k..k + 9 + k].to_vec(),
            prompt_len: k % 3,
        })
        .collect()
}

/// Training moves only the adapters (the base weights get no gradient: the
/// logits of a model with the adapters zeroed again are the base's), and a
/// few steps on a repeated batch lower its loss.
#[test]
fn training_lowers_the_loss_and_changes_only_the_adapters() {
    let ctx = ExecContext::new();
    let dir = fixture("llama_f32");
    let ids = prompt("llama_f32");
    let lora = LoraConfig {
        targets: vec![Target::QProj, Target::VProj, Target::DownProj],
        ..all_targets(4)
    };
    let model = TrainableDecoder::load(&ctx, &dir, &lora).unwrap();
    let before = model.logits(&ctx, &ids, 1, ids.len()).unwrap().to_vec();
    let ex = examples(&ids);
    let refs: Vec<&Example> = ex.iter().collect();
    let batch = Batch::new(&refs, 0).unwrap();
    let opts = TrainOptions {
        lr: 1e-2,
        batch: 6,
        ..TrainOptions::default()
    };
    let mut trainer = Trainer::new(model, opts, 10).unwrap();
    let mut losses = Vec::new();
    for _ in 0..10 {
        losses.push(trainer.step(&ctx, &batch).unwrap());
    }
    assert!(
        losses[9] < losses[0] - 0.05,
        "the loss did not fall: {losses:?}"
    );
    let model = trainer.into_model();
    // Every B moved off zero (the A's got gradients through them).
    for (name, p) in model.named_parameters() {
        if name.contains("lora_B") {
            assert!(p.to_vec().iter().any(|&v| v != 0.0), "{name} unchanged");
        }
    }
    // B = 0 again: the base model's logits, bit for bit (the base never
    // changed).
    for (name, p) in model.named_parameters() {
        if name.contains("lora_B") {
            p.copy_from_slice(&vec![0.0; p.numel()]).unwrap();
        }
    }
    let after = model.logits(&ctx, &ids, 1, ids.len()).unwrap().to_vec();
    assert_eq!(before, after);
}

/// Saved adapters are PEFT's files, and they load back bit for bit.
#[test]
fn adapters_round_trip_through_peft_files() {
    let ctx = ExecContext::new();
    let dir = fixture("qwen2_f32");
    let lora = LoraConfig {
        targets: vec![Target::KProj, Target::OProj, Target::UpProj],
        ..all_targets(3)
    };
    let model = TrainableDecoder::load(&ctx, &dir, &lora).unwrap();
    for (_, p) in model.named_parameters() {
        let v: Vec<f32> = (0..p.numel()).map(|i| (i as f32 * 0.37).sin()).collect();
        p.copy_from_slice(&v).unwrap();
    }
    let out = std::env::temp_dir().join(format!("fucina-lora-rt-{}", std::process::id()));
    peft::save_adapter(&model, &out, "qwen2_f32").unwrap();
    let cfg = peft::read_adapter_config(&out).unwrap();
    assert_eq!((cfg.r, cfg.alpha, cfg.dropout), (3, 6.0, 0.0));
    assert_eq!(cfg.targets, lora.targets);
    let (tensors, _) =
        fucina_llm::fucina::checkpoint::read(&ctx, out.join(peft::ADAPTER_WEIGHTS)).unwrap();
    let mut names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names.len(), 2 * 3 * model.config().num_hidden_layers);
    assert!(names.contains(&"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"));
    assert!(names.contains(&"base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"));
    let fresh = TrainableDecoder::load(&ctx, &dir, &cfg).unwrap();
    peft::load_adapter_weights(&ctx, &fresh, &out).unwrap();
    for ((n, a), (_, b)) in model
        .named_parameters()
        .iter()
        .zip(fresh.named_parameters())
    {
        assert_eq!(a.to_vec(), b.to_vec(), "{n}");
    }
    // A model with other targets refuses the file, naming the tensor.
    let other = TrainableDecoder::load(&ctx, &dir, &all_targets(3)).unwrap();
    let e = peft::load_adapter_weights(&ctx, &other, &out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing"), "{e}");
    std::fs::remove_dir_all(&out).unwrap();
}

/// A malformed JSONL record is an error naming the file and the line.
#[test]
fn a_malformed_record_names_its_line() {
    let tok =
        fucina_llm::Tokenizer::from_file(fixture("llama_f32").join("tokenizer.json")).unwrap();
    let path = std::env::temp_dir().join(format!("fucina-lora-data-{}.jsonl", std::process::id()));
    std::fs::write(
        &path,
        "{\"prompt\": \"ab\", \"completion\": \"cd\"}\n\n{\"text\": \"hello\"}\n{\"prompt\": 1, \"completion\": \"x\"}\n",
    )
    .unwrap();
    let e = read_jsonl(&path, &tok, Some(1), 64).unwrap_err();
    assert!(matches!(e, FinetuneError::Data { line: 4, .. }), "{e}");
    assert!(
        e.to_string().contains(":4: `prompt` must be a string"),
        "{e}"
    );
    std::fs::write(
        &path,
        "{\"prompt\": \"ab\", \"completion\": \"cd\"}\n{\"text\": \"hello\"}\n",
    )
    .unwrap();
    let ex = read_jsonl(&path, &tok, Some(1), 64).unwrap();
    assert_eq!(ex.len(), 2);
    let p = tok.encode("ab", true).unwrap();
    assert_eq!(ex[0].prompt_len, p.len());
    assert_eq!(ex[0].ids[..p.len()], p[..]);
    assert_eq!(*ex[0].ids.last().unwrap(), 1);
    assert_eq!(ex[1].prompt_len, 0);
    std::fs::remove_file(&path).unwrap();
}

/// The loss of a batch is transformers' causal-LM loss: the mean over the
/// predicted tokens of the cross-entropy of the logits one position earlier.
#[test]
fn the_batch_loss_is_the_mean_over_predicted_tokens() {
    let ctx = ExecContext::new();
    let dir = fixture("mistral_f32");
    let ids = prompt("mistral_f32");
    let model = TrainableDecoder::load(&ctx, &dir, &all_targets(2)).unwrap();
    let ex = examples(&ids);
    let refs: Vec<&Example> = ex[..2].iter().collect();
    let batch = Batch::new(&refs, 0).unwrap();
    let loss = batch_loss(&ctx, &model, &batch, None)
        .unwrap()
        .item()
        .unwrap();
    let v = model.config().vocab_size;
    let logits = model
        .logits(&ctx, &batch.ids, batch.b, batch.t)
        .unwrap()
        .to_vec();
    let mut sum = 0f64;
    for (&p, &l) in batch.positions.iter().zip(&batch.labels) {
        let row = &logits[p as usize * v..(p as usize + 1) * v];
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        sum += lse - row[l as usize] as f64;
    }
    let want = sum / batch.positions.len() as f64;
    assert!(
        (loss as f64 - want).abs() <= 1e-5 * want.abs(),
        "{loss} vs {want}"
    );
}

/// `store` with every tensor widened to f32 (the same values).
fn widened(store: &WeightStore) -> WeightStore {
    WeightStore::from_tensors(
        store
            .iter()
            .map(|(n, w)| {
                let v = Weight::from_f32(WeightFormat::F32, w.shape(), &w.to_f32_vec()).unwrap();
                (n.to_string(), v)
            })
            .collect::<HashMap<_, _>>(),
    )
}

/// Logits and the adapters' gradients of one backward, with `B` set non-zero.
fn logits_and_grads(
    ctx: &ExecContext,
    model: &TrainableDecoder,
    batch: &Batch,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    for (n, p) in model.named_parameters() {
        if n.contains("lora_B") {
            let v: Vec<f32> = (0..p.numel())
                .map(|i| 0.05 * (i as f32 * 0.71).sin())
                .collect();
            p.copy_from_slice(&v).unwrap();
        }
    }
    let logits = model
        .logits(ctx, &batch.ids, batch.b, batch.t)
        .unwrap()
        .to_vec();
    batch_loss(ctx, model, batch, None)
        .unwrap()
        .backward(ctx)
        .unwrap();
    let grads = model
        .parameters()
        .iter()
        .map(|p| p.grad(ctx).unwrap().unwrap().to_vec())
        .collect();
    (logits, grads)
}

/// A bf16 or f16 base (kept in its format, widened per block of rows as
/// each product reads it) gives the logits and the adapters' gradients of
/// the same values widened to f32, bit for bit.
#[test]
fn bf16_and_f16_bases_train_as_their_f32_values() {
    let ctx = ExecContext::new();
    let ids = prompt("llama_f32");
    let ex = examples(&ids);
    let refs: Vec<&Example> = ex.iter().collect();
    let batch = Batch::new(&refs, 0).unwrap();
    let config =
        fucina_llm::ModelConfig::from_file(fixture("llama_f32").join("config.json")).unwrap();
    for name in ["llama_bf16", "llama_f16"] {
        let store = WeightStore::open(fixture(name)).unwrap();
        let lora = all_targets(4);
        let a = TrainableDecoder::from_parts(&ctx, config.clone(), &store, &lora).unwrap();
        let b =
            TrainableDecoder::from_parts(&ctx, config.clone(), &widened(&store), &lora).unwrap();
        let (la, ga) = logits_and_grads(&ctx, &a, &batch);
        let (lb, gb) = logits_and_grads(&ctx, &b, &batch);
        // The bf16/f16 products widen the matrix into the f32 GEMM that the
        // f32 model's `linear` and `matmul` run: the same bits.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&la), bits(&lb), "{name}: logits differ");
        for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
            assert_eq!(bits(x), bits(y), "{name}: gradient {i} differs");
        }
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The largest `max |a - b| / max |b|` over the pairs of tensors.
fn worst_relative(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| max_diff(x, y) / y.iter().fold(0f32, |m, v| m.max(v.abs())))
        .fold(0f32, f32::max)
}

/// A Q8_0 base (`WeightStore::convert`) runs the inference kernel forward
/// (its logits are the inference decoder's on the same store, whose products
/// quantize the activations to 8 bits as llama.cpp's do), and its backward
/// widens the matrices: the gradients are those of the dequantized f32 model
/// up to the activations' 8-bit rounding in the forward.
#[test]
fn a_q8_0_base_trains_through_the_quantized_kernel() {
    let ctx = ExecContext::new();
    let ids = prompt("llama_f32");
    let ex = examples(&ids);
    let refs: Vec<&Example> = ex.iter().collect();
    let batch = Batch::new(&refs, 0).unwrap();
    let config =
        fucina_llm::ModelConfig::from_file(fixture("llama_f32").join("config.json")).unwrap();
    let q8 = WeightStore::open(fixture("llama_f32"))
        .unwrap()
        .convert(&ctx, LoadDtype::Q8_0, config.tie_word_embeddings)
        .unwrap();
    let lora = all_targets(4);
    let a = TrainableDecoder::from_parts(&ctx, config.clone(), &q8, &lora).unwrap();
    // Fresh adapters: the inference decoder's logits.
    let all = inference_logits(
        &ctx,
        &Model::from_parts(config.clone(), q8.clone()).unwrap(),
        &ids,
    );
    let got = a.logits(&ctx, &ids, 1, ids.len()).unwrap().to_vec();
    let dl = max_diff(&got, &all);
    assert!(
        dl <= LOGIT_TOL,
        "logits differ from the inference decoder's by {dl}"
    );
    let b = TrainableDecoder::from_parts(&ctx, config, &widened(&q8), &lora).unwrap();
    let (_, ga) = logits_and_grads(&ctx, &a, &batch);
    let (_, gb) = logits_and_grads(&ctx, &b, &batch);
    let worst = worst_relative(&ga, &gb);
    assert!(worst <= 5e-2, "gradients differ by {worst:.2e} relative");
    eprintln!(
        "Q8_0: logits {dl:.2e} from inference, gradients {worst:.2e} relative to the dequantized f32 model"
    );
}

/// An optimizer step over two micro-batches of two examples takes the
/// gradient of one batch of the four: the same loss and update within
/// rounding (AdamW with a large epsilon, so the update is close to linear in
/// the gradient).
#[test]
fn gradient_accumulation_equals_one_larger_batch() {
    let ctx = ExecContext::new();
    let dir = fixture("llama_f32");
    let ex = examples(&prompt("llama_f32"));
    let lora = LoraConfig {
        targets: vec![Target::QProj, Target::VProj, Target::UpProj],
        ..all_targets(4)
    };
    let run = |parts: &[&[Example]]| {
        let model = TrainableDecoder::load(&ctx, &dir, &lora).unwrap();
        for (n, p) in model.named_parameters() {
            if n.contains("lora_B") {
                let v: Vec<f32> = (0..p.numel()).map(|i| 0.05 * (i as f32).cos()).collect();
                p.copy_from_slice(&v).unwrap();
            }
        }
        let before: Vec<Vec<f32>> = model.parameters().iter().map(|p| p.to_vec()).collect();
        let opts = TrainOptions {
            lr: 1e-2,
            eps: 1.0,
            max_grad_norm: None,
            ..TrainOptions::default()
        };
        let mut trainer = Trainer::new(model, opts, 1).unwrap();
        let batches: Vec<Batch> = parts
            .iter()
            .map(|p| Batch::new(&p.iter().collect::<Vec<_>>(), 0).unwrap())
            .collect();
        let loss = trainer.step_accumulated(&ctx, &batches).unwrap();
        let deltas: Vec<Vec<f32>> = trainer
            .model()
            .parameters()
            .iter()
            .zip(&before)
            .map(|(p, b)| p.to_vec().iter().zip(b).map(|(x, y)| x - y).collect())
            .collect();
        (loss, deltas)
    };
    let (one_loss, one) = run(&[&ex[..4]]);
    let (acc_loss, acc) = run(&[&ex[..2], &ex[2..4]]);
    assert!(
        (one_loss - acc_loss).abs() <= 1e-6 * one_loss,
        "{one_loss} vs {acc_loss}"
    );
    let worst = worst_relative(&acc, &one);
    assert!(worst <= 1e-4, "updates differ by {worst:.2e} relative");
}

/// A job stopped after its third step (a checkpoint written there) and
/// resumed from the checkpoint in a fresh process state gives the losses and
/// adapter bits of the job that never stopped (dropout, warmup-cosine,
/// clipping, accumulation and an epoch boundary on the way).
#[test]
fn a_resumed_job_is_the_same_bits_as_an_uninterrupted_one() {
    let ctx = ExecContext::with_threads(2);
    let dir = fixture("llama_f32");
    let ex = examples(&prompt("llama_f32"));
    let lora = LoraConfig {
        dropout: 0.1,
        ..all_targets(4)
    };
    let opts = TrainOptions {
        lr: 1e-2,
        warmup_steps: 1,
        batch: 2,
        grad_accum: 2,
        epochs: 3,
        ..TrainOptions::default()
    };
    let (train, eval) = (&ex[..5], &ex[5..]);
    let steps = opts.total_steps(train.len());
    assert_eq!(steps, 6);
    let trainer = |seed: u64| {
        let model = TrainableDecoder::load(
            &ctx,
            &dir,
            &LoraConfig {
                seed,
                ..lora.clone()
            },
        )
        .unwrap();
        Trainer::new(model, opts.clone(), steps).unwrap()
    };
    let bits = |t: &Trainer| -> Vec<u32> {
        t.model()
            .parameters()
            .iter()
            .flat_map(|p| p.to_vec())
            .map(f32::to_bits)
            .collect()
    };
    let record = |losses: &mut Vec<(u64, u32)>, e: Event| match e {
        Event::Step { step, loss, .. } => losses.push((step, loss.to_bits())),
        Event::Epoch { epoch, eval_loss } => {
            losses.push((1000 + epoch as u64, eval_loss.unwrap().to_bits()))
        }
    };
    let mut whole = Vec::new();
    let mut t = trainer(5);
    t.fit(&ctx, train, eval, |_, e| {
        record(&mut whole, e);
        Ok(())
    })
    .unwrap();
    let want = bits(&t);

    let ckpt = std::env::temp_dir().join(format!("fucina-lora-resume-{}", std::process::id()));
    let mut first = Vec::new();
    let mut t = trainer(5);
    let stop = t.fit(&ctx, train, eval, |t, e| {
        record(&mut first, e);
        if let Event::Step { step: 3, .. } = e {
            t.save_checkpoint(&ckpt, "llama_f32")?;
            return Err(FinetuneError::Invalid {
                op: "test",
                reason: "stop".into(),
            });
        }
        Ok(())
    });
    assert!(stop.is_err());
    // Another seed: the checkpoint replaces the adapters' initialization.
    let mut t = trainer(6);
    t.load_checkpoint(&ctx, &ckpt).unwrap();
    assert_eq!(t.steps(), 3);
    t.fit(&ctx, train, eval, |_, e| {
        record(&mut first, e);
        Ok(())
    })
    .unwrap();
    assert_eq!(first, whole);
    assert_eq!(bits(&t), want);
    std::fs::remove_dir_all(&ckpt).unwrap();
}

/// The inference decoder's logits on prompt `ids` of `model`.
fn inference_logits(ctx: &ExecContext, model: &Model, ids: &[u32]) -> Vec<f32> {
    let v = model.config().vocab_size;
    let mut cache = model.new_cache(ctx, ids.len()).unwrap();
    let (mut all, mut last) = (vec![0f32; ids.len() * v], vec![0f32; v]);
    model
        .prefill(ctx, &mut cache, ids, Some(&mut all), &mut last)
        .unwrap();
    all
}

/// Trained adapters merged into the base (`peft::merge_adapter`) give the
/// inference decoder the trainable decoder's logits; the merged model written
/// as a directory (`peft::write_model_dir`) loads back to the same bits.
#[test]
fn merged_adapters_give_the_inference_decoder_the_trained_logits() {
    let ctx = ExecContext::new();
    for name in ["llama_f32", "llama_bf16"] {
        let dir = fixture(name);
        let ids = prompt(name);
        let model = TrainableDecoder::load(&ctx, &dir, &all_targets(4)).unwrap();
        let ex = examples(&ids);
        let refs: Vec<&Example> = ex.iter().collect();
        let batch = Batch::new(&refs, 0).unwrap();
        let opts = TrainOptions {
            lr: 1e-2,
            batch: 6,
            ..TrainOptions::default()
        };
        let mut trainer = Trainer::new(model, opts, 3).unwrap();
        for _ in 0..3 {
            trainer.step(&ctx, &batch).unwrap();
        }
        let trained = trainer
            .model()
            .logits(&ctx, &ids, 1, ids.len())
            .unwrap()
            .to_vec();
        let tmp =
            std::env::temp_dir().join(format!("fucina-lora-merge-{name}-{}", std::process::id()));
        let adapter = tmp.join("adapter");
        peft::save_adapter(trainer.model(), &adapter, name).unwrap();
        let config = fucina_llm::ModelConfig::from_file(dir.join("config.json")).unwrap();
        let merged =
            peft::merge_adapter(&ctx, &WeightStore::open(&dir).unwrap(), &adapter).unwrap();
        let inference = Model::from_parts(config.clone(), merged.clone()).unwrap();
        let got = inference_logits(&ctx, &inference, &ids);
        let base = inference_logits(&ctx, &Model::load(&dir).unwrap(), &ids);
        assert!(
            max_diff(&trained, &base) > 1e-2,
            "{name}: training changed nothing"
        );
        let d = max_diff(&got, &trained);
        assert!(d <= LOGIT_TOL, "{name}: merged logits differ by {d}");
        let out = tmp.join("merged");
        peft::write_model_dir(&ctx, &merged, &dir, &out).unwrap();
        let reloaded = Model::load(&out).unwrap();
        assert_eq!(inference_logits(&ctx, &reloaded, &ids), got, "{name}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}

/// An adapter file that does not fit the model is refused by name.
#[test]
fn merging_a_misfit_adapter_is_refused() {
    let ctx = ExecContext::new();
    let tmp = std::env::temp_dir().join(format!("fucina-lora-misfit-{}", std::process::id()));
    // qwen2_f32's adapters (hidden 48) against llama_f32 (hidden 64).
    let model = TrainableDecoder::load(&ctx, fixture("qwen2_f32"), &all_targets(2)).unwrap();
    peft::save_adapter(&model, &tmp, "qwen2_f32").unwrap();
    let store = WeightStore::open(fixture("llama_f32")).unwrap();
    let e = peft::merge_adapter(&ctx, &store, &tmp)
        .unwrap_err()
        .to_string();
    assert!(e.contains("do not fit the matrix"), "{e}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// A configuration the decoder cannot run, a token past the vocabulary and a
/// bad LoRA configuration are errors naming what is wrong.
#[test]
fn bad_configurations_and_inputs_are_errors() {
    let ctx = ExecContext::new();
    let dir = fixture("llama_f32");
    let store = WeightStore::open(&dir).unwrap();
    let config = fucina_llm::ModelConfig::from_file(dir.join("config.json")).unwrap();
    let mut odd = config.clone();
    odd.num_key_value_heads = 3;
    let e = TrainableDecoder::from_parts(&ctx, odd, &store, &all_targets(2)).unwrap_err();
    assert!(e.to_string().contains("num_key_value_heads"), "{e}");
    for (lora, want) in [
        (
            LoraConfig {
                r: 0,
                ..all_targets(2)
            },
            "rank r is 0",
        ),
        (
            LoraConfig {
                dropout: 1.0,
                ..all_targets(2)
            },
            "dropout 1",
        ),
        (
            LoraConfig {
                targets: vec![],
                ..all_targets(2)
            },
            "no target",
        ),
    ] {
        let e = TrainableDecoder::from_parts(&ctx, config.clone(), &store, &lora).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    }
    let e = Target::parse_list("q_proj,qkv").unwrap_err();
    assert!(e.to_string().contains("unknown target `qkv`"), "{e}");
    let model = TrainableDecoder::from_parts(&ctx, config, &store, &all_targets(2)).unwrap();
    let e = model.logits(&ctx, &[1, 2, 320], 1, 3).unwrap_err();
    assert!(e.to_string().contains("token id 320"), "{e}");
    let e = model.logits(&ctx, &[1, 2, 3], 2, 2).unwrap_err();
    assert!(e.to_string().contains("3 ids for a batch of 2 rows"), "{e}");
    let e = Trainer::new(
        model,
        TrainOptions {
            batch: 0,
            ..TrainOptions::default()
        },
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("batch of 0"), "{e}");
}

/// A `{"messages"}` record is rendered by the tokenizer's chat template; the
/// loss predicts the last (assistant) message's tokens, the template's end
/// of turn included.
#[test]
fn a_conversation_record_predicts_the_last_message() {
    use fucina_llm::finetune::data::{Record, tokenize};
    let dir = std::env::temp_dir().join(format!("fucina-lora-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixture("llama_f32").join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let template = "{% for m in messages %}{{ bos_token + m.role + '\\n' + m.content + eos_token + '\\n' }}{% endfor %}\
                    {% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}";
    let config = serde_json::json!({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let tok = fucina_llm::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let m = |r: &str, c: &str| fucina_llm::ChatMessage::new(r, c);
    let conv = vec![m("user", "Name a color."), m("assistant", "Blue.")];
    let ex = tokenize(&tok, &Record::Messages(conv.clone()), Some(1), 256).unwrap();
    let all = tok
        .encode(&tok.apply_chat_template(&conv, false).unwrap(), false)
        .unwrap();
    let prompt = tok
        .encode(&tok.apply_chat_template(&conv[..1], true).unwrap(), false)
        .unwrap();
    assert_eq!(ex.ids, all);
    assert_eq!(ex.prompt_len, prompt.len());
    let predicted = tok.decode(&ex.ids[ex.prompt_len..], false).unwrap();
    assert_eq!(predicted, "Blue.<|eos|>\n");
    // Through a file, and a malformed conversation names its line.
    let path = dir.join("chat.jsonl");
    std::fs::write(
        &path,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n",
    )
    .unwrap();
    let e = read_jsonl(&path, &tok, Some(1), 256)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("chat.jsonl:2: the last message is the user's"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A packed row gives each of its examples the logits it has alone (its own
/// positions, attention within itself), on a sliding-window model too; the
/// packed batch's loss is the token-weighted loss of the examples; a packed
/// job trains (fewer, fuller rows).
#[test]
fn packed_rows_give_each_example_its_own_logits() {
    use fucina_llm::finetune::data::pack;
    let ctx = ExecContext::new();
    for name in ["llama_f32", "mistral_f32"] {
        let dir = fixture(name);
        let model = TrainableDecoder::load(&ctx, &dir, &all_targets(4)).unwrap();
        let v = model.config().vocab_size;
        let ex = examples(&prompt(name));
        // Rows [0 | 1], [2 | 3], [4], [5] of at most 24 tokens.
        let rows_idx = pack(&ex, 24);
        assert_eq!(
            rows_idx,
            [vec![0, 1], vec![2, 3], vec![4], vec![5]],
            "{name}"
        );
        let rows: Vec<Vec<&Example>> = rows_idx
            .iter()
            .map(|r| r.iter().map(|&i| &ex[i]).collect())
            .collect();
        let batch = Batch::from_rows(&rows, 0).unwrap();
        let p = batch.packing.as_ref().unwrap();
        let packing = Some((&p.positions[..], &p.segments[..]));
        let h = model
            .hidden_packed(&ctx, &batch.ids, batch.b, batch.t, packing, None)
            .unwrap();
        let logits = model.project(&ctx, &h).unwrap().to_vec();
        for (r, row) in rows.iter().enumerate() {
            let mut start = r * batch.t;
            for e in row {
                let alone = model.logits(&ctx, &e.ids, 1, e.ids.len()).unwrap().to_vec();
                let got = &logits[start * v..(start + e.ids.len()) * v];
                let d = max_diff(got, &alone);
                assert!(d <= 1e-5, "{name}: row {r}: {d}");
                start += e.ids.len();
            }
        }
        let packed_loss = batch_loss(&ctx, &model, &batch, None)
            .unwrap()
            .item()
            .unwrap();
        let refs: Vec<&Example> = ex.iter().collect();
        let plain = Batch::new(&refs, 0).unwrap();
        let plain_loss = batch_loss(&ctx, &model, &plain, None)
            .unwrap()
            .item()
            .unwrap();
        assert_eq!(batch.positions.len(), plain.positions.len());
        assert!(
            (packed_loss - plain_loss).abs() <= 1e-6 * plain_loss,
            "{name}: {packed_loss} vs {plain_loss}"
        );
    }
    // A packed job: 4 rows in batches of 2, so 2 steps per epoch.
    let model = TrainableDecoder::load(&ctx, fixture("llama_f32"), &all_targets(4)).unwrap();
    let ex = examples(&prompt("llama_f32"));
    let opts = TrainOptions {
        lr: 1e-2,
        batch: 2,
        pack: Some(24),
        epochs: 2,
        ..TrainOptions::default()
    };
    let steps = opts.total_steps_for(&ex);
    assert_eq!(steps, 4);
    let mut trainer = Trainer::new(model, opts, steps).unwrap();
    let mut losses = Vec::new();
    trainer
        .fit(&ctx, &ex, &[], |_, e| {
            if let Event::Step { loss, .. } = e {
                losses.push(loss);
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(losses.len(), 4);
    assert!(losses[3] < losses[0], "{losses:?}");
}

/// Gradient checkpointing gives the adapters the gradients of the plain
/// backward bit for bit (the same ops run again, in the same order), with
/// dropout on, on f32 and bf16 bases, and checkpointed steps the same losses.
#[test]
fn gradient_checkpointing_gives_the_same_gradients() {
    let ctx = ExecContext::with_threads(2);
    for name in ["llama_f32", "llama_bf16", "qwen2_f32"] {
        let dir = fixture(name);
        let ex = examples(&prompt(name));
        let refs: Vec<&Example> = ex.iter().collect();
        let batch = Batch::new(&refs, 0).unwrap();
        let lora = LoraConfig {
            dropout: 0.1,
            ..all_targets(4)
        };
        let run = |checkpoint: bool| {
            let mut model = TrainableDecoder::load(&ctx, &dir, &lora).unwrap();
            model.set_checkpointing(checkpoint);
            let (loss, grads) = loss_and_grads(&ctx, &model, &batch, Some(9));
            let opts = TrainOptions {
                lr: 1e-2,
                batch: 6,
                ..TrainOptions::default()
            };
            let mut trainer = Trainer::new(model, opts, 3).unwrap();
            let losses: Vec<u32> = (0..3)
                .map(|_| trainer.step(&ctx, &batch).unwrap().to_bits())
                .collect();
            (loss, grads, losses)
        };
        let (plain_loss, plain, plain_steps) = run(false);
        let (ck_loss, ck, ck_steps) = run(true);
        assert_eq!(ck_loss.to_bits(), plain_loss.to_bits(), "{name}");
        assert_eq!(ck, plain, "{name}: gradients");
        assert_eq!(ck_steps, plain_steps, "{name}: losses");
    }
}

/// The loss of `batch` with dropout seeded by `seed` and the adapters'
/// gradients of its backward (`B` set non-zero first).
fn loss_and_grads(
    ctx: &ExecContext,
    model: &TrainableDecoder,
    batch: &Batch,
    seed: Option<u64>,
) -> (f32, Vec<Vec<f32>>) {
    for (n, p) in model.named_parameters() {
        if n.contains("lora_B") {
            let v: Vec<f32> = (0..p.numel())
                .map(|i| 0.05 * (i as f32 * 0.71).sin())
                .collect();
            p.copy_from_slice(&v).unwrap();
        }
    }
    let loss = batch_loss(ctx, model, batch, seed).unwrap();
    let value = loss.item().unwrap();
    loss.backward(ctx).unwrap();
    let grads = model
        .parameters()
        .iter()
        .map(|p| {
            let g = p.grad(ctx).unwrap().unwrap().to_vec();
            p.zero_grad();
            g
        })
        .collect();
    (value, grads)
}

/// Full fine-tuning: every weight is a parameter, its logits before training
/// are the LoRA decoder's with untouched adapters, a few steps lower the
/// batch's loss, and gradient checkpointing gives the same bits (the
/// recomputed layers hand their weights' gradients back through the inner
/// backward).
#[test]
fn full_fine_tuning_trains_every_weight_with_or_without_checkpointing() {
    let ctx = ExecContext::with_threads(2);
    let dir = fixture("llama_f32");
    let ex = examples(&prompt("llama_f32"));
    let batch = Batch::new(&ex[..3].iter().collect::<Vec<_>>(), 0).unwrap();
    let lora = TrainableDecoder::load(&ctx, &dir, &all_targets(4)).unwrap();
    let full = TrainableDecoder::load_full(&ctx, &dir).unwrap();
    assert!(full.is_full() && !lora.is_full());
    let names: Vec<String> = full
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains(&"model.embed_tokens.weight".to_string()));
    assert!(names.contains(&"model.layers.1.post_attention_layernorm.weight".to_string()));
    assert!(names.contains(&"lm_head.weight".to_string()));
    let ids = &batch.ids[..batch.t];
    let (a, b) = (
        lora.logits(&ctx, ids, 1, batch.t).unwrap().to_vec(),
        full.logits(&ctx, ids, 1, batch.t).unwrap().to_vec(),
    );
    assert_eq!(a, b, "B = 0 adapters leave the base's logits");
    let run = |checkpointing: bool| {
        let mut model = TrainableDecoder::load_full(&ctx, &dir).unwrap();
        model.set_checkpointing(checkpointing);
        let opts = TrainOptions {
            lr: 1e-3,
            ..TrainOptions::default()
        };
        let mut t = Trainer::new(model, opts, 4).unwrap();
        let losses: Vec<u32> = (0..4)
            .map(|_| t.step(&ctx, &batch).unwrap().to_bits())
            .collect();
        let bits: Vec<Vec<u32>> = t
            .model()
            .parameters()
            .iter()
            .map(|p| p.to_vec().iter().map(|x| x.to_bits()).collect())
            .collect();
        (losses, bits)
    };
    let (losses, bits) = run(false);
    assert!(
        f32::from_bits(losses[3]) < f32::from_bits(losses[0]),
        "{losses:?}"
    );
    assert_eq!(run(true), (losses, bits));
}

/// bf16 products (`TrainableDecoder::use_bf16_products`): the inputs of the
/// frozen products are rounded to bf16, so the logits move off the exact
/// ones by a bf16-sized amount and come near the inference decoder's own
/// bf16 products (`Model::use_bf16_products`, the same rule over activations
/// computed in other orders); training still lowers the loss; an f32 base is
/// refused naming its first matrix, and the model is left as it was.
#[test]
fn bf16_products_round_the_frozen_products_inputs() {
    let ctx = ExecContext::new();
    let dir = fixture("llama_bf16");
    let ids = prompt("llama_bf16");
    let exact = TrainableDecoder::load(&ctx, &dir, &all_targets(4)).unwrap();
    let mut bf = TrainableDecoder::load(&ctx, &dir, &all_targets(4)).unwrap();
    assert!(!bf.uses_bf16_products());
    bf.use_bf16_products().unwrap();
    assert!(bf.uses_bf16_products());
    let a = exact.logits(&ctx, &ids, 1, ids.len()).unwrap().to_vec();
    let b = bf.logits(&ctx, &ids, 1, ids.len()).unwrap().to_vec();
    let off_exact = max_diff(&a, &b);
    let mut m = Model::load(&dir).unwrap();
    m.use_bf16_products().unwrap();
    let inf = inference_logits(&ctx, &m, &ids);
    let off_inference = max_diff(&b, &inf);
    eprintln!(
        "bf16 products: max |logit diff| {off_exact:.2e} from the exact products, \
         {off_inference:.2e} from the inference decoder's bf16 products"
    );
    assert!(off_exact > 0.0 && off_exact < 0.1, "{off_exact}");
    assert!(off_inference < off_exact, "{off_inference} vs {off_exact}");

    let opts = TrainOptions {
        lr: 1e-2,
        batch: 2,
        ..TrainOptions::default()
    };
    let ex = examples(&ids);
    let mut trainer = Trainer::new(bf, opts, 6).unwrap();
    let batch = trainer.epoch_batches(&ex, 0).into_iter().next().unwrap();
    let first = trainer.step(&ctx, &batch).unwrap();
    let mut last = first;
    for _ in 0..5 {
        last = trainer.step(&ctx, &batch).unwrap();
    }
    assert!(last < first, "{first} -> {last}");

    let mut f32_model =
        TrainableDecoder::load(&ctx, fixture("llama_f32"), &all_targets(4)).unwrap();
    let e = f32_model.use_bf16_products().unwrap_err().to_string();
    assert!(e.contains("model.embed_tokens.weight"), "{e}");
    assert!(!f32_model.uses_bf16_products());
}
