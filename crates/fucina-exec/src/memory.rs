//! Memory advice for long-lived, read-mostly allocations that are not tensor
//! storage (the repacked quantized matrices of `ops/quant.rs`, the packed bf16
//! matrices of `ops/bf16_matmul.rs`).

/// Asks the kernel to back the whole 2 MiB pages inside `[p, p + len)` (a
/// fresh allocation, not touched yet) with huge pages: a repacked matrix is
/// read as long sequential streams, and 4 KiB pages cost a page walk every
/// 4 KiB. Advisory: a refusal (or another OS) changes nothing.
pub(crate) fn advise_huge_pages(p: *const u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (p as usize).next_multiple_of(HUGE);
        let end = (p as usize + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: [start, end) lies inside the caller's allocation, which
            // this process owns; MADV_HUGEPAGE only changes how its pages are
            // backed, never their contents, and its result is ignored.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}
