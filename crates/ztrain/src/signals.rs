//! SIGINT and SIGTERM: the first one asks the run to stop after the current step (write the
//! checkpoint if one was asked for, print the summary, exit 128 + the signal: 130 or 143); a
//! second one exits at once with that status. Built on `signal-hook`'s `flag` functions, whose
//! handlers only store to atomics, so ztrain itself has no `unsafe`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub use signal_hook::consts::{SIGINT, SIGTERM};

/// Whether a stop was asked for, and by which signal.
#[derive(Clone, Debug, Default)]
pub struct StopSignal {
    which: Arc<AtomicUsize>,
}

impl StopSignal {
    /// A stop nobody can ask for (library callers, tests).
    #[must_use]
    pub fn never() -> StopSignal {
        StopSignal::default()
    }

    /// Installs the handlers for SIGINT and SIGTERM.
    pub fn install() -> std::io::Result<StopSignal> {
        let stop = StopSignal::default();
        let asked = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            // Registered first, so it sees the flag as the earlier signal left it: set means
            // this is the second signal, and the process exits at once.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&asked))?;
            signal_hook::flag::register(sig, Arc::clone(&asked))?;
            signal_hook::flag::register_usize(sig, Arc::clone(&stop.which), sig as usize)?;
        }
        Ok(stop)
    }

    /// Asks for a stop as `signal` would (tests).
    pub fn raise(&self, signal: i32) {
        self.which.store(signal as usize, Ordering::SeqCst);
    }

    /// The signal that asked for a stop, if one did.
    #[must_use]
    pub fn received(&self) -> Option<i32> {
        match self.which.load(Ordering::SeqCst) {
            0 => None,
            s => i32::try_from(s).ok(),
        }
    }
}

/// `SIGINT` / `SIGTERM` / `signal N`.
#[must_use]
pub fn name(signal: i32) -> String {
    match signal {
        SIGINT => "SIGINT".into(),
        SIGTERM => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}
