//! The public door for a user's own op: [`CustomOp`], a forward and a backward over any
//! backend's op set, recorded by the tape like a built-in op ([`Tape::custom`]). Implement it
//! once generically (`impl<B: Ops<T>, T: Element> CustomOp<B, T> for MyOp`, from zcompute's
//! ops: it then runs on the CPU, the CUDA backend and the simulated device, eagerly and inside
//! a captured graph) or once per backend (`impl CustomOp<CpuBackend, f32>` with host loops
//! beside `impl<D: Driver> CustomOp<CudaBackend<D>, f32>` with the device's ops), as candle's
//! `CustomOp1` is one `cpu_fwd` and one `cuda_fwd`.
//!
//! What keeps a custom op correct under the trainer: the forward and backward only queue
//! backend ops (no `download`, no `upload`, no host synchronisation, which a capture refuses
//! with a typed error), the inputs and the output the backward reads are kept by the tape and
//! checked against in-place writes (`ModifiedInPlace`), and the backward returns one gradient
//! per input shaped as that input (checked: `ShapeMismatch`).

use super::only;
use crate::error::Result;
use crate::tape::{BackwardOp, Saved, Tape};
use crate::var::Var;
use zcompute::{BTensor, ComputeError, Element, Ops};

/// A user's differentiable op over backend `B` with elements `T`.
pub trait CustomOp<B: Ops<T>, T: Element> {
    /// The op's name, for errors and logs.
    fn name(&self) -> &'static str;

    /// The output from the inputs' values.
    fn forward(&self, backend: &B, inputs: &[&BTensor<B, T>]) -> zcompute::Result<BTensor<B, T>>;

    /// The gradient of each input (in input order, `None` for an input that takes none) from
    /// the output gradient `grad`, the inputs' values and the forward's output.
    fn backward(
        &self,
        backend: &B,
        inputs: &[&BTensor<B, T>],
        output: &BTensor<B, T>,
        grad: &BTensor<B, T>,
    ) -> zcompute::Result<Vec<Option<BTensor<B, T>>>>;
}

struct CustomBackward<Op, B: Ops<T>, T: Element> {
    op: Op,
    inputs: Vec<Saved<B, T>>,
    output: Saved<B, T>,
}

impl<Op: CustomOp<B, T>, B: Ops<T>, T: Element> BackwardOp<B, T> for CustomBackward<Op, B, T> {
    fn name(&self) -> &'static str {
        self.op.name()
    }

    fn backward(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
    ) -> Result<Vec<Option<BTensor<B, T>>>> {
        let name = self.op.name();
        let g = only(grads)?;
        let inputs = self
            .inputs
            .iter()
            .map(|s| s.get(name))
            .collect::<Result<Vec<_>>>()?;
        let out = self.op.backward(b, &inputs, self.output.get(name)?, g)?;
        if out.len() != inputs.len() {
            return Err(ComputeError::LengthMismatch {
                op: name,
                expected: inputs.len(),
                got: out.len(),
            }
            .into());
        }
        for (gi, x) in out.iter().zip(&inputs) {
            if let Some(gi) = gi
                && gi.shape() != x.shape()
            {
                return Err(ComputeError::ShapeMismatch {
                    op: name,
                    lhs: x.shape().into(),
                    rhs: gi.shape().into(),
                }
                .into());
            }
        }
        Ok(out)
    }
}

impl<'b, B: Ops<T>, T: Element> Tape<'b, B, T> {
    /// Runs a user's op (see [`CustomOp`]) and records its backward.
    pub fn custom<Op: CustomOp<B, T> + 'b>(
        &self,
        op: Op,
        inputs: &[&Var<B, T>],
    ) -> Result<Var<B, T>> {
        let tracked = self.tracks(op.name(), inputs)?;
        let values: Vec<&BTensor<B, T>> = inputs.iter().map(|v| &v.value).collect();
        let y = self.run(tracked, |b| op.forward(b, &values))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let version = self.new_version();
        let saved = inputs
            .iter()
            .map(|v| self.save(v, "input"))
            .collect::<Result<Vec<_>>>()?;
        let node = CustomBackward {
            output: self.save_output(&y, &version, "output"),
            inputs: saved,
            op,
        };
        Ok(self.push1(Box::new(node), inputs, y, version))
    }
}
