//! `CudaDriver`: the [`Driver`](crate::Driver) trait over the real CUDA driver, through `cuda-sys`.
//!
//! Handles are the driver's pointer values as `u64`. Every status is checked and becomes
//! [`DriverError::Cuda`] naming the exact CUDA symbol called (`cuMemAlloc_v2`, not `cuMemAlloc`),
//! except `CUDA_ERROR_NOT_READY` from queries, which is [`Readiness::NotReady`]. libcuda is
//! required at [`CudaDriver::load`]; cuBLAS is opened on the first `blas_*` call, so a machine
//! without cuBLAS can still use everything else.

mod args;
mod blas;
mod context;
mod copies;
mod driver_impl;
mod graphs;
mod ipc;
mod kernels;
mod lend;
mod memory;
pub mod nccl;
mod streams;

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cuda_sys::driver::{CUDA_ERROR_NOT_READY, CUDA_SUCCESS, CUresult, Cuda};

use crate::driver::{CuCode, DriverError, DriverResult};
use crate::types::{HostPtr, Readiness};

/// Bumped whenever a context may have been destroyed, so that every thread's cached "current
/// context" is re-checked (a released primary context can come back with the same address).
static CONTEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (epoch, context) last made current on this thread through any `CudaDriver`. The CUDA
    /// current context is per thread and per process, so one cache per thread suffices.
    static THREAD_CONTEXT: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// The real CUDA driver. `Send + Sync`: the driver API is thread-safe, and the state kept here
/// (the context to bind, the page-locked allocations) sits behind atomics and a mutex.
pub struct CudaDriver {
    cu: &'static Cuda,
    start: Instant,
    version: Option<u32>,
    /// The context last passed to `ctx_set_current` (0: none), made current on any thread that
    /// calls in before it issues a call that needs a context.
    context: AtomicU64,
    /// Primary contexts retained, by ordinal, so a release can forget the bound context.
    retained: Mutex<BTreeMap<u32, u64>>,
    /// Page-locked allocations: base address → length, to bound `host_read`/`host_write`.
    host: Mutex<BTreeMap<u64, usize>>,
    /// Bases of the page-locked allocations lent out right now (`lend.rs`).
    lent: Mutex<BTreeSet<u64>>,
}

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDriver")
            .field("version", &self.version)
            .field(
                "context",
                &format_args!("{:#x}", self.context.load(Ordering::Relaxed)),
            )
            .finish_non_exhaustive()
    }
}

impl CudaDriver {
    /// Opens libcuda (searching `$ZGPU_CUDA_LIB_DIR` first). Does not call `cuInit`.
    ///
    /// # Errors
    /// [`DriverError::Load`] when libcuda or one of its symbols cannot be found.
    pub fn load() -> DriverResult<CudaDriver> {
        let cu = cuda_sys::cuda()?;
        let mut version = 0i32;
        // SAFETY: the out-pointer is a live local; cuDriverGetVersion needs no initialisation.
        let version = match unsafe { cu.cuDriverGetVersion(&mut version) } {
            CUDA_SUCCESS => u32::try_from(version).ok(),
            _ => None,
        };
        tracing::debug!(?version, "CUDA driver loaded");
        Ok(CudaDriver {
            cu,
            start: Instant::now(),
            version,
            context: AtomicU64::new(0),
            retained: Mutex::new(BTreeMap::new()),
            host: Mutex::new(BTreeMap::new()),
            lent: Mutex::new(BTreeSet::new()),
        })
    }

    /// Makes the bound context current on the calling thread, unless this thread already has it.
    fn bind(&self) -> DriverResult<()> {
        let ctx = self.context.load(Ordering::Acquire);
        if ctx == 0 {
            // Nothing bound yet: the call goes ahead and the driver reports the missing context.
            return Ok(());
        }
        let epoch = CONTEXT_EPOCH.load(Ordering::Acquire);
        if THREAD_CONTEXT.with(Cell::get) == (epoch, ctx) {
            return Ok(());
        }
        // SAFETY: `ctx` came from cuDevicePrimaryCtxRetain through `ctx_set_current`; a released
        // context makes the call fail with a status, which is checked.
        check("cuCtxSetCurrent", unsafe {
            self.cu.cuCtxSetCurrent(ctx as *mut _)
        })?;
        THREAD_CONTEXT.with(|c| c.set((epoch, ctx)));
        Ok(())
    }

    /// Locks the page-locked allocation map. A poisoned lock only means another thread panicked
    /// while holding it; the map itself is always consistent, so it is used as is.
    fn host_map(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, usize>> {
        self.host
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks that `ptr..ptr+len` lies inside one live page-locked allocation of this driver.
    fn host_range(
        map: &BTreeMap<u64, usize>,
        call: &'static str,
        ptr: HostPtr,
        len: usize,
    ) -> DriverResult<*mut u8> {
        let inside = map
            .range(..=ptr.0)
            .next_back()
            .is_some_and(|(&base, &size)| {
                let end = base.checked_add(size as u64);
                let want = ptr.0.checked_add(len as u64);
                matches!((end, want), (Some(end), Some(want)) if want <= end)
            });
        if inside {
            Ok(ptr.0 as *mut u8)
        } else {
            Err(DriverError::InvalidArgument {
                call,
                reason: format!(
                    "{len} bytes at {:#x} are not inside a live cuMemAllocHost allocation",
                    ptr.0
                ),
            })
        }
    }

    /// Records a new page-locked allocation.
    fn host_insert(&self, ptr: *mut c_void, bytes: usize) {
        self.host_map().insert(ptr as u64, bytes);
    }
}

/// `Ok` for `CUDA_SUCCESS`, else the status as [`DriverError::Cuda`] naming `call`.
pub(crate) fn check(call: &'static str, status: CUresult) -> DriverResult<()> {
    if status == CUDA_SUCCESS {
        Ok(())
    } else {
        tracing::debug!(
            call,
            code = status,
            name = cuda_sys::cu_result_name(status),
            "CUDA error"
        );
        Err(DriverError::Cuda {
            call,
            code: CuCode(status),
        })
    }
}

/// A query's status: success is `Ready`, `CUDA_ERROR_NOT_READY` is `NotReady`, the rest errors.
pub(crate) fn readiness(call: &'static str, status: CUresult) -> DriverResult<Readiness> {
    match status {
        CUDA_SUCCESS => Ok(Readiness::Ready),
        CUDA_ERROR_NOT_READY => Ok(Readiness::NotReady),
        other => check(call, other).map(|()| Readiness::Ready),
    }
}

/// A byte count the caller gave as `u64`, as the `size_t` the driver takes.
pub(crate) fn size(call: &'static str, bytes: u64) -> DriverResult<usize> {
    usize::try_from(bytes).map_err(|_| DriverError::InvalidArgument {
        call,
        reason: format!("{bytes} bytes does not fit in size_t"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_named_errors() {
        assert!(check("cuInit", 0).is_ok());
        let err = check("cuMemAlloc_v2", 2).err();
        assert!(matches!(
            err,
            Some(DriverError::Cuda {
                call: "cuMemAlloc_v2",
                code: CuCode::OUT_OF_MEMORY
            })
        ));
        assert_eq!(
            readiness("cuStreamQuery", 600).ok(),
            Some(Readiness::NotReady)
        );
        assert_eq!(readiness("cuStreamQuery", 0).ok(), Some(Readiness::Ready));
        assert_eq!(
            readiness("cuEventQuery", 700)
                .err()
                .and_then(|e| e.cuda_code()),
            Some(CuCode::ILLEGAL_ADDRESS)
        );
    }

    #[test]
    fn host_ranges_are_bounded_by_their_allocation() {
        let mut map = BTreeMap::new();
        map.insert(0x1000u64, 256usize);
        let ok =
            |p: u64, n: usize| CudaDriver::host_range(&map, "host_read", HostPtr(p), n).is_ok();
        assert!(ok(0x1000, 256));
        assert!(ok(0x1010, 16));
        assert!(!ok(0x1000, 257));
        assert!(!ok(0x0fff, 1));
        assert!(!ok(0x10ff, 2));
        assert!(!ok(u64::MAX, 2));
    }

    #[test]
    fn load_without_libcuda_is_a_typed_error() {
        // On a GPU machine this loads; everywhere else it must say what it tried, not panic.
        if let Err(e) = CudaDriver::load() {
            let DriverError::Load(load) = &e else {
                panic!("expected a load error, got {e:?}")
            };
            assert!(load.to_string().contains("libcuda.so.1"), "{load}");
        }
    }

    #[test]
    fn loading_from_an_empty_folder_lists_what_was_tried() {
        let dir = std::env::temp_dir().join(format!("zgpu-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let candidates =
            cuda_sys::search_candidates(std::slice::from_ref(&dir), &["libcuda-absent.so.1"]);
        let err = cuda_sys::load_library::<Cuda>(&candidates)
            .err()
            .map(DriverError::from);
        match err {
            Some(DriverError::Load(cuda_sys::LoadError::LibraryNotFound { library, tried })) => {
                assert_eq!(library, "libcuda");
                assert!(tried[0].contains(&*dir.to_string_lossy()), "{tried:?}");
            }
            other => panic!("expected a load error, got {other:?}"),
        }
        let _ = std::fs::remove_dir(&dir);
    }
}
