//! Installs pinned CUDA 13.0 pieces from PyPI into `target/cuda-toolchain/`, nothing system-wide.
//!
//! Wheels are downloaded with `pip download` and unpacked by a short Python snippet, so that the
//! large ones (cuBLAS, NVRTC) contribute only their headers: their shared libraries are hundreds
//! of MiB that neither bindgen nor nvcc needs. Each wheel leaves a marker once unpacked, so a
//! second run installs nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Result, XtaskError, io};

/// The CUDA release every pinned package belongs to.
pub const CUDA_RELEASE: &str = "13.0";

/// One pinned PyPI package.
#[derive(Debug, Clone, Copy)]
pub struct Wheel {
    /// PyPI name.
    pub name: &'static str,
    /// Exact version.
    pub version: &'static str,
    /// Unpack only `nvidia/cu13/include/` (the package's libraries are not needed).
    pub headers_only: bool,
    /// The wheel's header folder inside the prefix (`nvidia/cu13/include` for the CUDA wheels).
    pub include: &'static str,
}

const fn wheel(name: &'static str, version: &'static str, headers_only: bool) -> Wheel {
    Wheel {
        name,
        version,
        headers_only,
        include: CUDA_INCLUDE,
    }
}

/// Where the CUDA 13 wheels keep their headers, relative to [`prefix`].
const CUDA_INCLUDE: &str = "nvidia/cu13/include";

/// `cuda.h` and the runtime headers cuBLAS includes (`driver_types.h`, `cuComplex.h`...).
pub const CUDA_RUNTIME: Wheel = wheel("nvidia-cuda-runtime", "13.0.96", true);
/// `crt/host_config.h` and friends, included by the runtime headers and by nvcc.
pub const CUDA_CRT: Wheel = wheel("nvidia-cuda-crt", "13.0.88", false);
/// libcu++'s `nv/target`, which `cuda_fp16.h` (included by `cublas_api.h`) needs.
pub const CUDA_CCCL: Wheel = wheel("nvidia-cuda-cccl", "13.0.85", true);
/// `nvrtc.h`.
pub const CUDA_NVRTC: Wheel = wheel("nvidia-cuda-nvrtc", "13.0.88", true);
/// `cublas_api.h`, `cublas_v2.h`, `cublasLt.h` (newest 13.0.x).
pub const CUBLAS: Wheel = wheel("nvidia-cublas", "13.0.2.14", true);
/// `nccl.h`: the release the GPU machines' system `libnccl.so.2` carries (PyTorch's wheel
/// carries 2.28.9, newer, which the bindings accept); the bindings refuse a library older
/// than this header.
pub const NCCL: Wheel = Wheel {
    name: "nvidia-nccl-cu13",
    version: "2.28.3",
    headers_only: true,
    include: "nvidia/nccl/include",
};
/// libclang for bindgen (the wheel ships `clang/native/libclang.so`).
pub const LIBCLANG: Wheel = wheel("libclang", "18.1.1", false);
/// nvcc itself.
pub const CUDA_NVCC: Wheel = wheel("nvidia-cuda-nvcc", "13.0.88", false);
/// cicc and libdevice, which nvcc runs to produce PTX.
pub const NVVM: Wheel = wheel("nvidia-nvvm", "13.0.88", false);

/// What bindgen needs.
pub const BINDGEN_WHEELS: &[Wheel] = &[
    CUDA_RUNTIME,
    CUDA_CRT,
    CUDA_CCCL,
    CUDA_NVRTC,
    CUBLAS,
    NCCL,
    LIBCLANG,
];
/// What `nvcc -ptx` needs.
pub const NVCC_WHEELS: &[Wheel] = &[CUDA_NVCC, CUDA_CRT, NVVM, CUDA_RUNTIME];

/// The workspace root (the xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// `target/cuda-toolchain/13.0`: the prefix every wheel is unpacked into.
pub fn prefix() -> PathBuf {
    workspace_root()
        .join("target")
        .join("cuda-toolchain")
        .join(CUDA_RELEASE)
}

/// `<prefix>/nvidia/cu13`: where the CUDA wheels put `include/`, `bin/`, `nvvm/`.
pub fn cuda_home() -> PathBuf {
    prefix().join("nvidia").join("cu13")
}

/// The folder holding `w`'s headers once installed.
pub fn include_dir(w: &Wheel) -> PathBuf {
    prefix().join(w.include)
}

/// Installs every wheel in `wheels` that is not installed yet.
pub fn ensure(wheels: &[Wheel]) -> Result<()> {
    let prefix = prefix();
    let markers = prefix.join(".installed");
    std::fs::create_dir_all(&markers).map_err(io("creating", &markers))?;
    for w in wheels {
        let marker = markers.join(format!("{}-{}", w.name, w.version));
        if marker.exists() {
            continue;
        }
        eprintln!(
            "installing {}=={} into {}",
            w.name,
            w.version,
            prefix.display()
        );
        let file = download(w)?;
        unpack(&file, &prefix, w.headers_only.then_some(w.include))?;
        std::fs::write(&marker, b"").map_err(io("writing", &marker))?;
    }
    Ok(())
}

fn download(w: &Wheel) -> Result<PathBuf> {
    let dir = prefix()
        .parent()
        .map(|p| p.join("wheels"))
        .unwrap_or_else(|| prefix().join("wheels"));
    std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
    let stem = format!("{}-{}-", w.name.replace('-', "_"), w.version);
    if let Some(found) = find_wheel(&dir, &stem)? {
        return Ok(found);
    }
    let spec = format!("{}=={}", w.name, w.version);
    let mut cmd = Command::new(python());
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
    ])
    .args(["--disable-pip-version-check", "-d"])
    .arg(&dir)
    .arg(&spec);
    run(&mut cmd)?;
    find_wheel(&dir, &stem)?.ok_or_else(|| {
        XtaskError::Other(format!(
            "pip downloaded no wheel for {spec} into {}",
            dir.display()
        ))
    })
}

fn find_wheel(dir: &Path, stem: &str) -> Result<Option<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(io("listing", dir))?;
    for entry in entries {
        let path = entry.map_err(io("listing", dir))?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with(stem) && name.ends_with(".whl") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Unpacks a wheel (a zip) with Python's zipfile, restoring executable bits (nvcc, cicc), which
/// `zipfile.extractall` drops.
fn unpack(wheel: &Path, prefix: &Path, headers: Option<&str>) -> Result<()> {
    const SNIPPET: &str = r#"
import os, sys, zipfile
wheel, dest, only = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if only and not info.filename.startswith(only):
            continue
        path = z.extract(info, dest)
        mode = (info.external_attr >> 16) & 0o777
        if mode and not info.is_dir():
            os.chmod(path, mode)
"#;
    let only = headers.map(|dir| format!("{dir}/")).unwrap_or_default();
    let mut cmd = Command::new(python());
    cmd.arg("-c").arg(SNIPPET).arg(wheel).arg(prefix).arg(only);
    run(&mut cmd)
}

fn python() -> &'static str {
    "python3"
}

/// Runs a command to completion, failing with its command line if it does not succeed.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().map_err(|e| XtaskError::Command {
        command: shown.clone(),
        reason: e.to_string(),
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(XtaskError::Command {
            command: shown,
            reason: status.to_string(),
        })
    }
}

/// Runs a command and returns its standard output.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| XtaskError::Command {
        command: shown.clone(),
        reason: e.to_string(),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(XtaskError::Command {
            command: shown,
            reason: format!("{}: {stderr}", out.status),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
