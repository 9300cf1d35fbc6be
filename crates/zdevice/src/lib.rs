//! zdevice: the device boundary.
//!
//! Two layers. [`Driver`] is the narrow set of raw calls the workspace makes, implemented by
//! `CudaDriver` (the real CUDA driver through `cuda-sys`) and `SimDriver` (a deterministic
//! simulation that answers as the real driver was measured to, see docs/capture-rules.md).
//! [`Device`] sits over any driver and holds every guard exactly once: primary context,
//! non-blocking streams, a cuBLAS workspace reserved before capture, deadlines on every wait,
//! no polling during capture, refusal of the calls the driver would silently leave out of a
//! graph, and `DeviceLost` after a sticky error or a driver call that never returned.
//!
//! [`MockDevice`] is `Device<SimDriver>`: what every higher crate tests against.

pub mod cuda;
pub mod device;
pub mod driver;
pub mod error;
pub mod faults;
pub mod faulty;
pub mod kernels;
pub mod rounding;
pub mod sim;
pub mod types;

pub use cuda::CudaDriver;
pub use faults::FaultAction;
pub use faulty::{AsyncStall, FaultController, FaultyDriver};
pub use sim::{SimConfig, SimDriver};

/// The device over the simulated driver: what every higher crate tests against.
pub type MockDevice = Device<SimDriver>;

// The crate's surface, named item by item (a new public item is exported on purpose, never by a
// glob). The modules stay public for their docs and for the items only advanced callers need.
pub use device::{
    CaptureEndError, CaptureMemory, CapturePhase, CaptureSession, CaptureWatch, CapturedGraph,
    Device, DeviceConfig, DeviceInfo, DevicePool, GraphInstance, LoadedModule, PinnedBuffer,
    Release, RoutedMemory, StreamCapture,
};
pub use driver::{CuCode, Driver, DriverError, DriverResult};
pub use error::{DeviceError, DeviceResult};
pub use types::{
    BlasHandle, CaptureMode, CaptureStatus, Context, DevicePtr, Event, Function, GemmEx, GemmF32,
    GemmMath, Graph, GraphExec, HostPtr, IPC_HANDLE_BYTES, InstantiateFlags, IpcMemHandle,
    KernelArg, LaunchConfig, MemPool, Module, PoolProps, PriorityRange, Readiness, Stream,
    StreamKind, StreamPriority, Transpose,
};

/// The README's example, compiled and run by `cargo test --doc` so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
