//! The raw op surface, one module per op family. Each op validates its operands
//! (returning an `Err` before anything is allocated), allocates its output from the
//! context's pool, and runs a kernel of [`crate::kernels`] over it, in parallel
//! chunks above [`crate::PARALLEL_THRESHOLD`].

pub(crate) mod attention;
pub(crate) mod batch_norm;
pub(crate) mod bf16_matmul;
pub(crate) mod bf16_round;
pub(crate) mod common;
pub(crate) mod conv;
pub(crate) mod conv_transpose;
pub(crate) mod elementwise;
pub(crate) mod gather;
pub(crate) mod group_norm;
pub(crate) mod grouped_matmul;
pub(crate) mod interpolate;
pub(crate) mod join;
pub(crate) mod loss;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod pad;
pub(crate) mod pool;
pub(crate) mod quant;
pub(crate) mod quant_format;
pub(crate) mod quant_matrix;
pub(crate) mod quant_packed;
pub(crate) mod recurrent;
pub(crate) mod recurrent_sequence;
pub(crate) mod reduce;
pub(crate) mod scan;
pub(crate) mod scatter;
pub(crate) mod softmax;
pub(crate) mod sort;
pub(crate) mod view;
pub(crate) mod weight_matmul;
