//! The device-memory options (`--arena-bytes`, `--segment-bytes`, `--arena-cap`,
//! `--overflow-reserve`, and their `ZMEM_*` variables) checked against the device before the
//! arena is made. zmem rounds the initial size up to whole segments, grows on demand from 0 and
//! clamps it to the cap; a run must never change what the user asked for without a word, so a
//! value the arena would not honour exactly is refused here, naming its valid range.

use zmem::ArenaConfig;
use zmem::units::Bytes;

use crate::error::{Result, TrainError};

/// How the user named one arena setting: the option when given, else its variable.
#[derive(Clone, Copy, Debug)]
pub struct Sources {
    pub arena_bytes: &'static str,
    pub segment_bytes: &'static str,
    pub arena_cap: &'static str,
    pub overflow_reserve: &'static str,
}

impl Sources {
    /// The names for a configuration where `given` lists the options on the command line.
    #[must_use]
    pub fn new(cfg: &ArenaConfig, given: [bool; 4]) -> Sources {
        let name = |given: bool, option: &'static str, var: &'static str| {
            if !given && cfg.from_env.contains(&var) {
                var
            } else {
                option
            }
        };
        Sources {
            arena_bytes: name(given[0], "--arena-bytes", "ZMEM_ARENA_BYTES"),
            segment_bytes: name(given[1], "--segment-bytes", "ZMEM_SEGMENT_BYTES"),
            arena_cap: name(given[2], "--arena-cap", "ZMEM_ARENA_CAP_BYTES"),
            overflow_reserve: name(
                given[3],
                "--overflow-reserve",
                "ZMEM_OVERFLOW_RESERVE_BYTES",
            ),
        }
    }
}

fn refuse(name: &str, value: u64, reason: String) -> TrainError {
    TrainError::ArenaOption {
        name: name.to_string(),
        value: Bytes(value).to_string(),
        reason,
    }
}

/// Checks `cfg` on a device of `total` bytes: the arena will hold exactly what was asked.
pub fn check(cfg: &ArenaConfig, total: u64, names: &Sources) -> Result<()> {
    let cap = cfg.cap_bytes.unwrap_or(total / 4 * 3);
    let cap_name = if cfg.cap_bytes.is_some() {
        names.arena_cap
    } else {
        "the default arena cap (3/4 of the device's memory)"
    };
    if let Some(c) = cfg.cap_bytes
        && c > total
    {
        return Err(refuse(
            names.arena_cap,
            c,
            format!("must be at most the device's memory, {}", Bytes(total)),
        ));
    }
    let seg = cfg.segment_bytes;
    if seg > cap {
        return Err(refuse(
            names.segment_bytes,
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
            names.arena_bytes,
            init,
            format!(
                "must be a whole number of segments ({} = {} each) between one segment and {cap_name}, {}; e.g. {nearest}",
                names.segment_bytes,
                Bytes(seg),
                Bytes(cap)
            ),
        ));
    }
    let reserve = cfg.overflow_reserve_bytes;
    if init.saturating_add(reserve) > total {
        return Err(refuse(
            names.overflow_reserve,
            reserve,
            format!(
                "with {} {} it exceeds the device's memory, {}",
                names.arena_bytes,
                Bytes(init),
                Bytes(total)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;

    fn names() -> Sources {
        Sources::new(&ArenaConfig::default(), [true; 4])
    }

    #[rstest]
    #[case::zero(0, None, "--arena-bytes 0 B")]
    #[case::one(1, None, "--arena-bytes 1 B")]
    #[case::four_k(4 << 10, None, "--arena-bytes 4.0 KiB")]
    #[case::not_whole(100 * M, None, "e.g. 64.0 MiB or 128.0 MiB")]
    #[case::above_default_cap(100 * G, None, "3/4 of the device's memory")]
    #[case::cap_above_device(64 * M, Some(5 * G), "--arena-cap")]
    fn values_the_arena_would_change_are_refused(
        #[case] initial: u64,
        #[case] cap: Option<u64>,
        #[case] says: &str,
    ) {
        let cfg = ArenaConfig {
            initial_bytes: initial,
            cap_bytes: cap,
            ..ArenaConfig::default()
        };
        let err = check(&cfg, 4 * G, &names()).expect_err("refused");
        assert!(err.to_string().contains(says), "{err}");
    }

    #[rstest]
    #[case(64 * M, None)]
    #[case(3 * G, None)]
    #[case(4 * G - 64 * M, Some(4 * G))]
    fn values_it_honours_pass(#[case] initial: u64, #[case] cap: Option<u64>) {
        let cfg = ArenaConfig {
            initial_bytes: initial,
            cap_bytes: cap,
            ..ArenaConfig::default()
        };
        check(&cfg, 4 * G, &names()).expect("honoured");
    }

    #[test]
    fn an_environment_value_is_named_by_its_variable() {
        let cfg = ArenaConfig::default()
            .with_vars([("ZMEM_ARENA_BYTES".to_string(), "4K".to_string())])
            .expect("parses");
        let err = check(&cfg, 4 * G, &Sources::new(&cfg, [false; 4])).expect_err("refused");
        assert!(err.to_string().starts_with("ZMEM_ARENA_BYTES"), "{err}");
    }
}
