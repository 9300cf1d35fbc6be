//! Reductions over one axis: the axis is permuted last and gathered, so each output element
//! reduces one dense row.

use super::{dense, math};
use crate::backend::ReduceOp;
use crate::element::Element;
use crate::error::{ComputeError, Result};
use crate::layout::Dims;
use crate::tensor::CpuTensor;

pub(crate) fn reduce<T: Element>(
    op: ReduceOp,
    x: &CpuTensor<T>,
    axis: usize,
    keepdim: bool,
) -> Result<CpuTensor<T>> {
    let name = match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Mean => "mean",
        ReduceOp::Max => "max",
    };
    x.layout().check_axis(name, axis)?;
    let n = x.shape()[axis];
    if n == 0 && op != ReduceOp::Sum {
        return Err(ComputeError::EmptyReduction { op: name, axis });
    }
    let mut perm: Dims = (0..x.rank()).filter(|&i| i != axis).collect();
    perm.push(axis);
    let rows = x.permute(&perm)?.to_vec();

    let mut shape: Dims = x.shape().into();
    if keepdim {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
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
