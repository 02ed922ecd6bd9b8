//! The encoder's arithmetic on the CPU, used only for CPU tensors (a CUDA device never reaches these):
//! `blas` (a CBLAS loaded at run time, or built-in kernels, for linear layers and attention), `packed` (the
//! built-in linear layers on AVX-512), `kernels` (fused row kernels with
//! their backward passes), `disentangled` (DeBERTa's attention probabilities), `int8` (int8 linear layers on
//! AVX-512 VNNI), `mapped` (a vector file's records read in place).

// Every unsafe operation in its own block, with its reason beside it, even inside an `unsafe fn`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod blas;
pub mod disentangled;
pub mod int8;
pub mod kernels;
pub mod mapped;
mod packed;
