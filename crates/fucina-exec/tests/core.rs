//! The context, constructors, views, layouts, scopes and teardown.

mod support;

use fucina_exec::{ExecContext, ExecError, LayoutClass, RawTensor, ScopeNode};
use std::sync::Arc;

#[test]
fn constructors_and_their_errors() {
    let ctx = ExecContext::new();
    assert_eq!(ctx.outstanding_buffers(), 0);
    let z = ctx.zeros(&[2, 3]).unwrap();
    assert_eq!(z.to_vec(), [0.0; 6]);
    assert_eq!(ctx.ones(&[2]).unwrap().to_vec(), [1.0, 1.0]);
    assert_eq!(ctx.full(&[3], 7.5).unwrap().to_vec(), [7.5; 3]);
    assert_eq!(ctx.scalar(4.0).unwrap().item().unwrap(), 4.0);
    assert_eq!(ctx.empty(&[5]).unwrap().shape(), [5]);
    let i = ctx.from_slice_typed::<i64>(&[3], &[0, 2, 1]).unwrap();
    assert_eq!(i.to_vec(), [0, 2, 1]);
    assert_eq!(
        ctx.ones_typed::<fucina_exec::storage::half::bf16>(&[1])
            .unwrap()
            .to_vec()[0]
            .to_bits(),
        0x3F80
    );
    assert_eq!(ctx.ones_typed::<bool>(&[2]).unwrap().to_vec(), [true, true]);
    assert_eq!(ctx.zeros_typed::<i32>(&[2]).unwrap().to_vec(), [0, 0]);

    assert!(matches!(
        ctx.zeros(&[]),
        Err(ExecError::InvalidShape { .. })
    ));
    assert!(matches!(
        ctx.zeros(&[1; 9]),
        Err(ExecError::InvalidShape { .. })
    ));
    assert!(matches!(
        ctx.zeros(&[3, 0]),
        Err(ExecError::InvalidShape { .. })
    ));
    assert!(matches!(
        ctx.zeros(&[usize::MAX, 3]),
        Err(ExecError::Overflow { .. })
    ));
    let before = fucina_exec::storage::allocation_stats().allocations;
    let e = ctx.from_slice(&[2, 2], &[1.0; 3]).unwrap_err();
    assert!(matches!(
        e,
        ExecError::InvalidDataLength {
            expected: 4,
            got: 3,
            ..
        }
    ));
    assert!(e.to_string().contains("from_slice"), "{e}");
    // checked before allocating
    assert_eq!(fucina_exec::storage::allocation_stats().allocations, before);
    // a huge shape that does not overflow fails in the pool, as an Err
    assert!(matches!(
        ctx.zeros(&[1 << 40, 1 << 20]),
        Err(ExecError::OutOfMemory { .. })
    ));
    drop((z, i));
    assert_eq!(ctx.outstanding_buffers(), 0);
}

#[test]
fn zero_copy_wraps_never_enter_the_pool() {
    let ctx = ExecContext::new();
    let v = ctx.from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    assert!(!v.buffer().is_pooled());
    let shared: Arc<[f32]> = Arc::from(vec![5.0f32, 6.0]);
    let s = ctx.from_shared(&[2], shared.clone()).unwrap();
    assert_eq!(s.to_vec(), [5.0, 6.0]);
    assert!(!s.is_unique()); // the caller still holds the Arc: read-only
    assert_eq!(ctx.outstanding_buffers(), 0);
    assert!(matches!(
        ctx.from_vec(&[3], vec![1.0f32]),
        Err(ExecError::InvalidDataLength { .. })
    ));
    // copy-on-write on a read-only wrap: the caller's Arc is untouched
    let mut s2 = s.clone();
    s2.data_mut().unwrap()[0] = 9.0;
    assert_eq!(s2.to_vec(), [9.0, 6.0]);
    assert_eq!(&shared[..], [5.0, 6.0]);
    assert_eq!(s.to_vec(), [5.0, 6.0]);
}

#[test]
fn views_share_storage_and_outlive_their_source() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.]).unwrap();
    let r = x.reshape(&[3, 2]).unwrap();
    assert!(r.same_storage(&x));
    assert_eq!(r.to_vec(), [1., 2., 3., 4., 5., 6.]);
    let t = x.transpose(0, 1).unwrap();
    assert_eq!(t.to_vec(), [1., 4., 2., 5., 3., 6.]);
    assert!(matches!(
        t.reshape(&[6]),
        Err(ExecError::UnsupportedView { .. })
    ));
    assert!(matches!(t.data(), Err(ExecError::UnsupportedView { .. })));
    assert!(matches!(
        x.reshape(&[4]),
        Err(ExecError::InvalidShape { .. })
    ));
    let n = x.narrow(1, 1, 2).unwrap();
    assert_eq!(n.to_vec(), [2., 3., 5., 6.]);
    assert!(matches!(
        x.narrow(1, 2, 2),
        Err(ExecError::IndexOutOfBounds { .. })
    ));
    assert!(matches!(
        x.narrow(2, 0, 1),
        Err(ExecError::InvalidAxis { .. })
    ));
    assert!(matches!(
        x.narrow(0, 0, 0),
        Err(ExecError::InvalidShape { .. })
    ));
    let p = x.unsqueeze(0).unwrap().permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), [3, 1, 2]);
    assert_eq!(p.to_vec(), [1., 4., 2., 5., 3., 6.]);
    assert!(matches!(
        x.permute(&[0, 0]),
        Err(ExecError::InvalidShape { .. })
    ));
    let u = x.unsqueeze(2).unwrap();
    assert_eq!(u.shape(), [2, 3, 1]);
    assert!(u.is_contiguous());
    assert_eq!(u.squeeze(2).unwrap().shape(), [2, 3]);
    assert!(matches!(x.squeeze(0), Err(ExecError::InvalidShape { .. })));
    let b = ctx.broadcast_to(&x.narrow(0, 0, 1).unwrap(), &[4, 2, 4]);
    assert!(matches!(b, Err(ExecError::ShapeMismatch { .. })));
    let row = ctx.from_slice(&[3], &[1., 2., 3.]).unwrap();
    let b = ctx.broadcast_to(&row, &[2, 3]).unwrap();
    assert_eq!(b.strides(), [0, 1]);
    assert_eq!(ctx.classify(&b), LayoutClass::TailBroadcast);
    assert_eq!(b.to_vec(), [1., 2., 3., 1., 2., 3.]);
    let s = x.view_with_strides(&[3], &[2], 0).unwrap();
    assert_eq!(s.to_vec(), [1., 3., 5.]);
    assert!(matches!(
        x.view_with_strides(&[5], &[2], 0),
        Err(ExecError::InvalidDataLength { .. })
    ));
    assert!(matches!(
        x.view_with_strides(&[2], &[1, 1], 0),
        Err(ExecError::InvalidShape { .. })
    ));
    // views keep the storage alive after the source is gone
    let addr = x.buffer().as_ptr();
    drop(x);
    assert_eq!(t.to_vec(), [1., 4., 2., 5., 3., 6.]);
    assert_eq!(t.buffer().as_ptr(), addr);
    assert_eq!(ctx.outstanding_buffers(), 2);
}

#[test]
fn classify_follows_the_documented_precedence() {
    let ctx = ExecContext::new();
    let x = ctx.zeros(&[2, 3]).unwrap();
    assert_eq!(ctx.classify(&x), LayoutClass::Contiguous);
    assert_eq!(
        ctx.classify(&x.transpose(0, 1).unwrap()),
        LayoutClass::Arbitrary
    );
    let one = ctx.scalar(1.0).unwrap();
    assert_eq!(ctx.classify(&one), LayoutClass::Scalar);
    assert_eq!(
        ctx.classify(&ctx.broadcast_to(&one, &[2, 3]).unwrap()),
        LayoutClass::TailBroadcast
    );
    let mid = ctx.zeros(&[2, 1, 3]).unwrap();
    assert_eq!(
        ctx.classify(&ctx.broadcast_to(&mid, &[2, 4, 3]).unwrap()),
        LayoutClass::Arbitrary
    );
}

#[test]
fn copy_on_write_keeps_other_handles_intact() {
    let ctx = ExecContext::new();
    let mut a = ctx.from_slice(&[3], &[1., 2., 3.]).unwrap();
    let addr = a.buffer().as_ptr();
    a.data_mut().unwrap()[0] = 10.0; // unique: in place
    assert_eq!(a.buffer().as_ptr(), addr);
    let b = a.clone();
    a.data_mut().unwrap()[1] = 20.0; // shared: copied first
    assert_ne!(a.buffer().as_ptr(), addr);
    assert_eq!(a.to_vec(), [10., 20., 3.]);
    assert_eq!(b.to_vec(), [10., 2., 3.]);
    // a strided view is materialized on write
    let m = ctx.from_slice(&[2, 2], &[1., 2., 3., 4.]).unwrap();
    let mut t = m.transpose(0, 1).unwrap();
    t.data_mut().unwrap()[1] = 0.0;
    assert_eq!(t.to_vec(), [1., 0., 2., 4.]);
    assert_eq!(m.to_vec(), [1., 2., 3., 4.]);
}

#[test]
fn pool_reuses_the_same_address() {
    let ctx = ExecContext::new();
    let a = ctx.from_slice(&[3], &[1., 2., 3.]).unwrap();
    let first = ctx.add(&a, &a).unwrap();
    let p = first.data().unwrap().as_ptr();
    drop(first);
    let second = ctx.add(&a, &a).unwrap();
    assert_eq!(second.data().unwrap().as_ptr(), p);
    assert_eq!(second.to_vec(), [2., 4., 6.]);
}

#[test]
fn replace_idiom_keeps_the_old_value_on_error() {
    let ctx = ExecContext::new();
    let mut x = ctx.from_slice(&[2], &[1., 2.]).unwrap();
    for _ in 0..3 {
        x = ctx.scale(&x, 2.0).unwrap();
    }
    assert_eq!(x.to_vec(), [8., 16.]);
    let bad = ctx.zeros(&[3]).unwrap();
    let r = ctx.add(&x, &bad).map(|v| {
        x = v;
    });
    assert!(r.is_err());
    assert_eq!(x.to_vec(), [8., 16.]);
}

#[test]
fn typed_casts() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[4], &[-1.5, 0.0, 2.7, 1e10]).unwrap();
    assert_eq!(
        ctx.cast_from_f32::<i64>(&x).unwrap().to_vec(),
        [-1, 0, 2, 10_000_000_000]
    );
    assert_eq!(
        ctx.cast_from_f32::<u8>(&x).unwrap().to_vec(),
        [0, 0, 2, 255]
    );
    assert_eq!(
        ctx.cast_from_f32::<bool>(&x).unwrap().to_vec(),
        [true, false, true, true]
    );
    let h = ctx
        .cast_from_f32::<fucina_exec::storage::half::f16>(&x)
        .unwrap();
    assert_eq!(
        ctx.cast_to_f32(&h).unwrap().to_vec()[..3],
        [-1.5, 0.0, 2.6992188]
    );
    let i = ctx.from_slice_typed::<i32>(&[2], &[7, -3]).unwrap();
    assert_eq!(ctx.cast_to_f32(&i).unwrap().to_vec(), [7.0, -3.0]);
    // casting a view
    let t = ctx
        .from_slice(&[2, 2], &[1., 2., 3., 4.])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    assert_eq!(ctx.cast_from_f32::<i64>(&t).unwrap().to_vec(), [1, 3, 2, 4]);
}

#[test]
fn scopes_hold_values_until_close_newest_first() {
    struct Node(Arc<std::sync::Mutex<Vec<u32>>>, u32);
    impl Drop for Node {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(self.1);
        }
    }
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ctx = ExecContext::new();
    let x = ctx.ones(&[4]).unwrap();
    assert!(!ctx.exec_scope_active());
    let outer = ctx.open_exec_scope();
    assert!(ctx.exec_scope_active());
    let base = ctx.outstanding_buffers();
    for i in 0..3 {
        let y = ctx.add(&x, &x).unwrap();
        ctx.reserve_scope_slot().unwrap();
        let node = ScopeNode::new(Arc::new(Node(log.clone(), i)));
        ctx.adopt_scope_value_assume_capacity(y, Some(node));
    }
    assert_eq!(ctx.outstanding_buffers(), base + 3);
    let inner = ctx.open_exec_scope();
    ctx.reserve_scope_slot().unwrap();
    ctx.adopt_scope_node_assume_capacity(ScopeNode::new(Arc::new(Node(log.clone(), 10))));
    ctx.reserve_scope_slot().unwrap();
    ctx.adopt_scope_value_assume_capacity(ctx.add(&x, &x).unwrap(), None);
    assert_eq!(ctx.outstanding_buffers(), base + 4);
    ctx.close_exec_scope(inner); // releases only its suffix
    assert_eq!(*log.lock().unwrap(), [10]);
    assert_eq!(ctx.outstanding_buffers(), base + 3);
    ctx.close_exec_scope(outer);
    assert_eq!(*log.lock().unwrap(), [10, 2, 1, 0]);
    assert_eq!(ctx.outstanding_buffers(), base);
    assert!(!ctx.exec_scope_active());
    // the RAII form
    let n = ctx.exec_scope(|ctx| {
        ctx.reserve_scope_slot().unwrap();
        ctx.adopt_scope_value_assume_capacity(ctx.add(&x, &x).unwrap(), None);
        ctx.outstanding_buffers()
    });
    assert_eq!(n, base + 1);
    assert_eq!(ctx.outstanding_buffers(), base);
}

#[test]
fn closing_an_outer_scope_closes_the_inner_ones_first() {
    let ctx = ExecContext::new();
    let outer = ctx.open_exec_scope();
    let inner = ctx.open_exec_scope();
    ctx.close_exec_scope(outer);
    assert!(!inner.is_open());
    assert!(!ctx.exec_scope_active());
    ctx.close_exec_scope(inner); // already closed: nothing happens
    assert!(!ctx.exec_scope_active());
}

#[test]
#[should_panic(expected = "no reserved slot")]
fn adopting_without_a_reserved_slot_panics() {
    let ctx = ExecContext::new();
    let _s = ctx.open_exec_scope();
    let x = ctx.ones(&[1]).unwrap();
    // fill the reserved capacity, then adopt once more without reserving
    ctx.reserve_scope_slot().unwrap();
    for _ in 0..64 {
        ctx.adopt_scope_value_assume_capacity(x.clone(), None);
    }
}

#[test]
fn open_scopes_are_released_at_teardown() {
    let ctx = ExecContext::new();
    let s = ctx.open_exec_scope();
    ctx.reserve_scope_slot().unwrap();
    ctx.adopt_scope_value_assume_capacity(ctx.ones(&[8]).unwrap(), None);
    std::mem::forget(s); // never closed nor dropped: the teardown releases it
    assert_eq!(ctx.outstanding_buffers(), 1);
    assert_eq!(ctx.close(), Ok(()));
}

#[test]
fn close_reports_leaked_buffers() {
    let ctx = ExecContext::new();
    let x = ctx.ones(&[8]).unwrap();
    let y = ctx.ones(&[8]).unwrap();
    assert_eq!(ctx.close(), Err(ExecError::LeakedBuffers { count: 2 }));
    // the leaked tensors stay valid: they keep their pool alive
    assert_eq!(x.to_vec(), [1.0; 8]);
    drop((x, y));
}

#[test]
fn dropping_a_context_with_live_buffers_is_safe_and_they_stay_valid() {
    let ctx = ExecContext::new();
    let x = ctx.ones(&[8]).unwrap();
    let s = ctx.open_exec_scope();
    ctx.reserve_scope_slot().unwrap();
    ctx.adopt_scope_value_assume_capacity(x.clone(), None);
    std::mem::forget(s); // an open scope holding `x` too
    drop(ctx);
    assert_eq!(x.to_vec(), [1.0; 8]);
    let mut y = x.clone();
    y.data_mut().unwrap()[0] = 2.0;
    assert_eq!((x.to_vec()[0], y.to_vec()[0]), (1.0, 2.0));
    // The last handle may go on another thread.
    std::thread::spawn(move || drop(x)).join().unwrap();
    drop(y);
}

#[test]
fn float_environment_changes_are_detected() {
    use fucina_exec::fpenv::{self, Environment, RoundingMode};
    let ctx = ExecContext::new();
    assert!(ctx.float_environment_at_init().is_some());
    assert_eq!(ctx.check_float_environment(), Ok(()));
    let mut guard = fpenv::Guard::begin();
    let changed = Environment {
        rounding: RoundingMode::TowardZero,
        ..ctx.float_environment_at_init().unwrap()
    };
    // SAFETY: no float computation whose result matters runs before the guard
    // restores the default: `check_float_environment` only compares control bits.
    unsafe { fpenv::set(changed) };
    let r = ctx.check_float_environment();
    guard.restore();
    assert!(
        matches!(r, Err(ExecError::FloatEnvironmentChanged { now, .. }) if now.rounding == RoundingMode::TowardZero),
        "{r:?}"
    );
    assert_eq!(ctx.check_float_environment(), Ok(()));
}

#[test]
fn small_ops_never_start_the_team() {
    let ctx = ExecContext::with_threads(2);
    let x = ctx.ones(&[64, 64]).unwrap();
    let _y = ctx.add(&x, &x).unwrap();
    assert!(ctx.team().is_none_or(|t| !t.is_started()));
    let big = ctx.ones(&[512, 512]).unwrap();
    let _z = ctx.add(&big, &big).unwrap();
    assert!(ctx.team().unwrap().is_started());
}

#[test]
fn tensors_cross_threads() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[3], &[1., 2., 3.]).unwrap();
    let v = std::thread::scope(|s| s.spawn(|| x.to_vec()).join().unwrap());
    assert_eq!(v, [1., 2., 3.]);
    // and a context can move to another thread
    let ctx2 = ExecContext::new();
    let out: Vec<f32> = std::thread::spawn(move || {
        let y: RawTensor = ctx2.full(&[2], 3.0).unwrap();
        y.to_vec()
    })
    .join()
    .unwrap();
    assert_eq!(out, [3.0, 3.0]);
}
