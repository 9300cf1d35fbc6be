//! The arena's settings with one owner: [`ArenaOverrides`] holds what a caller gave (builder
//! methods, the `ZMEM_*` environment, a memory plan's peaks) and resolves it against the
//! device, once, into the [`ArenaConfig`] an [`Arena`](crate::Arena) runs with. Every default
//! is computed here ([`ArenaOverrides::defaults`]), every combination checked here
//! ([`ArenaOverrides::resolve`]); the engine, ztrain and the memory plan pass overrides through.
//!
//! Precedence, lowest first: zmem's fixed defaults ([`ArenaConfig::default`]), the sizes a
//! memory plan implies ([`ArenaOverrides::planned`]), the `ZMEM_*` variables
//! ([`ArenaOverrides::from_env`], read once per process), then the builder methods. A value
//! the arena would not honour exactly (it would round an initial size up to whole segments or
//! clamp it to the cap) is refused, naming the setting the way the caller spelled it and its
//! valid range: an engine never changes what was asked for without a word.

use crate::class::{AllocClass, ClassBytes};
use crate::config::{ArenaConfig, default_cap};
use crate::error::MemError;
use crate::units::Bytes;

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
    /// Every setting, in [`ENV_VARS`](crate::ENV_VARS) order.
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

    /// The engine's builder method that overrides it (the default label of an override).
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

    /// The setting a `ZMEM_*` variable sets.
    #[must_use]
    pub fn of_env_var(var: &str) -> Option<ArenaSetting> {
        ArenaSetting::ALL.into_iter().find(|s| s.env_var() == var)
    }
}

/// Names an explicitly overridden setting in errors (a command line passes its option names).
pub type Labels = fn(ArenaSetting) -> &'static str;

/// Smallest segment a plan-sized arena grows by (the driver's allocation granularity).
pub const PLANNED_SEGMENT_MIN: u64 = 2 << 20;

/// The margin of a plan-sized arena: segments of 1/8 of the planned need (so the tail a step
/// leaves unused in its last segment stays small against what it uses), and an overflow pool
/// reserve of 1/32 of it (overflow only happens past the cap; the reserve is its headroom; at
/// 1/16 the captured default run reserved 1.52x its live peak on the accounting device after
/// the merges of 2026-11-26, above the 1.5 target).
pub const PLANNED_SEGMENT_SHARE: u64 = 8;
/// See [`PLANNED_SEGMENT_SHARE`].
pub const PLANNED_RESERVE_SHARE: u64 = 32;

/// The arena's settings as given: each `None` takes its default (see the module docs).
#[derive(Clone, Debug)]
pub struct ArenaOverrides {
    /// The fixed defaults, with the environment over them when read.
    base: ArenaConfig,
    initial_bytes: Option<u64>,
    segment_bytes: Option<u64>,
    cap_bytes: Option<u64>,
    overflow_reserve_bytes: Option<u64>,
    poison: Option<bool>,
    timeline_events: Option<usize>,
    sanitize: Option<bool>,
    /// A memory plan's per-class peaks: the defaults of the sizes follow them.
    planned: Option<ClassBytes>,
    labels: Labels,
}

impl Default for ArenaOverrides {
    fn default() -> Self {
        ArenaOverrides::new()
    }
}

/// Every field of a full config, given explicitly (a caller that wrote a whole `ArenaConfig`).
impl From<ArenaConfig> for ArenaOverrides {
    fn from(c: ArenaConfig) -> Self {
        ArenaOverrides {
            initial_bytes: Some(c.initial_bytes),
            segment_bytes: Some(c.segment_bytes),
            cap_bytes: c.cap_bytes,
            overflow_reserve_bytes: Some(c.overflow_reserve_bytes),
            poison: Some(c.poison),
            timeline_events: Some(c.timeline_events),
            sanitize: Some(c.sanitize),
            ..ArenaOverrides::over(c)
        }
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident, $field:ident, $ty:ty) => {
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: $ty) -> Self {
            self.$field = Some(value);
            self
        }
    };
}

impl ArenaOverrides {
    /// Nothing overridden, the environment ignored.
    #[must_use]
    pub fn new() -> ArenaOverrides {
        ArenaOverrides::over(ArenaConfig::default())
    }

    /// The `ZMEM_*` variables over the defaults (read once per process). A malformed value is
    /// [`MemError::Config`] naming the variable.
    pub fn from_env() -> Result<ArenaOverrides, MemError> {
        Ok(ArenaOverrides::over(ArenaConfig::from_env()?))
    }

    /// The `ZMEM_*` entries of `vars` over the defaults (others ignored): the environment read
    /// from a list, for tests and embedders.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<ArenaOverrides, MemError> {
        Ok(ArenaOverrides::over(
            ArenaConfig::default().with_vars(vars)?,
        ))
    }

    fn over(base: ArenaConfig) -> ArenaOverrides {
        ArenaOverrides {
            base,
            initial_bytes: None,
            segment_bytes: None,
            cap_bytes: None,
            overflow_reserve_bytes: None,
            poison: None,
            timeline_events: None,
            sanitize: None,
            planned: None,
            labels: ArenaSetting::method,
        }
    }

    setter!(
        /// Scratch memory allocated at creation: a whole number of segments, at most the cap.
        arena_bytes, initial_bytes, u64
    );
    setter!(
        /// Size of each segment the arena grows by: at least 256 B, at most the cap.
        segment_bytes, segment_bytes, u64
    );
    setter!(
        /// The most the arena may grow to (default three quarters of the device's memory): at
        /// most the device's memory.
        arena_cap, cap_bytes, u64
    );
    setter!(
        /// Overflow pool memory reserved up front; with the initial size, at most the device's
        /// memory.
        overflow_reserve, overflow_reserve_bytes, u64
    );
    setter!(
        /// Fill reclaimed and freed memory with NaN.
        poison, poison, bool
    );
    setter!(
        /// Events the arena's timeline ring keeps.
        timeline_events, timeline_events, usize
    );
    setter!(
        /// Sanitizer mode (one driver allocation per block).
        sanitize, sanitize, bool
    );

    /// Sizes the defaults from a memory plan's per-class peaks (zgrad's plan): segments,
    /// initial scratch and the overflow reserve follow what the steps need instead of zmem's
    /// fixed 64 MiB each. A setting given explicitly or by its variable still wins.
    #[must_use]
    pub fn planned(mut self, peaks: ClassBytes) -> Self {
        self.planned = Some(peaks);
        self
    }

    /// How errors name an explicitly overridden setting (default: the engine's builder
    /// method, e.g. `EngineConfig::arena_bytes`); a setting from the environment is named by
    /// its variable. A command line passes its option names here.
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

    /// Whether `setting` was given at all (explicitly or by its variable).
    fn is_given(&self, setting: ArenaSetting) -> bool {
        self.is_overridden(setting) || self.base.from_env.contains(&setting.env_var())
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

    /// The defaults for a device of `total` bytes: the fixed ones (with the environment over
    /// them), the cap (3/4 of the device), and, with a plan, the sizes it implies. The one
    /// place a default is computed.
    #[must_use]
    pub fn defaults(&self, total: u64) -> ArenaConfig {
        let mut c = self.base.clone();
        let cap = self.cap_bytes.or(c.cap_bytes).unwrap_or(default_cap(total));
        if let Some(peaks) = self.planned {
            let need = peaks.total().max(1);
            let round = |b: u64| b.div_ceil(PLANNED_SEGMENT_MIN) * PLANNED_SEGMENT_MIN;
            let given_size = self.is_given(ArenaSetting::InitialBytes)
                || self.is_given(ArenaSetting::SegmentBytes);
            if !given_size {
                let seg = round(need / PLANNED_SEGMENT_SHARE)
                    .clamp(PLANNED_SEGMENT_MIN, ArenaConfig::default().segment_bytes);
                c.segment_bytes = seg.min(cap / PLANNED_SEGMENT_MIN * PLANNED_SEGMENT_MIN);
            }
            if !self.is_given(ArenaSetting::InitialBytes) {
                let seg = self.segment_bytes.unwrap_or(c.segment_bytes).max(1);
                // Scratch beyond the segments is lent from the memory saved blocks give back
                // (an eager step's backward): the segments hold only what exceeds it.
                let beyond = peaks
                    .get(AllocClass::Scratch)
                    .saturating_sub(peaks.get(AllocClass::Saved));
                let scratch = beyond.div_ceil(seg).max(1) * seg;
                c.initial_bytes = scratch.min(cap / seg * seg).max(seg);
            }
            if !self.is_given(ArenaSetting::OverflowReserveBytes) {
                c.overflow_reserve_bytes = round(need / PLANNED_RESERVE_SHARE).clamp(
                    PLANNED_SEGMENT_MIN,
                    ArenaConfig::default().overflow_reserve_bytes,
                );
            }
        }
        c
    }

    /// The settings given (explicitly or by the environment) over the fixed defaults, before
    /// any device is known: no plan's sizes, the cap `None` unless given. Not checked.
    #[must_use]
    pub fn given(&self) -> ArenaConfig {
        self.apply(self.base.clone())
    }

    /// The settings merged in precedence order for a device of `total` bytes, not checked.
    #[must_use]
    pub fn merged(&self, total: u64) -> ArenaConfig {
        self.apply(self.defaults(total))
    }

    /// `c` with the explicit overrides over it.
    fn apply(&self, mut c: ArenaConfig) -> ArenaConfig {
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
    /// [`MemError::Setting`] names the setting (see [`ArenaOverrides::name_of`]), its value and
    /// its valid range. The cap stays `None` when none was given: the arena takes
    /// [`default_cap`] of its device, as checked here.
    pub fn resolve(&self, total: u64) -> Result<ArenaConfig, MemError> {
        let cfg = self.merged(total);
        let refuse = |setting: ArenaSetting, value: u64, reason: String| MemError::Setting {
            setting,
            name: self.name_of(setting),
            value: Bytes(value).to_string(),
            reason,
        };
        let names = |s| self.name_of(s);
        let cap = cfg.cap_for(total);
        let cap_name = if self.is_given(ArenaSetting::CapBytes) {
            names(ArenaSetting::CapBytes)
        } else {
            "the default arena cap (3/4 of the device's memory)"
        };
        if self.is_given(ArenaSetting::CapBytes) && cap > total {
            return Err(refuse(
                ArenaSetting::CapBytes,
                cap,
                format!("must be at most the device's memory, {}", Bytes(total)),
            ));
        }
        let seg = cfg.segment_bytes;
        if seg < crate::units::ALIGN || seg > cap {
            return Err(refuse(
                ArenaSetting::SegmentBytes,
                seg,
                format!("must be between 256 B and {cap_name}, {}", Bytes(cap)),
            ));
        }
        let init = cfg.initial_bytes;
        if init < seg || init > cap || !init.is_multiple_of(seg) {
            return Err(refuse(
                ArenaSetting::InitialBytes,
                init,
                initial_reason(init, seg, cap, names(ArenaSetting::SegmentBytes), cap_name),
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
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Why an initial size is refused, with the nearest sizes that would be honoured.
fn initial_reason(init: u64, seg: u64, cap: u64, seg_name: &str, cap_name: &str) -> String {
    let below = (init / seg).max(1) * seg;
    // Saturating: an initial size near 2^64 has no whole segment above it.
    let above = below.saturating_add(seg);
    let nearest = if below >= init || above > cap {
        Bytes(below.min(cap / seg * seg)).to_string()
    } else {
        format!("{} or {}", Bytes(below), Bytes(above))
    };
    format!(
        "must be a whole number of segments ({seg_name} = {} each) between one segment and {cap_name}, {}; e.g. {nearest}",
        Bytes(seg),
        Bytes(cap)
    )
}

#[cfg(test)]
#[path = "overrides_tests.rs"]
mod tests;
