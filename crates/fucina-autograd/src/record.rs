//! The op record schema: what a built-in op keeps for its backward (one
//! [`Saved`] variant per op or group of ops, written by [`record!`]), the forms
//! of an op's backward a node holds ([`Vjp`]: a function pointer over the
//! [`Saved`] record, or a closure in a recycled boxed slot), and the gradient lists a backward
//! returns ([`GradList`], [`Grads`]).
//!
//! A new standalone op adds its variant here; the graph memory (nodes, their
//! free list, release and the backward engine) is `node.rs`, which stores a
//! [`Vjp`] inline in every op node.

use fucina_exec::{
    AxisReduction, AxisStatistic, BinaryOp, ClassLoss, Dims, ExecContext, FullReduction,
    GroupNormOptions, InterpolateOptions, MaskOp, NormOp, PadOptions, Pool2dOp, RawTensor,
    RegressionLoss, ScalarOp, SoftmaxOp, UnaryOp,
};
use fucina_exec::{IndexOp, JoinOp, ProductOp, ViewOp};

use std::any::{Any, TypeId};

use crate::error::Result;
use crate::node::Small;

/// The gradients a custom backward returns, one per input of the op (`None` where
/// the input needs none), as a vector; an array `[Option<RawTensor>; N]` does
/// too, without allocating.
pub type Grads = Vec<Option<RawTensor>>;

/// The gradients a built-in VJP returns (inline for up to three inputs).
pub(crate) type GradList = Small<RawTensor>;

/// Builds a [`GradList`] without allocating (up to three entries).
macro_rules! grads {
    ($($g:expr),* $(,)?) => {
        <$crate::record::GradList as FromIterator<_>>::from_iter([$($g),*])
    };
}
pub(crate) use grads;

/// What a built-in op keeps for its backward: one variant per op (or per group
/// of ops that keep the same things), with named fields, stored inline in the
/// node (so every op node has the same type and can be recycled; the node is as
/// large as the largest variant, not as all of them together).
///
/// An op writes its variant once, through [`record!`], which also binds the same
/// fields by name in the op's backward: the forward and the backward of an op
/// cannot disagree on what a slot means.
pub(crate) enum Saved {
    /// The descriptor and the input of a unary elementwise op.
    Unary { op: UnaryOp, x: RawTensor },
    /// The descriptor, the output and the axis it was normalized along
    /// (`softmax`, `log_softmax`).
    OutputAlong {
        op: SoftmaxOp,
        y: RawTensor,
        axis: usize,
    },
    /// The descriptor of a scalar-parameter op and, if its backward reads it,
    /// the input (`scale`, `add_scalar`, `pow_scalar`, `clamp`, `dropout`).
    Scalar { op: ScalarOp, x: Option<RawTensor> },
    /// The descriptor and both operands' shapes of a binary op whose backward
    /// reads only the shapes (`add`, `sub`).
    BinaryShapes { op: BinaryOp, a: Dims, b: Dims },
    /// The descriptor and both operands of a binary op whose backward reads them
    /// (`mul`, `div`, `pow`, `maximum`, `minimum`).
    Binary {
        op: BinaryOp,
        a: RawTensor,
        b: RawTensor,
    },
    /// The descriptor and both operands of a matrix product (`matmul`,
    /// `linear`; a bias is not kept: its gradient reads only the output's).
    Product {
        op: ProductOp,
        a: RawTensor,
        b: RawTensor,
    },
    /// The descriptor, the mask and the operands' shapes of a mask op
    /// (`where_`, `masked_fill`; `b` is unused by `masked_fill`).
    Mask {
        op: MaskOp,
        mask: RawTensor<bool>,
        a: Dims,
        b: Dims,
    },
    /// The descriptor and the input shape of a reduction along `axis` (`sum`,
    /// `mean`).
    AxisReduce {
        op: AxisReduction,
        shape: Dims,
        axis: usize,
        keepdim: bool,
    },
    /// The descriptor and the input of a selecting reduction along `axis`
    /// (`max`, `min`).
    AxisSelect {
        op: AxisReduction,
        x: RawTensor,
        axis: usize,
        keepdim: bool,
    },
    /// The descriptor and the input of a statistic along `axis` (`variance`,
    /// `logsumexp`), and the output if the backward reads it (`logsumexp`).
    AxisStat {
        op: AxisStatistic,
        x: RawTensor,
        y: Option<RawTensor>,
        axis: usize,
        keepdim: bool,
    },
    /// The descriptor and the input shape of a full reduction (`sum_all`,
    /// `mean_all`).
    ReduceAll { op: FullReduction, shape: Dims },
    /// The descriptor (with its epsilon), the input and the scale of a
    /// normalization (`layer_norm`, `rms_norm`).
    Norm {
        op: NormOp,
        x: RawTensor,
        gamma: RawTensor,
    },
    /// The descriptor, the scores and the labels of a classification loss
    /// (`cross_entropy`, `nll_loss`).
    ClassLoss {
        op: ClassLoss,
        scores: RawTensor,
        labels: RawTensor<i64>,
    },
    /// The descriptor and both operands of a regression loss (`mse_loss`).
    RegressionLoss {
        op: RegressionLoss,
        a: RawTensor,
        b: RawTensor,
    },
    /// The descriptor (with its parameters) and the input shape of a view op
    /// (`reshape`, `permute`, `transpose`, `narrow`, `squeeze`, `unsqueeze`,
    /// `broadcast_to`, `materialize`).
    View { op: ViewOp, shape: Dims },
    /// The descriptor, the axis and the parts' lengths along it of a join
    /// (`concat` of up to eight parts; `stack`, whose parts are one position
    /// each, keeps none).
    Join {
        op: JoinOp,
        axis: usize,
        sizes: Dims,
    },
    /// The descriptor, the input shape, the axis and the indices of a gathering
    /// op (`index_select`, `gather`, `embedding`, and `topk` as a gather).
    Indexed {
        op: IndexOp,
        shape: Dims,
        axis: usize,
        index: RawTensor<i64>,
    },
    /// The axis of a running sum (`cumsum`).
    Scan { axis: usize },
    /// The input shape, the axis and the indices of `scatter_add` (the
    /// gradient of its source gathers at them).
    ScatterAdd {
        shape: Dims,
        axis: usize,
        index: RawTensor<i64>,
    },
    /// The input, the weight and the options of `conv2d` (a bias needs
    /// nothing; `groups` is `C_in / w.shape()[1]`, not stored, so the node stays
    /// within its size budget).
    Conv2d {
        x: RawTensor,
        w: RawTensor,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    },
    /// The input, the weight and the options of `conv1d` (as `conv2d`).
    Conv1d {
        x: RawTensor,
        w: RawTensor,
        stride: usize,
        padding: usize,
        dilation: usize,
    },
    /// The input, the weight and the options of `conv_transpose2d` (as
    /// `conv2d`: the groups and the output padding follow from the shapes of
    /// the input, the weight and the output gradient, so they are not stored).
    ConvTranspose2d {
        x: RawTensor,
        w: RawTensor,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    },
    /// The input, the weight and the options of `conv_transpose1d` (as
    /// `conv_transpose2d`).
    ConvTranspose1d {
        x: RawTensor,
        w: RawTensor,
        stride: usize,
        padding: usize,
        dilation: usize,
    },
    /// The descriptor, the input shape and (for `Max` only) the input of a 2-D
    /// pooling op.
    Pool2d {
        op: Pool2dOp,
        shape: Dims,
        x: Option<RawTensor>,
    },
    /// The input of a batch norm and its per-channel `[3, C]` parameters (rows
    /// `gamma`, the mean and `inv_std` it normalized with), packed so that the
    /// node stays small.
    BatchNorm {
        x: RawTensor,
        params: RawTensor,
        training: bool,
    },
    /// The input, the weight (when there is one) and the options of
    /// `group_norm`, and whether a bias is an input (its gradient reads no
    /// saved tensor).
    GroupNorm {
        x: RawTensor,
        weight: Option<RawTensor>,
        opts: GroupNormOptions,
        bias: bool,
    },
    /// The input of a fused training-mode batch norm and pooling op, its
    /// per-channel `[4, C]` parameters (rows `gamma`, `beta`, the mean and
    /// `inv_std`) and the pooling descriptor.
    BatchNormPool2d {
        x: RawTensor,
        params: RawTensor,
        op: Pool2dOp,
    },
    /// The input shape and the options of a `pad` (its backward reads no
    /// values).
    Pad { shape: Dims, opts: PadOptions },
    /// The `[B, 5H]` saved gates (`i, f, g, o, tanh(c')`) and the cell state
    /// read by an `lstm_cell`.
    LstmCell { saved: RawTensor, c: RawTensor },
    /// The `[B, 4H]` saved gates (`r, z, n`, the state's `n` block) and the
    /// state read by a `gru_cell`.
    GruCell { saved: RawTensor, h: RawTensor },
    /// The flat weight and the saved tensor (which keeps the input's rows) of
    /// an `lstm_sequence` (`lstm`) or a `gru_sequence`, and its direction.
    RecurrentSequence {
        w: RawTensor,
        saved: RawTensor,
        lstm: bool,
        reverse: bool,
    },
    /// The packed operand, the attention weights, the heads and the scale
    /// of an `attention_packed`.
    AttentionPacked {
        qkv: RawTensor,
        probs: RawTensor,
        heads: usize,
        scale: f32,
    },
    /// The input shape and the options of an `interpolate` (its backward
    /// reads no values).
    Interpolate {
        shape: Dims,
        opts: InterpolateOptions,
    },
}

/// Records an op node whose backward reads a typed [`Saved`] variant:
/// `record!(ctx, name, out, inputs, Variant { field: value, .. }, |ctx, g, needs| body)`.
/// The fields are written once here and bound by name (as references) in `body`.
/// Write a one-expression body without braces (`|ctx, g, _| Ok(grads![..])`):
/// braces around a single expression trip the `unused_braces` lint in the
/// expansion.
macro_rules! record {
    ($ctx:expr, $name:expr, $out:expr, $inputs:expr,
     $variant:ident { $($field:ident $(: $val:expr)?),* $(,)? },
     |$c:pat_param, $g:pat_param, $needs:pat_param| $body:expr $(,)?) => {
        $crate::tensor::Tensor::finish(
            $ctx,
            $name,
            $out,
            $inputs,
            $crate::record::Saved::$variant { $($field $(: $val)?),* },
            |$c, saved, $g, $needs| {
                let $crate::record::Saved::$variant { $($field),* } = saved else {
                    unreachable!("an op node holds the saved variant its op recorded")
                };
                $body
            },
        )
    };
}
pub(crate) use record;

/// A built-in VJP: a plain function over the op's [`Saved`] record, the output's
/// gradient and which inputs need one.
pub(crate) type VjpFn = fn(&ExecContext, &Saved, &RawTensor, &[bool]) -> Result<GradList>;

/// A VJP closure (custom ops, and ops whose saved state is not a [`Saved`]) in
/// a boxed slot of its own type: the first op of a closure type allocates the
/// slot; when the node releases its VJP, the closure is dropped (its captures
/// with it) and the empty slot goes back to the context's free list
/// ([`NodePool`](crate::node::NodePool)), where the next op with a closure of
/// the same type refills it in place. After a warm-up step, recording a
/// custom op allocates nothing.
pub(crate) type BoxedVjp = Box<dyn VjpSlot>;

/// A boxed slot that holds a VJP closure of one type, or nothing.
pub(crate) trait VjpSlot: Send + Sync {
    /// Runs the closure (`None` if the slot is empty).
    fn call(&self, ctx: &ExecContext, g: &RawTensor, needs: &[bool]) -> Option<Result<GradList>>;
    /// Drops the closure (and what it captured), leaving the slot empty.
    fn clear(&mut self);
    /// The slot as `Any`, for refilling with a closure of its type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// The slot's type (`TypeId` of `Option<F>`), the key of its free list.
    fn slot_type(&self) -> TypeId;
}

impl<F> VjpSlot for Option<F>
where
    F: Fn(&ExecContext, &RawTensor, &[bool]) -> Result<GradList> + Send + Sync + 'static,
{
    fn call(&self, ctx: &ExecContext, g: &RawTensor, needs: &[bool]) -> Option<Result<GradList>> {
        self.as_ref().map(|f| f(ctx, g, needs))
    }

    fn clear(&mut self) {
        *self = None;
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn slot_type(&self) -> TypeId {
        TypeId::of::<Option<F>>()
    }
}

/// An op's backward, until backward releases it.
// `Saved` lives inline on purpose: the node is allocated once and recycled;
// boxing it would allocate on every recorded op.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Vjp {
    /// Released (by a backward without `retain_graph`), or a leaf.
    None,
    Fn(VjpFn, Saved),
    Boxed(BoxedVjp),
}
