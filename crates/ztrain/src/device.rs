//! Choosing where to train: the CPU backend, the CUDA backend on the GPU, or the CUDA backend
//! over the simulated driver. A missing GPU is a typed error (`--device cuda`) or a fallback
//! that says why (`--device auto`), never a panic.

use zcompute::{CpuBackend, CudaBackend};
use zdevice::{CudaDriver, Device, DeviceConfig, Driver, SimConfig, SimDriver};
use zmem::{Arena, ArenaConfig};

use crate::cli::DeviceChoice;
use crate::error::{Result, TrainError};

/// An opened backend.
#[derive(Debug)]
pub enum Engine {
    Cpu(CpuBackend),
    Cuda(CudaBackend<CudaDriver>),
    Sim(CudaBackend<SimDriver>),
}

impl Engine {
    /// Short name recorded in checkpoints: resume is bitwise only on the same one.
    #[must_use]
    pub fn backend_name(&self) -> &'static str {
        match self {
            Engine::Cpu(_) => "cpu",
            Engine::Cuda(_) => "cuda",
            Engine::Sim(_) => "cuda-sim",
        }
    }
}

/// What was opened and why, for the first line of output.
#[derive(Debug)]
pub struct Opened {
    pub engine: Engine,
    /// E.g. `CUDA backend on NVIDIA H100 80GB HBM3 (79.2 GiB)` or `CPU backend (no usable
    /// GPU: …)`.
    pub description: String,
}

/// Checks a device of `total` bytes, called `name`, before its arena is made: the arena
/// options and the run's memory estimate.
pub type Check<'a> = &'a dyn Fn(u64, &str) -> Result<()>;

/// Opens the GPU: the driver library and device 0.
fn open_gpu() -> std::result::Result<Device<CudaDriver>, String> {
    let driver = CudaDriver::load().map_err(|e| e.to_string())?;
    Device::open(driver, DeviceConfig::default()).map_err(|e| e.to_string())
}

/// The GPU `--device auto`/`cuda` would train on, for a memory plan: its name and memory, or
/// why there is none.
pub fn gpu_memory() -> std::result::Result<(String, u64), String> {
    let device = open_gpu()?;
    let info = device.info();
    Ok((info.name.clone(), info.total_memory))
}

fn cuda_backend<D: Driver>(
    device: Device<D>,
    arena: &ArenaConfig,
    name: &str,
    check: Check<'_>,
) -> Result<CudaBackend<D>> {
    check(device.info().total_memory, name)?;
    let arena = Arena::new(device, arena.clone())?;
    Ok(CudaBackend::new(arena)?)
}

fn describe<D: Driver>(what: &str, b: &CudaBackend<D>) -> String {
    let info = b.device().info();
    format!(
        "{what} on {} ({})",
        info.name,
        zmem::units::Bytes(info.total_memory)
    )
}

/// Opens the backend `choice` asks for. `sim_memory` sizes the simulated device; `check` runs
/// on the device before its arena is made (a GPU that is there but too small is its error,
/// not a fallback to the CPU).
pub fn open(
    choice: DeviceChoice,
    arena: &ArenaConfig,
    sim_memory: u64,
    check: Check<'_>,
) -> Result<Opened> {
    let gpu = |device| {
        let b = cuda_backend(device, arena, "the GPU", check)?;
        Ok(Opened {
            description: describe("CUDA backend", &b),
            engine: Engine::Cuda(b),
        })
    };
    match choice {
        DeviceChoice::Cpu => Ok(Opened {
            engine: Engine::Cpu(CpuBackend),
            description: "CPU backend (--device cpu)".into(),
        }),
        DeviceChoice::Cuda => gpu(open_gpu().map_err(|reason| TrainError::NoGpu { reason })?),
        DeviceChoice::Auto => match open_gpu() {
            Ok(device) => gpu(device),
            Err(reason) => {
                tracing::info!(target: "ztrain.device.open", %reason, "no usable GPU; using the CPU backend");
                Ok(Opened {
                    engine: Engine::Cpu(CpuBackend),
                    description: format!("CPU backend (no usable GPU: {reason})"),
                })
            }
        },
        DeviceChoice::Sim => {
            let sim = SimDriver::new(SimConfig::with_capacity(sim_memory));
            let device = Device::open(sim, DeviceConfig::default())?;
            let b = cuda_backend(device, arena, "the simulated device (--sim-memory)", check)?;
            Ok(Opened {
                description: describe("CUDA backend over the simulated driver", &b),
                engine: Engine::Sim(b),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_arena() -> ArenaConfig {
        ArenaConfig {
            initial_bytes: 1 << 20,
            segment_bytes: 1 << 20,
            overflow_reserve_bytes: 1 << 20,
            ..ArenaConfig::default()
        }
    }

    /// This machine has no GPU (CI neither): `cuda` is the typed error, `auto` the CPU.
    /// Where a GPU is present the GPU tests cover the other branch.
    #[test]
    fn without_a_gpu_cuda_is_a_clear_error_and_auto_falls_back() {
        if CudaDriver::load().is_ok() {
            return; // a driver library is present: covered by the gpu tests instead
        }
        match open(DeviceChoice::Cuda, &small_arena(), 0, &|_, _| Ok(())) {
            Err(TrainError::NoGpu { reason }) => assert!(!reason.is_empty()),
            other => panic!("expected NoGpu, got {other:?}"),
        }
        let auto = open(DeviceChoice::Auto, &small_arena(), 0, &|_, _| Ok(())).expect("falls back");
        assert!(matches!(auto.engine, Engine::Cpu(_)));
        assert!(
            auto.description.contains("no usable GPU"),
            "{}",
            auto.description
        );
    }

    #[test]
    fn sim_opens_the_cuda_backend_on_the_simulated_driver() {
        let o = open(DeviceChoice::Sim, &small_arena(), 256 << 20, &|_, _| Ok(())).expect("sim");
        assert_eq!(o.engine.backend_name(), "cuda-sim");
        assert!(o.description.contains("simulated"), "{}", o.description);
    }
}
