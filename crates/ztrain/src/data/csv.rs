//! The CSV format: plain comma-separated values, no quoting.
//!
//! - Line 1 is a header row (names are free; only its column count is checked).
//! - Then one row per sample: `S·F` feature columns in the order column = `s·F + f` (scale `s`,
//!   feature `f`, both from 0), then the label as the model's task takes it (`0` or `1`, a
//!   class index, a real value), or its `K` labels for a task of `K` target values
//!   (`Task::regression(K)`). `S` and `F` come from the options. A weighted task's empty or
//!   NaN label is a masked target (weight 0).
//! - Cells may have spaces around them; values are decimal floats (`1`, `-0.5`, `3e-2`).
//! - A final newline is optional; `\r\n` line ends are accepted.
//!
//! Anything else stops the run with an error that names the line and column (both counted from
//! 1): a wrong column count, a cell that is not a number, NaN or infinity (but a weighted
//! task's missing label), a label the task does not take, a blank row, an empty file, or a
//! header with no samples. No row is skipped silently.

use std::fmt::Write as _;
use std::path::Path;

use super::Dataset;
use super::labels::{Label, LabelFault, Labels};
use crate::error::{CsvProblem, TrainError};

/// A CSV problem located in the text (the caller adds the file name).
#[derive(Clone, Debug, PartialEq)]
pub struct CsvFault {
    pub line: usize,
    pub column: usize,
    pub problem: CsvProblem,
}

impl CsvFault {
    /// `problem` at `line` and `column` (both from 1).
    #[must_use]
    pub fn at(line: usize, column: usize, problem: CsvProblem) -> CsvFault {
        CsvFault {
            line,
            column,
            problem,
        }
    }
}

fn fault(line: usize, column: usize, problem: CsvProblem) -> CsvFault {
    CsvFault::at(line, column, problem)
}

/// Parses CSV `text` holding samples of `scales × features` and the labels `labels` says.
pub fn parse(
    text: &str,
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<Dataset, CsvFault> {
    let width = scales * features;
    let columns = width + labels.values;
    // `lines()` drops one trailing newline and strips `\r` before `\n`.
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    let Some((_, header)) = lines.next().filter(|(_, l)| !l.trim().is_empty()) else {
        return Err(fault(1, 1, CsvProblem::Empty));
    };
    let header_columns = header.split(',').count();
    if header_columns != columns {
        return Err(fault(
            1,
            header_columns.min(columns) + 1,
            CsvProblem::ColumnCount {
                expected: columns,
                found: header_columns,
                labels: labels.values,
            },
        ));
    }
    let mut x = Vec::new();
    let mut y = Vec::new();
    for (line, text) in lines {
        row(line, text, width, (&mut x, &mut y), labels)?;
    }
    if y.is_empty() {
        return Err(fault(2, 1, CsvProblem::NoSamples));
    }
    Ok(Dataset {
        scales,
        features,
        x,
        y,
    })
}

/// The data row `text` (line `line`, from 1) of `width` features and `labels.values` labels:
/// its features pushed onto `x`, its targets (`Labels::targets`) onto `y`, every cell checked
/// (the one check of a row, read whole or streamed: `stream_csv`). A label is read as `f64`
/// where it must be an integer (a class index, 0 or 1), so that `2.0000001` is not class 2;
/// a real value as `f32`, as a feature. A masked task's empty or NaN label is masked.
pub(super) fn row(
    line: usize,
    text: &str,
    width: usize,
    (x, y): (&mut Vec<f32>, &mut Vec<f32>),
    labels: Labels,
) -> Result<(), CsvFault> {
    let columns = width + labels.values;
    if text.trim().is_empty() {
        return Err(fault(line, 1, CsvProblem::BlankRow));
    }
    let cells: Vec<&str> = text.split(',').collect();
    if cells.len() != columns {
        return Err(fault(
            line,
            cells.len().min(columns) + 1,
            CsvProblem::ColumnCount {
                expected: columns,
                found: cells.len(),
                labels: labels.values,
            },
        ));
    }
    let first = y.len();
    y.resize(first + labels.targets(), 0.0);
    for (i, cell) in cells.into_iter().enumerate() {
        let cell = cell.trim();
        let not_a_number = || {
            fault(
                line,
                i + 1,
                CsvProblem::NotANumber {
                    cell: cell.to_string(),
                },
            )
        };
        let not_finite = || {
            fault(
                line,
                i + 1,
                CsvProblem::NotFinite {
                    cell: cell.to_string(),
                },
            )
        };
        if i < width {
            let value: f32 = cell.parse().map_err(|_| not_a_number())?;
            if !value.is_finite() {
                return Err(not_finite());
            }
            x.push(value);
            continue;
        }
        let value = match (cell, labels.label) {
            ("", _) if labels.masked => None,
            (_, Label::Real) => Some(f64::from(cell.parse::<f32>().map_err(|_| not_a_number())?)),
            _ => Some(cell.parse::<f64>().map_err(|_| not_a_number())?),
        };
        labels
            .put(i - width, value, &mut y[first..])
            .map_err(|why| {
                let cell = cell.to_string();
                match why {
                    Some(LabelFault::NotBinary) => {
                        fault(line, i + 1, CsvProblem::BadLabel { cell })
                    }
                    Some(LabelFault::NotAClass { classes }) => {
                        fault(line, i + 1, CsvProblem::BadClass { cell, classes })
                    }
                    None => not_finite(),
                }
            })?;
    }
    Ok(())
}

/// Reads and parses the CSV file at `path` (once, through one open file, so a pipe works).
pub fn load(
    path: &Path,
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<Dataset, TrainError> {
    let bytes = crate::files::read_bounded(path, "reading the data file", u64::MAX, "")?;
    load_bytes(path, &bytes, scales, features, labels)
}

/// Parses the CSV `bytes` read from `path` (named in errors).
pub fn load_bytes(
    path: &Path,
    bytes: &[u8],
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<Dataset, TrainError> {
    let text = std::str::from_utf8(bytes).map_err(|e| TrainError::Io {
        what: "reading the data file",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    parse(text, scales, features, labels).map_err(|f| TrainError::Csv {
        path: path.to_path_buf(),
        line: f.line,
        column: f.column,
        problem: f.problem,
    })
}

/// Writes `data` in the format `parse` reads (header `x_s_f,…,label`, or `…,y_0,…,y_{K-1}` for
/// `K` target values a sample; values printed so that they parse back to the same `f32`):
/// the targets of an unweighted task (a weighted task's weights are no file's labels).
#[must_use]
pub fn to_csv(data: &Dataset) -> String {
    let mut out = String::new();
    for s in 0..data.scales {
        for f in 0..data.features {
            let _ = write!(out, "x_{s}_{f},");
        }
    }
    let (w, t) = (data.sample_width(), data.targets());
    let names: Vec<String> = match t {
        1 => vec!["label".into()],
        _ => (0..t).map(|k| format!("y_{k}")).collect(),
    };
    out.push_str(&names.join(","));
    out.push('\n');
    for i in 0..data.len() {
        for v in &data.x[i * w..(i + 1) * w] {
            let _ = write!(out, "{v},");
        }
        let labels: Vec<String> = data.y[i * t..(i + 1) * t]
            .iter()
            .map(f32::to_string)
            .collect();
        let _ = writeln!(out, "{}", labels.join(","));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::synthetic;
    use rstest::rstest;

    const HEADER: &str = "a,b,c,d,label\n"; // S = 2, F = 2

    #[test]
    fn round_trips_a_data_set_exactly() {
        let d = synthetic::generate(17, 3, 4, 9);
        assert_eq!(
            parse(&to_csv(&d), 3, 4, crate::data::labels::Labels::BINARY),
            Ok(d)
        );
    }

    #[test]
    fn accepts_spaces_crlf_and_no_final_newline() {
        let text = "a,b,c,d,label\r\n 1, -2.5 ,3e-2,4,1\r\n0,0,0,0,0";
        let d = parse(text, 2, 2, crate::data::labels::Labels::BINARY).expect("valid");
        assert_eq!(d.x, vec![1.0, -2.5, 0.03, 4.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(d.y, vec![1.0, 0.0]);
    }

    #[rstest]
    #[case::empty("", 1, 1, CsvProblem::Empty)]
    #[case::only_spaces("  \n", 1, 1, CsvProblem::Empty)]
    #[case::header_only(HEADER, 2, 1, CsvProblem::NoSamples)]
    #[case::header_short("a,b,label\n1,2,3,4,1\n", 1, 4, CsvProblem::ColumnCount { expected: 5, found: 3, labels: 1 })]
    #[case::row_short("a,b,c,d,label\n1,2,3,4,1\n1,2,3,1\n", 3, 5, CsvProblem::ColumnCount { expected: 5, found: 4, labels: 1 })]
    #[case::row_long("a,b,c,d,label\n1,2,3,4,5,1\n", 2, 6, CsvProblem::ColumnCount { expected: 5, found: 6, labels: 1 })]
    #[case::word("a,b,c,d,label\n1,2,x,4,1\n", 2, 3, CsvProblem::NotANumber { cell: "x".into() })]
    #[case::empty_cell("a,b,c,d,label\n1,,3,4,1\n", 2, 2, CsvProblem::NotANumber { cell: String::new() })]
    #[case::nan("a,b,c,d,label\n1,2,3,NaN,1\n", 2, 4, CsvProblem::NotFinite { cell: "NaN".into() })]
    #[case::inf("a,b,c,d,label\n-inf,2,3,4,1\n", 2, 1, CsvProblem::NotFinite { cell: "-inf".into() })]
    #[case::overflow("a,b,c,d,label\n1e39,2,3,4,1\n", 2, 1, CsvProblem::NotFinite { cell: "1e39".into() })]
    #[case::label_two("a,b,c,d,label\n1,2,3,4,0\n1,2,3,4,2\n", 3, 5, CsvProblem::BadLabel { cell: "2".into() })]
    #[case::label_half("a,b,c,d,label\n1,2,3,4,0.5\n", 2, 5, CsvProblem::BadLabel { cell: "0.5".into() })]
    #[case::label_nan("a,b,c,d,label\n1,2,3,4,nan\n", 2, 5, CsvProblem::NotFinite { cell: "nan".into() })]
    #[case::blank_row("a,b,c,d,label\n1,2,3,4,0\n\n1,2,3,4,1\n", 3, 1, CsvProblem::BlankRow)]
    fn malformed_input_names_line_and_column(
        #[case] text: &str,
        #[case] line: usize,
        #[case] column: usize,
        #[case] problem: CsvProblem,
    ) {
        assert_eq!(
            parse(text, 2, 2, crate::data::labels::Labels::BINARY),
            Err(CsvFault {
                line,
                column,
                problem
            })
        );
    }

    proptest::proptest! {
        /// Any text either parses to a consistent data set or is a located fault: no panic, no
        /// row dropped (every parsed data set has one label per data row).
        #[test]
        fn arbitrary_text_never_panics(text in "[0-9a-z.,\\- \n]{0,200}") {
            match parse(&text, 1, 2, crate::data::labels::Labels::BINARY) {
                Ok(d) => {
                    proptest::prop_assert_eq!(d.x.len(), d.y.len() * 2);
                    proptest::prop_assert_eq!(d.y.len() + 1, text.lines().count());
                }
                Err(f) => proptest::prop_assert!(f.line >= 1 && f.column >= 1 && f.column <= 4),
            }
        }
    }

    fn class_of_ten() -> Labels {
        Labels::one(crate::data::labels::Label::ClassIndex { classes: 10 })
    }

    /// A class label is read as `f64`: `2.0000001` is 2 in `f32` but not an integer (it was
    /// read as class 2); `2.0` and `2` are class 2.
    #[test]
    fn a_class_label_near_an_integer_is_not_that_class() {
        let text = "a,b,c,d,label\n1,2,3,4,2.0\n1,2,3,4,2\n";
        let d = parse(text, 2, 2, class_of_ten()).expect("whole classes");
        assert_eq!(d.y, vec![2.0, 2.0]);
        let text = "a,b,c,d,label\n1,2,3,4,2\n1,2,3,4,2.0000001\n";
        assert_eq!(
            parse(text, 2, 2, class_of_ten()),
            Err(CsvFault {
                line: 3,
                column: 5,
                problem: CsvProblem::BadClass {
                    cell: "2.0000001".into(),
                    classes: 10
                }
            })
        );
        let text = "a,b,c,d,label\n1,2,3,4,1.0000001\n";
        assert!(matches!(
            parse(text, 2, 2, Labels::BINARY),
            Err(CsvFault {
                problem: CsvProblem::BadLabel { .. },
                ..
            })
        ));
    }

    /// `K` label columns (the last `K`) are a sample's `K` targets; another count of columns
    /// names the expected count. A weighted task's empty or NaN label is masked (value 0,
    /// weight 0); an unweighted task's is refused.
    #[test]
    fn k_label_columns_are_the_samples_targets() {
        use zgrad::Task;
        let k3 = Labels::of(&Task::regression(3)).expect("labels");
        let text = "a,b,y0,y1,y2\n1,2,0.5,-1,3\n3,4,7,8,9\n";
        let d = parse(text, 1, 2, k3).expect("3 labels");
        assert_eq!(d.y, vec![0.5, -1.0, 3.0, 7.0, 8.0, 9.0]);
        assert_eq!((d.len(), d.targets()), (2, 3));
        let e = parse("a,b,y0,y1\n1,2,3,4\n", 1, 2, k3).unwrap_err();
        assert_eq!(
            e.problem,
            CsvProblem::ColumnCount {
                expected: 5,
                found: 4,
                labels: 3
            }
        );
        assert!(
            e.problem.to_string().contains("expected 5 columns"),
            "{}",
            e.problem
        );
        let masked = Labels::of(&Task::regression(3).weighted()).expect("labels");
        let text = "a,b,y0,y1,y2\n1,2,0.5,,NaN\n";
        let d = parse(text, 1, 2, masked).expect("masked");
        assert_eq!(d.y, vec![0.5, 0.0, 0.0, 1.0, 0.0, 0.0]);
        let e = parse(text, 1, 2, k3).unwrap_err();
        assert_eq!((e.line, e.column), (2, 4));
        let text = "a,b,y0,y1,y2\n1,2,0.5,1,inf\n";
        let e = parse(text, 1, 2, masked).unwrap_err();
        assert!(matches!(e.problem, CsvProblem::NotFinite { .. }), "{e:?}");
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.csv");
        std::fs::write(&path, "a,b,c,d,label\n1,2,3,4,7\n").expect("write");
        let err = load(&path, 2, 2, crate::data::labels::Labels::BINARY).expect_err("bad label");
        let msg = err.to_string();
        assert!(
            msg.contains("bad.csv") && msg.contains("line 2, column 5"),
            "{msg}"
        );
        let missing = load(
            &dir.path().join("none.csv"),
            2,
            2,
            crate::data::labels::Labels::BINARY,
        )
        .expect_err("missing");
        assert!(missing.to_string().contains("none.csv"), "{missing}");
    }
}
