//! Failure class C: the arena is reclaimed after every sample, and saved-for-backward tensors
//! must come through. The seed report's symptom was a head-weight gradient that matched the CPU
//! on batch 0 and then collapsed towards 0; here every batch's gradients, computed from the
//! same parameters, agree between the device and the CPU and between the two schedules, and
//! the head-weight gradient norm is printed per batch as in that report.
#![allow(clippy::print_stdout)] // the per-batch gradient norms are the scenario's output

use zcompute::{AllocClass, CpuBackend, CudaBackend, prelude::*};
use zdevice::Driver;
use zgrad::{StepSource, Tape, TrainSchedule, Trainer, TrainerConfig, Var, XAsset};
use zmem::Protection;

use crate::common::{
    NamedGrads, Size, assert_gradients_agree, batch, config, data, gradients, initial_parameters,
    norm, parameters, record_events, rel, scratch_addresses_by_step, set_parameters, trainer,
};

/// Per-tensor relative tolerance of gradients computed from the same parameters.
const GRAD_TOL: f64 = 1e-5;

/// The four runs scenario C compares: each schedule on the device and on the CPU, all from
/// the same initial parameters.
struct FourRuns<D: Driver> {
    dev_ps: Trainer<CudaBackend<D>, f32, XAsset<CudaBackend<D>>>,
    dev_bt: Trainer<CudaBackend<D>, f32, XAsset<CudaBackend<D>>>,
    cpu_ps: Trainer<CpuBackend, f32, XAsset<CpuBackend>>,
    cpu_bt: Trainer<CpuBackend, f32, XAsset<CpuBackend>>,
}

impl<D: Driver> FourRuns<D> {
    fn new(dev: &CudaBackend<D>, size: &Size, init: &[Vec<f32>]) -> Self {
        let per_sample = || config(TrainSchedule::PerSample, false);
        let batched = || config(TrainSchedule::Batched, false);
        FourRuns {
            dev_ps: trainer(dev.clone(), size, init, per_sample()),
            dev_bt: trainer(dev.clone(), size, init, batched()),
            cpu_ps: trainer(CpuBackend, size, init, per_sample()),
            cpu_bt: trainer(CpuBackend, size, init, batched()),
        }
    }

    /// One mini-batch on each run; the losses in field order.
    fn train_batch(&mut self, x: &[f32], y: &[f32], batch: usize) -> [f64; 4] {
        [
            self.dev_ps
                .step(StepSource::host(x, y, batch))
                .expect("device per-sample step")
                .loss,
            self.dev_bt
                .step(StepSource::host(x, y, batch))
                .expect("device batched step")
                .loss,
            self.cpu_ps
                .step(StepSource::host(x, y, batch))
                .expect("CPU per-sample step")
                .loss,
            self.cpu_bt
                .step(StepSource::host(x, y, batch))
                .expect("CPU batched step")
                .loss,
        ]
    }
}

/// At every mini-batch, from the device per-sample trainer's current parameters: the device
/// per-sample, device batched, CPU per-sample and CPU batched gradients agree within 1e-5; the
/// per-sample run reclaims scratch after every sample and reuses it for the next.
pub fn gradients_agree_at_every_batch<D: Driver>(dev: CudaBackend<D>, size: Size) {
    let ds = data(&size, 11);
    let init = initial_parameters(&size);
    let events = record_events(dev.arena());
    let mut runs = FourRuns::new(&dev, &size, &init);
    let resets_before = dev.arena().diagnostics().resets;
    let mut worst = [0.0f64; 4];
    for k in 0..size.batches {
        let (x, y) = batch(&size, &ds, k);
        let params = parameters(&dev, runs.dev_ps.model());
        set_parameters(&runs.dev_bt, &params);
        set_parameters(&runs.cpu_ps, &params);
        set_parameters(&runs.cpu_bt, &params);
        let [loss, ..] = runs.train_batch(x, y, size.batch);
        let (g_dps, g_dbt) = (gradients(&runs.dev_ps), gradients(&runs.dev_bt));
        let (g_cps, g_cbt) = (gradients(&runs.cpu_ps), gradients(&runs.cpu_bt));
        let head = |g: &[(String, Vec<f32>)]| {
            norm(&g.iter().find(|(n, _)| *n == "head.weight").expect("head").1)
        };
        println!(
            "batch {k:2}: loss {:.6}  |grad head.weight| device per-sample {:.6}  CPU per-sample {:.6}  CPU batched {:.6}",
            loss,
            head(&g_dps),
            head(&g_cps),
            head(&g_cbt)
        );
        let pairs = [
            ("device vs CPU (per-sample)", &g_dps, &g_cps),
            ("device vs CPU (batched)", &g_dbt, &g_cbt),
            ("device per-sample vs batched", &g_dps, &g_dbt),
            ("CPU per-sample vs batched", &g_cps, &g_cbt),
        ];
        for (i, (what, a, b)) in pairs.into_iter().enumerate() {
            let e = assert_gradients_agree(&format!("batch {k}: {what}"), a, b, GRAD_TOL);
            worst[i] = worst[i].max(e);
        }
    }
    println!(
        "worst per-tensor relative gradient difference over {} batches (device/CPU per-sample, device/CPU batched, device schedules, CPU schedules): {:.2e} {:.2e} {:.2e} {:.2e}",
        size.batches, worst[0], worst[1], worst[2], worst[3]
    );
    // Every sample of the per-sample schedule (and every batched step) ended a step.
    let resets = dev.arena().diagnostics().resets - resets_before;
    let steps = (size.batches * (size.batch + 1)) as u64;
    assert!(
        resets >= steps,
        "{resets} resets for {steps} steps: the trainer must reclaim every sample"
    );
    // Scratch is reused from sample to sample: consecutive steps get the same addresses.
    let by_step = scratch_addresses_by_step(&events.lock().expect("events"));
    let steps: Vec<&Vec<u64>> = by_step.values().collect();
    assert!(
        steps.len() as u64 >= (size.batches * size.batch) as u64,
        "{} steps allocated scratch",
        steps.len()
    );
    let reused = steps
        .windows(2)
        .filter(|w| w[1].iter().any(|p| w[0].contains(p)))
        .count();
    // Sanitizer mode (ZMEM_SANITIZE=1) gives every block its own allocation: no reuse to see.
    assert!(
        dev.arena().sanitize() || reused * 10 >= (steps.len() - 1) * 9,
        "only {reused} of {} consecutive steps reused scratch addresses",
        steps.len() - 1
    );
}

/// Whole trajectories, each trainer on its own: losses per batch and the final parameters of
/// the four runs agree within 1e-3.
pub fn trajectories_agree<D: Driver>(dev: CudaBackend<D>, size: Size) {
    let ds = data(&size, 12);
    let init = initial_parameters(&size);
    let mut runs = FourRuns::new(&dev, &size, &init);
    let (mut first, mut last) = (0.0, 0.0);
    for k in 0..size.batches {
        let (x, y) = batch(&size, &ds, k);
        let losses = runs.train_batch(x, y, size.batch);
        for l in &losses[1..] {
            assert!(
                (l - losses[0]).abs() <= 1e-3 * losses[0].abs(),
                "batch {k}: losses {losses:?}"
            );
        }
        if k == 0 {
            first = losses[0];
        }
        last = losses[0];
    }
    let reference = parameters(&CpuBackend, runs.cpu_bt.model());
    // kn.bias has a zero gradient in exact arithmetic: AdamW turns its rounding noise into
    // steps of up to lr in either direction, so it is held to 2·lr per element per step.
    let kn_bound = 2.0 * TrainerConfig::default().lr * size.batches as f64;
    for (what, params) in [
        ("device per-sample", parameters(&dev, runs.dev_ps.model())),
        ("device batched", parameters(&dev, runs.dev_bt.model())),
        (
            "CPU per-sample",
            parameters(&CpuBackend, runs.cpu_ps.model()),
        ),
    ] {
        for ((p, r), name) in params
            .iter()
            .zip(&reference)
            .zip(size.model.parameter_names())
        {
            if name.ends_with("kn.bias") {
                let apart = p
                    .iter()
                    .zip(r)
                    .map(|(a, b)| f64::from((a - b).abs()))
                    .fold(0.0, f64::max);
                assert!(
                    apart <= kn_bound,
                    "{what}: kn.bias moved apart by {apart} > {kn_bound}"
                );
                continue;
            }
            let e = rel(p, r);
            assert!(
                e <= 1e-3,
                "{what}: {name} after {} batches differs by {e:e}",
                size.batches
            );
        }
    }
    println!(
        "trajectories agree over {} batches; loss {first:.6} -> {last:.6}",
        size.batches
    );
}

/// Forward, a step reset that reclaims all it may (zmem's own protections of live scratch
/// switched off, so only the saved class protects), then backward, with a filler allocated in
/// between to take the reclaimed memory. Returns the gradients and the CPU's.
fn reset_between_forward_and_backward<D: Driver>(
    dev: &CudaBackend<D>,
    size: &Size,
    protected: bool,
) -> (NamedGrads, NamedGrads) {
    let ds = data(size, 13);
    let (x, y) = batch(size, &ds, 0);
    let init = initial_parameters(size);
    let shape = [size.batch, size.model.scales, size.model.features];
    // CPU reference.
    let cpu_model = XAsset::<CpuBackend, f32>::init(&CpuBackend, size.model, 0).expect("init");
    for (p, d) in cpu_model.parameters().iter().zip(&init) {
        p.upload(&CpuBackend, d).expect("upload");
    }
    {
        let tape = Tape::new(&CpuBackend);
        let xv = Var::constant(CpuBackend.upload(x, &shape).expect("x"));
        let yv = Var::constant(CpuBackend.upload(y, &shape[..1]).expect("y"));
        let (loss, _) = cpu_model.loss(&tape, &xv, &yv).expect("CPU forward");
        tape.backward(&loss).expect("CPU backward");
    }
    let cpu = model_gradients(&CpuBackend, &cpu_model);
    // Device, with the reset in the middle.
    let model = XAsset::<CudaBackend<D>, f32>::init(dev, size.model, 0).expect("init");
    for (p, d) in model.parameters().iter().zip(&init) {
        p.upload(dev, d).expect("upload");
    }
    let arena = dev.arena();
    arena.set_protection_for_tests(Protection::KeepLiveScratch, false);
    arena.set_protection_for_tests(Protection::GenerationCheck, false);
    dev.begin_step().expect("step");
    let previous = dev.set_alloc_class(AllocClass::Scratch);
    let xv = Var::constant(dev.upload(x, &shape).expect("x"));
    let yv = Var::constant(dev.upload(y, &shape[..1]).expect("y"));
    dev.set_alloc_class(previous);
    let tape = if protected {
        Tape::new(dev)
    } else {
        Tape::unprotected(dev)
    };
    let (loss, _) = model.loss(&tape, &xv, &yv).expect("device forward");
    dev.end_step().expect("reset");
    dev.begin_step().expect("next step");
    let class = dev.set_alloc_class(AllocClass::Scratch);
    let filler: Vec<_> = (0..64)
        .map(|_| dev.full(&[4096], 1.0e3).expect("filler"))
        .collect();
    dev.set_alloc_class(class);
    let backward = tape.backward(&loss);
    let grads = model_gradients(dev, &model);
    drop(filler);
    drop(tape);
    dev.end_step().expect("end");
    arena.set_protection_for_tests(Protection::KeepLiveScratch, true);
    arena.set_protection_for_tests(Protection::GenerationCheck, true);
    if protected {
        backward.expect("backward after the reset");
    }
    (grads, cpu)
}

fn model_gradients<B: Ops<f32>>(b: &B, m: &XAsset<B, f32>) -> NamedGrads {
    m.named_parameters()
        .into_iter()
        .map(|(n, p)| (n, b.download(p.grad().expect("grad")).expect("download")))
        .collect()
}

/// Saved tensors (zmem's saved class, owned by the tape) survive a reset between forward and
/// backward even with the arena's scratch protections off.
pub fn saved_tensors_survive_a_reset<D: Driver>(dev: CudaBackend<D>, size: Size) {
    let (grads, cpu) = reset_between_forward_and_backward(&dev, &size, true);
    assert_gradients_agree("saved tensors across a reset", &grads, &cpu, 1e-5);
}

/// Negative control: the test-only switch that leaves saved tensors in scratch reproduces the
/// collapse (gradients far from the CPU's, or NaN from poison), and the comparison detects it.
pub fn negative_control_saved_in_scratch_collapses<D: Driver>(dev: CudaBackend<D>, size: Size) {
    let (grads, cpu) = reset_between_forward_and_backward(&dev, &size, false);
    let far = grads
        .iter()
        .zip(&cpu)
        .filter(|((n, _), _)| !n.ends_with("kn.bias"))
        .any(|((_, g), (_, c))| g.iter().any(|v| !v.is_finite()) || rel(g, c) > 1e-2);
    assert!(
        far,
        "with saved tensors in scratch the reset should have corrupted the gradients"
    );
}

/// A tensor kept past its step's reset: by default the arena keeps exactly that block (the
/// value is intact); with that protection off, the generation check stops the next op that
/// reads it with `UseAfterReclaim` instead of letting it read reused memory.
pub fn tensor_kept_past_a_reset_is_caught<D: Driver>(dev: CudaBackend<D>) {
    let scratch = |f: &dyn Fn() -> zcompute::BTensor<CudaBackend<D>, f32>| {
        let class = dev.set_alloc_class(AllocClass::Scratch);
        let t = f();
        dev.set_alloc_class(class);
        t
    };
    dev.begin_step().expect("step");
    let kept = scratch(&|| dev.full(&[1000], 2.5).expect("full"));
    dev.end_step().expect("end");
    dev.begin_step().expect("step");
    let _other = scratch(&|| dev.full(&[1000], -1.0).expect("full"));
    assert_eq!(
        dev.download(&kept).expect("kept tensor is intact"),
        vec![2.5; 1000]
    );
    dev.end_step().expect("end");

    dev.arena()
        .set_protection_for_tests(Protection::KeepLiveScratch, false);
    dev.begin_step().expect("step");
    let kept = scratch(&|| dev.full(&[1000], 2.5).expect("full"));
    dev.end_step().expect("end");
    dev.begin_step().expect("step");
    let err = dev
        .unary(zcompute::UnaryOp::Tanh, &kept)
        .expect_err("reading reclaimed memory");
    dev.end_step().expect("end");
    dev.arena()
        .set_protection_for_tests(Protection::KeepLiveScratch, true);
    assert!(
        matches!(err, zcompute::ComputeError::UseAfterReclaim { .. }),
        "expected UseAfterReclaim, got {err}"
    );
}

macro_rules! scenario_c {
    ($backend:expr, $size:expr) => {
        #[test]
        fn gradients_agree_at_every_batch() {
            super::gradients_agree_at_every_batch($backend(false), $size);
        }
        #[test]
        fn gradients_agree_at_every_batch_with_poison() {
            super::gradients_agree_at_every_batch($backend(true), $size);
        }
        #[test]
        fn trajectories_agree() {
            super::trajectories_agree($backend(false), $size);
        }
        #[test]
        fn saved_tensors_survive_a_reset() {
            super::saved_tensors_survive_a_reset($backend(true), $size);
        }
        #[test]
        fn negative_control_saved_in_scratch_collapses() {
            super::negative_control_saved_in_scratch_collapses($backend(true), $size);
        }
        #[test]
        fn tensor_kept_past_a_reset_is_caught() {
            super::tensor_kept_past_a_reset_is_caught($backend(true));
        }
    };
}

/// Scenario C on a deeper model (docs/xasset.md "Depth"): per-sample, poison on, the arena reset
/// after every sample, 20 mini-batches, every batch's gradients against the CPU's.
macro_rules! scenario_c_deep {
    ($backend:expr, $size:expr) => {
        #[test]
        fn gradients_agree_at_every_batch_with_poison() {
            super::gradients_agree_at_every_batch($backend(true), $size);
        }
    };
}

/// The simulated twin of the GPU's three-block scenario C: the tiny sizes with three blocks.
mod mock_three_blocks {
    use crate::common::{Size, TINY, mock, roomy_arena};
    const TINY_DEEP: Size = Size {
        model: zgrad::XAssetConfig {
            layers: 3,
            ..TINY.model
        },
        batch: 4,
        batches: 20,
    };
    fn backend(poison: bool) -> zcompute::CudaBackend<zdevice::SimDriver> {
        mock(roomy_arena(poison))
    }
    scenario_c_deep!(backend, TINY_DEEP);
}

mod mock {
    use crate::common::{TINY, mock, roomy_arena};
    fn backend(poison: bool) -> zcompute::CudaBackend<zdevice::SimDriver> {
        mock(roomy_arena(poison))
    }
    scenario_c!(backend, TINY);
}

#[cfg(feature = "gpu")]
mod gpu {
    use crate::common::{Size, cuda};
    use zmem::ArenaConfig;
    /// The default XAsset model; 16 samples per mini-batch keeps the CPU references affordable.
    const DEFAULT: Size = Size {
        model: zgrad::XAssetConfig {
            features: 193,
            scales: 12,
            width: 256,
            heads: 4,
            ff: 1024,
            layers: 1,
        },
        batch: 16,
        batches: 50,
    };
    fn backend(poison: bool) -> zcompute::CudaBackend<zdevice::CudaDriver> {
        cuda(ArenaConfig {
            initial_bytes: 256 << 20,
            segment_bytes: 256 << 20,
            cap_bytes: Some(8 << 30),
            overflow_reserve_bytes: 64 << 20,
            poison,
            timeline_events: 4096,
            sanitize: false,
            from_env: Vec::new(),
        })
    }
    scenario_c!(backend, DEFAULT);
}

/// Scenario C at the default size with three blocks (2,419,969 parameters) on CUDA device 0.
#[cfg(feature = "gpu")]
mod gpu_three_blocks {
    use crate::common::{Size, cuda};
    use zmem::ArenaConfig;
    const DEFAULT_DEEP: Size = Size {
        model: zgrad::XAssetConfig {
            features: 193,
            scales: 12,
            width: 256,
            heads: 4,
            ff: 1024,
            layers: 3,
        },
        batch: 16,
        batches: 20,
    };
    fn backend(poison: bool) -> zcompute::CudaBackend<zdevice::CudaDriver> {
        cuda(ArenaConfig {
            initial_bytes: 256 << 20,
            segment_bytes: 256 << 20,
            cap_bytes: Some(8 << 30),
            overflow_reserve_bytes: 64 << 20,
            poison,
            timeline_events: 4096,
            sanitize: false,
            from_env: Vec::new(),
        })
    }
    scenario_c_deep!(backend, DEFAULT_DEEP);
}
