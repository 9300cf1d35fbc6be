//! A step's rows in host memory as the trainer's step paths see them: a `Source` of rows
//! (host slices, a [`PinnedBatch`] the caller fills in place, and the trainer's own landing
//! buffers and resident set), a `Shard`, this rank's rows of one, which a step uploads into its
//! own tensors (`rows.rs`), and the copy stream's landing buffers a queued step's pinned rows
//! go through (`staging.rs`).

mod pinned;
mod rows;
mod staging;

pub use pinned::PinnedBatch;
pub(crate) use rows::{HostSlices, Shard, Source};
pub(crate) use staging::{PinnedRows, Staging};
