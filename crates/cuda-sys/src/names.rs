//! Status-code names, from tables the xtask derives from the generated constants.

#[allow(dead_code, reason = "generated")]
#[path = "generated/names.rs"]
mod table;

pub(crate) use table::{
    CUBLAS_SYMBOLS, CUBLASLT_SYMBOLS, DRIVER_SYMBOLS, NCCL_SYMBOLS, NVRTC_SYMBOLS,
};

/// The CUDA name of a `CUresult` (`2` → `CUDA_ERROR_OUT_OF_MEMORY`), or `CUDA_ERROR_<unknown>`
/// for a value the 13.0 headers do not define.
#[must_use]
pub fn cu_result_name(code: u32) -> &'static str {
    table::cu_result_name(code).unwrap_or("CUDA_ERROR_<unknown>")
}

/// The name of a `cublasStatus_t`, or `CUBLAS_STATUS_<unknown>`.
#[must_use]
pub fn cublas_status_name(status: u32) -> &'static str {
    table::cublas_status_name(status).unwrap_or("CUBLAS_STATUS_<unknown>")
}

/// The name of an `nvrtcResult`, or `NVRTC_ERROR_<unknown>`.
#[must_use]
pub fn nvrtc_result_name(result: u32) -> &'static str {
    table::nvrtc_result_name(result).unwrap_or("NVRTC_ERROR_<unknown>")
}

/// The NCCL name of an `ncclResult_t` (`6` → `ncclRemoteError`), or `ncclResult_<unknown>`.
#[must_use]
pub fn nccl_result_name(result: u32) -> &'static str {
    table::nccl_result_name(result).unwrap_or("ncclResult_<unknown>")
}
