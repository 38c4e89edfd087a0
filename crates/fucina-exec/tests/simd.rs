//! Every vectorized op gives the same bits at every vector level the CPU supports
//! (portable, AVX2, AVX-512): the kernels keep one lane layout and one operation
//! sequence whatever the register width. One test function, because the level is a
//! process-wide setting.

#![allow(clippy::result_large_err)] // ExecError holds inline shapes, like RawTensor

mod support;

use fucina_exec::{
    ExecContext, ExecError, RawTensor, SimdLevel, detected_simd_level, force_simd_level, simd_level,
};
use support::{nan_bits, values};

/// The bits of every op output, in a fixed order.
fn run_all(ctx: &ExecContext) -> Result<Vec<(String, Vec<u32>)>, ExecError> {
    let mut out = Vec::new();
    let mut push = |name: &str, t: RawTensor| out.push((name.to_string(), nan_bits(&t)));
    // Odd sizes: vector bodies plus scalar tails; 1029 > 4 blocks of 256.
    let (r, c) = (13, 1029);
    let a = ctx.from_slice(&[r, c], &values(r * c, 1))?;
    let b = ctx.from_slice(&[r, c], &values(r * c, 2))?;
    let pos = ctx.add_scalar(&ctx.abs(&a)?, 0.25)?;
    let row = ctx.from_slice(&[c], &values(c, 3))?;
    let at = ctx
        .from_slice(&[c, r], &values(r * c, 4))?
        .transpose(0, 1)?;
    let gamma = ctx.from_slice(&[c], &values(c, 5))?;
    let beta = ctx.from_slice(&[c], &values(c, 6))?;
    let big = ctx.from_slice(&[3 * 65536 + 77], &values(3 * 65536 + 77, 7))?;

    // The GEMM follows the level too: each micro-kernel (portable, AVX2,
    // AVX-512) with a packed right-hand side (a transposed view) and, on
    // AVX-512, one read in place (row-major, whole 32-column panels).
    let w = ctx.from_slice(&[c, 64], &values(c * 64, 9))?;
    push("matmul_packed", ctx.matmul(&a, &b.transpose(0, 1)?)?);
    push("matmul_in_place", ctx.matmul(&a, &w)?);
    // The fused attention: 32-wide heads (the value read in place on
    // AVX-512) and 6-wide ones (packed), 33 keys (two panels).
    for (e, heads) in [(64, 2), (12, 2)] {
        let q = ctx.from_slice(&[2, 5, e], &values(10 * e, 40))?;
        let kv = ctx.from_slice(&[2, 33, e], &values(66 * e, 41))?;
        let (y, p) = ctx.attention(&q, &kv, &kv, heads, 0.4)?;
        let (dq, dk, dv) = ctx.attention_backward(&q, &kv, &kv, &p, &q, heads, 0.4)?;
        for (part, t) in [("", y), ("_p", p), ("_dq", dq), ("_dk", dk), ("_dv", dv)] {
            push(&format!("attention_e{e}{part}"), t);
        }
        let x = ctx.from_slice(&[2, 5, 3 * e], &values(30 * e, 42))?;
        let (y, p) = ctx.attention_packed(&x, heads, 0.4)?;
        let g = ctx.from_slice(&[2, 5, e], &values(10 * e, 43))?;
        let dx = ctx.attention_packed_backward(&x, &p, &g, heads, 0.4)?;
        push(&format!("attention_packed_e{e}"), y);
        let flags: Vec<bool> = (0..10).map(|i| i % 4 == 1).collect();
        let pad = ctx.from_slice_typed::<bool>(&[2, 5], &flags)?;
        let (ym, pm) = ctx.attention_packed_masked(&x, &pad, heads, 0.4)?;
        push(&format!("attention_packed_masked_e{e}"), ym);
        push(&format!("attention_packed_masked_e{e}_p"), pm);
        push(&format!("attention_packed_e{e}_dx"), dx);
    }
    push("add", ctx.add(&a, &b)?);
    push("add_row", ctx.add(&a, &row)?);
    push("add_transposed", ctx.add(&a, &at)?);
    push("sub", ctx.sub(&a, &b)?);
    push("mul", ctx.mul(&a, &b)?);
    push("div", ctx.div(&a, &pos)?);
    push("maximum", ctx.maximum(&a, &b)?);
    push("minimum", ctx.minimum(&a, &row)?);
    push("scale", ctx.scale(&a, 1.7)?);
    push("add_scalar", ctx.add_scalar(&a, -0.3)?);
    push("clamp", ctx.clamp(&a, -0.5, 0.7)?);
    push("neg", ctx.neg(&a)?);
    push("relu", ctx.relu(&a)?);
    push("relu_backward", ctx.relu_backward(&a, &b)?);
    push("sqrt", ctx.sqrt(&pos)?);
    push("rsqrt", ctx.rsqrt(&pos)?);
    push("exp", ctx.exp(&a)?);
    push("log", ctx.log(&pos)?);
    push("sigmoid", ctx.sigmoid(&a)?);
    push("tanh", ctx.tanh(&a)?);
    push("gelu", ctx.gelu(&a)?);
    push("gelu_backward", ctx.gelu_backward(&a, &b)?);
    push("gelu_erf", ctx.gelu_erf(&a)?);
    push("silu", ctx.silu(&a)?);
    push("softplus", ctx.softplus(&a)?);
    push("logsigmoid", ctx.logsigmoid(&a)?);
    push("mish", ctx.mish(&a)?);
    push("hardswish", ctx.hardswish(&a)?);
    push("hardswish_backward", ctx.hardswish_backward(&a, &b)?);
    // The libm-free transcendentals (`kernels::math`) on a wide range, with
    // special values: large magnitudes, zeros of both signs, infinities, NaN,
    // subnormals.
    let mut wide = values(r * c, 8);
    for (i, v) in wide.iter_mut().enumerate() {
        *v *= [1.0, 10.0, 60.0, 1e-3, 1e-39][i % 5];
    }
    let specials = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-45,
        -1e-40,
        100.0,
        -100.0,
        3e38,
    ];
    wide[..specials.len()].copy_from_slice(&specials);
    let w = ctx.from_slice(&[r, c], &wide)?;
    let wpos = ctx.abs(&w)?;
    for (name, t) in [
        ("exp_wide", ctx.exp(&w)?),
        ("log_wide", ctx.log(&w)?),
        ("log_pos_wide", ctx.log(&wpos)?),
        ("tanh_wide", ctx.tanh(&w)?),
        ("sigmoid_wide", ctx.sigmoid(&w)?),
        ("gelu_wide", ctx.gelu(&w)?),
        ("silu_wide", ctx.silu(&w)?),
        ("softplus_wide", ctx.softplus(&w)?),
        ("exp_backward", ctx.exp_backward(&a, &b)?),
        ("log_backward", ctx.log_backward(&pos, &b)?),
        ("tanh_backward", ctx.tanh_backward(&w, &b)?),
        ("sigmoid_backward", ctx.sigmoid_backward(&w, &b)?),
        ("silu_backward", ctx.silu_backward(&w, &b)?),
        ("softplus_backward", ctx.softplus_backward(&w, &b)?),
        ("logsigmoid_wide", ctx.logsigmoid(&w)?),
        ("logsigmoid_backward", ctx.logsigmoid_backward(&w, &b)?),
        ("mish_wide", ctx.mish(&w)?),
        ("mish_backward", ctx.mish_backward(&w, &b)?),
        ("gelu_erf_backward", ctx.gelu_erf_backward(&a, &b)?),
        ("softmax_wide", ctx.softmax(&w, 1)?),
        ("log_softmax_wide", ctx.log_softmax(&w, 1)?),
        ("logsumexp_wide", ctx.logsumexp(&w, 1, false)?),
    ] {
        push(name, t);
    }
    let mask = ctx.greater(&a, &b)?;
    push("where", ctx.where_(&mask, &a, &b)?);
    push("masked_fill", ctx.masked_fill(&a, &mask, 3.0)?);
    push("materialize_t", ctx.materialize(&at)?);
    push(
        "materialize_3d",
        ctx.materialize(&a.reshape(&[13, 3, 343])?.permute(&[2, 0, 1])?)?,
    );

    for axis in [0, 1] {
        push("sum", ctx.sum(&a, axis, false)?);
        push("mean", ctx.mean(&at, axis, true)?);
        push("max", ctx.max(&a, axis, false)?);
        push("min", ctx.min(&a, axis, false)?);
        push("variance", ctx.variance(&a, axis, false, true)?);
        push("logsumexp", ctx.logsumexp(&a, axis, false)?);
        push("softmax", ctx.softmax(&a, axis)?);
        push("log_softmax", ctx.log_softmax(&a, axis)?);
        let y = ctx.softmax(&a, axis)?;
        push("softmax_backward", ctx.softmax_backward(&y, &b, axis)?);
        let y = ctx.log_softmax(&a, axis)?;
        push(
            "log_softmax_backward",
            ctx.log_softmax_backward(&y, &b, axis)?,
        );
    }
    push("argmax", ctx.cast_to_f32(&ctx.argmax(&a, 1, false)?)?);
    push("sum_all", ctx.sum_all(&big)?);
    push("mean_all", ctx.mean_all(&a)?);
    push("sum_to", ctx.sum_to(&a, &[1, c])?);
    push("layer_norm", ctx.layer_norm(&a, &gamma, &beta, 1e-5)?);
    push("rms_norm", ctx.rms_norm(&a, &gamma, 1e-5)?);
    let (gx, gg, gb) = ctx.layer_norm_backward(&a, &gamma, &b, 1e-5)?;
    push("layer_norm_backward_x", gx);
    push("layer_norm_backward_gamma", gg);
    push("layer_norm_backward_beta", gb);
    let (gx, gg) = ctx.rms_norm_backward(&a, &gamma, &b, 1e-5)?;
    push("rms_norm_backward_x", gx);
    push("rms_norm_backward_gamma", gg);
    let labels: Vec<i64> = (0..r as i64).map(|i| (i * 97) % c as i64).collect();
    let labels = ctx.from_slice_typed::<i64>(&[r], &labels)?;
    push("cross_entropy", ctx.cross_entropy(&a, &labels)?);
    push(
        "cross_entropy_backward",
        ctx.cross_entropy_backward(&a, &labels, 0.5)?,
    );
    push("mse_loss", ctx.mse_loss(&a, &b)?);
    let (ga, gb) = ctx.mse_loss_backward(&a, &b, 2.0)?;
    push("mse_loss_backward_a", ga);
    push("mse_loss_backward_b", gb);
    // A scatter-add of rows (ids repeat): grad [r, c] into a vocabulary of 5 rows.
    let ids: Vec<i64> = (0..r as i64).map(|i| (i * 3) % 5).collect();
    let ids = ctx.from_slice_typed::<i64>(&[r], &ids)?;
    push("embedding_backward", ctx.embedding_backward(&a, &ids, 5)?);
    let (v, _) = ctx.topk(&a, 5, 1, true)?;
    push("topk", v);
    // The fused recurrent cells (hidden 37: vector bodies and scalar tails).
    let (bsz, h) = (5, 37);
    let g4 = |seed| ctx.from_slice(&[bsz, 4 * h], &values(bsz * 4 * h, seed));
    let g3 = |seed| ctx.from_slice(&[bsz, 3 * h], &values(bsz * 3 * h, seed));
    let st = ctx.from_slice(&[bsz, h], &values(bsz * h, 12))?;
    let (hc, saved) = ctx.lstm_cell(&g4(10)?, &g4(11)?, &st)?;
    let ghc = ctx.from_slice(&[2, bsz, h], &values(2 * bsz * h, 13))?;
    let (dg, dc) = ctx.lstm_cell_backward(&saved, &st, &ghc)?;
    push("lstm_cell", hc);
    push("lstm_cell_saved", saved);
    push("lstm_cell_backward_gates", dg);
    push("lstm_cell_backward_c", dc);
    let (h1, saved) = ctx.gru_cell(&g3(14)?, &g3(15)?, &st)?;
    let (dgi, dgh, dh) = ctx.gru_cell_backward(&saved, &st, &h1)?;
    push("gru_cell", h1);
    push("gru_cell_saved", saved);
    push("gru_cell_backward_gi", dgi);
    push("gru_cell_backward_gh", dgh);
    push("gru_cell_backward_h", dh);
    // The sequence ops (3 steps, batch 5, 6 features, hidden 37).
    let x = ctx.from_slice(&[3, bsz, 6], &values(3 * bsz * 6, 16))?;
    for (lstm, g) in [(true, 4 * h), (false, 3 * h)] {
        let w = ctx.from_slice(&[g, 6 + h + 2], &values(g * (h + 8), 17))?;
        let w = ctx.scale(&w, 0.3)?;
        for reverse in [false, true] {
            let (name, (out, saved, (gx, gw, gs))) = if lstm {
                let st = ctx.from_slice(&[2, bsz, h], &values(2 * bsz * h, 18))?;
                let (out, saved) = ctx.lstm_sequence(&x, &w, &st, reverse)?;
                let g = ctx.from_slice(&[4, bsz, h], &values(4 * bsz * h, 19))?;
                let grads = ctx.lstm_sequence_backward(&w, &saved, &g, reverse)?;
                ("lstm_sequence", (out, saved, grads))
            } else {
                let (out, saved) = ctx.gru_sequence(&x, &w, &st, reverse)?;
                let grads = ctx.gru_sequence_backward(&w, &saved, &out, reverse)?;
                ("gru_sequence", (out, saved, grads))
            };
            for (part, t) in [
                ("", out),
                ("_saved", saved),
                ("_dx", gx),
                ("_dw", gw),
                ("_ds", gs),
            ] {
                push(&format!("{name}{part}_{reverse}"), t);
            }
        }
    }
    Ok(out)
}

/// The bits of every element, every NaN mapped to one canonical NaN: a NaN stays
/// a NaN at every level, but its sign and payload are not part of the promise
/// (which operand's NaN an x86 instruction passes on depends on the operand
/// order the compiler picked for that vector width).

#[test]
fn every_vector_level_gives_the_same_bits() {
    let best = detected_simd_level();
    let levels: Vec<SimdLevel> = SimdLevel::available().collect();
    eprintln!("levels compared: {levels:?}");
    let mut reference: Option<Vec<(String, Vec<u32>)>> = None;
    for &level in &levels {
        assert!(force_simd_level(level));
        assert_eq!(simd_level(), level);
        for threads in [2] {
            let ctx = ExecContext::with_threads(threads);
            let got = run_all(&ctx).unwrap();
            ctx.close().unwrap();
            match &reference {
                None => reference = Some(got),
                Some(want) => {
                    assert_eq!(got.len(), want.len());
                    for ((name, g), (_, w)) in got.iter().zip(want) {
                        let diff = g.iter().zip(w).filter(|(x, y)| x != y).count();
                        assert_eq!(diff, 0, "{name}: {diff} elements differ at {level:?}");
                    }
                }
            }
        }
    }
    // A level above the CPU's is refused and changes nothing.
    if !SimdLevel::Avx512.is_supported() {
        assert!(!force_simd_level(SimdLevel::Avx512));
        assert_eq!(simd_level(), *levels.last().unwrap());
    }
    assert!(force_simd_level(best));
}
