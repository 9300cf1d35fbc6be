//! Matrix products and the fused BCE-with-logits loss, with their backward.

use super::{only, sum_to_shape};
use crate::error::Result;
use crate::tape::{BackwardOp, Saved, Tape};
use crate::var::Var;
use zcompute::{BTensor, Backend, BinaryOp, Element, MatmulOpts, ScalarSide, UnaryOp};

type Grads<B, T> = Vec<Option<BTensor<B, T>>>;

struct MatmulBackward<B: Backend<T>, T: Element> {
    a: Option<Saved<B, T>>,
    b: Option<Saved<B, T>>,
    a_shape: Vec<usize>,
    b_shape: Vec<usize>,
    opts: MatmulOpts,
}

fn opts(trans_a: bool, trans_b: bool) -> MatmulOpts {
    MatmulOpts { trans_a, trans_b }
}

impl<B: Backend<T>, T: Element> BackwardOp<B, T> for MatmulBackward<B, T> {
    fn name(&self) -> &'static str {
        "matmul"
    }

    /// With `C = op(A) · op(B)`: `d op(A) = G · op(B)ᵀ`, `d op(B) = op(A)ᵀ · G`; a transposed
    /// operand takes the transpose of that, written as a product with swapped flags so no
    /// transpose is materialised. Broadcast batch axes are summed back to the operand's shape.
    fn backward(&self, be: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let MatmulOpts { trans_a, trans_b } = self.opts;
        let ga = match &self.b {
            Some(b) => {
                let b = b.get("matmul")?;
                let prod = if trans_a {
                    be.matmul(b, g, opts(trans_b, true))?
                } else {
                    be.matmul(g, b, opts(false, !trans_b))?
                };
                Some(sum_to_shape(be, prod, &self.a_shape)?)
            }
            None => None,
        };
        let gb = match &self.a {
            Some(a) => {
                let a = a.get("matmul")?;
                let prod = if trans_b {
                    be.matmul(g, a, opts(true, trans_a))?
                } else {
                    be.matmul(a, g, opts(!trans_a, false))?
                };
                Some(sum_to_shape(be, prod, &self.b_shape)?)
            }
            None => None,
        };
        Ok(vec![ga, gb])
    }
}

struct BceBackward<B: Backend<T>, T: Element> {
    logits: Saved<B, T>,
    targets: Saved<B, T>,
    needs: [bool; 2],
}

impl<B: Backend<T>, T: Element> BackwardOp<B, T> for BceBackward<B, T> {
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

impl<'b, B: Backend<T>, T: Element> Tape<'b, B, T> {
    /// Batched matrix product (zcompute's `matmul`: transpose flags, broadcast batch axes).
    pub fn matmul(&self, a: &Var<B, T>, b: &Var<B, T>, o: MatmulOpts) -> Result<Var<B, T>> {
        let tracked = self.tracks("matmul", &[a, b])?;
        let y = self.run(tracked, |be| be.matmul(&a.value, &b.value, o))?;
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
