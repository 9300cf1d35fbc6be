//! Memory plans: what a training run will need, known before it runs.
//!
//! [`plan`] runs the first optimiser steps of the configured model (XAsset by its
//! `XAssetConfig`, any other [`Model`] through [`PlanModel`], e.g. [`ModelFn`] around its
//! constructor), in both schedules, on an
//! accounting-only simulated device (`SimConfig::accounting`: sizes and lifetimes, no kernel
//! bodies, no host memory behind allocations, parameters made on the device as zeros), and
//! reads zmem's per-class peaks (`Diagnostics::peak_bytes_by_class`). The arena there has no
//! practical cap and may not overflow, so the segments it grows to are the arena size that
//! holds those steps without overflow. Any model size plans in seconds.
//!
//! The plan answers the question a full arena raises: mis-sized (the cap is below
//! [`SchedulePlan::arena_bytes`]), legitimately full (the device is smaller than
//! [`MemoryPlan::device_bytes`]), or never reset (the real run's peaks exceed the plan's).

use crate::error::{GradError, Result};
use crate::model::Model;
use crate::trainer::{EvalSource, StepSource, TrainSchedule, Trainer, TrainerConfig};
use zcompute::{ArenaOverrides, ComputeError, CudaBackend, EngineConfig};
use zdevice::{DeviceConfig, SimConfig, SimDriver};
use zmem::{ArenaConfig, ClassBytes};

/// Memory of the accounting device plans run on: large enough for any model a GPU could hold.
pub const PLAN_DEVICE_BYTES: u64 = 1 << 50;

/// The backend plans run on: the CUDA backend over the accounting-only simulated driver.
pub type PlanBackend = CudaBackend<SimDriver>;

/// A model a plan can make: its sizes, how many input values one sample holds, and the model
/// itself on the plan's accounting device. Build it as a real run would (the same parameter
/// allocations: one flat set, `ParameterBuilder` or `ParameterSet::allocate`); its values do
/// not matter (the accounting device computes nothing), so a large model is best made with
/// `ParameterSet::allocate(b, shapes, None)`, which needs no host copy of its parameters.
pub trait PlanModel: Clone {
    /// The model the plan trains.
    type Model: Model<PlanBackend, f32>;
    /// Refuses sizes no run could have (`Config`), before any device work.
    fn validate(&self) -> Result<()> {
        Ok(())
    }
    /// Values of one sample's input (a batch of `n` holds `n` times this).
    fn values_per_sample(&self) -> usize;
    /// The model, made on the plan's device.
    fn build(&self, b: &PlanBackend) -> Result<Self::Model>;
}

/// Any model, by its constructor: `build` makes it on the plan's device, whose samples hold
/// `values_per_sample` values.
#[derive(Clone)]
pub struct ModelFn<F> {
    pub values_per_sample: usize,
    pub build: F,
}

impl<F> std::fmt::Debug for ModelFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFn")
            .field("values_per_sample", &self.values_per_sample)
            .finish_non_exhaustive()
    }
}

impl<F, M> PlanModel for ModelFn<F>
where
    F: Fn(&PlanBackend) -> Result<M> + Clone,
    M: Model<PlanBackend, f32>,
{
    type Model = M;

    fn validate(&self) -> Result<()> {
        if self.values_per_sample == 0 {
            return Err(GradError::Config(
                "memory plan: a sample of 0 values".into(),
            ));
        }
        Ok(())
    }

    fn values_per_sample(&self) -> usize {
        self.values_per_sample
    }

    fn build(&self, b: &PlanBackend) -> Result<M> {
        (self.build)(b)
    }
}

/// What to plan: the run's model (any [`PlanModel`]: `XAssetConfig`, a [`ModelFn`]), batch,
/// trainer and arena settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRequest<M> {
    pub model: M,
    /// Samples per optimiser step.
    pub batch: usize,
    /// The trainer's settings; `schedule` is ignored (both schedules are planned) and
    /// `capture` says whether the steps are captured.
    pub trainer: TrainerConfig,
    /// The arena's settings (segment size, initial size, overflow reserve); its cap is
    /// replaced by one the plan never reaches.
    pub arena: ArenaConfig,
    /// cuBLAS workspace the device reserves when it opens.
    pub blas_workspace_bytes: u64,
    /// Optimiser steps to run (at least 1). The default 2 covers the first step (a capture's
    /// warm-up and recording) and a steady one (its replay).
    pub steps: u64,
    /// Samples of a training set kept on the device (`Trainer::load(Load::Training)`; 0, the default:
    /// the data stays on the host). The plan then holds it (persistent memory,
    /// [`crate::device_data_bytes`]) and runs the steps the run runs on it
    /// (`queue` of loaded rows, each step's rows gathered on the device).
    pub resident_rows: usize,
    /// The read-back window of those queued steps (`every` of `queue` of loaded rows; 1, the
    /// default): the window's device history and step table are its size.
    pub readback_every: usize,
    /// Samples of a validation set evaluated after the steps, twice (two epochs: a captured
    /// pass is replayed the second time); 0, the default: none. On the device
    /// (`validation_on_device`) the plan holds the set ([`crate::validation_data_bytes`]) and
    /// evaluates it as `evaluate(EvalSource::Validation)` does (captured chunks when `capture`);
    /// from the host it evaluates one chunk of `min(eval_batch, rows)` zero samples with
    /// `Trainer::evaluate` (each chunk's memory is reclaimed before the next).
    pub validation_rows: usize,
    /// Whether the validation set lives on the device (`Trainer::load(Load::Validation)`).
    pub validation_on_device: bool,
    /// Samples of the training set evaluated once after the steps (a run's final numbers;
    /// 0, the default: none): the resident set with `evaluate(EvalSource::Loaded)` when
    /// `resident_rows > 0`, else one chunk from the host as for the validation set.
    pub train_eval_rows: usize,
    /// Whether the batched schedule's steps come from pinned batches through the two device
    /// landing buffers (`queue` of a pinned batch, how `ztrain` feeds a training set on the
    /// host), which the plan then holds; without it (the default) a host `step`.
    /// Ignored with `resident_rows > 0` and for the per-sample schedule.
    pub pinned: bool,
}

impl<M> PlanRequest<M> {
    /// A request with the device's default cuBLAS workspace and two steps.
    #[must_use]
    pub fn new(model: M, batch: usize, trainer: TrainerConfig, arena: ArenaConfig) -> Self {
        PlanRequest {
            model,
            batch,
            trainer,
            arena,
            blas_workspace_bytes: DeviceConfig::default().blas_workspace_bytes,
            steps: 2,
            resident_rows: 0,
            readback_every: 1,
            validation_rows: 0,
            validation_on_device: false,
            train_eval_rows: 0,
            pinned: false,
        }
    }
}

/// The plan of one schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulePlan {
    pub schedule: TrainSchedule,
    /// Whether the steps ran captured (capture asked for and not fallen back from).
    pub captured: bool,
    /// Peak live bytes per class (persistent, saved, scratch, graph).
    pub peak: ClassBytes,
    /// The arena's segments at the end: the arena cap that holds the steps without overflow.
    pub arena_bytes: u64,
    /// Bytes reserved for captured graphs (driver allocations beside the arena).
    pub capture_reserved_bytes: u64,
}

/// The plan of a run: both schedules, and what the device must hold beside the arena.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan<M> {
    pub request: PlanRequest<M>,
    /// `Batched` first, then `PerSample`.
    pub schedules: Vec<SchedulePlan>,
}

impl<M> MemoryPlan<M> {
    /// The plan of `schedule`.
    #[must_use]
    pub fn schedule(&self, schedule: TrainSchedule) -> Option<&SchedulePlan> {
        self.schedules.iter().find(|s| s.schedule == schedule)
    }

    /// Device memory the run of `schedule` needs: the arena, the capture reservations, the
    /// overflow pool's reserve and the cuBLAS workspace.
    #[must_use]
    pub fn device_bytes_for(&self, plan: &SchedulePlan) -> u64 {
        plan.arena_bytes
            + plan.capture_reserved_bytes
            + self.request.arena.overflow_reserve_bytes
            + self.request.blas_workspace_bytes
    }

    /// Device memory the more demanding schedule needs.
    #[must_use]
    pub fn device_bytes(&self) -> u64 {
        self.schedules
            .iter()
            .map(|s| self.device_bytes_for(s))
            .max()
            .unwrap_or(0)
    }

    /// The arena size the more demanding schedule needs.
    #[must_use]
    pub fn arena_bytes(&self) -> u64 {
        self.schedules
            .iter()
            .map(|s| s.arena_bytes)
            .max()
            .unwrap_or(0)
    }
}

/// Plans both schedules of `request` on the accounting device (see the module's docs).
pub fn plan<M: PlanModel>(request: &PlanRequest<M>) -> Result<MemoryPlan<M>> {
    request.model.validate()?;
    if request.batch == 0 || request.steps == 0 {
        return Err(GradError::Config(format!(
            "memory plan: batch {} and steps {} must both be at least 1",
            request.batch, request.steps
        )));
    }
    let schedules = [TrainSchedule::Batched, TrainSchedule::PerSample]
        .into_iter()
        .map(|s| plan_schedule(request, s))
        .collect::<Result<Vec<_>>>()?;
    let plan = MemoryPlan {
        request: request.clone(),
        schedules,
    };
    tracing::info!(
        target: "zgrad.plan",
        arena = plan.arena_bytes(),
        device = plan.device_bytes(),
        "memory plan made"
    );
    Ok(plan)
}

/// The engine a plan runs on: the request's arena settings passed through as overrides, with
/// a cap the plan never reaches, poison off, the request's cuBLAS workspace, on a fresh
/// accounting-only simulated device; overflow into the pool refused (a plan that needed it
/// would not be the arena's size).
fn open_plan_engine<M>(request: &PlanRequest<M>) -> Result<PlanBackend> {
    let overrides = ArenaOverrides::from(request.arena.clone())
        .arena_cap(PLAN_DEVICE_BYTES / 2)
        .poison(false);
    let backend = EngineConfig::new()
        .arena(overrides)
        .blas_workspace(request.blas_workspace_bytes)
        .sim_driver(SimDriver::new(SimConfig::accounting(PLAN_DEVICE_BYTES)))
        .map_err(|e| match e {
            ComputeError::ArenaSetting { .. } | ComputeError::Memory { .. } => {
                GradError::PlanArena(e)
            }
            other => GradError::PlanDevice(other),
        })?;
    backend.arena().set_overflow_enabled(false);
    Ok(backend)
}

/// Plans one schedule: a fresh accounting device, arena, backend, the model (zeroed, for
/// XAsset) and trainer, then `steps` steps on an all-zero batch.
pub fn plan_schedule<M: PlanModel>(
    request: &PlanRequest<M>,
    schedule: TrainSchedule,
) -> Result<SchedulePlan> {
    let backend = open_plan_engine(request)?;
    let arena = backend.arena().clone();
    let model = request.model.build(&backend)?;
    let trainer_config = TrainerConfig {
        schedule,
        ..request.trainer
    };
    let mut trainer = Trainer::new(backend, model, trainer_config)?;
    let sample = trainer
        .model()
        .sample_shape(request.model.values_per_sample())?;
    if request.resident_rows > 0 {
        trainer.load_zeroed(request.resident_rows, sample.clone())?;
    }
    if request.validation_rows > 0 && request.validation_on_device {
        trainer.load_validation_zeroed(request.validation_rows, sample.clone())?;
    }
    let captured = if request.resident_rows > 0 {
        resident_steps(request, &mut trainer)?
    } else if request.pinned && schedule == TrainSchedule::Batched && sample.len() == 2 {
        pinned_steps(request, &mut trainer, &sample)?
    } else {
        let x = vec![0.0f32; request.batch * request.model.values_per_sample()];
        let y = vec![0.0f32; request.batch * trainer.model().task().target_len()];
        let mut captured = request.trainer.capture;
        for _ in 0..request.steps {
            captured &= trainer
                .step(StepSource::host(&x, &y, request.batch))?
                .captured;
        }
        captured
    };
    evaluations(request, &mut trainer)?;
    let d = arena.diagnostics();
    Ok(SchedulePlan {
        schedule,
        captured,
        peak: d.peak_bytes_by_class,
        arena_bytes: d.capacity,
        capture_reserved_bytes: d.capture.reserved,
    })
}

/// The steps of a run whose training set lives on the device (loaded, zeroed, by the caller):
/// `steps` steps queued on its first rows and read back. Whether every step ran captured.
fn resident_steps<M: PlanModel>(
    request: &PlanRequest<M>,
    trainer: &mut Trainer<PlanBackend, f32, M::Model>,
) -> Result<bool> {
    let rows: Vec<usize> = (0..request.batch.min(request.resident_rows)).collect();
    let mut captured = request.trainer.capture;
    for _ in 0..request.steps {
        for r in trainer.queue(StepSource::loaded(&rows), request.readback_every.max(1))? {
            captured &= r.captured;
        }
    }
    for r in trainer.drain()? {
        captured &= r.captured;
    }
    Ok(captured)
}

/// The steps of a run fed from the host through pinned batches (`queue` of a pinned batch, two batches
/// in turn, as `ztrain` does): the two landing buffers are made on the device. Whether every
/// step ran captured.
fn pinned_steps<M: PlanModel>(
    request: &PlanRequest<M>,
    trainer: &mut Trainer<PlanBackend, f32, M::Model>,
    sample: &[usize],
) -> Result<bool> {
    let b = trainer.backend_rc().clone();
    let batches = [0, 1]
        .map(|_| {
            let targets = trainer.model().task().target_len();
            crate::PinnedBatch::with_targets(&*b, request.batch, sample[0], sample[1], targets)
        })
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let mut captured = request.trainer.capture;
    for k in 0..request.steps {
        let batch = &batches[usize::try_from(k % 2).unwrap_or(0)];
        for r in trainer.queue(StepSource::pinned(batch, request.batch), 1)? {
            captured &= r.captured;
        }
    }
    for r in trainer.drain()? {
        captured &= r.captured;
    }
    Ok(captured)
}

/// The evaluations a run makes after its steps: the validation set twice (two epochs), then
/// the training set once, each where it lives (see [`PlanRequest`]).
fn evaluations<M: PlanModel>(
    request: &PlanRequest<M>,
    trainer: &mut Trainer<PlanBackend, f32, M::Model>,
) -> Result<()> {
    let chunk = trainer.config().eval_batch.max(1);
    let per = request.model.values_per_sample();
    // One chunk from the host: every chunk's memory is reclaimed before the next.
    let from_host = |t: &Trainer<PlanBackend, f32, M::Model>, rows: usize| {
        let n = rows.min(chunk);
        let targets = t.model().task().target_len();
        t.evaluate_host(&vec![0.0f32; n * per], &vec![0.0f32; n * targets])
            .map(|_| ())
    };
    if request.validation_rows > 0 {
        for _ in 0..2 {
            if request.validation_on_device {
                trainer.evaluate(EvalSource::Validation)?;
            } else {
                from_host(trainer, request.validation_rows)?;
            }
        }
    }
    if request.train_eval_rows > 0 {
        if request.resident_rows > 0 {
            trainer.evaluate(EvalSource::Loaded)?;
        } else {
            from_host(trainer, request.train_eval_rows)?;
        }
    }
    Ok(())
}
