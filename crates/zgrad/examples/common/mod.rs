//! What the examples share: a perceptron with the target contract of its task, the choice
//! of device (`--device cpu|sim|cuda`) and deterministic data.

#![allow(dead_code)]

use zcompute::{Activation, Capture, Engine, prelude::*};
use zgrad::model::ParameterBuilder;
use zgrad::nn::Linear;
use zgrad::{GradError, Model, StepSource, Tape, Task, Var};

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

/// Trains `epochs` epochs over the whole batches of the first `samples` samples (`x_per` input
/// values and `y_per` target values a sample), printing each epoch's mean loss unless `quiet`.
/// Returns the first step's loss and the last epoch's mean loss.
#[allow(dead_code)]
pub fn train_epochs<B: Capture<f32> + 'static, M: Model<B, f32>>(
    trainer: &mut zgrad::Trainer<B, f32, M>,
    (x, x_per): (&[f32], usize),
    (y, y_per): (&[f32], usize),
    samples: usize,
    batch: usize,
    epochs: usize,
    quiet: bool,
) -> zgrad::Result<(f64, f64)> {
    let (mut first_loss, mut last_loss) = (None, 0.0);
    let steps = samples / batch;
    for epoch in 0..epochs {
        let mut sum = 0.0;
        for s in 0..steps {
            let rows = s * batch..(s + 1) * batch;
            let r = trainer.step(StepSource::host(
                &x[rows.start * x_per..rows.end * x_per],
                &y[rows.start * y_per..rows.end * y_per],
                batch,
            ))?;
            first_loss.get_or_insert(r.loss);
            sum += r.loss;
        }
        last_loss = sum / steps as f64;
        if !quiet {
            println!("epoch {epoch}: mean training loss {last_loss:.4}");
        }
    }
    Ok((first_loss.unwrap_or(f64::NAN), last_loss))
}

/// An example program's `main`: `--device` from the command line, then `ex` on it; a bad
/// option exits with status 2, an error with its causes and status 1.
#[allow(dead_code)]
pub fn main_of<E: Example>(ex: &E) {
    let device = device_from_args().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    if let Err(e) = on_device(device, ex) {
        fail(&e);
    }
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
