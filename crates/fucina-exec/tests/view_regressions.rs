//! Regression tests for view layouts that once panicked when read.

use fucina_exec::ExecContext;

/// `(shape, strides, offset, expected elements)` of a view.
type Case = (&'static [usize], &'static [usize], usize, &'static [f32]);

/// A size-1 axis may carry any stride (it is never stepped along), so
/// `view_with_strides` accepts one near `usize::MAX`. Reading such a view walked
/// its storage index one step past the axis and overflowed (a panic in builds
/// with overflow checks) before the walk was made wrapping.
#[test]
fn size_one_axes_with_huge_strides_read_back() {
    let ctx = ExecContext::new();
    let x = ctx.from_slice(&[2, 3], &[0., 1., 2., 3., 4., 5.]).unwrap();
    const HUGE: usize = usize::MAX;
    let cases: [Case; 5] = [
        (&[2, 1], &[1, HUGE], 0, &[0., 1.]),
        (&[1], &[HUGE], 3, &[3.]),
        (&[2, 1, 2], &[3, HUGE - 1, 1], 1, &[1., 2., 4., 5.]),
        (&[1, 3], &[HUGE, 1], 2, &[2., 3., 4.]),
        (&[3, 1, 1], &[2, HUGE, HUGE - 7], 0, &[0., 2., 4.]),
    ];
    for (shape, strides, offset, want) in cases {
        let v = x.view_with_strides(shape, strides, offset).unwrap();
        assert_eq!(v.to_vec(), want, "{shape:?} {strides:?} @{offset}");
        assert_eq!(ctx.materialize(&v).unwrap().to_vec(), want);
        // Views of the view, and a copy-on-write write through it.
        let t = v.transpose(0, v.rank() - 1).unwrap();
        assert_eq!(ctx.materialize(&t).unwrap().to_vec(), t.to_vec());
        let u = v.unsqueeze(0).unwrap();
        assert_eq!(u.to_vec(), want);
        let mut w = v.clone();
        w.data_mut().unwrap()[0] = -1.0;
        assert_eq!(w.to_vec()[0], -1.0);
        assert_eq!(v.to_vec(), want, "the view keeps its values");
    }
}

/// The input the `views` fuzz target found for the same bug (kept as
/// `fuzz/seeds/views/overflow-size1-huge-stride`): an 8-element tensor, then a
/// one-element view at offset 1 whose only axis has stride `usize::MAX`.
#[test]
fn fuzz_views_overflow_size1_huge_stride() {
    let ctx = ExecContext::new();
    let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let x = ctx.from_slice(&[8], &values).unwrap();
    let v = x.view_with_strides(&[1], &[usize::MAX], 1).unwrap();
    assert_eq!(v.to_vec(), [1.0]);
    assert_eq!(ctx.materialize(&v).unwrap().to_vec(), [1.0]);
}
