//! `--timeline FILE.csv`: where each millisecond of a step goes, on the host and on the GPU.
//!
//! Per step, the host's wall time by phase: filling the pinned batch (data on the host), the
//! trainer's phases (`zgrad::HostPhases`: index upload, staging on the copy stream, queueing
//! the step's work, read-back waits), and the loop's own work after the step (the tally,
//! signals, the progress bar, checkpoints). On a device, two timing events on the engine
//! stream around the step's work give its GPU span (from the stream reaching the step's
//! first work to its last finishing: the GPU time of the step when the host runs ahead, more
//! when the GPU waited for the host). Events are read where a read-back came back or the run
//! drained, and only those the stream has passed (polled), so the timeline adds no wait of
//! its own.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use zcompute::{CopyMark, PinnedHost};
use zgrad::HostPhases;

use crate::error::Result;

/// One step's row.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimes {
    pub step: u64,
    pub samples: usize,
    /// The step's whole host time, from the start of its fill to the end of its progress.
    pub host: Duration,
    /// Filling the pinned batch (data on the host).
    pub fill: Duration,
    pub phases: HostPhases,
    /// The loop's work after the step: tally, signals, progress bar, checkpoints.
    pub progress: Duration,
    /// Milliseconds between the engine-stream events around the step (`None` off a device).
    pub gpu_ms: Option<f64>,
}

impl StepTimes {
    /// Host time in none of the phases.
    #[must_use]
    pub fn other(&self) -> Duration {
        self.host
            .saturating_sub(self.fill + self.phases.total() + self.progress)
    }
}

/// The events around a step whose GPU span is not read yet.
struct Open {
    row: usize,
    start: CopyMark,
    end: CopyMark,
}

/// The run's timeline.
#[derive(Default)]
pub struct Timeline {
    rows: Vec<StepTimes>,
    open: VecDeque<Open>,
    /// Marks whose span was read, for reuse (an event made once, recorded many times).
    spare: Vec<CopyMark>,
    /// Read-backs added to the last row since it was queued (not progress).
    flushed: Duration,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline")
            .field("steps", &self.rows.len())
            .finish_non_exhaustive()
    }
}

impl Timeline {
    fn mark<B: PinnedHost<f32>>(&mut self, b: &B) -> zcompute::Result<CopyMark> {
        match self.spare.pop() {
            Some(m) => Ok(m),
            None => b.timing_mark(),
        }
    }

    /// Records the event before a step's work on the engine stream.
    pub fn before<B: PinnedHost<f32>>(&mut self, b: &B) -> Result<CopyMark> {
        let start = self.mark(b)?;
        b.mark_engine(&start)?;
        Ok(start)
    }

    /// Records the event after the step's work and adds its row (its span read later).
    pub fn after<B: PinnedHost<f32>>(
        &mut self,
        b: &B,
        start: CopyMark,
        times: StepTimes,
    ) -> Result<()> {
        let end = self.mark(b)?;
        b.mark_engine(&end)?;
        self.flushed = Duration::ZERO;
        self.rows.push(times);
        self.open.push_back(Open {
            row: self.rows.len() - 1,
            start,
            end,
        });
        Ok(())
    }

    /// Reads the GPU spans of the open steps but the last `keep`, oldest first, as far as
    /// the engine stream has passed their end (polled: a read-back that came back waited
    /// only for the window before, so later steps may still run; they stay open for the next
    /// call). A span that cannot be read stays unknown.
    pub fn resolve<B: PinnedHost<f32>>(&mut self, b: &B, keep: usize) {
        while self.open.len() > keep {
            let passed = self.open.front().map(|o| b.mark_passed(&o.end));
            if matches!(passed, Some(Ok(false))) {
                break;
            }
            let Some(o) = self.open.pop_front() else {
                break;
            };
            match b.elapsed_ms(&o.start, &o.end) {
                Ok(ms) => self.rows[o.row].gpu_ms = ms,
                Err(e) => {
                    tracing::debug!(target: "ztrain.timeline", error = %e, "GPU span unknown");
                }
            }
            self.spare.extend([o.start, o.end]);
        }
    }

    /// Adds the loop's work after the last step to its row: `elapsed` since the step was
    /// queued, less the read-backs [`Timeline::add_readback`] already counted.
    pub fn add_progress(&mut self, elapsed: Duration) {
        let progress = elapsed.saturating_sub(std::mem::take(&mut self.flushed));
        if let Some(r) = self.rows.last_mut() {
            r.progress += progress;
            r.host += progress;
        }
    }

    /// Adds a read-back outside the trainer's queue calls (a flush before a checkpoint, a
    /// stop or an epoch's end) to the last step's row.
    pub fn add_readback(&mut self, readback: Duration) {
        if let Some(r) = self.rows.last_mut() {
            r.phases.readback += readback;
            r.host += readback;
            self.flushed += readback;
        }
    }

    #[must_use]
    pub fn rows(&self) -> &[StepTimes] {
        &self.rows
    }

    /// The rows as CSV, times in microseconds.
    #[must_use]
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "step,samples,host_us,fill_us,index_upload_us,staging_us,launch_us,readback_us,progress_us,other_us,gpu_us\n",
        );
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        for r in &self.rows {
            let p = &r.phases;
            let _ = writeln!(
                out,
                "{},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{}",
                r.step,
                r.samples,
                us(r.host),
                us(r.fill),
                us(p.index_upload),
                us(p.staging),
                us(p.launch),
                us(p.readback),
                us(r.progress),
                us(r.other()),
                r.gpu_ms
                    .map_or(String::new(), |ms| format!("{:.1}", ms * 1e3)),
            );
        }
        out
    }

    /// Writes the CSV (atomically).
    pub fn write(&self, path: &Path) -> Result<()> {
        crate::files::write_atomically(path, "writing the timeline", self.csv().as_bytes())
    }

    /// The breakdown the run prints: means per step over the steady steps (all but the first
    /// two, which capture), host and GPU.
    #[must_use]
    pub fn summary(&self) -> String {
        let steady: Vec<&StepTimes> = if self.rows.len() > 2 {
            self.rows[2..].iter().collect()
        } else {
            self.rows.iter().collect()
        };
        let n = steady.len().max(1) as f64;
        let mean = |f: &dyn Fn(&StepTimes) -> Duration| {
            steady.iter().map(|r| f(r).as_secs_f64()).sum::<f64>() / n * 1e6
        };
        let gpu: Vec<f64> = steady.iter().filter_map(|r| r.gpu_ms).collect();
        let gpu_line = if gpu.is_empty() {
            "no GPU timeline on this backend".to_string()
        } else {
            format!(
                "GPU span {:.1} us a step (engine-stream events around the step, {} steps)",
                gpu.iter().sum::<f64>() / gpu.len() as f64 * 1e3,
                gpu.len()
            )
        };
        format!(
            "timeline: {} steps, means over steps 3 on: host {:.1} us a step = fill {:.1} + index upload {:.1} + staging {:.1} + launch {:.1} + read-back {:.1} + progress {:.1} + other {:.1}; {gpu_line}",
            self.rows.len(),
            mean(&|r| r.host),
            mean(&|r| r.fill),
            mean(&|r| r.phases.index_upload),
            mean(&|r| r.phases.staging),
            mean(&|r| r.phases.launch),
            mean(&|r| r.phases.readback),
            mean(&|r| r.progress),
            mean(&StepTimes::other),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zcompute::{Backend, CpuBackend, Engine, ReadbackOps};

    fn times(step: u64, ms: u64) -> StepTimes {
        StepTimes {
            step,
            samples: 8,
            host: Duration::from_millis(ms),
            fill: Duration::from_millis(1),
            phases: HostPhases {
                launch: Duration::from_millis(2),
                ..HostPhases::default()
            },
            ..StepTimes::default()
        }
    }

    /// On the simulated device every step gets a GPU span once the run waited for the device,
    /// and the events are reused; the CSV has a row a step and the summary the steady means.
    #[test]
    fn spans_are_read_after_a_wait_and_the_rows_add_up() {
        let b = Engine::sim(256 << 20).unwrap();
        let mut t = Timeline::default();
        for step in 1..=4 {
            let start = t.before(&b).unwrap();
            let x = b.zeros(&[1024]).unwrap();
            b.fill(&x, 1.0).unwrap();
            t.after(&b, start, times(step, 4)).unwrap();
            t.add_progress(Duration::from_millis(1));
            if step == 2 {
                b.synchronize().unwrap();
                t.resolve(&b, 0);
            }
        }
        assert!(t.rows()[..2].iter().all(|r| r.gpu_ms.is_some()));
        assert!(
            t.rows()[2..].iter().all(|r| r.gpu_ms.is_none()),
            "not waited for yet"
        );
        assert_eq!(t.spare.len(), 0, "reused by steps 3 and 4");
        b.synchronize().unwrap();
        t.resolve(&b, 0);
        assert!(t.rows().iter().all(|r| r.gpu_ms.is_some()));
        let csv = t.csv();
        assert_eq!(csv.lines().count(), 5, "{csv}");
        assert!(
            csv.lines()
                .nth(1)
                .unwrap()
                .starts_with("1,8,5000.0,1000.0,0.0,0.0,2000.0,0.0,1000.0,1000.0,"),
            "{csv}"
        );
        let s = t.summary();
        assert!(
            s.contains("4 steps") && s.contains("host 5000.0 us") && s.contains("GPU span"),
            "{s}"
        );
    }

    /// A read-back waits for its own copy only (`queue_download`): the steps queued after
    /// it are not passed yet, so their spans stay open (not lost as unreadable) and are read
    /// by a later resolve, after the run drained.
    #[test]
    fn spans_the_stream_has_not_passed_stay_open() {
        let b = Engine::sim(256 << 20).unwrap();
        let mut t = Timeline::default();
        let x = b.zeros(&[1024]).unwrap();
        // Step 2's work runs a second of virtual time: the copy after step 1 is done long
        // before the stream passes step 2's end.
        let stall = std::time::Duration::from_secs(1);
        b.device()
            .driver()
            .stall(zdevice::sim::calls::MEMSET_D32_ASYNC, 2, stall);
        let mut copy = None;
        for step in 1..=3 {
            let start = t.before(&b).unwrap();
            b.fill(&x, step as f32).unwrap();
            if step == 1 {
                copy = Some(b.queue_download(&x).unwrap());
            }
            t.after(&b, start, times(step, 4)).unwrap();
        }
        assert_eq!(copy.unwrap().wait().unwrap()[0], 1.0);
        t.resolve(&b, 0);
        assert!(t.rows()[0].gpu_ms.is_some(), "step 1 was passed");
        assert!(
            t.rows()[1..].iter().all(|r| r.gpu_ms.is_none()),
            "not passed yet"
        );
        assert!(!t.open.is_empty(), "still open");
        b.synchronize().unwrap();
        t.resolve(&b, 0);
        assert!(t.rows().iter().all(|r| r.gpu_ms.is_some()));
    }

    #[test]
    fn the_cpu_has_no_gpu_timeline() {
        let mut t = Timeline::default();
        let start = t.before(&CpuBackend).unwrap();
        t.after(&CpuBackend, start, times(1, 3)).unwrap();
        t.resolve(&CpuBackend, 0);
        assert_eq!(t.rows()[0].gpu_ms, None);
        assert!(t.summary().contains("no GPU timeline"), "{}", t.summary());
    }
}
