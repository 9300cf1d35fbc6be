//! Arena configuration: by API, or from `ZMEM_*` environment variables read once per process.

use std::fmt;
use std::sync::OnceLock;

use crate::error::MemError;
use crate::units::{Bytes, parse_bytes};

/// How an [`Arena`](crate::Arena) sizes itself. Every field can also come from the environment
/// (see [`ArenaConfig::from_env`]); the arena logs the values it runs with at creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Scratch memory allocated at creation (rounded up to whole segments).
    /// `ZMEM_ARENA_BYTES`.
    pub initial_bytes: u64,
    /// Size of each segment the arena grows by (a request larger than this gets a segment of
    /// its own size). `ZMEM_SEGMENT_BYTES`.
    pub segment_bytes: u64,
    /// Most the arena's segments (scratch and saved/persistent together) may add up to; past
    /// it, requests go to the overflow pool. `None`: three quarters of the device's memory.
    /// `ZMEM_ARENA_CAP_BYTES`.
    pub cap_bytes: Option<u64>,
    /// Bytes reserved in the overflow pool up front, so that overflow reuses memory instead of
    /// asking the operating system under pressure. `ZMEM_OVERFLOW_RESERVE_BYTES`.
    pub overflow_reserve_bytes: u64,
    /// Fill reclaimed scratch and freed memory with 0xFF bytes (a float32 NaN) so that a read
    /// of stale memory produces NaN at the op that read it. `ZMEM_POISON` (`1`/`0`).
    pub poison: bool,
    /// Events kept in the timeline's ring. `ZMEM_TIMELINE_EVENTS`.
    pub timeline_events: usize,
    /// Sanitizer mode: every block is its own driver allocation (no sub-allocation), so that
    /// compute-sanitizer sees an out-of-bounds access past a block's end. Slower; meant for
    /// `cargo xtask test-gpu --sanitize`. `ZMEM_SANITIZE` (`1`/`0`); `ZMEM_SANITIZE=1` in the
    /// process environment also turns it on for arenas whose config says `false` (see
    /// [`sanitize_forced`]), so that suites building their own configs run sanitized.
    pub sanitize: bool,
    /// Which fields came from the environment (for the creation report).
    pub from_env: Vec<&'static str>,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        ArenaConfig {
            initial_bytes: 64 << 20,
            segment_bytes: 64 << 20,
            cap_bytes: None,
            overflow_reserve_bytes: 64 << 20,
            poison: false,
            timeline_events: 4096,
            sanitize: false,
            from_env: Vec::new(),
        }
    }
}

/// The arena cap when none is given: three quarters of the device's `total` memory, leaving
/// room for the overflow pool, capture reservations and other users of the device. The one
/// place this default is computed.
#[must_use]
pub const fn default_cap(total: u64) -> u64 {
    total / 4 * 3
}

/// The environment variables the arena reads.
pub const ENV_VARS: [&str; 7] = [
    "ZMEM_ARENA_BYTES",
    "ZMEM_SEGMENT_BYTES",
    "ZMEM_ARENA_CAP_BYTES",
    "ZMEM_OVERFLOW_RESERVE_BYTES",
    "ZMEM_POISON",
    "ZMEM_TIMELINE_EVENTS",
    "ZMEM_SANITIZE",
];

static ENV: OnceLock<Result<ArenaConfig, MemError>> = OnceLock::new();
static FORCED: OnceLock<Result<bool, MemError>> = OnceLock::new();

/// Whether `ZMEM_SANITIZE` in the process environment (read once per process) turns sanitizer
/// mode on for every arena, whatever its config says. A malformed value is an error naming the
/// variable; `0` or unset forces nothing (a config may still ask for the mode).
pub fn sanitize_forced() -> Result<bool, MemError> {
    FORCED
        .get_or_init(|| match env_text("ZMEM_SANITIZE") {
            Ok(Some(v)) => parse_switch("ZMEM_SANITIZE", &v),
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        })
        .clone()
}

/// The process environment's `var` as text: None when unset, a typed error naming the variable
/// (never showing its bytes) when it is not UTF-8.
fn env_text(var: &'static str) -> Result<Option<String>, MemError> {
    match std::env::var_os(var) {
        None => Ok(None),
        Some(v) => v.into_string().map(Some).map_err(|_| MemError::Config {
            var,
            value: "(not shown)".into(),
            reason: "not valid UTF-8; expected a number or a 1/0 switch".into(),
        }),
    }
}

/// A `1`/`0` switch (also `true`/`on`/`yes`, `false`/`off`/`no`, empty: off).
fn parse_switch(var: &'static str, v: &str) -> Result<bool, MemError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" | "" => Ok(false),
        _ => Err(MemError::Config {
            var,
            value: v.to_string(),
            reason: "expected 1 or 0".into(),
        }),
    }
}

impl ArenaConfig {
    /// The cap on a device of `total` bytes: the configured one, else [`default_cap`].
    #[must_use]
    pub fn cap_for(&self, total: u64) -> u64 {
        self.cap_bytes.unwrap_or(default_cap(total))
    }

    /// The defaults overridden by the `ZMEM_*` variables, read once per process (later changes
    /// to the environment are not seen, so every arena of a run agrees). A malformed value is an
    /// error naming the variable, never a silent default.
    pub fn from_env() -> Result<ArenaConfig, MemError> {
        ENV.get_or_init(|| {
            // Only the arena's own variables are read, each with `var_os`: another variable
            // that is not UTF-8 is none of the arena's business (`std::env::vars` would panic
            // on it, printing its value).
            let mut vars = Vec::new();
            for name in ENV_VARS {
                if let Some(v) = env_text(name)? {
                    vars.push((name.to_string(), v));
                }
            }
            ArenaConfig::default().with_vars(vars)
        })
        .clone()
    }

    /// `self` overridden by the `ZMEM_*` entries of `vars` (others are ignored).
    pub fn with_vars(
        mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<ArenaConfig, MemError> {
        for (k, v) in vars {
            let Some(name) = ENV_VARS.iter().copied().find(|n| *n == k) else {
                continue;
            };
            let bad = |reason: String| MemError::Config {
                var: name,
                value: v.clone(),
                reason,
            };
            match name {
                "ZMEM_ARENA_BYTES" => self.initial_bytes = parse_bytes(&v).map_err(bad)?,
                "ZMEM_SEGMENT_BYTES" => self.segment_bytes = parse_bytes(&v).map_err(bad)?,
                "ZMEM_ARENA_CAP_BYTES" => self.cap_bytes = Some(parse_bytes(&v).map_err(bad)?),
                "ZMEM_OVERFLOW_RESERVE_BYTES" => {
                    self.overflow_reserve_bytes = parse_bytes(&v).map_err(bad)?;
                }
                "ZMEM_POISON" => self.poison = parse_switch(name, &v)?,
                "ZMEM_SANITIZE" => self.sanitize = parse_switch(name, &v)?,
                _ => {
                    self.timeline_events = v.trim().parse().map_err(|e| bad(format!("{e}")))?;
                }
            }
            if !self.from_env.contains(&name) {
                self.from_env.push(name);
            }
        }
        self.validate()?;
        Ok(self)
    }

    /// Checks the values make sense together, and that the timeline's ring stays a bounded
    /// ring (at most [`MAX_TIMELINE_EVENTS`] events).
    pub fn validate(&self) -> Result<(), MemError> {
        let bad = |var: &'static str, value: u64, reason: &str| MemError::Config {
            var,
            value: value.to_string(),
            reason: reason.to_string(),
        };
        if self.segment_bytes < crate::units::ALIGN {
            return Err(bad(
                "ZMEM_SEGMENT_BYTES",
                self.segment_bytes,
                "must be at least 256",
            ));
        }
        if self.timeline_events > MAX_TIMELINE_EVENTS {
            return Err(bad(
                "ZMEM_TIMELINE_EVENTS",
                self.timeline_events as u64,
                &format!(
                    "at most {MAX_TIMELINE_EVENTS} events (the ring would grow without bound)"
                ),
            ));
        }
        if let Some(cap) = self.cap_bytes
            && cap < self.initial_bytes
        {
            return Err(bad(
                "ZMEM_ARENA_CAP_BYTES",
                cap,
                "is smaller than ZMEM_ARENA_BYTES",
            ));
        }
        Ok(())
    }
}

impl fmt::Display for ArenaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "initial {} segment {} cap {} overflow reserve {} poison {} timeline {} events{}",
            Bytes(self.initial_bytes),
            Bytes(self.segment_bytes),
            self.cap_bytes
                .map_or("3/4 of device".to_string(), |c| Bytes(c).to_string()),
            Bytes(self.overflow_reserve_bytes),
            if self.poison { "on" } else { "off" },
            self.timeline_events,
            if self.sanitize {
                " sanitize on (one driver allocation per block)"
            } else {
                ""
            },
        )?;
        if !self.from_env.is_empty() {
            write!(f, " (from env: {})", self.from_env.join(", "))?;
        }
        Ok(())
    }
}

/// The most events the timeline's ring may keep (a few hundred MiB of events at most).
pub const MAX_TIMELINE_EVENTS: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn env_overrides_and_reports_sources() {
        let c = ArenaConfig::default()
            .with_vars(vars(&[
                ("ZMEM_ARENA_BYTES", "1M"),
                ("ZMEM_SEGMENT_BYTES", "512K"),
                ("ZMEM_ARENA_CAP_BYTES", "4M"),
                ("ZMEM_OVERFLOW_RESERVE_BYTES", "2M"),
                ("ZMEM_POISON", "1"),
                ("ZMEM_TIMELINE_EVENTS", "10"),
                ("ZMEM_SANITIZE", "on"),
                ("PATH", "/bin"),
            ]))
            .unwrap();
        assert_eq!(c.initial_bytes, 1 << 20);
        assert_eq!(c.segment_bytes, 512 << 10);
        assert_eq!(c.cap_bytes, Some(4 << 20));
        assert_eq!(c.overflow_reserve_bytes, 2 << 20);
        assert!(c.poison);
        assert_eq!(c.timeline_events, 10);
        assert!(c.sanitize);
        assert!(c.to_string().contains("sanitize on"), "{c}");
        assert_eq!(c.from_env.len(), 7);
        assert!(c.to_string().contains("from env: ZMEM_ARENA_BYTES"));
    }

    #[rstest]
    #[case("ZMEM_ARENA_BYTES", "lots")]
    #[case("ZMEM_POISON", "maybe")]
    #[case("ZMEM_SANITIZE", "2")]
    #[case("ZMEM_TIMELINE_EVENTS", "-1")]
    #[case("ZMEM_SEGMENT_BYTES", "16")]
    #[case("ZMEM_ARENA_CAP_BYTES", "1K")]
    #[case("ZMEM_TIMELINE_EVENTS", "1048577")]
    #[case("ZMEM_TIMELINE_EVENTS", "18446744073709551615")]
    fn malformed_values_name_the_variable(#[case] var: &str, #[case] value: &str) {
        let err = ArenaConfig::default()
            .with_vars(vars(&[(var, value)]))
            .unwrap_err();
        assert!(
            matches!(&err, MemError::Config { var: v, .. } if *v == var),
            "{err}"
        );
    }
}
