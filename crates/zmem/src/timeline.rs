//! The timeline: a bounded ring of recent events, per-step aggregates covering the whole run in
//! bounded memory (folded into step ranges as the run grows), and JSON export (written by hand: the format is small and fixed, no serde needed).

mod ring;
mod steps;

pub use steps::{STEP_RECORDS_MAX, StepRecord};

use std::fmt::Write as _;
use std::time::Duration;

use crate::block::Source;
use crate::class::{AllocClass, ClassBytes};

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A block was issued.
    Alloc {
        /// Its class.
        class: AllocClass,
        /// Aligned size.
        bytes: u64,
        /// Address.
        ptr: u64,
        /// Where the memory came from.
        source: Source,
    },
    /// A held, overflow or reservation block's memory was given back.
    Free {
        /// Its class.
        class: AllocClass,
        /// Size.
        bytes: u64,
        /// Address.
        ptr: u64,
        /// Where the memory goes back to.
        source: Source,
    },
    /// A step began.
    StepStart,
    /// A step ended.
    StepEnd {
        /// Scratch blocks kept because a handle still refers to them.
        kept_blocks: usize,
        /// Whether the reclaim was deferred because a capture was active.
        deferred: bool,
    },
    /// Scratch memory was reclaimed.
    Reset {
        /// Bytes made reusable.
        reclaimed_bytes: u64,
        /// What drove it (`Step::end at file:line`, ...).
        cause: String,
    },
    /// A request went to the overflow pool.
    Overflow {
        /// Overflow bytes requested so far, in all.
        bytes: u64,
        /// Overflow bytes outstanding after it.
        outstanding: u64,
    },
    /// A capture reservation was made.
    Reserve {
        /// Its id.
        reservation: u64,
        /// Its size.
        bytes: u64,
    },
    /// Allocations began to come from a reservation.
    CaptureBegin {
        /// The reservation.
        reservation: u64,
    },
    /// Allocations stopped coming from a reservation.
    CaptureEnd {
        /// The reservation.
        reservation: u64,
        /// Bytes of it in use.
        used: u64,
    },
    /// The graph owning a reservation dropped it.
    GraphDrop {
        /// The reservation.
        reservation: u64,
    },
}

impl EventKind {
    /// Short name, as in the JSON `kind` field.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Alloc { .. } => "alloc",
            EventKind::Free { .. } => "free",
            EventKind::StepStart => "step_start",
            EventKind::StepEnd { .. } => "step_end",
            EventKind::Reset { .. } => "reset",
            EventKind::Overflow { .. } => "overflow",
            EventKind::Reserve { .. } => "reserve",
            EventKind::CaptureBegin { .. } => "capture_begin",
            EventKind::CaptureEnd { .. } => "capture_end",
            EventKind::GraphDrop { .. } => "graph_drop",
        }
    }
}

/// One timeline entry. Allocation and free events carry no timestamp, to keep the fast path
/// free of clock reads; the others carry the driver's clock (virtual on the simulated device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Sequence number over the arena's life.
    pub seq: u64,
    /// The step it happened in (0 before the first).
    pub step: u64,
    /// Driver time, for events off the fast path.
    pub at: Option<Duration>,
    /// What happened.
    pub kind: EventKind,
}

pub(crate) struct Timeline {
    ring: ring::Ring,
    steps: steps::StepLog,
    /// The open step's aggregates (or the last ended step's, until the next opens).
    pub(crate) current: StepRecord,
}

impl Timeline {
    pub(crate) fn new(capacity: usize) -> Timeline {
        Timeline {
            ring: ring::Ring::new(capacity),
            steps: steps::StepLog::new(STEP_RECORDS_MAX),
            current: StepRecord::default(),
        }
    }

    pub(crate) fn push(&mut self, at: Option<Duration>, kind: EventKind) -> Event {
        let ev = Event {
            seq: self.ring.recorded() + 1,
            step: self.current.step,
            at,
            kind,
        };
        self.record(ev.clone());
        ev
    }

    /// Records an event without handing a copy back (the allocation fast path: no clone).
    pub(crate) fn record(&mut self, ev: Event) {
        self.ring.record(ev);
    }

    /// Records `count` scratch allocations of the current step (the fast path's, at a fold);
    /// `event(i)` gives the `i`-th one's `(bytes, ptr)`.
    pub(crate) fn record_scratch_allocs(
        &mut self,
        count: u64,
        event: impl FnMut(u64) -> (u64, u64),
    ) {
        let step = self.current.step;
        self.ring.record_scratch_allocs(step, count, event);
    }

    /// The next sequence number and the step, for building an event to `record`.
    pub(crate) fn stamp(&self) -> (u64, u64) {
        (self.ring.recorded() + 1, self.current.step)
    }

    /// Updates the step's peak with the current bytes by class.
    pub(crate) fn observe(&mut self, held: &ClassBytes) {
        let total = held.total();
        if total > self.current.peak_bytes {
            self.current.peak_bytes = total;
            self.current.peak_by_class = *held;
        }
    }

    /// Files the current step's aggregates: its end was recorded.
    pub(crate) fn end_step(&mut self) {
        self.steps.push(self.current.of_one_step());
    }

    /// `step_open`: whether `current` is a step still running (an ended one is in `steps`).
    pub(crate) fn snapshot(&self, step_open: bool) -> TimelineSnapshot {
        let mut steps = self.steps.records().to_vec();
        if step_open {
            steps.push(self.current.of_one_step());
        }
        TimelineSnapshot {
            events: self.ring.events(),
            steps,
            dropped: self.ring.recorded() - self.ring.len() as u64,
        }
    }
}

/// A copy of the timeline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimelineSnapshot {
    /// The most recent events, oldest first.
    pub events: Vec<Event>,
    /// Aggregates covering every step, oldest first, the open step last: one record per step
    /// until a long run folds them into ranges (at most [`STEP_RECORDS_MAX`] records).
    pub steps: Vec<StepRecord>,
    /// Events that fell out of the ring.
    pub dropped: u64,
}

impl TimelineSnapshot {
    /// `{"dropped":N,"events":[...],"steps":[...]}`; a step record's `step` is the first step
    /// it covers and `last_step` the last.
    #[must_use]
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(64 + 96 * self.events.len() + 160 * self.steps.len());
        let _ = write!(s, "{{\"dropped\":{},\"events\":[", self.dropped);
        for (i, e) in self.events.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            event_json(&mut s, e);
        }
        s.push_str("],\"steps\":[");
        for (i, r) in self.steps.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(
                s,
                "{{\"step\":{},\"last_step\":{},\"peak_bytes\":{},\"peak_by_class\":{},\"peak_step\":{},\"allocations\":{},\"bytes\":{},\"resets\":{},\"overflow_calls\":{},\"overflow_bytes\":{},\"step_overflow_bytes_max\":{},\"kept_blocks\":{}}}",
                r.step,
                r.last_step,
                r.peak_bytes,
                class_json(&r.peak_by_class),
                r.peak_step,
                r.allocations,
                r.bytes,
                r.resets,
                r.overflow_calls,
                r.overflow_bytes,
                r.step_overflow_bytes_max,
                r.kept_blocks
            );
        }
        s.push_str("]}");
        s
    }
}

fn class_json(c: &ClassBytes) -> String {
    let parts: Vec<String> = AllocClass::ALL
        .iter()
        .map(|k| format!("\"{}\":{}", k.name(), c.get(*k)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// Escapes a string for JSON.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn event_json(s: &mut String, e: &Event) {
    let _ = write!(
        s,
        "{{\"seq\":{},\"step\":{},\"kind\":\"{}\"",
        e.seq,
        e.step,
        e.kind.name()
    );
    if let Some(at) = e.at {
        let _ = write!(s, ",\"at_ns\":{}", at.as_nanos());
    }
    let _ = match &e.kind {
        EventKind::Alloc {
            class,
            bytes,
            ptr,
            source,
        }
        | EventKind::Free {
            class,
            bytes,
            ptr,
            source,
        } => write!(
            s,
            ",\"class\":\"{}\",\"bytes\":{bytes},\"ptr\":{ptr},\"source\":\"{}\"",
            class.name(),
            source.name()
        ),
        EventKind::StepStart => Ok(()),
        EventKind::StepEnd {
            kept_blocks,
            deferred,
        } => {
            write!(s, ",\"kept_blocks\":{kept_blocks},\"deferred\":{deferred}")
        }
        EventKind::Reset {
            reclaimed_bytes,
            cause,
        } => {
            write!(
                s,
                ",\"reclaimed_bytes\":{reclaimed_bytes},\"cause\":\"{}\"",
                esc(cause)
            )
        }
        EventKind::Overflow { bytes, outstanding } => {
            write!(s, ",\"bytes\":{bytes},\"outstanding\":{outstanding}")
        }
        EventKind::Reserve { reservation, bytes } => {
            write!(s, ",\"reservation\":{reservation},\"bytes\":{bytes}")
        }
        EventKind::CaptureBegin { reservation } | EventKind::GraphDrop { reservation } => {
            write!(s, ",\"reservation\":{reservation}")
        }
        EventKind::CaptureEnd { reservation, used } => {
            write!(s, ",\"reservation\":{reservation},\"used\":{used}")
        }
    };
    s.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_bounded_and_counts_drops() {
        let mut t = Timeline::new(3);
        for _ in 0..5 {
            t.push(None, EventKind::StepStart);
        }
        let snap = t.snapshot(false);
        assert_eq!(snap.events.len(), 3);
        assert_eq!(snap.dropped, 2);
        assert_eq!(snap.events[0].seq, 3);
    }

    #[test]
    fn json_escapes_and_nests() {
        let mut t = Timeline::new(8);
        t.push(
            Some(Duration::from_nanos(5)),
            EventKind::Reset {
                reclaimed_bytes: 1,
                cause: "a \"quoted\"\npath".into(),
            },
        );
        let json = t.snapshot(false).to_json();
        assert!(
            json.contains(r#""cause":"a \"quoted\"\u000apath""#),
            "{json}"
        );
        assert!(
            json.starts_with("{\"dropped\":0,\"events\":[{\"seq\":1"),
            "{json}"
        );
        assert!(json.ends_with("\"steps\":[]}"), "{json}");
    }
}
