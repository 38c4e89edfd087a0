//! `matmul`, `linear`, their backward kernels, and the right-hand-side lifetime
//! promise with its cache of packed right-hand sides.
//!
//! Every product here runs the blocked GEMM of `kernels::gemm`: operands are read
//! through their strides while packing (a transposed, narrowed or broadcast view is
//! never materialized; on the AVX-512 path a row-major right-hand side of whole
//! 32-column panels is read in place, without packing), the output is split by rows only, and each output element
//! is one fused multiply-add chain over `k` in increasing order. The result is
//! therefore bitwise identical for every team size, every batch size (a row's
//! value never depends on the other rows) and every instruction-set path.
//!
//! Products with `m * k * n` below 2^20 run serially on the caller; larger ones
//! split the output rows (over all batches) into the deterministic chunks of the
//! context's team. The micro-tile is 32 columns wide: a right-hand side narrower
//! than that (a matrix-vector product has `n = 1`) wastes the unused lanes, so
//! such products run well below the kernel's peak.

use fucina_storage::Buffer;

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::gemm::{self, GemmArgs, LhsRows, NR, Rhs, a_scratch_len};
use crate::kernels::simd::{self, SimdLevel};
use crate::parallel::for_each_run;
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, MAX_RANK, broadcast_shapes, check_shape};

/// How long the bytes of a matmul right-hand side stay unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RhsLifetime {
    /// Ordinary storage: no prepared form is kept beyond this call.
    #[default]
    Transient,
    /// The caller promises the storage's bytes never change while it lives (a
    /// weight); a prepared form (packed panels) may be cached and reused. Only
    /// storage that does not come from the context's pool may be marked so (pooled
    /// addresses are recycled): [`ExecContext::from_vec`], [`ExecContext::from_shared`],
    /// or [`RawTensor::from_buffer`] over a non-pooled [`Buffer`].
    StableProcess,
}

impl RhsLifetime {
    /// True for [`RhsLifetime::StableProcess`].
    pub fn is_cacheable(self) -> bool {
        matches!(self, RhsLifetime::StableProcess)
    }
}

/// Options of [`ExecContext::matmul_with`] and [`ExecContext::linear_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulOptions {
    /// The right-hand side's lifetime.
    pub rhs_lifetime: RhsLifetime,
}

/// The batched product `out[b] = a[b] · rhs[b]` of two validated operands, with
/// everything the kernels need: sizes, broadcast batch strides, matrix strides.
struct Plan {
    /// Output shape with the matrix dims (`batch ++ [m, n]`).
    out: Dims,
    /// The shape returned to the caller (1-D operands drop their matrix dim).
    result: Dims,
    /// Output batch dims.
    batch: Dims,
    m: usize,
    k: usize,
    n: usize,
    /// Left operand: offset, stride per output batch dim (0 where broadcast), row
    /// and column strides.
    a_off: usize,
    a_bstrides: Dims,
    a_rs: usize,
    a_cs: usize,
    /// Right operand: its own batch dims and their strides (the distinct matrices
    /// to pack), the index stride of each output batch dim into them (0 where
    /// broadcast), offset, row and column strides.
    b_batch: Dims,
    b_batch_strides: Dims,
    b_index_strides: Dims,
    b_off: usize,
    b_rs: usize,
    b_cs: usize,
    /// Number of distinct right-hand matrices (`b_batch` product).
    nb: usize,
}

/// `sum(unravel(idx, dims)[i] * strides[i])`.
fn unravel_dot(mut idx: usize, dims: &[usize], strides: &[usize]) -> usize {
    let mut acc = 0;
    for (&d, &s) in dims.iter().zip(strides).rev() {
        acc += (idx % d) * s;
        idx /= d;
    }
    acc
}

/// The shapes of `a · b` under numpy's rules (a 1-D left operand is a row
/// `[1, k]`, a 1-D right operand a column `[k, 1]`, batch dims broadcast).
struct ProductShape {
    /// The broadcast batch dims.
    batch: Dims,
    m: usize,
    k: usize,
    n: usize,
    /// `batch ++ [m, n]`.
    out: Dims,
    /// `out` without the dims of 1-D operands (`[1]` for two vectors).
    result: Dims,
}

/// The matrix view of an operand's shape: a 1-D left operand is a row `[1, k]`,
/// a 1-D right operand a column `[k, 1]`.
fn matrix_shape(shape: &[usize], left: bool) -> Dims {
    match shape {
        [d] if left => Dims::new(&[1, *d]),
        [d] => Dims::new(&[*d, 1]),
        _ => Dims::new(shape),
    }
}

/// Validates `a · b` (numpy rules: 1-D operands, broadcast batch dims) on the
/// operands' shapes.
/// The operands must be shapes a tensor can have (rank 1 to 8, no zero
/// dimension): `Plan::new` passes tensors' shapes, `ProductOp::out_shape`
/// checks its arguments first.
fn product_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<ProductShape, ExecError> {
    let mismatch = |reason| ExecError::ShapeMismatch {
        op,
        lhs: Dims::new(a),
        rhs: Dims::new(b),
        reason,
    };
    let (a_shape, b_shape) = (matrix_shape(a, true), matrix_shape(b, false));
    let (ar, br) = (a_shape.len(), b_shape.len());
    let (m, k) = (a_shape[ar - 2], a_shape[ar - 1]);
    let (kb, n) = (b_shape[br - 2], b_shape[br - 1]);
    if k != kb {
        return Err(mismatch(
            "inner dimensions differ (a's last dimension must equal b's second-to-last)",
        ));
    }
    let batch = broadcast_shapes(op, &a_shape[..ar - 2], &b_shape[..br - 2])
        .map_err(|_| mismatch("the batch dimensions do not broadcast"))?;
    let mut out = batch;
    if batch.len() + 2 > MAX_RANK {
        return Err(mismatch("the output would have rank above 8"));
    }
    out.push(m);
    out.push(n);
    if out.checked_product().is_none() {
        return Err(ExecError::Overflow { op, shape: out });
    }
    let mut result = batch;
    if a.len() > 1 {
        result.push(m);
    }
    if b.len() > 1 {
        result.push(n);
    }
    if result.is_empty() {
        result.push(1);
    }
    Ok(ProductShape {
        batch,
        m,
        k,
        n,
        out,
        result,
    })
}

impl Plan {
    /// Validates `a · b` (numpy rules: 1-D operands, broadcast batch dims).
    fn new(op: &'static str, a: &RawTensor, b: &RawTensor) -> Result<Plan, ExecError> {
        let ProductShape {
            batch,
            m,
            k,
            n,
            out,
            result,
        } = product_shape(op, a.shape(), b.shape())?;
        // Matrix views of the operands: [k] -> [1, k] on the left, [k] -> [k, 1] on
        // the right.
        let (a_shape, a_str) = matrix_view(a, true);
        let (b_shape, b_str) = matrix_view(b, false);
        let (ar, br) = (a_shape.len(), b_shape.len());
        let bl = batch.len();
        // Per output batch dim: a's stride (0 where a is broadcast), b's index stride.
        let (a_bl, b_bl) = (ar - 2, br - 2);
        let b_batch = Dims::new(&b_shape[..b_bl]);
        let b_batch_strides = Dims::new(&b_str[..b_bl]);
        let (mut a_bstrides, mut b_index_strides) = (Dims::default(), Dims::default());
        for (i, &d) in batch.iter().enumerate() {
            let stride_of = |rank: usize, shape: &[usize], strides: &[usize]| {
                if i + rank >= bl && shape[i + rank - bl] == d && d > 1 {
                    strides[i + rank - bl]
                } else {
                    0
                }
            };
            a_bstrides.push(stride_of(a_bl, &a_shape[..a_bl], &a_str[..a_bl]));
            // Index strides of b's own batch dims, row-major.
            let mut idx_strides = Dims::default();
            let mut acc = 1;
            for &bd in b_batch.iter().rev() {
                idx_strides.push(acc);
                acc *= bd;
            }
            idx_strides.as_mut_slice().reverse();
            b_index_strides.push(stride_of(b_bl, &b_batch, &idx_strides));
        }
        gemm::packed_b_len(k, n)
            .and_then(|l| l.checked_mul(b_batch.checked_product()?))
            .ok_or(ExecError::Overflow { op, shape: out })?;
        Ok(Plan {
            out,
            result,
            batch,
            m,
            k,
            n,
            a_off: a.offset(),
            a_bstrides,
            a_rs: a_str[ar - 2],
            a_cs: a_str[ar - 1],
            nb: b_batch.checked_product().unwrap_or(1),
            b_batch,
            b_batch_strides,
            b_index_strides,
            b_off: b.offset(),
            b_rs: b_str[br - 2],
            b_cs: b_str[br - 1],
        })
    }

    /// The plan of one `[k, n]` right-hand matrix alone (what [`pack_rhs`]
    /// reads), for a one-row left operand.
    fn for_rhs(b: &RawTensor, k: usize, n: usize) -> Plan {
        Plan {
            out: Dims::new(&[1, n]),
            result: Dims::new(&[1, n]),
            batch: Dims::default(),
            m: 1,
            k,
            n,
            a_off: 0,
            a_bstrides: Dims::default(),
            a_rs: k,
            a_cs: 1,
            b_batch: Dims::default(),
            b_batch_strides: Dims::default(),
            b_index_strides: Dims::default(),
            b_off: b.offset(),
            b_rs: b.strides()[0],
            b_cs: b.strides()[1],
            nb: 1,
        }
    }

    /// Storage offset of row `g` (over all batches) of the left operand.
    fn a_row_off(&self, g: usize) -> usize {
        let (bi, i) = (g / self.m, g % self.m);
        self.a_off + unravel_dot(bi, &self.batch, &self.a_bstrides) + i * self.a_rs
    }

    /// Index of the right-hand matrix used by output batch `bi`.
    fn b_index(&self, bi: usize) -> usize {
        unravel_dot(bi, &self.batch, &self.b_index_strides)
    }

    /// Output rows over all batches.
    fn rows(&self) -> usize {
        self.out.checked_product().unwrap_or(0) / self.n.max(1)
    }

    /// Floats of the packed form of one right-hand matrix.
    fn packed_one(&self) -> usize {
        self.n.div_ceil(NR) * self.k * NR
    }

    /// Floats of the packed form of every right-hand matrix.
    fn packed_len(&self) -> usize {
        self.packed_one() * self.nb
    }
}

/// Shape and strides of `x` seen as (a batch of) matrices: a 1-D left operand is a
/// row `[1, k]`, a 1-D right operand a column `[k, 1]`.
fn matrix_view(x: &RawTensor, left: bool) -> (Dims, Dims) {
    if x.rank() >= 2 {
        return (x.dims(), x.layout().stride_dims());
    }
    let (d, s) = (x.shape()[0], x.strides()[0]);
    if left {
        (Dims::new(&[1, d]), Dims::new(&[d * s.max(1), s]))
    } else {
        (Dims::new(&[d, 1]), Dims::new(&[s, 1]))
    }
}

/// Gate of the parallel split: with `work_per_row = k * n / WORK_DIV`, a product
/// goes parallel once `m * k * n` reaches `WORK_DIV * MATMUL_GATE` (2^20). The
/// GEMM keeps its own gate (it was tuned with the matmul benches), separate from
/// the elementwise [`crate::PARALLEL_THRESHOLD`].
const WORK_DIV: usize = 32;

/// The work unit of the matmul gate (see [`WORK_DIV`]).
const MATMUL_GATE: usize = 1 << 15;

/// Preferred least number of output rows per parallel chunk (capped at
/// `rows / threads`): every chunk streams the whole right-hand side through its
/// cache, so small chunks re-read it many times (the plain `k * n` weight gave
/// 8-row chunks for `[64, 784] x [784, 256]` at two threads). Measured on the
/// 2-vCPU AVX-512 machine (`benches/examples/gemm_probe.rs`, 2 threads, two
/// alternating runs): 1024³ ran at 277–297 GFLOP/s with 256-row chunks (4
/// chunks) against 250–256 with 24-row ones (8 chunks of 128 rows); 512³ at
/// 271–294 against 260–298.
const ROW_GRAIN: usize = 256;

/// The `work_per_row` the row split passes to `par_rows` for `rows` output rows
/// (over all batches) of depth `k` and width `n`: below the gate
/// (`rows * k * n < WORK_DIV * MATMUL_GATE`) the plain weight, which keeps
/// the product serial; above it, the weight that makes `par_rows` cut chunks of
/// about `min(ROW_GRAIN, rows / threads)` rows (at least one chunk per
/// participant where there are rows enough). Only the chunking depends on it,
/// never a value.
fn row_split_work(rows: usize, k: usize, n: usize, threads: usize) -> usize {
    let plain = (k.saturating_mul(n) / WORK_DIV).max(1);
    if rows.saturating_mul(plain) < MATMUL_GATE {
        // Scaled to `par_rows`' own threshold, so the product stays serial.
        return plain / (MATMUL_GATE / crate::PARALLEL_THRESHOLD);
    }
    let grain = ROW_GRAIN.min(rows / threads.max(1)).max(1);
    // `par_rows` cuts chunks of `PARALLEL_THRESHOLD / work_per_row` rows.
    (crate::PARALLEL_THRESHOLD / grain).max(1)
}

impl ExecContext {
    /// The matrix product of `a` and `b` with numpy semantics.
    ///
    /// - `[m, k] · [k, n] -> [m, n]`;
    /// - batched `[..., m, k] · [..., k, n] -> [..., m, n]` where the batch dims
    ///   broadcast (e.g. `[2, 1, m, k] · [3, k, n] -> [2, 3, m, n]`);
    /// - a 1-D left operand `[k]` is a row (its `m` dim is dropped from the result),
    ///   a 1-D right operand `[k]` a column (its `n` dim is dropped); two 1-D
    ///   operands give their dot product as shape `[1]`.
    ///
    /// Operands of any layout (transposed, narrowed, broadcast views) are read
    /// through their strides; nothing is materialized. Each output element is the
    /// fused multiply-add chain over `k` in increasing order, so the result is
    /// bitwise identical for every team size and batch size.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let a = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
    /// let b = ctx.from_slice(&[3, 1], &[1., 0., -1.])?;
    /// assert_eq!(ctx.matmul(&a, &b)?.to_vec(), [-2., -2.]);
    /// // a transposed view, read without a copy
    /// let at = a.transpose(0, 1)?; // [3, 2]
    /// assert_eq!(ctx.matmul(&at, &a)?.shape(), [3, 3]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`] naming both shapes when the inner dims differ or
    /// the batch dims do not broadcast; [`ExecError::Overflow`] if the output is too
    /// large; [`ExecError::OutOfMemory`].
    pub fn matmul(&self, a: &RawTensor, b: &RawTensor) -> Result<RawTensor, ExecError> {
        self.matmul_with(a, b, MatmulOptions::default())
    }

    /// [`matmul`](ExecContext::matmul) with options: with
    /// [`RhsLifetime::StableProcess`] the packed panels of `b` are kept in the
    /// context's right-hand-side cache and reused by later calls with the same
    /// storage and layout.
    ///
    /// # The right-hand-side cache
    /// - **Key.** The storage (`Buffer::ptr_eq`) and the layout (shape, strides,
    ///   offset) of `b`. An entry holds a handle to `b`'s storage, so that storage
    ///   stays alive (and its address cannot be handed to another allocation) until
    ///   the entry is evicted: a stale hit is impossible, but a cached weight's
    ///   memory is released only on eviction, [`clear_rhs_cache`](ExecContext::clear_rhs_cache)
    ///   or context teardown.
    /// - **Bounds.** At most 64 entries and 256 MiB of packed panels per context
    ///   (a packed matrix takes `k * ceil(n / 32) * 32` floats per batch matrix);
    ///   inserting past a bound evicts the least recently used entries; a single
    ///   matrix above the byte bound is packed for its call and not kept.
    /// - **When it pays.** Packing moves `k * n` floats of `b` (a transposed view,
    ///   such as a `linear` weight, through gathers or scalar scatter, which costs
    ///   several times a contiguous copy) while the product costs `m * k * n`
    ///   multiply-adds, so the saving shrinks as the number of rows `m` grows. For a
    ///   `[256, 784]` `linear` weight, a hit was 5x-7x faster than packing at
    ///   batch 1, about 2.6x at batch 8 and still 1.2x-1.4x at batch 64 on the
    ///   2-core AVX-512 machine the crate's bench ran on (`benches/matmul.rs`),
    ///   and the relative saving keeps shrinking as the batch grows. A hit costs a
    ///   linear scan of the entries.
    ///
    /// # Errors
    /// As [`matmul`](ExecContext::matmul); [`ExecError::UnstableRhs`] if `b` is
    /// marked `StableProcess` but lives in pooled storage (whose addresses are
    /// recycled), checked before anything is allocated.
    pub fn matmul_with(
        &self,
        a: &RawTensor,
        b: &RawTensor,
        options: MatmulOptions,
    ) -> Result<RawTensor, ExecError> {
        let plan = Plan::new("matmul", a, b)?;
        run_plan(self, "matmul", &plan, a, b, None, options)
    }

    /// `x · wᵀ + bias` (PyTorch's `linear`): `x` is `[..., in]` (or `[in]`), `w` is
    /// `[out, in]`, `bias` is `[out]`; the result is `[..., out]` (or `[out]`).
    /// `wᵀ` is read through strides (no copy).
    ///
    /// Each output element is the fused multiply-add chain over `in`, started from
    /// the bias (or `+0.0`), so row `i` of a batch is bitwise equal to the same row
    /// computed alone.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[1, 2], &[1., 2.])?;
    /// let w = ctx.from_slice(&[3, 2], &[1., 0., 0., 1., 1., 1.])?;
    /// let b = ctx.from_slice(&[3], &[0., 10., 100.])?;
    /// assert_eq!(ctx.linear(&x, &w, Some(&b))?.to_vec(), [1., 12., 103.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `w` is not 2-D; [`ExecError::ShapeMismatch`] if
    /// `x`'s last dim is not `w`'s second, or `bias` is not `[out]`;
    /// [`ExecError::OutOfMemory`].
    pub fn linear(
        &self,
        x: &RawTensor,
        w: &RawTensor,
        bias: Option<&RawTensor>,
    ) -> Result<RawTensor, ExecError> {
        self.linear_with(x, w, bias, MatmulOptions::default())
    }

    /// [`linear`](ExecContext::linear) with options: with
    /// [`RhsLifetime::StableProcess`] the packed panels of `wᵀ` are cached as
    /// described under [`matmul_with`](ExecContext::matmul_with).
    ///
    /// # Errors
    /// As [`linear`](ExecContext::linear); [`ExecError::UnstableRhs`] if `w` is
    /// marked `StableProcess` but lives in pooled storage.
    pub fn linear_with(
        &self,
        x: &RawTensor,
        w: &RawTensor,
        bias: Option<&RawTensor>,
        options: MatmulOptions,
    ) -> Result<RawTensor, ExecError> {
        let op = "linear";
        let wt = check_linear(op, x, w)?;
        if let Some(b) = bias
            && b.shape() != [w.shape()[0]]
        {
            return Err(ExecError::ShapeMismatch {
                op,
                lhs: b.dims(),
                rhs: w.dims(),
                reason: "bias must be [out] for a weight [out, in]",
            });
        }
        let plan = Plan::new(op, x, &wt)?;
        run_plan(self, op, &plan, x, &wt, bias, options)
    }

    /// The gradients of `c = matmul(a, b)` given `grad = dL/dc`:
    /// `grad_a = grad · bᵀ` and `grad_b = aᵀ · grad`, each summed over the batch
    /// dims its operand was broadcast along, so they have `a`'s and `b`'s shapes.
    /// Transposes are strided views (never materialized); the sums over broadcast
    /// batch dims add the per-batch products in increasing batch order.
    ///
    /// # Errors
    /// The errors of [`matmul`](ExecContext::matmul) for `a, b`;
    /// [`ExecError::ShapeMismatch`] if `grad` does not have the product's shape;
    /// [`ExecError::OutOfMemory`].
    pub fn matmul_backward(
        &self,
        a: &RawTensor,
        b: &RawTensor,
        grad: &RawTensor,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let op = "matmul_backward";
        let plan = Plan::new(op, a, b)?;
        if grad.shape() != plan.result.as_slice() {
            return Err(ExecError::ShapeMismatch {
                op,
                lhs: grad.dims(),
                rhs: plan.result,
                reason: "grad must have the shape of matmul(a, b)",
            });
        }
        // Matrix views (1-D operands and the matching grad dims restored).
        let a2 = if a.rank() == 1 {
            a.unsqueeze(0)?
        } else {
            a.clone()
        };
        let b2 = if b.rank() == 1 {
            b.unsqueeze(1)?
        } else {
            b.clone()
        };
        let mut g2 = grad.clone();
        if a.rank() == 1 && b.rank() == 1 {
            g2 = g2.unsqueeze(0)?;
        } else if a.rank() == 1 {
            g2 = g2.unsqueeze(g2.rank() - 1)?;
        } else if b.rank() == 1 {
            g2 = g2.unsqueeze(g2.rank())?;
        }
        let (ar, br) = (a2.rank(), b2.rank());
        let bt = b2.transpose(br - 2, br - 1)?;
        let at = a2.transpose(ar - 2, ar - 1)?;
        // An operand broadcast over batch dims gets the batched product summed
        // down to its shape by `sum_to`: the summation order of every broadcast
        // gradient of the runtime.
        let reduce = |full: RawTensor, target: &[usize]| match full.shape() == target {
            true => Ok(full),
            false => self.sum_to(&full, target),
        };
        let ga = reduce(transient_product(self, op, &g2, &bt)?, a2.shape())?.reshape(a.shape())?;
        let gb = reduce(transient_product(self, op, &at, &g2)?, b2.shape())?.reshape(b.shape())?;
        Ok((ga, gb))
    }

    /// The gradients of `y = linear(x, w, bias)` given `grad = dL/dy`:
    /// `grad_x = grad · w` (shape of `x`), `grad_w = gradᵀ · x` over all leading
    /// rows (shape `[out, in]`, the sum over rows in increasing row order) and
    /// `grad_bias = grad` summed over the rows in increasing order (shape `[out]`;
    /// ignore it when there is no bias).
    ///
    /// `grad` and `x` are flattened to rows for `grad_w` (a copy only when one of
    /// them is not contiguous); `gradᵀ` is a strided view.
    ///
    /// # Errors
    /// The errors of [`linear`](ExecContext::linear) for `x, w`;
    /// [`ExecError::ShapeMismatch`] if `grad` is not `[..., out]` with `x`'s
    /// leading dims; [`ExecError::OutOfMemory`].
    pub fn linear_backward(
        &self,
        x: &RawTensor,
        w: &RawTensor,
        grad: &RawTensor,
    ) -> Result<(RawTensor, RawTensor, RawTensor), ExecError> {
        let op = "linear_backward";
        check_linear_grad(op, x, w, grad)?;
        let (out_f, in_f) = (w.shape()[0], w.shape()[1]);
        let gx = transient_product(self, op, grad, w)?;
        let rows = x.numel() / in_f;
        let g2 = self.contiguous(grad)?.reshape(&[rows, out_f])?;
        let x2 = self.contiguous(x)?.reshape(&[rows, in_f])?;
        let gw = transient_product(self, op, &g2.transpose(0, 1)?, &x2)?;
        let gb = bias_grad(self, op, &g2)?;
        Ok((gx, gw, gb))
    }

    /// Drops every cached packed right-hand side (and the storage handles the
    /// entries hold).
    pub fn clear_rhs_cache(&self) {
        self.rhs_cache().borrow_mut().clear();
    }

    /// Number of packed right-hand sides in the cache.
    pub fn rhs_cache_len(&self) -> usize {
        self.rhs_cache().borrow().len()
    }
}

/// `a · b` for internal callers (transient right-hand side).
fn transient_product(
    ctx: &ExecContext,
    op: &'static str,
    a: &RawTensor,
    b: &RawTensor,
) -> Result<RawTensor, ExecError> {
    let plan = Plan::new(op, a, b)?;
    run_plan(ctx, op, &plan, a, b, None, MatmulOptions::default())
}

/// Packs (or fetches from the cache) the right-hand side, then runs the GEMM
/// over the output rows.
fn run_plan(
    ctx: &ExecContext,
    op: &'static str,
    plan: &Plan,
    a: &RawTensor,
    b: &RawTensor,
    bias: Option<&RawTensor>,
    options: MatmulOptions,
) -> Result<RawTensor, ExecError> {
    let stable = options.rhs_lifetime.is_cacheable();
    if stable && b.buffer().is_pooled() {
        return Err(ExecError::UnstableRhs { op });
    }
    let bias = bias.map(|t| ctx.contiguous(t)).transpose()?;
    let bias = bias.as_ref().map(|t| t.contiguous_slice());
    let len = plan.packed_len();
    let level = simd::level();
    let out = if !stable
        && plan.b_cs == 1
        && gemm::direct_rhs_ok(level, plan.rows(), plan.n, plan.b_rs)
    {
        // Row-major, whole panels: the kernel reads `b` where it lies.
        gemm_out(
            ctx,
            op,
            plan,
            a,
            RhsSource::InPlace(b.buffer()),
            bias,
            level,
        )?
    } else if stable {
        let cached = ctx.rhs_cache().borrow_mut().get(b, len);
        let packed = match cached {
            Some(p) => p,
            None => {
                let mut fresh =
                    Buffer::<f32>::zeroed(len).map_err(|e| ExecError::storage(op, e))?;
                let dst = fresh.get_mut().expect("a fresh buffer is unique");
                pack_rhs(ctx, plan, b, &mut dst[..len]);
                ctx.rhs_cache().borrow_mut().insert(b, fresh.clone(), len);
                fresh
            }
        };
        gemm_out(
            ctx,
            op,
            plan,
            a,
            RhsSource::Packed(&packed[..len]),
            bias,
            level,
        )?
    } else {
        let mut lease = ctx
            .pool()
            .acquire_scratch::<f32>(len)
            .map_err(|e| ExecError::storage(op, e))?;
        pack_rhs(ctx, plan, b, &mut lease);
        gemm_out(ctx, op, plan, a, RhsSource::Packed(&lease), bias, level)?
    };
    if plan.result == plan.out {
        Ok(out)
    } else {
        out.reshape(&plan.result)
    }
}

/// Packs every distinct right-hand matrix of `plan` into `dst`, split by panels
/// over the team once the floats moved reach the parallel gate (packing is
/// pure data movement: the split cannot change a value). Packing a `k x n`
/// matrix is `1/m` of the product's work, but on the calling thread alone it
/// was a fifth of a 2-thread `1024³` product and half of the `[64, 784] x
/// [784, 256]` training shape.
fn pack_rhs(ctx: &ExecContext, plan: &Plan, b: &RawTensor, dst: &mut [f32]) {
    let (k, n) = (plan.k, plan.n);
    let np = n.div_ceil(NR);
    let src: &[f32] = b.buffer();
    let panel = (k * NR).max(1);
    ctx.par_rows(dst, panel, panel, |panels, d| {
        if plan.b_cs == 1 {
            // Row-major: each run of panels of one matrix is packed row by row.
            for_each_run(panels, np, panel, d, |t, run, head| {
                let p = run.start - t * np;
                let off =
                    plan.b_off + unravel_dot(t, &plan.b_batch, &plan.b_batch_strides) + p * NR;
                let ncols = (n - p * NR).min(run.len() * NR);
                gemm::pack_b_rows(head, src, off, plan.b_rs, k, ncols);
            });
            return;
        }
        for (r, d) in panels.zip(d.chunks_exact_mut(panel)) {
            let (t, p) = (r / np, r % np);
            let off = plan.b_off
                + unravel_dot(t, &plan.b_batch, &plan.b_batch_strides)
                + p * NR * plan.b_cs;
            gemm::pack_b_panel(d, src, off, plan.b_rs, plan.b_cs, k, NR.min(n - p * NR));
        }
    });
}

/// Allocates the output and computes it from the right-hand side.
fn gemm_out(
    ctx: &ExecContext,
    op: &'static str,
    plan: &Plan,
    a: &RawTensor,
    rhs: RhsSource<'_>,
    bias: Option<&[f32]>,
    level: SimdLevel,
) -> Result<RawTensor, ExecError> {
    let (m, k, n) = (plan.m, plan.k, plan.n);
    let a_data: &[f32] = a.buffer();
    let work_per_row = row_split_work(plan.rows(), k, n, ctx.threads());
    let mut done = Ok(());
    let out = ctx.new_tensor(op, &plan.out, |out: &mut [f32]| {
        if out.len() == n {
            // A single output row (batch-1 inference): split its columns instead,
            // in whole packed panels.
            done = gemm_one_row(ctx, op, plan, a_data, rhs.matrix(plan, 0), bias, out, level);
            return;
        }
        // Runs of rows that share one right-hand matrix (one batch each, or the
        // whole chunk when every batch shares it).
        let period = if plan.nb == 1 { usize::MAX } else { m };
        let run = |rows: std::ops::Range<usize>, c: &mut [f32], scratch: &mut [f32]| {
            for_each_run(rows, period, n, c, |bi, run, c_seg| {
                if let Some(bias) = bias {
                    for row in c_seg.chunks_exact_mut(n) {
                        row.copy_from_slice(bias);
                    }
                }
                let lhs = LhsRows {
                    data: a_data,
                    row_off: |i| plan.a_row_off(run.start + i),
                    cs: plan.a_cs,
                };
                let t = if plan.nb == 1 { 0 } else { plan.b_index(bi) };
                let args = GemmArgs {
                    level,
                    lhs: &lhs,
                    m: run.len(),
                    k,
                    n,
                    rhs: rhs.matrix(plan, t),
                    accumulate: bias.is_some(),
                };
                gemm::gemm(&args, c_seg, scratch);
            });
        };
        let scratch = a_scratch_len(plan.rows());
        done = ctx.par_rows_with_scratch(op, out, n, work_per_row, scratch, run);
    })?;
    done.map(|()| out)
}

/// The product for a single output row `c` (`n` floats, one batch): groups of
/// `NR` columns (one packed panel each) are split across the team, the
/// remaining `n % NR` columns run on the caller. Every element is the same
/// fused multiply-add chain as on the row-split path.
#[allow(clippy::too_many_arguments)]
fn gemm_one_row(
    ctx: &ExecContext,
    op: &'static str,
    plan: &Plan,
    a_data: &[f32],
    rhs: Rhs<'_>,
    bias: Option<&[f32]>,
    c: &mut [f32],
    level: SimdLevel,
) -> Result<(), ExecError> {
    let (k, n) = (plan.k, plan.n);
    let lhs = LhsRows {
        data: a_data,
        row_off: |_| plan.a_row_off(0),
        cs: plan.a_cs,
    };
    let run = |j0: usize, c: &mut [f32], scratch: &mut [f32]| {
        if let Some(bias) = bias {
            c.copy_from_slice(&bias[j0..j0 + c.len()]);
        }
        let cols = c.len();
        let args = GemmArgs {
            level,
            lhs: &lhs,
            m: 1,
            k,
            n: cols,
            rhs: rhs.cols_from(j0, k),
            accumulate: bias.is_some(),
        };
        gemm::gemm(&args, c, scratch);
    };
    let full = n / NR * NR;
    let work_per_group = (k * NR / WORK_DIV).max(1);
    let (head, tail) = c.split_at_mut(full);
    let scratch = a_scratch_len(1);
    if full > 0 {
        ctx.par_rows_with_scratch(op, head, NR, work_per_group, scratch, |g, cg, s| {
            run(g.start * NR, cg, s)
        })?;
    }
    if !tail.is_empty() {
        // The last `n % NR` columns, on the caller.
        let mut s = ctx
            .pool()
            .acquire_scratch::<f32>(scratch)
            .map_err(|e| ExecError::storage(op, e))?;
        run(full, tail, &mut s);
    }
    Ok(())
}

/// Where the GEMM reads the right-hand matrices of a plan.
#[derive(Clone, Copy)]
enum RhsSource<'a> {
    /// Packed panels of every distinct right-hand matrix, one after the other
    /// ([`Plan::packed_one`] floats each).
    Packed(&'a [f32]),
    /// The right operand's storage, row-major (column stride 1), read in place.
    InPlace(&'a [f32]),
}

impl<'a> RhsSource<'a> {
    /// Right-hand matrix `t` (an index into the plan's distinct matrices).
    fn matrix(self, plan: &Plan, t: usize) -> Rhs<'a> {
        match self {
            RhsSource::Packed(p) => {
                let one = plan.packed_one();
                Rhs::Packed(&p[t * one..][..one])
            }
            RhsSource::InPlace(data) => Rhs::Rows {
                data,
                off: plan.b_off + unravel_dot(t, &plan.b_batch, &plan.b_batch_strides),
                rs: plan.b_rs,
            },
        }
    }
}

/// Validates `linear(x, w)` and a gradient `grad` of its output (`[..., out]`
/// with `x`'s leading dims).
fn check_linear_grad(
    op: &'static str,
    x: &RawTensor,
    w: &RawTensor,
    grad: &RawTensor,
) -> Result<(), ExecError> {
    let want = linear_shape(op, x.shape(), w.shape())?;
    if grad.shape() != want.as_slice() {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: grad.dims(),
            rhs: want,
            reason: "grad must be [..., out] with x's leading dims",
        });
    }
    Ok(())
}

/// The shape of `linear(x, w)`: `[..., out]` with `x`'s leading dims (`[out]`
/// for a 1-D `x`), after checking that `w` is `[out, in]` with `in` equal to
/// `x`'s last dimension. `x` and `w` must be shapes a tensor can have.
fn linear_shape(op: &'static str, x: &[usize], w: &[usize]) -> Result<Dims, ExecError> {
    let (out, inn) = linear_operands(op, x, w)?;
    Ok(product_shape(op, x, &[inn, out])?.result)
}

/// Checks that `w` is `[out, in]` with `in` equal to `x`'s last dimension;
/// returns `(out, in)`.
fn linear_operands(
    op: &'static str,
    x: &[usize],
    w: &[usize],
) -> Result<(usize, usize), ExecError> {
    let &[out, inn] = w else {
        return Err(ExecError::InvalidShape {
            op,
            shape: Dims::new(w),
            reason: "the weight must be 2-D [out, in]",
        });
    };
    if x[x.len() - 1] != inn {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: Dims::new(x),
            rhs: Dims::new(w),
            reason: "x's last dimension must equal the weight's second ([out, in])",
        });
    }
    Ok((out, inn))
}

/// Validates `linear(x, w)` and returns the `wᵀ` view `[in, out]`.
fn check_linear(op: &'static str, x: &RawTensor, w: &RawTensor) -> Result<RawTensor, ExecError> {
    linear_operands(op, x.shape(), w.shape())?;
    w.transpose(0, 1)
}

/// The descriptor of the matrix-product family: one variant per op, naming its
/// forward kernel (run by [`ExecContext::product`]) and its backward kernel
/// (run by [`ExecContext::product_backward`]). The named methods
/// ([`matmul`](ExecContext::matmul), [`linear`](ExecContext::linear) and their
/// `_with` forms) run the same kernels; the autograd layer records one variant
/// per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProductOp {
    /// [`ExecContext::matmul`]: the batched, broadcasting product `a · b`.
    Matmul,
    /// [`ExecContext::linear`]: `x · wᵀ + bias`, `w` being `[out, in]`.
    Linear,
}

impl ProductOp {
    /// Every op of the family, in declaration order.
    pub const ALL: &'static [ProductOp] = &[ProductOp::Matmul, ProductOp::Linear];

    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            ProductOp::Matmul => "matmul",
            ProductOp::Linear => "linear",
        }
    }

    /// The name of the op's backward kernel.
    pub fn backward_name(self) -> &'static str {
        match self {
            ProductOp::Matmul => "matmul_backward",
            ProductOp::Linear => "linear_backward",
        }
    }

    /// Whether the op takes a bias operand (`linear`).
    pub fn takes_bias(self) -> bool {
        matches!(self, ProductOp::Linear)
    }

    /// The shape of the op's result for a left operand of shape `a` and a right
    /// operand of shape `b` (the bias, when the op takes one, does not change it):
    /// numpy's matrix-product rule for `Matmul` (1-D operands, broadcast batch
    /// dims), `[..., out]` with `a`'s leading dims for `Linear` (`b` being the
    /// weight `[out, in]`).
    ///
    /// ```
    /// use fucina_exec::ProductOp;
    ///
    /// assert_eq!(ProductOp::Matmul.out_shape(&[2, 1, 3, 4], &[5, 4, 6])?.as_slice(), [2, 5, 3, 6]);
    /// assert_eq!(ProductOp::Linear.out_shape(&[7, 4], &[3, 4])?.as_slice(), [7, 3]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// The shape errors of the op's forward: [`ExecError::ShapeMismatch`] when
    /// the inner dimensions differ or the batch dims do not broadcast,
    /// [`ExecError::InvalidShape`] for a weight that is not 2-D (or a shape no
    /// tensor can have), [`ExecError::Overflow`].
    pub fn out_shape(self, a: &[usize], b: &[usize]) -> Result<Dims, ExecError> {
        check_shape(self.name(), a)?;
        check_shape(self.name(), b)?;
        match self {
            ProductOp::Matmul => Ok(product_shape(self.name(), a, b)?.result),
            ProductOp::Linear => linear_shape(self.name(), a, b),
        }
    }
}

/// The gradients [`ExecContext::product_backward`] returns: of the left operand,
/// the right operand and the bias, each `None` unless it was asked for.
pub type ProductGrads = [Option<RawTensor>; 3];

impl ExecContext {
    /// Runs the forward kernel of `op` on `a` and `b` (and `bias`, for ops that
    /// [take one](ProductOp::takes_bias)): the same kernel, and the same bits, as
    /// the op's named `_with` method.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, MatmulOptions, ProductOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[1, 2], &[1., 2.])?;
    /// let w = ctx.from_slice(&[3, 2], &[1., 0., 0., 1., 1., 1.])?;
    /// let y = ctx.product(ProductOp::Linear, &x, &w, None, MatmulOptions::default())?;
    /// assert_eq!(y.to_vec(), ctx.linear(&x, &w, None)?.to_vec());
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`matmul_with`](ExecContext::matmul_with) or
    /// [`linear_with`](ExecContext::linear_with); [`ExecError::InvalidArgument`]
    /// if `bias` is given to an op that takes none.
    pub fn product(
        &self,
        op: ProductOp,
        a: &RawTensor,
        b: &RawTensor,
        bias: Option<&RawTensor>,
        options: MatmulOptions,
    ) -> Result<RawTensor, ExecError> {
        match op {
            ProductOp::Matmul if bias.is_some() => Err(ExecError::InvalidArgument {
                op: "matmul",
                reason: "matmul takes no bias (linear does)",
            }),
            ProductOp::Matmul => self.matmul_with(a, b, options),
            ProductOp::Linear => self.linear_with(a, b, bias, options),
        }
    }

    /// Runs the backward kernel of `op`: the gradients of `a`, `b` and the bias
    /// from the output's gradient `grad`, each computed only where `needs` asks
    /// for it (`needs[2]`, the bias, only for ops that take one).
    ///
    /// - `Matmul` is [`matmul_backward`](ExecContext::matmul_backward) (both
    ///   products run; the unasked one is dropped).
    /// - `Linear` is [`linear_backward`](ExecContext::linear_backward) when the
    ///   input's gradient is asked for; when it is not (a first layer over data),
    ///   the largest of the three products, `grad · w`, is skipped: the weight's
    ///   gradient is the same product `gradᵀ · x` over the flattened rows, and the
    ///   bias's is [`sum`](ExecContext::sum) of the gradient rows along axis 0.
    ///
    /// # Errors
    /// As the named backward kernel ([`ExecError::ShapeMismatch`] if `grad` does
    /// not have the product's shape); [`ExecError::InvalidArgument`] if the bias's
    /// gradient is asked of an op that takes no bias.
    pub fn product_backward(
        &self,
        op: ProductOp,
        a: &RawTensor,
        b: &RawTensor,
        grad: &RawTensor,
        needs: [bool; 3],
    ) -> Result<ProductGrads, ExecError> {
        match op {
            ProductOp::Matmul if needs[2] => Err(ExecError::InvalidArgument {
                op: "matmul_backward",
                reason: "matmul has no bias to differentiate (linear does)",
            }),
            ProductOp::Matmul => {
                let (ga, gb) = self.matmul_backward(a, b, grad)?;
                Ok([needs[0].then_some(ga), needs[1].then_some(gb), None])
            }
            ProductOp::Linear if !needs[0] => {
                check_linear_grad("linear_backward", a, b, grad)?;
                let (gw, gb) = linear_param_grads(self, a, grad, needs[1], needs[2])?;
                Ok([None, gw, gb])
            }
            ProductOp::Linear => {
                let (gx, gw, gb) = self.linear_backward(a, b, grad)?;
                Ok([Some(gx), needs[1].then_some(gw), needs[2].then_some(gb)])
            }
        }
    }
}

/// The weight's and the bias's gradients of `linear` over the input `x` (each
/// only when wanted): `gradᵀ · x` over all leading rows, and `grad` summed over
/// the rows.
fn linear_param_grads(
    ctx: &ExecContext,
    x: &RawTensor,
    g: &RawTensor,
    want_w: bool,
    want_b: bool,
) -> Result<(Option<RawTensor>, Option<RawTensor>), ExecError> {
    let out = *g.shape().last().expect("rank >= 1");
    let inn = *x.shape().last().expect("rank >= 1");
    let rows = g.numel() / out;
    let g2 = ctx.contiguous(g)?.reshape(&[rows, out])?;
    let gw = if want_w {
        let x2 = ctx.contiguous(x)?.reshape(&[rows, inn])?;
        Some(ctx.matmul(&g2.transpose(0, 1)?, &x2)?)
    } else {
        None
    };
    let gb = if want_b {
        Some(bias_grad(ctx, "linear_backward", &g2)?)
    } else {
        None
    };
    Ok((gw, gb))
}

/// The bias gradient of `linear`: the column sums of the contiguous `[rows,
/// out]` gradient, each column added row after row. Both backward paths (with
/// and without the input's gradient) use it, so the bias gradient has the same
/// bits whichever operands need gradients; columns are split over the team,
/// never rows, so the bits do not depend on the thread count either.
pub(crate) fn bias_grad(
    ctx: &ExecContext,
    op: &'static str,
    g2: &RawTensor,
) -> Result<RawTensor, ExecError> {
    let (rows, out_f) = (g2.shape()[0], g2.shape()[1]);
    let gs = g2.contiguous_slice();
    ctx.new_tensor(op, &[out_f], |out| {
        ctx.par_rows(out, 1, rows, |cols, o| {
            o.fill(0.0);
            for row in gs.chunks_exact(out_f) {
                for (acc, &v) in o.iter_mut().zip(&row[cols.clone()]) {
                    *acc += v;
                }
            }
        });
    })
}

/// A right-hand matrix packed once into pool scratch for many products with
/// it (the recurrent sequence ops multiply every step's state by the same
/// `W_hhᵀ`): the panels of [`pack_rhs`], the depth `k` and the width `n`.
pub(crate) struct PackedRhs {
    panels: fucina_storage::ScratchLease<f32>,
    k: usize,
    n: usize,
}

impl ExecContext {
    /// Packs the 2-D right-hand side `b` (`[k, n]`, any strides) once, for
    /// [`gemm_packed`](Self::gemm_packed).
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `b` is not 2-D; [`ExecError::OutOfMemory`].
    pub(crate) fn pack_rhs_once(
        &self,
        op: &'static str,
        b: &RawTensor,
    ) -> Result<PackedRhs, ExecError> {
        let &[k, n] = b.shape() else {
            return Err(ExecError::InvalidShape {
                op,
                shape: b.dims(),
                reason: "a packed right-hand side must be 2-D",
            });
        };
        let plan = Plan::for_rhs(b, k, n);
        let len = plan.packed_len();
        let mut panels = self
            .pool()
            .acquire_scratch::<f32>(len)
            .map_err(|e| ExecError::storage(op, e))?;
        pack_rhs(self, &plan, b, &mut panels[..len]);
        Ok(PackedRhs { panels, k, n })
    }

    /// `out (+)= a · B` for `B` packed by [`pack_rhs_once`](Self::pack_rhs_once):
    /// `a` is `m` contiguous rows of `k`, `out` `m` rows of `n`; with
    /// `accumulate` each element's fused multiply-add chain over `k` starts
    /// from `out`'s value (a bias or a gradient copied there), else from `+0`.
    /// The chain is [`linear`](Self::linear)'s, so the bits are those of the
    /// same product through `linear` or `matmul`, for every team size.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] for the scratch of a team member.
    pub(crate) fn gemm_packed(
        &self,
        op: &'static str,
        a: &[f32],
        rhs: &PackedRhs,
        out: &mut [f32],
        accumulate: bool,
    ) -> Result<(), ExecError> {
        let (k, n) = (rhs.k, rhs.n);
        let m = out.len() / n;
        debug_assert_eq!(a.len(), m * k, "gemm_packed: a is m rows of k");
        let level = simd::level();
        let len = rhs.n.div_ceil(NR) * k * NR;
        let packed = &rhs.panels[..len];
        let work_per_row = row_split_work(m, k, n, self.threads());
        self.par_rows_with_scratch(
            op,
            out,
            n,
            work_per_row,
            a_scratch_len(m),
            |rows, c, scratch| {
                let lhs = LhsRows {
                    data: a,
                    row_off: |i| (rows.start + i) * k,
                    cs: 1,
                };
                let args = GemmArgs {
                    level,
                    lhs: &lhs,
                    m: rows.len(),
                    k,
                    n,
                    rhs: Rhs::Packed(packed),
                    accumulate,
                };
                gemm::gemm(&args, c, scratch);
            },
        )
    }
}
