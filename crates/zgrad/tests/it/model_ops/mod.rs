//! The ops models reach for (concat, where / masked fill, abs, minimum, min, argmax, SiLU,
//! variance, RMSNorm, embedding, attention with a key-padding mask, dropout) and a user's own
//! op through `CustomOp`: against the PyTorch float64 oracle (`tests/fixtures/make_ops.py`) on
//! the CPU backend (f64 and f32), on the simulated device and (`gpu`) on CUDA device 0; captured
//! equals eager bitwise for dropout, embedding and the custom op; the custom op inside a model
//! the `Trainer` trains, in both schedules, eager and captured (`custom_trainer`).

mod custom;
mod custom_trainer;
mod masked_attention;
mod oracle;
mod replay;

use zcompute::{CudaBackend, SimDriver};
use zdevice::{Device, DeviceConfig, Driver, SimConfig};
use zmem::{Arena, ArenaConfig};

fn backend_on<D: Driver>(device: Device<D>) -> CudaBackend<D> {
    let config = ArenaConfig {
        initial_bytes: 16 << 20,
        segment_bytes: 16 << 20,
        cap_bytes: Some(128 << 20),
        overflow_reserve_bytes: 4 << 20,
        poison: true,
        timeline_events: 64,
        sanitize: false,
        from_env: Vec::new(),
    };
    let b = CudaBackend::new(Arena::new(device, config).expect("arena")).expect("backend");
    b.set_poison(true);
    b
}

/// The CUDA backend over the simulated driver, its kernels run by their twins.
pub(crate) fn sim() -> CudaBackend<SimDriver> {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(256 << 20)
    });
    zcompute::cuda::twins::register(&sim);
    let config = DeviceConfig {
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    backend_on(Device::open(sim, config).expect("the simulated device opens"))
}

/// CUDA device 0.
#[cfg(feature = "gpu")]
pub(crate) fn gpu() -> CudaBackend<zdevice::CudaDriver> {
    let driver = zdevice::CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
    backend_on(Device::open(driver, DeviceConfig::default()).expect("CUDA device 0 opens"))
}
