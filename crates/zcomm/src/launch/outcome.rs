//! How a launch ended: each rank's end, the rank to blame, the exit code and the message.

use super::RANK_EXIT_BASE;

/// How one rank ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankEnd {
    /// Exited with this status code.
    Exited(i32),
    /// Ended by a signal (Unix) the launcher did not send.
    Signalled(Option<i32>),
    /// Still running when the grace after another rank's failure (or a stop) ran out: the
    /// launcher killed it. A rank that reports its own error in time never ends this way.
    TakenDown,
    /// Stopped (SIGSTOP, a debugger) while its peers gave up waiting for it: the rank that
    /// stalled the job. The launcher killed it.
    Stalled,
}

impl std::fmt::Display for RankEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankEnd::Exited(c) => write!(f, "exited with status {c}"),
            RankEnd::Signalled(Some(s)) => write!(f, "was killed by signal {s}"),
            RankEnd::Signalled(None) => write!(f, "was killed"),
            RankEnd::TakenDown => write!(f, "was killed by the launcher when the grace ran out"),
            RankEnd::Stalled => write!(
                f,
                "was stopped (SIGSTOP or a debugger) and answered no one, so its peers gave up; the launcher killed it"
            ),
        }
    }
}

/// The outcome of a launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launched {
    /// The first rank that failed and how, if one did.
    pub failed: Option<(usize, RankEnd)>,
    /// Whether the caller asked to stop (every rank was passed the signal, or taken down).
    pub stopped: bool,
    /// The signal the job stopped on: the one passed on from the launcher, or the one its
    /// ranks stopped on together (a signal sent to one rank).
    pub stopped_by: Option<i32>,
    /// How every rank ended, by rank.
    pub ends: Vec<Option<RankEnd>>,
}

impl Launched {
    /// 128 + the signal when the launcher was stopped by one (every time, whatever the ranks
    /// did meanwhile); else `RANK_EXIT_BASE + rank` for the first failed rank (1 past rank
    /// 99); else 128 + the signal every rank stopped on; else 0.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        let by_signal = |s: i32| u8::try_from(128 + s).unwrap_or(1);
        match (&self.failed, self.stopped, self.stopped_by) {
            (_, true, Some(s)) => by_signal(s),
            (_, true, None) => 1,
            (Some((r, _)), false, _) => u8::try_from(*r)
                .ok()
                .filter(|r| *r < 100)
                .map_or(1, |r| RANK_EXIT_BASE + r),
            (None, false, Some(s)) => by_signal(s),
            (None, false, None) => 0,
        }
    }

    /// A line saying what happened, for the user: the rank that failed first, then how each
    /// other rank ended (on its own with its error, or killed when the grace ran out).
    #[must_use]
    pub fn message(&self) -> String {
        match &self.failed {
            Some((r, end)) => {
                let others: Vec<String> = self
                    .ends
                    .iter()
                    .enumerate()
                    .filter(|(o, _)| o != r)
                    .map(|(o, e)| match e {
                        Some(e) => format!("rank {o} {e}"),
                        None => format!("rank {o} did not report how it ended"),
                    })
                    .collect();
                let mut line = format!(
                    "rank {r} of {} {end}; every other rank was taken down (exit code {})",
                    self.ends.len(),
                    self.exit_code()
                );
                if !others.is_empty() {
                    line += &format!(": {}", others.join(", "));
                }
                line
            }
            None => match (self.stopped, self.stopped_by) {
                (true, Some(s)) => format!(
                    "stopped by {}: passed on to every rank; {}",
                    signal_name(s),
                    self.ends_line()
                ),
                (true, None) => "stopped: every rank was taken down".into(),
                (false, Some(s)) => format!(
                    "stopped by {} sent to a rank (rank 0's output names it): every rank stopped after the same step; {}",
                    signal_name(s),
                    self.ends_line()
                ),
                (false, None) => format!("all {} ranks finished", self.ends.len()),
            },
        }
    }

    fn ends_line(&self) -> String {
        let ends: Vec<String> = self
            .ends
            .iter()
            .enumerate()
            .map(|(r, e)| match e {
                Some(e) => format!("rank {r} {e}"),
                None => format!("rank {r} did not report how it ended"),
            })
            .collect();
        ends.join(", ")
    }
}

/// `SIGINT`, `SIGTERM`, or `signal N`.
#[must_use]
pub fn signal_name(s: i32) -> String {
    match s {
        2 => "SIGINT".into(),
        15 => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}

/// The signal a rank stopped on, if its end says it stopped on SIGINT/SIGTERM (exited 130
/// or 143 after finishing its step, or ended by the signal before it could handle it).
#[must_use]
pub fn stop_signal_of(end: &RankEnd) -> Option<i32> {
    match end {
        RankEnd::Exited(c @ (130 | 143)) => Some(c - 128),
        RankEnd::Signalled(Some(s @ (2 | 15))) => Some(*s),
        _ => None,
    }
}
