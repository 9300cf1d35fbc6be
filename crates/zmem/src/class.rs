//! Allocation classes: how long a block's memory lives, and who gives it back.

use std::fmt;

/// How long a block lives. Reclaiming a step only ever touches `Scratch` memory that no live
/// handle refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllocClass {
    /// Lives within one step; reclaimed at the step's end unless a handle is still alive.
    Scratch,
    /// Saved for backward: lives until its last handle (the tape's) is dropped.
    Saved,
    /// Parameters, gradients, optimiser state: lives until its last handle is dropped.
    Persistent,
    /// Owned by a captured graph: comes from the graph's capture reservation and lives until
    /// both the graph and the block are dropped.
    Graph,
    /// Reduced-precision copies of persistent tensors (a bf16 step's copy of the weights its
    /// products read, refreshed every step): lives as persistent memory does, counted apart so
    /// a plan and a report show what mixed precision adds.
    Shadow,
}

impl AllocClass {
    /// Every class, in index order.
    pub const ALL: [AllocClass; 5] = [
        AllocClass::Scratch,
        AllocClass::Saved,
        AllocClass::Persistent,
        AllocClass::Graph,
        AllocClass::Shadow,
    ];

    /// Lower-case name, as used in logs and JSON.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            AllocClass::Scratch => "scratch",
            AllocClass::Saved => "saved",
            AllocClass::Persistent => "persistent",
            AllocClass::Graph => "graph",
            AllocClass::Shadow => "shadow",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for AllocClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes per class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassBytes(pub [u64; 5]);

impl ClassBytes {
    /// Bytes of `class`.
    #[must_use]
    pub fn get(&self, class: AllocClass) -> u64 {
        self.0[class.index()]
    }

    /// Sum over all classes.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub(crate) fn add(&mut self, class: AllocClass, bytes: u64) {
        self.0[class.index()] += bytes;
    }

    /// Raises each class to at least its value in `other`.
    pub(crate) fn raise_to(&mut self, other: &ClassBytes) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine = (*mine).max(theirs);
        }
    }

    pub(crate) fn sub(&mut self, class: AllocClass, bytes: u64) {
        let v = &mut self.0[class.index()];
        *v = v.saturating_sub(bytes);
    }
}

impl fmt::Display for ClassBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for c in AllocClass::ALL {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{}={}", c.name(), crate::units::Bytes(self.get(c)))?;
        }
        Ok(())
    }
}
