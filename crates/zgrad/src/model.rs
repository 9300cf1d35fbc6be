//! The model abstraction the trainer is generic over: what a model must give (its named
//! parameters in one fixed order, its loss on a tape, the shape of one sample's input), and
//! what every model then gets (flat buffers, host copies, safetensors files). `XAsset`
//! implements it here, delegating to its inherent methods; a model of your own does the same
//! in a few lines (`docs/guide.md`, "A model of your own").
//!
//! A model states its target contract ([`Model::task`], [`Task`]): what it outputs per
//! sample and what its targets are (binary by default; XAsset is binary). The loss is the
//! model's own (the trainer differentiates it; [`Tape::task_loss`] is the task's usual one);
//! the trainer, `evaluate` and `predict` check every output and target shape against the
//! task, and `Trainer::evaluate` reports the task's loss and metrics.
//!
//! [`ParameterBuilder`] makes a model's parameters as views of one flat buffer (one
//! [`ParameterSet`]), which is what gives the trainer its fixed-cost whole-model work (one
//! `zero_grad` memset, one AdamW launch, one all-reduce in data parallel).

use crate::error::{GradError, Result};
use crate::io::{HostTensor, write_tensors};
use crate::optim::ParameterSet;
use crate::rng::SplitMix64;
use crate::tape::Tape;
use crate::task::Task;
use crate::var::Var;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use zcompute::{BTensor, Element, prelude::*};

/// A model the trainer can train (see the module docs). Cloning must share the parameters
/// (a captured graph's body holds a clone): hold them as `Var`s, which are handles.
pub trait Model<B: Ops<T>, T: Element>: Clone + 'static {
    /// Parameters with their names, in one fixed order: the flat buffers' order, the
    /// checkpoint's (safetensors) names, a PyTorch `state_dict`'s names.
    fn named_parameters(&self) -> Vec<(String, Var<B, T>)>;

    /// What the model outputs per sample and what its targets are (see [`Task`]). Binary
    /// (one logit, a label in {0, 1}) unless the model says otherwise; every output, target
    /// and loss shape is checked against it, so a model that outputs anything else must say
    /// so here.
    fn task(&self) -> Task {
        Task::binary()
    }

    /// Mean loss over the batch (rank 0) and the outputs `[batch, ..Task::output_shape]`
    /// (detached is fine), for inputs `x [batch, ..sample shape]` and targets
    /// `y [batch, ..Task::target_shape]`. The trainer calls it in step scopes, eagerly and
    /// inside graph captures: use tape ops only (no host reads).
    fn loss(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        y: &Var<B, T>,
    ) -> Result<(Var<B, T>, Var<B, T>)>;

    /// The shape of one sample's input given its number of values (the trainer's batches are
    /// `[batch, ..this]` row-major). Refuses lengths the model cannot take with a typed
    /// `BadInput` error that says what it takes.
    fn sample_shape(&self, values_per_sample: usize) -> Result<Vec<usize>>;

    /// The outputs `[batch, ..Task::output_shape]` of `x` (evaluation, in no-grad mode). By
    /// default the outputs `loss` returns for all-zero targets; override it when the model
    /// can skip the loss.
    fn logits(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        let batch = x.shape().first().copied().unwrap_or(0);
        let shape = Task::batched(batch, &self.task().target_shape());
        let y = Var::constant(tape.backend().zeros(&shape)?);
        Ok(self.loss(tape, x, &y)?.1)
    }

    /// Every parameter, in `named_parameters`' order.
    fn parameters(&self) -> Vec<Var<B, T>> {
        self.named_parameters()
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    /// The model's flat parameter and gradient buffers (every parameter a view of them, in
    /// order). A model whose parameters are not views of one flat buffer (not made by
    /// [`ParameterBuilder`] or `ParameterSet::allocate`, or one was replaced) has none:
    /// `Config` error. The trainer works either way; flat buffers make it cheaper.
    fn parameter_set(&self) -> Result<ParameterSet<B, T>> {
        ParameterSet::of(&self.parameters()).ok_or_else(|| {
            GradError::Config(
                "the parameters are not views of one flat buffer (made separately, or a parameter was replaced)"
                    .into(),
            )
        })
    }

    /// The flat parameter buffer (see [`Model::parameter_set`]).
    fn flat_parameters(&self) -> Result<BTensor<B, T>> {
        Ok(self.parameter_set()?.values().clone())
    }

    /// The flat gradient buffer: the data-parallel collective all-reduces this one buffer
    /// (see [`Model::parameter_set`]).
    fn flat_gradients(&self) -> Result<BTensor<B, T>> {
        Ok(self.parameter_set()?.grads().clone())
    }

    /// Downloads every parameter to the host, by name, in order.
    fn to_host(&self, b: &B) -> Result<Vec<(String, HostTensor<T>)>> {
        self.named_parameters()
            .into_iter()
            .map(|(name, v)| {
                let shape = v.shape().to_vec();
                Ok((
                    name,
                    HostTensor {
                        shape,
                        data: v.to_vec(b)?,
                    },
                ))
            })
            .collect()
    }

    /// Saves every parameter under its name (safetensors, in `T`'s dtype): the file a
    /// PyTorch `load_state_dict` of a module with the same names reads.
    fn save(&self, b: &B, path: &Path, metadata: Option<HashMap<String, String>>) -> Result<()> {
        write_tensors(path, &self.to_host(b)?, metadata)
    }
}

/// How a [`ParameterBuilder`] fills a parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// Every value `c`.
    Constant(f64),
    /// Uniform in `[-bound, bound)`, drawn from the builder's generator in the order the
    /// parameters were added (PyTorch's default for a Linear layer: `bound = 1/sqrt(in)`).
    Uniform { bound: f64 },
    /// These values, row-major (as many as the shape holds).
    Values(Vec<f64>),
}

/// Builds a model's parameters as views of ONE flat parameter buffer and one gradient buffer
/// (`ParameterSet::allocate`): names and shapes in order, values from a seeded generator or
/// given, one upload for the whole model.
///
/// ```
/// use zcompute::CpuBackend;
/// use zgrad::model::{Init, ParameterBuilder};
///
/// let mut p = ParameterBuilder::new(7);
/// p.linear("l1", 6, 4).linear("l2", 4, 1).add("scale", &[1], Init::Constant(1.0));
/// let params = p.build::<_, f32>(&CpuBackend)?; // [(name, Var)], one flat buffer
/// assert_eq!(params[0].0, "l1.weight");
/// assert_eq!(params[0].1.shape(), &[4, 6]);
/// assert!(zgrad::ParameterSet::of(&params.iter().map(|p| p.1.clone()).collect::<Vec<_>>()).is_some());
/// # Ok::<(), zgrad::GradError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ParameterBuilder {
    rng: SplitMix64,
    entries: Vec<(String, Vec<usize>, Vec<f64>)>,
    /// The first problem met while adding (reported by `build`, so `add` chains).
    problem: Option<String>,
}

impl ParameterBuilder {
    /// An empty builder whose `Uniform` draws come from `SplitMix64::new(seed)`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        ParameterBuilder {
            rng: SplitMix64::new(seed),
            entries: Vec::new(),
            problem: None,
        }
    }

    /// Adds parameter `name` of `shape`, filled as `init` says. A repeated name, or values
    /// that do not fill the shape, make `build` fail naming it.
    pub fn add(&mut self, name: &str, shape: &[usize], init: Init) -> &mut Self {
        let numel: usize = shape.iter().product();
        let values = match init {
            Init::Constant(c) => vec![c; numel],
            Init::Uniform { bound } => self.rng.uniform_vec(numel, -bound, bound),
            Init::Values(v) => v,
        };
        if self.problem.is_none() {
            if self.entries.iter().any(|(n, _, _)| n == name) {
                self.problem = Some(format!("parameter `{name}` added twice"));
            } else if values.len() != numel {
                self.problem = Some(format!(
                    "parameter `{name}` of shape {shape:?} holds {numel} values, {} given",
                    values.len()
                ));
            }
        }
        self.entries
            .push((name.to_string(), shape.to_vec(), values));
        self
    }

    /// A Linear layer's `{prefix}.weight [outputs, inputs]` and `{prefix}.bias [outputs]`,
    /// initialised as PyTorch's `nn.Linear` (and `nn::Linear::init` from the same generator):
    /// uniform in ±1/sqrt(inputs), the weight drawn first.
    pub fn linear(&mut self, prefix: &str, inputs: usize, outputs: usize) -> &mut Self {
        let bound = 1.0 / (inputs.max(1) as f64).sqrt();
        self.add(
            &format!("{prefix}.weight"),
            &[outputs, inputs],
            Init::Uniform { bound },
        )
        .add(
            &format!("{prefix}.bias"),
            &[outputs],
            Init::Uniform { bound },
        )
    }

    /// The parameters in the order added, each a view of the flat buffers (persistent), with
    /// their names. Fails with `BadInput` naming the first problem met while adding.
    pub fn build<B: Ops<T>, T: Element>(&self, b: &B) -> Result<Vec<(String, Var<B, T>)>> {
        if let Some(p) = &self.problem {
            return Err(GradError::BadInput(p.clone()));
        }
        let shapes: Vec<Vec<usize>> = self.entries.iter().map(|(_, s, _)| s.clone()).collect();
        let values: Vec<Vec<T>> = self
            .entries
            .iter()
            .map(|(_, _, v)| v.iter().map(|&x| T::from_f64(x)).collect())
            .collect();
        let (_, vars) = ParameterSet::allocate(b, &shapes, Some(&values))?;
        Ok(self
            .entries
            .iter()
            .map(|(n, _, _)| n.clone())
            .zip(vars)
            .collect())
    }

    /// The parameters' names in order.
    #[must_use]
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|(n, _, _)| n.as_str()).collect()
    }
}

/// Checks that names are unique (a checkpoint keys tensors by name).
pub(crate) fn unique_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<()> {
    let mut seen = HashSet::new();
    for n in names {
        if !seen.insert(n) {
            return Err(GradError::Config(format!(
                "parameter name `{n}` appears twice: checkpoints key tensors by name"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Init, ParameterBuilder, unique_names};
    use crate::error::GradError;
    use zcompute::CpuBackend;

    #[test]
    fn the_builder_makes_one_flat_set_in_order_and_matches_linear_init() {
        let mut p = ParameterBuilder::new(3);
        p.linear("a", 5, 2)
            .add("c", &[2, 2], Init::Values(vec![1.0, 2.0, 3.0, 4.0]));
        let params = p.build::<_, f64>(&CpuBackend).unwrap();
        let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a.weight", "a.bias", "c"]);
        let vars: Vec<_> = params.iter().map(|(_, v)| v.clone()).collect();
        assert!(crate::ParameterSet::of(&vars).is_some());
        let mut rng = crate::rng::SplitMix64::new(3);
        let lin = crate::nn::Linear::<_, f64>::init(&CpuBackend, 5, 2, &mut rng).unwrap();
        assert_eq!(
            vars[0].to_vec(&CpuBackend).unwrap(),
            lin.weight.to_vec(&CpuBackend).unwrap()
        );
        assert_eq!(
            vars[1].to_vec(&CpuBackend).unwrap(),
            lin.bias.to_vec(&CpuBackend).unwrap()
        );
        assert_eq!(vars[2].to_vec(&CpuBackend).unwrap(), [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn the_builder_refuses_repeated_names_and_short_values() {
        let mut p = ParameterBuilder::new(1);
        p.add("w", &[2], Init::Constant(0.0))
            .add("w", &[3], Init::Constant(0.0));
        let e = p.build::<_, f32>(&CpuBackend).unwrap_err();
        assert!(
            matches!(&e, GradError::BadInput(m) if m.contains("`w` added twice")),
            "{e}"
        );
        let mut p = ParameterBuilder::new(1);
        p.add("v", &[2, 3], Init::Values(vec![1.0; 5]));
        let e = p.build::<_, f32>(&CpuBackend).unwrap_err();
        assert!(
            matches!(&e, GradError::BadInput(m) if m.contains("`v`") && m.contains("5 given")),
            "{e}"
        );
        assert!(unique_names(["a", "b", "a"]).is_err());
        assert!(unique_names(["a", "b"]).is_ok());
    }
}
