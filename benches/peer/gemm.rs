//! The `gemm` crate as a peer: one row-major product, shared by the `matmul`
//! bench and the `gemm_probe` example (included with `#[path]`).

/// `c = a · b` (row-major, `m x k` by `k x n`) with the `gemm` crate.
pub(crate) fn gemm_crate(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    par: gemm::Parallelism,
) {
    assert!(a.len() == m * k && b.len() == k * n && c.len() == m * n);
    // SAFETY: the asserts give the extents; row-major strides (column stride 1,
    // row stride k / n / n) describe exactly those buffers; `c` is not read
    // (`read_dst = false`) and does not alias the inputs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}
