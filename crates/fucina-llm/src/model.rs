//! The decoder: Llama-family models computed as transformers computes them,
//! with f32 activations and weights read in their file format by
//! [`ExecContext::weight_matmul`]. What an architecture changes (q/k norms,
//! Gemma's `1 + w` and sandwich norms, GeGLU, embedding scale, soft-capping,
//! per-layer windows and RoPE bases, fused projections, LongRoPE, a mixture
//! of experts in `moe`) comes from its [`ArchSpec`]
//! and the config's [`ArchParams`](crate::arch::ArchParams); the pass below is
//! the Llama one.
//!
//! # The forward pass
//!
//! A token's row is the embedding row of its id, widened to f32. Each layer
//! applies RMSNorm (`weight · (x / sqrt(mean(x²) + eps))`, in f32), the q, k, v
//! projections (with their bias for Qwen2 or `attention_bias`), RoPE on q and k
//! (rotate-half convention, inverse frequencies computed in f32 from
//! `rope_theta` and the `linear` or `llama3` scaling as transformers computes
//! them), stores k and v in the sequence's [`KvCache`], attends (grouped-query:
//! query head `h` reads key/value head `h / (heads / kv_heads)`; scores scaled by
//! `1/sqrt(head_dim)`; softmax in f32; causal, and limited to the last
//! `sliding_window` positions, the token's own included, when the config sets a
//! window), projects back through `o_proj` (and its bias), adds the residual,
//! then RMSNorm, the SwiGLU MLP `down(silu(gate(x)) · up(x))` and the residual
//! again. The final RMSNorm and `lm_head` (or the embedding matrix when the
//! embeddings are tied) give the logits.
//!
//! # Batch, thread, chunk and vector-level invariance
//!
//! A sequence's logits are the same bits whatever the other sequences decoded in
//! the same call, the thread count of the context and the vector level:
//! - every projection is one [`ExecContext::weight_matmul`] call over the rows of
//!   all sequences, whose result for a row is fixed by that row alone;
//! - RMSNorm, RoPE, SwiGLU and the residual adds are per-row loops;
//! - attention runs one task per (sequence, head) (prefill: per head and block
//!   of rows of the chunk); a task computes each of its query rows alone, every sum in a
//!   fixed order set by the row's own position (each score over the head
//!   dimension in increasing order, the softmax's sum in eight lanes folded in
//!   halves, each output element's weighted sum of values in increasing
//!   position), so the parallel split decides who computes a row, never how;
//! - the code of this module is compiled once, for the baseline target, without
//!   fused multiply-adds (its vector registers only ever hold independent sums
//!   side by side); the exponential of the softmax and of SiLU is the runtime's
//!   own (`fucina::exec::math::exp`), made of IEEE operations only (no C library), and so
//!   are the RoPE sines, cosines and powers and the attention scale
//!   `head_dim^-0.5` (the crate's `fmath`: correctly rounded f32 from
//!   double-double arithmetic), so the tables are the same bits on every
//!   platform and C library.
//!
//! Prefill writes the keys and values of a chunk into the cache first, then
//! each query row attends to the cached positions up to its own. A row's result
//! therefore does not depend on the chunk boundaries either: the logits of
//! position `t` are the same bits whether `t` was prefilled in one call, in
//! several calls, or decoded one token at a time.
//!
//! # Scratch memory
//!
//! The activations of a call (sized for its rows: the batch of a decode, a chunk
//! of a prefill) live in a workspace inside the [`Model`], behind a mutex: calls
//! on one model from several threads run one at a time. The workspace grows when
//! a call needs more rows, or more attention scores (a cache of larger
//! capacity), than any call before; once it has seen the largest batch and
//! cache, decoding allocates nothing.

mod attention;
mod fmath;
mod kernels;
mod moe;
mod step;

pub use step::PromptChunk;

// The RoPE tables and the attention scale, for the trainable decoder of
// `crate::finetune` (the same values as this decoder's).
pub(crate) use fmath::pow_f32;
pub(crate) use kernels::{inv_freq, rope_angles};

use std::path::Path;
use std::sync::Mutex;

use fucina::exec::PARALLEL_THRESHOLD;
use fucina::{ExecContext, Team};

use crate::arch::{Activation, ArchSpec, NormStyle};
pub use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::error::LlmError;
use crate::format_report::FormatReport;
use crate::weights::{LoadDtype, Weight, WeightStore};

/// Tokens a prefill processes per step (its chunks): bounds the activation
/// memory of a long prompt. The logits do not depend on it.
pub const PREFILL_CHUNK: usize = 256;

/// The context's team when `work` (in additions' worth) is large enough to be
/// split: [`PARALLEL_THRESHOLD`] or more, on a context of several threads,
/// outside a parallel region. Below it the work runs on the calling thread;
/// the results are the same bits either way.
fn team_for(ctx: &ExecContext, work: usize) -> Option<&Team> {
    match ctx.threads() > 1 && work >= PARALLEL_THRESHOLD && !fucina::thread::in_parallel_region() {
        true => ctx.team(),
        false => None,
    }
}

/// The weights of one decoder layer (norm weights and biases widened to f32;
/// a `1 + w` norm's sum formed at load).
struct Layer {
    input_norm: Vec<f32>,
    /// The MLP's input norm (`post_attention_layernorm`, or Gemma's
    /// `pre_feedforward_layernorm`).
    post_norm: Vec<f32>,
    /// Gemma's norm of the attention output (`post_attention_layernorm`).
    attn_out_norm: Option<Vec<f32>>,
    /// Gemma's norm of the MLP output (`post_feedforward_layernorm`).
    mlp_out_norm: Option<Vec<f32>>,
    /// The RMSNorms over each q and k head (`[head_dim]`).
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// The layer's sliding window.
    window: Option<usize>,
    /// The layer rotates with the local RoPE table (Gemma 3's sliding layers).
    local_rope: bool,
    qkv: Qkv,
    o: Weight,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    o_bias: Option<Vec<f32>>,
    ffn: Ffn,
}

/// The q, k and v projections of a layer: three matrices, or one whose rows
/// are q's, then k's, then v's (Phi-3's `qkv_proj`).
enum Qkv {
    Split { q: Weight, k: Weight, v: Weight },
    Fused(Weight),
}

/// The gate and up projections of an MLP: two matrices, or one whose rows are
/// the gate's, then up's (Phi-3's `gate_up_proj`).
enum GateUp {
    Split { gate: Weight, up: Weight },
    Fused(Weight),
}

impl Qkv {
    /// The matrices with their Hugging Face names (without the layer prefix).
    fn named_mut(&mut self) -> Vec<(&'static str, &mut Weight)> {
        match self {
            Qkv::Split { q, k, v } => vec![
                ("self_attn.q_proj", q),
                ("self_attn.k_proj", k),
                ("self_attn.v_proj", v),
            ],
            Qkv::Fused(w) => vec![("self_attn.qkv_proj", w)],
        }
    }

    fn weights(&self) -> Vec<&Weight> {
        match self {
            Qkv::Split { q, k, v } => vec![q, k, v],
            Qkv::Fused(w) => vec![w],
        }
    }
}

impl GateUp {
    /// The matrices with their Hugging Face names (without the layer prefix).
    fn named_mut(&mut self) -> Vec<(&'static str, &mut Weight)> {
        match self {
            GateUp::Split { gate, up } => vec![("mlp.gate_proj", gate), ("mlp.up_proj", up)],
            GateUp::Fused(w) => vec![("mlp.gate_up_proj", w)],
        }
    }

    fn weights(&self) -> Vec<&Weight> {
        match self {
            GateUp::Split { gate, up } => vec![gate, up],
            GateUp::Fused(w) => vec![w],
        }
    }
}

/// A layer's MLP: dense, or a mixture of experts.
enum Ffn {
    Dense { gate_up: GateUp, down: Weight },
    Moe(moe::Moe),
}

/// A loaded decoder: its configuration, its weights (shared, in their file
/// format) and a reusable activation workspace. `Send + Sync`.
pub struct Model {
    config: ModelConfig,
    spec: &'static ArchSpec,
    /// Embedding rows are multiplied by it (Gemma's `sqrt(hidden)`).
    embed_scale: Option<f32>,
    embed: Weight,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    /// `None` when the embeddings are tied.
    lm_head: Option<Weight>,
    inv_freq: Vec<f32>,
    /// The local layers' inverse frequencies, when they have their own base.
    local_inv_freq: Option<Vec<f32>>,
    /// LongRoPE: the original context (a cache of more positions rotates with
    /// the long frequencies), those frequencies, and the factor on the
    /// cosines and sines (`inv_freq` holds the short ones).
    long_rope: Option<(usize, Vec<f32>, f32)>,
    scale: f32,
    scratch: Mutex<Scratch>,
    /// What each tensor of the weights was stored as, and why.
    formats: FormatReport,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Attention work of one head over some query rows: the task a participant of
/// the team runs. Owns its output rows and its score scratch, so that tasks
/// share nothing mutable.
#[derive(Default)]
struct HeadTask {
    /// Index of the sequence in the call's caches (a decode row's; a step's
    /// prompt chunk reads the one past the decoding sequences; 0 in prefill).
    seq: usize,
    /// Query head.
    head: usize,
    /// Rows of the call's activations this task attends for.
    rows: std::ops::Range<usize>,
    /// `rows.len() * head_dim` outputs.
    out: Vec<f32>,
    /// At least four times the longest attention span of the call (four rows
    /// at a time).
    scores: Vec<f32>,
}

/// The activations of one call, reused across calls.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// The output of a fused projection (`qkv_proj`, `gate_up_proj`).
    fused: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The local layers' angles (when they have their own RoPE base).
    cos_local: Vec<f32>,
    sin_local: Vec<f32>,
    positions: Vec<usize>,
    /// Per row: its cache holds more positions than LongRoPE's original
    /// context (the long factors apply).
    long_context: Vec<bool>,
    tasks: Vec<HeadTask>,
    moe: moe::MoeScratch,
    /// A step's logits when the prompt chunk's last row goes through
    /// `lm_head` with the decode rows.
    logits: Vec<f32>,
}

/// Grows `v` to at least `n` elements (never shrinks).
fn grow<T: Clone + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

impl Scratch {
    /// Makes room for `rows` activation rows and `tasks` attention tasks of
    /// `task_rows` rows attending over at most `span` positions.
    fn ensure(
        &mut self,
        c: &ModelConfig,
        rows: usize,
        tasks: usize,
        task_rows: usize,
        span: usize,
    ) {
        let (h, hd) = (c.num_attention_heads, c.head_dim);
        grow(&mut self.x, rows * c.hidden_size);
        grow(&mut self.xn, rows * c.hidden_size);
        grow(&mut self.o, rows * c.hidden_size);
        grow(&mut self.q, rows * h * hd);
        grow(&mut self.attn, rows * h * hd);
        grow(&mut self.k, rows * c.num_key_value_heads * hd);
        grow(&mut self.v, rows * c.num_key_value_heads * hd);
        grow(&mut self.gate, rows * c.intermediate_size);
        grow(&mut self.up, rows * c.intermediate_size);
        let spec = c.architecture.spec();
        if spec.fused_qkv || spec.fused_gate_up {
            let qkv = (h + 2 * c.num_key_value_heads) * hd;
            grow(&mut self.fused, rows * qkv.max(2 * c.intermediate_size));
        }
        grow(&mut self.cos, rows * hd / 2);
        grow(&mut self.sin, rows * hd / 2);
        if c.params.local_rope_theta.is_some() {
            grow(&mut self.cos_local, rows * hd / 2);
            grow(&mut self.sin_local, rows * hd / 2);
        }
        grow(&mut self.positions, rows);
        grow(&mut self.long_context, rows);
        if self.tasks.len() < tasks {
            self.tasks.resize_with(tasks, HeadTask::default);
        }
        for t in &mut self.tasks[..tasks] {
            grow(&mut t.out, task_rows * hd);
            // Four rows' scores (`attention::attend_four_rows`).
            grow(&mut t.scores, 4 * span);
        }
    }
}

/// The rows `0..rows` of a prefill chunk whose first row sits at position
/// `start`, in at most `blocks` consecutive non-empty pieces of about equal
/// attention work (row `r` attends to `start + r + 1` positions, so the
/// earlier pieces are longer). Which rows a task takes never changes how a row
/// is computed.
fn balanced_row_blocks(
    start: usize,
    rows: usize,
    blocks: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> {
    let blocks = blocks.clamp(1, rows.max(1)) as u128;
    // Work of the rows before row k: k · start + k (k + 1) / 2.
    let work = move |k: usize| (k as u128) * (start as u128) + (k as u128) * (k as u128 + 1) / 2;
    let total = work(rows);
    let mut k = 0usize;
    (1..=blocks).filter_map(move |b| {
        let begin = k;
        let target = total * b / blocks;
        while k < rows && (work(k) < target || k == begin) {
            k += 1;
        }
        if b == blocks {
            k = rows;
        }
        (k > begin).then_some(begin..k)
    })
}

/// An invalid-request error of `op`.
fn invalid(op: &'static str, reason: String) -> LlmError {
    LlmError::InvalidRequest { op, reason }
}

/// The tensor `name` of `store`, checked to have `shape`.
fn tensor(store: &WeightStore, name: &str, shape: &[usize]) -> Result<Weight, LlmError> {
    let w = store.get(name)?;
    if w.shape() != shape {
        return Err(LlmError::BadTensor {
            name: name.to_string(),
            reason: format!(
                "shape {:?}, expected {:?} from the config",
                w.shape(),
                shape
            ),
        });
    }
    Ok(w.clone())
}

/// A vector tensor widened to f32.
fn vector(store: &WeightStore, name: &str, len: usize) -> Result<Vec<f32>, LlmError> {
    Ok(tensor(store, name, &[len])?.to_f32_vec())
}

/// Checks the sizes of a configuration the model can run.
/// Every size the model derives from the config is checked here, once, with
/// checked or saturating arithmetic (the lint keeps it so): past this point
/// the products of sizes the decoder forms cannot overflow.
#[warn(clippy::arithmetic_side_effects)]
pub(crate) fn check_config(c: &ModelConfig) -> Result<(), LlmError> {
    let op = "Model::from_parts";
    let positive = [
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_hidden_layers", c.num_hidden_layers),
        ("num_attention_heads", c.num_attention_heads),
        ("num_key_value_heads", c.num_key_value_heads),
        ("head_dim", c.head_dim),
        ("vocab_size", c.vocab_size),
        ("max_position_embeddings", c.max_position_embeddings),
    ];
    for (name, v) in positive {
        if v == 0 {
            return Err(invalid(op, format!("config: {name} is 0")));
        }
    }
    if !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
        return Err(invalid(
            op,
            format!(
                "config: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                c.num_attention_heads, c.num_key_value_heads
            ),
        ));
    }
    if !c.head_dim.is_multiple_of(2) {
        return Err(invalid(
            op,
            format!(
                "config: head_dim {} is odd (RoPE rotates pairs)",
                c.head_dim
            ),
        ));
    }
    if c.sliding_window == Some(0) {
        return Err(invalid(op, "config: sliding_window is 0".to_string()));
    }
    if !(c.rms_norm_eps.is_finite() && c.rope_theta.is_finite() && c.rope_theta > 0.0) {
        return Err(invalid(
            op,
            format!(
                "config: rms_norm_eps {} / rope_theta {} not usable",
                c.rms_norm_eps, c.rope_theta
            ),
        ));
    }
    if let Some(problem) = c.rope_scaling.problem() {
        return Err(invalid(op, format!("config: {problem}")));
    }
    check_params(c)?;
    // Every activation buffer's size must fit.
    let widest = c
        .hidden_size
        .max(c.intermediate_size)
        .max(c.num_attention_heads.saturating_mul(c.head_dim))
        .max(c.vocab_size);
    if widest.checked_mul(PREFILL_CHUNK * 4).is_none() {
        return Err(invalid(
            op,
            "config: sizes overflow the address space".to_string(),
        ));
    }
    Ok(())
}

/// The MLP of layer `i`: the experts when the config makes the layer sparse,
/// else the dense MLP (fused or not, as the spec says).
fn ffn(weights: &WeightStore, c: &ModelConfig, i: usize) -> Result<Ffn, LlmError> {
    let n = |s: &str| format!("model.layers.{i}.{s}");
    let hid = c.hidden_size;
    if let Some(m) = &c.params.moe
        && m.sparse_layers.get(i).copied().unwrap_or(true)
    {
        let inter = m.moe_intermediate_size;
        let names = c.architecture.spec().expert_names;
        let experts = (0..m.num_experts)
            .map(|e| {
                let x = |s: &str| n(&format!("{}.{e}.{s}.weight", names.experts));
                Ok(moe::Expert {
                    gate: tensor(weights, &x(names.gate), &[inter, hid])?,
                    up: tensor(weights, &x(names.up), &[inter, hid])?,
                    down: tensor(weights, &x(names.down), &[hid, inter])?,
                })
            })
            .collect::<Result<Vec<_>, LlmError>>()?;
        let router = n(&format!("{}.weight", names.router));
        return Ok(Ffn::Moe(moe::Moe {
            router: tensor(weights, &router, &[m.num_experts, hid])?,
            experts,
            top_k: m.num_experts_per_tok,
            norm_topk_prob: m.norm_topk_prob,
            inter,
            names,
        }));
    }
    let inter = c.intermediate_size;
    let gate_up = match c.architecture.spec().fused_gate_up {
        true => GateUp::Fused(tensor(
            weights,
            &n("mlp.gate_up_proj.weight"),
            &[2 * inter, hid],
        )?),
        false => GateUp::Split {
            gate: tensor(weights, &n("mlp.gate_proj.weight"), &[inter, hid])?,
            up: tensor(weights, &n("mlp.up_proj.weight"), &[inter, hid])?,
        },
    };
    let down = tensor(weights, &n("mlp.down_proj.weight"), &[hid, inter])?;
    Ok(Ffn::Dense { gate_up, down })
}

/// Checks the [`ArchParams`](crate::ArchParams) of a configuration.
fn check_params(c: &ModelConfig) -> Result<(), LlmError> {
    let op = "Model::from_parts";
    let p = &c.params;
    if !p.sliding_layers.is_empty() && p.sliding_layers.len() != c.num_hidden_layers {
        return Err(invalid(
            op,
            format!(
                "config: sliding_layers has {} entries for {} layers",
                p.sliding_layers.len(),
                c.num_hidden_layers
            ),
        ));
    }
    let positive = [
        ("attn_logit_softcapping", p.attn_logit_softcapping),
        ("final_logit_softcapping", p.final_logit_softcapping),
        ("query_pre_attn_scalar", p.query_pre_attn_scalar),
        ("local_rope_theta", p.local_rope_theta),
    ];
    let longrope_factor = p.longrope.as_ref().map(|lr| lr.attention_factor);
    for (name, v) in positive
        .into_iter()
        .chain([("longrope.attention_factor", longrope_factor)])
    {
        if let Some(x) = v
            && !(x.is_finite() && x > 0.0)
        {
            return Err(invalid(
                op,
                format!("config: {name} {x} is not positive and finite"),
            ));
        }
    }
    if let Some(m) = &p.moe {
        let bad = if m.num_experts == 0 || m.moe_intermediate_size == 0 {
            Some("no experts or experts of width 0".to_string())
        } else if m.num_experts_per_tok == 0 || m.num_experts_per_tok > m.num_experts {
            Some(format!(
                "{} experts per token of {}",
                m.num_experts_per_tok, m.num_experts
            ))
        } else if !m.sparse_layers.is_empty() && m.sparse_layers.len() != c.num_hidden_layers {
            Some(format!(
                "sparse_layers has {} entries for {} layers",
                m.sparse_layers.len(),
                c.num_hidden_layers
            ))
        } else if m
            .moe_intermediate_size
            .checked_mul(PREFILL_CHUNK * 4)
            .is_none()
            || m.num_experts.checked_mul(PREFILL_CHUNK * 4).is_none()
        {
            Some("sizes overflow the address space".to_string())
        } else {
            None
        };
        if let Some(b) = bad {
            return Err(invalid(op, format!("config: mixture of experts: {b}")));
        }
    }
    if let Some(rd) = p.rotary_dim
        && (rd == 0 || !rd.is_multiple_of(2) || rd > c.head_dim)
    {
        return Err(invalid(
            op,
            format!(
                "config: rotary_dim {rd} is not an even number of dimensions in 2..={}",
                c.head_dim
            ),
        ));
    }
    if let Some(lr) = &p.longrope {
        let half = c.rotary_dim() / 2;
        if lr.short_factor.len() != half || lr.long_factor.len() != half {
            return Err(invalid(
                op,
                format!(
                    "config: LongRoPE has {} short and {} long factors, expected rotary_dim / 2 = {half}",
                    lr.short_factor.len(),
                    lr.long_factor.len()
                ),
            ));
        }
        if c.rope_scaling != crate::config::RopeScaling::None {
            return Err(invalid(
                op,
                "config: LongRoPE and another RoPE scaling at once".to_string(),
            ));
        }
    }
    Ok(())
}

/// The rotary inverse frequencies of base `theta` and `scaling`, checked to
/// give finite angles over the model's positions.
fn checked_inv_freq(
    c: &ModelConfig,
    theta: f32,
    scaling: &crate::config::RopeScaling,
) -> Result<Vec<f32>, LlmError> {
    let inv_freq = kernels::inv_freq(c.rotary_dim(), theta, scaling);
    // Every rotary angle `pos · inv_freq[i]` of a position the model
    // supports must be finite (a rope_theta of 1e-45 is a positive f32, and
    // its frequencies overflow; its cosines would be NaN).
    let last_pos = (c.max_position_embeddings - 1) as f32;
    if let Some(f) = inv_freq
        .iter()
        .find(|&&f| !(f >= 0.0 && (f * last_pos).is_finite() && f.is_finite()))
    {
        return Err(invalid(
            "Model::from_parts",
            format!(
                "config: rope_theta {theta} with RoPE scaling {scaling:?} gives the rotary frequency {f}, \
                 whose angles overflow f32 over {} positions",
                c.max_position_embeddings
            ),
        ));
    }
    Ok(inv_freq)
}

impl Model {
    /// Loads the model at `path` (a Hugging Face model directory or a GGUF
    /// file, as [`OpenOptions::open`](crate::OpenOptions::open) reads them) in
    /// its file's formats, quantized matrices read in place: the model of
    /// `OpenOptions::new().in_place(true).open(path, ctx)`, without a context
    /// (nothing is converted or repacked) and without reading the tokenizer.
    ///
    /// # Errors
    /// Those of [`OpenOptions::open`](crate::OpenOptions::open).
    pub fn load(path: impl AsRef<Path>) -> Result<Model, LlmError> {
        let parts = crate::open::read_parts(path.as_ref(), false)?;
        Model::from_parts(parts.config, parts.weights)
    }

    /// Loads the model at `path` with its matrices converted to `dtype` by
    /// [`WeightStore::convert`] (quantized on `ctx`'s team) and repacked:
    /// `OpenOptions::new().dtype(dtype).open(path, ctx)`'s model. The
    /// embedding table and the output projection are converted too, the norms
    /// and biases stay f32; see [`WeightStore::convert`] for the rules
    /// (llama.cpp's).
    ///
    /// # Errors
    /// Those of [`OpenOptions::open`](crate::OpenOptions::open), among them
    /// [`LlmError::BadTensor`] naming a matrix whose column count is not a
    /// multiple of 32 when `dtype` is a block format.
    pub fn load_as(
        path: impl AsRef<Path>,
        ctx: &ExecContext,
        dtype: LoadDtype,
    ) -> Result<Model, LlmError> {
        Ok(crate::OpenOptions::new()
            .dtype(dtype)
            .open(path, ctx)?
            .model)
    }

    /// A model from a configuration and its weights (Hugging Face tensor names).
    /// Every tensor the configuration calls for must be present with the shape it
    /// implies; tensors it does not use are ignored (`lm_head.weight` of a tied
    /// model among them).
    ///
    /// # Errors
    /// [`LlmError::BadTensor`] naming a missing tensor, or one whose shape
    /// disagrees with the config (both shapes given); [`LlmError::InvalidRequest`]
    /// for an inconsistent config (a zero size, query heads not a multiple of
    /// key/value heads, an odd `head_dim`).
    pub fn from_parts(config: ModelConfig, weights: WeightStore) -> Result<Model, LlmError> {
        check_config(&config)?;
        let formats = weights.format_report();
        let c = &config;
        let (hid, hd) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let embed = tensor(&weights, "model.embed_tokens.weight", &[c.vocab_size, hid])?;
        // The layer count comes from a file: before anything is sized by it,
        // its last layer must be there (a count of 2^40 is refused here, not by
        // the allocator).
        let last = format!(
            "model.layers.{}.input_layernorm.weight",
            c.num_hidden_layers - 1
        );
        if !weights.contains(&last) {
            return Err(LlmError::BadTensor {
                name: last,
                reason: format!(
                    "missing: the config declares {} layers, the weights hold {} tensors",
                    c.num_hidden_layers,
                    weights.len()
                ),
            });
        }
        let spec = c.architecture.spec();
        // A `1 + w` norm's sum, formed in f32 (as transformers forms it) unless
        // the file holds it already.
        let one_plus = spec.norm == NormStyle::RmsOnePlus && !c.params.norms_include_one;
        let norm = |name: &str, len: usize| -> Result<Vec<f32>, LlmError> {
            let mut w = vector(&weights, name, len)?;
            if one_plus {
                w.iter_mut().for_each(|x| *x += 1.0);
            }
            Ok(w)
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let n = |s: &str| format!("model.layers.{i}.{s}");
            let bias = |s: &str, on: bool, len: usize| -> Result<Option<Vec<f32>>, LlmError> {
                match on {
                    true => Ok(Some(vector(&weights, &n(s), len)?)),
                    false => Ok(None),
                }
            };
            let opt_norm = |s: &str, on: bool, len: usize| -> Result<Option<Vec<f32>>, LlmError> {
                match on {
                    true => Ok(Some(norm(&n(s), len)?)),
                    false => Ok(None),
                }
            };
            let sandwich = spec.sandwich_norms;
            let sliding = c.params.sliding_layers.get(i).copied().unwrap_or(true);
            layers.push(Layer {
                input_norm: norm(&n("input_layernorm.weight"), hid)?,
                attn_out_norm: opt_norm("post_attention_layernorm.weight", sandwich, hid)?,
                mlp_out_norm: opt_norm("post_feedforward_layernorm.weight", sandwich, hid)?,
                q_norm: opt_norm("self_attn.q_norm.weight", spec.qk_norm, hd)?,
                k_norm: opt_norm("self_attn.k_norm.weight", spec.qk_norm, hd)?,
                window: c.sliding_window.filter(|_| sliding),
                local_rope: sliding && c.params.local_rope_theta.is_some(),
                qkv: match spec.fused_qkv {
                    true => Qkv::Fused(tensor(
                        &weights,
                        &n("self_attn.qkv_proj.weight"),
                        &[qd + 2 * kvd, hid],
                    )?),
                    false => Qkv::Split {
                        q: tensor(&weights, &n("self_attn.q_proj.weight"), &[qd, hid])?,
                        k: tensor(&weights, &n("self_attn.k_proj.weight"), &[kvd, hid])?,
                        v: tensor(&weights, &n("self_attn.v_proj.weight"), &[kvd, hid])?,
                    },
                },
                o: tensor(&weights, &n("self_attn.o_proj.weight"), &[hid, qd])?,
                q_bias: bias("self_attn.q_proj.bias", c.qkv_bias, qd)?,
                k_bias: bias("self_attn.k_proj.bias", c.qkv_bias, kvd)?,
                v_bias: bias("self_attn.v_proj.bias", c.qkv_bias, kvd)?,
                o_bias: bias("self_attn.o_proj.bias", c.o_bias, hid)?,
                post_norm: match sandwich {
                    true => norm(&n("pre_feedforward_layernorm.weight"), hid)?,
                    false => norm(&n("post_attention_layernorm.weight"), hid)?,
                },
                ffn: ffn(&weights, c, i)?,
            });
        }
        let final_norm = norm("model.norm.weight", hid)?;
        let lm_head = match c.tie_word_embeddings {
            true => None,
            false => Some(tensor(&weights, "lm_head.weight", &[c.vocab_size, hid])?),
        };
        let (inv_freq, long_rope) = match &c.params.longrope {
            None => (checked_inv_freq(c, c.rope_theta, &c.rope_scaling)?, None),
            Some(lr) => {
                let rd = c.rotary_dim();
                let short = kernels::inv_freq_with_factors(rd, c.rope_theta, &lr.short_factor);
                let long = kernels::inv_freq_with_factors(rd, c.rope_theta, &lr.long_factor);
                for f in short.iter().chain(&long) {
                    if !(f.is_finite() && *f >= 0.0) {
                        return Err(invalid(
                            "Model::from_parts",
                            format!("config: LongRoPE gives the rotary frequency {f}"),
                        ));
                    }
                }
                let from = lr.original_max_position_embeddings;
                (short, Some((from, long, lr.attention_factor)))
            }
        };
        let local_inv_freq = match c.params.local_rope_theta {
            Some(theta) => Some(checked_inv_freq(
                c,
                theta,
                &crate::config::RopeScaling::None,
            )?),
            None => None,
        };
        let scale = match c.params.query_pre_attn_scalar {
            Some(q) => fmath::pow_f32(q as f64, -0.5),
            None => fmath::pow_f32(hd as f64, -0.5),
        };
        // transformers rounds `sqrt(hidden)` to the activations' dtype.
        let embed_scale = spec.embed_scale.then(|| (hid as f64).sqrt() as f32);
        Ok(Model {
            config,
            spec,
            embed_scale,
            embed,
            layers,
            final_norm,
            lm_head,
            inv_freq,
            local_inv_freq,
            long_rope,
            scale,
            scratch: Mutex::new(Scratch::default()),
            formats,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// What each tensor of the weights the model was built from is stored as,
    /// and why ([`WeightStore::format_report`]): a GGUF file's own mix of
    /// types, or what converting at load made of each matrix (the asked
    /// format, the output projection's, or a fallback). Tensors the model does
    /// not read (a tied model's `lm_head.weight`) are listed too.
    pub fn formats(&self) -> &FormatReport {
        &self.formats
    }

    /// Every projection matrix with its tensor name: the output projection
    /// (the embedding matrix when tied), then the q, k, v, o and MLP
    /// projections of each layer. (The largest first: packing them in this
    /// order keeps at most one large matrix resident twice, its file pages
    /// and its copy, while the copies of the others are made.)
    fn projections_mut(&mut self) -> impl Iterator<Item = (String, &mut Weight)> {
        let layers = self.layers.iter_mut().enumerate().flat_map(|(i, l)| {
            let mut all = l.qkv.named_mut();
            all.push(("self_attn.o_proj", &mut l.o));
            let mut all: Vec<(String, &mut Weight)> =
                all.into_iter().map(|(n, w)| (n.to_string(), w)).collect();
            match &mut l.ffn {
                Ffn::Dense { gate_up, down } => {
                    all.extend(
                        gate_up
                            .named_mut()
                            .into_iter()
                            .map(|(n, w)| (n.to_string(), w)),
                    );
                    all.push(("mlp.down_proj".to_string(), down));
                }
                Ffn::Moe(m) => all.extend(m.named_mut()),
            }
            all.into_iter()
                .map(move |(n, w)| (format!("model.layers.{i}.{n}.weight"), w))
        });
        let head = match &mut self.lm_head {
            Some(h) => ("lm_head.weight".to_string(), h),
            None => ("model.embed_tokens.weight".to_string(), &mut self.embed),
        };
        std::iter::once(head).chain(layers)
    }

    /// Switches the model to **bf16 products**: every projection (and the
    /// output projection) rounds its input activations to bf16 and sums with
    /// the AMX rule ([`Weight::pack_bf16_products`]), on Intel's AMX tiles
    /// where the CPU has them (many times the f32 rate of a prompt's
    /// prefill) and by an emulation with the same bits elsewhere. Everything
    /// else (norms, RoPE, attention, softmax, SwiGLU, residuals) stays f32.
    ///
    /// The logits are no longer those of f32 activations (each projection's
    /// inputs lose their low 16 bits, as in a model run in bf16), but every
    /// invariance of the module holds as before: the same bits for any batch,
    /// thread count, vector level (AMX on or off) and prefill chunking, and a
    /// position's logits are the same whether prefilled or decoded.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] naming the first projection that is not a
    /// bf16 matrix (load the model with [`LoadDtype::BF16`] to convert it);
    /// out of memory. The model is unchanged on an error.
    pub fn use_bf16_products(&mut self) -> Result<(), LlmError> {
        let mut packed = Vec::new();
        for (name, w) in self.projections_mut() {
            let mut w = w.clone();
            w.pack_bf16_products().map_err(|e| match e {
                LlmError::InvalidRequest { op, reason } => LlmError::InvalidRequest {
                    op,
                    reason: format!("{name}: {reason}"),
                },
                e => e,
            })?;
            packed.push(w);
        }
        for ((_, dst), w) in self.projections_mut().zip(packed) {
            *dst = w;
        }
        Ok(())
    }

    /// Whether [`use_bf16_products`](Model::use_bf16_products) switched the
    /// model to bf16 products.
    pub fn uses_bf16_products(&self) -> bool {
        self.lm_head
            .as_ref()
            .unwrap_or(&self.embed)
            .has_bf16_products()
    }

    /// Bytes of weights one decode step reads for one token, in their file format:
    /// every projection of every layer and the output projection (the embedding
    /// matrix when tied), plus the norms and biases (widened to f32 at load) and
    /// the one embedding row of the token. The numerator of the memory-bandwidth
    /// limit of decoding.
    pub fn weight_bytes_per_token(&self) -> usize {
        let f32s = |v: &Option<Vec<f32>>| v.as_ref().map_or(0, |b| 4 * b.len());
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let ffn = match &l.ffn {
                    Ffn::Dense { gate_up, down } => {
                        down.bytes().len()
                            + gate_up
                                .weights()
                                .iter()
                                .map(|w| w.bytes().len())
                                .sum::<usize>()
                    }
                    Ffn::Moe(m) => m.bytes_per_token(),
                };
                l.qkv
                    .weights()
                    .into_iter()
                    .chain([&l.o])
                    .map(|w| w.bytes().len())
                    .sum::<usize>()
                    + ffn
                    + 4 * (l.input_norm.len() + l.post_norm.len())
                    + f32s(&l.attn_out_norm)
                    + f32s(&l.mlp_out_norm)
                    + f32s(&l.q_norm)
                    + f32s(&l.k_norm)
                    + f32s(&l.q_bias)
                    + f32s(&l.k_bias)
                    + f32s(&l.v_bias)
                    + f32s(&l.o_bias)
            })
            .sum();
        let head = self.lm_head.as_ref().unwrap_or(&self.embed).bytes().len();
        let embed_row = self.embed.bytes().len() / self.config.vocab_size.max(1);
        layers + head + 4 * self.final_norm.len() + embed_row
    }

    /// A KV cache for one sequence of at most `max_len` positions
    /// (`2 · layers · kv_heads · head_dim · max_len` f32 values, positions
    /// rounded up to a multiple of 16), taken now from `ctx`'s buffer pool and
    /// given back to it when the cache drops. Any context may then run the
    /// cache's calls.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when `max_len` is 0, exceeds the model's
    /// `max_position_embeddings`, or the pool cannot provide the memory (the
    /// system allocator refuses it).
    pub fn new_cache(&self, ctx: &ExecContext, max_len: usize) -> Result<KvCache, LlmError> {
        let c = &self.config;
        if max_len > c.max_position_embeddings {
            return Err(invalid(
                "Model::new_cache",
                format!(
                    "max_len {max_len} exceeds the model's max_position_embeddings {}",
                    c.max_position_embeddings
                ),
            ));
        }
        KvCache::new(
            ctx,
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
            max_len,
        )
    }

    /// Checks that `cache` was made for this model's shape.
    fn check_cache(&self, op: &'static str, cache: &KvCache) -> Result<(), LlmError> {
        let c = &self.config;
        let want = (c.num_hidden_layers, c.num_key_value_heads, c.head_dim);
        if cache.shape() != want {
            return Err(invalid(
                op,
                format!(
                    "the cache was made for (layers, kv_heads, head_dim) {:?}, the model has {want:?}",
                    cache.shape()
                ),
            ));
        }
        // A cache of another model of the same shape may hold more positions
        // than this model supports.
        if cache.capacity() > c.max_position_embeddings {
            return Err(invalid(
                op,
                format!(
                    "the cache holds {} positions, more than the model's max_position_embeddings {}",
                    cache.capacity(),
                    c.max_position_embeddings
                ),
            ));
        }
        Ok(())
    }

    /// Whether `cache` rotates with LongRoPE's long factors: it holds more
    /// positions than the original context (llama.cpp's rule, by the context's
    /// size, so that a position's rotation never changes as the sequence
    /// grows).
    fn long_context(&self, cache: &KvCache) -> bool {
        self.kv_variant(cache.capacity()) == 1
    }

    /// Which rotation a cache of `capacity` positions gives its keys: 1 for a
    /// LongRoPE model's cache longer than its original context (the long
    /// factors), else 0. Caches of the same variant hold the same key and
    /// value bits for the same tokens, so blocks moved between them by
    /// [`KvCache::export_block`] and [`KvCache::import_block`] give the bits a
    /// prefill would.
    pub fn kv_variant(&self, capacity: usize) -> u32 {
        self.long_rope
            .as_ref()
            .is_some_and(|(original, _, _)| capacity > *original) as u32
    }

    /// Checks that `token` is in the vocabulary.
    fn check_token(&self, op: &'static str, token: u32) -> Result<(), LlmError> {
        if token as usize >= self.config.vocab_size {
            return Err(invalid(
                op,
                format!(
                    "token id {token} is past the vocabulary ({} ids)",
                    self.config.vocab_size
                ),
            ));
        }
        Ok(())
    }

    /// Appends `tokens` to the sequence of `cache`, at positions `cache.len()..`,
    /// in chunks of [`PREFILL_CHUNK`] tokens, and writes the logits of the last
    /// token into `last_logits` (`[vocab]`). When `all_logits` is given it
    /// receives the logits of every token (`[tokens.len(), vocab]`, row-major);
    /// otherwise only the last token goes through `lm_head`.
    ///
    /// The logits of a position are the same bits as those [`decode`](Model::decode)
    /// gives for it after a prefill of the tokens before it, whatever the thread
    /// count and the vector level.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] for an empty prompt, a token id past the
    /// vocabulary, more tokens than the cache has room for (its `max_len`, at
    /// most the model's `max_position_embeddings`), a cache made for another
    /// model shape, a logits buffer of the wrong length, or a cache whose
    /// buffers a clone shares and whose copy the pool cannot provide; nothing
    /// is changed then. [`LlmError::Exec`] from the projections (the cache is
    /// then left at its former length).
    pub fn prefill(
        &self,
        ctx: &ExecContext,
        cache: &mut KvCache,
        tokens: &[u32],
        mut all_logits: Option<&mut [f32]>,
        last_logits: &mut [f32],
    ) -> Result<(), LlmError> {
        const OP: &str = "Model::prefill";
        let vocab = self.config.vocab_size;
        if tokens.is_empty() {
            return Err(invalid(OP, "the prompt is empty".to_string()));
        }
        self.check_cache(OP, cache)?;
        for &t in tokens {
            self.check_token(OP, t)?;
        }
        if tokens.len() > cache.remaining() {
            return Err(invalid(
                OP,
                format!(
                    "{} tokens after {} cached positions exceed the cache's max_len {} \
                     (the model's max_position_embeddings is {})",
                    tokens.len(),
                    cache.len(),
                    cache.capacity(),
                    self.config.max_position_embeddings
                ),
            ));
        }
        if last_logits.len() != vocab {
            return Err(invalid(
                OP,
                format!(
                    "last_logits has {} elements, expected {vocab}",
                    last_logits.len()
                ),
            ));
        }
        if let Some(all) = all_logits.as_deref()
            && all.len() != tokens.len() * vocab
        {
            return Err(invalid(
                OP,
                format!(
                    "all_logits has {} elements, expected {} tokens x {vocab}",
                    all.len(),
                    tokens.len()
                ),
            ));
        }
        cache.make_writable(OP)?;
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *scratch;
        let heads = self.config.num_attention_heads;
        let rows_max = tokens.len().min(PREFILL_CHUNK);
        // Attention tasks: each head's rows in `blocks` pieces of about equal
        // work, so that a team has at least eight tasks per participant (the
        // team claims them dynamically; the last one to finish bounds the idle
        // time).
        let blocks = (8 * ctx.threads()).div_ceil(heads).clamp(1, rows_max);
        // The longest piece is the first of a chunk that starts the cache.
        let longest = balanced_row_blocks(0, rows_max, blocks)
            .map(|r| r.len())
            .max()
            .unwrap_or(0);
        // Scores for the cache's whole capacity: later calls on it never grow them.
        s.ensure(
            &self.config,
            rows_max,
            heads * blocks,
            longest.max(rows_max.div_ceil(blocks)),
            cache.capacity(),
        );
        let start = cache.len();
        let n_chunks = tokens.len().div_ceil(PREFILL_CHUNK);
        for (ci, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
            let rows = chunk.len();
            let first = start + ci * PREFILL_CHUNK;
            for (r, p) in s.positions[..rows].iter_mut().enumerate() {
                *p = first + r;
            }
            s.long_context[..rows].fill(self.long_context(cache));
            let mut n_tasks = 0;
            for h in 0..heads {
                for piece in balanced_row_blocks(first, rows, blocks) {
                    let t = &mut s.tasks[n_tasks];
                    (t.seq, t.head, t.rows) = (0, h, piece);
                    n_tasks += 1;
                }
            }
            self.embed_rows(0, chunk, s)?;
            for l in 0..self.layers.len() {
                self.attention_inputs(ctx, l, rows, s)?;
                for r in 0..rows {
                    self.store_kv(l, s, r, cache);
                }
                let cache_ro = &*cache;
                self.attention(ctx, l, n_tasks, s, |_| cache_ro);
                self.attention_output_and_mlp(ctx, l, rows, s)?;
            }
            let hid = self.config.hidden_size;
            if let Some(all) = all_logits.as_deref_mut() {
                self.logits(
                    ctx,
                    &s.x[..rows * hid],
                    &mut s.xn[..rows * hid],
                    &mut all[ci * PREFILL_CHUNK * vocab..(ci * PREFILL_CHUNK + rows) * vocab],
                )?;
                if ci + 1 == n_chunks {
                    last_logits.copy_from_slice(&all[(tokens.len() - 1) * vocab..]);
                }
            } else if ci + 1 == n_chunks {
                self.logits(
                    ctx,
                    &s.x[(rows - 1) * hid..rows * hid],
                    &mut s.xn[..hid],
                    last_logits,
                )?;
            }
        }
        cache.set_len(start + tokens.len());
        Ok(())
    }

    /// Decodes one token per sequence: `tokens[i]` is appended to `caches[i]` at
    /// its own position `caches[i].len()`, and `logits` (`[caches.len(), vocab]`,
    /// row-major) receives each sequence's next-token logits. The projections of
    /// all sequences run as one batched product; attention runs per sequence and
    /// head. Sequences may join or leave between calls (pass a different slice).
    ///
    /// A sequence's logits are the same bits whatever the other sequences of the
    /// call, the thread count and the vector level. After a warm-up call with the
    /// largest batch and caches, a call allocates nothing.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when `tokens.len() != caches.len()`, the batch
    /// is empty, a token id is past the vocabulary, a cache is full (its
    /// `max_len`, at most the model's `max_position_embeddings`) or was made for
    /// another model shape, `logits` has the wrong length, or a cache's buffers
    /// are shared with a clone and the pool cannot provide their copy; nothing
    /// is changed then. [`LlmError::Exec`] from the projections (the caches
    /// keep their former lengths).
    pub fn decode(
        &self,
        ctx: &ExecContext,
        caches: &mut [&mut KvCache],
        tokens: &[u32],
        logits: &mut [f32],
    ) -> Result<(), LlmError> {
        self.mixed_step("Model::decode", ctx, None, caches, tokens, logits)
    }

    /// Loads the embedding rows of `tokens` into `s.x` from row `first` on,
    /// and the RoPE angles of the rows' positions (`s.positions`) into `s.cos`,
    /// `s.sin`.
    fn embed_rows(&self, first: usize, tokens: &[u32], s: &mut Scratch) -> Result<(), LlmError> {
        let hid = self.config.hidden_size;
        let half = self.config.rotary_dim() / 2;
        for (r, &t) in (first..).zip(tokens) {
            let x = &mut s.x[r * hid..(r + 1) * hid];
            self.embed.row_to_f32(t as usize, x)?;
            if let Some(k) = self.embed_scale {
                x.iter_mut().for_each(|v| *v *= k);
            }
            let pos = s.positions[r];
            let (cos, sin) = (
                &mut s.cos[r * half..(r + 1) * half],
                &mut s.sin[r * half..(r + 1) * half],
            );
            match &self.long_rope {
                None => kernels::rope_angles(pos, &self.inv_freq, cos, sin),
                Some((_, long, factor)) => {
                    let inv = match s.long_context[r] {
                        true => long,
                        false => &self.inv_freq,
                    };
                    kernels::rope_angles(pos, inv, cos, sin);
                    cos.iter_mut()
                        .chain(sin.iter_mut())
                        .for_each(|v| *v *= factor);
                }
            }
            if let Some(inv) = &self.local_inv_freq {
                kernels::rope_angles(
                    s.positions[r],
                    inv,
                    &mut s.cos_local[r * half..(r + 1) * half],
                    &mut s.sin_local[r * half..(r + 1) * half],
                );
            }
        }
        Ok(())
    }

    /// Layer `l`'s input norm, q/k/v projections (and biases) and RoPE for the
    /// first `rows` rows of `s.x`, into `s.q`, `s.k`, `s.v`.
    fn attention_inputs(
        &self,
        ctx: &ExecContext,
        l: usize,
        rows: usize,
        s: &mut Scratch,
    ) -> Result<(), LlmError> {
        let c = &self.config;
        let layer = &self.layers[l];
        let (hid, half, hd) = (c.hidden_size, c.rotary_dim() / 2, c.head_dim);
        let (qd, kvd) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        for (x, xn) in s.x[..rows * hid]
            .chunks_exact(hid)
            .zip(s.xn[..rows * hid].chunks_exact_mut(hid))
        {
            kernels::rms_norm(x, &layer.input_norm, c.rms_norm_eps, xn);
        }
        let xn = &s.xn[..rows * hid];
        match &layer.qkv {
            Qkv::Split { q, k, v } => {
                q.matmul(ctx, xn, rows, &mut s.q[..rows * qd])?;
                k.matmul(ctx, xn, rows, &mut s.k[..rows * kvd])?;
                v.matmul(ctx, xn, rows, &mut s.v[..rows * kvd])?;
            }
            Qkv::Fused(w) => {
                // Each output row is fixed by its input row: the same bits as
                // three products.
                let width = qd + 2 * kvd;
                let fused = &mut s.fused[..rows * width];
                w.matmul(ctx, xn, rows, fused)?;
                for (r, row) in fused.chunks_exact(width).enumerate() {
                    s.q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
                    s.k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
                    s.v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
                }
            }
        }
        let biases = [
            (&layer.q_bias, &mut s.q[..rows * qd]),
            (&layer.k_bias, &mut s.k[..rows * kvd]),
            (&layer.v_bias, &mut s.v[..rows * kvd]),
        ];
        for (bias, out) in biases {
            if let Some(b) = bias {
                kernels::add_bias(out, b);
            }
        }
        if let Some(w) = &layer.q_norm {
            kernels::rms_norm_heads(&mut s.q[..rows * qd], w, c.rms_norm_eps);
        }
        if let Some(w) = &layer.k_norm {
            kernels::rms_norm_heads(&mut s.k[..rows * kvd], w, c.rms_norm_eps);
        }
        let (cos, sin) = match layer.local_rope {
            true => (&s.cos_local, &s.sin_local),
            false => (&s.cos, &s.sin),
        };
        for r in 0..rows {
            let (cos, sin) = (
                &cos[r * half..(r + 1) * half],
                &sin[r * half..(r + 1) * half],
            );
            kernels::apply_rope(&mut s.q[r * qd..(r + 1) * qd], hd, cos, sin);
            kernels::apply_rope(&mut s.k[r * kvd..(r + 1) * kvd], hd, cos, sin);
        }
        Ok(())
    }

    /// Writes row `r`'s keys and values of layer `l` into `cache` at the row's
    /// position.
    fn store_kv(&self, l: usize, s: &Scratch, r: usize, cache: &mut KvCache) {
        let hd = self.config.head_dim;
        let kvd = self.config.num_key_value_heads * hd;
        let pos = s.positions[r];
        for g in 0..self.config.num_key_value_heads {
            let at = r * kvd + g * hd;
            cache.store(l, g, pos, &s.k[at..at + hd], &s.v[at..at + hd]);
        }
    }

    /// Runs the first `n_tasks` attention tasks of `s` for layer `l` (task `t`
    /// reads the cache `cache_of(t.seq)`) and gathers their outputs into
    /// `s.attn`. In parallel over tasks when the work is large enough; each
    /// task's rows are computed the same way either way.
    fn attention<'c>(
        &self,
        ctx: &ExecContext,
        l: usize,
        n_tasks: usize,
        s: &mut Scratch,
        cache_of: impl Fn(usize) -> &'c KvCache + Sync,
    ) {
        let c = &self.config;
        let hd = c.head_dim;
        let qd = c.num_attention_heads * hd;
        let group = c.num_attention_heads / c.num_key_value_heads;
        let (window, scale) = (self.layers[l].window, self.scale);
        let cap = c.params.attn_logit_softcapping;
        let Scratch {
            q,
            attn,
            positions,
            tasks,
            ..
        } = s;
        let (q, positions) = (&q[..], &positions[..]);
        let tasks = &mut tasks[..n_tasks];
        let run = |t: &mut HeadTask| {
            let cache = cache_of(t.seq);
            let g = t.head / group;
            let lo_of = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let (first, end) = (t.rows.start, t.rows.end);
            let mut r = first;
            while r < end {
                let i = r - first;
                let pos = positions[r];
                let lo = lo_of(pos);
                let at = r * qd + t.head * hd;
                if let Some(cap) = cap {
                    attention::attend_row_capped(
                        &q[at..at + hd],
                        cache.keys_tiled(l, g),
                        lo,
                        cache.values(l, g, lo..pos + 1),
                        scale,
                        cap,
                        &mut t.scores,
                        &mut t.out[i * hd..(i + 1) * hd],
                    );
                    r += 1;
                    continue;
                }
                // Four rows at once when the next three attend from the same
                // first position to at least as far as the one before (prefill
                // rows of one sequence): the same bits per row, shared loads.
                if r + 3 < end
                    && (1..4).all(|k| {
                        lo_of(positions[r + k]) == lo && positions[r + k] >= positions[r + k - 1]
                    })
                {
                    let p: [usize; 4] = std::array::from_fn(|k| positions[r + k]);
                    let qs: [&[f32]; 4] =
                        std::array::from_fn(|k| &q[at + k * qd..at + k * qd + hd]);
                    let (o0, rest) = t.out[i * hd..(i + 4) * hd].split_at_mut(hd);
                    let (o1, rest) = rest.split_at_mut(hd);
                    let (o2, o3) = rest.split_at_mut(hd);
                    attention::attend_four_rows(
                        qs,
                        cache.keys_tiled(l, g),
                        lo,
                        cache.values(l, g, lo..p[3] + 1),
                        p.map(|pos| pos + 1 - lo),
                        scale,
                        &mut t.scores,
                        [o0, o1, o2, o3],
                    );
                    r += 4;
                    continue;
                }
                // Two rows at once when the next row attends from the same
                // first position to at least as far (prefill rows of one
                // sequence): the same bits per row, shared loads.
                if r + 1 < end && lo_of(positions[r + 1]) == lo && positions[r + 1] >= pos {
                    let pos_b = positions[r + 1];
                    let at_b = at + qd;
                    let (out_a, out_b) = t.out[i * hd..(i + 2) * hd].split_at_mut(hd);
                    attention::attend_two_rows(
                        &q[at..at + hd],
                        &q[at_b..at_b + hd],
                        cache.keys_tiled(l, g),
                        lo,
                        cache.values(l, g, lo..pos_b + 1),
                        pos + 1 - lo,
                        scale,
                        &mut t.scores,
                        out_a,
                        out_b,
                    );
                    r += 2;
                    continue;
                }
                attention::attend_row(
                    &q[at..at + hd],
                    cache.keys_tiled(l, g),
                    lo,
                    cache.values(l, g, lo..pos + 1),
                    scale,
                    &mut t.scores,
                    &mut t.out[i * hd..(i + 1) * hd],
                );
                r += 1;
            }
        };
        let span = tasks
            .iter()
            .flat_map(|t| t.rows.clone())
            .map(|r| positions[r] + 1)
            .max()
            .unwrap_or(0);
        let work = n_tasks
            .saturating_mul(tasks.first().map_or(0, |t| t.rows.len()))
            .saturating_mul(span)
            .saturating_mul(hd);
        let team = match n_tasks > 1 {
            true => team_for(ctx, work),
            false => None,
        };
        match team {
            Some(team) => team.parallel_chunks_mut(tasks, run),
            None => tasks.iter_mut().for_each(run),
        }
        for t in tasks.iter() {
            for (i, r) in t.rows.clone().enumerate() {
                let at = r * qd + t.head * hd;
                attn[at..at + hd].copy_from_slice(&t.out[i * hd..(i + 1) * hd]);
            }
        }
    }

    /// Layer `l`'s output projection (and bias), residual add, post-attention
    /// norm, SwiGLU MLP and residual add, for the first `rows` rows.
    fn attention_output_and_mlp(
        &self,
        ctx: &ExecContext,
        l: usize,
        rows: usize,
        s: &mut Scratch,
    ) -> Result<(), LlmError> {
        let c = &self.config;
        let layer = &self.layers[l];
        let (hid, inter) = (c.hidden_size, c.intermediate_size);
        let qd = c.num_attention_heads * c.head_dim;
        let (x, o) = (&mut s.x[..rows * hid], &mut s.o[..rows * hid]);
        layer.o.matmul(ctx, &s.attn[..rows * qd], rows, o)?;
        if let Some(b) = &layer.o_bias {
            kernels::add_bias(o, b);
        }
        if let Some(w) = &layer.attn_out_norm {
            kernels::rms_norm_heads(o, w, c.rms_norm_eps);
        }
        kernels::add_into(x, o);
        let xn = &mut s.xn[..rows * hid];
        for (xr, xnr) in x.chunks_exact(hid).zip(xn.chunks_exact_mut(hid)) {
            kernels::rms_norm(xr, &layer.post_norm, c.rms_norm_eps, xnr);
        }
        let (gate_up, down) = match &layer.ffn {
            Ffn::Dense { gate_up, down } => (gate_up, down),
            Ffn::Moe(m) => {
                m.forward(ctx, xn, rows, o, &mut s.moe)?;
                kernels::add_into(x, o);
                return Ok(());
            }
        };
        let (gate, up) = (&mut s.gate[..rows * inter], &mut s.up[..rows * inter]);
        match gate_up {
            GateUp::Split { gate: g, up: u } => {
                g.matmul(ctx, xn, rows, gate)?;
                u.matmul(ctx, xn, rows, up)?;
            }
            GateUp::Fused(w) => {
                let fused = &mut s.fused[..rows * 2 * inter];
                w.matmul(ctx, xn, rows, fused)?;
                for (r, row) in fused.chunks_exact(2 * inter).enumerate() {
                    gate[r * inter..(r + 1) * inter].copy_from_slice(&row[..inter]);
                    up[r * inter..(r + 1) * inter].copy_from_slice(&row[inter..]);
                }
            }
        }
        // Element-wise: any split gives the same bits. An exponential costs
        // about as much as 16 additions.
        let act = match self.spec.activation {
            Activation::Silu => kernels::swiglu,
            Activation::GeluTanh => kernels::geglu,
        };
        match team_for(ctx, gate.len() * 16) {
            Some(team) => {
                team.parallel_for_slices(gate, PARALLEL_THRESHOLD / 16, |r, g| act(g, &up[r]))
            }
            None => act(gate, up),
        }
        down.matmul(ctx, gate, rows, o)?;
        if let Some(w) = &layer.mlp_out_norm {
            kernels::rms_norm_heads(o, w, c.rms_norm_eps);
        }
        kernels::add_into(x, o);
        Ok(())
    }

    /// The final norm of the rows `x` (into `xn`, same length) and their logits
    /// (`out`, `[rows, vocab]`).
    fn logits(
        &self,
        ctx: &ExecContext,
        x: &[f32],
        xn: &mut [f32],
        out: &mut [f32],
    ) -> Result<(), LlmError> {
        let hid = self.config.hidden_size;
        for (xr, xnr) in x.chunks_exact(hid).zip(xn.chunks_exact_mut(hid)) {
            kernels::rms_norm(xr, &self.final_norm, self.config.rms_norm_eps, xnr);
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        head.matmul(ctx, xn, x.len() / hid, out)?;
        if let Some(cap) = self.config.params.final_logit_softcapping {
            kernels::softcap(out, cap);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::balanced_row_blocks;

    /// The pieces cover every row once, in order, none empty, at most
    /// `blocks` of them, and none holds more than an equal share of the work
    /// plus one row's.
    #[test]
    fn balanced_row_blocks_cover_the_rows_with_equal_work() {
        for (start, rows, blocks) in [
            (0usize, 512usize, 2usize),
            (0, 512, 18),
            (512, 512, 4),
            (100, 7, 3),
            (0, 1, 4),
            (0, 3, 8),
            (3, 64, 64),
            (0, 0, 2),
        ] {
            let pieces: Vec<_> = balanced_row_blocks(start, rows, blocks).collect();
            assert!(
                pieces.len() <= blocks.max(1),
                "{start} {rows} {blocks}: {pieces:?}"
            );
            let mut next = 0;
            for p in &pieces {
                assert_eq!(p.start, next, "{start} {rows} {blocks}: {pieces:?}");
                assert!(p.end > p.start, "{start} {rows} {blocks}: {pieces:?}");
                next = p.end;
            }
            assert_eq!(next, rows, "{start} {rows} {blocks}: {pieces:?}");
            let work = |r: &std::ops::Range<usize>| r.clone().map(|k| start + k + 1).sum::<usize>();
            let total: usize = work(&(0..rows));
            for p in &pieces {
                assert!(
                    work(p) <= total / blocks.min(rows.max(1)) + start + rows + 1,
                    "{start} {rows} {blocks}: {p:?} holds too much work"
                );
            }
            if rows >= 2 * blocks && blocks > 1 {
                assert_eq!(pieces.len(), blocks, "{start} {rows} {blocks}: {pieces:?}");
                // The first piece (cheapest rows) is the longest.
                assert!(pieces[0].len() >= pieces[blocks - 1].len());
            }
        }
    }
}
