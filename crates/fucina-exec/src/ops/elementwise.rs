//! Elementwise ops: binary ops with numpy broadcasting, scalar forms, unary math,
//! `where_`/`masked_fill`, comparisons, the storage-consuming `take_*_no_grad` ops,
//! dropout, and the backward kernels of the unary ops.
//!
//! Every op reads its operands through their strides (contiguous, broadcast,
//! transposed or stepped views alike; see [`Geom`]) and writes a fresh contiguous
//! output. Each output element is a pure function of its inputs, so results never
//! depend on the team size.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::simd::vectorized;
use std::ops::Range;

use crate::kernels::math;
use crate::kernels::strided::{Geom, TILE, seg1, seg2, tiled_rows};
use crate::kernels::unary;
use crate::tensor::layout::{Dims, broadcast_layout, broadcast_shapes};
use crate::tensor::{Element, RawTensor};

/// Work weight of a cheap elementwise op (an add) per output element.
const CHEAP: usize = 1;
/// Work weight of a transcendental op (exp, tanh, erf) per output element.
const TRANSCENDENTAL: usize = 8;

impl ExecContext {
    /// `out[i] = f(x[i])` over any layout of `x`.
    pub(crate) fn map1<A: Element, O: Element>(
        &self,
        op: &'static str,
        x: &RawTensor<A>,
        cost: usize,
        f: impl Fn(A) -> O + Sync,
    ) -> Result<RawTensor<O>, ExecError> {
        let geom = Geom::new(x.shape(), [x.layout()]);
        let [sx] = geom.inner_strides();
        let xs: &[A] = x.buffer();
        let inner = geom.inner();
        if sx > 1 && inner > 1 && x.numel() > inner {
            return self.new_tensor(op, x.shape(), |out| {
                self.par_rows(out, inner, inner * cost, |rows, o| {
                    map1_tiled(&geom, rows, o, xs, &f)
                })
            });
        }
        self.new_tensor(op, x.shape(), |out| {
            self.par_rows(out, 1, cost, |r, o| {
                let start = r.start;
                geom.for_segments(r, |pos, len, [bx]| {
                    let o = &mut o[pos - start..pos - start + len];
                    vectorized!(seg1(o, xs, bx, sx, &f));
                });
            });
        })
    }

    /// `out[i] = f(a[i], b[i])` with numpy broadcasting, over any layouts.
    pub(crate) fn map2<A: Element, B: Element, O: Element>(
        &self,
        op: &'static str,
        a: &RawTensor<A>,
        b: &RawTensor<B>,
        cost: usize,
        f: impl Fn(A, B) -> O + Sync,
    ) -> Result<RawTensor<O>, ExecError> {
        let shape = broadcast_shapes(op, a.shape(), b.shape())?;
        self.map2_to(op, &shape, a, b, cost, f)
    }

    /// [`map2`](Self::map2) into the output shape `shape`, which the caller
    /// obtained from the op's descriptor (the broadcast of the operands').
    pub(crate) fn map2_to<A: Element, B: Element, O: Element>(
        &self,
        op: &'static str,
        shape: &[usize],
        a: &RawTensor<A>,
        b: &RawTensor<B>,
        cost: usize,
        f: impl Fn(A, B) -> O + Sync,
    ) -> Result<RawTensor<O>, ExecError> {
        let la = broadcast_layout(op, a.layout(), shape)?;
        let lb = broadcast_layout(op, b.layout(), shape)?;
        let geom = Geom::new(shape, [&la, &lb]);
        let [sa, sb] = geom.inner_strides();
        let (av, bv): (&[A], &[B]) = (a.buffer(), b.buffer());
        self.new_tensor(op, shape, |out| {
            self.par_rows(out, 1, cost, |r, o| {
                let start = r.start;
                geom.for_segments(r, |pos, len, [ba, bb]| {
                    let o = &mut o[pos - start..pos - start + len];
                    vectorized!(seg2(o, av, ba, sa, bv, bb, sb, &f));
                });
            });
        })
    }

    /// `out[i] = f(c[i], a[i], b[i])` with broadcasting of all three to
    /// `shape` (the output shape, which the caller obtained from the op's
    /// descriptor).
    fn map3<C: Element, A: Element, B: Element, O: Element>(
        &self,
        op: &'static str,
        shape: &[usize],
        c: &RawTensor<C>,
        a: &RawTensor<A>,
        b: &RawTensor<B>,
        f: impl Fn(C, A, B) -> O + Sync,
    ) -> Result<RawTensor<O>, ExecError> {
        let lc = broadcast_layout(op, c.layout(), shape)?;
        let la = broadcast_layout(op, a.layout(), shape)?;
        let lb = broadcast_layout(op, b.layout(), shape)?;
        let geom = Geom::new(shape, [&lc, &la, &lb]);
        let [sc, sa, sb] = geom.inner_strides();
        let (cv, av, bv): (&[C], &[A], &[B]) = (c.buffer(), a.buffer(), b.buffer());
        self.new_tensor(op, shape, |out| {
            self.par_rows(out, 1, CHEAP, |r, o| {
                let start = r.start;
                geom.for_segments(r, |pos, len, [bc, ba, bb]| {
                    let o = &mut o[pos - start..pos - start + len];
                    vectorized!(seg3(o, (cv, bc, sc), (av, ba, sa), (bv, bb, sb), &f));
                });
            });
        })
    }
}

/// Defines the enum of an op family's descriptor (unit variants, one per op),
/// its `ALL` list and its `name()` (each variant's name is its `ExecContext`
/// method's): the shell the family macros below share.
macro_rules! op_enum {
    ($(#[$meta:meta])* $enum:ident, $all:literal, $name_doc:literal {
        $($(#[$doc:meta])* $name:ident / $variant:ident),* $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $enum {$(
            $(#[$doc])*
            $variant,
        )*}

        impl $enum {
            #[doc = $all]
            pub const ALL: &'static [$enum] = &[$($enum::$variant),*];

            #[doc = $name_doc]
            pub fn name(self) -> &'static str {
                match self {$($enum::$variant => stringify!($name)),*}
            }
        }
    };
}

/// Defines the binary family from one line per op:
/// `name / Variant => |x, y| forward, backward |ctx, g[, a, b]| grads;`. The
/// backward binds the context, the output's gradient and, when it reads them,
/// the forward operands (which makes `keeps_operands` true); `grads` is
/// `each(ga, gb)` (each operand's gradient computed only when asked for) or
/// `both(pair)` (one kernel that returns both).
macro_rules! binary_ops {
    (@keeps) => { false };
    (@keeps $($operands:tt)+) => { true };
    (@grads $want:ident, each($ga:expr, $gb:expr $(,)?)) => {
        Ok(($want(0, &|| $ga)?, $want(1, &|| $gb)?))
    };
    (@grads $want:ident, both($pair:expr $(,)?)) => {{
        let (ga, gb) = $pair?;
        Ok((Some(ga), Some(gb)))
    }};
    ($($(#[$doc:meta])* $name:ident / $variant:ident => |$a:ident, $b:ident| $e:expr,
       backward |$c:pat_param, $g:pat_param $(, $oa:pat_param, $ob:pat_param)?| $form:ident $args:tt;)*) => {
        op_enum! {
            /// The descriptor of the binary elementwise family (broadcasting as in
            /// numpy): one variant per op, naming its forward kernel
            /// ([`ExecContext::binary`]) and its backward kernel
            /// ([`ExecContext::binary_backward`]). The named methods (`ctx.add(&a, &b)`)
            /// run the same kernels; the autograd layer records one variant per node.
            BinaryOp,
            "Every binary op, in declaration order.",
            "The op's name (the name of its `ExecContext` method, used in errors and graph nodes)." {
                $($(#[$doc])* $name / $variant),*
            }
        }

        impl BinaryOp {
            /// Whether the op's backward kernel reads the forward operands
            /// (`add` and `sub` need only their shapes, so a caller may drop the
            /// operands and pass `None` to [`ExecContext::binary_backward`]).
            pub fn keeps_operands(self) -> bool {
                match self {$(BinaryOp::$variant => binary_ops!(@keeps $($oa)?)),*}
            }

            /// The op's output shape for operands of shapes `a` and `b`: their
            /// numpy broadcast (right-aligned; equal dims or 1). The forward
            /// kernels take their output shape from here.
            ///
            /// # Errors
            /// [`ExecError::ShapeMismatch`] naming the op if the shapes do not
            /// broadcast.
            pub fn out_shape(self, a: &[usize], b: &[usize]) -> Result<Dims, ExecError> {
                broadcast_shapes(self.name(), a, b)
            }
        }

        impl ExecContext {
            /// Runs the forward kernel of the binary op `op` (the same kernel, and
            /// the same bits, as the op's named method).
            ///
            /// # Errors
            /// [`ExecError::ShapeMismatch`] if the shapes do not broadcast;
            /// [`ExecError::OutOfMemory`].
            pub fn binary(&self, op: BinaryOp, a: &RawTensor, b: &RawTensor) -> Result<RawTensor, ExecError> {
                match op {$(BinaryOp::$variant => self.$name(a, b)),*}
            }
        }

        impl ExecContext {$(
            $(#[$doc])*
            ///
            /// Operands broadcast as in numpy (right-aligned; equal dims or 1) and may
            /// have any layout.
            ///
            /// # Errors
            /// [`ExecError::ShapeMismatch`] if the shapes do not broadcast;
            /// [`ExecError::OutOfMemory`].
            pub fn $name(&self, a: &RawTensor, b: &RawTensor) -> Result<RawTensor, ExecError> {
                let shape = BinaryOp::$variant.out_shape(a.shape(), b.shape())?;
                self.map2_to(stringify!($name), &shape, a, b, CHEAP, |$a: f32, $b: f32| $e)
            }
        )*}

        impl ExecContext {
            /// Runs the backward kernel of the binary op `op`: the gradients of both
            /// operands, each of the broadcast (output) shape (reduce them to the operand
            /// shapes with `sum_to`). `operands` are the forward operands `(a, b)`; ops
            /// whose [`keeps_operands`](BinaryOp::keeps_operands) is false ignore them.
            /// `needs[i]` says whether operand `i`'s gradient is wanted; an unwanted one
            /// is `None` (`pow`, `maximum` and `minimum` compute both in one pass and
            /// return both).
            ///
            /// # Errors
            /// [`ExecError::InvalidArgument`] if `op` reads its operands and `operands`
            /// is `None`; [`ExecError::ShapeMismatch`] if the shapes do not broadcast;
            /// [`ExecError::OutOfMemory`].
            pub fn binary_backward(
                &self,
                op: BinaryOp,
                operands: Option<(&RawTensor, &RawTensor)>,
                grad: &RawTensor,
                needs: [bool; 2],
            ) -> Result<(Option<RawTensor>, Option<RawTensor>), ExecError> {
                let want = |i: usize, f: &dyn Fn() -> Result<RawTensor, ExecError>| {
                    if needs[i] { f().map(Some) } else { Ok(None) }
                };
                let operands = || {
                    operands.ok_or(ExecError::InvalidArgument {
                        op: "binary_backward",
                        reason: "this op's backward reads the forward operands; pass them",
                    })
                };
                match op {$(
                    BinaryOp::$variant => {
                        let $c = self;
                        let $g = grad;
                        $(let ($oa, $ob) = operands()?;)?
                        binary_ops!(@grads want, $form $args)
                    }
                )*}
            }
        }
    };
}

binary_ops! {
    /// `a + b`.
    add / Add => |x, y| x + y,
        backward |_, g| each(Ok(g.clone()), Ok(g.clone()));
    /// `a - b`.
    sub / Sub => |x, y| x - y,
        backward |ctx, g| each(Ok(g.clone()), ctx.neg(g));
    /// `a * b`.
    mul / Mul => |x, y| x * y,
        backward |ctx, g, a, b| each(ctx.mul(g, b), ctx.mul(g, a));
    /// `a / b` (IEEE: division by zero gives ±inf or NaN).
    div / Div => |x, y| x / y,
        backward |ctx, g, a, b| each(ctx.div(g, b), {
            // d(a/b)/db = -a / b^2
            let t = ctx.div(&ctx.div(a, b)?, b)?;
            ctx.neg(&ctx.mul(g, &t)?)
        });
    /// The larger of `a` and `b` (NaN if either is NaN, as `torch.maximum`).
    maximum / Maximum => |x, y| if x.is_nan() || y.is_nan() { f32::NAN } else { x.max(y) },
        backward |ctx, g, a, b| both(ctx.extremum_backward(a, b, g, true));
    /// The smaller of `a` and `b` (NaN if either is NaN, as `torch.minimum`).
    minimum / Minimum => |x, y| if x.is_nan() || y.is_nan() { f32::NAN } else { x.min(y) },
        backward |ctx, g, a, b| both(ctx.extremum_backward(a, b, g, false));
    /// `a` to the power `b` (`f32::powf`).
    pow / Pow => |x, y| x.powf(y),
        backward |ctx, g, a, b| both(ctx.pow_backward(a, b, g));
}

macro_rules! compare_ops {
    ($($(#[$doc:meta])* $name:ident / $variant:ident => $op:tt;)*) => {
        op_enum! {
            /// The descriptor of the comparison family (broadcasting as in
            /// [`add`](ExecContext::add), `bool` results): one variant per op, naming
            /// its forward kernel ([`ExecContext::compare`]). Comparisons have no
            /// gradient, so there is no backward kernel (and no autograd method).
            CompareOp,
            "Every comparison, in declaration order.",
            "The op's name (the name of its `ExecContext` method, used in errors)." {
                $($(#[$doc])* $name / $variant),*
            }
        }

        impl ExecContext {
            /// Runs the forward kernel of the comparison `op` (the same kernel,
            /// and the same bits, as the op's named method).
            ///
            /// # Errors
            /// As [`add`](ExecContext::add).
            pub fn compare(&self, op: CompareOp, a: &RawTensor, b: &RawTensor) -> Result<RawTensor<bool>, ExecError> {
                match op {$(CompareOp::$variant => self.$name(a, b)),*}
            }
        }

        impl ExecContext {$(
            $(#[$doc])*
            /// Broadcasting as in [`add`](ExecContext::add); the result is a `bool`
            /// tensor (NaN compares false except in `not_equal`).
            ///
            /// # Errors
            /// As [`add`](ExecContext::add).
            pub fn $name(&self, a: &RawTensor, b: &RawTensor) -> Result<RawTensor<bool>, ExecError> {
                self.map2(stringify!($name), a, b, CHEAP, |x: f32, y: f32| x $op y)
            }
        )*}
    };
}

compare_ops! {
    /// `a == b`.
    equal / Equal => ==;
    /// `a != b`.
    not_equal / NotEqual => !=;
    /// `a < b`.
    less / Less => <;
    /// `a <= b`.
    less_equal / LessEqual => <=;
    /// `a > b`.
    greater / Greater => >;
    /// `a >= b`.
    greater_equal / GreaterEqual => >=;
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident / $variant:ident, $bwd:ident, $cost:expr => |$x:ident| $e:expr, |$gx:ident| $de:expr;)*) => {
        op_enum! {
            /// The descriptor of the unary elementwise family: one variant per op,
            /// naming its forward kernel ([`ExecContext::unary`]) and its backward
            /// kernel ([`ExecContext::unary_backward`]). The named methods
            /// (`ctx.relu(&x)`, `ctx.relu_backward(&x, &g)`) forward to the same
            /// kernels; the autograd layer records one variant per node instead of a
            /// function per op.
            UnaryOp,
            "Every unary op, in declaration order.",
            "The op's name (the name of its `ExecContext` method, used in errors and graph nodes)." {
                $($(#[$doc])* $name / $variant),*
            }
        }

        impl UnaryOp {
            /// The name of the op's backward kernel.
            pub fn backward_name(self) -> &'static str {
                match self {$(UnaryOp::$variant => stringify!($bwd)),*}
            }

            /// The op's output shape for an input of shape `x`: `x` itself (the
            /// unary family is shape-preserving; it accepts every shape).
            pub fn out_shape(self, x: &[usize]) -> Dims {
                Dims::new(x)
            }
        }

        impl ExecContext {
            /// Runs the forward kernel of the unary op `op` on `x` (the same
            /// kernel, and the same bits, as the op's named method).
            ///
            /// # Errors
            /// [`ExecError::OutOfMemory`].
            pub fn unary(&self, op: UnaryOp, x: &RawTensor) -> Result<RawTensor, ExecError> {
                match op {$(UnaryOp::$variant => self.$name(x)),*}
            }

            /// Runs the backward kernel of the unary op `op`: `grad * dop/dx` at
            /// the forward input `x`.
            ///
            /// # Errors
            /// [`ExecError::ShapeMismatch`] if `x` and `grad` do not broadcast;
            /// [`ExecError::OutOfMemory`].
            pub fn unary_backward(
                &self,
                op: UnaryOp,
                x: &RawTensor,
                grad: &RawTensor,
            ) -> Result<RawTensor, ExecError> {
                match op {$(UnaryOp::$variant => self.$bwd(x, grad)),*}
            }
        }

        impl ExecContext {$(
            $(#[$doc])*
            ///
            /// # Errors
            /// [`ExecError::OutOfMemory`].
            pub fn $name(&self, x: &RawTensor) -> Result<RawTensor, ExecError> {
                self.map1(stringify!($name), x, $cost, |$x: f32| $e)
            }

            #[doc = concat!("The backward kernel of [`", stringify!($name), "`](ExecContext::", stringify!($name), "): `grad * d", stringify!($name), "/dx` at the forward input `x`.")]
            ///
            /// # Errors
            /// [`ExecError::ShapeMismatch`] if `x` and `grad` do not broadcast;
            /// [`ExecError::OutOfMemory`].
            #[allow(clippy::neg_multiply)]
            pub fn $bwd(&self, x: &RawTensor, grad: &RawTensor) -> Result<RawTensor, ExecError> {
                self.map2(stringify!($bwd), x, grad, $cost, |$gx: f32, g: f32| g * $de)
            }
        )*}
    };
}

unary_ops! {
    /// `-x`.
    neg / Neg, neg_backward, CHEAP => |x| -x, |_x| -1.0;
    /// `|x|` (its derivative at 0 is taken as 0, as PyTorch's `sign`).
    abs / Abs, abs_backward, CHEAP => |x| x.abs(), |x| if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { 0.0 };
    /// `e^x`, computed without libm so the loop vectorizes (relative error within
    /// `2 * 2^-23`; results in the subnormal range round gradually).
    exp / Exp, exp_backward, TRANSCENDENTAL => |x| math::exp(x), |x| math::exp(x);
    /// Natural logarithm (`-inf` at 0, NaN below), computed without libm (relative
    /// error within `2^-23`).
    log / Log, log_backward, TRANSCENDENTAL => |x| math::log(x), |x| 1.0 / x;
    /// Square root.
    sqrt / Sqrt, sqrt_backward, TRANSCENDENTAL => |x| x.sqrt(), |x| 0.5 / x.sqrt();
    /// `1 / sqrt(x)`.
    rsqrt / Rsqrt, rsqrt_backward, TRANSCENDENTAL => |x| 1.0 / x.sqrt(), |x| -0.5 / (x * x.sqrt());
    /// The logistic function `1 / (1 + e^-x)`, computed without libm (relative
    /// error within `2 * 2^-23` where the result is normal).
    sigmoid / Sigmoid, sigmoid_backward, TRANSCENDENTAL => |x| math::sigmoid(x), |x| { let s = math::sigmoid(x); s * (1.0 - s) };
    /// Hyperbolic tangent, computed without libm (relative error within
    /// `2 * 2^-23`).
    tanh / Tanh, tanh_backward, TRANSCENDENTAL => |x| math::tanh(x), |x| { let t = math::tanh(x); 1.0 - t * t };
    /// `max(x, 0)` (derivative 0 at 0).
    relu / Relu, relu_backward, CHEAP => |x| if x > 0.0 { x } else { 0.0 }, |x| if x > 0.0 { 1.0 } else { 0.0 };
    /// GELU, tanh approximation (PyTorch's `approximate="tanh"`).
    gelu / Gelu, gelu_backward, TRANSCENDENTAL => |x| unary::gelu(x), |x| unary::gelu_grad(x);
    /// Exact GELU `0.5 x (1 + erf(x / sqrt 2))`.
    gelu_erf / GeluErf, gelu_erf_backward, TRANSCENDENTAL => |x| unary::gelu_erf(x), |x| unary::gelu_erf_grad(x);
    /// SiLU (swish) `x * sigmoid(x)`.
    silu / Silu, silu_backward, TRANSCENDENTAL => |x| unary::silu(x), |x| unary::silu_grad(x);
    /// Softplus `ln(1 + e^x)`, linear above 20 (PyTorch's threshold).
    softplus / Softplus, softplus_backward, TRANSCENDENTAL => |x| unary::softplus(x), |x| unary::softplus_grad(x);
    /// Log-sigmoid `ln(1 / (1 + e^-x)) = min(x, 0) - ln(1 + e^-|x|)` (no
    /// overflow for any `x`).
    logsigmoid / LogSigmoid, logsigmoid_backward, TRANSCENDENTAL => |x| unary::logsigmoid(x), |x| unary::logsigmoid_grad(x);
    /// Mish `x * tanh(softplus(x))`.
    mish / Mish, mish_backward, TRANSCENDENTAL => |x| unary::mish(x), |x| unary::mish_grad(x);
    /// Hard swish `x * min(max(x + 3, 0), 6) / 6` (derivative `x / 3 + 1/2` on
    /// `[-3, 3]`, PyTorch's convention at the ends).
    hardswish / Hardswish, hardswish_backward, CHEAP => |x| unary::hardswish(x), |x| unary::hardswish_grad(x);
    /// Sine.
    sin / Sin, sin_backward, TRANSCENDENTAL => |x| x.sin(), |x| x.cos();
    /// Cosine.
    cos / Cos, cos_backward, TRANSCENDENTAL => |x| x.cos(), |x| -x.sin();
}

/// The descriptor of the scalar-parameter elementwise family: one variant per
/// op, holding its scalar parameters and naming its forward kernel
/// ([`ExecContext::scalar_op`]) and its backward kernel
/// ([`ExecContext::scalar_op_backward`]). The named methods (`ctx.scale(&x, 2.0)`)
/// run the same kernels; the autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ScalarOp {
    /// `x * s` ([`ExecContext::scale`]).
    Scale(f32),
    /// `x + s` ([`ExecContext::add_scalar`]).
    AddScalar(f32),
    /// `x ^ p` ([`ExecContext::pow_scalar`]).
    PowScalar(f32),
    /// `x` clamped to `[min, max]` ([`ExecContext::clamp`]).
    Clamp {
        /// The lower bound.
        min: f32,
        /// The upper bound.
        max: f32,
    },
    /// Inverted dropout ([`ExecContext::dropout`]): the mask is a pure function
    /// of `(seed, position)`, regenerated by the backward kernel, never stored.
    Dropout {
        /// The probability of dropping an element (`0 <= p < 1`).
        p: f32,
        /// The seed of the mask.
        seed: u64,
    },
}

impl ScalarOp {
    /// The op's name (the name of its `ExecContext` method, used in errors and
    /// graph nodes).
    pub fn name(self) -> &'static str {
        match self {
            ScalarOp::Scale(_) => "scale",
            ScalarOp::AddScalar(_) => "add_scalar",
            ScalarOp::PowScalar(_) => "pow_scalar",
            ScalarOp::Clamp { .. } => "clamp",
            ScalarOp::Dropout { .. } => "dropout",
        }
    }

    /// The op's output shape for an input of shape `x`: `x` itself (the
    /// scalar-parameter family is shape-preserving; it accepts every shape).
    pub fn out_shape(self, x: &[usize]) -> Dims {
        Dims::new(x)
    }

    /// Whether the op's backward kernel reads the forward input (`scale`,
    /// `add_scalar` and `dropout` do not, so a caller may drop it and pass `None` to
    /// [`ExecContext::scalar_op_backward`]).
    pub fn keeps_input(self) -> bool {
        matches!(self, ScalarOp::PowScalar(_) | ScalarOp::Clamp { .. })
    }
}

impl ExecContext {
    /// Runs the forward kernel of the scalar op `op` on `x` (the same kernel, and
    /// the same bits, as the op's named method).
    ///
    /// # Errors
    /// As the named method: [`ExecError::InvalidArgument`] for unordered or NaN
    /// clamp bounds or a dropout probability outside `0..1`;
    /// [`ExecError::OutOfMemory`].
    pub fn scalar_op(&self, op: ScalarOp, x: &RawTensor) -> Result<RawTensor, ExecError> {
        match op {
            ScalarOp::Scale(s) => self.scale(x, s),
            ScalarOp::AddScalar(s) => self.add_scalar(x, s),
            ScalarOp::PowScalar(p) => self.pow_scalar(x, p),
            ScalarOp::Clamp { min, max } => self.clamp(x, min, max),
            ScalarOp::Dropout { p, seed } => self.dropout(x, p, seed),
        }
    }

    /// Runs the backward kernel of the scalar op `op`: `grad * dop/dx` at the
    /// forward input `x` (ops whose [`keeps_input`](ScalarOp::keeps_input) is
    /// false ignore `x`).
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `op` reads its input and `x` is `None`,
    /// for unordered or NaN clamp bounds, or a dropout probability outside
    /// `0..1`; [`ExecError::ShapeMismatch`] if `x`
    /// and `grad` do not broadcast; [`ExecError::OutOfMemory`].
    pub fn scalar_op_backward(
        &self,
        op: ScalarOp,
        x: Option<&RawTensor>,
        grad: &RawTensor,
    ) -> Result<RawTensor, ExecError> {
        let input = || {
            x.ok_or(ExecError::InvalidArgument {
                op: "scalar_op_backward",
                reason: "this op's backward reads the forward input; pass it",
            })
        };
        match op {
            ScalarOp::Scale(s) => self.scale(grad, s),
            ScalarOp::AddScalar(_) => Ok(grad.clone()),
            ScalarOp::PowScalar(p) => self.pow_scalar_backward(input()?, p, grad),
            ScalarOp::Clamp { min, max } => self.clamp_backward(input()?, min, max, grad),
            ScalarOp::Dropout { p, seed } => self.dropout_backward(grad, p, seed),
        }
    }
}

impl ExecContext {
    /// `x * s`.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn scale(&self, x: &RawTensor, s: f32) -> Result<RawTensor, ExecError> {
        self.map1("scale", x, CHEAP, |v: f32| v * s)
    }

    /// `x + s`.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn add_scalar(&self, x: &RawTensor, s: f32) -> Result<RawTensor, ExecError> {
        self.map1("add_scalar", x, CHEAP, |v: f32| v + s)
    }

    /// `x` to the power `p` (`f32::powf`; `p == 2` is computed as `x * x`).
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn pow_scalar(&self, x: &RawTensor, p: f32) -> Result<RawTensor, ExecError> {
        if p == 2.0 {
            return self.map1("pow_scalar", x, CHEAP, |v: f32| v * v);
        }
        self.map1("pow_scalar", x, TRANSCENDENTAL, |v: f32| v.powf(p))
    }

    /// The backward kernel of [`pow_scalar`](ExecContext::pow_scalar):
    /// `grad * p * x^(p-1)`.
    ///
    /// # Errors
    /// As [`sub`](ExecContext::sub).
    pub fn pow_scalar_backward(
        &self,
        x: &RawTensor,
        p: f32,
        grad: &RawTensor,
    ) -> Result<RawTensor, ExecError> {
        if p == 2.0 {
            return self.map2("pow_scalar_backward", x, grad, CHEAP, |v: f32, g: f32| {
                g * 2.0 * v
            });
        }
        self.map2(
            "pow_scalar_backward",
            x,
            grad,
            TRANSCENDENTAL,
            |v: f32, g: f32| g * p * v.powf(p - 1.0),
        )
    }

    /// `x` clamped to `[min, max]` (NaN stays NaN).
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `min > max` or either bound is NaN;
    /// [`ExecError::OutOfMemory`].
    pub fn clamp(&self, x: &RawTensor, min: f32, max: f32) -> Result<RawTensor, ExecError> {
        check_bounds("clamp", min, max)?;
        self.map1("clamp", x, CHEAP, |v: f32| {
            if v < min {
                min
            } else if v > max {
                max
            } else {
                v
            }
        })
    }

    /// The backward kernel of [`clamp`](ExecContext::clamp): `grad` where
    /// `min <= x <= max`, else 0.
    ///
    /// # Errors
    /// As [`clamp`](ExecContext::clamp), and [`ExecError::ShapeMismatch`] if `x` and
    /// `grad` do not broadcast.
    pub fn clamp_backward(
        &self,
        x: &RawTensor,
        min: f32,
        max: f32,
        grad: &RawTensor,
    ) -> Result<RawTensor, ExecError> {
        check_bounds("clamp_backward", min, max)?;
        self.map2("clamp_backward", x, grad, CHEAP, |v: f32, g: f32| {
            if v >= min && v <= max { g } else { 0.0 }
        })
    }

    /// The backward kernels of [`pow`](ExecContext::pow): `(grad * b * a^(b-1),
    /// grad * a^b * ln a)`, each of the broadcast shape (reduce them to the operand
    /// shapes with `sum_to`).
    ///
    /// # Errors
    /// As [`pow`](ExecContext::pow).
    pub fn pow_backward(
        &self,
        a: &RawTensor,
        b: &RawTensor,
        grad: &RawTensor,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let t = self.map2("pow_backward", a, b, TRANSCENDENTAL, |x: f32, y: f32| {
            y * x.powf(y - 1.0)
        })?;
        let ga = self.mul(&t, grad)?;
        let u = self.map2("pow_backward", a, b, TRANSCENDENTAL, |x: f32, y: f32| {
            x.powf(y) * x.ln()
        })?;
        let gb = self.mul(&u, grad)?;
        Ok((ga, gb))
    }

    /// The backward kernels of [`maximum`](ExecContext::maximum) (or of
    /// [`minimum`](ExecContext::minimum) with `max = false`): the gradient goes to
    /// the operand that was selected; on ties it is split evenly (as PyTorch).
    /// Both results have the broadcast shape.
    ///
    /// # Errors
    /// As [`maximum`](ExecContext::maximum).
    pub fn extremum_backward(
        &self,
        a: &RawTensor,
        b: &RawTensor,
        grad: &RawTensor,
        max: bool,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let wa = self.map2("extremum_backward", a, b, CHEAP, move |x: f32, y: f32| {
            if x == y {
                0.5
            } else if (x > y) == max {
                1.0
            } else {
                0.0
            }
        })?;
        let ga = self.mul(&wa, grad)?;
        let gb = self.map2("extremum_backward", &wa, grad, CHEAP, |w: f32, g: f32| {
            (1.0 - w) * g
        })?;
        Ok((ga, gb))
    }

    /// `cond ? a : b` elementwise, all three broadcast together.
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`] if the shapes do not broadcast;
    /// [`ExecError::OutOfMemory`].
    pub fn where_(
        &self,
        cond: &RawTensor<bool>,
        a: &RawTensor,
        b: &RawTensor,
    ) -> Result<RawTensor, ExecError> {
        let shape = MaskOp::Where.out_shape(cond.shape(), a.shape(), Some(b.shape()))?;
        self.map3(
            "where_",
            &shape,
            cond,
            a,
            b,
            |c: bool, x: f32, y: f32| {
                if c { x } else { y }
            },
        )
    }

    /// `x` with `value` where `mask` is true (`mask` broadcasts to `x`'s shape; the
    /// result has `x`'s shape).
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`] if `mask` does not broadcast to `x`'s shape;
    /// [`ExecError::OutOfMemory`].
    pub fn masked_fill(
        &self,
        x: &RawTensor,
        mask: &RawTensor<bool>,
        value: f32,
    ) -> Result<RawTensor, ExecError> {
        let shape = MaskOp::MaskedFill(value).out_shape(mask.shape(), x.shape(), None)?;
        let m = mask.broadcast_to(&shape)?;
        self.map2_to("masked_fill", &shape, x, &m, CHEAP, |v: f32, c: bool| {
            if c { value } else { v }
        })
    }

    /// `x + y`, consuming `x`: when `x` is the only handle to its storage,
    /// contiguous, and the broadcast result has `x`'s shape, the sum is written into
    /// `x`'s storage (no allocation); otherwise it falls back to [`add`](ExecContext::add).
    ///
    /// # Errors
    /// As [`add`](ExecContext::add); on error `x` is dropped.
    pub fn take_add_no_grad(&self, x: RawTensor, y: &RawTensor) -> Result<RawTensor, ExecError> {
        self.take_binary("take_add_no_grad", x, y, |a, b| a + b)
    }

    /// `x * s`, consuming `x` and reusing its storage when it is unique (see
    /// [`take_add_no_grad`](ExecContext::take_add_no_grad)).
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] (only when the storage cannot be reused).
    pub fn take_scale_no_grad(&self, mut x: RawTensor, s: f32) -> Result<RawTensor, ExecError> {
        if !x.is_contiguous() || !x.is_unique() {
            return self.scale(&x, s);
        }
        let data = x.data_mut()?;
        self.par_rows(data, 1, CHEAP, |_, o| {
            vectorized!(for v in o.iter_mut() {
                *v *= s;
            })
        });
        Ok(x)
    }

    fn take_binary(
        &self,
        op: &'static str,
        mut x: RawTensor,
        y: &RawTensor,
        f: impl Fn(f32, f32) -> f32 + Sync,
    ) -> Result<RawTensor, ExecError> {
        let shape = broadcast_shapes(op, x.shape(), y.shape())?;
        if shape.as_slice() != x.shape() || !x.is_contiguous() || !x.is_unique() {
            return self.map2(op, &x, y, CHEAP, f);
        }
        let ly = broadcast_layout(op, y.layout(), &shape)?;
        let lx = *x.layout();
        let geom = Geom::new(&shape, [&lx, &ly]);
        let [_, sy] = geom.inner_strides();
        let yv: &[f32] = y.buffer();
        let off = x.offset();
        let data = x.data_mut()?;
        self.par_rows(data, 1, CHEAP, |r, o| {
            let start = r.start;
            geom.for_segments(r, |pos, len, [bx, by]| {
                debug_assert_eq!(bx, off + pos);
                let seg = &mut o[pos - start..pos - start + len];
                vectorized!(seg_inplace(seg, yv, by, sy, &f));
            });
        });
        Ok(x)
    }

    /// Inverted dropout: each element is kept with probability `1 - p` and scaled
    /// by `1 / (1 - p)`, or set to 0. Element `i` (row-major) is dropped iff
    /// `u_i < p` with `u_i = (fucina_rng::at(seed, i) >> 11) * 2^-53`, so the mask is
    /// a pure function of `(seed, i)`: never stored, regenerated by
    /// [`dropout_backward`](ExecContext::dropout_backward), identical for any
    /// chunking or team size. `p == 0` returns a copy.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] unless `0 <= p < 1`; [`ExecError::OutOfMemory`].
    pub fn dropout(&self, x: &RawTensor, p: f32, seed: u64) -> Result<RawTensor, ExecError> {
        self.dropout_apply("dropout", x, p, seed)
    }

    /// The backward kernel of [`dropout`](ExecContext::dropout) with the same `p` and
    /// `seed`: the same mask and scale applied to `grad`.
    ///
    /// # Errors
    /// As [`dropout`](ExecContext::dropout).
    pub fn dropout_backward(
        &self,
        grad: &RawTensor,
        p: f32,
        seed: u64,
    ) -> Result<RawTensor, ExecError> {
        self.dropout_apply("dropout_backward", grad, p, seed)
    }

    fn dropout_apply(
        &self,
        op: &'static str,
        x: &RawTensor,
        p: f32,
        seed: u64,
    ) -> Result<RawTensor, ExecError> {
        if !(0.0..1.0).contains(&p) {
            return Err(ExecError::InvalidArgument {
                op,
                reason: "the dropout probability must satisfy 0 <= p < 1",
            });
        }
        let src = self.contiguous(x)?;
        let xs = src.contiguous_slice();
        let scale = 1.0 / (1.0 - p);
        let threshold = f64::from(p);
        self.new_tensor(op, x.shape(), |out| {
            self.par_rows(out, 1, 4, |r, o| {
                for ((o, &v), i) in o.iter_mut().zip(&xs[r.clone()]).zip(r.start as u64..) {
                    let u = (fucina_rng::at(seed, i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
                    *o = if u < threshold { 0.0 } else { v * scale };
                }
            });
        })
    }
}

/// The descriptor of the mask-selection family: one variant per op, holding
/// its parameters and naming its forward kernel ([`ExecContext::mask_op`]) and
/// its backward kernel ([`ExecContext::mask_op_backward`]). The named methods
/// (`ctx.where_(&cond, &a, &b)`, `ctx.masked_fill(&x, &mask, v)`) run the same
/// kernels; the autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum MaskOp {
    /// `mask ? x : other` ([`ExecContext::where_`]; both operands take
    /// gradients).
    Where,
    /// `mask ? value : x` ([`ExecContext::masked_fill`]; one operand).
    MaskedFill(f32),
}

/// The error of a mask op given the wrong number of operands.
const MASK_ARITY_ERROR: ExecError = ExecError::InvalidArgument {
    op: "mask_op",
    reason: "where takes two operands, masked_fill one",
};

impl MaskOp {
    /// The op's name (`where` for [`where_`](ExecContext::where_), whose method
    /// name has a trailing underscore only because `where` is a Rust keyword;
    /// used in graph nodes).
    pub fn name(self) -> &'static str {
        match self {
            MaskOp::Where => "where",
            MaskOp::MaskedFill(_) => "masked_fill",
        }
    }

    /// The op's output shape for a mask of shape `mask`, the operand `x` and
    /// (for `where`) the second operand `other`: for `where` the broadcast of
    /// all three; for `masked_fill` `x`'s shape, to which the mask must
    /// broadcast. The forward kernels take their output shape from here.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `other` is given to an op of
    /// [`arity`](MaskOp::arity) 1 or missing for `where` (as
    /// [`ExecContext::mask_op`]); [`ExecError::ShapeMismatch`] if the shapes
    /// do not broadcast (naming `where_` or `masked_fill`).
    pub fn out_shape(
        self,
        mask: &[usize],
        x: &[usize],
        other: Option<&[usize]>,
    ) -> Result<Dims, ExecError> {
        match (self, other) {
            (MaskOp::Where, Some(other)) => {
                let xy = broadcast_shapes("where_", x, other)?;
                broadcast_shapes("where_", mask, &xy)
            }
            (MaskOp::MaskedFill(_), None) => match broadcast_shapes("masked_fill", mask, x) {
                Ok(shape) if shape.as_slice() == x => Ok(shape),
                _ => Err(ExecError::ShapeMismatch {
                    op: "masked_fill",
                    lhs: Dims::new(x),
                    rhs: Dims::new(mask),
                    reason: "the mask does not broadcast to the tensor's shape",
                }),
            },
            _ => Err(MASK_ARITY_ERROR),
        }
    }

    /// How many value operands the op takes (`where`: 2, `masked_fill`: 1).
    pub fn arity(self) -> usize {
        match self {
            MaskOp::Where => 2,
            MaskOp::MaskedFill(_) => 1,
        }
    }
}

impl ExecContext {
    /// Runs the forward kernel of the mask op `op` (the same kernel, and the
    /// same bits, as the op's named method): `where_(mask, x, other)` or
    /// `masked_fill(x, mask, value)`. `other` is the second operand of
    /// [`MaskOp::Where`]; ops of [`arity`](MaskOp::arity) 1 take `None`.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `other` is given to an op of arity 1
    /// or missing for `where`; otherwise as the named method.
    pub fn mask_op(
        &self,
        op: MaskOp,
        mask: &RawTensor<bool>,
        x: &RawTensor,
        other: Option<&RawTensor>,
    ) -> Result<RawTensor, ExecError> {
        match (op, other) {
            (MaskOp::Where, Some(other)) => self.where_(mask, x, other),
            (MaskOp::MaskedFill(value), None) => self.masked_fill(x, mask, value),
            _ => Err(MASK_ARITY_ERROR),
        }
    }

    /// Runs the backward kernel of the mask op `op`: the gradients of its
    /// operands from the output gradient `grad`, each where the mask selected
    /// that operand and 0 elsewhere. For `where` both have the broadcast
    /// (output) shape (reduce them to the operand shapes with `sum_to`); for
    /// `masked_fill` the second is `None`. `needs[i]` says whether operand
    /// `i`'s gradient is wanted; an unwanted one is `None`.
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`] if the shapes do not broadcast;
    /// [`ExecError::OutOfMemory`].
    pub fn mask_op_backward(
        &self,
        op: MaskOp,
        mask: &RawTensor<bool>,
        grad: &RawTensor,
        needs: [bool; 2],
    ) -> Result<(Option<RawTensor>, Option<RawTensor>), ExecError> {
        match op {
            MaskOp::Where => {
                let zero = self.scalar(0.0)?;
                let ga = match needs[0] {
                    true => Some(self.where_(mask, grad, &zero)?),
                    false => None,
                };
                let gb = match needs[1] {
                    true => Some(self.where_(mask, &zero, grad)?),
                    false => None,
                };
                Ok((ga, gb))
            }
            MaskOp::MaskedFill(_) => {
                let ga = match needs[0] {
                    true => Some(self.masked_fill(grad, mask, 0.0)?),
                    false => None,
                };
                Ok((ga, None))
            }
        }
    }
}

/// The rows `rows` (of the geometry's inner length) of a one-operand map whose
/// operand is read with a non-unit inner stride: groups of [`TILE`] consecutive
/// rows are written tile by tile ([`tiled_rows`]). Each output element is still
/// `f` of its own input, so the grouping changes no result.
fn map1_tiled<A: Copy, O: Copy>(
    geom: &Geom<1>,
    rows: Range<usize>,
    o: &mut [O],
    xs: &[A],
    f: &impl Fn(A) -> O,
) {
    let inner = geom.inner();
    let [sx] = geom.inner_strides();
    let mut bases = [0usize; TILE];
    let mut n = 0;
    let mut done = 0;
    geom.for_segments(rows.start * inner..rows.end * inner, |_, len, [bx]| {
        debug_assert_eq!(len, inner);
        bases[n] = bx;
        n += 1;
        if n == TILE {
            tiled_rows(&mut o[done..done + n * inner], inner, xs, &bases, sx, f);
            done += n * inner;
            n = 0;
        }
    });
    if n > 0 {
        tiled_rows(
            &mut o[done..done + n * inner],
            inner,
            xs,
            &bases[..n],
            sx,
            f,
        );
    }
}

/// `out[j] = f(c[bc + j*sc], a[.., ..], b[.., ..])` for a segment (stride 1 and 0
/// specialised for the two value operands).
#[inline(always)]
fn seg3<C: Copy, A: Copy, B: Copy, O>(
    out: &mut [O],
    (c, bc, sc): (&[C], usize, usize),
    (a, ba, sa): (&[A], usize, usize),
    (b, bb, sb): (&[B], usize, usize),
    f: &impl Fn(C, A, B) -> O,
) {
    let n = out.len();
    if (sc, sa, sb) == (1, 1, 1) {
        let (c, a, b) = (&c[bc..bc + n], &a[ba..ba + n], &b[bb..bb + n]);
        for (((o, &z), &x), &y) in out.iter_mut().zip(c).zip(a).zip(b) {
            *o = f(z, x, y);
        }
    } else {
        for (j, o) in out.iter_mut().enumerate() {
            *o = f(c[bc + j * sc], a[ba + j * sa], b[bb + j * sb]);
        }
    }
}

/// `seg[j] = f(seg[j], y[by + j*sy])` (stride 1 and 0 specialised).
#[inline(always)]
fn seg_inplace(seg: &mut [f32], y: &[f32], by: usize, sy: usize, f: &impl Fn(f32, f32) -> f32) {
    let n = seg.len();
    match sy {
        1 => {
            for (v, &w) in seg.iter_mut().zip(&y[by..by + n]) {
                *v = f(*v, w);
            }
        }
        0 => {
            let w = y[by];
            for v in seg.iter_mut() {
                *v = f(*v, w);
            }
        }
        _ => {
            for (j, v) in seg.iter_mut().enumerate() {
                *v = f(*v, y[by + j * sy]);
            }
        }
    }
}

fn check_bounds(op: &'static str, min: f32, max: f32) -> Result<(), ExecError> {
    if min.is_nan() || max.is_nan() || min > max {
        return Err(ExecError::InvalidArgument {
            op,
            reason: "clamp bounds must be ordered (min <= max) and not NaN",
        });
    }
    Ok(())
}
