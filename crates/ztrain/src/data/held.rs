//! What a run holds on the host for its data, in bytes, counted from the buffers themselves:
//! the samples (pre-cut rows, or the series of bars windows are cut from, stored once however
//! many windows index it), the pinned batches a host feed stages steps in, and what an
//! evaluation from the host holds beside them. A windowed run holds the series plus one batch
//! of windows (the pinned batch its steps and its evaluation chunks are cut into, and one
//! chunk's logits), never all the windows; the run says so in one line and in the memory
//! report, and the integration tests hold it to that.

use std::sync::Arc;

use super::Samples;

const F32: u64 = std::mem::size_of::<f32>() as u64;

/// What a run's samples are on the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kind {
    /// Pre-cut rows in memory.
    #[default]
    Rows,
    /// A series of bars windows are cut from.
    Series,
    /// Rows left in their file, read as batches are staged.
    Streamed,
}

impl Kind {
    /// The kind of `samples`.
    #[must_use]
    pub fn of(samples: &Samples) -> Kind {
        match samples {
            Samples::Rows(_) => Kind::Rows,
            Samples::Windows(_) => Kind::Series,
            Samples::Stream(_) => Kind::Streamed,
        }
    }
}

/// Host bytes of a run's data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostData {
    /// The samples: pre-cut rows (training and validation), or the series of bars (once).
    pub samples: u64,
    /// What `samples` are.
    pub kind: Kind,
    /// The pinned batches steps are staged in from the host (`feed::staging_batches`; 0 when
    /// the training set is on the device).
    pub staging: u64,
    /// What an evaluation from the host holds beside the staging: the logits of one chunk of
    /// windows cut into the staging batch, or every window cut at once where they are not
    /// evaluated in chunks (`feed::chunked`); 0 for pre-cut rows, evaluated where they lie.
    pub evaluation: u64,
    /// The most a streamed file's reader holds at a time (a Parquet table's pages of one
    /// column chunk and their read buffer: a bound from the file's footer, not a count); 0
    /// for the other sources, read straight into the staging.
    pub reader: u64,
    /// What that reader holds, `{}` standing for `reader` (`Streamed::reader_holds`).
    pub reader_holds: &'static str,
}

impl HostData {
    /// Every byte above.
    #[must_use]
    pub fn held(&self) -> u64 {
        self.samples + self.staging + self.evaluation + self.reader
    }

    /// The run's line, after the program's name (`held` first, in bytes, so that a script can
    /// read it).
    #[must_use]
    pub fn line(&self) -> String {
        format!(
            "host data held: {} bytes ({} {} bytes, pinned staging {} bytes, evaluation beside it {} bytes{})",
            self.held(),
            match self.kind {
                Kind::Rows => "samples",
                Kind::Series => "series of bars, once:",
                Kind::Streamed => "samples left in the file (--stream):",
            },
            self.samples,
            self.staging,
            self.evaluation,
            if self.reader > 0 {
                format!(
                    ", {}",
                    self.reader_holds.replace("{}", &self.reader.to_string())
                )
            } else {
                String::new()
            }
        )
    }
}

/// Bytes of the samples of `train` and `val`: each pre-cut set's values and labels, or the
/// series the windows index, counted once when both index the same one.
#[must_use]
pub fn samples_bytes(train: &Samples, val: &Samples) -> u64 {
    let rows = |d: &super::Dataset| (d.x.capacity() + d.y.capacity()) as u64 * F32;
    match (train, val) {
        (Samples::Windows(t), Samples::Windows(v)) if Arc::ptr_eq(&t.series, &v.series) => {
            rows(&t.series)
        }
        _ => [train, val]
            .iter()
            .map(|s| match s {
                Samples::Rows(d) => rows(d),
                Samples::Windows(w) => rows(&w.series),
                // Left in the file, read a batch at a time into the staging.
                Samples::Stream(_) => 0,
            })
            .sum(),
    }
}

/// What the reader of streamed `samples` holds (`Streamed::reader_holds`; "" for samples in
/// memory, or arrays read straight into the staging).
#[must_use]
pub fn reader_holds(samples: &Samples) -> &'static str {
    match samples {
        Samples::Stream(s) => s.reader_holds().unwrap_or(""),
        _ => "",
    }
}

/// The most bytes the reader of streamed `samples` holds at a time
/// (`Streamed::reader_bytes`; 0 for samples in memory).
#[must_use]
pub fn reader_bytes(samples: &Samples) -> u64 {
    match samples {
        Samples::Stream(s) => s.reader_bytes(),
        _ => 0,
    }
}

/// Bytes an evaluation of `samples` from the host holds beside the staging batch
/// (`Feed::evaluate`): windows evaluated in chunks (`chunked`) of `chunk` are cut into the
/// staging batch, leaving one chunk's logits; other windows are cut whole, their targets each;
/// pre-cut rows are evaluated where they lie.
#[must_use]
pub fn evaluation_bytes(samples: &Samples, chunk: usize, chunked: bool) -> u64 {
    match samples {
        Samples::Rows(_) => 0,
        s if chunked => chunk.max(1).min(s.len()) as u64 * F32,
        s => (s.len() * (s.sample_width() + s.targets())) as u64 * F32,
    }
}
