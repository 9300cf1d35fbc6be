//! `cargo xtask bindgen [--check]`: regenerates cuda-sys's committed bindings.
//!
//! bindgen loads libclang at run time through `LIBCLANG_PATH`, read when it first parses. Setting
//! an environment variable in-process is `unsafe` in edition 2024, so the xtask runs the generation
//! in a child copy of itself (`bindgen-inner`) with the variable set on the command instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Result, XtaskError, io};
use crate::toolchain::{
    self, BINDGEN_WHEELS, CUBLAS, CUDA_CCCL, CUDA_CRT, CUDA_NVRTC, CUDA_RUNTIME, LIBCLANG, NCCL,
    Wheel,
};

/// One generated file: a header, the library it binds and what to keep from it.
struct Binding {
    file: &'static str,
    header: &'static str,
    /// The struct bindgen generates for the dynamically loaded library.
    struct_name: &'static str,
    functions: &'static [&'static str],
    /// Types to keep even though no allowlisted function mentions them (flag enums).
    types: &'static [&'static str],
    /// `#define`d constants to keep (version numbers).
    vars: &'static [&'static str],
    /// The wheel whose include folder holds `header`, when it is not a CUDA toolkit header
    /// (its provenance is named in the file too). The CUDA include folder is searched as well.
    wheel: Option<Wheel>,
}

/// Real symbol names (cuda.h `#define`s many calls to `_v2` symbols; these are what `dlsym` finds).
const DRIVER_FUNCTIONS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamCreateWithPriority",
    "cuCtxGetStreamPriorityRange",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemAllocManaged",
    "cuMemFree_v2",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
    "cuMemAllocFromPoolAsync",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemsetD8_v2",
    "cuMemsetD32_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuMemsetD32Async",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuGraphGetNodes",
    "cuGraphDestroy",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
];

const DRIVER_TYPES: &[&str] = &[
    "cudaError_enum",
    "CUstream_flags_enum",
    "CUevent_flags_enum",
    "CUmemAttach_flags_enum",
    "CUgraphInstantiate_flags_enum",
    "CUdevice_attribute_enum",
    "CUmemAllocationType_enum",
    "CUmemLocationType_enum",
    "CUmemAllocationHandleType_enum",
    "CUmemPool_attribute_enum",
    "CUjit_option_enum",
    "CUipcMem_flags_enum",
];

const NVRTC_FUNCTIONS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTX",
    "nvrtcGetPTXSize",
    "nvrtcGetProgramLog",
    "nvrtcGetProgramLogSize",
    "nvrtcDestroyProgram",
    "nvrtcGetErrorString",
];

const CUBLAS_FUNCTIONS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSetWorkspace_v2",
    "cublasSetMathMode",
    "cublasSgemmStridedBatched",
    "cublasGemmStridedBatchedEx",
    "cublasGetVersion_v2",
];

const CUBLAS_TYPES: &[&str] = &[
    "cublasStatus_t",
    "cublasMath_t",
    "cublasOperation_t",
    "cublasComputeType_t",
    "cublasGemmAlgo_t",
    "cudaDataType_t",
];

const CUBLASLT_FUNCTIONS: &[&str] = &["cublasLtCreate", "cublasLtDestroy", "cublasLtGetVersion"];

/// NCCL: what a communicator per rank needs (init from a unique id, non-blocking, polled through
/// its asynchronous error; all-reduce and broadcast on a stream; finalize, destroy, abort).
const NCCL_FUNCTIONS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRankConfig",
    "ncclCommSplit",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommGetAsyncError",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclGetErrorString",
    "ncclGetLastError",
];

const NCCL_TYPES: &[&str] = &[
    "ncclResult_t",
    "ncclRedOp_t",
    "ncclDataType_t",
    "ncclConfig_t",
];

const NCCL_VARS: &[&str] = &[
    "NCCL_MAJOR",
    "NCCL_MINOR",
    "NCCL_PATCH",
    "NCCL_VERSION_CODE",
    "NCCL_UNIQUE_ID_BYTES",
];

const BINDINGS: &[Binding] = &[
    Binding {
        file: "driver.rs",
        header: "cuda.h",
        struct_name: "Cuda",
        functions: DRIVER_FUNCTIONS,
        types: DRIVER_TYPES,
        vars: &[],
        wheel: None,
    },
    Binding {
        file: "nvrtc.rs",
        header: "nvrtc.h",
        struct_name: "Nvrtc",
        functions: NVRTC_FUNCTIONS,
        types: &["nvrtcResult"],
        vars: &[],
        wheel: None,
    },
    Binding {
        file: "cublas.rs",
        header: "cublas_v2.h",
        struct_name: "Cublas",
        functions: CUBLAS_FUNCTIONS,
        types: CUBLAS_TYPES,
        vars: &[],
        wheel: None,
    },
    Binding {
        file: "cublaslt.rs",
        header: "cublasLt.h",
        struct_name: "CublasLt",
        functions: CUBLASLT_FUNCTIONS,
        types: &[],
        vars: &[],
        wheel: None,
    },
    Binding {
        file: "nccl.rs",
        header: "nccl.h",
        struct_name: "Nccl",
        functions: NCCL_FUNCTIONS,
        types: NCCL_TYPES,
        vars: NCCL_VARS,
        wheel: Some(NCCL),
    },
];

/// The committed output folder.
fn committed_dir() -> PathBuf {
    toolchain::workspace_root().join("crates/cuda-sys/src/generated")
}

/// Every file this command writes (the bindings plus the derived name tables).
fn outputs() -> Vec<&'static str> {
    let mut files: Vec<&'static str> = BINDINGS.iter().map(|b| b.file).collect();
    files.push("names.rs");
    files
}

/// `cargo xtask bindgen [--check]`.
pub fn run(check: bool) -> Result<()> {
    toolchain::ensure(BINDGEN_WHEELS)?;
    let libclang_dir = libclang_dir()?;
    let out = if check {
        let dir = toolchain::workspace_root().join("target/xtask-bindgen-check");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io("clearing", &dir))?;
        }
        dir
    } else {
        committed_dir()
    };
    let exe = std::env::current_exe().map_err(io("locating", "the xtask executable"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("bindgen-inner")
        .arg(&out)
        .env("LIBCLANG_PATH", &libclang_dir);
    toolchain::run(&mut cmd)?;
    if !check {
        eprintln!("wrote {}", out.display());
        return Ok(());
    }
    let mut stale = Vec::new();
    for file in outputs() {
        let fresh = std::fs::read(out.join(file)).map_err(io("reading", out.join(file)))?;
        let committed = std::fs::read(committed_dir().join(file)).unwrap_or_default();
        if fresh != committed {
            stale.push(format!("crates/cuda-sys/src/generated/{file}"));
        }
    }
    if stale.is_empty() {
        eprintln!("bindings are up to date ({} files)", outputs().len());
        Ok(())
    } else {
        Err(XtaskError::Stale(format!(
            "stale generated bindings: {} (run `cargo xtask bindgen`)",
            stale.join(", ")
        )))
    }
}

/// `LIBCLANG_PATH` when set, else the pinned wheel's `libclang.so`.
fn libclang_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("LIBCLANG_PATH") {
        return Ok(PathBuf::from(dir));
    }
    // The wheel keeps it under its `.data/platlib` folder (pip would move it to site-packages).
    let dir = toolchain::prefix().join(format!(
        "libclang-{}.data/platlib/clang/native",
        LIBCLANG.version
    ));
    if dir.join("libclang.so").exists() {
        Ok(dir)
    } else {
        Err(XtaskError::Other(format!(
            "no libclang.so in {}",
            dir.display()
        )))
    }
}

/// The child half: generates every file into `out` (libclang is on `LIBCLANG_PATH`).
pub fn inner(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(io("creating", out))?;
    let include = toolchain::cuda_home().join("include");
    let system_include = gcc_include()?;
    let mut tables = names_header();
    for binding in BINDINGS {
        let code = generate(binding, &include, &system_include)?;
        for f in binding.functions {
            if !code.contains(&format!("pub unsafe fn {f}(")) {
                return Err(XtaskError::Other(format!(
                    "{} declares no function {f}: check its #defines for the real symbol",
                    binding.header
                )));
            }
        }
        tables.push_str(&symbol_list(binding));
        std::fs::write(out.join(binding.file), &code)
            .map_err(io("writing", out.join(binding.file)))?;
        match binding.file {
            "driver.rs" => tables.push_str(&name_table(&code, "cu_result", "cudaError_enum")?),
            "nvrtc.rs" => tables.push_str(&name_table(&code, "nvrtc_result", "nvrtcResult")?),
            "cublas.rs" => tables.push_str(&name_table(&code, "cublas_status", "cublasStatus_t")?),
            "nccl.rs" => tables.push_str(&name_table(&code, "nccl_result", "ncclResult_t")?),
            _ => {}
        }
    }
    let names = out.join("names.rs");
    std::fs::write(&names, rustfmt(&tables)?).map_err(io("writing", &names))?;
    Ok(())
}

/// The first line of a generated file: the CUDA headers' provenance, and `wheel`'s when the
/// header came from another wheel.
fn provenance_of(wheel: Option<Wheel>) -> String {
    let base = provenance();
    match wheel {
        None => base,
        Some(w) => base.replacen(
            " with bindgen",
            &format!(" and {}=={} with bindgen", w.name, w.version),
            1,
        ),
    }
}

fn provenance() -> String {
    format!(
        "// @generated by `cargo xtask bindgen` from CUDA {} headers (PyPI {}=={}, {}=={}, {}=={}, \
         {}=={}, {}=={}) with bindgen 0.72 and libclang {}. Do not edit; regenerate with `cargo xtask bindgen`.",
        toolchain::CUDA_RELEASE,
        CUDA_RUNTIME.name,
        CUDA_RUNTIME.version,
        CUDA_CRT.name,
        CUDA_CRT.version,
        CUDA_CCCL.name,
        CUDA_CCCL.version,
        CUDA_NVRTC.name,
        CUDA_NVRTC.version,
        CUBLAS.name,
        CUBLAS.version,
        LIBCLANG.version,
    )
}

fn generate(binding: &Binding, include: &Path, system_include: &Path) -> Result<String> {
    let own_include = binding
        .wheel
        .map(|w| toolchain::include_dir(&w))
        .unwrap_or_else(|| include.to_path_buf());
    let header = own_include.join(binding.header);
    let mut builder = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("-I{}", own_include.display()))
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg(format!("-isystem{}", system_include.display()))
        .disable_header_comment()
        .raw_line(provenance_of(binding.wheel))
        .generate_comments(false)
        .layout_tests(false)
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .derive_default(true)
        .wrap_unsafe_ops(true)
        .dynamic_library_name(binding.struct_name)
        .dynamic_link_require_all(true)
        .allowlist_recursively(true);
    for f in binding.functions {
        builder = builder.allowlist_function(format!("^{f}$"));
    }
    for t in binding.types {
        builder = builder.allowlist_type(format!("^{t}$"));
    }
    for v in binding.vars {
        builder = builder.allowlist_var(format!("^{v}$"));
    }
    let bindings = builder
        .generate()
        .map_err(|e| XtaskError::Other(format!("bindgen failed on {}: {e}", binding.header)))?;
    let code = bindings.to_string();
    // Absolute paths would make the output depend on where the workspace lives.
    let root = toolchain::workspace_root();
    if code.contains(&*root.to_string_lossy()) {
        return Err(XtaskError::Other(format!(
            "{} output contains an absolute path",
            binding.file
        )));
    }
    Ok(code)
}

/// The C compiler's own include folder (for `stddef.h`): the pip libclang ships none.
fn gcc_include() -> Result<PathBuf> {
    let out = toolchain::output(Command::new("cc").arg("-print-file-name=include"))?;
    Ok(PathBuf::from(out.trim()))
}

fn names_header() -> String {
    format!(
        "{}\n//! Names of status codes and the symbols each library must export, derived from the \
         generated bindings.\n\n",
        provenance_of(Some(NCCL))
    )
}

fn symbol_list(binding: &Binding) -> String {
    let upper = binding.file.trim_end_matches(".rs").to_uppercase();
    let list: Vec<String> = binding.functions.iter().map(|f| format!("{f:?}")).collect();
    format!(
        "/// Every symbol `{}` resolves from its library.\npub const {upper}_SYMBOLS: &[&str] = &[{}];\n\n",
        binding.struct_name,
        list.join(", ")
    )
}

/// A `match` from value to name for every `pub const NAME: ty = VALUE;` of the enum `ty`. When two
/// names share a value the first (the header's order) wins.
fn name_table(code: &str, fn_name: &str, ty: &str) -> Result<String> {
    let marker = format!(": {ty} = ");
    let mut seen = std::collections::BTreeSet::new();
    let mut arms = String::new();
    for line in code.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("pub const ") else {
            continue;
        };
        let Some((name, value)) = rest.split_once(&marker) else {
            continue;
        };
        let value = value.trim_end_matches(';');
        let Ok(v) = value.parse::<u32>() else {
            continue;
        };
        if seen.insert(v) {
            arms.push_str(&format!("        {v} => \"{name}\",\n"));
        }
    }
    if seen.is_empty() {
        return Err(XtaskError::Other(format!(
            "no constants of type {ty} in the bindings"
        )));
    }
    Ok(format!(
        "/// The name of a `{ty}` value, or `None` for a value the 13.0 headers do not define.\n\
         pub fn {fn_name}_name(code: u32) -> Option<&'static str> {{\n    Some(match code {{\n{arms}        _ => return None,\n    }})\n}}\n\n"
    ))
}

fn rustfmt(code: &str) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2024", "--emit", "stdout"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| XtaskError::Command {
            command: "rustfmt".into(),
            reason: e.to_string(),
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(code.as_bytes())
            .map_err(|e| XtaskError::Command {
                command: "rustfmt".into(),
                reason: e.to_string(),
            })?;
    }
    let out = child.wait_with_output().map_err(|e| XtaskError::Command {
        command: "rustfmt".into(),
        reason: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(XtaskError::Command {
            command: "rustfmt".into(),
            reason: out.status.to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
