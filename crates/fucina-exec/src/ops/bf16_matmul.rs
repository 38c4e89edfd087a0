//! bf16 matrix products with the AMX summation rule
//! ([`ExecContext::bf16_matmul_amx_rule`]): activations rounded to bf16, bf16
//! weights, the depth summed in blocks of 32 with an even and an odd
//! accumulator per block, exactly as Intel's AMX `TDPBF16PS` does, so that
//! the AMX tiles, an AVX-512 emulation and a portable emulation give the same
//! bits. The rule, the paths and why they agree are described in
//! `kernels/amx_rule/` and in docs/DETERMINISM.md ("bf16 products with the
//! AMX rule").

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::amx_rule::{self, Acts, KB, Line, MT, NT, PackedB, Path, TILE};
use crate::memory::advise_huge_pages;
use crate::tensor::layout::Dims;
use crate::weight_format::{WeightFormat, WeightMatrix};

/// A bf16 weight matrix `[rows, cols]` (output features × input features, the
/// layout of [`WeightMatrix`]) packed once for
/// [`ExecContext::bf16_matmul_amx_rule`]: 64-byte aligned 1 KiB tiles of 16
/// output features × 32 input features, pairs of input features side by side
/// (the operand layout of the AMX tile product), with a small summary of the
/// values of each 16-feature panel. It takes the matrix's bytes rounded up to
/// whole tiles (an even number of 16-feature panels, the input features to a
/// multiple of 32).
///
/// This is the prepared form of a weight that lives for the process: make it
/// once when the model is loaded, keep it with the model. Immutable, `Send`
/// and `Sync`.
#[derive(Clone)]
pub struct PackedBf16Matrix {
    packed: PackedB,
}

impl std::fmt::Debug for PackedBf16Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedBf16Matrix")
            .field("rows", &self.rows())
            .field("cols", &self.cols())
            .field("size_bytes", &self.size_bytes())
            .finish()
    }
}

impl PackedBf16Matrix {
    /// Packs `w`, which must be in [`WeightFormat::BF16`].
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] (naming `PackedBf16Matrix::new`) when `w`
    /// is not bf16; [`ExecError::InvalidDataLength`] when `w.bytes` does not
    /// hold `rows * cols` elements; [`ExecError::Overflow`] when the packed
    /// size overflows; [`ExecError::OutOfMemory`] when it cannot be allocated.
    pub fn new(w: &WeightMatrix<'_>) -> Result<Self, ExecError> {
        const OP: &str = "PackedBf16Matrix::new";
        if w.format != WeightFormat::BF16 {
            return Err(ExecError::InvalidArgument {
                op: OP,
                reason: "the weight matrix must be bf16",
            });
        }
        let (n, kk) = (w.rows, w.cols);
        let overflow = || ExecError::Overflow {
            op: OP,
            shape: Dims::new(&[n, kk]),
        };
        let bytes = n
            .checked_mul(kk)
            .and_then(|e| e.checked_mul(2))
            .ok_or_else(overflow)?;
        if w.bytes.len() != bytes {
            return Err(ExecError::InvalidDataLength {
                op: OP,
                shape: Dims::new(&[n, kk]),
                expected: bytes,
                got: w.bytes.len(),
            });
        }
        let nlines = amx_rule::packed_b_lines(n, kk).ok_or_else(overflow)?;
        let mut lines: Vec<Line> = Vec::new();
        lines.try_reserve_exact(nlines).map_err(|_| {
            ExecError::storage(
                OP,
                fucina_storage::StorageError::AllocationFailed {
                    bytes: nlines.saturating_mul(64),
                },
            )
        })?;
        advise_huge_pages(lines.as_ptr().cast(), nlines * 64);
        lines.resize(nlines, Line([0; 32]));
        let mut spans = Vec::new();
        amx_rule::pack_b(w.bytes, n, kk, &mut lines, &mut spans);
        Ok(PackedBf16Matrix {
            packed: PackedB {
                n,
                k: kk,
                kblocks: kk.div_ceil(KB),
                panels: n.div_ceil(NT).next_multiple_of(2),
                lines,
                spans,
            },
        })
    }

    /// Output features (rows of the original matrix).
    pub fn rows(&self) -> usize {
        self.packed.n
    }

    /// Input features (columns of the original matrix).
    pub fn cols(&self) -> usize {
        self.packed.k
    }

    /// The bytes the packed tiles take.
    pub fn size_bytes(&self) -> usize {
        self.packed.lines.len() * 64
    }
}

/// Whether this process can use Intel AMX tiles for
/// [`ExecContext::bf16_matmul_amx_rule`]: the CPU has `amx_tile` and
/// `amx_bf16` and the Linux kernel granted the tile state (asked once per
/// process). The op uses them at the AVX-512 [`simd_level`](crate::simd_level)
/// unless the environment variable `FUCINA_AMX` is `off` (or `0`, `false`,
/// `no`) when the op first runs. The results are the same bits either way.
pub fn amx_available() -> bool {
    amx_rule::amx_available()
}

/// Test hook: turns the AMX path of [`ExecContext::bf16_matmul_amx_rule`] on
/// or off for every later call of the process; returns `false` (and changes
/// nothing) when asked to turn it on where [`amx_available`] is false. Meant
/// for tests that compare the paths' bits.
#[doc(hidden)]
pub fn force_amx(on: bool) -> bool {
    amx_rule::force_amx(on)
}

fn path_name(p: Path) -> &'static str {
    match p {
        Path::Amx => "amx",
        Path::Avx512 => "avx512",
        Path::Portable => "portable",
    }
}

/// Which implementation [`ExecContext::bf16_matmul_amx_rule`] runs now for a
/// call with many rows: `"amx"`, `"avx512"` (the AVX-512 emulation) or
/// `"portable"`. Calls of few rows may take another path with the same bits
/// (see [`amx_rule_path_for`]).
#[doc(hidden)]
pub fn amx_rule_path() -> &'static str {
    path_name(amx_rule::path())
}

/// Which implementation [`ExecContext::bf16_matmul_amx_rule`] runs now for a
/// call of `m` rows: as [`amx_rule_path`], except that where that is `"amx"`
/// calls of fewer rows than the threshold of [`set_amx_rule_min_rows`] take
/// the AVX-512 emulation (`"avx512"`), which reads the weights of a
/// decode-sized call faster than tiles padded to 32 rows.
#[doc(hidden)]
pub fn amx_rule_path_for(m: usize) -> &'static str {
    path_name(amx_rule::path_for(m))
}

/// Test and benchmark hook: calls of [`ExecContext::bf16_matmul_amx_rule`]
/// with fewer than `rows` rows take the AVX-512 emulation even where the AMX
/// path is on (`0`: every call takes the AMX tiles); returns the previous
/// threshold. The default is the one measured on this project's development
/// machine (docs/BENCHMARKS.md). The bits are the same either way.
#[doc(hidden)]
pub fn set_amx_rule_min_rows(rows: usize) -> usize {
    amx_rule::set_amx_min_rows(rows)
}

impl ExecContext {
    /// `out[i, j] = Σ_k bf16(x[i, k]) · w[j, k]` for `m` rows of `x`
    /// (`[m, w.cols()]`, row-major f32) into `out` (`[m, w.rows()]`), with the
    /// AMX summation rule: each activation rounded to bf16 (nearest-even),
    /// the depth in blocks of 32 from `k = 0`, per block an even and an odd
    /// accumulator from `+0` taking the pairs' products with one rounding per
    /// step and results below `2^-126` flushed to zero, then
    /// `C = C + (even + odd)`. See docs/DETERMINISM.md for the whole rule.
    ///
    /// Every path gives the same bits: AMX tiles where the CPU has them (at
    /// the AVX-512 level, unless `FUCINA_AMX=off`) for calls of 6 rows or
    /// more, an AVX-512 emulation (also for calls of up to 5 rows where AMX
    /// is on: decode-sized calls, whose weights it streams faster), and a
    /// portable one at lower levels; so do all thread counts, and a row's
    /// result does not depend on the other rows. The output features are
    /// split over the team in panels of 32; each output is computed whole by
    /// one thread. No heap allocation: pooled scratch only (the rounded
    /// activations, where the `vdpbf16ps` kernel runs also as its bf16
    /// pairs, and a panel-major copy of the output).
    ///
    /// ```
    /// use fucina_exec::{ExecContext, PackedBf16Matrix, WeightFormat, WeightMatrix};
    ///
    /// // bf16 weights [2, 4]: [[2^12, 1, 2^12, 1], [1, 1, 1, 1]]
    /// let bytes: Vec<u8> = [4096.0f32, 1.0, 4096.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    ///     .iter()
    ///     .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
    ///     .collect();
    /// let w = PackedBf16Matrix::new(&WeightMatrix::new(WeightFormat::BF16, 2, 4, &bytes)?)?;
    /// let ctx = ExecContext::new();
    /// let mut out = [0.0f32; 2];
    /// ctx.bf16_matmul_amx_rule(&[4096.0, 1.0, -4096.0, 1.0], 1, &w, &mut out)?;
    /// // Even products 2^24 - 2^24 = 0, odd 1 + 1 = 2 (a left-to-right sum
    /// // would lose the first 1 against 2^24 and give 1).
    /// assert_eq!(out, [2.0, 2.0]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidDataLength`] (naming `bf16_matmul_amx_rule`) when
    /// `x.len() != m * w.cols()` or `out.len() != m * w.rows()`;
    /// [`ExecError::Overflow`] when a size overflows; [`ExecError::OutOfMemory`]
    /// when the scratch cannot be had. Nothing is written on an error.
    pub fn bf16_matmul_amx_rule(
        &self,
        x: &[f32],
        m: usize,
        w: &PackedBf16Matrix,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        const OP: &str = "bf16_matmul_amx_rule";
        let b = &w.packed;
        let (n, kk) = (b.n, b.k);
        let overflow = |shape: &[usize]| ExecError::Overflow {
            op: OP,
            shape: Dims::new(shape),
        };
        let nx = m.checked_mul(kk).ok_or_else(|| overflow(&[m, kk]))?;
        if x.len() != nx {
            return Err(ExecError::InvalidDataLength {
                op: OP,
                shape: Dims::new(&[m, kk]),
                expected: nx,
                got: x.len(),
            });
        }
        let no = m.checked_mul(n).ok_or_else(|| overflow(&[m, n]))?;
        if out.len() != no {
            return Err(ExecError::InvalidDataLength {
                op: OP,
                shape: Dims::new(&[m, n]),
                expected: no,
                got: out.len(),
            });
        }
        if no == 0 {
            return Ok(());
        }
        if kk == 0 {
            // No block: every C stays +0.
            out.fill(0.0);
            return Ok(());
        }
        let path = amx_rule::path_for(m);
        let kb = b.kblocks;
        let ka = kb * KB;
        // AMX works on pairs of 16-row groups.
        let m_pad = if path == Path::Amx {
            m.next_multiple_of(2 * MT)
        } else {
            m
        };
        let too_big = || overflow(&[m_pad, b.panels * NT]);
        let nt = m_pad.checked_mul(b.panels * NT).ok_or_else(too_big)?;
        let lease = |e| ExecError::storage(OP, e);
        let pool = self.pool();
        let mut t = pool.acquire_scratch::<f32>(nt).map_err(lease)?;
        // The activations in the path's form.
        let (mut tiles, mut rows, mut spans, pairs);
        let acts = if path == Path::Amx {
            let per_group = kb * TILE;
            let len = (m_pad / MT)
                .checked_mul(per_group)
                .ok_or_else(|| overflow(&[m_pad, ka]))?;
            tiles = pool.acquire_scratch::<u16>(len).map_err(lease)?;
            self.par_rows(&mut tiles[..], per_group, MT * ka, |g, o| {
                crate::kernels::simd::vectorized!(amx_rule::pack_a_tiles(x, kk, kb, g.start, o))
            });
            Acts::Tiles(&tiles[..])
        } else {
            let len = m.checked_mul(ka).ok_or_else(|| overflow(&[m, ka]))?;
            rows = pool.acquire_scratch::<f32>(len).map_err(lease)?;
            spans = pool.acquire_scratch::<u16>(m).map_err(lease)?;
            amx_rule::widen_a(x, kk, ka, &mut rows, &mut spans);
            // The `vdpbf16ps` kernel's form too, where the call runs it.
            pairs = if amx_rule::wants_pairs(path, m) {
                let mut p = pool.acquire_scratch::<u32>(len / 2).map_err(lease)?;
                let rows = &rows[..];
                self.par_rows(&mut p[..], ka / 2, ka, |ri, o| {
                    amx_rule::pack_pairs(&rows[ri.start * ka..ri.end * ka], o)
                });
                Some(p)
            } else {
                None
            };
            Acts::Rows {
                a: &rows[..],
                spans: &spans[..],
                pairs: pairs.as_ref().map_or(&[][..], |p| &p[..]),
            }
        };
        // Multiply-adds per panel pair.
        let work = m.saturating_mul(ka).saturating_mul(2 * NT);
        self.par_rows(&mut t[..], 2 * m_pad * NT, work, |pairs, tp| {
            amx_rule::panel_pairs(path, &acts, b, m, m_pad, pairs, tp)
        });
        // Gather: out[i, j·16 + c] = t[j][i][c].
        let t = &t[..];
        self.par_rows(out, n, n, |ri, o| {
            for (i, orow) in ri.zip(o.chunks_exact_mut(n)) {
                let mut full = orow.chunks_exact_mut(NT);
                for (j, oc) in full.by_ref().enumerate() {
                    // A whole panel: a fixed-length copy (no library call).
                    let oc: &mut [f32; NT] = oc.try_into().expect("16 outputs");
                    let src = &t[(j * m_pad + i) * NT..(j * m_pad + i + 1) * NT];
                    *oc = src.try_into().expect("16 outputs");
                }
                let rest = full.into_remainder();
                if !rest.is_empty() {
                    let j = n / NT;
                    rest.copy_from_slice(&t[(j * m_pad + i) * NT..][..rest.len()]);
                }
            }
        });
        Ok(())
    }
}

impl PackedBf16Matrix {
    /// Row `r` of the packed matrix (output feature `r`, `cols()` values)
    /// widened to f32 into `out`: the matrix's own values, except that
    /// subnormal values read as zeros of their sign (the tiles hold the
    /// inputs as the AMX product reads them). Lets a caller that needs single
    /// rows (an embedding table that is also the output projection) keep one
    /// copy of the matrix.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] (naming `PackedBf16Matrix::row_to_f32`)
    /// when `r >= rows()` or `out.len() != cols()`; nothing is written then.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) -> Result<(), ExecError> {
        const OP: &str = "PackedBf16Matrix::row_to_f32";
        let b = &self.packed;
        if r >= b.n || out.len() != b.k {
            return Err(ExecError::InvalidArgument {
                op: OP,
                reason: "the row must be below rows() and out hold cols() values",
            });
        }
        let data = b.data();
        for (kk, o) in out.iter_mut().enumerate() {
            *o = amx_rule::bf(data[amx_rule::b_index(b.kblocks, r, kk)]);
        }
        Ok(())
    }
}
