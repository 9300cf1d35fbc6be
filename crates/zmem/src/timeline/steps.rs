//! Per-step aggregates for the whole run, in bounded memory: one record per step until
//! [`STEP_RECORDS_MAX`] are kept, then adjacent records are folded pairwise into records that
//! cover a range of steps (twice as many at each fold), so a run of any length is covered at a
//! resolution that coarsens with its length. Every record of the log covers the same number of
//! steps except the newest, which is still filling; the run's totals and highest peak survive
//! every fold exactly.

use crate::class::ClassBytes;

/// Most step records the timeline keeps (about 120 bytes each). When full, adjacent records
/// are folded pairwise, so it holds between half of this and this many, plus the open step.
pub const STEP_RECORDS_MAX: usize = 4096;

/// Aggregates of a step, or of a range of consecutive steps `step..=last_step` once a long run
/// folded them together (see [`STEP_RECORDS_MAX`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepRecord {
    /// The (first) step it covers.
    pub step: u64,
    /// The last step it covers (`step` for a record of one step).
    pub last_step: u64,
    /// Bytes held (all classes) at the highest peak of the steps covered.
    pub peak_bytes: u64,
    /// Bytes by class at that peak.
    pub peak_by_class: ClassBytes,
    /// The step that reached that peak (the first, on a tie).
    pub peak_step: u64,
    /// Allocations made in the steps covered.
    pub allocations: u64,
    /// Bytes allocated in them.
    pub bytes: u64,
    /// Resets their ends made (0 for a deferred one).
    pub resets: u64,
    /// Requests that went to the overflow pool in them.
    pub overflow_calls: u64,
    /// Their bytes.
    pub overflow_bytes: u64,
    /// Most overflow bytes one of the steps covered was served (`overflow_bytes` for one step).
    pub step_overflow_bytes_max: u64,
    /// Most scratch blocks kept at one of their ends (a leak shows as growth here).
    pub kept_blocks: usize,
}

impl StepRecord {
    /// Number of steps covered.
    #[must_use]
    pub fn span(&self) -> u64 {
        self.last_step.saturating_sub(self.step) + 1
    }

    /// `self` as a finished record of the single step `self.step`: the range and per-step
    /// maxima the arena does not track while the step runs.
    pub(crate) fn of_one_step(&self) -> StepRecord {
        StepRecord {
            last_step: self.step,
            peak_step: self.step,
            step_overflow_bytes_max: self.overflow_bytes,
            ..self.clone()
        }
    }

    /// Folds `later`, the record of the steps right after `self`'s, into `self`: counts and
    /// bytes add up, peaks and kept blocks take the larger (the earlier on a tie).
    fn absorb(&mut self, later: &StepRecord) {
        self.last_step = later.last_step;
        if later.peak_bytes > self.peak_bytes {
            self.peak_bytes = later.peak_bytes;
            self.peak_by_class = later.peak_by_class;
            self.peak_step = later.peak_step;
        }
        self.allocations += later.allocations;
        self.bytes += later.bytes;
        self.resets += later.resets;
        self.overflow_calls += later.overflow_calls;
        self.overflow_bytes += later.overflow_bytes;
        self.step_overflow_bytes_max = self
            .step_overflow_bytes_max
            .max(later.step_overflow_bytes_max);
        self.kept_blocks = self.kept_blocks.max(later.kept_blocks);
    }
}

/// The bounded record log.
pub(crate) struct StepLog {
    records: Vec<StepRecord>,
    /// Most records kept (even, at least 2).
    capacity: usize,
    /// Steps each record covers (a power of two; the newest record may cover fewer so far).
    width: u64,
}

impl StepLog {
    pub(crate) fn new(capacity: usize) -> StepLog {
        StepLog {
            records: Vec::new(),
            capacity: capacity.max(2) & !1,
            width: 1,
        }
    }

    /// Appends a finished record (of one step, or of a range: it is merged as a whole).
    pub(crate) fn push(&mut self, rec: StepRecord) {
        if let Some(last) = self.records.last_mut()
            && last.span() < self.width
        {
            last.absorb(&rec);
            return;
        }
        if self.records.len() == self.capacity {
            self.fold();
        }
        self.records.push(rec);
    }

    /// Halves the log: each pair of adjacent records becomes one covering both.
    fn fold(&mut self) {
        let n = self.records.len() / 2;
        for i in 0..n {
            let later = self.records[2 * i + 1].clone();
            self.records.swap(i, 2 * i);
            self.records[i].absorb(&later);
        }
        self.records.truncate(n);
        self.width *= 2;
        tracing::debug!(target: "zmem.timeline.steps", steps_per_record = self.width, records = n, "step records folded pairwise");
    }

    /// The records, oldest first.
    pub(crate) fn records(&self) -> &[StepRecord] {
        &self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(step: u64, peak: u64, overflow: u64) -> StepRecord {
        let mut r = StepRecord {
            step,
            peak_bytes: peak,
            allocations: step % 5,
            bytes: 256 * (step % 5),
            resets: 1,
            overflow_calls: u64::from(overflow > 0),
            overflow_bytes: overflow,
            kept_blocks: (step % 3) as usize,
            ..StepRecord::default()
        };
        r.peak_by_class.0[0] = peak;
        r.of_one_step()
    }

    #[test]
    fn folding_pairs_keeps_ranges_contiguous_and_maxima() {
        let mut log = StepLog::new(4);
        for s in 1..=9 {
            log.push(one(s, if s == 3 { 99 } else { s }, 10 * s));
        }
        let r = log.records();
        // 8 steps fill 4 records of width 2; the 9th starts folding into width 4.
        let ranges: Vec<_> = r.iter().map(|r| (r.step, r.last_step)).collect();
        assert_eq!(ranges, vec![(1, 4), (5, 8), (9, 9)]);
        assert_eq!((r[0].peak_bytes, r[0].peak_step), (99, 3));
        assert_eq!((r[1].peak_bytes, r[1].peak_step), (8, 8));
        assert_eq!(r[0].overflow_bytes, 10 + 20 + 30 + 40);
        assert_eq!(r[0].step_overflow_bytes_max, 40);
        assert_eq!(r[0].kept_blocks, 2);
    }

    proptest! {
        #[test]
        fn any_run_is_bounded_contiguous_and_exact(
            cap in 2usize..12,
            peaks in proptest::collection::vec(0u64..1000, 1..300),
        ) {
            let mut log = StepLog::new(cap);
            let steps: Vec<StepRecord> = peaks
                .iter()
                .enumerate()
                .map(|(i, p)| one(i as u64 + 1, *p, p % 7))
                .collect();
            for r in &steps {
                log.push(r.clone());
            }
            let r = log.records();
            prop_assert!(r.len() <= cap.max(2));
            prop_assert_eq!(r[0].step, 1);
            prop_assert_eq!(r[r.len() - 1].last_step, steps.len() as u64);
            for w in r.windows(2) {
                prop_assert_eq!(w[1].step, w[0].last_step + 1);
                prop_assert_eq!(w[0].span(), r[0].span());
            }
            let total = |f: fn(&StepRecord) -> u64, rs: &[StepRecord]| rs.iter().map(f).sum::<u64>();
            for f in [
                (|r: &StepRecord| r.allocations) as fn(&StepRecord) -> u64,
                |r| r.bytes,
                |r| r.resets,
                |r| r.overflow_calls,
                |r| r.overflow_bytes,
            ] {
                prop_assert_eq!(total(f, r), total(f, &steps));
            }
            let hw = |rs: &[StepRecord]| {
                let m = rs.iter().map(|r| r.peak_bytes).max().unwrap();
                (m, rs.iter().find(|r| r.peak_bytes == m).unwrap().peak_step)
            };
            prop_assert_eq!(hw(r), hw(&steps));
            prop_assert_eq!(
                r.iter().map(|r| r.step_overflow_bytes_max).max(),
                steps.iter().map(|r| r.overflow_bytes).max()
            );
        }
    }
}
