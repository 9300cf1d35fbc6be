//! Checks of the accumulating ops (`matmul_into`, `sum_rows_into`): they add into a caller's buffer, so the
//! buffer must have the result's shape, be writable and share no memory with an operand.

use super::common::{distinct, same_shape, writable};
use super::ops::{MatmulShape, Rows, matmul, rows};
use crate::descriptors::MatmulOpts;
use crate::error::Result;
use crate::storage::Storage;
use crate::tensor::Tensor;

/// `matmul_into`: the product's checks, then `dst` shaped as the product, writable, and in
/// other memory than `a` and `b`.
pub(crate) fn matmul_into<S: Storage>(
    a: &Tensor<S>,
    b: &Tensor<S>,
    opts: MatmulOpts,
    dst: &Tensor<S>,
) -> Result<MatmulShape> {
    const OP: &str = "matmul_into";
    let shape = matmul(a, b, opts)?;
    same_shape(OP, &shape.out, dst.shape())?;
    writable(OP, dst.layout())?;
    distinct(OP, &[("a", a), ("dst", dst)])?;
    distinct(OP, &[("b", b), ("dst", dst)])?;
    Ok(shape)
}

/// `sum_rows_into`: `x` of rank >= 1 (`[..., n]`), `dst` shaped `[n]`, writable, in other
/// memory.
pub(crate) fn sum_rows_into<S: Storage>(x: &Tensor<S>, dst: &Tensor<S>) -> Result<Rows> {
    const OP: &str = "sum_rows_into";
    let r = rows(OP, x)?;
    same_shape(OP, dst.shape(), &[r.n])?;
    writable(OP, dst.layout())?;
    distinct(OP, &[("x", x), ("dst", dst)])?;
    Ok(r)
}
