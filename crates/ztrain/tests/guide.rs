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
    };
    let model = XAsset::<B, f32>::init(&b, config, 7)?;
    let mut trainer = Trainer::new(b, model, TrainerConfig::default())?;
    let data = ztrain::data::synthetic::generate(64, 3, 4, 1);
    let first = trainer.train_batch(&data.x, &data.y, 64)?;
    let mut last = first;
    for _ in 0..30 {
        last = trainer.train_batch(&data.x, &data.y, 64)?;
    }
    let eval = trainer.evaluate(&data.x, &data.y)?; // no-grad: loss, accuracy
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
