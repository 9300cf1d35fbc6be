//! The run's output lines. Printing is never a reason to stop training: when standard output
//! is closed (`ztrain … | head -3`), the first failed write is logged
//! (`ztrain.console.closed`) and the run goes on silently, checkpoints included.

use std::io::Write;

/// Where progress lines go, and the program's name that starts its own lines
/// (`ztrain: resumed from ...`; a user's binary's name in its, `FitModel::program`).
pub struct Console<'a> {
    out: &'a mut dyn Write,
    program: String,
    closed: bool,
}

impl std::fmt::Debug for Console<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("program", &self.program)
            .field("closed", &self.closed)
            .finish()
    }
}

impl<'a> Console<'a> {
    /// Lines to `out`, the program's own (see [`Console::say`]) named `program`.
    #[must_use]
    pub fn new(out: &'a mut dyn Write, program: &str) -> Console<'a> {
        Console {
            out,
            program: program.to_string(),
            closed: false,
        }
    }

    /// The program's name, as its lines give it.
    #[must_use]
    pub fn program(&self) -> &str {
        &self.program
    }

    /// Prints `text` as the program's own line: `program: text`.
    pub fn say(&mut self, text: &str) {
        let line = format!("{}: {text}", self.program);
        self.line(&line);
    }

    /// Prints `text` and a newline (and flushes, so a reader sees each line when it happens).
    pub fn line(&mut self, text: &str) {
        if self.closed {
            return;
        }
        let written = writeln!(self.out, "{text}").and_then(|()| self.out.flush());
        if let Err(error) = written {
            self.closed = true;
            tracing::warn!(target: "ztrain.console.closed", %error, "standard output is closed; training goes on without printing");
        }
    }

    /// Whether a write has failed (nothing more is printed).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts `room` lines, then fails like a closed pipe.
    struct Pipe {
        room: usize,
        lines: Vec<u8>,
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.room == 0 {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            self.lines.extend_from_slice(buf);
            if buf.ends_with(b"\n") {
                self.room -= 1;
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_output_stops_printing_not_the_caller() {
        let mut pipe = Pipe {
            room: 1,
            lines: Vec::new(),
        };
        let mut c = Console::new(&mut pipe, "prog");
        c.say("one");
        assert!(!c.is_closed());
        c.line("two");
        c.line("three");
        assert!(c.is_closed());
        assert_eq!(pipe.lines, b"prog: one\n");
    }
}
