//! The device and context calls of `CudaDriver` (`Driver::init` to `Driver::ctx_synchronize`).
//!
//! Every `unsafe` block below calls one libcuda/cuBLAS entry point resolved by cuda-sys with the
//! signature of the pinned 13.0 header. Out-pointers are always live locals; handles are ones
//! this driver returned earlier (a stale or foreign handle is the driver's to reject, and its
//! status is checked); host buffers are Rust slices whose length is the count passed.

use std::ptr;
use std::sync::atomic::Ordering;

use cuda_sys::driver as cu;

use super::{CONTEXT_EPOCH, CudaDriver, THREAD_CONTEXT, check};
use crate::driver::{DriverError, DriverResult};
use crate::types::*;

fn device_of(drv: &CudaDriver, call: &'static str, ordinal: u32) -> DriverResult<cu::CUdevice> {
    let ordinal = i32::try_from(ordinal).map_err(|_| DriverError::InvalidArgument {
        call,
        reason: format!("device ordinal {ordinal} out of range"),
    })?;
    let mut dev: cu::CUdevice = 0;
    // SAFETY: out-pointer to a local.
    check("cuDeviceGet", unsafe {
        drv.cu.cuDeviceGet(&mut dev, ordinal)
    })?;
    Ok(dev)
}

fn attribute(
    drv: &CudaDriver,
    attr: cu::CUdevice_attribute,
    dev: cu::CUdevice,
) -> DriverResult<u32> {
    let mut v = 0i32;
    // SAFETY: out-pointer to a local; `dev` came from cuDeviceGet.
    check("cuDeviceGetAttribute", unsafe {
        drv.cu.cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(u32::try_from(v).unwrap_or(0))
}

impl CudaDriver {
    pub(super) fn cu_init(&self) -> DriverResult<()> {
        // SAFETY: cuInit takes flags only (0 is the one documented value).
        check("cuInit", unsafe { self.cu.cuInit(0) })
    }

    pub(super) fn cu_driver_version(&self) -> DriverResult<u32> {
        let mut v = 0i32;
        // SAFETY: out-pointer to a local.
        check("cuDriverGetVersion", unsafe {
            self.cu.cuDriverGetVersion(&mut v)
        })?;
        Ok(u32::try_from(v).unwrap_or(0))
    }

    pub(super) fn cu_device_count(&self) -> DriverResult<u32> {
        let mut n = 0i32;
        // SAFETY: out-pointer to a local.
        check("cuDeviceGetCount", unsafe {
            self.cu.cuDeviceGetCount(&mut n)
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    pub(super) fn cu_device_name(&self, ordinal: u32) -> DriverResult<String> {
        let dev = device_of(self, "cuDeviceGetName", ordinal)?;
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer is 256 chars long and its length is passed; the driver NUL-terminates.
        check("cuDeviceGetName", unsafe {
            self.cu
                .cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev)
        })?;
        let bytes: Vec<u8> = buf
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub(super) fn cu_device_total_mem(&self, ordinal: u32) -> DriverResult<u64> {
        let dev = device_of(self, "cuDeviceTotalMem_v2", ordinal)?;
        let mut bytes = 0usize;
        // SAFETY: out-pointer to a local.
        check("cuDeviceTotalMem_v2", unsafe {
            self.cu.cuDeviceTotalMem_v2(&mut bytes, dev)
        })?;
        Ok(bytes as u64)
    }

    pub(super) fn cu_compute_capability(&self, ordinal: u32) -> DriverResult<(u32, u32)> {
        let dev = device_of(self, "cuDeviceGetAttribute", ordinal)?;
        let major = attribute(self, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)?;
        let minor = attribute(self, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)?;
        Ok((major, minor))
    }

    pub(super) fn cu_primary_ctx_retain(&self, ordinal: u32) -> DriverResult<Context> {
        let dev = device_of(self, "cuDevicePrimaryCtxRetain", ordinal)?;
        let mut ctx: cu::CUcontext = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("cuDevicePrimaryCtxRetain", unsafe {
            self.cu.cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        let ctx = ctx as u64;
        self.retained
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(ordinal, ctx);
        Ok(Context(ctx))
    }

    pub(super) fn cu_primary_ctx_release(&self, ordinal: u32) -> DriverResult<()> {
        let dev = device_of(self, "cuDevicePrimaryCtxRelease_v2", ordinal)?;
        // SAFETY: plain call on a device handle from cuDeviceGet.
        let status = unsafe { self.cu.cuDevicePrimaryCtxRelease_v2(dev) };
        // The context may be gone now: every thread re-binds before its next call.
        CONTEXT_EPOCH.fetch_add(1, Ordering::AcqRel);
        let released = self
            .retained
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&ordinal);
        if let Some(ctx) = released {
            let _ = self
                .context
                .compare_exchange(ctx, 0, Ordering::AcqRel, Ordering::Acquire);
        }
        check("cuDevicePrimaryCtxRelease_v2", status)
    }

    pub(super) fn cu_ctx_set_current(&self, ctx: Context) -> DriverResult<()> {
        // SAFETY: the handle is passed through; the driver validates it and the status is checked.
        check("cuCtxSetCurrent", unsafe {
            self.cu.cuCtxSetCurrent(ctx.0 as cu::CUcontext)
        })?;
        self.context.store(ctx.0, Ordering::Release);
        let epoch = CONTEXT_EPOCH.load(Ordering::Acquire);
        THREAD_CONTEXT.with(|c| c.set((epoch, ctx.0)));
        Ok(())
    }

    pub(super) fn cu_ctx_synchronize(&self) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: no arguments; acts on the context just made current.
        check("cuCtxSynchronize", unsafe { self.cu.cuCtxSynchronize() })
    }
}

impl CudaDriver {
    /// Whether every device has unified addressing (`CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING`):
    /// then page-locked host memory is mapped into every context at its host address.
    pub(super) fn cu_unified_addressing(&self) -> DriverResult<bool> {
        let mut count = 0i32;
        // SAFETY: out-pointer to a local.
        check("cuDeviceGetCount", unsafe {
            self.cu.cuDeviceGetCount(&mut count)
        })?;
        for ordinal in 0..u32::try_from(count).unwrap_or(0) {
            let dev = device_of(self, "cuDeviceGetAttribute", ordinal)?;
            if attribute(self, cu::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev)? == 0 {
                return Ok(false);
            }
        }
        Ok(count > 0)
    }
}
