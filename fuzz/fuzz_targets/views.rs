//! Arbitrary chains of views (`reshape`, `broadcast_to`, `narrow`, `permute`,
//! `transpose`, `squeeze`, `unsqueeze`, `view_with_strides`) over a small tensor,
//! then every element read back: each op returns `Ok` or `Err`, never panics,
//! and a view that was accepted reads exactly the storage elements its layout
//! names (checked against an independent index computation).
#![no_main]

use fucina_exec::{ExecContext, RawTensor};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

thread_local! {
    static CTX: ExecContext = ExecContext::new();
}

/// The most elements a view is read back (or copied) with.
const MAX_READ: usize = 1 << 16;

/// A dimension or stride: mostly small, sometimes near `usize::MAX` or anything
/// (the overflow checks).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Size {
    Small(u8),
    NearMax(u8),
    Any(usize),
}

impl Size {
    fn get(self) -> usize {
        match self {
            Size::Small(v) => usize::from(v % 9),
            Size::NearMax(v) => usize::MAX - usize::from(v),
            Size::Any(v) => v,
        }
    }
}

fn sizes(v: &[Size]) -> Vec<usize> {
    v.iter().map(|s| s.get()).collect()
}

#[derive(Arbitrary, Debug)]
enum Op {
    Reshape(Vec<Size>),
    BroadcastTo(Vec<Size>),
    Narrow {
        axis: Size,
        start: Size,
        len: Size,
    },
    Permute(Vec<Size>),
    Transpose(Size, Size),
    Squeeze(Size),
    Unsqueeze(Size),
    /// `(dimension, stride)` pairs: the rank always agrees.
    ViewWithStrides {
        axes: Vec<(Size, Size)>,
        offset: Size,
    },
    /// Separate lists: the rank may disagree.
    ViewWithStridesRaw {
        shape: Vec<Size>,
        strides: Vec<Size>,
        offset: Size,
    },
    Materialize,
}

#[derive(Arbitrary, Debug)]
struct Input {
    shape: Vec<Size>,
    /// A strided view taken first (most crashes need one, so it is not left to
    /// the op list to find).
    strided: Option<([(Size, Size); 3], u8, Size)>,
    ops: Vec<Op>,
}

/// Reads every element of `t` three ways and checks them against the storage.
fn check(ctx: &ExecContext, t: &RawTensor) {
    let numel = t.numel();
    assert_eq!(numel, t.shape().iter().product::<usize>());
    if numel > MAX_READ {
        return; // a legal but huge broadcast: not worth reading
    }
    let storage: &[f32] = t.buffer();
    // The independent oracle: offset + sum(index * stride), checked.
    let mut expected = Vec::with_capacity(numel);
    let mut idx = vec![0usize; t.rank()];
    for _ in 0..numel {
        let at = idx
            .iter()
            .zip(t.strides())
            .try_fold(t.offset(), |acc, (&i, &s)| {
                i.checked_mul(s).and_then(|x| acc.checked_add(x))
            })
            .expect("an accepted view's indices do not overflow");
        // A view reaches only the elements of the tensor its storage was made
        // for, never the rest of a pooled block (values of earlier tensors).
        assert!(at < t.storage_extent(), "{t:?} reaches element {at}");
        expected.push(storage[at].to_bits());
        for ax in (0..idx.len()).rev() {
            idx[ax] += 1;
            if idx[ax] < t.shape()[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    let got: Vec<u32> = t.to_vec().iter().map(|v| v.to_bits()).collect();
    assert_eq!(got, expected, "to_vec of {t:?}");
    let m = ctx.materialize(t).expect("materialize a small view");
    assert!(m.is_contiguous());
    assert_eq!(m.shape(), t.shape());
    let mb: Vec<u32> = m.data().unwrap().iter().map(|v| v.to_bits()).collect();
    assert_eq!(mb, expected, "materialize of {t:?}");
    if t.is_contiguous() {
        let db: Vec<u32> = t.data().unwrap().iter().map(|v| v.to_bits()).collect();
        assert_eq!(db, expected, "data of {t:?}");
    } else {
        assert!(t.data().is_err());
    }
}

fuzz_target!(|input: Input| {
    CTX.with(|ctx| {
        let shape = sizes(&input.shape);
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        // The base tensor: element i holds i (at most 4096 elements).
        let mut t = match n {
            Some(n) if n <= 4096 => {
                let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
                match ctx.from_slice(&shape, &values) {
                    Ok(t) => t,
                    Err(_) => return,
                }
            }
            _ => {
                assert!(ctx.from_slice(&shape, &[]).is_err());
                return;
            }
        };
        check(ctx, &t);
        if let Some((axes, rank, offset)) = &input.strided {
            let rank = usize::from(rank % 3) + 1;
            let shape: Vec<usize> = axes[..rank].iter().map(|(d, _)| d.get()).collect();
            let strides: Vec<usize> = axes[..rank].iter().map(|(_, s)| s.get()).collect();
            if let Ok(v) = t.view_with_strides(&shape, &strides, offset.get()) {
                check(ctx, &v);
                t = v;
            }
        }
        for op in input.ops.iter().take(16) {
            let next = match op {
                Op::Reshape(s) => t.reshape(&sizes(s)),
                Op::BroadcastTo(s) => t.broadcast_to(&sizes(s)),
                Op::Narrow { axis, start, len } => t.narrow(axis.get(), start.get(), len.get()),
                Op::Permute(o) => t.permute(&sizes(o)),
                Op::Transpose(a, b) => t.transpose(a.get(), b.get()),
                Op::Squeeze(a) => t.squeeze(a.get()),
                Op::Unsqueeze(a) => t.unsqueeze(a.get()),
                Op::ViewWithStrides { axes, offset } => {
                    let shape: Vec<usize> = axes.iter().map(|(d, _)| d.get()).collect();
                    let strides: Vec<usize> = axes.iter().map(|(_, s)| s.get()).collect();
                    t.view_with_strides(&shape, &strides, offset.get())
                }
                Op::ViewWithStridesRaw {
                    shape,
                    strides,
                    offset,
                } => t.view_with_strides(&sizes(shape), &sizes(strides), offset.get()),
                // Copying a legal but huge broadcast is an honest request for
                // memory, not a bug: only small tensors are materialized.
                Op::Materialize if t.numel() <= MAX_READ => ctx.materialize(&t),
                Op::Materialize => continue,
            };
            if let Ok(next) = next {
                check(ctx, &next);
                t = next;
            }
        }
    });
});
