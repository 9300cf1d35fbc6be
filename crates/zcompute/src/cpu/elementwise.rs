//! Elementwise ops: unary maps, broadcasting binaries, scalar forms.

use super::{dense, gather, math};
use crate::backend::{BinaryOp, ScalarSide, UnaryOp};
use crate::element::Element;
use crate::error::Result;
use crate::tensor::CpuTensor;
use crate::validate;

pub(super) fn unary<T: Element>(op: UnaryOp, x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
    let out = gather(x).into_iter().map(|v| math::unary(op, v)).collect();
    dense(out, x.shape())
}

pub(super) fn binary<T: Element>(
    op: BinaryOp,
    a: &CpuTensor<T>,
    b: &CpuTensor<T>,
) -> Result<CpuTensor<T>> {
    let shape = validate::binary(op, a, b)?;
    // Broadcast views walk both operands in the output's logical order, stride 0 repeating.
    let la = a.layout().broadcast_to(&shape)?;
    let lb = b.layout().broadcast_to(&shape)?;
    let out = if a.shares_storage(b) {
        let data = a.storage().read();
        la.offsets()
            .zip(lb.offsets())
            .map(|(i, j)| math::binary(op, data[i], data[j]))
            .collect()
    } else {
        let da = a.storage().read();
        let db = b.storage().read();
        la.offsets()
            .zip(lb.offsets())
            .map(|(i, j)| math::binary(op, da[i], db[j]))
            .collect()
    };
    dense(out, &shape)
}

pub(super) fn binary_scalar<T: Element>(
    op: BinaryOp,
    x: &CpuTensor<T>,
    s: T,
    side: ScalarSide,
) -> Result<CpuTensor<T>> {
    let out = gather(x)
        .into_iter()
        .map(|v| match side {
            ScalarSide::Rhs => math::binary(op, v, s),
            ScalarSide::Lhs => math::binary(op, s, v),
        })
        .collect();
    dense(out, x.shape())
}
