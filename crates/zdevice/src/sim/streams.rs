//! Streams as FIFO queues of operations with completion times, events as markers in them, and
//! the calls that create, order, query and synchronise them.
//!
//! Queued work does not run when it is enqueued. It runs when something observes it: a
//! synchronisation (which first advances the clock to the work's completion time), a query that
//! finds its time has come, or a wait on an event recorded behind it. Nothing else drains a
//! non-blocking stream, so a test that forgets to synchronise reads stale data, as on a GPU.

use std::collections::VecDeque;
use std::time::Duration;

use super::access::KernelFault;
use super::capture::{Ask, Gate, Joined};
use super::oplog::Effect;
use super::ops::Op;
use super::state::{Cx, LEGACY, State};
use crate::driver::{CuCode, DriverResult};
use crate::types::{Event, PriorityRange, Readiness, Stream, StreamKind};

#[derive(Debug)]
pub(crate) struct Queued {
    pub seq: u64,
    pub ready_at: Duration,
    pub op: Op,
    /// Held by the fault plan ([`crate::FaultAction::Hang`]) until its hangs are released.
    pub hung: bool,
}

/// The simulated device's stream priorities (`cuCtxGetStreamPriorityRange`): 0, CUDA's
/// default, down to -5.
pub(crate) const SIM_PRIORITY_RANGE: PriorityRange = PriorityRange {
    least: 0,
    greatest: -5,
};

#[derive(Debug)]
pub(crate) struct StreamState {
    pub kind: StreamKind,
    /// Its priority, within [`SIM_PRIORITY_RANGE`] (the least unless made with one).
    pub priority: i32,
    pub queue: VecDeque<Queued>,
    /// When the last queued operation completes.
    pub busy_until: Duration,
}

impl StreamState {
    pub(crate) fn new(kind: StreamKind) -> Self {
        StreamState {
            kind,
            priority: SIM_PRIORITY_RANGE.least,
            queue: VecDeque::new(),
            busy_until: Duration::ZERO,
        }
    }
}

/// Where an event's latest record stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    Never,
    /// Queued as operation `seq` on `stream`, completing at `ready_at`.
    Pending {
        stream: Stream,
        seq: u64,
        ready_at: Duration,
    },
    Done {
        seq: u64,
        at: Duration,
    },
    /// Last recorded into a capture (a graph node), not on any stream.
    InCapture,
}

#[derive(Debug)]
pub(crate) struct EventState {
    pub timing: bool,
    pub rec: Recorded,
}

/// How far to drain a stream.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Upto {
    All,
    Seq(u64),
    Time(Duration),
}

impl State {
    pub(crate) fn stream_exists(&self, cx: &Cx, s: Stream) -> DriverResult<()> {
        if self.streams.contains_key(&s.0) {
            Ok(())
        } else {
            Err(cx.cuda(CuCode::INVALID_HANDLE))
        }
    }

    /// Queues `op` on `stream`, to start no earlier than `after` and when the stream is free.
    pub(crate) fn enqueue_after(
        &mut self,
        cx: &mut Cx,
        stream: Stream,
        op: Op,
        after: Duration,
    ) -> DriverResult<u64> {
        let duration = op.duration(&self.cfg).saturating_add(cx.take_stall());
        let seq = self.next_seq;
        let s = self
            .streams
            .get_mut(&stream.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
        let ready_at = self
            .now
            .max(s.busy_until)
            .max(after)
            .saturating_add(duration);
        s.busy_until = ready_at;
        s.queue.push_back(Queued {
            seq,
            ready_at,
            op,
            hung: std::mem::take(&mut cx.hang),
        });
        self.next_seq += 1;
        cx.effect = Effect::Enqueued;
        Ok(seq)
    }

    pub(crate) fn enqueue(&mut self, cx: &mut Cx, stream: Stream, op: Op) -> DriverResult<u64> {
        self.enqueue_after(cx, stream, op, Duration::ZERO)
    }

    /// Runs queued operations of `stream` in order, as far as `upto` says. Stops at an
    /// operation that cannot complete yet (a kernel waiting on the device, a wait for such a
    /// stream), which stays at the front.
    pub(crate) fn drain(&mut self, stream: Stream, upto: Upto) {
        loop {
            let Some(s) = self.streams.get_mut(&stream.0) else {
                return;
            };
            let Some(front) = s.queue.front() else { return };
            let go = match upto {
                Upto::All => true,
                Upto::Seq(q) => front.seq <= q,
                Upto::Time(t) => front.ready_at <= t,
            };
            if !go {
                return;
            }
            let Some(item) = s.queue.pop_front() else {
                return;
            };
            if let Some(item) = self.execute(item) {
                if let Some(s) = self.streams.get_mut(&stream.0) {
                    s.queue.push_front(item);
                }
                return;
            }
        }
    }

    /// Whether `stream` holds an operation due by now that could not complete (a kernel
    /// waiting on the device, or a wait behind one): a synchronize would never return.
    pub(crate) fn stuck(&self, stream: Stream) -> bool {
        self.streams
            .get(&stream.0)
            .and_then(|s| s.queue.front())
            .is_some_and(|front| front.ready_at <= self.now)
    }

    /// A synchronize's answer for a stream that cannot drain: on a GPU the call never returns;
    /// the simulator answers `CUDA_ERROR_NOT_READY` (600) instead (the device's own waits
    /// poll with deadlines and never make this call on such a stream).
    pub(crate) fn refuse_stuck(&self, cx: &Cx, streams: &[Stream]) -> DriverResult<()> {
        if streams.iter().any(|&s| self.stuck(s)) {
            return Err(cx.cuda(CuCode::NOT_READY));
        }
        Ok(())
    }

    /// Whether a launch onto `stream` finds room in its queue ([`SimConfig::launch_queue_depth`]
    /// operations not yet run): while the queue is full the host waits for the device, so the
    /// clock moves to the end of the oldest operation and it runs; false when that operation
    /// cannot complete (a kernel waiting on the device, a wait behind one, an operation the
    /// fault plan holds): the launch blocks. A stream that captures queues nothing.
    ///
    /// [`SimConfig::launch_queue_depth`]: super::SimConfig::launch_queue_depth
    pub(crate) fn launch_room(&mut self, stream: Stream) -> bool {
        if self.capture.as_ref().is_some_and(|c| c.holds(stream)) {
            return true;
        }
        let depth = self.cfg.launch_queue_depth.max(1);
        loop {
            let Some(s) = self.streams.get(&stream.0) else {
                return true;
            };
            let held = s.queue.len();
            let Some(front) = s.queue.front() else {
                return true;
            };
            if held < depth {
                return true;
            }
            self.now = self.now.max(front.ready_at);
            self.drain(stream, Upto::Time(self.now));
            let left = self.streams.get(&stream.0).map_or(0, |s| s.queue.len());
            if left >= held {
                return false;
            }
        }
    }

    /// Lets every operation held by [`crate::FaultAction::Hang`] complete.
    pub(crate) fn release_hangs(&mut self) {
        for s in self.streams.values_mut() {
            for q in &mut s.queue {
                q.hung = false;
            }
        }
    }

    /// Drains every stream completely, in handle order (deterministic).
    pub(crate) fn drain_everything(&mut self) {
        let mut ids: Vec<u64> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.drain(Stream(id), Upto::All);
        }
    }

    /// Advances the clock to the end of every blocking stream's work and drains them: what the
    /// legacy stream's implicit ordering does for a synchronous copy or memset.
    pub(crate) fn drain_blocking(&mut self) {
        let mut ids: Vec<u64> = self
            .streams
            .iter()
            .filter(|(_, s)| s.kind == StreamKind::Blocking)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(s) = self.streams.get(&id) {
                self.now = self.now.max(s.busy_until);
            }
            self.drain(Stream(id), Upto::All);
        }
    }

    /// Runs one operation; hands it back when it could not complete (see [`Self::drain`]).
    fn execute(&mut self, item: Queued) -> Option<Queued> {
        if item.hung {
            return Some(item);
        }
        match &item.op {
            // Waits reference strictly earlier operations, so this recursion ends.
            Op::Wait { stream, seq } => {
                let (stream, seq) = (*stream, *seq);
                self.drain(stream, Upto::Seq(seq));
                let behind = self
                    .streams
                    .get(&stream.0)
                    .and_then(|s| s.queue.front())
                    .is_some_and(|front| front.seq <= seq);
                if behind {
                    return Some(item);
                }
            }
            Op::EventRecord { event } => {
                if let Some(e) = self.events.get_mut(&event.0)
                    && matches!(e.rec, Recorded::Pending { seq, .. } if seq == item.seq)
                {
                    e.rec = Recorded::Done {
                        seq: item.seq,
                        at: item.ready_at,
                    };
                }
            }
            Op::Free { ptr } => self.release_device(*ptr),
            Op::AllocNode { ptr } | Op::FreeNode { ptr } => {
                if let Some((base, _)) = self.mem.find_base(*ptr) {
                    self.mem.poison_alloc(base);
                }
            }
            op if self.faulted() => tracing::debug!(?op, "skipped: the context has faulted"),
            op => match op.run_data(&mut self.mem, self.cfg.accounting_only) {
                Some(Err(KernelFault::Waiting(why))) => {
                    tracing::debug!(%why, ?op, "simulated kernel waiting on the device");
                    return Some(item);
                }
                Some(Err(fault)) => {
                    tracing::warn!(%fault, ?op, "simulated illegal address");
                    if self.pending.is_none_or(|c| !c.is_sticky()) {
                        self.pending = Some(CuCode::ILLEGAL_ADDRESS);
                    }
                }
                _ => {}
            },
        }
        None
    }

    // --- stream calls -------------------------------------------------------------------------

    pub(crate) fn stream_create(&mut self, cx: &mut Cx, kind: StreamKind) -> DriverResult<Stream> {
        self.gate(cx, Ask::none())?;
        let id = self.handle();
        self.streams.insert(id, StreamState::new(kind));
        Ok(Stream(id))
    }

    /// As the real driver: a priority outside [`SIM_PRIORITY_RANGE`] is clamped into it.
    pub(crate) fn stream_create_with_priority(
        &mut self,
        cx: &mut Cx,
        kind: StreamKind,
        priority: i32,
    ) -> DriverResult<Stream> {
        let s = self.stream_create(cx, kind)?;
        let r = SIM_PRIORITY_RANGE;
        if let Some(st) = self.streams.get_mut(&s.0) {
            st.priority = priority.clamp(r.greatest, r.least);
        }
        Ok(s)
    }

    /// The real call returns at once and lets queued work finish; the simulator runs it now so
    /// events recorded there still complete.
    pub(crate) fn stream_destroy(&mut self, cx: &mut Cx, s: Stream) -> DriverResult<()> {
        self.gate(cx, Ask::on(s))?;
        if s == LEGACY {
            return Err(cx.cuda(CuCode::INVALID_HANDLE));
        }
        self.stream_exists(cx, s)?;
        self.drain(s, Upto::All);
        self.streams.remove(&s.0);
        Ok(())
    }

    pub(crate) fn stream_query(&mut self, cx: &mut Cx, s: Stream) -> DriverResult<Readiness> {
        self.gate(cx, Ask::on(s))?;
        self.stream_exists(cx, s)?;
        self.drain(s, Upto::Time(self.now));
        self.surface(cx)?;
        let idle = self.streams.get(&s.0).is_none_or(|st| st.queue.is_empty());
        Ok(if idle {
            Readiness::Ready
        } else {
            Readiness::NotReady
        })
    }

    pub(crate) fn stream_synchronize(&mut self, cx: &mut Cx, s: Stream) -> DriverResult<()> {
        self.gate(cx, Ask::on(s))?;
        let busy = self
            .streams
            .get(&s.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?
            .busy_until;
        self.now = self.now.max(busy).saturating_add(cx.take_stall());
        self.drain(s, Upto::All);
        self.refuse_stuck(cx, &[s])?;
        self.surface(cx)
    }

    pub(crate) fn ctx_synchronize(&mut self, cx: &mut Cx) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        let busy = self
            .streams
            .values()
            .map(|s| s.busy_until)
            .max()
            .unwrap_or_default();
        self.now = self.now.max(busy).saturating_add(cx.take_stall());
        self.drain_everything();
        let all: Vec<Stream> = self.streams.keys().map(|&id| Stream(id)).collect();
        self.refuse_stuck(cx, &all)?;
        self.surface(cx)
    }

    /// Waiting on an event never recorded, or already complete, is a no-op (CUDA semantics).
    pub(crate) fn stream_wait_event(
        &mut self,
        cx: &mut Cx,
        s: Stream,
        e: Event,
    ) -> DriverResult<()> {
        let status = self.event_status_for_capture(e);
        let ask = Ask {
            event: status,
            ..Ask::on(s)
        };
        match self.gate(cx, ask)? {
            Gate::Join => return self.join_capture(cx, s),
            Gate::Capture => {
                self.capture_wait(s, e);
                return Ok(());
            }
            Gate::Run | Gate::Silent => {}
        }
        self.stream_exists(cx, s)?;
        let rec = self
            .events
            .get(&e.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?
            .rec;
        if let Recorded::Pending {
            stream,
            seq,
            ready_at,
        } = rec
        {
            self.enqueue_after(cx, s, Op::Wait { stream, seq }, ready_at)?;
        }
        Ok(())
    }

    // --- event calls --------------------------------------------------------------------------

    pub(crate) fn event_create(&mut self, cx: &mut Cx, timing: bool) -> DriverResult<Event> {
        self.gate(cx, Ask::none())?;
        let id = self.handle();
        self.events.insert(
            id,
            EventState {
                timing,
                rec: Recorded::Never,
            },
        );
        Ok(Event(id))
    }

    pub(crate) fn event_destroy(&mut self, cx: &mut Cx, e: Event) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        self.events
            .remove(&e.0)
            .map(|_| ())
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))
    }

    pub(crate) fn event_record(&mut self, cx: &mut Cx, e: Event, s: Stream) -> DriverResult<()> {
        if !self.events.contains_key(&e.0) {
            return Err(cx.cuda(CuCode::INVALID_HANDLE));
        }
        if self.gate(cx, Ask::on(s))? == Gate::Capture {
            self.capture_nodes(cx, vec![Op::EventRecord { event: e }]);
            if let Some(ev) = self.events.get_mut(&e.0) {
                ev.rec = Recorded::InCapture;
            }
            self.mark_in_capture(e, s);
            return Ok(());
        }
        let seq = self.enqueue(cx, s, Op::EventRecord { event: e })?;
        self.mark_recorded(e, s, seq);
        Ok(())
    }

    /// A stream outside the capture waited on an event recorded inside it: the stream joins
    /// the capture (fork), owing a join back for that wait.
    fn join_capture(&mut self, cx: &mut Cx, s: Stream) -> DriverResult<()> {
        self.stream_exists(cx, s)?;
        if let Some(c) = self.capture.as_mut() {
            c.joined.push(Joined {
                stream: s,
                work: 1,
                rejoined: 0,
            });
            cx.effect = Effect::Captured(0);
        }
        Ok(())
    }

    /// A stream in the capture waited on an event recorded inside it: a dependency (no node).
    /// The capturing stream waiting on an event recorded on a joined stream joins that stream
    /// back up to the record.
    fn capture_wait(&mut self, s: Stream, e: Event) {
        let Some(c) = self.capture.as_mut() else {
            return;
        };
        if s != c.stream {
            return;
        }
        let mark = c.marks.iter().rev().find(|(ev, _, _)| *ev == e.0).copied();
        if let Some((_, from, upto)) = mark
            && let Some(j) = c.joined.iter_mut().find(|j| j.stream == from)
        {
            j.rejoined = j.rejoined.max(upto);
        }
    }

    /// Remembers where an event recorded inside the capture on a joined stream stands in that
    /// stream's captured work.
    fn mark_in_capture(&mut self, e: Event, s: Stream) {
        let Some(c) = self.capture.as_mut() else {
            return;
        };
        if let Some(j) = c.joined.iter().find(|j| j.stream == s) {
            let work = j.work;
            c.marks.push((e.0, s, work));
        }
    }

    /// Points the event at the record operation `seq` just queued on `s`.
    pub(crate) fn mark_recorded(&mut self, e: Event, s: Stream, seq: u64) {
        let ready_at = self
            .streams
            .get(&s.0)
            .map(|st| st.busy_until)
            .unwrap_or(self.now);
        if let Some(ev) = self.events.get_mut(&e.0) {
            ev.rec = Recorded::Pending {
                stream: s,
                seq,
                ready_at,
            };
        }
    }

    /// Completes the event's record if its time has come; returns its completion time if done.
    fn settle(&mut self, e: Event) -> Option<Duration> {
        match self.events.get(&e.0)?.rec {
            Recorded::Done { at, .. } => Some(at),
            Recorded::Pending {
                stream,
                seq,
                ready_at,
            } if ready_at <= self.now => {
                self.drain(stream, Upto::Seq(seq));
                match self.events.get(&e.0)?.rec {
                    Recorded::Done { at, .. } => Some(at),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    pub(crate) fn event_status_for_capture(&self, e: Event) -> super::capture::EventStatus {
        use super::capture::EventStatus;
        let begin = self.capture.as_ref().map_or(u64::MAX, |c| c.begin_seq);
        match self.events.get(&e.0).map(|ev| ev.rec) {
            None | Some(Recorded::Never) => EventStatus::NeverRecorded,
            Some(Recorded::InCapture) => EventStatus::InCapture,
            Some(Recorded::Pending { seq, .. } | Recorded::Done { seq, .. }) if seq < begin => {
                EventStatus::BeforeCapture
            }
            Some(_) => EventStatus::InCapture,
        }
    }

    pub(crate) fn event_query(&mut self, cx: &mut Cx, e: Event) -> DriverResult<Readiness> {
        let status = self.event_status_for_capture(e);
        self.gate(cx, Ask::event(status))?;
        let rec = self
            .events
            .get(&e.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?
            .rec;
        let done = match rec {
            Recorded::Never | Recorded::InCapture => true,
            _ => self.settle(e).is_some(),
        };
        self.surface(cx)?;
        Ok(if done {
            Readiness::Ready
        } else {
            Readiness::NotReady
        })
    }

    pub(crate) fn event_synchronize(&mut self, cx: &mut Cx, e: Event) -> DriverResult<()> {
        let status = self.event_status_for_capture(e);
        self.gate(cx, Ask::event(status))?;
        let rec = self
            .events
            .get(&e.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?
            .rec;
        if let Recorded::Pending { ready_at, .. } = rec {
            self.now = self.now.max(ready_at);
        }
        self.now = self.now.saturating_add(cx.take_stall());
        let done = matches!(rec, Recorded::Never | Recorded::InCapture) || self.settle(e).is_some();
        if !done {
            return Err(cx.cuda(CuCode::NOT_READY));
        }
        self.surface(cx)
    }

    pub(crate) fn event_elapsed_ms(
        &mut self,
        cx: &mut Cx,
        start: Event,
        end: Event,
    ) -> DriverResult<f32> {
        self.gate(cx, Ask::none())?;
        for e in [start, end] {
            let ev = self
                .events
                .get(&e.0)
                .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?;
            if !ev.timing || matches!(ev.rec, Recorded::Never | Recorded::InCapture) {
                return Err(cx.cuda(CuCode::INVALID_HANDLE));
            }
        }
        let (Some(t0), Some(t1)) = (self.settle(start), self.settle(end)) else {
            return Err(cx.cuda(CuCode::NOT_READY));
        };
        let ms = (t1.as_secs_f64() - t0.as_secs_f64()) * 1e3;
        Ok(ms as f32)
    }
}
