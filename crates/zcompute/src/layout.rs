//! `Layout`: how a logical N-d index maps to an element of flat storage
//! (`offset + sum(index[i] * strides[i])`, in elements). Every view (reshape, permute, narrow,
//! broadcast) is a pure function from one layout to another and never touches data, so the same
//! view logic serves CPU storage now and device storage later.

use crate::error::{ComputeError, Result};
use smallvec::SmallVec;

/// Inline capacity for shapes and strides: the models we train (attention's head split
/// included) never go past rank 5, so a rank-6 buffer keeps every layout off the heap.
pub const INLINE_RANK: usize = 6;

/// A shape or a stride vector (in elements).
pub type Dims = SmallVec<[usize; INLINE_RANK]>;

/// Shape, strides (in elements; 0 means broadcast) and the offset of element `[0, ..., 0]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Dims,
    strides: Dims,
    offset: usize,
}

/// Row-major strides for `shape` (the last axis has stride 1).
#[must_use]
pub fn contiguous_strides(shape: &[usize]) -> Dims {
    let mut strides: Dims = SmallVec::from_elem(0, shape.len());
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
    }
    strides
}

/// Number of elements of `shape`, refusing shapes whose size overflows `usize`.
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| ComputeError::SizeOverflow {
            op,
            shape: shape.into(),
        })
}

/// The NumPy broadcast of two shapes: align on the right; each pair of sizes must be equal or
/// contain a 1.
pub fn broadcast_shapes(op: &'static str, lhs: &[usize], rhs: &[usize]) -> Result<Dims> {
    let rank = lhs.len().max(rhs.len());
    let mut out: Dims = SmallVec::from_elem(1, rank);
    for i in 0..rank {
        let a = if i < lhs.len() {
            lhs[lhs.len() - 1 - i]
        } else {
            1
        };
        let b = if i < rhs.len() {
            rhs[rhs.len() - 1 - i]
        } else {
            1
        };
        out[rank - 1 - i] = match (a, b) {
            (a, b) if a == b => a,
            (1, b) => b,
            (a, 1) => a,
            _ => {
                return Err(ComputeError::NotBroadcastable {
                    op,
                    lhs: lhs.into(),
                    rhs: rhs.into(),
                });
            }
        };
    }
    Ok(out)
}

impl Layout {
    /// A dense row-major layout at offset 0.
    #[must_use]
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: shape.into(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// An arbitrary strided layout (shape and strides must have the same length).
    pub fn new(shape: &[usize], strides: &[usize], offset: usize) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(ComputeError::ShapeMismatch {
                op: "layout",
                lhs: shape.into(),
                rhs: strides.into(),
            });
        }
        Ok(Layout {
            shape: shape.into(),
            strides: strides.into(),
            offset,
        })
    }

    #[must_use]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    #[must_use]
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    #[must_use]
    pub fn offset(&self) -> usize {
        self.offset
    }

    #[must_use]
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of logical elements (1 for rank 0).
    #[must_use]
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the elements are dense and row-major from `offset`, so the view is the storage
    /// slice `offset..offset + numel`. Axes of size 1 may carry any stride.
    #[must_use]
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// The largest storage index the view touches, or `None` for an empty view.
    #[must_use]
    pub fn max_offset(&self) -> Option<usize> {
        if self.numel() == 0 {
            return None;
        }
        let span = self
            .shape
            .iter()
            .zip(&self.strides)
            .try_fold(0usize, |acc, (&d, &s)| {
                acc.checked_add((d - 1).checked_mul(s)?)
            })?;
        self.offset.checked_add(span)
    }

    /// Storage index of one logical index, or `None` if the index is out of range.
    #[must_use]
    pub fn offset_of(&self, index: &[usize]) -> Option<usize> {
        if index.len() != self.rank() {
            return None;
        }
        let mut off = self.offset;
        for ((&i, &d), &s) in index.iter().zip(&self.shape).zip(&self.strides) {
            if i >= d {
                return None;
            }
            off += i * s;
        }
        Some(off)
    }

    /// The same elements under a new shape. Only contiguous layouts can be reshaped as views;
    /// anything else needs an explicit `contiguous` copy first, so a copy is never hidden.
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        let to_numel = checked_numel("reshape", shape)?;
        if to_numel != self.numel() {
            return Err(ComputeError::ReshapeNumel {
                from: self.shape[..].into(),
                to: shape.into(),
                from_numel: self.numel(),
                to_numel,
            });
        }
        if !self.is_contiguous() {
            return Err(self.not_contiguous("reshape"));
        }
        Ok(Layout {
            shape: shape.into(),
            strides: contiguous_strides(shape),
            offset: self.offset,
        })
    }

    /// Reorders axes: axis `i` of the result is axis `perm[i]` of `self`.
    pub fn permute(&self, perm: &[usize]) -> Result<Self> {
        let rank = self.rank();
        let mut seen: SmallVec<[bool; INLINE_RANK]> = SmallVec::from_elem(false, rank);
        let valid = perm.len() == rank
            && perm
                .iter()
                .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(ComputeError::InvalidPermutation {
                perm: perm.into(),
                rank,
            });
        }
        Ok(Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    /// Swaps two axes.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self> {
        self.check_axis("transpose", a)?;
        self.check_axis("transpose", b)?;
        let mut out = self.clone();
        out.shape.swap(a, b);
        out.strides.swap(a, b);
        Ok(out)
    }

    /// Keeps `len` entries of `axis` starting at `start`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        self.check_axis("narrow", axis)?;
        let size = self.shape[axis];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(ComputeError::NarrowOutOfRange {
                axis,
                start,
                len,
                size,
            });
        }
        let mut out = self.clone();
        out.shape[axis] = len;
        // An empty narrow keeps the offset where it is, so it never points past the storage.
        if len > 0 {
            out.offset += start * self.strides[axis];
        }
        Ok(out)
    }

    /// Views `self` as `shape` under NumPy broadcasting: new leading axes and size-1 axes get
    /// stride 0.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Self> {
        let err = || ComputeError::NotBroadcastable {
            op: "broadcast_to",
            lhs: self.shape[..].into(),
            rhs: shape.into(),
        };
        if shape.len() < self.rank() {
            return Err(err());
        }
        let lead = shape.len() - self.rank();
        let mut strides: Dims = SmallVec::from_elem(0, shape.len());
        for (i, (&d, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
            let target = shape[lead + i];
            if d == target {
                strides[lead + i] = s;
            } else if d != 1 {
                return Err(err());
            }
        }
        Ok(Layout {
            shape: shape.into(),
            strides,
            offset: self.offset,
        })
    }

    /// Inserts an axis of size 1 before `axis` (`axis == rank` appends).
    pub fn unsqueeze(&self, axis: usize) -> Result<Self> {
        if axis > self.rank() {
            return Err(ComputeError::AxisOutOfRange {
                op: "unsqueeze",
                axis,
                rank: self.rank(),
            });
        }
        let mut out = self.clone();
        let stride = self.strides.get(axis).map_or(1, |&s| s * self.shape[axis]);
        out.shape.insert(axis, 1);
        out.strides.insert(axis, stride);
        Ok(out)
    }

    /// Storage indices of every element, in logical row-major order.
    #[must_use]
    pub fn offsets(&self) -> Offsets<'_> {
        Offsets {
            layout: self,
            index: SmallVec::from_elem(0, self.rank()),
            next: self.offset,
            remaining: self.numel(),
        }
    }

    pub(crate) fn check_axis(&self, op: &'static str, axis: usize) -> Result<()> {
        if axis < self.rank() {
            Ok(())
        } else {
            Err(ComputeError::AxisOutOfRange {
                op,
                axis,
                rank: self.rank(),
            })
        }
    }

    pub(crate) fn not_contiguous(&self, op: &'static str) -> ComputeError {
        ComputeError::NotContiguous {
            op,
            shape: self.shape[..].into(),
            strides: self.strides[..].into(),
        }
    }
}

/// Iterator over a layout's storage indices (an odometer over the shape, last axis fastest).
#[derive(Debug, Clone)]
pub struct Offsets<'a> {
    layout: &'a Layout,
    index: Dims,
    next: usize,
    remaining: usize,
}

impl Iterator for Offsets<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        let current = self.next;
        self.remaining -= 1;
        if self.remaining > 0 {
            for ax in (0..self.layout.rank()).rev() {
                self.index[ax] += 1;
                self.next += self.layout.strides[ax];
                if self.index[ax] < self.layout.shape[ax] {
                    break;
                }
                self.next -= self.layout.strides[ax] * self.layout.shape[ax];
                self.index[ax] = 0;
            }
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Offsets<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(&[], &[])]
    #[case(&[7], &[1])]
    #[case(&[2, 3, 4], &[12, 4, 1])]
    #[case(&[3, 0, 2], &[0, 2, 1])]
    fn strides_are_row_major(#[case] shape: &[usize], #[case] strides: &[usize]) {
        assert_eq!(contiguous_strides(shape).as_slice(), strides);
    }

    #[rstest]
    #[case(&[3], &[3], Some(&[3][..]))]
    #[case(&[], &[2, 3], Some(&[2, 3][..]))]
    #[case(&[2, 1], &[1, 5], Some(&[2, 5][..]))]
    #[case(&[4, 1, 3], &[2, 1], Some(&[4, 2, 3][..]))]
    #[case(&[3], &[4], None)]
    #[case(&[2, 3], &[3, 3], None)]
    fn broadcast_table(#[case] a: &[usize], #[case] b: &[usize], #[case] out: Option<&[usize]>) {
        let got = broadcast_shapes("t", a, b).ok();
        assert_eq!(got.as_deref(), out);
        // Broadcasting is symmetric.
        assert_eq!(broadcast_shapes("t", b, a).ok().as_deref(), out);
    }

    #[test]
    fn contiguity_ignores_unit_axes_and_empty_views() {
        assert!(Layout::new(&[1, 3], &[99, 1], 4).unwrap().is_contiguous());
        assert!(
            !Layout::contiguous(&[2, 3])
                .transpose(0, 1)
                .unwrap()
                .is_contiguous()
        );
        assert!(Layout::new(&[2, 0], &[7, 7], 0).unwrap().is_contiguous());
        let row = Layout::contiguous(&[4, 5]).narrow(0, 2, 1).unwrap();
        assert!(row.is_contiguous());
        assert_eq!(row.offset(), 10);
        let col = Layout::contiguous(&[4, 5]).narrow(1, 2, 1).unwrap();
        assert!(!col.is_contiguous());
    }

    #[test]
    fn narrow_and_broadcast_offsets() {
        let l = Layout::contiguous(&[3, 4]).narrow(1, 1, 2).unwrap();
        assert_eq!(l.offsets().collect::<Vec<_>>(), vec![1, 2, 5, 6, 9, 10]);
        assert_eq!(l.max_offset(), Some(10));
        let b = Layout::contiguous(&[3]).broadcast_to(&[2, 3]).unwrap();
        assert_eq!(b.strides(), &[0, 1]);
        assert_eq!(b.offsets().collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2]);
        let empty = Layout::contiguous(&[3, 4]).narrow(0, 3, 0).unwrap();
        assert_eq!(empty.offsets().count(), 0);
        assert_eq!(empty.max_offset(), None);
    }

    #[test]
    fn unsqueeze_keeps_contiguity() {
        let l = Layout::contiguous(&[2, 3]);
        for axis in 0..=2 {
            let u = l.unsqueeze(axis).unwrap();
            assert!(u.is_contiguous(), "axis {axis}: {u:?}");
            assert_eq!(u.offsets().collect::<Vec<_>>(), (0..6).collect::<Vec<_>>());
        }
    }

    #[test]
    fn permute_then_inverse_is_identity() {
        let l = Layout::new(&[2, 3, 4], &[40, 1, 5], 3).unwrap();
        let p = l.permute(&[2, 0, 1]).unwrap();
        assert_eq!(p.shape(), &[4, 2, 3]);
        assert_eq!(p.permute(&[1, 2, 0]).unwrap(), l);
        assert_eq!(l.offset_of(&[1, 2, 3]), Some(3 + 40 + 2 + 15));
        assert_eq!(l.offset_of(&[2, 0, 0]), None);
    }
}
