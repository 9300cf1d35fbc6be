//! `ParameterSet`: a model's parameters in ONE flat persistent buffer and their gradients in
//! another, each parameter a view (`narrow` + `reshape`) of both at the same offset. Offsets
//! are padded to [`FLAT_ALIGN`] elements (256 bytes in f32) so vectorised kernels stay aligned;
//! the padding is zero and stays zero (only the views write into the buffers, and every
//! whole-buffer op keeps zeros zero: zeroing, clipping, AdamW with a zero gradient and a zero
//! parameter). Whole-model work then costs a fixed number of launches whatever the parameter
//! count: zero_grad one memset, the global gradient norm two launches, clipping one, AdamW one.
//!
//! The gradient buffer's allocation holds one more aligned block after the last parameter's
//! padding: its first element is the data-parallel step's loss slot ([`ParameterSet::loss_slot`]).
//! Nothing of the set reads or writes that block (`grads` ends before it), so the norm, clipping
//! and AdamW never see the loss, and nothing has to zero the slot again before them. The
//! data-parallel collective (issue 13) all-reduces [`ParameterSet::reduced`]: the gradients and
//! the slot, one buffer.
//!
//! The optimiser utilities (`zero_grad`, `grad_norm`, `clip_grad_norm`, `AdamW`) take a list of
//! parameters as before and recognise, with [`ParameterSet::of`], a list that is exactly a
//! set's views in order; any other list (separately allocated parameters, a subset, a model
//! with a parameter replaced) takes the per-tensor path.

use crate::error::{GradError, Result};
use crate::memory::ClassGuard;
use crate::var::Var;
use zcompute::{AllocClass, BTensor, Element, Layout, Storage, Tensor, prelude::*};

/// Elements every parameter's offset in a flat buffer is a multiple of (64 f32 = 256 bytes).
pub const FLAT_ALIGN: usize = 64;

/// Elements the gradient buffer's allocation holds after the set's `len`: one aligned block,
/// whose first element is the loss slot (see the module docs).
pub const GRAD_TAIL: usize = FLAT_ALIGN;

/// `numel` rounded up to [`FLAT_ALIGN`]: the room a parameter takes in a flat buffer.
#[must_use]
pub fn padded(numel: usize) -> usize {
    numel.div_ceil(FLAT_ALIGN) * FLAT_ALIGN
}

/// Offsets of parameters of these shapes in a flat buffer, and the buffer's length.
#[must_use]
pub fn flat_layout(shapes: &[Vec<usize>]) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(shapes.len());
    let mut next = 0;
    for shape in shapes {
        offsets.push(next);
        next += padded(shape.iter().product());
    }
    (offsets, next)
}

/// The flat parameter and gradient buffers of a list of parameters (see the module docs).
/// Cloning shares the buffers.
pub struct ParameterSet<B: Ops<T>, T: Element> {
    values: BTensor<B, T>,
    grads: BTensor<B, T>,
    offsets: Vec<usize>,
    shapes: Vec<Vec<usize>>,
}

impl<B: Ops<T>, T: Element> Clone for ParameterSet<B, T> {
    fn clone(&self) -> Self {
        ParameterSet {
            values: self.values.clone(),
            grads: self.grads.clone(),
            offsets: self.offsets.clone(),
            shapes: self.shapes.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for ParameterSet<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParameterSet")
            .field("parameters", &self.offsets.len())
            .field("len", &self.len())
            .finish()
    }
}

impl<B: Ops<T>, T: Element> ParameterSet<B, T> {
    /// Allocates the two flat buffers (persistent) for parameters of `shapes` and returns the
    /// set with one trainable leaf per shape, in order. `values` holds each parameter's data
    /// (row-major, one entry per shape) and is uploaded in one copy; `None` leaves every
    /// parameter zero (no host data at all, for memory plans). Gradients start at zero.
    pub fn allocate(
        b: &B,
        shapes: &[Vec<usize>],
        values: Option<&[Vec<T>]>,
    ) -> Result<(Self, Vec<Var<B, T>>)> {
        let (offsets, len) = flat_layout(shapes);
        if let Some(values) = values {
            let sizes_match = values.len() == shapes.len()
                && values
                    .iter()
                    .zip(shapes)
                    .all(|(v, s)| v.len() == s.iter().product::<usize>());
            if !sizes_match {
                return Err(GradError::BadInput(format!(
                    "parameter data does not match the shapes {shapes:?}"
                )));
            }
        }
        let _class = ClassGuard::new(b, AllocClass::Persistent);
        let values_t = match values {
            Some(values) => {
                let mut host = vec![T::ZERO; len];
                for (v, &off) in values.iter().zip(&offsets) {
                    host[off..off + v.len()].copy_from_slice(v);
                }
                b.upload(&host, &[len])?
            }
            None => b.zeros(&[len])?,
        };
        let set = ParameterSet {
            values: values_t,
            grads: b.zeros(&[len + GRAD_TAIL])?.narrow(0, 0, len)?,
            offsets,
            shapes: shapes.to_vec(),
        };
        let (values, grads) = (set.views_of(&set.values)?, set.views_of(&set.grads)?);
        let vars = values
            .into_iter()
            .zip(grads)
            .map(|(v, g)| Var::parameter_view(v, g))
            .collect::<Result<Vec<_>>>()?;
        Ok((set, vars))
    }

    /// The set whose views `params` are, exactly and in order: every value a contiguous view
    /// of one buffer, every gradient the view at the same offset of another, offsets packed as
    /// [`flat_layout`] lays them out and covering the values' buffer to its end and the
    /// gradients' to its tail ([`GRAD_TAIL`]). `None` for any other list (the callers then work
    /// per tensor).
    #[must_use]
    pub fn of(params: &[Var<B, T>]) -> Option<Self> {
        let first = params.first()?;
        let (v0, g0) = (first.value(), first.grad()?);
        let len = v0.storage().len();
        if g0.storage().len() != len + GRAD_TAIL || v0.shares_storage(g0) {
            return None;
        }
        let mut offsets = Vec::with_capacity(params.len());
        let mut next = 0;
        for p in params {
            let (v, g) = (p.value(), p.grad()?);
            let same_buffers = v.shares_storage(v0) && g.shares_storage(g0);
            let off = v.layout().offset();
            let in_place = off == next && g.layout().offset() == off && g.numel() == v.numel();
            if !(same_buffers && in_place && v.is_contiguous() && g.is_contiguous()) {
                return None;
            }
            offsets.push(off);
            next = off + padded(v.numel());
        }
        if next != len {
            return None;
        }
        let whole = |t: &BTensor<B, T>| {
            Tensor::from_parts(t.storage().clone(), Layout::contiguous(&[len])).ok()
        };
        Some(ParameterSet {
            values: whole(v0)?,
            grads: whole(g0)?,
            offsets,
            shapes: params.iter().map(|p| p.shape().to_vec()).collect(),
        })
    }

    /// Whether `params` are exactly this set's views, in order (the same buffers).
    #[must_use]
    pub fn holds(&self, params: &[Var<B, T>]) -> bool {
        Self::of(params).is_some_and(|s| {
            s.values.shares_storage(&self.values)
                && s.grads.shares_storage(&self.grads)
                && s.offsets == self.offsets
        })
    }

    /// The flat parameter buffer `[len]` (padding included).
    #[must_use]
    pub fn values(&self) -> &BTensor<B, T> {
        &self.values
    }

    /// The flat gradient buffer `[len]` (padding included, zero), without its tail.
    #[must_use]
    pub fn grads(&self) -> &BTensor<B, T> {
        &self.grads
    }

    /// What the data-parallel collective sums: the gradient buffer and the loss slot after it,
    /// `[len + 1]` (a view of the same allocation).
    pub fn reduced(&self) -> Result<BTensor<B, T>> {
        Ok(Tensor::from_parts(
            self.grads.storage().clone(),
            Layout::contiguous(&[self.len() + 1]),
        )?)
    }

    /// The loss slot, `[1]`: the first element of the gradient buffer's tail, summed with the
    /// gradients by the collective and read by no optimiser utility (see the module docs).
    pub fn loss_slot(&self) -> Result<BTensor<B, T>> {
        Ok(self.reduced()?.narrow(0, self.len(), 1)?)
    }

    /// Elements of each flat buffer, padding included.
    #[must_use]
    pub fn len(&self) -> usize {
        self.values.numel()
    }

    /// Whether the set holds no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each parameter's offset in the flat buffers, in order.
    #[must_use]
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Each parameter's shape, in order.
    #[must_use]
    pub fn shapes(&self) -> &[Vec<usize>] {
        &self.shapes
    }

    /// Per-parameter views (shaped) of a flat buffer laid out as this set (`flat` is `[len]`):
    /// the parameters' views of `values()`, or of AdamW's flat moments.
    pub fn views_of(&self, flat: &BTensor<B, T>) -> Result<Vec<BTensor<B, T>>> {
        if flat.shape() != [self.len()] {
            return Err(GradError::BadInput(format!(
                "a flat buffer of this set is [{}], got {:?}",
                self.len(),
                flat.shape()
            )));
        }
        self.offsets
            .iter()
            .zip(&self.shapes)
            .map(|(&off, shape)| {
                let n = shape.iter().product();
                Ok(flat.narrow(0, off, n)?.reshape(shape)?)
            })
            .collect()
    }

    /// Zeroes every gradient: one fill of the flat gradient buffer.
    pub fn zero_grad(&self, b: &B) -> Result<()> {
        b.fill(&self.grads, T::ZERO)?;
        Ok(())
    }

    /// The global gradient norm, rank 0, in the backend's fused norm (two launches on the GPU).
    pub fn grad_norm(&self, b: &B) -> Result<BTensor<B, T>> {
        Ok(b.norm2(&self.grads)?)
    }

    /// Clips the gradients to `max_norm` (PyTorch's `clip_grad_norm_`) and returns the norm
    /// before clipping: the norm's launches and one scaling of the flat buffer, with the
    /// coefficient computed on the device.
    pub fn clip_grad_norm(&self, b: &B, max_norm: T) -> Result<BTensor<B, T>> {
        let norm = self.grad_norm(b)?;
        b.clip_scale(&self.grads, &norm, max_norm)?;
        Ok(norm)
    }
}
