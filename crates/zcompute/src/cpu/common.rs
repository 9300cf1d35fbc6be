//! The tensor helpers the CPU backend's op modules share (reading a view in logical order,
//! writing values through one, a fresh dense tensor): the ground of `cpu/`, below the op
//! modules and `cpu/mod.rs` (which names them), so none of them reaches back up into
//! `mod.rs` for these, and no import circle forms.

use super::pool;
use crate::element::Element;
use crate::error::Result;
use crate::tensor::CpuTensor;

/// Elements of `x` in logical row-major order.
pub(crate) fn gather<T: Element>(x: &CpuTensor<T>) -> Vec<T> {
    if x.is_contiguous() && x.numel() > 0 {
        super::dense::with(x, pool::copied)
    } else {
        x.to_vec()
    }
}

/// A fresh dense tensor; `data.len()` must match `shape` (callers build it from the shape).
pub(crate) fn dense<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<CpuTensor<T>> {
    CpuTensor::from_vec(data, shape)
}

/// Writes `values` (logical order) through the view `dst`.
pub(super) fn scatter<T: Element>(values: &[T], dst: &CpuTensor<T>) {
    super::dense::write(values, dst);
}
