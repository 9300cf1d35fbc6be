//! What a trainer can say about itself between steps ([`TrainerStatus`], `Trainer::status`)
//! and the graphs it captured ([`CapturedGraphs`], `Trainer::graphs`): plain values the
//! trainer fills, for a training loop's bookkeeping, a benchmark and the tests.

use super::phases::HostPhases;
use zcomm::RankInfo;

/// A snapshot of a trainer (`Trainer::status`).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct TrainerStatus {
    /// Optimiser steps taken so far.
    pub step: u64,
    /// This rank's place in the job (`RankInfo::SINGLE` without a collective).
    pub rank: RankInfo,
    /// Steps queued by `queue` and not read back yet (the window being filled and the one
    /// whose copy to the host is in flight): `drain` reads them all back.
    pub queued: usize,
    /// Steps of the window being filled: 0 right after a call that completed a window (the
    /// same step on every rank of a job), though that window's read-back is still in flight.
    pub filling: usize,
    /// Samples of the training set on the device (`None` before `Load::Training`).
    pub loaded_rows: Option<usize>,
    /// Samples of the validation set on the device (`None` before `Load::Validation`; in
    /// data parallel the whole set's, of which this rank holds its shard).
    pub validation_rows: Option<usize>,
    /// The host time of each phase of the queued steps since the trainer was made (a
    /// per-step timeline takes the difference of two snapshots, `HostPhases::since`).
    pub host_phases: HostPhases,
}

/// The graphs a trainer captured (`Trainer::graphs`), for their node counts on the CUDA
/// backend (`CudaGraph::nodes`).
#[derive(Debug)]
#[non_exhaustive]
pub struct CapturedGraphs<'a, G> {
    /// The captured step of the configured schedule once a step captured it: the whole
    /// batched step, or the per-sample forward+backward.
    pub step: Option<&'a G>,
    /// The chunk graphs of the validation pass (one per chunk shape once captured; none
    /// eagerly): each `evaluate(EvalSource::Validation)` replays them.
    pub validation: Vec<&'a G>,
}
