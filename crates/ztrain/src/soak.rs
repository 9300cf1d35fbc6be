//! `--soak-report FILE.json`: memory sampled every `--soak-every` optimiser steps (the arena's
//! bytes in use and high-water mark, the device memory the driver reports in use, the process's
//! resident memory), and each one's slope per 1,000 steps by least squares over the samples
//! after the warm-up (the first tenth of the run's steps, at least one sample interval). A
//! leak shows as a positive slope; a flat run has slopes near 0 (exactly 0 for the arena).

use serde_json::{Value, json};

/// One sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub step: u64,
    /// Arena bytes in use (0 on the CPU backend).
    pub arena_bytes: u64,
    /// Highest arena bytes in use so far (0 on the CPU backend).
    pub arena_high_water: u64,
    /// Device memory in use according to the driver (0 on the CPU backend).
    pub device_used: u64,
    /// The process's resident memory.
    pub host_rss: u64,
}

/// The series' names, in the report's order.
pub const SERIES: [&str; 4] = [
    "arena_bytes",
    "arena_high_water",
    "device_used_bytes",
    "host_rss_bytes",
];

impl Sample {
    fn values(&self) -> [u64; 4] {
        [
            self.arena_bytes,
            self.arena_high_water,
            self.device_used,
            self.host_rss,
        ]
    }
}

/// Samples of one run.
#[derive(Clone, Debug, Default)]
pub struct Soak {
    pub every: u64,
    pub samples: Vec<Sample>,
}

/// Least-squares slope of `y` over `x` (0 with fewer than two distinct `x`).
#[must_use]
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

impl Soak {
    #[must_use]
    pub fn new(every: u64) -> Soak {
        Soak {
            every,
            samples: Vec::new(),
        }
    }

    /// Whether step `step` is sampled.
    #[must_use]
    pub fn due(&self, step: u64) -> bool {
        step.is_multiple_of(self.every)
    }

    /// Warm-up steps for a run that ended at `last_step`.
    #[must_use]
    pub fn warmup(&self, last_step: u64) -> u64 {
        (last_step / 10).max(self.every)
    }

    /// Each series' slope in bytes per 1,000 steps after the warm-up.
    #[must_use]
    pub fn slopes(&self) -> [f64; 4] {
        let last = self.samples.last().map_or(0, |s| s.step);
        let warm = self.warmup(last);
        let after: Vec<&Sample> = self.samples.iter().filter(|s| s.step > warm).collect();
        std::array::from_fn(|i| {
            let pts: Vec<(f64, f64)> = after
                .iter()
                .map(|s| (s.step as f64, s.values()[i] as f64))
                .collect();
            slope(&pts) * 1000.0
        })
    }

    /// The report: configuration, samples, warm-up and slopes.
    #[must_use]
    pub fn to_json(&self, device: &str, config: &Value) -> Value {
        let last = self.samples.last().map_or(0, |s| s.step);
        let slopes = self.slopes();
        let samples: Vec<Value> = self
            .samples
            .iter()
            .map(|s| {
                let v = s.values();
                json!({"step": s.step, SERIES[0]: v[0], SERIES[1]: v[1], SERIES[2]: v[2], SERIES[3]: v[3]})
            })
            .collect();
        let slope_map: serde_json::Map<String, Value> = SERIES
            .iter()
            .zip(slopes)
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        json!({
            "device": device,
            "config": config,
            "every": self.every,
            "steps": last,
            "warmup_steps": self.warmup(last),
            "slopes_bytes_per_1000_steps": slope_map,
            "samples": samples,
        })
    }

    /// `soak: … slopes per 1000 steps after the warm-up (W steps): arena +0 B, …`.
    #[must_use]
    pub fn summary(&self) -> String {
        let last = self.samples.last().map_or(0, |s| s.step);
        let s = self.slopes();
        format!(
            "soak: {} samples to step {last}; slopes per 1000 steps after the warm-up ({} steps): arena {:+.0} B, arena high-water {:+.0} B, device {:+.0} B, host RSS {:+.0} B",
            self.samples.len(),
            self.warmup(last),
            s[0],
            s[1],
            s[2],
            s[3]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_and_of_a_flat_series() {
        let line: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 * i as f64 + 7.0)).collect();
        assert!((slope(&line) - 3.0).abs() < 1e-12);
        assert_eq!(slope(&[(1.0, 5.0), (2.0, 5.0)]), 0.0);
        assert_eq!(slope(&[(1.0, 5.0)]), 0.0);
    }

    #[test]
    fn the_warm_up_is_left_out_of_the_slopes() {
        let mut soak = Soak::new(10);
        for step in (10..=1000).step_by(10) {
            // Grows during the first 100 steps, then flat except a 2-byte-per-step leak in RSS.
            soak.samples.push(Sample {
                step,
                arena_bytes: step.min(100) * 1000,
                arena_high_water: step.min(100) * 1000,
                device_used: 5,
                host_rss: 1_000_000 + 2 * step,
            });
        }
        let s = soak.slopes();
        assert_eq!(&s[..3], &[0.0, 0.0, 0.0]);
        assert!((s[3] - 2000.0).abs() < 1e-6, "{}", s[3]);
    }
}
