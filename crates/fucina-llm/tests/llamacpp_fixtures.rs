//! GGUF files written by llama.cpp itself (tests/fixtures/llamacpp/, made by
//! scripts/make_llamacpp_fixtures.py with `llama_model_quantize`, one per
//! preset) against what llama.cpp computed for them: every tensor's ggml type is
//! one fucina reads; every tensor, dequantized by fucina, has the fingerprint of
//! gguf-py's dequantization of the same bytes (its block layout read alike); the
//! logits of the prompt and of 31 decode steps (teacher-forced with llama.cpp's
//! greedy ids) agree with llama.cpp's within a tolerance per fixture; and
//! fucina's argmax agrees with llama.cpp's greedy id at least `top1_floor` times
//! of 32. A second test shows these checks fail on a misread block and on
//! another preset's logits.
//!
//! Why the quantized files cannot agree exactly: both runtimes read the same
//! weight bits, but each quantizes the activations before the integer dot
//! product, differently where the formats have blocks of 32: llama.cpp rounds
//! them to Q8_0 blocks of 32 with an f16 scale (Q8_1, the same values and a
//! block sum, for Q4_1 and Q5_1), fucina to int8 blocks of 32 with an f32
//! scale. The two roundings differ by up to half a step of int8 per element,
//! and a different float summation order comes on top. For the K formats and
//! IQ4_XS both round them to Q8_K blocks of 256 and take the same integer
//! sums, so those files agree to float summation order. The F32 file has no activation
//! rounding: there the two agree to float summation order.

mod gguf_support;
mod llamacpp_support;
#[path = "../examples/common/npy.rs"]
mod npy;

use std::path::{Path, PathBuf};

use fucina_llm::arch::gguf::load_gguf;
use fucina_llm::fucina::ExecContext;
use fucina_llm::fucina::exec::WeightFormat;
use fucina_llm::gguf::GgufFile;
use fucina_llm::{Model, Weight, WeightStore, open_model};
use gguf_support::llama_hf_name;
use llamacpp_support::{argmax, ids, teacher_forced_rows};
use serde_json::Value;

/// One fixture and what it must meet.
struct Case {
    /// The directory under tests/fixtures/llamacpp/.
    name: &'static str,
    /// The largest |fucina - llama.cpp| allowed on any logit of any row.
    tol: f32,
    /// The largest root mean square of fucina - llama.cpp over every row.
    rms_tol: f32,
    /// The fewest of llama.cpp's 32 greedy ids fucina's argmax must agree with.
    top1_floor: usize,
}

/// The fixtures and their tolerances: max |fucina - llama.cpp| over every row,
/// the root mean square of the difference, and the top-1 floor, each a little
/// above (below) what was measured, which the comment gives (max, rms, top-1;
/// 2 threads, AMD EPYC Zen 4, the same with `FUCINA_SIMD=portable` and `avx2`).
/// The reference logits' standard deviation is about 4.1, their range about 32:
/// the files with formats of blocks of 32 differ by 0.24-0.33 at most
/// (0.8-1.2 % of the range) and by 0.05-0.07 in root mean square. Nearly all
/// of it is the activation rounding: fucina with the same weights dequantized
/// to f32 (no rounding on its side) differs from llama.cpp almost as much (the
/// test prints both). The files whose matrices are all K formats or IQ4_XS
/// (`tiny_q2_k`, `tiny_q3_k_m`, `tiny_q4_k_m`, `tiny_q5_k_m`, `tiny_q6_k`,
/// `tiny_iq4_xs`) agree to float summation order (below 1e-5): for those
/// formats fucina rounds the activations as llama.cpp does (Q8_K, blocks of
/// 256) and takes the same integer sums. The
/// script's `--check` reproduces llama.cpp's logits to 5e-5 or better on the
/// Q8_0, Q4_0, Q3_K_M, Q5_K_M, IQ4_NL, IQ4_XS and small Q4_K_M files with a
/// numpy forward pass that rounds the activations as ggml's reference
/// quantizers do. The F32 file, with no rounding on either side, agrees to
/// float summation order. The top-1 floor of the others allows 3 flips in 32:
/// llama.cpp's greedy choices include near-ties (`min_greedy_gap` in
/// reference.json is as small as 0.001, against differences up to 0.33 on a
/// logit).
const CASES: [Case; 15] = [
    // measured 0.288, 0.0567, 31
    case("tiny_q4_0", 0.32, 0.07, 29),
    // measured 0.304, 0.0590, 31
    case("tiny_q4_1", 0.34, 0.07, 29),
    // measured 0.247, 0.0574, 31
    case("tiny_q5_0", 0.34, 0.07, 29),
    // measured 0.264, 0.0617, 30
    case("tiny_q5_1", 0.31, 0.073, 29),
    // measured 0.242, 0.0504, 32
    case("tiny_q8_0", 0.31, 0.063, 29),
    // measured 4.77e-06, 6.99e-07, 32
    case("tiny_q2_k", 1e-5, 2e-6, 32),
    // measured 4.77e-06, 6.52e-07, 32
    case("tiny_q3_k_m", 1e-5, 2e-6, 32),
    // measured 3.81e-06, 6.06e-07, 32
    case("tiny_q4_k_m", 1e-5, 2e-6, 32),
    // measured 4.77e-06, 7.00e-07, 32
    case("tiny_q5_k_m", 1e-5, 2e-6, 32),
    // measured 5.72e-06, 7.02e-07, 32
    case("tiny_q6_k", 1.5e-5, 2e-6, 32),
    // measured 0.253, 0.0568, 32
    case("tiny_iq4_nl", 0.32, 0.083, 29),
    // measured 4.77e-06, 6.92e-07, 32
    case("tiny_iq4_xs", 1e-5, 2e-6, 32),
    // measured 5.25e-06, 1.20e-06, 32
    case("small_f32", 1e-5, 3e-6, 32),
    // measured 0.330, 0.0574, 32
    case("small_q4_k_m", 0.43, 0.09, 29),
    // measured 0.290, 0.0671, 32
    case("small_q5_k_m", 0.38, 0.091, 29),
];

const fn case(name: &'static str, tol: f32, rms_tol: f32, top1_floor: usize) -> Case {
    Case {
        name,
        tol,
        rms_tol,
        top1_floor,
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llamacpp")
        .join(name)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() { f32::INFINITY } else { m.max(d) }
    })
}

/// The ggml types `path` holds, each checked to be one fucina reads.
fn tensor_types(path: &Path) -> Vec<(String, usize)> {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut types: Vec<(String, usize)> = Vec::new();
    for t in file.tensors() {
        assert!(
            t.ggml_type.format().is_some(),
            "{}: tensor {} has type {}, which fucina does not read",
            path.display(),
            t.name,
            t.ggml_type.name()
        );
        let name = t.ggml_type.name();
        match types.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => types.push((name, 1)),
        }
    }
    types.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    types
}

/// `[sum x, sum x², sum over rows of Σ_j j·x_j, max |x|]` of a `[rows, cols]`
/// tensor's values, in f64: the script's fingerprint of gguf-py's dequantized
/// values (independent of the order of the rows, which fucina's loader changes
/// for the q and k projections), and `sum |x|`.
fn fingerprint(v: &[f32], cols: usize) -> ([f64; 4], f64) {
    let mut f = [0f64; 4];
    let mut abs = 0f64;
    for (i, &x) in v.iter().enumerate() {
        let x = f64::from(x);
        f[0] += x;
        f[1] += x * x;
        f[2] += (i % cols) as f64 * x;
        f[3] = f[3].max(x.abs());
        abs += x.abs();
    }
    (f, abs)
}

/// Each tensor of the GGUF file `path`, dequantized by fucina, against the
/// fingerprint of gguf-py's dequantization of the same bytes
/// (`dequantized_fingerprints` of `r`; gguf-py's values equal ggml's own bit for
/// bit on these files, checked by the script's `--check`). Returns the
/// mismatches, each naming its tensor, and the store with every tensor widened
/// to f32.
fn dequantized(path: &Path, r: &Value) -> (Vec<String>, WeightStore) {
    let (_, store, _file) = load_gguf(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fps = r["dequantized_fingerprints"]
        .as_object()
        .expect("dequantized_fingerprints");
    assert_eq!(
        fps.len(),
        store.iter().count(),
        "{}: tensor count",
        path.display()
    );
    let mut bad = Vec::new();
    let mut dense = std::collections::HashMap::new();
    for (gguf, want) in fps {
        let w = store.get(&llama_hf_name(gguf)).expect("every tensor loads");
        let v = w.to_f32_vec();
        let cols = *w.shape().last().unwrap();
        let (got, abs) = fingerprint(&v, cols);
        // The same f32 values summed in another order, or values a last bit
        // apart where the two compute d·q - m in another order: each term off by
        // at most ~1e-7 of |x|; a misread block moves a term by |x| or more.
        let tol = [abs, 2.0 * abs * got[3], abs * cols as f64, got[3]].map(|t| 1e-6 * t);
        for k in 0..4 {
            let e = want[k].as_f64().expect("a number");
            if (got[k] - e).abs() > tol[k] {
                bad.push(format!(
                    "{gguf} ({}): fingerprint {k} is {}, gguf-py's {e}",
                    w.quant_format().map_or(w.format().name(), |q| q.name()),
                    got[k]
                ));
            }
        }
        dense.insert(
            llama_hf_name(gguf),
            Weight::from_f32(WeightFormat::F32, w.shape(), &v).unwrap(),
        );
    }
    (bad, WeightStore::from_tensors(dense))
}

/// What one model measured against llama.cpp's logits.
struct Agreement {
    /// max |fucina - llama.cpp| over the prompt's rows.
    prefill: f32,
    /// max |fucina - llama.cpp| over the 31 decode steps' rows.
    decode: f32,
    /// The root mean square of fucina - llama.cpp over every row.
    rms: f32,
    /// How many of llama.cpp's 32 greedy ids fucina's argmax agrees with.
    top1: usize,
}

impl Agreement {
    fn max(&self) -> f32 {
        self.prefill.max(self.decode)
    }
}

/// Prefill `prompt` (every row's logits), then the 31 decode steps of
/// llama.cpp's greedy ids (teacher-forced: its id, whatever `model` chose),
/// against llama.cpp's rows `reference` ([prompt + 31, vocab]).
fn agreement(
    model: &Model,
    ctx: &ExecContext,
    prompt: &[u32],
    greedy: &[u32],
    reference: &[f32],
) -> Agreement {
    let t = prompt.len();
    let vocab = model.config().vocab_size;
    let (rows, top1) = teacher_forced_rows(model, ctx, prompt, greedy);
    let sq: f64 = rows
        .iter()
        .zip(reference)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    Agreement {
        prefill: max_abs_diff(&rows[..t * vocab], &reference[..t * vocab]),
        decode: max_abs_diff(&rows[t * vocab..], &reference[t * vocab..]),
        rms: (sq / rows.len() as f64).sqrt() as f32,
        top1,
    }
}

/// How many of `model`'s own greedy ids (free-running from `prompt`) equal
/// llama.cpp's `greedy` before the first that differs.
fn same_continuation(model: &Model, ctx: &ExecContext, prompt: &[u32], greedy: &[u32]) -> usize {
    let mut cache = model
        .new_cache(ctx, prompt.len() + greedy.len())
        .expect("a cache");
    let mut logits = vec![0f32; model.config().vocab_size];
    model
        .prefill(ctx, &mut cache, prompt, None, &mut logits)
        .expect("prefill");
    for (step, &tok) in greedy.iter().enumerate() {
        let own = argmax(&logits);
        if own != tok {
            return step;
        }
        if step + 1 < greedy.len() {
            model
                .decode(ctx, &mut [&mut cache], &[own], &mut logits)
                .expect("decode");
        }
    }
    greedy.len()
}

/// A fixture's prompt, llama.cpp's greedy ids and logits rows, and reference.json.
struct Reference {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    logits: Vec<f32>,
    json: Value,
}

fn reference(name: &str, vocab: usize) -> Reference {
    let dir = fixture(name);
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("reference.json")).expect("reference.json"),
    )
    .expect("reference.json parses");
    let prompt = ids(&json["prompt_ids"]);
    let greedy = ids(&json["greedy_ids"]);
    assert_eq!(greedy.len(), 32, "{name}: 32 greedy ids");
    let (shape, logits) = npy::read_npy_f32(&dir.join("logits.npy")).expect("logits.npy");
    assert_eq!(
        shape,
        [prompt.len() + greedy.len() - 1, vocab],
        "{name}: logits.npy shape"
    );
    Reference {
        prompt,
        greedy,
        logits,
        json,
    }
}

/// The fixture `name` as `generate --model` opens it.
fn open(name: &str, ctx: &ExecContext) -> Model {
    open_model(fixture(name).join("model.gguf"), ctx, None)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .model
}

/// What one fixture measured.
struct Measured {
    /// The file as `generate --model` runs it.
    quant: Agreement,
    /// The file with every weight dequantized to f32 by fucina (no activation
    /// rounding on fucina's side): how much of the difference is llama.cpp's.
    dense: Agreement,
    /// How many of fucina's own greedy ids equal llama.cpp's before the first
    /// that differs (a near-tie decided the other way ends it).
    same: usize,
    /// The reference logits' standard deviation and range (max - min).
    std: f32,
    range: f32,
    /// The ggml types of the file's tensors, with their counts.
    types: Vec<(String, usize)>,
    /// Tensors whose dequantized values are not gguf-py's.
    misread: Vec<String>,
}

/// Runs llama.cpp's prompt and greedy ids through the fixture `name` and through
/// its weights dequantized to f32.
fn measure(name: &str, ctx: &ExecContext) -> Measured {
    let path = fixture(name).join("model.gguf");
    let types = tensor_types(&path);
    let model = open(name, ctx);
    let r = reference(name, model.config().vocab_size);
    let (misread, dense_store) = dequantized(&path, &r.json);
    let n = r.logits.len() as f32;
    let mean = r.logits.iter().sum::<f32>() / n;
    let var = r
        .logits
        .iter()
        .map(|x| (x - mean) * (x - mean))
        .sum::<f32>()
        / n;
    let (lo, hi) = r
        .logits
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let dense = Model::from_parts(model.config().clone(), dense_store).expect("dense model");
    Measured {
        quant: agreement(&model, ctx, &r.prompt, &r.greedy, &r.logits),
        dense: agreement(&dense, ctx, &r.prompt, &r.greedy, &r.logits),
        same: same_continuation(&model, ctx, &r.prompt, &r.greedy),
        std: var.sqrt(),
        range: hi - lo,
        types,
        misread,
    }
}

#[test]
fn llamacpp_files_match_llamacpp_logits() {
    let ctx = ExecContext::with_threads(2);
    let mut failures = Vec::new();
    for case in &CASES {
        let m = measure(case.name, &ctx);
        let (q, d) = (&m.quant, &m.dense);
        let types: Vec<String> = m.types.iter().map(|(n, c)| format!("{c} {n}")).collect();
        eprintln!(
            "{:13} max |fucina - llama.cpp| prefill {:.2e}, decode {:.2e} ({:.2} % of the std {:.2}, {:.2} % of the range {:.1}), rms {:.2e}; top-1 {}/32, free-running the same {} ids; \
             weights dequantized to f32: max {:.2e}, rms {:.2e}, top-1 {}/32; {}",
            case.name,
            q.prefill,
            q.decode,
            100.0 * q.max() / m.std,
            m.std,
            100.0 * q.max() / m.range,
            m.range,
            q.rms,
            q.top1,
            m.same,
            d.max(),
            d.rms,
            d.top1,
            types.join(", ")
        );
        for e in &m.misread {
            failures.push(format!("{}: {e}", case.name));
        }
        if q.max() > case.tol || q.rms > case.rms_tol {
            failures.push(format!(
                "{}: logits differ from llama.cpp's by {} (rms {}; tolerances {}, rms {})",
                case.name,
                q.max(),
                q.rms,
                case.tol,
                case.rms_tol
            ));
        }
        if q.top1 < case.top1_floor {
            failures.push(format!(
                "{}: top-1 agreement {}/32 (floor {})",
                case.name, q.top1, case.top1_floor
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The checks can fail: a block scale changed in a copy of a llama.cpp file is
/// a fingerprint mismatch naming the tensor, and the logits of the same model
/// quantized by another preset (Q8_0 against Q4_0's reference) are outside
/// Q4_0's tolerance.
#[test]
fn a_misread_block_or_another_file_is_caught() {
    let name = "tiny_q4_k_m";
    let path = fixture(name).join("model.gguf");
    let r = reference(name, 260);
    let mut bytes = std::fs::read(&path).expect("the fixture");
    let file = GgufFile::open(&path).expect("the fixture parses");
    let (info, data) = file.tensor("blk.0.ffn_up.weight").expect("ffn_up");
    assert_eq!(info.ggml_type.name(), "q4_k");
    // The tensor's offset in the file: where its first 144-byte block occurs.
    let at = bytes
        .windows(144)
        .position(|w| w == &data[..144])
        .expect("the tensor's bytes");
    // The f16 super-block scale d of block 0: its high byte's low bit flips.
    bytes[at + 1] ^= 0x01;
    let dir = std::env::temp_dir().join(format!("fucina-llamacpp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("model.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let (misread, _) = dequantized(&bad, &r.json);
    std::fs::remove_dir_all(&dir).unwrap();
    eprintln!("changed block scale: {misread:?}");
    assert!(
        !misread.is_empty()
            && misread
                .iter()
                .all(|e| e.starts_with("blk.0.ffn_up.weight (q4_k)")),
        "{misread:?}"
    );

    let ctx = ExecContext::with_threads(2);
    let q8 = open("tiny_q8_0", &ctx);
    let q4 = reference("tiny_q4_0", 260);
    let a = agreement(&q8, &ctx, &q4.prompt, &q4.greedy, &q4.logits);
    let case = CASES.iter().find(|c| c.name == "tiny_q4_0").unwrap();
    eprintln!(
        "tiny_q8_0 against tiny_q4_0's reference: max {:.2e}, rms {:.2e}, top-1 {}/32",
        a.max(),
        a.rms,
        a.top1
    );
    assert!(
        a.max() > case.tol && a.rms > case.rms_tol,
        "Q8_0's logits pass for Q4_0's: max {}, rms {}",
        a.max(),
        a.rms
    );
}
