//! The decoder against an independent float64 reference forward written here
//! (naive loops over the Hugging Face definitions), on tiny random models of
//! each architecture, RoPE scaling, weight format and tying; prefill/decode
//! consistency; and the errors of bad weights and bad requests.

mod model_support;

use std::collections::HashMap;

use fucina::ExecContext;
use fucina::exec::WeightFormat;
use fucina_llm::{
    Architecture, KV_BLOCK, KvCache, LlmError, Model, ModelConfig, PREFILL_CHUNK, RopeScaling,
    Weight, WeightStore,
};
use model_support::{llama, random_weights, tokens};

// ---------------------------------------------------------------------------
// The float64 reference.

struct Reference<'a> {
    c: &'a ModelConfig,
    w: HashMap<String, Vec<f64>>,
    /// Round every projection's input to bf16 (nearest-even, through f32)
    /// first: the model's bf16 products.
    bf16_inputs: bool,
}

/// `x` rounded to f32, then to bf16 (nearest-even), as f64.
fn to_bf16(x: f64) -> f64 {
    let b = (x as f32).to_bits();
    let r = (b + 0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(r) as f64
}

impl<'a> Reference<'a> {
    fn new(c: &'a ModelConfig, w: &HashMap<String, Weight>) -> Self {
        let w = w
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.to_f32_vec().iter().map(|&x| x as f64).collect(),
                )
            })
            .collect();
        Reference {
            c,
            w,
            bf16_inputs: false,
        }
    }

    fn t(&self, name: &str) -> &[f64] {
        &self.w[name]
    }

    /// `W x` for `W` of `[rows, x.len()]`.
    fn linear(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let w = self.t(name);
        let cols = x.len();
        let rounded: Vec<f64>;
        let x = match self.bf16_inputs {
            true => {
                rounded = x.iter().map(|&v| to_bf16(v)).collect();
                &rounded[..]
            }
            false => x,
        };
        (0..w.len() / cols)
            .map(|j| (0..cols).map(|k| w[j * cols + k] * x[k]).sum())
            .collect()
    }

    fn linear_bias(&self, name: &str, bias: Option<&str>, x: &[f64]) -> Vec<f64> {
        let mut y = self.linear(name, x);
        if let Some(b) = bias {
            for (yi, bi) in y.iter_mut().zip(self.t(b)) {
                *yi += bi;
            }
        }
        y
    }

    fn rms(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + self.c.rms_norm_eps as f64).sqrt();
        x.iter().zip(self.t(name)).map(|(v, w)| v * r * w).collect()
    }

    fn inv_freq(&self) -> Vec<f64> {
        let hd = self.c.head_dim;
        (0..hd / 2)
            .map(|i| {
                let f = (self.c.rope_theta as f64).powf(-((2 * i) as f64) / hd as f64);
                match self.c.rope_scaling {
                    RopeScaling::None => f,
                    RopeScaling::Linear { factor } => f / factor as f64,
                    RopeScaling::Llama3 {
                        factor,
                        low_freq_factor,
                        high_freq_factor,
                        original_max_position_embeddings,
                    } => {
                        let (factor, lo, hi) = (
                            factor as f64,
                            low_freq_factor as f64,
                            high_freq_factor as f64,
                        );
                        let old = original_max_position_embeddings as f64;
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < old / hi {
                            f
                        } else if wavelen > old / lo {
                            f / factor
                        } else {
                            let s = (old / wavelen - lo) / (hi - lo);
                            (1.0 - s) * f / factor + s * f
                        }
                    }
                }
            })
            .collect()
    }

    fn rope(&self, v: &mut [f64], pos: usize, inv: &[f64]) {
        let half = self.c.head_dim / 2;
        for head in v.chunks_mut(self.c.head_dim) {
            for i in 0..half {
                let th = pos as f64 * inv[i];
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * th.cos() - b * th.sin();
                head[i + half] = b * th.cos() + a * th.sin();
            }
        }
    }

    /// The logits of every position of `tokens` (from position 0).
    fn forward(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let c = self.c;
        let (hid, hd) = (c.hidden_size, c.head_dim);
        let (nh, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        let inv = self.inv_freq();
        let emb = self.t("model.embed_tokens.weight");
        let mut xs: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| emb[t as usize * hid..(t as usize + 1) * hid].to_vec())
            .collect();
        for l in 0..c.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let bias = |s: &str, on: bool| on.then(|| p(s));
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (t, x) in xs.iter().enumerate() {
                let xn = self.rms(&p("input_layernorm.weight"), x);
                let mut q = self.linear_bias(
                    &p("self_attn.q_proj.weight"),
                    bias("self_attn.q_proj.bias", c.qkv_bias).as_deref(),
                    &xn,
                );
                let mut k = self.linear_bias(
                    &p("self_attn.k_proj.weight"),
                    bias("self_attn.k_proj.bias", c.qkv_bias).as_deref(),
                    &xn,
                );
                let v = self.linear_bias(
                    &p("self_attn.v_proj.weight"),
                    bias("self_attn.v_proj.bias", c.qkv_bias).as_deref(),
                    &xn,
                );
                self.rope(&mut q, t, &inv);
                self.rope(&mut k, t, &inv);
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            for t in 0..xs.len() {
                let mut attn = vec![0.0f64; nh * hd];
                for h in 0..nh {
                    let g = h / (nh / nkv);
                    let q = &qs[t][h * hd..(h + 1) * hd];
                    let seen: Vec<usize> = (0..=t)
                        .filter(|&j| c.sliding_window.is_none_or(|w| t - j < w))
                        .collect();
                    let scores: Vec<f64> = seen
                        .iter()
                        .map(|&j| {
                            let k = &ks[j][g * hd..(g + 1) * hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (&j, ej) in seen.iter().zip(&e) {
                        for d in 0..hd {
                            attn[h * hd + d] += ej / z * vs[j][g * hd + d];
                        }
                    }
                }
                let o = self.linear_bias(
                    &p("self_attn.o_proj.weight"),
                    bias("self_attn.o_proj.bias", c.o_bias).as_deref(),
                    &attn,
                );
                for (x, o) in xs[t].iter_mut().zip(&o) {
                    *x += o;
                }
                let xn = self.rms(&p("post_attention_layernorm.weight"), &xs[t]);
                let gate = self.linear(&p("mlp.gate_proj.weight"), &xn);
                let up = self.linear(&p("mlp.up_proj.weight"), &xn);
                let act: Vec<f64> = gate
                    .iter()
                    .zip(&up)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let down = self.linear(&p("mlp.down_proj.weight"), &act);
                for (x, d) in xs[t].iter_mut().zip(&down) {
                    *x += d;
                }
            }
        }
        let head = match c.tie_word_embeddings {
            true => "model.embed_tokens.weight",
            false => "lm_head.weight",
        };
        xs.iter()
            .map(|x| self.linear(head, &self.rms("model.norm.weight", x)))
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Helpers.

/// Prefills `tokens` into a fresh cache; returns every position's logits.
fn prefill_all(model: &Model, ctx: &ExecContext, tokens: &[u32]) -> Vec<f32> {
    let vocab = model.config().vocab_size;
    let mut cache = model.new_cache(ctx, tokens.len() + 8).unwrap();
    let mut all = vec![0.0f32; tokens.len() * vocab];
    let mut last = vec![0.0f32; vocab];
    model
        .prefill(ctx, &mut cache, tokens, Some(&mut all), &mut last)
        .unwrap();
    assert_eq!(cache.len(), tokens.len());
    assert_eq!(bits(&last), bits(&all[(tokens.len() - 1) * vocab..]));
    all
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Checks the model's logits of every position of a random prompt of `n`
/// tokens against the float64 reference.
fn check_against_reference(c: &ModelConfig, format: WeightFormat, n: usize, seed: u64) {
    let w = random_weights(c, format, seed);
    let reference = Reference::new(c, &w);
    let model = Model::from_parts(c.clone(), WeightStore::from_tensors(w)).unwrap();
    let prompt = tokens(seed ^ 0xabc, n, c.vocab_size);
    let want = reference.forward(&prompt);
    let ctx = ExecContext::with_threads(2);
    let got = prefill_all(&model, &ctx, &prompt);
    let vocab = c.vocab_size;
    let (mut worst, mut scale) = (0.0f64, 0.0f64);
    for (t, row) in want.iter().enumerate() {
        for (j, &r) in row.iter().enumerate() {
            worst = worst.max((got[t * vocab + j] as f64 - r).abs());
            scale = scale.max(r.abs());
        }
    }
    eprintln!(
        "{:?} {format:?}: max |logit| {scale:.3}, max error {worst:.2e}",
        c.architecture
    );
    assert!(scale > 0.5, "the logits are not degenerate ({scale})");
    assert!(
        worst <= 1e-4,
        "max abs error {worst:e} against the f64 reference"
    );
}

// ---------------------------------------------------------------------------
// Against the reference.

#[test]
fn llama_f32_untied_matches_the_f64_reference() {
    check_against_reference(&llama(64), WeightFormat::F32, 20, 1);
}

#[test]
fn llama_bf16_tied_llama3_scaling_matches_the_f64_reference() {
    let mut c = llama(64);
    c.tie_word_embeddings = true;
    // Wavelengths of head_dim 16 at theta 10000 span 6.3 .. 20000: with an
    // original context of 32 (bands at 8 and 32) some frequencies are kept,
    // some divided, some interpolated.
    c.rope_scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 32,
    };
    check_against_reference(&c, WeightFormat::BF16, 20, 2);
}

#[test]
fn llama_f16_linear_scaling_matches_the_f64_reference() {
    let mut c = llama(64);
    c.rope_scaling = RopeScaling::Linear { factor: 2.5 };
    check_against_reference(&c, WeightFormat::F16, 20, 3);
}

#[test]
fn llama_attention_bias_matches_the_f64_reference() {
    let mut c = llama(64);
    c.qkv_bias = true;
    c.o_bias = true;
    check_against_reference(&c, WeightFormat::F32, 20, 4);
}

#[test]
fn qwen2_qkv_bias_matches_the_f64_reference() {
    let mut c = llama(64);
    c.architecture = Architecture::Qwen2;
    c.qkv_bias = true;
    c.rope_theta = 1_000_000.0;
    c.rms_norm_eps = 1e-6;
    c.tie_word_embeddings = true;
    check_against_reference(&c, WeightFormat::BF16, 20, 5);
}

#[test]
fn mistral_sliding_window_matches_the_f64_reference() {
    let mut c = llama(64);
    c.architecture = Architecture::Mistral;
    c.sliding_window = Some(5);
    check_against_reference(&c, WeightFormat::F32, 24, 6);
}

#[test]
fn a_prompt_of_several_chunks_matches_the_f64_reference() {
    let mut c = llama(32);
    c.num_hidden_layers = 1;
    c.max_position_embeddings = 4 * PREFILL_CHUNK;
    check_against_reference(&c, WeightFormat::F32, 2 * PREFILL_CHUNK + 11, 7);
}

#[test]
fn one_kv_head_and_eight_query_heads_match_the_f64_reference() {
    let mut c = llama(64);
    c.num_attention_heads = 8;
    c.num_key_value_heads = 1;
    c.head_dim = 8;
    check_against_reference(&c, WeightFormat::F32, 12, 8);
}

// ---------------------------------------------------------------------------
// Prefill, decode and chunking give the same bits.

fn prefill_then_decode_is_prefill_of_the_whole(c: &ModelConfig) {
    let model = model_support::model(c, WeightFormat::BF16, 11);
    prefill_then_decode_is_prefill_of_the_whole_for(&model, c);
}

fn prefill_then_decode_is_prefill_of_the_whole_for(model: &Model, c: &ModelConfig) {
    let vocab = c.vocab_size;
    let seq = tokens(99, PREFILL_CHUNK + 20, vocab);
    for threads in [1, 3] {
        let ctx = ExecContext::with_threads(threads);
        let whole = prefill_all(model, &ctx, &seq);
        // Prefill of a prefix (odd length, across no chunk boundary), another
        // prefill across the chunk boundary, then decode one token at a time.
        let mut cache = model.new_cache(&ctx, seq.len()).unwrap();
        let mut last = vec![0.0f32; vocab];
        model
            .prefill(&ctx, &mut cache, &seq[..7], None, &mut last)
            .unwrap();
        assert_eq!(bits(&last), bits(&whole[6 * vocab..7 * vocab]), "prefix");
        let mut part = vec![0.0f32; (PREFILL_CHUNK + 3 - 7) * vocab];
        model
            .prefill(
                &ctx,
                &mut cache,
                &seq[7..PREFILL_CHUNK + 3],
                Some(&mut part),
                &mut last,
            )
            .unwrap();
        assert_eq!(
            bits(&part),
            bits(&whole[7 * vocab..(PREFILL_CHUNK + 3) * vocab]),
            "second prefill"
        );
        for t in PREFILL_CHUNK + 3..seq.len() {
            let mut logits = vec![0.0f32; vocab];
            model
                .decode(&ctx, &mut [&mut cache], &seq[t..t + 1], &mut logits)
                .unwrap();
            assert_eq!(
                bits(&logits),
                bits(&whole[t * vocab..(t + 1) * vocab]),
                "decode of position {t} ({threads} threads)"
            );
        }
        assert_eq!(cache.len(), seq.len());
    }
}

#[test]
fn prefill_then_decode_gives_the_bits_of_one_prefill() {
    prefill_then_decode_is_prefill_of_the_whole(&llama(64));
}

#[test]
fn prefill_then_decode_gives_the_bits_of_one_prefill_with_a_window() {
    let mut c = llama(64);
    c.architecture = Architecture::Mistral;
    c.sliding_window = Some(9);
    c.qkv_bias = true;
    prefill_then_decode_is_prefill_of_the_whole(&c);
}

/// The keys and values of every whole block of `cache`, as bits.
fn kv_blocks(cache: &KvCache) -> Vec<Vec<u32>> {
    (0..cache.len() / KV_BLOCK)
        .map(|b| {
            let mut out = vec![0.0f32; cache.block_elems()];
            cache.export_block(b, &mut out).unwrap();
            bits(&out)
        })
        .collect()
}

#[test]
fn kv_blocks_do_not_depend_on_chunks_or_batch_and_import_gives_prefill_bits() {
    let mut c = llama(64);
    c.architecture = Architecture::Mistral;
    c.sliding_window = Some(21);
    c.qkv_bias = true;
    c.max_position_embeddings = 4 * PREFILL_CHUNK;
    let model = model_support::model(&c, WeightFormat::BF16, 13);
    let vocab = c.vocab_size;
    let n = PREFILL_CHUNK + 2 * KV_BLOCK + 5;
    let seq = tokens(77, n, vocab);
    let other = tokens(78, n, vocab);
    let mut last = vec![0.0f32; vocab];
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        // One prefill of the whole prompt.
        let mut whole = model.new_cache(&ctx, n + 8).unwrap();
        model
            .prefill(&ctx, &mut whole, &seq, None, &mut last)
            .unwrap();
        let want = kv_blocks(&whole);
        assert_eq!(want.len(), n / KV_BLOCK);
        // Prefill in pieces across block and chunk boundaries, into a cache
        // of another capacity.
        let mut pieces = model.new_cache(&ctx, 3 * n).unwrap();
        for piece in [&seq[..5], &seq[5..KV_BLOCK + 9], &seq[KV_BLOCK + 9..]] {
            model
                .prefill(&ctx, &mut pieces, piece, None, &mut last)
                .unwrap();
        }
        assert_eq!(kv_blocks(&pieces), want, "pieces, {threads} threads");
        // A prefix prefill, then decode one token at a time beside another
        // sequence.
        let mut dec = model.new_cache(&ctx, n).unwrap();
        let mut mate = model.new_cache(&ctx, 2 * n).unwrap();
        model
            .prefill(&ctx, &mut dec, &seq[..3], None, &mut last)
            .unwrap();
        model
            .prefill(&ctx, &mut mate, &other[..9], None, &mut last)
            .unwrap();
        let mut logits = vec![0.0f32; 2 * vocab];
        for t in 3..n {
            let toks = [seq[t], other[t]];
            model
                .decode(&ctx, &mut [&mut dec, &mut mate], &toks, &mut logits)
                .unwrap();
        }
        assert_eq!(kv_blocks(&dec), want, "decode, {threads} threads");
        // Import the first blocks, prefill the rest: the logits of one
        // prefill, and the same cache.
        let mut whole_logits = vec![0.0f32; vocab];
        let mut fresh = model.new_cache(&ctx, n + 8).unwrap();
        model
            .prefill(&ctx, &mut fresh, &seq, None, &mut whole_logits)
            .unwrap();
        for k in 1..=n / KV_BLOCK {
            let mut cache = model.new_cache(&ctx, n + 1).unwrap();
            let mut block = vec![0.0f32; cache.block_elems()];
            for b in 0..k {
                pieces.export_block(b, &mut block).unwrap();
                cache.import_block(&block).unwrap();
            }
            assert_eq!(cache.len(), k * KV_BLOCK);
            model
                .prefill(&ctx, &mut cache, &seq[k * KV_BLOCK..], None, &mut last)
                .unwrap();
            assert_eq!(bits(&last), bits(&whole_logits), "{k} blocks imported");
            assert_eq!(kv_blocks(&cache), want);
        }
    }
}

#[test]
fn kv_block_export_and_import_refuse_bad_requests() {
    let c = llama(64);
    let model = model_support::model(&c, WeightFormat::F32, 5);
    let ctx = ExecContext::with_threads(1);
    let vocab = c.vocab_size;
    let mut last = vec![0.0f32; vocab];
    let mut cache = model.new_cache(&ctx, 2 * KV_BLOCK).unwrap();
    model
        .prefill(
            &ctx,
            &mut cache,
            &tokens(1, KV_BLOCK + 3, vocab),
            None,
            &mut last,
        )
        .unwrap();
    let mut block = vec![0.0f32; cache.block_elems()];
    let err = |r: Result<(), LlmError>| r.unwrap_err().to_string();
    assert!(err(cache.export_block(1, &mut block)).contains("not stored"));
    assert!(err(cache.export_block(usize::MAX, &mut block)).contains("not stored"));
    assert!(err(cache.export_block(0, &mut block[1..])).contains("elements"));
    cache.export_block(0, &mut block).unwrap();
    // Not at a block boundary.
    assert!(err(cache.import_block(&block)).contains("whole number"));
    cache.truncate(KV_BLOCK);
    assert!(err(cache.import_block(&block[1..])).contains("elements"));
    assert_eq!(cache.len(), KV_BLOCK);
    cache.import_block(&block).unwrap();
    // Full.
    assert!(err(cache.import_block(&block)).contains("no room"));
    assert_eq!(cache.len(), 2 * KV_BLOCK);
    // A shared clone is copied before the import writes.
    let mut a = model.new_cache(&ctx, 2 * KV_BLOCK).unwrap();
    a.import_block(&block).unwrap();
    let b = a.clone();
    a.truncate(0);
    let mut zeros = block.clone();
    zeros.fill(0.0);
    a.import_block(&zeros).unwrap();
    let mut got = vec![0.0f32; block.len()];
    b.export_block(0, &mut got).unwrap();
    assert_eq!(bits(&got), bits(&block));
    assert_eq!(model.kv_variant(4096), 0);
}

// ---------------------------------------------------------------------------
// bf16 products.

/// The absolute differences between the logits `got` (`[n, vocab]`) and
/// `want`, sorted, and the largest `|want|`.
fn sorted_errors(got: &[f32], want: &[Vec<f64>]) -> (Vec<f64>, f64) {
    let vocab = want[0].len();
    let mut errors = Vec::new();
    let mut scale = 0.0f64;
    for (t, row) in want.iter().enumerate() {
        for (j, &r) in row.iter().enumerate() {
            errors.push((got[t * vocab + j] as f64 - r).abs());
            scale = scale.max(r.abs());
        }
    }
    errors.sort_by(f64::total_cmp);
    (errors, scale)
}

/// The `q`-quantile of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q) as usize]
}

#[test]
fn bf16_products_match_the_reference_with_bf16_inputs() {
    // Qwen2 biases, tied embeddings (the embedding matrix is the output
    // projection) and a prompt across two chunks.
    let mut c = llama(64);
    c.architecture = Architecture::Qwen2;
    c.qkv_bias = true;
    c.tie_word_embeddings = true;
    c.num_hidden_layers = 1;
    c.max_position_embeddings = 4 * PREFILL_CHUNK;
    let w = random_weights(&c, WeightFormat::BF16, 21);
    let mut reference = Reference::new(&c, &w);
    let mut model = Model::from_parts(c.clone(), WeightStore::from_tensors(w)).unwrap();
    assert!(!model.uses_bf16_products());
    model.use_bf16_products().unwrap();
    assert!(model.uses_bf16_products());
    let prompt = tokens(5, PREFILL_CHUNK + 30, c.vocab_size);
    let got = prefill_all(&model, &ExecContext::with_threads(2), &prompt);
    let (exact, scale) = sorted_errors(&got, &reference.forward(&prompt));
    reference.bf16_inputs = true;
    let (rounded, _) = sorted_errors(&got, &reference.forward(&prompt));
    let (e90, r90) = (quantile(&exact, 0.9), quantile(&rounded, 0.9));
    let r_max = quantile(&rounded, 1.0);
    eprintln!(
        "bf16 products: max |logit| {scale:.3}; 90th percentile error {e90:.2e} against f64 \
         inputs, {r90:.2e} against bf16-rounded inputs (max {r_max:.2e})"
    );
    assert!(scale > 0.5, "the logits are not degenerate ({scale})");
    // Against the reference that rounds the projections' inputs as the model
    // does, only the f32 sums differ, except where an input lies within an
    // f32 rounding of a bf16 rounding boundary and the two round it to
    // neighbouring bf16 values (one bf16 step of one input: rare, bounded).
    assert!(
        r90 <= 1e-4,
        "90th percentile error {r90:e} against bf16-rounded inputs"
    );
    assert!(
        r_max <= 1e-3 * scale,
        "max error {r_max:e} against bf16-rounded inputs"
    );
    // Against f64 inputs the rounding shows everywhere.
    assert!(
        e90 > 30.0 * r90,
        "the inputs are not rounded ({e90:e} vs {r90:e})"
    );
}

#[test]
fn bf16_products_prefill_then_decode_gives_the_bits_of_one_prefill() {
    let mut c = llama(64);
    c.max_position_embeddings = 4 * PREFILL_CHUNK;
    let mut model = model_support::model(&c, WeightFormat::BF16, 11);
    model.use_bf16_products().unwrap();
    prefill_then_decode_is_prefill_of_the_whole_for(&model, &c);
}

#[test]
fn packed_rows_are_the_file_rows() {
    // Rows read back after packing (an embedding table that is also the
    // output projection): the tiles when they hold the file's values, the
    // file's bytes when a subnormal was flushed in the tiles.
    let values: Vec<f32> = (0..40 * 70)
        .map(|i| ((i * 7919 % 613) as f32 - 306.0) / 97.0)
        .collect();
    let mut with_subnormal = values.clone();
    with_subnormal[3 * 70 + 5] = f32::from_bits(0x0001_0000); // a bf16 subnormal
    for v in [values, with_subnormal] {
        let w = Weight::from_f32(WeightFormat::BF16, &[40, 70], &v).unwrap();
        let mut packed = w.clone();
        assert!(packed.pack_bf16_products().unwrap());
        assert!(!packed.pack_bf16_products().unwrap(), "packed once");
        let (mut a, mut b) = (vec![0.0f32; 70], vec![0.0f32; 70]);
        for r in 0..40 {
            w.row_to_f32(r, &mut a).unwrap();
            packed.row_to_f32(r, &mut b).unwrap();
            assert_eq!(bits(&a), bits(&b), "row {r}");
        }
        assert!(packed.row_to_f32(40, &mut b).is_err());
        assert!(packed.row_to_f32(0, &mut b[..69]).is_err());
    }
}

#[test]
fn bf16_products_need_bf16_matrices() {
    // bf16 everywhere but the last layer's down projection: the matrices
    // before it are packed, then the model is left as it was.
    let c = llama(32);
    let mut w = random_weights(&c, WeightFormat::BF16, 3);
    let name = "model.layers.1.mlp.down_proj.weight";
    let down = &w[name];
    let f16 = Weight::from_f32(WeightFormat::F16, down.shape(), &down.to_f32_vec()).unwrap();
    w.insert(name.to_string(), f16);
    let mut model = Model::from_parts(c.clone(), WeightStore::from_tensors(w)).unwrap();
    let ctx = ExecContext::with_threads(1);
    let prompt = tokens(8, 9, c.vocab_size);
    let before = prefill_all(&model, &ctx, &prompt);
    match model.use_bf16_products() {
        Err(LlmError::InvalidRequest { op, reason }) => {
            assert_eq!(op, "Weight::pack_bf16_products");
            assert!(reason.contains(name) && reason.contains("f16"), "{reason}");
        }
        other => panic!("expected an invalid request, got {other:?}"),
    }
    assert!(!model.uses_bf16_products());
    assert_eq!(bits(&prefill_all(&model, &ctx, &prompt)), bits(&before));
}

#[test]
fn a_cleared_cache_starts_a_new_sequence() {
    let c = llama(32);
    let model = model_support::model(&c, WeightFormat::F32, 12);
    let ctx = ExecContext::with_threads(1);
    let (a, b) = (tokens(1, 9, c.vocab_size), tokens(2, 5, c.vocab_size));
    let want = prefill_all(&model, &ctx, &b);
    let mut cache = model.new_cache(&ctx, 20).unwrap();
    let mut last = vec![0.0f32; c.vocab_size];
    model
        .prefill(&ctx, &mut cache, &a, None, &mut last)
        .unwrap();
    cache.clear();
    assert!(cache.is_empty());
    model
        .prefill(&ctx, &mut cache, &b, None, &mut last)
        .unwrap();
    assert_eq!(bits(&last), bits(&want[4 * c.vocab_size..]));
}

// ---------------------------------------------------------------------------
// Bad weights.

fn from_parts_err(c: &ModelConfig, w: HashMap<String, Weight>) -> String {
    match Model::from_parts(c.clone(), WeightStore::from_tensors(w)) {
        Ok(_) => panic!("from_parts accepted bad weights"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_tensor_is_named() {
    let c = llama(32);
    for name in [
        "model.layers.1.mlp.up_proj.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.0.post_attention_layernorm.weight",
    ] {
        let mut w = random_weights(&c, WeightFormat::F32, 1);
        w.remove(name);
        let e = from_parts_err(&c, w);
        assert!(e.contains(name), "{e}");
    }
    // A tied model needs no lm_head; a biased one needs its biases.
    let mut tied = c.clone();
    tied.tie_word_embeddings = true;
    let mut w = random_weights(&c, WeightFormat::F32, 1);
    w.remove("lm_head.weight");
    assert!(Model::from_parts(tied, WeightStore::from_tensors(w)).is_ok());
    let mut biased = c.clone();
    biased.qkv_bias = true;
    let e = from_parts_err(&biased, random_weights(&c, WeightFormat::F32, 1));
    assert!(e.contains("model.layers.0.self_attn.q_proj.bias"), "{e}");
}

#[test]
fn a_wrong_shape_is_named_with_both_shapes() {
    let c = llama(32);
    let mut w = random_weights(&c, WeightFormat::BF16, 1);
    let name = "model.layers.1.self_attn.k_proj.weight";
    w.insert(
        name.to_string(),
        Weight::from_f32(WeightFormat::BF16, &[8, 32], &[0.0; 256]).unwrap(),
    );
    let e = from_parts_err(&c, w);
    assert!(
        e.contains(name) && e.contains("[8, 32]") && e.contains("[16, 32]"),
        "{e}"
    );
    let mut w = random_weights(&c, WeightFormat::F32, 1);
    w.insert(
        "model.norm.weight".to_string(),
        Weight::from_f32(WeightFormat::F32, &[2, 16], &[1.0; 32]).unwrap(),
    );
    let e = from_parts_err(&c, w);
    assert!(
        e.contains("model.norm.weight") && e.contains("[2, 16]"),
        "{e}"
    );
}

#[test]
fn an_inconsistent_config_is_an_error() {
    let mut c = llama(32);
    c.num_key_value_heads = 3;
    let e = from_parts_err(&c, random_weights(&llama(32), WeightFormat::F32, 1));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let mut c = llama(32);
    c.head_dim = 7;
    let e = from_parts_err(&c, random_weights(&llama(32), WeightFormat::F32, 1));
    assert!(e.contains("head_dim"), "{e}");
}

#[test]
fn load_reports_a_missing_directory() {
    assert!(Model::load("/nonexistent/fucina-llm-model").is_err());
}

// ---------------------------------------------------------------------------
// Bad requests: an error, and nothing changed.

fn invalid(r: Result<(), LlmError>, words: &str) {
    match r {
        Err(LlmError::InvalidRequest { reason, .. }) => {
            assert!(
                reason.contains(words),
                "`{reason}` should mention `{words}`"
            )
        }
        other => panic!("expected InvalidRequest ({words}), got {other:?}"),
    }
}

#[test]
fn bad_requests_are_errors_that_change_nothing() {
    let c = llama(32);
    let model = model_support::model(&c, WeightFormat::F32, 3);
    let ctx = ExecContext::with_threads(1);
    let vocab = c.vocab_size;
    let mut last = vec![0.0f32; vocab];
    assert!(model.new_cache(&ctx, 0).is_err());
    assert!(
        model
            .new_cache(&ctx, c.max_position_embeddings + 1)
            .is_err()
    );
    let mut cache = model.new_cache(&ctx, 6).unwrap();
    assert_eq!(cache.capacity(), 6);
    invalid(
        model.prefill(&ctx, &mut cache, &[], None, &mut last),
        "empty",
    );
    invalid(
        model.prefill(&ctx, &mut cache, &[3, 97], None, &mut last),
        "97",
    );
    invalid(
        model.prefill(&ctx, &mut cache, &[1; 7], None, &mut last),
        "max_len",
    );
    invalid(
        model.prefill(&ctx, &mut cache, &[1, 2], None, &mut last[..5]),
        "last_logits",
    );
    invalid(
        model.prefill(&ctx, &mut cache, &[1, 2], Some(&mut [0.0; 3]), &mut last),
        "all_logits",
    );
    assert_eq!(cache.len(), 0);
    model
        .prefill(&ctx, &mut cache, &[1, 2, 3, 4, 5], None, &mut last)
        .unwrap();
    let mut logits = vec![0.0f32; 2 * vocab];
    let mut other = model.new_cache(&ctx, 6).unwrap();
    invalid(
        model.decode(&ctx, &mut [&mut cache], &[1, 2], &mut logits[..vocab]),
        "2 tokens for 1 caches",
    );
    invalid(model.decode(&ctx, &mut [], &[], &mut []), "no sequences");
    invalid(
        model.decode(&ctx, &mut [&mut cache, &mut other], &[1, 200], &mut logits),
        "200",
    );
    invalid(
        model.decode(
            &ctx,
            &mut [&mut cache, &mut other],
            &[1, 2],
            &mut logits[1..],
        ),
        "logits",
    );
    assert_eq!((cache.len(), other.len()), (5, 0));
    // Position 5 is the last one; then the cache is full.
    model
        .decode(&ctx, &mut [&mut cache, &mut other], &[1, 2], &mut logits)
        .unwrap();
    invalid(
        model.decode(&ctx, &mut [&mut other, &mut cache], &[1, 2], &mut logits),
        "full",
    );
    assert_eq!((cache.len(), other.len()), (6, 1));
    // A cache of another model shape.
    let mut c2 = c.clone();
    c2.num_hidden_layers = 3;
    let model2 = model_support::model(&c2, WeightFormat::F32, 3);
    let mut foreign: KvCache = model2.new_cache(&ctx, 6).unwrap();
    invalid(
        model.prefill(&ctx, &mut foreign, &[1], None, &mut last),
        "cache was made for",
    );
    assert!(foreign.is_empty());
}

#[test]
fn the_model_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Model>();
    check::<KvCache>();
}

#[test]
fn the_cache_comes_from_the_contexts_pool_and_returns_to_it() {
    let c = llama(32);
    let model = model_support::model(&c, WeightFormat::F32, 3);
    let ctx = ExecContext::with_threads(1);
    let pool = ctx.pool();
    let outstanding = pool.outstanding_buffers();
    let cache = model.new_cache(&ctx, 40).unwrap();
    // Keys and values: two pooled buffers of 2 layers x 2 heads x 8 x 48 slots.
    assert_eq!(pool.outstanding_buffers(), outstanding + 2);
    assert_eq!(cache.bytes(), 2 * 4 * (2 * 2 * 8 * 48));
    drop(cache);
    assert_eq!(pool.outstanding_buffers(), outstanding);
    // The next cache of the same size reuses the memory: hits, no miss.
    let before = pool.stats();
    let mut cache = model.new_cache(&ctx, 40).unwrap();
    let after = pool.stats();
    assert_eq!(after.misses, before.misses, "no new allocation");
    assert_eq!(after.hits, before.hits + 2);
    // Recycled memory holds the previous user's values: the results do not
    // depend on it.
    let prompt = model_support::tokens(4, 21, c.vocab_size);
    let mut last = vec![0.0f32; c.vocab_size];
    model
        .prefill(&ctx, &mut cache, &prompt, None, &mut last)
        .unwrap();
    drop(cache);
    let fresh_ctx = ExecContext::with_threads(1);
    let mut fresh = model.new_cache(&fresh_ctx, 40).unwrap();
    let mut want = vec![0.0f32; c.vocab_size];
    model
        .prefill(&ctx, &mut fresh, &prompt[..17], None, &mut want)
        .unwrap();
    let mut recycled = model.new_cache(&ctx, 40).unwrap();
    model
        .prefill(&ctx, &mut recycled, &prompt[..17], None, &mut last)
        .unwrap();
    assert_eq!(bits(&last), bits(&want));
}

#[test]
fn a_cloned_cache_is_copied_on_its_first_write() {
    let c = llama(32);
    let model = model_support::model(&c, WeightFormat::F32, 3);
    let ctx = ExecContext::with_threads(2);
    let vocab = c.vocab_size;
    let prompt = model_support::tokens(5, 9, vocab);
    let mut last = vec![0.0f32; vocab];
    let mut a = model.new_cache(&ctx, 16).unwrap();
    model
        .prefill(&ctx, &mut a, &prompt, None, &mut last)
        .unwrap();
    let outstanding = ctx.pool().outstanding_buffers();
    let mut b = a.clone();
    assert_eq!(ctx.pool().outstanding_buffers(), outstanding, "shared");
    // Both continue the same prefix with different tokens, in one batch.
    let mut logits = vec![0.0f32; 2 * vocab];
    model
        .decode(&ctx, &mut [&mut a, &mut b], &[7, 8], &mut logits)
        .unwrap();
    assert_eq!(ctx.pool().outstanding_buffers(), outstanding + 2, "copied");
    for (i, t) in [7u32, 8].into_iter().enumerate() {
        let mut seq = prompt.clone();
        seq.push(t);
        let mut alone = model.new_cache(&ctx, 16).unwrap();
        model
            .prefill(&ctx, &mut alone, &seq, None, &mut last)
            .unwrap();
        assert_eq!(
            bits(&logits[i * vocab..(i + 1) * vocab]),
            bits(&last),
            "sequence {i}"
        );
    }
    assert_eq!((a.len(), b.len()), (10, 10));
}

#[test]
fn a_cache_the_pool_cannot_provide_is_an_error() {
    // 2^60 f32 per buffer (2^62 bytes): within the address-space check, but
    // no system allocator provides it.
    let mut c = llama(8);
    (
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
    ) = (1, 1, 1);
    c.head_dim = 2;
    c.max_position_embeddings = 1 << 59;
    let model = model_support::model(&c, WeightFormat::F32, 3);
    let ctx = ExecContext::with_threads(1);
    match model.new_cache(&ctx, 1 << 59) {
        Err(LlmError::InvalidRequest { op, reason }) => {
            assert_eq!(op, "Model::new_cache");
            assert!(reason.contains("pool cannot provide"), "{reason}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(ctx.pool().outstanding_buffers(), 0);
    // A cache that fits still works.
    assert!(model.new_cache(&ctx, 64).is_ok());
}
