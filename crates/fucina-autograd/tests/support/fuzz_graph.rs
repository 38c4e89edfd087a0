//! Random autograd graphs from bytes: the generator and checker shared by the
//! `autograd_graphs` fuzz target (`fuzz/fuzz_targets/autograd_graphs.rs`, run
//! with `cargo xtask fuzz autograd_graphs`) and the ordinary test
//! `tests/fuzz_graphs.rs`, which runs it over a fixed set of seeds so that CI
//! exercises it without cargo-fuzz. Both include this file with `#[path]`.
//!
//! The bytes drive a small program: leaf variables of random small shapes,
//! then up to [`MAX_OPS`] ops, each taking its
//! operands from the tensors made so far: elementwise (unary, binary, with a
//! scalar), reductions, `matmul`/`linear`, views, `softmax`/`log_softmax`,
//! norms, losses, `concat`/`stack`, indexing with random (also out-of-range)
//! indices, `masked_fill`, `dropout`, `topk`. Shapes, axes and arguments are
//! often wrong on purpose. Then the last tensor is reduced to a scalar and
//! backpropagated, and backward is called a second time.
//!
//! [`check`] asserts:
//! - no panic anywhere (an `Err` is a fine answer to a bad op);
//! - after every `Err` the context still works: a small probe graph computes
//!   and backpropagates the right values on it, and the graph built so far
//!   keeps being used by the later ops and the final backward;
//! - when the graph uses only ops whose derivatives stay bounded (no `div`,
//!   `pow`, `log`, `sqrt`, ...) and every value of the forward is finite and
//!   at most [`TAME`] in magnitude, every gradient is finite;
//! - a second backward of a consumed graph is an `Err` and changes no
//!   gradient;
//! - the same bits on a re-run: the program runs twice, on a 1-thread and on a
//!   2-thread context, and every op's outcome (its output bits or its error
//!   text), the loss and every gradient agree.
#![allow(dead_code, unreachable_pub)]

use fucina_autograd::exec::{ExecContext, RawTensor};
use fucina_autograd::{AutogradError, Tensor};

/// The most ops a program runs.
pub const MAX_OPS: usize = 24;

/// The most elements a tensor kept for later ops may have.
pub const MAX_NUMEL: usize = 4096;

/// Forward values above this magnitude switch the finite-gradient check off
/// for the program (bounded derivatives of bounded values cannot overflow).
pub const TAME: f32 = 1e3;

/// Reads the program's bytes; past the end every read is 0 (a short input is a
/// short program, never an error).
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A dimension: mostly 1..=4, sometimes 0 (refused: no dimension is zero).
    pub fn dim(&mut self) -> usize {
        match self.u8() % 16 {
            0 => 0,
            b => usize::from(b % 4) + 1,
        }
    }

    /// A small shape of rank 0..=3 (rank 0 is refused: a tensor has at least
    /// one dimension).
    pub fn shape(&mut self) -> Vec<usize> {
        let rank = self.below(4);
        (0..rank).map(|_| self.dim()).collect()
    }

    /// An axis for a tensor of rank `rank`: mostly valid, sometimes not.
    pub fn axis(&mut self, rank: usize) -> usize {
        match self.u8() {
            b if b < 16 => rank + usize::from(b % 3),
            b => usize::from(b) % rank.max(1),
        }
    }

    /// A float in `[-2, 2]` (in steps of 1/32).
    pub fn value(&mut self) -> f32 {
        (f32::from(self.u8()) - 128.0) / 64.0
    }

    /// A scalar argument: mostly moderate, sometimes 0, huge or not a number.
    pub fn scalar(&mut self) -> f32 {
        match self.u8() % 32 {
            0 => 0.0,
            1 => f32::NAN,
            2 => f32::INFINITY,
            3 => 1e30,
            _ => self.value(),
        }
    }
}

/// One op's outcome: its output's shape and bits, or its error's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok(Vec<usize>, Vec<u32>),
    Err(String),
}

/// What one run of a program produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub ops: Vec<Outcome>,
    /// The loss's bits, or the error that prevented it.
    pub loss: Outcome,
    /// Backward's result (`None`: Ok).
    pub backward: Option<String>,
    /// Every leaf's gradient bits (`None`: no gradient).
    pub grads: Vec<Option<Vec<u32>>>,
    /// Whether the finite-gradient check applied.
    pub finite_checked: bool,
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

/// The state of one run.
struct Run<'c> {
    ctx: &'c ExecContext,
    /// Every tensor made so far (leaves first).
    pool: Vec<Tensor>,
    leaves: usize,
    ops: Vec<Outcome>,
    /// Only ops with bounded derivatives so far, and every value tame.
    smooth: bool,
}

impl Run<'_> {
    fn pick<'t>(&'t self, b: &mut Bytes<'_>) -> &'t Tensor {
        &self.pool[b.below(self.pool.len())]
    }

    /// A shape for a reshape of `t`: often one with its element count, else
    /// a random one.
    fn reshape_to(b: &mut Bytes<'_>, t: &Tensor) -> Vec<usize> {
        let n = t.numel();
        match b.below(4) {
            0 => b.shape(),
            1 => vec![n],
            2 if n > 0 && n.is_multiple_of(2) => vec![2, n / 2],
            _ => vec![1, n, 1],
        }
    }

    /// `len` indices below `hi`, some out of range (a zero `len` is refused).
    fn i64s(
        &self,
        b: &mut Bytes<'_>,
        len: usize,
        hi: usize,
    ) -> Result<RawTensor<i64>, AutogradError> {
        let v: Vec<i64> = (0..len)
            .map(|_| match b.u8() % 16 {
                0 => -1,
                1 => hi as i64,
                x => i64::from(x) % (hi.max(1) as i64),
            })
            .collect();
        Ok(self.ctx.from_slice_typed::<i64>(&[len], &v)?)
    }

    /// Runs one op chosen by the bytes; `Ok(None)` when the bytes chose nothing
    /// to keep.
    fn op(&mut self, b: &mut Bytes<'_>) -> Result<Option<Tensor>, AutogradError> {
        let ctx = self.ctx;
        let x = self.pick(b).clone();
        let rank = x.shape().len();
        let out = match b.below(20) {
            0 | 1 => {
                let k = b.below(17);
                let bounded = k < 13;
                self.smooth &= bounded;
                match k {
                    0 => x.neg(ctx),
                    1 => x.abs(ctx),
                    2 => x.tanh(ctx),
                    3 => x.sigmoid(ctx),
                    4 => x.relu(ctx),
                    5 => x.gelu(ctx),
                    6 => x.gelu_erf(ctx),
                    7 => x.silu(ctx),
                    8 => x.softplus(ctx),
                    9 => x.sin(ctx),
                    10 => x.cos(ctx),
                    11 => x.logsigmoid(ctx),
                    12 => x.mish(ctx),
                    13 => x.exp(ctx),
                    14 => x.log(ctx),
                    15 => x.sqrt(ctx),
                    _ => x.rsqrt(ctx),
                }?
            }
            2 | 3 => {
                let y = self.pick(b).clone();
                let k = b.below(7);
                self.smooth &= k < 5;
                match k {
                    0 => x.add(ctx, &y),
                    1 => x.sub(ctx, &y),
                    2 => x.mul(ctx, &y),
                    3 => x.maximum(ctx, &y),
                    4 => x.minimum(ctx, &y),
                    5 => x.div(ctx, &y),
                    _ => x.pow(ctx, &y),
                }?
            }
            4 => {
                let (s, t) = (b.scalar(), b.scalar());
                match b.below(4) {
                    0 => x.scale(ctx, s),
                    1 => x.add_scalar(ctx, s),
                    2 => x.clamp(ctx, s, t),
                    _ => {
                        self.smooth = false;
                        x.pow_scalar(ctx, s)
                    }
                }?
            }
            5 | 6 => {
                let (axis, keep) = (b.axis(rank), b.bool());
                match b.below(8) {
                    0 => x.sum(ctx, axis, keep),
                    1 => x.mean(ctx, axis, keep),
                    2 => x.max(ctx, axis, keep),
                    3 => x.min(ctx, axis, keep),
                    4 => x.logsumexp(ctx, axis, keep),
                    5 => x.variance(ctx, axis, keep, b.bool()),
                    6 => x.sum_all(ctx),
                    _ => x.mean_all(ctx),
                }?
            }
            7 => {
                let w = self.pick(b).clone();
                match b.below(3) {
                    0 => x.matmul(ctx, &w),
                    1 => x.linear(ctx, &w, None),
                    _ => {
                        let bias = self.pick(b).clone();
                        x.linear(ctx, &w, Some(&bias))
                    }
                }?
            }
            8 | 9 => match b.below(8) {
                0 => x.reshape(ctx, &Self::reshape_to(b, &x))?,
                1 => {
                    let mut order: Vec<usize> = (0..rank).collect();
                    order.rotate_left(b.below(rank.max(1)));
                    if b.below(4) == 0 {
                        order.push(b.below(4));
                    }
                    x.permute(ctx, &order)?
                }
                2 => x.transpose(ctx, b.axis(rank), b.axis(rank))?,
                3 => {
                    let axis = b.axis(rank);
                    x.narrow(ctx, axis, b.below(4), b.below(4))?
                }
                4 => x.squeeze(ctx, b.axis(rank))?,
                5 => x.unsqueeze(ctx, b.axis(rank + 1))?,
                6 => {
                    let mut to = b.shape();
                    to.extend_from_slice(x.shape());
                    if b.below(3) == 0 {
                        to = b.shape();
                    }
                    x.broadcast_to(ctx, &to)?
                }
                _ => x.materialize(ctx)?,
            },
            10 => {
                let axis = b.axis(rank);
                match b.bool() {
                    true => x.softmax(ctx, axis)?,
                    false => x.log_softmax(ctx, axis)?,
                }
            }
            11 => {
                let eps = [1e-3, 1e-2, 0.1, -1.0, f32::NAN][b.below(5)];
                self.smooth &= eps >= 1e-3;
                let n = x.shape().last().copied().unwrap_or(1);
                let n = if b.below(4) == 0 { b.dim() } else { n };
                let gamma = self.leaf(b, &[n])?;
                match b.bool() {
                    true => {
                        let beta = self.leaf(b, &[n])?;
                        x.layer_norm(ctx, &gamma, &beta, eps)?
                    }
                    false => x.rms_norm(ctx, &gamma, eps)?,
                }
            }
            12 => {
                let rows = x.shape().first().copied().unwrap_or(1);
                let classes = x.shape().get(1).copied().unwrap_or(1);
                let len = if b.below(4) == 0 { b.dim() } else { rows };
                match b.below(3) {
                    0 => {
                        let y = self.pick(b).clone();
                        x.mse_loss(ctx, &y)?
                    }
                    1 => x.cross_entropy(ctx, &self.i64s(b, len, classes)?)?,
                    _ => x.nll_loss(ctx, &self.i64s(b, len, classes)?)?,
                }
            }
            13 => {
                let y = self.pick(b).clone();
                let extra = usize::from(b.bool());
                let axis = b.axis(rank + extra);
                match b.bool() {
                    true => Tensor::concat(ctx, &[&x, &y], axis)?,
                    false => Tensor::stack(ctx, &[&x, &y], axis)?,
                }
            }
            14 => {
                self.smooth = false;
                let axis = b.axis(rank);
                match b.bool() {
                    true => x.l2_normalize(ctx, axis, 1e-6)?,
                    false => {
                        let y = self.pick(b).clone();
                        x.cosine_similarity(ctx, &y, axis, 1e-6)?
                    }
                }
            }
            15 => {
                let axis = b.axis(rank);
                let n = x.shape().get(axis).copied().unwrap_or(1);
                let len = b.below(5);
                match b.below(3) {
                    0 => x.index_select(ctx, axis, &self.i64s(b, len, n)?)?,
                    1 => x.embedding(ctx, &self.i64s(b, len, n)?)?,
                    _ => {
                        // An index tensor of x's shape (or another), along `axis`.
                        let shape = match b.bool() {
                            true => x.shape().to_vec(),
                            false => b.shape(),
                        };
                        let len: usize = shape.iter().product();
                        let idx = self.i64s(b, len, n)?;
                        let idx = match idx.reshape(&shape) {
                            Ok(i) => i,
                            Err(_) => idx,
                        };
                        x.gather(ctx, axis, &idx)?
                    }
                }
            }
            16 => {
                let shape = match b.below(4) {
                    0 => b.shape(),
                    _ => x.shape().to_vec(),
                };
                let len: usize = shape.iter().product();
                let m: Vec<bool> = (0..len).map(|_| b.bool()).collect();
                let mask = ctx.from_slice_typed::<bool>(&shape, &m)?;
                x.masked_fill(ctx, &mask, b.scalar())?
            }
            17 => {
                let p = [0.0, 0.25, 0.5, 0.9, 1.0, -0.5, f32::NAN][b.below(7)];
                x.dropout(ctx, p, u64::from(b.u8()))?
            }
            18 => {
                let (k, axis) = (b.below(4), b.axis(rank));
                x.topk(ctx, k, axis, b.bool())?.0
            }
            _ => {
                let shape = b.shape();
                self.leaf(b, &shape)?
            }
        };
        Ok((out.numel() <= MAX_NUMEL).then_some(out))
    }

    /// A fresh leaf variable of `shape` with values from the bytes.
    fn leaf(&mut self, b: &mut Bytes<'_>, shape: &[usize]) -> Result<Tensor, AutogradError> {
        // At most 4^3 elements: the generator's shapes are small.
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| b.value()).collect();
        let t = Tensor::variable_from_slice(self.ctx, shape, &v)?;
        Ok(t)
    }
}

/// Runs `data` as a program on `ctx` and records everything it produced,
/// asserting the per-run properties (see the module docs).
pub fn run(ctx: &ExecContext, data: &[u8]) -> Trace {
    let mut b = Bytes::new(data);
    let mut r = Run {
        ctx,
        pool: Vec::new(),
        leaves: 0,
        ops: Vec::new(),
        smooth: true,
    };
    for _ in 0..1 + b.below(3) {
        let rank = 1 + b.below(3);
        let shape: Vec<usize> = (0..rank).map(|_| 1 + b.below(4)).collect();
        let t = r.leaf(&mut b, &shape).expect("a small leaf");
        r.pool.push(t);
    }
    r.leaves = r.pool.len();
    for _ in 0..MAX_OPS {
        if b.done() {
            break;
        }
        match r.op(&mut b) {
            Ok(Some(t)) => {
                let v = t.to_vec();
                r.smooth &= v.iter().all(|x| x.is_finite() && x.abs() <= TAME);
                r.ops.push(Outcome::Ok(t.shape().to_vec(), bits(&t)));
                r.pool.push(t);
            }
            Ok(None) => r.ops.push(Outcome::Ok(Vec::new(), Vec::new())),
            Err(e) => {
                r.ops.push(Outcome::Err(e.to_string()));
                probe(ctx);
            }
        }
    }
    let last = r.pool.last().expect("at least one leaf").clone();
    let loss = last.sum_all(ctx);
    let (loss_outcome, backward) = match &loss {
        Ok(l) => {
            r.smooth &= l.to_vec().iter().all(|x| x.is_finite());
            let bw = l.backward(ctx).err().map(|e| e.to_string());
            (Outcome::Ok(l.shape().to_vec(), bits(l)), bw)
        }
        Err(e) => (Outcome::Err(e.to_string()), None),
    };
    let grads = |r: &Run<'_>| -> Vec<Option<Vec<u32>>> {
        r.pool[..r.leaves]
            .iter()
            .map(|leaf| leaf.grad(ctx).expect("a gradient copy").map(|g| bits(&g)))
            .collect()
    };
    let g = grads(&r);
    let finite_checked = loss.is_ok() && backward.is_none() && r.smooth;
    if finite_checked {
        for (i, grad) in g.iter().enumerate() {
            if let Some(grad) = grad {
                assert!(
                    grad.iter().all(|&v| f32::from_bits(v).is_finite()),
                    "leaf {i}: a gradient is not finite although every forward value is \
                     finite and tame and every op has bounded derivatives: {:?}",
                    grad.iter().map(|&v| f32::from_bits(v)).collect::<Vec<_>>()
                );
            }
        }
    }
    if let Ok(l) = &loss {
        assert!(
            l.backward(ctx).is_err(),
            "a second backward of a consumed (or absent) graph is an Err"
        );
        assert_eq!(grads(&r), g, "a refused second backward changed a gradient");
    }
    drop(loss);
    probe(ctx);
    Trace {
        ops: r.ops,
        loss: loss_outcome,
        backward,
        grads: g,
        finite_checked,
    }
}

/// A small graph on `ctx` that must work after any error:
/// `d/dv sum(v * v + v) = 2v + 1`.
pub fn probe(ctx: &ExecContext) {
    let v = Tensor::variable_from_slice(ctx, &[3], &[1.0, -2.0, 0.5]).expect("probe leaf");
    let y = v
        .mul(ctx, &v)
        .and_then(|s| s.add(ctx, &v))
        .and_then(|s| s.sum_all(ctx))
        .expect("probe forward");
    assert_eq!(y.to_vec(), [4.75], "probe forward");
    y.backward(ctx).expect("probe backward");
    let g = v.grad(ctx).expect("probe gradient").expect("a gradient");
    assert_eq!(g.to_vec(), [3.0, -3.0, 2.0], "probe gradient");
}

/// Runs `data` on a 1-thread and on a 2-thread context and asserts both runs
/// produced the same trace (see the module docs); returns it.
pub fn check(data: &[u8]) -> Trace {
    let first = {
        let ctx = ExecContext::with_threads(1);
        run(&ctx, data)
    };
    let second = {
        let ctx = ExecContext::with_threads(2);
        run(&ctx, data)
    };
    assert_eq!(first, second, "a re-run (2 threads) gave other results");
    first
}
