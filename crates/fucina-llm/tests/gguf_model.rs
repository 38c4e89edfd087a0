//! A Llama model converted to GGUF the way llama.cpp's converter does it (tensor
//! names, the q/k row order of its rotary embedding, dims innermost first,
//! metadata keys, the tokenizer in `tokenizer.ggml.*`) loads through
//! `arch::gguf` and gives the same logit bits as the safetensors original; the
//! `generate` example's library path (`open_model` and its batch loop) runs it
//! with the tokenizer the file stores; a GGUF file of another architecture, with
//! a missing key, or with `rope_freqs` is refused by name.

use std::io::Write;
use std::path::PathBuf;

use fucina::ExecContext;
use fucina::exec::{QuantFormat, WeightFormat};
use fucina_llm::arch::gguf::load_gguf;
use fucina_llm::sample::SamplingParams;
use fucina_llm::{LlmError, LoadDtype, Model, ModelConfig, WeightStore, open_model};

#[path = "../examples/common/batch.rs"]
mod batch;
#[path = "../../fucina-exec/tests/child_process/mod.rs"]
#[macro_use]
mod child_process;
mod gguf_support;
mod gguf_vocab;
use gguf_support::{Writer, f32v, llama_gguf_name, str_v, u32v};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// llama.cpp's row order for the q or k projection: its row `h·D + 2j + i` is
/// Hugging Face's row `h·D + i·D/2 + j`.
fn permute(bytes: &[u8], rows: usize, row_bytes: usize, head_dim: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len()];
    for h in 0..rows / head_dim {
        for i in 0..2 {
            for j in 0..head_dim / 2 {
                let from = h * head_dim + i * head_dim / 2 + j;
                let to = h * head_dim + 2 * j + i;
                out[to * row_bytes..(to + 1) * row_bytes]
                    .copy_from_slice(&bytes[from * row_bytes..(from + 1) * row_bytes]);
            }
        }
    }
    out
}

/// The GGUF image of a Hugging Face Llama model, with `skip` metadata keys left out
/// and `extra` appended.
fn convert(
    cfg: &ModelConfig,
    store: &WeightStore,
    skip: &[&str],
    extra: &[(&str, u32, Vec<u8>)],
) -> Vec<u8> {
    convert_as(cfg, store, skip, extra, None)
}

/// [`convert`] with every matrix stored as `quant` (Q8_0 or Q4_0, quantized here by
/// the runtime) when given; the norms stay F32, as llama.cpp keeps them.
fn convert_as(
    cfg: &ModelConfig,
    store: &WeightStore,
    skip: &[&str],
    extra: &[(&str, u32, Vec<u8>)],
    quant: Option<QuantFormat>,
) -> Vec<u8> {
    convert_with(cfg, store, skip, extra, &|_| quant)
}

/// ggml's type code of a block format.
fn ggml_code(q: QuantFormat) -> u32 {
    fucina::exec::TensorFormat::from(q).ggml_code()
}

/// [`convert_as`] with each matrix's format chosen by its Hugging Face name.
fn convert_with(
    cfg: &ModelConfig,
    store: &WeightStore,
    skip: &[&str],
    extra: &[(&str, u32, Vec<u8>)],
    quant_of: &dyn Fn(&str) -> Option<QuantFormat>,
) -> Vec<u8> {
    let ctx = ExecContext::new();
    let mut w = Writer::default();
    let meta: Vec<(&str, u32, Vec<u8>)> = vec![
        ("general.architecture", 8, str_v("llama")),
        ("llama.embedding_length", 4, u32v(cfg.hidden_size)),
        ("llama.feed_forward_length", 4, u32v(cfg.intermediate_size)),
        ("llama.block_count", 4, u32v(cfg.num_hidden_layers)),
        (
            "llama.attention.head_count",
            4,
            u32v(cfg.num_attention_heads),
        ),
        (
            "llama.attention.head_count_kv",
            4,
            u32v(cfg.num_key_value_heads),
        ),
        ("llama.attention.key_length", 4, u32v(cfg.head_dim)),
        ("llama.rope.dimension_count", 4, u32v(cfg.head_dim)),
        ("llama.context_length", 4, u32v(cfg.max_position_embeddings)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            6,
            f32v(cfg.rms_norm_eps),
        ),
        ("llama.rope.freq_base", 6, f32v(cfg.rope_theta)),
        (
            "tokenizer.ggml.bos_token_id",
            4,
            u32v(cfg.bos_token_id.unwrap() as usize),
        ),
        (
            "tokenizer.ggml.eos_token_id",
            4,
            u32v(cfg.eos_token_ids[0] as usize),
        ),
    ];
    for (k, t, v) in meta
        .iter()
        .filter(|(k, _, _)| !skip.contains(k))
        .chain(extra)
    {
        w.kv(k, *t, v);
    }
    // The fixture's tokenizer, as llama.cpp's converter stores it (the bos/eos
    // ids are written above).
    for (k, t, v) in gguf_vocab::gpt2_metadata(&fixture("llama_f32")) {
        if !meta.iter().any(|(m, _, _)| *m == k) && !skip.contains(&k.as_str()) {
            w.kv(&k, t, &v);
        }
    }
    for (name, weight) in store.iter() {
        assert_eq!(weight.format(), WeightFormat::F32);
        let shape = weight.shape();
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let mut bytes = weight.bytes().to_vec();
        let mut code = 0;
        let mut row_bytes = shape.last().unwrap() * 4;
        if let (Some(q), &[rows, cols]) = (quant_of(name), shape) {
            let values = weight.to_f32_vec();
            bytes = ctx.quantize(q, rows, cols, &values).unwrap().into_bytes();
            code = ggml_code(q);
            row_bytes = cols / q.block_elements() * q.block_bytes();
        }
        if name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight") {
            bytes = permute(&bytes, shape[0], row_bytes, cfg.head_dim);
        }
        w.tensor(&llama_gguf_name(name), &dims, code, &bytes);
    }
    w.bytes()
}

fn write(bytes: &[u8], tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fucina-gguf-model-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("model.gguf");
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

#[test]
fn a_converted_llama_gives_the_same_logit_bits() {
    let dir = fixture("llama_f32");
    let cfg = ModelConfig::from_file(dir.join("config.json")).unwrap();
    let store = WeightStore::open(&dir).unwrap();
    let path = write(&convert(&cfg, &store, &[], &[]), "ok");

    let (gcfg, gstore, file) = load_gguf(&path).unwrap();
    assert_eq!(file.tensors().len(), store.len());
    assert_eq!(gcfg.hidden_size, cfg.hidden_size);
    assert_eq!(gcfg.num_key_value_heads, cfg.num_key_value_heads);
    assert_eq!(gcfg.vocab_size, cfg.vocab_size);
    assert_eq!(gcfg.tie_word_embeddings, cfg.tie_word_embeddings);
    assert_eq!(gcfg.eos_token_ids, cfg.eos_token_ids);
    // Every tensor other than q and k is the mapped file; q and k are put back.
    for (name, w) in store.iter() {
        let g = gstore.get(name).unwrap();
        assert_eq!(g.shape(), w.shape(), "{name}");
        assert_eq!(g.bytes(), w.bytes(), "{name}");
    }

    let ctx = ExecContext::with_threads(2);
    let reference = Model::from_parts(cfg.clone(), store).unwrap();
    let converted = Model::from_parts(gcfg, gstore).unwrap();
    let prompt: Vec<u32> = (0..12)
        .map(|i| (i * 37 + 5) % cfg.vocab_size as u32)
        .collect();
    let vocab = cfg.vocab_size;
    let run = |m: &Model| {
        let mut cache = m.new_cache(&ctx, prompt.len()).unwrap();
        let mut all = vec![0.0f32; prompt.len() * vocab];
        let mut last = vec![0.0f32; vocab];
        m.prefill(&ctx, &mut cache, &prompt, Some(&mut all), &mut last)
            .unwrap();
        all.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(run(&reference), run(&converted));
}

#[test]
fn bad_gguf_models_are_refused_by_name() {
    let dir = fixture("llama_f32");
    let cfg = ModelConfig::from_file(dir.join("config.json")).unwrap();
    let store = WeightStore::open(&dir).unwrap();
    let err = |bytes: Vec<u8>, tag: &str| load_gguf(write(&bytes, tag)).unwrap_err().to_string();

    let e = err(convert(&cfg, &store, &["llama.block_count"], &[]), "nokey");
    assert!(
        e.contains("llama.block_count is missing") && e.contains("model.gguf"),
        "{e}"
    );
    let e = err(
        convert(
            &cfg,
            &store,
            &["general.architecture"],
            &[("general.architecture", 8, str_v("gpt2"))],
        ),
        "arch",
    );
    assert!(e.contains("\"gpt2\" is not supported"), "{e}");
    let e = err(
        convert(
            &cfg,
            &store,
            &["llama.attention.head_count_kv"],
            &[("llama.attention.head_count_kv", 4, u32v(3))],
        ),
        "heads",
    );
    assert!(e.contains("3 key/value heads"), "{e}");
    let e = err(
        convert(
            &cfg,
            &store,
            &[],
            &[("llama.rope.scaling.type", 8, str_v("yarn"))],
        ),
        "yarn",
    );
    assert!(e.contains("\"yarn\" is not supported"), "{e}");
    let e = err(
        convert(
            &cfg,
            &store,
            &["llama.rope.dimension_count"],
            &[("llama.rope.dimension_count", 4, u32v(8))],
        ),
        "partial",
    );
    assert!(e.contains("partial rotary"), "{e}");
    // A tensor of an unsupported type names the tensor.
    let mut w = Writer::default();
    w.kv("general.architecture", 8, &str_v("llama"));
    w.tensor("blk.0.attn_q.weight", &[256, 1], 21, &[0u8; 110]); // IQ3_S
    let path = write(&w.bytes(), "type");
    let file = fucina_llm::gguf::GgufFile::open(&path).unwrap();
    let e = fucina_llm::arch::gguf::gguf_weights(&file, &cfg).unwrap_err();
    assert!(
        matches!(e, LlmError::BadTensor { ref name, .. } if name == "blk.0.attn_q.weight"),
        "{e}"
    );
    // ... and its type by ggml's name, with the supported ones.
    assert!(
        e.to_string().contains("type iq3_s (ggml type 21)")
            && e.to_string().contains("supported: f32, f16, bf16, q8_0"),
        "{e}"
    );
}

fn u64v(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// Metadata a hostile file could hold: a layer count of 2^40 (once sized an
/// allocation: an abort), a key length of 2^63 + 2 (once overflowed the row
/// count), a RoPE factor positive as f64 but 0 as f32 (once loaded, then every
/// logit was NaN), an architecture stored as a number (once reported missing).
#[test]
fn hostile_gguf_metadata_is_an_err() {
    in_child!("hostile_gguf_metadata_is_an_err");
    let dir = fixture("llama_f32");
    let cfg = ModelConfig::from_file(dir.join("config.json")).unwrap();
    let store = WeightStore::open(&dir).unwrap();
    let load = |skip: &[&str], extra: &[(&str, u32, Vec<u8>)], tag: &str| {
        let path = write(&convert(&cfg, &store, skip, extra), tag);
        load_gguf(&path).and_then(|(c, w, _)| Model::from_parts(c, w))
    };
    let e = load(
        &["llama.block_count"],
        &[("llama.block_count", 10, u64v(1 << 40))],
        "layers",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("declares 1099511627776 layers"),
        "{e}"
    );
    let huge = (1u64 << 63) + 2;
    let e = load(
        &["llama.attention.key_length", "llama.rope.dimension_count"],
        &[
            ("llama.attention.key_length", 10, u64v(huge)),
            ("llama.rope.dimension_count", 10, u64v(huge)),
        ],
        "keylen",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("heads of 9223372036854775810 rows"),
        "{e}"
    );
    let e = load(
        &[],
        &[
            ("llama.rope.scaling.type", 8, str_v("linear")),
            (
                "llama.rope.scaling.factor",
                12,
                1e-300f64.to_le_bytes().to_vec(),
            ),
        ],
        "ropefactor",
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("llama.rope.scaling.factor = F64(1e-300) is not a positive finite f32"),
        "{e}"
    );
    let e = load(
        &["general.architecture"],
        &[("general.architecture", 4, u32v(1))],
        "archtype",
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("general.architecture = U32(1) is not a string"),
        "{e}"
    );
}

/// Every prompt position's logits of `m` (a 12-token prompt).
fn logits(m: &Model, threads: usize) -> Vec<f32> {
    let ctx = ExecContext::with_threads(threads);
    let vocab = m.config().vocab_size;
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let mut cache = m.new_cache(&ctx, prompt.len()).unwrap();
    let mut all = vec![0.0f32; prompt.len() * vocab];
    let mut last = vec![0.0f32; vocab];
    m.prefill(&ctx, &mut cache, &prompt, Some(&mut all), &mut last)
        .unwrap();
    all
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

/// Q8_0 and Q4_0 GGUF models run through the quantized kernels: their logits
/// stay close to the f32 model's (max difference and top-1 agreement printed),
/// and are the same bits on 1 and 2 threads.
#[test]
fn quantized_gguf_models_run_close_to_f32() {
    let dir = fixture("llama_f32");
    let cfg = ModelConfig::from_file(dir.join("config.json")).unwrap();
    let store = WeightStore::open(&dir).unwrap();
    let vocab = cfg.vocab_size;
    let reference = logits(&Model::from_parts(cfg.clone(), store.clone()).unwrap(), 1);
    let scale = reference.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    for (q, tag, max_rel, min_top1) in [
        (QuantFormat::Q8_0, "q8", 0.05f32, 11usize),
        (QuantFormat::Q4_0, "q4", 0.35, 6),
    ] {
        let path = write(&convert_as(&cfg, &store, &[], &[], Some(q)), tag);
        let (gcfg, gstore, _file) = load_gguf(&path).unwrap();
        let w = gstore.get("model.layers.0.mlp.up_proj.weight").unwrap();
        assert_eq!(w.quant_format(), Some(q));
        assert!(w.is_mapped(), "quantized weights are read in place");
        // The same weights dequantized into an f32 model: the only difference left
        // is the rounding of the activations to int8 blocks, so a wrong row order
        // or block read would show here.
        let dequantized: std::collections::HashMap<String, fucina_llm::Weight> = gstore
            .iter()
            .map(|(n, w)| {
                let v = w.to_f32_vec();
                (
                    n.to_string(),
                    fucina_llm::Weight::from_f32(WeightFormat::F32, w.shape(), &v).unwrap(),
                )
            })
            .collect();
        let deq = logits(
            &Model::from_parts(gcfg.clone(), WeightStore::from_tensors(dequantized)).unwrap(),
            1,
        );
        // The kernels' repacked copy (what `open_model` makes) gives the same
        // bits as the weights read in place, for 1 and 3 threads.
        let mut packed_store = gstore.clone();
        let ctx = ExecContext::with_threads(2);
        assert!(packed_store.repack_quantized(&ctx).unwrap() >= 7);
        assert!(
            packed_store
                .get("model.layers.0.mlp.up_proj.weight")
                .unwrap()
                .is_repacked()
        );
        assert!(
            !gstore
                .get("model.layers.0.mlp.up_proj.weight")
                .unwrap()
                .is_repacked()
        );
        assert_eq!(
            packed_store.repack_quantized(&ctx).unwrap(),
            0,
            "repacked once"
        );
        let packed = Model::from_parts(gcfg.clone(), packed_store).unwrap();
        let model = Model::from_parts(gcfg, gstore).unwrap();
        let one = logits(&model, 1);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for threads in [1, 3] {
            assert_eq!(
                bits(&logits(&packed, threads)),
                bits(&one),
                "{q:?}: repacked, {threads} threads"
            );
        }
        let deq_diff = one
            .iter()
            .zip(&deq)
            .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
        eprintln!("{q:?}: max |logit - dequantized-f32 logit| = {deq_diff:.3e}");
        assert!(
            deq_diff <= 0.03 * scale,
            "{q:?} against its dequantized weights: {deq_diff}"
        );
        let two = logits(&model, 2);
        assert_eq!(bits(&one), bits(&two), "{q:?}: 1 and 2 threads");
        let max_diff = one
            .iter()
            .zip(&reference)
            .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
        let top1 = one
            .chunks(vocab)
            .zip(reference.chunks(vocab))
            .filter(|(a, b)| argmax(a) == argmax(b))
            .count();
        eprintln!(
            "{q:?}: max |logit - f32 logit| = {max_diff:.3e} ({:.2} % of the largest logit {scale:.3}); top-1 agreement {top1}/12",
            100.0 * max_diff / scale
        );
        assert!(max_diff <= max_rel * scale, "{q:?}: {max_diff}");
        assert!(top1 >= min_top1, "{q:?}: top-1 {top1}/12");
    }
}

fn reference_ids(key: &str) -> Vec<u32> {
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("llama_f32").join("reference.json")).unwrap(),
    )
    .unwrap();
    r[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// `generate --model file.gguf`: `open_model` reads the model and the tokenizer
/// the file stores, and the example's batch loop greedily produces the ids
/// transformers produced for the safetensors original; `--dtype q8_0` on the
/// GGUF file gives the bits it gives on the safetensors directory.
#[test]
fn generate_runs_a_gguf_file_with_its_own_tokenizer() {
    let dir = fixture("llama_f32");
    let cfg = ModelConfig::from_file(dir.join("config.json")).unwrap();
    let store = WeightStore::open(&dir).unwrap();
    let path = write(&convert(&cfg, &store, &[], &[]), "generate");
    let ctx = ExecContext::with_threads(2);

    let opened = open_model(&path, &ctx, None).unwrap();
    assert_eq!(opened.stop_tokens, cfg.eos_token_ids);
    let tok = opened
        .tokenizer
        .as_ref()
        .expect("the GGUF file's tokenizer");
    let prompt = reference_ids("prompt_ids");
    let text = tok.decode(&prompt, true).unwrap();
    assert_eq!(tok.encode(&text, true).unwrap(), prompt, "{text:?}");

    let params = SamplingParams {
        temperature: 0.0,
        stop_tokens: opened.stop_tokens.clone(),
        ..SamplingParams::default()
    };
    let greedy = reference_ids("greedy_ids");
    assert!(!greedy.iter().any(|t| opened.stop_tokens.contains(t)));
    let second = tok
        .encode("the same tokens on every machine", true)
        .unwrap();
    let out = batch::generate(
        &opened.model,
        &ctx,
        &[prompt.clone(), second],
        greedy.len(),
        &params,
        false,
    )
    .unwrap();
    assert_eq!(out.ids[0], greedy, "greedy ids of the GGUF model");
    let continuation = tok.decode(&out.ids[0], true).unwrap();
    assert!(!continuation.is_empty());

    // Quantized at load: the GGUF file and the directory give the same bits.
    for dtype in [LoadDtype::Q8_0, LoadDtype::Q4_0] {
        let from_gguf = open_model(&path, &ctx, Some(dtype)).unwrap();
        let from_dir = open_model(&dir, &ctx, Some(dtype)).unwrap();
        assert!(from_dir.tokenizer.is_some());
        let a = logits(&from_gguf.model, 2);
        let b = logits(&from_dir.model, 2);
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{dtype}: GGUF and directory"
        );
    }
    // Not a model: a directory without config.json, a missing file.
    let e = open_model(path.with_file_name("nothing.gguf"), &ctx, None).unwrap_err();
    assert!(
        matches!(e, LlmError::Io { .. }) && e.to_string().contains("nothing.gguf"),
        "{e}"
    );
    assert!(open_model(std::env::temp_dir(), &ctx, None).is_err());
}

/// A random Llama model as wide as the K formats need (hidden 256, MLP 512:
/// every matrix's rows are whole super-blocks), with the `llama_f32`
/// fixture's vocabulary and tokenizer.
fn wide_random_model() -> (ModelConfig, WeightStore) {
    let mut cfg = ModelConfig::from_file(fixture("llama_f32").join("config.json")).unwrap();
    cfg.hidden_size = 256;
    cfg.intermediate_size = 512;
    cfg.head_dim = 64;
    let (h, f, v, kv) = (256, 512, cfg.vocab_size, cfg.num_key_value_heads * 64);
    let mut seed = 0u64;
    let mut tensor = |shape: &[usize], scale: f32, offset: f32| {
        seed += 1;
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n as u64)
            .map(|i| {
                let u = (fucina::exec::rng::at(seed, i) >> 40) as f32 / (1u64 << 24) as f32;
                offset + scale * (2.0 * u - 1.0)
            })
            .collect();
        fucina_llm::Weight::from_f32(WeightFormat::F32, shape, &values).unwrap()
    };
    let mut t = std::collections::HashMap::new();
    t.insert(
        "model.embed_tokens.weight".into(),
        tensor(&[v, h], 1.0, 0.0),
    );
    t.insert("model.norm.weight".into(), tensor(&[h], 0.1, 1.0));
    t.insert("lm_head.weight".into(), tensor(&[v, h], 0.1, 0.0));
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}.");
        for (name, shape, scale, offset) in [
            ("input_layernorm.weight", vec![h], 0.1, 1.0),
            ("post_attention_layernorm.weight", vec![h], 0.1, 1.0),
            ("self_attn.q_proj.weight", vec![h, h], 0.1, 0.0),
            ("self_attn.k_proj.weight", vec![kv, h], 0.1, 0.0),
            ("self_attn.v_proj.weight", vec![kv, h], 0.1, 0.0),
            ("self_attn.o_proj.weight", vec![h, h], 0.1, 0.0),
            ("mlp.gate_proj.weight", vec![f, h], 0.1, 0.0),
            ("mlp.up_proj.weight", vec![f, h], 0.1, 0.0),
            ("mlp.down_proj.weight", vec![h, f], 0.07, 0.0),
        ] {
            t.insert(format!("{p}{name}"), tensor(&shape, scale, offset));
        }
    }
    (cfg, WeightStore::from_tensors(t))
}

/// `store` with every tensor widened to f32.
fn dequantized(store: &WeightStore) -> WeightStore {
    WeightStore::from_tensors(
        store
            .iter()
            .map(|(n, w)| {
                let v = w.to_f32_vec();
                (
                    n.to_string(),
                    fucina_llm::Weight::from_f32(WeightFormat::F32, w.shape(), &v).unwrap(),
                )
            })
            .collect(),
    )
}

/// A GGUF file with Q4_K and Q6_K matrices (llama.cpp's Q4_K_M choice: Q6_K for
/// the output projection, the v and down projections; Q4_K elsewhere) loads
/// with its blocks mapped, is not repacked, and gives logits close to the same
/// model with its weights dequantized to f32 (the same greedy ids at every
/// position), the same bits for 1 and 3 threads, and close to the f32 original.
#[test]
fn k_quant_gguf_models_match_their_dequantized_weights() {
    let (cfg, store) = wide_random_model();
    let vocab = cfg.vocab_size;
    let reference = logits(&Model::from_parts(cfg.clone(), store.clone()).unwrap(), 1);
    let scale = reference.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let q6 = |n: &str| {
        n == "lm_head.weight" || n.ends_with("v_proj.weight") || n.ends_with("down_proj.weight")
    };
    let quant_of = |n: &str| -> Option<QuantFormat> {
        Some(if q6(n) {
            QuantFormat::Q6_K
        } else {
            QuantFormat::Q4_K
        })
    };
    let path = write(&convert_with(&cfg, &store, &[], &[], &quant_of), "k");
    let (gcfg, gstore, _file) = load_gguf(&path).unwrap();
    for (name, f) in [
        ("model.layers.0.mlp.up_proj.weight", QuantFormat::Q4_K),
        ("model.layers.1.mlp.down_proj.weight", QuantFormat::Q6_K),
        ("lm_head.weight", QuantFormat::Q6_K),
        ("model.embed_tokens.weight", QuantFormat::Q4_K),
        ("model.layers.0.self_attn.q_proj.weight", QuantFormat::Q4_K),
    ] {
        let w = gstore.get(name).unwrap();
        assert_eq!(w.quant_format(), Some(f), "{name}");
        if !name.contains("q_proj") {
            assert!(w.is_mapped(), "{name} is read in place");
        }
    }
    // The K formats are read in place: nothing is repacked.
    let mut repacked = gstore.clone();
    assert_eq!(repacked.repack_quantized(&ExecContext::new()).unwrap(), 0);
    let deq = logits(
        &Model::from_parts(gcfg.clone(), dequantized(&gstore)).unwrap(),
        1,
    );
    let model = Model::from_parts(gcfg, gstore).unwrap();
    let one = logits(&model, 1);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&logits(&model, 3)), bits(&one), "1 and 3 threads");
    let diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
    };
    let ids = |v: &[f32]| v.chunks(vocab).map(argmax).collect::<Vec<_>>();
    let deq_diff = diff(&one, &deq);
    let deq_scale = deq.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    eprintln!(
        "K model: max |logit - dequantized-f32 logit| = {deq_diff:.3e} (largest {deq_scale:.3})"
    );
    assert!(
        deq_diff <= 0.03 * deq_scale,
        "against its dequantized weights: {deq_diff}"
    );
    assert_eq!(
        ids(&one),
        ids(&deq),
        "greedy ids against the dequantized model"
    );
    let max_diff = diff(&one, &reference);
    let top1 = ids(&one)
        .iter()
        .zip(ids(&reference))
        .filter(|(a, b)| *a == b)
        .count();
    eprintln!(
        "K model: max |logit - f32 logit| = {max_diff:.3e} ({:.2} % of the largest logit {scale:.3}); top-1 agreement {top1}/12",
        100.0 * max_diff / scale
    );
    assert!(max_diff <= 0.35 * scale, "{max_diff}");
}

/// A GGUF file mixing the formats of llama.cpp's `Q5_K_M`, `Q4_1`, `Q5_0`,
/// `Q5_1`, `Q2_K`, `Q3_K_M`, `IQ4_NL` and `IQ4_XS` presets per tensor (Q5_K,
/// Q6_K, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, IQ4_NL, IQ4_XS) loads with
/// every tensor in its format, and gives logits close to the same model with
/// its weights dequantized to f32 (the same greedy ids), the same bits for 1
/// and 3 threads.
#[test]
fn mixed_legacy_and_k5_gguf_models_match_their_dequantized_weights() {
    let (cfg, store) = wide_random_model();
    let vocab = cfg.vocab_size;
    let quant_of = |n: &str| -> Option<QuantFormat> {
        Some(if n == "lm_head.weight" {
            QuantFormat::Q6_K
        } else if n.ends_with("v_proj.weight") {
            QuantFormat::Q5_0
        } else if n.ends_with("down_proj.weight") {
            QuantFormat::Q5_1
        } else if n.ends_with("up_proj.weight") {
            QuantFormat::Q2_K
        } else if n.ends_with("k_proj.weight") {
            QuantFormat::Q8_0
        } else if n.ends_with("o_proj.weight") {
            QuantFormat::IQ4_XS
        } else if n.ends_with("gate_proj.weight") {
            QuantFormat::IQ4_NL
        } else if n.ends_with("q_proj.weight") {
            QuantFormat::Q3_K
        } else if n == "model.embed_tokens.weight" {
            QuantFormat::Q4_1
        } else {
            QuantFormat::Q5_K
        })
    };
    let path = write(&convert_with(&cfg, &store, &[], &[], &quant_of), "k5");
    let (gcfg, gstore, _file) = load_gguf(&path).unwrap();
    for (name, w) in gstore.iter() {
        if w.shape().len() == 2 {
            assert_eq!(w.quant_format(), quant_of(name), "{name}");
        }
    }
    let deq = logits(
        &Model::from_parts(gcfg.clone(), dequantized(&gstore)).unwrap(),
        1,
    );
    let model = Model::from_parts(gcfg, gstore).unwrap();
    let one = logits(&model, 1);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&logits(&model, 3)), bits(&one), "1 and 3 threads");
    let deq_diff = one
        .iter()
        .zip(&deq)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    let deq_scale = deq.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    eprintln!(
        "mixed model: max |logit - dequantized-f32 logit| = {deq_diff:.3e} (largest {deq_scale:.3})"
    );
    assert!(
        deq_diff <= 0.03 * deq_scale,
        "against its dequantized weights: {deq_diff}"
    );
    let ids = |v: &[f32]| v.chunks(vocab).map(argmax).collect::<Vec<_>>();
    assert_eq!(
        ids(&one),
        ids(&deq),
        "greedy ids against the dequantized model"
    );
}

/// A K-quant tensor whose rows are not whole super-blocks, or whose data is
/// cut short, is an error naming it.
#[test]
fn bad_k_quant_tensors_are_named() {
    let mut w = Writer::default();
    w.kv("general.architecture", 8, &str_v("llama"));
    w.tensor("blk.0.ffn_up.weight", &[128, 2], 12, &[0u8; 144]);
    let e = fucina_llm::gguf::GgufFile::open(write(&w.bytes(), "k-rows"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blk.0.ffn_up.weight") && e.contains("256"),
        "{e}"
    );
    let mut w = Writer::default();
    w.kv("general.architecture", 8, &str_v("llama"));
    w.tensor("output.weight", &[256, 2], 14, &[0u8; 419]); // two rows need 420 bytes
    let e = fucina_llm::gguf::GgufFile::open(write(&w.bytes(), "k-short"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("output.weight"), "{e}");
    // A Q4_K weight built by hand with the wrong byte count names itself.
    let e = fucina_llm::Weight::quantized("w", QuantFormat::Q4_K, &[2, 256], vec![0u8; 287])
        .unwrap_err()
        .to_string();
    assert!(e.contains('w') && e.contains("288"), "{e}");
    let e = fucina_llm::Weight::quantized("w2", QuantFormat::Q6_K, &[2, 128], vec![0u8; 210])
        .unwrap_err()
        .to_string();
    assert!(e.contains("w2") && e.contains("256"), "{e}");
}

/// `convert(Q4_K)` (`generate --dtype q4_k`) of a model whose matrices are whole
/// super-blocks: Q4_K matrices, the output projection in Q6_K, the bytes of
/// the runtime's quantizer, logits close to the f32 model's.
#[test]
fn q4_k_conversion_keeps_the_output_projection_in_q6_k() {
    let (cfg, store) = wide_random_model();
    let ctx = ExecContext::with_threads(2);
    let conv = store.convert(&ctx, LoadDtype::Q4_K, false).unwrap();
    for (name, w) in store.iter() {
        let c = conv.get(name).unwrap();
        let &[rows, cols] = w.shape() else {
            assert_eq!(c.quant_format(), None, "{name}");
            continue;
        };
        let q = if name == "lm_head.weight" {
            QuantFormat::Q6_K
        } else {
            QuantFormat::Q4_K
        };
        assert_eq!(c.quant_format(), Some(q), "{name}");
        let want = ctx.quantize(q, rows, cols, &w.to_f32_vec()).unwrap();
        assert!(c.bytes() == want.bytes(), "{name}: bytes");
    }
    let reference = logits(&Model::from_parts(cfg.clone(), store).unwrap(), 1);
    let scale = reference.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let one = logits(&Model::from_parts(cfg.clone(), conv).unwrap(), 1);
    let vocab = cfg.vocab_size;
    let max_diff = one
        .iter()
        .zip(&reference)
        .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
    let top1 = one
        .chunks(vocab)
        .zip(reference.chunks(vocab))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    eprintln!(
        "convert(Q4_K): max |logit - f32 logit| = {max_diff:.3e} ({:.2} % of {scale:.3}); top-1 {top1}/12",
        100.0 * max_diff / scale
    );
    assert!(max_diff <= 0.35 * scale, "{max_diff}");
}
