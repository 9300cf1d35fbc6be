//! `--metrics FILE.csv` (or `.jsonl`): every reported metric in a file pandas reads
//! (`pd.read_csv`, `pd.read_json(lines=True)`): one row per epoch (`kind` = `epoch`: the
//! running train loss, the validation loss and accuracy, the rate, the time) and, with
//! `--metrics-every N`, one row every N optimiser steps (`kind` = `step`: the step's loss,
//! gradient norm and learning rate). A metric a row does not have is an empty cell (NaN to
//! pandas) or `null`. The columns are the same for every task, so one header serves every
//! file: a classification task (binary, classes) fills `val_accuracy` and leaves `val_mse`,
//! `val_mae` and `val_pearson` empty; a regression fills those three and leaves
//! `val_accuracy` empty (a regression has no accuracy; zgrad's `NaN` is not written). The
//! regression columns come last, so a reader of the first columns of older files reads
//! these alike. Each row is written when it is known (a run that stops keeps its rows);
//! a resumed run appends to the file. The rows also feed the report's curves.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::error::{Result, TrainError};

/// The file's columns, in order.
pub const COLUMNS: [&str; 14] = [
    "kind",
    "epoch",
    "step",
    "train_loss",
    "grad_norm",
    "lr",
    "val_loss",
    "val_accuracy",
    "samples_per_second",
    "elapsed_s",
    "samples",
    "val_mse",
    "val_mae",
    "val_pearson",
];

/// One row: an epoch's end or a step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricRow {
    /// `epoch` or `step`.
    pub kind: &'static str,
    /// The epoch (from 1) the row is in.
    pub epoch: u64,
    /// Optimiser steps taken.
    pub step: u64,
    pub train_loss: Option<f64>,
    pub grad_norm: Option<f64>,
    pub lr: Option<f64>,
    pub val_loss: Option<f64>,
    pub val_accuracy: Option<f64>,
    pub samples_per_second: Option<f64>,
    pub elapsed_s: Option<f64>,
    /// Samples behind `train_loss` (the batch, or the epoch's).
    pub samples: Option<u64>,
    /// A regression's validation metrics (`zgrad::RegressionMetrics`).
    pub val_mse: Option<f64>,
    pub val_mae: Option<f64>,
    pub val_pearson: Option<f64>,
}

impl MetricRow {
    fn cells(&self) -> [Option<String>; 14] {
        let f = |v: Option<f64>| v.map(|v| format!("{v}"));
        [
            Some(self.kind.to_string()),
            Some(self.epoch.to_string()),
            Some(self.step.to_string()),
            f(self.train_loss),
            f(self.grad_norm),
            f(self.lr),
            f(self.val_loss),
            f(self.val_accuracy),
            f(self.samples_per_second),
            f(self.elapsed_s),
            self.samples.map(|s| s.to_string()),
            f(self.val_mse),
            f(self.val_mae),
            f(self.val_pearson),
        ]
    }

    /// The row as one CSV line (no newline): numbers printed exactly, empty where absent.
    #[must_use]
    pub fn csv(&self) -> String {
        self.cells()
            .iter()
            .map(|c| c.clone().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The row as one JSON object (`null` where absent; non-finite numbers as `null` too).
    #[must_use]
    pub fn json(&self) -> serde_json::Value {
        json!({
            "kind": self.kind, "epoch": self.epoch, "step": self.step,
            "train_loss": self.train_loss, "grad_norm": self.grad_norm, "lr": self.lr,
            "val_loss": self.val_loss, "val_accuracy": self.val_accuracy,
            "samples_per_second": self.samples_per_second, "elapsed_s": self.elapsed_s,
            "samples": self.samples,
            "val_mse": self.val_mse, "val_mae": self.val_mae, "val_pearson": self.val_pearson,
        })
    }
}

/// The metrics of a run: the rows so far (for the report) and the file they go to.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Every `every` steps a step row (`None`: epoch rows only).
    pub every: Option<u64>,
    /// Every step's loss read back, for the report's curve.
    pub step_losses: Vec<(u64, f64)>,
    /// Every row, in order.
    pub rows: Vec<MetricRow>,
    file: Option<(PathBuf, bool, BufWriter<File>)>,
}

impl Metrics {
    /// Rows to `path` (CSV, or JSON lines when it ends in `.jsonl`/`.ndjson`), when given:
    /// created anew, or appended to when `append` (a resumed run) and it exists.
    pub fn new(path: Option<&Path>, every: Option<u64>, append: bool) -> Result<Metrics> {
        let file = match path {
            None => None,
            Some(path) => {
                let jsonl = path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                    e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("ndjson")
                });
                let io = |source| TrainError::Io {
                    what: "writing the metrics file",
                    path: path.to_path_buf(),
                    source,
                };
                let existing = append && path.metadata().is_ok_and(|m| m.len() > 0);
                let f = OpenOptions::new()
                    .create(true)
                    .write(true)
                    .append(existing)
                    .truncate(!existing)
                    .open(path)
                    .map_err(io)?;
                let mut w = BufWriter::new(f);
                if !jsonl && !existing {
                    writeln!(w, "{}", COLUMNS.join(",")).map_err(io)?;
                    w.flush().map_err(io)?;
                }
                Some((path.to_path_buf(), jsonl, w))
            }
        };
        Ok(Metrics {
            every,
            step_losses: Vec::new(),
            rows: Vec::new(),
            file,
        })
    }

    /// Adds `row`, written to the file at once.
    pub fn push(&mut self, row: MetricRow) -> Result<()> {
        if let Some((path, jsonl, w)) = self.file.as_mut() {
            let line = if *jsonl {
                row.json().to_string()
            } else {
                row.csv()
            };
            writeln!(w, "{line}")
                .and_then(|()| w.flush())
                .map_err(|source| TrainError::Io {
                    what: "writing the metrics file",
                    path: path.clone(),
                    source,
                })?;
        }
        self.rows.push(row);
        Ok(())
    }

    /// A read-back step of epoch `epoch`: kept for the curve, and a row when it is due.
    pub fn step(&mut self, epoch: u64, r: &zgrad::StepReport) -> Result<()> {
        self.step_losses.push((r.step, r.loss));
        if self.every.is_some_and(|e| r.step.is_multiple_of(e)) {
            self.push(MetricRow {
                kind: "step",
                epoch,
                step: r.step,
                train_loss: Some(r.loss),
                grad_norm: Some(r.grad_norm),
                lr: Some(r.lr),
                samples: Some(r.samples as u64),
                ..MetricRow::default()
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch_row() -> MetricRow {
        MetricRow {
            kind: "epoch",
            epoch: 2,
            step: 8,
            train_loss: Some(0.5),
            val_loss: Some(0.25),
            val_accuracy: Some(0.75),
            ..MetricRow::default()
        }
    }

    #[test]
    fn csv_rows_have_every_column_and_empty_cells_where_absent() {
        let line = epoch_row().csv();
        assert_eq!(line, "epoch,2,8,0.5,,,0.25,0.75,,,,,,");
        assert_eq!(line.split(',').count(), COLUMNS.len());
    }

    fn regression_row() -> MetricRow {
        MetricRow {
            val_accuracy: None,
            val_mse: Some(0.25),
            val_mae: Some(0.375),
            val_pearson: Some(0.875),
            ..epoch_row()
        }
    }

    #[test]
    fn a_regressions_row_has_its_metrics_and_no_accuracy() {
        let line = regression_row().csv();
        assert_eq!(line, "epoch,2,8,0.5,,,0.25,,,,,0.25,0.375,0.875");
        let cells: Vec<&str> = line.split(',').collect();
        let col = |name: &str| COLUMNS.iter().position(|c| *c == name).expect(name);
        assert_eq!(cells[col("val_accuracy")], "");
        assert_eq!(cells[col("val_pearson")], "0.875");
        let v = regression_row().json();
        assert_eq!(v["val_accuracy"], serde_json::Value::Null);
        assert_eq!(v["val_mse"], 0.25);
        assert_eq!(v["val_mae"], 0.375);
        assert_eq!(v["val_pearson"], 0.875);
        // The JSON object has every column, no more.
        let keys: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut columns = COLUMNS.to_vec();
        columns.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, columns);
    }

    #[test]
    fn a_file_gets_its_header_once_and_rows_as_they_come() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.csv");
        let mut m = Metrics::new(Some(&path), Some(2), false).expect("opens");
        let report = |step| zgrad::StepReport {
            step,
            loss: 0.125,
            grad_norm: 1.0,
            lr: 0.001,
            samples: 4,
            captured: false,
        };
        m.step(1, &report(1)).expect("step 1");
        m.step(1, &report(2)).expect("step 2");
        m.push(epoch_row()).expect("epoch");
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], COLUMNS.join(","));
        assert_eq!(lines[1], "step,1,2,0.125,1,0.001,,,,,4,,,");
        assert_eq!(lines.len(), 3);
        assert_eq!(m.step_losses.len(), 2);
        // A resumed run appends, without a second header.
        let mut m = Metrics::new(Some(&path), None, true).expect("opens");
        m.push(epoch_row()).expect("epoch");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.lines().count(), 4);
        assert_eq!(text.matches("kind,").count(), 1);
    }

    #[test]
    fn json_lines_are_objects_with_nulls() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.jsonl");
        let mut m = Metrics::new(Some(&path), None, false).expect("opens");
        m.push(epoch_row()).expect("epoch");
        let text = std::fs::read_to_string(&path).expect("read");
        let v: serde_json::Value = serde_json::from_str(text.trim()).expect("json");
        assert_eq!(v["val_loss"], 0.25);
        assert_eq!(v["grad_norm"], serde_json::Value::Null);
    }
}
