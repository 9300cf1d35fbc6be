//! The whole matrix as a markdown table, with the known breakages other changes fix.

use std::fmt::Write as _;

use zdevice::Driver;

use super::case::{case, missing_driver_case, record};
use super::{CaseResult, Fault, MODES, Mode, Settings};
use crate::common::initial_parameters;

/// Broken promises the matrix finds that belong to other changes: (call, fault, why). The
/// matrix marks them `known` instead of failing, and fails once one of them stops happening
/// (then remove it here).
pub const KNOWN: &[(&str, Fault, &str)] = &[];

fn known(call: &str, fault: Fault) -> Option<usize> {
    KNOWN.iter().position(|(c, f, _)| *c == call && *f == fault)
}

/// Runs a whole matrix; returns the markdown table and the broken promises. `isolate` runs a
/// case elsewhere (a fresh process) when it returns `Some`; the sim passes one returning `None`.
pub fn matrix<D: Driver>(
    make: &dyn Fn() -> D,
    s: &Settings,
    isolate: &dyn Fn(Mode, &'static str, Fault) -> Option<CaseResult>,
) -> (String, Vec<String>) {
    let mut broken = Vec::new();
    let mut known_seen = vec![(false, false); KNOWN.len()];
    let params = initial_parameters(&s.size);
    let mut table = String::new();
    let missing = missing_driver_case(make, s, &params);
    let _ = writeln!(
        table,
        "Driver missing (every call fails to load): {}",
        missing.cell()
    );
    broken.extend(missing.broken);
    let mut cases = 1;
    for mode in MODES {
        let (calls, reference) = record(make, s, mode, &params);
        let _ = writeln!(table, "\n### {}\n", mode.name);
        let _ = write!(table, "| call |");
        for f in Fault::ALL {
            let _ = write!(table, " {} |", f.header());
        }
        let _ = writeln!(table, "\n|---|---|---|---|---|");
        for (call, in_steps) in calls.all() {
            let at = if in_steps { "" } else { " (setup)" };
            let _ = write!(table, "| `{call}`{at} |");
            for fault in Fault::ALL {
                let result = isolate(mode, call, fault).unwrap_or_else(|| {
                    case(make, s, mode, &params, &reference, call, in_steps, fault)
                });
                cases += 1;
                match (known(call, fault), result.broken.clone()) {
                    (Some(k), Some(why)) => {
                        known_seen[k] = (true, true);
                        let _ = why;
                        let _ = write!(table, " known (see below) |");
                    }
                    (k, broken_now) => {
                        if let Some(k) = k {
                            known_seen[k].0 = true;
                        }
                        let _ = write!(table, " {} |", result.cell());
                        broken.extend(broken_now);
                    }
                }
            }
            let _ = writeln!(table);
        }
    }
    for (k, (exercised, broke)) in known_seen.iter().enumerate() {
        let (call, fault, why) = KNOWN[k];
        if *broke {
            let _ = writeln!(table, "\n- known: `{call}` / {}: {why}", fault.header());
        } else if *exercised {
            broken.push(format!(
                "`{call}` / {} no longer breaks: remove it from KNOWN ({why})",
                fault.header()
            ));
        }
    }
    let _ = writeln!(table, "\n{cases} cases, {} broken.", broken.len());
    for b in &broken {
        let _ = writeln!(table, "- BROKEN: {b}");
    }
    (table, broken)
}
