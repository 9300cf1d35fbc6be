//! `--stream` of a CSV file (the format `csv.rs` reads): one pass over the file, a MiB at a
//! time, finds where every row starts (an index of 8 bytes a row: the only thing held beside
//! one row's text), and each row is then read by position as a batch is staged and parsed by
//! the whole-file parser's own row check (`csv::row`), so the values, and a bad cell's line
//! and column, are the ones reading the file whole gives.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::csv::{CsvFault, row};
use super::labels::Labels;
use crate::error::{CsvProblem, DataError, DataPlace, Result, TrainError};

/// A CSV file of `width` feature columns and the labels, left on disk.
#[derive(Debug)]
pub struct CsvRows {
    path: PathBuf,
    file: File,
    width: usize,
    /// What a label may be (the model's task's).
    labels: Labels,
    /// Data row `i` is the bytes `starts[i]..starts[i + 1]` (its line end included).
    starts: Vec<u64>,
    /// The longest row's bytes.
    longest: u64,
    /// The file's length and modification time when opened.
    len: u64,
    modified: Option<SystemTime>,
}

impl CsvRows {
    /// Opens the CSV file `path` of `width` features and the labels: its header checked, and
    /// where each row starts found (each row is checked as it is read).
    pub fn open(path: &Path, width: usize, labels: Labels) -> Result<CsvRows> {
        let io = |source| TrainError::Io {
            what: "opening the data file to stream it (--stream)",
            path: path.to_path_buf(),
            source,
        };
        let (file, len, modified) = super::stream::open(path)?;
        // Every line's start (and the file's end, closing the last line).
        let mut lines = vec![0u64];
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < len {
            let n = file.read_at(&mut buf, at).map_err(io)?;
            if n == 0 {
                break;
            }
            let ends = buf[..n].iter().enumerate().filter(|(_, b)| **b == b'\n');
            lines.extend(ends.map(|(i, _)| at + i as u64 + 1));
            at += n as u64;
        }
        // A last line without its newline; none after a final newline (`str::lines`).
        if lines.last() != Some(&at) {
            lines.push(at);
        }
        let rows = CsvRows {
            path: path.to_path_buf(),
            file,
            width,
            labels,
            longest: lines.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0),
            starts: lines,
            len: at,
            modified,
        };
        rows.check_header()?;
        Ok(CsvRows {
            starts: rows.starts[1..].to_vec(),
            ..rows
        })
    }

    /// The header (the first line, `starts[0]..starts[1]` before `open` drops it): not blank,
    /// `width` and the labels' columns; and at least one row after it.
    fn check_header(&self) -> Result<()> {
        let text = match self.starts.get(1) {
            Some(_) => self.line(0, 1)?,
            None => String::new(),
        };
        let columns = self.width + self.labels.values;
        if text.trim().is_empty() {
            return Err(self.fault(CsvFault::at(1, 1, CsvProblem::Empty)));
        }
        let found = text.split(',').count();
        if found != columns {
            return Err(self.fault(CsvFault::at(
                1,
                found.min(columns) + 1,
                CsvProblem::ColumnCount {
                    expected: columns,
                    found,
                    labels: self.labels.values,
                },
            )));
        }
        if self.starts.len() < 3 {
            return Err(self.fault(CsvFault::at(2, 1, CsvProblem::NoSamples)));
        }
        Ok(())
    }

    /// Data rows.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.starts.len() - 1
    }

    /// The most bytes the reader holds: the row index and the longest row's text.
    #[must_use]
    pub fn reader_bound(&self) -> u64 {
        self.starts.len() as u64 * 8 + self.longest
    }

    /// Reads data row `i`'s features into `x` (`width` values) and its targets into `y`
    /// (`Labels::targets` values), each cell checked as the whole-file parser checks it.
    pub fn read(&self, i: usize, x: &mut [f32], y: &mut [f32]) -> Result<()> {
        let text = self.line(i, i + 2)?;
        let mut values = Vec::with_capacity(self.width);
        let mut targets = Vec::with_capacity(self.labels.targets());
        row(
            i + 2,
            &text,
            self.width,
            (&mut values, &mut targets),
            self.labels,
        )
        .map_err(|f| self.fault(f))?;
        x.copy_from_slice(&values);
        y.copy_from_slice(&targets);
        Ok(())
    }

    /// The text of the line from `starts[i]` (line `line` of the file, for messages), its
    /// line end dropped, after checking that the file is as opened.
    fn line(&self, i: usize, line: usize) -> Result<String> {
        let fail = |problem, source: Option<std::io::Error>| {
            TrainError::from(DataError {
                path: self.path.clone(),
                format: "CSV",
                place: DataPlace::Row(line),
                problem,
                source: source.map(|e| Box::new(e) as _),
            })
        };
        super::stream::unchanged(&self.file, self.len, self.modified)
            .map_err(|(p, e)| fail(p, e))?;
        let (start, end) = (self.starts[i], self.starts[i + 1]);
        let mut bytes = vec![0u8; (end - start) as usize];
        self.file
            .read_exact_at(&mut bytes, start)
            .map_err(|e| fail(crate::error::DataProblem::Unreadable, Some(e)))?;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        String::from_utf8(bytes).map_err(|e| TrainError::Io {
            what: "reading the data file",
            path: self.path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
    }

    /// A located CSV fault as the run's error, naming the file.
    fn fault(&self, f: CsvFault) -> TrainError {
        TrainError::Csv {
            path: self.path.clone(),
            line: f.line,
            column: f.column,
            problem: f.problem,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{csv, synthetic};
    use crate::error::DataProblem;

    #[test]
    fn streamed_rows_are_the_parsed_rows_and_a_bad_cell_is_named_as_parsing_names_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = synthetic::generate(7, 2, 3, 4);
        let path = dir.path().join("d.csv");
        // CRLF line ends and no final newline: the whole-file parser's `str::lines`.
        let text = csv::to_csv(&d).replace('\n', "\r\n");
        std::fs::write(&path, text.trim_end()).expect("write");
        let rows = CsvRows::open(&path, 6, crate::data::labels::Labels::BINARY).expect("opens");
        assert_eq!(rows.rows(), 7);
        let (mut x, mut y) = ([0.0; 6], [0.0]);
        for i in 0..7 {
            rows.read(i, &mut x, &mut y).expect("reads");
            assert_eq!(y[0], d.y[i]);
            assert_eq!(&x[..], &d.x[i * 6..(i + 1) * 6]);
        }
        let bad = "a,b,c,label\n1,2,3,0\n1,x,3,1\n";
        std::fs::write(&path, bad).expect("write");
        let rows = CsvRows::open(&path, 3, crate::data::labels::Labels::BINARY).expect("opens");
        let e = rows.read(1, &mut [0.0; 3], &mut [0.0]).unwrap_err();
        let whole = csv::load_bytes(
            &path,
            bad.as_bytes(),
            1,
            3,
            crate::data::labels::Labels::BINARY,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), whole.to_string());
        assert!(e.to_string().contains("d.csv"), "{e}");
    }

    #[test]
    fn a_header_without_rows_is_refused_and_a_file_written_to_under_the_run_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.csv");
        std::fs::write(&path, "a,b,c,label\n").expect("write");
        let e = CsvRows::open(&path, 3, crate::data::labels::Labels::BINARY).unwrap_err();
        assert!(
            matches!(
                &e,
                TrainError::Csv {
                    problem: CsvProblem::NoSamples,
                    ..
                }
            ),
            "{e}"
        );
        std::fs::write(&path, "a,b,c,label\n1,2,3,0\n").expect("write");
        let rows = CsvRows::open(&path, 3, crate::data::labels::Labels::BINARY).expect("opens");
        std::fs::write(&path, "a,b,c,label\n1,2,3,0\n4,5,6,1\n").expect("rewrite");
        let e = rows.read(0, &mut [0.0; 3], &mut [0.0]).unwrap_err();
        let TrainError::Data(d) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(d.place, DataPlace::Row(2));
        assert!(matches!(d.problem, DataProblem::Changed { .. }), "{e}");
        assert!(e.to_string().contains("d.csv"), "{e}");
    }
}
