//! Kernels as Rust closures, PTX modules reduced to their entry names, and the built-in kernels
//! of `kernels/fill.cu`.
//!
//! A PTX module loads if it parses as far as the simulator looks (a `.version` line it supports
//! and at least one `.entry`); a function resolves only if its entry is in the module and a
//! closure of that name is registered, so a kernel the simulator cannot run is a load-time
//! `CUDA_ERROR_NOT_FOUND` rather than a silent no-op.

use std::collections::HashMap;
use std::sync::Arc;

use super::access::{KernelArgs, KernelFault, SimMemory};
use crate::types::{KernelArg, LaunchConfig};

/// A simulated kernel: sees only its launch configuration, its arguments and checked memory.
pub type KernelFn = dyn Fn(&LaunchConfig, &[KernelArg], &mut SimMemory<'_>) -> Result<(), KernelFault>
    + Send
    + Sync;

/// PTX declaring the built-in kernels, for tests that load a module without the build step.
pub const BUILTIN_PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64

.visible .entry fill_f32(
\t.param .u64 fill_f32_param_0,
\t.param .f32 fill_f32_param_1,
\t.param .u64 fill_f32_param_2
)
{
\tret;
}

.visible .entry axpy_f32(
\t.param .u64 axpy_f32_param_0,
\t.param .u64 axpy_f32_param_1,
\t.param .f32 axpy_f32_param_2,
\t.param .u64 axpy_f32_param_3
)
{
\tret;
}
";

/// What `cuModuleLoadData` makes of a PTX text.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PtxInfo {
    pub version: (u32, u32),
    pub entries: Vec<String>,
}

/// Reads the `.version` and the `.entry` names; None when either is missing (invalid PTX).
pub(crate) fn parse_ptx(ptx: &str) -> Option<PtxInfo> {
    let version = ptx.lines().find_map(|line| {
        let rest = line.trim().strip_prefix(".version")?;
        let (major, minor) = rest.trim().split_once('.')?;
        Some((major.trim().parse().ok()?, minor.trim().parse().ok()?))
    })?;
    let mut entries = Vec::new();
    let mut rest = ptx;
    while let Some(at) = rest.find(".entry") {
        rest = &rest[at + ".entry".len()..];
        // `.entry` must be a whole directive, followed by whitespace, the name, then `(`.
        if !rest.starts_with(char::is_whitespace) {
            continue;
        }
        let after = rest.trim_start();
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
            .unwrap_or(after.len());
        let (name, tail) = after.split_at(end);
        if !name.is_empty() && tail.trim_start().starts_with('(') {
            entries.push(name.to_string());
        }
    }
    (!entries.is_empty()).then_some(PtxInfo { version, entries })
}

#[derive(Debug)]
pub(crate) struct ModuleData {
    pub entries: Vec<String>,
}

pub(crate) struct FunctionData {
    pub module: u64,
    pub name: Arc<str>,
    pub kernel: Arc<KernelFn>,
}

/// Registered closures, loaded modules and resolved functions.
#[derive(Default)]
pub(crate) struct Kernels {
    pub registry: HashMap<String, Arc<KernelFn>>,
    pub modules: HashMap<u64, ModuleData>,
    pub functions: HashMap<u64, FunctionData>,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.registry.keys().collect();
        names.sort();
        f.debug_struct("Kernels")
            .field("registered", &names)
            .field("modules", &self.modules.len())
            .field("functions", &self.functions.len())
            .finish()
    }
}

impl Kernels {
    /// The registry with the built-in kernels.
    pub(crate) fn with_builtins() -> Self {
        let mut k = Kernels::default();
        k.registry.insert("fill_f32".into(), Arc::new(fill_f32));
        k.registry.insert("axpy_f32".into(), Arc::new(axpy_f32));
        k
    }
}

/// `fill_f32(float* out, float value, unsigned long long n)`: `out[i] = value` for `i < n`.
///
/// Written as the grid-stride loop of `kernels/fill.cu`: every element is covered whatever the
/// grid, so the launch configuration is not consulted.
pub fn fill_f32(
    _config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let a = KernelArgs(args);
    let (out, value, n) = (a.ptr(0)?, a.f32(1)?, a.u64(2)?);
    mem.fill_f32(out, value, n)
}

/// `axpy_f32(float* y, const float* x, float a, unsigned long long n)`: `y[i] = a * x[i] + y[i]`,
/// as one fused multiply-add (what nvcc emits for this expression by default).
pub fn axpy_f32(
    _config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let a = KernelArgs(args);
    let (y, x, alpha, n) = (a.ptr(0)?, a.ptr(1)?, a.f32(2)?, a.u64(3)?);
    let xs = mem.read_f32(x, n)?;
    let mut ys = mem.read_f32(y, n)?;
    for (yi, xi) in ys.iter_mut().zip(&xs) {
        *yi = alpha.mul_add(*xi, *yi);
    }
    mem.write_f32(y, &ys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_builtin_ptx() {
        let info = parse_ptx(BUILTIN_PTX).expect("valid");
        assert_eq!(info.version, (8, 0));
        assert_eq!(info.entries, ["fill_f32", "axpy_f32"]);
    }

    #[test]
    fn rejects_ptx_without_entries_or_version() {
        assert_eq!(parse_ptx(""), None);
        assert_eq!(parse_ptx(".version 8.0\n.target sm_90\n"), None);
        assert_eq!(parse_ptx(".entry f(\n"), None);
        let info = parse_ptx(".version 9.1\n.entry\n  k_2 (").expect("valid");
        assert_eq!(info.entries, ["k_2"]);
        assert_eq!(info.version, (9, 1));
    }
}
