//! The CUDA backend's helpers that need nothing of it: the mapping of zmem's and the device's
//! errors onto `ComputeError`, and the lock that carries on past poisoning.

use crate::error::ComputeError;
use std::sync::{Mutex, MutexGuard, PoisonError};
use zdevice::DeviceError;
use zmem::MemError;

/// Locks a mutex, carrying on past poisoning (the guarded data are plain values).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Maps a zmem error onto what the caller of an op can do about it, keeping it as the source.
pub(crate) fn mem_error(op: &'static str, e: MemError) -> ComputeError {
    match e {
        MemError::UseAfterReclaim { .. } | MemError::ForeignBlock => {
            ComputeError::UseAfterReclaim {
                op,
                source: Box::new(e),
            }
        }
        MemError::OutOfMemory { .. } => ComputeError::OutOfMemory {
            op,
            source: Box::new(e),
        },
        MemError::TooLarge { .. } => ComputeError::TooLarge {
            op,
            source: Box::new(e),
        },
        MemError::CaptureReservationExhausted { .. } => ComputeError::CaptureReservationExhausted {
            op,
            source: Box::new(e),
        },
        MemError::NoOpenStep { .. } => ComputeError::NoOpenStep { op },
        MemError::StepAlreadyOpen { .. } => ComputeError::StepState {
            op,
            why: "another step is open on this arena; end it first",
        },
        MemError::Device(d) => device_error(op, d),
        _ => ComputeError::Memory {
            op,
            source: Box::new(e),
        },
    }
}

/// Maps a device error onto what the caller of an op can do about it, keeping it as the
/// source.
pub(crate) fn device_error(op: &'static str, e: DeviceError) -> ComputeError {
    match e {
        DeviceError::CaptureInvalidated { .. } => {
            ComputeError::CaptureInvalidated { op, source: e }
        }
        DeviceError::Timeout { .. } => ComputeError::Timeout { op, source: e },
        _ => ComputeError::Device { op, source: e },
    }
}
