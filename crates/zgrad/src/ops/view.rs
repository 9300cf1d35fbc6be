//! Views (reshape, permute, transpose, narrow, split, broadcast, unsqueeze) and `contiguous`,
//! with their backward. A view shares its input's data and therefore its version counter.

use super::{reshape_any, sum_to_shape};
use crate::error::Result;
use crate::tape::{BackwardOp, Tape};
use crate::var::Var;
use zcompute::{BTensor, Element, prelude::*};

type Grads<B, T> = Vec<Option<BTensor<B, T>>>;

enum ViewKind {
    Reshape,
    Permute(Vec<usize>),
    Transpose(usize, usize),
    Narrow { axis: usize, start: usize },
    Broadcast,
    Unsqueeze,
    Contiguous,
}

fn view_name(kind: &ViewKind) -> &'static str {
    match kind {
        ViewKind::Reshape => "reshape",
        ViewKind::Permute(_) => "permute",
        ViewKind::Transpose(..) => "transpose",
        ViewKind::Narrow { .. } => "narrow",
        ViewKind::Broadcast => "broadcast_to",
        ViewKind::Unsqueeze => "unsqueeze",
        ViewKind::Contiguous => "contiguous",
    }
}

struct ViewBackward {
    kind: ViewKind,
    in_shape: Vec<usize>,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for ViewBackward {
    fn name(&self) -> &'static str {
        view_name(&self.kind)
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = super::only(grads)?;
        let gx = match &self.kind {
            ViewKind::Reshape | ViewKind::Unsqueeze => reshape_any(b, g, &self.in_shape)?,
            ViewKind::Permute(perm) => {
                let mut inverse = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inverse[p] = i;
                }
                g.permute(&inverse)?
            }
            ViewKind::Transpose(x, y) => g.transpose(*x, *y)?,
            ViewKind::Narrow { axis, start } => {
                let full = b.zeros(&self.in_shape)?;
                let window = full.narrow(*axis, *start, g.shape()[*axis])?;
                b.copy_into(g, &window)?;
                full
            }
            ViewKind::Broadcast => sum_to_shape(b, g.clone(), &self.in_shape)?,
            ViewKind::Contiguous => g.clone(),
        };
        Ok(vec![Some(gx)])
    }
}

/// The pieces of a split write their gradients into one buffer (missing pieces stay zero).
struct SplitBackward {
    axis: usize,
    sizes: Vec<usize>,
    in_shape: Vec<usize>,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for SplitBackward {
    fn name(&self) -> &'static str {
        "split"
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let full = b.zeros(&self.in_shape)?;
        let mut start = 0;
        for (g, &len) in grads.iter().zip(&self.sizes) {
            if let Some(g) = g {
                b.copy_into(g, &full.narrow(self.axis, start, len)?)?;
            }
            start += len;
        }
        Ok(vec![Some(full)])
    }
}

impl<'b, B: Ops<T>, T: Element> Tape<'b, B, T> {
    fn view(
        &self,
        x: &Var<B, T>,
        kind: ViewKind,
        f: impl FnOnce(&BTensor<B, T>) -> zcompute::Result<BTensor<B, T>>,
    ) -> Result<Var<B, T>> {
        let tracked = self.tracks(view_name(&kind), &[x])?;
        let y = f(&x.value)?;
        if !tracked {
            return Ok(Var {
                value: y,
                origin: crate::var::Origin::Constant,
                version: x.version.clone(),
            });
        }
        let node = ViewBackward {
            kind,
            in_shape: x.shape().to_vec(),
        };
        Ok(self.push1(Box::new(node), &[x], y, x.version.clone()))
    }

    /// View with a new shape (the input must be contiguous; see `contiguous`).
    pub fn reshape(&self, x: &Var<B, T>, shape: &[usize]) -> Result<Var<B, T>> {
        self.view(x, ViewKind::Reshape, |t| t.reshape(shape))
    }

    /// View with axes reordered: axis `i` of the result is axis `perm[i]` of `x`.
    pub fn permute(&self, x: &Var<B, T>, perm: &[usize]) -> Result<Var<B, T>> {
        self.view(x, ViewKind::Permute(perm.to_vec()), |t| t.permute(perm))
    }

    pub fn transpose(&self, x: &Var<B, T>, a: usize, b: usize) -> Result<Var<B, T>> {
        self.view(x, ViewKind::Transpose(a, b), |t| t.transpose(a, b))
    }

    pub fn narrow(
        &self,
        x: &Var<B, T>,
        axis: usize,
        start: usize,
        len: usize,
    ) -> Result<Var<B, T>> {
        self.view(x, ViewKind::Narrow { axis, start }, |t| {
            t.narrow(axis, start, len)
        })
    }

    pub fn broadcast_to(&self, x: &Var<B, T>, shape: &[usize]) -> Result<Var<B, T>> {
        self.view(x, ViewKind::Broadcast, |t| t.broadcast_to(shape))
    }

    pub fn unsqueeze(&self, x: &Var<B, T>, axis: usize) -> Result<Var<B, T>> {
        self.view(x, ViewKind::Unsqueeze, |t| t.unsqueeze(axis))
    }

    /// A dense copy (the way to reshape a permuted or narrowed view).
    pub fn contiguous(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        let tracked = self.tracks("contiguous", &[x])?;
        let y = self.run(tracked, |b| b.contiguous(&x.value))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let node = ViewBackward {
            kind: ViewKind::Contiguous,
            in_shape: x.shape().to_vec(),
        };
        Ok(self.push1(Box::new(node), &[x], y, self.new_version()))
    }

    /// Consecutive pieces of `axis` with the given sizes (one node, several outputs).
    pub fn split(&self, x: &Var<B, T>, axis: usize, sizes: &[usize]) -> Result<Vec<Var<B, T>>> {
        let tracked = self.tracks("split", &[x])?;
        let pieces = x.value.split(axis, sizes)?;
        if !tracked {
            return Ok(pieces
                .into_iter()
                .map(|value| Var {
                    value,
                    origin: crate::var::Origin::Constant,
                    version: x.version.clone(),
                })
                .collect());
        }
        let node = SplitBackward {
            axis,
            sizes: sizes.to_vec(),
            in_shape: x.shape().to_vec(),
        };
        let outputs = pieces.into_iter().map(|p| (p, x.version.clone())).collect();
        Ok(self.push(Box::new(node), &[x], outputs))
    }
}
