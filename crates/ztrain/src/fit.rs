//! The run loop as a library: any zgrad [`Model`] trained the way the `ztrain` command trains
//! XAsset, as Lightning's `Trainer.fit` or burn's `Learner` serve any model. A model's
//! [`FitModel`] says how to make it and how to name it; the rest is the loop's: the data
//! (`--data` in every format ztrain reads, or the synthetic set; windows cut as training runs),
//! epochs and the seeded shuffle, the validation split, the training set on the device or the
//! host, read-back windows, the progress bar and lines, the model's own evaluation (zgrad's
//! `Trainer::evaluate`: the loss and metrics of its `Task`), SIGINT/SIGTERM (a checkpoint, then
//! exit 128 + the signal), checkpoints and `--resume`, the memory report, the timeline, the
//! metrics file, and data parallel: a binary whose `main` is [`main`] takes `--gpus N` and
//! starts its ranks as `ztrain` does (the launcher starts copies of the running executable).
//!
//! ```no_run
//! # use ztrain::fit::FitModel;
//! # fn demo<S: FitModel>(my_model: S) -> std::process::ExitCode {
//! // A user's `main`: ztrain's options, launcher, signals and exit codes for `my_model`.
//! ztrain::fit::main(&my_model)
//! # }
//! ```
//!
//! The `ztrain` command is XAsset's use of it (`crate::xasset::XAssetFit`); the example
//! `crates/ztrain/examples/fit_mlp/` trains a model of its own. Every call the loop makes
//! into zgrad's `Trainer` is in [`learner`].

mod command;
pub mod learner;

pub(crate) use command::end_rank_now;

use std::io::Write;
use std::path::Path;

use zcomm::LaunchEnv;
use zcomm::secret::Auth;
use zcompute::EngineConfig;
use zgrad::{Model, SchedulePlan};

use crate::budget::Estimate;
use crate::cli::Options;
use crate::config::RunConfig;
use crate::error::Result;
use crate::signals::StopSignal;
use crate::step::TrainBackend;

pub use crate::summary::Outcome;
pub use command::{main, options_from};

/// What the run loop needs to know of a model: how to make it on a backend, and how to name
/// it. The rest (the memory estimate, the arena sized from a plan, `--plan`, `--init-from`) has
/// defaults a model may replace.
///
/// The run's configuration ([`RunConfig`], from the command line) gives the data's shape:
/// a sample is `config.model.scales` x `config.model.features` values (a window of
/// `--window` bars with `--window`) and its targets (`FitModel::task`'s: one label, or `K`
/// regression values); the model's `sample_shape` of that
/// many values must be `[scales, features]` (the training set on the host is staged as such).
pub trait FitModel {
    /// The model on backend `B` (a clone shares its parameters, as zgrad's `Model` asks).
    type Model<B: TrainBackend>: Model<B, f32>;

    /// The model's target contract: the [`zgrad::Model::task`] of the model
    /// [`FitModel::init`] makes, known before it is made, since a data file's labels are
    /// checked as they are read (0 or 1 for a binary model, a class index in `0..C` for
    /// `Task::class_index(C)`, `K` finite values for `Task::regression(K)`: `K` label columns,
    /// `y` `[N, K]`; a weighted task's missing labels masked). By default
    /// XAsset's, `Task::binary()`; a run whose model's task differs from this is refused.
    fn task(&self, config: &RunConfig) -> zgrad::Task {
        let _ = config;
        zgrad::Task::binary()
    }

    /// The model's name and sizes, for the run's first line (`XAsset F=8 S=16 ...`).
    fn describe(&self, config: &RunConfig) -> String;

    /// The model's parameters, counted before any is made: the bound on a checkpoint's size.
    fn parameters(&self, config: &RunConfig) -> Result<u64>;

    /// The model's sizes as a checkpoint records them (its configuration's `model`): a resume
    /// whose sizes differ is refused, naming each difference.
    fn config_json(&self, config: &RunConfig) -> serde_json::Value;

    /// The model made on `b`, initialised from `config.seed`.
    fn init<B: TrainBackend>(&self, b: &B, config: &RunConfig) -> zgrad::Result<Self::Model<B>>;

    /// The program's name in its lines and errors (`fit_mlp: host data held ...`, a rank's
    /// failure, the launcher's report), its `--help` usage and `--version`: by default the
    /// file name of the running executable (`argv[0]`); the `ztrain` command's is `ztrain`.
    fn program(&self) -> String {
        running_program()
    }

    /// What `--help` says the program trains (`None`: the `ztrain` command's own text, about
    /// XAsset). The default says it trains a model through ztrain's run loop.
    fn about(&self) -> Option<&str> {
        Some(
            "Train a model through ztrain's run loop on --data (or a synthetic data set), and report loss, metrics, speed and memory.",
        )
    }

    /// Whether the model's sizes are XAsset's options (`--width`, `--heads`, `--ff`,
    /// `--layers`, the fields of those names of `config.model`). `false`, the default: the
    /// program refuses them as unknown options and leaves them out of `--help` (they would
    /// change nothing but the checkpoint's configuration); `config.model` keeps XAsset's
    /// defaults there. The data's shape (`--scales`/`--window`, `--features`) is every model's.
    fn reads_xasset_sizes(&self) -> bool {
        false
    }

    /// The model's line in the memory report (by default [`FitModel::describe`]).
    fn report_line(&self, config: &RunConfig) -> String {
        self.describe(config)
    }

    /// The model of `--init-from path` (a safetensors file read no further than `limit`
    /// bytes): by default [`FitModel::init`]'s model with every parameter from the file, by
    /// name (`resume::init_parameters`: a PyTorch `state_dict` of the same names, or a
    /// checkpoint; missing, extra or misshapen tensors are an error naming them).
    fn init_from<B: TrainBackend>(
        &self,
        b: &B,
        path: &Path,
        config: &RunConfig,
        limit: u64,
    ) -> Result<Self::Model<B>> {
        let model = self.init(b, config)?;
        crate::resume::init_parameters(b, &model, path, limit)?;
        Ok(model)
    }

    /// The run's memory, estimated before anything big is made: checked against the host and
    /// the device. `None` (the default): no estimate, no check before the device opens (the
    /// plan of [`FitModel::sized_engine`] then sizes the arena and the data's room).
    fn estimate(&self, config: &RunConfig) -> Result<Option<Estimate>> {
        let _ = config;
        Ok(None)
    }

    /// The engine of a run of `world` ranks with its arena sized from the run's memory plan,
    /// and that plan: by default zgrad's plan of the model's steps (made on the accounting
    /// device with [`FitModel::init`]), which also says how much room the data sets have on
    /// the device (`--data-on`).
    fn sized_engine(
        &self,
        engine: EngineConfig,
        config: &RunConfig,
        world: usize,
    ) -> Result<(EngineConfig, Option<SchedulePlan>)> {
        let model = zgrad::plan::ModelFn {
            values_per_sample: config.model.scales * config.model.features,
            build: |b: &zgrad::plan::PlanBackend| self.init(b, config),
        };
        crate::plan::sized_engine_and_plan_of(engine, config, world, model)
    }

    /// `--plan`: prints the run's memory plan to `out` instead of training: by default
    /// zgrad's plan of the model's steps (made on the accounting device with
    /// [`FitModel::init`]), named by [`FitModel::describe`] and [`FitModel::config_json`].
    fn print_plan(&self, options: &Options, out: &mut dyn Write) -> Result<()> {
        let config = options.config()?;
        let model = zgrad::plan::ModelFn {
            values_per_sample: config.model.scales * config.model.features,
            build: |b: &zgrad::plan::PlanBackend| self.init(b, &config),
        };
        let named = crate::plan::PlannedModel {
            line: self.describe(&config),
            json: self.config_json(&config),
            targets: self.task(&config).target_len(),
        };
        let report = crate::plan::make_of(options, &config, model, named, &|_, _| Ok(()))?;
        crate::plan::print_report(&self.program(), options, &report, out)
    }
}

/// Which rank of which job a run is, given by its caller instead of the launcher's variables
/// (ranks of one test process, or a program that starts its ranks itself).
#[derive(Clone, Debug)]
pub struct Job {
    /// The rank, the world and rank 0's rendezvous address.
    pub env: LaunchEnv,
    /// How the ranks prove they belong to the job (`None`: the environment's secret,
    /// `zcomm`'s `Auth::from_env`).
    pub auth: Option<Auth>,
}

/// Trains `model` as `options` say, as one process or the rank the launcher's variables name
/// (`RANK`, `WORLD_SIZE`, ...): the `ztrain` command's run, for any model. Progress lines go
/// to `out` (a closed `out` stops the printing, not the run); `show_bar` draws the progress
/// bar on stderr; `stop` asks the run to stop after a step (the SIGINT/SIGTERM handlers set it:
/// [`StopSignal::install`]), writing the checkpoint first.
pub fn run<S: FitModel>(
    model: &S,
    options: &Options,
    out: &mut dyn Write,
    show_bar: bool,
    stop: &StopSignal,
) -> Result<Outcome> {
    crate::run::run_model(model, options, None, out, show_bar, stop)
}

/// [`run`] as the rank `job` names.
pub fn run_rank<S: FitModel>(
    model: &S,
    options: &Options,
    job: &Job,
    out: &mut dyn Write,
    show_bar: bool,
    stop: &StopSignal,
) -> Result<Outcome> {
    crate::run::run_model(model, options, Some(job), out, show_bar, stop)
}

/// The running executable's file name (`argv[0]`'s last component), else `ztrain::fit`.
fn running_program() -> String {
    std::env::args_os()
        .next()
        .and_then(|argv0| {
            Path::new(&argv0)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "ztrain::fit".into())
}
