//! Plain handle and descriptor types shared by every [`Driver`](crate::Driver).
//!
//! Handles are opaque integers rather than raw pointers so that the trait stays object-safe,
//! `Send` and `Sync`, and so that the simulated driver can encode what it needs (for example a
//! generation in the upper bits of a device address). Only the driver that issued a handle may
//! interpret it.

use std::fmt;

macro_rules! handle {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u64);
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }
    };
}

handle!(
    /// A context (`CUcontext`).
    Context
);
handle!(
    /// A stream (`CUstream`). Streams made through [`Device`](crate::Device) are non-blocking.
    Stream
);
handle!(
    /// An event (`CUevent`).
    Event
);
handle!(
    /// A captured graph (`CUgraph`).
    Graph
);
handle!(
    /// An instantiated, launchable graph (`CUgraphExec`).
    GraphExec
);
handle!(
    /// A loaded module (`CUmodule`).
    Module
);
handle!(
    /// A kernel inside a module (`CUfunction`).
    Function
);
handle!(
    /// A stream-ordered memory pool (`CUmemoryPool`).
    MemPool
);
handle!(
    /// A cuBLAS handle (`cublasHandle_t`).
    BlasHandle
);
handle!(
    /// Page-locked host memory from `cuMemAllocHost`.
    HostPtr
);

/// A device address (`CUdeviceptr`). Arithmetic within one allocation is allowed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null address.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// This address plus `bytes`.
    #[must_use]
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

/// Bytes of a legacy CUDA IPC memory handle (`CU_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// An interprocess handle to a device allocation (`CUipcMemHandle`): 64 opaque bytes that
/// another process on the same host opens with `cuIpcOpenMemHandle` to reach the allocation.
/// Plain bytes, so it can travel over any channel between the ranks. Only the kind of driver
/// that issued it can interpret it: the simulated driver's name its own allocation, which no
/// other process can open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcMemHandle(pub [u8; IPC_HANDLE_BYTES]);

/// Stream creation flags. The device only ever asks for non-blocking streams; the blocking kind
/// exists so the simulated driver can reproduce the measured 906 rows of docs/capture-rules.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// `CU_STREAM_NON_BLOCKING`: no implicit ordering with the legacy default stream.
    NonBlocking,
    /// `CU_STREAM_DEFAULT`: implicitly ordered with the legacy default stream.
    Blocking,
}

/// How the device schedules a stream's work against other streams' (`cuStreamCreateWithPriority`):
/// when SMs free up, blocks of a higher-priority stream's pending kernels are started first.
/// A hint only: running blocks are never preempted, and the order of work is what the events
/// say. A graph captured from a stream keeps each kernel's priority when it is instantiated
/// with [`InstantiateFlags::use_node_priority`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamPriority {
    /// CUDA's default, which is the device's least priority.
    #[default]
    Normal,
    /// The greatest priority the device offers (`cuCtxGetStreamPriorityRange`).
    High,
}

/// `cuCtxGetStreamPriorityRange`: numerically lower is greater (0, the default, is the least).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityRange {
    /// The least priority (CUDA's default for a stream).
    pub least: i32,
    /// The greatest priority.
    pub greatest: i32,
}

impl PriorityRange {
    /// The driver's number for `p` on a device with this range.
    #[must_use]
    pub fn value(self, p: StreamPriority) -> i32 {
        match p {
            StreamPriority::Normal => self.least,
            StreamPriority::High => self.greatest,
        }
    }
}

/// `CUstreamCaptureMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    /// `CU_STREAM_CAPTURE_MODE_GLOBAL`: unsafe calls from any thread are refused.
    Global,
    /// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: unsafe calls from the capturing thread are refused.
    ThreadLocal,
    /// `CU_STREAM_CAPTURE_MODE_RELAXED`: nothing is refused.
    Relaxed,
}

/// `CUstreamCaptureStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureStatus {
    /// Not capturing.
    None,
    /// Capturing, and the capture is still valid.
    Active,
    /// Capturing, but an illegal call invalidated the capture; ending it returns 901.
    Invalidated,
}

/// Whether asynchronous work has finished (`cuStreamQuery` / `cuEventQuery`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// All work has completed.
    Ready,
    /// Work is still pending (`CUDA_ERROR_NOT_READY`).
    NotReady,
}

/// `cuGraphInstantiate` flags we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InstantiateFlags {
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
    pub auto_free_on_launch: bool,
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`: each kernel runs at the priority of the
    /// stream it was captured from, not the priority of the stream the graph is launched into.
    pub use_node_priority: bool,
}

/// Grid and block shape of a kernel launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks per grid (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch covering `n` elements with `block` threads per block, each thread
    /// handling `per_thread` elements.
    #[must_use]
    pub fn linear(n: u64, block: u32, per_thread: u32) -> LaunchConfig {
        let per_block = u64::from(block) * u64::from(per_thread.max(1));
        let blocks = n.div_ceil(per_block).clamp(1, u64::from(u32::MAX)) as u32;
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// One kernel parameter, passed by value as CUDA does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A device address.
    Ptr(DevicePtr),
    /// `unsigned int`.
    U32(u32),
    /// `int`.
    I32(i32),
    /// `unsigned long long`.
    U64(u64),
    /// `long long`.
    I64(i64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
}

/// cuBLAS operation on an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transpose {
    /// `CUBLAS_OP_N`.
    No,
    /// `CUBLAS_OP_T`.
    Yes,
}

/// `cublasSgemmStridedBatched` in cuBLAS's column-major convention:
/// `C[i] = alpha * op(A[i]) * op(B[i]) + beta * C[i]` for `i` in `0..batch`, where `op(A)` is
/// `m x k`, `op(B)` is `k x n` and `C` is `m x n`, with leading dimensions and element strides.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(missing_docs)]
pub struct GemmF32 {
    pub transa: Transpose,
    pub transb: Transpose,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub alpha: f32,
    pub a: DevicePtr,
    pub lda: i32,
    pub stride_a: i64,
    pub b: DevicePtr,
    pub ldb: i32,
    pub stride_b: i64,
    pub beta: f32,
    pub c: DevicePtr,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
}

/// Properties of a stream-ordered memory pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolProps {
    /// Device ordinal the pool allocates on.
    pub ordinal: u32,
    /// Upper bound on the pool's size in bytes (`maxSize`; 0 = unlimited).
    pub max_size: u64,
}

// --- mixed-precision gemm (issue 42) ---------------------------------------------------------

/// The arithmetic of a [`GemmEx`]: what A and B hold and how the product reads them. Every
/// mode accumulates in float32 and reads and writes a float32 C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmMath {
    /// float32 A and B, float32 products (`CUBLAS_COMPUTE_32F_PEDANTIC`: no TF32 whatever the
    /// handle's math mode).
    F32,
    /// float32 A and B, read by TF32 tensor cores (10 significand bits) with float32
    /// accumulation (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    Tf32,
    /// bf16 A and B (`CUDA_R_16BF`, 2 bytes an element), float32 accumulation
    /// (`CUBLAS_COMPUTE_32F`). Converting float32 operands to bf16 is the caller's (zcompute's
    /// conversion kernel, round to nearest-even).
    Bf16,
}

impl GemmMath {
    /// Bytes of one element of A and B.
    #[must_use]
    pub fn operand_bytes(self) -> u64 {
        match self {
            GemmMath::F32 | GemmMath::Tf32 => 4,
            GemmMath::Bf16 => 2,
        }
    }

    /// The mode's name (`f32`, `tf32`, `bf16`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            GemmMath::F32 => "f32",
            GemmMath::Tf32 => "tf32",
            GemmMath::Bf16 => "bf16",
        }
    }
}

/// `cublasGemmStridedBatchedEx`: the product `gemm` describes (its sizes, leading dimensions
/// and batch strides, all counted in elements as cuBLAS counts them) under `math`. Under
/// [`GemmMath::Bf16`] `gemm.a` and `gemm.b` address bf16 elements; C is float32 in every mode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmEx {
    /// What A and B hold and how they are multiplied.
    pub math: GemmMath,
    /// The product's geometry and scalars (`alpha`, `beta` are float32 host scalars).
    pub gemm: GemmF32,
}
