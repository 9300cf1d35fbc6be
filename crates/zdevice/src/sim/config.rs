//! Configuration of a simulated device.

use std::time::Duration;

/// What the simulated device looks like and how it behaves.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Device memory in bytes (`cuMemGetInfo` total, `cuDeviceTotalMem`).
    pub capacity: u64,
    /// `cuDeviceGetName`.
    pub device_name: String,
    /// `cuDriverGetVersion` (13000 = CUDA 13.0).
    pub driver_version: u32,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Overwrite freed device memory with 0xFF bytes (a float32 NaN) and hand out fresh
    /// allocations filled the same way, so a use of stale or uninitialised memory computes NaN.
    pub poison_on_free: bool,
    /// Every call, starting with `cuInit`, fails as if `libcuda` could not be loaded.
    pub missing_driver: bool,
    /// A stalled synchronous call also blocks the calling thread for the stall's length in
    /// real time (holding the driver, as a call stuck inside a real driver does), and the
    /// driver says its time is not virtual, so the device runs blocking calls on its watchdog
    /// worker. For testing that watchdog; the clock itself stays virtual.
    pub real_time_stalls: bool,
    /// Highest PTX ISA version `cuModuleLoadData` accepts (newer → 222 UNSUPPORTED_PTX_VERSION).
    pub max_ptx_isa: (u32, u32),
    /// Virtual time every driver call costs, so that polling loops see time move.
    pub call_time: Duration,
    /// Virtual time every queued operation takes on its stream, before size-dependent time.
    pub op_time: Duration,
    /// Copy and memset bandwidth in bytes per virtual microsecond (about 1 TB/s by default).
    pub bytes_per_us: u64,
    /// Matrix-product rate in floating-point operations per virtual microsecond.
    pub flops_per_us: u64,
    /// Records the op log keeps (a ring: older ones are dropped and counted, see
    /// [`SimDriver::op_log_dropped`](super::SimDriver::op_log_dropped)). Default
    /// [`DEFAULT_OP_LOG_CAPACITY`](super::DEFAULT_OP_LOG_CAPACITY) = 65,536.
    pub op_log_capacity: usize,
    /// Accounting only (for memory plans): allocations, frees, pools, streams, events, capture
    /// and graphs behave as usual, but no host memory stands behind device memory: kernels,
    /// matrix products, memsets and copies into device memory are queued, timed and logged but
    /// not run, and device memory reads as zeros (a download yields zeros; poison is off). Any
    /// model size can then be walked through for its sizes and lifetimes in seconds.
    pub accounting_only: bool,
    /// Operations a stream may hold not yet run before a launch onto it (`cuLaunchKernel`,
    /// `cuGraphLaunch`) blocks the calling thread, as a GPU's launch queue does when the host
    /// runs ahead of the device: the host then waits for the device to run the oldest (the
    /// clock moves to its end). Behind an operation that never completes (a kernel waiting on
    /// the device for a peer that died, a wait behind one) the launch blocks until that
    /// operation can complete, re-checked whenever the fault plan's hangs are released (an
    /// abort) and every few milliseconds: with a dead peer that never happens, as measured on
    /// 2 H200s (issue 44). A GPU's queue holds about a thousand launches.
    pub launch_queue_depth: usize,
}

/// [`SimConfig::launch_queue_depth`]'s default.
pub const DEFAULT_LAUNCH_QUEUE_DEPTH: usize = 1024;

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            capacity: 256 << 20,
            device_name: "Simulated CUDA device".to_string(),
            driver_version: 13000,
            compute_capability: (9, 0),
            poison_on_free: true,
            missing_driver: false,
            real_time_stalls: false,
            max_ptx_isa: (9, 0),
            call_time: Duration::from_micros(1),
            op_time: Duration::from_micros(5),
            bytes_per_us: 1_000_000,
            flops_per_us: 50_000_000,
            op_log_capacity: super::DEFAULT_OP_LOG_CAPACITY,
            accounting_only: false,
            launch_queue_depth: DEFAULT_LAUNCH_QUEUE_DEPTH,
        }
    }
}

impl SimConfig {
    /// The default device with `capacity` bytes of memory.
    #[must_use]
    pub fn with_capacity(capacity: u64) -> Self {
        SimConfig {
            capacity,
            ..SimConfig::default()
        }
    }

    /// An accounting-only device of `capacity` bytes (see [`SimConfig::accounting_only`]):
    /// sizes and lifetimes without data, for memory plans.
    #[must_use]
    pub fn accounting(capacity: u64) -> Self {
        SimConfig {
            capacity,
            poison_on_free: false,
            accounting_only: true,
            ..SimConfig::default()
        }
    }
}
