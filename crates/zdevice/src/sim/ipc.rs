//! Interprocess memory (legacy CUDA IPC). The simulator is one process with no peer to share
//! memory with: it exports handles for its own allocations (so a caller's exchange of handles
//! can be tested), and refuses to open any: its own process's as CUDA does
//! (`CUDA_ERROR_INVALID_CONTEXT`), any other as CUDA does on a system without IPC support.
//!
//! A handle's bytes: the magic `zsimipc1`, the process id (u32), four zero bytes, the
//! simulator's instance number (u64, unique in the process) and the allocation's base address
//! (u64, generation-stamped, so a reissued range gets a different handle, as CUDA's does), all
//! little-endian, then zeros.

use super::capture::Ask;
use super::memory::AllocKind;
use super::state::{Cx, State};
use crate::driver::{CuCode, DriverResult};
use crate::types::{DevicePtr, IPC_HANDLE_BYTES, IpcMemHandle};

/// The first bytes of every simulated handle.
const MAGIC: &[u8; 8] = b"zsimipc1";

/// What a simulated handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exported {
    pub process: u32,
    pub instance: u64,
    pub ptr: DevicePtr,
}

pub(crate) fn encode(e: Exported) -> IpcMemHandle {
    let mut b = [0u8; IPC_HANDLE_BYTES];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&e.process.to_le_bytes());
    b[16..24].copy_from_slice(&e.instance.to_le_bytes());
    b[24..32].copy_from_slice(&e.ptr.0.to_le_bytes());
    IpcMemHandle(b)
}

/// What a handle names, if a simulator made it.
pub(crate) fn decode(h: &IpcMemHandle) -> Option<Exported> {
    let b = &h.0;
    if &b[..8] != MAGIC || b[12..16] != [0; 4] || b[32..].iter().any(|&x| x != 0) {
        return None;
    }
    let word = |r: std::ops::Range<usize>| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[r]);
        u64::from_le_bytes(w)
    };
    let mut process = [0u8; 4];
    process.copy_from_slice(&b[8..12]);
    Some(Exported {
        process: u32::from_le_bytes(process),
        instance: word(16..24),
        ptr: DevicePtr(word(24..32)),
    })
}

impl State {
    /// A handle for the live `cuMemAlloc` allocation holding `ptr`: an address inside it names
    /// the whole allocation, as on the GPU (measured on an H200: CUDA exports an interior
    /// address, and its handle is the base's), so the handle encodes the base. Anything else
    /// (freed, stale, foreign, managed, pool or graph memory, null) is
    /// `CUDA_ERROR_INVALID_VALUE`, CUDA's answer for freed, pool and null addresses.
    pub(crate) fn ipc_get_mem_handle(
        &mut self,
        cx: &mut Cx,
        ptr: DevicePtr,
    ) -> DriverResult<IpcMemHandle> {
        self.gate(cx, Ask::none())?;
        let base = self
            .mem
            .resolve(ptr, 1)
            .ok()
            .map(|(_, within)| DevicePtr(ptr.0 - within as u64));
        match base.and_then(|b| self.mem.find_base(b).map(|(_, a)| (b, a))) {
            Some((base, a)) if a.kind == AllocKind::Device && !a.free_pending => {
                Ok(encode(Exported {
                    process: std::process::id(),
                    instance: self.instance,
                    ptr: base,
                }))
            }
            _ => Err(cx.cuda(CuCode::INVALID_VALUE)),
        }
    }

    /// A handle this process exported (from any simulator in it) is
    /// `CUDA_ERROR_INVALID_CONTEXT`, as CUDA answers (measured on an H100); any other is
    /// `CUDA_ERROR_NOT_SUPPORTED`: no other process shares the simulated device.
    pub(crate) fn ipc_open_mem_handle(
        &mut self,
        cx: &mut Cx,
        handle: &IpcMemHandle,
    ) -> DriverResult<DevicePtr> {
        self.gate(cx, Ask::none())?;
        let names = decode(handle);
        if names.is_some_and(|e| e.process == std::process::id()) {
            return Err(cx.cuda(CuCode::INVALID_CONTEXT));
        }
        tracing::debug!(
            call = cx.call,
            names = ?names,
            "the simulated driver has no peer process to open an IPC handle from"
        );
        Err(cx.cuda(CuCode::NOT_SUPPORTED))
    }

    /// Always `CUDA_ERROR_INVALID_VALUE`: nothing was ever opened here.
    pub(crate) fn ipc_close_mem_handle(
        &mut self,
        cx: &mut Cx,
        _ptr: DevicePtr,
    ) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        Err(cx.cuda(CuCode::INVALID_VALUE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_decodes_to_what_it_encodes() {
        let e = Exported {
            process: 4242,
            instance: 7,
            ptr: DevicePtr(0x0003_0001_0000_0100),
        };
        let h = encode(e);
        assert_eq!(&h.0[..8], MAGIC);
        assert_eq!(decode(&h), Some(e));
        let mut other = h;
        other.0[40] = 1;
        assert_eq!(decode(&other), None, "trailing bytes are zero");
        assert_eq!(decode(&IpcMemHandle([0; IPC_HANDLE_BYTES])), None);
    }
}
