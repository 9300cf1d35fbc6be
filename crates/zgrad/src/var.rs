//! `Var`: a tensor plus where its gradient goes. Constants have no gradient; leaves
//! (parameters) own a persistent gradient buffer that backward accumulates into; every other
//! variable was produced by an op recorded on a tape.
//!
//! Every variable carries a version counter, shared with the views of the same data. Writes in
//! place through zgrad (`fill`, `copy_from`, `upload`, optimiser steps) bump it; a saved tensor
//! remembers the version it was saved at, so backward notices a write that happened after.

use crate::error::Result;
use crate::memory::ClassGuard;
use std::cell::Cell;
use std::rc::Rc;
use zcompute::{AllocClass, BTensor, Element, prelude::*};

/// A version counter shared by a variable and its views.
pub(crate) type Version = Rc<Cell<u64>>;

pub(crate) fn new_version() -> Version {
    Rc::new(Cell::new(0))
}

/// Where a variable's gradient goes.
pub(crate) enum Origin<B: Ops<T>, T: Element> {
    /// No gradient (inputs, detached values, no-grad results).
    Constant,
    /// A parameter: backward accumulates into this persistent buffer of the same shape.
    Leaf(BTensor<B, T>),
    /// Output `slot` of node `id` on tape `tape`.
    Node { tape: u64, id: usize, slot: usize },
}

impl<B: Ops<T>, T: Element> Clone for Origin<B, T> {
    fn clone(&self) -> Self {
        match self {
            Origin::Constant => Origin::Constant,
            Origin::Leaf(g) => Origin::Leaf(g.clone()),
            Origin::Node { tape, id, slot } => Origin::Node {
                tape: *tape,
                id: *id,
                slot: *slot,
            },
        }
    }
}

/// A tensor in the autograd graph. Cloning is cheap and shares the data, the gradient buffer
/// and the version counter.
pub struct Var<B: Ops<T>, T: Element> {
    pub(crate) value: BTensor<B, T>,
    pub(crate) origin: Origin<B, T>,
    pub(crate) version: Version,
}

impl<B: Ops<T>, T: Element> Clone for Var<B, T> {
    fn clone(&self) -> Self {
        Var {
            value: self.value.clone(),
            origin: self.origin.clone(),
            version: self.version.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for Var<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let origin = match &self.origin {
            Origin::Constant => "constant".to_string(),
            Origin::Leaf(_) => "leaf".to_string(),
            Origin::Node { tape, id, slot } => format!("tape {tape} node {id}.{slot}"),
        };
        f.debug_struct("Var")
            .field("shape", &self.value.shape())
            .field("origin", &origin)
            .field("version", &self.version.get())
            .finish()
    }
}

impl<B: Ops<T>, T: Element> Var<B, T> {
    /// A value that needs no gradient (an input, a label, a detached result).
    #[must_use]
    pub fn constant(value: BTensor<B, T>) -> Self {
        Var {
            value,
            origin: Origin::Constant,
            version: new_version(),
        }
    }

    /// A trainable leaf: `value` plus a zeroed gradient buffer of the same shape, allocated in
    /// the persistent class (it outlives every step).
    pub fn parameter(backend: &B, value: BTensor<B, T>) -> Result<Self> {
        let grad = {
            let _class = ClassGuard::new(backend, AllocClass::Persistent);
            backend.zeros(value.shape())?
        };
        Ok(Var {
            value,
            origin: Origin::Leaf(grad),
            version: new_version(),
        })
    }

    /// A trainable leaf over given storage: `value` and its gradient buffer `grad` (same shape,
    /// other memory), both views the caller keeps zeroed or filled; `ParameterSet` makes its
    /// parameters this way, as views of its flat buffers.
    pub fn parameter_view(value: BTensor<B, T>, grad: BTensor<B, T>) -> Result<Self> {
        if value.shape() != grad.shape() {
            return Err(crate::error::GradError::BadInput(format!(
                "a parameter's gradient must have its shape {:?}, got {:?}",
                value.shape(),
                grad.shape()
            )));
        }
        if value.shares_storage(&grad) {
            return Err(crate::error::GradError::BadInput(
                "a parameter's gradient must not share the parameter's memory".into(),
            ));
        }
        Ok(Var {
            value,
            origin: Origin::Leaf(grad),
            version: new_version(),
        })
    }

    /// Uploads `data` as a persistent trainable leaf of `shape`.
    pub fn parameter_from(backend: &B, data: &[T], shape: &[usize]) -> Result<Self> {
        let value = {
            let _class = ClassGuard::new(backend, AllocClass::Persistent);
            backend.upload(data, shape)?
        };
        Self::parameter(backend, value)
    }

    /// The tensor.
    #[must_use]
    pub fn value(&self) -> &BTensor<B, T> {
        &self.value
    }

    #[must_use]
    pub fn shape(&self) -> &[usize] {
        self.value.shape()
    }

    /// Whether backward will compute a gradient for this variable.
    #[must_use]
    pub fn requires_grad(&self) -> bool {
        !matches!(self.origin, Origin::Constant)
    }

    /// Whether this is a trainable leaf (a parameter).
    #[must_use]
    pub fn is_leaf(&self) -> bool {
        matches!(self.origin, Origin::Leaf(_))
    }

    /// The accumulated gradient of a leaf (`None` for other variables).
    #[must_use]
    pub fn grad(&self) -> Option<&BTensor<B, T>> {
        match &self.origin {
            Origin::Leaf(g) => Some(g),
            _ => None,
        }
    }

    /// The same data as a constant: backward stops here. Shares the version counter.
    #[must_use]
    pub fn detach(&self) -> Self {
        Var {
            value: self.value.clone(),
            origin: Origin::Constant,
            version: self.version.clone(),
        }
    }

    /// How many in-place writes went through zgrad into this data.
    #[must_use]
    pub fn version(&self) -> u64 {
        self.version.get()
    }

    /// Records an in-place write done outside zgrad's own methods (say, a fused kernel).
    pub fn bump_version(&self) {
        self.version.set(self.version.get() + 1);
    }

    /// Writes `value` into every element, in place.
    pub fn fill(&self, backend: &B, value: T) -> Result<()> {
        backend.fill(&self.value, value)?;
        self.bump_version();
        Ok(())
    }

    /// Copies `src` (same shape) into this variable's data, in place.
    pub fn copy_from(&self, backend: &B, src: &BTensor<B, T>) -> Result<()> {
        backend.copy_into(src, &self.value)?;
        self.bump_version();
        Ok(())
    }

    /// Writes host `data` (logical row-major order) into this variable's data, in place.
    pub fn upload(&self, backend: &B, data: &[T]) -> Result<()> {
        backend.upload_into(data, &self.value)?;
        self.bump_version();
        Ok(())
    }

    /// Downloads the value to the host (row-major).
    pub fn to_vec(&self, backend: &B) -> Result<Vec<T>> {
        Ok(backend.download(&self.value)?)
    }

    /// Sets a leaf's gradient to zero (nothing for other variables).
    pub fn zero_grad(&self, backend: &B) -> Result<()> {
        if let Origin::Leaf(g) = &self.origin {
            backend.fill(g, T::ZERO)?;
        }
        Ok(())
    }
}
