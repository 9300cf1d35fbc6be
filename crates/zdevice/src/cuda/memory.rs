//! The memory calls of `CudaDriver`: device, managed and page-locked host allocations, the
//! stream-ordered ones and memory pools.
//!
//! Every `unsafe` block below calls one libcuda/cuBLAS entry point resolved by cuda-sys with the
//! signature of the pinned 13.0 header. Out-pointers are always live locals; handles are ones
//! this driver returned earlier (a stale or foreign handle is the driver's to reject, and its
//! status is checked); host buffers are Rust slices whose length is the count passed.

use std::ffi::c_void;
use std::ptr;

use cuda_sys::driver as cu;

use super::streams::stream;
use super::{CudaDriver, check, size};
use crate::driver::{DriverError, DriverResult};
use crate::types::*;

impl CudaDriver {
    pub(super) fn cu_mem_get_info(&self) -> DriverResult<(u64, u64)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals.
        check("cuMemGetInfo_v2", unsafe {
            self.cu.cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    pub(super) fn cu_mem_alloc(&self, bytes: u64) -> DriverResult<DevicePtr> {
        let n = size("cuMemAlloc_v2", bytes)?;
        self.bind()?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local.
        check("cuMemAlloc_v2", unsafe { self.cu.cuMemAlloc_v2(&mut p, n) })?;
        Ok(DevicePtr(p))
    }

    pub(super) fn cu_mem_alloc_managed(&self, bytes: u64) -> DriverResult<DevicePtr> {
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

    pub(super) fn cu_mem_free(&self, p: DevicePtr) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: the driver validates the address; the status is checked.
        check("cuMemFree_v2", unsafe { self.cu.cuMemFree_v2(p.0) })
    }

    pub(super) fn cu_mem_alloc_host(&self, bytes: u64) -> DriverResult<HostPtr> {
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

    pub(super) fn cu_mem_free_host(&self, p: HostPtr) -> DriverResult<()> {
        self.bind()?;
        // The entry leaves the map under its lock, so no host_read/host_write/host_store_u32
        // can be copying from this allocation while it goes away (they find it gone: a typed
        // error). The free itself runs outside the lock (issue 44): `cuMemFreeHost` may wait
        // for the device, and a give-up flag stored by another thread (`host_store_u32`,
        // which takes the lock) is what ends the kernel the device may be waiting for.
        let size = {
            let mut map = self.host_map();
            self.refuse_lent(&map, "cuMemFreeHost", p)?;
            map.remove(&p.0)
        };
        // SAFETY: the driver validates the address; the status is checked.
        let freed = check("cuMemFreeHost", unsafe {
            self.cu.cuMemFreeHost(p.0 as *mut c_void)
        });
        if freed.is_err()
            && let Some(size) = size
        {
            // Not freed: the allocation is still live, so it stays reachable.
            self.host_map().insert(p.0, size);
        }
        freed
    }

    pub(super) fn cu_host_read(&self, src: HostPtr, dst: &mut [u8]) -> DriverResult<()> {
        let map = self.host_map();
        let from = Self::host_range(&map, "host_read", src, dst.len())?;
        self.refuse_lent(&map, "host_read", src)?;
        // SAFETY: `from..from+len` lies inside a live page-locked allocation (checked above; the
        // lock keeps it from being freed meanwhile), and `dst` is a distinct Rust buffer.
        unsafe { ptr::copy_nonoverlapping(from, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    pub(super) fn cu_host_write(&self, dst: HostPtr, src: &[u8]) -> DriverResult<()> {
        let map = self.host_map();
        let to = Self::host_range(&map, "host_write", dst, src.len())?;
        self.refuse_lent(&map, "host_write", dst)?;
        // SAFETY: as in host_read, with the roles swapped.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), to, src.len()) };
        Ok(())
    }

    /// `Driver::host_device_ptr`. With unified addressing, `cuMemHostGetDevicePointer_v2`
    /// answers the host address for memory from `cuMemAllocHost` (CUDA's unified addressing
    /// section); the pinned cuda-sys bindings do not carry that call, so the answer is made
    /// from the device attribute and this driver's own record of its page-locked allocations.
    pub(super) fn cu_host_device_ptr(&self, p: HostPtr) -> DriverResult<DevicePtr> {
        const CALL: &str = "cuMemHostGetDevicePointer_v2";
        Self::host_range(&self.host_map(), CALL, p, 1)?;
        if !self.cu_unified_addressing()? {
            return Err(DriverError::Cuda {
                call: CALL,
                code: crate::driver::CuCode::NOT_SUPPORTED,
            });
        }
        Ok(DevicePtr(p.0))
    }

    /// `Driver::host_store_u32`.
    pub(super) fn cu_host_store_u32(&self, dst: HostPtr, value: u32) -> DriverResult<()> {
        const CALL: &str = "host_store_u32";
        if !dst.0.is_multiple_of(4) {
            return Err(DriverError::InvalidArgument {
                call: CALL,
                reason: format!("{:#x} is not 4-byte aligned", dst.0),
            });
        }
        let map = self.host_map();
        let to = Self::host_range(&map, CALL, dst, 4)?;
        self.refuse_lent(&map, CALL, dst)?;
        // SAFETY: `to..to+4` lies inside a live page-locked allocation (checked above; the lock
        // keeps it from being freed meanwhile), is 4-byte aligned and not lent out as a Rust
        // slice (both checked above). The memory is shared with kernels and other host threads only through atomic or
        // volatile accesses of the same word, so an atomic view of it is sound.
        let word = unsafe { std::sync::atomic::AtomicU32::from_ptr(to.cast::<u32>()) };
        word.store(value, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    pub(super) fn cu_mem_alloc_async(&self, bytes: u64, s: Stream) -> DriverResult<DevicePtr> {
        let n = size("cuMemAllocAsync", bytes)?;
        self.bind()?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuMemAllocAsync", unsafe {
            self.cu.cuMemAllocAsync(&mut p, n, stream(s))
        })?;
        Ok(DevicePtr(p))
    }

    pub(super) fn cu_mem_free_async(&self, p: DevicePtr, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuMemFreeAsync", unsafe {
            self.cu.cuMemFreeAsync(p.0, stream(s))
        })
    }

    pub(super) fn cu_mem_pool_create(&self, props: PoolProps) -> DriverResult<MemPool> {
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

    pub(super) fn cu_mem_pool_destroy(&self, pool: MemPool) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuMemPoolDestroy", unsafe {
            self.cu.cuMemPoolDestroy(pool.0 as cu::CUmemoryPool)
        })
    }

    pub(super) fn cu_mem_pool_set_release_threshold(
        &self,
        pool: MemPool,
        bytes: u64,
    ) -> DriverResult<()> {
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

    pub(super) fn cu_mem_pool_reserved(&self, pool: MemPool) -> DriverResult<u64> {
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

    pub(super) fn cu_mem_pool_trim_to(&self, pool: MemPool, keep_bytes: u64) -> DriverResult<()> {
        let keep = size("cuMemPoolTrimTo", keep_bytes)?;
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuMemPoolTrimTo", unsafe {
            self.cu.cuMemPoolTrimTo(pool.0 as cu::CUmemoryPool, keep)
        })
    }

    pub(super) fn cu_mem_alloc_from_pool_async(
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
}
