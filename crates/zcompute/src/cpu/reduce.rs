//! Reductions over one axis: the axis is permuted last and gathered, so each output element
//! reduces one dense row.

use super::{dense, math};
use crate::backend::ReduceOp;
use crate::element::Element;
use crate::error::Result;
use crate::layout::Dims;
use crate::tensor::CpuTensor;
use crate::validate;

pub(crate) fn reduce<T: Element>(
    op: ReduceOp,
    x: &CpuTensor<T>,
    axis: usize,
    keepdim: bool,
) -> Result<CpuTensor<T>> {
    let validate::Reduced { shape, n, .. } = validate::reduce(op, x, axis, keepdim)?;
    let mut perm: Dims = (0..x.rank()).filter(|&i| i != axis).collect();
    perm.push(axis);
    let rows = x.permute(&perm)?.to_vec();

    let outer: usize = shape.iter().product();
    let out: Vec<T> = if n == 0 {
        vec![T::ZERO; outer]
    } else {
        rows.chunks_exact(n)
            .map(|row| match op {
                ReduceOp::Sum => math::pairwise_sum(row),
                ReduceOp::Mean => math::pairwise_sum(row) / T::from_f64(n as f64),
                ReduceOp::Max => math::row_max(row),
            })
            .collect()
    };
    dense(out, &shape)
}
