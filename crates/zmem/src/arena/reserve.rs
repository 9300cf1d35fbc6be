//! Capture reservations' memory: reserving the slots before a capture, handing blocks out of
//! them during it (no device call).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use zdevice::{DevicePtr, Driver};

use super::Shared;
use super::state::{Slot, State};
use crate::block::{Block, BlockInner};
use crate::capture::{CapturePlan, ReservationMem};
use crate::class::AllocClass;
use crate::error::{MemError, MemResult};
use crate::units::ALIGN;

impl<D: Driver> Shared<D> {
    /// Allocates a reservation's slots from the capture pool, before the capture: one shared
    /// slot of `plan.bytes()` by default; in sanitizer mode one exclusive slot per recorded
    /// request and a shared one for the headroom (or one of 256 bytes for an empty plan). On
    /// failure, the slots already allocated are given back.
    pub(crate) fn reserve_slots(&self, st: &mut State, plan: &CapturePlan) -> MemResult<Vec<Slot>> {
        let pool = match st.capture.pool {
            Some(p) => p,
            None => {
                let p = self.device.create_pool(0, u64::MAX)?;
                st.capture.pool = Some(p);
                p
            }
        };
        let mut want: Vec<(u64, bool)> = if self.sanitized() {
            plan.requests().iter().map(|&r| (r, false)).collect()
        } else {
            Vec::new()
        };
        let shared = if self.sanitized() {
            plan.headroom()
        } else {
            plan.bytes()
        };
        if shared > 0 || want.is_empty() {
            want.push((shared.max(ALIGN), true));
        }
        let mut slots = Vec::with_capacity(want.len());
        for (size, is_shared) in want {
            // A zero-byte request still gets an allocation of its own (the driver refuses 0).
            let got = self
                .device
                .alloc_from_pool(pool.pool, size.max(ALIGN), self.device.stream());
            match got {
                Ok(ptr) => slots.push(Slot {
                    ptr,
                    size,
                    used: 0,
                    shared: is_shared,
                }),
                Err(e) => {
                    for s in &slots {
                        if let Err(e) = self.device.free_async(s.ptr, self.device.stream()) {
                            tracing::warn!(target: "zmem.arena.capture", error = %e, "freeing a partial reservation failed");
                        }
                    }
                    return Err(self.map_device_error(st, AllocClass::Graph, size, e));
                }
            }
        }
        Ok(slots)
    }

    /// A graph block from the active reservation: the first free exclusive slot that fits,
    /// else bumped from a shared slot. No device call. Also the bytes it adds to the graph
    /// class: all of them, except where a graph pool's earlier member already counted them.
    pub(crate) fn alloc_reserved(
        &self,
        st: &mut State,
        res: &Arc<ReservationMem>,
        requested: u64,
        size: u64,
    ) -> MemResult<(Block, u64)> {
        let Some(info) = st.capture.reservations.get_mut(&res.id) else {
            return Err(MemError::CaptureActive {
                op: "allocating from a dropped reservation",
            });
        };
        let exclusive = info
            .slots
            .iter()
            .position(|s| !s.shared && s.used == 0 && s.size >= size);
        let pick = exclusive.or_else(|| {
            info.slots
                .iter()
                .position(|s| s.shared && s.used + size <= s.size)
        });
        let Some(i) = pick else {
            // Past the total, what is missing; within it (sanitizer mode, no slot of this
            // size left), a slot of this size.
            let short = (info.cur + size).saturating_sub(info.bytes);
            return Err(MemError::CaptureReservationExhausted {
                reservation: res.id,
                requested,
                needed_more: if short == 0 { size } else { short },
                reserved: info.bytes,
                used: info.cur,
            });
        };
        let slot = &mut info.slots[i];
        let ptr: DevicePtr = slot.ptr.offset(slot.used);
        let taken = if slot.shared { size } else { slot.size };
        slot.used += taken;
        info.cur += taken;
        let held = info.cur.saturating_sub(info.used);
        info.used = info.used.max(info.cur);
        let b = Block(Arc::new(BlockInner {
            ptr: AtomicU64::new(ptr.0),
            size: AtomicU64::new(size),
            requested: AtomicU64::new(requested),
            class: AllocClass::Graph,
            source: crate::block::Source::Reservation,
            step: AtomicU64::new(st.step_now()),
            generation: AtomicU64::new(res.cell.current()),
            cell: Arc::clone(&res.cell),
            owner: None,
            _reservation: Some(Arc::clone(res)),
        }));
        if let Some(info) = st.capture.reservations.get_mut(&res.id) {
            info.blocks.push(Arc::downgrade(&b.0));
        }
        Ok((b, held))
    }
}

/// Makes `res`'s memory ready for a graph pool member's capture: its offsets back to 0,
/// and, when an earlier member captured into it, its generation moved, so that a block an
/// earlier member handed out is refused (`UseAfterReclaim`) where the arena resolves it
/// rather than read as this member's data.
pub(crate) fn rewind_for_member(st: &mut State, res: u64) {
    let Some(info) = st.capture.reservations.get_mut(&res) else {
        return;
    };
    if info.captures > 0 {
        info.cell.advance();
    }
    info.captures += 1;
    info.cur = 0;
    for slot in &mut info.slots {
        slot.used = 0;
    }
}
