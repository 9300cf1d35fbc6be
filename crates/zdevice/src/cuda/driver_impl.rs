//! `impl Driver for CudaDriver`: one checked CUDA call per method.
//!
//! Every `unsafe` block below calls one libcuda/cuBLAS entry point resolved by cuda-sys with the
//! signature of the pinned 13.0 header. Out-pointers are always live locals; handles are ones
//! this driver returned earlier (a stale or foreign handle is the driver's to reject, and its
//! status is checked); host buffers are Rust slices whose length is the count passed.

use std::ffi::{CString, c_void};
use std::ptr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cuda_sys::driver as cu;

use super::args::ArgSlots;
use super::{CONTEXT_EPOCH, CudaDriver, THREAD_CONTEXT, check, readiness, size};
use crate::driver::{Driver, DriverError, DriverResult};
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

fn stream(s: Stream) -> cu::CUstream {
    s.0 as cu::CUstream
}

fn event(e: Event) -> cu::CUevent {
    e.0 as cu::CUevent
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

impl Driver for CudaDriver {
    fn describe(&self) -> String {
        match self.version {
            Some(v) => format!(
                "CudaDriver (libcuda, driver API {}.{})",
                v / 1000,
                (v % 1000) / 10
            ),
            None => "CudaDriver (libcuda, driver version unknown)".to_string(),
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn pause(&self, d: Duration) {
        std::thread::sleep(d);
    }

    fn is_virtual_time(&self) -> bool {
        false
    }

    fn init(&self) -> DriverResult<()> {
        // SAFETY: cuInit takes flags only (0 is the one documented value).
        check("cuInit", unsafe { self.cu.cuInit(0) })
    }

    fn driver_version(&self) -> DriverResult<u32> {
        let mut v = 0i32;
        // SAFETY: out-pointer to a local.
        check("cuDriverGetVersion", unsafe {
            self.cu.cuDriverGetVersion(&mut v)
        })?;
        Ok(u32::try_from(v).unwrap_or(0))
    }

    fn device_count(&self) -> DriverResult<u32> {
        let mut n = 0i32;
        // SAFETY: out-pointer to a local.
        check("cuDeviceGetCount", unsafe {
            self.cu.cuDeviceGetCount(&mut n)
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    fn device_name(&self, ordinal: u32) -> DriverResult<String> {
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

    fn device_total_mem(&self, ordinal: u32) -> DriverResult<u64> {
        let dev = device_of(self, "cuDeviceTotalMem_v2", ordinal)?;
        let mut bytes = 0usize;
        // SAFETY: out-pointer to a local.
        check("cuDeviceTotalMem_v2", unsafe {
            self.cu.cuDeviceTotalMem_v2(&mut bytes, dev)
        })?;
        Ok(bytes as u64)
    }

    fn compute_capability(&self, ordinal: u32) -> DriverResult<(u32, u32)> {
        let dev = device_of(self, "cuDeviceGetAttribute", ordinal)?;
        let major = attribute(self, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)?;
        let minor = attribute(self, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)?;
        Ok((major, minor))
    }

    fn primary_ctx_retain(&self, ordinal: u32) -> DriverResult<Context> {
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

    fn primary_ctx_release(&self, ordinal: u32) -> DriverResult<()> {
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

    fn ctx_set_current(&self, ctx: Context) -> DriverResult<()> {
        // SAFETY: the handle is passed through; the driver validates it and the status is checked.
        check("cuCtxSetCurrent", unsafe {
            self.cu.cuCtxSetCurrent(ctx.0 as cu::CUcontext)
        })?;
        self.context.store(ctx.0, Ordering::Release);
        let epoch = CONTEXT_EPOCH.load(Ordering::Acquire);
        THREAD_CONTEXT.with(|c| c.set((epoch, ctx.0)));
        Ok(())
    }

    fn ctx_synchronize(&self) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: no arguments; acts on the context just made current.
        check("cuCtxSynchronize", unsafe { self.cu.cuCtxSynchronize() })
    }

    fn stream_create(&self, kind: StreamKind) -> DriverResult<Stream> {
        self.bind()?;
        let flags = match kind {
            StreamKind::NonBlocking => cu::CU_STREAM_NON_BLOCKING,
            StreamKind::Blocking => cu::CU_STREAM_DEFAULT,
        };
        let mut s: cu::CUstream = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("cuStreamCreate", unsafe {
            self.cu.cuStreamCreate(&mut s, flags)
        })?;
        Ok(Stream(s as u64))
    }

    fn stream_destroy(&self, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuStreamDestroy_v2", unsafe {
            self.cu.cuStreamDestroy_v2(stream(s))
        })
    }

    fn stream_query(&self, s: Stream) -> DriverResult<Readiness> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        readiness("cuStreamQuery", unsafe { self.cu.cuStreamQuery(stream(s)) })
    }

    fn stream_synchronize(&self, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuStreamSynchronize", unsafe {
            self.cu.cuStreamSynchronize(stream(s))
        })
    }

    fn stream_wait_event(&self, s: Stream, e: Event) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles; flags 0 is the only documented value.
        check("cuStreamWaitEvent", unsafe {
            self.cu.cuStreamWaitEvent(stream(s), event(e), 0)
        })
    }

    fn event_create(&self, timing: bool) -> DriverResult<Event> {
        self.bind()?;
        let flags = if timing {
            cu::CU_EVENT_DEFAULT
        } else {
            cu::CU_EVENT_DISABLE_TIMING
        };
        let mut e: cu::CUevent = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("cuEventCreate", unsafe {
            self.cu.cuEventCreate(&mut e, flags)
        })?;
        Ok(Event(e as u64))
    }

    fn event_destroy(&self, e: Event) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuEventDestroy_v2", unsafe {
            self.cu.cuEventDestroy_v2(event(e))
        })
    }

    fn event_record(&self, e: Event, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuEventRecord", unsafe {
            self.cu.cuEventRecord(event(e), stream(s))
        })
    }

    fn event_query(&self, e: Event) -> DriverResult<Readiness> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        readiness("cuEventQuery", unsafe { self.cu.cuEventQuery(event(e)) })
    }

    fn event_synchronize(&self, e: Event) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuEventSynchronize", unsafe {
            self.cu.cuEventSynchronize(event(e))
        })
    }

    fn event_elapsed_ms(&self, start: Event, end: Event) -> DriverResult<f32> {
        self.bind()?;
        let mut ms = 0f32;
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuEventElapsedTime_v2", unsafe {
            self.cu
                .cuEventElapsedTime_v2(&mut ms, event(start), event(end))
        })?;
        Ok(ms)
    }

    fn mem_get_info(&self) -> DriverResult<(u64, u64)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals.
        check("cuMemGetInfo_v2", unsafe {
            self.cu.cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn mem_alloc(&self, bytes: u64) -> DriverResult<DevicePtr> {
        let n = size("cuMemAlloc_v2", bytes)?;
        self.bind()?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local.
        check("cuMemAlloc_v2", unsafe { self.cu.cuMemAlloc_v2(&mut p, n) })?;
        Ok(DevicePtr(p))
    }

    fn mem_alloc_managed(&self, bytes: u64) -> DriverResult<DevicePtr> {
        let n = size("cuMemAllocManaged", bytes)?;
        self.bind()?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local.
        check("cuMemAllocManaged", unsafe {
            self.cu
                .cuMemAllocManaged(&mut p, n, cu::CU_MEM_ATTACH_GLOBAL)
        })?;
        Ok(DevicePtr(p))
    }

    fn mem_free(&self, p: DevicePtr) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: the driver validates the address; the status is checked.
        check("cuMemFree_v2", unsafe { self.cu.cuMemFree_v2(p.0) })
    }

    fn mem_alloc_host(&self, bytes: u64) -> DriverResult<HostPtr> {
        let n = size("cuMemAllocHost_v2", bytes)?;
        self.bind()?;
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("cuMemAllocHost_v2", unsafe {
            self.cu.cuMemAllocHost_v2(&mut p, n)
        })?;
        self.host_insert(p, n);
        Ok(HostPtr(p as u64))
    }

    fn mem_free_host(&self, p: HostPtr) -> DriverResult<()> {
        self.bind()?;
        // The map stays locked across the free so that no host_read/host_write can be copying
        // from this allocation while it goes away.
        let mut map = self.host_map();
        self.refuse_lent(&map, "cuMemFreeHost", p)?;
        // SAFETY: the driver validates the address; the status is checked.
        check("cuMemFreeHost", unsafe {
            self.cu.cuMemFreeHost(p.0 as *mut c_void)
        })?;
        map.remove(&p.0);
        Ok(())
    }

    fn host_read(&self, src: HostPtr, dst: &mut [u8]) -> DriverResult<()> {
        let map = self.host_map();
        let from = Self::host_range(&map, "host_read", src, dst.len())?;
        self.refuse_lent(&map, "host_read", src)?;
        // SAFETY: `from..from+len` lies inside a live page-locked allocation (checked above; the
        // lock keeps it from being freed meanwhile), and `dst` is a distinct Rust buffer.
        unsafe { ptr::copy_nonoverlapping(from, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn host_write(&self, dst: HostPtr, src: &[u8]) -> DriverResult<()> {
        let map = self.host_map();
        let to = Self::host_range(&map, "host_write", dst, src.len())?;
        self.refuse_lent(&map, "host_write", dst)?;
        // SAFETY: as in host_read, with the roles swapped.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), to, src.len()) };
        Ok(())
    }

    fn host_lend_f32(
        &self,
        ptr: HostPtr,
        words: usize,
        f: &mut dyn FnMut(&mut [f32]),
    ) -> DriverResult<()> {
        self.lend_f32(ptr, words, f)
    }

    fn mem_alloc_async(&self, bytes: u64, s: Stream) -> DriverResult<DevicePtr> {
        let n = size("cuMemAllocAsync", bytes)?;
        self.bind()?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuMemAllocAsync", unsafe {
            self.cu.cuMemAllocAsync(&mut p, n, stream(s))
        })?;
        Ok(DevicePtr(p))
    }

    fn mem_free_async(&self, p: DevicePtr, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuMemFreeAsync", unsafe {
            self.cu.cuMemFreeAsync(p.0, stream(s))
        })
    }

    fn mem_pool_create(&self, props: PoolProps) -> DriverResult<MemPool> {
        let max_size = size("cuMemPoolCreate", props.max_size)?;
        let id = i32::try_from(props.ordinal).map_err(|_| DriverError::InvalidArgument {
            call: "cuMemPoolCreate",
            reason: format!("device ordinal {} out of range", props.ordinal),
        })?;
        self.bind()?;
        let desc = cu::CUmemPoolProps {
            allocType: cu::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: cu::CU_MEM_HANDLE_TYPE_NONE,
            location: cu::CUmemLocation {
                type_: cu::CU_MEM_LOCATION_TYPE_DEVICE,
                id,
            },
            maxSize: max_size,
            ..Default::default()
        };
        let mut pool: cu::CUmemoryPool = ptr::null_mut();
        // SAFETY: out-pointer to a local; `desc` is a fully initialised props struct (reserved
        // bytes zero, as the API requires).
        check("cuMemPoolCreate", unsafe {
            self.cu.cuMemPoolCreate(&mut pool, &desc)
        })?;
        Ok(MemPool(pool as u64))
    }

    fn mem_pool_destroy(&self, pool: MemPool) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuMemPoolDestroy", unsafe {
            self.cu.cuMemPoolDestroy(pool.0 as cu::CUmemoryPool)
        })
    }

    fn mem_pool_set_release_threshold(&self, pool: MemPool, bytes: u64) -> DriverResult<()> {
        self.bind()?;
        // The attribute is a cuuint64_t read through the pointer.
        let mut value: u64 = bytes;
        // SAFETY: `value` is a live u64, the type this attribute takes.
        check("cuMemPoolSetAttribute", unsafe {
            self.cu.cuMemPoolSetAttribute(
                pool.0 as cu::CUmemoryPool,
                cu::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                ptr::from_mut(&mut value).cast(),
            )
        })
    }

    fn mem_pool_reserved(&self, pool: MemPool) -> DriverResult<u64> {
        self.bind()?;
        let mut value: u64 = 0;
        // SAFETY: `value` is a live u64, the type this attribute writes.
        check("cuMemPoolGetAttribute", unsafe {
            self.cu.cuMemPoolGetAttribute(
                pool.0 as cu::CUmemoryPool,
                cu::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                ptr::from_mut(&mut value).cast(),
            )
        })?;
        Ok(value)
    }

    fn mem_pool_trim_to(&self, pool: MemPool, keep_bytes: u64) -> DriverResult<()> {
        let keep = size("cuMemPoolTrimTo", keep_bytes)?;
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuMemPoolTrimTo", unsafe {
            self.cu.cuMemPoolTrimTo(pool.0 as cu::CUmemoryPool, keep)
        })
    }

    fn mem_alloc_from_pool_async(
        &self,
        bytes: u64,
        pool: MemPool,
        s: Stream,
    ) -> DriverResult<DevicePtr> {
        let n = size("cuMemAllocFromPoolAsync", bytes)?;
        self.bind()?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuMemAllocFromPoolAsync", unsafe {
            self.cu
                .cuMemAllocFromPoolAsync(&mut p, n, pool.0 as cu::CUmemoryPool, stream(s))
        })?;
        Ok(DevicePtr(p))
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: `src` is a live slice of exactly the length passed; the copy completes before
        // the call returns (synchronous copy).
        check("cuMemcpyHtoD_v2", unsafe {
            self.cu
                .cuMemcpyHtoD_v2(dst.0, src.as_ptr().cast(), src.len())
        })
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: `dst` is a live, exclusively borrowed slice of the length passed; synchronous.
        check("cuMemcpyDtoH_v2", unsafe {
            self.cu
                .cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src.0, dst.len())
        })
    }

    fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> DriverResult<()> {
        let n = size("cuMemcpyDtoD_v2", bytes)?;
        self.bind()?;
        // SAFETY: device addresses only; the driver validates them.
        check("cuMemcpyDtoD_v2", unsafe {
            self.cu.cuMemcpyDtoD_v2(dst.0, src.0, n)
        })
    }

    fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DriverResult<()> {
        let n = size("cuMemsetD8_v2", bytes)?;
        self.bind()?;
        // SAFETY: device address only; the driver validates it.
        check("cuMemsetD8_v2", unsafe {
            self.cu.cuMemsetD8_v2(dst.0, value, n)
        })
    }

    fn memset_d32(&self, dst: DevicePtr, value: u32, count: u64) -> DriverResult<()> {
        let n = size("cuMemsetD32_v2", count)?;
        self.bind()?;
        // SAFETY: device address only; the driver validates it.
        check("cuMemsetD32_v2", unsafe {
            self.cu.cuMemsetD32_v2(dst.0, value, n)
        })
    }

    fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        let n = size("cuMemcpyDtoDAsync_v2", bytes)?;
        self.bind()?;
        // SAFETY: device addresses only; see the module comment on handles.
        check("cuMemcpyDtoDAsync_v2", unsafe {
            self.cu.cuMemcpyDtoDAsync_v2(dst.0, src.0, n, stream(s))
        })
    }

    fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        let n = size("cuMemsetD8Async", bytes)?;
        self.bind()?;
        // SAFETY: device address only; see the module comment on handles.
        check("cuMemsetD8Async", unsafe {
            self.cu.cuMemsetD8Async(dst.0, value, n, stream(s))
        })
    }

    fn memset_d32_async(
        &self,
        dst: DevicePtr,
        value: u32,
        count: u64,
        s: Stream,
    ) -> DriverResult<()> {
        let n = size("cuMemsetD32Async", count)?;
        self.bind()?;
        // SAFETY: device address only; see the module comment on handles.
        check("cuMemsetD32Async", unsafe {
            self.cu.cuMemsetD32Async(dst.0, value, n, stream(s))
        })
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: HostPtr,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        let n = size("cuMemcpyHtoDAsync_v2", bytes)?;
        let from = {
            let map = self.host_map();
            self.refuse_lent(&map, "cuMemcpyHtoDAsync_v2", src)?;
            Self::host_range(&map, "cuMemcpyHtoDAsync_v2", src, n)?
        };
        self.bind()?;
        // SAFETY: `src..src+n` is inside a live page-locked allocation (checked); the caller
        // keeps it alive and unmodified until the copy has run (this function's contract).
        check("cuMemcpyHtoDAsync_v2", unsafe {
            self.cu
                .cuMemcpyHtoDAsync_v2(dst.0, from.cast_const().cast(), n, stream(s))
        })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: HostPtr,
        src: DevicePtr,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        let n = size("cuMemcpyDtoHAsync_v2", bytes)?;
        let to = {
            let map = self.host_map();
            self.refuse_lent(&map, "cuMemcpyDtoHAsync_v2", dst)?;
            Self::host_range(&map, "cuMemcpyDtoHAsync_v2", dst, n)?
        };
        self.bind()?;
        // SAFETY: `dst..dst+n` is inside a live page-locked allocation (checked); the caller
        // neither reads nor frees it until the copy has run (this function's contract).
        check("cuMemcpyDtoHAsync_v2", unsafe {
            self.cu.cuMemcpyDtoHAsync_v2(to.cast(), src.0, n, stream(s))
        })
    }

    unsafe fn memcpy_htod_async_pageable(
        &self,
        dst: DevicePtr,
        src: &[u8],
        s: Stream,
    ) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: `src` is live for the call, which stages pageable memory before returning; a
        // captured node re-reads it, which the caller guarantees to keep alive (the contract).
        check("cuMemcpyHtoDAsync_v2", unsafe {
            self.cu
                .cuMemcpyHtoDAsync_v2(dst.0, src.as_ptr().cast(), src.len(), stream(s))
        })
    }

    fn module_load_ptx(&self, ptx: &str) -> DriverResult<Module> {
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

    fn module_unload(&self, module: Module) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuModuleUnload", unsafe {
            self.cu.cuModuleUnload(module.0 as cu::CUmodule)
        })
    }

    fn module_get_function(&self, module: Module, name: &str) -> DriverResult<Function> {
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

    unsafe fn launch_kernel(
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

    fn stream_begin_capture(&self, s: Stream, mode: CaptureMode) -> DriverResult<()> {
        self.bind()?;
        let mode = match mode {
            CaptureMode::Global => cu::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => cu::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => cu::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // SAFETY: see the module comment on handles.
        check("cuStreamBeginCapture_v2", unsafe {
            self.cu.cuStreamBeginCapture_v2(stream(s), mode)
        })
    }

    fn stream_end_capture(&self, s: Stream) -> DriverResult<Graph> {
        self.bind()?;
        let mut g: cu::CUgraph = ptr::null_mut();
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuStreamEndCapture", unsafe {
            self.cu.cuStreamEndCapture(stream(s), &mut g)
        })?;
        Ok(Graph(g as u64))
    }

    fn stream_is_capturing(&self, s: Stream) -> DriverResult<CaptureStatus> {
        self.bind()?;
        let mut status: cu::CUstreamCaptureStatus = cu::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuStreamIsCapturing", unsafe {
            self.cu.cuStreamIsCapturing(stream(s), &mut status)
        })?;
        match status {
            cu::CU_STREAM_CAPTURE_STATUS_NONE => Ok(CaptureStatus::None),
            cu::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(CaptureStatus::Active),
            cu::CU_STREAM_CAPTURE_STATUS_INVALIDATED => Ok(CaptureStatus::Invalidated),
            other => Err(DriverError::InvalidArgument {
                call: "cuStreamIsCapturing",
                reason: format!("the driver answered capture status {other}, unknown in CUDA 13.0"),
            }),
        }
    }

    fn graph_node_count(&self, graph: Graph) -> DriverResult<usize> {
        self.bind()?;
        let mut n = 0usize;
        // SAFETY: a null node array asks only for the count, written to a local.
        check("cuGraphGetNodes", unsafe {
            self.cu
                .cuGraphGetNodes(graph.0 as cu::CUgraph, ptr::null_mut(), &mut n)
        })?;
        Ok(n)
    }

    fn graph_destroy(&self, graph: Graph) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuGraphDestroy", unsafe {
            self.cu.cuGraphDestroy(graph.0 as cu::CUgraph)
        })
    }

    fn graph_instantiate(&self, graph: Graph, flags: InstantiateFlags) -> DriverResult<GraphExec> {
        self.bind()?;
        let bits = if flags.auto_free_on_launch {
            u64::from(cu::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        } else {
            0
        };
        let mut exec: cu::CUgraphExec = ptr::null_mut();
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuGraphInstantiateWithFlags", unsafe {
            self.cu
                .cuGraphInstantiateWithFlags(&mut exec, graph.0 as cu::CUgraph, bits)
        })?;
        Ok(GraphExec(exec as u64))
    }

    fn graph_launch(&self, exec: GraphExec, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuGraphLaunch", unsafe {
            self.cu.cuGraphLaunch(exec.0 as cu::CUgraphExec, stream(s))
        })
    }

    fn graph_exec_destroy(&self, exec: GraphExec) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuGraphExecDestroy", unsafe {
            self.cu.cuGraphExecDestroy(exec.0 as cu::CUgraphExec)
        })
    }

    fn blas_create(&self) -> DriverResult<BlasHandle> {
        super::blas::create(self)
    }

    fn blas_destroy(&self, handle: BlasHandle) -> DriverResult<()> {
        super::blas::destroy(self, handle)
    }

    fn blas_set_stream(&self, handle: BlasHandle, s: Stream) -> DriverResult<()> {
        super::blas::set_stream(self, handle, s)
    }

    fn blas_set_workspace(
        &self,
        handle: BlasHandle,
        workspace: DevicePtr,
        bytes: u64,
    ) -> DriverResult<()> {
        super::blas::set_workspace(self, handle, workspace, bytes)
    }

    fn blas_set_tf32(&self, handle: BlasHandle, tf32: bool) -> DriverResult<()> {
        super::blas::set_tf32(self, handle, tf32)
    }

    unsafe fn gemm_strided_batched_f32(
        &self,
        handle: BlasHandle,
        gemm: &GemmF32,
    ) -> DriverResult<()> {
        // SAFETY: forwarded contract: every operand lies in live device memory.
        unsafe { super::blas::sgemm_strided_batched(self, handle, gemm) }
    }
}
