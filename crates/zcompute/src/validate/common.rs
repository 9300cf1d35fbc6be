//! The checks every op's validation shares: equal shapes, writable destination views, operands
//! in distinct storage, output sizes that fit in memory, scalars in range.

use crate::element::Element;
use crate::error::{ComputeError, Result};
use crate::layout::{Layout, checked_numel};
use crate::storage::Storage;
use crate::tensor::Tensor;

/// Refuses two shapes that must be equal and are not.
pub(crate) fn same_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<()> {
    if a == b {
        Ok(())
    } else {
        Err(ComputeError::ShapeMismatch {
            op,
            lhs: a.into(),
            rhs: b.into(),
        })
    }
}

/// Refuses destination views that reach one element twice (broadcast views): writing through
/// them would depend on iteration order. Sorting axes by stride, each stride must clear the span
/// of the smaller ones. This accepts every layout the view ops can build without broadcasting.
pub(crate) fn writable(op: &'static str, layout: &Layout) -> Result<()> {
    // An empty view writes nothing, whatever its strides (a reshape of an empty tensor has a
    // stride of 0 in front of the zero-sized axis).
    if layout.numel() == 0 {
        return Ok(());
    }
    let mut axes: smallvec::SmallVec<[(usize, usize); 6]> = layout
        .shape()
        .iter()
        .zip(layout.strides())
        .filter(|&(&d, _)| d > 1)
        .map(|(&d, &s)| (s, d))
        .collect();
    axes.sort_unstable();
    let mut span = 0usize;
    for (stride, dim) in axes {
        if stride <= span {
            return Err(ComputeError::OverlappingDestination {
                op,
                shape: layout.shape().into(),
                strides: layout.strides().into(),
            });
        }
        span += (dim - 1) * stride;
    }
    Ok(())
}

/// Refuses any two of `named` that share storage (an in-place op reading what it writes).
pub(super) fn distinct<S: Storage>(
    op: &'static str,
    named: &[(&'static str, &Tensor<S>)],
) -> Result<()> {
    for (i, (lhs, l)) in named.iter().enumerate() {
        for (rhs, r) in &named[i + 1..] {
            if l.shares_storage(r) {
                return Err(ComputeError::Aliased { op, lhs, rhs });
            }
        }
    }
    Ok(())
}

/// The element count of an output of `shape`, refusing shapes whose size in bytes does not fit
/// in memory at all (`isize::MAX` bytes; broadcasting or a matrix product of sane inputs can
/// ask for one), so no backend reaches an allocation that cannot be expressed.
pub(crate) fn output_numel<T: Element>(op: &'static str, shape: &[usize]) -> Result<usize> {
    let n = checked_numel(op, shape)?;
    let fits = n
        .checked_mul(T::DTYPE.size())
        .is_some_and(|bytes| isize::try_from(bytes).is_ok());
    if fits {
        Ok(n)
    } else {
        Err(ComputeError::SizeOverflow {
            op,
            shape: shape.into(),
        })
    }
}

/// Refuses a scalar argument outside `[min, max)` (`max_open: false`: `[min, max]`), NaN
/// and infinities included.
pub(super) fn scalar_in<T: Element>(
    op: &'static str,
    arg: &'static str,
    value: T,
    (min, max, max_open): (f64, f64, bool),
    expected: &'static str,
) -> Result<()> {
    let v = value.to_f64();
    let below_max = if max_open { v < max } else { v <= max };
    if v.is_finite() && v >= min && below_max {
        Ok(())
    } else {
        Err(ComputeError::InvalidScalar {
            op,
            arg,
            value: format!("{v:?}"),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writable_layouts() {
        let ok = |l: Layout| writable("t", &l).is_ok();
        assert!(ok(Layout::contiguous(&[3, 4])));
        assert!(ok(Layout::contiguous(&[3, 4]).transpose(0, 1).unwrap()));
        assert!(ok(Layout::contiguous(&[3, 4]).narrow(1, 1, 2).unwrap()));
        assert!(ok(Layout::new(&[1, 4], &[0, 1], 0).unwrap()));
        assert!(ok(Layout::new(&[5, 0], &[0, 1], 0).unwrap()));
        assert!(!ok(Layout::contiguous(&[4]).broadcast_to(&[2, 4]).unwrap()));
        assert!(!ok(Layout::new(&[2, 3], &[2, 1], 0).unwrap()));
    }

    #[test]
    fn output_sizes_must_fit_in_memory() {
        assert_eq!(output_numel::<f32>("t", &[3, 0, 5]), Ok(0));
        assert_eq!(output_numel::<f32>("t", &[]), Ok(1));
        let max_f32 = isize::MAX as usize / 4;
        assert_eq!(output_numel::<f32>("t", &[max_f32]), Ok(max_f32));
        assert!(matches!(
            output_numel::<f32>("t", &[max_f32 + 1]),
            Err(ComputeError::SizeOverflow { op: "t", .. })
        ));
        assert!(output_numel::<f64>("t", &[max_f32]).is_err());
        assert!(output_numel::<f32>("t", &[usize::MAX, 2]).is_err());
    }

    #[test]
    fn scalar_ranges() {
        let beta = (0.0, 1.0, true);
        assert!(scalar_in("t", "b", 0.0f32, beta, "").is_ok());
        assert!(scalar_in("t", "b", 0.999f32, beta, "").is_ok());
        for bad in [1.0f32, -0.1, f32::NAN, f32::INFINITY] {
            let e = scalar_in("t", "b", bad, beta, "in [0, 1)").unwrap_err();
            assert!(
                matches!(e, ComputeError::InvalidScalar { arg: "b", .. }),
                "{e}"
            );
        }
        assert!(scalar_in("t", "e", f64::MAX, (0.0, f64::MAX, false), "").is_ok());
        assert!(scalar_in("t", "e", f64::INFINITY, (0.0, f64::INFINITY, false), "").is_err());
    }
}
