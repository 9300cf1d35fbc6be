//! zdevice: the device boundary.
//!
//! Two layers. [`Driver`] is the narrow set of raw calls the workspace makes, implemented by
//! `CudaDriver` (the real CUDA driver through `cuda-sys`) and `SimDriver` (a deterministic
//! simulation that answers as the real driver was measured to, see capture-rules.md).
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
pub mod sim;
pub mod types;

pub use cuda::CudaDriver;
pub use faults::FaultAction;
pub use faulty::{AsyncStall, FaultController, FaultyDriver};
pub use sim::{SimConfig, SimDriver};

/// The device over the simulated driver: what every higher crate tests against.
pub type MockDevice = Device<SimDriver>;

pub use device::*;
pub use driver::*;
pub use error::*;
pub use types::*;
