//! How a run ends: the summary lines, the soak and memory reports, and the [`Outcome`].

use std::time::{Duration, Instant};

use zcompute::units::Bytes;
use zgrad::Model;

use crate::console::Console;
use crate::error::Result;
use crate::files;
use crate::fit::learner::Learner;
use crate::memory::MemorySource;
use crate::progress::host_memory;
use crate::report::MemoryReport;
use crate::run::Context;
use crate::soak::{Sample, Soak};
use crate::step::{Tally, TrainBackend};

/// Samples trained and the time the trainer took for them (its step calls and the waits for
/// the steps they queued): its own samples per second, without data loading, evaluation or
/// checkpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Throughput {
    pub(crate) samples: u64,
    pub(crate) time: Duration,
}

impl Throughput {
    pub(crate) fn add(&mut self, samples: usize, time: Duration) {
        self.samples += samples as u64;
        self.time += time;
    }

    /// `; 3072 samples trained at 5123 samples/s`, or nothing when none were.
    pub(crate) fn summary_part(&self) -> String {
        if self.samples == 0 {
            return String::new();
        }
        let rate = self.samples as f64 / self.time.as_secs_f64().max(1e-9);
        format!("; {} samples trained at {rate:.0} samples/s", self.samples)
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Optimiser steps taken in all (resumed ones included).
    pub steps: u64,
    /// Whether `--stop-after` (or a signal) ended it before the last epoch.
    pub stopped_early: bool,
    /// The signal that stopped it (`main` exits with 128 + it).
    pub interrupted: Option<i32>,
    /// The training set's loss and metrics at the end (`None` if the run stopped early).
    pub train: Option<Tally>,
    /// Validation loss and metrics at the end (`None` without a validation set).
    pub validation: Option<Tally>,
}

/// Why the epoch loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Finished,
    StopAfter,
    Signal(i32),
}

/// The end of a run, for the summary.
pub(crate) struct End<'a> {
    pub(crate) started: Instant,
    pub(crate) steps: u64,
    /// The samples this run trained on (resumed ones not counted) and the time spent in
    /// `Trainer::step` on them.
    pub(crate) training: Throughput,
    pub(crate) ended: Ended,
    pub(crate) soak: Option<&'a Soak>,
    pub(crate) config: &'a serde_json::Value,
    /// The run's metrics (the report's curves).
    pub(crate) metrics: &'a crate::metrics::Metrics,
    /// What the run held on the host for its data.
    pub(crate) host_data: crate::data::held::HostData,
}

pub(crate) fn sample_memory<B: MemorySource>(b: &B, step: u64) -> Sample {
    Sample {
        step,
        arena_bytes: b.arena_in_use(),
        arena_high_water: b.arena_high_water(),
        device_used: b.device_used(),
        host_rss: host_memory().map_or(0, |(now, _)| now),
    }
}

/// `batched, capture off`.
fn schedule_line(c: &zgrad::TrainerConfig) -> String {
    let schedule = crate::config::schedule_name(c.schedule);
    let capture = if c.capture { "on" } else { "off" };
    format!("{schedule}, capture {capture}")
}

/// The memory report's line for the host's data bytes.
fn host_data_fact(d: &crate::data::held::HostData) -> String {
    format!(
        "{} held: {} {}, pinned staging {}, evaluation beside it {}{}",
        Bytes(d.held()),
        match d.kind {
            crate::data::held::Kind::Rows => "samples",
            crate::data::held::Kind::Series => "series of bars (once)",
            crate::data::held::Kind::Streamed => "samples left in the file (--stream)",
        },
        Bytes(d.samples),
        Bytes(d.staging),
        Bytes(d.evaluation),
        if d.reader > 0 {
            format!(", Parquet reader at most {}", Bytes(d.reader))
        } else {
            String::new()
        }
    )
}

pub(crate) fn finish<B: TrainBackend + MemorySource, M: Model<B, f32>>(
    b: &B,
    learner: &Learner<B, M>,
    ctx: &Context<'_>,
    out: &mut Console<'_>,
    end: &End<'_>,
    train: Option<Tally>,
    validation: Option<Tally>,
) -> Result<Outcome> {
    let (options, description, steps) = (ctx.options, ctx.description, end.steps);
    b.synchronize()?;
    let mut summary = format!(
        "summary: {steps} steps in {:.1} s",
        end.started.elapsed().as_secs_f64()
    );
    summary += &end.training.summary_part();
    if let Some(t) = &train {
        summary += &format!("; train loss {:.4} {}", t.mean_loss(), t.metrics_text());
    }
    if let Some(v) = &validation {
        summary += &format!(
            "; validation loss {:.4} {}",
            v.mean_loss(),
            v.metrics_text()
        );
    }
    summary += &format!("; peak {} memory {}", b.kind(), Bytes(b.peak()));
    out.line(&summary);
    out.line(&format!("arena: {}", b.diagnostics()));
    if let (Some(path), Some(soak)) = (&options.soak_report, end.soak) {
        let json = soak.to_json(description, end.config);
        files::write_atomically(path, "writing the soak report", json.to_string().as_bytes())?;
        out.line(&soak.summary());
        out.line(&format!("soak report: {}", path.display()));
    }
    if let Some(path) = &options.memory_report {
        let report = MemoryReport {
            title: format!("{} memory report", out.program()),
            facts: vec![
                ("device".into(), description.to_string()),
                ("model".into(), ctx.model_line.clone()),
                ("schedule".into(), schedule_line(learner.config())),
                ("optimiser steps".into(), steps.to_string()),
                ("host data".into(), host_data_fact(&end.host_data)),
            ],
            steps: b.steps().unwrap_or_default(),
            diagnostics: b.diagnostics(),
            curves: crate::report::curves::Curves::of(end.metrics),
        };
        report.write(path)?;
        out.line(&format!("memory report: {}", path.display()));
    }
    Ok(Outcome {
        steps,
        stopped_early: end.ended != Ended::Finished,
        interrupted: match end.ended {
            Ended::Signal(s) => Some(s),
            _ => None,
        },
        train,
        validation,
    })
}
