//! The examples of `docs/guide.md`, compiled and run, so the guide stays true. Each function
//! here is one code block of the guide (keep them in step when either changes). Every example
//! that takes a backend runs on the CPU and on the simulated device (`Engine::sim`: the CUDA
//! backend over `SimDriver`), as the guide promises. ztrain does not depend on zdevice, so the
//! one example below the engine ("zmem alone") reaches the simulated device through the
//! engine's arena.

use zcompute::{
    ArenaSetting, Capture, ComputeError, CudaBackend, Engine, EngineConfig, MatmulOpts, SimDriver,
    UnaryOp, prelude::*,
};
use zgrad::EvalSource;
use zgrad::StepSource;
use zgrad::{
    AdamW, AdamWHyper, Tape, Trainer, TrainerConfig, Var, XAsset, XAssetConfig, in_step, zero_grad,
};
use zmem::{Arena, ArenaConfig};

type AnyError = Box<dyn std::error::Error>;

// Guide: "Start here: an engine".
fn start_here() -> Result<CudaBackend<SimDriver>, AnyError> {
    let engine = Engine::sim(256 << 20)?;
    let _ = Engine::cpu();
    let configured = EngineConfig::from_env()?
        .arena_bytes(64 << 20)
        .segment_bytes(32 << 20)
        .poison(true)
        .sim(256 << 20)?;
    assert_eq!(configured.arena().config().initial_bytes, 64 << 20);
    assert!(configured.arena().config().poison);
    let refused = EngineConfig::new().arena_bytes(100 << 20).sim(256 << 20);
    assert!(matches!(
        refused,
        Err(ComputeError::ArenaSetting {
            setting: ArenaSetting::InitialBytes,
            ..
        })
    ));
    Ok(engine)
}

// Guide: "zmem alone".
fn zmem_alone() -> Result<String, AnyError> {
    // The guide opens `MockDevice` directly (zdevice); ztrain, which has no zdevice
    // dependency, takes the same simulated device from an engine.
    let device = Engine::sim(256 << 20)?.device().clone();
    let arena = Arena::new(device, ArenaConfig::default())?;
    let weights = arena.alloc_persistent(4 << 20)?; // lives until its last handle drops
    for _ in 0..3 {
        let step = arena.step()?;
        let tmp = step.alloc_scratch(1 << 20)?; // reclaimed when the step ends
        let _address = tmp.ptr()?; // checked against the block's generation
        drop(tmp); // `step.end()` does not compile while `tmp` borrows the step
        step.end()?;
    }
    assert!(weights.is_valid());
    let diagnostics = arena.diagnostics(); // one line with Display
    let timeline = arena.timeline(); // per-step aggregates + recent events; .to_json()
    assert_eq!(diagnostics.resets, 3);
    assert_eq!(timeline.steps.len(), 3);
    Ok(diagnostics.to_string())
}

// Guide: "zcompute alone".
fn tanh_linear<B: Ops<f32>>(b: &B) -> zcompute::Result<Vec<f32>> {
    let x = b.upload(&[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
    let w = b.upload(&[0.5, -1.0, 0.25, 2.0], &[2, 2])?; // PyTorch's [out, in]
    let opts = MatmulOpts {
        trans_b: true,
        ..MatmulOpts::default()
    };
    let y = b.unary(UnaryOp::Tanh, &b.matmul(&x, &w, opts)?)?; // tanh(x · wᵀ)
    b.download(&y)
}

// Guide: "zgrad with a custom model": a two-layer network learns XOR.
fn xor_mlp<B: Ops<f32>>(b: B) -> Result<(f32, f32), AnyError> {
    let xs = [0.0f32, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0];
    let ys = [0.0f32, 1.0, 1.0, 0.0];
    let init: Vec<f32> = (0..16).map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0).collect();
    let w1 = Var::parameter_from(&b, &init, &[2, 8])?;
    let b1 = Var::parameter_from(&b, &[0.0; 8], &[8])?;
    let w2 = Var::parameter_from(&b, &init[..8], &[8, 1])?;
    let b2 = Var::parameter_from(&b, &[0.0], &[1])?;
    let params = vec![w1.clone(), b1.clone(), w2.clone(), b2.clone()];
    let mut opt = AdamW::new(&b, &params, AdamWHyper::default())?;
    let x = Var::constant(b.upload(&xs, &[4, 2])?);
    let y = Var::constant(b.upload(&ys, &[4])?);
    let mut losses = Vec::new();
    for _ in 0..300 {
        // A step scope: the iteration's temporaries are the step's scratch memory.
        let loss = in_step(&b, || {
            let tape = Tape::new(&b);
            let h = tape.tanh(&tape.add(&tape.matmul(&x, &w1, MatmulOpts::default())?, &b1)?)?;
            let logits = tape.add(&tape.matmul(&h, &w2, MatmulOpts::default())?, &b2)?;
            let loss = tape.bce_with_logits(&tape.reshape(&logits, &[4])?, &y)?;
            tape.backward(&loss)?;
            opt.step(&b, &params, 0.05)?;
            zero_grad(&b, &params)?;
            Ok(loss.to_vec(&b)?[0]) // read inside the step: its memory is reclaimed after
        })?;
        losses.push(loss);
    }
    Ok((losses[0], losses[losses.len() - 1]))
}

// Guide: "zgrad's trainer on the XAsset model at any size".
fn xasset_trainer<B: Capture<f32> + 'static>(b: B) -> Result<(f64, f64), AnyError> {
    let config = XAssetConfig {
        features: 4,
        scales: 3,
        width: 16,
        heads: 2,
        ff: 32,
        layers: 1,
    };
    let model = XAsset::<B, f32>::init(&b, config, 7)?;
    let mut trainer = Trainer::new(b, model, TrainerConfig::default())?;
    let data = ztrain::data::synthetic::generate(64, 3, 4, 1);
    let first = trainer.step(StepSource::host(&data.x, &data.y, 64))?;
    let mut last = first;
    for _ in 0..30 {
        last = trainer.step(StepSource::host(&data.x, &data.y, 64))?;
    }
    let eval = trainer.evaluate(EvalSource::Host(&data.x, &data.y))?; // no-grad: loss, accuracy
    assert!(eval.accuracy > 0.5);
    Ok((first.loss, last.loss))
}

#[test]
fn zmem_alone_runs_and_explains_itself() {
    let line = zmem_alone().expect("example runs");
    assert!(line.contains("3 resets"), "{line}");
}

#[test]
fn zcompute_alone_gives_the_same_numbers_on_cpu_and_simulated_cuda() {
    let cpu = tanh_linear(&Engine::cpu()).expect("cpu");
    let sim = tanh_linear(&mock_backend()).expect("sim");
    let want = [
        (-1.5f32).tanh(),
        (4.25f32).tanh(),
        (-2.5f32).tanh(),
        (8.75f32).tanh(),
    ];
    for (got, want) in cpu.iter().chain(&sim).zip(want.iter().chain(&want)) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
}

fn mock_backend() -> CudaBackend<SimDriver> {
    Engine::sim(256 << 20).expect("the simulated engine opens")
}

#[test]
fn start_here_opens_configures_and_refuses() {
    start_here().expect("example runs");
}

#[test]
fn engine_cuda_without_a_gpu_is_device_unavailable() {
    // The guide's commented alternative. On a GPU machine the gpu suite runs it instead.
    if let Err(e) = Engine::cuda(0) {
        assert!(
            matches!(e, ComputeError::DeviceUnavailable { ordinal: 0, .. }),
            "{e:?}"
        );
    }
}

#[test]
fn zgrad_custom_model_learns_xor() {
    let (first, last) = xor_mlp(Engine::cpu()).expect("example runs");
    assert!(last < 0.1 && last < first / 5.0, "loss {first} -> {last}");
}

#[test]
fn zgrad_custom_model_learns_xor_on_the_simulated_device() {
    let (first, last) = xor_mlp(mock_backend()).expect("example runs on the device backend");
    assert!(last < 0.1 && last < first / 5.0, "loss {first} -> {last}");
}

#[test]
fn zgrad_trainer_lowers_the_loss_of_a_small_xasset() {
    let (first, last) = xasset_trainer(Engine::cpu()).expect("example runs");
    assert!(last < first, "loss {first} -> {last}");
}

#[test]
fn zgrad_trainer_lowers_the_loss_of_a_small_xasset_on_the_simulated_device() {
    let (first, last) = xasset_trainer(mock_backend()).expect("example runs on the device");
    assert!(last < first, "loss {first} -> {last}");
}

// Guide: "A model of your own": a two-layer perceptron through the trainer.
mod own_model {
    use super::AnyError;
    use std::rc::Rc;
    use std::time::Duration;
    use zcomm::{Collective, RankInfo, SimCollective, rendezvous::Server};
    use zcompute::{Activation, Capture, Engine, prelude::*};
    use zgrad::model::ParameterBuilder;
    use zgrad::nn::Linear;
    use zgrad::{GradError, Model, StepSource, Tape, TrainSchedule, Trainer, TrainerConfig, Var};

    #[derive(Clone)]
    struct Mlp<B: Ops<f32>> {
        scales: usize,
        features: usize,
        l1: Linear<B, f32>,
        l2: Linear<B, f32>,
    }

    impl<B: Ops<f32>> Mlp<B> {
        fn new(
            b: &B,
            scales: usize,
            features: usize,
            hidden: usize,
            seed: u64,
        ) -> zgrad::Result<Self> {
            let mut p = ParameterBuilder::new(seed);
            p.linear("l1", scales * features, hidden)
                .linear("l2", hidden, 1);
            let params = p.build(b)?;
            let var = |i: usize| params[i].1.clone();
            let (l1, l2) = (
                Linear {
                    weight: var(0),
                    bias: var(1),
                },
                Linear {
                    weight: var(2),
                    bias: var(3),
                },
            );
            Ok(Mlp {
                scales,
                features,
                l1,
                l2,
            })
        }
    }

    impl<B: Ops<f32> + Clone + 'static> Model<B, f32> for Mlp<B> {
        fn named_parameters(&self) -> Vec<(String, Var<B, f32>)> {
            let vars = [
                &self.l1.weight,
                &self.l1.bias,
                &self.l2.weight,
                &self.l2.bias,
            ];
            let names = ["l1.weight", "l1.bias", "l2.weight", "l2.bias"];
            names
                .iter()
                .zip(vars)
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
            let logits = tape.reshape(&self.l2.forward(tape, &hidden)?, &[batch])?;
            Ok((tape.bce_with_logits(&logits, y)?, logits))
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

    /// Losses of the steps and the flat parameters after them.
    type Run = (Vec<f64>, Vec<f32>);

    /// Losses of 6 steps (global batch 33: unequal shards on two ranks) and the parameters
    /// after them, on one rank or as one rank of a job over `comm`.
    fn train<B: Capture<f32> + Clone + 'static>(
        b: B,
        schedule: TrainSchedule,
        capture: bool,
        comm: Option<Rc<dyn Collective<B, f32>>>,
    ) -> Result<Run, AnyError> {
        let model = Mlp::new(&b, 3, 4, 16, 7)?;
        let config = TrainerConfig {
            schedule,
            capture,
            lr: 1e-2,
            clip_grad: Some(1.0),
            ..TrainerConfig::default()
        };
        let mut trainer = Trainer::new(b.clone(), model, config)?;
        let data = ztrain::data::synthetic::generate(33, 3, 4, 1);
        // Samples of 16 values: the MLP takes [3, 4]; nothing is applied.
        let wrong = trainer.step(StepSource::host(&data.x[..32], &data.y[..2], 2));
        assert!(matches!(
            wrong.map_err(|e| e.applied()),
            Err(Some(zgrad::Applied::No))
        ));
        if let Some(comm) = comm {
            trainer = trainer.with_collective(comm)?;
        }
        let mut losses = Vec::new();
        for _ in 0..6 {
            let r = trainer.step(StepSource::host(&data.x, &data.y, 33))?;
            assert_eq!(r.captured, capture, "the step ran captured when asked");
            losses.push(r.loss);
        }
        Ok((losses, b.download(&trainer.model().flat_parameters()?)?))
    }

    fn two_ranks(schedule: TrainSchedule, capture: bool) -> Result<[Run; 2], AnyError> {
        let timeout = Duration::from_secs(30);
        let server = Server::bind("127.0.0.1:0")?;
        let addr = server.local_addr()?.to_string();
        let rank1 = std::thread::spawn(move || -> Result<_, String> {
            let run = || -> Result<_, AnyError> {
                let b = Engine::sim(256 << 20)?;
                let info = RankInfo {
                    rank: 1,
                    world: 2,
                    local_rank: 1,
                };
                let comm = SimCollective::join(&b, &addr, info, timeout)?;
                train(b, schedule, capture, Some(Rc::new(comm)))
            };
            run().map_err(|e| e.to_string())
        });
        let b = Engine::sim(256 << 20)?;
        let comm = SimCollective::serve(&b, server, 2, timeout)?;
        let rank0 = train(b, schedule, capture, Some(Rc::new(comm)))?;
        let rank1 = rank1.join().map_err(|_| "rank 1 panicked")??;
        Ok([rank0, rank1])
    }

    fn bits(v: &Run) -> (Vec<u64>, Vec<u32>) {
        (
            v.0.iter().map(|l| l.to_bits()).collect(),
            v.1.iter().map(|p| p.to_bits()).collect(),
        )
    }

    const SCHEDULES: [TrainSchedule; 2] = [TrainSchedule::Batched, TrainSchedule::PerSample];

    #[test]
    fn guide_own_model_captured_equals_eager_on_the_cpu() {
        for schedule in SCHEDULES {
            let eager = train(Engine::cpu(), schedule, false, None).expect("eager");
            let captured = train(Engine::cpu(), schedule, true, None).expect("captured");
            assert_eq!(bits(&captured), bits(&eager), "{schedule:?}");
            assert!(eager.0[5] < eager.0[0], "{schedule:?}: loss {:?}", eager.0);
        }
    }

    #[test]
    fn guide_own_model_captured_equals_eager_on_the_simulated_device() {
        for schedule in SCHEDULES {
            let eager = train(super::mock_backend(), schedule, false, None).expect("eager");
            let captured = train(super::mock_backend(), schedule, true, None).expect("captured");
            assert_eq!(bits(&captured), bits(&eager), "{schedule:?}");
            assert!(eager.0[5] < eager.0[0], "{schedule:?}: loss {:?}", eager.0);
        }
    }

    fn rel(a: &[f32], b: &[f32]) -> f64 {
        let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (d / n.max(1e-30)).sqrt()
    }

    #[test]
    fn guide_own_model_two_simulated_ranks_equal_one() {
        for schedule in SCHEDULES {
            for capture in [false, true] {
                let at = format!("{schedule:?} capture={capture}");
                let one = train(super::mock_backend(), schedule, capture, None).expect("one");
                let [r0, r1] = two_ranks(schedule, capture).expect("two ranks");
                assert_eq!(bits(&r0), bits(&r1), "{at}: both ranks the same bits");
                for (l, w) in r0.0.iter().zip(&one.0) {
                    assert!((l - w).abs() <= 1e-5 * w.abs().max(1.0), "{at}: {l} vs {w}");
                }
                let e = rel(&r0.1, &one.1);
                assert!(e <= 1e-5, "{at}: parameters differ by {e:e}");
            }
        }
    }
}
