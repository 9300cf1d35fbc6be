//! A Linear layer as one tape node: `act(x · wᵀ + bias)` forward through `LinearOps::linear`
//! (one kernel on the device for few rows), and a backward that, when the tape gives the
//! parameter gradients' buffers, is one `LinearOps::linear_backward_into` (one launch on the
//! device for few rows: tanh's backward, the input's gradient `gz · w`, and the weight's and
//! bias's gradients added into their buffers); otherwise tanh's backward, the product and the
//! parameter gradients one op each.
//!
//! Under a reduced math mode (`Tape::with_math_mode`: TF32, bf16) the products run through
//! `PrecisionOps` (`linear_mode`, `linear_backward_into_mode`, `matmul_mode`,
//! `matmul_into_mode`) and the bias, tanh, residual add and bias gradient stay float32
//! (docs/precision.md); under float32 the calls are exactly the float32 ones above. Under bf16
//! on a training tape (`Tape::bf16_operands_once`) each operand is converted once: the weight
//! read from the step's copy, the input converted in the forward and its bf16 copy kept for
//! the weight's gradient (instead of the float32 input: that product is its only reader), the
//! output's gradient converted once for both backward products. The conversion is one
//! deterministic formula, so the bits are those of converting on every call.

use super::fused::{into_at, sum_rows_to};
use super::only;
use crate::error::Result;
use crate::memory::ClassGuard;
use crate::tape::{BackwardOp, Saved, SavedBf16, Tape};
use crate::var::Var;
use zcompute::{Activation, AllocClass, BBf16, BTensor, Element, MathMode, MatmulOpts, prelude::*};

type Grads<B, T> = Vec<Option<BTensor<B, T>>>;

const NAME: &str = "linear";

/// `gzᵀ · x`: the weight's gradient.
const TN: MatmulOpts = MatmulOpts {
    trans_a: true,
    trans_b: false,
};

struct LinearBackward<B: Ops<T>, T: Element> {
    /// The input, for the weight's gradient (none when the weight needs none, or when its
    /// bf16 copy is kept instead).
    x: Option<Saved<B, T>>,
    /// Under bf16 on a training tape, the input's copy made by the forward's product, for the
    /// weight's gradient (`Tape::bf16_operands_once`).
    x_bf16: Option<SavedBf16<B, T>>,
    /// The weight, for the input's gradient (none when the input needs none).
    w: Option<Saved<B, T>>,
    /// The output, for tanh's backward (none for the identity).
    y: Option<Saved<B, T>>,
    /// x, w, bias.
    needs: [bool; 3],
    /// Whether the node has a fourth input, a residual added after the activation
    /// (`Tape::linear_add`), whose gradient is the output's, unchanged.
    residual: bool,
    /// The products' arithmetic, as the forward ran.
    mode: MathMode,
    /// Under bf16, the weight's copy from the tape's shadow (when the input needs a gradient):
    /// `gz · w` reads it instead of converting the weight again.
    w_bf16: Option<BBf16<B, T>>,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for LinearBackward<B, T> {
    fn name(&self) -> &'static str {
        NAME
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        self.backward_into(b, grads, &[])
    }

    /// With `z = x · wᵀ + bias` and `y = act(z)`: `gz = act'(gy)`, `gx = gz · w`,
    /// `gw = gzᵀ · x`, `gbias = Σ_rows gz`. When the tape gives the weight's buffer, its
    /// gradient (and the bias's, when that buffer is given too) is added in place by one
    /// `linear_param_grads_into`; otherwise each needed parameter gradient is returned (or the
    /// bias's column sum added into its own buffer).
    fn backward_into(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Grads<B, T>> {
        let g = only(grads)?;
        if let Some(x) = &self.x_bf16 {
            return self.backward_bf16(b, g, x.get(NAME)?, into);
        }
        if let Some(done) = self.fused_into(b, g, into)? {
            return Ok(done);
        }
        let gz = match &self.y {
            Some(y) => b.tanh_backward(g, y.get(NAME)?)?,
            None => g.clone(),
        };
        let gx = match &self.w {
            Some(w) if self.needs[0] => {
                let w = w.get(NAME)?;
                Some(match (self.mode, &self.w_bf16) {
                    (MathMode::F32, _) => b.matmul(&gz, w, MatmulOpts::default())?,
                    (_, Some(copy)) => b.matmul_bf16_rhs(&gz, copy, MatmulOpts::default())?,
                    (mode, None) => b.matmul_mode(&gz, w, MatmulOpts::default(), mode)?,
                })
            }
            _ => None,
        };
        let [_, need_w, need_bias] = self.needs;
        let (mut gw, mut bias_done) = (None, false);
        if let Some(x) = self.x.as_ref().filter(|_| need_w) {
            let x = x.get(NAME)?;
            let out_in = [gz.shape()[1], x.shape()[1]];
            match into_at(into, 1).filter(|dw| dw.shape() == out_in) {
                Some(dw) => {
                    let db = into_at(into, 2).filter(|db| need_bias && db.shape() == [out_in[0]]);
                    if self.mode == MathMode::F32 {
                        b.linear_param_grads_into(&gz, x, dw, db)?;
                    } else {
                        b.matmul_into_mode(&gz, x, TN, dw, self.mode)?;
                        if let Some(db) = db {
                            b.sum_rows_into(&gz, db)?;
                        }
                    }
                    bias_done = db.is_some();
                }
                None => {
                    gw = Some(match self.mode {
                        MathMode::F32 => b.matmul(&gz, x, TN)?,
                        mode => b.matmul_mode(&gz, x, TN, mode)?,
                    });
                }
            }
        }
        let gbias = if need_bias && !bias_done {
            sum_rows_to(b, &gz, into_at(into, 2))?
        } else {
            None
        };
        Ok(self.with_residual(g, vec![gx, gw, gbias]))
    }
}

impl<B: Ops<T>, T: Element> LinearBackward<B, T> {
    /// The backward under bf16 with the input's copy `x` from the forward: the output's
    /// gradient converted once, and both products read copies (`gz · w` the weight's from the
    /// step's copy, `gzᵀ · x` the input's). When the tape gives the parameters' buffers, the
    /// whole backward is one `linear_backward_into_bf16`, as the per-call path's `fused_into`
    /// is one `linear_backward_into_mode` (the two give the same bits); otherwise the steps
    /// one by one, as `backward_into` takes them.
    fn backward_bf16(
        &self,
        b: &B,
        g: &BTensor<B, T>,
        x: &BBf16<B, T>,
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Grads<B, T>> {
        let [need_x, _, need_bias] = self.needs;
        let out_in = [g.shape()[1], x.shape()[1]];
        let w_copy = self.w_bf16.as_ref().filter(|_| need_x && self.w.is_some());
        if let Some(dw) = into_at(into, 1).filter(|dw| dw.shape() == out_in) {
            let db = into_at(into, 2).filter(|db| need_bias && db.shape() == [out_in[0]]);
            // The whole backward as one `PrecisionOps::linear_backward_into_bf16` (one launch on
            // the device for one sample's rows), where it takes every gradient asked for.
            if need_bias == db.is_some() && need_x == w_copy.is_some() {
                let (act, y) = match &self.y {
                    Some(y) => (Activation::Tanh, Some(y.get(NAME)?)),
                    None => (Activation::Identity, None),
                };
                let gx = b.linear_backward_into_bf16(g, x, w_copy, (act, y), (dw, db))?;
                return Ok(self.with_residual(g, vec![gx, None, None]));
            }
        }
        // The copy is freed when the node's backward returns, as a per-call conversion's
        // temporary is (a scratch block would live to the step's end); tanh's backward and the
        // copy are one launch on the device, so its result is made in that class too.
        let (gz, gz_bf16) = {
            let _class = ClassGuard::new(b, AllocClass::Saved);
            match &self.y {
                Some(y) => b.tanh_backward_bf16(g, y.get(NAME)?)?,
                None => (g.clone(), b.bf16_copy_of(g)?),
            }
        };
        let gx = match (&self.w, &self.w_bf16) {
            (Some(_), Some(w)) if need_x => {
                Some(b.matmul_bf16(&gz_bf16, w, MatmulOpts::default())?)
            }
            (Some(w), None) if need_x => {
                Some(b.matmul_mode(&gz, w.get(NAME)?, MatmulOpts::default(), self.mode)?)
            }
            _ => None,
        };
        let gw = match into_at(into, 1).filter(|dw| dw.shape() == out_in) {
            Some(dw) => {
                b.matmul_into_bf16(&gz_bf16, x, TN, dw)?;
                None
            }
            None => Some(b.matmul_bf16(&gz_bf16, x, TN)?),
        };
        let gbias = if need_bias {
            sum_rows_to(b, &gz, into_at(into, 2))?
        } else {
            None
        };
        Ok(self.with_residual(g, vec![gx, gw, gbias]))
    }

    /// The whole backward as one `LinearOps::linear_backward_into` when the tape gives the
    /// weight's buffer (and the bias's, when the bias needs a gradient); `None` (nothing run)
    /// otherwise.
    fn fused_into(
        &self,
        b: &B,
        g: &BTensor<B, T>,
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Option<Grads<B, T>>> {
        let [need_x, need_w, need_bias] = self.needs;
        let Some(x) = self.x.as_ref().filter(|_| need_w) else {
            return Ok(None);
        };
        let x = x.get(NAME)?;
        let (out, inp) = (g.shape()[1], x.shape()[1]);
        let Some(dw) = into_at(into, 1).filter(|dw| dw.shape() == [out, inp]) else {
            return Ok(None);
        };
        let db = into_at(into, 2).filter(|db| need_bias && db.shape() == [out]);
        if need_bias && db.is_none() {
            return Ok(None);
        }
        let w = match &self.w {
            Some(w) if need_x => Some(w.get(NAME)?),
            _ => None,
        };
        let (act, y) = match &self.y {
            Some(y) => (Activation::Tanh, Some(y.get(NAME)?)),
            None => (Activation::Identity, None),
        };
        // Under a reduced mode this is the per-call path (a tape without the trainer's
        // copies: a node with the weight's copy saves the input's too and takes
        // `backward_bf16`).
        let gx = match self.mode {
            MathMode::F32 => b.linear_backward_into(g, x, w, (act, y), (dw, db))?,
            mode => b.linear_backward_into_mode(g, x, w, (act, y), (dw, db), mode)?,
        };
        Ok(Some(self.with_residual(g, vec![gx, None, None])))
    }

    /// The inputs' gradients, with the residual's (the output's gradient) appended when the
    /// node has one.
    fn with_residual(&self, g: &BTensor<B, T>, mut grads: Grads<B, T>) -> Grads<B, T> {
        if self.residual {
            grads.push(Some(g.clone()));
        }
        grads
    }
}

impl<B: Ops<T>, T: Element> Tape<'_, B, T> {
    /// A Linear layer, `act(x · wᵀ + bias)` for `x [rows, in]`, `w [out, in]` (PyTorch's
    /// layout) and `bias [out]`, as one node (`zcompute::LinearOps::linear`). Backward keeps only
    /// what it reads: `x` when the weight needs a gradient, `w` when `x` does, the output for
    /// tanh.
    pub fn linear(
        &self,
        x: &Var<B, T>,
        w: &Var<B, T>,
        bias: &Var<B, T>,
        act: Activation,
    ) -> Result<Var<B, T>> {
        self.linear_node(x, w, bias, act, None)
    }

    /// A Linear layer with a residual added after the activation (a skip connection),
    /// `act(x · wᵀ + bias) + residual` for `residual [rows, out]`, as one node
    /// (`zcompute::LinearOps::linear_add`: the add is the product's epilogue on the device). Its
    /// backward is [`Tape::linear`]'s, and the residual's gradient is the output's. No
    /// activation: tanh's backward reads tanh's output, which the add would change.
    pub fn linear_add(
        &self,
        x: &Var<B, T>,
        w: &Var<B, T>,
        bias: &Var<B, T>,
        residual: &Var<B, T>,
    ) -> Result<Var<B, T>> {
        self.linear_node(x, w, bias, Activation::Identity, Some(residual))
    }

    /// `act(x · wᵀ + bias)`, plus `residual` when given (then `act` is the identity, so the
    /// saved output is tanh's only without one).
    fn linear_node(
        &self,
        x: &Var<B, T>,
        w: &Var<B, T>,
        bias: &Var<B, T>,
        act: Activation,
        residual: Option<&Var<B, T>>,
    ) -> Result<Var<B, T>> {
        let mut inputs = vec![x, w, bias];
        inputs.extend(residual);
        let tracked = self.tracks(NAME, &inputs)?;
        let mode = self.math_mode();
        let w_bf16 = self.bf16_weight(w);
        let needs = [x.requires_grad(), w.requires_grad(), bias.requires_grad()];
        // The input's copy, made once: the product below reads it, the backward keeps it.
        let x_bf16 = match &w_bf16 {
            Some(_) if tracked && needs[1] && self.bf16_operands_once() => {
                Some(self.save_bf16(x, "input")?)
            }
            _ => None,
        };
        let x_copy = x_bf16.as_ref().map(|x| x.get(NAME)).transpose()?;
        let y = self.run(tracked, |b| match (residual, mode, w_bf16.as_ref()) {
            // Under bf16 with the weight's copy: `linear_mode` on the copy (and on the input's,
            // when made), then the residual added in float32; the bias epilogue and the add
            // inside the product on the device.
            (residual, MathMode::Bf16, Some(copy)) => {
                let r = residual.map(|r| &r.value);
                match x_copy {
                    Some(x) => b.linear_bf16(x, copy, &bias.value, act, r),
                    None => b.linear_bf16_rhs(&x.value, copy, &bias.value, act, r),
                }
            }
            (Some(r), MathMode::F32, _) => {
                b.linear_add(&x.value, &w.value, &bias.value, act, &r.value)
            }
            (None, MathMode::F32, _) => b.linear(&x.value, &w.value, &bias.value, act),
            // The residual added in float32 after the product under the mode.
            (Some(r), mode, _) => b.add(
                &b.linear_mode(&x.value, &w.value, &bias.value, act, mode)?,
                &r.value,
            ),
            (None, mode, _) => b.linear_mode(&x.value, &w.value, &bias.value, act, mode),
        })?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let version = self.new_version();
        let node = LinearBackward {
            x: (needs[1] && x_bf16.is_none())
                .then(|| self.save(x, "input"))
                .transpose()?,
            x_bf16,
            w: needs[0].then(|| self.save(w, "weight")).transpose()?,
            y: (act == Activation::Tanh).then(|| self.save_output(&y, &version, "output")),
            needs,
            residual: residual.is_some(),
            mode,
            w_bf16: w_bf16.filter(|_| needs[0]),
        };
        Ok(self.push1(Box::new(node), &inputs, y, version))
    }
}
