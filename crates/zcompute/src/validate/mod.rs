//! The one validation layer of the op set: shape inference, broadcasting, aliasing and
//! argument checks, written once for every backend. Each `Backend` method of `CpuBackend` and
//! `CudaBackend` calls its function here before it allocates, reads or launches anything, and
//! works from the shapes it returns, so a bad input gets the same typed error (the same variant,
//! op name and fields) on every backend, and no backend can run an op on inputs another would
//! refuse. What stays in a backend is what only that backend can know: device state (capture,
//! open steps, memory) and its own limits (cuBLAS's 32-bit sizes, the kernels' 6 strided axes).
//!
//! Element types need no check: a `Backend<T>` takes tensors of its own storage only, so an f64
//! operand on an f32 op does not compile:
//!
//! ```compile_fail
//! use zcompute::{Backend, CpuBackend, CpuTensor};
//! let a = CpuTensor::<f32>::from_vec(vec![1.0], &[1]).unwrap();
//! let b = CpuTensor::<f64>::from_vec(vec![1.0], &[1]).unwrap();
//! let _ = CpuBackend.add(&a, &b);
//! ```
//!
//! Ops with no constraint on their arguments (`unary`, `binary_scalar`, `contiguous`,
//! `download`: any tensor is valid, the output has the input's shape) have no function here.

mod accumulate;
mod attention;
mod common;
mod flat;
mod fused;
mod indexed;
mod into;
mod linear;
mod norm_params;
mod ops;
mod select;

pub(crate) use accumulate::*;
pub(crate) use attention::*;
pub(crate) use flat::*;
pub(crate) use fused::*;
pub(crate) use indexed::{indexed_row, indexed_rows, indexed_rows_at_cursor, row_of};
pub(crate) use into::*;
pub(crate) use linear::*;
pub(crate) use norm_params::*;
pub(crate) use ops::*;
pub(crate) use select::*;
