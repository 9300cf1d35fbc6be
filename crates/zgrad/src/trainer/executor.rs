//! The step executor: the one owner of the trainer's capture policy. Every piece of device
//! work the trainer may run as a graph (the batched step, the per-sample step's one sample, the
//! queued steps, the validation set's chunks, the resident replay) goes through one door,
//! [`Executor::run`]: replay the graph held for its key when its rows have the graph's shape,
//! else capture one when capture is on and no graph is held, else run the work eagerly. This
//! file is the only place that begins a capture, replays a graph or turns capture off.
//!
//! The graphs are cached by [`GraphKey`] (which work, and where its rows come from), each
//! with the row shape it was captured for: rows of another shape (an epoch's last, shorter
//! batch) run eagerly beside the graph, which stays for the next full batch. A new schedule or
//! a new precision is a new key (or a field of one) and a body; the policy stays here. The
//! precision policy (`TrainerConfig::precision`) is fixed for a trainer's life, so every graph
//! it holds was captured under it and the key needs no precision field.
//!
//! A failed capture logs a warning and turns capture off for the rest of the run (graphs
//! already held by evaluation keep replaying; the training steps run eagerly). What the
//! failure left applied is decided here, from what the body reported while it ran:
//! - the body completed once (the device backend's warm-up runs it for real): its work is
//!   done, and the caller continues from it instead of repeating it;
//! - the body failed inside its update (`Started` set, no completed run): the update may be
//!   applied in part, [`DoorError::Partial`] (`Applied::Maybe`; the trainer marks the
//!   optimiser's state unknown);
//! - nothing ran: the work runs eagerly ([`Eager::AfterFailedCapture`]).
//!
//! A failed replay of a body holding an update is [`DoorError::Partial`] too (the graph may
//! have run in part), and so is an eager run that failed after its update started; of any
//! other body, the body's own error.

use super::body::{ErrorSlot, into_body_error, take_body_error};
use crate::batch::Shard;
use crate::error::{Applied, GradError, Result};
use crate::optim::Optimizer;
use crate::var::Var;
use std::cell::Cell;
use std::rc::Rc;
use zcompute::{Capture, Element, GraphPool, prelude::*};

/// What a graph is of. With the row shape its entry records, what decides the graph's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GraphKey {
    /// a host `step`'s batched step: rows from host slices or pinned memory alike (both refill
    /// its static inputs).
    Batched,
    /// One sample of the per-sample schedule, read from the slots' table through an index in
    /// device memory.
    Sample,
    /// A queued batched step on rows gathered from the device data set (`Load::Training`).
    QueuedDevice,
    /// A queued batched step on rows copied from a pinned batch (`queue` of a pinned batch).
    QueuedPinned,
    /// Chunk group `n` of the validation set on the device (a full chunk's, then the last's).
    EvalChunk(usize),
}

impl GraphKey {
    /// Whether a graph of this key replays only while capture is on. The training steps run
    /// eagerly for the rest of the run once a capture failed, even where a graph is held;
    /// evaluation's graphs, each captured whole, keep replaying.
    fn replays_only_while_on(self) -> bool {
        !matches!(self, GraphKey::EvalChunk(_))
    }
}

/// The static inputs a graph reads, refilled before each replay.
pub(super) struct StaticInputs<B: Ops<T>, T: Element> {
    pub x: Var<B, T>,
    pub y: Var<B, T>,
}

impl<B: Ops<T>, T: Element> StaticInputs<B, T> {
    /// Zeros of `x` and `y` shapes in persistent memory (they outlive every step).
    pub(super) fn zeros(b: &B, x: &[usize], y: &[usize]) -> Result<Self> {
        Ok(StaticInputs {
            x: Var::constant(crate::memory::persistent_zeros(b, x)?),
            y: Var::constant(crate::memory::persistent_zeros(b, y)?),
        })
    }

    /// Refills them from `data` (written outside zgrad's ops: their versions move, as
    /// `Var::upload` moves them).
    pub(super) fn refill(&self, b: &B, data: &Shard<'_, B, T>) -> Result<()> {
        data.upload(b, self.x.value(), self.y.value())?;
        self.x.bump_version();
        self.y.bump_version();
        Ok(())
    }
}

/// Set by a body just before its first update kernel: a failure after it may have moved some
/// parameters.
pub(super) type Started = Rc<Cell<bool>>;

/// What a capture records: the body (a `'static` closure over cloned handles, legal inside a
/// capture) and the static inputs it reads, if it reads any the caller refills.
pub(super) struct Recording<B: Ops<T>, T: Element> {
    pub body: Box<dyn FnMut() -> Result<()>>,
    pub inputs: Option<StaticInputs<B, T>>,
}

/// One request at the door.
#[derive(Clone, Copy)]
pub(super) struct Request<'a> {
    pub key: GraphKey,
    /// The shape of the rows the work reads (a graph replays only on rows of its shape).
    pub shape: &'a [usize],
    /// Names the work in the fallback's warning.
    pub what: &'static str,
    /// The step whose update the body applies; `None` for a body without one.
    pub update: Option<u64>,
    /// Replay the graph held, whatever the policy says, and nothing else (`Request::held`).
    held_only: bool,
}

impl<'a> Request<'a> {
    pub(super) fn new(
        key: GraphKey,
        shape: &'a [usize],
        what: &'static str,
        update: Option<u64>,
    ) -> Self {
        Request {
            key,
            shape,
            what,
            update,
            held_only: false,
        }
    }

    /// The resident replay (a step from the held batch): the graph held for `key`, holding
    /// step `step`'s update, replays whatever the policy says (capture off after a failure
    /// included); nothing is captured or run eagerly, and without a graph of `shape` the
    /// request is refused.
    pub(super) fn held(key: GraphKey, shape: &'a [usize], what: &'static str, step: u64) -> Self {
        Request {
            held_only: true,
            ..Request::new(key, shape, what, Some(step))
        }
    }
}

/// Why the eager form of the work is asked for.
pub(super) enum Eager<'a, B: Ops<T>, T: Element> {
    /// Capture is off (or the rows are not the graph's shape).
    Plain,
    /// A capture failed having done nothing; the recording's static inputs, filled.
    AfterFailedCapture(Option<&'a StaticInputs<B, T>>),
}

/// How the work ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ran {
    Replayed,
    Captured,
    Eager,
    /// The capture failed and capture is now off. `done`: the body had completed once (its
    /// work is applied); otherwise the eager form ran (`Eager::AfterFailedCapture`).
    FellBack {
        done: bool,
    },
}

impl Ran {
    /// Whether the work ran as (or was recorded into) a graph.
    pub(super) fn captured(self) -> bool {
        matches!(self, Ran::Replayed | Ran::Captured)
    }
}

/// A failure at the door.
#[derive(Debug)]
pub(super) enum DoorError {
    /// The body's update may have been applied in part: `Applied::Maybe` at its step.
    Partial(GradError),
    Other(GradError),
}

impl DoorError {
    /// The error to report, the optimiser's state marked unknown when the update may be
    /// applied in part.
    pub(super) fn settle<B: Ops<T>, T: Element>(self, optim: &mut Optimizer<B, T>) -> GradError {
        match self {
            DoorError::Partial(e) => {
                optim.mark_unknown();
                e
            }
            DoorError::Other(e) => e,
        }
    }
}

impl DoorError {
    /// The error of a body without an update (never `Partial`).
    pub(super) fn into_error(self) -> GradError {
        match self {
            DoorError::Partial(e) | DoorError::Other(e) => e,
        }
    }
}

impl From<GradError> for DoorError {
    fn from(e: GradError) -> Self {
        DoorError::Other(e)
    }
}

/// A captured graph, where its body leaves errors, and what it was captured for.
struct Entry<B: Capture<T>, T: Element> {
    key: GraphKey,
    shape: Vec<usize>,
    graph: B::Graph,
    errors: ErrorSlot,
    inputs: Option<StaticInputs<B, T>>,
}

/// The capture policy and the graphs.
pub(super) struct Executor<B: Capture<T>, T: Element> {
    /// `TrainerConfig::capture`.
    capture: bool,
    /// Set after a capture failed: the rest of the run is eager. The trainer's policy, not
    /// capture state: where a capture is lives in the device's capture session alone.
    disabled: bool,
    graphs: Vec<Entry<B, T>>,
    /// The window's track (`Window::made`) the queued graphs were captured with.
    queued_for: u64,
    /// The memory every graph of the trainer is captured into: they replay one at a time on
    /// the engine stream and keep what outlives a replay (parameters, gradients, moments, the
    /// optimiser's slot and gate, stats, history, inputs) in persistent tensors, so they share
    /// one reservation (see `zmem::GraphPool`).
    pool: GraphPool,
}

impl<B: Capture<T> + 'static, T: Element> Executor<B, T> {
    pub(super) fn new(capture: bool) -> Self {
        Executor {
            capture,
            disabled: false,
            graphs: Vec::new(),
            queued_for: 0,
            pool: GraphPool::new(),
        }
    }

    /// Whether new work is captured (capture on, and no capture failed yet).
    pub(super) fn on(&self) -> bool {
        self.capture && !self.disabled
    }

    fn entry(&self, key: GraphKey) -> Option<&Entry<B, T>> {
        self.graphs.iter().find(|e| e.key == key)
    }

    /// The graph held for `key`.
    pub(super) fn graph(&self, key: GraphKey) -> Option<&B::Graph> {
        self.entry(key).map(|e| &e.graph)
    }

    /// The graph held for `key`, its static inputs and the row shape it was captured for.
    pub(super) fn inputs(&self, key: GraphKey) -> Option<(&StaticInputs<B, T>, &[usize])> {
        let e = self.entry(key)?;
        Some((e.inputs.as_ref()?, &e.shape))
    }

    /// The graphs whose key `which` picks, in the order they were captured.
    pub(super) fn graphs(
        &self,
        which: impl Fn(GraphKey) -> bool,
    ) -> impl Iterator<Item = &B::Graph> {
        self.graphs
            .iter()
            .filter(move |e| which(e.key))
            .map(|e| &e.graph)
    }

    /// Drops the graphs whose key `which` picks (what they read is about to go).
    pub(super) fn forget(&mut self, which: impl Fn(GraphKey) -> bool) {
        self.graphs.retain(|e| !which(e.key));
    }

    /// Drops the queued steps' graphs when the window's track changed since they were
    /// captured (they would write their history rows into the old one).
    pub(super) fn queued_track(&mut self, made: u64) {
        if self.queued_for != made {
            self.forget(|k| matches!(k, GraphKey::QueuedDevice | GraphKey::QueuedPinned));
            self.queued_for = made;
        }
    }

    /// The door. Replays the graph of `req.key` (after `refill` filled its static inputs)
    /// when one of `req.shape` is held and the key replays now; captures what `record` makes
    /// when capture is on and none is held; otherwise runs `eager`. On a failed capture it
    /// decides what was applied (module docs), turns capture off and runs `eager` when the
    /// body did nothing.
    ///
    /// `cx` is what the three closures write (the optimiser, say): each gets it in turn.
    /// `record` and `eager` set [`Started`] just before their first update kernel.
    pub(super) fn run<C>(
        &mut self,
        b: &B,
        cx: &mut C,
        req: Request<'_>,
        refill: impl FnOnce(&mut C, Option<&StaticInputs<B, T>>) -> Result<()>,
        record: impl FnOnce(&mut C, &Started) -> Result<Recording<B, T>>,
        eager: impl FnOnce(&mut C, Eager<'_, B, T>, &Started) -> Result<()>,
    ) -> std::result::Result<Ran, DoorError> {
        let on = self.on();
        let usable = on || req.held_only || !req.key.replays_only_while_on();
        let held = self.graphs.iter().position(|e| e.key == req.key);
        if req.held_only && held.is_none_or(|i| self.graphs[i].shape != req.shape) {
            return Err(DoorError::Other(GradError::BadInput(format!(
                "no captured {} of rows {:?} to replay",
                req.what, req.shape
            ))));
        }
        match held {
            Some(i) if usable && self.graphs[i].shape == req.shape => {
                let entry = &mut self.graphs[i];
                refill(cx, entry.inputs.as_ref())?;
                b.replay(&mut entry.graph).map_err(|e| {
                    let e = take_body_error(e, &entry.errors);
                    match req.update {
                        // The graph may have run in part, its update included.
                        Some(step) => DoorError::Partial(e.at_step(step, Applied::Maybe)),
                        None => DoorError::Other(e),
                    }
                })?;
                Ok(Ran::Replayed)
            }
            None if on => self.capture(b, cx, req, record, eager),
            // Capture off, or rows of another shape than the graph's: eagerly.
            _ => {
                run_eager(cx, req, Eager::Plain, eager)?;
                Ok(Ran::Eager)
            }
        }
    }

    fn capture<C>(
        &mut self,
        b: &B,
        cx: &mut C,
        req: Request<'_>,
        record: impl FnOnce(&mut C, &Started) -> Result<Recording<B, T>>,
        eager: impl FnOnce(&mut C, Eager<'_, B, T>, &Started) -> Result<()>,
    ) -> std::result::Result<Ran, DoorError> {
        let started = Started::default();
        let Recording { mut body, inputs } = record(cx, &started)?;
        let (errors, runs) = (ErrorSlot::default(), Rc::new(Cell::new(0u32)));
        let wrapped = {
            let (errors, runs) = (errors.clone(), Rc::clone(&runs));
            move || {
                body().map_err(|e| into_body_error(e, &errors))?;
                runs.set(runs.get() + 1);
                Ok(())
            }
        };
        match b.capture_in_pool(&self.pool, Box::new(wrapped)) {
            Ok(graph) => {
                self.graphs.push(Entry {
                    key: req.key,
                    shape: req.shape.to_vec(),
                    graph,
                    errors,
                    inputs,
                });
                Ok(Ran::Captured)
            }
            Err(e) => {
                let e = take_body_error(e, &errors);
                let done = runs.get() > 0;
                if let (false, true, Some(step)) = (done, started.get(), req.update) {
                    // The body failed inside its update: some parameters may have moved.
                    return Err(DoorError::Partial(e.at_step(step, Applied::Maybe)));
                }
                tracing::warn!(
                    target: "zgrad.trainer.capture",
                    error = %e,
                    "capture of the {} failed; continuing with eager execution",
                    req.what
                );
                self.disabled = true;
                if !done {
                    run_eager(cx, req, Eager::AfterFailedCapture(inputs.as_ref()), eager)?;
                }
                Ok(Ran::FellBack { done })
            }
        }
    }
}

/// Runs the eager form of `req`'s work: a failure after its update started may have applied
/// it in part ([`DoorError::Partial`]), as in a capture.
fn run_eager<B: Ops<T>, T: Element, C>(
    cx: &mut C,
    req: Request<'_>,
    how: Eager<'_, B, T>,
    eager: impl FnOnce(&mut C, Eager<'_, B, T>, &Started) -> Result<()>,
) -> std::result::Result<(), DoorError> {
    let started = Started::default();
    eager(cx, how, &started).map_err(|e| match (started.get(), req.update) {
        (true, Some(step)) => DoorError::Partial(e.at_step(step, Applied::Maybe)),
        _ => DoorError::Other(e),
    })
}
