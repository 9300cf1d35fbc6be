//! Storage: the flat buffer behind a tensor. A tensor is `Storage + Layout`; views share the
//! storage and differ in layout. The CPU storage lives here; a device storage (a zmem `Block`
//! with its allocation class) implements the same trait in the CUDA backend.
//!
//! Storage is shared and mutable through any handle, as device memory is: an in-place op on a
//! view (fill, copy into a narrow, an optimiser step) is seen by every tensor over that storage.

use crate::element::Element;
use std::fmt::Debug;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A flat buffer of `Elem`s that tensors view through layouts.
pub trait Storage: Clone + Debug + Send + Sync {
    type Elem: Element;

    /// Number of elements the buffer holds.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether two handles refer to the same buffer (used to refuse aliased in-place ops).
    fn same_buffer(&self, other: &Self) -> bool;
}

/// Host memory: a `Vec` behind an `Arc<RwLock>`. The lock is there for soundness of shared
/// mutation without `unsafe`; ops take it once per call, never per element. The last handle
/// to a large buffer hands it to the host pool for reuse (`host_pool`).
#[derive(Clone, Debug)]
pub struct CpuStorage<T: Element> {
    data: Arc<RwLock<Vec<T>>>,
}

impl<T: Element> Drop for CpuStorage<T> {
    fn drop(&mut self) {
        if let Some(lock) = Arc::get_mut(&mut self.data) {
            let v = std::mem::take(lock.get_mut().unwrap_or_else(PoisonError::into_inner));
            crate::host_pool::give(v);
        }
    }
}

impl<T: Element> CpuStorage<T> {
    #[must_use]
    pub fn from_vec(data: Vec<T>) -> Self {
        CpuStorage {
            data: Arc::new(RwLock::new(data)),
        }
    }

    // A poisoned lock only means a panic elsewhere while it was held; the data is plain numbers
    // with no invariant to break, so we keep going rather than propagate the panic.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Vec<T>> {
        self.data.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Vec<T>> {
        self.data.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Element> Storage for CpuStorage<T> {
    type Elem = T;

    fn len(&self) -> usize {
        self.read().len()
    }

    fn same_buffer(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
    }
}
