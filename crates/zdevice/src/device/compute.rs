//! Modules, kernel launches and cuBLAS.

use crate::driver::{CuCode, Driver};
use crate::error::{DeviceError, DeviceResult};
use crate::types::*;

use super::Device;

/// A loaded PTX module. Unloaded on drop.
#[derive(Debug)]
pub struct LoadedModule<D: Driver> {
    device: Device<D>,
    module: Module,
}

impl<D: Driver> LoadedModule<D> {
    /// Looks up a kernel by its `extern "C"` name.
    pub fn function(&self, name: &str) -> DeviceResult<Function> {
        self.device
            .call(|d| d.module_get_function(self.module, name))
    }
}

impl<D: Driver> Drop for LoadedModule<D> {
    fn drop(&mut self) {
        if self.device.check_lost().is_ok()
            && let Err(e) = self.device.inner.driver.module_unload(self.module)
        {
            tracing::warn!(target: "zdevice.device.module", error = %e, "module unload failed");
        }
    }
}

/// CUDA release, Linux driver and PTX ISA: which driver a PTX `.version` needs.
const PTX_ISA_TABLE: &[((u32, u32), &str, &str)] = &[
    ((8, 0), "12.0", "525"),
    ((8, 1), "12.1", "530"),
    ((8, 2), "12.2", "535"),
    ((8, 3), "12.3", "545"),
    ((8, 4), "12.4", "550"),
    ((8, 5), "12.5", "555"),
    ((8, 6), "12.6", "560"),
    ((8, 7), "12.8", "570"),
    ((8, 8), "12.9", "575"),
    ((9, 0), "13.0", "580"),
];

/// The `.version X.Y` of a PTX text.
fn ptx_isa(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(".version"))?;
    let (major, minor) = line.trim_start_matches(".version").trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn ptx_too_new(ptx: &str, driver_version: u32) -> DeviceError {
    let isa = ptx_isa(ptx);
    let (needs_cuda, needs_driver) = isa
        .and_then(|v| PTX_ISA_TABLE.iter().find(|(isa, ..)| *isa == v))
        .map(|(_, c, d)| (*c, *d))
        .unwrap_or(("newer than 13.0", "newer than 580"));
    DeviceError::PtxTooNew {
        ptx_isa: isa.map_or_else(|| "unknown".into(), |(a, b)| format!("{a}.{b}")),
        needs_cuda,
        needs_driver,
        driver_cuda: format!("{}.{}", driver_version / 1000, (driver_version % 1000) / 10),
    }
}

impl<D: Driver> Device<D> {
    /// Loads a PTX module (JIT-compiled by the driver for this device). A driver too old for
    /// the PTX yields `PtxTooNew` naming the driver needed. Refused during capture.
    pub fn load_module(&self, ptx: &str) -> DeviceResult<LoadedModule<D>> {
        let call = "cuModuleLoadData";
        self.refuse_during_capture(call, "load modules before capture")?;
        let text = ptx.to_owned();
        let deadline = self.inner.config.build_deadline;
        let module = self
            .call_watched(call, deadline, move |d| d.module_load_ptx(&text))
            .map_err(|e| match e {
                DeviceError::Driver { code, .. } if code == CuCode::UNSUPPORTED_PTX_VERSION => {
                    ptx_too_new(ptx, self.inner.info.driver_version)
                }
                other => other,
            })?;
        Ok(LoadedModule {
            device: self.clone(),
            module,
        })
    }

    /// Launches a kernel on `stream` (capturable).
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number and type, and every address the
    /// kernel reads or writes must stay live device memory until the launch has run.
    pub unsafe fn launch(
        &self,
        function: Function,
        config: LaunchConfig,
        args: &[KernelArg],
        stream: Stream,
    ) -> DeviceResult<()> {
        // SAFETY: forwarded from this function's contract.
        self.call_queued("cuLaunchKernel", |d| unsafe {
            d.launch_kernel(function, config, args, stream)
        })
    }

    /// Chooses TF32 tensor-op math (`true`) or strict float32 (`false`, the default) for gemms.
    pub fn set_tf32(&self, enabled: bool) -> DeviceResult<()> {
        self.call(|d| d.blas_set_tf32(self.inner.blas, enabled))
    }

    /// Strided batched float32 gemm (cuBLAS column-major convention) on `stream`, using the
    /// workspace reserved at open (so it allocates nothing, and is capturable).
    ///
    /// # Safety
    /// Every operand described by `gemm` must lie in live device memory until the gemm has run.
    pub unsafe fn gemm_f32(&self, gemm: &GemmF32, stream: Stream) -> DeviceResult<()> {
        let blas = self.blas_for("cublasSgemmStridedBatched", gemm, stream)?;
        // SAFETY: forwarded from this function's contract.
        self.call_queued("cublasSgemmStridedBatched", |d| unsafe {
            d.gemm_strided_batched_f32(blas, gemm)
        })
    }

    /// The cuBLAS handle, bound to `stream`, for a product `gemm` describes: a negative size is
    /// refused here (cuBLAS would take it as a huge one), and the handle is rebound only when
    /// the stream changes.
    fn blas_for(
        &self,
        call: &'static str,
        gemm: &GemmF32,
        stream: Stream,
    ) -> DeviceResult<BlasHandle> {
        if gemm.m < 0 || gemm.n < 0 || gemm.k < 0 || gemm.batch < 0 {
            return Err(DeviceError::InvalidArgument {
                call,
                reason: format!(
                    "negative dimension: m={} n={} k={} batch={}",
                    gemm.m, gemm.n, gemm.k, gemm.batch
                ),
            });
        }
        let blas = self.inner.blas;
        let mut bound = self
            .inner
            .blas_stream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *bound != stream {
            self.call(|d| d.blas_set_stream(blas, stream))?;
            *bound = stream;
        }
        Ok(blas)
    }
}

// --- mixed-precision gemm (issue 42) ---------------------------------------------------------

impl<D: Driver> Device<D> {
    /// Strided batched gemm under `gemm.math` (float32, TF32 or bf16 operands; float32
    /// accumulation and C: [`Driver::gemm_strided_batched_ex`]) on `stream`, using the workspace
    /// reserved at open, so it allocates nothing and is capturable as the float32 gemm is.
    ///
    /// # Safety
    /// Every operand described by `gemm` must lie in live device memory, A and B holding
    /// elements of the mode's type, until the gemm has run.
    pub unsafe fn gemm_ex(&self, gemm: &GemmEx, stream: Stream) -> DeviceResult<()> {
        const CALL: &str = "cublasGemmStridedBatchedEx";
        let blas = self.blas_for(CALL, &gemm.gemm, stream)?;
        // SAFETY: forwarded from this function's contract.
        self.call_queued(CALL, |d| unsafe { d.gemm_strided_batched_ex(blas, gemm) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ptx_isa() {
        assert_eq!(ptx_isa("//\n.version 9.0\n.target sm_80\n"), Some((9, 0)));
        assert_eq!(ptx_isa(".target sm_80"), None);
    }

    #[test]
    fn names_the_driver_needed() {
        let e = ptx_too_new(".version 9.0\n", 12040);
        let msg = e.to_string();
        assert!(msg.contains("CUDA 13.0"), "{msg}");
        assert!(msg.contains("580"), "{msg}");
        assert!(msg.contains("supports CUDA 12.4"), "{msg}");
    }
}
