//! The training run: data, model, epochs, validation, checkpoints, the memory report and the
//! summary. Output lines go to the writer the caller passes (stdout from `main`, a buffer in
//! tests); the progress bar goes to stderr when it is a terminal.

use std::io::Write;
use std::time::Instant;

use zgrad::{Trainer, XAsset, XAssetConfig};
use zmem::units::Bytes;

use crate::checkpoint::Progress;
use crate::cli::Options;
use crate::config::{DataSource, RunConfig, fnv1a};
use crate::data::{self, Dataset, epoch_order};
use crate::device::{self, Engine};
use crate::error::{Result, TrainError};
use crate::memory::MemorySource;
use crate::progress::EpochBar;
use crate::report::MemoryReport;
use crate::resume::{checkpoint_of, resume};
use crate::rng::Rng;
use crate::step::{Tally, TrainBackend, trainer_config};

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Optimiser steps taken in all (resumed ones included).
    pub steps: u64,
    /// Whether `--stop-after` ended it before the last epoch.
    pub stopped_early: bool,
    /// Last epoch's running training loss and accuracy (`None` if no epoch finished here).
    pub train: Option<Tally>,
    /// Validation loss and accuracy at the end (`None` without a validation set).
    pub validation: Option<Tally>,
}

/// Salt of the data-order generator, so it never equals the initialisation's stream.
const ORDER_SALT: u64 = 0x6f72_6465_725f_7267;

fn io_err(what: &'static str) -> impl Fn(std::io::Error) -> TrainError {
    move |source| TrainError::Io {
        what,
        path: "standard output".into(),
        source,
    }
}

/// Parses nothing: runs what `options` say, writing progress lines to `out`. `show_bar`: draw
/// the progress bar on stderr (when it is a terminal).
pub fn run(options: &Options, out: &mut dyn Write, show_bar: bool) -> Result<Outcome> {
    let config = options.config()?;
    let arena = options.arena_config()?;
    let opened = device::open(options.device, &arena, options.sim_memory)?;
    if options.memory_report.is_some() && matches!(opened.engine, Engine::Cpu(_)) {
        return Err(TrainError::MemoryReport(format!(
            "the {} has no device arena to report on; use --device sim (or cuda)",
            opened.description
        )));
    }
    let w = io_err("writing to");
    writeln!(out, "ztrain: {}", opened.description).map_err(&w)?;
    let name = opened.engine.backend_name();
    let d = opened.description.as_str();
    match opened.engine {
        Engine::Cpu(b) => train(b, (name, d), &config, options, out, show_bar),
        Engine::Cuda(b) => train(b, (name, d), &config, options, out, show_bar),
        Engine::Sim(b) => train(b, (name, d), &config, options, out, show_bar),
    }
}

/// Loads or generates the data set; returns it with the CSV file's digest.
fn load_data(config: &RunConfig) -> Result<(Dataset, Option<u64>)> {
    let m = &config.model;
    match &config.data {
        DataSource::Synthetic { samples, seed } => Ok((
            data::synthetic::generate(*samples, m.scales, m.features, *seed),
            None,
        )),
        DataSource::Csv { path } => {
            let bytes = std::fs::read(path).map_err(|source| TrainError::Io {
                what: "reading the data file",
                path: path.clone(),
                source,
            })?;
            let digest = fnv1a(&bytes);
            Ok((data::csv::load(path, m.scales, m.features)?, Some(digest)))
        }
    }
}

/// `backend`: the backend's short name (for checkpoints) and its description.
fn train<B: TrainBackend + MemorySource>(
    b: B,
    (backend_name, description): (&str, &str),
    config: &RunConfig,
    options: &Options,
    out: &mut dyn Write,
    show_bar: bool,
) -> Result<Outcome> {
    let w = io_err("writing to");
    let started = Instant::now();
    let (dataset, digest) = load_data(config)?;
    let (train_set, val_set) = dataset.split_validation(config.validate_fraction);
    if train_set.is_empty() {
        return Err(TrainError::Options(
            "no training samples left after the validation split".into(),
        ));
    }
    let config_json = config.to_json(digest);
    let m = config.model;
    let model_config = XAssetConfig {
        features: m.features,
        scales: m.scales,
        width: m.width,
        heads: m.heads,
        ff: m.ff,
    };
    let model = XAsset::init(&b, model_config, config.seed)?;
    let n_train = train_set.len();
    let steps_per_epoch = n_train.div_ceil(config.batch) as u64;
    let total_steps = steps_per_epoch * config.epochs as u64;
    let mut learner = Trainer::new(b.clone(), model, trainer_config(config, total_steps))?;

    let mut progress = match &options.resume {
        Some(path) => resume(&mut learner, path, &config_json, backend_name, n_train, out)?,
        None => {
            let mut rng = Rng::new(config.seed ^ ORDER_SALT);
            let order = epoch_order(n_train, &mut rng);
            Progress {
                step: 0,
                epoch: 0,
                position: 0,
                rng: rng.state(),
                order: order.iter().map(|&i| i as u64).collect(),
            }
        }
    };
    let mut rng = Rng::from_state(progress.rng).ok_or_else(|| TrainError::CheckpointCorrupt {
        path: options.resume.clone().unwrap_or_default(),
        reason: "generator state is all zero".into(),
    })?;
    writeln!(
        out,
        "ztrain: XAsset F={} S={} D={} H={} FF={} ({} parameters); {} train / {} validation samples; batch {}, {} epochs, {} schedule",
        m.features, m.scales, m.width, m.heads, m.ff, m.parameters(), n_train, val_set.len(),
        config.batch, config.epochs, crate::config::spelled(&config.schedule)
    )
    .map_err(&w)?;

    let save = |learner: &Trainer<B>, progress: &Progress| -> Result<()> {
        match &options.checkpoint {
            Some(path) => checkpoint_of(learner, progress, &config_json, backend_name)?.save(path),
            None => Ok(()),
        }
    };
    let mut validation = None;
    let epochs = config.epochs as u64;
    while progress.epoch < epochs {
        let order: Vec<usize> = progress.order.iter().map(|&i| i as usize).collect();
        let bar = EpochBar::new(
            progress.epoch + 1,
            epochs,
            n_train as u64,
            progress.position,
            show_bar,
        );
        let mut tally = Tally::default();
        while (progress.position as usize) < n_train {
            let start = progress.position as usize;
            let chunk = &order[start..(start + config.batch).min(n_train)];
            let (x, y) = train_set.gather(chunk);
            let report = learner.train_batch(&x, &y, chunk.len())?;
            tally.add(Tally::of(chunk.len(), report.loss, 0.0));
            progress.step = report.step;
            progress.position += chunk.len() as u64;
            bar.update(progress.position, tally.mean_loss(), b.in_use());
            let stop = options.stop_after.is_some_and(|s| progress.step >= s);
            let every = options
                .checkpoint_every
                .is_some_and(|e| progress.step.is_multiple_of(e));
            if stop || every {
                progress.rng = rng.state();
                save(&learner, &progress)?;
            }
            if stop && (progress.position as usize) < n_train {
                bar.finish();
                writeln!(
                    out,
                    "ztrain: stopped after step {} (--stop-after); resume with --resume",
                    progress.step
                )
                .map_err(&w)?;
                return finish(
                    &b,
                    &learner,
                    (options, description),
                    out,
                    started,
                    progress.step,
                    true,
                    None,
                    None,
                );
            }
        }
        let rate = bar.samples_per_second(progress.position);
        bar.finish();
        let val = evaluate(&learner, &val_set)?;
        let mut line = format!("epoch {}/{epochs}: ", progress.epoch + 1);
        if tally.samples > 0 {
            line += &format!("train loss {:.4} (running)", tally.mean_loss());
        }
        if let Some(v) = val {
            line += &format!(", val loss {:.4} acc {:.4}", v.mean_loss(), v.accuracy());
            validation = Some(v);
        }
        line += &format!(
            ", {rate:.0} samples/s, {:.1} s, {} memory {}",
            started.elapsed().as_secs_f64(),
            b.kind(),
            Bytes(b.in_use())
        );
        writeln!(out, "{line}").map_err(&w)?;
        progress.epoch += 1;
        progress.position = 0;
        progress.order = epoch_order(n_train, &mut rng)
            .iter()
            .map(|&i| i as u64)
            .collect();
        progress.rng = rng.state();
        save(&learner, &progress)?;
        if options.stop_after.is_some_and(|s| progress.step >= s) && progress.epoch < epochs {
            writeln!(
                out,
                "ztrain: stopped after step {} (--stop-after); resume with --resume",
                progress.step
            )
            .map_err(&w)?;
            return finish(
                &b,
                &learner,
                (options, description),
                out,
                started,
                progress.step,
                true,
                None,
                validation,
            );
        }
    }
    // The final numbers: the whole training set in no-grad mode, like the validation set.
    let train_final = evaluate(&learner, &train_set)?;
    finish(
        &b,
        &learner,
        (options, description),
        out,
        started,
        progress.step,
        false,
        train_final,
        validation,
    )
}

/// Loss and accuracy over `data` in no-grad mode (`None` for an empty set).
fn evaluate<B: TrainBackend>(learner: &Trainer<B>, data: &Dataset) -> Result<Option<Tally>> {
    if data.is_empty() {
        return Ok(None);
    }
    let e = learner.evaluate(&data.x, &data.y)?;
    Ok(Some(Tally::of(e.samples, e.loss, e.accuracy)))
}

/// `batched, capture off`.
fn schedule_line(c: &zgrad::TrainerConfig) -> String {
    let schedule = match c.schedule {
        zgrad::TrainSchedule::Batched => "batched",
        zgrad::TrainSchedule::PerSample => "per-sample",
    };
    let capture = if c.capture { "on" } else { "off" };
    format!("{schedule}, capture {capture}")
}

/// `F=193 S=12 D=256 H=4 FF=1024`.
fn model_line(c: &XAssetConfig) -> String {
    format!(
        "F={} S={} D={} H={} FF={}",
        c.features, c.scales, c.width, c.heads, c.ff
    )
}

#[allow(clippy::too_many_arguments)]
fn finish<B: TrainBackend + MemorySource>(
    b: &B,
    learner: &Trainer<B>,
    (options, description): (&Options, &str),
    out: &mut dyn Write,
    started: Instant,
    steps: u64,
    stopped_early: bool,
    train: Option<Tally>,
    validation: Option<Tally>,
) -> Result<Outcome> {
    let w = io_err("writing to");
    b.synchronize()?;
    let mut summary = format!(
        "summary: {steps} steps in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Some(t) = &train {
        summary += &format!("; train loss {:.4} acc {:.4}", t.mean_loss(), t.accuracy());
    }
    if let Some(v) = &validation {
        summary += &format!(
            "; validation loss {:.4} acc {:.4}",
            v.mean_loss(),
            v.accuracy()
        );
    }
    summary += &format!("; peak {} memory {}", b.kind(), Bytes(b.peak()));
    writeln!(out, "{summary}").map_err(&w)?;
    writeln!(out, "arena: {}", b.diagnostics()).map_err(&w)?;
    if let Some(path) = &options.memory_report {
        let report = MemoryReport {
            title: "ztrain memory report".into(),
            facts: vec![
                ("device".into(), description.to_string()),
                ("model".into(), model_line(&learner.model().config)),
                ("schedule".into(), schedule_line(learner.config())),
                ("optimiser steps".into(), steps.to_string()),
            ],
            steps: b.steps().unwrap_or_default(),
            diagnostics: b.diagnostics(),
        };
        report.write(path)?;
        writeln!(out, "memory report: {}", path.display()).map_err(&w)?;
    }
    Ok(Outcome {
        steps,
        stopped_early,
        train,
        validation,
    })
}
