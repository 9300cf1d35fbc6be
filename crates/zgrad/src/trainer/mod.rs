//! The trainer: any [`Model`] with AdamW (or SGD with momentum) in both schedules of
//! docs/xasset.md (batched, and per-sample gradient accumulation), eager or with graph
//! capture, data parallel, and evaluation in no-grad mode. Nothing here knows one model: the
//! input shape comes from `Model::sample_shape`, the loss from `Model::loss`, the parameters
//! (and their flat buffers) from `Model::named_parameters`.
//!
//! The trainer's public surface, all of it:
//!
//! - made by `new`, and made one rank of a data-parallel job by `with_collective` (and
//!   `with_grad_sync`, how the gradients are summed);
//! - `load` a [`Load`]: a data set onto the device (the training set, the validation set) or
//!   the order the loaded rows will be stepped in;
//! - `step` (one step read back at once) and `queue` (read back a window later, or at
//!   `drain`) from a [`StepSource`]; `drain`;
//! - `evaluate` from an [`EvalSource`] (a set the caller holds nowhere whole is a
//!   [`ChunkedEval`], fed a chunk at a time); `predict`;
//! - `save_checkpoint`, `load_checkpoint` and `export_parameters` (`crate::checkpoint`), and
//!   `restore` (parameters and optimiser state from values the caller holds);
//! - `give_up` a job's collective after an error outside a step;
//! - and to look at: `backend`, `model`, `config`, `optimizer`, `status` (a
//!   [`TrainerStatus`]: step count, rank, queued steps, sets loaded, host time) and `graphs`
//!   (the [`CapturedGraphs`]).
//!
//! A step is where its rows come from (`source.rs`: host slices and pinned memory, whose
//! batch is `crate::batch`'s; the data set loaded on the device, `device_data.rs`; the batch a
//! captured step holds) x its schedule (in the config: batched, one gated body and one door
//! call for every source, `batched.rs`; per-sample, its samples in `per_sample.rs` and its
//! tail in `queued_samples.rs`) x when it is read back (at once, or at `drain`: `queued/`, the
//! same body writing a history row). Whatever the path, the
//! work that may run as a graph goes through one door, `executor.rs`, which owns the capture
//! policy: the graphs (keyed by `GraphKey` and the rows' shape), replay, capture, eager
//! execution, and the fallback after a failed capture (what was applied, capture off for the
//! rest of the run). Evaluation's chunks on the device go through the same door
//! (`eval_device.rs`). A new schedule or precision is a key there and a body in `body.rs`.
//!
//! Step scopes are the trainer's job: it opens a step before the work of every sample (or
//! batch) and closes it after, so the backend's scratch memory is reclaimed every time
//! without the caller doing anything. Parameters, gradients, optimiser state and the static
//! inputs of captured graphs are persistent; saved tensors belong to the tape.

mod batched;
mod body;
mod checks;
mod chunked_eval;
mod device_data;
mod distributed;
mod eval;
mod eval_chunks;
mod eval_device;
mod executor;
mod gated;
mod locate;
mod per_sample;
mod phases;
mod queued;
mod queued_samples;
mod resident;
mod sizes;
mod source;
mod status;
mod step_table;

use crate::batch::{HostSlices, PinnedRows, Shard, Source, Staging};
use crate::error::{Applied, GradError, Result};
use crate::memory::ClassGuard;
pub(crate) use crate::memory::{in_step, in_step_split};
use crate::model::{Model, unique_names};
use crate::optim::{AdamW, AdamWHyper, Optimizer, OptimizerState, Sgd, SgdHyper};
use crate::precision::Precision;
use crate::schedule::LrSchedule;
use body::StepParts;
use gated::GatedRows;
use source::From;
use std::rc::Rc;
use zcompute::{AllocClass, Capture, Element, MatmulOpts};

pub use crate::batch::PinnedBatch;
use crate::shard;
pub use chunked_eval::ChunkedEval;
pub use distributed::{DEFAULT_BUCKET_BYTES, GradSync};
pub use phases::HostPhases;
pub use sizes::{device_data_bytes, max_device_rows, validation_data_bytes};
pub use source::{EvalSource, Load, ReplayMark, StepSource};
pub use status::{CapturedGraphs, TrainerStatus};
pub use step_table::step_table_bytes;

/// How a batch becomes one optimiser step (docs/xasset.md, "Two training schedules").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrainSchedule {
    /// One forward and backward over the whole batch.
    Batched,
    /// Forward and backward per sample with the loss divided by B, gradients accumulating;
    /// the step's scratch memory is reclaimed after every sample.
    PerSample,
}

/// Everything the trainer needs to know.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainerConfig {
    pub schedule: TrainSchedule,
    /// Capture the per-sample forward+backward (per-sample) or the whole step (batched) as a
    /// graph and replay it; falls back to eager execution with a warning if capture fails.
    pub capture: bool,
    /// Base learning rate (the schedule scales it).
    pub lr: f64,
    pub lr_schedule: LrSchedule,
    /// Clip gradients to this global norm before the optimiser step.
    pub clip_grad: Option<f64>,
    pub adamw: AdamWHyper,
    /// `Some`: train with SGD (`torch.optim.SGD`: momentum, dampening, Nesterov, weight decay
    /// in AdamW's parameter groups) instead of AdamW, whose `adamw` settings are then unused.
    pub sgd: Option<SgdHyper>,
    /// Samples per chunk in `evaluate`.
    pub eval_batch: usize,
    /// The training step's precision policy (docs/precision.md): the matrix products of the
    /// forward and backward (Linear layers, `Tape::matmul`) under `Precision::math_mode`, and
    /// those of evaluation (`evaluate`, `predict`, the device evaluation) too; parameters,
    /// gradients, AdamW, norms, softmax and losses stay float32.
    /// `F32` (the default) is the float32 step bit for bit. A backend that cannot run the
    /// policy is refused by `Trainer::new` (`PrecisionUnsupported`).
    pub precision: Precision,
    /// NEGATIVE CONTROL ONLY (scenario C): saved tensors stay in scratch memory. Only with the
    /// `testing` feature (tests enable it; a release build of `ztrain` has no such switch).
    #[cfg(any(test, feature = "testing"))]
    pub unprotected_saved_tensors: bool,
    /// REFERENCE ONLY: under bf16, convert every Linear operand (weight, input, output
    /// gradient) on every product call (the path before the weights' bf16 copy,
    /// `crate::weight_shadow`, and the inputs' saved copies), to check both against it bit for
    /// bit. Only with the `testing` feature.
    #[cfg(any(test, feature = "testing"))]
    pub bf16_weights_per_call: bool,
}

impl TrainerConfig {
    /// Whether saved tensors stay in scratch (the negative control).
    #[cfg(any(test, feature = "testing"))]
    fn saved_tensors_unprotected(&self) -> bool {
        self.unprotected_saved_tensors
    }

    /// Without the `testing` feature saved tensors are always protected.
    #[cfg(not(any(test, feature = "testing")))]
    fn saved_tensors_unprotected(&self) -> bool {
        false
    }

    /// Whether a bf16 step keeps a bf16 copy of the weights (always, but for the reference).
    #[cfg(any(test, feature = "testing"))]
    fn bf16_weight_copy(&self) -> bool {
        self.precision == Precision::Bf16 && !self.bf16_weights_per_call
    }

    /// Whether a bf16 step keeps a bf16 copy of the weights: always under bf16.
    #[cfg(not(any(test, feature = "testing")))]
    fn bf16_weight_copy(&self) -> bool {
        self.precision == Precision::Bf16
    }
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            schedule: TrainSchedule::Batched,
            capture: false,
            lr: 1e-3,
            lr_schedule: LrSchedule::Constant,
            clip_grad: None,
            adamw: AdamWHyper::default(),
            sgd: None,
            eval_batch: 256,
            precision: Precision::F32,
            #[cfg(any(test, feature = "testing"))]
            unprotected_saved_tensors: false,
            #[cfg(any(test, feature = "testing"))]
            bf16_weights_per_call: false,
        }
    }
}

/// A step's rows on this rank (`Trainer::step_rows`).
struct StepRows {
    lr: f64,
    rows: std::ops::Range<usize>,
    /// `[rows, ..sample shape]`.
    shape: Vec<usize>,
}

/// What one optimiser step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// The optimiser step just taken (1-based).
    pub step: u64,
    /// Mean loss over the batch.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    pub samples: usize,
    /// Whether this step ran (or was recorded) as a captured graph.
    pub captured: bool,
}

/// Trains a model `M` (any [`Model`]) of elements `T` with AdamW or SGD on backend `B`.
pub struct Trainer<B: Capture<T> + 'static, T: Element, M: Model<B, T>> {
    backend: Rc<B>,
    parts: StepParts<B, T, M>,
    optim: Optimizer<B, T>,
    config: TrainerConfig,
    /// The capture policy and every graph (`executor.rs`).
    exec: executor::Executor<B, T>,
    /// The per-sample schedule's slots (`per_sample.rs`).
    samples: Option<per_sample::SampleSlots<B, T>>,
    /// The training set on the device (`Load::Training`), and the steps queued on it.
    data: Option<device_data::DeviceData<B, T>>,
    /// The validation set on the device (`Load::Validation`) and its chunk graphs.
    validation: Option<eval_device::EvalSet<B, T>>,
    window: queued::Window<B, T>,
    /// The landing buffers of `queue` of a pinned batch's copy stream, made at its first call.
    staging: Option<Staging<B, T>>,
    /// Host time of the queued steps' phases, summed since the trainer was made.
    phases: HostPhases,
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> std::fmt::Debug for Trainer<B, T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("config", &self.config)
            .field("step", &self.optim.step_count())
            .finish_non_exhaustive()
    }
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// A trainer of `model` (its parameters are trained in place: the trainer holds a clone
    /// sharing them). Refuses a model with no parameters, a parameter without a gradient
    /// buffer or two parameters of one name (`Config`).
    pub fn new(backend: impl Into<Rc<B>>, model: M, config: TrainerConfig) -> Result<Self> {
        let backend = backend.into();
        let named = model.named_parameters();
        unique_names(named.iter().map(|(n, _)| n.as_str()))?;
        if named.is_empty() {
            return Err(GradError::Config("the model has no parameters".into()));
        }
        if let Some((name, _)) = named.iter().find(|(_, p)| p.grad().is_none()) {
            return Err(GradError::Config(format!(
                "parameter `{name}` is not trainable (no gradient buffer: make it with Var::parameter or ParameterBuilder)"
            )));
        }
        let params: Vec<_> = named.into_iter().map(|(_, p)| p).collect();
        refuse_unsupported_precision(&*backend, config.precision)?;
        let optim = match config.sgd {
            Some(hyper) => Optimizer::Sgd(Sgd::new(&*backend, &params, hyper)?),
            None => Optimizer::AdamW(AdamW::new(&*backend, &params, config.adamw)?),
        };
        let (stats, one) = {
            let _class = ClassGuard::new(&*backend, AllocClass::Persistent);
            (backend.zeros(&[2])?, backend.full(&[], T::ONE)?)
        };
        let weight_shadow = weight_shadow(&*backend, &model, &config)?;
        Ok(Trainer {
            parts: StepParts {
                model,
                params,
                stats,
                one,
                clip: config.clip_grad.map(T::from_f64),
                unprotected: config.saved_tensors_unprotected(),
                math_mode: config.precision.math_mode(),
                weight_shadow,
                dist: distributed::Dist::single_process(&*backend)?,
            },
            backend,
            optim,
            config,
            exec: executor::Executor::new(config.capture),
            samples: None,
            data: None,
            validation: None,
            window: queued::Window::default(),
            staging: None,
            phases: HostPhases::default(),
        })
    }

    #[must_use]
    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub(crate) fn backend_rc(&self) -> &Rc<B> {
        &self.backend
    }

    #[must_use]
    pub fn model(&self) -> &M {
        &self.parts.model
    }

    #[must_use]
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    #[must_use]
    pub fn optimizer(&self) -> &Optimizer<B, T> {
        &self.optim
    }

    /// Where the trainer stands now: steps taken, its rank, the queued steps not read back,
    /// the sets on the device and the host time of the queued steps' phases.
    #[must_use]
    pub fn status(&self) -> TrainerStatus {
        TrainerStatus {
            step: self.optim.step_count(),
            rank: self.parts.dist.info(),
            queued: self.window.pending(),
            filling: self.window.filling(),
            loaded_rows: self.data.as_ref().map(device_data::DeviceData::rows),
            validation_rows: self.validation.as_ref().map(eval_device::EvalSet::total),
            host_phases: self.phases,
        }
    }

    /// The graphs captured so far: the step of the configured schedule (the whole batched
    /// step, or the per-sample forward+backward) and the validation pass's chunks.
    #[must_use]
    pub fn graphs(&self) -> CapturedGraphs<'_, B::Graph> {
        use executor::GraphKey;
        CapturedGraphs {
            step: self.exec.graph(match self.config.schedule {
                TrainSchedule::Batched => GraphKey::Batched,
                TrainSchedule::PerSample => GraphKey::Sample,
            }),
            validation: self
                .exec
                .graphs(|k| matches!(k, GraphKey::EvalChunk(_)))
                .collect(),
        }
    }

    /// Puts `what` on the device ([`Load`]):
    ///
    /// - `Training`: the training set, uploaded once for the queued steps of its rows
    ///   (`StepSource::loaded`) and `evaluate(EvalSource::Loaded)`; it replaces a set loaded
    ///   before (dropping the captured steps that read it). Refuses with `BadInput` shapes a
    ///   host `step` would refuse and more rows than indices of `T` can name exactly
    ///   ([`max_device_rows`]).
    /// - `Validation`: the validation set, uploaded once for `evaluate(EvalSource::Validation)`
    ///   (the targets on the device beside the features; the unweighted binary task's labels
    ///   on the host instead, where its report sums). In data parallel each rank keeps only
    ///   its shard (load it after `with_collective`; `evaluate(EvalSource::Validation)`
    ///   refuses a set sharded otherwise). Replaces a set loaded before. Refuses with
    ///   `BadInput` shapes `evaluate` would refuse and a non-finite feature or label (naming
    ///   the sample; the old set kept).
    /// - `Order`: announces the rows the next queued steps of the loaded set will take:
    ///   `order` in chunks of `batch` rows (the last may be shorter), as a training loop
    ///   walks an epoch's order (`ztrain` at each epoch's start, and on resuming from its
    ///   position). A batched step that takes the plan's next chunk then finds its row
    ///   indices and `[lr, t]` on the device already: one host-to-device copy puts up those
    ///   of the rest of a read-back window at its first step, and the steps after it upload
    ///   nothing (without a plan, each step makes two small copies, and the GPU waits for
    ///   them between two replays). A step that takes other rows, or another step number or
    ///   learning rate than planned (after a non-finite step was read back), uploads its own
    ///   and ends the plan: a plan never changes what a step computes. Replaces the plan
    ///   before; the per-sample schedule ignores it. Refuses with `BadInput` before the
    ///   training set is loaded, a `batch` of 0 and a row not in the data set.
    ///
    /// Out of device memory is the backend's error (`TooLarge` / `OutOfMemory`), nothing
    /// loaded.
    pub fn load(&mut self, what: Load<'_, T>) -> Result<()> {
        match what {
            Load::Training { x, y, n } => self.load_training(x, y, n),
            Load::Validation { x, y, n } => self.load_validation(x, y, n),
            Load::Order { order, batch } => self.plan_rows(order, batch),
        }
    }

    /// Sets the parameters to `values` (one a parameter, in `Model::named_parameters`'
    /// order, each its values row-major) and the optimiser's state to `state`
    /// (`Optimizer::export` of a trainer of this model): what `load_checkpoint` does with a
    /// file's, for a caller that keeps them its own way. Values of another count or size,
    /// and a state that does not fit (`BadInput`; another optimiser's: `OptimizerMismatch`),
    /// are refused before anything is written; a restore that fails while
    /// writing the parameters leaves the state unknown (`StateUnknown` until one succeeds),
    /// and one that succeeds clears an unknown state left by a failed step. Captured graphs
    /// keep working: the values are written into the existing tensors.
    pub fn restore(&mut self, values: &[Vec<T>], state: &OptimizerState<T>) -> Result<()> {
        let params = &self.parts.params;
        let sizes_match = values.len() == params.len()
            && params
                .iter()
                .zip(values)
                .all(|(p, v)| p.value().numel() == v.len());
        if !sizes_match {
            return Err(GradError::BadInput(format!(
                "restore: {} parameter values of sizes {:?} for the model's {} of sizes {:?}",
                values.len(),
                values.iter().map(Vec::len).collect::<Vec<_>>(),
                params.len(),
                params.iter().map(|p| p.value().numel()).collect::<Vec<_>>(),
            )));
        }
        // The state too, before a parameter is written: one that does not fit leaves both.
        self.optim.check(state)?;
        let b = Rc::clone(&self.backend);
        let written = params
            .iter()
            .zip(values)
            .try_for_each(|(p, value)| p.upload(&*b, value));
        if let Err(e) = written {
            // Some parameters may already hold the new values: neither the old state nor
            // the restored one, until a restore succeeds.
            self.optim.mark_unknown();
            return Err(e);
        }
        self.optim.import(&b, state)
    }

    /// Checks a batch against the model (its inputs, and its targets against `Model::task`)
    /// and returns one sample's input shape (`Model::sample_shape`).
    fn shape_of(&self, x: &[T], y: &[T], batch: usize) -> Result<Vec<usize>> {
        let sample = self.sample_of(x, batch)?;
        self.parts.model.task().check_targets(y, batch)?;
        Ok(sample)
    }

    /// Checks `batch` samples' inputs `x` and returns one sample's shape.
    fn sample_of(&self, x: &[T], batch: usize) -> Result<Vec<usize>> {
        if batch == 0 || x.is_empty() || !x.len().is_multiple_of(batch) {
            return Err(GradError::BadInput(format!(
                "batch {batch}: x has {} values (x must hold batch samples of equal size)",
                x.len(),
            )));
        }
        self.parts.model.sample_shape(x.len() / batch)
    }

    /// The targets' shape `[rows, ..Task::target_shape]` of `rows` samples.
    pub(crate) fn targets_shape(&self, rows: usize) -> Vec<usize> {
        crate::task::Task::batched(rows, &self.parts.model.task().target_shape())
    }

    /// Target values per sample (`Task::target_len`).
    pub(crate) fn target_len(&self) -> usize {
        self.parts.model.task().target_len()
    }

    /// One optimiser step on the rows of `src`, in the configured schedule, eager or captured,
    /// read back before it returns. Whatever the source, the step is the same device work
    /// and the same result, bit for bit. A non-finite loss or gradient skips the update (on
    /// the device for a captured batched step) and is reported as `NonFinite`, naming the
    /// step and, where it can be found, the sample. Rows of the loaded data set are queued
    /// and read back at once (`queue` with a window of one, then `drain`); a step while
    /// queued steps are not read back yet is refused (`BadInput`: `drain` first).
    ///
    /// Every error is a `GradError::Step` whose `applied` says what happened to the model:
    /// `No`: nothing changed, retrying the batch is safe; `Yes`: the update was applied and
    /// counted (`status().step` moved) and what failed came after it, so go on with the next
    /// batch; `Maybe`: the update may have been applied in part, and every later call refuses
    /// with `StateUnknown` until `load_checkpoint` (or `restore`) restores the state. A retry after any error
    /// thus never applies an update twice.
    pub fn step(&mut self, src: StepSource<'_, B, T>) -> Result<StepReport> {
        let step = self.optim.step_count() + 1;
        let report = match src.0 {
            From::Host { x, y, batch } => self.optim.check_state().and_then(|()| {
                let sample = self.shape_of(x, y, batch)?;
                let (per, ty) = (x.len() / batch, self.target_len());
                self.train_source(&HostSlices { x, y, per, ty }, batch, &sample, step)
            }),
            From::Pinned { batch, n } => self.optim.check_state().and_then(|()| {
                let sample = self.pinned_sample(batch, n)?;
                self.train_source(batch.source(), n, &sample, step)
            }),
            From::Held(mark) => return self.replay_held(step, mark),
            From::Loaded(rows) => return self.step_loaded(rows, step),
        }
        .map_err(|e| self.settle(step, self.distributed_error(e)))?;
        Self::log_step(&report);
        Ok(report)
    }

    /// `step` on rows of the loaded data set: one step queued in a window of its own and
    /// read back.
    fn step_loaded(&mut self, rows: &[usize], step: u64) -> Result<StepReport> {
        self.refuse_pending()
            .map_err(|e| e.at_step(step, Applied::No))?;
        let mut reports = self.queue_rows(rows, 1)?;
        reports.extend(self.drain()?);
        match reports.pop() {
            Some(report) if reports.is_empty() => Ok(report),
            _ => Err(GradError::BadInput(format!(
                "internal: {} reports read back for one step",
                reports.len() + 1
            ))
            .at_step(step, Applied::Maybe)),
        }
    }

    /// Queues one optimiser step on the rows of `src`, reading nothing back: the reports of
    /// a window of `every` steps come back, in step order, from the call that fills the
    /// next window (a window late, so the host never waits for the steps it just queued) or
    /// from [`Trainer::drain`]; other calls return none. The step is `step`'s on the same
    /// rows, bit for bit, eager or captured, in either schedule (a per-sample step keeps its
    /// samples' losses in the window, summed on the host in `f64` when it is read back).
    ///
    /// The sources queued: rows of the loaded data set (`StepSource::loaded`), and a pinned
    /// batch (`StepSource::pinned`: copied on the backend's copy stream into one of two
    /// device landing buffers while the engine stream still runs the steps before; refill
    /// the *other* of two batches while this one's copy and step run, so the host stages
    /// batch k+1 while the device runs step k). Host slices and the held batch are stepped
    /// at once (`step`): queueing them is `BadInput`, nothing applied.
    ///
    /// Errors are `GradError::Step`s as for `step`: `BadInput` (nothing loaded, no rows, a row
    /// out of range) applies nothing; a non-finite step found by the read-back is `NonFinite`
    /// naming its step and sample (a pinned step's sample is no longer there: the step is
    /// named), with the model and step count as that step's predecessor left them
    /// (`Applied::No`: every later queued step was skipped on the device and is dropped).
    pub fn queue(&mut self, src: StepSource<'_, B, T>, every: usize) -> Result<Vec<StepReport>> {
        match src.0 {
            From::Loaded(rows) => self.queue_rows(rows, every),
            From::Pinned { batch, n } => self.queue_pinned(batch, n, every),
            From::Host { .. } | From::Held(_) => {
                let step = self.optim.step_count() + 1;
                Err(GradError::BadInput(
                    "queue: host slices and the held batch are stepped at once (step); queue rows of the loaded data set or a pinned batch".into(),
                )
                .at_step(step, Applied::No))
            }
        }
    }

    /// Refuses a step read back at once while queued steps are not read back yet.
    fn refuse_pending(&self) -> Result<()> {
        match self.window.pending() {
            0 => Ok(()),
            n => Err(GradError::BadInput(format!(
                "{n} queued steps are not read back yet: call drain first"
            ))),
        }
    }

    /// One sample's shape `[S, F]` of `batch`, checking `n`, that the model takes it and
    /// that the batch holds the model's target values per sample.
    fn pinned_sample(&self, batch: &dyn PinnedRows<B, T>, n: usize) -> Result<[usize; 2]> {
        let task = self.parts.model.task();
        if batch.targets() != task.target_len() {
            return Err(GradError::BadInput(format!(
                "a pinned batch of {} target values a sample; the model's task is {task} ({} a sample): make it with PinnedBatch::with_targets",
                batch.targets(),
                task.target_len()
            )));
        }
        let [capacity, scales, features] = batch.dims();
        let pinned = [scales, features];
        let sample = self.parts.model.sample_shape(pinned[0] * pinned[1]);
        if n == 0 || n > capacity || sample.as_deref().ok() != Some(&pinned[..]) {
            return Err(GradError::BadInput(format!(
                "batch {n} of a pinned batch of {} x {} x {} (n must be 1..=capacity, and the model take samples [{}, {}]: {})",
                capacity,
                pinned[0],
                pinned[1],
                pinned[0],
                pinned[1],
                match &sample {
                    Ok(s) => format!("it takes {s:?}"),
                    Err(e) => e.to_string(),
                }
            )));
        }
        Ok(pinned)
    }

    fn log_step(report: &StepReport) {
        tracing::debug!(
            target: "zgrad.trainer.step",
            step = report.step,
            loss = report.loss,
            grad_norm = report.grad_norm,
            lr = report.lr,
            captured = report.captured,
            "step"
        );
    }

    /// The step on `batch` samples of `src` (each of shape `sample`), whichever memory holds
    /// them.
    fn train_source(
        &mut self,
        src: &dyn Source<B, T>,
        batch: usize,
        sample: &[usize],
        step: u64,
    ) -> Result<StepReport> {
        self.refuse_pending()?;
        let StepRows { lr, rows, shape } = self.step_rows(batch, sample, step)?;
        let data = Shard { src, rows };
        let mut report = match self.config.schedule {
            TrainSchedule::Batched => {
                let rows = (GatedRows::Shard(&data), None);
                self.batched_step(rows, &shape, lr, |t, k| {
                    let (x, y) = data.host(&t.backend)?;
                    t.find_sample(&x, &y, &shape, k)
                })
            }
            TrainSchedule::PerSample => self.per_sample(&data, &shape, lr),
        }?;
        report.samples = batch;
        Ok(report)
    }

    /// Step `step` on `batch` rows of samples `sample`, wherever they come from: its learning
    /// rate, this rank's shard of the rows (all of them in a single process), the collective
    /// prepared for it, and the shape `[rows, ..sample]` the model's loss takes.
    fn step_rows(&mut self, batch: usize, sample: &[usize], step: u64) -> Result<StepRows> {
        let lr = self.config.lr_schedule.lr_at(self.config.lr, step);
        let info = self.parts.dist.info();
        let rows = shard(info.rank, info.world, batch);
        let params = self.batched_params();
        self.parts
            .dist
            .prepare(&*self.backend, params, rows.len(), batch, step)?;
        let shape = std::iter::once(rows.len())
            .chain(sample.iter().copied())
            .collect();
        Ok(StepRows { lr, rows, shape })
    }

    /// The verdict on a failed step `step`: a `Step` error keeps its own; any other error is
    /// `Yes` when the step was counted (it came after the update was queued, say from closing
    /// the step scope) and `No` otherwise (every path counts its update as soon as it was
    /// queued, and marks a possibly partial one `Maybe` itself).
    fn settle(&self, step: u64, e: GradError) -> GradError {
        let applied = if self.optim.step_count() >= step {
            Applied::Yes
        } else {
            Applied::No
        };
        e.at_step(step, applied)
    }

    /// Reads `[loss, norm]` back and refuses non-finite values.
    fn read_stats(&self, step: u64) -> Result<(f64, f64)> {
        gated::read_stats(&*self.backend, &self.parts, step)
    }
}

/// Under bf16, the bf16 copy of the model's flat parameter buffer the step's Linear products
/// read their weights from (`crate::weight_shadow`); none under float32 and TF32, and none
/// for a model whose parameters are not one flat buffer (its products convert per call).
fn weight_shadow<B: zcompute::Ops<T>, T: Element, M: Model<B, T>>(
    b: &B,
    model: &M,
    config: &TrainerConfig,
) -> Result<Option<crate::weight_shadow::WeightShadow<B, T>>> {
    if !config.bf16_weight_copy() {
        return Ok(None);
    }
    match model.parameter_set() {
        Ok(set) => Ok(Some(crate::weight_shadow::WeightShadow::new(
            b,
            set.values(),
        )?)),
        Err(_) => Ok(None),
    }
}

/// Refuses a precision policy the backend cannot run, before any step: one 1x1 product under
/// the policy's math mode (a reduced mode on float64 elements, or on a backend without
/// `PrecisionOps` of its own, is refused by the backend with a typed error; the probe's two
/// tiny tensors are freed at once). Float32 runs nothing.
fn refuse_unsupported_precision<B: zcompute::Ops<T>, T: Element>(
    b: &B,
    precision: Precision,
) -> Result<()> {
    let mode = precision.math_mode();
    if mode == zcompute::MathMode::F32 {
        return Ok(());
    }
    // Persistent: the trainer is made outside any step, where scratch may not be allocated.
    let _class = ClassGuard::new(b, AllocClass::Persistent);
    let probe = b.zeros(&[1, 1])?;
    b.matmul_mode(&probe, &probe, MatmulOpts::default(), mode)
        .map(drop)
        .map_err(|source| GradError::PrecisionUnsupported {
            precision: precision.name(),
            source: Box::new(source),
        })
}
