//! Module loading, function lookup and kernel launches.

use std::sync::Arc;

use super::capture::{Ask, Gate};
use super::kernels::{FunctionData, ModuleData, parse_ptx};
use super::ops::Op;
use super::state::{Cx, State};
use crate::driver::{CuCode, DriverResult};
use crate::types::{Function, KernelArg, LaunchConfig, Module, Stream};

/// Limits of compute capability 9.0 that `cuLaunchKernel` enforces.
const MAX_THREADS_PER_BLOCK: u64 = 1024;
const MAX_BLOCK_Z: u32 = 64;
const MAX_SHARED_BYTES: u32 = 227 * 1024;

impl State {
    pub(crate) fn module_load_ptx(&mut self, cx: &mut Cx, ptx: &str) -> DriverResult<Module> {
        self.gate(cx, Ask::none())?;
        let info = parse_ptx(ptx).ok_or(cx.cuda(CuCode::INVALID_PTX))?;
        if info.version > self.cfg.max_ptx_isa {
            return Err(cx.cuda(CuCode::UNSUPPORTED_PTX_VERSION));
        }
        let id = self.handle();
        self.kernels.modules.insert(
            id,
            ModuleData {
                entries: info.entries,
            },
        );
        Ok(Module(id))
    }

    pub(crate) fn module_unload(&mut self, cx: &mut Cx, m: Module) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        self.kernels
            .modules
            .remove(&m.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
        self.kernels.functions.retain(|_, f| f.module != m.0);
        Ok(())
    }

    /// The entry must be in the module's PTX and have a registered closure.
    pub(crate) fn module_get_function(
        &mut self,
        cx: &mut Cx,
        m: Module,
        name: &str,
    ) -> DriverResult<Function> {
        self.gate(cx, Ask::none())?;
        let module = self
            .kernels
            .modules
            .get(&m.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
        if !module.entries.iter().any(|e| e == name) {
            return Err(cx.cuda(CuCode::NOT_FOUND));
        }
        let Some(kernel) = self.kernels.registry.get(name).cloned() else {
            tracing::debug!(name, "PTX entry has no registered simulated kernel");
            return Err(cx.cuda(CuCode::NOT_FOUND));
        };
        let id = self.handle();
        self.kernels.functions.insert(
            id,
            FunctionData {
                module: m.0,
                name: Arc::from(name),
                kernel,
            },
        );
        Ok(Function(id))
    }

    pub(crate) fn launch_kernel(
        &mut self,
        cx: &mut Cx,
        f: Function,
        config: LaunchConfig,
        args: &[KernelArg],
        s: Stream,
    ) -> DriverResult<()> {
        let func = self
            .kernels
            .functions
            .get(&f.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
        let (g, b) = (config.grid, config.block);
        let threads = u64::from(b.0) * u64::from(b.1) * u64::from(b.2);
        let bad_shape = [g.0, g.1, g.2].contains(&0)
            || threads == 0
            || threads > MAX_THREADS_PER_BLOCK
            || b.2 > MAX_BLOCK_Z
            || config.shared_mem_bytes > MAX_SHARED_BYTES;
        if bad_shape {
            return Err(cx.cuda(CuCode::INVALID_VALUE));
        }
        let op = Op::Kernel {
            name: func.name.clone(),
            kernel: func.kernel.clone(),
            config,
            args: Arc::from(args),
        };
        if self.gate(cx, Ask::on(s))? == Gate::Capture {
            self.capture_nodes(cx, vec![op]);
            return Ok(());
        }
        self.enqueue(cx, s, op).map(|_| ())
    }
}
