//! What the user sees while a run goes: a progress bar per epoch (indicatif, on stderr, drawn
//! only when stderr is a terminal) with the running loss, samples per second and memory in use;
//! host memory numbers for the CPU backend.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use zcompute::units::Bytes;

/// The progress bar of one epoch.
#[derive(Debug)]
pub struct EpochBar {
    bar: ProgressBar,
    start: Instant,
    resumed_at: u64,
}

impl EpochBar {
    /// A bar over `samples` samples of epoch `epoch` (from 1) of `epochs`, starting at `done`
    /// (a resumed epoch starts part-way). `visible: false` draws nothing (tests, `--quiet`).
    #[must_use]
    pub fn new(epoch: u64, epochs: u64, samples: u64, done: u64, visible: bool) -> EpochBar {
        let target = if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(samples), target);
        let style =
            ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(format!("{epoch}/{epochs}"));
        bar.set_position(done);
        bar.enable_steady_tick(Duration::from_millis(500));
        EpochBar {
            bar,
            start: Instant::now(),
            resumed_at: done,
        }
    }

    /// Moves to `done` samples with the running mean `loss` and `memory` bytes in use.
    pub fn update(&self, done: u64, loss: f64, memory: u64) {
        self.bar.set_position(done);
        self.bar.set_message(format!(
            "loss {loss:.4}  {:.0} samples/s  mem {}",
            self.samples_per_second(done),
            Bytes(memory)
        ));
    }

    /// Samples per second since the bar started (resumed samples do not count).
    #[must_use]
    pub fn samples_per_second(&self, done: u64) -> f64 {
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        done.saturating_sub(self.resumed_at) as f64 / secs
    }

    /// Time since the bar started.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Removes the bar (the caller prints the epoch's summary line instead).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Host memory of this process from `/proc/self/status`: (resident now, resident peak), in
/// bytes; `None` where the file does not exist (not Linux).
#[must_use]
pub fn host_memory() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status(&status)
}

fn parse_status(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_resident_and_peak_from_proc_status() {
        let text = "Name:\tztrain\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_status(text), Some((1 << 20, 2 << 20)));
        assert_eq!(parse_status("Name: x\n"), None);
    }

    #[test]
    fn this_process_has_host_memory_on_linux() {
        if cfg!(target_os = "linux") {
            let (now, peak) = host_memory().expect("/proc/self/status");
            assert!(now > 0 && peak >= now);
        }
    }

    #[test]
    fn hidden_bar_counts_rates_from_its_start() {
        let bar = EpochBar::new(1, 2, 100, 40, false);
        std::thread::sleep(Duration::from_millis(20));
        bar.update(60, 0.5, 1 << 20);
        let rate = bar.samples_per_second(60);
        assert!(rate > 0.0 && rate < 20.0 / 0.02 + 1.0, "{rate}");
        bar.finish();
    }
}
