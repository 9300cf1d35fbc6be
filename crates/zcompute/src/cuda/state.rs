//! The CUDA backend's handle and the state its clones share: the arena, the device and its
//! stream, the loaded kernels, the open step, the allocation class, what a capture collects,
//! the staging buffers; the constructor, and allocation and address resolution, on which every
//! op of the sibling modules builds.

use super::kernels::{self, Kernel};
use super::side_stream::stream::SideStream;
use super::storage::{CudaStorage, CudaTensor};
use super::support::{device_error, lock, mem_error};
use super::transfer::staging::Staging;
use crate::backend::AllocClass;
use crate::error::{ComputeError, Result};
use crate::layout::{Layout, checked_numel};
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use zdevice::{CapturePhase, Device, DevicePtr, Driver, Function, LoadedModule, Stream};
use zmem::{Arena, Block, OwnedStep};

/// The CUDA backend. Cheap to clone: clones share the arena, the stream, the loaded kernels,
/// the open step and the allocation class (a captured body holds a clone).
pub struct CudaBackend<D: Driver> {
    pub(super) inner: Arc<Inner<D>>,
}

impl<D: Driver> Clone for CudaBackend<D> {
    fn clone(&self) -> Self {
        CudaBackend {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<D: Driver> std::fmt::Debug for CudaBackend<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.inner.device.info().name)
            .field("class", &*lock(&self.inner.class))
            .field("poison", &self.inner.poison.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner<D: Driver> {
    /// One counter per column tile for the single-launch reductions' "last block" tickets
    /// (`kernels::TICKETS` of them, zeroed once; every kernel that takes a ticket leaves it at
    /// 0 again). Shared by every launch on `stream`, which runs them one after another. A
    /// device allocation of its own (16 KiB), not the arena's: it would otherwise open a
    /// persistent segment in a backend that has no other persistent tensor. Freed on drop.
    pub(super) tickets: OnceLock<DevicePtr>,
    pub(super) arena: Arena<D>,
    pub(super) device: Device<D>,
    pub(super) stream: Stream,
    pub(super) functions: Vec<Function>,
    pub(super) class: Mutex<AllocClass>,
    pub(super) step: Mutex<Option<OwnedStep<D>>>,
    pub(super) poison: AtomicBool,
    pub(super) capture_log: Mutex<Option<CaptureLog>>,
    pub(super) staging: Mutex<Staging>,
    /// The copy stream pinned batches are staged on (`PinnedHost::upload_pinned_beside`): a
    /// side stream like the all-reduce's, made at its first use, its events destroyed with it.
    pub(super) copy_lane: Mutex<Option<SideStream<D>>>,
    // Dropped last: functions above belong to these modules.
    pub(super) _modules: Vec<LoadedModule<D>>,
}

impl<D: Driver> Drop for Inner<D> {
    fn drop(&mut self) {
        if let Some(&tickets) = self.tickets.get() {
            // cuMemFree waits for the work still queued on them.
            if let Err(e) = self.device.free(tickets) {
                tracing::warn!(target: "zcompute.cuda.drop", error = %e, "freeing the tickets failed");
            }
        }
        let staging = std::mem::take(&mut *lock(&self.staging));
        staging.release(&self.device);
    }
}

/// What this backend's `capture` call collects, filed by the device session's phase: present
/// only while the call runs.
#[derive(Debug, Default)]
pub(crate) struct CaptureLog {
    /// Every tensor the warm-up run allocated, in order (weakly: the body's temporaries are
    /// freed as usual).
    pub(crate) warm_up: Vec<Weak<Block>>,
    /// What the captured run touched and made.
    pub(crate) run: Recorded,
}

/// What the captured run touched and made.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    /// Every block the captured work touched, retained by the graph's reservation so memory
    /// whose address the graph baked in stays the graph's.
    pub(crate) used: Vec<Block>,
    /// Every tensor the captured run allocated, in order (paired with the warm-up's).
    pub(crate) allocated: Vec<CudaStorage>,
}

/// The NaN pattern outputs are poisoned with (0xFFFFFFFF is a quiet NaN).
const POISON_BITS: u32 = 0xFFFF_FFFF;

impl<D: Driver> CudaBackend<D> {
    /// A backend over `arena` (and its device): loads the PTX modules once and resolves every
    /// kernel of the id table. Refused during capture. Most callers want [`crate::Engine`],
    /// which builds the device and the arena too.
    ///
    /// Over a simulated driver the kernels' Rust twins must be registered on it first
    /// ([`twins::register`](super::twins::register); `Engine::sim` does it): a simulator without them has no function
    /// under the kernels' names, and this constructor fails with the driver's `Device` error.
    pub fn new(arena: Arena<D>) -> Result<CudaBackend<D>> {
        const OP: &str = "CudaBackend::new";
        let device = arena.device().clone();
        device.bind_thread().map_err(|e| device_error(OP, e))?;
        let modules = kernels::MODULES
            .iter()
            .map(|(_, ptx)| device.load_module(ptx).map_err(|e| device_error(OP, e)))
            .collect::<Result<Vec<_>>>()?;
        let functions = Kernel::ALL
            .iter()
            .map(|k| {
                let spec = k.spec();
                modules[spec.module]
                    .function(spec.name)
                    .map_err(|e| device_error(OP, e))
            })
            .collect::<Result<Vec<_>>>()?;
        tracing::debug!(
            target: "zcompute.cuda.new",
            device = %device.info().name,
            kernels = functions.len(),
            "CUDA backend ready"
        );
        let stream = device.stream();
        let backend = CudaBackend {
            inner: Arc::new(Inner {
                tickets: OnceLock::new(),
                arena,
                device,
                stream,
                functions,
                class: Mutex::new(AllocClass::Persistent),
                step: Mutex::new(None),
                poison: AtomicBool::new(false),
                capture_log: Mutex::new(None),
                staging: Mutex::new(Staging::default()),
                copy_lane: Mutex::new(None),
                _modules: modules,
            }),
        };
        backend.make_tickets()?;
        Ok(backend)
    }

    /// Allocates and zeroes the tickets (they live as long as the backend).
    fn make_tickets(&self) -> Result<()> {
        const OP: &str = "CudaBackend::new";
        let device = &self.inner.device;
        let p = device
            .alloc(kernels::TICKETS as u64 * 4)
            .map_err(|e| device_error(OP, e))?;
        // Set before anything can fail, so drop frees them.
        let _ = self.inner.tickets.set(p);
        // On the engine stream, as all of the backend's work (none on the legacy default
        // stream; see `PeerExchange::new`), and waited for before any kernel takes a ticket.
        device
            .memset_d32_async(p, 0, kernels::TICKETS as u64, self.inner.stream)
            .and_then(|()| device.synchronize(self.inner.stream))
            .map_err(|e| device_error(OP, e))
    }

    /// The tickets' address (see `Inner::tickets`; always there once `new` returned).
    pub(crate) fn tickets(&self) -> Option<DevicePtr> {
        self.inner.tickets.get().copied()
    }

    /// The arena the backend allocates from.
    #[must_use]
    pub fn arena(&self) -> &Arena<D> {
        &self.inner.arena
    }

    /// The device underneath.
    #[must_use]
    pub fn device(&self) -> &Device<D> {
        &self.inner.device
    }

    /// When on, every op fills its fresh outputs with NaN before computing them, so an element
    /// an op forgets to write shows up as NaN (the tests run with it on).
    pub fn set_poison(&self, on: bool) {
        self.inner.poison.store(on, Ordering::Relaxed);
    }

    /// TF32 tensor-op math for matrix products (`false`, the default: strict float32).
    pub fn set_tf32(&self, on: bool) -> Result<()> {
        self.inner
            .device
            .set_tf32(on)
            .map_err(|e| device_error("set_tf32", e))
    }

    /// Whether a capture is under way on the device (a warm-up, a routed reservation or a
    /// capturing stream): uploads, downloads, syncs and step changes are refused then.
    pub(crate) fn capturing(&self) -> bool {
        self.inner.device.capture_phase() != CapturePhase::Idle
    }

    /// Whether the captured run is on: allocations come from the routed reservation.
    fn recording_graph(&self) -> bool {
        matches!(
            self.inner.device.capture_phase(),
            CapturePhase::Reserved | CapturePhase::Capturing
        )
    }

    /// A fresh dense tensor of `shape` in the current allocation class (poisoned if asked).
    pub(crate) fn alloc(&self, op: &'static str, shape: &[usize]) -> Result<CudaTensor> {
        let class = *lock(&self.inner.class);
        self.alloc_in(op, shape, Some(class))
    }

    /// A fresh dense temporary (held memory, returned when dropped; the reservation while
    /// capturing).
    pub(crate) fn alloc_temp(&self, op: &'static str, shape: &[usize]) -> Result<CudaTensor> {
        self.alloc_in(op, shape, None)
    }

    fn alloc_in(
        &self,
        op: &'static str,
        shape: &[usize],
        class: Option<AllocClass>,
    ) -> Result<CudaTensor> {
        let n = checked_numel(op, shape)?;
        let bytes = (n.max(1) as u64)
            .checked_mul(4)
            .ok_or_else(|| ComputeError::SizeOverflow {
                op,
                shape: shape.into(),
            })?;
        let arena = &self.inner.arena;
        let block = if self.recording_graph() {
            // Routed to the active capture reservation whatever the class.
            arena.alloc_saved(bytes)
        } else {
            match class {
                None | Some(AllocClass::Saved) => arena.alloc_saved(bytes),
                Some(AllocClass::Persistent) => arena.alloc_persistent(bytes),
                Some(AllocClass::Shadow) => arena.alloc_shadow(bytes),
                Some(AllocClass::Scratch) => match lock(&self.inner.step).as_ref() {
                    Some(step) => step.alloc_scratch(bytes),
                    None => return Err(ComputeError::NoOpenStep { op }),
                },
                Some(AllocClass::Graph) => {
                    return Err(ComputeError::Unsupported {
                        op,
                        reason: "graph memory is issued only inside capture; choose scratch, saved or persistent".into(),
                    });
                }
            }
        }
        .map_err(|e| mem_error(op, e))?;
        let t = Tensor::from_parts(CudaStorage::new(block, n), Layout::contiguous(shape))?;
        if let Some(log) = lock(&self.inner.capture_log).as_mut() {
            match self.inner.device.capture_phase() {
                CapturePhase::Idle => {}
                CapturePhase::WarmUp => log.warm_up.push(Arc::downgrade(t.storage().shared())),
                CapturePhase::Reserved | CapturePhase::Capturing => {
                    log.run.allocated.push(t.storage().clone());
                }
            }
        }
        if n > 0 && self.inner.poison.load(Ordering::Relaxed) {
            let p = self.ptr(op, &t)?;
            self.inner
                .device
                .memset_d32_async(p, POISON_BITS, n as u64, self.inner.stream)
                .map_err(|e| device_error(op, e))?;
        }
        Ok(t)
    }

    /// The address of `t`'s first element for a library that works on the engine stream
    /// outside the op set (NCCL collectives): zmem's generation check first, and while
    /// capturing, the block is recorded so the graph keeps the memory it baked in.
    pub fn device_ptr(&self, op: &'static str, t: &CudaTensor) -> Result<DevicePtr> {
        self.ptr(op, t)
    }

    /// The address of `t`'s first element, after zmem's generation check. While capturing, the
    /// block is recorded so the graph keeps it.
    pub(crate) fn ptr(&self, op: &'static str, t: &CudaTensor) -> Result<DevicePtr> {
        let block = t.storage().block();
        let base = self
            .inner
            .arena
            .resolve(block)
            .map_err(|e| mem_error(op, e))?;
        if self.recording_graph()
            && let Some(log) = lock(&self.inner.capture_log).as_mut()
            && !log.run.used.iter().any(|b| b.same(block))
        {
            log.run.used.push(block.clone());
        }
        Ok(base.offset(t.layout().offset() as u64 * 4))
    }
}
