//! Checks of `NormOps::layer_norm_backward_into`: LayerNorm backward's (with the residual
//! stream's gradient), plus the weight's and bias's gradient buffers it adds into.

use super::common::{distinct, same_shape, writable};
use super::fused::layer_norm_backward_add;
use super::linear::disjoint_views;
use super::ops::Rows;
use crate::descriptors::LayerNormBackward;
use crate::error::Result;
use crate::storage::Storage;
use crate::tensor::Tensor;

/// `layer_norm_backward_into`: `layer_norm_backward_add`'s checks; `dw` and `db`, where given,
/// shaped `[n]`, writable (no broadcast view) and in other memory than every operand read;
/// they may be disjoint views of one buffer (a flat gradient buffer), not overlapping ones.
pub(crate) fn layer_norm_backward_into<S: Storage>(
    ln: &LayerNormBackward<'_, S>,
    dw: Option<&Tensor<S>>,
    db: Option<&Tensor<S>>,
) -> Result<Rows> {
    const OP: &str = "layer_norm_backward_into";
    let LayerNormBackward {
        g,
        residual,
        x,
        mean,
        rstd,
        weight,
    } = *ln;
    let r = layer_norm_backward_add(g, residual, x, mean, rstd, weight)?;
    let mut read: smallvec::SmallVec<[(&'static str, &Tensor<S>); 6]> =
        smallvec::smallvec![("g", g), ("x", x), ("mean", mean), ("rstd", rstd)];
    read.extend(residual.map(|t| ("residual", t)));
    read.extend(weight.map(|t| ("weight", t)));
    for (name, dst) in [("dw", dw), ("db", db)] {
        let Some(dst) = dst else { continue };
        same_shape(OP, dst.shape(), &[r.n])?;
        writable(OP, dst.layout())?;
        for &(src_name, src) in &read {
            distinct(OP, &[(src_name, src), (name, dst)])?;
        }
    }
    if let (Some(dw), Some(db)) = (dw, db) {
        disjoint_views(OP, ("dw", dw), ("db", db))?;
    }
    Ok(r)
}
