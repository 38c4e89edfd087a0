//! `WeightStore::convert` / `Model::load_as` (`generate --dtype`): the converted
//! matrices are the runtime's own quantizer (or rounding) of the f32 values, bit
//! for bit; the output projection of a Q4_0 model keeps Q8_0 as llama.cpp keeps
//! more bits there; the logits of the fixture models after Q8_0 and Q4_0 stay
//! close to f32 (figures printed, see docs/QUANTIZATION.md); the converted models
//! give the same bits for 1–4 threads, every vector level, and alone or in a
//! batch; a matrix whose
//! columns are not a multiple of 32 is refused by name and shape.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fucina::ExecContext;
use fucina::exec::{QuantFormat, SimdLevel, WeightFormat, detected_simd_level, force_simd_level};
use fucina_llm::{LlmError, LoadDtype, Model, ModelConfig, Weight, WeightStore};
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

/// Every prompt position's logits, `[T, vocab]`.
fn logits(m: &Model, ctx: &ExecContext, prompt: &[u32]) -> Vec<f32> {
    let vocab = m.config().vocab_size;
    let mut cache = m.new_cache(ctx, prompt.len() + 4).unwrap();
    let mut all = vec![0.0f32; prompt.len() * vocab];
    let mut last = vec![0.0f32; vocab];
    m.prefill(ctx, &mut cache, prompt, Some(&mut all), &mut last)
        .unwrap();
    all
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

#[test]
fn dtype_names_parse_and_print() {
    for d in LoadDtype::ALL {
        assert_eq!(d.name().parse::<LoadDtype>().unwrap(), d);
        assert_eq!(d.to_string(), d.name());
    }
    assert_eq!("Q4_0".parse::<LoadDtype>().unwrap(), LoadDtype::Q4_0);
    assert_eq!("Q4_K".parse::<LoadDtype>().unwrap(), LoadDtype::Q4_K);
    let e = "q7_k".parse::<LoadDtype>().unwrap_err().to_string();
    assert!(e.contains("\"q7_k\"") && e.contains("q4_k"), "{e}");
}

/// Each converted matrix holds exactly the bytes the runtime's quantizer (or
/// `Weight::from_f32`'s rounding) makes from its f32 values; vectors are kept
/// as they are, still mapped; the output projection of Q4_0 is Q8_0.
#[test]
fn converted_matrices_are_the_runtime_quantizer_bits() {
    let ctx = ExecContext::with_threads(3);
    for (fix, tied) in [("llama_f32", false), ("llama3_rope_f32", false)] {
        let cfg = ModelConfig::from_file(fixture(fix).join("config.json")).unwrap();
        assert_eq!(cfg.tie_word_embeddings, tied);
        let store = WeightStore::open(fixture(fix)).unwrap();
        for dtype in LoadDtype::ALL {
            let conv = store.convert(&ctx, dtype, tied).unwrap();
            assert_eq!(conv.len(), store.len());
            for (name, w) in store.iter() {
                let c = conv.get(name).unwrap();
                assert_eq!(c.shape(), w.shape(), "{fix} {dtype} {name}");
                let &[rows, cols] = w.shape() else {
                    assert_eq!(c.bytes(), w.bytes(), "{fix} {dtype} {name}: vectors kept");
                    assert!(c.is_mapped(), "{name}: a kept tensor stays mapped");
                    continue;
                };
                let values = w.to_f32_vec();
                // the output projection is Q8_0 (the formats of blocks of 32)
                // or Q6_K; the fixtures' 64 and 128 columns are not whole
                // super-blocks, so the K formats fall back: Q6_K to Q8_0, Q4_K
                // to Q5_0, Q5_K to Q5_1
                let quant = match dtype.quant() {
                    Some(q) if name == "lm_head.weight" && q != QuantFormat::Q8_0 => {
                        Some(QuantFormat::Q8_0)
                    }
                    Some(QuantFormat::Q4_K) => Some(QuantFormat::Q5_0),
                    Some(QuantFormat::Q5_K) => Some(QuantFormat::Q5_1),
                    Some(QuantFormat::Q6_K) => Some(QuantFormat::Q8_0),
                    Some(QuantFormat::Q2_K | QuantFormat::Q3_K | QuantFormat::IQ4_XS) => {
                        Some(QuantFormat::IQ4_NL)
                    }
                    q => q,
                };
                assert_eq!(c.quant_format(), quant, "{fix} {dtype} {name}");
                let want = match (quant, dtype) {
                    (Some(q), _) => ExecContext::with_threads(1)
                        .quantize(q, rows, cols, &values)
                        .unwrap()
                        .into_bytes(),
                    (None, LoadDtype::F32) => {
                        assert!(c.is_mapped(), "{name}: already f32, kept mapped");
                        w.bytes().to_vec()
                    }
                    (None, LoadDtype::F16) => {
                        Weight::from_f32(WeightFormat::F16, w.shape(), &values)
                            .unwrap()
                            .bytes()
                            .to_vec()
                    }
                    (None, _) => Weight::from_f32(WeightFormat::BF16, w.shape(), &values)
                        .unwrap()
                        .bytes()
                        .to_vec(),
                };
                assert!(c.bytes() == want.as_slice(), "{fix} {dtype} {name}: bytes");
            }
        }
    }
    // A tied model: the embedding table is the output projection, so Q4_0 keeps
    // it in Q8_0 (the other matrices are Q4_0).
    let mut t = HashMap::new();
    let v: Vec<f32> = (0..64 * 32)
        .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
        .collect();
    for n in [
        "model.embed_tokens.weight",
        "model.layers.0.mlp.up_proj.weight",
    ] {
        t.insert(
            n.to_string(),
            Weight::from_f32(WeightFormat::F32, &[64, 32], &v).unwrap(),
        );
    }
    let store = WeightStore::from_tensors(t);
    let conv = store.convert(&ctx, LoadDtype::Q4_0, true).unwrap();
    let q = |n: &str| conv.get(n).unwrap().quant_format();
    assert_eq!(q("model.embed_tokens.weight"), Some(QuantFormat::Q8_0));
    assert_eq!(
        q("model.layers.0.mlp.up_proj.weight"),
        Some(QuantFormat::Q4_0)
    );
    let conv = store.convert(&ctx, LoadDtype::Q4_0, false).unwrap();
    assert_eq!(
        conv.get("model.embed_tokens.weight")
            .unwrap()
            .quant_format(),
        Some(QuantFormat::Q4_0)
    );
}

/// A matrix larger than the block of rows `convert` widens at a time (2^20
/// elements) gives the bytes of converting it whole.
#[test]
fn a_large_matrix_converts_as_a_whole() {
    let (rows, cols) = (520, 4096);
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 10007) as f32 - 5003.0) / 4000.0)
        .collect();
    let name = "model.layers.0.mlp.up_proj.weight";
    let w = Weight::from_f32(WeightFormat::BF16, &[rows, cols], &v).unwrap();
    let widened = w.to_f32_vec();
    let store = WeightStore::from_tensors(HashMap::from([(name.to_string(), w)]));
    let ctx = ExecContext::with_threads(2);
    for (dtype, q) in [
        (LoadDtype::Q8_0, QuantFormat::Q8_0),
        (LoadDtype::Q4_0, QuantFormat::Q4_0),
    ] {
        let c = store.convert(&ctx, dtype, false).unwrap();
        let whole = ctx.quantize(q, rows, cols, &widened).unwrap();
        assert!(c.get(name).unwrap().bytes() == whole.bytes(), "{dtype}");
    }
    let c = store.convert(&ctx, LoadDtype::F32, false).unwrap();
    assert_eq!(c.get(name).unwrap().to_f32_vec(), widened);
    let c = store.convert(&ctx, LoadDtype::F16, false).unwrap();
    assert!(
        c.get(name).unwrap().bytes()
            == Weight::from_f32(WeightFormat::F16, &[rows, cols], &widened)
                .unwrap()
                .bytes()
    );
}

/// A bf16 copy made at load is the fixture that transformers rounded to bf16,
/// byte for byte (both round to nearest-even).
#[test]
fn bf16_and_f16_conversions_match_the_rounded_fixtures() {
    let ctx = ExecContext::with_threads(2);
    let f32_store = WeightStore::open(fixture("llama_f32")).unwrap();
    for (dtype, fix) in [
        (LoadDtype::BF16, "llama_bf16"),
        (LoadDtype::F16, "llama_f16"),
    ] {
        let conv = f32_store.convert(&ctx, dtype, false).unwrap();
        let theirs = WeightStore::open(fixture(fix)).unwrap();
        for (name, w) in theirs.iter() {
            if w.shape().len() == 2 {
                assert_eq!(conv.get(name).unwrap().bytes(), w.bytes(), "{fix} {name}");
            }
        }
    }
}

/// Max |Δlogit| and top-1 agreement of the fixture models after Q8_0 and Q4_0
/// against the f32 model, over every position of the fixture prompt.
#[test]
fn quantized_fixture_logits_stay_close_to_f32() {
    let ctx = ExecContext::with_threads(2);
    // Bounds: max |Δ| relative to the largest |logit|, and the share of positions
    // whose top-1 token agrees (tiny random-weight models: a pessimistic case).
    for fix in ["llama_f32", "llama3_rope_f32", "llama_bf16"] {
        let p = prompt(fix);
        let reference = Model::load_as(fixture(fix), &ctx, LoadDtype::F32).unwrap();
        let vocab = reference.config().vocab_size;
        let want = logits(&reference, &ctx, &p);
        let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for (dtype, max_rel, min_top1) in [
            (LoadDtype::Q8_0, 0.04f32, 0.9f32),
            (LoadDtype::Q4_0, 0.35, 0.6),
        ] {
            let m = Model::load_as(fixture(fix), &ctx, dtype).unwrap();
            let got = logits(&m, &ctx, &p);
            let max_diff = got
                .iter()
                .zip(&want)
                .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
            let top1 = got
                .chunks(vocab)
                .zip(want.chunks(vocab))
                .filter(|(a, b)| argmax(a) == argmax(b))
                .count();
            eprintln!(
                "{fix} {dtype}: max |Δlogit| = {max_diff:.4} ({:.2} % of the largest |logit| {scale:.3}); \
                 top-1 agreement {top1}/{}",
                100.0 * max_diff / scale,
                p.len()
            );
            assert!(
                max_diff > 0.0,
                "{fix} {dtype}: quantization changed nothing?"
            );
            assert!(
                max_diff <= max_rel * scale,
                "{fix} {dtype}: max |Δlogit| {max_diff}"
            );
            assert!(
                top1 as f32 >= min_top1 * p.len() as f32,
                "{fix} {dtype}: top-1 {top1}/{}",
                p.len()
            );
        }
    }
}

/// Converted models give the same logit bits for 1–4 threads (conversion and
/// inference) and every vector level, and a sequence decoded in a batch gives
/// the bits it gives alone.
#[test]
fn converted_models_are_deterministic_across_threads_and_batch() {
    let fix = "llama_f32";
    let p = prompt(fix);
    for dtype in [LoadDtype::Q8_0, LoadDtype::Q4_0, LoadDtype::BF16] {
        let mut first: Option<(Vec<u32>, Vec<u8>)> = None;
        for threads in 1..=4 {
            let ctx = ExecContext::with_threads(threads);
            let m = Model::load_as(fixture(fix), &ctx, dtype).unwrap();
            let b = bits(&logits(&m, &ctx, &p));
            let wbytes = WeightStore::open(fixture(fix))
                .unwrap()
                .convert(&ctx, dtype, false)
                .unwrap()
                .get("model.layers.1.mlp.down_proj.weight")
                .unwrap()
                .bytes()
                .to_vec();
            match &first {
                None => first = Some((b, wbytes)),
                Some((b1, w1)) => {
                    assert_eq!(&b, b1, "{dtype}: {threads} threads against 1");
                    assert_eq!(&wbytes, w1, "{dtype}: conversion on {threads} threads");
                }
            }
        }
        // Every vector level the CPU has gives the same bits.
        let (want, _) = first.as_ref().unwrap();
        let best = detected_simd_level();
        for level in SimdLevel::available() {
            assert!(force_simd_level(level));
            let ctx = ExecContext::with_threads(2);
            let m = Model::load_as(fixture(fix), &ctx, dtype).unwrap();
            let got = bits(&logits(&m, &ctx, &p));
            assert!(force_simd_level(best));
            assert_eq!(&got, want, "{dtype}: vector level {level:?}");
        }

        // Sequence A decoded alone, then together with B (other prompt, other
        // length), on 3 threads against 1.
        let vocab;
        let alone = {
            let ctx = ExecContext::with_threads(1);
            let m = Model::load_as(fixture(fix), &ctx, dtype).unwrap();
            vocab = m.config().vocab_size;
            let mut c = m.new_cache(&ctx, p.len() + 8).unwrap();
            let mut l = vec![0.0f32; vocab];
            m.prefill(&ctx, &mut c, &p, None, &mut l).unwrap();
            let mut out = vec![bits(&l)];
            for step in 0..6u32 {
                let mut caches = [&mut c];
                m.decode(&ctx, &mut caches, &[(step * 31 + 7) % vocab as u32], &mut l)
                    .unwrap();
                out.push(bits(&l));
            }
            out
        };
        let ctx = ExecContext::with_threads(3);
        let m = Model::load_as(fixture(fix), &ctx, dtype).unwrap();
        let q: Vec<u32> = p.iter().rev().take(9).copied().collect();
        let (mut ca, mut cb) = (
            m.new_cache(&ctx, p.len() + 8).unwrap(),
            m.new_cache(&ctx, q.len() + 8).unwrap(),
        );
        let mut la = vec![0.0f32; vocab];
        let mut lb = vec![0.0f32; vocab];
        m.prefill(&ctx, &mut cb, &q, None, &mut lb).unwrap();
        m.prefill(&ctx, &mut ca, &p, None, &mut la).unwrap();
        assert_eq!(bits(&la), alone[0], "{dtype}: prefill");
        let mut both = vec![0.0f32; 2 * vocab];
        for step in 0..6u32 {
            let mut caches = [&mut cb, &mut ca];
            let tokens = [
                (step * 17 + 3) % vocab as u32,
                (step * 31 + 7) % vocab as u32,
            ];
            m.decode(&ctx, &mut caches, &tokens, &mut both).unwrap();
            assert_eq!(
                bits(&both[vocab..]),
                alone[step as usize + 1],
                "{dtype}: step {step} in a batch of two against alone"
            );
        }
    }
}

/// A matrix whose columns are not a multiple of 32 cannot be Q8_0 or Q4_0: the
/// error names the tensor and its shape, as llama.cpp refuses it; float
/// conversions of it work, and the store is left as it was.
#[test]
fn columns_not_a_multiple_of_32_are_refused_by_name() {
    let ctx = ExecContext::with_threads(2);
    let mut t = HashMap::new();
    let v: Vec<f32> = (0..8 * 40).map(|i| i as f32 / 100.0).collect();
    t.insert(
        "model.layers.0.mlp.down_proj.weight".to_string(),
        Weight::from_f32(WeightFormat::F32, &[8, 40], &v).unwrap(),
    );
    t.insert(
        "model.layers.0.mlp.up_proj.weight".to_string(),
        Weight::from_f32(WeightFormat::F32, &[10, 32], &v).unwrap(),
    );
    let store = WeightStore::from_tensors(t);
    for dtype in [LoadDtype::Q8_0, LoadDtype::Q4_0] {
        let e = store.convert(&ctx, dtype, false).unwrap_err();
        let LlmError::BadTensor {
            ref name,
            ref reason,
        } = e
        else {
            panic!("{e}")
        };
        assert_eq!(name, "model.layers.0.mlp.down_proj.weight");
        assert!(
            reason.contains("[8, 40]") && reason.contains("32"),
            "{reason}"
        );
    }
    for dtype in [LoadDtype::F32, LoadDtype::F16, LoadDtype::BF16] {
        let c = store.convert(&ctx, dtype, false).unwrap();
        assert_eq!(
            c.get("model.layers.0.mlp.down_proj.weight")
                .unwrap()
                .shape(),
            [8, 40]
        );
    }
    assert_eq!(
        store
            .get("model.layers.0.mlp.down_proj.weight")
            .unwrap()
            .format(),
        WeightFormat::F32
    );
    // The fixtures whose hidden size (48) or MLP width (112) is not a multiple of
    // 32 are refused the same way by `Model::load_as`, naming a tensor.
    for fix in ["qwen2_f32", "llama_linear_f32", "mistral_f32"] {
        let e = Model::load_as(fixture(fix), &ctx, LoadDtype::Q8_0).unwrap_err();
        assert!(
            matches!(e, LlmError::BadTensor { ref reason, .. } if reason.contains("not a multiple of the 32-element blocks")),
            "{fix}: {e}"
        );
        Model::load_as(fixture(fix), &ctx, LoadDtype::BF16).unwrap();
    }
}

/// `conversion_target`, the rule `convert` follows (llama.cpp's): the output
/// projection keeps more bits, and a super-block format on rows that are not
/// whole super-blocks falls back per tensor, at SmolLM2-135M's shapes (hidden
/// 576, MLP 1536) and the fixtures' (64, 128).
#[test]
fn conversion_targets_follow_llama_quantizes_rule() {
    use fucina::exec::TensorFormat as T;
    use fucina_llm::FormatChoice::{Asked, Fallback, Output};
    use fucina_llm::conversion_target;
    let fb = |wanted| Fallback { wanted };
    for (dtype, cols, output, want) in [
        (T::Q4_K, 576, false, (T::Q5_0, fb(QuantFormat::Q4_K))),
        (T::Q4_K, 1536, false, (T::Q4_K, Asked)),
        (T::Q4_K, 576, true, (T::Q8_0, fb(QuantFormat::Q6_K))),
        (T::Q4_K, 1536, true, (T::Q6_K, Output)),
        (T::Q5_K, 576, false, (T::Q5_1, fb(QuantFormat::Q5_K))),
        (T::Q5_K, 512, false, (T::Q5_K, Asked)),
        (T::Q6_K, 576, false, (T::Q8_0, fb(QuantFormat::Q6_K))),
        (T::Q6_K, 1536, true, (T::Q6_K, Asked)),
        (T::Q2_K, 64, false, (T::IQ4_NL, fb(QuantFormat::Q2_K))),
        (T::Q3_K, 128, false, (T::IQ4_NL, fb(QuantFormat::Q3_K))),
        (T::IQ4_XS, 576, false, (T::IQ4_NL, fb(QuantFormat::IQ4_XS))),
        (T::IQ4_XS, 768, true, (T::Q6_K, Output)),
        (T::Q4_0, 576, false, (T::Q4_0, Asked)),
        (T::Q4_0, 576, true, (T::Q8_0, Output)),
        (T::Q5_1, 64, true, (T::Q8_0, Output)),
        (T::IQ4_NL, 576, true, (T::Q8_0, Output)),
        (T::Q8_0, 576, true, (T::Q8_0, Asked)),
        (T::F16, 576, true, (T::F16, Asked)),
        (T::BF16, 48, false, (T::BF16, Asked)),
    ] {
        assert_eq!(
            conversion_target(dtype, cols, output),
            want,
            "{dtype}, {cols} columns, output {output}"
        );
    }
    // Whatever is asked, a matrix whose columns are whole blocks of 32 gets a
    // format whose blocks fit them.
    for dtype in LoadDtype::ALL {
        for cols in [32, 64, 96, 576, 960, 1536, 2048] {
            for output in [false, true] {
                let (f, _) = conversion_target(dtype, cols, output);
                assert!(f.row_bytes(cols).is_some(), "{dtype}, {cols}: {f}");
            }
        }
    }
}

/// `Model::load_as(Q4_K)` of the `llama_f32` fixture (64 and 128 columns, no
/// whole super-block anywhere): every matrix falls back (to Q5_0, the output
/// projection to Q8_0), and the model's report says so tensor by tensor.
#[test]
fn a_fixture_loaded_as_q4_k_reports_its_fallbacks() {
    use fucina::exec::TensorFormat;
    use fucina_llm::FormatChoice;
    let ctx = ExecContext::with_threads(2);
    let model = Model::load_as(fixture("llama_f32"), &ctx, LoadDtype::Q4_K).unwrap();
    let report = model.formats();
    let store = WeightStore::open(fixture("llama_f32")).unwrap();
    assert_eq!(report.entries().len(), store.len());
    for e in report.entries() {
        let want = match (e.name.as_str(), e.shape.len()) {
            (_, 1) => (TensorFormat::F32, FormatChoice::File),
            ("lm_head.weight", _) => (
                TensorFormat::Q8_0,
                FormatChoice::Fallback {
                    wanted: QuantFormat::Q6_K,
                },
            ),
            _ => (
                TensorFormat::Q5_0,
                FormatChoice::Fallback {
                    wanted: QuantFormat::Q4_K,
                },
            ),
        };
        assert_eq!((e.format, e.choice), want, "{}", e.name);
    }
    let summary = report.summary();
    assert!(
        summary.contains("  lm_head.weight: 64 columns, q6_k → q8_0")
            && summary
                .contains("  model.layers.*.mlp.down_proj.weight ×2: 128 columns, q4_k → q5_0")
            && summary.contains("  model.embed_tokens.weight: 64 columns, q4_k → q5_0"),
        "{summary}"
    );
}

/// `convert` at SmolLM2-135M's widths (hidden 576, MLP 1536, tied
/// embeddings), for every super-block format: the matrices of 576 columns
/// fall back, the down projection (1536 columns) keeps the asked format, the
/// tied embedding table (the output projection) takes Q8_0, Q6_K's fallback;
/// each converted matrix holds the runtime quantizer's bytes of its format.
#[test]
fn smollm2_widths_fall_back_per_tensor() {
    use fucina::exec::TensorFormat;
    use fucina_llm::FormatChoice;
    let ctx = ExecContext::with_threads(2);
    let shapes = [
        ("model.embed_tokens.weight", [16, 576]),
        ("model.layers.0.self_attn.q_proj.weight", [8, 576]),
        ("model.layers.0.mlp.up_proj.weight", [8, 576]),
        ("model.layers.0.mlp.down_proj.weight", [8, 1536]),
    ];
    let mut tensors = HashMap::new();
    for (i, (name, shape)) in shapes.iter().enumerate() {
        let n = shape[0] * shape[1];
        let v: Vec<f32> = (0..n)
            .map(|k| (((k * 31 + i * 7) % 97) as f32 - 48.0) / 200.0)
            .collect();
        tensors.insert(
            name.to_string(),
            Weight::from_f32(WeightFormat::F32, shape, &v).unwrap(),
        );
    }
    let norm = Weight::from_f32(WeightFormat::F32, &[576], &[1.0; 576]).unwrap();
    tensors.insert("model.norm.weight".to_string(), norm);
    let store = WeightStore::from_tensors(tensors);
    for (asked, fallback) in [
        (QuantFormat::Q4_K, QuantFormat::Q5_0),
        (QuantFormat::Q5_K, QuantFormat::Q5_1),
        (QuantFormat::Q6_K, QuantFormat::Q8_0),
        (QuantFormat::Q2_K, QuantFormat::IQ4_NL),
        (QuantFormat::Q3_K, QuantFormat::IQ4_NL),
        (QuantFormat::IQ4_XS, QuantFormat::IQ4_NL),
    ] {
        let conv = store.convert(&ctx, asked.into(), true).unwrap();
        let report = conv.format_report();
        for (name, w) in store.iter() {
            let e = report.get(name).unwrap();
            let want = match name {
                "model.norm.weight" => (TensorFormat::F32, FormatChoice::File),
                "model.embed_tokens.weight" => (
                    TensorFormat::Q8_0,
                    FormatChoice::Fallback {
                        wanted: QuantFormat::Q6_K,
                    },
                ),
                "model.layers.0.mlp.down_proj.weight" => (asked.into(), FormatChoice::Asked),
                _ => (fallback.into(), FormatChoice::Fallback { wanted: asked }),
            };
            assert_eq!((e.format, e.choice), want, "{asked:?}: {name}");
            if let (Some(q), &[rows, cols]) = (e.format.quant(), w.shape()) {
                let bytes = ctx.quantize(q, rows, cols, &w.to_f32_vec()).unwrap();
                assert!(
                    conv.get(name).unwrap().bytes() == bytes.bytes(),
                    "{asked:?}: {name}"
                );
            }
        }
        let summary = report.summary();
        let (a, f) = (TensorFormat::from(asked), TensorFormat::from(fallback));
        assert!(
            summary.contains(&format!(
                "\n  model.layers.*.self_attn.q_proj.weight: 576 columns, {a} → {f}"
            )) && summary.contains("\n  model.embed_tokens.weight: 576 columns, q6_k → q8_0")
                && !summary.contains("down_proj"),
            "{summary}"
        );
    }
}
