//! The checked accessor through which simulated kernels (and the CPU gemm) reach device memory.
//!
//! A kernel closure receives only its launch configuration, its arguments and a [`SimMemory`].
//! Every access is checked against the allocation table: an address outside every live
//! allocation, past the end of one, or carrying the generation of a freed allocation is a
//! [`KernelFault`], which the simulator turns into a sticky `CUDA_ERROR_ILLEGAL_ADDRESS` (700)
//! reported at the next synchronisation, as a GPU would.

use super::memory::Memory;
use crate::types::{DevicePtr, KernelArg};

/// Why a simulated kernel could not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelFault {
    /// The address is in no live allocation.
    #[error("address {ptr:?} is in no live allocation")]
    Unmapped {
        /// The address.
        ptr: DevicePtr,
    },
    /// The address carries the generation of a freed allocation whose range was reissued.
    #[error(
        "address {ptr:?} is stale: generation {found}, the live allocation there is generation {live}"
    )]
    Stale {
        /// The address.
        ptr: DevicePtr,
        /// Its generation.
        found: u16,
        /// The generation of the allocation now at that range.
        live: u16,
    },
    /// The access runs past the end of its allocation.
    #[error("{len} bytes at {ptr:?} run past the end of its {size}-byte allocation")]
    OutOfBounds {
        /// The address.
        ptr: DevicePtr,
        /// Bytes accessed.
        len: u64,
        /// Size of the allocation.
        size: u64,
    },
    /// A kernel argument has the wrong type or is missing.
    #[error("kernel argument {index}: {reason}")]
    BadArgument {
        /// Position in the argument list.
        index: usize,
        /// What was wrong.
        reason: String,
    },
    /// Host memory of an asynchronous copy was freed before the copy ran.
    #[error("page-locked host memory at {0:#x} is not allocated")]
    HostUnmapped(u64),
    /// The kernel waits on the device for something that has not come (a peer that stopped
    /// or died, for a collective): not an error, and not done. The simulator leaves it at the
    /// front of its stream and runs it again at the next query or wait, as a GPU keeps such a
    /// kernel spinning: the stream, and every stream or event waiting behind it, never drains
    /// until the kernel completes (say, once its communicator is aborted).
    #[error("the kernel is waiting on the device: {0}")]
    Waiting(String),
}

/// Checked access to simulated device memory, handed to kernel closures.
#[derive(Debug)]
pub struct SimMemory<'a> {
    mem: &'a mut Memory,
}

fn bytes_of(ptr: DevicePtr, n: u64, size: u64) -> Result<u64, KernelFault> {
    n.checked_mul(size).ok_or(KernelFault::OutOfBounds {
        ptr,
        len: u64::MAX,
        size: 0,
    })
}

macro_rules! typed_access {
    ($read:ident, $write:ident, $t:ty, $n:expr) => {
        #[doc = concat!("Reads `n` `", stringify!($t), "` values at `ptr` (little-endian).")]
        pub fn $read(&self, ptr: DevicePtr, n: u64) -> Result<Vec<$t>, KernelFault> {
            let bytes = self.read_bytes(ptr, bytes_of(ptr, n, $n)?)?;
            Ok(bytes
                .chunks_exact($n)
                .map(|c| {
                    let mut a = [0u8; $n];
                    a.copy_from_slice(c);
                    <$t>::from_le_bytes(a)
                })
                .collect())
        }

        #[doc = concat!("Writes `values` at `ptr` as `", stringify!($t), "` (little-endian).")]
        pub fn $write(&mut self, ptr: DevicePtr, values: &[$t]) -> Result<(), KernelFault> {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.write_bytes(ptr, &bytes)
        }
    };
}

impl<'a> SimMemory<'a> {
    pub(crate) fn new(mem: &'a mut Memory) -> Self {
        SimMemory { mem }
    }

    /// Checks that `bytes` bytes at `ptr` are accessible, without touching them.
    pub fn check(&self, ptr: DevicePtr, bytes: u64) -> Result<(), KernelFault> {
        self.mem.resolve(ptr, bytes).map(|_| ())
    }

    /// Reads `len` bytes at `ptr`. The range is checked before anything is allocated.
    pub fn read_bytes(&self, ptr: DevicePtr, len: u64) -> Result<Vec<u8>, KernelFault> {
        self.mem.read(ptr, len)
    }

    /// Writes `data` at `ptr`.
    pub fn write_bytes(&mut self, ptr: DevicePtr, data: &[u8]) -> Result<(), KernelFault> {
        self.mem.write(ptr, data)
    }

    /// Writes `n` copies of `value` at `ptr` (checked first, so a huge `n` faults cheaply).
    pub fn fill_f32(&mut self, ptr: DevicePtr, value: f32, n: u64) -> Result<(), KernelFault> {
        self.mem
            .fill(ptr, bytes_of(ptr, n, 4)?, &value.to_le_bytes())
    }

    typed_access!(read_u8, write_u8, u8, 1);
    typed_access!(read_u32, write_u32, u32, 4);
    typed_access!(read_f32, write_f32, f32, 4);
    typed_access!(read_f64, write_f64, f64, 8);
}

/// Typed views of a kernel's argument list; a missing or mistyped argument is a fault, not a
/// panic.
#[derive(Clone, Copy, Debug)]
pub struct KernelArgs<'a>(pub &'a [KernelArg]);

fn bad(index: usize, want: &str, got: Option<&KernelArg>) -> KernelFault {
    let reason = match got {
        Some(a) => format!("expected {want}, got {a:?}"),
        None => format!("expected {want}, argument missing"),
    };
    KernelFault::BadArgument { index, reason }
}

impl KernelArgs<'_> {
    /// A device pointer argument.
    pub fn ptr(&self, i: usize) -> Result<DevicePtr, KernelFault> {
        match self.0.get(i) {
            Some(KernelArg::Ptr(p)) => Ok(*p),
            other => Err(bad(i, "a pointer", other)),
        }
    }

    /// A `float` argument.
    pub fn f32(&self, i: usize) -> Result<f32, KernelFault> {
        match self.0.get(i) {
            Some(KernelArg::F32(v)) => Ok(*v),
            other => Err(bad(i, "a float", other)),
        }
    }

    /// A `double` argument.
    pub fn f64(&self, i: usize) -> Result<f64, KernelFault> {
        match self.0.get(i) {
            Some(KernelArg::F64(v)) => Ok(*v),
            other => Err(bad(i, "a double", other)),
        }
    }

    /// An `unsigned long long` argument (an `unsigned int` widens, as C would).
    pub fn u64(&self, i: usize) -> Result<u64, KernelFault> {
        match self.0.get(i) {
            Some(KernelArg::U64(v)) => Ok(*v),
            Some(KernelArg::U32(v)) => Ok(u64::from(*v)),
            other => Err(bad(i, "an unsigned long long", other)),
        }
    }

    /// An `unsigned int` argument.
    pub fn u32(&self, i: usize) -> Result<u32, KernelFault> {
        match self.0.get(i) {
            Some(KernelArg::U32(v)) => Ok(*v),
            other => Err(bad(i, "an unsigned int", other)),
        }
    }

    /// An `int` argument.
    pub fn i32(&self, i: usize) -> Result<i32, KernelFault> {
        match self.0.get(i) {
            Some(KernelArg::I32(v)) => Ok(*v),
            other => Err(bad(i, "an int", other)),
        }
    }

    /// A `long long` argument.
    pub fn i64(&self, i: usize) -> Result<i64, KernelFault> {
        match self.0.get(i) {
            Some(KernelArg::I64(v)) => Ok(*v),
            other => Err(bad(i, "a long long", other)),
        }
    }
}
