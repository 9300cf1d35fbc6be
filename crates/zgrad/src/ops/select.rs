//! The ops models reach for beyond a layer's fused kernels (zcompute's `SelectOps` and
//! `RandomOps`, and composites of the op set), each with its backward: concat, where / masked
//! fill, abs, minimum and min, argmax (no gradient), SiLU, variance, RMSNorm, embedding,
//! attention with a key-padding mask, and dropout.

use super::{only, positive_mask, sum_to_shape};
use crate::error::Result;
use crate::tape::{BackwardOp, Saved, Tape};
use crate::var::Var;
use zcompute::{BTensor, Element, MatmulOpts, UnaryOp, prelude::*};

type Grads<B, T> = Vec<Option<BTensor<B, T>>>;

/// Each part's gradient is its window of the output's.
struct ConcatBackward {
    axis: usize,
    sizes: Vec<usize>,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for ConcatBackward {
    fn name(&self) -> &'static str {
        "concat"
    }

    fn backward(&self, _: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let mut start = 0;
        let mut out = Vec::with_capacity(self.sizes.len());
        for &len in &self.sizes {
            out.push(Some(g.narrow(self.axis, start, len)?));
            start += len;
        }
        Ok(out)
    }
}

/// `where(cond, a, b)`: the gradient goes to `a` where the mask holds, to `b` elsewhere.
struct SelectBackward<B: Ops<T>, T: Element> {
    cond: Saved<B, T>,
    shapes: [Vec<usize>; 2],
    needs: [bool; 2],
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for SelectBackward<B, T> {
    fn name(&self) -> &'static str {
        "select"
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let cond = self.cond.get("select")?;
        let zero = b.zeros(&[])?;
        let ga = if self.needs[0] {
            Some(sum_to_shape(b, b.select(cond, g, &zero)?, &self.shapes[0])?)
        } else {
            None
        };
        let gb = if self.needs[1] {
            Some(sum_to_shape(b, b.select(cond, &zero, g)?, &self.shapes[1])?)
        } else {
            None
        };
        Ok(vec![None, ga, gb])
    }
}

/// `|x|`: `g * sign(x)`, 0 at 0 (as PyTorch).
struct AbsBackward<B: Ops<T>, T: Element> {
    x: Saved<B, T>,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for AbsBackward<B, T> {
    fn name(&self) -> &'static str {
        "abs"
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let x = self.x.get("abs")?;
        let sign = b.sub(
            &positive_mask(b, x)?,
            &positive_mask(b, &b.unary(UnaryOp::Neg, x)?)?,
        )?;
        Ok(vec![Some(b.mul(g, &sign)?)])
    }
}

/// An embedding's table gradient: the output gradient's rows added at their indices, in index
/// order (zcompute's deterministic `index_add_rows`).
struct EmbeddingBackward<B: Ops<T>, T: Element> {
    index: Saved<B, T>,
    table_shape: Vec<usize>,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for EmbeddingBackward<B, T> {
    fn name(&self) -> &'static str {
        "embedding"
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let dst = b.zeros(&self.table_shape)?;
        self.add_rows(b, g, &dst)?;
        Ok(vec![Some(dst)])
    }

    fn backward_into(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Grads<B, T>> {
        match into.first().copied().flatten() {
            Some(buf) => {
                self.add_rows(b, only(grads)?, buf)?;
                Ok(vec![None])
            }
            None => self.backward(b, grads),
        }
    }
}

impl<B: Ops<T>, T: Element> EmbeddingBackward<B, T> {
    fn add_rows(&self, b: &B, g: &BTensor<B, T>, dst: &BTensor<B, T>) -> Result<()> {
        let g = if g.is_contiguous() {
            g.clone()
        } else {
            b.contiguous(g)?
        };
        Ok(b.index_add_rows(&g, self.index.get("embedding")?, dst)?)
    }
}

impl<'b, B: Ops<T>, T: Element> Tape<'b, B, T> {
    /// `parts` joined along `axis` (torch's `cat`); each part's gradient is its window of the
    /// output's.
    pub fn concat(&self, parts: &[&Var<B, T>], axis: usize) -> Result<Var<B, T>> {
        let tracked = self.tracks("concat", parts)?;
        let values: Vec<&BTensor<B, T>> = parts.iter().map(|p| &p.value).collect();
        let y = self.run(tracked, |b| b.concat(&values, axis))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let sizes = parts.iter().map(|p| p.shape()[axis]).collect();
        let node = ConcatBackward { axis, sizes };
        Ok(self.push1(Box::new(node), parts, y, self.new_version()))
    }

    /// `cond != 0 ? a : b` elementwise, broadcast (torch's `where` with a float mask; a NaN
    /// in the mask gives NaN). The mask gets no gradient.
    pub fn select(&self, cond: &Var<B, T>, a: &Var<B, T>, b: &Var<B, T>) -> Result<Var<B, T>> {
        let tracked = self.tracks("select", &[a, b])?;
        let y = self.run(tracked, |be| be.select(&cond.value, &a.value, &b.value))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let node = SelectBackward {
            cond: self.save(cond, "mask")?,
            shapes: [a.shape().to_vec(), b.shape().to_vec()],
            needs: [a.requires_grad(), b.requires_grad()],
        };
        Ok(self.push1(Box::new(node), &[cond, a, b], y, self.new_version()))
    }

    /// `x` with `value` where `mask != 0` (torch's `masked_fill`; `value` may be infinite).
    pub fn masked_fill(&self, x: &Var<B, T>, mask: &Var<B, T>, value: T) -> Result<Var<B, T>> {
        let fill = Var::constant(self.backend().full(&[], value)?);
        self.select(mask, &fill, x)
    }

    /// `|x|` (gradient `sign(x)`, 0 at 0, as PyTorch).
    pub fn abs(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        let tracked = self.tracks("abs", &[x])?;
        let y = self.run(tracked, |b| {
            let neg = b.unary(UnaryOp::Neg, &x.value)?;
            b.maximum(&x.value, &neg)
        })?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let node = AbsBackward {
            x: self.save(x, "input")?,
        };
        Ok(self.push1(Box::new(node), &[x], y, self.new_version()))
    }

    /// Elementwise minimum, `-max(-a, -b)` (exact; NaN propagates; ties share the gradient
    /// half and half, as `torch.minimum`).
    pub fn minimum(&self, a: &Var<B, T>, b: &Var<B, T>) -> Result<Var<B, T>> {
        let m = self.maximum(&self.neg(a)?, &self.neg(b)?)?;
        self.neg(&m)
    }

    /// Minimum over `axis`, `-max(-x)` (the gradient goes where the minimum is).
    pub fn min(&self, x: &Var<B, T>, axis: usize, keepdim: bool) -> Result<Var<B, T>> {
        let m = self.max(&self.neg(x)?, axis, keepdim)?;
        self.neg(&m)
    }

    /// The index of the first maximum along the last axis (a NaN counts as the maximum), as
    /// whole numbers of the element type (exact below 2^24 in f32): a constant, no gradient.
    pub fn argmax(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        Ok(self.constant(self.backend().argmax(&x.value)?))
    }

    /// SiLU (swish), `x * sigmoid(x)`.
    pub fn silu(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        let s = self.sigmoid(x)?;
        self.mul(x, &s)
    }

    /// Variance over `axis`: `mean((x - mean(x))²)`, times `n / (n - 1)` when `unbiased`
    /// (torch's default `correction = 1`). Also returns the mean (shaped as the variance).
    pub fn var_mean(
        &self,
        x: &Var<B, T>,
        axis: usize,
        keepdim: bool,
        unbiased: bool,
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        let n = x.shape().get(axis).copied().unwrap_or(0);
        let mean = self.mean(x, axis, true)?;
        let d = self.sub(x, &mean)?;
        let mut var = self.mean(&self.mul(&d, &d)?, axis, keepdim)?;
        if unbiased {
            var = self.scale(&var, T::from_f64(n as f64 / (n as f64 - 1.0)))?;
        }
        let mean = if keepdim {
            mean
        } else {
            let mut shape = x.shape().to_vec();
            shape.remove(axis);
            self.reshape(&mean, &shape)?
        };
        Ok((var, mean))
    }

    /// RMSNorm over the last axis: `x / sqrt(mean(x²) + eps) * weight` (`weight` `[n]`,
    /// optional), as `torch.nn.functional.rms_norm`.
    pub fn rms_norm(&self, x: &Var<B, T>, weight: Option<&Var<B, T>>, eps: T) -> Result<Var<B, T>> {
        let last = x.shape().len().saturating_sub(1);
        let ms = self.mean(&self.mul(x, x)?, last, true)?;
        let r = self.unary(UnaryOp::Rsqrt, &self.add_scalar(&ms, eps)?)?;
        let y = self.mul(x, &r)?;
        match weight {
            Some(w) => self.mul(&y, w),
            None => Ok(y),
        }
    }

    /// Rows of `table` (`[rows, ...]`) picked by `index` (any shape; whole numbers): shape
    /// `index ++ table[1..]`. The table's gradient is the output gradient's rows added at their
    /// indices in index order (deterministic, no atomics). An index naming no row is the typed
    /// error `IndexOutOfRange` on the CPU, a row of NaN on a device (never another row).
    pub fn embedding(&self, table: &Var<B, T>, index: &BTensor<B, T>) -> Result<Var<B, T>> {
        let tracked = self.tracks("embedding", &[table])?;
        let index = if index.is_contiguous() {
            index.clone()
        } else {
            self.backend().contiguous(index)?
        };
        let y = self.run(tracked, |b| b.embedding(&table.value, &index))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let node = EmbeddingBackward {
            index: self.save(&Var::constant(index), "index")?,
            table_shape: table.shape().to_vec(),
        };
        Ok(self.push1(Box::new(node), &[table], y, self.new_version()))
    }

    /// Attention `softmax(q kᵀ · scale + mask) v` over `[..., s, d]` operands, with a
    /// key-padding mask `key_keep` (`[..., 1, s_k]` or anything broadcasting to the scores
    /// `[..., s_q, s_k]`; 1 = attend, 0 = padding). A query row whose keys are all padding
    /// gets an output of zeros and a zero gradient (PyTorch's math path gives NaN there).
    ///
    /// Where the shapes are a key-padding mask's (`q [..., s_q, d]`, `k [..., s_k, d]`,
    /// `v [..., s_k, d_v]` with the same leading axes, `key_keep [..., 1, s_k]` with them too,
    /// not requiring a gradient), it is one fused node ([`Tape::key_padding_attention`]: one
    /// pass per query row on the CPU and CUDA backends); the mask then holds 0 or 1. Otherwise
    /// it is the composite of the tape's ops: masked scores filled with a large negative
    /// finite value, the softmax, then the probabilities times the mask (so an all-padding
    /// row, whose softmax is uniform over padding, becomes zero; elsewhere the padding's
    /// probabilities are exactly 0 already).
    pub fn masked_attention(
        &self,
        q: &Var<B, T>,
        k: &Var<B, T>,
        v: &Var<B, T>,
        key_keep: &Var<B, T>,
        scale: T,
    ) -> Result<Var<B, T>> {
        if let Some(out) = self.masked_attention_fused(q, k, v, key_keep, scale)? {
            return Ok(out);
        }
        let trans_b = MatmulOpts {
            trans_a: false,
            trans_b: true,
        };
        let scores = self.scale(&self.matmul(q, k, trans_b)?, scale)?;
        let padding = self.constant(self.backend().binary_scalar(
            zcompute::BinaryOp::Sub,
            &key_keep.value,
            T::ONE,
            zcompute::ScalarSide::Lhs,
        )?);
        // -1e30 is finite in f32 and f64: exp(-1e30 - max) is exactly 0, and no inf - inf.
        let masked = self.masked_fill(&scores, &padding, T::from_f64(-1e30))?;
        let probs = self.mul(&self.softmax_last(&masked)?, key_keep)?;
        self.matmul(&probs, v, MatmulOpts::default())
    }

    /// [`Tape::masked_attention`] as one [`Tape::key_padding_attention`] node with the leading
    /// axes folded into one batch, or `None` where the shapes are not a key-padding mask's.
    fn masked_attention_fused(
        &self,
        q: &Var<B, T>,
        k: &Var<B, T>,
        v: &Var<B, T>,
        key_keep: &Var<B, T>,
        scale: T,
    ) -> Result<Option<Var<B, T>>> {
        let (qs, ks, vs, ms) = (q.shape(), k.shape(), v.shape(), key_keep.shape());
        let rank = qs.len();
        if rank < 2 || [ks.len(), vs.len(), ms.len()] != [rank; 3] || key_keep.requires_grad() {
            return Ok(None);
        }
        let lead = &qs[..rank - 2];
        let (s_q, d, s_k, d_v) = (qs[rank - 2], qs[rank - 1], ks[rank - 2], vs[rank - 1]);
        let fits = [&ks[..rank - 2], &vs[..rank - 2], &ms[..rank - 2]]
            .iter()
            .all(|l| l == &lead)
            && ks[rank - 1] == d
            && vs[rank - 2] == s_k
            && ms[rank - 2..] == [1, s_k];
        // Folding the leading axes is a reshape: views that are not dense keep the composite.
        let dense = rank == 3 || [q, k, v].iter().all(|x| x.value().is_contiguous());
        if !fits || !dense {
            return Ok(None);
        }
        let batch: usize = lead.iter().product();
        let fold = |x: &Var<B, T>, s: usize, w: usize| match rank {
            3 => Ok(x.clone()),
            _ => self.reshape(x, &[batch, s, w]),
        };
        let keep = self
            .backend()
            .contiguous(key_keep.value())?
            .reshape(&[batch, s_k])?;
        let out = self.key_padding_attention(
            &fold(q, s_q, d)?,
            &fold(k, s_k, d)?,
            &fold(v, s_k, d_v)?,
            Some(&keep),
            scale,
        )?;
        if rank == 3 {
            return Ok(Some(out));
        }
        let mut shape = lead.to_vec();
        shape.extend([s_q, d_v]);
        self.reshape(&out, &shape).map(Some)
    }

    /// Inverted dropout: `x * mask`, the mask `1 / (1 - p)` where kept and 0 where dropped,
    /// drawn by zcompute's counter-based generator from `(seed, step, stream, element)`;
    /// `step` (one element, in device memory) is read when the op runs, so a captured step
    /// that advances it (`RandomOps::advance_step`) draws new masks on each replay, the same
    /// as eager. The backward multiplies by the same mask. `p` in `[0, 1)`.
    pub fn dropout(
        &self,
        x: &Var<B, T>,
        p: f64,
        seed: u64,
        stream: u32,
        step: &BTensor<B, T>,
    ) -> Result<Var<B, T>> {
        let mask = self
            .backend()
            .dropout_mask(x.shape(), p, seed, stream, step)?;
        self.mul(x, &Var::constant(mask))
    }
}
