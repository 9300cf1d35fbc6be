//! The one place values read from a data file become samples: every format (Parquet and Arrow
//! column by column, NumPy and safetensors array by array) puts its values here, and the
//! checks are the CSV's: a finite float32 for a feature, a label as the model's task takes it
//! (`Labels`), no missing value turned into a number (a weighted task's missing label is a
//! masked target, weight 0). The result is the [`Dataset`] the CSV loader would
//! produce from the same numbers, so training on it is bitwise the same.

use std::path::Path;

use super::Dataset;
use super::labels::{LabelFault, Labels};
use crate::error::{DataError, DataPlace, DataProblem, TrainError};

/// A problem at a known place of a file (the caller adds the file and its format).
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    pub place: DataPlace,
    pub problem: DataProblem,
}

impl Fault {
    #[must_use]
    pub fn new(place: DataPlace, problem: DataProblem) -> Fault {
        Fault { place, problem }
    }

    /// The run's error for this fault in the `format` file at `path`.
    #[must_use]
    pub fn in_file(self, path: &Path, format: &'static str) -> TrainError {
        TrainError::from(DataError {
            path: path.to_path_buf(),
            format,
            place: self.place,
            problem: self.problem,
            source: None,
        })
    }
}

/// How a missing or non-finite value is named in messages.
fn missing(v: Option<f64>) -> Option<DataProblem> {
    let value = match v {
        None => "a missing value (null)".to_string(),
        Some(v) if v.is_nan() => "NaN".to_string(),
        Some(v) if v.is_infinite() => format!("{v}"),
        Some(v) if !(v as f32).is_finite() => format!("{v} (beyond float32)"),
        Some(_) => return None,
    };
    Some(DataProblem::Missing { value })
}

/// A feature value as the CSV would hold it: finite and within float32.
pub fn feature(v: Option<f64>, place: impl FnOnce() -> DataPlace) -> Result<f32, Fault> {
    match (v, missing(v)) {
        (Some(v), None) => Ok(v as f32),
        (_, problem) => Err(Fault::new(place(), problem_or_null(problem))),
    }
}

fn problem_or_null(p: Option<DataProblem>) -> DataProblem {
    p.unwrap_or(DataProblem::Missing {
        value: "a missing value (null)".into(),
    })
}

/// Label value `k` of a sample as the model's task takes it (`labels`: 0 or 1 for a binary
/// model, XAsset's), written into the sample's targets `out` (`Labels::put`: a weighted
/// task's missing value masked).
pub fn put_label(
    labels: Labels,
    (k, v): (usize, Option<f64>),
    out: &mut [f32],
    place: impl FnOnce() -> DataPlace,
) -> Result<(), Fault> {
    labels.put(k, v, out).map_err(|why| {
        let problem = match (why, v) {
            (Some(LabelFault::NotBinary), Some(value)) => DataProblem::BadLabel {
                value: format!("{value}"),
            },
            (Some(LabelFault::NotAClass { classes }), Some(value)) => DataProblem::BadClass {
                value: format!("{value}"),
                classes,
            },
            // Missing, infinite or beyond float32: refused as a feature is.
            _ => problem_or_null(missing(v)),
        };
        Fault::new(place(), problem)
    })
}

/// A sample's label values `values` (`labels.values` of them) as its targets
/// (`labels.targets()` values), each checked by `put_label`; `place(k)` names value `k`.
pub fn targets(
    labels: Labels,
    values: impl IntoIterator<Item = Option<f64>>,
    out: &mut [f32],
    place: impl Fn(usize) -> DataPlace,
) -> Result<(), Fault> {
    for (k, v) in values.into_iter().enumerate().take(labels.values) {
        put_label(labels, (k, v), out, || place(k))?;
    }
    Ok(())
}

/// A table of `found` columns and `rows` rows must be `width` features and the labels
/// (`labels.values` columns), and hold a sample: the checks of [`Table::new`], for a reader
/// that holds no table (`--stream`).
pub fn check_columns(found: usize, width: usize, labels: Labels, rows: usize) -> Result<(), Fault> {
    if found == width {
        return Err(Fault::new(
            DataPlace::File,
            DataProblem::MissingLabel { features: width },
        ));
    }
    if found != width + labels.values {
        return Err(Fault::new(
            DataPlace::File,
            DataProblem::ColumnCount {
                expected: width + labels.values,
                found,
                labels: labels.values,
            },
        ));
    }
    if rows == 0 {
        return Err(Fault::new(DataPlace::File, DataProblem::NoSamples));
    }
    Ok(())
}

/// The place of cell (`row`, `column`) of a table whose columns are `names`, both from 0, as
/// messages name it (from 1).
#[must_use]
pub fn cell_place(names: &[String], row: usize, column: usize) -> DataPlace {
    DataPlace::Cell {
        row: row + 1,
        column: column + 1,
        name: names.get(column).cloned().unwrap_or_default(),
    }
}

/// A table being filled: `width` feature columns, then the labels, `rows` rows. Each format
/// puts every cell once (in any order); `finish` checks that it did.
#[derive(Debug)]
pub struct Table {
    names: Vec<String>,
    width: usize,
    rows: usize,
    x: Vec<f32>,
    y: Vec<f32>,
    filled: Vec<usize>,
    /// What a label may be (the model's task's).
    labels: Labels,
}

impl Table {
    /// A table of `rows` rows with the columns `names` (the file's, in order), which must be
    /// `width` features and `labels.values` labels, each label one `labels` takes.
    pub fn new(
        names: Vec<String>,
        width: usize,
        rows: usize,
        labels: Labels,
    ) -> Result<Table, Fault> {
        check_columns(names.len(), width, labels, rows)?;
        let cells = rows.checked_mul(width).ok_or_else(|| {
            Fault::new(
                DataPlace::File,
                DataProblem::Corrupt {
                    detail: format!("{rows} rows of {width} columns do not fit in memory"),
                },
            )
        })?;
        Ok(Table {
            names,
            width,
            rows,
            x: vec![0.0; cells],
            y: vec![0.0; rows * labels.targets()],
            filled: vec![0; width + labels.values],
            labels,
        })
    }

    /// Columns (features and the labels).
    #[must_use]
    pub fn columns(&self) -> usize {
        self.width + self.labels.values
    }

    /// The place of cell (`row`, `column`), both from 0, as messages name it (from 1).
    #[must_use]
    pub fn place(&self, row: usize, column: usize) -> DataPlace {
        cell_place(&self.names, row, column)
    }

    /// The place of `column` (from 0) as a whole.
    #[must_use]
    pub fn column_place(&self, column: usize) -> DataPlace {
        DataPlace::Column {
            index: column + 1,
            name: self.names.get(column).cloned().unwrap_or_default(),
        }
    }

    /// Puts the values of `column` for rows `first..first + values.len()` (`None`: null).
    pub fn put_column(
        &mut self,
        column: usize,
        first: usize,
        values: impl IntoIterator<Item = Option<f64>>,
    ) -> Result<(), Fault> {
        let mut row = first;
        for v in values {
            if row >= self.rows {
                return Err(Fault::new(
                    self.column_place(column),
                    DataProblem::Corrupt {
                        detail: format!("more than the {} rows the file announces", self.rows),
                    },
                ));
            }
            if column < self.width {
                self.x[row * self.width + column] = feature(v, || self.place(row, column))?;
            } else {
                let t = self.labels.targets();
                let (names, out) = (&self.names, &mut self.y[row * t..(row + 1) * t]);
                put_label(self.labels, (column - self.width, v), out, || {
                    cell_place(names, row, column)
                })?;
            }
            row += 1;
        }
        self.filled[column] += row - first;
        Ok(())
    }

    /// The rows, features row-major then the targets (`Labels::targets` a row): every column
    /// must have every row.
    pub fn finish(self) -> Result<(Vec<f32>, Vec<f32>), Fault> {
        if let Some(c) = self.filled.iter().position(|&n| n != self.rows) {
            return Err(Fault::new(
                self.column_place(c),
                DataProblem::Corrupt {
                    detail: format!(
                        "{} values in the column, {} rows in the file",
                        self.filled[c], self.rows
                    ),
                },
            ));
        }
        Ok((self.x, self.y))
    }

    /// The samples of `scales × features` (`scales · features` must be the width).
    pub fn into_dataset(self, scales: usize, features: usize) -> Result<Dataset, Fault> {
        debug_assert_eq!(scales * features, self.width);
        let (x, y) = self.finish()?;
        Ok(Dataset {
            scales,
            features,
            x,
            y,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    #[test]
    fn a_filled_table_is_the_csv_data_set() {
        let mut t = Table::new(names(3), 2, 2, Labels::BINARY).expect("table");
        t.put_column(2, 0, [Some(1.0), Some(0.0)]).expect("labels");
        t.put_column(0, 0, [Some(0.5), Some(-1.0)]).expect("col 0");
        t.put_column(1, 0, [Some(2.0)]).expect("col 1, row 1");
        t.put_column(1, 1, [Some(3.0)]).expect("col 1, row 2");
        let d = t.into_dataset(1, 2).expect("full");
        assert_eq!(d.x, vec![0.5, 2.0, -1.0, 3.0]);
        assert_eq!(d.y, vec![1.0, 0.0]);
    }

    #[test]
    fn one_column_short_is_the_missing_label() {
        let e = Table::new(names(4), 4, 3, Labels::BINARY).unwrap_err();
        assert_eq!(e.problem, DataProblem::MissingLabel { features: 4 });
        let e = Table::new(names(7), 4, 3, Labels::BINARY).unwrap_err();
        assert_eq!(
            e.problem,
            DataProblem::ColumnCount {
                expected: 5,
                found: 7,
                labels: 1,
            }
        );
    }

    #[test]
    fn missing_values_and_bad_labels_name_the_cell() {
        let mut t = Table::new(names(3), 2, 3, Labels::BINARY).expect("table");
        let e = t.put_column(1, 0, [Some(1.0), Some(f64::NAN)]).unwrap_err();
        assert_eq!(t.place(1, 1), e.place);
        assert_eq!(e.place.to_string(), ", row 2, column 2 (`c1`)");
        assert!(matches!(e.problem, DataProblem::Missing { ref value } if value == "NaN"));
        let e = t.put_column(0, 2, [None]).unwrap_err();
        assert!(e.problem.to_string().contains("null"), "{}", e.problem);
        let e = t.put_column(2, 0, [Some(0.5)]).unwrap_err();
        assert_eq!(
            e.problem,
            DataProblem::BadLabel {
                value: "0.5".into()
            }
        );
        let e = t.put_column(0, 0, [Some(1e39)]).unwrap_err();
        assert!(e.problem.to_string().contains("beyond float32"));
    }

    #[test]
    fn a_column_with_rows_left_out_is_refused() {
        let mut t = Table::new(names(2), 1, 2, Labels::BINARY).expect("table");
        t.put_column(0, 0, [Some(1.0), Some(2.0)]).expect("x");
        t.put_column(1, 0, [Some(1.0)]).expect("y");
        let e = t.finish().unwrap_err();
        assert_eq!(
            e.place,
            DataPlace::Column {
                index: 2,
                name: "c1".into()
            }
        );
    }
}
