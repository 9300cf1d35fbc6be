//! The event ring: the most recent events. Allocation and free events are stored inline as
//! plain `Copy` slots (the scratch fast path folds thousands of them per step, so recording
//! one must not allocate, move a whole `Event`, or read the slot it overwrites to drop it); the
//! others, a few per step, wait in a side queue that their slots point into. Sequence numbers
//! are not stored in slots: the ring holds consecutive ones, so a slot's position gives it.

use std::collections::VecDeque;

use crate::block::Source;
use crate::class::AllocClass;

use super::{Event, EventKind};

#[derive(Clone, Copy)]
enum Tag {
    Alloc(AllocClass, Source),
    Free(AllocClass, Source),
    /// The event is in `others`.
    Other,
}

#[derive(Clone, Copy)]
struct Slot {
    step: u64,
    bytes: u64,
    ptr: u64,
    tag: Tag,
}

/// A bounded ring of events, oldest overwritten first.
pub(crate) struct Ring {
    slots: Vec<Slot>,
    /// The oldest slot once the ring is full (0 until then).
    head: usize,
    capacity: usize,
    /// Events recorded so far (the newest one's sequence number).
    seq: u64,
    /// The events of `Other` slots with their sequence numbers, oldest first; those that fell
    /// out of the ring are dropped when the next one arrives.
    others: VecDeque<(u64, Event)>,
}

impl Ring {
    pub(crate) fn new(capacity: usize) -> Ring {
        Ring {
            slots: Vec::with_capacity(capacity.min(1 << 16)),
            head: 0,
            capacity,
            seq: 0,
            others: VecDeque::new(),
        }
    }

    #[inline]
    fn put(&mut self, slot: Slot) {
        self.seq += 1;
        if self.slots.len() < self.capacity {
            self.slots.push(slot);
        } else if self.capacity > 0 {
            // A plain store: `Slot` is `Copy`, nothing to drop.
            self.slots[self.head] = slot;
            self.head += 1;
            if self.head == self.capacity {
                self.head = 0;
            }
        }
    }

    /// The sequence number of the oldest event still in the ring.
    fn first_seq(&self) -> u64 {
        self.seq + 1 - self.slots.len() as u64
    }

    pub(crate) fn record(&mut self, ev: Event) {
        let (tag, bytes, ptr) = match ev.kind {
            EventKind::Alloc {
                class,
                bytes,
                ptr,
                source,
            } if ev.at.is_none() => (Tag::Alloc(class, source), bytes, ptr),
            EventKind::Free {
                class,
                bytes,
                ptr,
                source,
            } if ev.at.is_none() => (Tag::Free(class, source), bytes, ptr),
            _ => (Tag::Other, 0, 0),
        };
        let step = ev.step;
        if matches!(tag, Tag::Other) {
            if self.capacity == 0 {
                self.seq += 1;
                return;
            }
            let seq = self.seq + 1;
            self.others.push_back((seq, ev));
        }
        self.put(Slot {
            step,
            bytes,
            ptr,
            tag,
        });
        let first = self.first_seq();
        while self.others.front().is_some_and(|(seq, _)| *seq < first) {
            self.others.pop_front();
        }
    }

    /// Records `count` scratch allocations from the arena made in `step` (the fast path's
    /// events, at a fold), the `i`-th one's `(bytes, ptr)` given by `event(i)`. One pass with
    /// the ring's state in locals: thousands of these arrive at once.
    pub(crate) fn record_scratch_allocs(
        &mut self,
        step: u64,
        count: u64,
        mut event: impl FnMut(u64) -> (u64, u64),
    ) {
        let tag = Tag::Alloc(AllocClass::Scratch, Source::Arena);
        let slot = |(bytes, ptr)| Slot {
            step,
            bytes,
            ptr,
            tag,
        };
        self.seq += count;
        let mut i = 0;
        while i < count && self.slots.len() < self.capacity {
            self.slots.push(slot(event(i)));
            i += 1;
        }
        if i == count || self.capacity == 0 {
            return;
        }
        let (cap, mut head) = (self.capacity, self.head);
        let slots = &mut self.slots[..cap];
        for j in i..count {
            slots[head] = slot(event(j));
            head += 1;
            if head == cap {
                head = 0;
            }
        }
        self.head = head;
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Events recorded so far, including those that fell out.
    pub(crate) fn recorded(&self) -> u64 {
        self.seq
    }

    /// The events, oldest first.
    pub(crate) fn events(&self) -> Vec<Event> {
        let first = self.first_seq();
        let mut others = self.others.iter().skip_while(|(seq, _)| *seq < first);
        let (newer, older) = self.slots.split_at(self.head);
        older
            .iter()
            .chain(newer)
            .zip(first..)
            .filter_map(|(slot, seq)| {
                let (class, source, alloc) = match slot.tag {
                    Tag::Alloc(c, s) => (c, s, true),
                    Tag::Free(c, s) => (c, s, false),
                    Tag::Other => return others.next().map(|(_, ev)| Event { seq, ..ev.clone() }),
                };
                let (bytes, ptr) = (slot.bytes, slot.ptr);
                let kind = if alloc {
                    EventKind::Alloc {
                        class,
                        bytes,
                        ptr,
                        source,
                    }
                } else {
                    EventKind::Free {
                        class,
                        bytes,
                        ptr,
                        source,
                    }
                };
                Some(Event {
                    seq,
                    step: slot.step,
                    at: None,
                    kind,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other(step: u64) -> Event {
        Event {
            seq: 0,
            step,
            at: Some(std::time::Duration::from_nanos(step)),
            kind: EventKind::StepStart,
        }
    }

    /// Inline and boxed events interleave, wrap around several times, and come back in order
    /// with consecutive sequence numbers; boxed ones that fell out are forgotten.
    #[test]
    fn mixed_events_come_back_in_order_after_wrapping() {
        let mut ring = Ring::new(5);
        for i in 0..23u64 {
            if i % 3 == 0 {
                ring.record(other(i));
            } else {
                ring.record_scratch_allocs(i, 1, |_| (256 * i, 0x1000 + i));
            }
        }
        let events = ring.events();
        assert_eq!(ring.recorded(), 23);
        let got: Vec<(u64, u64, bool)> = events
            .iter()
            .map(|e| (e.seq, e.step, matches!(e.kind, EventKind::StepStart)))
            .collect();
        let want: Vec<(u64, u64, bool)> = (18..23u64).map(|i| (i + 1, i, i % 3 == 0)).collect();
        assert_eq!(got, want);
        assert!(
            ring.others.len() <= 2,
            "{} boxed events kept",
            ring.others.len()
        );
        assert!(matches!(
            events[1].kind,
            EventKind::Alloc { bytes, ptr, .. } if bytes == 256 * 19 && ptr == 0x1000 + 19
        ));
    }

    /// A batch larger than the ring keeps its newest events, after the older ones it pushes
    /// out, exactly as one event at a time would.
    #[test]
    fn a_batch_wraps_like_single_events() {
        let mut batch = Ring::new(7);
        let mut single = Ring::new(7);
        for r in [&mut batch, &mut single] {
            r.record(other(1));
            r.record_scratch_allocs(1, 1, |_| (256, 1));
        }
        batch.record_scratch_allocs(2, 20, |i| (512, 100 + i));
        for i in 0..20 {
            single.record_scratch_allocs(2, 1, |_| (512, 100 + i));
        }
        assert_eq!(batch.events(), single.events());
        assert_eq!(batch.recorded(), 22);
        assert!(matches!(
            batch.events().last().map(|e| &e.kind),
            Some(EventKind::Alloc { ptr: 119, .. })
        ));
    }

    #[test]
    fn a_ring_of_nothing_only_counts() {
        let mut ring = Ring::new(0);
        ring.record(other(1));
        ring.record_scratch_allocs(1, 1, |_| (256, 0));
        assert_eq!((ring.recorded(), ring.len()), (2, 0));
        assert!(ring.events().is_empty() && ring.others.is_empty());
    }
}
