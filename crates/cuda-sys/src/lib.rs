//! Raw CUDA 13.0 bindings: the driver API, NVRTC, cuBLAS and cuBLASLt, and NCCL 2.28, opened at
//! run time.
//!
//! The bindings in `src/generated/` are produced by `cargo xtask bindgen` from pinned headers and
//! committed, so building needs no CUDA toolkit. Libraries are opened with `libloading` on first
//! use and every symbol is resolved up front: a missing library or symbol is a [`LoadError`],
//! never a panic or a link failure, so the workspace runs its CPU tests on machines without CUDA.

mod loader;
mod names;

pub use loader::{
    Api, LIB_DIR_ENV, LibraryKind, LoadError, NCCL_LIB_DIR_ENV, cublas, cublas_lt, cuda,
    load_library, nccl, nvrtc, search_candidates,
};
pub use names::{cu_result_name, cublas_status_name, nccl_result_name, nvrtc_result_name};

/// Declares one module of bindgen output, with the lints bindgen's code cannot meet allowed.
macro_rules! generated {
    ($(#[$doc:meta])* $name:ident = $path:literal) => {
        $(#[$doc])*
        #[allow(
            non_upper_case_globals,
            non_camel_case_types,
            non_snake_case,
            dead_code,
            missing_debug_implementations,
            unsafe_op_in_unsafe_fn,
            clippy::all,
            clippy::undocumented_unsafe_blocks,
            clippy::missing_safety_doc,
            reason = "bindgen output, kept as generated"
        )]
        #[path = $path]
        pub mod $name;
    };
}

generated!(
    /// The CUDA driver API (`cuda.h`): [`driver::Cuda`] holds every resolved entry point.
    driver = "generated/driver.rs"
);
generated!(
    /// NVRTC (`nvrtc.h`): [`nvrtc::Nvrtc`].
    nvrtc = "generated/nvrtc.rs"
);
generated!(
    /// cuBLAS (`cublas_v2.h`): [`cublas::Cublas`].
    cublas = "generated/cublas.rs"
);
generated!(
    /// cuBLASLt (`cublasLt.h`): [`cublaslt::CublasLt`].
    cublaslt = "generated/cublaslt.rs"
);
generated!(
    /// NCCL (`nccl.h` of the pinned 2.28 wheel): [`nccl::Nccl`]. The library's version is not
    /// checked here (`ncclGetVersion` against [`nccl::NCCL_VERSION_CODE`] is zdevice's job).
    nccl = "generated/nccl.rs"
);

/// The README's example, compiled and run by `cargo test --doc` so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
