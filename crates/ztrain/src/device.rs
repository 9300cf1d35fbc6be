//! Choosing where to train: the CPU backend, the CUDA backend on the GPU, or the CUDA backend
//! over the simulated driver, all opened through zcompute's engine builder. A missing GPU is a
//! typed error (`--device cuda`) or a fallback that says why (`--device auto`), never a panic;
//! a GPU that is there but refuses the arena options is its error, not a fallback.

use zcompute::{
    ComputeError, CpuBackend, CudaBackend, CudaDriver, Driver, EngineConfig, SimConfig, SimDriver,
};

use crate::arena_options::refused;
use crate::cli::DeviceChoice;
use crate::error::{Result, TrainError};

/// The GPU ztrain trains on.
const GPU_ORDINAL: u32 = 0;

/// The backend ztrain opened, whichever of the three it is (zcompute's `Engine` is the door
/// that opened it).
#[derive(Debug)]
pub enum AnyBackend {
    Cpu(CpuBackend),
    Cuda(CudaBackend<CudaDriver>),
    Sim(CudaBackend<SimDriver>),
}

impl AnyBackend {
    /// Short name recorded in checkpoints: resume is bitwise only on the same one.
    #[must_use]
    pub fn backend_name(&self) -> &'static str {
        match self {
            AnyBackend::Cpu(_) => "cpu",
            AnyBackend::Cuda(_) => "cuda",
            AnyBackend::Sim(_) => "cuda-sim",
        }
    }

    /// The device's memory, for the run's estimate (`None` on the CPU).
    #[must_use]
    pub fn device_memory(&self) -> Option<u64> {
        match self {
            AnyBackend::Cpu(_) => None,
            AnyBackend::Cuda(b) => Some(b.device().info().total_memory),
            AnyBackend::Sim(b) => Some(b.device().info().total_memory),
        }
    }
}

/// What was opened and why, for the first line of output.
#[derive(Debug)]
pub struct Opened {
    pub backend: AnyBackend,
    /// E.g. `CUDA backend on NVIDIA H100 80GB HBM3 (79.2 GiB)` or `CPU backend (no usable
    /// GPU: …)`.
    pub description: String,
}

/// The GPU `--device auto`/`cuda` would train on, for a memory plan: its name and memory, or
/// why there is none.
pub fn gpu_memory() -> std::result::Result<(String, u64), String> {
    zcompute::Engine::gpu_info(GPU_ORDINAL).map_err(|e| e.to_string())
}

fn describe<D: Driver>(what: &str, b: &CudaBackend<D>) -> String {
    let info = b.device().info();
    format!(
        "{what} on {} ({})",
        info.name,
        zcompute::units::Bytes(info.total_memory)
    )
}

/// The CPU backend on `ZGPU_CPU_THREADS` threads (else one per processor): a bad value is
/// refused here, by name, rather than replaced by the machine's count.
fn cpu(description: String) -> Result<Opened> {
    let threads = zcompute::cpu::default_threads()
        .and_then(|n| zcompute::cpu::set_threads(n).map(|()| n))
        .map_err(|e| TrainError::Options(e.to_string()))?;
    Ok(Opened {
        backend: AnyBackend::Cpu(zcompute::Engine::cpu()),
        description: format!("{description}, {threads} threads"),
    })
}

/// Opens the backend `choice` asks for, its arena sized by `engine` (checked against the
/// device as it opens). `sim_memory` sizes the simulated device.
pub fn open(choice: DeviceChoice, engine: &EngineConfig, sim_memory: u64) -> Result<Opened> {
    open_on(
        choice,
        engine,
        &SimConfig::with_capacity(sim_memory),
        GPU_ORDINAL,
    )
}

/// As [`open`], on GPU `ordinal` (a rank's `LOCAL_RANK`), a simulated device being `sim`.
pub fn open_on(
    choice: DeviceChoice,
    engine: &EngineConfig,
    sim: &SimConfig,
    ordinal: u32,
) -> Result<Opened> {
    let gpu = |b: CudaBackend<CudaDriver>| Opened {
        description: describe("CUDA backend", &b),
        backend: AnyBackend::Cuda(b),
    };
    match choice {
        DeviceChoice::Cpu => cpu("CPU backend (--device cpu)".into()),
        DeviceChoice::Cuda => match engine.cuda(ordinal) {
            Ok(b) => Ok(gpu(b)),
            Err(ComputeError::DeviceUnavailable { reason, .. }) => {
                Err(TrainError::NoGpu { reason })
            }
            Err(e) => Err(refused(e)),
        },
        DeviceChoice::Auto => match engine.cuda(ordinal) {
            Ok(b) => Ok(gpu(b)),
            Err(ComputeError::DeviceUnavailable { reason, .. }) => {
                tracing::info!(target: "ztrain.device.open", %reason, "no usable GPU; using the CPU backend");
                cpu(format!("CPU backend (no usable GPU: {reason})"))
            }
            Err(e) => Err(refused(e)),
        },
        DeviceChoice::Sim => {
            let b = engine
                .sim_driver(SimDriver::new(sim.clone()))
                .map_err(refused)?;
            Ok(Opened {
                description: describe("CUDA backend over the simulated driver", &b),
                backend: AnyBackend::Sim(b),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_arena() -> EngineConfig {
        EngineConfig::new()
            .arena_bytes(1 << 20)
            .segment_bytes(1 << 20)
            .overflow_reserve(1 << 20)
    }

    /// This machine has no GPU (CI neither): `cuda` is the typed error, `auto` the CPU.
    /// Where a GPU is present the GPU tests cover the other branch.
    #[test]
    fn without_a_gpu_cuda_is_a_clear_error_and_auto_falls_back() {
        if CudaDriver::load().is_ok() {
            return; // a driver library is present: covered by the gpu tests instead
        }
        match open(DeviceChoice::Cuda, &small_arena(), 0) {
            Err(TrainError::NoGpu { reason }) => assert!(!reason.is_empty()),
            other => panic!("expected NoGpu, got {other:?}"),
        }
        let auto = open(DeviceChoice::Auto, &small_arena(), 0).expect("falls back");
        assert!(matches!(auto.backend, AnyBackend::Cpu(_)));
        assert!(
            auto.description.contains("no usable GPU"),
            "{}",
            auto.description
        );
    }

    #[test]
    fn sim_opens_the_cuda_backend_on_the_simulated_driver() {
        let o = open(DeviceChoice::Sim, &small_arena(), 256 << 20).expect("sim");
        assert_eq!(o.backend.backend_name(), "cuda-sim");
        assert_eq!(o.backend.device_memory(), Some(256 << 20));
        assert!(o.description.contains("simulated"), "{}", o.description);
    }

    #[test]
    fn a_refused_arena_option_is_named_by_its_flag_not_a_fallback() {
        let cfg = small_arena()
            .labels(crate::arena_options::option_name)
            .arena_bytes(3 << 19);
        match open(DeviceChoice::Sim, &cfg, 256 << 20) {
            Err(TrainError::ArenaOption { name, .. }) => assert_eq!(name, "--arena-bytes"),
            other => panic!("expected ArenaOption, got {other:?}"),
        }
    }
}
