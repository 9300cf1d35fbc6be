//! A user's `CustomOp` inside a model the `Trainer` trains: a perceptron whose activation is
//! the custom `Softplus` (`tape.custom`), trained in both schedules, eagerly and captured, on
//! the CPU and the simulated device. Captured equals eager bit for bit (losses, gradients,
//! parameters after every step); the per-sample schedule equals the batched one within
//! float32 rounding (the first step's loss and gradient, from the same parameters).

use super::custom::{Softplus, bits};
use zcompute::{Capture, CpuBackend, prelude::*};
use zgrad::model::ParameterBuilder;
use zgrad::nn::Linear;
use zgrad::{Model, StepSource, Tape, TrainSchedule, Trainer, TrainerConfig, Var};

const FEATURES: usize = 5;
const HIDDEN: usize = 8;
const BATCH: usize = 6;
const STEPS: usize = 3;

/// `x [B, F] -> Linear(F, H) -> softplus (the user's op) -> Linear(H, 1)`: one logit.
struct SoftplusMlp<B: Ops<f32>> {
    l1: Linear<B, f32>,
    l2: Linear<B, f32>,
}

impl<B: Ops<f32>> Clone for SoftplusMlp<B> {
    fn clone(&self) -> Self {
        SoftplusMlp {
            l1: self.l1.clone(),
            l2: self.l2.clone(),
        }
    }
}

impl<B: Ops<f32>> SoftplusMlp<B> {
    fn new(b: &B) -> Self {
        let mut p = ParameterBuilder::new(40);
        p.linear("l1", FEATURES, HIDDEN).linear("l2", HIDDEN, 1);
        let v: Vec<_> = p.build(b).unwrap().into_iter().map(|(_, v)| v).collect();
        SoftplusMlp {
            l1: Linear {
                weight: v[0].clone(),
                bias: v[1].clone(),
            },
            l2: Linear {
                weight: v[2].clone(),
                bias: v[3].clone(),
            },
        }
    }
}

impl<B: Ops<f32> + 'static> Model<B, f32> for SoftplusMlp<B> {
    fn named_parameters(&self) -> Vec<(String, Var<B, f32>)> {
        vec![
            ("l1.weight".into(), self.l1.weight.clone()),
            ("l1.bias".into(), self.l1.bias.clone()),
            ("l2.weight".into(), self.l2.weight.clone()),
            ("l2.bias".into(), self.l2.bias.clone()),
        ]
    }

    fn loss(
        &self,
        tape: &Tape<'_, B, f32>,
        x: &Var<B, f32>,
        y: &Var<B, f32>,
    ) -> zgrad::Result<(Var<B, f32>, Var<B, f32>)> {
        let h = tape.custom(Softplus, &[&self.l1.forward(tape, x)?])?;
        let logits = tape.reshape(&self.l2.forward(tape, &h)?, &[x.shape()[0]])?;
        Ok((
            tape.task_loss(&Model::<B, f32>::task(self), &logits, y)?,
            logits,
        ))
    }

    fn sample_shape(&self, values: usize) -> zgrad::Result<Vec<usize>> {
        if values != FEATURES {
            return Err(zgrad::GradError::BadInput(format!(
                "{values} values: the model takes {FEATURES}"
            )));
        }
        Ok(vec![FEATURES])
    }
}

/// What a run left: each step's loss, the first step's gradient, each step's parameters.
struct Run {
    losses: Vec<f64>,
    first_grad: Vec<f32>,
    params: Vec<Vec<f32>>,
}

fn train<B: Capture<f32> + 'static>(b: B, schedule: TrainSchedule, capture: bool) -> Run {
    let model = SoftplusMlp::new(&b);
    let config = TrainerConfig {
        schedule,
        capture,
        lr: 1e-2,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b, model, config).unwrap();
    let mut run = Run {
        losses: Vec::new(),
        first_grad: Vec::new(),
        params: Vec::new(),
    };
    for k in 0..STEPS {
        // Inputs spread over softplus's range (both tails and the bend), new ones each step.
        let x: Vec<f32> = (0..BATCH * FEATURES)
            .map(|i| ((i * 7 + k * 3) % 13) as f32 / 2.0 - 3.0)
            .collect();
        let y: Vec<f32> = (0..BATCH).map(|i| ((i + k) % 2) as f32).collect();
        let r = t.step(StepSource::host(&x, &y, BATCH)).unwrap();
        assert_eq!((r.captured, r.samples), (capture, BATCH), "step {k}");
        run.losses.push(r.loss);
        if k == 0 {
            run.first_grad = t
                .backend()
                .download(&t.model().flat_gradients().unwrap())
                .unwrap();
        }
        run.params.push(
            t.backend()
                .download(&t.model().flat_parameters().unwrap())
                .unwrap(),
        );
    }
    run
}

fn check_backend<B: Capture<f32> + 'static>(make: impl Fn() -> B) {
    let mut eager_runs = Vec::new();
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let eager = train(make(), schedule, false);
        let captured = train(make(), schedule, true);
        let f64_bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            f64_bits(&captured.losses),
            f64_bits(&eager.losses),
            "{schedule:?}"
        );
        assert_eq!(
            bits(&captured.first_grad),
            bits(&eager.first_grad),
            "{schedule:?}"
        );
        for (c, e) in captured.params.iter().zip(&eager.params) {
            assert_eq!(bits(c), bits(e), "{schedule:?}");
        }
        assert!(eager.losses.iter().all(|l| l.is_finite()), "{schedule:?}");
        eager_runs.push(eager);
    }
    let (batched, per_sample) = (&eager_runs[0], &eager_runs[1]);
    let (lb, lp) = (batched.losses[0], per_sample.losses[0]);
    assert!(
        (lb - lp).abs() <= 1e-6 * lb.abs().max(1.0),
        "loss {lb} vs {lp}"
    );
    let scale = batched
        .first_grad
        .iter()
        .fold(0.0f32, |m, g| m.max(g.abs()))
        .max(1e-3);
    assert!(scale > 1e-3, "a gradient that is not all zero");
    for (i, (p, q)) in per_sample
        .first_grad
        .iter()
        .zip(&batched.first_grad)
        .enumerate()
    {
        // Per sample, B partial sums in another order: a few roundings of the largest entry.
        assert!(
            (p - q).abs() <= 8.0 * BATCH as f32 * f32::EPSILON * scale,
            "gradient {i}: per-sample {p} vs batched {q}"
        );
    }
}

#[test]
fn a_custom_op_trains_through_the_trainer_on_the_cpu_per_sample_and_captured() {
    check_backend(|| CpuBackend);
}

#[test]
fn a_custom_op_trains_through_the_trainer_on_the_simulated_device_per_sample_and_captured() {
    check_backend(super::sim);
}
