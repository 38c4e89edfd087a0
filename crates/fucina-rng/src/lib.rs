//! # fucina-rng
//!
//! The deterministic random numbers of fucina: splitmix64 with an O(1) counter
//! form, and the fills built on it (Gaussian, uniform, Kaiming, normal, Gumbel,
//! integers, permutations, categorical draws). Every `(seed -> values)` mapping here is a
//! **checkpoint contract**: store a seed instead of the values, regenerate the
//! values later, and get the same bits, on any run, thread count, chunking and
//! CPU. The mappings are bit-compatible with the reference implementation, the
//! Zig library of the same name (its outputs for seed 42 are the crate's
//! golden tests).
//!
//! The crate has no dependencies (optional `rand_core` adapters aside) and
//! allocates nothing.
//!
//! ```
//! use fucina_rng::{at, gaussian_fill, gaussian_fill_at, gaussian_fill_at_fast, splitmix64, uniform_fill};
//!
//! // The stream and its counter form: the i-th output in O(1).
//! let mut state = 42u64;
//! for i in 0..8 {
//!     assert_eq!(splitmix64(&mut state), at(42, i));
//! }
//!
//! // Any chunking of a Gaussian fill gives identical bits.
//! let mut whole = [0.0f32; 6];
//! gaussian_fill(7, &mut whole, 1.0);
//! let mut parts = [0.0f32; 6];
//! gaussian_fill_at(7, 0, &mut parts[..2], 1.0);
//! gaussian_fill_at(7, 2, &mut parts[2..], 1.0);
//! assert_eq!(whole.map(f32::to_bits), parts.map(f32::to_bits));
//!
//! // The vectorized Gaussian (a separate mapping, a few ulps from the exact one).
//! let mut noise = vec![0.0f32; 4096];
//! gaussian_fill_at_fast(7, 0, &mut noise, 0.02);
//! assert!((noise[0] - whole[0] * 0.02).abs() < 1e-6);
//!
//! // Uniform on the half-open [lo, hi).
//! let mut w = vec![0.0f32; 4096];
//! uniform_fill(1, &mut w, -0.5, 0.5);
//! assert!(w.iter().all(|v| (-0.5..0.5).contains(v)));
//! ```
//!
//! ## The mappings
//!
//! | function | values | contract |
//! | --- | --- | --- |
//! | [`splitmix64`], [`at`], [`SplitMix64`] | `u64` stream | `at(seed, i) = mix(seed + (i + 1) * 0x9E3779B97F4A7C15)` |
//! | [`gaussian_fill`], [`gaussian_fill_at`] | N(0, scale²) | Box–Muller in f64, one rounding to f32 |
//! | [`gaussian_fill_at_fast`] | N(0, scale²) | Box–Muller in f32 polynomials, vectorized, its own contract |
//! | [`normal_fill`] | N(mean, std²) | `gaussian_fill(std)`, then `+ mean` in f32 when `mean != 0` |
//! | [`uniform_fill`] | U[lo, hi) | f64 affine map, rounded, round-ups to `hi` clamped below `hi` |
//! | [`kaiming_uniform_fill`] | U[-b, b), b = sqrt(1/fan_in) | PyTorch `nn.Linear` default init |
//! | [`gumbel_fill`] | Gumbel(0, 1) | `-ln(-ln u)` over an open uniform, f64 |
//! | [`randint_fill`] | integers in [low, high) | multiply-shift `low + (x * span) >> 64` |
//! | [`randperm_fill`] | permutation of 0..n | Fisher–Yates over the counter stream |
//! | [`categorical`], [`categorical_fill`] | index drawn with probability ∝ `weights[k]` | inverse CDF in f64 at `u = (at(seed, i) >> 11) * 2^-53` |
//!
//! The exact bit-level definition of each mapping is in its function's docs
//! and in `docs/DETERMINISM.md` of the repository.
//!
//! ## Determinism and portability
//!
//! * Every fill except the sequential-stream ones is a pure function of
//!   `(seed, element index)`; `gaussian_fill_at` and `gaussian_fill_at_fast`
//!   take the index of the first element, so disjoint windows can be filled
//!   independently (e.g. on several threads) with the one-shot result.
//! * The exact f64 mappings use this crate's own portable `ln`, `sin` and `cos`
//!   (ports of the fdlibm/musl algorithms), not the platform libm, whose
//!   precision Rust documents as unspecified.
//! * Everything is stated under the default IEEE environment (round to
//!   nearest-even, no flush-to-zero); `fucina-fpenv` can check it.
//!
//! ## Vectorization
//!
//! The exact [`gaussian_fill`] and [`gaussian_fill_at`] compute 16 pairs at a
//! time through a branch-free form of the f64 Box–Muller (the quadrant of the
//! angle is applied with masks instead of branches), which the compiler turns
//! into SSE2 (2 lanes), AVX2 (4) or AVX-512 (8) code, chosen at run time. The
//! few angles the branch-free form does not cover exactly (within a few
//! ulps of a multiple of pi/2, or tiny) are flagged and their block redone
//! with the general functions, so every path gives the bits of the scalar
//! definition.
//!
//! [`gaussian_fill_at_fast`] and [`uniform_fill`] choose at run time between an
//! AVX-512 (F/DQ/VL) body, an AVX2 body and portable scalar code (other
//! targets use the scalar code). Each vector lane runs the scalar op sequence
//! exactly, so all paths give identical bits; the tests compare every path the
//! CPU offers against the scalar one on long arrays and random windows.
//!
//! The AVX-512 Gaussian loop does 16 pairs (32 values) per step: the counter
//! mixing is `vpsrlq`/`vpxorq`/`vpmullq` on 8 u64 lanes, the uniforms
//! `vcvtqq2pd`/`vmulpd`/`vcvtpd2ps`, the f32 math `vmulps`/`vaddps`/`vsubps`/
//! `vsqrtps`/`vrndscaleps` on zmm registers with mask-register selects, and the
//! interleave two `vpermt2ps`. It is branch-free and contains no fused
//! multiply-add (Rust never contracts `a * b + c`; no `fmadd` intrinsic is
//! used): checked with `objdump -d` on the release build, which has no
//! `vfmadd` at all. The AVX2 body emulates the 64-bit multiply with three
//! `vpmuludq` and the u64 -> f64 conversion with exact magic-number arithmetic.
//!
//! ## Panics
//!
//! Only contract violations panic: [`randint_fill`] with `low >= high` and
//! [`kaiming_uniform_fill`] with `fan_in == 0`. Nothing else panics or
//! allocates. The categorical sampler takes user data (a probability vector),
//! so it returns a [`CategoricalError`] instead for weights that are not a
//! distribution (none, negative, NaN, infinite, all zero).
//!
//! ## Features
//!
//! * `std` (default): run-time CPU feature detection for the vector paths.
//!   Without it the crate is `no_std` (it needs neither `std` nor `alloc`)
//!   and picks a vector path only when the build enables its target features
//!   (e.g. `-C target-cpu=native`); every mapping gives the same bits either
//!   way.
//! * `rand_core`: `rand_core` 0.10 `TryRng` (hence `Rng`) and `SeedableRng` for [`SplitMix64`].
//! * `rand_core_09`: `rand_core` 0.9 `RngCore` and `SeedableRng` for [`SplitMix64`].
//!
//! In both, `seed_from_u64(seed)` uses the seed as the state as-is, so the
//! `next_u64` sequence equals `at(seed, 0), at(seed, 1), ...`.

#![cfg_attr(not(any(feature = "std", test)), no_std)]

mod categorical;
mod dispatch;
mod fast;
mod float;
mod gaussian;
mod int;
mod math;
mod rand_adapters;
mod stream;
mod uniform;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use categorical::{CategoricalError, categorical, categorical_fill};
pub use fast::gaussian_fill_at_fast;
pub use gaussian::{gaussian_fill, gaussian_fill_at, normal_fill};
pub use int::{randint_fill, randperm_fill};
pub use stream::{SplitMix64, at, splitmix64};
pub use uniform::{gumbel_fill, kaiming_uniform_fill, uniform_fill};
