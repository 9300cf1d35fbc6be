//! The workspace's own kernels, as PTX built from `kernels/*.cu` by `cargo xtask build-kernels`.
//!
//! Embedded at compile time so that nothing is read from disk at run time; load with
//! [`Driver::module_load_ptx`](crate::Driver::module_load_ptx).

/// PTX of `kernels/fill.cu` (target `compute_80`).
pub const FILL_PTX: &str = include_str!("../../../kernels/ptx/fill.ptx");

/// `fill_f32(float* out, float value, unsigned long long n)`: `out[i] = value` for `i < n`.
pub const FILL_F32: &str = "fill_f32";

/// `axpy_f32(float* y, const float* x, float a, unsigned long long n)`: `y[i] += a * x[i]`.
pub const AXPY_F32: &str = "axpy_f32";

/// PTX of `kernels/spin.cu` (target `compute_80`).
pub const SPIN_PTX: &str = include_str!("../../../kernels/ptx/spin.ptx");

/// `spin_ns(unsigned long long nanos)`: one thread spins on `%globaltimer` until `nanos`
/// nanoseconds have passed (launch it as 1 x 1). [`FaultyDriver`](crate::FaultyDriver) queues
/// it to stall an asynchronous call on a real GPU.
pub const SPIN_NS: &str = "spin_ns";
