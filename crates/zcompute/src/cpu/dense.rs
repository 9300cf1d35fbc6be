//! Reading tensors as dense slices without copying them: a contiguous tensor is read in place
//! under its storage's read lock, any other view is gathered into logical order first. Two
//! operands over one buffer are read under one lock (a second read lock of the same `RwLock`
//! from one thread can deadlock behind a waiting writer).

use crate::element::Element;
use crate::tensor::CpuTensor;

/// The tensor's elements in `data` when it is contiguous (`data` is its storage).
fn window<'a, T: Element>(data: &'a [T], x: &CpuTensor<T>) -> &'a [T] {
    let start = x.layout().offset();
    &data[start..start + x.numel()]
}

/// Calls `f` with `x`'s elements in logical order.
pub(crate) fn with<T: Element, R>(x: &CpuTensor<T>, f: impl FnOnce(&[T]) -> R) -> R {
    if x.numel() == 0 {
        return f(&[]);
    }
    if x.is_contiguous() {
        let data = x.storage().read();
        f(window(&data, x))
    } else {
        f(&x.to_vec())
    }
}

/// Calls `f` with the elements of `a` and `b`, each in logical order.
pub(crate) fn with2<T: Element, R>(
    a: &CpuTensor<T>,
    b: &CpuTensor<T>,
    f: impl FnOnce(&[T], &[T]) -> R,
) -> R {
    let dense = |x: &CpuTensor<T>| x.numel() == 0 || x.is_contiguous();
    match (dense(a), dense(b)) {
        (false, _) => {
            let va = a.to_vec();
            with(b, |sb| f(&va, sb))
        }
        (true, false) => {
            let vb = b.to_vec();
            with(a, |sa| f(sa, &vb))
        }
        (true, true) if a.shares_storage(b) => {
            let data = a.storage().read();
            let sa = if a.numel() == 0 {
                &[][..]
            } else {
                window(&data, a)
            };
            let sb = if b.numel() == 0 {
                &[][..]
            } else {
                window(&data, b)
            };
            f(sa, sb)
        }
        (true, true) => with(a, |sa| with(b, |sb| f(sa, sb))),
    }
}

/// Writes `values` (logical order) through the view `dst`: one copy when `dst` is contiguous.
pub(crate) fn write<T: Element>(values: &[T], dst: &CpuTensor<T>) {
    let mut data = dst.storage().write();
    if dst.is_contiguous() {
        let (start, n) = (dst.layout().offset(), values.len().min(dst.numel()));
        super::par::copy(&values[..n], &mut data[start..start + n]);
    } else {
        for (o, &v) in dst.layout().offsets().zip(values) {
            data[o] = v;
        }
    }
}
