//! `Scratch`: a scratch allocation borrowed from its step.
//!
//! Most scratch lives and dies inside its step, so the fast path hands out a plain value
//! (address, size, generation): no reference count, no lock. It becomes a refcounted [`Block`]
//! only when something wants one, through `Deref` (cloning it to keep the memory past the step,
//! or passing it where a `&Block` is expected): that registers the block with its segment, once,
//! and the step's end then keeps it exactly while referenced. Its own methods (`ptr`, `size`,
//! ...) never need the block.
//!
//! Not `Send` and not `Sync`: it stays on the thread of its step, whose fast path counts the
//! live plain handles without read-modify-write instructions. Its `Block` is both.

use std::cell::OnceCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use zdevice::DevicePtr;

use crate::arena::Core;
use crate::arena::fast::Plain;
use crate::block::{Block, Source};
use crate::class::AllocClass;
use crate::error::{LiveBlock, MemError};

enum Repr {
    /// From the step's window; the block is made on first deref.
    Plain(Plain, OnceCell<Block>),
    /// From the locked path (overflow, a capture reservation, a recording).
    Block(Block),
}

/// A scratch allocation borrowed from its step: the step cannot end while this lives.
/// Derefs to [`Block`]; clone that to keep memory past the step (the step's end then keeps it).
pub struct Scratch<'s> {
    repr: Repr,
    core: &'s Core,
    /// Not `Send`, not `Sync` (see the module documentation).
    _local: PhantomData<Rc<()>>,
}

impl<'s> Scratch<'s> {
    #[inline]
    pub(crate) fn plain(p: Plain, core: &'s Core) -> Scratch<'s> {
        Scratch {
            repr: Repr::Plain(p, OnceCell::new()),
            core,
            _local: PhantomData,
        }
    }

    #[inline]
    pub(crate) fn block(b: Block, core: &'s Core) -> Scratch<'s> {
        Scratch {
            repr: Repr::Block(b),
            core,
            _local: PhantomData,
        }
    }

    /// The device address, after checking the memory has not been reclaimed under the handle
    /// (as [`Block::ptr`]).
    #[inline]
    pub fn ptr(&self) -> Result<DevicePtr, MemError> {
        match &self.repr {
            Repr::Plain(p, _) => {
                let stale = !self.core.fast.is_open(p.step);
                if stale && self.core.flags.generation_check.load(Ordering::Relaxed) {
                    return Err(MemError::UseAfterReclaim {
                        class: AllocClass::Scratch,
                        size: p.size,
                        block_generation: p.generation,
                        memory_generation: self.core.generation_at(p.ptr),
                    });
                }
                Ok(DevicePtr(p.ptr))
            }
            Repr::Block(b) => b.ptr(),
        }
    }

    /// The address without the generation check: for logs and overlap checks only.
    #[must_use]
    #[inline]
    pub fn raw_ptr(&self) -> DevicePtr {
        match &self.repr {
            Repr::Plain(p, _) => DevicePtr(p.ptr),
            Repr::Block(b) => b.raw_ptr(),
        }
    }

    /// Size in bytes (the request rounded up to 256).
    #[must_use]
    #[inline]
    pub fn size(&self) -> u64 {
        match &self.repr {
            Repr::Plain(p, _) => p.size,
            Repr::Block(b) => b.size(),
        }
    }

    /// The size that was asked for.
    #[must_use]
    #[inline]
    pub fn requested(&self) -> u64 {
        match &self.repr {
            Repr::Plain(p, _) => p.requested,
            Repr::Block(b) => b.requested(),
        }
    }

    /// The class it was allocated as (`Graph` inside a capture).
    #[must_use]
    #[inline]
    pub fn class(&self) -> AllocClass {
        match &self.repr {
            Repr::Plain(..) => AllocClass::Scratch,
            Repr::Block(b) => b.class(),
        }
    }

    /// Where its memory came from.
    #[must_use]
    #[inline]
    pub fn source(&self) -> Source {
        match &self.repr {
            Repr::Plain(..) => Source::Arena,
            Repr::Block(b) => b.source(),
        }
    }

    /// The step that allocated it.
    #[must_use]
    #[inline]
    pub fn step(&self) -> u64 {
        match &self.repr {
            Repr::Plain(p, _) => p.step,
            Repr::Block(b) => b.step(),
        }
    }

    /// The generation it was issued at.
    #[must_use]
    #[inline]
    pub fn generation(&self) -> u64 {
        match &self.repr {
            Repr::Plain(p, _) => p.generation,
            Repr::Block(b) => b.generation(),
        }
    }

    /// Whether the memory is still this handle's.
    #[must_use]
    #[inline]
    pub fn is_valid(&self) -> bool {
        match &self.repr {
            Repr::Plain(p, _) => self.core.fast.is_open(p.step),
            Repr::Block(b) => b.is_valid(),
        }
    }

    /// Whether `other` is a handle to this allocation (a plain scratch has none until it is
    /// dereferenced to a [`Block`]).
    #[must_use]
    #[inline]
    pub fn same(&self, other: &Block) -> bool {
        match &self.repr {
            Repr::Plain(_, cell) => cell.get().is_some_and(|b| b.same(other)),
            Repr::Block(b) => b.same(other),
        }
    }

    /// A description of the allocation (for logs and error lists).
    #[must_use]
    #[inline]
    pub fn describe(&self) -> LiveBlock {
        match &self.repr {
            Repr::Plain(p, _) => LiveBlock {
                class: AllocClass::Scratch,
                size: p.size,
                ptr: p.ptr,
                step: p.step,
            },
            Repr::Block(b) => b.describe(),
        }
    }
}

impl Deref for Scratch<'_> {
    type Target = Block;
    /// The refcounted block; made (under the arena's lock, once) for a plain allocation.
    #[inline]
    fn deref(&self) -> &Block {
        match &self.repr {
            Repr::Plain(p, cell) => cell.get_or_init(|| self.core.materialize(p)),
            Repr::Block(b) => b,
        }
    }
}

impl Drop for Scratch<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Repr::Plain(_, cell) = &self.repr
            && cell.get().is_none()
        {
            self.core.fast.plain_gone();
        }
    }
}

impl fmt::Debug for Scratch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scratch")
            .field("ptr", &self.raw_ptr())
            .field("size", &self.size())
            .field("class", &self.class())
            .field("source", &self.source())
            .field("generation", &self.generation())
            .field("plain", &matches!(self.repr, Repr::Plain(..)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use zdevice::{Device, DeviceConfig, SimConfig, SimDriver};

    use crate::{Arena, ArenaConfig, MemError, Protection};

    fn arena() -> Arena<SimDriver> {
        let driver = SimDriver::new(SimConfig::with_capacity(64 << 20));
        let cfg = DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        };
        let dev = Device::open(driver, cfg).expect("the simulated device opens");
        let cfg = ArenaConfig {
            initial_bytes: 1 << 20,
            segment_bytes: 1 << 20,
            cap_bytes: Some(4 << 20),
            overflow_reserve_bytes: 1 << 20,
            ..ArenaConfig::default()
        };
        Arena::new(dev, cfg).expect("arena")
    }

    /// A plain scratch cannot outlive its step in safe code (it borrows the step), so its
    /// check is exercised by closing the step underneath it; the generation-check switch off
    /// is the negative control.
    #[test]
    fn a_plain_scratch_of_a_closed_step_is_refused() {
        for check in [true, false] {
            let arena = arena();
            arena.set_protection_for_tests(Protection::GenerationCheck, check);
            let step = arena.step().expect("step");
            let s = step.alloc_scratch(1000).expect("alloc");
            assert!(s.is_valid() && s.ptr().is_ok());
            arena.shared.core.fast.set_open_step(0);
            assert!(!s.is_valid());
            match s.ptr() {
                Err(MemError::UseAfterReclaim { size: 1024, .. }) => assert!(check),
                Ok(p) => assert!(!check && p == s.raw_ptr()),
                other => panic!("{other:?}"),
            }
            arena.shared.core.fast.set_open_step(step.index());
        }
    }
}
