//! Timing tools: CUDA events on the engine stream (GPU time between two points of the stream,
//! as PyTorch's `torch.cuda.Event` pairs), host wall-clock medians, and JSON output.

use std::time::Instant;
use zcompute::CudaBackend;
use zdevice::{CudaDriver, Device, DeviceError, Event, Stream};

pub type Error = Box<dyn std::error::Error>;

/// Two timing events on the backend's stream.
pub struct EventPair {
    device: Device<CudaDriver>,
    stream: Stream,
    start: Event,
    end: Event,
}

impl EventPair {
    pub fn new(gpu: &CudaBackend<CudaDriver>) -> Result<EventPair, Error> {
        let device = gpu.device().clone();
        let start = device.create_event(true)?;
        let end = match device.create_event(true) {
            Ok(e) => e,
            Err(e) => {
                let _ = device.destroy_event(start);
                return Err(e.into());
            }
        };
        Ok(EventPair {
            stream: device.stream(),
            device,
            start,
            end,
        })
    }

    pub fn start(&self) -> Result<(), DeviceError> {
        self.device.record_event(self.start, self.stream)
    }

    pub fn end(&self) -> Result<(), DeviceError> {
        self.device.record_event(self.end, self.stream)
    }

    /// Milliseconds from `start` to `end` once `end` completed (bounded wait).
    pub fn elapsed_ms(&self) -> Result<f64, Error> {
        self.device.wait_event(self.end)?;
        Ok(f64::from(self.device.elapsed_ms(self.start, self.end)?))
    }
}

impl Drop for EventPair {
    fn drop(&mut self) {
        let _ = self.device.destroy_event(self.start);
        let _ = self.device.destroy_event(self.end);
    }
}

/// The median of `v` (sorted in place); NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median of `iters` timings returned by `step` after `warm` untimed calls.
pub fn median_of(
    warm: usize,
    iters: usize,
    mut step: impl FnMut() -> Result<f64, Error>,
) -> Result<f64, Error> {
    for _ in 0..warm {
        step()?;
    }
    let mut ms = (0..iters).map(|_| step()).collect::<Result<Vec<_>, _>>()?;
    Ok(median(&mut ms))
}

/// Host wall-clock milliseconds of `f`.
pub fn wall_ms<R>(f: impl FnOnce() -> Result<R, Error>) -> Result<(f64, R), Error> {
    let t0 = Instant::now();
    let r = f()?;
    Ok((t0.elapsed().as_secs_f64() * 1e3, r))
}

/// One JSON object built field by field (values are written as JSON already).
#[derive(Default)]
pub struct Json(Vec<String>);

impl Json {
    pub fn raw(&mut self, key: &str, value: impl std::fmt::Display) {
        self.0.push(format!("\"{key}\":{value}"));
    }

    pub fn str(&mut self, key: &str, value: &str) {
        let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
        self.raw(key, format!("\"{escaped}\""));
    }

    /// Three decimals, or null for a row that was not run (or NaN).
    pub fn ms(&mut self, key: &str, value: Option<f64>) {
        match value.filter(|v| v.is_finite()) {
            Some(v) => self.raw(key, format!("{v:.3}")),
            None => self.raw(key, "null"),
        }
    }

    pub fn list(&mut self, key: &str, values: &[f64]) {
        let items: Vec<String> = values.iter().map(|v| format!("{v:.3}")).collect();
        self.raw(key, format!("[{}]", items.join(",")));
    }

    pub fn opt(&mut self, key: &str, value: Option<usize>) {
        match value {
            Some(v) => self.raw(key, v),
            None => self.raw(key, "null"),
        }
    }

    pub fn finish(self) -> String {
        format!("{{{}}}", self.0.join(","))
    }
}
