//! What the examples share: a perceptron with the target contract of its task, the choice
//! of device (`--device cpu|sim|cuda`) and deterministic data.

#![allow(dead_code)]

use zcompute::{Activation, Capture, Engine, prelude::*};
use zgrad::model::ParameterBuilder;
use zgrad::nn::Linear;
use zgrad::{GradError, Model, Tape, Task, Var};

/// `inputs -> hidden (tanh) -> hidden (tanh) -> outputs`, its loss the task's own
/// (`Tape::task_loss`), its parameters one flat buffer.
pub struct TaskMlp<B: Ops<f32>> {
    pub inputs: usize,
    pub task: Task,
    pub layers: Vec<Linear<B, f32>>,
}

// By hand: a derive would ask `B: Clone`; a clone shares the parameters (handles).
impl<B: Ops<f32>> Clone for TaskMlp<B> {
    fn clone(&self) -> Self {
        TaskMlp {
            inputs: self.inputs,
            task: self.task,
            layers: self.layers.clone(),
        }
    }
}

impl<B: Ops<f32>> TaskMlp<B> {
    pub fn new(b: &B, inputs: usize, hidden: usize, task: Task, seed: u64) -> zgrad::Result<Self> {
        let outputs = task.output_len();
        let mut p = ParameterBuilder::new(seed);
        p.linear("l1", inputs, hidden)
            .linear("l2", hidden, hidden)
            .linear("l3", hidden, outputs);
        let v: Vec<_> = p.build(b)?.into_iter().map(|(_, v)| v).collect();
        let layers = v
            .chunks_exact(2)
            .map(|wb| Linear {
                weight: wb[0].clone(),
                bias: wb[1].clone(),
            })
            .collect();
        Ok(TaskMlp {
            inputs,
            task,
            layers,
        })
    }
}

impl<B: Ops<f32> + 'static> Model<B, f32> for TaskMlp<B> {
    fn task(&self) -> Task {
        self.task
    }

    fn named_parameters(&self) -> Vec<(String, Var<B, f32>)> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            out.push((format!("l{}.weight", i + 1), l.weight.clone()));
            out.push((format!("l{}.bias", i + 1), l.bias.clone()));
        }
        out
    }

    fn loss(
        &self,
        tape: &Tape<'_, B, f32>,
        x: &Var<B, f32>,
        y: &Var<B, f32>,
    ) -> zgrad::Result<(Var<B, f32>, Var<B, f32>)> {
        let mut h = x.clone();
        let last = self.layers.len() - 1;
        for l in &self.layers[..last] {
            h = l.forward_act(tape, &h, Activation::Tanh)?;
        }
        let mut out = self.layers[last].forward(tape, &h)?;
        if self.task.output_shape().is_empty() {
            // One logit per sample: `[batch]`, as a binary task says.
            out = tape.reshape(&out, &[x.shape()[0]])?;
        }
        Ok((tape.task_loss(&self.task, &out, y)?, out))
    }

    fn sample_shape(&self, values: usize) -> zgrad::Result<Vec<usize>> {
        if values != self.inputs {
            return Err(GradError::BadInput(format!(
                "a sample of {values} values: the model takes {}",
                self.inputs
            )));
        }
        Ok(vec![self.inputs])
    }
}

/// Where an example runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// The simulated device (the CUDA backend over zdevice's simulated driver).
    Sim,
    /// CUDA device 0.
    Cuda,
}

/// An example's work, generic over the backend.
pub trait Example {
    type Out;
    fn run<B: Capture<f32> + 'static>(&self, b: B) -> zgrad::Result<Self::Out>;
}

/// Runs `ex` on `device`.
pub fn on_device<E: Example>(device: Device, ex: &E) -> zgrad::Result<E::Out> {
    match device {
        Device::Cpu => ex.run(Engine::cpu()),
        Device::Sim => ex.run(Engine::sim(1 << 30)?),
        Device::Cuda => ex.run(Engine::cuda(0)?),
    }
}

/// `--device cpu|sim|cuda` (cpu by default) from the command line.
pub fn device_from_args() -> Result<Device, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut device = Device::Cpu;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = match a.as_str() {
            "--device" => it.next().map(String::as_str),
            other => other.strip_prefix("--device="),
        };
        device = match value {
            Some("cpu") => Device::Cpu,
            Some("sim") => Device::Sim,
            Some("cuda") => Device::Cuda,
            _ => return Err(format!("usage: --device cpu|sim|cuda (got `{a}`)")),
        };
    }
    Ok(device)
}

/// `n · per` values uniform in [-1, 1), from `seed`.
pub fn uniform(seed: u64, n: usize) -> Vec<f32> {
    zgrad::rng::SplitMix64::new(seed)
        .uniform_vec(n, -1.0, 1.0)
        .into_iter()
        .map(|v| v as f32)
        .collect()
}

/// Prints an error with its chain of causes and exits with status 1.
pub fn fail(e: &dyn std::error::Error) -> ! {
    eprintln!("error: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        eprintln!("  caused by: {s}");
        source = s.source();
    }
    std::process::exit(1)
}
