//! The first line a library user writes: an engine (a backend with its device and arena) in one
//! call.
//!
//! ```
//! use zcompute::{Backend, Engine, EngineConfig};
//! // The CUDA backend over the simulated driver (kernel twins registered), 256 MiB of memory.
//! let sim = Engine::sim(256 << 20)?;
//! let x = sim.upload(&[1.0f32, 2.0], &[2])?;
//! assert_eq!(sim.download(&x)?, vec![1.0, 2.0]);
//! // Arena settings: defaults, then `ZMEM_*` variables, then these overrides; checked once.
//! let small = EngineConfig::from_env()?.arena_bytes(1 << 20).segment_bytes(1 << 20).sim(128 << 20)?;
//! assert_eq!(small.arena().config().initial_bytes, 1 << 20);
//! // `Engine::cuda(0)?` is the same backend on GPU 0 (an error on a machine without one).
//! # Ok::<(), zcompute::ComputeError>(())
//! ```

mod settings;

pub use settings::{ArenaSetting, EngineConfig, Labels};
/// The drivers an engine's backend is generic over (so a user names `CudaBackend<SimDriver>`
/// without depending on zdevice).
pub use zdevice::{CudaDriver, Driver, SimConfig, SimDriver, StreamPriority};
pub use zmem::ArenaOverrides;

use zdevice::{Device, DeviceConfig};
use zmem::Arena;

use crate::cpu::CpuBackend;
use crate::cuda::{CudaBackend, device_error, mem_error, twins};
use crate::error::{ComputeError, Result};

/// Opens engines with the arena settings of the environment (`ZMEM_*`) over zmem's defaults;
/// [`EngineConfig`] overrides them.
#[derive(Clone, Copy, Debug)]
pub struct Engine;

impl Engine {
    /// The CUDA backend over the real driver on GPU `ordinal`. No driver library or no such
    /// device: [`ComputeError::DeviceUnavailable`].
    pub fn cuda(ordinal: u32) -> Result<CudaBackend<CudaDriver>> {
        EngineConfig::from_env()?.cuda(ordinal)
    }

    /// The same backend over the simulated driver with `capacity` bytes of device memory, the
    /// kernels' Rust twins registered: the whole device path in host memory, for tests and CI.
    pub fn sim(capacity: u64) -> Result<CudaBackend<SimDriver>> {
        EngineConfig::from_env()?.sim(capacity)
    }

    /// GPU `ordinal`'s name and total memory, without making an arena (what a memory plan
    /// compares itself with). No driver library or no such device:
    /// [`ComputeError::DeviceUnavailable`].
    pub fn gpu_info(ordinal: u32) -> Result<(String, u64)> {
        let device = open_cuda(DeviceConfig {
            ordinal,
            ..DeviceConfig::default()
        })?;
        let info = device.info();
        Ok((info.name.clone(), info.total_memory))
    }

    /// The CPU backend (no device, no arena).
    #[must_use]
    pub fn cpu() -> CpuBackend {
        CpuBackend
    }
}

impl EngineConfig {
    /// The CUDA backend over the real driver on GPU `ordinal`, its arena sized by `self`.
    pub fn cuda(&self, ordinal: u32) -> Result<CudaBackend<CudaDriver>> {
        self.on_device(open_cuda(self.device_config(ordinal))?)
    }

    /// The CUDA backend over a simulated driver of `capacity` bytes, twins registered.
    pub fn sim(&self, capacity: u64) -> Result<CudaBackend<SimDriver>> {
        self.sim_driver(SimDriver::new(SimConfig::with_capacity(capacity)))
    }

    /// The CUDA backend over `sim` (any [`SimConfig`]: fault plans, clocks), twins registered.
    pub fn sim_driver(&self, sim: SimDriver) -> Result<CudaBackend<SimDriver>> {
        twins::register(&sim);
        let device =
            Device::open(sim, self.device_config(0)).map_err(|e| device_error("Engine::sim", e))?;
        self.on_device(device)
    }

    /// The CUDA backend on an opened `device` (any driver: a wrapper such as `FaultyDriver`,
    /// too): checks the settings against its memory, makes the arena, loads the kernels. Over a
    /// simulator of your own, register [`twins`] on it first.
    pub fn on_device<D: Driver>(&self, device: Device<D>) -> Result<CudaBackend<D>> {
        // The one check of the settings, against this device; the arena takes it as it is.
        let config = self.arena_config(device.info().total_memory)?;
        tracing::debug!(
            target: "zcompute.engine.open",
            device = %device.info().name,
            arena = %config,
            "opening engine"
        );
        let arena = Arena::new(device, config).map_err(|e| mem_error("Engine::arena", e))?;
        CudaBackend::new(arena)
    }
}

/// Opens the GPU `config.ordinal` names over the real driver.
fn open_cuda(config: DeviceConfig) -> Result<Device<CudaDriver>> {
    let ordinal = config.ordinal;
    let unavailable = |reason: String| ComputeError::DeviceUnavailable { ordinal, reason };
    let driver = CudaDriver::load().map_err(|e| unavailable(e.to_string()))?;
    Device::open(driver, config).map_err(|e| unavailable(e.to_string()))
}

#[cfg(test)]
mod tests;
