//! Graph memory pools: one capture reservation shared by graphs that never run at the same
//! time, as PyTorch's `torch.cuda.graph(pool=...)` shares a private memory pool.
//!
//! A plain [`CaptureReservation`] is one graph's alone. Graphs replayed one after another,
//! such as the evaluation graphs of one set (one per chunk shape), need their intermediates
//! only during their own replay; giving each its own memory keeps the sum of them reserved,
//! where the largest one would do. A [`GraphPool`]'s members share one reservation, sized to
//! the largest member, and counted once (the arena's `graph` class and its reserved bytes
//! show the largest member, not the sum).
//!
//! # What the members promise (the types cannot check it)
//! 1. **One at a time.** Members replay one at a time, in stream order on one stream. The
//!    CUDA backend replays every graph on its one engine stream, so its graphs keep this as
//!    long as nothing replays them elsewhere.
//! 2. **Nothing left behind.** No member's output lives in the shared memory past its
//!    replay: what must outlast a replay is written into memory allocated outside the
//!    capture (persistent tensors the body reads and writes), or copied out before another
//!    member replays. The next member's replay overwrites everything else.
//!
//! # What is checked and refused (typed [`MemError`]s, nothing allocated or routed)
//! - a member capturing while another member's capture is open
//!   ([`MemError::GraphPoolMemberCapturing`]);
//! - a member captured into twice ([`MemError::GraphPoolMemberReused`]): each capture is a
//!   new member;
//! - in a pool sized up front ([`GraphPool::with_bytes`]), a member needing more than its
//!   memory while other members hold it ([`MemError::GraphPoolTooSmall`]): the memory cannot
//!   move under graphs that baked its addresses in;
//! - one pool used on two arenas ([`MemError::GraphPoolOfAnotherArena`]);
//! - a block an earlier member handed out, resolved by the arena after another member
//!   captured into the memory: `UseAfterReclaim` (its generation moved), not another
//!   member's data. Graph replays read baked-in addresses and are not affected.
//!
//! A pool made with [`GraphPool::new`] is sized by its first member. A larger member that
//! comes while members hold that memory gets new memory of its own size, which the pool then
//! hands to later members; the earlier members keep the old memory until they go (so the
//! pool holds the largest member alone when it is captured first, and never more than
//! separate reservations would). The memory is owned jointly: every member (and every block
//! issued from it) keeps it alive; the pool itself only points at it, so with no member left
//! it is given back (in stream order) and the next member reserves anew. In sanitizer mode each member gets
//! memory of its own, so that one member's stray write cannot land in another's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use zdevice::Driver;

use crate::arena::Arena;
use crate::capture::{CapturePlan, CaptureReservation, ReservationMem};
use crate::error::{MemError, MemResult};

/// A shared capture reservation for graphs that never run at the same time (see the module
/// docs for what the members promise). Cheap to clone: clones are the same pool. Reserve a
/// member with [`Arena::reserve_in_pool`] and capture into it with
/// [`Arena::capture_into`], as with a plain reservation.
#[derive(Clone, Default)]
pub struct GraphPool {
    book: Arc<Mutex<PoolBook>>,
}

/// What a pool knows: its arena, its memory (if a member holds it), its members.
#[derive(Default)]
pub(crate) struct PoolBook {
    /// The arena its memory comes from, once a member was reserved.
    arena_id: Option<u64>,
    /// The shared memory, held by the members (and their blocks), not by the pool.
    mem: Weak<ReservationMem>,
    /// Bytes to reserve at least when the memory is made.
    min_bytes: u64,
    /// Sized up front: a larger member is refused instead of given new memory.
    fixed: bool,
    /// Members alive.
    members: usize,
    next_member: u64,
    /// The member whose capture is open.
    pub(crate) capturing: Option<u64>,
}

/// A reservation's membership of a pool.
pub(crate) struct Member {
    pub(crate) pool: GraphPool,
    pub(crate) id: u64,
    /// Whether a capture has been begun into it.
    pub(crate) captured: AtomicBool,
}

impl GraphPool {
    /// An empty pool: its memory is made by its first member, at that member's size; a
    /// larger member later gets new memory (see the module docs).
    #[must_use]
    pub fn new() -> GraphPool {
        GraphPool::default()
    }

    /// An empty pool whose memory, when made, is at least `bytes`, for members whose largest
    /// is known up front but may not come first. A member needing more while members hold
    /// the memory is refused ([`MemError::GraphPoolTooSmall`]), not given more.
    #[must_use]
    pub fn with_bytes(bytes: u64) -> GraphPool {
        let pool = GraphPool::default();
        {
            let mut book = pool.lock();
            book.min_bytes = bytes;
            book.fixed = true;
        }
        pool
    }

    /// Bytes of its memory now (0 while no member holds any).
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.lock().mem.upgrade().map_or(0, |m| m.size)
    }

    /// Members alive.
    #[must_use]
    pub fn members(&self) -> usize {
        self.lock().members
    }

    fn lock(&self) -> MutexGuard<'_, PoolBook> {
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks that `member` may capture now and returns the pool's book, locked: the caller
    /// marks the capture open once the arena routes to the member.
    pub(crate) fn begin_capture(&self, member: &Member) -> MemResult<MutexGuard<'_, PoolBook>> {
        let book = self.lock();
        if let Some(other) = book.capturing {
            return Err(MemError::GraphPoolMemberCapturing { member: other });
        }
        if member.captured.load(Ordering::Acquire) {
            return Err(MemError::GraphPoolMemberReused { member: member.id });
        }
        Ok(book)
    }

    /// `member`'s capture has ended.
    pub(crate) fn capture_ended(&self, member: u64) {
        let mut book = self.lock();
        if book.capturing == Some(member) {
            book.capturing = None;
        }
    }

    /// `member` is gone.
    pub(crate) fn left(&self, member: u64) {
        let mut book = self.lock();
        book.members = book.members.saturating_sub(1);
        if book.capturing == Some(member) {
            book.capturing = None;
        }
    }
}

impl std::fmt::Debug for GraphPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let book = self.lock();
        f.debug_struct("GraphPool")
            .field("bytes", &book.mem.upgrade().map_or(0, |m| m.size))
            .field("members", &book.members)
            .field("capturing", &book.capturing)
            .finish_non_exhaustive()
    }
}

impl<D: Driver> Arena<D> {
    /// A new member of `pool` with room for `plan`: the pool's memory when it is large enough,
    /// else new memory of `plan.bytes()` (or the pool's [`GraphPool::with_bytes`], if more),
    /// which becomes the pool's. Refused during capture, while another member captures, on a
    /// pool of another arena, and, for a pool sized up front, with
    /// [`MemError::GraphPoolTooSmall`] when members hold memory smaller than the plan.
    pub fn reserve_in_pool(
        &self,
        pool: &GraphPool,
        plan: &CapturePlan,
    ) -> MemResult<CaptureReservation> {
        let sh = &self.shared;
        if sh.device.is_capturing() {
            return Err(MemError::CaptureActive {
                op: "reserving memory for a capture",
            });
        }
        let arena_id = sh.core.flags.arena_id;
        let mut book = pool.lock();
        if book.arena_id.is_some_and(|a| a != arena_id) {
            return Err(MemError::GraphPoolOfAnotherArena);
        }
        if let Some(member) = book.capturing {
            return Err(MemError::GraphPoolMemberCapturing { member });
        }
        let needed = plan.bytes();
        let mem = match book.mem.upgrade() {
            _ if sh.sanitized() => self.reserve_memory(plan)?,
            Some(mem) if mem.size >= needed => mem,
            Some(mem) if book.members > 0 && book.fixed => {
                return Err(MemError::GraphPoolTooSmall {
                    pool_bytes: mem.size,
                    needed,
                    members: book.members,
                });
            }
            held => {
                let headroom = book.min_bytes.saturating_sub(needed);
                let mem = self.reserve_memory(&plan.clone().with_headroom(headroom))?;
                if let Some(old) = held {
                    tracing::debug!(
                        target: "zmem.arena.pool",
                        old = old.size,
                        new = mem.size,
                        members = book.members,
                        "a larger member: the graph pool moves to new memory, its members keep the old"
                    );
                }
                book.mem = Arc::downgrade(&mem);
                mem
            }
        };
        book.arena_id = Some(arena_id);
        book.members += 1;
        let id = book.next_member;
        book.next_member += 1;
        tracing::debug!(
            target: "zmem.arena.pool",
            reservation = mem.id,
            bytes = mem.size,
            member = id,
            members = book.members,
            "graph pool member reserved"
        );
        drop(book);
        Ok(CaptureReservation {
            mem,
            arena_id,
            retained: Mutex::default(),
            member: Some(Member {
                pool: pool.clone(),
                id,
                captured: AtomicBool::new(false),
            }),
        })
    }
}
