//! One case of the matrix: set up, train with the fault, recover, tear down, check the ledger.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;

use zcompute::CudaBackend;
use zdevice::{Device, DeviceConfig, Driver, FaultController, FaultyDriver};
use zgrad::{OptimizerState, PARAMETER_NAMES, StepSource, Trainer, XAsset};
use zmem::Arena;

use super::{CallList, CaseResult, Fault, MODES, Mode, Settings};
use crate::common::{Size, batch, config, data, rel};

/// The backend every case trains on: CUDA over the fault-injecting driver.
type Faulty<D> = CudaBackend<FaultyDriver<D>>;

struct Run<D: Driver> {
    trainer: Trainer<Faulty<D>, f32, XAsset<Faulty<D>>>,
    device: Device<FaultyDriver<D>>,
    optimizer: OptimizerState<f32>,
}

/// `GradError::Compute(ComputeError::Device { .. })` → `Compute::Device`.
fn variant_path(debug: &str) -> String {
    let end = debug.find([' ', '{', '"']).unwrap_or(debug.len());
    debug[..end].trim_end_matches('(').replace('(', "::")
}

fn typed<E: std::fmt::Debug>(e: E) -> String {
    let debug = format!("{e:?}");
    if std::env::var_os("ZGPU_FAULT_MATRIX_VERBOSE").is_some() {
        println!("error: {debug}");
    }
    variant_path(&debug)
}

/// Device, arena, backend, model with `params`, trainer: any failure as its variant path.
fn setup<D: Driver>(
    driver: FaultyDriver<D>,
    s: &Settings,
    mode: Mode,
    params: &[Vec<f32>],
    opened: &mut Option<Device<FaultyDriver<D>>>,
) -> Result<Run<D>, String> {
    let device = Device::open(driver, s.device.clone()).map_err(typed)?;
    *opened = Some(device.clone());
    let arena = Arena::new(device.clone(), s.arena.clone()).map_err(typed)?;
    let b = CudaBackend::new(arena).map_err(typed)?;
    b.set_poison(s.arena.poison);
    let model = XAsset::<_, f32>::init(&b, s.size.model, 0).map_err(typed)?;
    for (p, data) in model.parameters().iter().zip(params) {
        p.upload(&b, data).map_err(typed)?;
    }
    let trainer =
        Trainer::new(Rc::new(b), model, config(mode.schedule, mode.capture)).map_err(typed)?;
    let names: Vec<String> = PARAMETER_NAMES.iter().map(|n| (*n).to_string()).collect();
    let optimizer = trainer
        .optimizer()
        .export(trainer.backend(), &names)
        .map_err(typed)?;
    Ok(Run {
        trainer,
        device,
        optimizer,
    })
}

/// Two steps on the first two mini-batches, then the parameters.
fn train<D: Driver>(run: &mut Run<D>, size: &Size) -> Result<Vec<Vec<f32>>, String> {
    let set = data(size, 11);
    for k in 0..2 {
        let (x, y) = batch(size, &set, k);
        run.trainer
            .step(StepSource::host(x, y, size.batch))
            .map_err(|e| format!("step {}: {}", k + 1, typed(e)))?;
    }
    let b = run.trainer.backend();
    run.trainer
        .model()
        .parameters()
        .iter()
        .map(|p| p.to_vec(b).map_err(|e| format!("download: {}", typed(e))))
        .collect()
}

/// Puts back the initial parameters and optimiser state.
fn restore<D: Driver>(run: &mut Run<D>, params: &[Vec<f32>]) -> Result<(), String> {
    run.trainer.restore(params, &run.optimizer).map_err(typed)
}

/// Whether every tensor is within `tolerance` of the clean run's.
fn differs(got: &[Vec<f32>], reference: &[Vec<f32>], tolerance: f64) -> Option<String> {
    got.iter()
        .zip(reference)
        .enumerate()
        .map(|(i, (a, b))| (i, rel(a, b)))
        .find(|(_, err)| err.is_nan() || *err > tolerance)
        .map(|(i, err)| {
            format!(
                "parameter {} differs from the clean run by {err:e}",
                PARAMETER_NAMES[i]
            )
        })
}

/// Waits out what a stall left queued (each wait bounded by the sync deadline).
fn drain<D: Driver>(device: &Device<FaultyDriver<D>>) {
    for _ in 0..8 {
        if device.synchronize(device.stream()).is_ok() {
            return;
        }
    }
}

/// A clean run of `mode`: the calls it makes and its parameters after two steps. Also checks
/// the ledger is empty after teardown.
pub fn record<D: Driver>(
    make: &dyn Fn() -> D,
    s: &Settings,
    mode: Mode,
    params: &[Vec<f32>],
) -> (CallList, Vec<Vec<f32>>) {
    let driver = FaultyDriver::new(make());
    let ctl = driver.controller();
    ctl.set_async_stall(s.async_stall);
    // The clean run may JIT the kernels on a cold cache: default deadlines for it.
    let clean = Settings {
        device: DeviceConfig {
            blas_workspace_bytes: s.device.blas_workspace_bytes,
            ..DeviceConfig::default()
        },
        ..s.clone()
    };
    let mut run = setup(driver, &clean, mode, params, &mut None).expect("the clean run sets up");
    let at_setup = ctl.calls_seen();
    let result = train(&mut run, &s.size).expect("the clean run trains");
    let steps = ctl
        .calls_seen()
        .into_iter()
        .filter(|(c, n)| {
            at_setup
                .iter()
                .find(|(k, _)| k == c)
                .is_none_or(|(_, m)| n > m)
        })
        .map(|(c, _)| c)
        .collect();
    drop(run);
    assert_eq!(
        ctl.live_resources(),
        vec![],
        "{}: the clean run leaks",
        mode.name
    );
    let setup = at_setup.into_iter().map(|(c, _)| c).collect();
    (CallList { setup, steps }, result)
}

/// One case: `fault` on the first call of `call` in the steps (or at setup when `in_steps` is
/// false). Panics, naming the case, on a broken promise.
#[allow(clippy::too_many_arguments)]
pub fn case<D: Driver>(
    make: &dyn Fn() -> D,
    s: &Settings,
    mode: Mode,
    params: &[Vec<f32>],
    reference: &[Vec<f32>],
    call: &'static str,
    in_steps: bool,
    fault: Fault,
) -> CaseResult {
    let name = format!("{} / {call} / {}", mode.name, fault.header());
    let attempt = catch_unwind(AssertUnwindSafe(|| {
        run_case(make, s, mode, params, reference, call, in_steps, fault)
    }));
    match attempt {
        Ok(Ok(result)) => result,
        Ok(Err(broken)) => CaseResult::broken(format!("{name}: {broken}")),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_default();
            CaseResult::broken(format!("{name}: the engine panicked: {msg}"))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_case<D: Driver>(
    make: &dyn Fn() -> D,
    s: &Settings,
    mode: Mode,
    params: &[Vec<f32>],
    reference: &[Vec<f32>],
    call: &'static str,
    in_steps: bool,
    fault: Fault,
) -> Result<CaseResult, String> {
    let driver = FaultyDriver::new(make());
    let ctl = driver.controller();
    ctl.set_async_stall(s.async_stall);
    let action = fault.action(call, s.stall);
    if !in_steps {
        ctl.fault(call, 1, action);
    }
    let mut opened = None;
    let setup = setup(driver, s, mode, params, &mut opened);
    let lost_at_setup = opened.as_ref().is_some_and(|d| d.lost_reason().is_some());
    drop(opened);
    let mut run = match setup {
        Ok(run) => run,
        Err(e) => {
            let after =
                settle::<D>(&ctl, None, lost_at_setup).map_err(|b| format!("setup: {e}; {b}"))?;
            return Ok(CaseResult {
                outcome: format!("setup: {e}"),
                after,
                broken: None,
            });
        }
    };
    if in_steps {
        ctl.fault(call, 1, action);
    }
    let outcome = match train(&mut run, &s.size) {
        Ok(got) => {
            if let Some(d) = differs(&got, reference, s.tolerance) {
                return Err(format!("the run reported success but {d}"));
            }
            "ok".to_string()
        }
        Err(e) => e,
    };
    ctl.clear_faults();
    if ctl.sticky_error().is_none() && run.device.lost_reason().is_none() {
        drain(&run.device);
        restore(&mut run, params).map_err(|e| format!("{outcome}; restoring failed: {e}"))?;
        let again = train(&mut run, &s.size).map_err(|e| {
            format!("{outcome}; the device is not lost, yet a clean run failed: {e}")
        })?;
        if let Some(d) = differs(&again, reference, s.tolerance) {
            return Err(format!("{outcome}; after recovery {d}"));
        }
    }
    let after = settle(&ctl, Some(run), false).map_err(|e| format!("{outcome}; {e}"))?;
    Ok(CaseResult {
        outcome,
        after,
        broken: None,
    })
}

/// Tears `run` down and states what became of the device: `recovered` (a restored state
/// trained to the clean result; nothing may be left in the ledger), `released` (setup failed
/// and gave back all it had taken), `lost` or `sticky` (what is left goes with the context).
fn settle<D: Driver>(
    ctl: &FaultController,
    run: Option<Run<D>>,
    lost_at_setup: bool,
) -> Result<String, String> {
    let run_existed = run.is_some();
    let lost = lost_at_setup || run.as_ref().and_then(|r| r.device.lost_reason()).is_some();
    drop(run);
    let left = ctl.live_resources();
    let held: usize = left.iter().map(|(_, n)| n).sum();
    if ctl.sticky_error().is_some() {
        Ok(if held > 0 {
            format!("sticky ({held} held)")
        } else {
            "sticky".to_string()
        })
    } else if lost {
        Ok(if held > 0 {
            format!("lost ({held} held)")
        } else {
            "lost".to_string()
        })
    } else if held > 0 {
        Err(format!("leaked after teardown: {left:?}"))
    } else if run_existed {
        Ok("recovered".to_string())
    } else {
        Ok("released".to_string())
    }
}

/// A driver that is not there: setup must say so, typed, and hold nothing.
pub(super) fn missing_driver_case<D: Driver>(
    make: &dyn Fn() -> D,
    s: &Settings,
    params: &[Vec<f32>],
) -> CaseResult {
    let driver = FaultyDriver::new(make());
    let ctl = driver.controller();
    ctl.set_async_stall(s.async_stall);
    ctl.set_missing_driver(true);
    let mut opened = None;
    let outcome = match setup(driver, s, MODES[0], params, &mut opened) {
        Ok(_) => return CaseResult::broken("a missing driver went unnoticed".to_string()),
        Err(e) => format!("setup: {e}"),
    };
    drop(opened);
    match settle::<D>(&ctl, None, false) {
        Ok(after) => CaseResult {
            outcome,
            after,
            broken: None,
        },
        Err(b) => CaseResult::broken(format!("driver missing: {b}")),
    }
}
