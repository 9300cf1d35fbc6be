//! The copy and memset calls of `CudaDriver`, synchronous and stream-ordered.
//!
//! Every `unsafe` block below calls one libcuda/cuBLAS entry point resolved by cuda-sys with the
//! signature of the pinned 13.0 header. Out-pointers are always live locals; handles are ones
//! this driver returned earlier (a stale or foreign handle is the driver's to reject, and its
//! status is checked); host buffers are Rust slices whose length is the count passed.

use super::streams::stream;
use super::{CudaDriver, check, size};
use crate::driver::DriverResult;
use crate::types::*;

impl CudaDriver {
    pub(super) fn cu_memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: `src` is a live slice of exactly the length passed; the copy completes before
        // the call returns (synchronous copy).
        check("cuMemcpyHtoD_v2", unsafe {
            self.cu
                .cuMemcpyHtoD_v2(dst.0, src.as_ptr().cast(), src.len())
        })
    }

    pub(super) fn cu_memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: `dst` is a live, exclusively borrowed slice of the length passed; synchronous.
        check("cuMemcpyDtoH_v2", unsafe {
            self.cu
                .cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src.0, dst.len())
        })
    }

    pub(super) fn cu_memcpy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    ) -> DriverResult<()> {
        let n = size("cuMemcpyDtoD_v2", bytes)?;
        self.bind()?;
        // SAFETY: device addresses only; the driver validates them.
        check("cuMemcpyDtoD_v2", unsafe {
            self.cu.cuMemcpyDtoD_v2(dst.0, src.0, n)
        })
    }

    pub(super) fn cu_memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DriverResult<()> {
        let n = size("cuMemsetD8_v2", bytes)?;
        self.bind()?;
        // SAFETY: device address only; the driver validates it.
        check("cuMemsetD8_v2", unsafe {
            self.cu.cuMemsetD8_v2(dst.0, value, n)
        })
    }

    pub(super) fn cu_memset_d32(&self, dst: DevicePtr, value: u32, count: u64) -> DriverResult<()> {
        let n = size("cuMemsetD32_v2", count)?;
        self.bind()?;
        // SAFETY: device address only; the driver validates it.
        check("cuMemsetD32_v2", unsafe {
            self.cu.cuMemsetD32_v2(dst.0, value, n)
        })
    }

    pub(super) fn cu_memcpy_dtod_async(
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

    pub(super) fn cu_memset_d8_async(
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

    pub(super) fn cu_memset_d32_async(
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

    pub(super) unsafe fn cu_memcpy_htod_async(
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

    pub(super) unsafe fn cu_memcpy_dtoh_async(
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

    pub(super) unsafe fn cu_memcpy_htod_async_pageable(
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
}
