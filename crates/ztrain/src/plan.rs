//! `ztrain --plan`: the memory plan of the configured run (`zgrad::plan`), printed before any
//! training, as a table or (`--json`) as one JSON object. It needs no GPU: the plan runs on an
//! accounting-only simulated device, and the GPU is only asked how much memory it has.

use std::io::Write;

use serde_json::json;
use zcompute::AllocClass;
use zcompute::units::Bytes;
use zcompute::{ArenaConfig, EngineConfig};
use zgrad::{MemoryPlan, PlanRequest, SchedulePlan, TrainSchedule, XAssetConfig};

use crate::cli::{DataOn, DeviceChoice, Options};
use crate::console::Console;
use crate::data::placement::{self, DeviceRoom};
use crate::error::Result;
use crate::step::trainer_config;

/// The device the plan is checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A device with this name and memory (the GPU, or the simulated one of `--device sim`).
    Device { name: String, total: u64 },
    /// No usable GPU, and why.
    NoGpu { reason: String },
    /// `--device cpu`: no device memory is used.
    Cpu,
}

/// The model a plan is of, as the report names it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedModel {
    /// Its name and sizes (`XAsset L=1 D=256 ...`).
    pub line: String,
    /// Its sizes, the JSON's `model`.
    pub json: serde_json::Value,
    /// Target values per sample (`Task::target_len`): the training set's device bytes.
    pub targets: usize,
}

/// The plan and what it says about the chosen device.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanReport<M> {
    pub plan: MemoryPlan<M>,
    /// The model planned, as the report names it.
    pub model: PlannedModel,
    pub target: Target,
    /// The arena cap the run would have: `--arena-cap` (or its variable), else 3/4 of the
    /// device's memory; `None` when neither is known.
    pub cap: Option<u64>,
    /// Where the training set goes (`--data-on`, decided from the plan as the run decides).
    pub data: DataPlan,
}

/// The training set's place in a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataPlan {
    /// Samples of the training set (`None`: not known before the file is read).
    pub samples: Option<usize>,
    /// Its device bytes on the device (features, labels, indices).
    pub bytes: u64,
    /// Whether the plan holds it on the device (then it is in the persistent peak and the
    /// arena).
    pub on_device: bool,
    /// Samples of the validation set (`None`: not known before the file is read).
    pub validation_samples: Option<usize>,
    /// Its device bytes on the device (features, logits, chunk inputs).
    pub validation_bytes: u64,
    /// Whether the plan holds it on the device (evaluated there, captured with `--capture`).
    pub validation_on_device: bool,
}

impl<M> PlanReport<M> {
    /// Whether the device holds what the plan needs (`None`: no device to ask).
    #[must_use]
    pub fn fits(&self) -> Option<bool> {
        match &self.target {
            Target::Device { total, .. } => Some(self.plan.device_bytes() <= *total),
            _ => None,
        }
    }

    /// Whether the arena cap holds one step without overflow (`None`: cap unknown).
    #[must_use]
    pub fn cap_holds(&self) -> Option<bool> {
        self.cap.map(|c| c >= self.plan.arena_bytes())
    }
}

/// Makes the plan of `options` (XAsset of their sizes) and looks at the device they choose.
pub fn make(options: &Options) -> Result<PlanReport<XAssetConfig>> {
    let config = options.config()?;
    let m = config.model;
    let model = PlannedModel {
        line: format!(
            "XAsset L={} D={} H={} FF={} S={} F={}",
            m.layers, m.width, m.heads, m.ff, m.scales, m.features
        ),
        json: json!({"features": m.features, "scales": m.scales, "width": m.width,
                     "heads": m.heads, "ff": m.ff, "layers": m.layers}),
        targets: 1,
    };
    make_of(options, &config, m, model, &|config, batch| {
        check_sizes(config, batch)?;
        refuse_beyond_any_machine(config)
    })
}

/// [`make`] for any model (`zgrad::plan::PlanModel`) of the run `config`, named in the report
/// as `named` says; `checks` refuses sizes before any plan is made (a rank's batch given).
pub fn make_of<M: zgrad::plan::PlanModel>(
    options: &Options,
    config: &crate::config::RunConfig,
    model: M,
    named: PlannedModel,
    checks: &dyn Fn(&crate::config::RunConfig, usize) -> Result<()>,
) -> Result<PlanReport<M>> {
    let config = config.clone();
    let engine = options.arena.engine_config()?;
    let target = match options.device {
        DeviceChoice::Cpu => Target::Cpu,
        DeviceChoice::Sim => Target::Device {
            name: "the simulated device (--sim-memory)".into(),
            total: options.sim_memory,
        },
        DeviceChoice::Auto | DeviceChoice::Cuda => match crate::device::gpu_memory() {
            Ok((name, total)) => Target::Device { name, total },
            Err(reason) => Target::NoGpu { reason },
        },
    };
    // The arena the run would have: its fixed settings merged with what was given, then sized
    // from the plan of its steps (`sized_engine`, before the run places its sets); not checked
    // against the device: whether the device holds it is what the plan reports (a run with
    // these settings is refused before it starts). Then the run on that arena: the sets where
    // the run puts them, its steps, its evaluations.
    let batch = rank_batch(options, config.batch);
    checks(&config, batch)?;
    let world = usize::from(options.gpus).max(1);
    let total = match &target {
        Target::Device { total, .. } => *total,
        _ => SIZING_MAX_DEVICE_BYTES,
    };
    let schedules = [TrainSchedule::Batched, TrainSchedule::PerSample];
    let sizing = schedules
        .iter()
        .map(|&s| zgrad::plan::plan_schedule(&sizing_request(model.clone(), &config, batch), s))
        .collect::<zgrad::Result<Vec<_>>>()?;
    let sized = |s: &SchedulePlan| engine.overrides().clone().planned(s.peak).merged(total);
    let run_sizing = sizing
        .iter()
        .find(|s| s.schedule == config.schedule)
        .unwrap_or(&sizing[0]);
    let arena = sized(run_sizing);
    let cap = match &target {
        Target::Device { total, .. } => Some(arena.cap_for(*total)),
        _ => arena.cap_bytes,
    };
    let data = data_plan(
        options,
        &config,
        (&target, named.targets),
        cap,
        run_sizing.arena_bytes,
        world,
    )?;
    let mut request = run_request(model, &config, batch, world, arena);
    request.resident_rows = if data.on_device {
        data.samples.unwrap_or(0)
    } else {
        0
    };
    request.readback_every = options.readback_every;
    request.validation_on_device = data.validation_on_device;
    // Each schedule on the arena its own run would have (sized from its own plan).
    let plans = schedules
        .iter()
        .zip(&sizing)
        .map(|(&s, sizing)| {
            let mut r = request.clone();
            r.arena = sized(sizing);
            zgrad::plan::plan_schedule(&r, s)
        })
        .collect::<zgrad::Result<Vec<_>>>()?;
    let plan = MemoryPlan {
        request,
        schedules: plans,
    };
    Ok(PlanReport {
        plan,
        model: named,
        target,
        cap,
        data,
    })
}

/// Samples the run trains on and validates with: the synthetic set split as
/// `Dataset::split_validation` splits it (`None` for a CSV file, whose rows are not read
/// before the run).
fn split_samples(config: &crate::config::RunConfig) -> Option<(usize, usize)> {
    match &config.data {
        crate::config::DataSource::Synthetic { samples, .. } => {
            let n = *samples;
            let fraction = config.validate_fraction;
            let n_val = if fraction <= 0.0 || n == 0 {
                0
            } else {
                ((n as f64 * fraction).ceil() as usize).clamp(1, n)
            };
            Some((n - n_val, n_val)).filter(|&(t, _)| t > 0)
        }
        crate::config::DataSource::File { .. } => None,
    }
}

/// The plan request a run's arena is sized from (`sized_engine`): a rank's steps (batch
/// `batch`) on zmem's fixed arena defaults.
fn sizing_request<M>(model: M, config: &crate::config::RunConfig, batch: usize) -> PlanRequest<M> {
    PlanRequest::new(
        model,
        batch,
        trainer_config(config, 1),
        ArenaConfig::default(),
    )
}

/// The plan request of a run's rank (batch `batch` of `world` ranks) on `arena`, its sets on
/// the host (`make` places them): its steps from pinned batches, the validation pass (twice:
/// two epochs; a rank's shard) and the final evaluation of the training set. A CSV file's
/// sets are not counted yet: a chunk of `--batch` samples of each stands for them (a host
/// evaluation holds one chunk at a time).
#[must_use]
pub fn run_request<M>(
    model: M,
    config: &crate::config::RunConfig,
    batch: usize,
    world: usize,
    arena: ArenaConfig,
) -> PlanRequest<M> {
    let mut request = PlanRequest::new(model, batch, trainer_config(config, 1), arena);
    let (train, val) = split_samples(config).unwrap_or((config.batch, config.batch));
    let world = world.max(1);
    request.validation_rows = val.div_ceil(world);
    request.train_eval_rows = train;
    request.pinned = true;
    request
}

/// Where the sets go (`--data-on`, decided from the plan as the run decides): the training
/// set (`placement::on_device`), then the validation set in the room it leaves
/// (`placement::validation_on_device`). `plan_arena`: the arena of the run's plan with the
/// sets on the host.
fn data_plan(
    options: &Options,
    config: &crate::config::RunConfig,
    (target, targets): (&Target, usize),
    cap: Option<u64>,
    plan_arena: u64,
    world: usize,
) -> Result<DataPlan> {
    let split = split_samples(config);
    let per = config.model.scales * config.model.features;
    let every = options.readback_every;
    let bytes = split.map_or(0, |(n, _)| {
        resident_bytes((n, per, targets), config.batch, world, every)
    });
    let room = match (target, cap) {
        (Target::Device { .. }, Some(cap)) => Some(DeviceRoom {
            cap,
            plan: plan_arena,
        }),
        _ => None,
    };
    let on_device = match (split, options.data_on) {
        (None, _) | (_, DataOn::Host) => false,
        (Some(_), DataOn::Device) => true,
        (Some((n, _)), DataOn::Auto) => placement::on_device(
            DataOn::Auto,
            room,
            bytes,
            n,
            zgrad::max_device_rows::<f32>(),
        )?,
    };
    let chunk = trainer_config(config, 1).eval_batch;
    let val_rows = split.map(|(_, v)| v);
    let validation_bytes = val_rows.map_or(0, |v| {
        zgrad::validation_data_bytes(v.div_ceil(world), per, chunk, 4)
    });
    let taken = if on_device { bytes } else { 0 };
    let validation_on_device = val_rows.is_some_and(|v| v > 0)
        && placement::validation_on_device(options.data_on, room, taken, validation_bytes);
    Ok(DataPlan {
        samples: split.map(|(t, _)| t),
        bytes,
        on_device,
        validation_samples: val_rows,
        validation_bytes,
        validation_on_device,
    })
}

/// Device bytes of a training set of `n` samples of `per` values and `targets` target values
/// on the device for a run of
/// `batch` samples a step on `world` ranks read back every `every` steps: the set and its
/// index buffer (`zgrad::device_data_bytes`) and the queued steps' table of a window's
/// indices (`zgrad::step_table_bytes`, the largest shard's rows).
#[must_use]
pub fn resident_bytes(
    (n, per, targets): (usize, usize, usize),
    batch: usize,
    world: usize,
    every: usize,
) -> u64 {
    let rows = zgrad::shard(0, world.max(1), batch.min(n)).len();
    zgrad::device_data_bytes(n, per, targets, 4)
        .saturating_add(zgrad::step_table_bytes(every, rows, 4))
}

/// Largest device estimate (`budget::Estimate::device`) a run's arena is sized from its plan
/// for: no GPU holds more, and such a run is refused when its device opens.
pub const SIZING_MAX_DEVICE_BYTES: u64 = 1 << 40;

/// The engine configuration of a run, its arena sized from the run's plan: the peaks of the
/// run's schedule (a rank's batch with `world` ranks) become the defaults of the arena's sizes
/// (zmem's `ArenaOverrides::planned`), so the arena holds about what the steps need instead of
/// 64 MiB segments and a 64 MiB overflow reserve; a size the user gave (option or variable)
/// still wins. The plan runs on the accounting device with zmem's fixed defaults (the peaks do
/// not depend on the segment size), so a refused option is still refused by the engine, named
/// by its flag.
pub fn sized_engine(
    engine: EngineConfig,
    config: &crate::config::RunConfig,
    world: usize,
) -> Result<EngineConfig> {
    Ok(sized_engine_and_plan(engine, config, world)?.0)
}

/// [`sized_engine`], and the plan it sized the arena from (`None` where it did not plan).
pub fn sized_engine_and_plan(
    engine: EngineConfig,
    config: &crate::config::RunConfig,
    world: usize,
) -> Result<(EngineConfig, Option<SchedulePlan>)> {
    // A step never holds more samples than the data set has (the estimate's rule too).
    let samples = match &config.data {
        crate::config::DataSource::Synthetic { samples, .. } => *samples,
        crate::config::DataSource::File { .. } => usize::MAX,
    };
    let batch = config.batch.min(samples).div_ceil(world.max(1));
    if check_sizes(config, batch).is_err() {
        // A batch this host could not hold for the plan's step (a CSV file's rows are not
        // counted yet): zmem's fixed defaults, the arena growing as the steps need.
        tracing::debug!(target: "ztrain.plan", batch, "batch too large to plan; arena not sized");
        return Ok((engine, None));
    }
    let planned = zgrad::plan::plan_schedule(
        &sizing_request(config.model, config, batch),
        config.schedule,
    )?;
    tracing::debug!(
        target: "ztrain.plan",
        peaks = %planned.peak,
        "arena sized from the plan"
    );
    let overrides = engine.overrides().clone().planned(planned.peak);
    Ok((engine.arena(overrides), Some(planned)))
}

/// [`sized_engine_and_plan`] for any model (`zgrad::plan::PlanModel`: a model's `FitModel`
/// gives one by default): the run's schedule planned for a rank's batch on zmem's fixed arena
/// defaults, the arena sized from its peaks.
pub fn sized_engine_and_plan_of<M: zgrad::plan::PlanModel>(
    engine: EngineConfig,
    config: &crate::config::RunConfig,
    world: usize,
    model: M,
) -> Result<(EngineConfig, Option<SchedulePlan>)> {
    let samples = match &config.data {
        crate::config::DataSource::Synthetic { samples, .. } => *samples,
        crate::config::DataSource::File { .. } => usize::MAX,
    };
    let batch = config.batch.min(samples).div_ceil(world.max(1));
    let request = PlanRequest::new(
        model,
        batch,
        trainer_config(config, 1),
        ArenaConfig::default(),
    );
    let planned = zgrad::plan::plan_schedule(&request, config.schedule)?;
    tracing::debug!(target: "ztrain.plan", peaks = %planned.peak, "arena sized from the plan");
    let overrides = engine.overrides().clone().planned(planned.peak);
    Ok((engine.arena(overrides), Some(planned)))
}

fn schedule_name(s: TrainSchedule) -> &'static str {
    match s {
        TrainSchedule::Batched => "batched",
        TrainSchedule::PerSample => "per-sample",
    }
}

/// The classes in the order of the table and the JSON.
const CLASSES: [AllocClass; 5] = [
    AllocClass::Persistent,
    AllocClass::Saved,
    AllocClass::Scratch,
    AllocClass::Graph,
    AllocClass::Shadow,
];

fn schedule_json<M>(plan: &MemoryPlan<M>, s: &SchedulePlan) -> serde_json::Value {
    let peak: serde_json::Map<String, serde_json::Value> = CLASSES
        .iter()
        .map(|c| (c.name().to_string(), json!(s.peak.get(*c))))
        .collect();
    json!({
        "schedule": schedule_name(s.schedule),
        "captured": s.captured,
        "peak_bytes": peak,
        "arena_bytes": s.arena_bytes,
        "capture_reserved_bytes": s.capture_reserved_bytes,
        "device_bytes": plan.device_bytes_for(s),
    })
}

/// The report as one JSON object (`--plan --json`).
#[must_use]
pub fn to_json<M>(r: &PlanReport<M>) -> serde_json::Value {
    let req = &r.plan.request;
    let device = match &r.target {
        Target::Device { name, total } => json!({"name": name, "total_bytes": total}),
        Target::NoGpu { reason } => json!({"name": null, "no_gpu": reason}),
        Target::Cpu => json!({"name": "cpu"}),
    };
    json!({
        "model": r.model.json,
        "batch": req.batch,
        "capture": req.trainer.capture,
        "steps": req.steps,
        "schedules": r.plan.schedules.iter().map(|s| schedule_json(&r.plan, s)).collect::<Vec<_>>(),
        "arena_bytes": r.plan.arena_bytes(),
        "overflow_reserve_bytes": req.arena.overflow_reserve_bytes,
        "blas_workspace_bytes": req.blas_workspace_bytes,
        "device_bytes": r.plan.device_bytes(),
        "arena_cap_bytes": r.cap,
        "arena_cap_holds": r.cap_holds(),
        "device": device,
        "fits": r.fits(),
        "training_set": {"samples": r.data.samples, "bytes": r.data.bytes,
                         "on_device": r.data.on_device},
        "validation_set": {"samples": r.data.validation_samples,
                           "bytes": r.data.validation_bytes,
                           "on_device": r.data.validation_on_device},
    })
}

/// The report as the lines `program --plan` prints (`ztrain --plan: ...`).
#[must_use]
pub fn to_lines<M>(r: &PlanReport<M>, program: &str) -> Vec<String> {
    let req = &r.plan.request;
    let mut lines = vec![
        format!(
            "{program} --plan: {}, batch {}, {} ({} steps per schedule on an accounting-only simulated device)",
            r.model.line,
            req.batch,
            if req.trainer.capture {
                "captured"
            } else {
                "eager"
            },
            req.steps
        ),
        format!(
            "{:<11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            "schedule", "persistent", "saved", "scratch", "graph", "shadow", "arena", "device"
        ),
    ];
    for s in &r.plan.schedules {
        let mut row = format!("{:<11}", schedule_name(s.schedule));
        for c in CLASSES {
            row.push_str(&format!(" {:>11}", Bytes(s.peak.get(c)).to_string()));
        }
        row.push_str(&format!(
            " {:>11} {:>11}",
            Bytes(s.arena_bytes).to_string(),
            Bytes(r.plan.device_bytes_for(s)).to_string()
        ));
        if req.trainer.capture && !s.captured {
            row.push_str(" (capture fell back to eager)");
        }
        lines.push(row);
    }
    let worst = r
        .plan
        .schedules
        .iter()
        .max_by_key(|s| r.plan.device_bytes_for(s));
    lines.push(match (r.data.samples, r.data.on_device) {
        (Some(n), true) => format!(
            "training set on the device: {n} samples, {} (in the persistent peak and the arena above; --data-on host keeps it off)",
            Bytes(r.data.bytes)
        ),
        (Some(n), false) => format!(
            "training set on the host: {n} samples ({} on the device would not fit the arena cap with the margin, or --data-on host)",
            Bytes(r.data.bytes)
        ),
        (None, _) => "training set: a CSV file, not counted (its rows are read when the run starts)".into(),
    });
    lines.push(match (r.data.validation_samples, r.data.validation_on_device) {
        (Some(0), _) => "validation set: none (--validate-fraction 0)".into(),
        (Some(n), true) => format!(
            "validation set on the device: {n} samples, {} (evaluated there every epoch, in the plan above with its pass)",
            Bytes(r.data.validation_bytes)
        ),
        (Some(n), false) => format!(
            "validation set on the host: {n} samples ({} on the device would not fit beside the training set, or --data-on host); its pass is in the plan above",
            Bytes(r.data.validation_bytes)
        ),
        (None, _) => "validation set: from a CSV file, a chunk of its pass counted (its rows are read when the run starts)".into(),
    });
    lines.push(format!(
        "arena that holds one step without overflow: {} (--arena-cap)",
        Bytes(r.plan.arena_bytes())
    ));
    if let Some(s) = worst {
        lines.push(format!(
            "device memory needed: {} = arena {} + capture reservations {} + overflow reserve {} + cuBLAS workspace {} ({})",
            Bytes(r.plan.device_bytes()),
            Bytes(s.arena_bytes),
            Bytes(s.capture_reserved_bytes),
            Bytes(req.arena.overflow_reserve_bytes),
            Bytes(req.blas_workspace_bytes),
            schedule_name(s.schedule)
        ));
    }
    lines.push(match (&r.target, r.fits()) {
        (Target::Device { name, total }, Some(true)) => {
            format!("device: {name} ({}): it fits", Bytes(*total))
        }
        (Target::Device { name, total }, _) => format!(
            "device: {name} ({}): it does NOT fit (short by {})",
            Bytes(*total),
            Bytes(r.plan.device_bytes().saturating_sub(*total))
        ),
        (Target::NoGpu { reason }, _) => format!(
            "device: no usable GPU on this machine ({reason}); the plan holds for any GPU with at least {}",
            Bytes(r.plan.device_bytes())
        ),
        (Target::Cpu, _) => "device: --device cpu uses no device memory; the plan is for a GPU".into(),
    });
    if let (Some(cap), Some(holds)) = (r.cap, r.cap_holds()) {
        lines.push(if holds {
            format!("arena cap {}: holds one step", Bytes(cap))
        } else {
            format!(
                "arena cap {}: too small, the step would overflow; raise --arena-cap to at least {}",
                Bytes(cap),
                Bytes(r.plan.arena_bytes())
            )
        });
    }
    lines
}

/// The run's own size checks (checked arithmetic for every size: the run refuses what would
/// wrap), and the plan's step input in host memory: it runs one step on an all-zero batch,
/// so the batch's values must fit the host (half of what is available).
pub fn check_sizes(config: &crate::config::RunConfig, batch: usize) -> Result<()> {
    crate::budget::Estimate::of(config)?;
    let m = &config.model;
    let bytes = [m.scales, m.features, 4]
        .iter()
        .try_fold(batch as u64, |acc, &n| acc.checked_mul(n as u64));
    let limit = crate::budget::host_available().map_or(u64::MAX, |a| a / 2);
    match bytes {
        Some(b) if b <= limit => Ok(()),
        _ => Err(crate::error::TrainError::Options(format!(
            "--plan: a batch of {batch} samples of {}x{} values does not fit this host's memory (the plan runs one step on it); lower --batch",
            m.scales, m.features
        ))),
    }
}

/// A run whose device memory passes what any machine holds ([`SIZING_MAX_DEVICE_BYTES`]) is
/// refused before it is planned (the plan's step on the accounting device would only give up
/// on it, "timed out ... waiting for event"), naming the size option that makes the need: the
/// one that, back at its default, shrinks the need the most.
fn refuse_beyond_any_machine(config: &crate::config::RunConfig) -> Result<()> {
    use crate::budget::Estimate;
    use crate::config::RunConfig;
    let estimate = Estimate::of(config)?;
    let need = estimate.device()?;
    if need <= SIZING_MAX_DEVICE_BYTES {
        return Ok(());
    }
    let defaults = <Options as clap::Parser>::try_parse_from(["ztrain"])
        .map_err(|e| crate::error::TrainError::Options(e.to_string()))?
        .config()?;
    type Reset = fn(&mut RunConfig, &RunConfig);
    let sizes: [(&str, usize, usize, Reset); 7] = [
        (
            "--width",
            config.model.width,
            defaults.model.width,
            |c, d| {
                c.model.width = d.model.width;
            },
        ),
        ("--ff", config.model.ff, defaults.model.ff, |c, d| {
            c.model.ff = d.model.ff;
        }),
        (
            "--layers",
            config.model.layers,
            defaults.model.layers,
            |c, d| {
                c.model.layers = d.model.layers;
            },
        ),
        (
            "--heads",
            config.model.heads,
            defaults.model.heads,
            |c, d| {
                c.model.heads = d.model.heads;
            },
        ),
        (
            "--scales",
            config.model.scales,
            defaults.model.scales,
            |c, d| {
                c.model.scales = d.model.scales;
            },
        ),
        (
            "--features",
            config.model.features,
            defaults.model.features,
            |c, d| {
                c.model.features = d.model.features;
            },
        ),
        ("--batch", config.batch, defaults.batch, |c, d| {
            c.batch = d.batch
        }),
    ];
    let need_with_default = |reset: Reset| {
        let mut c = config.clone();
        reset(&mut c, &defaults);
        Estimate::of(&c)
            .and_then(|e| e.device())
            .unwrap_or(u64::MAX)
    };
    let (name, value, default, reset) = sizes
        .iter()
        .copied()
        .min_by_key(|&(_, _, _, reset)| need_with_default(reset))
        .unwrap_or(sizes[0]);
    Err(crate::error::TrainError::OutOfMemory {
        needed: format!(
            "about {} of device memory with {name} {value} (model and optimiser {}, activations {})",
            Bytes(need),
            Bytes(estimate.model),
            Bytes(estimate.activations)
        ),
        available: format!(
            "no device holds more than {}",
            Bytes(SIZING_MAX_DEVICE_BYTES)
        ),
        advice: format!(
            "lower {name} (at its default, {default}, the run needs about {})",
            Bytes(need_with_default(reset))
        ),
    })
}

/// The batch one rank trains on: with `--gpus N` the global batch is split over the ranks,
/// and the largest shard (rank 0's, zgrad's `shard`) is the one every rank must hold.
fn rank_batch(options: &Options, batch: usize) -> usize {
    batch.div_ceil(usize::from(options.gpus).max(1))
}

/// Makes and prints the plan of `options` (`--json`: one JSON object): one plan, a rank's
/// (with `--gpus N`, every rank's shard is at most the one planned).
pub fn print(options: &Options, out: &mut dyn Write) -> Result<PlanReport<XAssetConfig>> {
    let report = make(options)?;
    print_report("ztrain", options, &report, out)?;
    Ok(report)
}

/// Prints `report`, the plan of `options`' run, as [`print()`] does.
pub fn print_report<M>(
    program: &str,
    options: &Options,
    report: &PlanReport<M>,
    out: &mut dyn Write,
) -> Result<()> {
    let ranks = usize::from(options.gpus);
    let global = options.config()?.batch;
    let mut console = Console::new(out, program);
    if options.json {
        let mut v = to_json(report);
        v["ranks"] = json!(ranks);
        v["global_batch"] = json!(global);
        console.line(&v.to_string());
    } else {
        for line in to_lines(report, program) {
            console.line(&line);
        }
        if ranks > 1 {
            console.line(&format!(
                "per rank: each of the {ranks} ranks (one GPU each) trains at most {} of the global batch of {global}; the plan is a rank's",
                report.plan.request.batch
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
