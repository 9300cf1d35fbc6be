//! The training run: the checks before it (outputs, memory, arena options), data, model,
//! epochs, validation, checkpoints and stops (`--stop-after`, SIGINT/SIGTERM); `summary` ends
//! it. Output lines go to the writer the caller passes (stdout from `main`, a buffer in tests)
//! through a `Console`, so a closed stdout never stops training; the progress bar goes to
//! stderr when it is a terminal.
//!
//! The modules: `open.rs` (the checks before the device opens, and the backend), `setup.rs`
//! (data, trainer, the start and the first lines), `epochs.rs` (the epochs' loop).

mod epochs;
mod open;
mod setup;

use epochs::Epochs;
use open::open_backend;
use setup::{
    checkpoint_limit, feed_of, header, host_data_of, load_data, new_learner, start, validation_of,
};

use std::io::Write;
use std::rc::Rc;
use std::time::Instant;

use zcomm::{Collective, LaunchEnv};

use zgrad::Model;

use crate::budget::Estimate;
use crate::cli::Options;
use crate::config::RunConfig;
use crate::console::Console;
use crate::data::Samples;
use crate::data::feed::Feed;
use crate::data::labels::Labels;
use crate::data::placement::DeviceRoom;
use crate::device::AnyBackend;
use crate::distributed::Role;
use crate::error::{Result, TrainError};
use crate::fit::learner::Learner;
use crate::fit::{FitModel, Job};
use crate::memory::MemorySource;
use crate::rng::Rng;
use crate::signals::{self, StopSignal};
use crate::soak::Soak;
use crate::step::{Tally, TrainBackend};

pub use crate::summary::Outcome;
use crate::summary::{End, Ended, Throughput, finish};
use crate::timeline::Timeline;

/// Parses nothing: trains XAsset as `options` say (`crate::fit::run` of `XAssetFit`), writing
/// progress lines to `out` (a closed `out` stops the printing, not the run). `show_bar`: draw
/// the progress bar on stderr (when it is a terminal). `stop`: a signal asking the run to stop
/// after the current step.
pub fn run(
    options: &Options,
    out: &mut dyn Write,
    show_bar: bool,
    stop: &StopSignal,
) -> Result<Outcome> {
    crate::fit::run(&crate::xasset::XAssetFit, options, out, show_bar, stop)
}

/// The run of `spec`'s model (`crate::fit::run`): as the rank `job` names, else as the
/// launcher's variables say.
pub(crate) fn run_model<S: FitModel>(
    spec: &S,
    options: &Options,
    job: Option<&Job>,
    out: &mut dyn Write,
    show_bar: bool,
    stop: &StopSignal,
) -> Result<Outcome> {
    if options.plan {
        spec.print_plan(options, out)?;
        return Ok(Outcome {
            steps: 0,
            stopped_early: false,
            interrupted: None,
            train: None,
            validation: None,
        });
    }
    let (env, auth) = match job {
        Some(job) => (job.env.clone(), job.auth.clone()),
        None => match crate::distributed::role(options)? {
            Role::Rank(env) => (env, None),
            Role::Single => (LaunchEnv::SINGLE, None),
            Role::Launcher(n) => {
                return Err(TrainError::Options(format!(
                    "--gpus {n}: the ranks are started by {}'s main (ztrain::fit::main), or by a launcher that sets RANK and WORLD_SIZE",
                    spec.program()
                )));
            }
        },
    };
    // Rank 0 alone prints, writes checkpoints (`save` in `train`) and reports.
    let mut sink = std::io::sink();
    let quiet;
    let (options, out, show_bar): (&Options, &mut dyn Write, bool) = if env.info.rank > 0 {
        quiet = Options {
            memory_report: None,
            soak_report: None,
            timeline: None,
            metrics: None,
            ..options.clone()
        };
        (&quiet, &mut sink, false)
    } else {
        (options, out, show_bar)
    };
    let mut config = options.config()?;
    if env.info.world > 1 && options.device != crate::cli::DeviceChoice::Sim {
        // NCCL's transport decides whether the steps can be captured (issue 44).
        let transport = zcomm::nccl::transport::transport(|k| std::env::var(k).ok(), env.info);
        config.capture = crate::distributed::captured_steps(config.capture, &transport);
    }
    let (opened, room) = open_backend(spec, options, &env, &config)?;
    let mut console = Console::new(out, &spec.program());
    console.say(&opened.description);
    if env.info.world > 1 {
        console.say(&format!(
            "rank 0 of a data-parallel job of {} ranks (one process each); --batch {} is the global batch, split over them",
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
        model_line: spec.report_line(&config),
    };
    let ranks = (env.info.world > 1).then_some(&env);
    let timeout = crate::distributed::comm_timeout(options)?;
    // The rendezvous: the caller's proof of membership, else the environment's secret.
    let rendezvous = |e: &LaunchEnv| match &auth {
        Some(a) => {
            Ok(zcomm::rendezvous::Config::new(a.clone(), timeout).with_cancel(stop.as_cancel()))
        }
        None => crate::distributed::rendezvous_config(e, timeout, stop),
    };
    let overlap_ctas = crate::distributed::overlap_ctas(options)?;
    match opened.backend {
        AnyBackend::Cpu(_) if ranks.is_some() => Err(TrainError::Options(format!(
            "rank {} of {}: the {} cannot be a rank of a job; use --device cuda or --device sim",
            env.info.rank, env.info.world, d
        ))),
        AnyBackend::Cpu(b) => train(spec, b, None, &ctx, &mut console),
        AnyBackend::Cuda(b) => {
            let comm = ranks
                .map(|e| {
                    crate::distributed::nccl_collective(
                        &b,
                        e,
                        rendezvous(e)?,
                        overlap_ctas,
                        options.last_bucket,
                    )
                })
                .transpose()?;
            train(spec, b, comm, &ctx, &mut console)
        }
        AnyBackend::Sim(b) => {
            let comm = ranks
                .map(|e| crate::distributed::sim_collective(&b, e, rendezvous(e)?))
                .transpose()?;
            train(spec, b, comm, &ctx, &mut console)
        }
    }
}

/// Device memory the data sets may take on a device of `total` bytes: the arena's cap less
/// the run's plan (its arena; the estimate where the run was not planned).
pub(crate) fn device_room(
    engine: &zcompute::EngineConfig,
    planned: Option<&zgrad::SchedulePlan>,
    estimate: Option<&Estimate>,
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
            .unwrap_or_else(|| estimate.and_then(|e| e.device().ok()).unwrap_or(u64::MAX)),
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
    /// The model's line in the memory report (`FitModel::report_line`).
    pub(crate) model_line: String,
}

/// Trains as [`train_rank`] does; a wait on the device that passed its deadline in a job of
/// several ranks (in the set-up, the steps, an evaluation, a checkpoint) is the collective's
/// error naming the peer the device waits behind (issue 44).
pub(crate) fn train<S: FitModel, B: TrainBackend + MemorySource>(
    spec: &S,
    b: B,
    comm: Option<Rc<dyn Collective<B, f32>>>,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
) -> Result<Outcome> {
    let named = comm.clone();
    train_rank(spec, b, comm, ctx, out)
        .map_err(|e| crate::distributed::name_the_silent_peer(named.as_deref(), e))
}

fn train_rank<S: FitModel, B: TrainBackend + MemorySource>(
    spec: &S,
    b: B,
    comm: Option<Rc<dyn Collective<B, f32>>>,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
) -> Result<Outcome> {
    let (config, options) = (ctx.config, ctx.options);
    let started = Instant::now();
    let task = spec.task(config);
    // A file's labels are checked as the model takes them; the synthetic set's are 0/1.
    let labels = match config.data {
        crate::config::DataSource::File { .. } => Labels::of(&task)?,
        crate::config::DataSource::Synthetic { .. } => Labels::BINARY,
    };
    let data = load_data(config, options.stream, labels)?;
    let (train_set, val_set) = (data.train, data.val);
    if train_set.is_empty() {
        return Err(TrainError::Options(
            "no training samples left after the validation split (and --gap); lower --validate-fraction or --gap, or give more data".into(),
        ));
    }
    let mut config_json = config.to_json(data.digest);
    config_json["model"] = spec.config_json(config);
    if let Some(n) = &data.norm {
        // In the checkpoint: a resume whose statistics differ is refused (`differences`).
        config_json["normalization"] = n.to_json();
    }
    if ctx.world > 1 {
        // Checkpoints record the job's ranks: a resume with another number is refused.
        config_json["world"] = serde_json::json!(ctx.world);
    }
    let n_train = train_set.len();
    let limit = checkpoint_limit(spec.parameters(config)?, n_train);
    let mut learner = new_learner(spec, &b, ctx, n_train, limit)?;
    if learner.model().task() != task {
        return Err(TrainError::Options(format!(
            "the model's task is {} but its FitModel::task says {task}: return the model's task from FitModel::task (the data's labels are checked by it)",
            learner.model().task()
        )));
    }
    let progress = start(&mut learner, ctx, &config_json, n_train, limit, out)?;
    // The ranks agree on a stop signal where the steps are read back (one tiny all-reduce,
    // read at the next such point), and on the read-back window from their step times.
    let agree = signals::Agreement::new(comm.clone(), options.readback_every);
    if let Some(c) = comm {
        // Every rank starts from rank 0's parameters (restored from the checkpoint alike).
        learner = learner.join(c, crate::distributed::grad_sync(options)?)?;
    }
    let rng = Rng::from_state(progress.rng).ok_or_else(|| TrainError::CheckpointCorrupt {
        path: options.resume.clone().unwrap_or_default(),
        reason: "generator state is all zero".into(),
    })?;
    out.say(&header(spec, config, n_train, val_set.len())?);
    if let Some(path) = &options.init_from {
        out.say(&format!(
            "parameters from {} (optimiser moments zero, step 0)",
            path.display()
        ));
    }
    let feed = feed_of(&mut learner, &train_set, &val_set, ctx, out)?;
    validation_of(&mut learner, &val_set, &train_set, &feed, ctx, out)?;
    let host_data = host_data_of(&learner, &train_set, &val_set, &feed, out);
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
        metrics: crate::metrics::Metrics::new(
            options.metrics.as_deref(),
            options.metrics_every,
            options.resume.is_some(),
        )?,
    };
    ctx.stop.training_starts();
    // On an error, the job's collective is given up before the trainer is dropped: a
    // collective whose peer stopped waits on the device until aborted, and the teardown would
    // wait behind it (issue 44).
    let ended = match run.all(out) {
        Ok(ended) => ended,
        Err(e) => {
            let e = crate::distributed::name_the_silent_peer(run.agree.comm(), e);
            run.learner.give_up(&e.to_string());
            return Err(e);
        }
    };
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
        metrics: &run.metrics,
        host_data,
    };
    let concluded = conclude(
        &b,
        &mut run.learner,
        &mut run.feed,
        ctx,
        out,
        &end,
        &train_set,
        run.validation,
    );
    let concluded =
        concluded.map_err(|e| crate::distributed::name_the_silent_peer(run.agree.comm(), e));
    if let Err(e) = &concluded {
        run.learner.give_up(&e.to_string());
    }
    concluded
}

/// The run's end as `end.ended` says: the final numbers over the training set when it
/// finished, else the line that says why it stopped and how to go on; then the summary.
#[allow(clippy::too_many_arguments)]
fn conclude<B: TrainBackend + MemorySource, M: Model<B, f32>>(
    b: &B,
    learner: &mut Learner<B, M>,
    feed: &mut Feed<B>,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
    end: &End<'_>,
    train_set: &Samples,
    validation: Option<Tally>,
) -> Result<Outcome> {
    match end.ended {
        Ended::Finished => {
            // The final numbers: the whole training set in no-grad mode, like the validation set.
            let e = feed.evaluate_train(learner, train_set)?;
            let train_final = Some(Tally::of_report(&e));
            finish(b, learner, ctx, out, end, train_final, validation)
        }
        Ended::StopAfter => {
            out.say(&format!(
                "stopped after step {} (--stop-after); resume with --resume",
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
            out.say(&format!(
                "stopped by {} after step {}; {saved}",
                signals::name(sig),
                end.steps
            ));
            finish(b, learner, ctx, out, end, None, validation)
        }
    }
}
