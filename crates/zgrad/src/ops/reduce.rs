//! Reductions over an axis, softmax and LayerNorm over the last axis, with their backward.

use super::fused::{layer_norm_param_buffers, layer_norm_param_grads};
use super::{only, positive_mask};
use crate::error::Result;
use crate::tape::{BackwardOp, Saved, Tape};
use crate::var::Var;
use zcompute::{BTensor, BinaryOp, Element, ReduceOp, ScalarSide, prelude::*};

type Grads<B, T> = Vec<Option<BTensor<B, T>>>;

struct ReduceBackward<B: Ops<T>, T: Element> {
    op: ReduceOp,
    axis: usize,
    keepdim: bool,
    in_shape: Vec<usize>,
    /// Max only: the input and the kept-dim maximum.
    max: Option<(Saved<B, T>, Saved<B, T>)>,
}

fn reduce_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Mean => "mean",
        ReduceOp::Max => "max",
    }
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for ReduceBackward<B, T> {
    fn name(&self) -> &'static str {
        reduce_name(self.op)
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let g = if self.keepdim {
            g.clone()
        } else {
            g.unsqueeze(self.axis)?
        };
        let n = self.in_shape[self.axis];
        let spread = match self.op {
            ReduceOp::Sum => g,
            ReduceOp::Mean => {
                b.binary_scalar(BinaryOp::Div, &g, T::from_f64(n as f64), ScalarSide::Rhs)?
            }
            // The gradient goes to the maximal elements, split evenly between ties (amax).
            ReduceOp::Max => {
                let name = self.name();
                let (x, m) = self.max.as_ref().map_or_else(
                    || {
                        Err(crate::GradError::from(
                            zcompute::ComputeError::LengthMismatch {
                                op: "max backward (saved tensors)",
                                expected: 2,
                                got: 0,
                            },
                        ))
                    },
                    |(x, m)| Ok((x.get(name)?, m.get(name)?)),
                )?;
                let below = positive_mask(b, &b.sub(m, x)?)?;
                let hit = b.binary_scalar(BinaryOp::Sub, &below, T::ONE, ScalarSide::Lhs)?;
                let count = b.sum(&hit, self.axis, true)?;
                b.mul(&b.div(&g, &count)?, &hit)?
            }
        };
        let full = b.contiguous(&spread.broadcast_to(&self.in_shape)?)?;
        Ok(vec![Some(full)])
    }
}

struct SoftmaxBackward<B: Ops<T>, T: Element> {
    y: Saved<B, T>,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for SoftmaxBackward<B, T> {
    fn name(&self) -> &'static str {
        "softmax"
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let y = self.y.get("softmax")?;
        Ok(vec![Some(b.softmax_backward(g, y)?)])
    }
}

struct LayerNormBackward<B: Ops<T>, T: Element> {
    x: Saved<B, T>,
    mean: Saved<B, T>,
    rstd: Saved<B, T>,
    weight: Option<Saved<B, T>>,
    needs: [bool; 3],
    /// Whether the node also outputs its input (`layer_norm_stream`): outputs `(x, y)`.
    stream: bool,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for LayerNormBackward<B, T> {
    fn name(&self) -> &'static str {
        "layer_norm"
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        self.backward_into(b, grads, &[])
    }

    /// The weight's and bias's gradients (column sums) go straight into their buffers when
    /// the tape gives them.
    fn backward_into(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Grads<B, T>> {
        const OP: &str = "layer_norm";
        // A stream node's gradients: the stream's (the input passed on) and the norm's.
        let (g_stream, g) = if self.stream {
            let g_stream = grads.first().and_then(Option::as_ref);
            match grads.get(1).and_then(Option::as_ref) {
                Some(g) => (g_stream, g),
                None => return Ok(vec![Some(only(grads)?.clone()), None, None]),
            }
        } else {
            (None, only(grads)?)
        };
        let weight = self.weight.as_ref().map(|w| w.get(OP)).transpose()?;
        let (x, mean, rstd) = (self.x.get(OP)?, self.mean.get(OP)?, self.rstd.get(OP)?);
        // With the tape's buffers for the parameters' gradients, one op (one launch on the
        // device for few rows) adds into them.
        let n = x.shape().last().copied().unwrap_or(1);
        let needs = [self.needs[1], self.needs[2]];
        if let Some([dw, db]) = layer_norm_param_buffers(into, 1, n, needs) {
            let input = b.layer_norm_backward_into(
                &zcompute::LayerNormBackward {
                    g,
                    residual: g_stream,
                    x,
                    mean,
                    rstd,
                    weight,
                },
                self.needs[0],
                dw,
                db,
            )?;
            return Ok(vec![input, None, None]);
        }
        let want = [self.needs[0], self.needs[1]];
        // The stream's gradient is added to the input's in the backward kernel itself.
        let grads = match g_stream {
            Some(r) => b.layer_norm_backward_add(
                &zcompute::LayerNormBackward {
                    g,
                    residual: Some(r),
                    x,
                    mean,
                    rstd,
                    weight,
                },
                want,
            )?,
            None => b.layer_norm_backward(g, x, mean, rstd, weight, want)?,
        };
        let [gw, gb] = layer_norm_param_grads(b, grads.g_xhat, g, self.needs[2], into, 1)?;
        Ok(vec![grads.input, gw, gb])
    }
}

impl<'b, B: Ops<T>, T: Element> Tape<'b, B, T> {
    /// Sum, mean or max over `axis` (`keepdim` keeps it with size 1).
    pub fn reduce(
        &self,
        op: ReduceOp,
        x: &Var<B, T>,
        axis: usize,
        keepdim: bool,
    ) -> Result<Var<B, T>> {
        let tracked = self.tracks(reduce_name(op), &[x])?;
        let y = self.run(tracked, |b| b.reduce(op, &x.value, axis, keepdim))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let version = self.new_version();
        let max = if op == ReduceOp::Max {
            let m = if keepdim {
                y.clone()
            } else {
                y.unsqueeze(axis)?
            };
            Some((
                self.save(x, "input")?,
                self.save_output(&m, &version, "maximum"),
            ))
        } else {
            None
        };
        let node = ReduceBackward {
            op,
            axis,
            keepdim,
            in_shape: x.shape().to_vec(),
            max,
        };
        Ok(self.push1(Box::new(node), &[x], y, version))
    }

    pub fn sum(&self, x: &Var<B, T>, axis: usize, keepdim: bool) -> Result<Var<B, T>> {
        self.reduce(ReduceOp::Sum, x, axis, keepdim)
    }

    pub fn mean(&self, x: &Var<B, T>, axis: usize, keepdim: bool) -> Result<Var<B, T>> {
        self.reduce(ReduceOp::Mean, x, axis, keepdim)
    }

    pub fn max(&self, x: &Var<B, T>, axis: usize, keepdim: bool) -> Result<Var<B, T>> {
        self.reduce(ReduceOp::Max, x, axis, keepdim)
    }

    /// Sum of every element, as a rank-0 variable.
    pub fn sum_all(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        let flat = self.reshape(x, &[x.value.numel()])?;
        self.sum(&flat, 0, false)
    }

    /// Mean of every element, as a rank-0 variable.
    pub fn mean_all(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        let flat = self.reshape(x, &[x.value.numel()])?;
        self.mean(&flat, 0, false)
    }

    /// Softmax over the last axis.
    pub fn softmax_last(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        let tracked = self.tracks("softmax", &[x])?;
        let y = self.run(tracked, |b| b.softmax_last(&x.value))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let version = self.new_version();
        let node = SoftmaxBackward {
            y: self.save_output(&y, &version, "output"),
        };
        Ok(self.push1(Box::new(node), &[x], y, version))
    }

    /// LayerNorm over the last axis (biased variance), with optional affine weight and bias.
    pub fn layer_norm(
        &self,
        x: &Var<B, T>,
        weight: Option<&Var<B, T>>,
        bias: Option<&Var<B, T>>,
        eps: T,
    ) -> Result<Var<B, T>> {
        let mut out = self.layer_norm_node(x, weight, bias, eps, false)?;
        out.pop().ok_or_else(|| missing_output("layer_norm"))
    }

    /// LayerNorm of a residual stream that goes on past it: returns `(x, layer_norm(x))`, the
    /// first the input itself (no copy, its version shared) to use downstream instead of `x`.
    /// Same values as `layer_norm`; in backward the stream's gradient is added to LayerNorm's
    /// input gradient in LayerNorm's backward kernel, where using `x` twice would take a
    /// separate add.
    pub fn layer_norm_stream(
        &self,
        x: &Var<B, T>,
        weight: Option<&Var<B, T>>,
        bias: Option<&Var<B, T>>,
        eps: T,
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        let mut out = self.layer_norm_node(x, weight, bias, eps, true)?;
        let y = out
            .pop()
            .ok_or_else(|| missing_output("layer_norm_stream"))?;
        let stream = out.pop().unwrap_or_else(|| x.clone());
        Ok((stream, y))
    }

    /// One LayerNorm node; with `stream`, its outputs are `[x, y]`, else `[y]`.
    fn layer_norm_node(
        &self,
        x: &Var<B, T>,
        weight: Option<&Var<B, T>>,
        bias: Option<&Var<B, T>>,
        eps: T,
        stream: bool,
    ) -> Result<Vec<Var<B, T>>> {
        let mut inputs = vec![x];
        inputs.extend(weight);
        inputs.extend(bias);
        let tracked = self.tracks("layer_norm", &inputs)?;
        let out = {
            let _class =
                tracked.then(|| crate::memory::ClassGuard::new(self.backend(), self.saved_class()));
            self.backend().layer_norm(
                &x.value,
                weight.map(|w| &w.value),
                bias.map(|b| &b.value),
                eps,
            )?
        };
        if !tracked {
            let y = self.constant(out.out);
            return Ok(if stream { vec![x.clone(), y] } else { vec![y] });
        }
        // Statistics are fresh outputs nobody else can write: their own version counters.
        let stats = self.new_version();
        let node = LayerNormBackward {
            x: self.save(x, "input")?,
            mean: self.save_output(&out.mean, &stats, "mean"),
            rstd: self.save_output(&out.rstd, &stats, "rstd"),
            weight: weight.map(|w| self.save(w, "weight")).transpose()?,
            needs: [
                x.requires_grad(),
                weight.is_some_and(Var::requires_grad),
                bias.is_some_and(Var::requires_grad),
            ],
            stream,
        };
        // The tape routes gradients by input position: pad absent affine inputs with constants.
        let absent = Var::constant(out.mean.clone());
        let w = weight.unwrap_or(&absent);
        let bb = bias.unwrap_or(&absent);
        let mut outputs = Vec::with_capacity(2);
        if stream {
            outputs.push((x.value.clone(), x.version.clone()));
        }
        outputs.push((out.out, self.new_version()));
        Ok(self.push(Box::new(node), &[x, w, bb], outputs))
    }
}

fn missing_output(op: &'static str) -> crate::GradError {
    zcompute::ComputeError::LengthMismatch {
        op,
        expected: 1,
        got: 0,
    }
    .into()
}
