//! The device-memory options (`--arena-bytes`, `--segment-bytes`, `--arena-cap`,
//! `--overflow-reserve`, `--poison`) as one value: they become zmem's `ArenaOverrides` (zmem's
//! defaults, then the `ZMEM_*` environment, then these options), which the engine passes
//! through and zmem checks once, against the device, when the engine opens. Errors name a
//! setting the way the user gave it: the option, or the variable when it came from the
//! environment.

use clap::Args;
use zcompute::{ArenaOverrides, ArenaSetting, ComputeError, EngineConfig};

use crate::error::{Result, TrainError};

/// The arena's options.
#[derive(Clone, Debug, Default, Args)]
pub struct ArenaOptions {
    /// Scratch memory the arena allocates at start (K/M/G suffixes; default from
    /// ZMEM_ARENA_BYTES, else 64M).
    #[arg(long, value_parser = crate::cli::parse_size, help_heading = HEADING)]
    pub arena_bytes: Option<u64>,

    /// Size of each segment the arena grows by (default ZMEM_SEGMENT_BYTES, else 64M).
    #[arg(long, value_parser = crate::cli::parse_size, help_heading = HEADING)]
    pub segment_bytes: Option<u64>,

    /// Most the arena may grow to; past it requests go to the overflow pool (default
    /// ZMEM_ARENA_CAP_BYTES, else 3/4 of device memory).
    #[arg(long, value_parser = crate::cli::parse_size, help_heading = HEADING)]
    pub arena_cap: Option<u64>,

    /// Overflow pool memory reserved up front (default ZMEM_OVERFLOW_RESERVE_BYTES, else 64M).
    #[arg(long, value_parser = crate::cli::parse_size, help_heading = HEADING)]
    pub overflow_reserve: Option<u64>,

    /// Fill reclaimed and freed device memory with NaN so a use after reset fails loudly.
    #[arg(long, help_heading = HEADING)]
    pub poison: bool,
}

const HEADING: &str = "Device memory (zmem arena; --device cuda or sim)";

/// The option that sets `setting` (errors name it so).
#[must_use]
pub fn option_name(setting: ArenaSetting) -> &'static str {
    match setting {
        ArenaSetting::InitialBytes => "--arena-bytes",
        ArenaSetting::SegmentBytes => "--segment-bytes",
        ArenaSetting::CapBytes => "--arena-cap",
        ArenaSetting::OverflowReserveBytes => "--overflow-reserve",
        ArenaSetting::Poison => "--poison",
        // No option: only the variable sets them.
        other => other.env_var(),
    }
}

impl ArenaOptions {
    /// The arena's overrides: the `ZMEM_*` environment, then these options over it, errors
    /// named by option.
    pub fn overrides(&self) -> Result<ArenaOverrides> {
        let mut o = EngineConfig::from_env()
            .map_err(refused)?
            .overrides()
            .clone()
            .labels(option_name);
        if let Some(v) = self.arena_bytes {
            o = o.arena_bytes(v);
        }
        if let Some(v) = self.segment_bytes {
            o = o.segment_bytes(v);
        }
        if let Some(v) = self.arena_cap {
            o = o.arena_cap(v);
        }
        if let Some(v) = self.overflow_reserve {
            o = o.overflow_reserve(v);
        }
        if self.poison {
            o = o.poison(true);
        }
        Ok(o)
    }

    /// The engine configuration over [`ArenaOptions::overrides`].
    pub fn engine_config(&self) -> Result<EngineConfig> {
        Ok(EngineConfig::new().arena(self.overrides()?))
    }
}

/// An arena setting the engine refused, as the option (or variable) the user gave; other
/// errors unchanged.
#[must_use]
pub fn refused(e: ComputeError) -> TrainError {
    match e {
        ComputeError::ArenaSetting {
            name,
            value,
            reason,
            ..
        } => TrainError::ArenaOption {
            name: name.to_string(),
            value,
            reason,
        },
        other => TrainError::Compute(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn a_refused_option_is_named_by_its_flag() {
        let o = ArenaOptions {
            arena_bytes: Some(4 << 10),
            ..ArenaOptions::default()
        };
        let cfg = o.engine_config().expect("parses");
        let err = refused(cfg.arena_config(4 * G).expect_err("refused"));
        assert!(
            err.to_string().starts_with("--arena-bytes 4.0 KiB"),
            "{err}"
        );
    }

    #[test]
    fn options_override_and_poison_only_turns_on() {
        let o = ArenaOptions {
            arena_bytes: Some(1 << 20),
            segment_bytes: Some(512 << 10),
            poison: true,
            ..ArenaOptions::default()
        };
        let a = o
            .engine_config()
            .expect("parses")
            .arena_config(4 * G)
            .expect("valid");
        assert_eq!(
            (a.initial_bytes, a.segment_bytes, a.poison),
            (1 << 20, 512 << 10, true)
        );
    }
}
