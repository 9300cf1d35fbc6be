//! [`AsyncStall::SpinKernel`]: the kernel of `kernels/spin.cu`, loaded once per context and
//! queued on a stalled call's stream.

use std::sync::MutexGuard;
use std::time::Duration;

use super::{AsyncStall, FaultyDriver};
use crate::driver::Driver;
use crate::types::{Function, KernelArg, LaunchConfig, Module, Stream};

impl<D: Driver> FaultyDriver<D> {
    /// Queues the spinning kernel for `d` on `stream`, when that is how stalls are made and
    /// the kernel is loaded; false when the stall must be emulated instead.
    pub(super) fn spin_on(&self, stream: u64, d: Duration) -> bool {
        if self.ctl.lock().async_stall != AsyncStall::SpinKernel {
            return false;
        }
        let Some((_, function)) = *self.spin_lock() else {
            return false;
        };
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let config = LaunchConfig {
            grid: (1, 1, 1),
            block: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [KernelArg::U64(nanos)];
        // SAFETY: `spin_ns(unsigned long long)` takes exactly this one argument and touches
        // no memory; `function` was resolved from its module, which stays loaded until the
        // context is released.
        let launched = unsafe {
            self.inner
                .launch_kernel(function, config, &args, Stream(stream))
        };
        launched.is_ok()
    }

    fn spin_lock(&self) -> MutexGuard<'_, Option<(Module, Function)>> {
        self.spin
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Loads the spinning kernel into the context just made current, if stalls use it and it
    /// is not loaded yet (a failure leaves stalls emulated).
    pub(super) fn load_spin(&self) {
        if self.ctl.lock().async_stall != AsyncStall::SpinKernel {
            return;
        }
        let mut spin = self.spin_lock();
        if spin.is_some() {
            return;
        }
        let Ok(module) = self.inner.module_load_ptx(crate::kernels::SPIN_PTX) else {
            return;
        };
        match self
            .inner
            .module_get_function(module, crate::kernels::SPIN_NS)
        {
            Ok(function) => *spin = Some((module, function)),
            Err(_) => {
                let _ = self.inner.module_unload(module);
            }
        }
    }

    /// Unloads the spinning kernel before its context goes.
    pub(super) fn unload_spin(&self) {
        if let Some((module, _)) = self.spin_lock().take() {
            let _ = self.inner.module_unload(module);
        }
    }
}
