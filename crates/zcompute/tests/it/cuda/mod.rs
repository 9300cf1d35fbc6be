//! The CUDA backend against the CPU backend. Every body is generic over the driver: the
//! `mock` suite runs it on the simulated device (CI), the `gpu` suite (feature `gpu`) on CUDA
//! device 0. Outputs are poisoned with NaN before each op, so an element a kernel forgets to
//! write fails the comparison.

pub mod accumulate_bodies;
pub mod bodies;
pub mod capture;
pub mod capture_end;
pub mod capture_pool;
mod chain;
mod cols_once;
pub mod errors;
mod exchange;
pub mod flat_bodies;
mod fused;
mod fused_launch;
mod indexed;
mod linear;
mod linear_backward;
mod linear_backward_bf16;
mod linear_backward_errors;
mod linear_bf16;
mod linear_launch;
mod norm_params;
mod norm_params_launch;
mod optim;
pub mod precision;
mod readback;
mod reduce_launch;
mod select;
mod side_stream;
#[macro_use]
mod suite;
pub mod validation;
#[macro_use]
mod validation_table;
mod memory;

use zcompute::CudaBackend;
use zdevice::{Device, DeviceConfig, Driver, SimConfig, SimDriver};
use zmem::{Arena, ArenaConfig};

fn arena_config() -> ArenaConfig {
    ArenaConfig {
        initial_bytes: 16 << 20,
        segment_bytes: 16 << 20,
        cap_bytes: Some(192 << 20),
        overflow_reserve_bytes: 4 << 20,
        poison: true,
        timeline_events: 256,
        sanitize: false,
        from_env: Vec::new(),
    }
}

/// A backend over `device` with poison on.
pub fn backend_on<D: Driver>(device: Device<D>) -> CudaBackend<D> {
    let arena = Arena::new(device, arena_config()).expect("arena");
    let b = CudaBackend::new(arena).expect("backend");
    b.set_poison(true);
    b
}

/// A fresh simulated device (freed memory poisoned by the simulator too) and backend.
pub fn mock() -> CudaBackend<SimDriver> {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(512 << 20)
    });
    // The kernels' Rust twins: registered explicitly, as `Engine::sim` does.
    zcompute::cuda::twins::register(&sim);
    on_sim(sim)
}

/// A backend on `sim` (its kernels registered by the caller), with no cuBLAS workspace.
pub fn on_sim(sim: SimDriver) -> CudaBackend<SimDriver> {
    let dev = Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    backend_on(dev)
}

/// The kernels a backend ran, in launch order (`observed`).
pub type KernelLog = std::sync::Arc<std::sync::Mutex<Vec<zcompute::cuda::Kernel>>>;

/// A fresh simulated device and backend whose every kernel launch is logged (after the twin
/// ran), for tests that pin which kernels an op runs.
pub fn observed() -> (CudaBackend<SimDriver>, KernelLog) {
    let sim = SimDriver::new(SimConfig::with_capacity(512 << 20));
    let log = KernelLog::default();
    let seen = std::sync::Arc::clone(&log);
    zcompute::cuda::twins::register_observed(&sim, move |k| seen.lock().unwrap().push(k));
    (on_sim(sim), log)
}

/// A simulated backend behind the fault-injecting wrapper, whose controller counts the
/// driver calls the backend makes.
pub fn counted_mock() -> (
    CudaBackend<zdevice::FaultyDriver<SimDriver>>,
    zdevice::FaultController,
) {
    let sim = SimDriver::new(SimConfig::with_capacity(512 << 20));
    zcompute::cuda::twins::register(&sim);
    let driver = zdevice::FaultyDriver::new(sim);
    let ctl = driver.controller();
    let dev = Device::open(
        driver,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    (backend_on(dev), ctl)
}

/// One backend on CUDA device 0 for the whole test binary (module loads and cuBLAS setup are
/// paid once; the bundle runs tests on one thread).
#[cfg(feature = "gpu")]
pub fn gpu() -> CudaBackend<zdevice::CudaDriver> {
    use std::sync::OnceLock;
    static GPU: OnceLock<CudaBackend<zdevice::CudaDriver>> = OnceLock::new();
    GPU.get_or_init(|| {
        let driver = zdevice::CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
        let dev = Device::open(driver, DeviceConfig::default()).expect("CUDA device 0 opens");
        backend_on(dev)
    })
    .clone()
}

mod mock_suite {
    op_suite!(super::mock);
    validation_table!(super::super::mock);
}

#[cfg(feature = "gpu")]
mod gpu_suite {
    op_suite!(super::gpu);
    validation_table!(super::super::gpu);
}
