//! The XAsset model exactly as `docs/xasset.md` specifies, at any size and depth: a
//! Linear embedding, L encoder blocks (`nn::EncoderBlock`: LayerNorm, QK-normalised attention
//! with a residual, a tanh feed-forward block with a residual) and the mean-pool + linear + BCE
//! head (`nn::PoolHead`). Parameters load from and save to safetensors under docs/xasset.md's names
//! (`blocks.{i}.<name>` when L > 1), so a PyTorch `state_dict` with those names loads.

use crate::error::{GradError, Result};
use crate::io::{HostTensor, TensorFile, write_tensors};
use crate::model::Model;
use crate::nn::{EncoderBlock, Linear, PoolHead};
use crate::optim::ParameterSet;
use crate::tape::Tape;
use crate::var::Var;
use std::collections::HashMap;
use std::path::Path;
use zcompute::{Element, prelude::*};

mod config;
pub use config::XAssetConfig;

/// The XAsset classifier: the embedding, `config.layers` encoder blocks and the head. Cloning
/// shares the parameters (a capture body holds a clone).
pub struct XAsset<B: Ops<T>, T: Element = f32> {
    pub config: XAssetConfig,
    pub emb: Linear<B, T>,
    pub blocks: Vec<EncoderBlock<B, T>>,
    pub head: PoolHead<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for XAsset<B, T> {
    fn clone(&self) -> Self {
        XAsset {
            config: self.config,
            emb: self.emb.clone(),
            blocks: self.blocks.clone(),
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

/// The parameter names of the one-block model, in docs/xasset.md's order (also the order of
/// `parameters()` at `layers` 1; [`XAssetConfig::parameter_names`] gives them at any depth).
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

/// Names a parameter file may hold beside the parameters: the oracle's inputs (`x`, `y`) and,
/// in a checkpoint, the optimiser's state (`optim.*`), which a parameter load does not take.
fn is_known_extra(name: &str) -> bool {
    name == "x" || name == "y" || name.starts_with("optim.")
}

impl<B: Ops<T>, T: Element> XAsset<B, T> {
    /// PyTorch's default initialisation from `seed` (Linear weights and biases uniform in
    /// ±1/sqrt(in), LayerNorm weight 1 and bias 0): the values the `nn` modules' own `init`
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
    /// parameter order, offsets padded to `optim::FLAT_ALIGN` elements). The data-parallel
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

    /// Every parameter with its name ([`XAssetConfig::parameter_names`]), in that order.
    #[must_use]
    pub fn named_parameters(&self) -> Vec<(String, Var<B, T>)> {
        self.config
            .parameter_names()
            .into_iter()
            .zip(self.parameters())
            .collect()
    }

    /// Every parameter: the embedding's, each block's (`EncoderBlock::parameters`), the head's.
    #[must_use]
    pub fn parameters(&self) -> Vec<Var<B, T>> {
        let mut out = vec![self.emb.weight.clone(), self.emb.bias.clone()];
        for block in &self.blocks {
            out.extend(block.parameters());
        }
        out.extend([
            self.head.linear.weight.clone(),
            self.head.linear.bias.clone(),
        ]);
        out
    }

    /// Builds the model from host tensors named as [`XAssetConfig::parameter_names`] says, its
    /// sizes read from them ([`XAssetConfig::of_file`]). Every tensor is checked first: the
    /// missing ones, the ones of another shape and the ones no parameter has that name (other
    /// than `x`, `y` and `optim.*`) are all named in one `ParameterMismatch`.
    pub fn from_tensors(b: &B, file: &TensorFile<T>, path: &Path) -> Result<Self> {
        let (config, _) = XAssetConfig::of_file(file, path)?;
        Self::from_tensors_as(b, file, path, config)
    }

    /// [`XAsset::from_tensors`] for a model of the sizes `asked` (`scales` is compared only
    /// when the file has `x`): a file of other sizes is a `ModelMismatch` naming each
    /// difference. The library call under `ztrain --init-from`.
    pub fn from_tensors_checked(
        b: &B,
        file: &TensorFile<T>,
        path: &Path,
        asked: &XAssetConfig,
    ) -> Result<Self> {
        let (found, has_scales) = XAssetConfig::of_file(file, path)?;
        let differences = found.differences(asked, has_scales);
        if !differences.is_empty() {
            return Err(GradError::ModelMismatch {
                file: path.display().to_string(),
                differences,
            });
        }
        Self::from_tensors_as(b, file, path, *asked)
    }

    fn from_tensors_as(
        b: &B,
        file: &TensorFile<T>,
        path: &Path,
        config: XAssetConfig,
    ) -> Result<Self> {
        config.validate()?;
        let names = config.parameter_names();
        let shapes = Self::shapes(&config);
        let (mut missing, mut misshapen) = (Vec::new(), Vec::new());
        for (name, shape) in names.iter().zip(&shapes) {
            match file.tensors.get(name) {
                None => missing.push(name.clone()),
                Some(t) if &t.shape != shape => {
                    misshapen.push(format!("{name} {:?} (the model's {shape:?})", t.shape));
                }
                Some(_) => {}
            }
        }
        let extra: Vec<String> = file
            .tensors
            .keys()
            .filter(|n| !is_known_extra(n) && !names.contains(n))
            .cloned()
            .collect();
        if !(missing.is_empty() && misshapen.is_empty() && extra.is_empty()) {
            return Err(GradError::ParameterMismatch {
                file: path.display().to_string(),
                missing,
                extra,
                misshapen,
            });
        }
        let values: Vec<Vec<T>> = names.iter().map(|n| file.tensors[n].data.clone()).collect();
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

    /// Loads a parameter file (F32 or F64 tensors: a PyTorch `state_dict` saved with
    /// safetensors, an oracle input, or a checkpoint, whose optimiser and run state it leaves
    /// out), its sizes read from the file.
    pub fn load(b: &B, path: &Path) -> Result<Self> {
        Self::from_tensors(b, &crate::checkpoint::read_parameter_file(path)?, path)
    }

    /// [`XAsset::load`] for a model of the sizes `asked` ([`XAsset::from_tensors_checked`]).
    pub fn load_checked(b: &B, path: &Path, asked: &XAssetConfig) -> Result<Self> {
        let file = crate::checkpoint::read_parameter_file(path)?;
        Self::from_tensors_checked(b, &file, path, asked)
    }

    /// Downloads every parameter to the host, by name.
    pub fn to_host(&self, b: &B) -> Result<Vec<(String, HostTensor<T>)>> {
        self.named_parameters()
            .into_iter()
            .map(|(name, v)| {
                Ok((
                    name,
                    HostTensor {
                        shape: v.shape().to_vec(),
                        data: v.to_vec(b)?,
                    },
                ))
            })
            .collect()
    }

    /// Saves every parameter under its name (in `T`'s dtype).
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
        c.shapes()
    }

    fn assemble(config: XAssetConfig, vars: Vec<Var<B, T>>) -> Result<Self> {
        let want = 4 + 16 * config.layers;
        if vars.len() != want {
            return Err(GradError::Config(format!(
                "XAsset with {} blocks has {want} parameters, got {}",
                config.layers,
                vars.len()
            )));
        }
        let mut vars = vars.into_iter();
        let mut next = || {
            vars.next()
                .ok_or_else(|| GradError::Config("too few".into()))
        };
        let emb = Linear {
            weight: next()?,
            bias: next()?,
        };
        let blocks = (0..config.layers)
            .map(|_| {
                let block: Result<Vec<_>> = (0..16).map(|_| next()).collect();
                EncoderBlock::from_parameters(block?, config.heads)
            })
            .collect::<Result<Vec<_>>>()?;
        let head = PoolHead {
            linear: Linear {
                weight: next()?,
                bias: next()?,
            },
        };
        Ok(XAsset {
            config,
            emb,
            blocks,
            head,
        })
    }

    /// docs/xasset.md steps 1-7: `x [B, S, F]` to the residual stream `h [B, S, D]` before
    /// pooling (the embedding, then every block on the stream the previous one left).
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
        let mut h = self.emb.forward(tape, x)?;
        for block in &self.blocks {
            h = block.forward(tape, &h)?;
        }
        Ok(h)
    }

    /// `x [B, S, F] -> logits [B]` (docs/xasset.md steps 1-8).
    pub fn forward(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        let h = self.trunk(tape, x)?;
        self.head.forward(tape, &h)
    }

    /// Mean BCE-with-logits of the batch (docs/xasset.md step 9) and the logits. Pooling, the head
    /// and the loss run as one fused op, whose logits are detached (for reporting); with
    /// targets that need a gradient, the unfused path (`nn::PoolHead::loss`).
    pub fn loss(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        y: &Var<B, T>,
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        let h = self.trunk(tape, x)?;
        self.head.loss(tape, &h, y)
    }
}

/// XAsset through its inherent methods: parameter names of docs/xasset.md, the fused
/// pool-head-BCE loss, samples `[S, F]` for any S.
impl<B: Ops<T> + 'static, T: Element> Model<B, T> for XAsset<B, T> {
    fn named_parameters(&self) -> Vec<(String, Var<B, T>)> {
        XAsset::named_parameters(self)
            .into_iter()
            .map(|(name, v)| (name.to_string(), v))
            .collect()
    }

    fn loss(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        y: &Var<B, T>,
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        XAsset::loss(self, tape, x, y)
    }

    fn sample_shape(&self, values_per_sample: usize) -> Result<Vec<usize>> {
        let f = self.config.features;
        if values_per_sample == 0 || !values_per_sample.is_multiple_of(f) {
            return Err(GradError::BadInput(format!(
                "a sample of {values_per_sample} values: XAsset takes S x {f} (S >= 1 scales of {f} features)"
            )));
        }
        Ok(vec![values_per_sample / f, f])
    }

    fn logits(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        XAsset::forward(self, tape, x)
    }

    fn parameters(&self) -> Vec<Var<B, T>> {
        XAsset::parameters(self)
    }
}

/// XAsset at these sizes, made with zero parameters on the device (`XAsset::zeroed`).
impl crate::plan::PlanModel for XAssetConfig {
    type Model = XAsset<crate::plan::PlanBackend, f32>;

    fn validate(&self) -> Result<()> {
        XAssetConfig::validate(self)
    }

    fn values_per_sample(&self) -> usize {
        self.scales * self.features
    }

    fn build(&self, b: &crate::plan::PlanBackend) -> Result<Self::Model> {
        XAsset::zeroed(b, *self)
    }
}

#[cfg(test)]
mod bucket_tests;

#[cfg(test)]
mod tests {
    use super::{XAsset, XAssetConfig};
    use crate::error::GradError;
    use crate::model::Model;
    use zcompute::CpuBackend;

    #[test]
    fn xasset_through_the_trait_keeps_its_names_order_and_sample_shape() {
        let c = XAssetConfig {
            features: 3,
            scales: 2,
            width: 4,
            heads: 2,
            ff: 8,
            layers: 1,
        };
        let m = XAsset::<_, f32>::init(&CpuBackend, c, 1).unwrap();
        let named = Model::named_parameters(&m);
        assert_eq!(named.len(), XAsset::named_parameters(&m).len());
        for ((n, v), (want, w)) in named.iter().zip(XAsset::named_parameters(&m)) {
            assert_eq!(n, &want);
            assert!(v.value().shares_storage(w.value()));
        }
        assert_eq!(m.sample_shape(6).unwrap(), [2, 3]);
        assert_eq!(m.sample_shape(15).unwrap(), [5, 3]);
        for bad in [0, 4] {
            assert!(matches!(m.sample_shape(bad), Err(GradError::BadInput(_))));
        }
        assert!(Model::parameter_set(&m).is_ok());
    }
}
