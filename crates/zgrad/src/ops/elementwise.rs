//! Unary maps, broadcasting binaries and scalar forms, with their backward.

use super::{max_share, only, positive_mask, sum_to_shape};
use crate::error::Result;
use crate::tape::{BackwardOp, Saved, Tape};
use crate::var::Var;
use zcompute::{BTensor, BinaryOp, Element, ScalarSide, UnaryOp, prelude::*};

type Grads<B, T> = Vec<Option<BTensor<B, T>>>;

struct UnaryBackward<B: Ops<T>, T: Element> {
    op: UnaryOp,
    /// The input for log, relu and gelu; the output for the others (none for neg).
    saved: Option<Saved<B, T>>,
}

fn unary_name(op: UnaryOp) -> &'static str {
    match op {
        UnaryOp::Neg => "neg",
        UnaryOp::Exp => "exp",
        UnaryOp::Log => "log",
        UnaryOp::Sqrt => "sqrt",
        UnaryOp::Rsqrt => "rsqrt",
        UnaryOp::Tanh => "tanh",
        UnaryOp::Sigmoid => "sigmoid",
        UnaryOp::Relu => "relu",
        UnaryOp::Gelu => "gelu",
    }
}

/// Whether the backward of `op` reads its input (else its output).
fn saves_input(op: UnaryOp) -> bool {
    matches!(op, UnaryOp::Log | UnaryOp::Relu | UnaryOp::Gelu)
}

/// d gelu / dx = Φ(x) + x φ(x). The backend has no erf, so Φ(x) = gelu(x) / x, with the
/// point x = 0 (where Φ = 1/2) patched by a zero mask z: Φ = (gelu(x) + z/2) / (x + z).
fn gelu_grad<B: Ops<T>, T: Element>(b: &B, x: &BTensor<B, T>) -> Result<BTensor<B, T>> {
    let pos = positive_mask(b, x)?;
    let neg = positive_mask(b, &b.unary(UnaryOp::Neg, x)?)?;
    let nonzero = b.add(&pos, &neg)?;
    let z = b.binary_scalar(BinaryOp::Sub, &nonzero, T::ONE, ScalarSide::Lhs)?;
    let gelu = b.unary(UnaryOp::Gelu, x)?;
    let half_z = b.binary_scalar(BinaryOp::Mul, &z, T::from_f64(0.5), ScalarSide::Rhs)?;
    let cdf = b.div(&b.add(&gelu, &half_z)?, &b.add(x, &z)?)?;
    let x2 = b.mul(x, x)?;
    let e = b.unary(
        UnaryOp::Exp,
        &b.binary_scalar(BinaryOp::Mul, &x2, T::from_f64(-0.5), ScalarSide::Rhs)?,
    )?;
    let inv_sqrt_2pi = T::from_f64(1.0 / (2.0 * std::f64::consts::PI).sqrt());
    let pdf = b.binary_scalar(BinaryOp::Mul, &e, inv_sqrt_2pi, ScalarSide::Rhs)?;
    Ok(b.add(&cdf, &b.mul(x, &pdf)?)?)
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for UnaryBackward<B, T> {
    fn name(&self) -> &'static str {
        unary_name(self.op)
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let name = self.name();
        let s = || -> Result<&BTensor<B, T>> {
            match &self.saved {
                Some(s) => s.get(name),
                None => Err(zcompute::ComputeError::LengthMismatch {
                    op: "unary backward (saved tensor)",
                    expected: 1,
                    got: 0,
                }
                .into()),
            }
        };
        let scalar =
            |x: &BTensor<B, T>, op, v: f64| b.binary_scalar(op, x, T::from_f64(v), ScalarSide::Rhs);
        let gx = match self.op {
            UnaryOp::Neg => b.unary(UnaryOp::Neg, g)?,
            UnaryOp::Exp => b.mul(g, s()?)?,
            UnaryOp::Log => b.div(g, s()?)?,
            // d sqrt = 1 / (2 y)
            UnaryOp::Sqrt => b.div(&scalar(g, BinaryOp::Mul, 0.5)?, s()?)?,
            // d x^-1/2 = -y³ / 2
            UnaryOp::Rsqrt => {
                let y = s()?;
                let y3 = b.mul(&b.mul(y, y)?, y)?;
                b.mul(g, &scalar(&y3, BinaryOp::Mul, -0.5)?)?
            }
            // 1 - y²
            UnaryOp::Tanh => {
                let y = s()?;
                let d = b.binary_scalar(BinaryOp::Sub, &b.mul(y, y)?, T::ONE, ScalarSide::Lhs)?;
                b.mul(g, &d)?
            }
            // y (1 - y)
            UnaryOp::Sigmoid => {
                let y = s()?;
                let d = b.binary_scalar(BinaryOp::Sub, y, T::ONE, ScalarSide::Lhs)?;
                b.mul(g, &b.mul(y, &d)?)?
            }
            UnaryOp::Relu => b.mul(g, &positive_mask(b, s()?)?)?,
            UnaryOp::Gelu => b.mul(g, &gelu_grad(b, s()?)?)?,
        };
        Ok(vec![Some(gx)])
    }
}

struct BinaryBackward<B: Ops<T>, T: Element> {
    op: BinaryOp,
    a: Option<Saved<B, T>>,
    b: Option<Saved<B, T>>,
    a_shape: Vec<usize>,
    b_shape: Vec<usize>,
    needs: [bool; 2],
}

fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Maximum => "maximum",
    }
}

fn saved<'s, B: Ops<T>, T: Element>(
    s: &'s Option<Saved<B, T>>,
    op: &'static str,
) -> Result<&'s BTensor<B, T>> {
    match s {
        Some(s) => s.get(op),
        None => Err(zcompute::ComputeError::LengthMismatch {
            op: "backward (saved tensor)",
            expected: 1,
            got: 0,
        }
        .into()),
    }
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for BinaryBackward<B, T> {
    fn name(&self) -> &'static str {
        binary_name(self.op)
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let n = self.name();
        let (ga, gb) = match self.op {
            BinaryOp::Add => (g.clone(), g.clone()),
            BinaryOp::Sub => (g.clone(), b.unary(UnaryOp::Neg, g)?),
            BinaryOp::Mul => {
                let ga = if self.needs[0] {
                    b.mul(g, saved(&self.b, n)?)?
                } else {
                    g.clone()
                };
                let gb = if self.needs[1] {
                    b.mul(g, saved(&self.a, n)?)?
                } else {
                    g.clone()
                };
                (ga, gb)
            }
            BinaryOp::Div => {
                let y = saved(&self.b, n)?;
                let ga = b.div(g, y)?;
                let gb = if self.needs[1] {
                    let x = saved(&self.a, n)?;
                    let q = b.div(&b.mul(g, x)?, &b.mul(y, y)?)?;
                    b.unary(UnaryOp::Neg, &q)?
                } else {
                    g.clone()
                };
                (ga, gb)
            }
            BinaryOp::Maximum => {
                let diff = b.sub(saved(&self.a, n)?, saved(&self.b, n)?)?;
                let share_a = max_share(b, &diff)?;
                let share_b = b.binary_scalar(BinaryOp::Sub, &share_a, T::ONE, ScalarSide::Lhs)?;
                (b.mul(g, &share_a)?, b.mul(g, &share_b)?)
            }
        };
        let ga = if self.needs[0] {
            Some(sum_to_shape(b, ga, &self.a_shape)?)
        } else {
            None
        };
        let gb = if self.needs[1] {
            Some(sum_to_shape(b, gb, &self.b_shape)?)
        } else {
            None
        };
        Ok(vec![ga, gb])
    }
}

struct ScalarBackward<B: Ops<T>, T: Element> {
    op: BinaryOp,
    side: ScalarSide,
    s: T,
    x: Option<Saved<B, T>>,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for ScalarBackward<B, T> {
    fn name(&self) -> &'static str {
        match self.op {
            BinaryOp::Add => "add_scalar",
            BinaryOp::Sub => "sub_scalar",
            BinaryOp::Mul => "mul_scalar",
            BinaryOp::Div => "div_scalar",
            BinaryOp::Maximum => "maximum_scalar",
        }
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        let rhs = ScalarSide::Rhs;
        let gx = match (self.op, self.side) {
            (BinaryOp::Add, _) | (BinaryOp::Sub, ScalarSide::Rhs) => g.clone(),
            (BinaryOp::Sub, ScalarSide::Lhs) => b.unary(UnaryOp::Neg, g)?,
            (BinaryOp::Mul, _) => b.binary_scalar(BinaryOp::Mul, g, self.s, rhs)?,
            (BinaryOp::Div, ScalarSide::Rhs) => b.binary_scalar(BinaryOp::Div, g, self.s, rhs)?,
            // d (s / x) = -s / x²
            (BinaryOp::Div, ScalarSide::Lhs) => {
                let x = saved(&self.x, self.name())?;
                let q = b.div(g, &b.mul(x, x)?)?;
                b.binary_scalar(BinaryOp::Mul, &q, -self.s, rhs)?
            }
            (BinaryOp::Maximum, _) => {
                let x = saved(&self.x, self.name())?;
                let diff = b.binary_scalar(BinaryOp::Sub, x, self.s, rhs)?;
                b.mul(g, &max_share(b, &diff)?)?
            }
        };
        Ok(vec![Some(gx)])
    }
}

impl<'b, B: Ops<T>, T: Element> Tape<'b, B, T> {
    /// An elementwise function (zcompute's `unary`).
    pub fn unary(&self, op: UnaryOp, x: &Var<B, T>) -> Result<Var<B, T>> {
        let tracked = self.tracks(unary_name(op), &[x])?;
        let y = self.run(tracked, |b| b.unary(op, &x.value))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let version = self.new_version();
        let saved = match op {
            UnaryOp::Neg => None,
            _ if saves_input(op) => Some(self.save(x, "input")?),
            _ => Some(self.save_output(&y, &version, "output")),
        };
        Ok(self.push1(Box::new(UnaryBackward { op, saved }), &[x], y, version))
    }

    /// An elementwise function of two tensors, broadcast as NumPy does.
    pub fn binary(&self, op: BinaryOp, a: &Var<B, T>, b: &Var<B, T>) -> Result<Var<B, T>> {
        let tracked = self.tracks(binary_name(op), &[a, b])?;
        let y = self.run(tracked, |be| be.binary(op, &a.value, &b.value))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let needs = [a.requires_grad(), b.requires_grad()];
        let (save_a, save_b) = match op {
            BinaryOp::Add | BinaryOp::Sub => (false, false),
            BinaryOp::Mul => (needs[1], needs[0]),
            BinaryOp::Div => (needs[1], true),
            BinaryOp::Maximum => (true, true),
        };
        let node = BinaryBackward {
            op,
            a: save_a.then(|| self.save(a, "lhs")).transpose()?,
            b: save_b.then(|| self.save(b, "rhs")).transpose()?,
            a_shape: a.shape().to_vec(),
            b_shape: b.shape().to_vec(),
            needs,
        };
        Ok(self.push1(Box::new(node), &[a, b], y, self.new_version()))
    }

    /// `x op s` (`ScalarSide::Rhs`) or `s op x` (`ScalarSide::Lhs`).
    pub fn binary_scalar(
        &self,
        op: BinaryOp,
        x: &Var<B, T>,
        s: T,
        side: ScalarSide,
    ) -> Result<Var<B, T>> {
        let tracked = self.tracks("binary_scalar", &[x])?;
        let y = self.run(tracked, |b| b.binary_scalar(op, &x.value, s, side))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let keep = matches!(
            (op, side),
            (BinaryOp::Maximum, _) | (BinaryOp::Div, ScalarSide::Lhs)
        );
        let node = ScalarBackward {
            op,
            side,
            s,
            x: keep.then(|| self.save(x, "input")).transpose()?,
        };
        Ok(self.push1(Box::new(node), &[x], y, self.new_version()))
    }

    pub fn add(&self, a: &Var<B, T>, b: &Var<B, T>) -> Result<Var<B, T>> {
        self.binary(BinaryOp::Add, a, b)
    }

    pub fn sub(&self, a: &Var<B, T>, b: &Var<B, T>) -> Result<Var<B, T>> {
        self.binary(BinaryOp::Sub, a, b)
    }

    pub fn mul(&self, a: &Var<B, T>, b: &Var<B, T>) -> Result<Var<B, T>> {
        self.binary(BinaryOp::Mul, a, b)
    }

    pub fn div(&self, a: &Var<B, T>, b: &Var<B, T>) -> Result<Var<B, T>> {
        self.binary(BinaryOp::Div, a, b)
    }

    pub fn maximum(&self, a: &Var<B, T>, b: &Var<B, T>) -> Result<Var<B, T>> {
        self.binary(BinaryOp::Maximum, a, b)
    }

    pub fn scale(&self, x: &Var<B, T>, s: T) -> Result<Var<B, T>> {
        self.binary_scalar(BinaryOp::Mul, x, s, ScalarSide::Rhs)
    }

    pub fn add_scalar(&self, x: &Var<B, T>, s: T) -> Result<Var<B, T>> {
        self.binary_scalar(BinaryOp::Add, x, s, ScalarSide::Rhs)
    }

    pub fn neg(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.unary(UnaryOp::Neg, x)
    }

    pub fn exp(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.unary(UnaryOp::Exp, x)
    }

    pub fn log(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.unary(UnaryOp::Log, x)
    }

    pub fn tanh(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.unary(UnaryOp::Tanh, x)
    }

    pub fn sigmoid(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.unary(UnaryOp::Sigmoid, x)
    }

    pub fn relu(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.unary(UnaryOp::Relu, x)
    }

    pub fn gelu(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.unary(UnaryOp::Gelu, x)
    }
}
