//! The fixture models of tests/fixtures/ (tiny random-weight Hugging Face
//! models written by scripts/make_fixtures.py) against what `transformers`
//! computed for them: the logits of every prompt position, the 32 greedy ids
//! and the logits each was chosen from; the `generate` example's batch loop
//! (batched decode, sequences dropping out) against single-sequence runs; and
//! the examples' `.npy` writer against files `numpy.save` wrote.

#[path = "../examples/common/batch.rs"]
mod batch;
#[path = "../examples/common/npy.rs"]
mod npy;

use std::path::{Path, PathBuf};

use fucina_llm::fucina::ExecContext;
use fucina_llm::model::Model;
use fucina_llm::sample::{Sampler, SamplingParams};
use serde_json::Value;

/// Every fixture model directory.
const MODELS: [&str; 14] = [
    "llama_f32",
    "llama_bf16",
    "llama_f16",
    "llama3_rope_f32",
    "llama_linear_f32",
    "qwen2_f32",
    "mistral_f32",
    "qwen3_f32",
    "gemma2_f32",
    "gemma3_f32",
    "phi3_f32",
    "phi4_mini_f32",
    "qwen3_moe_f32",
    "mixtral_f32",
];

/// The tolerance on logits: f32 weights, and bf16/f16 weights whose reference
/// ran in f32 on the same rounded values.
const TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

struct Reference {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    dtype: String,
    /// [prompt.len(), vocab]
    logits: Vec<f32>,
    /// [greedy.len(), vocab]
    gen_logits: Vec<f32>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn reference(name: &str, vocab: usize) -> Reference {
    let dir = fixture(name);
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let prompt = ids(&r["prompt_ids"]);
    let greedy = ids(&r["greedy_ids"]);
    let (shape, logits) = npy::read_npy_f32(&dir.join("logits.npy")).unwrap();
    assert_eq!(shape, [prompt.len(), vocab], "{name}: logits.npy shape");
    let (shape, gen_logits) = npy::read_npy_f32(&dir.join("gen_logits.npy")).unwrap();
    assert_eq!(shape, [greedy.len(), vocab], "{name}: gen_logits.npy shape");
    Reference {
        prompt,
        greedy,
        dtype: r["weights_dtype"].as_str().unwrap().to_string(),
        logits,
        gen_logits,
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0.0,
            |m: f32, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}

/// Prefill logits, then 32 greedy steps (one decode call each), against
/// `transformers`. Returns the largest logit difference seen.
fn check_model(name: &str, ctx: &ExecContext) -> f32 {
    let model = Model::load(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let vocab = model.config().vocab_size;
    let r = reference(name, vocab);
    let t = r.prompt.len();
    let n = r.greedy.len();
    assert_eq!(n, 32, "{name}: the reference has 32 greedy ids");

    let mut cache = model.new_cache(ctx, t + n).unwrap();
    let mut all = vec![0f32; t * vocab];
    let mut last = vec![0f32; vocab];
    model
        .prefill(ctx, &mut cache, &r.prompt, Some(&mut all), &mut last)
        .unwrap();
    assert_eq!(cache.len(), t);
    let prefill_diff = max_abs_diff(&all, &r.logits);
    assert!(
        prefill_diff <= TOL,
        "{name} ({}): prefill logits differ from transformers' by {prefill_diff}",
        r.dtype
    );
    assert_eq!(
        last.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        all[(t - 1) * vocab..]
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        "{name}: last_logits is the last row of all_logits"
    );

    let mut sampler = Sampler::with_vocab(SamplingParams::default(), vocab).unwrap();
    let mut history = r.prompt.clone();
    let mut logits = last;
    let mut decode_diff = 0f32;
    for step in 0..n {
        let d = max_abs_diff(&logits, &r.gen_logits[step * vocab..(step + 1) * vocab]);
        assert!(
            d <= TOL,
            "{name} ({}): the logits of greedy step {step} differ from transformers' by {d}",
            r.dtype
        );
        decode_diff = decode_diff.max(d);
        let tok = sampler.sample(&logits, &history).unwrap();
        assert_eq!(
            tok,
            r.greedy[step],
            "{name}: greedy id {step} (ids so far {:?})",
            &history[t..]
        );
        history.push(tok);
        if step + 1 < n {
            model
                .decode(ctx, &mut [&mut cache], &[tok], &mut logits)
                .unwrap();
        }
    }
    assert_eq!(&history[t..], &r.greedy[..]);
    eprintln!(
        "{name} ({}): max |logit - transformers| prefill {prefill_diff:.2e}, decode {decode_diff:.2e}",
        r.dtype
    );
    prefill_diff.max(decode_diff)
}

#[test]
fn every_fixture_matches_transformers() {
    let ctx = ExecContext::with_threads(2);
    let mut worst = 0f32;
    for name in MODELS {
        worst = worst.max(check_model(name, &ctx));
    }
    eprintln!("all fixtures: max |logit - transformers| {worst:.2e} (tolerance {TOL:.0e})");
}

#[test]
fn prefill_in_pieces_gives_the_reference_rows() {
    // A prompt prefilled in two calls: the second call's rows are the
    // reference's rows for those positions (positions continue from the cache).
    let ctx = ExecContext::with_threads(1);
    for name in [
        "llama_f32",
        "mistral_f32",
        "qwen2_f32",
        "qwen3_f32",
        "gemma2_f32",
        "gemma3_f32",
        "phi3_f32",
        "phi4_mini_f32",
        "qwen3_moe_f32",
        "mixtral_f32",
    ] {
        let model = Model::load(fixture(name)).unwrap();
        let vocab = model.config().vocab_size;
        let r = reference(name, vocab);
        let t = r.prompt.len();
        let split = t / 2;
        // The capacity of the main test (LongRoPE's factors follow it).
        let mut cache = model.new_cache(&ctx, t + 32).unwrap();
        let mut last = vec![0f32; vocab];
        model
            .prefill(&ctx, &mut cache, &r.prompt[..split], None, &mut last)
            .unwrap();
        let mut rest = vec![0f32; (t - split) * vocab];
        model
            .prefill(
                &ctx,
                &mut cache,
                &r.prompt[split..],
                Some(&mut rest),
                &mut last,
            )
            .unwrap();
        let d = max_abs_diff(&rest, &r.logits[split * vocab..]);
        assert!(
            d <= TOL,
            "{name}: rows {split}.. of a split prefill differ by {d}"
        );
    }
}

#[test]
fn the_generate_loop_batches_and_drops_finished_sequences() {
    let ctx = ExecContext::with_threads(2);
    let model = Model::load(fixture("llama_f32")).unwrap();
    let vocab = model.config().vocab_size;
    let r = reference("llama_f32", vocab);
    let greedy = SamplingParams::default();

    // The full prompt alone: transformers' greedy ids.
    let solo = batch::generate(
        &model,
        &ctx,
        std::slice::from_ref(&r.prompt),
        32,
        &greedy,
        true,
    )
    .unwrap();
    assert_eq!(solo.ids[0], r.greedy);
    let logits = solo.first_prompt_logits.as_ref().unwrap();
    assert!(max_abs_diff(logits, &r.logits) <= TOL);
    assert_eq!(solo.prefill_tokens, r.prompt.len());
    assert_eq!((solo.decode_tokens, solo.decode_steps), (31, 31));

    // Three prompts of different lengths, with a stop token that ends the first
    // sequence early: each sequence's ids are the ones it gets alone.
    let stop = r.greedy[6];
    let first = r.greedy.iter().position(|&t| t == stop).unwrap();
    let params = SamplingParams {
        stop_tokens: vec![stop],
        ..SamplingParams::default()
    };
    let prompts = vec![
        r.prompt.clone(),
        r.prompt[..5].to_vec(),
        vec![7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
    ];
    let together = batch::generate(&model, &ctx, &prompts, 24, &params, false).unwrap();
    assert_eq!(
        together.ids[0],
        r.greedy[..=first],
        "the first sequence stops at {stop}"
    );
    for (i, p) in prompts.iter().enumerate() {
        let alone =
            batch::generate(&model, &ctx, std::slice::from_ref(p), 24, &params, false).unwrap();
        assert_eq!(
            together.ids[i], alone.ids[0],
            "sequence {i} in the batch and alone"
        );
        let len = together.ids[i].len();
        assert!(len == 24 || (len < 24 && together.ids[i][len - 1] == stop));
        // Why it ended, as the `generate` example reports it.
        let why = if together.ids[i][len - 1] == stop {
            batch::Stop::StopToken(stop)
        } else {
            batch::Stop::MaxTokens
        };
        assert_eq!(together.stops[i], why, "sequence {i}");
    }
    assert_eq!(together.stops[0], batch::Stop::StopToken(stop));
    // The tokens reach the streaming callback as they are chosen: in each
    // sequence's order, every one of them.
    let mut streamed = vec![Vec::new(); prompts.len()];
    let out = batch::generate_streaming(&model, &ctx, &prompts, 24, &params, false, &mut |i, t| {
        streamed[i].push(t)
    })
    .unwrap();
    assert_eq!(streamed, out.ids);
    assert_eq!(out.ids, together.ids);
    let total: usize = together.ids.iter().map(Vec::len).sum();
    assert_eq!(together.decode_tokens, total - prompts.len());

    // Seeded sampling: prompt i draws with seed + i, so a batch of one
    // reproduces the batch's first sequence, and the batch's sequences differ.
    let sampled = SamplingParams {
        temperature: 1.0,
        top_k: 50,
        top_p: 0.95,
        seed: 11,
        ..SamplingParams::default()
    };
    let same = vec![r.prompt.clone(), r.prompt.clone()];
    let a = batch::generate(&model, &ctx, &same, 16, &sampled, false).unwrap();
    let b = batch::generate(&model, &ctx, &same[..1], 16, &sampled, false).unwrap();
    assert_eq!(a.ids[0], b.ids[0]);
    assert_ne!(
        a.ids[0], a.ids[1],
        "two sequences with the same prompt draw differently"
    );
    let again = batch::generate(&model, &ctx, &same, 16, &sampled, false).unwrap();
    assert_eq!(a.ids, again.ids);

    // Bad requests are errors.
    assert!(batch::generate(&model, &ctx, &[], 4, &greedy, false).is_err());
    assert!(batch::generate(&model, &ctx, &[vec![]], 4, &greedy, false).is_err());
    assert!(batch::generate(&model, &ctx, &[vec![vocab as u32]], 4, &greedy, false).is_err());
}

#[test]
fn prompt_ids_parse() {
    assert_eq!(
        batch::parse_prompt_ids("1,2,3").unwrap(),
        vec![vec![1, 2, 3]]
    );
    assert_eq!(
        batch::parse_prompt_ids(" 5, 6 ;7").unwrap(),
        vec![vec![5, 6], vec![7]]
    );
    assert!(batch::parse_prompt_ids("1,,2").unwrap() == vec![vec![1, 2]]);
    for bad in ["", "1;", "1;;2", "1,x", "-1", "4294967296"] {
        assert!(
            batch::parse_prompt_ids(bad).is_err(),
            "{bad:?} should be an error"
        );
    }
}

#[test]
fn npy_writer_gives_numpys_bytes() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture("npy"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    for name in MODELS {
        files.push(fixture(name).join("logits.npy"));
        files.push(fixture(name).join("gen_logits.npy"));
    }
    assert!(files.len() >= 5 + 2 * MODELS.len());
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        let (shape, values) = npy::parse_npy_f32(&bytes).unwrap();
        assert_eq!(
            npy::npy_f32_bytes(&shape, &values),
            bytes,
            "{}: the writer's bytes differ from numpy.save's",
            path.display()
        );
    }
    // The values round-trip, and the sample arrays hold what the script wrote.
    let (shape, v) = npy::read_npy_f32(&fixture("npy").join("vector.npy")).unwrap();
    assert_eq!((shape, v), (vec![5], vec![-1.0, -0.5, 0.0, 0.5, 1.0]));
    let (shape, v) = npy::read_npy_f32(&fixture("npy").join("cube.npy")).unwrap();
    assert_eq!(shape, [2, 3, 4]);
    assert_eq!(v[23], 23.0 / 7.0);
    // Corrupt files are errors.
    let good = std::fs::read(fixture("npy").join("matrix.npy")).unwrap();
    assert!(npy::parse_npy_f32(&good[..good.len() - 1]).is_err());
    assert!(npy::parse_npy_f32(&good[..8]).is_err());
    let mut be = good.clone();
    let at = be.windows(5).position(|w| w == b"'<f4'").unwrap();
    be[at + 1] = b'>';
    assert!(npy::parse_npy_f32(&be).is_err());
}

#[test]
fn phi3_and_phi4_mini_rotate_a_short_context_with_the_short_factors() {
    // The reference of `phi3_f32` rotates with LongRoPE's long factors (the
    // test's cache of 42 positions exceeds the original context of 16); a
    // cache of at most 16 positions takes the short ones, whose prompt logits
    // transformers wrote to short_logits.npy. `phi4_mini_f32` rotates only
    // the first 12 of each head's 16 dimensions (a partial rotary embedding).
    let ctx = ExecContext::with_threads(2);
    for name in ["phi3_f32", "phi4_mini_f32"] {
        let model = Model::load(fixture(name)).unwrap();
        let vocab = model.config().vocab_size;
        let r = reference(name, vocab);
        let (shape, short) = npy::read_npy_f32(&fixture(name).join("short_logits.npy")).unwrap();
        assert_eq!(shape, [r.prompt.len(), vocab]);
        let run = |max_len: usize| {
            let mut cache = model.new_cache(&ctx, max_len).unwrap();
            let mut all = vec![0f32; r.prompt.len() * vocab];
            let mut last = vec![0f32; vocab];
            model
                .prefill(&ctx, &mut cache, &r.prompt, Some(&mut all), &mut last)
                .unwrap();
            all
        };
        let d = max_abs_diff(&run(16), &short);
        assert!(d <= TOL, "{name}: short-context logits differ by {d}");
        let d = max_abs_diff(&run(17), &r.logits);
        assert!(d <= TOL, "{name}: long-context logits differ by {d}");
        // The two differ: the factors matter on this prompt.
        assert!(max_abs_diff(&short, &r.logits) > 1e-2);
    }
}
