//! `--window S`: a table of bars (one row per time step: `F` feature columns, then the label)
//! cut into `[S, F]` windows as training runs. The series is stored once; a window is an
//! index into it (sample `i` is bars `first + i .. first + i + S`, labelled with its last
//! bar's label), and a batch's windows are copied out of it when the batch is staged.
//!
//! The split is walk-forward: the validation windows are the last `fraction` of the windows,
//! and every bar of a training window comes strictly before every bar of a validation window,
//! `gap` bars apart (`split`). Normalisation statistics, when asked for, come from the bars
//! the training windows cover only (`Normalization::of_rows`).

use std::sync::Arc;

use super::Dataset;
use super::table::Fault;
use crate::error::{DataPlace, DataProblem};

/// Windows of `window` consecutive bars of `series` (a [`Dataset`] of one scale: one bar a
/// sample), starting at bars `first .. first + len`.
#[derive(Clone, Debug, PartialEq)]
pub struct Windows {
    pub series: Arc<Dataset>,
    pub window: usize,
    pub first: usize,
    pub len: usize,
}

impl Windows {
    /// Values per window (`S·F`).
    #[must_use]
    pub fn sample_width(&self) -> usize {
        self.window * self.series.features
    }

    /// Copies window `i`'s features into `x` (`S·F` values) and its targets (its last bar's:
    /// the series' targets a bar) into `y`.
    pub fn copy(&self, i: usize, x: &mut [f32], y: &mut [f32]) {
        let (f, t) = (self.series.features, self.series.targets());
        let start = self.first + i;
        x.copy_from_slice(&self.series.x[start * f..(start + self.window) * f]);
        let last = start + self.window - 1;
        y.copy_from_slice(&self.series.y[last * t..(last + 1) * t]);
    }

    /// The windows as pre-cut samples (what a CSV of one window a row would hold).
    #[must_use]
    pub fn materialize(&self) -> Dataset {
        let (w, t) = (self.sample_width(), self.series.targets());
        let (mut x, mut y) = (vec![0.0; self.len * w], vec![0.0; self.len * t]);
        for i in 0..self.len {
            self.copy(i, &mut x[i * w..(i + 1) * w], &mut y[i * t..(i + 1) * t]);
        }
        Dataset {
            scales: self.window,
            features: self.series.features,
            x,
            y,
        }
    }
}

/// The training and validation windows of `series` (bars, one scale), validation the last
/// `fraction` of the `rows - window + 1` windows (rounded up, as `Dataset::split_validation`),
/// training the windows whose last bar lies more than `gap` bars before the first validation
/// bar. `normalize`: the series normalised by the statistics of the bars the training
/// windows cover (returned). A window longer than the series is a fault.
pub fn split(
    mut series: Dataset,
    window: usize,
    fraction: f64,
    gap: usize,
    normalize: bool,
) -> Result<(Windows, Windows, Option<Normalization>), Fault> {
    let rows = series.len();
    if window == 0 || window > rows {
        return Err(Fault::new(
            DataPlace::File,
            DataProblem::WindowTooLong { window, rows },
        ));
    }
    let total = rows - window + 1;
    let n_val = if fraction <= 0.0 {
        0
    } else {
        ((total as f64 * fraction).ceil() as usize).clamp(1, total)
    };
    let val_first = total - n_val;
    // The last training window ends at bar `n_train - 1 + window - 1`, `gap` bars before the
    // first validation bar `val_first` (with no validation windows, every window trains).
    let n_train = if n_val == 0 {
        total
    } else {
        val_first.saturating_sub(window - 1 + gap)
    };
    let norm = (normalize && n_train > 0).then(|| {
        let n = Normalization::of_rows(&series.x, series.features, n_train + window - 1);
        n.apply(&mut series.x);
        n
    });
    // Held for the whole run: no more than its values (a loader's growth room goes).
    series.x.shrink_to_fit();
    series.y.shrink_to_fit();
    let series = Arc::new(series);
    Ok((
        Windows {
            series: Arc::clone(&series),
            window,
            first: 0,
            len: n_train,
        },
        Windows {
            series,
            window,
            first: val_first,
            len: n_val,
        },
        norm,
    ))
}

/// Per-feature mean and standard deviation of the training part, applied to every value as
/// `(v - mean) / std` (a constant feature's std counts as 1). Computed in `f64`, in row order.
#[derive(Clone, Debug, PartialEq)]
pub struct Normalization {
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
}

impl Normalization {
    /// The statistics of feature `f` over `rows` rows of `features` values each in `x`
    /// (feature `f` of row `r` at `r·features + f`).
    #[must_use]
    pub fn of_rows(x: &[f32], features: usize, rows: usize) -> Normalization {
        let x = x.get(..rows * features).unwrap_or(x);
        let whole: Result<_, std::convert::Infallible> =
            Normalization::of_chunks(features, |visit| {
                visit(x);
                Ok(())
            });
        match whole {
            Ok(n) => n,
            Err(never) => match never {},
        }
    }

    /// [`Normalization::of_rows`] of rows given a chunk at a time: `pass(visit)` gives every
    /// row in order, in chunks of whole rows (`visit(values)`), and is called twice (the mean,
    /// then the deviations from it). The same sums in the same order as `of_rows` of the rows
    /// in one piece, so bitwise its statistics: a streamed file's (`--stream --normalize`).
    pub fn of_chunks<E>(
        features: usize,
        mut pass: impl FnMut(&mut dyn FnMut(&[f32])) -> Result<(), E>,
    ) -> Result<Normalization, E> {
        let mut mean = vec![0.0f64; features];
        let mut rows = 0usize;
        pass(&mut |x: &[f32]| {
            for row in x.chunks_exact(features.max(1)) {
                for (m, &v) in mean.iter_mut().zip(row) {
                    *m += f64::from(v);
                }
                rows += 1;
            }
        })?;
        let n = rows.max(1) as f64;
        for m in &mut mean {
            *m /= n;
        }
        let mut sq = vec![0.0f64; features];
        pass(&mut |x: &[f32]| {
            for row in x.chunks_exact(features.max(1)) {
                for ((s, &v), m) in sq.iter_mut().zip(row).zip(&mean) {
                    let d = f64::from(v) - m;
                    *s += d * d;
                }
            }
        })?;
        let std = sq
            .iter()
            .map(|s| {
                let sd = (s / n).sqrt();
                if sd > 0.0 && sd.is_finite() { sd } else { 1.0 }
            })
            .collect();
        Ok(Normalization { mean, std })
    }

    /// Applies the statistics to every value of `x` (rows of `mean.len()` values).
    pub fn apply(&self, x: &mut [f32]) {
        let f = self.mean.len();
        for (i, v) in x.iter_mut().enumerate() {
            let k = i % f;
            *v = ((f64::from(*v) - self.mean[k]) / self.std[k]) as f32;
        }
    }

    /// As JSON (stored in the checkpoint's configuration): each number as the shortest text
    /// that reads back as the same `f64`, in a string, so that the comparison on resume is
    /// exact (serde_json's own float parsing may be off by an ulp).
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        let text = |v: &[f64]| v.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>();
        serde_json::json!({"mean": text(&self.mean), "std": text(&self.std)})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn bars(rows: usize, features: usize) -> Dataset {
        Dataset {
            scales: 1,
            features,
            x: (0..rows * features).map(|v| v as f32).collect(),
            y: (0..rows).map(|i| (i % 2) as f32).collect(),
        }
    }

    /// Bars of `K` targets each (a table's last `K` columns): a window's targets are its last
    /// bar's `K`.
    #[test]
    fn a_window_takes_its_last_bars_k_targets() {
        let mut series = bars(10, 2);
        series.y = (0..20).map(|v| v as f32).collect();
        let (train, _, _) = split(series, 3, 0.0, 0, false).expect("fits");
        let (mut x, mut y) = ([0.0; 6], [0.0; 2]);
        train.copy(4, &mut x, &mut y);
        assert_eq!(y, [12.0, 13.0], "bar 6's two targets");
        let d = train.materialize();
        assert_eq!((d.len(), d.targets()), (8, 2));
        assert_eq!(&d.y[8..10], &y);
    }

    #[test]
    fn a_window_is_consecutive_bars_labelled_by_its_last() {
        let (train, _, _) = split(bars(10, 2), 3, 0.0, 0, false).expect("fits");
        assert_eq!(train.len, 8);
        let mut x = [0.0; 6];
        let mut y = [9.0];
        train.copy(4, &mut x, &mut y);
        assert_eq!(x, [8.0, 9.0, 10.0, 11.0, 12.0, 13.0]);
        assert_eq!(y, [0.0], "bar 6's label");
        let d = train.materialize();
        assert_eq!(&d.x[4 * 6..5 * 6], &x);
        assert_eq!((d.scales, d.features, d.len()), (3, 2, 8));
    }

    #[rstest]
    #[case(43, 4, 0.25, 0, 27, 30, 10)]
    #[case(43, 4, 0.25, 5, 22, 30, 10)]
    #[case(10, 10, 0.5, 0, 0, 0, 1)]
    #[case(20, 1, 0.2, 2, 14, 16, 4)]
    fn validation_bars_come_strictly_after_training_bars_and_the_gap(
        #[case] rows: usize,
        #[case] window: usize,
        #[case] fraction: f64,
        #[case] gap: usize,
        #[case] n_train: usize,
        #[case] val_first: usize,
        #[case] n_val: usize,
    ) {
        let (t, v, _) = split(bars(rows, 1), window, fraction, gap, false).expect("fits");
        assert_eq!((t.len, v.first, v.len), (n_train, val_first, n_val));
        if t.len > 0 {
            let last_train_bar = t.len - 1 + window - 1;
            assert_eq!(last_train_bar + gap + 1, v.first);
        }
        assert_eq!(v.first + v.len + window - 1, rows);
    }

    #[test]
    fn the_series_holds_no_more_than_its_values() {
        let mut b = bars(10, 2);
        b.x.reserve(1000);
        b.y.reserve(1000);
        let (t, _, _) = split(b, 3, 0.2, 0, false).expect("fits");
        assert_eq!((t.series.x.capacity(), t.series.y.capacity()), (20, 10));
    }

    #[test]
    fn a_window_longer_than_the_series_is_refused() {
        let e = split(bars(5, 2), 6, 0.2, 0, false).unwrap_err();
        assert_eq!(e.problem, DataProblem::WindowTooLong { window: 6, rows: 5 });
        assert!(e.problem.to_string().contains("--window 6"));
    }

    #[test]
    fn the_statistics_are_the_training_bars_only() {
        // Bars 0..10 of one feature valued 0..10; window 2, a fifth validation, gap 1:
        // 9 windows, 2 validate (first bar 7), training windows end by bar 5: bars 0..=5.
        let (t, v, n) = split(bars(10, 1), 2, 0.2, 1, true).expect("fits");
        assert_eq!((t.len, v.first), (5, 7));
        let n = n.expect("asked for");
        assert_eq!(n.mean, vec![2.5]);
        let mut x = [0.0; 2];
        v.copy(0, &mut x, &mut [0.0]);
        assert_eq!(f64::from(x[0]), ((7.0 - 2.5) / n.std[0]) as f32 as f64);
    }

    #[test]
    fn the_stored_statistics_survive_a_json_round_trip_exactly() {
        // serde_json parses this f64 one ulp off; the statistics are stored as text.
        let n = Normalization {
            mean: vec![0.113_774_675_058_155_53],
            std: vec![1.162_049_440_618_646_1],
        };
        let json = n.to_json();
        let back: serde_json::Value = serde_json::from_str(&json.to_string()).expect("json");
        assert_eq!(back, json);
        let mean: f64 = back["mean"][0]
            .as_str()
            .expect("text")
            .parse()
            .expect("f64");
        assert_eq!(mean.to_bits(), n.mean[0].to_bits());
    }

    #[test]
    fn normalization_uses_the_rows_it_is_given() {
        let x = [1.0, 10.0, 3.0, 10.0, 100.0, -5.0];
        let n = Normalization::of_rows(&x, 2, 2);
        assert_eq!(n.mean, vec![2.0, 10.0]);
        assert_eq!(
            n.std,
            vec![1.0, 1.0],
            "a constant feature's std counts as 1"
        );
        let mut y = x;
        n.apply(&mut y);
        assert_eq!(y, [-1.0, 0.0, 1.0, 0.0, 98.0, -15.0]);
    }

    proptest::proptest! {
        /// Rows given in chunks of any sizes (`--stream --normalize`) give the statistics of
        /// the rows in one piece, bit for bit.
        #[test]
        fn statistics_of_chunks_are_the_statistics_of_the_rows_bitwise(
            values in proptest::collection::vec(-1e6f32..1e6, 3..120),
            cuts in proptest::collection::vec(1usize..9, 1..20),
        ) {
            let features = 3;
            let rows = values.len() / features;
            let x = &values[..rows * features];
            let whole = Normalization::of_rows(x, features, rows);
            let chunked: Result<_, ()> = Normalization::of_chunks(features, |visit| {
                let mut at = 0;
                for &c in cuts.iter().cycle() {
                    if at == rows {
                        break;
                    }
                    let end = (at + c).min(rows);
                    visit(&x[at * features..end * features]);
                    at = end;
                }
                Ok(())
            });
            let chunked = chunked.expect("no error");
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            proptest::prop_assert_eq!(bits(&chunked.mean), bits(&whole.mean));
            proptest::prop_assert_eq!(bits(&chunked.std), bits(&whole.std));
        }
    }
}
