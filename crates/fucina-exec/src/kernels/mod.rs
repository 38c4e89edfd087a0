//! Kernels: plain functions over slices, free of shapes and pools. The ops
//! (`src/ops/`) validate, allocate and split the work; kernels compute. The hot
//! loops run at the vector level chosen at run time ([`simd`]).

pub(crate) mod amx_rule;
pub(crate) mod batch_norm;
pub(crate) mod conv;
#[cfg(target_arch = "x86_64")]
pub(crate) mod depthwise_avx512;
pub(crate) mod gather;
pub(crate) mod gemm;
pub(crate) mod math;
pub(crate) mod pool_2x2;
pub(crate) mod prefetch;
pub(crate) mod quant_block;
pub(crate) mod quant_dot;
pub(crate) mod quant_k;
pub(crate) mod quant_packed;
pub(crate) mod recurrent;
pub(crate) mod reduce;
pub(crate) mod rowwise;
pub(crate) mod simd;
pub(crate) mod sort;
pub(crate) mod strided;
pub(crate) mod transpose;
pub(crate) mod unary;
pub(crate) mod weight_dot;
