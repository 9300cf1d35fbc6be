//! The device layer's one error type: each variant says what the caller can do about it.

use std::time::Duration;

use crate::driver::{CuCode, DriverError};

/// What a [`Device`](crate::Device) call can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The CUDA driver or one of its libraries could not be loaded: install a driver, or point
    /// `ZGPU_CUDA_LIB_DIR` at the folder holding it.
    #[error("CUDA is not available: {0}")]
    Unavailable(#[from] cuda_sys::LoadError),
    /// The driver loaded but reports no usable device at this ordinal.
    #[error("no CUDA device {ordinal}: {reason}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// What the driver said.
        reason: String,
    },
    /// A driver call failed with a status that leaves the device usable: fix the input, retry.
    #[error("{call} failed: {code}")]
    Driver {
        /// The CUDA function.
        call: &'static str,
        /// The CUDA status.
        code: CuCode,
    },
    /// A cuBLAS call failed.
    #[error("{call} failed: {name} ({status})")]
    Blas {
        /// The cuBLAS function.
        call: &'static str,
        /// The raw status.
        status: u32,
        /// Its cuBLAS name.
        name: &'static str,
    },
    /// Not enough free device memory now; freeing memory (or waiting for frees) may help.
    #[error("out of device memory in {call}: requested {requested} bytes, {free} free of {total}")]
    OutOfMemory {
        /// The allocation call.
        call: &'static str,
        /// Bytes requested.
        requested: u64,
        /// Bytes free when it failed.
        free: u64,
        /// Device capacity.
        total: u64,
    },
    /// The request can never fit on this device, whatever is freed.
    #[error("{call}: requested {requested} bytes, more than the device's {total} bytes in all")]
    TooLarge {
        /// The allocation call.
        call: &'static str,
        /// Bytes requested.
        requested: u64,
        /// Device capacity.
        total: u64,
    },
    /// The call is not allowed while a stream captures (the driver would fail it, hang, or,
    /// worse, succeed and leave the work out of the graph). Issue it before or after capture.
    #[error("{call} is not allowed while a stream is capturing: {why}")]
    CaptureIllegal {
        /// The refused call.
        call: &'static str,
        /// Why it is refused and what to do instead.
        why: &'static str,
    },
    /// The driver invalidated the capture (an illegal call was made during it); the capture has
    /// ended and the device is usable.
    #[error("stream capture was invalidated ({call} returned {code})")]
    CaptureInvalidated {
        /// The call that reported it.
        call: &'static str,
        /// The CUDA status.
        code: CuCode,
    },
    /// A bounded wait ran out. The device stays usable unless the wait was inside the driver
    /// (then `device_lost` is set, [`DeviceError::is_fatal`] is true, and every later call is
    /// [`DeviceError::DeviceLost`]).
    #[error(
        "timed out after {elapsed:?} (deadline {deadline:?}) waiting for {waited_for}{}",
        if *.device_lost { " (device lost)" } else { "" }
    )]
    Timeout {
        /// What was waited for: the call that overran, when one did.
        waited_for: String,
        /// The deadline.
        deadline: Duration,
        /// How long was waited.
        elapsed: Duration,
        /// The device is lost after this wait (a driver call that returned late, or never).
        device_lost: bool,
    },
    /// An earlier call failed in a way that leaves the context unusable (a sticky error, or a
    /// driver call that never returned). Recreate the process's device; nothing more will run.
    #[error("device lost: {reason}")]
    DeviceLost {
        /// The first failure.
        reason: String,
    },
    /// The driver is too old for the embedded PTX.
    #[error(
        "PTX ISA {ptx_isa} needs a CUDA {needs_cuda} driver ({needs_driver} or newer); this driver supports CUDA {driver_cuda}"
    )]
    PtxTooNew {
        /// The PTX's `.version`.
        ptx_isa: String,
        /// The CUDA version that introduced it.
        needs_cuda: &'static str,
        /// The Linux driver release that first supports it.
        needs_driver: &'static str,
        /// What the installed driver supports, e.g. `12.4`.
        driver_cuda: String,
    },
    /// The simulated driver does not know the real driver's answer to this call during capture.
    #[error("{call} during capture is not modelled by the simulated driver")]
    NotModelled {
        /// The refused call.
        call: &'static str,
    },
    /// An argument was rejected.
    #[error("{call}: invalid argument: {reason}")]
    InvalidArgument {
        /// The call.
        call: &'static str,
        /// What was wrong.
        reason: String,
    },
}

impl DeviceError {
    /// Whether the device can still be used after this error.
    #[must_use]
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            DeviceError::DeviceLost { .. }
                | DeviceError::Timeout {
                    device_lost: true,
                    ..
                }
        )
    }

    /// Whether the device lacked free memory for a request that fits its capacity: freeing
    /// memory (or waiting for frees) may let a retry succeed.
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, DeviceError::OutOfMemory { .. })
    }

    /// Whether the request exceeds the device's capacity: no retry can succeed; split it.
    #[must_use]
    pub fn is_too_large(&self) -> bool {
        matches!(self, DeviceError::TooLarge { .. })
    }

    /// Whether the driver invalidated a capture (it has ended; the device stays usable).
    #[must_use]
    pub fn is_capture_invalidated(&self) -> bool {
        matches!(self, DeviceError::CaptureInvalidated { .. })
    }
}

impl From<DriverError> for DeviceError {
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::Cuda { call, code } => DeviceError::Driver { call, code },
            DriverError::Cublas { call, status, name } => DeviceError::Blas { call, status, name },
            DriverError::Load(l) => DeviceError::Unavailable(l),
            DriverError::NotModelled { call } => DeviceError::NotModelled { call },
            DriverError::InvalidArgument { call, reason } => {
                DeviceError::InvalidArgument { call, reason }
            }
        }
    }
}

/// Result of a device call.
pub type DeviceResult<T> = Result<T, DeviceError>;
