//! `Tensor<S>`: a storage handle plus a layout. View ops live here, independent of the backend,
//! because they only rewrite the layout; anything that touches data goes through a `Backend`.

use crate::element::DType;
use crate::element::Element;
use crate::error::{ComputeError, Result};
use crate::layout::{Layout, checked_numel};
use crate::storage::{CpuStorage, Storage};

/// A strided view over shared storage. Invariant: every index the layout reaches is inside the
/// storage (checked in `from_parts`, preserved by every view op), so backends index freely.
#[derive(Clone, Debug)]
pub struct Tensor<S: Storage> {
    storage: S,
    layout: Layout,
}

/// A tensor in host memory.
pub type CpuTensor<T> = Tensor<CpuStorage<T>>;

impl<S: Storage> Tensor<S> {
    /// Pairs a storage with a layout, refusing layouts that reach past the storage.
    pub fn from_parts(storage: S, layout: Layout) -> Result<Self> {
        if let Some(max) = layout.max_offset()
            && max >= storage.len()
        {
            return Err(ComputeError::OutOfStorage {
                needed: max + 1,
                len: storage.len(),
            });
        }
        Ok(Tensor { storage, layout })
    }

    #[must_use]
    pub fn storage(&self) -> &S {
        &self.storage
    }

    #[must_use]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    #[must_use]
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    #[must_use]
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    #[must_use]
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    #[must_use]
    pub fn dtype(&self) -> DType {
        S::Elem::DTYPE
    }

    #[must_use]
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// Whether both tensors view the same buffer.
    #[must_use]
    pub fn shares_storage(&self, other: &Self) -> bool {
        self.storage.same_buffer(&other.storage)
    }

    fn with_layout(&self, layout: Layout) -> Self {
        // Every caller derives `layout` from `self.layout` by a view op that stays inside it.
        Tensor {
            storage: self.storage.clone(),
            layout,
        }
    }

    /// View with a new shape; the layout must be contiguous (`NotContiguous` otherwise).
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        Ok(self.with_layout(self.layout.reshape(shape)?))
    }

    /// View with axes reordered: axis `i` of the result is axis `perm[i]` of `self`.
    pub fn permute(&self, perm: &[usize]) -> Result<Self> {
        Ok(self.with_layout(self.layout.permute(perm)?))
    }

    /// View with two axes swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self> {
        Ok(self.with_layout(self.layout.transpose(a, b)?))
    }

    /// View of `len` entries of `axis` from `start`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        Ok(self.with_layout(self.layout.narrow(axis, start, len)?))
    }

    /// Views of consecutive pieces of `axis` with the given sizes, which must add up to the
    /// axis size (as `torch.split` with a list).
    pub fn split(&self, axis: usize, sizes: &[usize]) -> Result<Vec<Self>> {
        self.layout.check_axis("split", axis)?;
        let size = self.shape()[axis];
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(size) {
            return Err(ComputeError::LengthMismatch {
                op: "split",
                expected: size,
                got: total.unwrap_or(usize::MAX),
            });
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let piece = self.narrow(axis, start, len);
                start += len;
                piece
            })
            .collect()
    }

    /// Broadcast view (stride 0 on new or size-1 axes). Read-only in effect: writing into it is
    /// refused as an overlapping destination.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Self> {
        Ok(self.with_layout(self.layout.broadcast_to(shape)?))
    }

    /// View with a size-1 axis inserted before `axis`.
    pub fn unsqueeze(&self, axis: usize) -> Result<Self> {
        Ok(self.with_layout(self.layout.unsqueeze(axis)?))
    }
}

impl<T: Element> CpuTensor<T> {
    /// A dense tensor over `data` (row-major), which must hold exactly `numel(shape)` elements.
    pub fn from_vec(data: Vec<T>, shape: &[usize]) -> Result<Self> {
        let expected = checked_numel("from_vec", shape)?;
        if data.len() != expected {
            return Err(ComputeError::LengthMismatch {
                op: "from_vec",
                expected,
                got: data.len(),
            });
        }
        Ok(Tensor {
            storage: CpuStorage::from_vec(data),
            layout: Layout::contiguous(shape),
        })
    }

    /// A rank-0 tensor.
    #[must_use]
    pub fn scalar(value: T) -> Self {
        Tensor {
            storage: CpuStorage::from_vec(vec![value]),
            layout: Layout::contiguous(&[]),
        }
    }

    /// The elements in logical row-major order (a gather for strided views).
    #[must_use]
    pub fn to_vec(&self) -> Vec<T> {
        let data = self.storage.read();
        let l = &self.layout;
        if l.numel() == 0 {
            Vec::new()
        } else if l.is_contiguous() {
            data[l.offset()..l.offset() + l.numel()].to_vec()
        } else {
            l.offsets().map(|o| data[o]).collect()
        }
    }
}
