//! Software prefetch hints, shared by the GEMM and the row kernels. A hint never
//! faults, reads nothing the program can observe and changes no result; off
//! x86_64 the functions do nothing.

/// Asks for every 64-byte line of `x` (one hint per 16 floats) to be brought
/// into L1: the next row of a row kernel, the next `C` tile of the GEMM.
#[inline(always)]
pub(crate) fn l1(x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for c in x.chunks(16) {
        // SAFETY: SSE is part of the x86_64 baseline; a prefetch never faults and
        // reads nothing (the address is inside `x` anyway).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(c.as_ptr().cast())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// [`l1`] on row `row` (of `len` floats) of `rows`, if `row < end`: the row a
/// row-by-row loop that stops before `end` computes next.
#[inline(always)]
pub(crate) fn next_row(rows: &[f32], row: usize, end: usize, len: usize) {
    if row < end {
        l1(&rows[row * len..][..len]);
    }
}
