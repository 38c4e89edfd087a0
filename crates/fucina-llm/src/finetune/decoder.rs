//! The trainable decoder: the Llama-family forward of [`crate::model`] built
//! from autograd ops, over frozen base weights, with LoRA adapters.
//!
//! # The forward
//!
//! For a batch of `B` rows of `T` tokens (right-padded; every row starts at
//! position 0, or, packed, each of its sequences does: see
//! [`TrainableDecoder::hidden_packed`]): embedding rows (frozen, no gradient), then per layer RMSNorm
//! (`rms_norm`), the q, k, v projections (each `base(x) + bias + adapter(x)`),
//! per-head q/k RMSNorm where the architecture has it (Qwen3), RoPE in the
//! rotate-half convention with the inference decoder's own cosine and sine
//! tables (`x1 · cos − x2 · sin`, `x2 · cos + x1 · sin`: `narrow`, `mul`,
//! `sub`, `add`, `concat`), grouped-query causal attention (the query heads
//! sharing a key/value head are stacked along the rows, so one batched
//! `matmul` serves a group without repeating k and v; scores scaled by the
//! inference decoder's `head_dim^-0.5`, a constant `0 / −inf` mask of the
//! causal and sliding-window rule added, `softmax`), `o_proj`, the residual,
//! RMSNorm, SwiGLU (`silu(gate) · up`, `down_proj`), the residual, the final
//! RMSNorm and the output projection (the embedding matrix when tied).
//!
//! # Frozen base weights
//!
//! The base projections are constants: backward computes the gradient of
//! their input only, never of the weight. An f32 matrix is copied once at load
//! into a runtime tensor and multiplied by the runtime's `linear`. A bf16 or
//! f16 matrix stays in its format (memory-mapped, as inference reads it):
//! each product widens it to f32 in blocks of rows (at most 8 MiB of f32 at a
//! time: a projection whole, the output projection in blocks of 3640 rows of
//! the vocabulary) into pooled buffers and runs the runtime's f32 GEMM, the
//! forward's `x · Wᵀ` by `linear`, the backward's `dx = g · W` by `matmul`
//! over the same rows (no transposed copy: the base costs its file size). The
//! products are exact (a bf16 or f16 value is an f32 one), and each output
//! is the GEMM's fused multiply-add chain, whole over the depth forward and
//! per block of rows, added in order, backward: the blocks depend on the
//! matrix's shape only, so the bits depend on neither the thread count nor
//! the other rows of a batch. A block-quantized matrix (a base loaded with
//! [`WeightStore::convert`]) goes forward through the inference kernel
//! ([`Weight::matmul`]) and is widened the same way for its backward.
//!
//! # Full fine-tuning
//!
//! [`TrainableDecoder::load_full`] makes every weight of an f32 model a
//! trained parameter instead (a matrix multiplied by the runtime's `linear`,
//! the embedding rows gathered by `index_select`, the norms and biases read
//! through their parameter handles), with no adapter; any other format is
//! refused by name.
//!
//! # Differences from the inference decoder
//!
//! The same weights, RoPE tables and scale; the sums run in the runtime's
//! orders (its f32 GEMM over the widened base, `rms_norm`, `softmax`)
//! rather than the inference kernels', so the logits agree within rounding (`tests/finetune.rs` bounds
//! the difference) rather than bit for bit.

use std::sync::Arc;

use fucina::exec::WeightFormat;
use fucina::nn::Parameter;
use fucina::{ExecContext, RawTensor, Tensor, custom_vjp, custom_vjp_unsaved};

use super::error::{FinetuneError, invalid};
use super::lora::{LoraAdapter, LoraConfig, Target, adapter_seed};
use crate::arch::{Activation, NormStyle};
use crate::config::ModelConfig;
use crate::weights::{Weight, WeightStore};

/// A frozen base matrix `[out, in]`.
#[derive(Clone, Debug)]
enum Frozen {
    /// An f32 matrix, as a runtime tensor.
    Dense(RawTensor),
    /// Another format, read in place (a bf16 or f16 matrix widened to f32 per
    /// block of rows as each product reads it); shared, so that the op of
    /// each step holds it without a copy or an allocation.
    File(Arc<Weight>),
    /// An f32 matrix trained itself (full fine-tuning).
    Trained(Parameter),
    /// A bf16 matrix on bf16 products with the AMX rule
    /// ([`TrainableDecoder::use_bf16_products`]).
    Bf16(Arc<Bf16Base>),
}

/// A frozen bf16 matrix `W` (`[out, in]`) for bf16 products with the AMX
/// rule ([`ExecContext::bf16_matmul_amx_rule`]): `W`'s tiles (its
/// [`Weight::matmul`] and [`Weight::row_to_f32`] read them; the file's
/// pages are released) for the forward's `x · Wᵀ`, and the tiles of `Wᵀ`
/// for the backward's `g · W`.
#[derive(Debug)]
struct Bf16Base {
    w: Weight,
    t: fucina::exec::PackedBf16Matrix,
}

impl Bf16Base {
    /// Packs the bf16 matrix `w` (named `name` in errors) both ways.
    fn new(name: &str, w: &Weight) -> Result<Bf16Base, FinetuneError> {
        let not_bf16 = || {
            invalid(
                "TrainableDecoder::use_bf16_products",
                format!(
                    "{name} is {:?}, shape {:?}: bf16 products need a bf16 base matrix",
                    w.tensor_format(),
                    w.shape()
                ),
            )
        };
        if w.quant_format().is_some() || w.format() != WeightFormat::BF16 || w.shape().len() != 2 {
            return Err(not_bf16());
        }
        let (rows, cols) = (w.shape()[0], w.shape()[1]);
        // Wᵀ's bytes, `[cols, rows]`, in blocks of 64 × 64 elements (a
        // temporary: the tiles replace it).
        let src = w.bytes();
        let mut tb = vec![0u8; src.len()];
        const B: usize = 64;
        for r0 in (0..rows).step_by(B) {
            for c0 in (0..cols).step_by(B) {
                for r in r0..(r0 + B).min(rows) {
                    for c in c0..(c0 + B).min(cols) {
                        let (s, d) = (2 * (r * cols + c), 2 * (c * rows + r));
                        tb[d..d + 2].copy_from_slice(&src[s..s + 2]);
                    }
                }
            }
        }
        let wt = fucina::exec::WeightMatrix::new(WeightFormat::BF16, cols, rows, &tb)?;
        let t = fucina::exec::PackedBf16Matrix::new(&wt)?;
        drop(tb);
        let mut w = w.clone();
        w.pack_bf16_products()?;
        Ok(Bf16Base { w, t })
    }
}

/// A vector of the model (a norm's weight, a bias): frozen, or trained
/// (full fine-tuning). A trained one is read through its parameter handle
/// at every forward (the optimizer's updates are copy-on-write).
#[derive(Clone, Debug)]
enum Vector {
    Frozen(Tensor),
    Trained(Parameter),
}

impl Vector {
    fn get(&self) -> Tensor {
        match self {
            Vector::Frozen(t) => t.clone(),
            Vector::Trained(p) => p.tensor(),
        }
    }
}

impl Frozen {
    /// The frozen form of `w`: an f32 matrix copied into a runtime tensor, a
    /// bf16 or f16 matrix kept in its format (widened per block of rows as
    /// the products read it), a quantized one as it is.
    fn new(ctx: &ExecContext, w: &Weight) -> Result<Frozen, FinetuneError> {
        if w.quant_format().is_none() && w.format() == WeightFormat::F32 {
            return Ok(Frozen::Dense(ctx.from_slice(w.shape(), &w.to_f32_vec())?));
        }
        Ok(Frozen::File(Arc::new(w.clone())))
    }

    /// The trained form of the f32 matrix `name` (full fine-tuning).
    fn trained(ctx: &ExecContext, name: &str, w: &Weight) -> Result<Frozen, FinetuneError> {
        let t = Tensor::from_slice(ctx, w.shape(), &f32_values(name, w)?)?;
        Ok(Frozen::Trained(Parameter::new(t)))
    }

    fn shape(&self) -> [usize; 2] {
        match self {
            Frozen::Dense(t) => [t.shape()[0], t.shape()[1]],
            Frozen::File(w) => [w.shape()[0], w.shape()[1]],
            Frozen::Trained(p) => [p.shape()[0], p.shape()[1]],
            Frozen::Bf16(b) => [b.w.shape()[0], b.w.shape()[1]],
        }
    }

    /// `x · Wᵀ` for `x` `[n, in]`, differentiable in `x` only.
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor, FinetuneError> {
        match self {
            Frozen::Dense(w) => Ok(x.linear(ctx, &Tensor::constant(w.clone()), None)?),
            Frozen::File(w) => frozen_file_linear(ctx, w, x),
            Frozen::Trained(p) => Ok(x.linear(ctx, &p.tensor(), None)?),
            Frozen::Bf16(b) => frozen_bf16_linear(ctx, b, x),
        }
    }

    /// Rows `ids` of the matrix (an embedding lookup), a constant `[n, in]`.
    fn rows(&self, ctx: &ExecContext, ids: &[u32]) -> Result<Tensor, FinetuneError> {
        let [rows, cols] = self.shape();
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= rows) {
            return Err(invalid(
                "TrainableDecoder",
                format!("token id {bad} is past the vocabulary ({rows} ids)"),
            ));
        }
        if let Frozen::Trained(p) = self {
            let idx: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
            let idx = ctx.from_slice_typed::<i64>(&[ids.len()], &idx)?;
            return Ok(p.tensor().index_select(ctx, 0, &idx)?);
        }
        let mut out = ctx.empty(&[ids.len(), cols])?;
        let data = out.data_mut()?;
        match self {
            Frozen::Dense(w) => {
                let src = w.data()?;
                for (o, &i) in data.chunks_exact_mut(cols).zip(ids) {
                    o.copy_from_slice(&src[i as usize * cols..(i as usize + 1) * cols]);
                }
            }
            Frozen::File(w) => {
                for (o, &i) in data.chunks_exact_mut(cols).zip(ids) {
                    w.row_to_f32(i as usize, o)?;
                }
            }
            Frozen::Bf16(b) => {
                for (o, &i) in data.chunks_exact_mut(cols).zip(ids) {
                    b.w.row_to_f32(i as usize, o)?;
                }
            }
            Frozen::Trained(_) => unreachable!("returned above"),
        }
        Ok(Tensor::constant(out))
    }
}

/// The most f32 values a widened block of a frozen matrix holds (8 MiB): a
/// projection of the bench shapes widens whole, the output projection over
/// the vocabulary in blocks of rows. A function of the matrix's columns only,
/// so the blocks (and the bits) do not depend on the rows of a call.
const WIDE_BLOCK_FLOATS: usize = 1 << 21;

/// The rows of `w` per widened block.
fn wide_block_rows(w: &Weight) -> usize {
    (WIDE_BLOCK_FLOATS / w.shape()[1].max(1)).max(1)
}

/// Rows `r0..r0 + rows` of `w` widened to f32 into a pooled `[rows, cols]`
/// tensor.
fn widened_rows(
    ctx: &ExecContext,
    w: &Weight,
    r0: usize,
    rows: usize,
) -> Result<RawTensor, fucina::AutogradError> {
    let cols = w.shape()[1];
    let mut t = ctx.empty(&[rows, cols])?;
    for (i, row) in t.data_mut()?.chunks_exact_mut(cols).enumerate() {
        w.row_to_f32(r0 + i, row).map_err(external)?;
    }
    Ok(t)
}

/// `x · Wᵀ` (`x` `[n, in]` contiguous, `W` `[out, in]`) by the runtime's
/// `linear` over blocks of `W`'s rows widened to f32: each output is the
/// f32 GEMM's fused multiply-add chain over `in` whole, so a row's bits do
/// not depend on the other rows, the blocks or the team.
fn widened_forward(
    ctx: &ExecContext,
    w: &Weight,
    x: &RawTensor,
) -> Result<RawTensor, fucina::AutogradError> {
    widened_forward_in(ctx, w, x, wide_block_rows(w))
}

/// [`widened_forward`] in blocks of `block` rows.
fn widened_forward_in(
    ctx: &ExecContext,
    w: &Weight,
    x: &RawTensor,
    block: usize,
) -> Result<RawTensor, fucina::AutogradError> {
    blocked_forward(ctx, w.shape()[0], block, x, |r0, rows| {
        widened_rows(ctx, w, r0, rows)
    })
}

/// `x · Wᵀ` by the runtime's `linear` over the blocks of `block` rows of an
/// `[out_f, in]` matrix that `wblock(r0, rows)` gives widened to f32 (one
/// `linear` when one block holds every row).
fn blocked_forward(
    ctx: &ExecContext,
    out_f: usize,
    block: usize,
    x: &RawTensor,
    mut wblock: impl FnMut(usize, usize) -> Result<RawTensor, fucina::AutogradError>,
) -> Result<RawTensor, fucina::AutogradError> {
    let n = x.shape()[0];
    if block >= out_f {
        return Ok(ctx.linear(x, &wblock(0, out_f)?, None)?);
    }
    let mut y = ctx.empty(&[n, out_f])?;
    let yd = y.data_mut()?;
    for r0 in (0..out_f).step_by(block) {
        let rows = block.min(out_f - r0);
        let part = ctx.linear(x, &wblock(r0, rows)?, None)?;
        for (dst, src) in yd
            .chunks_exact_mut(out_f)
            .zip(part.data()?.chunks_exact(rows))
        {
            dst[r0..r0 + rows].copy_from_slice(src);
        }
    }
    Ok(y)
}

/// `g · W` (`g` `[n, out]` contiguous, `W` `[out, in]`) by the runtime's
/// `matmul` over blocks of `W`'s rows widened to f32: the depth `out` is
/// summed per block (one fused multiply-add chain each) and the blocks'
/// products added in order; the blocks depend on `W`'s shape only.
fn widened_backward(
    ctx: &ExecContext,
    w: &Weight,
    g: &RawTensor,
) -> Result<RawTensor, fucina::AutogradError> {
    widened_backward_in(ctx, w, g, wide_block_rows(w))
}

/// [`widened_backward`] in blocks of `block` rows.
fn widened_backward_in(
    ctx: &ExecContext,
    w: &Weight,
    g: &RawTensor,
    block: usize,
) -> Result<RawTensor, fucina::AutogradError> {
    blocked_backward(ctx, w.shape()[0], block, g, |r0, rows| {
        widened_rows(ctx, w, r0, rows)
    })
}

/// `g · W` by the runtime's `matmul` over the blocks of `block` rows of an
/// `[out_f, in]` matrix that `wblock(r0, rows)` gives widened to f32: the
/// depth summed per block, the blocks' products added in order.
fn blocked_backward(
    ctx: &ExecContext,
    out_f: usize,
    block: usize,
    g: &RawTensor,
    mut wblock: impl FnMut(usize, usize) -> Result<RawTensor, fucina::AutogradError>,
) -> Result<RawTensor, fucina::AutogradError> {
    if block >= out_f {
        return Ok(ctx.matmul(g, &wblock(0, out_f)?)?);
    }
    let mut dx: Option<RawTensor> = None;
    for r0 in (0..out_f).step_by(block) {
        let rows = block.min(out_f - r0);
        let part = ctx.matmul(&g.narrow(1, r0, rows)?, &wblock(r0, rows)?)?;
        dx = Some(match dx {
            None => part,
            Some(d) => ctx.add(&d, &part)?,
        });
    }
    Ok(dx.expect("a matrix with rows has a block"))
}

/// `x · Wᵀ` with `W` read in its file format. A bf16 or f16 matrix is
/// widened to f32 per block of rows and multiplied by the runtime's GEMM
/// ([`widened_forward`], [`widened_backward`]); a quantized one goes
/// through the inference kernel forward ([`Weight::matmul`]) and is widened
/// the same way for the backward's `g · W`.
///
/// One op of `x` that keeps nothing ([`custom_vjp_unsaved`]): its backward
/// needs only the gradient and the weight its closure holds, so the graph
/// keeps neither the product `[n, out]` nor `x` (which stays alive only while
/// an adapter or another op holds it).
fn frozen_file_linear(
    ctx: &ExecContext,
    w: &Arc<Weight>,
    x: &Tensor,
) -> Result<Tensor, FinetuneError> {
    let out_f = w.shape()[0];
    let n = x.shape()[0];
    let fw = Arc::clone(w);
    let forward = move |ctx: &ExecContext, xs: &[RawTensor]| {
        let xc = ctx.contiguous(&xs[0])?;
        if fw.quant_format().is_none() {
            return widened_forward(ctx, &fw, &xc);
        }
        let mut y = ctx.empty(&[n, out_f])?;
        fw.matmul(ctx, xc.data()?, n, y.data_mut()?)
            .map_err(external)?;
        Ok(y)
    };
    let bw = Arc::clone(w);
    frozen_op(ctx, "frozen_linear", x, forward, move |ctx, g| {
        widened_backward(ctx, &bw, g)
    })
}

/// The op of a frozen product `x · Wᵀ`: `forward` alone (a constant) where no
/// gradient is wanted, else one op of `x` that keeps nothing
/// ([`custom_vjp_unsaved`]) whose backward is `grad_x` of the contiguous
/// output gradient.
fn frozen_op(
    ctx: &ExecContext,
    name: &'static str,
    x: &Tensor,
    forward: impl FnOnce(&ExecContext, &[RawTensor]) -> Result<RawTensor, fucina::AutogradError>,
    grad_x: impl Fn(&ExecContext, &RawTensor) -> Result<RawTensor, fucina::AutogradError>
    + Send
    + Sync
    + 'static,
) -> Result<Tensor, FinetuneError> {
    if !x.requires_grad() || !fucina::is_grad_enabled() {
        return Ok(Tensor::constant(forward(ctx, &[x.raw().clone()])?));
    }
    Ok(custom_vjp_unsaved(
        ctx,
        name,
        &[x],
        forward,
        move |ctx, a| {
            if !a.needs[0] {
                return Ok([None]);
            }
            let g = ctx.contiguous(a.grad)?;
            Ok([Some(grad_x(ctx, &g)?)])
        },
    )?)
}

/// `x · Wᵀ` for a bf16 `W` with bf16 products on the AMX rule
/// ([`ExecContext::bf16_matmul_amx_rule`]: `x` rounded to bf16, the depth
/// summed in blocks of 32 with an even and an odd accumulator): forward over
/// `W`'s tiles, backward `g · W` over `Wᵀ`'s (the gradient rounded to bf16
/// likewise). Every row's bits are a function of that row alone, whatever
/// the thread count, the vector level or the other rows. One op of `x` that
/// keeps nothing, as [`frozen_file_linear`].
fn frozen_bf16_linear(
    ctx: &ExecContext,
    b: &Arc<Bf16Base>,
    x: &Tensor,
) -> Result<Tensor, FinetuneError> {
    let (out_f, in_f) = (b.w.shape()[0], b.w.shape()[1]);
    let n = x.shape()[0];
    let fb = Arc::clone(b);
    let forward = move |ctx: &ExecContext, xs: &[RawTensor]| {
        let xc = ctx.contiguous(&xs[0])?;
        let mut y = ctx.empty(&[n, out_f])?;
        fb.w.matmul(ctx, xc.data()?, n, y.data_mut()?)
            .map_err(external)?;
        Ok(y)
    };
    let bb = Arc::clone(b);
    frozen_op(ctx, "frozen_bf16_linear", x, forward, move |ctx, g| {
        let mut dx = ctx.empty(&[n, in_f])?;
        ctx.bf16_matmul_amx_rule(g.data()?, n, &bb.t, dx.data_mut()?)?;
        Ok(dx)
    })
}

/// Rows per block of the fused output projection and loss
/// ([`TrainableDecoder::loss`]): the `[rows, vocab]` logits and their
/// gradient exist one block at a time (48 MiB each for a vocabulary of
/// 49152).
const HEAD_BLOCK_ROWS: usize = 256;

/// The frozen output projection of the fused loss, in the form its products
/// read: the matrix widened to f32 whole (a bf16 or f16 base: read in the
/// blocks of [`widened_forward`] and [`widened_backward`], widened once for
/// the whole loss instead of once per product), or the AMX-rule tiles.
enum HeadProducts {
    Widened { w: Arc<Weight>, wide: RawTensor },
    Bf16(Arc<Bf16Base>),
}

/// The fused loss's products of `head`, or `None` where the loss takes the
/// separate ops (an f32 or quantized base, a trained matrix).
fn head_products(
    ctx: &ExecContext,
    head: &Frozen,
) -> Result<Option<HeadProducts>, fucina::AutogradError> {
    Ok(match head {
        Frozen::File(w) if w.quant_format().is_none() => Some(HeadProducts::Widened {
            w: Arc::clone(w),
            wide: widened_rows(ctx, w, 0, w.shape()[0])?,
        }),
        Frozen::Bf16(b) => Some(HeadProducts::Bf16(Arc::clone(b))),
        _ => None,
    })
}

impl HeadProducts {
    /// `x · Wᵀ` for `x` `[rows, in]` contiguous: the bits of the frozen op's
    /// forward, row for row.
    fn forward(
        &self,
        ctx: &ExecContext,
        x: &RawTensor,
    ) -> Result<RawTensor, fucina::AutogradError> {
        match self {
            HeadProducts::Widened { w, wide } => {
                blocked_forward(ctx, w.shape()[0], wide_block_rows(w), x, |r0, rows| {
                    Ok(wide.narrow(0, r0, rows)?)
                })
            }
            HeadProducts::Bf16(b) => {
                let n = x.shape()[0];
                let mut y = ctx.empty(&[n, b.w.shape()[0]])?;
                b.w.matmul(ctx, x.data()?, n, y.data_mut()?)
                    .map_err(external)?;
                Ok(y)
            }
        }
    }

    /// `g · W` for `g` `[rows, out]` contiguous: the bits of the frozen op's
    /// backward, row for row.
    fn backward(
        &self,
        ctx: &ExecContext,
        g: &RawTensor,
    ) -> Result<RawTensor, fucina::AutogradError> {
        match self {
            HeadProducts::Widened { w, wide } => {
                blocked_backward(ctx, w.shape()[0], wide_block_rows(w), g, |r0, rows| {
                    Ok(wide.narrow(0, r0, rows)?)
                })
            }
            HeadProducts::Bf16(b) => {
                let n = g.shape()[0];
                let mut dx = ctx.empty(&[n, b.w.shape()[1]])?;
                ctx.bf16_matmul_amx_rule(g.data()?, n, &b.t, dx.data_mut()?)?;
                Ok(dx)
            }
        }
    }
}

/// The fused output projection and mean cross-entropy of `h` (`[n, in]`
/// contiguous) against `labels` (`[n]`), `block` rows at a time: the loss
/// (`[1]`), and with `grad` the gradient of `h` for that loss gradient
/// (`[n, in]`). Each block's logits are the frozen op's, row for row; the
/// per-row terms are `cross_entropy`'s and the loss their fixed-order mean
/// over all `n` rows (`mean_all`, the reduction `cross_entropy` runs); each
/// block's logit gradient is `cross_entropy_backward`'s rows (`s = grad /
/// n`) and its product the frozen op's backward, row for row: the bits of
/// `project` then `cross_entropy`, without the `[n, vocab]` logits.
fn fused_head_loss(
    ctx: &ExecContext,
    head: &HeadProducts,
    h: &RawTensor,
    labels: &fucina::RawTensor<i64>,
    grad: Option<f32>,
    block: usize,
) -> Result<(RawTensor, Option<RawTensor>), fucina::AutogradError> {
    let (n, in_f) = (h.shape()[0], h.shape()[1]);
    let mut terms = ctx.empty(&[n])?;
    let mut dh = match grad {
        Some(_) => Some(ctx.empty(&[n, in_f])?),
        None => None,
    };
    let s = grad.map(|g| g / n as f32);
    for r0 in (0..n).step_by(block.max(1)) {
        let rows = block.max(1).min(n - r0);
        let x = ctx.contiguous(&h.narrow(0, r0, rows)?)?;
        let lab = labels.narrow(0, r0, rows)?;
        let logits = head.forward(ctx, &x)?;
        let t = ctx.cross_entropy_per_row(&logits, &lab)?;
        terms.data_mut()?[r0..r0 + rows].copy_from_slice(t.data()?);
        if let (Some(s), Some(dh)) = (s, dh.as_mut()) {
            let g = ctx.cross_entropy_backward_scaled(&logits, &lab, s)?;
            drop(logits);
            let d = head.backward(ctx, &g)?;
            dh.data_mut()?[r0 * in_f..(r0 + rows) * in_f].copy_from_slice(d.data()?);
        }
    }
    Ok((ctx.mean_all(&terms)?, dh))
}

/// An error of the loader's types inside an op's closure.
fn external(e: crate::error::LlmError) -> fucina::AutogradError {
    fucina::AutogradError::External(fucina::autograd::ExternalError::new(e))
}

/// A projection: the base, its bias, and an adapter.
#[derive(Clone, Debug)]
struct Proj {
    base: Frozen,
    bias: Option<Vector>,
    lora: Option<LoraAdapter>,
}

impl Proj {
    fn forward(
        &self,
        ctx: &ExecContext,
        x: &Tensor,
        dropout_seed: Option<u64>,
    ) -> Result<Tensor, FinetuneError> {
        let mut y = self.base.forward(ctx, x)?;
        if let Some(b) = &self.bias {
            y = y.add(ctx, &b.get())?;
        }
        if let Some(l) = &self.lora {
            y = y.add(ctx, &l.forward(ctx, x, dropout_seed)?)?;
        }
        Ok(y)
    }
}

impl Layer {
    /// The layer's trained tensors: its adapters' matrices, and under full
    /// fine-tuning its weights, biases and norms.
    fn trained(&self) -> Vec<Tensor> {
        // At most the two norms, the q/k norms, seven biases, seven weights
        // and seven adapters' two matrices: one allocation.
        let mut out = Vec::with_capacity(4 + 7 * 4);
        let vectors = [&self.input_norm, &self.post_norm]
            .into_iter()
            .chain(self.q_norm.as_ref())
            .chain(self.k_norm.as_ref())
            .chain(self.projs.iter().filter_map(|p| p.bias.as_ref()));
        for v in vectors {
            if let Vector::Trained(p) = v {
                out.push(p.tensor());
            }
        }
        for p in &self.projs {
            if let Frozen::Trained(w) = &p.base {
                out.push(w.tensor());
            }
            if let Some(a) = &p.lora {
                out.extend([a.a.tensor(), a.b.tensor()]);
            }
        }
        out
    }
}

/// One decoder layer.
#[derive(Clone, Debug)]
struct Layer {
    input_norm: Vector,
    post_norm: Vector,
    q_norm: Option<Vector>,
    k_norm: Option<Vector>,
    window: Option<usize>,
    /// q, k, v, o, gate, up, down (the order of [`Target::ALL`]).
    projs: [Proj; 7],
}

/// The Llama-family decoder as a differentiable module with LoRA adapters
/// (see the [module documentation](self)).
#[derive(Debug)]
pub struct TrainableDecoder {
    config: ModelConfig,
    lora: LoraConfig,
    embed: Frozen,
    layers: Vec<Layer>,
    final_norm: Vector,
    /// Full fine-tuning: every weight, by its Hugging Face name, in the
    /// order of the file's names (empty with adapters).
    full: Vec<(String, Parameter)>,
    /// `None` when tied to the embeddings.
    lm_head: Option<Frozen>,
    inv_freq: Vec<f32>,
    scale: f32,
    /// Gradient checkpointing per layer.
    checkpointing: bool,
}

/// Refuses an architecture the trainable decoder does not build.
fn check_supported(c: &ModelConfig) -> Result<(), FinetuneError> {
    let spec = c.architecture.spec();
    let p = &c.params;
    let unsupported = if spec.activation != Activation::Silu || spec.norm != NormStyle::Rms {
        Some("a GeGLU MLP or `1 + w` norms")
    } else if spec.sandwich_norms || spec.embed_scale {
        Some("sandwich norms or an embedding scale")
    } else if spec.fused_qkv || spec.fused_gate_up {
        Some("fused projections")
    } else if p.moe.is_some() {
        Some("a mixture of experts")
    } else if p.longrope.is_some() || p.local_rope_theta.is_some() || p.rotary_dim.is_some() {
        Some("LongRoPE, per-layer RoPE bases or a partial rotary embedding")
    } else if p.attn_logit_softcapping.is_some()
        || p.final_logit_softcapping.is_some()
        || p.query_pre_attn_scalar.is_some()
    {
        Some("soft-capping or a query scale")
    } else {
        None
    };
    match unsupported {
        Some(what) => Err(invalid(
            "TrainableDecoder::from_parts",
            format!(
                "{}: {what} is not supported by the trainable decoder (Llama, Qwen2, Mistral, Qwen3)",
                spec.hf_class
            ),
        )),
        None => Ok(()),
    }
}

/// The f32 vector `name` of length `len`, trained or frozen.
fn vector(
    ctx: &ExecContext,
    store: &WeightStore,
    name: &str,
    len: usize,
    train: bool,
) -> Result<Vector, FinetuneError> {
    let w = matrix_or_vector(store, name, &[len])?;
    Ok(match train {
        true => Vector::Trained(Parameter::new(Tensor::from_slice(
            ctx,
            &[len],
            &f32_values(name, w)?,
        )?)),
        false => Vector::Frozen(Tensor::from_slice(ctx, &[len], &w.to_f32_vec())?),
    })
}

/// The values of the f32 tensor `name`; full fine-tuning refuses any other
/// format by name.
fn f32_values(name: &str, w: &Weight) -> Result<Vec<f32>, FinetuneError> {
    if w.quant_format().is_some() || w.format() != WeightFormat::F32 {
        return Err(invalid(
            "TrainableDecoder::load_full",
            format!(
                "{name} is {:?}: full fine-tuning trains f32 models only (use LoRA)",
                w.format()
            ),
        ));
    }
    Ok(w.to_f32_vec())
}

/// The tensor `name`, checked to have `shape`.
fn matrix_or_vector<'a>(
    store: &'a WeightStore,
    name: &str,
    shape: &[usize],
) -> Result<&'a Weight, FinetuneError> {
    let w = store.get(name)?;
    if w.shape() != shape {
        return Err(crate::error::LlmError::BadTensor {
            name: name.to_string(),
            reason: format!("shape {:?}, expected {shape:?} from the config", w.shape()),
        }
        .into());
    }
    Ok(w)
}

impl TrainableDecoder {
    /// Loads the model in `dir` (`config.json` and its safetensors weights)
    /// with fresh adapters of `lora`.
    ///
    /// # Errors
    /// Those of [`ModelConfig::from_file`], [`WeightStore::open`] and
    /// [`from_parts`](TrainableDecoder::from_parts).
    pub fn load(
        ctx: &ExecContext,
        dir: impl AsRef<std::path::Path>,
        lora: &LoraConfig,
    ) -> Result<TrainableDecoder, FinetuneError> {
        let dir = dir.as_ref();
        let config = ModelConfig::from_file(dir.join("config.json"))?;
        let weights = WeightStore::open(dir)?;
        TrainableDecoder::from_parts(ctx, config, &weights, lora)
    }

    /// The decoder of `config` over `weights` (Hugging Face names), with fresh
    /// adapters of `lora` (`A` Kaiming-uniform, `B` zero).
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] for an architecture it does not build (see
    /// [`TrainableDecoder`]) or a bad `lora`; [`LlmError::BadTensor`](crate::LlmError::BadTensor)
    /// for a missing tensor or one of the wrong shape; out of memory.
    pub fn from_parts(
        ctx: &ExecContext,
        config: ModelConfig,
        weights: &WeightStore,
        lora: &LoraConfig,
    ) -> Result<TrainableDecoder, FinetuneError> {
        lora.check()?;
        Self::build(ctx, config, weights, lora, false)
    }

    /// Loads the model in `dir` for full fine-tuning: every weight (the
    /// embeddings, every projection and bias, the norms, the output
    /// projection) a trained f32 parameter, no adapter.
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] naming the first tensor that is not f32
    /// (full fine-tuning trains f32 models only); those of
    /// [`load`](TrainableDecoder::load).
    pub fn load_full(
        ctx: &ExecContext,
        dir: impl AsRef<std::path::Path>,
    ) -> Result<TrainableDecoder, FinetuneError> {
        let dir = dir.as_ref();
        let config = ModelConfig::from_file(dir.join("config.json"))?;
        let weights = WeightStore::open(dir)?;
        TrainableDecoder::from_parts_full(ctx, config, &weights)
    }

    /// [`from_parts`](TrainableDecoder::from_parts) for full fine-tuning (see
    /// [`load_full`](TrainableDecoder::load_full)).
    ///
    /// # Errors
    /// As [`load_full`](TrainableDecoder::load_full).
    pub fn from_parts_full(
        ctx: &ExecContext,
        config: ModelConfig,
        weights: &WeightStore,
    ) -> Result<TrainableDecoder, FinetuneError> {
        let none = LoraConfig {
            targets: Vec::new(),
            ..LoraConfig::default()
        };
        Self::build(ctx, config, weights, &none, true)
    }

    /// Whether every weight is trained (full fine-tuning).
    pub fn is_full(&self) -> bool {
        !self.full.is_empty()
    }

    /// `base` (the store the model was loaded from) with every trained weight
    /// of a full fine-tune replaced by its current f32 values (`base` itself
    /// with adapters), for [`peft::write_model_dir`](super::peft::write_model_dir).
    ///
    /// # Errors
    /// Out of memory.
    pub fn trained_store(&self, base: &WeightStore) -> Result<WeightStore, FinetuneError> {
        let mut tensors: std::collections::HashMap<String, Weight> = base
            .iter()
            .map(|(n, w)| (n.to_string(), w.clone()))
            .collect();
        for (name, p) in &self.full {
            let w = Weight::from_f32(WeightFormat::F32, &p.shape(), &p.to_vec())?;
            tensors.insert(name.clone(), w);
        }
        Ok(WeightStore::from_tensors(tensors))
    }

    /// The decoder, its weights trained (`full`) or frozen with `lora`'s
    /// adapters.
    fn build(
        ctx: &ExecContext,
        config: ModelConfig,
        weights: &WeightStore,
        lora: &LoraConfig,
        full: bool,
    ) -> Result<TrainableDecoder, FinetuneError> {
        check_supported(&config)?;
        // The inference decoder's checks of the sizes (none zero, heads
        // grouping evenly, an even head dimension, no overflow).
        crate::model::check_config(&config)?;
        let c = &config;
        let (hid, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        // Full fine-tuning: every trained weight by name, in load order.
        let trained: std::cell::RefCell<Vec<(String, Parameter)>> = Default::default();
        let matrix = |name: &str, shape: &[usize]| -> Result<Frozen, FinetuneError> {
            let w = matrix_or_vector(weights, name, shape)?;
            match full {
                true => {
                    let f = Frozen::trained(ctx, name, w)?;
                    if let Frozen::Trained(p) = &f {
                        trained.borrow_mut().push((name.to_string(), p.clone()));
                    }
                    Ok(f)
                }
                false => Frozen::new(ctx, w),
            }
        };
        let vector = |name: &str, len: usize| -> Result<Vector, FinetuneError> {
            let v = vector(ctx, weights, name, len, full)?;
            if let Vector::Trained(p) = &v {
                trained.borrow_mut().push((name.to_string(), p.clone()));
            }
            Ok(v)
        };
        let embed = matrix("model.embed_tokens.weight", &[c.vocab_size, hid])?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut k = 0u64;
        for i in 0..c.num_hidden_layers {
            let n = |s: &str| format!("model.layers.{i}.{s}");
            let shapes = [
                [qd, hid],
                [kvd, hid],
                [kvd, hid],
                [hid, qd],
                [inter, hid],
                [inter, hid],
                [hid, inter],
            ];
            let mut projs = Vec::with_capacity(7);
            for (t, shape) in Target::ALL.into_iter().zip(shapes) {
                let base = matrix(&n(&format!("{}.weight", t.module())), &shape)?;
                let has_bias = match t {
                    Target::QProj | Target::KProj | Target::VProj => c.qkv_bias,
                    Target::OProj => c.o_bias,
                    _ => false,
                };
                let bias = match has_bias {
                    true => Some(vector(&n(&format!("{}.bias", t.module())), shape[0])?),
                    false => None,
                };
                let adapter = match lora.targets.contains(&t) {
                    true => {
                        let seed = adapter_seed(lora.seed, k);
                        k += 1;
                        Some(LoraAdapter::new(ctx, lora, shape[0], shape[1], seed)?)
                    }
                    false => None,
                };
                projs.push(Proj {
                    base,
                    bias,
                    lora: adapter,
                });
            }
            let qk_norm = c.architecture.spec().qk_norm;
            let opt = |s: &str| -> Result<Option<Vector>, FinetuneError> {
                match qk_norm {
                    true => Ok(Some(vector(&n(s), hd)?)),
                    false => Ok(None),
                }
            };
            let sliding = c.params.sliding_layers.get(i).copied().unwrap_or(true);
            layers.push(Layer {
                input_norm: vector(&n("input_layernorm.weight"), hid)?,
                post_norm: vector(&n("post_attention_layernorm.weight"), hid)?,
                q_norm: opt("self_attn.q_norm.weight")?,
                k_norm: opt("self_attn.k_norm.weight")?,
                window: c.sliding_window.filter(|_| sliding),
                projs: projs.try_into().expect("seven projections"),
            });
        }
        let final_norm = vector("model.norm.weight", hid)?;
        let lm_head = match c.tie_word_embeddings {
            true => None,
            false => Some(matrix("lm_head.weight", &[c.vocab_size, hid])?),
        };
        let full = trained.into_inner();
        let inv_freq = crate::model::inv_freq(hd, c.rope_theta, &c.rope_scaling);
        let scale = crate::model::pow_f32(hd as f64, -0.5);
        Ok(TrainableDecoder {
            config,
            lora: lora.clone(),
            embed,
            layers,
            final_norm,
            full,
            lm_head,
            inv_freq,
            scale,
            checkpointing: false,
        })
    }

    /// Turns gradient checkpointing per layer on or off: with it, a training
    /// forward keeps only each layer's input and output for the backward,
    /// which runs each layer's forward again (about a third more compute for
    /// the memory of the activations inside the layers). The gradients are
    /// the same values.
    pub fn set_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// Whether gradient checkpointing is on.
    pub fn checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// Switches the frozen base products to **bf16 products**: every frozen
    /// projection and the output projection (the embedding matrix when tied)
    /// rounds its input to bf16 and sums with the AMX rule
    /// ([`ExecContext::bf16_matmul_amx_rule`](fucina::ExecContext::bf16_matmul_amx_rule):
    /// the depth in blocks of 32, an even and an odd f32 accumulator per
    /// block), forward `x · Wᵀ` and backward `g · W` (the gradient rounded
    /// to bf16 too), as a base run in bf16 computes them (PyTorch's bf16
    /// base). On AMX tiles where the CPU has them, on `vdpbf16ps` where
    /// AVX512_BF16 passes the rule's check, by an emulation elsewhere: the
    /// same bits on every path, vector level and thread count, and a row's
    /// bits do not depend on the other rows. Everything else (the adapters,
    /// norms, attention, SwiGLU, the loss) stays f32.
    ///
    /// Each matrix is packed in both orientations (its tiles replace the
    /// file's pages, which are released; the transposed tiles cost the
    /// matrix's size once more). The default (without this call) is the
    /// exact product of the widened matrix.
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] naming the first base matrix that is not
    /// bf16 (an f32, f16 or quantized base, or a fully trained one); out of
    /// memory. The model is unchanged on an error.
    pub fn use_bf16_products(&mut self) -> Result<(), FinetuneError> {
        let pack = |name: &str, f: &Frozen| -> Result<Frozen, FinetuneError> {
            match f {
                Frozen::Bf16(_) => Ok(f.clone()),
                Frozen::File(w) => Ok(Frozen::Bf16(Arc::new(Bf16Base::new(name, w)?))),
                Frozen::Dense(_) | Frozen::Trained(_) => Err(invalid(
                    "TrainableDecoder::use_bf16_products",
                    format!(
                        "{name} is an f32 matrix{}: bf16 products need a bf16 base",
                        if matches!(f, Frozen::Trained(_)) {
                            " trained in full"
                        } else {
                            ""
                        }
                    ),
                )),
            }
        };
        let embed = pack("model.embed_tokens.weight", &self.embed)?;
        let lm_head = match &self.lm_head {
            Some(h) => Some(pack("lm_head.weight", h)?),
            None => None,
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            let mut bases = Vec::with_capacity(7);
            for (t, p) in Target::ALL.into_iter().zip(&l.projs) {
                let name = format!("model.layers.{i}.{}.weight", t.module());
                bases.push(pack(&name, &p.base)?);
            }
            layers.push(bases);
        }
        self.embed = embed;
        self.lm_head = lm_head;
        for (l, bases) in self.layers.iter_mut().zip(layers) {
            for (p, b) in l.projs.iter_mut().zip(bases) {
                p.base = b;
            }
        }
        Ok(())
    }

    /// Whether [`use_bf16_products`](TrainableDecoder::use_bf16_products)
    /// switched the frozen products to bf16 products.
    pub fn uses_bf16_products(&self) -> bool {
        matches!(self.embed, Frozen::Bf16(_))
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The adapters' configuration.
    pub fn lora_config(&self) -> &LoraConfig {
        &self.lora
    }

    /// Every adapter matrix with its PEFT name
    /// (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), in
    /// layer order, `A` before `B`.
    ///
    /// Under full fine-tuning ([`load_full`](TrainableDecoder::load_full)):
    /// every weight with its Hugging Face name (`model.embed_tokens.weight`,
    /// ...), in load order.
    pub fn named_parameters(&self) -> Vec<(String, Parameter)> {
        if self.is_full() {
            return self.full.clone();
        }
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            for (t, p) in Target::ALL.into_iter().zip(&l.projs) {
                if let Some(a) = &p.lora {
                    let prefix = format!("base_model.model.model.layers.{i}.{}", t.module());
                    out.push((format!("{prefix}.lora_A.weight"), a.a.clone()));
                    out.push((format!("{prefix}.lora_B.weight"), a.b.clone()));
                }
            }
        }
        out
    }

    /// The trainable parameters (the adapters), in the order of
    /// [`named_parameters`](TrainableDecoder::named_parameters).
    pub fn parameters(&self) -> Vec<Parameter> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// The RoPE tables: `[t, 1, head_dim / 2]` cosines and sines of positions
    /// `0..t` (broadcast over the rows and heads), or with `positions`
    /// (`[b · t]`, a packed batch) `[b, t, 1, head_dim / 2]`.
    fn rope_tables(
        &self,
        ctx: &ExecContext,
        b: usize,
        t: usize,
        positions: Option<&[u32]>,
    ) -> Result<(Tensor, Tensor), FinetuneError> {
        let half = self.config.head_dim / 2;
        let shape: &[usize] = match positions {
            Some(_) => &[b, t, 1, half],
            None => &[t, 1, half],
        };
        // Written in place into pooled tensors (no host vectors per step).
        let (mut cos, mut sin) = (ctx.empty(shape)?, ctx.empty(shape)?);
        for (i, (c, s)) in cos
            .data_mut()?
            .chunks_exact_mut(half)
            .zip(sin.data_mut()?.chunks_exact_mut(half))
            .enumerate()
        {
            let p = positions.map_or(i, |p| p[i] as usize);
            crate::model::rope_angles(p, &self.inv_freq, c, s);
        }
        Ok((Tensor::constant(cos), Tensor::constant(sin)))
    }

    /// The additive attention mask: `0` where query `i` sees key `j` (`j <=
    /// i`, `i - j < window` with a window, and with `segments` (`[b · t]`, a
    /// packed batch) both in the same segment of their row), `-inf`
    /// elsewhere; `[t, t]`, or `[b, 1, 1, t, t]` with segments.
    fn mask(
        ctx: &ExecContext,
        b: usize,
        t: usize,
        window: Option<usize>,
        segments: Option<&[u32]>,
    ) -> Result<Tensor, FinetuneError> {
        let rows = if segments.is_some() { b } else { 1 };
        let shape: &[usize] = match segments {
            Some(_) => &[b, 1, 1, t, t],
            None => &[t, t],
        };
        // Written in place into a pooled tensor (no host vector per step).
        let mut out = ctx.empty(shape)?;
        let m = out.data_mut()?;
        m.fill(f32::NEG_INFINITY);
        for r in 0..rows {
            for i in 0..t {
                for j in 0..=i {
                    let same = segments.is_none_or(|s| s[r * t + i] == s[r * t + j]);
                    if same && window.is_none_or(|w| i - j < w) {
                        m[(r * t + i) * t + j] = 0.0;
                    }
                }
            }
        }
        Ok(Tensor::constant(out))
    }

    /// The final hidden states (after the final norm) of a batch of `b` rows
    /// of `t` tokens each (`ids`, row-major): `[b · t, hidden]`. `train`
    /// (the step's seed) turns the adapters' dropout on.
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] for an id past the vocabulary, `ids` not
    /// `b · t` long, `t` past `max_position_embeddings` or 0; op errors.
    pub fn hidden(
        &self,
        ctx: &ExecContext,
        ids: &[u32],
        b: usize,
        t: usize,
        train: Option<u64>,
    ) -> Result<Tensor, FinetuneError> {
        self.hidden_packed(ctx, ids, b, t, None, train)
    }

    /// [`hidden`](TrainableDecoder::hidden) of a packed batch: `packing`
    /// gives each token's position in its own sequence and its segment (the
    /// sequence it belongs to, within its row; `[b · t]` each). A token attends
    /// only to the earlier tokens of its segment and rotates with its own
    /// position, so each packed sequence's hidden states are those it has
    /// alone, within rounding.
    ///
    /// # Errors
    /// As [`hidden`](TrainableDecoder::hidden), and
    /// [`FinetuneError::Invalid`] for packing lists that are not `b · t` long
    /// or a position past `max_position_embeddings`.
    pub fn hidden_packed(
        &self,
        ctx: &ExecContext,
        ids: &[u32],
        b: usize,
        t: usize,
        packing: Option<(&[u32], &[u32])>,
        train: Option<u64>,
    ) -> Result<Tensor, FinetuneError> {
        const OP: &str = "TrainableDecoder::hidden";
        let c = &self.config;
        if t == 0 || b == 0 || ids.len() != b * t {
            return Err(invalid(
                OP,
                format!("{} ids for a batch of {b} rows of {t} tokens", ids.len()),
            ));
        }
        if t > c.max_position_embeddings {
            return Err(invalid(
                OP,
                format!(
                    "{t} tokens exceed max_position_embeddings {}",
                    c.max_position_embeddings
                ),
            ));
        }
        let (h, kvh, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let eps = c.rms_norm_eps;
        if let Some((pos, seg)) = packing {
            if pos.len() != b * t || seg.len() != b * t {
                return Err(invalid(
                    OP,
                    format!(
                        "{} positions and {} segments for {} tokens",
                        pos.len(),
                        seg.len(),
                        b * t
                    ),
                ));
            }
            if let Some(&p) = pos
                .iter()
                .find(|&&p| p as usize >= c.max_position_embeddings)
            {
                return Err(invalid(
                    OP,
                    format!(
                        "position {p} is past max_position_embeddings {}",
                        c.max_position_embeddings
                    ),
                ));
            }
        }
        let (positions, segments) = (packing.map(|p| p.0), packing.map(|p| p.1));
        let (cos, sin) = self.rope_tables(ctx, b, t, positions)?;
        // One mask per window the layers use: at most two (none, and the
        // config's sliding window), so a fixed array (no vector per step).
        let mut masks: [Option<(Option<usize>, Tensor)>; 2] = [None, None];
        for l in &self.layers {
            if masks.iter().flatten().any(|(w, _)| *w == l.window) {
                continue;
            }
            let slot = masks
                .iter_mut()
                .find(|m| m.is_none())
                .expect("at most two windows: none and the config's");
            *slot = Some((l.window, Self::mask(ctx, b, t, l.window, segments)?));
        }
        let mut x = self.embed.rows(ctx, ids)?;
        for (li, l) in self.layers.iter().enumerate() {
            let args = LayerArgs {
                b,
                t,
                heads: (h, kvh, hd),
                eps,
                scale: self.scale,
                cos: cos.clone(),
                sin: sin.clone(),
                mask: masks
                    .iter()
                    .flatten()
                    .find(|(w, _)| *w == l.window)
                    .expect("made")
                    .1
                    .clone(),
                seeds: train.map(|s| (s, li)),
            };
            x = match self.checkpointing {
                true => checkpointed_layer(ctx, l, &x, args)?,
                false => layer_forward(ctx, l, &x, &args)?,
            };
        }
        Ok(x.rms_norm(ctx, &self.final_norm.get(), eps)?)
    }

    /// The logits of hidden rows `[n, hidden]`: `[n, vocab]`.
    ///
    /// # Errors
    /// Op errors.
    pub fn project(&self, ctx: &ExecContext, hidden: &Tensor) -> Result<Tensor, FinetuneError> {
        self.lm_head
            .as_ref()
            .unwrap_or(&self.embed)
            .forward(ctx, hidden)
    }

    /// The mean cross-entropy of the logits of `hidden` rows (`[n, hidden]`)
    /// against `labels` (`[n]`), shape `[1]`: the bits of
    /// [`project`](TrainableDecoder::project) then `cross_entropy`, and the
    /// same gradient, without the `[n, vocab]` logits and their gradient.
    /// For a bf16 or f16 base (exact or on bf16 products) the output
    /// projection and the loss run a block of 256 rows at a time, and the
    /// gradient of `hidden` is computed with the loss, for a loss gradient
    /// of `grad` (what the backward will bring: 1, or the scale the loss is
    /// multiplied by), then kept (`[n, hidden]`) until the backward; a
    /// backward that brings another gradient computes the blocks again for
    /// it. The exact products widen the matrix once for the whole loss (one
    /// f32 copy of the output projection during the call, in place of the
    /// two widenings of the separate products). An f32 or quantized base, and
    /// a trained output projection, take `project` then `cross_entropy`.
    ///
    /// # Errors
    /// A label outside the vocabulary; op errors.
    pub fn loss(
        &self,
        ctx: &ExecContext,
        hidden: &Tensor,
        labels: &fucina::RawTensor<i64>,
        grad: f32,
    ) -> Result<Tensor, FinetuneError> {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let Some(hp) = head_products(ctx, head)? else {
            return Ok(self.project(ctx, hidden)?.cross_entropy(ctx, labels)?);
        };
        let need = hidden.requires_grad() && fucina::is_grad_enabled();
        let h = ctx.contiguous(hidden.raw())?;
        let (loss, dh) =
            fused_head_loss(ctx, &hp, &h, labels, need.then_some(grad), HEAD_BLOCK_ROWS)?;
        drop(hp);
        let Some(dh) = dh else {
            return Ok(Tensor::constant(loss));
        };
        let head = head.clone();
        let labels = labels.clone();
        let hint = grad.to_bits();
        Ok(custom_vjp_unsaved(
            ctx,
            "lm_head_cross_entropy",
            &[hidden],
            move |_, _| Ok(loss),
            move |ctx, a| {
                if !a.needs[0] {
                    return Ok([None]);
                }
                let g = ctx.contiguous(a.grad)?.data()?[0];
                if g.to_bits() == hint {
                    return Ok([Some(dh.clone())]);
                }
                // Another gradient than announced: the blocks again.
                let hp = head_products(ctx, &head)?.expect("the head had products");
                let (_, d) = fused_head_loss(ctx, &hp, &h, &labels, Some(g), HEAD_BLOCK_ROWS)?;
                Ok([d])
            },
        )?)
    }

    /// The logits of every position of a batch (`[b · t, vocab]`), without
    /// dropout.
    ///
    /// # Errors
    /// As [`hidden`](TrainableDecoder::hidden).
    pub fn logits(
        &self,
        ctx: &ExecContext,
        ids: &[u32],
        b: usize,
        t: usize,
    ) -> Result<Tensor, FinetuneError> {
        let h = self.hidden(ctx, ids, b, t, None)?;
        self.project(ctx, &h)
    }
}

/// What a layer's forward needs besides its weights: the batch's shape, the
/// heads `(query, key/value, head_dim)`, the norms' epsilon, the attention
/// scale, the RoPE tables, the layer's mask, and the dropout seeds (the
/// step's seed and the layer's index; `None` without dropout).
#[derive(Clone, Debug)]
struct LayerArgs {
    b: usize,
    t: usize,
    heads: (usize, usize, usize),
    eps: f32,
    scale: f32,
    cos: Tensor,
    sin: Tensor,
    mask: Tensor,
    seeds: Option<(u64, usize)>,
}

/// One decoder layer on the residual stream `x` (`[b · t, hidden]`).
fn layer_forward(
    ctx: &ExecContext,
    l: &Layer,
    x: &Tensor,
    a: &LayerArgs,
) -> Result<Tensor, FinetuneError> {
    let (b, t, eps) = (a.b, a.t, a.eps);
    let (h, kvh, hd) = a.heads;
    let rep = h / kvh;
    // Each projection's dropout mask from its own seed.
    let seed = |p: usize| {
        a.seeds
            .map(|(s, li)| fucina::rng::at(s, (li * 7 + p) as u64))
    };
    let xn = x.rms_norm(ctx, &l.input_norm.get(), eps)?;
    let q = l.projs[0].forward(ctx, &xn, seed(0))?;
    let k = l.projs[1].forward(ctx, &xn, seed(1))?;
    let v = l.projs[2].forward(ctx, &xn, seed(2))?;
    let mut q = q.reshape(ctx, &[b, t, h, hd])?;
    let mut k = k.reshape(ctx, &[b, t, kvh, hd])?;
    if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
        q = q.rms_norm(ctx, &qn.get(), eps)?;
        k = k.rms_norm(ctx, &kn.get(), eps)?;
    }
    let q = rope(ctx, &q, &a.cos, &a.sin)?;
    let k = rope(ctx, &k, &a.cos, &a.sin)?;
    // [b, kvh, rep · t, hd]: the query heads of a group stacked.
    let q = q
        .permute(ctx, &[0, 2, 1, 3])?
        .materialize(ctx)?
        .reshape(ctx, &[b, kvh, rep * t, hd])?;
    let k = k.permute(ctx, &[0, 2, 3, 1])?; // [b, kvh, hd, t]
    let v = v
        .reshape(ctx, &[b, t, kvh, hd])?
        .permute(ctx, &[0, 2, 1, 3])?; // [b, kvh, t, hd]
    // The probabilities are recomputed in the backward, not kept.
    let (scale, mask) = (a.scale, a.mask.clone());
    let core = recomputed(ctx, "attention", [&q, &k, &v], move |ctx, qkv| {
        let p = qkv[0]
            .matmul(ctx, &qkv[1])?
            .scale(ctx, scale)?
            .reshape(ctx, &[b, kvh, rep, t, t])?
            .add(ctx, &mask)?
            .softmax(ctx, -1)?
            .reshape(ctx, &[b, kvh, rep * t, t])?;
        Ok(p.matmul(ctx, &qkv[2])?) // [b, kvh, rep · t, hd] = [b, h, t, hd]
    })?;
    let attn = core
        .reshape(ctx, &[b, h, t, hd])?
        .permute(ctx, &[0, 2, 1, 3])?
        .materialize(ctx)?
        .reshape(ctx, &[b * t, h * hd])?;
    let o = l.projs[3].forward(ctx, &attn, seed(3))?;
    let x = x.add(ctx, &o)?;
    let xn = x.rms_norm(ctx, &l.post_norm.get(), eps)?;
    let gate = l.projs[4].forward(ctx, &xn, seed(4))?;
    let up = l.projs[5].forward(ctx, &xn, seed(5))?;
    let act = recomputed(ctx, "swiglu", [&gate, &up], |ctx, gu| {
        Ok(gu[0].silu(ctx)?.mul(ctx, &gu[1])?)
    })?;
    let down = l.projs[6].forward(ctx, &act, seed(6))?;
    Ok(x.add(ctx, &down)?)
}

/// [`layer_forward`] with gradient checkpointing: the forward runs without
/// a graph, and one op keeps only the layer's input (and output); its
/// backward runs the layer again with a graph and backpropagates through it
/// (a backward inside the backward), which adds the adapters' gradients to
/// them directly and returns the input's.
fn checkpointed_layer(
    ctx: &ExecContext,
    l: &Layer,
    x: &Tensor,
    args: LayerArgs,
) -> Result<Tensor, FinetuneError> {
    let params = l.trained();
    if !fucina::is_grad_enabled() || (params.is_empty() && !x.requires_grad()) {
        return layer_forward(ctx, l, x, &args);
    }
    let y = {
        let _g = fucina::no_grad();
        layer_forward(ctx, l, &x.detach(), &args)?
    };
    let mut inputs: Vec<&Tensor> = Vec::with_capacity(1 + params.len());
    inputs.push(x);
    inputs.extend(params.iter());
    let layer = l.clone();
    let out = custom_vjp(
        ctx,
        "checkpointed_layer",
        &inputs,
        move |_, _| Ok(y.raw().clone()),
        move |ctx, a| {
            let xv = Tensor::constant(a.inputs[0].clone()).into_variable();
            let y = layer_forward(ctx, &layer, &xv, &args).map_err(|e| {
                fucina::AutogradError::External(fucina::autograd::ExternalError::new(e))
            })?;
            y.backward_with(ctx, Some(a.grad), super::trainer::RELEASE_AS_IT_GOES)?;
            let mut grads = Vec::with_capacity(a.inputs.len());
            grads.push(match a.needs[0] {
                true => xv.grad(ctx)?.map(|g| g.raw().clone()),
                false => None,
            });
            // The trained tensors' gradients are already theirs (the inner
            // backward added them); the outer pass adds zeros.
            for (p, &need) in a.inputs[1..].iter().zip(&a.needs[1..]) {
                grads.push(match need {
                    true => Some(ctx.zeros(p.shape())?),
                    false => None,
                });
            }
            Ok(grads)
        },
    )?;
    Ok(out)
}

/// `f(inputs)` as one op that keeps only its inputs (not its output): the forward runs `f`
/// without a graph; the backward runs it again with a graph over the saved
/// inputs and backpropagates the output's gradient through it (the same ops
/// in the same order, so the same gradients, bit for bit, as `f` recorded
/// directly). `f` must not read parameters that need a gradient (those would
/// get theirs from the inner backward and be missed by the outer one).
///
/// The attention core (whose softmax would keep the `[b, heads, t, t]`
/// probabilities) and SwiGLU (`silu(gate)` and the product) use it: what the
/// graph keeps between forward and backward is their inputs alone.
fn recomputed<F, const N: usize>(
    ctx: &ExecContext,
    name: &'static str,
    inputs: [&Tensor; N],
    f: F,
) -> Result<Tensor, FinetuneError>
where
    F: Fn(&ExecContext, &[Tensor]) -> Result<Tensor, FinetuneError> + Send + Sync + 'static,
{
    if !fucina::is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
        return f(ctx, &inputs.map(Tensor::clone));
    }
    let y = {
        let _g = fucina::no_grad();
        f(ctx, &inputs.map(Tensor::detach))?
    };
    let out = y.raw().clone();
    drop(y);
    // Arrays, not lists: with the op's closure in a recycled slot, a step
    // through this block allocates nothing after warm-up.
    let saved: [RawTensor; N] = inputs.map(|t| t.raw().clone());
    Ok(custom_vjp_unsaved(
        ctx,
        name,
        &inputs,
        move |_, _| Ok(out),
        move |ctx, a| {
            let vars: [Tensor; N] = std::array::from_fn(|i| {
                let x = Tensor::constant(saved[i].clone());
                match a.needs[i] {
                    true => x.into_variable(),
                    false => x,
                }
            });
            let y = f(ctx, &vars).map_err(|e| {
                fucina::AutogradError::External(fucina::autograd::ExternalError::new(e))
            })?;
            y.backward_with(ctx, Some(a.grad), super::trainer::RELEASE_AS_IT_GOES)?;
            let mut grads: [Option<RawTensor>; N] = std::array::from_fn(|_| None);
            for ((g, v), &need) in grads.iter_mut().zip(&vars).zip(a.needs) {
                if need {
                    *g = v.grad(ctx)?.map(|g| g.raw().clone());
                }
            }
            Ok(grads)
        },
    )?)
}

/// RoPE in the rotate-half convention on `x` `[b, t, heads, hd]` with tables
/// `[t, 1, hd / 2]`.
fn rope(
    ctx: &ExecContext,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor, FinetuneError> {
    let half = x.shape()[3] / 2;
    let x1 = x.narrow(ctx, 3, 0, half)?;
    let x2 = x.narrow(ctx, 3, half, half)?;
    let lo = x1.mul(ctx, cos)?.sub(ctx, &x2.mul(ctx, sin)?)?;
    let hi = x2.mul(ctx, cos)?.add(ctx, &x1.mul(ctx, sin)?)?;
    Ok(Tensor::concat(ctx, &[&lo, &hi], 3)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The widened bf16 products in blocks of rows: forward the bits of one
    /// `linear` over the whole widened matrix; backward the blocks' products
    /// added in order; both the same bits for 1 and 2 threads and for a row
    /// alone as within its batch.
    #[test]
    fn widened_blocks_keep_the_bits_of_a_row() {
        let (out_f, in_f, n, block) = (11, 7, 5, 4);
        let vals = |len: usize, s: u64| -> Vec<f32> {
            (0..len)
                .map(|i| (fucina::rng::at(s, i as u64) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let wv = vals(out_f * in_f, 1);
        let bytes: Vec<u8> = wv
            .iter()
            .flat_map(|&v| fucina::storage::half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let w = Weight::from_bytes("w", WeightFormat::BF16, &[out_f, in_f], bytes).unwrap();
        let one = ExecContext::with_threads(1);
        let two = ExecContext::with_threads(2);
        let x = one.from_slice(&[n, in_f], &vals(n * in_f, 2)).unwrap();
        let g = one.from_slice(&[n, out_f], &vals(n * out_f, 3)).unwrap();
        let wide = widened_rows(&one, &w, 0, out_f).unwrap();

        let y = widened_forward_in(&one, &w, &x, block).unwrap().to_vec();
        assert_eq!(y, one.linear(&x, &wide, None).unwrap().to_vec());
        assert_eq!(y, widened_forward_in(&two, &w, &x, block).unwrap().to_vec());
        let row = one.contiguous(&x.narrow(0, 2, 1).unwrap()).unwrap();
        let alone = widened_forward_in(&one, &w, &row, block).unwrap().to_vec();
        assert_eq!(alone, y[2 * out_f..3 * out_f]);

        let dx = widened_backward_in(&one, &w, &g, block).unwrap().to_vec();
        let mut want = vec![0.0f32; n * in_f];
        for r0 in (0..out_f).step_by(block) {
            let rows = block.min(out_f - r0);
            let part = one
                .matmul(
                    &g.narrow(1, r0, rows).unwrap(),
                    &wide.narrow(0, r0, rows).unwrap(),
                )
                .unwrap()
                .to_vec();
            for (acc, p) in want.iter_mut().zip(part) {
                *acc = if r0 == 0 { p } else { *acc + p };
            }
        }
        assert_eq!(dx, want);
        assert_eq!(
            dx,
            widened_backward_in(&two, &w, &g, block).unwrap().to_vec()
        );
        let grow = one.contiguous(&g.narrow(0, 2, 1).unwrap()).unwrap();
        let alone = widened_backward_in(&one, &w, &grow, block)
            .unwrap()
            .to_vec();
        assert_eq!(alone, dx[2 * in_f..3 * in_f]);
    }

    /// The fused output projection and loss, in blocks of 2 rows, give the
    /// bits of the frozen op then `cross_entropy` (its loss, and the
    /// gradient of the hidden rows under a scaled loss), on the widened
    /// products and on bf16 products.
    #[test]
    fn the_fused_head_loss_keeps_the_bits_of_the_separate_ops() {
        let (vocab, in_f, n) = (11, 7, 5);
        let vals = |len: usize, s: u64| -> Vec<f32> {
            (0..len)
                .map(|i| (fucina::rng::at(s, i as u64) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let bytes: Vec<u8> = vals(vocab * in_f, 1)
            .iter()
            .flat_map(|&v| fucina::storage::half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let w = Weight::from_bytes("w", WeightFormat::BF16, &[vocab, in_f], bytes).unwrap();
        let ctx = ExecContext::with_threads(2);
        let labels = ctx
            .from_slice_typed::<i64>(&[n], &[3, 0, 10, 7, 3])
            .unwrap();
        let hv = vals(n * in_f, 2);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let heads = [
            Frozen::File(Arc::new(w.clone())),
            Frozen::Bf16(Arc::new(Bf16Base::new("w", &w).unwrap())),
        ];
        for head in &heads {
            let h = Tensor::variable_from_slice(&ctx, &[n, in_f], &hv).unwrap();
            let loss = head
                .forward(&ctx, &h)
                .unwrap()
                .cross_entropy(&ctx, &labels)
                .unwrap();
            let want_loss = loss.to_vec();
            loss.scale(&ctx, 0.375).unwrap().backward(&ctx).unwrap();
            let want_dh = h.grad(&ctx).unwrap().unwrap().to_vec();
            let hp = head_products(&ctx, head).unwrap().unwrap();
            let (got_loss, got_dh) =
                fused_head_loss(&ctx, &hp, h.raw(), &labels, Some(0.375), 2).unwrap();
            assert_eq!(bits(&got_loss.to_vec()), bits(&want_loss));
            assert_eq!(bits(&got_dh.unwrap().to_vec()), bits(&want_dh));
        }
    }

    /// The gradients of `f` through [`recomputed`] are those of `f` recorded
    /// directly, bit for bit (a causal attention core over strided inputs,
    /// one input constant).
    #[test]
    fn recomputed_blocks_give_the_same_gradient_bits() {
        let ctx = ExecContext::with_threads(2);
        let (b, kvh, rep, t, hd) = (2, 2, 3, 5, 4);
        let vals = |n: usize, s: u64| -> Vec<f32> {
            (0..n)
                .map(|i| (fucina::rng::at(s, i as u64) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let mut m = vec![f32::NEG_INFINITY; t * t];
        for i in 0..t {
            for j in 0..=i {
                m[i * t + j] = 0.0;
            }
        }
        let mask = Tensor::from_slice(&ctx, &[t, t], &m).unwrap();
        let core = move |ctx: &ExecContext, qkv: &[Tensor]| -> Result<Tensor, FinetuneError> {
            let p = qkv[0]
                .matmul(ctx, &qkv[1])?
                .scale(ctx, 0.5)?
                .reshape(ctx, &[b, kvh, rep, t, t])?
                .add(ctx, &mask)?
                .softmax(ctx, -1)?
                .reshape(ctx, &[b, kvh, rep * t, t])?;
            Ok(p.matmul(ctx, &qkv[2])?)
        };
        let run = |recompute: bool, v_const: bool| {
            let q = Tensor::variable_from_slice(
                &ctx,
                &[b, kvh, rep * t, hd],
                &vals(b * kvh * rep * t * hd, 1),
            )
            .unwrap();
            let k0 =
                Tensor::variable_from_slice(&ctx, &[b, kvh, t, hd], &vals(b * kvh * t * hd, 2))
                    .unwrap();
            let k = k0.permute(&ctx, &[0, 1, 3, 2]).unwrap();
            let v = Tensor::from_slice(&ctx, &[b, kvh, t, hd], &vals(b * kvh * t * hd, 3)).unwrap();
            let v = if v_const { v } else { v.into_variable() };
            let y = match recompute {
                true => recomputed(&ctx, "attention", [&q, &k, &v], core.clone()).unwrap(),
                false => core(&ctx, &[q.clone(), k.clone(), v.clone()]).unwrap(),
            };
            let w = Tensor::from_slice(&ctx, y.shape(), &vals(y.raw().numel(), 4)).unwrap();
            y.mul(&ctx, &w)
                .unwrap()
                .sum_all(&ctx)
                .unwrap()
                .backward(&ctx)
                .unwrap();
            let bits = |t: &Tensor| -> Option<Vec<u32>> {
                t.grad(&ctx)
                    .unwrap()
                    .map(|g| g.to_vec().iter().map(|x| x.to_bits()).collect())
            };
            (
                y.to_vec().iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                bits(&q),
                bits(&k0),
                bits(&v),
            )
        };
        for v_const in [false, true] {
            let direct = run(false, v_const);
            assert!(direct.1.is_some() && direct.2.is_some());
            assert_eq!(direct.3.is_none(), v_const);
            assert_eq!(run(true, v_const), direct);
        }
    }
}
