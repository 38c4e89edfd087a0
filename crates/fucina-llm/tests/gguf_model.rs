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
use fucina::exec::{QuantFormat, TensorFormat, WeightFormat};
use fucina_llm::arch::gguf::load_gguf;
use fucina_llm::sample::SamplingParams;
use fucina_llm::{FormatChoice, LlmError, LoadDtype, Model, ModelConfig, WeightStore, open_model};

#[path = "../examples/common/batch.rs"]
mod batch;
#[path = "../../fucina-exec/tests/child_process/mod.rs"]
#[macro_use]
mod child_process;
mod gguf_support;
mod gguf_vocab;
use gguf_support::{Writer, f32v, llama_gguf_name, permute, str_v, u32v};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
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
    // A code ggml does not define, and the largest u32.
    for code in [99u32, u32::MAX] {
        let mut w = Writer::default();
        w.kv("general.architecture", 8, &str_v("llama"));
        w.tensor("blk.1.ffn_down.weight", &[256, 1], code, &[0u8; 64]);
        let path = write(&w.bytes(), &format!("code-{code}"));
        let file = fucina_llm::gguf::GgufFile::open(&path).unwrap();
        let e = fucina_llm::arch::gguf::gguf_weights(&file, &cfg).unwrap_err();
        assert!(
            matches!(e, LlmError::BadTensor { ref name, .. } if name == "blk.1.ffn_down.weight")
                && e.to_string().contains(&format!(
                    "its GGUF ggml type {code}, which ggml does not define, is not supported"
                )),
            "{e}"
        );
    }
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
    // An f32 file read as it is: every tensor the file's, in f32.
    assert_eq!(
        opened.model.formats().counts(),
        vec![(TensorFormat::F32, store.len())]
    );
    assert_eq!(
        opened.model.formats().to_string(),
        format!("formats: {} f32", store.len())
    );
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
    random_model(512)
}

/// [`wide_random_model`] with an MLP width of `f` (the down projection's
/// column count).
fn random_model(f: usize) -> (ModelConfig, WeightStore) {
    let mut cfg = ModelConfig::from_file(fixture("llama_f32").join("config.json")).unwrap();
    cfg.hidden_size = 256;
    cfg.intermediate_size = f;
    cfg.head_dim = 64;
    let (h, v, kv) = (256, cfg.vocab_size, cfg.num_key_value_heads * 64);
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
/// with its blocks mapped, has its Q4_K matrices of whole strips repacked
/// (the same bits), and gives logits close to the same
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
    // Q4_K matrices of a multiple of 8 rows are repacked (strips of eight
    // rows), the others (Q6_K, a row count off the strips, the embedding
    // table beside its own lm_head) read in place.
    let mut repacked = gstore.clone();
    let n = repacked.repack_quantized(&ExecContext::new()).unwrap();
    let mut want = 0;
    for (name, w) in repacked.iter() {
        // (the embedding table, only read by rows beside its own lm_head,
        // stays in place)
        let strips = w.quant_format() == Some(QuantFormat::Q4_K)
            && w.shape().len() == 2
            && w.shape()[0] % 8 == 0
            && name != "model.embed_tokens.weight";
        assert_eq!(w.is_repacked(), strips, "{name}");
        want += usize::from(strips);
    }
    assert_eq!(n, want);
    assert!(n > 0, "some Q4_K matrix is repacked");
    let deq = logits(
        &Model::from_parts(gcfg.clone(), dequantized(&gstore)).unwrap(),
        1,
    );
    let model = Model::from_parts(gcfg.clone(), gstore).unwrap();
    let one = logits(&model, 1);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&logits(&model, 3)), bits(&one), "1 and 3 threads");
    let repacked = Model::from_parts(gcfg, repacked).unwrap();
    assert_eq!(bits(&logits(&repacked, 1)), bits(&one), "repacked Q4_K");
    assert_eq!(
        bits(&logits(&repacked, 3)),
        bits(&one),
        "repacked, 3 threads"
    );
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
    // The file's mix of types is reported as it is, tensor by tensor.
    let report = gstore.format_report();
    assert_eq!(report.entries().len(), gstore.len());
    for (name, w) in gstore.iter() {
        let e = report.get(name).unwrap();
        assert_eq!(
            (e.shape.as_slice(), e.choice),
            (w.shape(), FormatChoice::File)
        );
        let want = match w.shape().len() {
            2 => TensorFormat::from(quant_of(name).unwrap()),
            _ => TensorFormat::F32,
        };
        assert_eq!(e.format, want, "{name}");
    }
    let layers = cfg.num_hidden_layers;
    assert_eq!(
        report.summary(),
        format!(
            "formats: {} f32, {layers} q8_0, 1 q4_1, {layers} q5_0, {layers} q5_1, {layers} q2_k, \
             {layers} q3_k, 1 q6_k, {layers} iq4_nl, {layers} iq4_xs",
            2 * layers + 1
        )
    );
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

/// `convert(Q4_K)` of a model whose down projections' rows (320 columns) are
/// not whole super-blocks: those fall back to Q5_0 (llama.cpp's rule,
/// `conversion_target`), the other matrices take Q4_K, the output projection
/// Q6_K; the converted store and the model built from it report each tensor's
/// format and why, the summary groups the fallbacks by name, and the model
/// runs close to f32.
#[test]
fn q4_k_conversion_falls_back_per_tensor_and_reports_it() {
    let (cfg, store) = random_model(320);
    let ctx = ExecContext::with_threads(2);
    assert!(
        store
            .format_report()
            .entries()
            .iter()
            .all(|e| e.choice == FormatChoice::File && e.format == TensorFormat::F32)
    );
    let conv = store.convert(&ctx, LoadDtype::Q4_K, false).unwrap();
    let report = conv.format_report();
    assert_eq!(report.entries().len(), store.len());
    for (name, w) in store.iter() {
        let e = report.get(name).unwrap();
        assert_eq!(e.shape, w.shape(), "{name}");
        assert_eq!(e.format, conv.get(name).unwrap().tensor_format(), "{name}");
        let (format, choice) = match name {
            _ if w.shape().len() == 1 => (TensorFormat::F32, FormatChoice::File),
            "lm_head.weight" => (TensorFormat::Q6_K, FormatChoice::Output),
            _ if name.ends_with("down_proj.weight") => (
                TensorFormat::Q5_0,
                FormatChoice::Fallback {
                    wanted: QuantFormat::Q4_K,
                },
            ),
            _ => (TensorFormat::Q4_K, FormatChoice::Asked),
        };
        assert_eq!((e.format, e.choice), (format, choice), "{name}");
        if let (Some(q), &[rows, cols]) = (format.quant(), w.shape()) {
            let want = ctx.quantize(q, rows, cols, &w.to_f32_vec()).unwrap();
            assert!(
                conv.get(name).unwrap().bytes() == want.bytes(),
                "{name}: bytes"
            );
        }
    }
    let layers = cfg.num_hidden_layers;
    assert_eq!(
        report.counts(),
        vec![
            (TensorFormat::F32, 2 * layers + 1),
            (TensorFormat::Q5_0, layers),
            (TensorFormat::Q4_K, 6 * layers + 1),
            (TensorFormat::Q6_K, 1),
        ]
    );
    assert_eq!(report.fallbacks().count(), layers);
    assert_eq!(
        report.to_string(),
        format!(
            "formats: {} f32, {layers} q5_0, {} q4_k, 1 q6_k ({layers} fell back)\n  \
             model.layers.*.mlp.down_proj.weight ×{layers}: 320 columns, q4_k → q5_0",
            2 * layers + 1,
            6 * layers + 1
        )
    );
    let listing = report.listing();
    assert_eq!(listing.lines().count(), store.len());
    assert!(
        listing
            .contains("model.layers.0.mlp.down_proj.weight [256, 320] q5_0 (fallback of q4_k)\n")
            && listing.contains("lm_head.weight [320, 256] q6_k (output projection)\n")
            && listing.contains("model.norm.weight [256] f32 (file)\n")
            && listing.contains("model.layers.1.mlp.up_proj.weight [320, 256] q4_k (asked)\n"),
        "{listing}"
    );
    // The model keeps the report of the store it was built from.
    let reference = logits(&Model::from_parts(cfg.clone(), store).unwrap(), 1);
    let model = Model::from_parts(cfg, conv).unwrap();
    assert_eq!(model.formats(), &report);
    let one = logits(&model, 1);
    let scale = reference.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let max_diff = one
        .iter()
        .zip(&reference)
        .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(max_diff <= 0.35 * scale, "{max_diff} of {scale}");
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

/// The offset of the f16 scale `d` in a block of `q` (llama.cpp's layouts,
/// `docs/QUANTIZATION.md`).
fn scale_offset(q: QuantFormat) -> usize {
    match q {
        QuantFormat::Q2_K => 80,
        QuantFormat::Q3_K => 108,
        QuantFormat::Q6_K => 208,
        _ => 0,
    }
}

/// f16 NaN, +inf and -inf.
const NON_FINITE_F16: [u16; 3] = [0x7e00, 0x7c00, 0xfc00];

/// A block scale that is NaN or infinite, in every block format, read from a
/// GGUF file: the file loads (the loader does not read the blocks, as
/// llama.cpp's does not unless asked to check them), and
/// `WeightStore::check_finite` (that check) is an error naming the tensor, the
/// row and the block; the block's values
/// dequantize to NaN (a NaN scale) or to non-finite values (an infinite one),
/// every other value to the same bits as without it; a product reading that
/// row gives NaN (resp. non-finite) outputs in that column only, at every
/// activation row, in place and from the repacked strips (Q8_0, Q4_0).
#[test]
fn non_finite_block_scales_load_and_poison_only_their_outputs() {
    let cfg = ModelConfig::from_file(fixture("llama_f32").join("config.json")).unwrap();
    let ctx = ExecContext::with_threads(2);
    let (rows, cols, m) = (4usize, 512usize, 3usize);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 29 % 89) as f32 - 44.0) / 300.0)
        .collect();
    let x: Vec<f32> = (0..m * cols).map(|i| (i as f32 * 0.37).sin()).collect();
    for q in QuantFormat::ALL {
        let good = ctx.quantize(q, rows, cols, &w).unwrap().bytes().to_vec();
        let good = fucina_llm::Weight::quantized("good", q, &[rows, cols], good).unwrap();
        let good_values = good.to_f32_vec();
        let mut good_out = vec![0.0f32; m * rows];
        good.matmul(&ctx, &x, m, &mut good_out).unwrap();
        let row_bytes = cols / q.block_elements() * q.block_bytes();
        for bits in NON_FINITE_F16 {
            let mut bytes = good.bytes().to_vec();
            let at = row_bytes + scale_offset(q); // row 1, block 0
            bytes[at..at + 2].copy_from_slice(&bits.to_le_bytes());
            let code = TensorFormat::from(q).ggml_code();
            let mut gguf = Writer::default();
            gguf.kv("general.architecture", 8, &str_v("llama"));
            gguf.tensor("output.weight", &[cols as u64, rows as u64], code, &bytes);
            let path = write(&gguf.bytes(), &format!("nan-{}-{bits:x}", q.name()));
            let file = fucina_llm::gguf::GgufFile::open(&path).unwrap();
            let store = fucina_llm::arch::gguf::gguf_weights(&file, &cfg).unwrap();
            let mut wt = store.get("lm_head.weight").unwrap().clone();
            let nan = bits == 0x7e00;
            let what = format!("{q:?}, scale {bits:#x}");
            // The opt-in check (`--check-tensors`) names the tensor, the row
            // and the block.
            let e = store.check_finite().unwrap_err();
            assert!(
                matches!(e, LlmError::BadTensor { ref name, .. } if name == "lm_head.weight")
                    && e.to_string().contains("row 1, column 0 is ")
                    && e.to_string().contains(&format!(
                        "block 0 of the row ({} values of {})",
                        q.block_elements(),
                        q.name()
                    )),
                "{what}: {e}"
            );
            let values = wt.to_f32_vec();
            for (i, (v, g)) in values.iter().zip(&good_values).enumerate() {
                if i / cols == 1 && i % cols < q.block_elements() {
                    assert!(
                        !v.is_finite() && (!nan || v.is_nan()),
                        "{what}: value {i} = {v}"
                    );
                } else {
                    assert_eq!(v.to_bits(), g.to_bits(), "{what}: value {i}");
                }
            }
            for repack in [false, true] {
                if repack && !wt.repack(&ctx).unwrap() {
                    continue;
                }
                let mut out = vec![0.0f32; m * rows];
                wt.matmul(&ctx, &x, m, &mut out).unwrap();
                for (i, (o, g)) in out.iter().zip(&good_out).enumerate() {
                    if i % rows == 1 {
                        assert!(
                            !o.is_finite() && (!nan || o.is_nan()),
                            "{what}, repacked {repack}: output {i} = {o}"
                        );
                    } else {
                        assert_eq!(
                            o.to_bits(),
                            g.to_bits(),
                            "{what}, repacked {repack}: output {i}"
                        );
                    }
                }
            }
        }
    }
}

/// `WeightStore::check_finite` passes a store of finite values, quantized or
/// not, and names a float tensor's first non-finite value.
#[test]
fn check_finite_passes_finite_stores_and_names_float_nans() {
    let (_, store) = wide_random_model();
    store.check_finite().unwrap();
    let ctx = ExecContext::with_threads(2);
    for dtype in [LoadDtype::Q4_K, LoadDtype::IQ4_NL, LoadDtype::BF16] {
        store
            .convert(&ctx, dtype, false)
            .unwrap()
            .check_finite()
            .unwrap();
    }
    let mut tensors: std::collections::HashMap<String, fucina_llm::Weight> = store
        .iter()
        .map(|(n, w)| (n.to_string(), w.clone()))
        .collect();
    let mut norm = vec![1.0f32; 256];
    norm[9] = f32::INFINITY;
    tensors.insert(
        "model.norm.weight".into(),
        fucina_llm::Weight::from_f32(WeightFormat::F16, &[256], &norm).unwrap(),
    );
    let mut v = store
        .get("model.layers.1.mlp.up_proj.weight")
        .unwrap()
        .to_f32_vec();
    v[3 * 256 + 17] = f32::NAN;
    tensors.insert(
        "model.layers.1.mlp.up_proj.weight".into(),
        fucina_llm::Weight::from_f32(WeightFormat::F32, &[512, 256], &v).unwrap(),
    );
    let store = WeightStore::from_tensors(tensors);
    let e = store.check_finite().unwrap_err().to_string();
    // Name order: the layer's matrix comes before the final norm.
    assert!(
        e.contains("model.layers.1.mlp.up_proj.weight") && e.contains("row 3, column 17 is NaN"),
        "{e}"
    );
    let mut only_norm: std::collections::HashMap<String, fucina_llm::Weight> =
        std::collections::HashMap::new();
    only_norm.insert(
        "model.norm.weight".into(),
        store.get("model.norm.weight").unwrap().clone(),
    );
    let e = WeightStore::from_tensors(only_norm)
        .check_finite()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.norm.weight") && e.contains("element 9 is inf"),
        "{e}"
    );
}

/// A model whose output projection has a NaN block scale (Q5_0, a format of
/// blocks of 32, and Q4_K, a super-block format) builds and prefills; that
/// token's logit is NaN at every position, the others finite; sampling such
/// logits is an error, not a token.
#[test]
fn a_nan_scale_in_the_output_projection_gives_nan_logits_that_sampling_refuses() {
    let (cfg, store) = wide_random_model();
    let ctx = ExecContext::with_threads(2);
    let vocab = cfg.vocab_size;
    let token = 7usize;
    for q in [QuantFormat::Q5_0, QuantFormat::Q4_K] {
        let head = store.get("lm_head.weight").unwrap();
        let &[rows, cols] = head.shape() else {
            unreachable!()
        };
        let mut bytes = ctx
            .quantize(q, rows, cols, &head.to_f32_vec())
            .unwrap()
            .bytes()
            .to_vec();
        let at = token * (cols / q.block_elements() * q.block_bytes()) + scale_offset(q);
        bytes[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
        let mut tensors: std::collections::HashMap<String, fucina_llm::Weight> = store
            .iter()
            .map(|(n, w)| (n.to_string(), w.clone()))
            .collect();
        tensors.insert(
            "lm_head.weight".into(),
            fucina_llm::Weight::quantized("lm_head.weight", q, &[rows, cols], bytes).unwrap(),
        );
        let model = Model::from_parts(cfg.clone(), WeightStore::from_tensors(tensors)).unwrap();
        let all = logits(&model, 2);
        for (i, l) in all.iter().enumerate() {
            assert_eq!(l.is_nan(), i % vocab == token, "{q:?}: logit {i} = {l}");
            assert!(l.is_nan() || l.is_finite(), "{q:?}: logit {i} = {l}");
        }
        let mut sampler = fucina_llm::Sampler::new(SamplingParams::default()).unwrap();
        let e = sampler.sample(&all[..vocab], &[]).unwrap_err();
        assert!(
            e.to_string().contains(&format!("logit {token} is NaN")),
            "{q:?}: {e}"
        );
    }
}

/// The committed fuzz seed with a tensor in every block format.
const BLOCK_FORMAT_SEEDS: [&str; 2] = [
    "../../fuzz/seeds/gguf_header/llama_block_formats.gguf",
    "../../fuzz/seeds/gguf_model/llama_block_formats.gguf",
];

/// A Llama GGUF image whose layer `i` holds an up projection (2 rows of 256
/// columns) in the `i`-th block format, with a narrow Q4_0 embedding table
/// and the `llama_f32` fixture's tokenizer: the fuzz seed of `gguf_header` and
/// `gguf_model`.
fn block_format_seed() -> Vec<u8> {
    let mut cfg = ModelConfig::from_file(fixture("llama_f32").join("config.json")).unwrap();
    cfg.hidden_size = 256;
    cfg.head_dim = 64;
    cfg.num_hidden_layers = QuantFormat::ALL.len();
    let mut t = std::collections::HashMap::new();
    let values: Vec<f32> = (0..512)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    for l in 0..QuantFormat::ALL.len() {
        let w = fucina_llm::Weight::from_f32(WeightFormat::F32, &[2, 256], &values).unwrap();
        t.insert(format!("model.layers.{l}.mlp.up_proj.weight"), w);
    }
    let norm = fucina_llm::Weight::from_f32(WeightFormat::F32, &[256], &[1.0; 256]).unwrap();
    t.insert("model.norm.weight".to_string(), norm);
    // The embedding table gives the vocabulary size: narrow, in Q4_0.
    let v = cfg.vocab_size;
    let embed: Vec<f32> = (0..v * 32).map(|i| (i % 7) as f32 - 3.0).collect();
    let embed = fucina_llm::Weight::from_f32(WeightFormat::F32, &[v, 32], &embed).unwrap();
    t.insert("model.embed_tokens.weight".to_string(), embed);
    let store = WeightStore::from_tensors(t);
    convert_with(&cfg, &store, &[], &[], &|name: &str| {
        if name == "model.embed_tokens.weight" {
            return Some(QuantFormat::Q4_0);
        }
        let layer: usize = name.split('.').nth(2)?.parse().ok()?;
        QuantFormat::ALL.get(layer).copied()
    })
}

/// Writes the seeds of [`BLOCK_FORMAT_SEEDS`] (run with `--ignored` after a
/// change to the test writer or the quantizers).
#[test]
#[ignore = "writes the committed fuzz seeds"]
fn write_block_format_fuzz_seeds() {
    let bytes = block_format_seed();
    for p in BLOCK_FORMAT_SEEDS {
        std::fs::write(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p), &bytes).unwrap();
    }
}

/// The committed seeds load as the `gguf_model` target loads them: the
/// config, the weights with a matrix in every block format (each
/// dequantizing to the values it was quantized from, within 0.4 of their
/// range ±0.78: Q2_K has four levels), and
/// the tokenizer.
#[test]
fn the_block_format_fuzz_seeds_load() {
    let values: Vec<f32> = (0..512)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    for p in BLOCK_FORMAT_SEEDS {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p);
        let file = fucina_llm::gguf::GgufFile::open(&path).unwrap();
        let config = fucina_llm::arch::gguf::gguf_config(&file).unwrap();
        let store = fucina_llm::arch::gguf::gguf_weights(&file, &config).unwrap();
        for (l, q) in QuantFormat::ALL.into_iter().enumerate() {
            let w = store
                .get(&format!("model.layers.{l}.mlp.up_proj.weight"))
                .unwrap();
            assert_eq!(w.quant_format(), Some(q), "{}", path.display());
            let worst = w
                .to_f32_vec()
                .iter()
                .zip(&values)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst < 0.4, "{q:?}: {worst}");
        }
        fucina_llm::Tokenizer::from_gguf(&file).unwrap();
    }
}
