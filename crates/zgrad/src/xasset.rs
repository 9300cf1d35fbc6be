//! The XAsset model exactly as `reference/XASSET.md` specifies, at any size: embedding,
//! LayerNorm, QK-normalised attention with a residual, a tanh feed-forward block with a
//! residual, mean pooling over scales and a one-logit head. Parameters load from and save to
//! safetensors under XASSET.md's names.

use crate::error::{GradError, Result};
use crate::io::{HostTensor, TensorFile, read_tensors, take, write_tensors};
use crate::nn::{FeedForward, LayerNorm, Linear, QkNormAttention};
use crate::optim::ParameterSet;
use crate::tape::Tape;
use crate::var::Var;
use std::collections::HashMap;
use std::path::Path;
use zcompute::{Element, prelude::*};

/// The model's sizes. `scales` (S) is the data's, not a parameter's: the model runs on any S.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XAssetConfig {
    /// F: features per scale.
    pub features: usize,
    /// S: time scales per sample.
    pub scales: usize,
    /// D: model width.
    pub width: usize,
    /// H: attention heads (D must be divisible by H).
    pub heads: usize,
    /// FF: feed-forward width.
    pub ff: usize,
}

impl Default for XAssetConfig {
    fn default() -> Self {
        XAssetConfig {
            features: 193,
            scales: 12,
            width: 256,
            heads: 4,
            ff: 1024,
        }
    }
}

impl XAssetConfig {
    /// Refuses zero sizes and a width not divisible by the heads.
    pub fn validate(&self) -> Result<()> {
        let sizes = [self.features, self.scales, self.width, self.heads, self.ff];
        if sizes.contains(&0) {
            return Err(GradError::Config(format!("zero size in {self:?}")));
        }
        if !self.width.is_multiple_of(self.heads) {
            return Err(GradError::Config(format!(
                "width {} is not divisible by {} heads",
                self.width, self.heads
            )));
        }
        Ok(())
    }

    /// Number of trainable parameters (839,937 at the default size).
    #[must_use]
    pub fn parameter_count(&self) -> usize {
        let (f, d, ff) = (self.features, self.width, self.ff);
        let dh = d / self.heads.max(1);
        (d * f + d)
            + 2 * d
            + (3 * d * d + 3 * d)
            + 4 * dh
            + (d * d + d)
            + 2 * d
            + (ff * d + ff)
            + (d * ff + d)
            + (d + 1)
    }
}

/// The XAsset classifier. Cloning shares the parameters (a capture body holds a clone).
pub struct XAsset<B: Ops<T>, T: Element = f32> {
    pub config: XAssetConfig,
    pub emb: Linear<B, T>,
    pub ln1: LayerNorm<B, T>,
    pub attn: QkNormAttention<B, T>,
    pub ln2: LayerNorm<B, T>,
    pub ff: FeedForward<B, T>,
    pub head: Linear<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for XAsset<B, T> {
    fn clone(&self) -> Self {
        XAsset {
            config: self.config,
            emb: self.emb.clone(),
            ln1: self.ln1.clone(),
            attn: self.attn.clone(),
            ln2: self.ln2.clone(),
            ff: self.ff.clone(),
            head: self.head.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for XAsset<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XAsset")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The parameter names, in XASSET.md's order (also the order of `parameters()`).
pub const PARAMETER_NAMES: [&str; 20] = [
    "emb.weight",
    "emb.bias",
    "ln1.weight",
    "ln1.bias",
    "qkv.weight",
    "qkv.bias",
    "qn.weight",
    "qn.bias",
    "kn.weight",
    "kn.bias",
    "o.weight",
    "o.bias",
    "ln2.weight",
    "ln2.bias",
    "f1.weight",
    "f1.bias",
    "f2.weight",
    "f2.bias",
    "head.weight",
    "head.bias",
];

impl<B: Ops<T>, T: Element> XAsset<B, T> {
    /// PyTorch's default initialisation from `seed` (Linear weights and biases uniform in
    /// ±1/sqrt(in), LayerNorm weight 1 and bias 0): the values the `nn` blocks' own `init`
    /// draws, uploaded in one copy into the model's flat parameter buffer.
    pub fn init(b: &B, config: XAssetConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let values: Vec<Vec<T>> = crate::xasset_init::init_values(&config, seed)
            .into_iter()
            .map(|v| v.into_iter().map(T::from_f64).collect())
            .collect();
        let (_, vars) = ParameterSet::allocate(b, &Self::shapes(&config), Some(&values))?;
        Self::assemble(config, vars)
    }

    /// The model's flat parameter and gradient buffers (every parameter is a view of them, in
    /// XASSET.md's order, offsets padded to `optim::FLAT_ALIGN` elements). The data-parallel
    /// collective all-reduces `grads()`, this one buffer. A model one of whose parameters was
    /// replaced by a separately allocated one has none: `Config` error.
    pub fn parameter_set(&self) -> Result<ParameterSet<B, T>> {
        ParameterSet::of(&self.parameters()).ok_or_else(|| {
            GradError::Config(
                "the parameters are not views of one flat buffer (a parameter was replaced)".into(),
            )
        })
    }

    /// The flat parameter buffer (see [`XAsset::parameter_set`]).
    pub fn flat_parameters(&self) -> Result<zcompute::BTensor<B, T>> {
        Ok(self.parameter_set()?.values().clone())
    }

    /// The flat gradient buffer: the data-parallel collective all-reduces this one buffer
    /// (see [`XAsset::parameter_set`]).
    pub fn flat_gradients(&self) -> Result<zcompute::BTensor<B, T>> {
        Ok(self.parameter_set()?.grads().clone())
    }

    /// Every parameter with its XASSET.md name, in that order.
    #[must_use]
    pub fn named_parameters(&self) -> Vec<(&'static str, Var<B, T>)> {
        PARAMETER_NAMES
            .iter()
            .copied()
            .zip(self.parameters())
            .collect()
    }

    /// Every parameter, in XASSET.md's order.
    #[must_use]
    pub fn parameters(&self) -> Vec<Var<B, T>> {
        let a = &self.attn;
        [
            &self.emb.weight,
            &self.emb.bias,
            &self.ln1.weight,
            &self.ln1.bias,
            &a.qkv.weight,
            &a.qkv.bias,
            &a.qn.weight,
            &a.qn.bias,
            &a.kn.weight,
            &a.kn.bias,
            &a.o.weight,
            &a.o.bias,
            &self.ln2.weight,
            &self.ln2.bias,
            &self.ff.f1.weight,
            &self.ff.f1.bias,
            &self.ff.f2.weight,
            &self.ff.f2.bias,
            &self.head.weight,
            &self.head.bias,
        ]
        .into_iter()
        .cloned()
        .collect()
    }

    /// Builds the model from host tensors named as in XASSET.md; sizes come from the shapes
    /// (D and F from emb.weight, FF from f1.weight, dh from qn.weight, H = D / dh, S from `x`
    /// when the file has it).
    pub fn from_tensors(b: &B, file: &TensorFile<T>, path: &Path) -> Result<Self> {
        let emb = take(file, path, "emb.weight", None)?;
        let [d, f] = emb.shape[..] else {
            return Err(GradError::BadTensorFile {
                file: path.display().to_string(),
                name: "emb.weight".into(),
                problem: format!("shape {:?} is not [D, F]", emb.shape),
            });
        };
        let ff = take(file, path, "f1.weight", None)?
            .shape
            .first()
            .copied()
            .unwrap_or(0);
        let dh = take(file, path, "qn.weight", None)?
            .shape
            .first()
            .copied()
            .unwrap_or(0);
        let scales = file.tensors.get("x").and_then(|x| x.shape.get(1).copied());
        let config = XAssetConfig {
            features: f,
            scales: scales.unwrap_or(XAssetConfig::default().scales),
            width: d,
            heads: d.checked_div(dh).unwrap_or(0),
            ff,
        };
        config.validate()?;
        if dh * config.heads != d {
            return Err(GradError::Config(format!(
                "qn.weight width {dh} does not divide D = {d}"
            )));
        }
        let shapes = Self::shapes(&config);
        let mut values = Vec::with_capacity(PARAMETER_NAMES.len());
        for (name, shape) in PARAMETER_NAMES.iter().zip(&shapes) {
            let t = take(file, path, name, Some(shape))?;
            values.push(t.data.iter().map(|v| T::from_f64(v.to_f64())).collect());
        }
        let (_, vars) = ParameterSet::allocate(b, &shapes, Some(&values))?;
        Self::assemble(config, vars)
    }

    /// The model with every parameter zero, made on the device without host data: the same
    /// persistent allocations as [`XAsset::init`], for memory plans (`crate::plan`) where a
    /// host copy of a large model's parameters would cost more than the plan itself.
    pub fn zeroed(b: &B, config: XAssetConfig) -> Result<Self> {
        config.validate()?;
        let (_, vars) = ParameterSet::allocate(b, &Self::shapes(&config), None)?;
        Self::assemble(config, vars)
    }

    /// Loads a parameter file (F32 or F64).
    pub fn load(b: &B, path: &Path) -> Result<Self> {
        Self::from_tensors(b, &read_tensors(path)?, path)
    }

    /// Downloads every parameter to the host, by name.
    pub fn to_host(&self, b: &B) -> Result<Vec<(String, HostTensor<T>)>> {
        self.named_parameters()
            .into_iter()
            .map(|(name, v)| {
                Ok((
                    name.to_string(),
                    HostTensor {
                        shape: v.shape().to_vec(),
                        data: v.to_vec(b)?,
                    },
                ))
            })
            .collect()
    }

    /// Saves every parameter under its XASSET.md name (in `T`'s dtype).
    pub fn save(
        &self,
        b: &B,
        path: &Path,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<()> {
        write_tensors(path, &self.to_host(b)?, metadata)
    }

    /// The shapes of the parameters in order, PyTorch's `[out, in]` layout.
    #[must_use]
    pub fn shapes(c: &XAssetConfig) -> Vec<Vec<usize>> {
        let (f, d, ff) = (c.features, c.width, c.ff);
        let dh = d / c.heads.max(1);
        vec![
            vec![d, f],
            vec![d],
            vec![d],
            vec![d],
            vec![3 * d, d],
            vec![3 * d],
            vec![dh],
            vec![dh],
            vec![dh],
            vec![dh],
            vec![d, d],
            vec![d],
            vec![d],
            vec![d],
            vec![ff, d],
            vec![ff],
            vec![d, ff],
            vec![d],
            vec![1, d],
            vec![1],
        ]
    }

    fn assemble(config: XAssetConfig, vars: Vec<Var<B, T>>) -> Result<Self> {
        let n = vars.len();
        let v: [Var<B, T>; 20] = vars
            .try_into()
            .map_err(|_| GradError::Config(format!("XAsset has 20 parameters, got {n}")))?;
        let [
            ew,
            eb,
            l1w,
            l1b,
            qw,
            qb,
            qnw,
            qnb,
            knw,
            knb,
            ow,
            ob,
            l2w,
            l2b,
            f1w,
            f1b,
            f2w,
            f2b,
            hw,
            hb,
        ] = v;
        let linear = |weight, bias| Linear { weight, bias };
        let ln = |weight, bias| LayerNorm {
            weight,
            bias,
            eps: crate::nn::LN_EPS,
        };
        Ok(XAsset {
            config,
            emb: linear(ew, eb),
            ln1: ln(l1w, l1b),
            attn: QkNormAttention {
                qkv: linear(qw, qb),
                qn: ln(qnw, qnb),
                kn: ln(knw, knb),
                o: linear(ow, ob),
                heads: config.heads,
            },
            ln2: ln(l2w, l2b),
            ff: FeedForward {
                f1: linear(f1w, f1b),
                f2: linear(f2w, f2b),
            },
            head: linear(hw, hb),
        })
    }

    /// XASSET.md steps 1-6: `x [B, S, F]` to the residual stream `h [B, S, D]` before
    /// pooling. The residual add before `ln2` and `ln2` are one fused op.
    fn trunk(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        let &[_batch, _scales, features] = x.shape() else {
            return Err(GradError::BadInput(format!(
                "x must be [B, S, F], got {:?}",
                x.shape()
            )));
        };
        if features != self.config.features {
            return Err(GradError::BadInput(format!(
                "x has {features} features, the model {}",
                self.config.features
            )));
        }
        let h = self.emb.forward(tape, x)?;
        // h goes on past ln1: its gradient from the residual add joins ln1's in one kernel.
        let (h, u) = self.ln1.forward_stream(tape, &h)?;
        let attended = self.attn.forward(tape, &u)?;
        let eps = T::from_f64(self.ln2.eps);
        let (h, u) = tape.add_layer_norm(&h, &attended, &self.ln2.weight, &self.ln2.bias, eps)?;
        // h + ff(u): the add is the f2 product's epilogue.
        self.ff.forward_add(tape, &u, &h)
    }

    /// `x [B, S, F] -> logits [B]` (XASSET.md steps 1-8).
    pub fn forward(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        let h = self.trunk(tape, x)?;
        let batch = h.shape()[0];
        let pooled = tape.mean(&h, 1, false)?;
        let logit = self.head.forward(tape, &pooled)?;
        tape.reshape(&logit, &[batch])
    }

    /// Mean BCE-with-logits of the batch (XASSET.md step 9) and the logits. Pooling, the head
    /// and the loss run as one fused op, whose logits are detached (for reporting); with
    /// targets that need a gradient, the unfused path.
    pub fn loss(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        y: &Var<B, T>,
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        if y.requires_grad() {
            let logits = self.forward(tape, x)?;
            return Ok((tape.bce_with_logits(&logits, y)?, logits));
        }
        let h = self.trunk(tape, x)?;
        tape.pool_head_bce(&h, &self.head.weight, &self.head.bias, y)
    }
}
