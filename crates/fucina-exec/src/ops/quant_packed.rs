//! [`PackedQuantMatrix`]: a block-of-32 matrix (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1,
//! IQ4_NL) or a Q4_K matrix of a multiple of eight rows repacked once into the
//! kernels' strip layout (`kernels::quant_packed`, `kernels::quant_k::q4k_packed`)
//! for a weight that lives for the process, [`ExecContext::repack_quant`] that makes it and
//! [`ExecContext::quant_matmul_packed`] that reads it (the same bits as
//! [`ExecContext::quant_matmul`] on the original blocks).

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::quant_dot::{Acts, LANES, QK};
use crate::kernels::quant_k;
use crate::kernels::quant_k::q4k_packed;
use crate::kernels::quant_k::q8k::KActs;
use crate::kernels::quant_packed::{self, G, StripLayout};
use crate::memory::advise_huge_pages;
use crate::ops::quant::{check_product, q4k_packed_kernel};
use crate::ops::quant_format::QuantFormat;
use crate::ops::quant_matrix::{QuantMatrix, check_row, dequantize_row};
use crate::tensor::layout::Dims;

/// Runs `$body` with `$F` the `kernels::quant_block` type of a repackable
/// [`QuantFormat`] (a `quant_dot::Block32`).
///
/// # Panics
/// For a format that is not [`QuantFormat::repackable`] (checked by
/// [`ExecContext::repack_quant`] before a packed matrix exists).
macro_rules! with_strip_format {
    ($format:expr, $F:ident => $body:expr) => {{
        use crate::kernels::quant_block as qb;
        match $format {
            QuantFormat::Q8_0 => {
                type $F = qb::Q8_0;
                $body
            }
            QuantFormat::Q4_0 => {
                type $F = qb::Q4_0;
                $body
            }
            QuantFormat::Q5_0 => {
                type $F = qb::Q5_0;
                $body
            }
            QuantFormat::Q4_1 => {
                type $F = qb::Q4_1;
                $body
            }
            QuantFormat::Q5_1 => {
                type $F = qb::Q5_1;
                $body
            }
            QuantFormat::IQ4_NL => {
                type $F = qb::IQ4_NL;
                $body
            }
            f => panic!("{f:?} is not a repackable format (repack_quant checks it)"),
        }
    }};
}

/// Rows per strip of a [`PackedQuantMatrix`]: the kernels write the outputs
/// of whole strips.
pub(crate) const STRIP_ROWS: usize = G;

/// 64 bytes, 64-byte aligned: the unit of a [`PackedQuantMatrix`]'s storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The bytes of `lines`.
fn line_bytes(lines: &[Line]) -> &[u8] {
    // SAFETY: a Line is 64 bytes with no padding (repr(C) over [u8; 64]), so
    // the slice's memory is `64 · len` initialized bytes, borrowed as long as
    // `lines`.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast(), lines.len() * 64) }
}

/// The bytes of `lines`, mutably.
fn line_bytes_mut(lines: &mut [Line]) -> &mut [u8] {
    // SAFETY: as in `line_bytes`; the borrow is exclusive, and any byte
    // pattern is a valid Line.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), lines.len() * 64) }
}

/// A block-quantized matrix repacked for the kernels: the same bytes as the
/// llama.cpp blocks it was made from ([`ExecContext::repack_quant`]), laid out
/// in 64-byte aligned strips of eight rows with the eight rows' f16 scales side
/// by side, so a decode step reads one sequential stream per thread and
/// converts eight scales at once. A Q4_K matrix (a multiple of eight rows)
/// keeps its size exactly: each super-block of a strip is one tile of the
/// eight rows' scales and codes interleaved, so that one 64-byte load holds
/// codes of all eight rows (see docs/QUANTIZATION.md). [`ExecContext::quant_matmul_packed`] gives
/// the same bits as [`ExecContext::quant_matmul`] on the original matrix.
///
/// This is the prepared form of a weight that lives for the process
/// ([`RhsLifetime::StableProcess`](crate::RhsLifetime)): make it once, keep it
/// with the model, drop it with the model (it owns its copy; nothing is cached
/// elsewhere). Immutable, `Send` and `Sync`.
#[derive(Clone)]
pub struct PackedQuantMatrix {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    layout: Layout,
    lines: Vec<Line>,
}

/// How a [`PackedQuantMatrix`]'s strips are laid out.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// The blocks of 32 (`kernels::quant_packed`).
    Blocks(StripLayout),
    /// Q4_K (`kernels::quant_k::q4k_packed`): each strip the bytes of its
    /// eight rows, `row_bytes` per row.
    Q4K { row_bytes: usize },
}

impl std::fmt::Debug for PackedQuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedQuantMatrix")
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("size_bytes", &self.size_bytes())
            .finish()
    }
}

impl PackedQuantMatrix {
    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Output features (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns, a multiple of 32).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The memory the repacked copy takes: the matrix's bytes, plus the
    /// padding of the last strip to eight rows and of each strip's scales to
    /// 64 bytes.
    pub fn size_bytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// Row `r` dequantized into `out` (`out.len() == cols`): the same values,
    /// bit for bit, as [`QuantMatrix::dequantize_row`] on the original blocks
    /// (so an owner that keeps only the repacked copy can still read a row,
    /// e.g. a tied embedding).
    ///
    /// # Errors
    /// [`ExecError::IndexOutOfBounds`] if `r >= rows`,
    /// [`ExecError::InvalidDataLength`] if `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), ExecError> {
        check_row(
            "PackedQuantMatrix::dequantize_row",
            r,
            self.rows,
            self.cols,
            out.len(),
        )?;
        let lay = match self.layout {
            Layout::Blocks(ref lay) => lay,
            Layout::Q4K { row_bytes } => {
                let sb = q4k_packed::G * row_bytes;
                let s = r / q4k_packed::G;
                let strip = &line_bytes(&self.lines)[s * sb..(s + 1) * sb];
                let mut blk = [0u8; 144];
                for (b, ob) in out.chunks_exact_mut(quant_k::QK_K).enumerate() {
                    q4k_packed::block_of(strip, r % q4k_packed::G, b, &mut blk);
                    dequantize_row(self.format, &blk, ob);
                }
                return Ok(());
            }
        };
        let sb = lay.strip_bytes;
        let strip = &line_bytes(&self.lines)[r / G * sb..(r / G + 1) * sb];
        let mut blk = [0u8; 34];
        let bb = lay.block_bytes();
        for (b, ob) in out.chunks_exact_mut(QK).enumerate() {
            quant_packed::block_of(lay, strip, r % G, b, &mut blk[..bb]);
            dequantize_row(self.format, &blk[..bb], ob);
        }
        Ok(())
    }
}

impl PackedQuantMatrix {
    /// The outputs of the strips `strips` for the `m` quantized activation
    /// rows `acts` (with their block sums `sums` for a format with a min
    /// term) into `out_t` (`G · m` per strip): the kernel of
    /// [`ExecContext::quant_matmul_packed`], for a caller that splits the
    /// strips itself.
    pub(crate) fn strip_rows(
        &self,
        strips: std::ops::Range<usize>,
        acts: &Acts<'_>,
        sums: &[f32],
        m: usize,
        out_t: &mut [f32],
    ) {
        let data = line_bytes(&self.lines);
        let Layout::Blocks(lay) = &self.layout else {
            panic!("strip_rows: a Q4_K matrix takes super-block activations (strip_rows_k)");
        };
        with_strip_format!(self.format, F => quant_packed::packed_rows::<F>(lay, data, strips, acts, sums, m, out_t));
    }

    /// Whether the kernels read the super-block activations
    /// (`quant_k::q8k`) for this matrix (a repacked Q4_K matrix), through
    /// [`strip_rows_k`](Self::strip_rows_k).
    pub(crate) fn takes_super_blocks(&self) -> bool {
        matches!(self.layout, Layout::Q4K { .. })
    }

    /// The outputs of the strips `strips` of a repacked Q4_K matrix for the
    /// `m` super-block activation rows `acts` into `out_t` (`[rows][m]`, the
    /// strips' rows in order): the rows kernel of
    /// [`ExecContext::quant_matmul_packed`], for a caller that splits the
    /// strips itself.
    ///
    /// # Panics
    /// For a matrix of blocks of 32 (see
    /// [`takes_super_blocks`](Self::takes_super_blocks)), or slices too short
    /// (caller bugs).
    pub(crate) fn strip_rows_k(
        &self,
        strips: std::ops::Range<usize>,
        acts: &KActs<'_>,
        m: usize,
        out_t: &mut [f32],
    ) {
        let Layout::Q4K { row_bytes } = self.layout else {
            panic!("strip_rows_k: only a repacked Q4_K matrix takes super-block activations");
        };
        let g = q4k_packed::G;
        let rows = strips.start * g..strips.end * g;
        q4k_packed::packed_rows(line_bytes(&self.lines), row_bytes, rows, acts, m, out_t);
    }
}

impl ExecContext {
    /// Repacks `w` into the kernels' strip layout (see [`PackedQuantMatrix`]),
    /// in parallel over strips: for a weight that lives for the process, made
    /// once and kept by its owner.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, QuantFormat};
    ///
    /// let ctx = ExecContext::new();
    /// let w: Vec<f32> = (0..10 * 64).map(|i| ((i * 7 % 19) as f32 - 9.0) / 10.0).collect();
    /// let q = ctx.quantize(QuantFormat::Q8_0, 10, 64, &w)?;
    /// let packed = ctx.repack_quant(&q.matrix())?;
    /// let x: Vec<f32> = (0..64).map(|i| (i as f32).cos()).collect();
    /// let (mut a, mut b) = (vec![0.0; 10], vec![0.0; 10]);
    /// ctx.quant_matmul(&x, 1, &q.matrix(), &mut a)?;
    /// ctx.quant_matmul_packed(&x, 1, &packed, &mut b)?;
    /// assert_eq!(a, b); // the same bits
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] for a matrix of another format, or a
    /// Q4_K matrix whose row count is not a multiple of 8 (see
    /// [`QuantFormat::repackable_rows`]: those are read in place by
    /// [`quant_matmul`](Self::quant_matmul)), [`ExecError::Overflow`] if the
    /// size overflows, [`ExecError::OutOfMemory`] if the copy cannot be
    /// allocated.
    pub fn repack_quant(&self, w: &QuantMatrix<'_>) -> Result<PackedQuantMatrix, ExecError> {
        let op = "repack_quant";
        if !w.format.repackable_rows(w.rows) {
            return Err(ExecError::InvalidArgument {
                op,
                reason: "only q8_0, q4_0, q5_0, q4_1, q5_1 and iq4_nl matrices, and q4_k matrices of a multiple of 8 rows, are repacked; the others are read in place by quant_matmul",
            });
        }
        if w.format == QuantFormat::Q4_K {
            return self.repack_q4k(w);
        }
        let overflow = || ExecError::Overflow {
            op,
            shape: Dims::new(&[w.rows, w.cols]),
        };
        let layout = with_strip_format!(w.format, F => StripLayout::new::<F>(w.cols / QK))
            .ok_or_else(overflow)?;
        let strips = w.rows.div_ceil(G);
        let nbytes = strips
            .checked_mul(layout.strip_bytes)
            .ok_or_else(overflow)?;
        let mut lines: Vec<Line> = Vec::new();
        lines.try_reserve_exact(nbytes / 64).map_err(|_| {
            ExecError::storage(
                op,
                fucina_storage::StorageError::AllocationFailed { bytes: nbytes },
            )
        })?;
        advise_huge_pages(lines.as_ptr().cast(), nbytes);
        lines.resize(nbytes / 64, Line([0; 64]));
        if nbytes > 0 {
            let bytes = line_bytes_mut(&mut lines);
            let sb = layout.strip_bytes;
            self.par_rows(bytes, sb, sb, |r, out| {
                for (s, o) in r.zip(out.chunks_exact_mut(sb)) {
                    quant_packed::repack_strip(&layout, w.bytes, w.rows, s, o);
                }
            });
        }
        Ok(PackedQuantMatrix {
            format: w.format,
            rows: w.rows,
            cols: w.cols,
            layout: Layout::Blocks(layout),
            lines,
        })
    }

    /// [`repack_quant`](Self::repack_quant) of a Q4_K matrix of a multiple
    /// of eight rows: strips of eight rows, each the size of its rows.
    fn repack_q4k(&self, w: &QuantMatrix<'_>) -> Result<PackedQuantMatrix, ExecError> {
        let op = "repack_quant";
        let row_bytes = w.row_bytes();
        let nbytes = w.bytes.len();
        debug_assert_eq!(nbytes, w.rows * row_bytes);
        let mut lines: Vec<Line> = Vec::new();
        lines.try_reserve_exact(nbytes.div_ceil(64)).map_err(|_| {
            ExecError::storage(
                op,
                fucina_storage::StorageError::AllocationFailed { bytes: nbytes },
            )
        })?;
        advise_huge_pages(lines.as_ptr().cast(), nbytes);
        lines.resize(nbytes.div_ceil(64), Line([0; 64]));
        let sb = q4k_packed::G * row_bytes;
        if nbytes > 0 {
            let bytes = &mut line_bytes_mut(&mut lines)[..nbytes];
            self.par_rows(bytes, sb, sb, |r, out| {
                for (s, o) in r.zip(out.chunks_exact_mut(sb)) {
                    q4k_packed::repack_strip(w.bytes, row_bytes, s, o);
                }
            });
        }
        Ok(PackedQuantMatrix {
            format: w.format,
            rows: w.rows,
            cols: w.cols,
            layout: Layout::Q4K { row_bytes },
            lines,
        })
    }

    /// [`quant_matmul`](Self::quant_matmul) over a repacked matrix: the same
    /// `out[i, j] = Σ_k x[i, k] · w[j, k]`, the same bits (for any `m`, thread
    /// count and vector level), read from the strip layout. Allocates nothing
    /// once the context's pool holds the scratch of a call of this size.
    ///
    /// # Errors
    /// As [`quant_matmul`](Self::quant_matmul).
    pub fn quant_matmul_packed(
        &self,
        x: &[f32],
        m: usize,
        w: &PackedQuantMatrix,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        let op = "quant_matmul_packed";
        let (rows, cols) = (w.rows, w.cols);
        let lay = match w.layout {
            Layout::Blocks(lay) => lay,
            Layout::Q4K { row_bytes } => {
                // the strips hold the original's bytes count, row by row in
                // runs of eight (a view of the same size)
                let bytes = &line_bytes(&w.lines)[..rows * row_bytes];
                let q = QuantMatrix::new(w.format, rows, cols, bytes)?;
                let kernel = (q4k_packed_kernel(), q4k_packed::G);
                return self.quant_matmul_q8k(op, x, m, &q, out, kernel);
            }
        };
        let Some((nx, no)) = check_product(op, x, m, rows, cols, out)? else {
            return Ok(());
        };
        let nb = cols / QK;
        let lease = |e| ExecError::storage(op, e);
        let pool = self.pool();
        let strips = rows.div_ceil(G);
        let mut xq = pool.acquire_scratch::<i8>(nx).map_err(lease)?;
        let mut xs = pool.acquire_scratch::<f32>(m * nb).map_err(lease)?;
        let mut xb = pool.acquire_scratch::<i32>(m * nb * LANES).map_err(lease)?;
        let mut t = pool.acquire_scratch::<f32>(strips * G * m).map_err(lease)?;
        // A format with a min term (Q4_1, Q5_1) needs each activation block's sum.
        let mut sums = match w.format.needs_sums() {
            true => Some(pool.acquire_scratch::<f32>(m * nb).map_err(lease)?),
            false => None,
        };
        let offset = w.format.act_offset();
        match sums.as_deref_mut() {
            Some(sums) => {
                quant_k::quantize_acts(x, m, cols, offset, &mut xq, &mut xs, &mut xb, sums)
            }
            None => self.quantize_acts(x, cols, offset, &mut xq, &mut xs, &mut xb),
        }
        let sums = sums.as_deref().unwrap_or(&[]);
        let acts = Acts {
            q: &xq,
            scale: &xs,
            bias: &xb,
            cols,
        };
        let data = line_bytes(&w.lines);
        if quant_packed::gemm_path(m) {
            // A prefill: each chunk of strips unpacks its tiles into its own
            // scratch (taken from the pool before the team runs).
            self.par_rows_with_scratch(
                op,
                &mut t,
                G * m,
                G * m * cols,
                lay.gemm_scratch_bytes(),
                |r, o, scratch: &mut [u8]| {
                    with_strip_format!(w.format, F => quant_packed::packed_gemm::<F>(&lay, data, r, &acts, sums, m, o, scratch));
                },
            )?;
        } else {
            self.par_rows(&mut t, G * m, G * m * cols, |r, o| {
                with_strip_format!(w.format, F => quant_packed::packed_rows::<F>(&lay, data, r, &acts, sums, m, o));
            });
        }
        debug_assert_eq!(out.len(), no);
        if m == 1 {
            out.copy_from_slice(&t[..rows]);
        } else {
            // `t` holds each strip's outputs activation row by activation
            // row: a row of `out` is gathered in runs of G (rows of `out` in
            // parallel).
            let t = &t[..strips * G * m];
            self.par_rows(out, rows, rows, |ri, out| {
                for (s, ts) in t.chunks_exact(G * m).enumerate() {
                    let n = G.min(rows - s * G);
                    for (i, o) in ri.clone().zip(out.chunks_exact_mut(rows)) {
                        let run = &ts[i * G..(i + 1) * G];
                        let o = &mut o[s * G..s * G + n];
                        if n == G {
                            // A whole strip: a fixed-length copy (no library
                            // call).
                            let o: &mut [f32; G] = o.try_into().expect("G outputs");
                            *o = run.try_into().expect("a run of G");
                        } else {
                            o.copy_from_slice(&run[..n]);
                        }
                    }
                }
            });
        }
        Ok(())
    }
}
