//! zmem's one error type. Each variant says what the caller can do about it.

use std::time::Duration;

use zdevice::DeviceError;

use crate::class::AllocClass;
use crate::diag::Diagnostics;
use crate::units::Bytes;

/// A block that was still alive when something needed it gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Its class.
    pub class: AllocClass,
    /// Its (aligned) size in bytes.
    pub size: u64,
    /// Its device address.
    pub ptr: u64,
    /// The step that allocated it.
    pub step: u64,
}

impl std::fmt::Display for LiveBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} at {:#x} (step {})",
            self.class,
            Bytes(self.size),
            self.ptr,
            self.step
        )
    }
}

fn list(alive: &[LiveBlock]) -> String {
    let shown: Vec<String> = alive.iter().take(8).map(ToString::to_string).collect();
    let more = alive.len().saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// What a zmem call can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemError {
    /// Neither the arena (at its cap) nor the overflow pool could serve the request now.
    /// Freeing memory, ending a step, raising `ZMEM_ARENA_CAP_BYTES` or
    /// `ZMEM_OVERFLOW_RESERVE_BYTES` may help; the diagnostics say what filled the arena.
    #[error("out of memory for a {class} request of {}: {diagnostics}", Bytes(*.requested))]
    OutOfMemory {
        /// Bytes requested.
        requested: u64,
        /// Class of the request.
        class: AllocClass,
        /// The arena's state when it failed.
        diagnostics: Box<Diagnostics>,
        /// The device's own error, when there was one.
        #[source]
        device: Option<DeviceError>,
    },
    /// The request can never be served, whatever is freed: split it.
    #[error("a {class} request of {} can never fit: {why}", Bytes(*.requested))]
    TooLarge {
        /// Bytes requested.
        requested: u64,
        /// Class of the request.
        class: AllocClass,
        /// The limit it exceeds.
        why: String,
        /// The device's own refusal, when the limit is the device's capacity (checked before
        /// any driver call, or answered by the driver).
        #[source]
        device: Option<DeviceError>,
    },
    /// The handle's memory was reclaimed (its step ended with the handle's protection removed,
    /// or its arena was dropped): the handle is stale and must not be used. This is a bug in
    /// the caller's lifetimes, caught before the GPU read garbage.
    #[error(
        "use after reclaim: {class} block of {} (generation {block_generation}, memory now at {memory_generation})",
        Bytes(*.size)
    )]
    UseAfterReclaim {
        /// Class of the stale handle.
        class: AllocClass,
        /// Its size.
        size: u64,
        /// The generation the handle was issued at.
        block_generation: u64,
        /// The memory's current generation.
        memory_generation: u64,
    },
    /// A request inside a capture did not fit the graph's reservation: the capture must be
    /// abandoned, and the reservation made at least `needed_more` bytes larger (record the
    /// plan again, or add headroom).
    #[error(
        "capture reservation {reservation} exhausted: a request of {} needs {} more ({} of {} used)",
        Bytes(*.requested), Bytes(*.needed_more), Bytes(*.used), Bytes(*.reserved)
    )]
    CaptureReservationExhausted {
        /// The reservation's id.
        reservation: u64,
        /// The request that did not fit.
        requested: u64,
        /// Bytes missing for this request.
        needed_more: u64,
        /// The reservation's size.
        reserved: u64,
        /// Bytes already handed out from it.
        used: u64,
    },
    /// A member of a graph pool sized up front (`GraphPool::with_bytes`) needs more memory
    /// than the pool holds, and other members' graphs hold it (their addresses are baked in,
    /// so it cannot grow). Size the pool with at least `needed`, capture the largest member
    /// first, or drop the members' graphs so that the next member sizes the memory anew.
    /// Nothing was allocated.
    #[error(
        "the graph pool was sized to {} and a member needs {}, while {members} member(s) hold it: size the pool with at least that, capture the largest member first, or drop its members first",
        Bytes(*.pool_bytes), Bytes(*.needed)
    )]
    GraphPoolTooSmall {
        /// Bytes of the pool's memory.
        pool_bytes: u64,
        /// Bytes the new member's plan needs.
        needed: u64,
        /// Members holding the memory.
        members: usize,
    },
    /// Another member of the graph pool is capturing: its members share memory, so they
    /// capture (and replay) one at a time. End that capture (drop its `CaptureScope`) first.
    #[error(
        "member {member} of this graph pool is capturing; members capture one at a time: end its capture first"
    )]
    GraphPoolMemberCapturing {
        /// The member whose capture is open.
        member: u64,
    },
    /// This graph pool member was captured into already: every capture needs a new member
    /// (`Arena::reserve_in_pool`), since a new capture into the shared memory would rewrite
    /// what the earlier one's graph uses.
    #[error(
        "graph pool member {member} was captured into already; reserve a new member for each capture"
    )]
    GraphPoolMemberReused {
        /// The member.
        member: u64,
    },
    /// The graph pool's memory comes from another arena: use one pool per arena (per device).
    #[error("the graph pool belongs to another arena; make one pool per arena")]
    GraphPoolOfAnotherArena,
    /// A stream is capturing but no capture reservation is active on this arena: allocating
    /// now would either be illegal in the graph or hand the graph memory a step reset will
    /// reuse. Capture through the one entry point that activates a reservation.
    #[error(
        "a {class} allocation of {} was attempted while a stream captures and no capture reservation is active",
        Bytes(*.requested)
    )]
    AllocationDuringCapture {
        /// Class of the request.
        class: AllocClass,
        /// Bytes requested.
        requested: u64,
    },
    /// The operation is not allowed while a capture (or capture reservation) is active;
    /// do it before or after the capture.
    #[error("{op} is not allowed while a capture is active")]
    CaptureActive {
        /// What was refused.
        op: &'static str,
    },
    /// The overflow pool did not answer within the device's allocation deadline. The device
    /// is lost afterwards (the driver call may never return); the diagnostics say why the arena
    /// had overflowed.
    #[error("the overflow pool did not answer within {deadline:?}: {diagnostics}")]
    Timeout {
        /// The deadline.
        deadline: Duration,
        /// The arena's state when it gave up.
        diagnostics: Box<Diagnostics>,
        /// The device's timeout (what was waited for, and how long).
        #[source]
        device: DeviceError,
    },
    /// [`Step::end_strict`](crate::Step::end_strict) found scratch blocks still referenced. The
    /// step has ended and exactly these blocks were kept; drop them, or allocate them as
    /// `saved` if they are meant to outlive the step.
    #[error("step {step} ended with {} live scratch block(s), kept: {}", .alive.len(), list(.alive))]
    LiveScratchAtStepEnd {
        /// The step.
        step: u64,
        /// What is still alive.
        alive: Vec<LiveBlock>,
    },
    /// Only one step may be open on an arena at a time: end the open one first.
    #[error("step {open} is still open on this arena; end it before starting another")]
    StepAlreadyOpen {
        /// The open step.
        open: u64,
    },
    /// Scratch memory is issued only inside a step: open one ([`Arena::step`](crate::Arena::step)
    /// or [`Arena::step_owned`](crate::Arena::step_owned)) first.
    #[error("scratch allocation of {requested} bytes with no step open; open a step first")]
    NoOpenStep {
        /// Bytes asked for.
        requested: u64,
    },
    /// The block belongs to a different arena.
    #[error("the block was issued by another arena")]
    ForeignBlock,
    /// A configuration value (from the environment or the API) is malformed.
    #[error("bad configuration {var}={value}: {reason}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// An arena setting the arena would not honour exactly (`ArenaOverrides::resolve`):
    /// `name` is how the caller spelled it (its variable, or the override's label), `reason`
    /// the valid range. Nothing was allocated; change the setting.
    #[error("{name} {value}: {reason}")]
    Setting {
        /// The setting.
        setting: crate::overrides::ArenaSetting,
        /// How the caller spelled it.
        name: &'static str,
        /// Its value.
        value: String,
        /// Its valid range.
        reason: String,
    },
    /// The device failed in a way zmem cannot interpret (for example `DeviceLost`); the device
    /// error (the source) says what to do.
    #[error("a device call failed")]
    Device(#[from] DeviceError),
}

impl MemError {
    /// Whether the memory was not available now but the request fits: ending steps, dropping
    /// blocks or raising the arena cap / overflow reserve may let a retry succeed.
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, MemError::OutOfMemory { .. })
    }

    /// Whether the request can never be served (it exceeds the device or the arena's limit).
    #[must_use]
    pub fn is_too_large(&self) -> bool {
        matches!(self, MemError::TooLarge { .. })
    }

    /// Whether a capture's reservation ran out (record the plan again, or add headroom).
    #[must_use]
    pub fn is_capture_reservation_exhausted(&self) -> bool {
        matches!(self, MemError::CaptureReservationExhausted { .. })
    }

    /// The device's error under this one, if the device reported one.
    #[must_use]
    pub fn device_error(&self) -> Option<&DeviceError> {
        match self {
            MemError::OutOfMemory { device, .. } | MemError::TooLarge { device, .. } => {
                device.as_ref()
            }
            MemError::Timeout { device, .. } | MemError::Device(device) => Some(device),
            _ => None,
        }
    }
}

/// Result of a zmem call.
pub type MemResult<T> = Result<T, MemError>;
