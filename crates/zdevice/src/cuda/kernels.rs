//! The module and kernel-launch calls of `CudaDriver`.
//!
//! Every `unsafe` block below calls one libcuda/cuBLAS entry point resolved by cuda-sys with the
//! signature of the pinned 13.0 header. Out-pointers are always live locals; handles are ones
//! this driver returned earlier (a stale or foreign handle is the driver's to reject, and its
//! status is checked); host buffers are Rust slices whose length is the count passed.

use std::ffi::CString;
use std::ptr;

use cuda_sys::driver as cu;

use super::args::ArgSlots;
use super::streams::stream;
use super::{CudaDriver, check};
use crate::driver::{DriverError, DriverResult};
use crate::types::*;

impl CudaDriver {
    pub(super) fn cu_module_load_ptx(&self, ptx: &str) -> DriverResult<Module> {
        let image = CString::new(ptx).map_err(|_| DriverError::InvalidArgument {
            call: "cuModuleLoadData",
            reason: "PTX text contains a NUL byte".to_string(),
        })?;
        self.bind()?;
        let mut m: cu::CUmodule = ptr::null_mut();
        // SAFETY: out-pointer to a local; `image` is NUL-terminated PTX, read during the call.
        check("cuModuleLoadData", unsafe {
            self.cu.cuModuleLoadData(&mut m, image.as_ptr().cast())
        })?;
        Ok(Module(m as u64))
    }

    pub(super) fn cu_module_unload(&self, module: Module) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuModuleUnload", unsafe {
            self.cu.cuModuleUnload(module.0 as cu::CUmodule)
        })
    }

    pub(super) fn cu_module_get_function(
        &self,
        module: Module,
        name: &str,
    ) -> DriverResult<Function> {
        let cname = CString::new(name).map_err(|_| DriverError::InvalidArgument {
            call: "cuModuleGetFunction",
            reason: format!("kernel name {name:?} contains a NUL byte"),
        })?;
        self.bind()?;
        let mut f: cu::CUfunction = ptr::null_mut();
        // SAFETY: out-pointer to a local; `cname` is NUL-terminated and live for the call.
        check("cuModuleGetFunction", unsafe {
            self.cu
                .cuModuleGetFunction(&mut f, module.0 as cu::CUmodule, cname.as_ptr())
        })?;
        Ok(Function(f as u64))
    }

    pub(super) unsafe fn cu_launch_kernel(
        &self,
        function: Function,
        config: LaunchConfig,
        args: &[KernelArg],
        s: Stream,
    ) -> DriverResult<()> {
        self.bind()?;
        let mut slots = ArgSlots::new(args);
        let mut params = slots.pointers();
        let LaunchConfig {
            grid,
            block,
            shared_mem_bytes,
        } = config;
        // SAFETY: `params` points at one live 8-byte slot per argument; the driver copies the
        // values during this call. That they match the kernel's parameters, and that the memory
        // it touches is live, is the caller's contract.
        check("cuLaunchKernel", unsafe {
            self.cu.cuLaunchKernel(
                function.0 as cu::CUfunction,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_mem_bytes,
                stream(s),
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        })
    }
}
