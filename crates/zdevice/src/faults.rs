//! The fault plan: scripted failures, stalls and sticky errors keyed by CUDA function name.
//!
//! Shared by the two drivers that inject faults: the simulated driver ([`SimDriver`]) and the
//! wrapper over any driver ([`FaultyDriver`]), so one plan reads the same on both.
//!
//! Calls are counted per name from the moment the driver is created; a rule registered "for the
//! Nth call" targets the Nth call of that name after registration (1 = the next one).
//!
//! [`SimDriver`]: crate::SimDriver
//! [`FaultyDriver`]: crate::faulty::FaultyDriver

use std::collections::HashMap;
use std::time::Duration;

use crate::driver::CuCode;

/// What happens to the targeted call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// The call fails with this code and has no effect.
    Fail(CuCode),
    /// The call takes this much extra virtual time (a synchronous call advances the clock before
    /// returning; an asynchronous one keeps its stream busy that much longer).
    Stall(Duration),
    /// The call fails with this code and every later call fails the same way (as after a real
    /// sticky error such as 700).
    Sticky(CuCode),
    /// The call itself succeeds, and the next synchronising call (stream or event synchronize
    /// or query, context synchronize) fails with this code, as an error of asynchronous work
    /// queued earlier does; a sticky code then stays for every later call.
    FailAtNextSync(CuCode),
    /// The call's work never completes until the plan's hangs are released: what a GPU does
    /// when a kernel waits on the device for a peer that stopped. An asynchronous call's stream
    /// never drains (its queries answer `NotReady`; events recorded behind it never complete;
    /// a synchronize of it answers `CUDA_ERROR_NOT_READY`, where a GPU's would never return);
    /// a synchronous call does not return (the calling thread blocks) until released, as an
    /// `ncclCommAbort` behind such a kernel: the code must make it from a thread that can be
    /// left behind, with a deadline.
    Hang,
}

impl FaultAction {
    /// A short name for tables: `fail 2`, `sticky 700`, `stall 2s`, `fail at next sync 719`.
    #[must_use]
    pub fn label(&self) -> String {
        match self {
            FaultAction::Fail(c) => format!("fail {}", c.0),
            FaultAction::Stall(d) => format!("stall {d:?}"),
            FaultAction::Sticky(c) => format!("sticky {}", c.0),
            FaultAction::FailAtNextSync(c) => format!("fail at next sync {}", c.0),
            FaultAction::Hang => "hang".into(),
        }
    }
}

#[derive(Clone, Debug)]
struct Rule {
    call: &'static str,
    at: u64,
    action: FaultAction,
}

/// Per-name call counters and the pending rules.
#[derive(Debug, Default)]
pub(crate) struct FaultPlan {
    counts: HashMap<&'static str, u64>,
    rules: Vec<Rule>,
}

impl FaultPlan {
    /// Schedules `action` for the `n`th next call of `call` (`n` = 0 is taken as 1).
    pub(crate) fn add(&mut self, call: &'static str, n: u64, action: FaultAction) {
        let done = self.counts.get(call).copied().unwrap_or(0);
        self.rules.push(Rule {
            call,
            at: done.saturating_add(n.max(1)),
            action,
        });
    }

    /// Counts one call of `call` and returns the action scheduled for it, if any. A rule fires
    /// once and is removed; when several target the same call, the first registered wins.
    pub(crate) fn on_call(&mut self, call: &'static str) -> Option<FaultAction> {
        let count = self.counts.entry(call).or_insert(0);
        *count = count.saturating_add(1);
        let now = *count;
        let i = self
            .rules
            .iter()
            .position(|r| r.call == call && r.at == now)?;
        Some(self.rules.remove(i).action)
    }

    /// Drops every pending rule (counters are kept).
    pub(crate) fn clear(&mut self) {
        self.rules.clear();
    }

    /// How many times `call` has been made.
    pub(crate) fn count(&self, call: &str) -> u64 {
        self.counts.get(call).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_call_fires_once() {
        let mut plan = FaultPlan::default();
        assert_eq!(plan.on_call("a"), None);
        plan.add("a", 2, FaultAction::Fail(CuCode(2)));
        assert_eq!(plan.on_call("a"), None);
        assert_eq!(plan.on_call("b"), None);
        assert_eq!(plan.on_call("a"), Some(FaultAction::Fail(CuCode(2))));
        assert_eq!(plan.on_call("a"), None);
        assert_eq!(plan.count("a"), 4);
    }
}
