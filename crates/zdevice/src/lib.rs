//! zdevice: the device boundary.
pub mod driver;
pub mod types;
pub use driver::*;
pub use types::*;
