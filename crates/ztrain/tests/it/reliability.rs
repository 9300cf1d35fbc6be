//! Hostile use of the `ztrain` binary (issue 10): outputs that would destroy data, inputs that
//! would hang, sizes that would abort, signals, closed pipes, silently changed options, soak and
//! determinism. Each test runs the built command as a user would.

mod files;
mod hostile;
mod signals;
mod soak;
