//! The training run: the checks before it (outputs, memory, arena options), data, model,
//! epochs, validation, checkpoints and stops (`--stop-after`, SIGINT/SIGTERM); `summary` ends
//! it. Output lines go to the writer the caller passes (stdout from `main`, a buffer in tests)
//! through a `Console`, so a closed stdout never stops training; the progress bar goes to
//! stderr when it is a terminal.

use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use zcomm::{Collective, LaunchEnv};

use zcompute::units::Bytes;
use zgrad::{StepReport, Trainer, XAsset, XAssetConfig};

use crate::arena_options;
use crate::budget::{Estimate, host_available};
use crate::checkpoint::Progress;
use crate::cli::{DeviceChoice, Options};
use crate::config::{DataSource, RunConfig, fnv1a};
use crate::console::Console;
use crate::data::feed::Feed;
use crate::data::placement::{self, DeviceRoom};
use crate::data::{self, Dataset, epoch_order};
use crate::device::{self, AnyBackend};
use crate::distributed::Role;
use crate::error::{Result, TrainError};
use crate::files::{self, Named};
use crate::memory::MemorySource;
use crate::progress::EpochBar;
use crate::resume::{ResumeAt, checkpoint_of, resume};
use crate::rng::Rng;
use crate::signals::{self, StopSignal};
use crate::soak::Soak;
use crate::step::{Tally, TrainBackend, trainer_config};

pub use crate::summary::Outcome;
use crate::summary::{End, Ended, Throughput, finish, sample_memory};
use crate::timeline::{StepTimes, Timeline};

/// Salt of the data-order generator, so it never equals the initialisation's stream.
const ORDER_SALT: u64 = 0x6f72_6465_725f_7267;

/// Checks every output against the inputs and each other, and that it can be written, before
/// anything trains (`crate::files`).
fn check_files(options: &Options) -> Result<()> {
    fn named<'a>(option: &'static str, path: &'a Option<PathBuf>) -> Option<Named<'a>> {
        path.as_deref().map(|path| Named { option, path })
    }
    let outputs: Vec<Named<'_>> = [
        named("--checkpoint", &options.checkpoint),
        named("--memory-report", &options.memory_report),
        named("--soak-report", &options.soak_report),
        named("--timeline", &options.timeline),
    ]
    .into_iter()
    .flatten()
    .collect();
    let inputs: Vec<Named<'_>> = [
        named("--data", &options.data),
        named("--resume", &options.resume),
        named("--init-from", &options.init_from),
    ]
    .into_iter()
    .flatten()
    .collect();
    files::check_outputs(&outputs, &inputs, &[("--checkpoint", "--resume")])
}

/// Parses nothing: runs what `options` say, writing progress lines to `out` (a closed `out`
/// stops the printing, not the run). `show_bar`: draw the progress bar on stderr (when it is a
/// terminal). `stop`: a signal asking the run to stop after the current step.
pub fn run(
    options: &Options,
    out: &mut dyn Write,
    show_bar: bool,
    stop: &StopSignal,
) -> Result<Outcome> {
    if options.plan {
        let report = crate::plan::print(options, out)?;
        tracing::debug!(target: "ztrain.plan", fits = ?report.fits(), "memory plan printed");
        return Ok(Outcome {
            steps: 0,
            stopped_early: false,
            interrupted: None,
            train: None,
            validation: None,
        });
    }
    let env = match crate::distributed::role(options)? {
        Role::Rank(env) => env,
        Role::Single => LaunchEnv::SINGLE,
        Role::Launcher(n) => {
            return Err(TrainError::Options(format!(
                "--gpus {n}: the ranks are started by the ztrain command (or by a launcher that sets RANK and WORLD_SIZE)"
            )));
        }
    };
    // Rank 0 alone prints, writes checkpoints (`save` in `train`) and reports.
    let mut sink = std::io::sink();
    let quiet;
    let (options, out, show_bar): (&Options, &mut dyn Write, bool) = if env.info.rank > 0 {
        quiet = Options {
            memory_report: None,
            soak_report: None,
            timeline: None,
            ..options.clone()
        };
        (&quiet, &mut sink, false)
    } else {
        (options, out, show_bar)
    };
    let config = options.config()?;
    let (opened, room) = open_backend(options, &env, &config)?;
    let mut console = Console::new(out);
    console.line(&format!("ztrain: {}", opened.description));
    if env.info.world > 1 {
        console.line(&format!(
            "ztrain: rank 0 of a data-parallel job of {} ranks (one process each); --batch {} is the global batch, split over them",
            env.info.world, config.batch
        ));
    }
    let name = opened.backend.backend_name();
    let d = opened.description.as_str();
    let ctx = Context {
        options,
        world: env.info.world,
        rank: env.info.rank,
        config: &config,
        backend_name: name,
        description: d,
        show_bar,
        stop,
        room,
    };
    let ranks = (env.info.world > 1).then_some(&env);
    let timeout = crate::distributed::comm_timeout(options)?;
    match opened.backend {
        AnyBackend::Cpu(_) if ranks.is_some() => Err(TrainError::Options(format!(
            "rank {} of {}: the {} cannot be a rank of a job; use --device cuda or --device sim",
            env.info.rank, env.info.world, d
        ))),
        AnyBackend::Cpu(b) => train(b, None, &ctx, &mut console),
        AnyBackend::Cuda(b) => {
            let comm = ranks
                .map(|e| crate::distributed::nccl_collective(&b, e, timeout, stop))
                .transpose()?;
            train(b, comm, &ctx, &mut console)
        }
        AnyBackend::Sim(b) => {
            let comm = ranks
                .map(|e| crate::distributed::sim_collective(&b, e, timeout, stop))
                .transpose()?;
            train(b, comm, &ctx, &mut console)
        }
    }
}

/// The checks before the device opens (outputs, the memory estimate against the host and the
/// device), the arena's settings (options, the run's plan) and the backend itself.
fn open_backend(
    options: &Options,
    env: &LaunchEnv,
    config: &RunConfig,
) -> Result<(device::Opened, Option<DeviceRoom>)> {
    let mut engine = options.arena.engine_config()?;
    if env.info.world > 1 {
        // A rank's every wait, a collective whose peer died included, ends at --comm-timeout
        // with a typed error of its own (the device's default deadline may be longer).
        engine = engine.sync_deadline(crate::distributed::comm_timeout(options)?);
    }
    check_files(options)?;
    let estimate = Estimate::of(config)?;
    let mut sim_arena = 0;
    if options.device == DeviceChoice::Sim {
        // The simulated device's memory is known now: its options first, before the host.
        let arena = engine
            .arena_config(options.sim_memory)
            .map_err(arena_options::refused)?;
        sim_arena = arena
            .initial_bytes
            .saturating_add(arena.overflow_reserve_bytes);
    }
    match options.device {
        DeviceChoice::Cpu => estimate.check_host(estimate.device()?)?,
        DeviceChoice::Sim => estimate.check_host(estimate.device()?.max(sim_arena))?,
        DeviceChoice::Auto | DeviceChoice::Cuda => estimate.check_host(0)?,
    }
    // The arena's sizes from the run's plan (after the checks above: the plan steps on a batch
    // in host memory), unless the user gave them. A run the device cannot hold is refused by
    // the estimate once the device is open: not planned first (a plan's time grows with it).
    let bound = match options.device {
        DeviceChoice::Sim => options.sim_memory,
        _ => crate::plan::SIZING_MAX_DEVICE_BYTES,
    };
    let mut planned = None;
    if options.device != DeviceChoice::Cpu && estimate.device()? <= bound {
        (engine, planned) = crate::plan::sized_engine_and_plan(engine, config, env.info.world)?;
    }
    let ordinal = u32::try_from(env.info.local_rank)
        .map_err(|_| TrainError::Options("LOCAL_RANK does not fit a device ordinal".into()))?;
    let opened = device::open_on(options.device, &engine, options.sim_memory, ordinal)?;
    if let Some(total) = opened.backend.device_memory() {
        let (name, raise) = match opened.backend {
            AnyBackend::Sim(_) => (
                "the simulated device (--sim-memory)",
                ", or raise --sim-memory",
            ),
            _ => ("the GPU", ""),
        };
        estimate.check_device(total, name, raise)?;
    }
    if options.memory_report.is_some() && matches!(opened.backend, AnyBackend::Cpu(_)) {
        return Err(TrainError::MemoryReport(format!(
            "the {} has no device arena to report on; use --device sim (or cuda)",
            opened.description
        )));
    }
    if options.device == DeviceChoice::Auto && matches!(opened.backend, AnyBackend::Cpu(_)) {
        estimate.check_host(estimate.device()?)?;
    }
    let room = opened
        .backend
        .device_memory()
        .map(|total| device_room(&engine, planned.as_ref(), &estimate, total));
    Ok((opened, room))
}

/// Device memory the data sets may take on a device of `total` bytes: the arena's cap less
/// the run's plan (its arena; the estimate where the run was not planned).
pub(crate) fn device_room(
    engine: &zcompute::EngineConfig,
    planned: Option<&zgrad::SchedulePlan>,
    estimate: &Estimate,
    total: u64,
) -> DeviceRoom {
    DeviceRoom {
        cap: engine
            .arena_config(total)
            .ok()
            .and_then(|a| a.cap_bytes)
            .unwrap_or(total / 4 * 3),
        plan: planned
            .map(|p| p.arena_bytes)
            .unwrap_or_else(|| estimate.device().unwrap_or(u64::MAX)),
    }
}

/// What a run's training loop reads.
pub(crate) struct Context<'a> {
    pub(crate) options: &'a Options,
    /// Ranks of the job (1: a single process), and this one's.
    pub(crate) world: usize,
    pub(crate) rank: usize,
    pub(crate) config: &'a RunConfig,
    /// The backend's short name (for checkpoints) and its description.
    pub(crate) backend_name: &'a str,
    pub(crate) description: &'a str,
    pub(crate) show_bar: bool,
    pub(crate) stop: &'a StopSignal,
    /// Device memory the training set may take (`None` on the CPU backend).
    pub(crate) room: Option<DeviceRoom>,
}

/// Loads or generates the data set; returns it with the CSV file's digest. The file is read
/// once (a pipe works), bounded by the host's available memory.
fn load_data(config: &RunConfig) -> Result<(Dataset, Option<u64>)> {
    let m = &config.model;
    match &config.data {
        DataSource::Synthetic { samples, seed } => Ok((
            data::synthetic::generate(*samples, m.scales, m.features, *seed),
            None,
        )),
        DataSource::Csv { path } => {
            // Parsing holds the text and the values (about as large): a quarter of what is free.
            let limit = host_available().map_or(u64::MAX, |a| a / 4);
            let bytes = files::read_bounded(
                path,
                "reading the data file",
                limit,
                "a quarter of the host's available memory: the text and its values must fit",
            )?;
            let digest = fnv1a(&bytes);
            Ok((
                data::csv::load_bytes(path, &bytes, m.scales, m.features)?,
                Some(digest),
            ))
        }
    }
}

/// The most bytes a checkpoint of `params` parameters and `n_train` samples can take: the
/// parameters and both moments, the data order, and a header well under a MiB.
fn checkpoint_limit(params: u64, n_train: usize) -> u64 {
    params
        .saturating_mul(12)
        .saturating_add((n_train as u64).saturating_mul(8))
        .saturating_add(1 << 20)
}

pub(crate) fn train<B: TrainBackend + MemorySource>(
    b: B,
    comm: Option<Rc<dyn Collective<B, f32>>>,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
) -> Result<Outcome> {
    let (config, options) = (ctx.config, ctx.options);
    let started = Instant::now();
    let (dataset, digest) = load_data(config)?;
    let (train_set, val_set) = dataset.split_validation(config.validate_fraction);
    if train_set.is_empty() {
        return Err(TrainError::Options(
            "no training samples left after the validation split".into(),
        ));
    }
    let mut config_json = config.to_json(digest);
    if ctx.world > 1 {
        // Checkpoints record the job's ranks: a resume with another number is refused.
        config_json["world"] = serde_json::json!(ctx.world);
    }
    let n_train = train_set.len();
    let limit = checkpoint_limit(crate::config::parameters(&config.model)?, n_train);
    let mut learner = new_learner(&b, ctx, n_train, limit)?;
    let progress = start(&mut learner, ctx, &config_json, n_train, limit, out)?;
    // The ranks agree on a stop signal where the steps are read back (one tiny all-reduce).
    let agree = comm.clone();
    if let Some(c) = comm {
        // Every rank starts from rank 0's parameters (restored from the checkpoint alike).
        learner = learner
            .with_collective(c)?
            .with_grad_sync(crate::distributed::grad_sync(options)?)?;
    }
    let rng = Rng::from_state(progress.rng).ok_or_else(|| TrainError::CheckpointCorrupt {
        path: options.resume.clone().unwrap_or_default(),
        reason: "generator state is all zero".into(),
    })?;
    out.line(&header(config, n_train, val_set.len())?);
    if let Some(path) = &options.init_from {
        out.line(&format!(
            "ztrain: parameters from {} (optimiser moments zero, step 0)",
            path.display()
        ));
    }
    let feed = feed_of(&mut learner, &train_set, ctx, out)?;
    validation_of(&mut learner, &val_set, &train_set, &feed, ctx, out)?;
    let mut run = Epochs {
        b: &b,
        learner,
        progress,
        rng,
        feed,
        train_set: &train_set,
        val_set: &val_set,
        agree,
        ctx,
        config_json: &config_json,
        soak: options
            .soak_report
            .as_ref()
            .map(|_| Soak::new(options.soak_every)),
        validation: None,
        training: Throughput::default(),
        started,
        timeline: options.timeline.as_ref().map(|_| Timeline::default()),
    };
    let ended = run.all(out)?;
    if let (Some(t), Some(path)) = (run.timeline.as_mut(), &options.timeline) {
        // Every step's events are behind this wait.
        b.synchronize()?;
        t.resolve(&b, 0);
        t.write(path)?;
        out.line(&t.summary());
        out.line(&format!("timeline: {}", path.display()));
    }
    let end = End {
        started,
        steps: run.progress.step,
        training: run.training,
        ended,
        soak: run.soak.as_ref(),
        config: &config_json,
    };
    conclude(
        &b,
        &run.learner,
        &run.feed,
        ctx,
        out,
        &end,
        &train_set,
        run.validation,
    )
}

/// Where the training set lives (`--data-on`), loaded there, said in one line.
fn feed_of<B: TrainBackend>(
    learner: &mut Trainer<B>,
    train_set: &Dataset,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
) -> Result<Feed<B>> {
    let bytes = zgrad::device_data_bytes(train_set.len(), train_set.sample_width(), 4);
    let rows = zgrad::max_device_rows::<f32>();
    let on_device =
        placement::on_device(ctx.options.data_on, ctx.room, bytes, train_set.len(), rows)?;
    let every = ctx.options.readback_every;
    out.line(&if on_device {
        format!(
            "ztrain: training set on the device ({}; each step's rows gathered there), read back every {every} steps",
            Bytes(bytes)
        )
    } else {
        format!(
            "ztrain: training set on the host (each step's rows staged in pinned memory, two batches in turn), read back every {every} steps"
        )
    });
    Ok(Feed::new(
        learner,
        train_set,
        on_device,
        ctx.config.batch,
        every,
    )?)
}

/// Puts the validation set on the device when it fits beside the training set
/// (`placement::validation_on_device`), said in one line; else it is evaluated from the host.
fn validation_of<B: TrainBackend>(
    learner: &mut Trainer<B>,
    val_set: &Dataset,
    train_set: &Dataset,
    feed: &Feed<B>,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
) -> Result<()> {
    if val_set.is_empty() {
        return Ok(());
    }
    let per = val_set.sample_width();
    let taken = match feed {
        Feed::Device { .. } => zgrad::device_data_bytes(train_set.len(), per, 4),
        Feed::Host { .. } => 0,
    };
    let chunk = learner.config().eval_batch;
    let bytes = zgrad::validation_data_bytes(val_set.len(), per, chunk, 4);
    if placement::validation_on_device(ctx.options.data_on, ctx.room, taken, bytes) {
        learner.load_validation(&val_set.x, &val_set.y, val_set.len())?;
        out.line(&format!(
            "ztrain: validation set on the device ({}; evaluated in chunks of {chunk}{}, read back once an epoch)",
            Bytes(bytes),
            if ctx.config.capture { ", captured" } else { "" }
        ));
    }
    Ok(())
}

/// Says a rank's failure at once (tearing the rank down after a dead peer may wait on the
/// device up to its deadline, and the launcher may take the rank down first).
fn rank_error(ctx: &Context<'_>, e: zgrad::GradError) -> TrainError {
    let e = TrainError::from(e);
    if ctx.world > 1 {
        tracing::error!(
            target: "ztrain.rank",
            rank = ctx.rank,
            error = %crate::error::report(&e),
            "training stopped"
        );
    }
    e
}

/// The epochs of a run and what they carry from step to step.
struct Epochs<'a, 'c, B: TrainBackend + MemorySource> {
    b: &'a B,
    learner: Trainer<B>,
    progress: Progress,
    rng: Rng,
    feed: Feed<B>,
    train_set: &'a Dataset,
    val_set: &'a Dataset,
    agree: Option<Rc<dyn Collective<B, f32>>>,
    ctx: &'a Context<'c>,
    config_json: &'a serde_json::Value,
    soak: Option<Soak>,
    validation: Option<Tally>,
    training: Throughput,
    started: Instant,
    /// `--timeline`: each step's host phases and GPU span.
    timeline: Option<Timeline>,
}

impl<B: TrainBackend + MemorySource> Epochs<'_, '_, B> {
    /// Rank 0 writes the checkpoint (when one was asked for) of the progress so far.
    fn save(&mut self) -> Result<()> {
        self.progress.rng = self.rng.state();
        match &self.ctx.options.checkpoint {
            Some(path) if self.ctx.rank == 0 => checkpoint_of(
                &self.learner,
                &self.progress,
                self.config_json,
                self.ctx.backend_name,
            )?
            .save(path),
            _ => Ok(()),
        }
    }

    /// Reads back every step not read back yet into `tally`.
    fn flush(&mut self, tally: &mut Tally) -> Result<()> {
        let reports = self
            .feed
            .flush(&mut self.learner)
            .map_err(|e| rank_error(self.ctx, e))?;
        absorb(tally, &reports);
        if let Some(t) = self.timeline.as_mut() {
            // The read-back waited for every step queued, their events included.
            t.add_readback(self.learner.take_host_phases().readback);
            t.resolve(self.b, 0);
        }
        Ok(())
    }

    /// The stop signal after step `step`: this process's own in a job of one (a flag, read
    /// every step); in a job of several, the one the ranks agree on where every step has
    /// been read back (the same steps on every rank, so they all stop after the same one).
    fn signal(&self) -> Result<Option<i32>> {
        if self.ctx.world > 1 && !self.feed.settled(&self.learner) {
            return Ok(None);
        }
        crate::signals::agreed(
            self.ctx.stop,
            self.agree.as_ref(),
            self.b,
            self.progress.step,
        )
    }

    /// Every epoch left, or until a stop.
    fn all(&mut self, out: &mut Console<'_>) -> Result<Ended> {
        let epochs = self.ctx.config.epochs as u64;
        while self.progress.epoch < epochs {
            if let Some(ended) = self.epoch(out)? {
                return Ok(ended);
            }
        }
        Ok(Ended::Finished)
    }

    /// One epoch (or what is left of it): its steps, then validation, the checkpoint and
    /// the epoch's line. `Some` when the run stops here.
    fn epoch(&mut self, out: &mut Console<'_>) -> Result<Option<Ended>> {
        let (ctx, n_train) = (self.ctx, self.train_set.len());
        let epochs = ctx.config.epochs as u64;
        let order: Vec<usize> = self.progress.order.iter().map(|&i| i as usize).collect();
        let bar = EpochBar::new(
            self.progress.epoch + 1,
            epochs,
            n_train as u64,
            self.progress.position,
            ctx.show_bar,
        );
        let mut tally = Tally::default();
        while (self.progress.position as usize) < n_train {
            let start = self.progress.position as usize;
            let chunk = &order[start..(start + ctx.config.batch).min(n_train)];
            if let Some(ended) = self.step(chunk, &mut tally, &bar)? {
                bar.finish();
                return Ok(Some(ended));
            }
        }
        self.flush(&mut tally)?;
        let rate = bar.samples_per_second(self.progress.position);
        bar.finish();
        let val = evaluate(&mut self.learner, self.val_set)?;
        let line = epoch_line(
            self.progress.epoch + 1,
            epochs,
            &tally,
            val.as_ref(),
            rate,
            self.started,
            self.b,
        );
        self.validation = val.or(self.validation);
        self.progress.epoch += 1;
        self.progress.position = 0;
        self.progress.order = epoch_order(n_train, &mut self.rng)
            .iter()
            .map(|&i| i as u64)
            .collect();
        // The checkpoint first: a line that announces the epoch means its checkpoint is there.
        self.save()?;
        out.line(&line);
        if let Some(sig) = self.signal()? {
            return Ok(Some(Ended::Signal(sig)));
        }
        let stop = ctx
            .options
            .stop_after
            .is_some_and(|s| self.progress.step >= s);
        Ok((stop && self.progress.epoch < epochs).then_some(Ended::StopAfter))
    }

    /// One step on `chunk`, and what follows it: the checkpoint every --checkpoint-every
    /// steps, --stop-after and signals, each after reading back every step (so exact).
    fn step(
        &mut self,
        chunk: &[usize],
        tally: &mut Tally,
        bar: &EpochBar,
    ) -> Result<Option<Ended>> {
        let ctx = self.ctx;
        let t0 = Instant::now();
        let mark = match self.timeline.as_mut() {
            Some(t) => Some(t.before(self.b)?),
            None => None,
        };
        let reports = self
            .feed
            .step(&mut self.learner, self.train_set, chunk)
            .map_err(|e| rank_error(ctx, e))?;
        let queued = Instant::now();
        self.training.add(chunk.len(), queued - t0);
        if let (Some(t), Some(start)) = (self.timeline.as_mut(), mark) {
            let times = StepTimes {
                step: self.learner.step(),
                samples: chunk.len(),
                host: queued - t0,
                fill: self.feed.take_fill(),
                phases: self.learner.take_host_phases(),
                ..StepTimes::default()
            };
            t.after(self.b, start, times)?;
            if !reports.is_empty() {
                // The read-back waited for the steps before this one (this one's last event
                // was recorded after it).
                t.resolve(self.b, 1);
            }
        }
        let result = self.after_step(chunk, tally, bar, &reports);
        if let Some(t) = self.timeline.as_mut() {
            t.add_progress(queued.elapsed());
        }
        result
    }

    /// What follows a step: the tally, the checkpoint every --checkpoint-every steps,
    /// --stop-after and signals, each after reading back every step (so exact).
    fn after_step(
        &mut self,
        chunk: &[usize],
        tally: &mut Tally,
        bar: &EpochBar,
        reports: &[StepReport],
    ) -> Result<Option<Ended>> {
        let options = self.ctx.options;
        absorb(tally, reports);
        self.progress.step = self.learner.step();
        self.progress.position += chunk.len() as u64;
        if let Some(s) = self.soak.as_mut().filter(|s| s.due(self.progress.step)) {
            s.samples.push(sample_memory(self.b, self.progress.step));
        }
        let signal = self.signal()?;
        let stop = options.stop_after.is_some_and(|s| self.progress.step >= s);
        let every = options
            .checkpoint_every
            .is_some_and(|e| self.progress.step.is_multiple_of(e));
        if stop || every || signal.is_some() {
            self.flush(tally)?;
            self.save()?;
        }
        if !reports.is_empty() || stop || every || signal.is_some() {
            bar.update(self.progress.position, tally.mean_loss(), self.b.in_use());
        }
        if let Some(sig) = signal {
            return Ok(Some(Ended::Signal(sig)));
        }
        let more = (self.progress.position as usize) < self.train_set.len();
        Ok((stop && more).then_some(Ended::StopAfter))
    }
}

/// Adds read-back steps to the epoch's running tally, in step order.
fn absorb(tally: &mut Tally, reports: &[StepReport]) {
    for r in reports {
        tally.add(Tally::of(r.samples, r.loss, 0.0));
    }
}

/// The run's trainer: XAsset from the `--init-from` file (read no further than `limit` bytes)
/// or from the seed, with AdamW's schedule over the run's steps.
fn new_learner<B: TrainBackend>(
    b: &B,
    ctx: &Context<'_>,
    n_train: usize,
    limit: u64,
) -> Result<Trainer<B>> {
    let config = ctx.config;
    let model_config: XAssetConfig = config.model;
    let steps_per_epoch = n_train.div_ceil(config.batch) as u64;
    let total_steps = steps_per_epoch
        .checked_mul(config.epochs as u64)
        .ok_or_else(|| {
            TrainError::Options(format!(
                "--epochs {}: the run would take more than 2^64 steps",
                config.epochs
            ))
        })?;
    let model = match &ctx.options.init_from {
        Some(path) => crate::resume::init_from(b, path, &model_config, limit)?,
        None => XAsset::init(b, model_config, config.seed)?,
    };
    Ok(Trainer::new(
        b.clone(),
        model,
        trainer_config(config, total_steps),
    )?)
}

/// Where the run starts: under `--resume`, the checkpoint's place (the learner restored from
/// it); else step 0 with the first epoch's order drawn from the seed.
fn start<B: TrainBackend>(
    learner: &mut Trainer<B>,
    ctx: &Context<'_>,
    config_json: &serde_json::Value,
    n_train: usize,
    limit: u64,
    out: &mut Console<'_>,
) -> Result<Progress> {
    let config = ctx.config;
    match &ctx.options.resume {
        Some(path) => {
            let at = ResumeAt {
                config: config_json,
                backend: ctx.backend_name,
                n_train,
                limit,
                epochs: config.epochs as u64,
            };
            resume(learner, path, &at, out)
        }
        None => {
            let mut rng = Rng::new(config.seed ^ ORDER_SALT);
            let order = epoch_order(n_train, &mut rng);
            Ok(Progress {
                step: 0,
                epoch: 0,
                position: 0,
                rng: rng.state(),
                order: order.iter().map(|&i| i as u64).collect(),
            })
        }
    }
}

/// The run's first line: the model, the data split and the schedule.
fn header(config: &RunConfig, n_train: usize, n_val: usize) -> Result<String> {
    let m = &config.model;
    Ok(format!(
        "ztrain: XAsset F={} S={} D={} H={} FF={} L={} ({} parameters); {} train / {} validation samples; batch {}, {} epochs, {} schedule",
        m.features,
        m.scales,
        m.width,
        m.heads,
        m.ff,
        m.layers,
        crate::config::parameters(m)?,
        n_train,
        n_val,
        config.batch,
        config.epochs,
        crate::config::schedule_name(config.schedule)
    ))
}

/// The line that ends an epoch: its running train loss, the validation numbers, the rate,
/// the time so far and the device memory in use.
fn epoch_line<B: MemorySource>(
    epoch: u64,
    epochs: u64,
    tally: &Tally,
    val: Option<&Tally>,
    rate: f64,
    started: Instant,
    b: &B,
) -> String {
    let mut line = format!("epoch {epoch}/{epochs}: ");
    if tally.samples > 0 {
        line += &format!("train loss {:.4} (running)", tally.mean_loss());
    }
    if let Some(v) = val {
        line += &format!(", val loss {:.4} acc {:.4}", v.mean_loss(), v.accuracy());
    }
    line += &format!(
        ", {rate:.0} samples/s, {:.1} s, {} memory {}",
        started.elapsed().as_secs_f64(),
        b.kind(),
        Bytes(b.in_use())
    );
    line
}

/// The run's end as `end.ended` says: the final numbers over the training set when it
/// finished, else the line that says why it stopped and how to go on; then the summary.
#[allow(clippy::too_many_arguments)]
fn conclude<B: TrainBackend + MemorySource>(
    b: &B,
    learner: &Trainer<B>,
    feed: &Feed<B>,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
    end: &End<'_>,
    train_set: &Dataset,
    validation: Option<Tally>,
) -> Result<Outcome> {
    match end.ended {
        Ended::Finished => {
            // The final numbers: the whole training set in no-grad mode, like the validation set.
            let e = feed.evaluate_train(learner, train_set)?;
            let train_final = Some(Tally::of(e.samples, e.loss, e.accuracy));
            finish(b, learner, ctx, out, end, train_final, validation)
        }
        Ended::StopAfter => {
            out.line(&format!(
                "ztrain: stopped after step {} (--stop-after); resume with --resume",
                end.steps
            ));
            finish(b, learner, ctx, out, end, None, validation)
        }
        Ended::Signal(sig) => {
            let saved = match &ctx.options.checkpoint {
                Some(p) => format!(
                    "checkpoint written to {}; resume with --resume {}",
                    p.display(),
                    p.display()
                ),
                None => "no --checkpoint was given, so the progress is not saved".into(),
            };
            out.line(&format!(
                "ztrain: stopped by {} after step {}; {saved}",
                signals::name(sig),
                end.steps
            ));
            finish(b, learner, ctx, out, end, None, validation)
        }
    }
}

/// Loss and accuracy over `data` in no-grad mode (`None` for an empty set): on the device when
/// the validation set was put there (`validation_of`), else from the host.
pub(crate) fn evaluate<B: TrainBackend>(
    learner: &mut Trainer<B>,
    data: &Dataset,
) -> Result<Option<Tally>> {
    if data.is_empty() {
        return Ok(None);
    }
    let e = if learner.validation_rows().is_some() {
        learner.evaluate_validation()?
    } else {
        learner.evaluate(&data.x, &data.y)?
    };
    Ok(Some(Tally::of(e.samples, e.loss, e.accuracy)))
}
