//! The memory a run needs, estimated before anything big is allocated, so that an option too
//! large for the machine is a typed error saying what would be needed and what is there, never
//! an aborted process ("memory allocation of … bytes failed") or an overflow panic.
//!
//! Every size is computed with checked arithmetic in `u64`: a product that does not fit is
//! the same typed error. The estimate:
//!
//! - parameters: docs/xasset.md's count × 4 bytes, and as much again for the gradients and twice
//!   for AdamW's moments (16 bytes per parameter);
//! - activations: per sample `S·F + L·(12·S·D + 2·H·S² + 2·S·FF)` floats (the input, and per
//!   block the width-`D` tensors, the attention scores and softmax, the feed-forward before and
//!   after tanh), twice for their gradients, times the samples one forward holds at once (the batch
//!   for the batched schedule, one per sample; evaluation runs batches of `--batch`);
//! - data (host): the samples' values and labels, twice (the validation split copies).
//!
//! The device part is compared with the device's memory; the host part (the device part as
//! well on the CPU backend and on the simulated device, whose memory is host memory) with the
//! host's `MemAvailable`. It is an estimate: it errs towards refusing only runs that cannot fit.

use zcompute::units::Bytes;

use crate::config::{DataSource, RunConfig};
use crate::error::{Result, TrainError};
use zgrad::TrainSchedule;

/// Bytes a run needs, by where they live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// Parameters, gradients and optimiser state.
    pub model: u64,
    /// Activations and their gradients at the largest batch.
    pub activations: u64,
    /// The data set in host memory (0 for a CSV file before it is read).
    pub data: u64,
}

fn too_big(what: &str) -> TrainError {
    TrainError::OutOfMemory {
        needed: format!("{what} of more than 2^64 bytes"),
        available: "no machine addresses that much".into(),
        advice:
            "lower the sizes (--scales, --features, --width, --heads, --ff, --layers, --samples, --batch)"
                .into(),
    }
}

/// `a · b · …` in u64, or the typed error naming `what`.
fn product(what: &str, factors: &[u64]) -> Result<u64> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| too_big(what))
}

fn sum(what: &str, terms: &[u64]) -> Result<u64> {
    terms
        .iter()
        .try_fold(0u64, |acc, &t| acc.checked_add(t))
        .ok_or_else(|| too_big(what))
}

impl Estimate {
    /// The estimate for `config` (checked arithmetic throughout).
    pub fn of(config: &RunConfig) -> Result<Estimate> {
        let m = &config.model;
        let (s, f, d, h, ff, l) = (
            m.scales as u64,
            m.features as u64,
            m.width as u64,
            m.heads as u64,
            m.ff as u64,
            m.layers as u64,
        );
        let params = crate::config::parameters(m)?;
        let model = product("the parameters and optimiser state", &[params, 16])?;
        let per_block = sum(
            "the activations",
            &[
                product("the activations", &[12, s, d])?,
                product("the attention scores", &[2, h, s, s])?,
                product("the feed-forward activations", &[2, s, ff])?,
            ],
        )?;
        let per_sample = sum(
            "the activations",
            &[
                product("the input", &[s, f])?,
                product("the activations", &[per_block, l])?,
            ],
        )?;
        let samples = match &config.data {
            DataSource::Synthetic { samples, .. } => *samples as u64,
            DataSource::File { .. } => 0,
        };
        let batch = config.batch as u64;
        let batch = if samples > 0 {
            batch.min(samples)
        } else {
            batch
        };
        let held = match config.schedule {
            TrainSchedule::Batched => product("the activations", &[2, batch])?,
            TrainSchedule::PerSample => 2,
        }
        .max(batch);
        let activations = product("the activations", &[per_sample, held, 4])?;
        let data = product(
            "the data set",
            &[samples, sum("a sample", &[s * f, 1])?, 4, 2],
        )?;
        Ok(Estimate {
            model,
            activations,
            data,
        })
    }

    /// Device bytes: the model and the activations.
    pub fn device(&self) -> Result<u64> {
        sum("the device memory", &[self.model, self.activations])
    }

    /// Checks the device part fits in `capacity` bytes of `device` (e.g. "the simulated
    /// device"); `raise` says how to get more.
    pub fn check_device(&self, capacity: u64, device: &str, raise: &str) -> Result<()> {
        let needed = self.device()?;
        if needed > capacity {
            return Err(TrainError::OutOfMemory {
                needed: format!(
                    "about {} of device memory (model and optimiser {}, activations {})",
                    Bytes(needed),
                    Bytes(self.model),
                    Bytes(self.activations)
                ),
                available: format!("{device} has {}", Bytes(capacity)),
                advice: format!(
                    "lower the model sizes or --batch, or use the per-sample schedule{raise}"
                ),
            });
        }
        Ok(())
    }

    /// Checks the host part, and `device` bytes of device memory that live in host memory (the
    /// CPU backend's, the simulated device's), fit in the host's available memory. No check
    /// where the host does not say.
    pub fn check_host(&self, device: u64) -> Result<()> {
        let Some(available) = host_available() else {
            return Ok(());
        };
        let needed = sum("the host memory", &[self.data, device])?;
        if needed > available {
            return Err(TrainError::OutOfMemory {
                needed: format!(
                    "about {} of host memory (data {}, model, optimiser and activations {})",
                    Bytes(needed),
                    Bytes(self.data),
                    Bytes(device)
                ),
                available: format!("the host has {} available", Bytes(available)),
                advice: "lower --samples, the model sizes or --batch".into(),
            });
        }
        Ok(())
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (`None` where there is no such file).
#[must_use]
pub fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text)
}

fn parse_meminfo(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .and_then(|kb| kb.checked_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cli::Options;
    use clap::Parser as _;

    proptest::proptest! {
        /// Any sizes on the command line give a configuration and an estimate, or a typed error:
        /// never an overflow panic.
        #[test]
        fn hostile_sizes_never_panic(
            sizes in proptest::collection::vec(
                proptest::prop_oneof![0u64..4, 1u64..100_000, proptest::num::u64::ANY],
                8,
            ),
            per_sample in proptest::bool::ANY,
        ) {
            let names = ["--scales", "--features", "--width", "--heads", "--ff", "--samples", "--batch", "--layers"];
            let mut args = vec!["ztrain".to_string()];
            for (n, v) in names.iter().zip(&sizes) {
                args.push(format!("{n}={v}"));
            }
            if per_sample {
                args.push("--schedule=per-sample".into());
            }
            let options = Options::try_parse_from(&args).expect("parses");
            if let Ok(config) = options.config()
                && let Ok(e) = Estimate::of(&config)
            {
                let _ = e.device();
                let _ = e.check_host(u64::MAX);
                let _ = e.check_device(1 << 30, "the test device", "");
            }
        }
    }

    #[test]
    fn reads_mem_available() {
        let text = "MemTotal: 100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_meminfo(text), Some(2 << 20));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
    }
}
