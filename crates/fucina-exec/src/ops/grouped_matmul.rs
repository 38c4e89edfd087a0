//! [`ExecContext::grouped_matmul`]: a list of independent weight products
//! (each `out = x · wᵀ` with its own weight, activations and output) run as
//! one dispatch over the team, for the many small products of a
//! mixture-of-experts layer (at decode, each chosen expert's gate, up and
//! down products are a single activation row against a small matrix: one
//! fork-join per product costs more than the product).
//!
//! The single-row products (`m = 1`) of float weights ([`WeightMatrix`]),
//! block-quantized matrices read in place ([`QuantMatrix`]) and repacked ones
//! ([`PackedQuantMatrix`] of a whole number of strips) are split into work
//! items, each a run of one product's output features, and the team takes the
//! items of every product in one fork-join. Each output feature is computed
//! whole by the kernel that the product's single call runs
//! ([`ExecContext::weight_matmul`], [`ExecContext::quant_matmul`],
//! [`ExecContext::quant_matmul_packed`]), in the same order, from the same
//! activations: a quantized product's activations are quantized by the
//! routine of its single call, to int8 blocks of 32 or, for the formats
//! whose single call takes super-block activations (the K formats and
//! IQ4_XS: one
//! scale per 256 and the sums of each group of 16), to those, which the
//! format's super-block rows kernel then reads. So every output is the same
//! bits as the single call gives, for every thread count and vector level.
//! The other products (several rows, a [`PackedBf16Matrix`], a packed matrix
//! whose rows end inside a strip) run through their single call, one after
//! another, after the grouped ones.
//!
//! # No allocation at steady state
//! The work lists of a call (the products, their activations' places in the
//! pooled scratch, the work items) live in a [`GroupedScratch`] the caller
//! keeps between calls: [`GroupedScratch::list`] lends a product list that
//! reuses the previous list's memory, and [`GroupedList::run`] runs it with
//! the scratch's other lists. Once the lists have grown to a call's size
//! and the context's pool holds the quantized activations of that size, a
//! call allocates nothing. ([`ExecContext::grouped_matmul`] over a slice
//! uses fresh lists each call.)

use std::mem;
use std::ops::Range;

use crate::context::{ExecContext, PARALLEL_THRESHOLD};
use crate::error::ExecError;
use crate::kernels::quant_block;
use crate::kernels::quant_dot::{Acts, LANES, QK};
use crate::kernels::quant_k::q8k::{self, GROUPS, KActs};
use crate::kernels::quant_k::{self, QK_K};
use crate::kernels::weight_dot::weight_rows;
use crate::ops::bf16_matmul::PackedBf16Matrix;
use crate::ops::quant::{Q8kRows, q4k_packed_kernel, q8k_kernel};
use crate::ops::quant_format::{QuantFormat, with_block_format};
use crate::ops::quant_matrix::QuantMatrix;
use crate::ops::quant_packed::{PackedQuantMatrix, STRIP_ROWS};
use crate::tensor::layout::Dims;
use crate::weight_format::WeightMatrix;

/// The weight of one product of [`ExecContext::grouped_matmul`], in any form
/// the single products read.
#[derive(Clone, Copy, Debug)]
pub enum GroupedWeight<'a> {
    /// A float matrix (f32, f16, bf16), read as
    /// [`ExecContext::weight_matmul`] reads it.
    Float(WeightMatrix<'a>),
    /// A block-quantized matrix read in place, as
    /// [`ExecContext::quant_matmul`] reads it.
    Quant(QuantMatrix<'a>),
    /// A repacked block-quantized matrix, as
    /// [`ExecContext::quant_matmul_packed`] reads it.
    Packed(&'a PackedQuantMatrix),
    /// A bf16 matrix with the AMX summation rule, as
    /// [`ExecContext::bf16_matmul_amx_rule`] reads it.
    Bf16AmxRule(&'a PackedBf16Matrix),
}

impl GroupedWeight<'_> {
    /// `(rows, cols)`: output and input features.
    fn shape(&self) -> (usize, usize) {
        match self {
            GroupedWeight::Float(w) => (w.rows, w.cols),
            GroupedWeight::Quant(w) => (w.rows, w.cols),
            GroupedWeight::Packed(w) => (w.rows(), w.cols()),
            GroupedWeight::Bf16AmxRule(w) => (w.rows(), w.cols()),
        }
    }
}

/// One product of [`ExecContext::grouped_matmul`]:
/// `out[i, j] = Σ_k x[i, k] · w[j, k]` for the `m` rows of `x`
/// (`[m, cols]`, row-major) into `out` (`[m, rows]`).
#[derive(Debug)]
pub struct GroupedProduct<'a> {
    /// The weight, `[rows, cols]`.
    pub weight: GroupedWeight<'a>,
    /// The activations, `[m, cols]`.
    pub x: &'a [f32],
    /// Activation rows.
    pub m: usize,
    /// The output, `[m, rows]`.
    pub out: &'a mut [f32],
}

/// The work lists of grouped products, kept by the caller between calls so
/// that a call allocates nothing once they have grown to its size (see the
/// module documentation): a product list ([`list`](Self::list)), the places
/// of the products' quantized activations and the work items.
///
/// ```
/// use fucina_exec::{ExecContext, GroupedProduct, GroupedScratch, GroupedWeight, WeightFormat, WeightMatrix};
///
/// let ctx = ExecContext::new();
/// let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
/// let w = WeightMatrix::new(WeightFormat::F32, 2, 2, &bytes)?;
/// let mut scratch = GroupedScratch::new();
/// for step in 0..3 {
///     let (mut a, mut b) = ([0.0f32; 2], [0.0f32; 2]);
///     let mut list = scratch.list();
///     list.push(GroupedProduct { weight: GroupedWeight::Float(w), x: &[1.0, 0.0], m: 1, out: &mut a });
///     list.push(GroupedProduct { weight: GroupedWeight::Float(w), x: &[0.0, 1.0], m: 1, out: &mut b });
///     list.run(&ctx)?; // from the second step on, no allocation
///     drop(list);
///     assert_eq!((a, b), ([1.0, 3.0], [2.0, 4.0]));
/// }
/// # Ok::<(), fucina_exec::ExecError>(())
/// ```
#[derive(Default)]
pub struct GroupedScratch {
    /// The memory of the last product list (empty).
    products: Vec<GroupedProduct<'static>>,
    work: WorkLists,
}

impl std::fmt::Debug for GroupedScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupedScratch")
            .field("products", &self.products.capacity())
            .field("spans", &self.work.spans.capacity())
            .field("items", &self.work.items.capacity())
            .finish()
    }
}

/// The lists a call fills and empties again (see [`GroupedScratch`]).
#[derive(Default)]
struct WorkLists {
    /// Per product, where its quantized activations lie (`None` for a float
    /// product and one run through its single call).
    spans: Vec<Option<ActSpan>>,
    /// The memory of the last call's work items (empty).
    items: Vec<Item<'static>>,
}

impl GroupedScratch {
    /// Empty lists (nothing allocated until the first call).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty product list over the memory of the last one (given back
    /// when the list drops), to fill with [`GroupedList::push`] and run with
    /// [`GroupedList::run`].
    pub fn list<'a>(&mut self) -> GroupedList<'a, '_> {
        GroupedList {
            products: recycle(mem::take(&mut self.products)),
            scratch: self,
        }
    }
}

/// A list of grouped products lent by [`GroupedScratch::list`]; its memory
/// goes back to the scratch when it drops.
pub struct GroupedList<'a, 's> {
    products: Vec<GroupedProduct<'a>>,
    scratch: &'s mut GroupedScratch,
}

impl std::fmt::Debug for GroupedList<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.products).finish()
    }
}

impl<'a> GroupedList<'a, '_> {
    /// Appends a product (it may grow the list's memory, kept for the next
    /// list).
    pub fn push(&mut self, product: GroupedProduct<'a>) {
        self.products.push(product);
    }

    /// Products in the list.
    pub fn len(&self) -> usize {
        self.products.len()
    }

    /// Whether the list holds no product.
    pub fn is_empty(&self) -> bool {
        self.products.is_empty()
    }

    /// Runs every product of the list, as
    /// [`ExecContext::grouped_matmul`] runs a slice of them (the same bits),
    /// with the scratch's work lists: no allocation once they and the
    /// context's pool have grown to a call of this size. The list keeps its
    /// products.
    ///
    /// # Errors
    /// As [`ExecContext::grouped_matmul`].
    pub fn run(&mut self, ctx: &ExecContext) -> Result<(), ExecError> {
        ctx.grouped_with(&mut self.products, &mut self.scratch.work)
    }
}

impl Drop for GroupedList<'_, '_> {
    fn drop(&mut self) {
        self.scratch.products = recycle(mem::take(&mut self.products));
    }
}

/// `v` emptied, as a vector of `U` over the same memory (no allocation).
/// For a type that differs from `T` in its lifetimes only: a list kept
/// between calls can be refilled with values that borrow for a shorter
/// time.
fn recycle<T, U>(v: Vec<T>) -> Vec<U> {
    const {
        assert!(size_of::<T>() == size_of::<U>() && align_of::<T>() == align_of::<U>());
        assert!(size_of::<T>() > 0);
    }
    let mut v = mem::ManuallyDrop::new(v);
    v.clear();
    let (ptr, cap) = (v.as_mut_ptr(), v.capacity());
    // SAFETY: `ptr` and `cap` come from a `Vec<T>` (its memory, now owned
    // here alone: `v` is never dropped), allocated by the global allocator
    // for `cap` values of `T` (or dangling with `cap == 0`); `U` has the
    // size and alignment of `T` (asserted at compile time), so it is the
    // same allocation layout for `cap` values of `U`; the length is 0, so no
    // value is reinterpreted.
    unsafe { Vec::from_raw_parts(ptr.cast::<U>(), 0, cap) }
}

/// The fewest output features per work item of a parallel call, and the
/// multiple every item's length is rounded to: a multiple of the kernels'
/// row blocks and of the strips of a packed
/// matrix (8 rows).
const ITEM_ROWS: usize = 64;

/// Output features per work item of a product of `rows` features: the whole
/// product on one thread; else its share of `threads`, rounded up to a
/// multiple of [`ITEM_ROWS`] (each item a long run of weight rows, which the
/// kernels stream with their next block prefetched; the team's participants
/// take the items of every product).
fn item_rows(rows: usize, threads: usize) -> usize {
    match threads {
        0 | 1 => rows.max(1),
        t => rows.div_ceil(t).next_multiple_of(ITEM_ROWS),
    }
}

/// What one work item computes: a run of output features of one product.
#[derive(Clone, Copy)]
enum Kernel<'a> {
    Float(WeightMatrix<'a>, &'a [f32]),
    /// In place, activations in blocks of 32 (and their sums).
    Quant(QuantMatrix<'a>, Acts<'a>, &'a [f32]),
    /// In place, super-block activations, with the format's rows kernel.
    Super(QuantMatrix<'a>, KActs<'a>, Q8kRows),
    /// A packed matrix; the item's range counts strips.
    Packed(&'a PackedQuantMatrix, Acts<'a>, &'a [f32]),
    /// A packed Q4_K matrix, super-block activations; the item's range
    /// counts strips.
    SuperPacked(&'a PackedQuantMatrix, KActs<'a>),
}

/// One work item: the kernel, its range of output features (strips for a
/// packed matrix) and their outputs.
struct Item<'a> {
    kernel: Kernel<'a>,
    range: Range<usize>,
    out: &'a mut [f32],
}

impl Item<'_> {
    fn run(&mut self) {
        let r = self.range.clone();
        match &self.kernel {
            Kernel::Float(w, x) => weight_rows(x, 1, w, r, self.out),
            Kernel::Quant(w, acts, sums) => {
                let rb = w.row_bytes();
                with_block_format!(w.format, F => quant_block::quant_rows::<F>(w.bytes, rb, r, acts, sums, 1, self.out))
            }
            Kernel::Super(w, acts, rows) => rows(w.bytes, w.row_bytes(), r, acts, 1, self.out),
            Kernel::Packed(w, acts, sums) => w.strip_rows(r, acts, sums, 1, self.out),
            Kernel::SuperPacked(w, acts) => w.strip_rows_k(r, acts, 1, self.out),
        }
    }
}

/// Whether product `p` runs in the grouped dispatch (else through its single
/// call).
fn grouped(p: &GroupedProduct<'_>) -> bool {
    let (rows, cols) = p.weight.shape();
    p.m == 1
        && rows > 0
        && cols > 0
        && match p.weight {
            GroupedWeight::Float(_) | GroupedWeight::Quant(_) => true,
            GroupedWeight::Packed(_) => rows.is_multiple_of(STRIP_ROWS),
            GroupedWeight::Bf16AmxRule(_) => false,
        }
}
/// Checks one product's lengths (as its single call does), naming
/// `grouped_matmul`.
fn check(p: &GroupedProduct<'_>) -> Result<(), ExecError> {
    const OP: &str = "grouped_matmul";
    let (rows, cols) = p.weight.shape();
    let overflow = |shape: &[usize]| ExecError::Overflow {
        op: OP,
        shape: Dims::new(shape),
    };
    let length = |shape: &[usize], expected: usize, got: usize| {
        if expected == got {
            Ok(())
        } else {
            Err(ExecError::InvalidDataLength {
                op: OP,
                shape: Dims::new(shape),
                expected,
                got,
            })
        }
    };
    if let GroupedWeight::Float(w) = p.weight {
        let bytes = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(w.format.size_bytes()))
            .ok_or_else(|| overflow(&[rows, cols]))?;
        length(&[rows, cols], bytes, w.bytes.len())?;
    }
    let nx =
        p.m.checked_mul(cols)
            .ok_or_else(|| overflow(&[p.m, cols]))?;
    length(&[p.m, cols], nx, p.x.len())?;
    let no =
        p.m.checked_mul(rows)
            .ok_or_else(|| overflow(&[p.m, rows]))?;
    length(&[p.m, rows], no, p.out.len())
}

/// How a grouped quantized product's activations are quantized: as its
/// single call quantizes them.
#[derive(Clone, Copy)]
enum ActForm {
    /// Int8 blocks of 32 with the format's offset (`quant_dot`), and each
    /// block's sum when the format has a min term.
    Blocks { offset: i32, sums: bool },
    /// Super-blocks of 256 (`q8k::quantize_row`), read by the format's rows
    /// kernel.
    Super(Q8kRows),
}

impl ActForm {
    /// The form of the single call of a quantized weight `w`.
    fn of(w: &GroupedWeight<'_>) -> ActForm {
        let format = quant_format(w);
        match (w, q8k_kernel(format)) {
            (GroupedWeight::Quant(_), Some(k)) => ActForm::Super(k.rows),
            (GroupedWeight::Packed(p), _) if p.takes_super_blocks() => {
                ActForm::Super(q4k_packed_kernel().rows)
            }
            _ => ActForm::Blocks {
                offset: format.act_offset(),
                sums: format.needs_sums(),
            },
        }
    }
}

/// Where one grouped quantized product's activations lie in the pooled
/// buffers: the values at `q` (`cols`) in `xq`; in blocks of 32 the scales
/// and sums at `s` (`cols / 32`) in `xs` and `xsum`, the lane biases at `b`
/// (`cols / 32 · 8`) in `xb`; in super-blocks the scales at `s`
/// (`cols / 256`) in `xs`, the group sums at `g` (`cols / 256 · 16`) in
/// `xg`.
#[derive(Clone, Copy)]
struct ActSpan {
    form: ActForm,
    cols: usize,
    q: usize,
    s: usize,
    b: usize,
    g: usize,
}

/// The pooled activation buffers' lengths (see [`ActSpan`]).
#[derive(Clone, Copy, Default)]
struct ActLens {
    q: usize,
    s: usize,
    b: usize,
    g: usize,
}

/// Fills `spans` with each product's [`ActSpan`] (`None` for a float product
/// and one not grouped) and returns the buffers' lengths.
fn plan_spans(products: &[GroupedProduct<'_>], spans: &mut Vec<Option<ActSpan>>) -> ActLens {
    spans.clear();
    let mut n = ActLens::default();
    for p in products {
        let quant = grouped(p) && !matches!(p.weight, GroupedWeight::Float(_));
        if !quant {
            spans.push(None);
            continue;
        }
        let cols = p.weight.shape().1;
        let form = ActForm::of(&p.weight);
        spans.push(Some(ActSpan {
            form,
            cols,
            q: n.q,
            s: n.s,
            b: n.b,
            g: n.g,
        }));
        n.q += cols;
        match form {
            ActForm::Blocks { .. } => {
                n.s += cols / QK;
                n.b += cols / QK * LANES;
            }
            ActForm::Super(_) => {
                n.s += cols / QK_K;
                n.g += cols / QK_K * GROUPS;
            }
        }
    }
    n
}

/// The pooled buffers of the quantized activations, shared by the items.
#[derive(Clone, Copy)]
struct ActBufs<'a> {
    q: &'a [i8],
    s: &'a [f32],
    b: &'a [i32],
    sum: &'a [f32],
    g: &'a [i16],
}

impl<'a> ActBufs<'a> {
    /// The kernel of a grouped product with activations at `span` (`None`
    /// for a float product).
    fn kernel(&self, weight: GroupedWeight<'a>, x: &'a [f32], span: Option<ActSpan>) -> Kernel<'a> {
        let Some(a) = span else {
            let GroupedWeight::Float(w) = weight else {
                unreachable!("a grouped quantized product has its activations")
            };
            return Kernel::Float(w, x);
        };
        let q = &self.q[a.q..a.q + a.cols];
        match a.form {
            ActForm::Super(rows) => {
                let nk = a.cols / QK_K;
                let acts = KActs {
                    q,
                    d: &self.s[a.s..a.s + nk],
                    bsums: &self.g[a.g..a.g + nk * GROUPS],
                    cols: a.cols,
                };
                match weight {
                    GroupedWeight::Quant(w) => Kernel::Super(w, acts, rows),
                    GroupedWeight::Packed(w) => Kernel::SuperPacked(w, acts),
                    _ => unreachable!("a float weight has no quantized activations"),
                }
            }
            ActForm::Blocks { sums, .. } => {
                let nb = a.cols / QK;
                let acts = Acts {
                    q,
                    scale: &self.s[a.s..a.s + nb],
                    bias: &self.b[a.b..a.b + nb * LANES],
                    cols: a.cols,
                };
                let sums = if sums {
                    &self.sum[a.s..a.s + nb]
                } else {
                    &[][..]
                };
                match weight {
                    GroupedWeight::Quant(w) => Kernel::Quant(w, acts, sums),
                    GroupedWeight::Packed(w) => Kernel::Packed(w, acts, sums),
                    _ => unreachable!("a float weight has no quantized activations"),
                }
            }
        }
    }
}

impl ExecContext {
    /// Runs every product of `products` (each `out = x · wᵀ`, see
    /// [`GroupedProduct`]): the single-row products of float, in-place
    /// quantized and repacked weights in one dispatch over the team, the work
    /// items being runs of one product's output features, each written by
    /// one thread; the others (several rows, a [`PackedBf16Matrix`], a packed
    /// matrix whose rows end inside a strip) through their single call, one
    /// after another. Every output is the same bits as the product's single
    /// call ([`weight_matmul`](Self::weight_matmul),
    /// [`quant_matmul`](Self::quant_matmul),
    /// [`quant_matmul_packed`](Self::quant_matmul_packed),
    /// [`bf16_matmul_amx_rule`](Self::bf16_matmul_amx_rule)) gives, for any
    /// thread count and vector level (see the module documentation).
    ///
    /// Its work lists are fresh each call (a few small allocations); a caller
    /// that runs grouped products again and again keeps a
    /// [`GroupedScratch`] and runs them through
    /// [`GroupedList::run`] (the same bits), which allocates nothing at
    /// steady state.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, GroupedProduct, GroupedWeight, WeightFormat, WeightMatrix};
    ///
    /// let ctx = ExecContext::new();
    /// let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    /// let w = WeightMatrix::new(WeightFormat::F32, 2, 2, &bytes)?;
    /// let (mut a, mut b) = ([0.0f32; 2], [0.0f32; 2]);
    /// ctx.grouped_matmul(&mut [
    ///     GroupedProduct { weight: GroupedWeight::Float(w), x: &[1.0, 0.0], m: 1, out: &mut a },
    ///     GroupedProduct { weight: GroupedWeight::Float(w), x: &[0.0, 1.0], m: 1, out: &mut b },
    /// ])?;
    /// assert_eq!((a, b), ([1.0, 3.0], [2.0, 4.0]));
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidDataLength`] (naming `grouped_matmul`) when a
    /// product's `x` is not `m · cols` values, its `out` not `m · rows`, or a
    /// float weight's bytes not `rows · cols` elements;
    /// [`ExecError::Overflow`] when a size overflows. These are checked for
    /// every product before any is computed: nothing is written then.
    /// [`ExecError::OutOfMemory`] when scratch cannot be had (then outputs
    /// may be partly written).
    pub fn grouped_matmul(&self, products: &mut [GroupedProduct<'_>]) -> Result<(), ExecError> {
        self.grouped_with(products, &mut WorkLists::default())
    }

    /// [`grouped_matmul`](Self::grouped_matmul) with the work lists `work`.
    fn grouped_with(
        &self,
        products: &mut [GroupedProduct<'_>],
        work: &mut WorkLists,
    ) -> Result<(), ExecError> {
        const OP: &str = "grouped_matmul";
        products.iter().try_for_each(check)?;
        let n = plan_spans(products, &mut work.spans);
        let lease = |e| ExecError::storage(OP, e);
        let pool = self.pool();
        // (The pool hands out no empty lease: one element at least.)
        let mut xq = pool.acquire_scratch::<i8>(n.q.max(1)).map_err(lease)?;
        let mut xs = pool.acquire_scratch::<f32>(n.s.max(1)).map_err(lease)?;
        let mut xb = pool.acquire_scratch::<i32>(n.b.max(1)).map_err(lease)?;
        let mut xsum = pool.acquire_scratch::<f32>(n.s.max(1)).map_err(lease)?;
        let mut xg = pool.acquire_scratch::<i16>(n.g.max(1)).map_err(lease)?;
        for (p, span) in products.iter().zip(&work.spans) {
            let Some(a) = span else {
                continue;
            };
            let q = &mut xq[a.q..a.q + a.cols];
            match a.form {
                ActForm::Super(_) => {
                    let nk = a.cols / QK_K;
                    let d = &mut xs[a.s..a.s + nk];
                    q8k::quantize_row(p.x, q, d, &mut xg[a.g..a.g + nk * GROUPS]);
                }
                ActForm::Blocks { offset, sums } => {
                    let nb = a.cols / QK;
                    let s = &mut xs[a.s..a.s + nb];
                    let b = &mut xb[a.b..a.b + nb * LANES];
                    match sums {
                        true => {
                            let sums = &mut xsum[a.s..a.s + nb];
                            quant_k::quantize_acts(p.x, 1, a.cols, offset, q, s, b, sums);
                        }
                        false => self.quantize_acts(p.x, a.cols, offset, q, s, b),
                    }
                }
            }
        }
        let bufs = ActBufs {
            q: &xq,
            s: &xs,
            b: &xb,
            sum: &xsum,
            g: &xg,
        };
        self.run_items(products, &work.spans, bufs, &mut work.items);
        for p in products.iter_mut().filter(|p| !grouped(p)) {
            let (x, m, out) = (p.x, p.m, &mut *p.out);
            match p.weight {
                GroupedWeight::Float(w) => self.weight_matmul(x, m, &w, out),
                GroupedWeight::Quant(w) => self.quant_matmul(x, m, &w, out),
                GroupedWeight::Packed(w) => self.quant_matmul_packed(x, m, w, out),
                GroupedWeight::Bf16AmxRule(w) => self.bf16_matmul_amx_rule(x, m, w, out),
            }?;
        }
        Ok(())
    }

    /// Splits the grouped products into work items (in the memory of
    /// `kept`, given back empty) and runs them over the team in one
    /// fork-join.
    fn run_items(
        &self,
        products: &mut [GroupedProduct<'_>],
        spans: &[Option<ActSpan>],
        bufs: ActBufs<'_>,
        kept: &mut Vec<Item<'static>>,
    ) {
        let work = products
            .iter()
            .filter(|p| grouped(p))
            .map(|p| p.weight.shape())
            .fold(0usize, |w, (r, c)| w.saturating_add(r.saturating_mul(c)));
        let team = self.team().filter(|_| {
            self.threads() > 1 && work >= PARALLEL_THRESHOLD && !fucina_thread::in_parallel_region()
        });
        let threads = team.map_or(1, |t| t.participants());
        let mut items: Vec<Item<'_>> = recycle(mem::take(kept));
        for (p, &span) in products.iter_mut().zip(spans) {
            if !grouped(p) {
                continue;
            }
            let (rows, _) = p.weight.shape();
            let per_item = item_rows(rows, threads);
            let kernel = bufs.kernel(p.weight, p.x, span);
            let unit = match kernel {
                Kernel::Packed(..) | Kernel::SuperPacked(..) => STRIP_ROWS,
                _ => 1,
            };
            let mut rest = &mut *p.out;
            let mut start = 0;
            while start < rows {
                let end = rows.min(start + per_item);
                let (head, tail) = rest.split_at_mut(end - start);
                items.push(Item {
                    kernel,
                    range: start / unit..end / unit,
                    out: head,
                });
                (start, rest) = (end, tail);
            }
        }
        match team {
            Some(team) if items.len() > 1 => team.parallel_chunks_mut(&mut items, Item::run),
            _ => items.iter_mut().for_each(Item::run),
        }
        *kept = recycle(items);
    }
}

/// The block format of a quantized weight.
///
/// # Panics
/// For a float weight (the callers ask only of quantized ones).
fn quant_format(w: &GroupedWeight<'_>) -> QuantFormat {
    match w {
        GroupedWeight::Quant(w) => w.format,
        GroupedWeight::Packed(w) => w.format(),
        _ => panic!("grouped_matmul: a float weight has no block format"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_in_place_format_is_grouped_with_its_single_calls_activations() {
        let ctx = ExecContext::with_threads(1);
        for q in QuantFormat::ALL {
            let (rows, cols) = (8, 256);
            let w = ctx
                .quantize(q, rows, cols, &vec![0.5; rows * cols])
                .unwrap();
            let (x, mut out) = (vec![1.0; cols], vec![0.0; rows]);
            let p = GroupedProduct {
                weight: GroupedWeight::Quant(w.matrix()),
                x: &x,
                m: 1,
                out: &mut out,
            };
            assert!(grouped(&p), "{q:?}");
            // The super-block activations exactly where the single call
            // takes them (a format joining that path follows by itself).
            let form = ActForm::of(&p.weight);
            assert_eq!(
                matches!(form, ActForm::Super(_)),
                q8k_kernel(q).is_some(),
                "{q:?}"
            );
        }
    }

    #[test]
    fn a_recycled_list_keeps_its_memory() {
        let mut v: Vec<&'static [f32]> = Vec::with_capacity(5);
        v.push(&[1.0]);
        let cap = v.capacity();
        let local = [2.0f32];
        let mut w: Vec<&[f32]> = recycle(v);
        assert_eq!((w.len(), w.capacity()), (0, cap));
        w.push(&local);
        let back: Vec<&'static [f32]> = recycle(w);
        assert_eq!((back.len(), back.capacity()), (0, cap));
    }
}
