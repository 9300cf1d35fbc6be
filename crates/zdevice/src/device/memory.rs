//! Device memory: allocations, copies, memsets, pinned host staging and stream-ordered pools.

use std::sync::Mutex;

use crate::driver::{CuCode, Driver};
use crate::error::{DeviceError, DeviceResult};
use crate::types::*;

use super::Device;

const NO_SYNC_ALLOC: &str = "synchronous allocation is illegal during capture; allocate from a capture reservation made before it";
const NO_SYNC_FREE: &str =
    "frees during capture invalidate it; free after the capture ends (or drop the graph first)";
const NO_IPC_EXPORT: &str = "IPC export is not in docs/capture-rules.md and is treated as cuMemAlloc, which capture refuses; export before the capture begins";
const NO_IPC_OPEN: &str = "mapping peer memory is not in docs/capture-rules.md and is treated as cuMemAlloc, which capture refuses; open handles before the capture begins";
const NO_IPC_CLOSE: &str = "unmapping peer memory is not in docs/capture-rules.md and is treated as cuMemFree, which invalidates a capture; close after the capture ends (or drop the graph first)";
const SILENT: &str = "the driver would run it now and leave it out of the graph; use the async form on the capturing stream";

/// Page-locked host memory for asynchronous transfers. Freed through [`Device::free_pinned`];
/// reads and writes wait for the transfer that last used it, so a pending copy never sees
/// half-written data.
#[derive(Debug)]
pub struct PinnedBuffer {
    ptr: HostPtr,
    len: u64,
    pending: Mutex<Option<Event>>,
}

impl PinnedBuffer {
    /// Size in bytes.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the buffer is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A stream-ordered pool with memory reserved up front and kept by its release threshold, so
/// allocations from it reuse memory instead of asking the operating system under pressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePool {
    /// The driver's pool handle.
    pub pool: MemPool,
    /// Bytes reserved at creation.
    pub reserved: u64,
}

impl<D: Driver> Device<D> {
    /// Refuses, without a driver call, a request of `requested` bytes that can never fit on this
    /// device (`TooLarge`, the error an allocation of that size gets from the driver), so that
    /// a layer above (the arena) can check before it calls the driver. `call` names the caller.
    pub fn check_fits(&self, call: &'static str, requested: u64) -> DeviceResult<()> {
        let total = self.inner.info.total_memory;
        if requested > total {
            return Err(DeviceError::TooLarge {
                call,
                requested,
                total,
            });
        }
        Ok(())
    }

    /// Maps an allocation failure to `OutOfMemory` or `TooLarge` with the device's numbers.
    fn alloc_error(&self, call: &'static str, requested: u64, e: DeviceError) -> DeviceError {
        match e {
            DeviceError::Driver { code, .. } if code == CuCode::OUT_OF_MEMORY => {
                let (free, total) = self
                    .inner
                    .driver
                    .mem_get_info()
                    .unwrap_or((0, self.inner.info.total_memory));
                if requested > total {
                    DeviceError::TooLarge {
                        call,
                        requested,
                        total,
                    }
                } else {
                    DeviceError::OutOfMemory {
                        call,
                        requested,
                        free,
                        total,
                    }
                }
            }
            other => other,
        }
    }

    /// (free, total) device bytes.
    pub fn mem_info(&self) -> DeviceResult<(u64, u64)> {
        self.call(|d| d.mem_get_info())
    }

    /// Allocates `bytes` of device memory (`cuMemAlloc`). Refused during capture.
    pub fn alloc(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        let call = "cuMemAlloc_v2";
        self.refuse_during_capture(call, NO_SYNC_ALLOC)?;
        if bytes == 0 {
            return Err(DeviceError::InvalidArgument {
                call,
                reason: "zero-byte allocation".into(),
            });
        }
        let deadline = self.inner.config.alloc_deadline;
        self.call_watched(call, deadline, move |d| d.mem_alloc(bytes))
            .map_err(|e| self.alloc_error(call, bytes, e))
    }

    /// Frees memory from [`Device::alloc`]. Refused during capture.
    pub fn free(&self, ptr: DevicePtr) -> DeviceResult<()> {
        self.refuse_during_capture("cuMemFree_v2", NO_SYNC_FREE)?;
        self.call(|d| d.mem_free(ptr))
    }

    // --- interprocess memory (legacy CUDA IPC) ----------------------------------------------

    /// Exports an allocation from [`Device::alloc`] as a handle another process on this host
    /// can open with [`Device::ipc_open`] (`cuIpcGetMemHandle`). An address inside the
    /// allocation exports all of it (the importer gets the base). The allocation stays this
    /// process's: free it only after every importer has closed it. Bounded by the allocation
    /// deadline, as `alloc` is. Refused during capture.
    pub fn ipc_export(&self, ptr: DevicePtr) -> DeviceResult<IpcMemHandle> {
        let call = "cuIpcGetMemHandle";
        self.refuse_during_capture(call, NO_IPC_EXPORT)?;
        let deadline = self.inner.config.alloc_deadline;
        self.call_watched(call, deadline, move |d| d.ipc_get_mem_handle(ptr))
    }

    /// Maps the allocation a peer process exported with [`Device::ipc_export`] into this
    /// device's context (`cuIpcOpenMemHandle_v2` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`).
    /// The address is valid in this process until [`Device::ipc_close`]; opening the same
    /// handle again gives the same address and needs one more close. CUDA refuses a handle
    /// this process exported itself (`CUDA_ERROR_INVALID_CONTEXT`); the simulated driver
    /// refuses every handle (`CUDA_ERROR_NOT_SUPPORTED`: it has no peer process). Bounded by
    /// the allocation deadline, as `alloc` is. Refused during capture.
    pub fn ipc_open(&self, handle: &IpcMemHandle) -> DeviceResult<DevicePtr> {
        let call = "cuIpcOpenMemHandle_v2";
        self.refuse_during_capture(call, NO_IPC_OPEN)?;
        let deadline = self.inner.config.alloc_deadline;
        let handle = *handle;
        self.call_watched(call, deadline, move |d| d.ipc_open_mem_handle(&handle))
    }

    /// Closes one open of an address from [`Device::ipc_open`] (`cuIpcCloseMemHandle`); the
    /// mapping goes with the last one. Refused during capture.
    pub fn ipc_close(&self, ptr: DevicePtr) -> DeviceResult<()> {
        self.refuse_during_capture("cuIpcCloseMemHandle", NO_IPC_CLOSE)?;
        self.call(|d| d.ipc_close_mem_handle(ptr))
    }

    /// Synchronous host-to-device copy. Refused during capture (a silent row).
    pub fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> DeviceResult<()> {
        self.refuse_during_capture("cuMemcpyHtoD_v2", SILENT)?;
        self.call(|d| d.memcpy_htod(dst, src))
    }

    /// Synchronous device-to-host copy. Refused during capture (a silent row). Ordered only
    /// after work the caller has synchronised: call [`Device::synchronize`] first.
    pub fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DeviceResult<()> {
        self.refuse_during_capture("cuMemcpyDtoH_v2", SILENT)?;
        self.call(|d| d.memcpy_dtoh(dst, src))
    }

    /// Synchronous device-to-device copy. Refused during capture (a silent row).
    pub fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> DeviceResult<()> {
        self.refuse_during_capture("cuMemcpyDtoD_v2", SILENT)?;
        self.call(|d| d.memcpy_dtod(dst, src, bytes))
    }

    /// Synchronous byte memset. Refused during capture (a silent row).
    pub fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DeviceResult<()> {
        self.refuse_during_capture("cuMemsetD8_v2", SILENT)?;
        self.call(|d| d.memset_d8(dst, value, bytes))
    }

    /// Synchronous 32-bit memset of `count` words. Refused during capture (a silent row).
    pub fn memset_d32(&self, dst: DevicePtr, value: u32, count: u64) -> DeviceResult<()> {
        self.refuse_during_capture("cuMemsetD32_v2", SILENT)?;
        self.call(|d| d.memset_d32(dst, value, count))
    }

    /// Asynchronous device-to-device copy on `stream` (capturable).
    pub fn copy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> DeviceResult<()> {
        self.call_queued("cuMemcpyDtoDAsync_v2", |d| {
            d.memcpy_dtod_async(dst, src, bytes, stream)
        })
    }

    /// Asynchronous byte memset on `stream` (capturable).
    pub fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: u64,
        stream: Stream,
    ) -> DeviceResult<()> {
        self.call_queued("cuMemsetD8Async", |d| {
            d.memset_d8_async(dst, value, bytes, stream)
        })
    }

    /// Asynchronous 32-bit memset on `stream` (capturable).
    pub fn memset_d32_async(
        &self,
        dst: DevicePtr,
        value: u32,
        count: u64,
        stream: Stream,
    ) -> DeviceResult<()> {
        self.call_queued("cuMemsetD32Async", |d| {
            d.memset_d32_async(dst, value, count, stream)
        })
    }

    // --- pinned staging -----------------------------------------------------------------------

    /// Allocates page-locked host memory for asynchronous transfers. Refused during capture.
    pub fn alloc_pinned(&self, bytes: u64) -> DeviceResult<PinnedBuffer> {
        let call = "cuMemAllocHost_v2";
        self.refuse_during_capture(call, NO_SYNC_ALLOC)?;
        let deadline = self.inner.config.alloc_deadline;
        let ptr = self.call_watched(call, deadline, move |d| d.mem_alloc_host(bytes))?;
        Ok(PinnedBuffer {
            ptr,
            len: bytes,
            pending: Mutex::new(None),
        })
    }

    /// Waits for the transfer that last used `buf`, if any.
    fn settle(&self, buf: &PinnedBuffer) -> DeviceResult<()> {
        let mut pending = buf
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(event) = *pending {
            self.wait_event(event)?;
            self.call(|d| d.event_destroy(event))?;
            *pending = None;
        }
        Ok(())
    }

    /// Whether the transfer that last used `buf` has finished (true when there was none),
    /// without waiting: a read-back queued with [`Device::download_async`] can be polled.
    pub fn pinned_settled(&self, buf: &PinnedBuffer) -> DeviceResult<bool> {
        let pending = *buf
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pending.map_or(Ok(true), |event| self.event_done(event))
    }

    fn check_range(call: &'static str, buf: &PinnedBuffer, bytes: u64) -> DeviceResult<()> {
        if bytes > buf.len {
            return Err(DeviceError::InvalidArgument {
                call,
                reason: format!("{bytes} bytes do not fit a pinned buffer of {}", buf.len),
            });
        }
        Ok(())
    }

    /// Writes `src` at the start of `buf` (after any pending transfer has finished).
    pub fn write_pinned(&self, buf: &PinnedBuffer, src: &[u8]) -> DeviceResult<()> {
        Self::check_range("write_pinned", buf, src.len() as u64)?;
        self.settle(buf)?;
        self.call(|d| d.host_write(buf.ptr, src))
    }

    /// Reads the start of `buf` into `dst` (after any pending transfer has finished).
    pub fn read_pinned(&self, buf: &PinnedBuffer, dst: &mut [u8]) -> DeviceResult<()> {
        Self::check_range("read_pinned", buf, dst.len() as u64)?;
        self.settle(buf)?;
        self.call(|d| d.host_read(buf.ptr, dst))
    }

    /// Lends the whole of `buf` to `f` as `len / 4` f32, after the transfer that last used it
    /// has finished, so the caller writes a batch in place (no staging copy) and then uploads
    /// it with [`Device::upload_async`]. `&mut` keeps every other use of the buffer out while
    /// `f` runs. Returns what `f` returns.
    ///
    /// During a capture (measured on an H100, the simulator alike: conformance
    /// `pinned_lend_during_capture`): a buffer whose last transfer has finished is lent and
    /// the capture goes on without a node; one whose upload is still queued is refused with
    /// `CaptureIllegal` before `f` runs (waiting on its event would invalidate the capture).
    pub fn pinned_f32_mut<R>(
        &self,
        buf: &mut PinnedBuffer,
        f: impl FnOnce(&mut [f32]) -> R,
    ) -> DeviceResult<R> {
        self.settle(buf)?;
        let words = usize::try_from(buf.len / 4).map_err(|_| DeviceError::InvalidArgument {
            call: "host_lend_f32",
            reason: format!("{} bytes do not fit in usize", buf.len),
        })?;
        let (mut f, mut out) = (Some(f), None);
        self.call(|d| {
            d.host_lend_f32(buf.ptr, words, &mut |view| {
                if let Some(f) = f.take() {
                    out = Some(f(view));
                }
            })
        })?;
        out.ok_or_else(|| DeviceError::InvalidArgument {
            call: "host_lend_f32",
            reason: "the driver did not lend the buffer".into(),
        })
    }

    /// Queues a copy of the first `bytes` of `src` to `dst` on `stream`. Refused during capture:
    /// a captured host copy would read the buffer again at every replay.
    pub fn upload_async(
        &self,
        dst: DevicePtr,
        src: &PinnedBuffer,
        bytes: u64,
        stream: Stream,
    ) -> DeviceResult<()> {
        self.upload_range_async(dst, src, 0, bytes, stream)
    }

    /// Queues a copy of `bytes` of `src` from byte `offset` on to `dst` on `stream` (a shard
    /// of a batch held in one pinned buffer). Refused during capture, as `upload_async`.
    pub fn upload_range_async(
        &self,
        dst: DevicePtr,
        src: &PinnedBuffer,
        offset: u64,
        bytes: u64,
        stream: Stream,
    ) -> DeviceResult<()> {
        let call = "cuMemcpyHtoDAsync_v2";
        self.refuse_during_capture(call, "upload inputs before capture or before replay")?;
        let end = offset
            .checked_add(bytes)
            .ok_or_else(|| DeviceError::InvalidArgument {
                call,
                reason: format!("{bytes} bytes from offset {offset} overflow"),
            })?;
        Self::check_range(call, src, end)?;
        self.settle(src)?;
        let from = HostPtr(src.ptr.0 + offset);
        // SAFETY: `from..from+bytes` lies inside `src`, live pinned memory (checked above); it
        // cannot be written, read or freed through this API until the event recorded below has
        // completed (`settle`), so it stays valid and unmodified while the copy runs.
        self.call(|d| unsafe { d.memcpy_htod_async(dst, from, bytes, stream) })?;
        self.mark_pending(src, stream)
    }

    /// Queues a copy of `bytes` from `src` into the start of `dst` on `stream`; read the result
    /// with [`Device::read_pinned`], which waits for it.
    pub fn download_async(
        &self,
        dst: &PinnedBuffer,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> DeviceResult<()> {
        let call = "cuMemcpyDtoHAsync_v2";
        self.refuse_during_capture(call, "download results after the capture ends")?;
        Self::check_range(call, dst, bytes)?;
        self.settle(dst)?;
        // SAFETY: as in `upload_async`: `dst` is live pinned memory of at least `bytes` bytes,
        // untouched through this API until the recorded event completes.
        self.call(|d| unsafe { d.memcpy_dtoh_async(dst.ptr, src, bytes, stream) })?;
        self.mark_pending(dst, stream)
    }

    fn mark_pending(&self, buf: &PinnedBuffer, stream: Stream) -> DeviceResult<()> {
        // Without an event to wait on, the buffer must not be touched until the queued copy
        // ran: wait for the stream (bounded) before reporting the failure, and destroy an
        // event that could not be recorded (the fault matrix found it leaked).
        let event = self.call(|d| d.event_create(false)).inspect_err(|_| {
            let _ = self.synchronize(stream);
        })?;
        if let Err(e) = self.call(|d| d.event_record(event, stream)) {
            let _ = self.synchronize(stream);
            let _ = self.call(|d| d.event_destroy(event));
            return Err(e);
        }
        *buf.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(event);
        Ok(())
    }

    /// Frees a pinned buffer once its last transfer has finished. Refused during capture.
    pub fn free_pinned(&self, buf: PinnedBuffer) -> DeviceResult<()> {
        self.refuse_during_capture("cuMemFreeHost", NO_SYNC_FREE)?;
        self.settle(&buf)?;
        self.call(|d| d.mem_free_host(buf.ptr))
    }

    // --- device-mapped host flags (issue 44) -------------------------------------------------

    /// Where kernels read `buf` (`cuMemHostGetDevicePointer_v2`; with unified addressing, the
    /// host address): a flag the host sets there with [`Device::store_pinned_u32`] reaches a
    /// kernel polling it without any stream. Answered during a capture as outside one (the
    /// call submits nothing); a device marked lost still answers, as it does not touch the
    /// device's work.
    pub fn pinned_device_ptr(&self, buf: &PinnedBuffer) -> DeviceResult<DevicePtr> {
        let r = self.inner.driver.host_device_ptr(buf.ptr);
        self.checked(r)
    }

    /// Stores `value` as the u32 at byte `offset` of `buf` (4-byte aligned), one atomic store
    /// with release ordering: no stream, no wait for a pending transfer of `buf`, no capture
    /// rule, and it works after the device was marked lost. How the host tells a kernel that
    /// polls the word (through [`Device::pinned_device_ptr`]) to stop waiting, whatever the
    /// streams hold.
    pub fn store_pinned_u32(
        &self,
        buf: &PinnedBuffer,
        offset: u64,
        value: u32,
    ) -> DeviceResult<()> {
        Self::check_range("store_pinned_u32", buf, offset.saturating_add(4))?;
        let r = self
            .inner
            .driver
            .host_store_u32(HostPtr(buf.ptr.0 + offset), value);
        self.checked(r)
    }

    // --- stream-ordered memory ----------------------------------------------------------------

    /// Creates a stream-ordered pool and reserves `reserve` bytes in it up front (allocated and
    /// returned to the pool, which keeps them because its release threshold is at least
    /// `reserve`). Refused during capture.
    pub fn create_pool(&self, reserve: u64, release_threshold: u64) -> DeviceResult<DevicePool> {
        let call = "cuMemPoolCreate";
        self.refuse_during_capture(call, "create pools before capture")?;
        let props = PoolProps {
            ordinal: self.inner.info.ordinal,
            max_size: 0,
        };
        let pool = self.call(|d| d.mem_pool_create(props))?;
        let threshold = release_threshold.max(reserve);
        // Any failure after the pool exists destroys it again, or every failed attempt would
        // leave a pool behind (the fault matrix found this for each step below).
        let stream = self.inner.stream;
        let filled = (|| {
            self.call(|d| d.mem_pool_set_release_threshold(pool, threshold))?;
            if reserve > 0 {
                let ptr = self.alloc_from_pool(pool, reserve, stream)?;
                if let Err(e) = self.call(|d| d.mem_free_async(ptr, stream)) {
                    // Once more, so the reservation does not stay outstanding in the pool
                    // destroyed below (a pool is released only once its blocks are).
                    let _ = self.call(|d| d.mem_free_async(ptr, stream));
                    return Err(e);
                }
                self.synchronize(stream)?;
            }
            self.call(|d| d.mem_pool_reserved(pool))
        })();
        let reserved = match filled {
            Ok(reserved) => reserved,
            Err(e) => {
                // A pool destroyed with an allocation outstanding is released by the driver
                // once that allocation is gone (cuMemPoolDestroy's contract).
                if let Err(d) = self.inner.driver.mem_pool_destroy(pool) {
                    tracing::warn!(target: "zdevice.device.pool", error = %d, "destroying a pool that failed to fill failed too");
                }
                return Err(e);
            }
        };
        tracing::info!(target: "zdevice.device.pool", reserve, reserved, threshold, "pool created");
        Ok(DevicePool { pool, reserved })
    }

    /// Allocates from `pool` in `stream` order, bounded by the allocation deadline (`Timeout`
    /// then `DeviceLost` if the driver does not answer). Refused during capture.
    pub fn alloc_from_pool(
        &self,
        pool: MemPool,
        bytes: u64,
        stream: Stream,
    ) -> DeviceResult<DevicePtr> {
        let call = "cuMemAllocFromPoolAsync";
        self.refuse_during_capture(call, NO_SYNC_ALLOC)?;
        let deadline = self.inner.config.alloc_deadline;
        self.call_watched(call, deadline, move |d| {
            d.mem_alloc_from_pool_async(bytes, pool, stream)
        })
        .map_err(|e| self.alloc_error(call, bytes, e))
    }

    /// Returns pool memory in `stream` order. Refused during capture.
    pub fn free_async(&self, ptr: DevicePtr, stream: Stream) -> DeviceResult<()> {
        self.refuse_during_capture("cuMemFreeAsync", NO_SYNC_FREE)?;
        self.call(|d| d.mem_free_async(ptr, stream))
    }

    /// Bytes the pool holds from the device right now.
    pub fn pool_reserved(&self, pool: MemPool) -> DeviceResult<u64> {
        self.call(|d| d.mem_pool_reserved(pool))
    }

    /// Destroys a pool (its memory must have been freed).
    pub fn destroy_pool(&self, pool: DevicePool) -> DeviceResult<()> {
        self.refuse_during_capture("cuMemPoolDestroy", NO_SYNC_FREE)?;
        self.call(|d| d.mem_pool_destroy(pool.pool))
    }

    /// Allocates on the device's default pool in `stream` order (`cuMemAllocAsync`); used for
    /// benchmarks and comparisons. Refused during capture (it would put a memory node in the
    /// graph, which launches only once).
    pub fn alloc_async(&self, bytes: u64, stream: Stream) -> DeviceResult<DevicePtr> {
        let call = "cuMemAllocAsync";
        self.refuse_during_capture(call, NO_SYNC_ALLOC)?;
        let deadline = self.inner.config.alloc_deadline;
        self.call_watched(call, deadline, move |d| d.mem_alloc_async(bytes, stream))
            .map_err(|e| self.alloc_error(call, bytes, e))
    }
}
