//! What a careless or hostile caller could once turn into an abort, a broken
//! context or stale data: huge zero-copy views, panics and early returns inside
//! exec scopes, foreign and stale scope tokens, views past a tensor's extent,
//! sizes from the caller that overflow in conv and pool geometry, and the texts
//! of two errors. Cases that used to abort the process run in a child
//! process with a timeout.
#![allow(clippy::result_large_err)] // `ExecError` carries inline shapes

use std::panic::{AssertUnwindSafe, catch_unwind};

use fucina_exec::{
    Conv1dOptions, Conv2dOptions, ExecContext, ExecError, Pool2dOp, Pool2dOptions, RawTensor,
};

mod child_process;
use child_process::{is_child, run_in_child};

/// Adopts a fresh one-element tensor into the innermost open scope.
fn adopt_one(ctx: &ExecContext) {
    let v = ctx.ones(&[1]).unwrap();
    ctx.reserve_scope_slot().unwrap();
    ctx.adopt_scope_value_assume_capacity(v, None);
}

/// Whether this platform refuses a single allocation of `bytes` up front
/// (Linux with heuristic or strict overcommit; with `overcommit_memory = 1` a
/// 4 TiB request could be granted and only fail when touched).
fn refuses_huge_allocations() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|v| v.trim() != "1")
}

// ---- item 1: huge zero-copy views ----

/// A broadcast of one element to 2^46 elements (2^48 bytes, more than the
/// address space of a 47-bit user space, so no allocator can grant it).
fn huge_view(ctx: &ExecContext) -> RawTensor {
    ctx.ones(&[1])
        .unwrap()
        .broadcast_to(&[1 << 20, 1 << 26])
        .unwrap()
}

fn assert_out_of_memory<T: std::fmt::Debug>(r: Result<T, ExecError>, op: &str) {
    match r {
        Err(ExecError::OutOfMemory { op: got, .. }) => assert_eq!(got, op),
        other => panic!("{op}: expected OutOfMemory, got {other:?}"),
    }
}

fn check_huge_view_is_refused(ctx: &ExecContext, b: &RawTensor) {
    let before = ctx.outstanding_buffers();
    assert_out_of_memory(b.try_to_vec(), "to_vec");
    assert_out_of_memory(ctx.materialize(b), "materialize");
    assert_out_of_memory(ctx.contiguous(b), "materialize");
    assert_out_of_memory(ctx.clone(b), "materialize");
    assert_out_of_memory(ctx.add(b, b), "add");
    let mut w = b.clone();
    assert_out_of_memory(w.data_mut().map(|_| ()), "data_mut");
    assert_eq!(
        w.shape(),
        b.shape(),
        "a failed data_mut leaves the view as it was"
    );
    assert_eq!(w.strides(), b.strides());
    // The infallible form panics with a message (no abort), naming the way out.
    let msg = catch_unwind(AssertUnwindSafe(|| b.to_vec())).expect_err("to_vec must panic");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("try_to_vec"), "panic message: {msg}");
    // The context is unharmed and nothing was left behind.
    assert_eq!(ctx.outstanding_buffers(), before);
    assert_eq!(ctx.ones(&[3]).unwrap().to_vec(), [1.0; 3]);
}

#[test]
fn huge_views_are_refused_with_an_error_not_an_abort() {
    if is_child() {
        let ctx = ExecContext::with_threads(2);
        let b = huge_view(&ctx);
        check_huge_view_is_refused(&ctx, &b);
        if refuses_huge_allocations() {
            // The case of the report: 2^40 elements, 4 TiB.
            let b = ctx.ones(&[1]).unwrap().broadcast_to(&[1 << 40]).unwrap();
            check_huge_view_is_refused(&ctx, &b);
        }
        return;
    }
    run_in_child("huge_views_are_refused_with_an_error_not_an_abort");
}

#[test]
fn copy_into_checks_the_destination_length() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.]).unwrap();
    let t = x.transpose(0, 1).unwrap();
    let mut dst = [0.0; 6];
    t.copy_into(&mut dst).unwrap();
    assert_eq!(dst, [1., 4., 2., 5., 3., 6.]);
    let mut short = [9.0; 5];
    assert!(matches!(
        t.copy_into(&mut short),
        Err(ExecError::InvalidDataLength {
            op: "copy_into",
            expected: 6,
            got: 5,
            ..
        })
    ));
    assert_eq!(short, [9.0; 5], "nothing written on error");
    assert_eq!(t.try_to_vec().unwrap(), t.to_vec());
    let c = ctx.contiguous(&x).unwrap();
    assert!(c.same_storage(&x), "a contiguous tensor is not copied");
    let c = ctx.contiguous(&t).unwrap();
    assert!(c.is_contiguous() && !c.same_storage(&x));
    assert_eq!(c.data().unwrap(), [1., 4., 2., 5., 3., 6.]);
}

// ---- item 3: a panic inside an exec scope ----

#[test]
fn a_panic_inside_an_exec_scope_unwinds_and_closes_every_scope() {
    if is_child() {
        let ctx = ExecContext::with_threads(1);
        let base = ctx.outstanding_buffers();
        // The report's case: an inner scope token alive while the panic unwinds.
        let r = catch_unwind(AssertUnwindSafe(|| {
            ctx.exec_scope(|c| {
                adopt_one(c);
                let _s = c.open_exec_scope();
                adopt_one(c);
                panic!("boom");
            })
        }));
        assert!(r.is_err());
        assert!(!ctx.exec_scope_active());
        assert_eq!(ctx.exec_scope_len(), 0);
        assert_eq!(ctx.outstanding_buffers(), base);
        // An inner scope whose token was forgotten: the outer close takes it.
        let r = catch_unwind(AssertUnwindSafe(|| {
            ctx.exec_scope(|c| {
                std::mem::forget(c.open_exec_scope());
                adopt_one(c);
                std::mem::forget(c.open_exec_scope());
                adopt_one(c);
                panic!("boom");
            })
        }));
        assert!(r.is_err());
        assert!(!ctx.exec_scope_active());
        assert_eq!(ctx.outstanding_buffers(), base);
        // The context still works.
        let n = ctx.exec_scope(|c| {
            adopt_one(c);
            c.exec_scope_len()
        });
        assert_eq!(n, 1);
        assert_eq!(ctx.close(), Ok(()));
        return;
    }
    run_in_child("a_panic_inside_an_exec_scope_unwinds_and_closes_every_scope");
}

// ---- item 4: early returns, out-of-order, stale and foreign tokens ----

fn fails(ctx: &ExecContext) -> Result<(), ExecError> {
    ctx.from_slice(&[2], &[1.0]).map(|_| ())
}

#[test]
fn an_early_return_inside_an_exec_scope_closes_the_inner_scope() {
    let ctx = ExecContext::with_threads(1);
    let base = ctx.outstanding_buffers();
    let r: Result<(), ExecError> = ctx.exec_scope(|c| {
        adopt_one(c);
        let inner = c.open_exec_scope();
        adopt_one(c);
        fails(c)?;
        c.close_exec_scope(inner);
        Ok(())
    });
    assert!(matches!(r, Err(ExecError::InvalidDataLength { .. })));
    assert!(!ctx.exec_scope_active());
    assert_eq!(ctx.exec_scope_len(), 0);
    assert_eq!(ctx.outstanding_buffers(), base);
    // Later results are not retained by a scope left open.
    let x = ctx.ones(&[4]).unwrap();
    drop(x);
    assert_eq!(ctx.outstanding_buffers(), base);
}

#[test]
fn a_dropped_token_closes_its_scope() {
    let ctx = ExecContext::with_threads(1);
    {
        let s = ctx.open_exec_scope();
        adopt_one(&ctx);
        assert!(s.is_open());
        assert_eq!(ctx.exec_scope_len(), 1);
    }
    assert!(!ctx.exec_scope_active());
    assert_eq!(ctx.exec_scope_len(), 0);
    assert_eq!(ctx.outstanding_buffers(), 0);
}

#[test]
fn an_out_of_order_close_closes_the_nested_scopes_and_leaves_the_context_working() {
    let ctx = ExecContext::with_threads(1);
    let outer = ctx.open_exec_scope();
    adopt_one(&ctx);
    let inner = ctx.open_exec_scope();
    adopt_one(&ctx);
    ctx.close_exec_scope(outer);
    assert!(!inner.is_open());
    assert!(!ctx.exec_scope_active());
    assert_eq!(ctx.outstanding_buffers(), 0);
    ctx.close_exec_scope(inner); // a stale token: nothing happens
    // Scopes open and close as usual afterwards, and release what they adopt.
    let s = ctx.open_exec_scope();
    adopt_one(&ctx);
    assert_eq!(ctx.exec_scope_len(), 1);
    ctx.close_exec_scope(s);
    assert!(!ctx.exec_scope_active());
    assert_eq!(ctx.outstanding_buffers(), 0);
}

#[test]
fn a_stale_token_never_closes_a_newer_scope_at_the_same_depth() {
    let ctx = ExecContext::with_threads(1);
    let a = ctx.open_exec_scope();
    let b = ctx.open_exec_scope();
    ctx.close_exec_scope(a); // closes b too
    let c = ctx.open_exec_scope();
    let d = ctx.open_exec_scope();
    // `b` and `d` have the same depth and mark; only `d` is open.
    assert_eq!((b.depth(), b.mark()), (d.depth(), d.mark()));
    adopt_one(&ctx);
    ctx.close_exec_scope(b);
    assert!(d.is_open() && c.is_open());
    assert_eq!(ctx.exec_scope_len(), 1);
    ctx.close_exec_scope(d);
    assert!(c.is_open() && ctx.exec_scope_active());
    assert_eq!(ctx.exec_scope_len(), 0);
    ctx.close_exec_scope(c);
    assert!(!ctx.exec_scope_active());
}

#[test]
fn a_token_closes_only_a_scope_of_its_own_context() {
    let a = ExecContext::with_threads(1);
    let b = ExecContext::with_threads(1);
    let sa = a.open_exec_scope();
    adopt_one(&a);
    let sb = b.open_exec_scope();
    adopt_one(&b);
    let r = catch_unwind(AssertUnwindSafe(|| b.close_exec_scope(sa)));
    let msg = r.expect_err("a foreign token must be refused");
    let msg = msg.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(msg.contains("another ExecContext"), "panic message: {msg}");
    // `b` is untouched; `a`'s scope was closed by its token while unwinding.
    assert!(sb.is_open());
    assert_eq!(b.exec_scope_len(), 1);
    assert!(!a.exec_scope_active());
    assert_eq!(a.outstanding_buffers(), 0);
    b.close_exec_scope(sb);
    assert_eq!(b.outstanding_buffers(), 0);
}

// ---- item 6: dropping a context before its tensors ----

#[test]
fn dropping_a_context_before_its_tensors_is_silent() {
    if is_child() {
        let ctx = ExecContext::with_threads(2);
        let x = ctx.ones(&[1000]).unwrap();
        let y = ctx.matmul(&ctx.ones(&[64, 64]).unwrap(), &ctx.ones(&[64, 64]).unwrap());
        drop(ctx);
        assert_eq!(x.to_vec(), [1.0; 1000]);
        assert_eq!(y.unwrap().to_vec()[0], 64.0);
        eprintln!("child done");
        return;
    }
    let stderr = run_in_child("dropping_a_context_before_its_tensors_is_silent");
    let stderr: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("running ") && *l != "child done")
        .collect();
    assert!(stderr.is_empty(), "the drop printed: {stderr:?}");
}

// ---- item 7: views bounded by the tensor's extent ----

#[test]
fn a_strided_view_cannot_reach_past_the_tensor_into_stale_pool_data() {
    let ctx = ExecContext::with_threads(1);
    drop(ctx.full(&[8], 42.0).unwrap());
    let t = ctx.from_slice(&[6], &[0., 1., 2., 3., 4., 5.]).unwrap();
    assert!(t.buffer().len() > 6, "the pooled block is rounded up");
    assert_eq!(t.storage_extent(), 6);
    assert!(matches!(
        t.view_with_strides(&[2], &[1], 6),
        Err(ExecError::InvalidDataLength {
            op: "view_with_strides",
            expected: 8,
            got: 6,
            ..
        })
    ));
    assert!(t.view_with_strides(&[1], &[1], 6).is_err());
    assert_eq!(
        t.view_with_strides(&[2], &[1], 4).unwrap().to_vec(),
        [4., 5.]
    );
    // Views of views share the extent of the storage's tensor.
    let n = t.narrow(0, 1, 2).unwrap();
    assert_eq!(n.storage_extent(), 6);
    assert_eq!(
        n.view_with_strides(&[3], &[2], 1).unwrap().to_vec(),
        [1., 3., 5.]
    );
    assert!(n.view_with_strides(&[4], &[2], 1).is_err());
    // A copy-on-write write gives the view its own extent.
    let mut w = t.view_with_strides(&[3], &[2], 0).unwrap();
    w.data_mut().unwrap()[0] = -1.0;
    assert_eq!(w.storage_extent(), 3);
    assert!(w.view_with_strides(&[1], &[1], 3).is_err());
    // A wrapped buffer longer than the shape: the tensor's elements only.
    let buf = fucina_exec::storage::Buffer::from_vec(vec![1.0f32; 10]);
    let r = RawTensor::from_buffer(buf, &[4]).unwrap();
    assert_eq!(r.storage_extent(), 4);
    assert!(r.view_with_strides(&[1], &[1], 4).is_err());
}

// ---- sizes from the caller in conv and pool geometry ----

/// The message of an `Err`, asserting that it is one (a panic fails the test
/// by itself: these ran into "attempt to multiply with overflow" in debug
/// builds and wrapped in release ones).
fn err_text<T: std::fmt::Debug>(r: Result<T, ExecError>) -> String {
    r.expect_err("an impossible size must be an Err")
        .to_string()
}

fn assert_mentions(msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(msg.contains(n), "`{msg}` should mention `{n}`");
    }
}

const BIG: usize = 1 << 40;

#[test]
fn conv_sizes_that_overflow_are_errors_not_panics() {
    let ctx = ExecContext::with_threads(2);
    let one = |shape: &[usize]| ctx.ones(shape).unwrap();
    let o2 = |stride, padding, dilation| Conv2dOptions {
        stride,
        padding,
        dilation,
        groups: 1,
    };
    let (x, w) = (one(&[1, 1, 1, 1]), one(&[1, 1, 1, 1]));
    // The report: an output of 2^41 x 2^41 positions.
    let e = err_text(ctx.conv2d(&x, &w, None, o2([1, 1], [BIG, BIG], [1, 1])));
    assert_mentions(&e, &["conv2d", "overflows usize", "2199023255553"]);
    // Stride 1 with a dilated kernel: a 1x1 output, but the GEMM paths would
    // run over zero-padded planes of 2 x (2^32 + 1)^2 floats.
    let dilated = o2([1, 1], [1 << 31, 1 << 31], [1 << 32, 1 << 32]);
    let (x2, w2) = (one(&[1, 2, 1, 1]), one(&[1, 2, 2, 2]));
    let planes = "[2, 4294967298, 4294967297]";
    let e = err_text(ctx.conv2d(&x2, &w2, None, dilated));
    assert_mentions(&e, &["conv2d", "overflows usize", planes]);
    let e = err_text(ctx.conv2d_input_grad(&[1, 2, 1, 1], &w2, &w, dilated));
    assert_mentions(&e, &["conv2d_input_grad", "overflows usize", planes]);
    let e = err_text(ctx.conv2d_weight_grad(&x2, &[1, 2, 2, 2], &w, dilated));
    assert_mentions(&e, &["conv2d_weight_grad", "overflows usize", planes]);
    // The direct depthwise kernels read the image itself: that one computes
    // (every tap but the first lies in the padding, and that one reads x).
    let y = ctx.conv2d(&x, &one(&[1, 1, 2, 2]), None, dilated).unwrap();
    assert_eq!(y.shape(), [1, 1, 1, 1]);
    drop(y);
    // A padded size past isize::MAX (the kernels' signed offsets).
    let e = err_text(ctx.conv1d(
        &one(&[1, 1, 1]),
        &one(&[1, 1, 1]),
        None,
        Conv1dOptions {
            padding: 1 << 62,
            ..Default::default()
        },
    ));
    assert_mentions(&e, &["conv1d", "padding", "overflows"]);
    let e = err_text(ctx.conv1d(
        &one(&[4, 1, 1]),
        &one(&[1, 1, 1]),
        None,
        Conv1dOptions {
            padding: 1 << 61,
            ..Default::default()
        },
    ));
    assert_mentions(
        &e,
        &["conv1d", "[4, 1, 4611686018427387905]", "overflows usize"],
    );
    // Huge options that give a small output still compute: a 3x3 output whose
    // centre reads the one input element.
    let y = ctx
        .conv2d(&x, &w, None, o2([BIG, BIG], [BIG, BIG], [1, 1]))
        .unwrap();
    assert_eq!(y.shape(), [1, 1, 3, 3]);
    assert_eq!(y.to_vec(), [0., 0., 0., 0., 1., 0., 0., 0., 0.]);
    assert_eq!(ctx.outstanding_buffers(), 5, "x, w, x2, w2 and y only");
}

#[test]
fn conv_backward_shapes_from_the_caller_are_checked() {
    let ctx = ExecContext::with_threads(2);
    let one = |shape: &[usize]| ctx.ones(shape).unwrap();
    let strided = |s: usize, p: usize| Conv2dOptions {
        stride: [s, s],
        padding: [p, p],
        ..Default::default()
    };
    let (x, w, dy) = (one(&[1, 1, 1, 1]), one(&[1, 1, 1, 1]), one(&[1, 1, 1, 1]));
    // An input of 2^80 elements whose (strided) output is one element.
    let e = err_text(ctx.conv2d_input_grad(&[1, 1, BIG, BIG], &w, &dy, strided(BIG, 0)));
    assert_mentions(
        &e,
        &[
            "conv2d_input_grad",
            "[1, 1, 1099511627776, 1099511627776]",
            "overflows usize",
        ],
    );
    // 2^62 elements: a count that fits, memory that does not.
    let huge = 1 << 31;
    assert!(matches!(
        ctx.conv2d_input_grad(&[1, 1, huge, huge], &w, &dy, strided(huge, 0)),
        Err(ExecError::OutOfMemory {
            op: "conv2d_input_grad",
            ..
        })
    ));
    // A zero in the weight's shape (it used to underflow at `kernel - 1`).
    for w_shape in [[1, 1, 0, 1], [1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 1, 1]] {
        let e = err_text(ctx.conv2d_weight_grad(&x, &w_shape, &dy, Conv2dOptions::default()));
        assert_mentions(&e, &["conv2d_weight_grad", "a dimension is zero"]);
    }
    let e = err_text(ctx.conv1d_weight_grad(
        &one(&[1, 1, 1]),
        &[1, 1, 0],
        &one(&[1, 1, 1]),
        Conv1dOptions::default(),
    ));
    assert_mentions(&e, &["conv1d_weight_grad", "a dimension is zero"]);
    let e = err_text(ctx.conv2d_input_grad(&[1, 0, 1, 1], &w, &dy, Conv2dOptions::default()));
    assert_mentions(&e, &["conv2d_input_grad", "a dimension is zero"]);
    // A weight of 2^63 taps over a padded input: its column-matrix scratch
    // (`K x 32` floats) overflows.
    let x2 = one(&[1, 2, 1, 1]);
    let e = err_text(ctx.conv2d_weight_grad(&x2, &[1, 2, huge, huge], &dy, strided(1 << 32, huge)));
    assert_mentions(
        &e,
        &[
            "conv2d_weight_grad",
            "[9223372036854775808, 32]",
            "overflows usize",
        ],
    );
    assert_eq!(ctx.outstanding_buffers(), 4, "nothing left behind");
}

#[test]
fn pool_sizes_that_overflow_are_errors_not_panics() {
    let ctx = ExecContext::with_threads(2);
    let x = ctx.from_slice(&[1, 1, 2, 2], &[1., 2., 3., 4.]).unwrap();
    // The report: an adaptive output of 2^80 cells.
    let e = err_text(ctx.adaptive_avg_pool2d(&x, [BIG, BIG]));
    assert_mentions(
        &e,
        &[
            "adaptive_avg_pool2d",
            "[1, 1, 1099511627776, 1099511627776]",
            "overflows usize",
        ],
    );
    let (g, b) = (ctx.ones(&[1]).unwrap(), ctx.zeros(&[1]).unwrap());
    let e = err_text(ctx.batch_norm_pool2d(&x, &g, &b, 1e-5, Pool2dOp::AdaptiveAvg([BIG, BIG])));
    assert_mentions(&e, &["adaptive_avg_pool2d", "overflows usize"]);
    // The adaptive windows' bounds `i * H` past usize (an output that could
    // not be allocated anyway, but the check does not rely on that).
    let e = err_text(ctx.adaptive_avg_pool2d(&x, [usize::MAX / 2 + 1, 1]));
    assert_mentions(
        &e,
        &[
            "adaptive_avg_pool2d",
            "output size times its input size overflows",
        ],
    );
    // A backward for an input shape of 2^80 elements whose strided output is
    // one element, and one with a zero dimension.
    let dy = ctx.ones(&[1, 1, 1, 1]).unwrap();
    let strided = Pool2dOp::Avg(Pool2dOptions {
        kernel: [2, 2],
        stride: [BIG, BIG],
        padding: [0, 0],
    });
    let e = err_text(ctx.pool2d_backward(strided, &[1, 1, BIG, BIG], None, &dy));
    assert_mentions(&e, &["avg_pool2d", "overflows usize"]);
    let e = err_text(ctx.pool2d_backward(Pool2dOp::AdaptiveAvg([1, 1]), &[1, 0, 2, 2], None, &dy));
    assert_mentions(&e, &["adaptive_avg_pool2d", "a dimension is zero"]);
    // A window of 2^80 elements: the average's divisor overflows, the max pool
    // (which needs no area) still computes over the clipped window.
    let wide = Pool2dOptions {
        kernel: [BIG, BIG],
        stride: [BIG, BIG],
        padding: [BIG / 2, BIG / 2],
    };
    let one = ctx.full(&[1, 1, 1, 1], 5.0).unwrap();
    let e = err_text(ctx.avg_pool2d(&one, wide));
    assert_mentions(&e, &["avg_pool2d", "overflows usize"]);
    assert_eq!(ctx.max_pool2d(&one, wide).unwrap().to_vec(), [5.0]);
    let gx = ctx
        .pool2d_backward(Pool2dOp::Max(wide), &[1, 1, 1, 1], Some(&one), &dy)
        .unwrap();
    assert_eq!(gx.to_vec(), [1.0]);
}

// ---- error texts ----

#[test]
fn narrow_past_the_end_names_the_axis_size() {
    let ctx = ExecContext::with_threads(1);
    let x = ctx.zeros(&[3, 4]).unwrap();
    let e = x.narrow(1, 2, 3).unwrap_err();
    assert_eq!(
        e,
        ExecError::IndexOutOfBounds {
            op: "narrow",
            index: 4,
            bound: 4
        }
    );
    assert_eq!(e.to_string(), "narrow: index 4 is out of bounds for size 4");
    let e = x.narrow(0, 5, 1).unwrap_err();
    assert_eq!(e.to_string(), "narrow: index 5 is out of bounds for size 3");
    let e = x.narrow(0, 1, usize::MAX).unwrap_err();
    assert!(e.to_string().ends_with("out of bounds for size 3"), "{e}");
}

#[test]
fn a_rank_9_shape_prints_its_rank() {
    let ctx = ExecContext::with_threads(1);
    let e = ctx.zeros(&[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "full: invalid shape [1, 2, 3, 4, 5, 6, 7, 8, … (rank 9)]: rank above 8"
    );
    let e = ctx.zeros(&[1; 300]).unwrap_err();
    assert!(e.to_string().contains("(rank 255 or more)"), "{e}");
    // Shapes of rank 8 and below print as before.
    let d = fucina_exec::Dims::new(&[2, 3]);
    assert_eq!(
        (d.to_string(), d.len(), d.given_len()),
        ("[2, 3]".into(), 2, 2)
    );
}
