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
//! activations (a quantized product's activations are quantized by the same
//! routine), so every output is the same bits as the single call gives, for
//! every thread count and vector level. The other products (several rows, a
//! [`PackedBf16Matrix`], a packed matrix whose rows end inside a strip, the
//! K formats and IQ4_XS, whose activations are quantized
//! per 256 rather than per block of 32) run
//! through their single call, one after another, after the grouped ones.

use std::ops::Range;

use crate::context::{ExecContext, PARALLEL_THRESHOLD};
use crate::error::ExecError;
use crate::kernels::quant_block;
use crate::kernels::quant_dot::{Acts, LANES, QK};
use crate::kernels::quant_k;
use crate::kernels::weight_dot::weight_rows;
use crate::ops::bf16_matmul::PackedBf16Matrix;
use crate::ops::quant_format::with_block_format;
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

/// The fewest output features per work item of a parallel call, and the
/// multiple every item's length is rounded to: a multiple of the kernels'
/// row blocks (4 weight rows for `m = 1`) and of the strips of a packed
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
    Quant(QuantMatrix<'a>, Acts<'a>, &'a [f32]),
    /// A packed matrix; the item's range counts strips.
    Packed(&'a PackedQuantMatrix, Acts<'a>, &'a [f32]),
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
            Kernel::Packed(w, acts, sums) => w.strip_rows(r, acts, sums, 1, self.out),
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
            GroupedWeight::Float(_) => true,
            // The formats with super-block activations (the K formats, IQ4_XS)
            // run their single call: the grouped items quantize activations
            // in blocks of 32, which would give other bits.
            GroupedWeight::Quant(w) => !crate::ops::quant::takes_super_block_acts(w.format),
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

/// The quantized-activation scratch of the grouped products: per product
/// (`None` for a float one) its offsets into the pooled buffers.
#[derive(Clone, Copy, Default)]
struct ActSpan {
    /// Offset of the values (`cols`), and of the scales and sums (`nb`).
    q: usize,
    s: usize,
    cols: usize,
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
        const OP: &str = "grouped_matmul";
        products.iter().try_for_each(check)?;
        // The quantized products' activations, one pooled buffer each kind.
        let mut spans = Vec::with_capacity(products.len());
        let (mut nq, mut ns) = (0usize, 0usize);
        for p in products.iter() {
            let quant = grouped(p) && !matches!(p.weight, GroupedWeight::Float(_));
            let cols = p.weight.shape().1;
            spans.push(quant.then_some(ActSpan { q: nq, s: ns, cols }));
            if quant {
                nq += cols;
                ns += cols / QK;
            }
        }
        let lease = |e| ExecError::storage(OP, e);
        let pool = self.pool();
        // (The pool hands out no empty lease: one element at least.)
        let mut xq = pool.acquire_scratch::<i8>(nq.max(1)).map_err(lease)?;
        let mut xs = pool.acquire_scratch::<f32>(ns.max(1)).map_err(lease)?;
        let mut xb = pool
            .acquire_scratch::<i32>((ns * LANES).max(1))
            .map_err(lease)?;
        let mut xsum = pool.acquire_scratch::<f32>(ns.max(1)).map_err(lease)?;
        for (p, span) in products.iter().zip(&spans) {
            let Some(a) = span else {
                continue;
            };
            let format = quant_format(&p.weight);
            let nb = a.cols / QK;
            let (q, s) = (&mut xq[a.q..a.q + a.cols], &mut xs[a.s..a.s + nb]);
            let b = &mut xb[a.s * LANES..(a.s + nb) * LANES];
            match format.needs_sums() {
                true => {
                    let sums = &mut xsum[a.s..a.s + nb];
                    quant_k::quantize_acts(p.x, 1, a.cols, format.act_offset(), q, s, b, sums);
                }
                false => self.quantize_acts(p.x, a.cols, format.act_offset(), q, s, b),
            }
        }
        let (xq, xs, xb, xsum) = (&xq[..], &xs[..], &xb[..], &xsum[..]);
        let work = products
            .iter()
            .filter(|p| grouped(p))
            .map(|p| p.weight.shape())
            .fold(0usize, |w, (r, c)| w.saturating_add(r.saturating_mul(c)));
        let team = self.team().filter(|_| {
            self.threads() > 1 && work >= PARALLEL_THRESHOLD && !fucina_thread::in_parallel_region()
        });
        let threads = team.map_or(1, |t| t.participants());
        let mut items = Vec::new();
        for (p, span) in products.iter_mut().zip(&spans) {
            if !grouped(p) {
                continue;
            }
            let (rows, _) = p.weight.shape();
            let per_item = item_rows(rows, threads);
            let acts = span.map(|a| {
                let nb = a.cols / QK;
                let sums = match quant_format(&p.weight).needs_sums() {
                    true => &xsum[a.s..a.s + nb],
                    false => &[][..],
                };
                let acts = Acts {
                    q: &xq[a.q..a.q + a.cols],
                    scale: &xs[a.s..a.s + nb],
                    bias: &xb[a.s * LANES..(a.s + nb) * LANES],
                    cols: a.cols,
                };
                (acts, sums)
            });
            let (kernel, unit) = match (p.weight, acts) {
                (GroupedWeight::Float(w), _) => (Kernel::Float(w, p.x), 1),
                (GroupedWeight::Quant(w), Some((a, s))) => (Kernel::Quant(w, a, s), 1),
                (GroupedWeight::Packed(w), Some((a, s))) => (Kernel::Packed(w, a, s), STRIP_ROWS),
                _ => unreachable!("a grouped quantized product has its activations"),
            };
            let mut rest = &mut *p.out;
            let mut start = 0;
            while start < rows {
                let end = rows.min(start + per_item);
                let (head, tail) = rest.split_at_mut(end - start);
                let range = start / unit..end / unit;
                items.push(Item {
                    kernel,
                    range,
                    out: head,
                });
                (start, rest) = (end, tail);
            }
        }
        match team {
            Some(team) if items.len() > 1 => team.parallel_chunks_mut(&mut items, Item::run),
            _ => items.iter_mut().for_each(Item::run),
        }
        drop(items);
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
}

/// The block format of a quantized weight.
///
/// # Panics
/// For a float weight (the callers ask only of quantized ones).
fn quant_format(w: &GroupedWeight<'_>) -> crate::ops::quant_format::QuantFormat {
    match w {
        GroupedWeight::Quant(w) => w.format,
        GroupedWeight::Packed(w) => w.format(),
        _ => panic!("grouped_matmul: a float weight has no block format"),
    }
}
