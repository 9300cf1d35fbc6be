//! `cargo xtask build-kernels [--check]`: `kernels/*.cu` → committed `kernels/ptx/<stem>.ptx`.
//!
//! PTX for `compute_80` is JIT-compiled by the driver on Ampere, Hopper and Blackwell. The output
//! must be byte-for-byte reproducible, so: one pinned nvcc (a different nvcc on PATH is ignored,
//! its banner differs), no `-lineinfo`/`-G` (they embed file paths), and sources are compiled
//! from the kernels folder by relative name. The result is checked for absolute paths anyway.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Result, XtaskError, io};
use crate::toolchain::{self, CUDA_NVCC, NVCC_WHEELS};

/// The virtual architecture every kernel is built for.
const ARCH: &str = "compute_80";

/// `cargo xtask build-kernels [--check]`.
pub fn run(check: bool) -> Result<()> {
    let root = toolchain::workspace_root();
    let kernels = root.join("kernels");
    let committed = kernels.join("ptx");
    let sources = sources(&kernels)?;
    if sources.is_empty() {
        // An xtask built from another checkout (its workspace root is compiled in) would
        // otherwise "check" an absent folder and pass.
        return Err(XtaskError::Other(format!(
            "no kernels/*.cu under {}; is this xtask built from this checkout?",
            root.display()
        )));
    }
    let nvcc = nvcc()?;
    let out = if check {
        root.join("target/xtask-kernels-check")
    } else {
        committed.clone()
    };
    if check && out.exists() {
        std::fs::remove_dir_all(&out).map_err(io("clearing", &out))?;
    }
    std::fs::create_dir_all(&out).map_err(io("creating", &out))?;
    for stem in &sources {
        compile(&nvcc, &kernels, stem, &out)?;
    }
    if !check {
        eprintln!(
            "compiled {} kernel file(s) into {}",
            sources.len(),
            out.display()
        );
        return Ok(());
    }
    let mut problems = Vec::new();
    for stem in &sources {
        let name = format!("{stem}.ptx");
        let fresh = std::fs::read(out.join(&name)).map_err(io("reading", out.join(&name)))?;
        match std::fs::read(committed.join(&name)) {
            Ok(old) if old == fresh => {}
            Ok(_) => problems.push(format!("kernels/ptx/{name} is stale")),
            Err(_) => problems.push(format!("kernels/ptx/{name} is missing")),
        }
    }
    for ptx in list(&committed, "ptx")? {
        if !sources.contains(&ptx) {
            problems.push(format!("kernels/ptx/{ptx}.ptx has no kernels/{ptx}.cu"));
        }
    }
    if problems.is_empty() {
        eprintln!("{} PTX file(s) up to date", sources.len());
        Ok(())
    } else {
        Err(XtaskError::Stale(format!(
            "{} (run `cargo xtask build-kernels`)",
            problems.join("; ")
        )))
    }
}

/// Stems of `kernels/*.cu`, sorted.
fn sources(kernels: &Path) -> Result<Vec<String>> {
    list(kernels, "cu")
}

/// Stems of the files in `dir` with extension `ext`, sorted; an absent folder has none.
fn list(dir: &Path, ext: &str) -> Result<Vec<String>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut stems = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("listing", dir))? {
        let path = entry.map_err(io("listing", dir))?.path();
        if path.extension().and_then(|e| e.to_str()) == Some(ext)
            && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
        {
            stems.push(stem.to_string());
        }
    }
    stems.sort();
    Ok(stems)
}

/// The pinned nvcc: the one on PATH if it is that exact release, else installed from PyPI.
fn nvcc() -> Result<PathBuf> {
    let wanted = format!("V{}", CUDA_NVCC.version);
    if let Ok(version) = toolchain::output(Command::new("nvcc").arg("--version")) {
        if version.contains(&wanted) {
            return Ok(PathBuf::from("nvcc"));
        }
        eprintln!("note: nvcc on PATH is not {wanted}; using the pinned one");
    }
    toolchain::ensure(NVCC_WHEELS)?;
    Ok(toolchain::cuda_home().join("bin").join("nvcc"))
}

fn compile(nvcc: &Path, kernels: &Path, stem: &str, out: &Path) -> Result<()> {
    let ptx = out.join(format!("{stem}.ptx"));
    let mut cmd = Command::new(nvcc);
    cmd.current_dir(kernels)
        .args(["-ptx", &format!("-arch={ARCH}"), "-o"])
        .arg(&ptx)
        .arg(format!("{stem}.cu"));
    toolchain::run(&mut cmd)?;
    let text = std::fs::read_to_string(&ptx).map_err(io("reading", &ptx))?;
    let root = toolchain::workspace_root();
    if text.contains(&*root.to_string_lossy()) || text.contains("/tmp/") {
        return Err(XtaskError::Other(format!(
            "{} contains an absolute path; the PTX would not be reproducible",
            ptx.display()
        )));
    }
    Ok(())
}
