//! The cuBLAS half of `CudaDriver`. libcublas is opened on the first call, so a machine without
//! it fails only the `blas_*` calls, with a typed load error.

use std::ffi::c_void;

use cuda_sys::cublas::{self as cb, Cublas, cublasStatus_t};

use super::{CudaDriver, size};
use crate::driver::{DriverError, DriverResult};
use crate::types::{BlasHandle, DevicePtr, GemmEx, GemmF32, GemmMath, Stream, Transpose};

fn lib() -> DriverResult<&'static Cublas> {
    Ok(cuda_sys::cublas()?)
}

fn check(call: &'static str, status: cublasStatus_t) -> DriverResult<()> {
    if status == cb::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        let name = cuda_sys::cublas_status_name(status);
        tracing::debug!(call, status, name, "cuBLAS error");
        Err(DriverError::Cublas { call, status, name })
    }
}

fn handle(h: BlasHandle) -> cb::cublasHandle_t {
    h.0 as cb::cublasHandle_t
}

fn op(t: Transpose) -> cb::cublasOperation_t {
    match t {
        Transpose::No => cb::CUBLAS_OP_N,
        Transpose::Yes => cb::CUBLAS_OP_T,
    }
}

pub(super) fn create(drv: &CudaDriver) -> DriverResult<BlasHandle> {
    let blas = lib()?;
    // cuBLAS binds the handle to the context current on this thread: the primary one.
    drv.bind()?;
    let mut h: cb::cublasHandle_t = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    check("cublasCreate_v2", unsafe { blas.cublasCreate_v2(&mut h) })?;
    Ok(BlasHandle(h as u64))
}

pub(super) fn destroy(drv: &CudaDriver, h: BlasHandle) -> DriverResult<()> {
    let blas = lib()?;
    drv.bind()?;
    // SAFETY: the handle came from cublasCreate_v2; cuBLAS reports a bad one as a status.
    check("cublasDestroy_v2", unsafe {
        blas.cublasDestroy_v2(handle(h))
    })
}

pub(super) fn set_stream(drv: &CudaDriver, h: BlasHandle, s: Stream) -> DriverResult<()> {
    let blas = lib()?;
    drv.bind()?;
    // SAFETY: handle from cublasCreate_v2 and stream from cuStreamCreate (a CUstream is a
    // cudaStream_t).
    check("cublasSetStream_v2", unsafe {
        blas.cublasSetStream_v2(handle(h), s.0 as cb::cudaStream_t)
    })
}

pub(super) fn set_workspace(
    drv: &CudaDriver,
    h: BlasHandle,
    workspace: DevicePtr,
    bytes: u64,
) -> DriverResult<()> {
    let n = size("cublasSetWorkspace_v2", bytes)?;
    let blas = lib()?;
    drv.bind()?;
    // SAFETY: cuBLAS stores the device address and size; the device layer keeps that memory
    // reserved for as long as the handle may use it.
    check("cublasSetWorkspace_v2", unsafe {
        blas.cublasSetWorkspace_v2(handle(h), workspace.0 as *mut c_void, n)
    })
}

/// TF32 tensor-op math, or pedantic math otherwise. Pedantic rather than default: it is the mode
/// documented to use the prescribed precision in every phase, so no TF32 (nor any other reduced
/// precision cuBLAS may adopt as a default) can enter a float32 product that the CPU reference
/// has to match.
pub(super) fn set_tf32(drv: &CudaDriver, h: BlasHandle, tf32: bool) -> DriverResult<()> {
    let blas = lib()?;
    drv.bind()?;
    let mode = if tf32 {
        cb::CUBLAS_TF32_TENSOR_OP_MATH
    } else {
        cb::CUBLAS_PEDANTIC_MATH
    };
    // SAFETY: handle from cublasCreate_v2; the mode is a defined cublasMath_t.
    check("cublasSetMathMode", unsafe {
        blas.cublasSetMathMode(handle(h), mode)
    })
}

/// # Safety
/// Every operand described by `g` lies in live device memory (the trait method's contract).
pub(super) unsafe fn sgemm_strided_batched(
    drv: &CudaDriver,
    h: BlasHandle,
    g: &GemmF32,
) -> DriverResult<()> {
    let blas = lib()?;
    drv.bind()?;
    // SAFETY: alpha and beta are host scalars (the handle keeps cuBLAS's default host pointer
    // mode) live for the call; the device operands are the caller's contract.
    check("cublasSgemmStridedBatched", unsafe {
        blas.cublasSgemmStridedBatched(
            handle(h),
            op(g.transa),
            op(g.transb),
            g.m,
            g.n,
            g.k,
            &g.alpha,
            g.a.0 as *const f32,
            g.lda,
            g.stride_a,
            g.b.0 as *const f32,
            g.ldb,
            g.stride_b,
            &g.beta,
            g.c.0 as *mut f32,
            g.ldc,
            g.stride_c,
            g.batch,
        )
    })
}

// --- mixed-precision gemm (issue 42) ---------------------------------------------------------

/// The operand type and compute type of a mode. C is float32 in every mode; the compute types
/// are explicit, so the handle's math mode (pedantic unless `set_tf32`) changes none of them.
fn ex_types(math: GemmMath) -> (cb::cudaDataType, cb::cublasComputeType_t) {
    match math {
        GemmMath::F32 => (cb::CUDA_R_32F, cb::CUBLAS_COMPUTE_32F_PEDANTIC),
        GemmMath::Tf32 => (cb::CUDA_R_32F, cb::CUBLAS_COMPUTE_32F_FAST_TF32),
        GemmMath::Bf16 => (cb::CUDA_R_16BF, cb::CUBLAS_COMPUTE_32F),
    }
}

/// # Safety
/// Every operand described by `g` lies in live device memory, A and B of the mode's element
/// type (the trait method's contract).
pub(super) unsafe fn gemm_strided_batched_ex(
    drv: &CudaDriver,
    h: BlasHandle,
    ex: &GemmEx,
) -> DriverResult<()> {
    let blas = lib()?;
    drv.bind()?;
    let g = &ex.gemm;
    let (ab_type, compute) = ex_types(ex.math);
    // SAFETY: alpha and beta are float32 host scalars (the compute types are all 32F, whose
    // scalars are float; the handle keeps cuBLAS's default host pointer mode), live for the
    // call; the device operands and their element types are the caller's contract.
    check("cublasGemmStridedBatchedEx", unsafe {
        blas.cublasGemmStridedBatchedEx(
            handle(h),
            op(g.transa),
            op(g.transb),
            g.m,
            g.n,
            g.k,
            std::ptr::from_ref(&g.alpha).cast::<c_void>(),
            g.a.0 as *const c_void,
            ab_type,
            g.lda,
            g.stride_a,
            g.b.0 as *const c_void,
            ab_type,
            g.ldb,
            g.stride_b,
            std::ptr::from_ref(&g.beta).cast::<c_void>(),
            g.c.0 as *mut c_void,
            cb::CUDA_R_32F,
            g.ldc,
            g.stride_c,
            g.batch,
            compute,
            cb::CUBLAS_GEMM_DEFAULT,
        )
    })
}
