//! What a careless or hostile caller could once turn into an abort, a broken
//! context or stale data: huge zero-copy views, panics and early returns inside
//! exec scopes, foreign and stale scope tokens, views past a tensor's extent, and
//! the texts of two errors. Cases that used to abort the process run in a child
//! process with a timeout.
#![allow(clippy::result_large_err)] // `ExecError` carries inline shapes

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fucina_exec::{ExecContext, ExecError, RawTensor};

/// Set in the child processes this file starts.
const CHILD: &str = "FUCINA_EXEC_HARDENING_CHILD";

/// Runs the test `name` of this binary alone in a child process and asserts that
/// it exits successfully within a minute (an abort or a hang fails the caller).
/// Returns what it wrote to stderr.
fn run_in_child(name: &str) -> String {
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child test process");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name}: the child process hung (killed after 60 s)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    assert!(
        status.success(),
        "{name}: the child process failed ({status}):\n{stderr}"
    );
    stderr
}

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

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
