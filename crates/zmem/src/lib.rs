//! zmem: device memory for the engine, over any `zdevice::Device<D>`.
//!
//! - [`Arena`]: scratch segments (256-byte bump allocation within a [`Step`], reclaimed at its
//!   end), a held region for `saved` and `persistent` blocks, a stream-ordered overflow pool
//!   with memory reserved up front, and [`CaptureReservation`]s for captured graphs (shared,
//!   through a [`GraphPool`], by graphs that never run at the same time).
//! - [`Block`]: a cheap, cloneable handle carrying its memory's generation.
//! - [`Scratch`]: a step's scratch allocation, a plain value (no lock, no reference count on
//!   the fast path) until it is dereferenced to a `Block` to be kept.
//! - [`Diagnostics`] and the timeline ([`TimelineSnapshot`]) explain the arena at any time.
//!
//! Live scratch at step end: a step's end keeps exactly the scratch blocks still referenced
//! and reclaims everything else (no floor); `Step::end_strict` reports them as an error.
//! See README.md.
#![forbid(unsafe_code)]

mod arena;
mod block;
mod capture;
mod class;
mod config;
mod diag;
mod error;
mod overrides;
mod pool;
mod scratch;
mod step;
mod timeline;
pub mod units;

#[cfg(any(test, feature = "testing"))]
pub use arena::Protection;
pub use arena::reclaim_summary::StepSummary;
pub use arena::{Arena, Sink};
pub use block::{Block, Source};
pub use capture::{CapturePlan, CaptureReservation, CaptureScope, Recording};
pub use class::{AllocClass, ClassBytes};
pub use config::{ArenaConfig, ENV_VARS, MAX_TIMELINE_EVENTS, default_cap, sanitize_forced};
pub use diag::{CaptureStats, Diagnostics, FillCause, OverflowStats, ResetInfo};
pub use error::{LiveBlock, MemError, MemResult};
pub use overrides::{ArenaOverrides, ArenaSetting, Labels};
pub use pool::GraphPool;
pub use scratch::Scratch;
pub use step::{OwnedStep, Step};
pub use timeline::{Event, EventKind, STEP_RECORDS_MAX, StepRecord, TimelineSnapshot};
