//! Socket reads and writes bounded by a deadline, and (for the waits of a rendezvous) by a
//! stop request polled every [`POLL`].

use super::Cancel;
use super::stream::Stream;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// How often a long wait looks at its stop request.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// Time left before `deadline`, None once it passed.
pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

pub(crate) fn timed_out() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline passed")
}

/// The error a cancelled wait returns (told apart by [`is_cancelled`]).
fn cancelled() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::Interrupted, CANCELLED)
}

const CANCELLED: &str = "a stop was asked for";

/// Whether `e` is the error of a wait its stop request ended.
pub(crate) fn is_cancelled(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Interrupted && e.to_string() == CANCELLED
}

/// `read_exact` with every read bounded by `deadline`.
pub(crate) fn read_exact(s: &mut Stream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    read_exact_until(s, buf, deadline, None)
}

/// `read_exact` bounded by `deadline`, giving up within [`POLL`] once `cancel` says so.
pub(crate) fn read_exact_until(
    s: &mut Stream,
    buf: &mut [u8],
    deadline: Instant,
    cancel: Option<&Cancel>,
) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        let left = remaining(deadline).ok_or_else(timed_out)?;
        let slice = if cancel.is_some() {
            left.min(POLL)
        } else {
            left
        };
        s.set_read_timeout(Some(slice))?;
        match s.read(&mut buf[at..]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the connection was closed",
                ));
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if cancel.is_some_and(|c| c()) {
                    return Err(cancelled());
                }
                if remaining(deadline).is_none() {
                    return Err(timed_out());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `write_all` with every write bounded by `deadline`.
pub(crate) fn write_all(s: &mut Stream, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        s.set_write_timeout(Some(remaining(deadline).ok_or_else(timed_out)?))?;
        match s.write(&buf[at..]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "peer gone",
                ));
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timed_out());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
