//! `--data FILE`: the file's format from its extension, each read into the same [`Dataset`]
//! the CSV loader produces (the `S·F` features in the CSV's order, then the label), so a run
//! on any of them trains bitwise the same. Also the bar tables `--window` cuts.

use std::path::Path;

use super::Dataset;
use super::labels::Labels;
use crate::error::{Result, TrainError};

/// The formats `--data` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Csv,
    Parquet,
    Arrow,
    Npz,
    Npy,
    Safetensors,
}

impl Format {
    /// The format of `path`, from its extension (any case). Any other extension, or none (a
    /// pipe, `/dev/stdin`), is CSV, as `--data` always read: a binary file there is refused
    /// by the CSV reader (not text).
    pub fn of(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        Ok(match ext.as_str() {
            "parquet" | "pq" => Format::Parquet,
            "arrow" | "feather" | "ipc" => Format::Arrow,
            "npz" => Format::Npz,
            "npy" => Format::Npy,
            "safetensors" => Format::Safetensors,
            _ => Format::Csv,
        })
    }

    /// How messages name it.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Format::Csv => "CSV",
            Format::Parquet => super::parquet::FORMAT,
            Format::Arrow => super::arrow::FORMAT,
            Format::Npz => super::npy::NPZ,
            Format::Npy => super::npy::NPY,
            Format::Safetensors => super::tensors::FORMAT,
        }
    }

    /// How the run's configuration names it (`csv` as before formats were added).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Parquet => "parquet",
            Format::Arrow => "arrow",
            Format::Npz => "npz",
            Format::Npy => "npy",
            Format::Safetensors => "safetensors",
        }
    }
}

/// Why a data file read whole is bounded (`load`'s `limit`).
pub(super) const LIMIT_REASON: &str =
    "a quarter of the host's available memory: the file and its values must fit";

/// Reads `path` whole, no larger than `limit` bytes (a quarter of the host's available
/// memory: the bytes and the values must fit).
fn read(path: &Path, limit: u64) -> Result<Vec<u8>> {
    crate::files::read_bounded(path, "reading the data file", limit, LIMIT_REASON)
}

/// The samples of `scales × features` in the data file `path` (`y_path`: the labels' `.npy`
/// beside a features `.npy`), each label one `labels` takes, with an FNV-1a fingerprint of
/// the bytes read.
pub fn load(
    path: &Path,
    y_path: Option<&Path>,
    scales: usize,
    features: usize,
    limit: u64,
    labels: Labels,
) -> Result<(Dataset, u64)> {
    let format = Format::of(path)?;
    match (format, y_path) {
        (Format::Npy, None) => return needs_labels(path),
        (Format::Npy, Some(y)) => {
            let (d, bytes) = super::npy::load_pair(path, y, (scales, features), limit, labels)?;
            return Ok((d, crate::config::fnv1a(&bytes)));
        }
        (_, Some(_)) => {
            return Err(TrainError::Options(
                "--labels goes with a features .npy file (--data x.npy --labels y.npy)".into(),
            ));
        }
        _ => {}
    }
    let bytes = read(path, limit)?;
    let digest = crate::config::fnv1a(&bytes);
    let width = scales * features;
    let data = match format {
        Format::Csv => super::csv::load_bytes(path, &bytes, scales, features, labels)?,
        Format::Parquet => super::parquet::table(path, bytes, width, labels)?
            .into_dataset(scales, features)
            .map_err(|f| f.in_file(path, super::parquet::FORMAT))?,
        Format::Arrow => super::arrow::table(path, bytes, width, labels)?
            .into_dataset(scales, features)
            .map_err(|f| f.in_file(path, super::arrow::FORMAT))?,
        Format::Npz => super::npy::load_npz(path, &bytes, scales, features, labels)?,
        Format::Safetensors => super::tensors::load(path, &bytes, scales, features, labels)?,
        Format::Npy => needs_labels(path)?,
    };
    Ok((data, digest))
}

/// A features `.npy` without `--labels`.
fn needs_labels<T>(path: &Path) -> Result<T> {
    Err(TrainError::Options(format!(
        "--data {}: a .npy file holds one array (the features x [N, S, F]); give the labels' .npy (y [N], or [N, K] for K target values) with --labels, or both in one .npz",
        path.display()
    )))
}

/// The bars of a table for `--window` (CSV, Parquet or Arrow: `features` columns and the
/// label, one row per time step) as a data set of one scale, with the bytes' fingerprint.
pub fn load_bars(
    path: &Path,
    features: usize,
    limit: u64,
    labels: Labels,
) -> Result<(Dataset, u64)> {
    let format = Format::of(path)?;
    if !matches!(format, Format::Csv | Format::Parquet | Format::Arrow) {
        return Err(TrainError::Options(format!(
            "--window cuts windows from a table of bars (one row per time step: .csv, .parquet or .arrow); {} is a {} file of pre-cut samples: drop --window",
            path.display(),
            format.name()
        )));
    }
    load(path, None, 1, features, limit, labels)
}
