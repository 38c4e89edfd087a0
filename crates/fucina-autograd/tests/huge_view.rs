//! A zero-copy view far larger than memory is read back with an error, not an
//! abort: `Tensor::try_to_vec` takes its memory fallibly.

use fucina_autograd::exec::{ExecContext, ExecError};
use fucina_autograd::{AutogradError, Tensor};

#[test]
fn try_to_vec_of_a_huge_broadcast_is_an_out_of_memory_error() {
    let ctx = ExecContext::with_threads(1);
    let one = Tensor::ones(&ctx, &[1]).unwrap();
    // 2^46 elements, 2^48 bytes: more than a 47-bit address space can hold.
    let b = one.broadcast_to(&ctx, &[1 << 20, 1 << 26]).unwrap();
    match b.try_to_vec() {
        Err(AutogradError::Exec(e))
            if matches!(*e, ExecError::OutOfMemory { op: "to_vec", .. }) => {}
        other => panic!("expected an out-of-memory error, got {other:?}"),
    }
    assert!(matches!(
        b.materialize(&ctx).unwrap_err().as_exec(),
        Some(ExecError::OutOfMemory { .. })
    ));
    // A small view reads back as `to_vec` does.
    let s = one.broadcast_to(&ctx, &[3]).unwrap();
    assert_eq!(s.try_to_vec().unwrap(), s.to_vec());
    assert_eq!(s.try_to_vec().unwrap(), [1.0; 3]);
}
