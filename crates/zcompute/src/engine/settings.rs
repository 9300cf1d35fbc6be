//! The arena settings of an engine: one value ([`EngineConfig`]) resolved in one documented
//! order and validated once, against the device it is for. zmem would round an initial size up
//! to whole segments and clamp it to the cap; an engine never changes what was asked for without
//! a word, so a value the arena would not honour exactly is refused here, naming its valid range.
//!
//! Precedence, lowest first: zmem's defaults ([`ArenaConfig::default`]), then the `ZMEM_*`
//! environment variables ([`EngineConfig::from_env`], read once per process), then the explicit
//! overrides of the builder methods. Nothing is checked until the device's memory is known
//! ([`EngineConfig::arena_config`]), and then everything is checked there, once.

use zmem::units::Bytes;
use zmem::{ArenaConfig, MemError};

use crate::error::{ComputeError, Result};

/// One arena setting, for errors and for naming it the way the caller's users spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArenaSetting {
    /// Scratch memory allocated at creation (`ZMEM_ARENA_BYTES`).
    InitialBytes,
    /// The size the arena grows by (`ZMEM_SEGMENT_BYTES`).
    SegmentBytes,
    /// The most the arena may grow to (`ZMEM_ARENA_CAP_BYTES`).
    CapBytes,
    /// The overflow pool reserved up front (`ZMEM_OVERFLOW_RESERVE_BYTES`).
    OverflowReserveBytes,
    /// NaN-filling of reclaimed memory (`ZMEM_POISON`).
    Poison,
    /// Events in the timeline ring (`ZMEM_TIMELINE_EVENTS`).
    TimelineEvents,
    /// One driver allocation per block (`ZMEM_SANITIZE`).
    Sanitize,
}

impl ArenaSetting {
    /// Every setting, in `zmem::ENV_VARS` order.
    pub const ALL: [ArenaSetting; 7] = [
        ArenaSetting::InitialBytes,
        ArenaSetting::SegmentBytes,
        ArenaSetting::CapBytes,
        ArenaSetting::OverflowReserveBytes,
        ArenaSetting::Poison,
        ArenaSetting::TimelineEvents,
        ArenaSetting::Sanitize,
    ];

    /// The environment variable zmem reads it from.
    #[must_use]
    pub const fn env_var(self) -> &'static str {
        match self {
            ArenaSetting::InitialBytes => "ZMEM_ARENA_BYTES",
            ArenaSetting::SegmentBytes => "ZMEM_SEGMENT_BYTES",
            ArenaSetting::CapBytes => "ZMEM_ARENA_CAP_BYTES",
            ArenaSetting::OverflowReserveBytes => "ZMEM_OVERFLOW_RESERVE_BYTES",
            ArenaSetting::Poison => "ZMEM_POISON",
            ArenaSetting::TimelineEvents => "ZMEM_TIMELINE_EVENTS",
            ArenaSetting::Sanitize => "ZMEM_SANITIZE",
        }
    }

    /// The [`EngineConfig`] method that overrides it (the default label of an override).
    #[must_use]
    pub const fn method(self) -> &'static str {
        match self {
            ArenaSetting::InitialBytes => "EngineConfig::arena_bytes",
            ArenaSetting::SegmentBytes => "EngineConfig::segment_bytes",
            ArenaSetting::CapBytes => "EngineConfig::arena_cap",
            ArenaSetting::OverflowReserveBytes => "EngineConfig::overflow_reserve",
            ArenaSetting::Poison => "EngineConfig::poison",
            ArenaSetting::TimelineEvents => "EngineConfig::timeline_events",
            ArenaSetting::Sanitize => "EngineConfig::sanitize",
        }
    }

    fn of_env_var(var: &str) -> Option<ArenaSetting> {
        ArenaSetting::ALL.into_iter().find(|s| s.env_var() == var)
    }
}

/// Names an explicitly overridden setting in errors (a command line passes its option names).
pub type Labels = fn(ArenaSetting) -> &'static str;

/// How an engine's arena is sized: defaults, then the environment, then explicit overrides
/// (module docs). Build it with [`EngineConfig::from_env`] (or [`EngineConfig::new`] to ignore
/// the environment), override with the builder methods, open with [`EngineConfig::cuda`],
/// [`EngineConfig::sim`] or [`EngineConfig::on_device`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Defaults, with the environment over them when read.
    base: ArenaConfig,
    initial_bytes: Option<u64>,
    segment_bytes: Option<u64>,
    cap_bytes: Option<u64>,
    overflow_reserve_bytes: Option<u64>,
    poison: Option<bool>,
    timeline_events: Option<usize>,
    sanitize: Option<bool>,
    /// The device's deadline on every wait (`DeviceConfig::sync_deadline`) for the devices
    /// this config opens (`cuda`, `sim`); `None` keeps zdevice's default.
    sync_deadline: Option<std::time::Duration>,
    labels: Labels,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig::new()
    }
}

impl EngineConfig {
    /// zmem's defaults, the environment ignored.
    #[must_use]
    pub fn new() -> EngineConfig {
        EngineConfig::over(ArenaConfig::default())
    }

    /// zmem's defaults overridden by the `ZMEM_*` environment variables (read once per process).
    /// A malformed value is [`ComputeError::ArenaSetting`] naming the variable.
    pub fn from_env() -> Result<EngineConfig> {
        Ok(EngineConfig::over(
            ArenaConfig::from_env().map_err(env_error)?,
        ))
    }

    /// Defaults overridden by the `ZMEM_*` entries of `vars` (others ignored): the environment
    /// read from a list, for tests and embedders.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<EngineConfig> {
        let base = ArenaConfig::default().with_vars(vars).map_err(env_error)?;
        Ok(EngineConfig::over(base))
    }

    fn over(base: ArenaConfig) -> EngineConfig {
        EngineConfig {
            base,
            initial_bytes: None,
            segment_bytes: None,
            cap_bytes: None,
            overflow_reserve_bytes: None,
            poison: None,
            timeline_events: None,
            sanitize: None,
            sync_deadline: None,
            labels: ArenaSetting::method,
        }
    }

    /// The deadline of every wait of the devices this config opens (`cuda`, `sim`; a device
    /// passed to `on_device` keeps its own): a data-parallel rank sets its communicator's
    /// timeout here, so a collective whose peer died ends with a typed `Timeout` in time.
    #[must_use]
    pub fn sync_deadline(mut self, deadline: std::time::Duration) -> Self {
        self.sync_deadline = Some(deadline);
        self
    }

    /// The device settings `cuda` and `sim` open devices with (`ordinal` and the deadline).
    pub(crate) fn device_config(&self, ordinal: u32) -> zdevice::DeviceConfig {
        let base = zdevice::DeviceConfig::default();
        zdevice::DeviceConfig {
            ordinal,
            sync_deadline: self.sync_deadline.unwrap_or(base.sync_deadline),
            ..base
        }
    }

    /// Scratch memory allocated at creation: a whole number of segments, at most the cap.
    #[must_use]
    pub fn arena_bytes(mut self, bytes: u64) -> Self {
        self.initial_bytes = Some(bytes);
        self
    }

    /// Size of each segment the arena grows by: at least 256 B, at most the cap.
    #[must_use]
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = Some(bytes);
        self
    }

    /// The most the arena may grow to (default three quarters of the device's memory): at most
    /// the device's memory.
    #[must_use]
    pub fn arena_cap(mut self, bytes: u64) -> Self {
        self.cap_bytes = Some(bytes);
        self
    }

    /// Overflow pool memory reserved up front; with the initial size, at most the device's
    /// memory.
    #[must_use]
    pub fn overflow_reserve(mut self, bytes: u64) -> Self {
        self.overflow_reserve_bytes = Some(bytes);
        self
    }

    /// Fill reclaimed and freed memory with NaN.
    #[must_use]
    pub fn poison(mut self, on: bool) -> Self {
        self.poison = Some(on);
        self
    }

    /// Events the arena's timeline ring keeps.
    #[must_use]
    pub fn timeline_events(mut self, events: usize) -> Self {
        self.timeline_events = Some(events);
        self
    }

    /// Sanitizer mode (one driver allocation per block).
    #[must_use]
    pub fn sanitize(mut self, on: bool) -> Self {
        self.sanitize = Some(on);
        self
    }

    /// How errors name an explicitly overridden setting (default: the builder method, e.g.
    /// `EngineConfig::arena_bytes`); a setting from the environment is named by its variable.
    /// A command line passes its option names here.
    #[must_use]
    pub fn labels(mut self, labels: Labels) -> Self {
        self.labels = labels;
        self
    }

    /// Whether `setting` was given explicitly (a builder method), not by default or environment.
    #[must_use]
    pub fn is_overridden(&self, setting: ArenaSetting) -> bool {
        match setting {
            ArenaSetting::InitialBytes => self.initial_bytes.is_some(),
            ArenaSetting::SegmentBytes => self.segment_bytes.is_some(),
            ArenaSetting::CapBytes => self.cap_bytes.is_some(),
            ArenaSetting::OverflowReserveBytes => self.overflow_reserve_bytes.is_some(),
            ArenaSetting::Poison => self.poison.is_some(),
            ArenaSetting::TimelineEvents => self.timeline_events.is_some(),
            ArenaSetting::Sanitize => self.sanitize.is_some(),
        }
    }

    /// The name errors give `setting`: its label when overridden, its variable when it came
    /// from the environment, its label otherwise.
    #[must_use]
    pub fn name_of(&self, setting: ArenaSetting) -> &'static str {
        let var = setting.env_var();
        if !self.is_overridden(setting) && self.base.from_env.contains(&var) {
            var
        } else {
            (self.labels)(setting)
        }
    }

    /// The settings merged in precedence order, not yet checked against a device.
    #[must_use]
    pub fn merged(&self) -> ArenaConfig {
        let mut c = self.base.clone();
        c.initial_bytes = self.initial_bytes.unwrap_or(c.initial_bytes);
        c.segment_bytes = self.segment_bytes.unwrap_or(c.segment_bytes);
        c.cap_bytes = self.cap_bytes.or(c.cap_bytes);
        c.overflow_reserve_bytes = self
            .overflow_reserve_bytes
            .unwrap_or(c.overflow_reserve_bytes);
        c.poison = self.poison.unwrap_or(c.poison);
        c.timeline_events = self.timeline_events.unwrap_or(c.timeline_events);
        c.sanitize = self.sanitize.unwrap_or(c.sanitize);
        c
    }

    /// The arena configuration for a device of `total` bytes: the merged settings, checked
    /// once. Refused (never adjusted) when the arena would not hold exactly what was asked:
    /// [`ComputeError::ArenaSetting`] names the setting (see [`EngineConfig::name_of`]), its
    /// value and its valid range.
    pub fn arena_config(&self, total: u64) -> Result<ArenaConfig> {
        let cfg = self.merged();
        let refuse =
            |setting: ArenaSetting, value: u64, reason: String| ComputeError::ArenaSetting {
                setting,
                name: self.name_of(setting),
                value: Bytes(value).to_string(),
                reason,
            };
        let names = |s| self.name_of(s);
        let cap = cfg.cap_bytes.unwrap_or(total / 4 * 3);
        let cap_name = if cfg.cap_bytes.is_some() {
            names(ArenaSetting::CapBytes)
        } else {
            "the default arena cap (3/4 of the device's memory)"
        };
        if let Some(c) = cfg.cap_bytes
            && c > total
        {
            return Err(refuse(
                ArenaSetting::CapBytes,
                c,
                format!("must be at most the device's memory, {}", Bytes(total)),
            ));
        }
        let seg = cfg.segment_bytes;
        if seg < zmem::units::ALIGN || seg > cap {
            return Err(refuse(
                ArenaSetting::SegmentBytes,
                seg,
                format!("must be between 256 B and {cap_name}, {}", Bytes(cap)),
            ));
        }
        let init = cfg.initial_bytes;
        if init < seg || init > cap || !init.is_multiple_of(seg) {
            let below = (init / seg).max(1) * seg;
            let nearest = if below >= init || below + seg > cap {
                Bytes(below.min(cap / seg * seg)).to_string()
            } else {
                format!("{} or {}", Bytes(below), Bytes(below + seg))
            };
            return Err(refuse(
                ArenaSetting::InitialBytes,
                init,
                format!(
                    "must be a whole number of segments ({} = {} each) between one segment and {cap_name}, {}; e.g. {nearest}",
                    names(ArenaSetting::SegmentBytes),
                    Bytes(seg),
                    Bytes(cap)
                ),
            ));
        }
        let reserve = cfg.overflow_reserve_bytes;
        if init.saturating_add(reserve) > total {
            return Err(refuse(
                ArenaSetting::OverflowReserveBytes,
                reserve,
                format!(
                    "with {} {} it exceeds the device's memory, {}",
                    names(ArenaSetting::InitialBytes),
                    Bytes(init),
                    Bytes(total)
                ),
            ));
        }
        Ok(cfg)
    }
}

/// A malformed `ZMEM_*` variable, named by the variable.
fn env_error(e: MemError) -> ComputeError {
    match e {
        MemError::Config { var, value, reason } => ComputeError::ArenaSetting {
            setting: ArenaSetting::of_env_var(var).unwrap_or(ArenaSetting::InitialBytes),
            name: var,
            value,
            reason,
        },
        other => crate::cuda::mem_error("EngineConfig::from_env", other),
    }
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
