//! Running one case in a fresh process: the test binary re-executes itself, filtered to one
//! test, with [`CHILD_CASE`] naming the case; the child prints its result on one line.

use std::process::Command;

use zdevice::Driver;

use super::case::{case, record};
use super::{CaseResult, Fault, MODES, Mode, Settings};
use crate::common::initial_parameters;

/// Names the one case a child process runs (`mode|call|fault`).
pub const CHILD_CASE: &str = "ZGPU_FAULT_CASE";

/// The single case a child process was asked for, from `spec` = `mode|call|fault`.
fn parse_case(
    spec: &str,
    calls: &[(&'static str, bool)],
) -> Option<(Mode, &'static str, bool, Fault)> {
    let mut parts = spec.split('|');
    let (m, c, f) = (parts.next()?, parts.next()?, parts.next()?);
    let mode = MODES.into_iter().find(|x| x.name == m)?;
    let (call, in_steps) = calls.iter().copied().find(|(x, _)| *x == c)?;
    let fault = Fault::ALL.into_iter().find(|x| x.header() == f)?;
    Some((mode, call, in_steps, fault))
}

/// The line a child prints its result on.
const CHILD_RESULT: &str = "FAULT-CASE-RESULT:";

/// `cell|broken` on one line, for a child process to hand its result back.
fn encode(r: &CaseResult) -> String {
    format!(
        "{}|{}|{}",
        r.outcome,
        r.after,
        r.broken.as_deref().unwrap_or("")
    )
}

fn decode(line: &str) -> Option<CaseResult> {
    let mut parts = line.splitn(3, '|');
    let (outcome, after, broken) = (parts.next()?, parts.next()?, parts.next()?);
    Some(CaseResult {
        outcome: outcome.to_string(),
        after: after.to_string(),
        broken: (!broken.is_empty()).then(|| broken.to_string()),
    })
}

/// In a child: the one case named by `spec`, printed on the result line.
pub fn run_child<D: Driver>(make: &dyn Fn() -> D, spec: &str, s: &Settings) {
    let params = initial_parameters(&s.size);
    let mode_name = spec.split('|').next().unwrap_or_default();
    let mode = MODES
        .into_iter()
        .find(|m| m.name == mode_name)
        .expect("the child's mode is known");
    let (calls, reference) = record(make, s, mode, &params);
    let (mode, call, in_steps, fault) =
        parse_case(spec, &calls.all()).expect("the child's case is one of the workload's calls");
    let result = case(make, s, mode, &params, &reference, call, in_steps, fault);
    println!("{CHILD_RESULT}{}", encode(&result));
}

/// Runs one case in a fresh process: this test binary again, filtered to `test` (which
/// must call [`run_child`] when [`CHILD_CASE`] is set).
pub fn in_child(test: &str, mode: Mode, call: &'static str, fault: Fault) -> CaseResult {
    let spec = format!("{}|{call}|{}", mode.name, fault.header());
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_CASE, &spec)
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => return CaseResult::broken(format!("{spec}: the child did not start: {e}")),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The harness may print "test <name> ... " on the same line first.
    let line = stdout
        .lines()
        .find_map(|l| l.split_once(CHILD_RESULT).map(|(_, rest)| rest));
    match (out.status.success(), line.and_then(decode)) {
        (true, Some(result)) => result,
        (_, _) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: String = stderr
                .chars()
                .rev()
                .take(600)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            CaseResult::broken(format!(
                "{spec}: the child exited {} without a result: {tail}",
                out.status
            ))
        }
    }
}
