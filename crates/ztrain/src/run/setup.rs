//! What a run sets up before its epochs: the data, the trainer, where it starts, where the
//! training and validation sets live, and the run's first line.

use super::Context;

use zcompute::units::Bytes;
use zgrad::Model;

use crate::budget::host_available;
use crate::checkpoint::Progress;
use crate::cli::DataOn;
use crate::config::{DataSource, RunConfig};
use crate::console::Console;
use crate::data::feed::{self, Feed};
use crate::data::held::{self, HostData};
use crate::data::labels::Labels;
use crate::data::placement;
use crate::data::windows::{self, Normalization};
use crate::data::{self, Samples, epoch_order, formats};
use crate::error::{Result, TrainError};
use crate::fit::FitModel;
use crate::fit::learner::Learner;
use crate::plan::resident_bytes;
use crate::resume::{ResumeAt, resume};
use crate::rng::Rng;
use crate::step::{TrainBackend, trainer_config};

/// Salt of the data-order generator, so it never equals the initialisation's stream.
const ORDER_SALT: u64 = 0x6f72_6465_725f_7267;

/// The data of a run: the training and validation samples, the normalisation statistics
/// (`--normalize`) and the data file's fingerprint.
pub(super) struct RunData {
    pub(super) train: Samples,
    pub(super) val: Samples,
    pub(super) norm: Option<Normalization>,
    pub(super) digest: Option<u64>,
}

/// Loads or generates the data set and splits it: pre-cut samples by their tail
/// (`Dataset::split_validation`), bars into windows walk-forward (`windows::split`);
/// normalised by the training part's statistics under `--normalize`. The file is read once,
/// bounded by the host's available memory; under `stream` (`--stream`) left in the file, its
/// rows read as batches are staged (`data::stream`). Each label is checked as `labels` (the
/// model's task's) takes it.
pub(super) fn load_data(config: &RunConfig, stream: bool, labels: Labels) -> Result<RunData> {
    let m = &config.model;
    // Parsing holds the bytes and the values (about as large): a quarter of what is free.
    let limit = host_available().map_or(u64::MAX, |a| a / 4);
    let (dataset, digest) = match &config.data {
        DataSource::Synthetic { samples, seed } => (
            data::synthetic::generate(*samples, m.scales, m.features, *seed),
            None,
        ),
        DataSource::File {
            path,
            window: Some(window),
            gap,
            ..
        } => {
            let (bars, digest) = formats::load_bars(path, m.features, limit, labels)?;
            let format = formats::Format::of(path)?.label();
            let (train, val, norm) = windows::split(
                bars,
                *window,
                config.validate_fraction,
                *gap,
                config.normalize,
            )
            .map_err(|f| f.in_file(path, format))?;
            return Ok(RunData {
                train: Samples::Windows(train),
                val: Samples::Windows(val),
                norm,
                digest: Some(digest),
            });
        }
        DataSource::File {
            path,
            labels: y_path,
            ..
        } if stream => {
            return load_streamed(config, path, y_path.as_deref(), labels);
        }
        DataSource::File {
            path,
            labels: y_path,
            ..
        } => {
            let (d, digest) =
                formats::load(path, y_path.as_deref(), m.scales, m.features, limit, labels)?;
            (d, Some(digest))
        }
    };
    let (mut train, mut val) = dataset.split_validation(config.validate_fraction);
    let norm = (config.normalize && !train.is_empty()).then(|| {
        // Every scale of every training sample is a row of F values.
        let rows = train.len() * train.scales;
        let n = Normalization::of_rows(&train.x, train.features, rows);
        n.apply(&mut train.x);
        n.apply(&mut val.x);
        n
    });
    Ok(RunData {
        train: Samples::Rows(train),
        val: Samples::Rows(val),
        norm,
        digest,
    })
}

/// `load_data` of the pre-cut samples in `path` (and `labels`) under `--stream`: the file is
/// opened and checked (header, shapes, length), its fingerprint taken a MiB at a time, and
/// split as `Dataset::split_validation` splits the rows read whole; under `--normalize` the
/// training rows are read through first for their statistics (`Streamed::statistics`).
fn load_streamed(
    config: &RunConfig,
    path: &std::path::Path,
    y_path: Option<&std::path::Path>,
    labels: Labels,
) -> Result<RunData> {
    let m = &config.model;
    let (all, digest) = match (formats::Format::of(path)?, y_path) {
        (formats::Format::Npy, Some(y)) => {
            data::stream::npy_pair(path, y, m.scales, m.features, labels)?
        }
        (formats::Format::Safetensors, None) => {
            data::stream::safetensors(path, m.scales, m.features, labels)?
        }
        (formats::Format::Parquet, None) => {
            data::stream::parquet(path, m.scales, m.features, labels)?
        }
        (formats::Format::Arrow, None) => data::stream::arrow(path, m.scales, m.features, labels)?,
        (formats::Format::Csv, None) => data::stream::csv(path, m.scales, m.features, labels)?,
        (formats::Format::Npz, None) => data::stream_npz::npz(path, m.scales, m.features, labels)?,
        // A features `.npy` without its labels, or `--labels` beside another format: the
        // loader's own refusal.
        _ => {
            formats::load(path, y_path, m.scales, m.features, 0, labels)?;
            return Err(TrainError::Options(format!(
                "--stream: {} cannot be streamed with these options",
                path.display()
            )));
        }
    };
    let n_val = data::validation_len(all.len, config.validate_fraction);
    let (mut train, mut val) = all.split(n_val);
    // `--normalize`: a first pass over the training rows in the file (two, in fact: the mean,
    // then the deviations), a batch at a time, for the statistics the rows read whole give.
    let norm = if config.normalize && train.len > 0 {
        let n = train.statistics(config.batch)?;
        let shared = std::sync::Arc::new(n.clone());
        train = train.normalized(std::sync::Arc::clone(&shared));
        val = val.normalized(shared);
        Some(n)
    } else {
        None
    };
    Ok(RunData {
        train: Samples::Stream(train),
        val: Samples::Stream(val),
        norm,
        digest: Some(digest),
    })
}

/// The most bytes a checkpoint of `params` parameters and `n_train` samples can take: the
/// parameters and both moments, the data order, and a header well under a MiB.
pub(super) fn checkpoint_limit(params: u64, n_train: usize) -> u64 {
    params
        .saturating_mul(12)
        .saturating_add((n_train as u64).saturating_mul(8))
        .saturating_add(1 << 20)
}

/// Device bytes the training set takes there, its step table included (`resident_bytes`).
fn train_set_bytes(train_set: &Samples, ctx: &Context<'_>) -> u64 {
    let (per, every) = (train_set.sample_width(), ctx.options.readback_every);
    let n = train_set.len();
    resident_bytes(
        (n, per, train_set.targets()),
        ctx.config.batch,
        ctx.world,
        every,
    )
}

/// Where the training set lives (`--data-on`), loaded there, said in one line.
pub(super) fn feed_of<B: TrainBackend, M: Model<B, f32>>(
    learner: &mut Learner<B, M>,
    train_set: &Samples,
    val_set: &Samples,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
) -> Result<Feed<B>> {
    let bytes = train_set_bytes(train_set, ctx);
    let rows = zgrad::max_device_rows::<f32>();
    let on_device = match train_set {
        // Windows are cut on the host as batches are staged: the series is stored once.
        Samples::Windows(_) if ctx.options.data_on == DataOn::Device => {
            return Err(TrainError::Options(
                "--data-on device: windows (--window) are cut on the host as each batch is staged; use --data-on host or auto".into(),
            ));
        }
        Samples::Windows(_) => false,
        Samples::Stream(_) if ctx.options.data_on == DataOn::Device => {
            return Err(TrainError::Options(
                "--data-on device with --stream: streamed rows are read into the host's staging batch step by step; use --data-on host or auto, or drop --stream".into(),
            ));
        }
        Samples::Stream(_) => false,
        Samples::Rows(_) => {
            placement::on_device(ctx.options.data_on, ctx.room, bytes, train_set.len(), rows)?
        }
    };
    let every = ctx.options.readback_every;
    out.say(&if on_device {
        format!(
            "training set on the device ({}; each step's rows gathered there), read back every {every} steps",
            Bytes(bytes)
        )
    } else if feed::staging_batches(train_set) == 1 {
        format!(
            "training set on the host (each step's {} into one pinned batch once the last copy from it is done), read back every {every} steps",
            if matches!(train_set, Samples::Stream(_)) {
                "rows read from the file"
            } else {
                "windows cut"
            }
        )
    } else {
        format!(
            "training set on the host (each step's rows staged in pinned memory, two batches in turn), read back every {every} steps"
        )
    });
    Feed::new(
        learner,
        train_set,
        val_set,
        on_device,
        ctx.config.batch,
        every,
    )
}

/// Puts the validation set on the device when it fits beside the training set
/// (`placement::validation_on_device`), said in one line; else it is evaluated from the host.
pub(super) fn validation_of<B: TrainBackend, M: Model<B, f32>>(
    learner: &mut Learner<B, M>,
    val_set: &Samples,
    train_set: &Samples,
    feed: &Feed<B>,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
) -> Result<()> {
    // Validation windows are cut as they are evaluated, from the host.
    let Samples::Rows(val_set) = val_set else {
        return Ok(());
    };
    if val_set.is_empty() {
        return Ok(());
    }
    let per = val_set.sample_width();
    let taken = match feed {
        Feed::Device { .. } => train_set_bytes(train_set, ctx),
        Feed::Host { .. } => 0,
    };
    let chunk = learner.config().eval_batch;
    let bytes = zgrad::validation_data_bytes(val_set.len(), per, chunk, 4);
    if placement::validation_on_device(ctx.options.data_on, ctx.room, taken, bytes) {
        learner.load_validation(&val_set.x, &val_set.y, val_set.len())?;
        out.say(&format!(
            "validation set on the device ({}; evaluated in chunks of {chunk}{}, read back once an epoch)",
            Bytes(bytes),
            if ctx.config.capture { ", captured" } else { "" }
        ));
    }
    Ok(())
}

/// What the run holds on the host for its data (`held`), said in one line.
pub(super) fn host_data_of<B: TrainBackend, M: Model<B, f32>>(
    learner: &Learner<B, M>,
    train_set: &Samples,
    val_set: &Samples,
    feed: &Feed<B>,
    out: &mut Console<'_>,
) -> HostData {
    let chunk = learner.config().eval_batch;
    let evaluation = |set: &Samples| held::evaluation_bytes(set, chunk, feed::chunked(set));
    let data = HostData {
        samples: held::samples_bytes(train_set, val_set),
        kind: held::Kind::of(train_set),
        staging: feed.staging_bytes(),
        evaluation: evaluation(train_set).max(evaluation(val_set)),
        reader: held::reader_bytes(train_set).max(held::reader_bytes(val_set)),
        reader_holds: held::reader_holds(train_set),
    };
    out.say(&data.line());
    data
}

/// The run's trainer: the model from the `--init-from` file (read no further than `limit`
/// bytes) or from the seed, with the optimiser's schedule over the run's steps.
pub(super) fn new_learner<S: FitModel, B: TrainBackend>(
    spec: &S,
    b: &B,
    ctx: &Context<'_>,
    n_train: usize,
    limit: u64,
) -> Result<Learner<B, S::Model<B>>> {
    let config = ctx.config;
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
        Some(path) => spec.init_from(b, path, config, limit)?,
        None => spec.init(b, config)?,
    };
    Ok(Learner::new(b, model, trainer_config(config, total_steps))?)
}

/// Where the run starts: under `--resume`, the checkpoint's place (the learner restored from
/// it); else step 0 with the first epoch's order drawn from the seed.
pub(super) fn start<B: TrainBackend, M: Model<B, f32>>(
    learner: &mut Learner<B, M>,
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

/// The run's first line (without the program's name): the model, the data split and the
/// schedule.
pub(super) fn header<S: FitModel>(
    spec: &S,
    config: &RunConfig,
    n_train: usize,
    n_val: usize,
) -> Result<String> {
    Ok(format!(
        "{} ({} parameters); {} train / {} validation samples; batch {}, {} epochs, {} schedule",
        spec.describe(config),
        spec.parameters(config)?,
        n_train,
        n_val,
        config.batch,
        config.epochs,
        crate::config::schedule_name(config.schedule)
    ))
}
