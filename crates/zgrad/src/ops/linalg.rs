//! Matrix products and the fused BCE-with-logits loss, with their backward.

use super::{only, sum_to_shape};
use crate::error::Result;
use crate::tape::{BackwardOp, Saved, Tape};
use crate::var::Var;
use zcompute::{BTensor, BinaryOp, Element, MathMode, MatmulOpts, ScalarSide, UnaryOp, prelude::*};

type Grads<B, T> = Vec<Option<BTensor<B, T>>>;

struct MatmulBackward<B: Ops<T>, T: Element> {
    a: Option<Saved<B, T>>,
    b: Option<Saved<B, T>>,
    a_shape: Vec<usize>,
    b_shape: Vec<usize>,
    opts: MatmulOpts,
    /// The products' arithmetic, as the forward ran (`Tape::with_math_mode`).
    mode: MathMode,
}

fn opts(trans_a: bool, trans_b: bool) -> MatmulOpts {
    MatmulOpts { trans_a, trans_b }
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for MatmulBackward<B, T> {
    fn name(&self) -> &'static str {
        "matmul"
    }

    fn backward(&self, be: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        self.backward_into(be, grads, &[None, None])
    }

    /// With `C = op(A) · op(B)`: `d op(A) = G · op(B)ᵀ`, `d op(B) = op(A)ᵀ · G`; a transposed
    /// operand takes the transpose of that, written as a product with swapped flags so no
    /// transpose is materialised. Broadcast batch axes are summed back to the operand's shape;
    /// an operand with a dense gradient buffer and no broadcast axes gets its product added
    /// straight into the buffer (`matmul_into`: no separate accumulation pass).
    fn backward_into(
        &self,
        be: &B,
        grads: &[Option<BTensor<B, T>>],
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let MatmulOpts { trans_a, trans_b } = self.opts;
        let batch = &g.shape()[..g.shape().len() - 2];
        let ga = match &self.b {
            Some(b) => {
                let b = b.get("matmul")?;
                let (x, y, o) = if trans_a {
                    (b, g, opts(trans_b, true))
                } else {
                    (g, b, opts(false, !trans_b))
                };
                product_grad(
                    be,
                    (x, y, o, self.mode),
                    &self.a_shape,
                    batch,
                    into.first().copied().flatten(),
                )?
            }
            None => None,
        };
        let gb = match &self.a {
            Some(a) => {
                let a = a.get("matmul")?;
                let (x, y, o) = if trans_b {
                    (g, a, opts(true, trans_a))
                } else {
                    (a, g, opts(!trans_a, false))
                };
                product_grad(
                    be,
                    (x, y, o, self.mode),
                    &self.b_shape,
                    batch,
                    into.get(1).copied().flatten(),
                )?
            }
            None => None,
        };
        Ok(vec![ga, gb])
    }
}

/// One operand's gradient `x · y`: added into `dst` when given and the product already has the
/// operand's shape (its batch axes are the output's, none broadcast); otherwise returned,
/// summed back to `shape`.
fn product_grad<B: Ops<T>, T: Element>(
    be: &B,
    (x, y, o, mode): (&BTensor<B, T>, &BTensor<B, T>, MatmulOpts, MathMode),
    shape: &[usize],
    batch: &[usize],
    dst: Option<&BTensor<B, T>>,
) -> Result<Option<BTensor<B, T>>> {
    if let Some(dst) = dst
        && dst.shape() == shape
        && shape[..shape.len() - 2] == *batch
    {
        match mode {
            MathMode::F32 => be.matmul_into(x, y, o, dst)?,
            mode => be.matmul_into_mode(x, y, o, dst, mode)?,
        }
        return Ok(None);
    }
    let product = match mode {
        MathMode::F32 => be.matmul(x, y, o)?,
        mode => be.matmul_mode(x, y, o, mode)?,
    };
    Ok(Some(sum_to_shape(be, product, shape)?))
}

struct BceBackward<B: Ops<T>, T: Element> {
    logits: Saved<B, T>,
    targets: Saved<B, T>,
    needs: [bool; 2],
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for BceBackward<B, T> {
    fn name(&self) -> &'static str {
        "bce_with_logits"
    }

    /// d/dx = (sigmoid(x) - y) / n, d/dy = -x / n, times the incoming scalar gradient.
    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let x = self.logits.get("bce_with_logits")?;
        let y = self.targets.get("bce_with_logits")?;
        let n = T::from_f64(x.numel() as f64);
        let g_n = b.binary_scalar(BinaryOp::Div, g, n, ScalarSide::Rhs)?;
        let gx = if self.needs[0] {
            let d = b.sub(&b.unary(UnaryOp::Sigmoid, x)?, y)?;
            Some(b.mul(&d, &g_n)?)
        } else {
            None
        };
        let gy = if self.needs[1] {
            Some(b.mul(&b.unary(UnaryOp::Neg, x)?, &g_n)?)
        } else {
            None
        };
        Ok(vec![gx, gy])
    }
}

impl<'b, B: Ops<T>, T: Element> Tape<'b, B, T> {
    /// Batched matrix product (zcompute's `matmul`: transpose flags, broadcast batch axes),
    /// forward and backward under the tape's math mode ([`Tape::with_math_mode`]).
    pub fn matmul(&self, a: &Var<B, T>, b: &Var<B, T>, o: MatmulOpts) -> Result<Var<B, T>> {
        let tracked = self.tracks("matmul", &[a, b])?;
        let mode = self.math_mode();
        let y = self.run(tracked, |be| match mode {
            MathMode::F32 => be.matmul(&a.value, &b.value, o),
            mode => be.matmul_mode(&a.value, &b.value, o, mode),
        })?;
        if !tracked {
            return Ok(self.constant(y));
        }
        // A's gradient needs B and B's needs A: save only what a needed gradient reads.
        let node = MatmulBackward {
            a: b.requires_grad().then(|| self.save(a, "lhs")).transpose()?,
            b: a.requires_grad().then(|| self.save(b, "rhs")).transpose()?,
            a_shape: a.shape().to_vec(),
            b_shape: b.shape().to_vec(),
            opts: o,
            mode,
        };
        Ok(self.push1(Box::new(node), &[a, b], y, self.new_version()))
    }

    /// Mean BCE-with-logits over every element (rank 0), stable for any logit.
    pub fn bce_with_logits(&self, logits: &Var<B, T>, targets: &Var<B, T>) -> Result<Var<B, T>> {
        let tracked = self.tracks("bce_with_logits", &[logits, targets])?;
        let y = self.run(tracked, |b| {
            b.bce_with_logits_mean(&logits.value, &targets.value)
        })?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let node = BceBackward {
            logits: self.save(logits, "logits")?,
            targets: self.save(targets, "targets")?,
            needs: [logits.requires_grad(), targets.requires_grad()],
        };
        Ok(self.push1(Box::new(node), &[logits, targets], y, self.new_version()))
    }
}
