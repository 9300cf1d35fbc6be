//! Helpers: the simulated device, small arena configurations, captured tracing output.

use std::io::Write;
use std::sync::{Arc, Mutex};

use zdevice::{Device, DeviceConfig, MockDevice, SimConfig, SimDriver};
use zmem::ArenaConfig;

/// A check: `Err` says what did not hold.
pub type Check = Result<(), String>;

/// Fails with `msg` unless `cond`.
pub fn ensure(cond: bool, msg: impl Into<String>) -> Check {
    if cond { Ok(()) } else { Err(msg.into()) }
}

/// Formats any error.
pub fn s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A simulated device with `capacity` bytes (freed memory is not poisoned by the simulator,
/// so poison seen in tests is the arena's own).
pub fn mock(capacity: u64) -> MockDevice {
    let cfg = SimConfig {
        poison_on_free: false,
        ..SimConfig::with_capacity(capacity)
    };
    let driver = SimDriver::new(cfg);
    Device::open(
        driver,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens")
}

thread_local! {
    /// Whether `small` configures sanitizer mode on this thread (see `sanitized`).
    static SANITIZE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every `small` config of this thread in sanitizer mode (one driver allocation
/// per block), so that a scenario body runs unchanged in both modes.
pub fn sanitized<R>(on: bool, f: impl FnOnce() -> R) -> R {
    let before = SANITIZE.with(|c| c.replace(on));
    let r = f();
    SANITIZE.with(|c| c.set(before));
    r
}

/// A small arena: 256 KiB of scratch in 64 KiB segments, capped at `cap`, 1 MiB overflow
/// reserve, no poison; sanitizer mode inside `sanitized(true, ..)`.
pub fn small(cap: u64) -> ArenaConfig {
    ArenaConfig {
        initial_bytes: (256 << 10).min(cap),
        segment_bytes: 64 << 10,
        cap_bytes: Some(cap),
        overflow_reserve_bytes: 1 << 20,
        poison: false,
        timeline_events: 4096,
        sanitize: SANITIZE.with(std::cell::Cell::get),
        from_env: Vec::new(),
    }
}

thread_local! {
    /// Where this thread's tracing output goes while a `Logs::capture` runs.
    static SINK: std::cell::RefCell<Option<Arc<Mutex<Vec<u8>>>>> =
        const { std::cell::RefCell::new(None) };
}

/// One global subscriber writing to the calling thread's sink. A global one (rather than a
/// scoped `with_default` per test) keeps tracing's per-callsite interest cache consistent when
/// tests run in parallel threads.
fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let sub = tracing_subscriber::fmt()
            .with_writer(ThreadSink)
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        // Fails only if another global subscriber exists; then nothing is captured and the
        // log assertions say so.
        let _ = tracing::subscriber::set_global_default(sub);
    });
}

/// Tracing output captured for the duration of a closure on this thread.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Runs `f` with this thread's tracing output going here.
    pub fn capture<R>(&self, f: impl FnOnce() -> R) -> R {
        install();
        let previous = SINK.with(|s| s.replace(Some(Arc::clone(&self.0))));
        let r = f();
        SINK.with(|s| *s.borrow_mut() = previous);
        r
    }

    /// Everything written.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// Lines containing every one of `needles`.
    pub fn count(&self, needles: &[&str]) -> usize {
        self.text()
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .count()
    }
}

/// The writer half: appends to the calling thread's sink, if any.
pub struct ThreadSink;

impl Write for ThreadSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        SINK.with(|s| {
            if let Some(sink) = s.borrow().as_ref() {
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ThreadSink {
    type Writer = ThreadSink;
    fn make_writer(&'a self) -> ThreadSink {
        ThreadSink
    }
}
