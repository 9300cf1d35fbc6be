//! `Block`: the cheap, cloneable handle to a piece of device memory.
//!
//! A block carries the generation of the memory it was issued from. Scratch segments move to
//! a new generation each time a step reclaims them; a block still alive at that moment is kept
//! and re-stamped, so a live handle never goes stale. A handle can only go stale when its
//! protection is switched off (the negative-control tests) or its arena is gone; resolving it
//! then fails with `UseAfterReclaim` instead of reaching another owner's bytes.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use zdevice::DevicePtr;

use crate::capture::ReservationMem;
use crate::class::AllocClass;
use crate::error::{LiveBlock, MemError};

/// Per-arena switches. Every protection has one so that its test can be shown to fail without
/// it; they are on unless a test turns them off.
#[derive(Debug)]
pub(crate) struct Flags {
    pub(crate) arena_id: u64,
    pub(crate) generation_check: AtomicBool,
    pub(crate) keep_live_scratch: AtomicBool,
    pub(crate) capture_routing: AtomicBool,
    /// Whether requests the segments cannot serve may go to the overflow pool.
    pub(crate) overflow_enabled: AtomicBool,
    /// Sanitizer mode (fixed at creation): every block is its own driver allocation.
    pub(crate) sanitize: bool,
}

/// The current generation of one piece of memory (a scratch segment, the held region, the
/// overflow pool, a capture reservation).
#[derive(Debug)]
pub(crate) struct GenCell {
    pub(crate) generation: AtomicU64,
    pub(crate) flags: Arc<Flags>,
}

impl GenCell {
    pub(crate) fn new(flags: &Arc<Flags>) -> Arc<GenCell> {
        Arc::new(GenCell {
            generation: AtomicU64::new(0),
            flags: Arc::clone(flags),
        })
    }

    pub(crate) fn current(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(crate) fn advance(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }
}

/// Where a block's memory came from, and so how it goes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A scratch segment of the arena (reclaimed by step end).
    Arena,
    /// The saved/persistent region (returned when the last handle drops).
    Held,
    /// The stream-ordered overflow pool (freed in stream order when the last handle drops).
    Overflow,
    /// A capture reservation (kept until the graph and the block are both gone).
    Reservation,
}

impl Source {
    /// Lower-case name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Source::Arena => "arena",
            Source::Held => "held",
            Source::Overflow => "overflow",
            Source::Reservation => "reservation",
        }
    }
}

/// What a dropped block hands back to its arena.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Returned {
    pub(crate) ptr: DevicePtr,
    pub(crate) size: u64,
    pub(crate) class: AllocClass,
    pub(crate) source: Source,
    /// The reservation id, for `Source::Reservation` (0 otherwise).
    pub(crate) reservation: u64,
}

/// The arena side of a block's drop, type-erased so `Block` is not generic over the driver.
pub(crate) trait Reclaim: Send + Sync {
    /// A held, overflow or reservation block's last handle is gone.
    fn give_back(&self, r: Returned);
    /// The graph that owned a reservation dropped it.
    fn graph_dropped(&self, reservation: u64);
}

/// A block's description. Address, sizes and step are atomics only so that the arena can
/// reissue a dead scratch block's allocation (its own reference is then the only one) without
/// `Arc::get_mut`'s compare-and-swap; they change only under the arena's lock, while no
/// handle other than the arena's refers to the block.
pub(crate) struct BlockInner {
    pub(crate) ptr: AtomicU64,
    pub(crate) size: AtomicU64,
    pub(crate) requested: AtomicU64,
    pub(crate) class: AllocClass,
    pub(crate) source: Source,
    pub(crate) step: AtomicU64,
    pub(crate) generation: AtomicU64,
    pub(crate) cell: Arc<GenCell>,
    /// Held and overflow blocks return their memory on drop; scratch blocks do not (step end
    /// reclaims them), graph blocks keep their reservation alive instead.
    pub(crate) owner: Option<Weak<dyn Reclaim>>,
    pub(crate) _reservation: Option<Arc<ReservationMem>>,
}

impl BlockInner {
    pub(crate) fn ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr.load(Ordering::Relaxed))
    }

    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    pub(crate) fn requested(&self) -> u64 {
        self.requested.load(Ordering::Relaxed)
    }

    pub(crate) fn step(&self) -> u64 {
        self.step.load(Ordering::Relaxed)
    }
}

impl Drop for BlockInner {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.as_ref().and_then(Weak::upgrade) {
            owner.give_back(Returned {
                ptr: self.ptr(),
                size: self.size(),
                class: self.class,
                source: self.source,
                reservation: 0,
            });
        }
    }
}

/// A handle to device memory. Clones share the memory; it is given back (or becomes
/// reclaimable, for scratch) when the last clone is dropped.
#[derive(Clone)]
pub struct Block(pub(crate) Arc<BlockInner>);

impl Block {
    /// The device address, after checking the memory has not been reclaimed under the handle.
    pub fn ptr(&self) -> Result<DevicePtr, MemError> {
        let b = &self.0;
        let current = b.cell.current();
        let issued = b.generation.load(Ordering::Acquire);
        if issued != current && b.cell.flags.generation_check.load(Ordering::Relaxed) {
            return Err(MemError::UseAfterReclaim {
                class: b.class,
                size: b.size(),
                block_generation: issued,
                memory_generation: current,
            });
        }
        Ok(b.ptr())
    }

    /// The address without the generation check: for logs and overlap checks only.
    #[must_use]
    pub fn raw_ptr(&self) -> DevicePtr {
        self.0.ptr()
    }

    /// Size in bytes (the request rounded up to 256).
    #[must_use]
    pub fn size(&self) -> u64 {
        self.0.size()
    }

    /// The size that was asked for.
    #[must_use]
    pub fn requested(&self) -> u64 {
        self.0.requested()
    }

    /// The class it was allocated as (`Graph` for anything allocated inside a capture).
    #[must_use]
    pub fn class(&self) -> AllocClass {
        self.0.class
    }

    /// Where its memory came from.
    #[must_use]
    pub fn source(&self) -> Source {
        self.0.source
    }

    /// The step that allocated it.
    #[must_use]
    pub fn step(&self) -> u64 {
        self.0.step()
    }

    /// The generation it was issued (or last re-stamped) at.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }

    /// Whether the memory is still this handle's.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.0.generation.load(Ordering::Acquire) == self.0.cell.current()
    }

    /// Whether `self` and `other` are handles to the same allocation.
    #[must_use]
    pub fn same(&self, other: &Block) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A scratch block whose memory is not this handle's (its generation is never current).
    pub(crate) fn stale_scratch(flags: &Arc<Flags>, p: &crate::arena::fast::Plain) -> Block {
        let cell = GenCell::new(flags);
        Block(Arc::new(BlockInner {
            ptr: AtomicU64::new(p.ptr),
            size: AtomicU64::new(p.size),
            requested: AtomicU64::new(p.requested),
            class: AllocClass::Scratch,
            source: Source::Arena,
            step: AtomicU64::new(p.step),
            generation: AtomicU64::new(cell.current().wrapping_sub(1)),
            cell,
            owner: None,
            _reservation: None,
        }))
    }

    pub(crate) fn arena_id(&self) -> u64 {
        self.0.cell.flags.arena_id
    }

    /// A description of the block (for logs and error lists).
    #[must_use]
    pub fn describe(&self) -> LiveBlock {
        describe(&self.0)
    }
}

pub(crate) fn describe(b: &BlockInner) -> LiveBlock {
    LiveBlock {
        class: b.class,
        size: b.size(),
        ptr: b.ptr().0,
        step: b.step(),
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("ptr", &self.0.ptr())
            .field("size", &self.0.size())
            .field("class", &self.0.class)
            .field("source", &self.0.source)
            .field("generation", &self.generation())
            .finish()
    }
}
