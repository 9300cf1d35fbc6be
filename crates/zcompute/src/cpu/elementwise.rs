//! Elementwise ops: unary maps, broadcasting binaries, scalar forms.
//!
//! Each operand of a binary op is classified against the output's rows (the last axis): the
//! whole output's shape read densely, one row repeated (a bias), one value per row (a
//! LayerNorm statistic), or one value; those run as tight loops over row slices, split over
//! the pool by rows. Any other view (transposed, strided) walks its layout's offsets.

use super::{dense, math, par};
use crate::backend::{BinaryOp, ScalarSide, UnaryOp};
use crate::element::Element;
use crate::error::Result;
use crate::layout::{Layout, contiguous_strides};
use crate::tensor::CpuTensor;
use crate::validate;

pub(super) fn unary<T: Element>(op: UnaryOp, x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
    let mut out = super::pool::overwritten(x.numel());
    super::dense::with(x, |xs| {
        par::chunks_mut(&mut out, |start, chunk| {
            math::unary_slice(op, &xs[start..start + chunk.len()], chunk);
        });
    });
    dense(out, x.shape())
}

/// How one operand of a binary op is read, per output row of `n` elements.
#[derive(Clone, Copy)]
enum Operand<'a, T> {
    /// Every element, in the output's order.
    Dense(&'a [T]),
    /// One row of `n`, the same for every output row.
    Row(&'a [T]),
    /// One value per output row.
    PerRow(&'a [T]),
    /// One value.
    Scalar(T),
}

/// One output row's elements of an operand.
enum RowOf<'a, T> {
    Slice(&'a [T]),
    Value(T),
}

impl<'a, T: Element> Operand<'a, T> {
    fn row(self, r: usize, n: usize) -> RowOf<'a, T> {
        match self {
            Operand::Dense(d) => RowOf::Slice(&d[r * n..(r + 1) * n]),
            Operand::Row(d) => RowOf::Slice(d),
            Operand::PerRow(d) => RowOf::Value(d[r]),
            Operand::Scalar(v) => RowOf::Value(v),
        }
    }

    /// Elements `start..start + len` of a dense operand or one value; `None` for the others.
    fn flat(self, start: usize, len: usize) -> Option<RowOf<'a, T>> {
        match self {
            Operand::Dense(d) => Some(RowOf::Slice(&d[start..start + len])),
            Operand::Scalar(v) => Some(RowOf::Value(v)),
            Operand::Row(_) | Operand::PerRow(_) => None,
        }
    }
}

/// Whether `strides` walk `shape` densely (size-1 axes ignored).
fn dense_strides(shape: &[usize], strides: &[usize]) -> bool {
    let want = contiguous_strides(shape);
    shape
        .iter()
        .zip(strides.iter().zip(want.iter()))
        .all(|(&d, (&s, &w))| d == 1 || s == w)
}

/// Classifies the broadcast layout `l` (output-shaped) over `data`, or `None` for a general
/// strided view.
fn classify<'a, T: Element>(l: &Layout, data: &'a [T]) -> Option<Operand<'a, T>> {
    let (shape, strides, off) = (l.shape(), l.strides(), l.offset());
    let numel = l.numel();
    let rank = shape.len();
    if rank == 0 || strides.iter().zip(shape).all(|(&s, &d)| s == 0 || d == 1) {
        return Some(Operand::Scalar(data[off]));
    }
    let n = shape[rank - 1];
    let (outer_shape, outer_strides) = (&shape[..rank - 1], &strides[..rank - 1]);
    let last_dense = n == 1 || strides[rank - 1] == 1;
    let outer_zero = outer_strides
        .iter()
        .zip(outer_shape)
        .all(|(&s, &d)| s == 0 || d == 1);
    if last_dense && dense_strides(shape, strides) {
        Some(Operand::Dense(&data[off..off + numel]))
    } else if last_dense && outer_zero {
        Some(Operand::Row(&data[off..off + n]))
    } else if strides[rank - 1] == 0 && dense_strides(outer_shape, outer_strides) {
        Some(Operand::PerRow(&data[off..off + numel / n.max(1)]))
    } else {
        None
    }
}

/// `o[i] = f(x[i], y[i])` for one row or chunk.
fn apply<T: Element>(o: &mut [T], x: RowOf<'_, T>, y: RowOf<'_, T>, f: impl Fn(T, T) -> T) {
    match (x, y) {
        (RowOf::Slice(x), RowOf::Slice(y)) => {
            for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                *o = f(x, y);
            }
        }
        (RowOf::Slice(x), RowOf::Value(y)) => {
            for (o, &x) in o.iter_mut().zip(x) {
                *o = f(x, y);
            }
        }
        (RowOf::Value(x), RowOf::Slice(y)) => {
            for (o, &y) in o.iter_mut().zip(y) {
                *o = f(x, y);
            }
        }
        (RowOf::Value(x), RowOf::Value(y)) => o.fill(f(x, y)),
    }
}

/// `out[i] = f(a[i], b[i])` over rows of `n`, each operand read per its kind; operands that
/// are dense or one value are walked flat (split anywhere, rows or not).
fn rows<T: Element>(
    out: &mut [T],
    n: usize,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    f: impl Fn(T, T) -> T + Send + Sync + Copy,
) {
    if let (Some(_), Some(_)) = (a.flat(0, 0), b.flat(0, 0)) {
        par::chunks_mut(out, |start, chunk| {
            let len = chunk.len();
            if let (Some(x), Some(y)) = (a.flat(start, len), b.flat(start, len)) {
                apply(chunk, x, y, f);
            }
        });
        return;
    }
    par::rows_mut(out, n, |first, block| {
        for (i, o) in block.chunks_exact_mut(n).enumerate() {
            apply(o, a.row(first + i, n), b.row(first + i, n), f);
        }
    });
}

/// Dispatches `op` to a monomorphic closure so each loop compiles to straight-line code.
fn binary_rows<T: Element>(
    op: BinaryOp,
    out: &mut [T],
    n: usize,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
) {
    match op {
        BinaryOp::Add => rows(out, n, a, b, |x, y| x + y),
        BinaryOp::Sub => rows(out, n, a, b, |x, y| x - y),
        BinaryOp::Mul => rows(out, n, a, b, |x, y| x * y),
        BinaryOp::Div => rows(out, n, a, b, |x, y| x / y),
        BinaryOp::Maximum => rows(out, n, a, b, math::maximum),
    }
}

/// The binary op over `da`/`db` (the operands' storages) through broadcast layouts.
fn binary_into<T: Element>(
    op: BinaryOp,
    out: &mut [T],
    shape: &[usize],
    la: &Layout,
    lb: &Layout,
    da: &[T],
    db: &[T],
) {
    let n = shape.last().copied().unwrap_or(1).max(1);
    match (classify(la, da), classify(lb, db)) {
        (Some(a), Some(b)) => binary_rows(op, out, n, a, b),
        _ => {
            for ((o, i), j) in out.iter_mut().zip(la.offsets()).zip(lb.offsets()) {
                *o = math::binary(op, da[i], db[j]);
            }
        }
    }
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
    let mut out = super::pool::overwritten(la.numel());
    if !out.is_empty() {
        if a.shares_storage(b) {
            let data = a.storage().read();
            binary_into(op, &mut out, &shape, &la, &lb, &data, &data);
        } else {
            let da = a.storage().read();
            let db = b.storage().read();
            binary_into(op, &mut out, &shape, &la, &lb, &da, &db);
        }
    }
    dense(out, &shape)
}

pub(super) fn binary_scalar<T: Element>(
    op: BinaryOp,
    x: &CpuTensor<T>,
    s: T,
    side: ScalarSide,
) -> Result<CpuTensor<T>> {
    let mut out = super::pool::overwritten(x.numel());
    super::dense::with(x, |xs| {
        let (xs, s) = (Operand::Dense(xs), Operand::Scalar(s));
        let n = out.len().max(1);
        match side {
            ScalarSide::Rhs => binary_rows(op, &mut out, n, xs, s),
            ScalarSide::Lhs => binary_rows(op, &mut out, n, s, xs),
        }
    });
    dense(out, x.shape())
}
