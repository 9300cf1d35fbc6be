//! The interprocess memory calls of `CudaDriver` (legacy CUDA IPC): export an allocation as a
//! 64-byte handle, open a peer process's handle, close it again.
//!
//! Every `unsafe` block below calls one libcuda entry point resolved by cuda-sys with the
//! signature of the pinned 13.0 header. Out-pointers are always live locals; the handle is
//! passed by value (64 plain bytes, which the driver validates); addresses are the driver's to
//! reject, and every status is checked.

use std::os::raw::c_char;

use cuda_sys::driver as cu;

use super::{CudaDriver, check};
use crate::driver::DriverResult;
use crate::types::{DevicePtr, IPC_HANDLE_BYTES, IpcMemHandle};

// The handle is exactly the bytes of `CUipcMemHandle`, nothing more or less.
const _: () = assert!(std::mem::size_of::<cu::CUipcMemHandle>() == IPC_HANDLE_BYTES);

/// Byte for byte, `u8` to `c_char`.
fn to_raw(handle: &IpcMemHandle) -> cu::CUipcMemHandle {
    cu::CUipcMemHandle {
        reserved: handle.0.map(|b| b as c_char),
    }
}

/// Byte for byte, `c_char` to `u8`.
fn from_raw(raw: &cu::CUipcMemHandle) -> IpcMemHandle {
    IpcMemHandle(raw.reserved.map(|b| b as u8))
}

impl CudaDriver {
    pub(super) fn cu_ipc_get_mem_handle(&self, p: DevicePtr) -> DriverResult<IpcMemHandle> {
        self.bind()?;
        let mut raw = cu::CUipcMemHandle::default();
        // SAFETY: out-pointer to a local of the handle type; the driver validates the address
        // (a pointer that is not the base of a live cuMemAlloc allocation is an error status).
        check("cuIpcGetMemHandle", unsafe {
            self.cu.cuIpcGetMemHandle(&mut raw, p.0)
        })?;
        Ok(from_raw(&raw))
    }

    pub(super) fn cu_ipc_open_mem_handle(&self, handle: &IpcMemHandle) -> DriverResult<DevicePtr> {
        self.bind()?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; the handle is passed by value and validated by the
        // driver; the flag is the one value the header allows.
        check("cuIpcOpenMemHandle_v2", unsafe {
            self.cu.cuIpcOpenMemHandle_v2(
                &mut p,
                to_raw(handle),
                cu::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
            )
        })?;
        Ok(DevicePtr(p))
    }

    pub(super) fn cu_ipc_close_mem_handle(&self, p: DevicePtr) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: the driver validates the address (one not opened through IPC is an error
        // status); the status is checked.
        check("cuIpcCloseMemHandle", unsafe {
            self.cu.cuIpcCloseMemHandle(p.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_cross_the_boundary_byte_for_byte() {
        let mut bytes = [0u8; IPC_HANDLE_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(200);
        }
        let handle = IpcMemHandle(bytes);
        assert_eq!(from_raw(&to_raw(&handle)), handle);
        assert_eq!(to_raw(&handle).reserved[0] as u8, 200);
    }
}
