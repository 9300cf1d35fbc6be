//! Optimiser steps that fail, on the simulated device with the driver's fault plan: a failure
//! before any update kernel changes nothing and a retry matches a run that never failed (and
//! the CPU); a failure after the update was queued is reported as applied and counted; a
//! failure inside the update leaves the state unknown and the trainer refuses to step until a
//! checkpoint restores it.

use rstest::rstest;
use zcompute::{CpuBackend, CudaBackend, prelude::*};
use zdevice::sim::calls::{LAUNCH_KERNEL, MEMCPY_HTOD, MEMCPY_HTOD_ASYNC, MEMSET_D8_ASYNC};
use zdevice::{CuCode, Device, DeviceConfig, SimConfig, SimDriver};
use zgrad::{
    AdamW, AdamWHyper, Applied, GradError, LrSchedule, StepSource, TensorFile, TrainSchedule,
    Trainer, TrainerConfig, Var, XAsset, read_tensors,
};
use zmem::{Arena, ArenaConfig};

use crate::support::fixtures;
use fixtures::fixture;

type Mock = CudaBackend<SimDriver>;

fn mock() -> Mock {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(512 << 20)
    });
    zcompute::cuda::twins::register(&sim);
    let config = DeviceConfig {
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    let dev = Device::open(sim, config).expect("the simulated device opens");
    let arena = Arena::new(
        dev,
        ArenaConfig {
            initial_bytes: 16 << 20,
            segment_bytes: 16 << 20,
            cap_bytes: Some(192 << 20),
            overflow_reserve_bytes: 4 << 20,
            poison: true,
            sanitize: false,
            timeline_events: 256,
            from_env: Vec::new(),
        },
    )
    .expect("arena");
    let b = CudaBackend::new(arena).expect("backend");
    b.set_poison(true);
    b
}

fn sim(b: &Mock) -> &SimDriver {
    b.device().driver()
}

/// How many times `call` runs during `f`.
fn calls_during(b: &Mock, call: &str, f: impl FnOnce()) -> u64 {
    let before = sim(b).call_count(call);
    f();
    sim(b).call_count(call) - before
}

/// The one host-to-device copy call `f` makes (synchronous or asynchronous) and how often.
fn upload_call_during(b: &Mock, f: impl FnOnce()) -> (&'static str, u64) {
    let (sync, async_) = (
        sim(b).call_count(MEMCPY_HTOD),
        sim(b).call_count(MEMCPY_HTOD_ASYNC),
    );
    f();
    let sync = sim(b).call_count(MEMCPY_HTOD) - sync;
    let async_ = sim(b).call_count(MEMCPY_HTOD_ASYNC) - async_;
    match (sync, async_) {
        (n, 0) if n > 0 => (MEMCPY_HTOD, n),
        (0, n) if n > 0 => (MEMCPY_HTOD_ASYNC, n),
        other => panic!("uploads through both copy calls: {other:?}"),
    }
}

const VALUES: [&[f32]; 2] = [&[0.5, -1.25, 2.0, 0.75], &[-0.3, 1.5]];
const GRADS: [&[f32]; 2] = [&[0.25, -0.5, 1.0, -2.0], &[3.0, -0.125]];

fn params_on<B: Ops<f32>>(b: &B) -> Vec<Var<B, f32>> {
    VALUES
        .iter()
        .zip(GRADS)
        .map(|(v, g)| {
            let p = Var::parameter_from(b, v, &[v.len()]).unwrap();
            b.upload_into(g, p.grad().unwrap()).unwrap();
            p
        })
        .collect()
}

/// Parameters, moments and step count, bitwise.
fn snapshot<B: Ops<f32>>(
    b: &B,
    opt: &AdamW<B, f32>,
    ps: &[Var<B, f32>],
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>, u64) {
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let state = opt.export(b, &[]).unwrap();
    let params = ps.iter().map(|p| bits(p.to_vec(b).unwrap())).collect();
    let moments = state
        .moments
        .into_iter()
        .flat_map(|m| [bits(m.m), bits(m.v)])
        .collect();
    (params, moments, opt.step_count())
}

/// Issue 10 item 3: the step counter moved before the fallible `[lr, t]` upload, so a retry
/// ran with `t` off by one and the parameters drifted from the CPU's.
#[test]
fn a_failed_slot_upload_changes_nothing_and_the_retry_matches_the_cpu() {
    let b = mock();
    let ps = params_on(&b);
    let hyper = AdamWHyper::default();
    let mut opt = AdamW::new(&b, &ps, hyper).unwrap();
    let cpu_ps = params_on(&CpuBackend);
    let mut cpu_opt = AdamW::new(&CpuBackend, &cpu_ps, hyper).unwrap();

    // Step 1 makes exactly one upload, the slot's: that is the call to fail.
    let (call, n) = upload_call_during(&b, || opt.step(&b, &ps, 1e-2).unwrap());
    assert_eq!(n, 1, "one [lr, t] upload per step");
    cpu_opt.step(&CpuBackend, &cpu_ps, 1e-2).unwrap();

    let before = snapshot(&b, &opt, &ps);
    sim(&b).fail_nth(call, 1, CuCode::INVALID_VALUE);
    let err = opt.step(&b, &ps, 1e-2).unwrap_err();
    assert_eq!(err.applied(), Some(Applied::No), "{err}");
    assert!(matches!(err, GradError::Step { step: 2, .. }), "{err}");
    assert_eq!(snapshot(&b, &opt, &ps), before, "t, m, v and p unchanged");

    opt.step(&b, &ps, 1e-2).expect("the retry");
    opt.step(&b, &ps, 5e-3).unwrap();
    cpu_opt.step(&CpuBackend, &cpu_ps, 1e-2).unwrap();
    cpu_opt.step(&CpuBackend, &cpu_ps, 5e-3).unwrap();
    assert_eq!(
        snapshot(&b, &opt, &ps),
        snapshot(&CpuBackend, &cpu_opt, &cpu_ps),
        "three steps after a failed one equal three CPU steps, bitwise"
    );
}

/// A launch that fails after the first update kernel was queued: the step may be partly
/// applied, so the optimiser refuses to go on until `import` restores its state.
#[test]
fn a_failure_inside_the_update_leaves_the_state_unknown_until_import() {
    let b = mock();
    let ps = params_on(&b);
    let mut opt = AdamW::new(&b, &ps, AdamWHyper::default()).unwrap();
    opt.step(&b, &ps, 1e-2).unwrap();
    let saved = opt.export(&b, &[]).unwrap();
    let values: Vec<Vec<f32>> = ps.iter().map(|p| p.to_vec(&b).unwrap()).collect();

    // The second parameter's kernel: the first one has run.
    sim(&b).fail_nth(LAUNCH_KERNEL, 2, CuCode::INVALID_VALUE);
    let err = opt.step(&b, &ps, 1e-2).unwrap_err();
    assert_eq!(err.applied(), Some(Applied::Maybe), "{err}");
    assert_eq!(opt.unknown_step(), Some(2));
    let again = opt.step(&b, &ps, 1e-2).unwrap_err();
    assert!(
        matches!(again.cause(), GradError::StateUnknown { step: 2 }),
        "{again}"
    );
    assert_eq!(again.applied(), Some(Applied::No));

    for (p, v) in ps.iter().zip(&values) {
        p.upload(&b, v).unwrap();
    }
    opt.import(&b, &saved).unwrap();
    assert_eq!(opt.unknown_step(), None);
    opt.step(&b, &ps, 1e-2)
        .expect("steps again after the restore");
    assert_eq!(opt.step_count(), 2);
}

struct Tiny {
    input: TensorFile<f32>,
    path: std::path::PathBuf,
}

fn tiny() -> Tiny {
    let path = fixture("xasset_tiny_in.safetensors");
    Tiny {
        input: read_tensors(&path).unwrap(),
        path,
    }
}

fn trainer_on<B: zcompute::Capture<f32> + 'static>(
    b: B,
    f: &Tiny,
    schedule: TrainSchedule,
    capture: bool,
) -> Trainer<B, f32, XAsset<B>> {
    let model = XAsset::from_tensors(&b, &f.input, &f.path).unwrap();
    let config = TrainerConfig {
        schedule,
        capture,
        lr: 1e-2,
        lr_schedule: LrSchedule::LinearWarmup { warmup_steps: 2 },
        ..TrainerConfig::default()
    };
    Trainer::new(b, model, config).unwrap()
}

fn batch(f: &Tiny, k: usize) -> (Vec<f32>, Vec<f32>) {
    let x = f.input.tensors["x"].data.iter();
    let x = x.map(|v| v * (1.0 + 0.1 * k as f32)).collect();
    (x, f.input.tensors["y"].data.clone())
}

fn parameters<B: zcompute::Capture<f32> + 'static>(
    t: &Trainer<B, f32, XAsset<B>>,
) -> Vec<Vec<f32>> {
    let b = t.backend();
    let ps = t.model().parameters();
    ps.iter().map(|p| p.to_vec(b).unwrap()).collect()
}

fn rel(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    let (mut d, mut n) = (0.0, 0.0);
    for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
        d += (f64::from(*g) - f64::from(*w)).powi(2);
        n += f64::from(*w).powi(2);
    }
    (d / n).sqrt()
}

/// Item 3 in the trainer's captured paths (capturing and replaying): failing the slot upload
/// of a step changes nothing; the retried run equals, bitwise, a run that never failed.
#[rstest]
#[case::while_capturing(1)]
#[case::before_a_replay(3)]
fn a_failed_slot_upload_in_a_captured_step_is_not_counted(#[case] failing_step: usize) {
    let f = tiny();
    let b = mock();
    let mut t = trainer_on(b.clone(), &f, TrainSchedule::Batched, true);
    // The same run on a device that never fails.
    let mut clean = trainer_on(mock(), &f, TrainSchedule::Batched, true);
    // Every step of the captured path uploads the `[lr, t]` slot, then x and y, one copy each.
    let (call, _) = upload_call_during(&b, || {
        Var::parameter_from(&b, &[1.0f32], &[1]).unwrap();
    });
    for k in 0..4 {
        let (x, y) = batch(&f, k);
        if k + 1 == failing_step {
            sim(&b).fail_nth(call, 3, CuCode::INVALID_VALUE);
            let before = parameters(&t);
            let err = t.step(StepSource::host(&x, &y, 4)).unwrap_err();
            assert_eq!(err.applied(), Some(Applied::No), "{err}");
            assert_eq!(t.status().step, k as u64, "the failed step is not counted");
            assert_eq!(parameters(&t), before);
        }
        let (_, n) = upload_call_during(&b, || {
            assert_eq!(
                t.step(StepSource::host(&x, &y, 4)).unwrap().step,
                k as u64 + 1
            );
        });
        assert_eq!(n, 3, "step {}: x, y and the slot", k + 1);
        clean.step(StepSource::host(&x, &y, 4)).unwrap();
    }
    let err = rel(&parameters(&t), &parameters(&clean));
    assert!(err == 0.0, "a retried step vs none failed: {err:e}");
}

/// Item 4: closing the step (its reclaim's poison memset) fails after the update was applied.
/// The trainer used to turn that into a failure of the whole batch, so a retry applied the
/// update twice; now the error says `Applied::Yes`, the step is counted, and going on with the
/// next batch equals a run that never failed.
#[rstest]
#[case::batched(TrainSchedule::Batched, false)]
#[case::per_sample(TrainSchedule::PerSample, false)]
#[case::per_sample_captured(TrainSchedule::PerSample, true)]
fn a_failed_reclaim_after_the_update_reports_it_applied(
    #[case] schedule: TrainSchedule,
    #[case] capture: bool,
) {
    // (A replayed batched step has no scratch to poison: its memory is the graph's.)
    let f = tiny();
    let b = mock();
    let mut t = trainer_on(b.clone(), &f, schedule, capture);
    let clean_b = mock();
    let mut clean = trainer_on(clean_b.clone(), &f, schedule, capture);
    for k in 0..4 {
        let (x, y) = batch(&f, k);
        // The same step on the twin device says how many poison memsets it makes; the last
        // is that of the step's last reclaim, after the update.
        let poisons = calls_during(&clean_b, MEMSET_D8_ASYNC, || {
            clean.step(StepSource::host(&x, &y, 4)).unwrap();
        });
        assert!(poisons > 0, "poison is on");
        if k == 2 {
            sim(&b).fail_nth(MEMSET_D8_ASYNC, poisons, CuCode::INVALID_VALUE);
            let err = t.step(StepSource::host(&x, &y, 4)).unwrap_err();
            assert_eq!(err.applied(), Some(Applied::Yes), "{err}");
            assert!(matches!(err, GradError::Step { step: 3, .. }), "{err}");
            assert_eq!(t.status().step, 3, "the applied step is counted");
            continue;
        }
        t.step(StepSource::host(&x, &y, 4)).unwrap();
    }
    assert_eq!(t.status().step, 4);
    assert_eq!(
        parameters(&t),
        parameters(&clean),
        "no update applied twice"
    );
}

/// Item 3, trainer side: an update that failed part-way leaves the state unknown; the trainer
/// refuses every step (`StateUnknown`, not applied) until a checkpoint is loaded, after which
/// the run equals one that never failed.
#[test]
fn the_trainer_refuses_to_step_on_an_unknown_state_until_a_checkpoint_is_loaded() {
    let f = tiny();
    let b = mock();
    let mut t = trainer_on(b.clone(), &f, TrainSchedule::Batched, false);
    let mut clean = trainer_on(mock(), &f, TrainSchedule::Batched, false);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("step1.safetensors");
    let (x, y) = batch(&f, 0);
    let launches = calls_during(&b, LAUNCH_KERNEL, || {
        t.step(StepSource::host(&x, &y, 4)).unwrap();
    });
    clean.step(StepSource::host(&x, &y, 4)).unwrap();
    t.save_checkpoint(&ckpt, Default::default()).unwrap();

    // An eager step ends with one AdamW kernel per parameter: fail the last one.
    let (x, y) = batch(&f, 1);
    sim(&b).fail_nth(LAUNCH_KERNEL, launches, CuCode::INVALID_VALUE);
    let err = t.step(StepSource::host(&x, &y, 4)).unwrap_err();
    assert_eq!(err.applied(), Some(Applied::Maybe), "{err}");
    let refused = t.step(StepSource::host(&x, &y, 4)).unwrap_err();
    assert!(
        matches!(refused.cause(), GradError::StateUnknown { step: 2 }),
        "{refused}"
    );
    assert_eq!(refused.applied(), Some(Applied::No));
    assert_eq!(t.status().step, 1);
    let unknown = dir.path().join("unknown.safetensors");
    let not_saved = t.save_checkpoint(&unknown, Default::default()).unwrap_err();
    assert!(
        matches!(not_saved, GradError::StateUnknown { step: 2 }),
        "{not_saved}"
    );
    assert!(!unknown.exists(), "no checkpoint of an unknown state");

    t.load_checkpoint(&ckpt).unwrap();
    for k in 1..3 {
        let (x, y) = batch(&f, k);
        t.step(StepSource::host(&x, &y, 4)).unwrap();
        clean.step(StepSource::host(&x, &y, 4)).unwrap();
    }
    assert_eq!(parameters(&t), parameters(&clean));
}
