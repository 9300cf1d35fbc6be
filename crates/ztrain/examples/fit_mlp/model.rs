//! A model of a user's own, trained through ztrain's run loop (`ztrain::fit`): a two-layer MLP
//! over a sample's `S x F` values (flattened), its head as its task asks (one logit against a
//! label in {0, 1}, the example's; or `C` logits against a class index, or one regression
//! value: ztrain's tests train each). Shared by the example's `main` and ztrain's tests
//! (`tests/it/fit.rs`).

use serde_json::json;
use zcompute::{Activation, prelude::*};
use zgrad::model::ParameterBuilder;
use zgrad::nn::Linear;
use zgrad::{GradError, Model, Tape, Task, Var};
use ztrain::config::RunConfig;
use ztrain::fit::FitModel;
use ztrain::step::TrainBackend;

/// `[B, S, F]` -> `[B, S·F]` -> `tanh(Linear(S·F, H))` -> `Linear(H, O)`: the task's `O`
/// outputs a sample (`Task::output_len`), shaped as the task says.
#[derive(Clone)] // a clone shares the parameters (a captured graph's body holds one)
pub struct WindowMlp<B: Ops<f32>> {
    task: Task,
    scales: usize,
    features: usize,
    l1: Linear<B, f32>,
    l2: Linear<B, f32>,
}

impl<B: Ops<f32>> std::fmt::Debug for WindowMlp<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowMlp")
            .field("scales", &self.scales)
            .field("features", &self.features)
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

impl<B: Ops<f32>> WindowMlp<B> {
    /// PyTorch's `nn.Linear` initialisation from `seed`, every parameter a view of one flat
    /// buffer (one all-reduce of the gradients in data parallel); the head has `task`'s
    /// outputs.
    pub fn new(
        b: &B,
        scales: usize,
        features: usize,
        (hidden, task): (usize, Task),
        seed: u64,
    ) -> zgrad::Result<Self> {
        let mut p = ParameterBuilder::new(seed);
        p.linear("l1", scales * features, hidden)
            .linear("l2", hidden, task.output_len());
        let params = p.build(b)?;
        let var = |i: usize| params[i].1.clone();
        Ok(WindowMlp {
            task,
            scales,
            features,
            l1: Linear {
                weight: var(0),
                bias: var(1),
            },
            l2: Linear {
                weight: var(2),
                bias: var(3),
            },
        })
    }
}

impl<B: Ops<f32> + Clone + 'static> Model<B, f32> for WindowMlp<B> {
    fn task(&self) -> Task {
        self.task
    }

    fn named_parameters(&self) -> Vec<(String, Var<B, f32>)> {
        [
            ("l1.weight", &self.l1.weight),
            ("l1.bias", &self.l1.bias),
            ("l2.weight", &self.l2.weight),
            ("l2.bias", &self.l2.bias),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.clone()))
        .collect()
    }

    fn loss(
        &self,
        tape: &Tape<'_, B, f32>,
        x: &Var<B, f32>,
        y: &Var<B, f32>,
    ) -> zgrad::Result<(Var<B, f32>, Var<B, f32>)> {
        let batch = x.shape().first().copied().unwrap_or(0);
        let flat = tape.reshape(x, &[batch, self.scales * self.features])?;
        let hidden = self.l1.forward_act(tape, &flat, Activation::Tanh)?;
        let shape = Task::batched(batch, &self.task.output_shape());
        let logits = tape.reshape(&self.l2.forward(tape, &hidden)?, &shape)?;
        Ok((tape.task_loss(&self.task(), &logits, y)?, logits))
    }

    fn sample_shape(&self, values: usize) -> zgrad::Result<Vec<usize>> {
        let (s, f) = (self.scales, self.features);
        if values != s * f {
            return Err(GradError::BadInput(format!(
                "a sample of {values} values: the MLP takes [{s}, {f}]"
            )));
        }
        Ok(vec![s, f])
    }
}

/// The MLP as the run loop's model: `hidden` units, trained for `task` (the example's:
/// `Task::binary()`); the sample's shape is the run's (`--scales`/`--window` x
/// `--features`), its seed `--seed`.
#[derive(Clone, Copy, Debug)]
pub struct MlpFit {
    pub hidden: usize,
    pub task: Task,
}

impl FitModel for MlpFit {
    type Model<B: TrainBackend> = WindowMlp<B>;

    fn task(&self, _config: &RunConfig) -> Task {
        self.task
    }

    fn describe(&self, config: &RunConfig) -> String {
        let m = &config.model;
        format!("MLP F={} S={} H={}", m.features, m.scales, self.hidden)
    }

    fn about(&self) -> Option<&str> {
        Some(
            "Train a two-layer MLP over each sample's S x F values through ztrain's run loop (the data, epochs, checkpoints, --gpus: every option below).",
        )
    }

    fn parameters(&self, config: &RunConfig) -> ztrain::Result<u64> {
        let inputs = (config.model.scales * config.model.features) as u64;
        let (h, o) = (self.hidden as u64, self.task.output_len() as u64);
        Ok(inputs * h + h + h * o + o)
    }

    fn config_json(&self, config: &RunConfig) -> serde_json::Value {
        let m = &config.model;
        json!({"mlp": {"scales": m.scales, "features": m.features, "hidden": self.hidden}})
    }

    fn init<B: TrainBackend>(&self, b: &B, config: &RunConfig) -> zgrad::Result<WindowMlp<B>> {
        let m = &config.model;
        WindowMlp::new(
            b,
            m.scales,
            m.features,
            (self.hidden, self.task),
            config.seed,
        )
    }
}
