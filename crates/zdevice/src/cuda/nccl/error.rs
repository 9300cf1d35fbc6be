//! [`NcclError`]: what an NCCL call can fail with.

use std::time::Duration;

use crate::error::DeviceError;

/// What an NCCL call can fail with. Every variant but `Library`, `VersionTooOld`, `NotNative`
/// and `InvalidArgument` leaves the communicator aborted: the job cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// libnccl or one of its symbols could not be loaded: install NCCL or point
    /// `ZGPU_NCCL_LIB_DIR` at its folder.
    #[error("the NCCL library could not be loaded: {0}")]
    Library(#[from] cuda_sys::LoadError),
    /// The loaded library is older than the header the bindings were generated from.
    #[error("NCCL {found} is loaded but {needed} or newer is needed")]
    VersionTooOld {
        /// The library's version, `2.28.3`.
        found: String,
        /// The pinned header's.
        needed: String,
    },
    /// An NCCL call returned an error code at once.
    #[error("{call} returned {name} ({code}): {detail}")]
    Call {
        /// The NCCL function.
        call: &'static str,
        /// The raw `ncclResult_t`.
        code: u32,
        /// Its NCCL name.
        name: &'static str,
        /// `ncclGetLastError`'s text.
        detail: String,
    },
    /// The communicator's asynchronous error became an error while `call`'s work was under way
    /// (`ncclRemoteError`, `ncclSystemError`: typically a peer failed or vanished).
    #[error("{call}: the communicator reported {name} ({code}): {detail}")]
    Async {
        /// The call whose work was being waited for.
        call: &'static str,
        /// The raw `ncclResult_t`.
        code: u32,
        /// Its NCCL name.
        name: &'static str,
        /// `ncclGetLastError`'s text.
        detail: String,
    },
    /// `call`'s work did not complete within the deadline (a peer stalled or died).
    #[error("{call} did not complete within {deadline:?}; the communicator was aborted")]
    Timeout {
        /// The call whose work was being waited for.
        call: &'static str,
        /// The deadline (the device's sync deadline).
        deadline: Duration,
    },
    /// The communicator was aborted by an earlier failure; nothing more runs on it.
    #[error("{call}: the communicator was aborted after an earlier failure")]
    Aborted {
        /// The refused call.
        call: &'static str,
    },
    /// NCCL needs real CUDA streams and device memory; this driver's handles are not.
    #[error("NCCL needs the real CUDA driver; {driver} has none of its streams or memory")]
    NotNative {
        /// The driver's description.
        driver: String,
    },
    /// An argument was rejected before reaching NCCL.
    #[error("{call}: invalid argument: {reason}")]
    InvalidArgument {
        /// The call.
        call: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The device refused or failed a call around NCCL's (binding the context, waiting on the
    /// stream, a capture in progress).
    #[error("the device failed around an NCCL call: {0}")]
    Device(#[from] DeviceError),
}

impl NcclError {
    /// Whether the communicator was aborted by this failure (or before it).
    #[must_use]
    pub fn aborted_communicator(&self) -> bool {
        matches!(
            self,
            NcclError::Call { .. }
                | NcclError::Async { .. }
                | NcclError::Timeout { .. }
                | NcclError::Aborted { .. }
        )
    }
}
