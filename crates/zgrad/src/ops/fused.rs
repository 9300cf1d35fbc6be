//! The fused ops of zcompute (`zcompute::fused`) on the tape, with their backward: the bias
//! epilogue after a product (`bias_act`), the residual add with LayerNorm (`add_layer_norm`)
//! and the model's tail, mean-pool + head + BCE (`pool_head_bce`). Each is one kernel forward
//! and one (plus a deterministic column reduction for a bias) backward on the device, where the
//! unfused ops took two to ten.

use super::reshape_any;
use crate::error::Result;
use crate::memory::ClassGuard;
use crate::tape::{BackwardOp, Saved, Tape};
use crate::var::Var;
use zcompute::{Activation, BTensor, Element, prelude::*};

type Grads<B, T> = Vec<Option<BTensor<B, T>>>;

/// Sums every axis but the last: `[..., n] -> [n]` (one column reduction on the device).
fn sum_rows<B: Ops<T>, T: Element>(b: &B, t: &BTensor<B, T>) -> Result<BTensor<B, T>> {
    let n = t.shape().last().copied().unwrap_or(1);
    let rows = t.numel() / n.max(1);
    let flat = reshape_any(b, t, &[rows, n])?;
    Ok(b.sum(&flat, 0, false)?)
}

/// A parameter's column-sum gradient `[..., n] -> [n]`: added into `dst` (the parameter's dense
/// gradient buffer, when the tape gave one shaped `[n]`) and `None` returned, else returned.
pub(super) fn sum_rows_to<B: Ops<T>, T: Element>(
    b: &B,
    t: &BTensor<B, T>,
    dst: Option<&BTensor<B, T>>,
) -> Result<Option<BTensor<B, T>>> {
    let n = t.shape().last().copied().unwrap_or(1);
    match dst {
        Some(dst) if dst.shape() == [n] => {
            b.sum_rows_into(t, dst)?;
            Ok(None)
        }
        _ => Ok(Some(sum_rows(b, t)?)),
    }
}

/// A LayerNorm's weight and bias gradients: column sums of `g * xhat` (when computed) and of
/// the output gradient `g` (when the bias needs one), each added into the tape's buffer `into`
/// names at `at` (weight) and `at + 1` (bias) when it gave one.
pub(super) fn layer_norm_param_grads<B: Ops<T>, T: Element>(
    b: &B,
    g_xhat: Option<BTensor<B, T>>,
    g: &BTensor<B, T>,
    bias_needed: bool,
    into: &[Option<&BTensor<B, T>>],
    at: usize,
) -> Result<[Option<BTensor<B, T>>; 2]> {
    let gw = match g_xhat {
        Some(t) => sum_rows_to(b, &t, into_at(into, at))?,
        None => None,
    };
    let gb = if bias_needed {
        sum_rows_to(b, g, into_at(into, at + 1))?
    } else {
        None
    };
    Ok([gw, gb])
}

/// The tape's `[n]` buffers for a LayerNorm's weight (`at`) and bias (`at + 1`) gradients
/// when it gave one for every parameter that `needs` a gradient (and one does): then
/// LayerNorm's backward adds into them itself (`NormOps::layer_norm_backward_into`, one launch
/// on the device for few rows). `None` otherwise: the caller takes the unfused path; also when
/// both are one buffer (one parameter as weight and bias), which that op refuses as aliased.
pub(super) fn layer_norm_param_buffers<'a, S: zcompute::Storage>(
    into: &[Option<&'a zcompute::Tensor<S>>],
    at: usize,
    n: usize,
    needs: [bool; 2],
) -> Option<[Option<&'a zcompute::Tensor<S>>; 2]> {
    if !(needs[0] || needs[1]) {
        return None;
    }
    let mut out = [None, None];
    for (k, need) in needs.into_iter().enumerate() {
        if need {
            out[k] = Some(into_at(into, at + k).filter(|d| d.shape() == [n])?);
        }
    }
    // The tape gives dense buffers: each spans `[offset, offset + n)` of its storage.
    if let [Some(dw), Some(db)] = out
        && dw.shares_storage(db)
        && dw.layout().offset().abs_diff(db.layout().offset()) < n
    {
        return None;
    }
    Some(out)
}

/// The tape's buffer for input `i`, if it gave one.
pub(super) fn into_at<'a, X>(into: &[Option<&'a X>], i: usize) -> Option<&'a X> {
    into.get(i).copied().flatten()
}

fn missing(op: &'static str) -> crate::GradError {
    zcompute::ComputeError::LengthMismatch {
        op,
        expected: 1,
        got: 0,
    }
    .into()
}

struct BiasActBackward<B: Ops<T>, T: Element> {
    /// The output, for tanh's backward (none for the identity).
    y: Option<Saved<B, T>>,
    needs: [bool; 2],
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for BiasActBackward<B, T> {
    fn name(&self) -> &'static str {
        "bias_act"
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        self.backward_into(b, grads, &[])
    }

    /// The bias's gradient, a column sum, goes straight into its buffer when the tape gives
    /// one.
    fn backward_into(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Grads<B, T>> {
        let g = super::only(grads)?;
        let gz = match &self.y {
            Some(y) => b.tanh_backward(g, y.get("bias_act")?)?,
            None => g.clone(),
        };
        let gb = if self.needs[1] {
            sum_rows_to(b, &gz, into_at(into, 1))?
        } else {
            None
        };
        Ok(vec![self.needs[0].then_some(gz), gb])
    }
}

struct AddLayerNormBackward<B: Ops<T>, T: Element> {
    sum: Saved<B, T>,
    mean: Saved<B, T>,
    rstd: Saved<B, T>,
    weight: Option<Saved<B, T>>,
    /// a or b, the weight, the bias.
    needs: [bool; 3],
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for AddLayerNormBackward<B, T> {
    fn name(&self) -> &'static str {
        "add_layer_norm"
    }

    /// `grads` are those of the sum `h` (the residual stream) and of `y = LN(h)`; `a` and `b`
    /// both get `g_h + LN'(g_y)`, from one kernel.
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
        const OP: &str = "add_layer_norm";
        let g_h = grads.first().and_then(Option::as_ref);
        let Some(g_y) = grads.get(1).and_then(Option::as_ref) else {
            let g = g_h.ok_or_else(|| missing("add_layer_norm backward (output gradient)"))?;
            let gin = self.needs[0].then(|| g.clone());
            return Ok(vec![gin.clone(), gin, None, None]);
        };
        let weight = self.weight.as_ref().map(|w| w.get(OP)).transpose()?;
        let (sum, mean, rstd) = (self.sum.get(OP)?, self.mean.get(OP)?, self.rstd.get(OP)?);
        let n = sum.shape().last().copied().unwrap_or(1);
        let needs = [self.needs[1], self.needs[2]];
        if let Some([dw, db]) = layer_norm_param_buffers(into, 2, n, needs) {
            let input = b.layer_norm_backward_into(
                &zcompute::LayerNormBackward {
                    g: g_y,
                    residual: g_h,
                    x: sum,
                    mean,
                    rstd,
                    weight,
                },
                self.needs[0],
                dw,
                db,
            )?;
            return Ok(vec![input.clone(), input, None, None]);
        }
        let grads = b.layer_norm_backward_add(
            &zcompute::LayerNormBackward {
                g: g_y,
                residual: g_h,
                x: sum,
                mean,
                rstd,
                weight,
            },
            [self.needs[0], self.needs[1]],
        )?;
        let [gw, gb] = layer_norm_param_grads(b, grads.g_xhat, g_y, self.needs[2], into, 2)?;
        Ok(vec![grads.input.clone(), grads.input, gw, gb])
    }
}

struct PoolHeadBceBackward<B: Ops<T>, T: Element> {
    h: Saved<B, T>,
    weight: Saved<B, T>,
    logits: Saved<B, T>,
    targets: Saved<B, T>,
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for PoolHeadBceBackward<B, T> {
    fn name(&self) -> &'static str {
        "pool_head_bce"
    }

    fn backward(&self, b: &B, grads: &[Option<BTensor<B, T>>]) -> Result<Grads<B, T>> {
        self.backward_into(b, grads, &[])
    }

    /// With both the weight's and the bias's buffers given, the backward adds their gradients
    /// into them itself (on the device, from its kernels: no separate add).
    fn backward_into(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Grads<B, T>> {
        const OP: &str = "pool_head_bce";
        let g = super::only(grads)?;
        if let (Some(dw), Some(db)) = (into_at(into, 1), into_at(into, 2)) {
            let gh = b.pool_head_bce_backward_into(
                g,
                self.h.get(OP)?,
                self.weight.get(OP)?,
                self.logits.get(OP)?,
                self.targets.get(OP)?,
                [dw, db],
            )?;
            return Ok(vec![Some(gh), None, None]);
        }
        let r = b.pool_head_bce_backward(
            g,
            self.h.get(OP)?,
            self.weight.get(OP)?,
            self.logits.get(OP)?,
            self.targets.get(OP)?,
        )?;
        Ok(vec![Some(r.h), Some(r.weight), Some(r.bias)])
    }
}

impl<'b, B: Ops<T>, T: Element> Tape<'b, B, T> {
    /// `act(x + bias)` for `x` `[..., n]` and `bias` `[n]`: the epilogue of a product in one
    /// kernel; backward is tanh's backward in one kernel and the bias's column sum.
    pub fn bias_act(&self, x: &Var<B, T>, bias: &Var<B, T>, act: Activation) -> Result<Var<B, T>> {
        let tracked = self.tracks("bias_act", &[x, bias])?;
        let y = self.run(tracked, |b| b.bias_act(&x.value, &bias.value, act))?;
        if !tracked {
            return Ok(self.constant(y));
        }
        let version = self.new_version();
        let node = BiasActBackward {
            y: (act == Activation::Tanh).then(|| self.save_output(&y, &version, "output")),
            needs: [x.requires_grad(), bias.requires_grad()],
        };
        Ok(self.push1(Box::new(node), &[x, bias], y, version))
    }

    /// The residual add with LayerNorm: `h = a + b` and `y = layer_norm(h)` in one kernel,
    /// returned as `(h, y)`; backward adds `h`'s gradient to LayerNorm's input gradient in the
    /// same kernel.
    pub fn add_layer_norm(
        &self,
        a: &Var<B, T>,
        b: &Var<B, T>,
        weight: &Var<B, T>,
        bias: &Var<B, T>,
        eps: T,
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        let tracked = self.tracks("add_layer_norm", &[a, b, weight, bias])?;
        let out = {
            let _class = tracked.then(|| ClassGuard::new(self.backend(), self.saved_class()));
            self.backend().add_layer_norm(
                &a.value,
                &b.value,
                Some(&weight.value),
                Some(&bias.value),
                eps,
            )?
        };
        if !tracked {
            return Ok((self.constant(out.sum), self.constant(out.norm.out)));
        }
        let (sum_version, stats) = (self.new_version(), self.new_version());
        let node = AddLayerNormBackward {
            sum: self.save_output(&out.sum, &sum_version, "sum"),
            mean: self.save_output(&out.norm.mean, &stats, "mean"),
            rstd: self.save_output(&out.norm.rstd, &stats, "rstd"),
            weight: Some(self.save(weight, "weight")?),
            needs: [
                a.requires_grad() || b.requires_grad(),
                weight.requires_grad(),
                bias.requires_grad(),
            ],
        };
        let outputs = vec![(out.sum, sum_version), (out.norm.out, self.new_version())];
        let mut vars = self.push(Box::new(node), &[a, b, weight, bias], outputs);
        let y = vars
            .pop()
            .ok_or_else(|| missing("add_layer_norm (outputs)"))?;
        let h = vars
            .pop()
            .ok_or_else(|| missing("add_layer_norm (outputs)"))?;
        Ok((h, y))
    }

    /// The model's tail: mean over axis 1 of `h` `[B, S, D]`, the head (`weight` `[1, D]`,
    /// `bias` `[1]`) and the mean BCE-with-logits against `targets` `[B]`, in one kernel
    /// forward and one backward. Returns the loss (rank 0) and the logits `[B]`, which are
    /// detached: no gradient flows back through them (nor to the targets, which are data). Use
    /// `matmul`, `bias_act` and `bce_with_logits` where either needs one.
    pub fn pool_head_bce(
        &self,
        h: &Var<B, T>,
        weight: &Var<B, T>,
        bias: &Var<B, T>,
        targets: &Var<B, T>,
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        let tracked = self.tracks("pool_head_bce", &[h, weight, bias])?;
        let out = {
            let _class = tracked.then(|| ClassGuard::new(self.backend(), self.saved_class()));
            self.backend()
                .pool_head_bce(&h.value, &weight.value, &bias.value, &targets.value)?
        };
        let logits = self.constant(out.logits.clone());
        if !tracked {
            return Ok((self.constant(out.loss), logits));
        }
        let logits_version = self.new_version();
        let node = PoolHeadBceBackward {
            h: self.save(h, "h")?,
            weight: self.save(weight, "weight")?,
            logits: self.save_output(&out.logits, &logits_version, "logits"),
            targets: self.save(targets, "targets")?,
        };
        let loss = self.push1(
            Box::new(node),
            &[h, weight, bias],
            out.loss,
            self.new_version(),
        );
        Ok((loss, logits))
    }
}
