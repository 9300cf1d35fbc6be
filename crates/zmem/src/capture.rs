//! Capture reservations: memory reserved for one graph before its capture begins, sized by a
//! recorded warm-up (or a dry run of known sizes). While a reservation is active every
//! allocation of the arena comes from it, so nothing allocates inside the capture; the graph
//! owns it until dropped, and step resets never touch it. The active reservation is carried by
//! the device's capture session (`Device::route_capture_memory`), which the allocation paths
//! read: the arena keeps no flag of its own.
//!
//! Graphs that never run at the same time can share one reservation instead, a
//! [`GraphPool`](crate::GraphPool): see `pool.rs` for what its members promise.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use zdevice::{CaptureMemory, DeviceError, DevicePtr, Driver, RoutedMemory};

use crate::arena::Arena;
use crate::arena::reserve::rewind_for_member;
use crate::arena::state::ResInfo;
use crate::block::{Block, GenCell, Reclaim, Returned, Source};
use crate::class::AllocClass;
use crate::error::{MemError, MemResult};
use crate::pool::Member;
use crate::timeline::EventKind;
use crate::units::{ALIGN, align_up};

/// The memory a graph needs: the aligned sizes of the requests a warm-up made, plus headroom.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CapturePlan {
    requests: Vec<u64>,
    headroom: u64,
}

impl CapturePlan {
    /// A dry-run plan from known request sizes (each rounded up to 256).
    #[must_use]
    pub fn from_requests(sizes: impl IntoIterator<Item = u64>) -> CapturePlan {
        let requests = sizes
            .into_iter()
            .map(|s| align_up(s).unwrap_or(u64::MAX))
            .collect();
        CapturePlan {
            requests,
            headroom: 0,
        }
    }

    /// Adds `bytes` of headroom.
    #[must_use]
    pub fn with_headroom(mut self, bytes: u64) -> CapturePlan {
        self.headroom = self.headroom.saturating_add(bytes);
        self
    }

    /// Bytes to reserve: every request (a reservation never reuses within a capture, since the
    /// graph replays all of them) plus headroom.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.requests
            .iter()
            .fold(self.headroom, |a, b| a.saturating_add(*b))
    }

    /// The headroom added to the requests.
    #[must_use]
    pub fn headroom(&self) -> u64 {
        self.headroom
    }

    /// The recorded (aligned) request sizes, in order.
    #[must_use]
    pub fn requests(&self) -> &[u64] {
        &self.requests
    }
}

/// The device memory of a reservation. Kept alive by its `CaptureReservation` and by every
/// block issued from it; given back (in stream order) when all are gone.
pub(crate) struct ReservationMem {
    pub(crate) id: u64,
    /// Its driver allocations (address, bytes): one, or one per block in sanitizer mode.
    pub(crate) allocs: Vec<(DevicePtr, u64)>,
    /// Bytes blocks may use, over all of them.
    pub(crate) size: u64,
    pub(crate) cell: Arc<GenCell>,
    owner: Weak<dyn Reclaim>,
}

impl Drop for ReservationMem {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.upgrade() {
            for &(ptr, size) in &self.allocs {
                owner.give_back(Returned {
                    ptr,
                    size,
                    class: AllocClass::Graph,
                    source: Source::Reservation,
                    reservation: self.id,
                });
            }
        }
    }
}

/// Memory reserved for one captured graph. Keep it with the graph; drop it with the graph.
/// A [`GraphPool`](crate::GraphPool) member's shares its memory with the pool's other members.
pub struct CaptureReservation {
    pub(crate) mem: Arc<ReservationMem>,
    pub(crate) arena_id: u64,
    pub(crate) retained: Mutex<Vec<Block>>,
    /// The pool it is a member of, if any.
    pub(crate) member: Option<Member>,
}

impl CaptureReservation {
    /// Its id (in the timeline and diagnostics).
    #[must_use]
    pub fn id(&self) -> u64 {
        self.mem.id
    }

    /// Bytes reserved (for a graph pool member, the pool's memory it shares).
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.mem.size
    }

    /// Whether it is a [`GraphPool`](crate::GraphPool) member.
    #[must_use]
    pub fn is_pool_member(&self) -> bool {
        self.member.is_some()
    }

    /// Keeps `block` alive for as long as the graph: use it for graph inputs allocated before
    /// the capture, whose addresses the graph bakes in.
    pub fn retain(&self, block: &Block) {
        self.retained
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(block.clone());
    }
}

impl Drop for CaptureReservation {
    fn drop(&mut self) {
        // The pool's lock before the arena's (the order everywhere).
        if let Some(member) = &self.member {
            member.pool.left(member.id);
        }
        if let Some(owner) = self.mem.owner.upgrade() {
            owner.graph_dropped(self.mem.id);
        }
    }
}

impl std::fmt::Debug for CaptureReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureReservation")
            .field("id", &self.mem.id)
            .field("bytes", &self.mem.size)
            .field("member", &self.member.as_ref().map(|m| m.id))
            .finish_non_exhaustive()
    }
}

/// While alive, every allocation of the arena comes from the reservation (the device's capture
/// session routes to it). Begin the device capture after creating it and end the capture
/// before dropping it.
pub struct CaptureScope<'a, D: Driver> {
    arena: &'a Arena<D>,
    reservation: &'a CaptureReservation,
    routed: Option<RoutedMemory<'a, D>>,
}

impl<D: Driver> CaptureScope<'_, D> {
    /// Bytes of the reservation handed out so far (by this capture, for a graph pool member).
    #[must_use]
    pub fn used(&self) -> u64 {
        let st = self.arena.shared.lock();
        st.capture
            .reservations
            .get(&self.reservation.id())
            .map_or(0, |r| r.cur)
    }
}

impl<D: Driver> Drop for CaptureScope<'_, D> {
    fn drop(&mut self) {
        let sh = &self.arena.shared;
        let ev = {
            let mut st = sh.lock();
            // Unrouted under the arena's lock, so that releasing it reopens the fast path.
            drop(self.routed.take());
            let id = self.reservation.id();
            let used = st.capture.reservations.get(&id).map_or(0, |r| r.cur);
            let at = Some(sh.device.driver().now());
            st.timeline.push(
                at,
                EventKind::CaptureEnd {
                    reservation: id,
                    used,
                },
            )
        };
        sh.publish(&[ev]);
        // After the arena's lock is released (the pool's lock is never taken under it).
        if let Some(member) = &self.reservation.member {
            member.pool.capture_ended(member.id);
        }
    }
}

impl<D: Driver> std::fmt::Debug for CaptureScope<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureScope")
            .field("reservation", self.reservation)
            .finish()
    }
}

/// Records the sizes of every allocation while alive; [`Recording::finish`] turns them into a
/// plan. Run one warm-up of the workload to be captured inside it.
pub struct Recording<'a, D: Driver> {
    arena: &'a Arena<D>,
}

impl<D: Driver> Recording<'_, D> {
    /// Stops recording and returns the plan.
    #[must_use]
    pub fn finish(self) -> CapturePlan {
        let requests = self
            .arena
            .shared
            .lock()
            .capture
            .recording
            .take()
            .unwrap_or_default();
        CapturePlan {
            requests,
            headroom: 0,
        }
    }
}

impl<D: Driver> Drop for Recording<'_, D> {
    fn drop(&mut self) {
        self.arena.shared.lock().capture.recording = None;
    }
}

impl<D: Driver> std::fmt::Debug for Recording<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recording")
    }
}

impl<D: Driver> Arena<D> {
    /// Starts recording allocation sizes (for a warm-up run).
    pub fn start_recording(&self) -> MemResult<Recording<'_, D>> {
        let mut st = self.shared.lock();
        if st.capture.recording.is_some() {
            return Err(MemError::CaptureActive {
                op: "starting a second recording",
            });
        }
        st.capture.recording = Some(Vec::new());
        Ok(Recording { arena: self })
    }

    /// Runs `warm_up` while recording and returns its result with the plan it implies.
    pub fn record_plan<R>(&self, warm_up: impl FnOnce() -> R) -> MemResult<(R, CapturePlan)> {
        let rec = self.start_recording()?;
        let r = warm_up();
        Ok((r, rec.finish()))
    }

    /// Reserves `plan.bytes()` for one graph from the arena's capture pool (stream-ordered, so
    /// giving it back never synchronises the device). Refused during capture.
    pub fn reserve_for_capture(&self, plan: &CapturePlan) -> MemResult<CaptureReservation> {
        if self.shared.device.is_capturing() {
            return Err(MemError::CaptureActive {
                op: "reserving memory for a capture",
            });
        }
        Ok(CaptureReservation {
            mem: self.reserve_memory(plan)?,
            arena_id: self.shared.core.flags.arena_id,
            retained: Mutex::default(),
            member: None,
        })
    }

    /// The memory of a new reservation of `plan.bytes()`, tracked by the arena.
    pub(crate) fn reserve_memory(&self, plan: &CapturePlan) -> MemResult<Arc<ReservationMem>> {
        let sh = &self.shared;
        let (mem, ev, size) = {
            let mut st = sh.lock();
            let slots = sh.reserve_slots(&mut st, plan)?;
            let size: u64 = slots.iter().map(|s| s.size).sum();
            let allocs = slots.iter().map(|s| (s.ptr, s.size.max(ALIGN))).collect();
            let id = st.capture.next_reservation;
            st.capture.next_reservation += 1;
            let cell = GenCell::new(&sh.core.flags);
            st.capture.reservations.insert(
                id,
                ResInfo {
                    bytes: size,
                    used: 0,
                    cur: 0,
                    captures: 0,
                    slots,
                    blocks: Vec::new(),
                    cell: Arc::clone(&cell),
                },
            );
            st.raise_reserved_peak();
            let mem = Arc::new(ReservationMem {
                id,
                allocs,
                size,
                cell,
                owner: sh.reclaimer(),
            });
            let at = Some(sh.device.driver().now());
            let ev = st.timeline.push(
                at,
                EventKind::Reserve {
                    reservation: id,
                    bytes: size,
                },
            );
            (mem, ev, size)
        };
        tracing::debug!(target: "zmem.arena.capture", id = mem.id, bytes = size, "reserved for capture");
        sh.publish(&[ev]);
        Ok(mem)
    }

    /// Routes every allocation of this arena into `reservation` until the scope is dropped.
    pub fn capture_into<'a>(
        &'a self,
        reservation: &'a CaptureReservation,
    ) -> MemResult<CaptureScope<'a, D>> {
        let sh = &self.shared;
        if reservation.arena_id != sh.core.flags.arena_id {
            return Err(MemError::ForeignBlock);
        }
        // A member's pool stays locked until the routing is in place (its lock before the
        // arena's), so two members cannot both pass the check.
        let mut pool = match &reservation.member {
            Some(member) => Some((member, member.pool.begin_capture(member)?)),
            None => None,
        };
        let (routed, ev) = {
            let mut st = sh.lock();
            let memory: CaptureMemory = Arc::clone(&reservation.mem) as CaptureMemory;
            let routed = match sh
                .device
                .route_capture_memory(sh.core.flags.arena_id, memory)
            {
                Ok(routed) => routed,
                Err(DeviceError::CaptureIllegal { .. }) => {
                    return Err(MemError::CaptureActive {
                        op: "activating a second reservation",
                    });
                }
                Err(e) => return Err(MemError::Device(e)),
            };
            if let Some((member, book)) = pool.as_mut() {
                book.capturing = Some(member.id);
                member.captured.store(true, Ordering::Release);
                rewind_for_member(&mut st, reservation.id());
            }
            let at = Some(sh.device.driver().now());
            let ev = st.timeline.push(
                at,
                EventKind::CaptureBegin {
                    reservation: reservation.id(),
                },
            );
            (routed, ev)
        };
        drop(pool);
        sh.publish(&[ev]);
        Ok(CaptureScope {
            arena: self,
            reservation,
            routed: Some(routed),
        })
    }
}
