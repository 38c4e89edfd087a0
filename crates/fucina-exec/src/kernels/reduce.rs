//! PLACEHOLDER: these kernels are being written.
