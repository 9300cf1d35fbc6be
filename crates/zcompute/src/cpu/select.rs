//! The selection and random families on the host, as plain loops in the kernels' order
//! (`kernels/select.cu`): the same bits as the device for `select`, `argmax` and the dropout
//! mask, and `index_add_rows` adding rows in index order as the kernel does.

use super::indexed::row_of;
use super::{CpuBackend, dense, gather, scatter};
use crate::element::Element;
use crate::error::Result;
use crate::random::{RandomOps, dropout_keeps, dropout_step, dropout_threshold};
use crate::select::SelectOps;
use crate::tensor::CpuTensor;
use crate::validate;

impl<T: Element> SelectOps<T> for CpuBackend {
    fn select(
        &self,
        cond: &CpuTensor<T>,
        a: &CpuTensor<T>,
        b: &CpuTensor<T>,
    ) -> Result<CpuTensor<T>> {
        let shape = validate::select(cond, a, b)?;
        let c = gather(&cond.broadcast_to(&shape)?);
        let a = gather(&a.broadcast_to(&shape)?);
        let b = gather(&b.broadcast_to(&shape)?);
        let out = c
            .iter()
            .zip(a.iter().zip(&b))
            .map(|(&c, (&a, &b))| {
                if c.is_nan() {
                    c
                } else if c != T::ZERO {
                    a
                } else {
                    b
                }
            })
            .collect();
        dense(out, &shape)
    }

    fn argmax(&self, x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        let (rows, shape) = validate::argmax(x)?;
        let data = gather(x);
        let out = data
            .chunks(rows.n)
            .map(|row| T::from_f64(argmax_row(row) as f64))
            .collect();
        dense(out, &shape)
    }

    fn index_add_rows(
        &self,
        src: &CpuTensor<T>,
        index: &CpuTensor<T>,
        dst: &CpuTensor<T>,
    ) -> Result<()> {
        let (table, n) = validate::index_add_rows(src, index, dst)?;
        let at: Vec<f64> = gather(index).into_iter().map(T::to_f64).collect();
        validate::indices_in_range("index_add_rows", &at, table.rows)?;
        let src = gather(src);
        let mut out = gather(dst);
        for (i, v) in at.iter().enumerate().take(n) {
            let Some(r) = row_of(*v, table.rows) else {
                continue;
            };
            let len = table.row_len;
            for (d, s) in out[r * len..(r + 1) * len]
                .iter_mut()
                .zip(&src[i * len..(i + 1) * len])
            {
                *d = *d + *s;
            }
        }
        scatter(&out, dst);
        Ok(())
    }

    fn embedding(&self, table: &CpuTensor<T>, index: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        let shape = validate::embedding(table, index)?;
        let rows = table.shape()[0];
        let at: Vec<f64> = gather(index).into_iter().map(T::to_f64).collect();
        validate::indices_in_range("embedding", &at, rows)?;
        let len = table.numel() / rows.max(1);
        let data = gather(table);
        let mut out = Vec::with_capacity(at.len() * len);
        for v in at {
            // In range: checked above.
            let r = row_of(v, rows).unwrap_or(0);
            out.extend_from_slice(&data[r * len..(r + 1) * len]);
        }
        dense(out, &shape)
    }
}

/// The index of the first maximum of `row` (non-empty); a NaN counts as the maximum.
pub(crate) fn argmax_row<T: Element>(row: &[T]) -> usize {
    let (mut best, mut bv) = (0, row[0]);
    for (j, &v) in row.iter().enumerate().skip(1) {
        if bv.is_nan() {
            break;
        }
        if v.is_nan() || v > bv {
            best = j;
            bv = v;
        }
    }
    best
}

impl<T: Element> RandomOps<T> for CpuBackend {
    fn dropout_mask(
        &self,
        shape: &[usize],
        p: f64,
        seed: u64,
        stream: u32,
        step: &CpuTensor<T>,
    ) -> Result<CpuTensor<T>> {
        let n = validate::dropout_mask::<_>(shape, p, step)?;
        let out = match dropout_step(gather(step)[0].to_f64()) {
            Some(s) => {
                let threshold = dropout_threshold(p);
                let scale = T::from_f64(1.0 / (1.0 - p));
                (0..n as u64)
                    .map(|i| {
                        if dropout_keeps(seed, s, stream, i, threshold) {
                            scale
                        } else {
                            T::ZERO
                        }
                    })
                    .collect()
            }
            None => vec![T::from_f64(f64::NAN); n],
        };
        dense(out, shape)
    }
}
