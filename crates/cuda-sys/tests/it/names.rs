//! Status names come from the full 13.0 tables.

use cuda_sys::{cu_result_name, cublas_status_name, nvrtc_result_name};

#[test]
fn cu_result_names() {
    assert_eq!(cu_result_name(0), "CUDA_SUCCESS");
    assert_eq!(cu_result_name(2), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(cu_result_name(222), "CUDA_ERROR_UNSUPPORTED_PTX_VERSION");
    assert_eq!(cu_result_name(600), "CUDA_ERROR_NOT_READY");
    assert_eq!(cu_result_name(900), "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED");
    assert_eq!(cu_result_name(901), "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");
    assert_eq!(cu_result_name(906), "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT");
    assert_eq!(cu_result_name(999), "CUDA_ERROR_UNKNOWN");
    assert_eq!(cu_result_name(123_456), "CUDA_ERROR_<unknown>");
}

#[test]
fn cublas_and_nvrtc_names() {
    assert_eq!(cublas_status_name(0), "CUBLAS_STATUS_SUCCESS");
    assert_eq!(cublas_status_name(7), "CUBLAS_STATUS_INVALID_VALUE");
    assert_eq!(cublas_status_name(99), "CUBLAS_STATUS_<unknown>");
    assert_eq!(nvrtc_result_name(0), "NVRTC_SUCCESS");
    assert_eq!(nvrtc_result_name(6), "NVRTC_ERROR_COMPILATION");
    assert_eq!(nvrtc_result_name(999), "NVRTC_ERROR_<unknown>");
}
