//! Data sets: samples of `S` scales × `F` features with their targets (a 0/1 label, a class
//! index or `K` regression values, as the model's task takes them: [`labels`]), from a data file
//! ([`formats`]: CSV, Parquet, Arrow IPC, NumPy, safetensors), cut from a series of bars as
//! training runs ([`windows`]) or generated ([`synthetic`]); the train/validation split and
//! the epoch order.

pub mod arrow;
pub mod arrow_stream;
pub mod csv;
pub mod elements;
pub mod feed;
pub mod formats;
pub mod held;
pub mod labels;
pub mod npy;
pub mod parquet;
pub mod parquet_stream;
pub mod placement;
pub mod stream;
pub mod stream_csv;
pub mod stream_npz;
pub mod synthetic;
pub mod table;
pub mod tensors;
pub mod windows;

use std::borrow::Cow;

use crate::error::Result;
use crate::rng::Rng;

/// Samples in memory, row-major: sample `i`'s features are `x[i·S·F .. (i+1)·S·F]`, feature `f`
/// of scale `s` at offset `s·F + f` (the CSV column order), its targets `y[i·T .. (i+1)·T]`
/// (`T = targets()`, the model's `Task::target_len`: one label, 0.0 or 1.0 for XAsset; `K`
/// regression values; then a weighted task's weights).
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub scales: usize,
    pub features: usize,
    pub x: Vec<f32>,
    pub y: Vec<f32>,
}

impl Dataset {
    /// Number of samples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.x.len() / self.sample_width().max(1)
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Target values per sample (`y.len() / len()`; 1 for an empty set).
    #[must_use]
    pub fn targets(&self) -> usize {
        match self.len() {
            0 => 1,
            n => self.y.len() / n,
        }
    }

    /// Values per sample (`S·F`).
    #[must_use]
    pub fn sample_width(&self) -> usize {
        self.scales * self.features
    }

    /// The samples at `indices`, in that order: `x` as `[indices.len(), S, F]` row-major and the
    /// targets. Indices must be below `len()`.
    #[must_use]
    pub fn gather(&self, indices: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let (w, t) = (self.sample_width(), self.targets());
        let mut x = Vec::with_capacity(indices.len() * w);
        let mut y = Vec::with_capacity(indices.len() * t);
        for &i in indices {
            x.extend_from_slice(&self.x[i * w..(i + 1) * w]);
            y.extend_from_slice(&self.y[i * t..(i + 1) * t]);
        }
        (x, y)
    }

    /// Splits off the last `fraction` of the samples (rounded up, at least one when `fraction >
    /// 0`) as the validation set. The tail, not a random subset: CSV rows are often in time
    /// order, and validating on the latest rows is what a time series needs.
    #[must_use]
    pub fn split_validation(mut self, fraction: f64) -> (Dataset, Dataset) {
        let n = self.len();
        let n_val = validation_len(n, fraction);
        let n_train = n - n_val;
        let (w, t) = (self.sample_width(), self.targets());
        let val = Dataset {
            scales: self.scales,
            features: self.features,
            x: self.x.split_off(n_train * w),
            y: self.y.split_off(n_train * t),
        };
        (self, val)
    }

    /// Fraction of labels equal to 1 (of one-label samples: XAsset's 0/1 labels).
    #[must_use]
    pub fn positive_fraction(&self) -> f64 {
        if self.is_empty() {
            return 0.0;
        }
        self.y.iter().filter(|&&v| v == 1.0).count() as f64 / self.len() as f64
    }
}

/// Samples in the validation set of `n` split by `fraction`: the last `fraction` of them,
/// rounded up, at least one when `fraction > 0`.
#[must_use]
pub fn validation_len(n: usize, fraction: f64) -> usize {
    if fraction <= 0.0 {
        0
    } else {
        ((n as f64 * fraction).ceil() as usize).clamp(1, n)
    }
}

/// The samples a run trains or validates on: rows in memory, windows cut from a series of
/// bars stored once, or rows read from their file as they are staged (`--stream`).
#[derive(Clone, Debug, PartialEq)]
pub enum Samples {
    Rows(Dataset),
    Windows(windows::Windows),
    Stream(stream::Streamed),
}

impl Samples {
    /// Number of samples.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Samples::Rows(d) => d.len(),
            Samples::Windows(w) => w.len,
            Samples::Stream(s) => s.len,
        }
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values per sample (`S·F`).
    #[must_use]
    pub fn sample_width(&self) -> usize {
        match self {
            Samples::Rows(d) => d.sample_width(),
            Samples::Windows(w) => w.sample_width(),
            Samples::Stream(s) => s.sample_width(),
        }
    }

    /// Target values per sample (`Task::target_len`).
    #[must_use]
    pub fn targets(&self) -> usize {
        match self {
            Samples::Rows(d) => d.targets(),
            Samples::Windows(w) => w.series.targets(),
            Samples::Stream(s) => s.targets(),
        }
    }

    /// A sample's shape `(S, F)`.
    #[must_use]
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Samples::Rows(d) => (d.scales, d.features),
            Samples::Windows(w) => (w.window, w.series.features),
            Samples::Stream(s) => (s.scales, s.features),
        }
    }

    /// Copies sample `i`'s features into `x` (`S·F` values) and its targets into `y`
    /// (`targets()` values); a streamed sample is read from its file (an error names the file
    /// and the row).
    pub fn copy(&self, i: usize, x: &mut [f32], y: &mut [f32]) -> Result<()> {
        match self {
            Samples::Rows(d) => {
                let (w, t) = (d.sample_width(), d.targets());
                x.copy_from_slice(&d.x[i * w..(i + 1) * w]);
                y.copy_from_slice(&d.y[i * t..(i + 1) * t]);
            }
            Samples::Windows(w) => w.copy(i, x, y),
            Samples::Stream(s) => s.copy(i, x, y)?,
        }
        Ok(())
    }

    /// Copies samples `rows` (any order) into `x` (sample `rows[i]`'s `S·F` values at
    /// `x[i·S·F..]`) and `y` (its targets at `y[i·T..]`, `T = targets()`): a streamed file
    /// read once for them all (a Parquet table a row group at a time), else sample by sample.
    pub fn copy_rows(&self, rows: &[usize], x: &mut [f32], y: &mut [f32]) -> Result<()> {
        if let Samples::Stream(s) = self {
            return s.copy_rows(rows, x, y);
        }
        let (per, t) = (self.sample_width(), self.targets());
        for (i, &r) in rows.iter().enumerate() {
            let (x, y) = (&mut x[i * per..(i + 1) * per], &mut y[i * t..(i + 1) * t]);
            self.copy(r, x, y)?;
        }
        Ok(())
    }

    /// Whether the samples are cut or read as each batch is staged (windows, streamed rows)
    /// rather than held as rows: the run then holds one batch of them (`feed`).
    #[must_use]
    pub fn staged_one_batch_at_a_time(&self) -> bool {
        !matches!(self, Samples::Rows(_))
    }

    /// The samples as rows in memory: the rows themselves, or the windows cut (a copy of
    /// `S` times the bars) or the streamed rows read (all of them): only where a whole set
    /// must be in one piece.
    pub fn rows(&self) -> Result<Cow<'_, Dataset>> {
        match self {
            Samples::Rows(d) => Ok(Cow::Borrowed(d)),
            Samples::Windows(w) => Ok(Cow::Owned(w.materialize())),
            Samples::Stream(s) => {
                let (n, per) = (s.len, s.sample_width());
                let (mut x, mut y) = (vec![0.0; n * per], vec![0.0; n * s.targets()]);
                s.copy_rows(&(0..n).collect::<Vec<_>>(), &mut x, &mut y)?;
                Ok(Cow::Owned(Dataset {
                    scales: s.scales,
                    features: s.features,
                    x,
                    y,
                }))
            }
        }
    }
}

/// The order samples are visited in one epoch: a fresh shuffle of `0..n` from the run's
/// generator at the start of each epoch, so the order is part of the generator's state and a
/// checkpoint restores it exactly.
#[must_use]
pub fn epoch_order(n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn counting(n: usize) -> Dataset {
        Dataset {
            scales: 2,
            features: 3,
            x: (0..n * 6).map(|v| v as f32).collect(),
            y: (0..n).map(|i| (i % 2) as f32).collect(),
        }
    }

    #[rstest]
    #[case(10, 0.0, 10, 0)]
    #[case(10, 0.1, 9, 1)]
    #[case(10, 0.15, 8, 2)]
    #[case(10, 0.01, 9, 1)]
    #[case(10, 1.0, 0, 10)]
    fn split_takes_the_tail(
        #[case] n: usize,
        #[case] fraction: f64,
        #[case] n_train: usize,
        #[case] n_val: usize,
    ) {
        let (train, val) = counting(n).split_validation(fraction);
        assert_eq!((train.len(), val.len()), (n_train, n_val));
        assert_eq!(train.x.len(), n_train * 6);
        if n_val > 0 {
            assert_eq!(val.x[0], (n_train * 6) as f32);
        }
    }

    #[test]
    fn gather_keeps_sample_rows_together() {
        let d = counting(4);
        let (x, y) = d.gather(&[3, 0]);
        assert_eq!(&x[..6], &[18.0, 19.0, 20.0, 21.0, 22.0, 23.0]);
        assert_eq!(&x[6..], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(y, vec![1.0, 0.0]);
    }

    #[test]
    fn epoch_order_depends_only_on_the_generator() {
        let a = epoch_order(50, &mut Rng::new(3));
        let b = epoch_order(50, &mut Rng::new(3));
        assert_eq!(a, b);
        assert_ne!(a, (0..50).collect::<Vec<_>>());
    }
}
